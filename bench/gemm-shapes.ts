/**
 * GPU GEMM micro-benchmark at the 8×1024 distillation shapes (run on the GPU machine: `node dist/bench/gemm-shapes.js`):
 * each matmulForward of the Qwen2.5-1.5B teacher and 0.5B student layers in bf16 (with and without a bias, into a bf16
 * and an f32 output) and in fp32/TF32, timed over repeated launches with one synchronize; prints µs per call and
 * TFLOP/s, so a slow cuBLAS choice for one shape shows up by itself rather than inside a step profile.
 */
import { createCudaBackend } from '../src/backend/cuda/index.js';
import type { Buf, DType } from '../src/backend/backend.js';
import { presetConfig } from '../src/model/config.js';
import { Transformer } from '../src/model/transformer.js';

const be = createCudaBackend({ log: () => {} });
const N = 8192, REPS = 20;
const shapes: Array<[string, number, number]> = [
  ['teacher q/o 1536x1536', 1536, 1536], ['teacher k/v 1536x256', 1536, 256], ['teacher gate/up 1536x8960', 1536, 8960],
  ['teacher down 8960x1536', 8960, 1536], ['student q/o 896x896', 896, 896], ['student gate/up 896x4864', 896, 4864],
  ['student down 4864x896', 4864, 896],
];
const time = (f: () => void): number => {
  f(); be.synchronize();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < REPS; i++) f();
  be.synchronize();
  return Number(process.hrtime.bigint() - t0) / 1e3 / REPS;
};
for (const [name, k, m] of shapes) {
  const row: string[] = [];
  for (const [inDt, outDt, bias] of [['bf16', 'bf16', false], ['bf16', 'bf16', true], ['bf16', 'f32', false], ['bf16', 'f32', true], ['f32', 'f32', false]] as Array<[DType, DType, boolean]>) {
    const x = be.alloc(N * k, 'x', inDt), w = be.alloc(m * k, 'w', inDt), o = be.alloc(N * m, 'o', outDt);
    const b: Buf | null = bias ? be.alloc(m, 'b', inDt) : null;
    const us = time(() => be.matmulForward(o, x, w, b, N, k, m));
    row.push(`${inDt}->${outDt}${bias ? '+bias' : ''} ${us.toFixed(1)} us ${(2 * N * k * m / us / 1e6).toFixed(0)} TF/s`);
  }
  console.log(`${name.padEnd(26)} ${row.join(' | ')}`);
}

// The same products as a model runs them: the teacher's (Qwen2.5-1.5B-shaped) whole forward at 8×1024, profiled, so the
// per-op GPU times can be set beside the isolated ones above (DISTILLERY_CUDA_PROFILE=1 prints the table on dispose).
if (process.argv.includes('--model')) {
  const t = new Transformer(be, presetConfig('qwen2.5-1.5b', 151936), { batch: 8, seq: 1024, training: false, precision: 'bf16', label: 'teacher' });
  const ids = Int32Array.from({ length: N }, (_, i) => (i * 7919) % 151936);
  for (let i = 0; i < 3; i++) t.forwardHidden(ids, 8, 1024);
  be.synchronize();
  const t0 = process.hrtime.bigint();
  t.forwardHidden(ids, 8, 1024);
  be.synchronize();
  console.log(`teacher forward (bf16, 8x1024): ${(Number(process.hrtime.bigint() - t0) / 1e6).toFixed(1)} ms`);
}
be.dispose();
