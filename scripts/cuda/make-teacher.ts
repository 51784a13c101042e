/**
 * Writes a randomly initialized checkpoint folder (config.json + model.safetensors + tokenizer.json) for a model
 * preset, to serve as a distillation teacher on the GPU machine (no downloads there).
 * Usage: node dist/scripts/cuda/make-teacher.js <out-dir> <preset> <vocab> <tokenizer.json> [f32|bf16]
 */
import * as fs from 'node:fs';
import { presetConfig } from '../../src/model/config.js';
import { fastWeights } from './fast-weights.js';
import { writeCheckpoint } from '../../src/model/checkpoint.js';

const [out, preset, vocab, tokenizer, dtype] = process.argv.slice(2);
if (!out || !preset || !vocab || !tokenizer) {
  process.stderr.write('usage: make-teacher.js <out-dir> <preset> <vocab> <tokenizer.json> [f32|bf16]\n');
  process.exit(2);
}
const t0 = Date.now();
const cfg = presetConfig(preset, Number(vocab));
const w = fastWeights(cfg);
writeCheckpoint(out, cfg, w, { dtype: dtype === 'f32' ? 'f32' : 'bf16', tokenizerJson: JSON.parse(fs.readFileSync(tokenizer, 'utf8')) as object });
process.stderr.write(`make-teacher: ${preset} (${(w.length / 1e6).toFixed(0)}M parameters) written to ${out} in ${((Date.now() - t0) / 1000).toFixed(1)}s\n`);
