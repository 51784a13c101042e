/**
 * Generation's cached attention (Backend.attentionCached: one new token a sequence attending to its KV cache) alone on
 * CUDA, at the models' head shapes, batches and cache lengths: GPU µs per call, timed over a captured region of REPS
 * calls replayed (so the host's launch cost is out of the figure), and the bandwidth that implies over the bytes a call
 * must read at least (each sequence's K and V rows once, q, out). bf16 caches and operands, as generation runs them.
 * Usage (on the GPU machine): node dist/bench/attention-cached.js [--lens=256,1024,4096] [--batches=8,64]
 */
import { createCudaBackend } from '../src/backend/cuda/index.js';

const REPS = 50;
const arg = (name: string, dflt: string): number[] =>
  (process.argv.find((x) => x.startsWith(`--${name}=`))?.split('=')[1] ?? dflt).split(',').map(Number);
const lens = arg('lens', '256,1024,4096'), batches = arg('batches', '8,64');
const be = createCudaBackend({ log: (l) => { if (!l.startsWith('[kernel-cache]') && !l.startsWith('[cuda-timeline]')) process.stderr.write(`${l}\n`); } });
const shapes: Array<[string, number, number, number]> = [
  ['qwen2.5-0.5b (14/2 heads, hd 64)', 14, 2, 64], ['qwen3-0.6b (16/8 heads, hd 128)', 16, 8, 128],
  ['qwen2.5-1.5b (12/2 heads, hd 128)', 12, 2, 128], ['llama3-8b (32/8 heads, hd 128)', 32, 8, 128],
];
const fill = (n: number, seed: number): Float32Array => Float32Array.from({ length: n }, (_, i) => Math.sin((i + seed) * 12.9898) * 0.5);
for (const [name, nH, nKv, hd] of shapes) {
  for (const B of batches) {
    for (const L of lens) {
      const tMax = L;
      const q = be.alloc(B * nH * hd, 'q', 'bf16'), out = be.alloc(B * nH * hd, 'out', 'bf16');
      const kc = be.alloc(B * tMax * nKv * hd, 'kc', 'bf16'), vc = be.alloc(B * tMax * nKv * hd, 'vc', 'bf16');
      be.upload(q, fill(B * nH * hd, 1)); be.upload(kc, fill(B * tMax * nKv * hd, 2)); be.upload(vc, fill(B * tMax * nKv * hd, 3));
      // the newest token at position L - 1 attends to all L rows
      const again = be.capturedRepeat(`attention-cached ${name} ${B} ${L}`, () => {
        for (let r = 0; r < REPS; r++) be.attentionCached(out, q, kc, vc, B, 1, L - 1, tMax, nH, nKv, hd);
      });
      again(); be.synchronize();
      const t0 = process.hrtime.bigint();
      for (let k = 0; k < 4; k++) again();
      be.synchronize();
      const us = Number(process.hrtime.bigint() - t0) / 1e3 / (4 * REPS);
      const bytes = 2 * (2 * B * L * nKv * hd + 2 * B * nH * hd);
      console.log(`[attention-cached] ${name.padEnd(34)} B=${String(B).padStart(3)} L=${String(L).padStart(5)}: ${us.toFixed(2).padStart(8)} us  ${(bytes / us / 1e3).toFixed(0).padStart(5)} GB/s`);
    }
  }
}
be.dispose();
