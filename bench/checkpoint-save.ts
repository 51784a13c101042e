/**
 * What a checkpoint save costs on the host, without a GPU: the float32 resume folder of a preset model (writeCheckpoint),
 * its AdamW moments (optimizer.safetensors) and the bf16 folder users load, written into a temporary folder on the
 * disk given (default: the OS temp folder), each timed twice. Prints ms per write and GB/s.
 *
 *   node dist/bench/checkpoint-save.js [preset (qwen2.5-0.5b)] [folder]
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { presetConfig } from '../src/model/config.js';
import { parameterLayout } from '../src/model/params.js';
import { writeCheckpoint } from '../src/model/checkpoint.js';
import { writeSafetensors } from '../src/io/safetensors.js';

const preset = process.argv[2] ?? 'qwen2.5-0.5b';
const where = fs.mkdtempSync(path.join(process.argv[3] ?? os.tmpdir(), 'distillery-save-bench-'));
const cfg = presetConfig(preset, 151936);
const n = parameterLayout(cfg).total;
const fill = (seed: number): Float32Array => { const a = new Float32Array(n); for (let i = 0; i < n; i += 97) a[i] = (i % 1000) * 1e-4 + seed; return a; };
const w = fill(0), m = fill(1), v = fill(2);
const time = (what: string, bytes: number, f: () => void): void => {
  for (let r = 0; r < 2; r++) {
    const t0 = process.hrtime.bigint();
    f();
    const ms = Number(process.hrtime.bigint() - t0) / 1e6;
    console.log(`${what.padEnd(40)} ${ms.toFixed(0).padStart(7)} ms  ${(bytes / ms / 1e6).toFixed(2)} GB/s`);
  }
};
console.log(`checkpoint save of ${preset} (${n} parameters) into ${where}`);
try {
  time('resume folder, f32 (writeCheckpoint)', 4 * n, () => writeCheckpoint(path.join(where, 'model'), cfg, w, { dtype: 'f32' }));
  time('AdamW moments, f32 (optimizer.safetensors)', 8 * n, () => writeSafetensors(path.join(where, 'optimizer.safetensors'),
    new Map([['m', { shape: [n], data: m }], ['v', { shape: [n], data: v }]]), { dtype: 'f32' }));
  time('user folder, bf16 (writeCheckpoint)', 2 * n, () => writeCheckpoint(path.join(where, 'user'), cfg, w, { dtype: 'bf16' }));
} finally {
  fs.rmSync(where, { recursive: true, force: true });
}
