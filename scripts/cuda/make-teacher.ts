/**
 * Writes a randomly initialized checkpoint folder (config.json + model.safetensors + tokenizer.json) for a model
 * preset, to serve as a distillation teacher on the GPU machine (no downloads there).
 * Usage: node dist/scripts/cuda/make-teacher.js <out-dir> <preset> <vocab> <tokenizer.json> [f32|bf16]
 */
import * as fs from 'node:fs';
import { presetConfig } from '../../src/model/config.js';
import { parameterLayout } from '../../src/model/params.js';
import { writeCheckpoint } from '../../src/model/checkpoint.js';

const [out, preset, vocab, tokenizer, dtype] = process.argv.slice(2);
if (!out || !preset || !vocab || !tokenizer) {
  process.stderr.write('usage: make-teacher.js <out-dir> <preset> <vocab> <tokenizer.json> [f32|bf16]\n');
  process.exit(2);
}
const t0 = Date.now();
const cfg = presetConfig(preset, Number(vocab));
// A fast init (uniform with std 0.02 from an xorshift generator; norms 1, biases 0): the values do not matter for
// throughput or pre-warm, and a per-element Box-Muller over 1.5B parameters takes minutes in JavaScript.
const layout = parameterLayout(cfg);
const w = new Float32Array(layout.total);
let x = 0x9e3779b9 | 0;
const a = 0.02 * Math.sqrt(3) / 2147483648;
for (const t of layout.tensors) {
  if (t.init === 'ones') { w.fill(1, t.offset, t.offset + t.size); continue; }
  if (t.init === 'zeros') continue;
  for (let i = t.offset, e = t.offset + t.size; i < e; i++) { x ^= x << 13; x ^= x >>> 17; x ^= x << 5; w[i] = x * a; }
}
writeCheckpoint(out, cfg, w, { dtype: dtype === 'f32' ? 'f32' : 'bf16', tokenizerJson: JSON.parse(fs.readFileSync(tokenizer, 'utf8')) as object });
process.stderr.write(`make-teacher: ${preset} (${(w.length / 1e6).toFixed(0)}M parameters) written to ${out} in ${((Date.now() - t0) / 1000).toFixed(1)}s\n`);
