/**
 * Writes `batch` prompts of exactly `len` tokens of a model folder's tokenizer, one {"prompt"} per line, for the
 * generation benchmarks (text the tokenizer splits one token per word is not guaranteed, so the prompts are word lists
 * cut by token count). Prompt b starts at word b of a fixed sentence, so the prompts differ.
 * Usage: node dist/scripts/cuda/fixed-length-prompts.js <model-dir> <batch> <len> <out.jsonl>
 */
import * as fs from 'node:fs';
import { Tokenizer } from '../../src/tokenizer/bpe.js';

const [dir, batch, len, out] = process.argv.slice(2);
if (!dir || !batch || !len || !out) {
  process.stderr.write('usage: fixed-length-prompts.js <model-dir> <batch> <len> <out.jsonl>\n');
  process.exit(2);
}
const B = Number(batch), L = Number(len);
const tok = Tokenizer.fromFile(`${dir}/tokenizer.json`);
const words = 'the model reads the pieces in order and the student learns to match the teacher on every token'.split(' ');
const lines: string[] = [];
for (let b = 0; b < B; b++) {
  let ids: number[] = [];
  for (let i = 0; ids.length < L; i++) ids = tok.encode(Array.from({ length: i + 1 }, (_, k) => words[(k + b) % words.length]).join(' '));
  lines.push(JSON.stringify({ prompt: tok.decode(ids.slice(0, L)) }));
}
fs.writeFileSync(out, `${lines.join('\n')}\n`);
