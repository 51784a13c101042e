/**
 * BPE training benchmark: the demo's tokenizer (600k characters of builtin:docs, 512 tokens), the whole corpus at
 * 2048 tokens, and one long run of letters without whitespace (one pre-token of N bytes), median of 5 (1 for the
 * long run).
 *
 *   node dist/bench/bpe.js [letters, default 2000000]
 *
 * Measured on the 2-core sandbox (2026-11-23), before → after the per-pair occurrence lists: demo 97 → 92 ms,
 * corpus 2048 tokens 235 → 106 ms, 2M letters without whitespace 100.6 s → 1.0 s (50 MB: ~30 s, 1.2 GB RSS).
 */
import { trainBpe } from '../src/tokenizer/train-bpe.js';
import { loadDocCorpus } from '../src/data/doc-corpus.js';

const SPECIALS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];

function median(f: () => void, n: number): number {
  const ts: number[] = [];
  for (let i = 0; i < n; i++) { const t0 = performance.now(); f(); ts.push(performance.now() - t0); }
  return ts.sort((a, b) => a - b)[Math.floor(n / 2)]!;
}

for (const [maxChars, vocabSize] of [[600_000, 512], [2_000_000, 2048]] as const) {
  const docs = loadDocCorpus({ maxChars }).documents;
  console.log(`builtin:docs ${maxChars} characters, ${vocabSize} tokens: ${median(() => trainBpe(docs, { vocabSize, specialTokens: SPECIALS }), 5).toFixed(0)} ms`);
}
const n = Number(process.argv[2] ?? 2_000_000);
const letters = loadDocCorpus({}).documents.join('').replace(/[^\p{L}]/gu, '');
const text = Buffer.from(letters.repeat(Math.ceil(n / letters.length)).slice(0, n)).toString(); // flat, not a rope
console.log(`${n} letters without whitespace, 512 tokens: ${median(() => trainBpe([text], { vocabSize: 512, specialTokens: SPECIALS }), 1).toFixed(0)} ms`);
