/**
 * Generation's cached attention (Backend.attentionCached: one new token a sequence attending to its KV cache) alone on
 * CUDA, at the models' head shapes, batches and cache lengths: GPU µs per call, timed over a captured region of REPS
 * calls replayed (so the host's launch cost is out of the figure), and the bandwidth that implies over the bytes a call
 * must read at least (each sequence's K and V rows once, q, out). bf16 caches and operands, as generation runs them.
 * `--sweep` also times attention_cached_gqa's layouts (blocks of 2 to 32 warps, 1, 2 or 4 rows in flight a slot) beside
 * the one the backend picks (CudaBackend.cachedAttentionGqaLayout), launched directly, split as the backend splits the call (CudaBackend.cachedAttentionGqaGrid) or
 * into each count of `--splits=1,2,...` (0: the backend's).
 * `--capacity=N` gives the caches N rows (at least L), as a decode's do: its capacity is the prompt's length and the new
 * tokens', and the kernel (cachedAttentionKernel) and the split (cachedAttentionSplits, then the GPU's waves) are chosen by the capacity.
 * `--kernels` times only the other kernels (a block per query head; attention_cached_mma at 1 to 16 splits).
 * Usage (on the GPU machine): node dist/bench/attention-cached.js [--lens=256,1024,4096] [--batches=8,64] [--capacity=N] [--sweep [--splits=0,1] | --kernels]
 */
import { createCudaBackend } from '../src/backend/cuda/index.js';
import { SMEM_DEFAULT } from '../src/backend/cuda/kernels/attention.js';
import {
  CACHED_COUNTERS, CACHED_MAX_SPLITS, attentionCached, attentionCachedGqa, cachedAttentionBlock, cachedAttentionGqaSmem,
} from '../src/backend/cuda/kernels/attention-cached.js';
import { CACHED_MMA_MIN_BLOCKS, CACHED_MMA_THREADS, attentionCachedMma, cachedMmaShape } from '../src/backend/cuda/kernels/attention-cached-mma.js';
import type { KernelSpec } from '../src/backend/cuda/kernels/spec.js';
import type { Buf } from '../src/backend/backend.js';
import { packBf16 } from '../src/backend/bf16.js';

const REPS = 50;
const arg = (name: string, dflt: string): number[] =>
  (process.argv.find((x) => x.startsWith(`--${name}=`))?.split('=')[1] ?? dflt).split(',').map(Number);
const lens = arg('lens', '256,1024,4096'), batches = arg('batches', '8,64'), [capacity] = arg('capacity', '0'), sweep = process.argv.includes('--sweep'), kernelsOnly = process.argv.includes('--kernels');
const sweepSplits = arg('splits', '0');
const be = createCudaBackend({ log: (l) => { if (!l.startsWith('[kernel-cache]') && !l.startsWith('[cuda-timeline]')) process.stderr.write(`${l}\n`); } });
const shapes: Array<[string, number, number, number]> = [
  ['qwen2.5-0.5b (14/2 heads, hd 64)', 14, 2, 64], ['qwen3-0.6b (16/8 heads, hd 128)', 16, 8, 128],
  ['qwen2.5-1.5b (12/2 heads, hd 128)', 12, 2, 128], ['llama3-8b (32/8 heads, hd 128)', 32, 8, 128],
];
// bf16 bits of a pseudo-random period of FILL_PERIOD values (a prime, so no two rows of the caches are alike), tiled:
// a 4096-row cache at batch 64 is 268M values, too many to draw and convert one by one (seconds a shape)
const FILL_PERIOD = 4099;
const fill = (n: number, seed: number): Uint16Array => {
  const out = new Uint16Array(n);
  out.set(packBf16(Float32Array.from({ length: Math.min(n, FILL_PERIOD) }, (_, i) => Math.sin((i + seed) * 12.9898) * 0.5)));
  for (let have = Math.min(n, FILL_PERIOD); have < n; have *= 2) out.copyWithin(have, 0, Math.min(have, n - have));
  return out;
};
for (const [name, nH, nKv, hd] of shapes) {
  for (const B of batches) {
    for (const L of lens) {
      const tMax = Math.max(L, capacity);
      const q = be.alloc(B * nH * hd, 'q', 'bf16'), out = be.alloc(B * nH * hd, 'out', 'bf16');
      const kc = be.alloc(B * tMax * nKv * hd, 'kc', 'bf16'), vc = be.alloc(B * tMax * nKv * hd, 'vc', 'bf16');
      be.uploadBf16(q, fill(B * nH * hd, 1)); be.uploadBf16(kc, fill(B * tMax * nKv * hd, 2)); be.uploadBf16(vc, fill(B * tMax * nKv * hd, 3));
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
      // the kernel, layout and splits the backend launches for this call
      const launched = be.cachedAttentionLaunchOf(B, 1, nH, nKv, hd, tMax);
      const { splits: planned } = be.cachedAttentionGqaGrid(B, 1, nH, nKv, hd, tMax, true);
      console.log(`[attention-cached] ${name.padEnd(34)} B=${String(B).padStart(3)} L=${String(L).padStart(5)}${tMax > L ? ` of ${tMax}` : ''}: ${us.toFixed(2).padStart(8)} us  ${(bytes / us / 1e3).toFixed(0).padStart(5)} GB/s` +
        ` (${launched.kernel}${launched.splits === 0 ? '' : `, block ${launched.block}${launched.params.un === undefined ? '' : `, un ${String(launched.params.un)}`}` +
          `${launched.params.minBlocks === undefined ? '' : `, min blocks ${String(launched.params.minBlocks)}`}, splits ${launched.splits}`}, ${launched.blocksPerSm} an SM)`);
      if (sweep || kernelsOnly) {
        // attention_cached_gqa launched directly, whichever kernel the backend picks (CudaBackend.launch is private: a
        // benchmark's reach, not an API)
        const launch = (be as unknown as { launch(s: KernelSpec, g: readonly [number, number, number], b: number, a: unknown[]): void }).launch.bind(be);
        const P = (x: Buf): unknown => ({ t: 'p', v: (x as unknown as { ptr: bigint }).ptr }), I = (v: number): unknown => ({ t: 'i', v });
        // the backend's output, to check each layout's against (a layout that times well but computes wrong is marked): out
        // is zeroed before each layout, and a difference past 5% of the largest output value is wrong (the layouts differ
        // by the bf16 rounding of sums taken in other orders; a layout that skipped half the rows would differ by about
        // the output itself, an average of many values of either sign)
        const want = be.download(out), scale = want.reduce((a, x) => Math.max(a, Math.abs(x)), 0);
        // split counts the kernel takes: up to CACHED_MAX_SPLITS (its merge's arrays), and a counter for each of the
        // grid's (query row, KV head) pairs
        const splitsList = [...new Set(sweepSplits.map((x) => x || planned))].filter((x) => x >= 1 && (x === 1 || (x <= CACHED_MAX_SPLITS && B * nKv <= CACHED_COUNTERS)));
        // the split partials' scratch (counters zero, as the backend keeps them between calls)
        const part = be.alloc(CACHED_COUNTERS + CACHED_MAX_SPLITS * B * nH * (hd + 2), 'sweep part');
        // one kernel's launches timed over a captured region (out zeroed first) and its output checked: "label us"
        const timeIt = (label: string, spec: KernelSpec, grid: readonly [number, number, number], block: number, args: unknown[]): string => {
          const rep = be.capturedRepeat(`sweep ${name} ${B} ${L} ${label} ${grid.join('x')}`, () => { for (let r = 0; r < REPS; r++) launch(spec, grid, block, args); });
          be.zero(out);
          rep(); be.synchronize();
          const s0 = process.hrtime.bigint();
          for (let k = 0; k < 4; k++) rep();
          be.synchronize();
          const u2 = Number(process.hrtime.bigint() - s0) / 1e3 / (4 * REPS), got = be.download(out);
          let err = 0;
          for (let k = 0; k < got.length; k++) err = Math.max(err, Math.abs(got[k] - want[k]));
          return `${label} ${u2.toFixed(1)}${err > 0.05 * scale ? ` WRONG (${err.toExponential(1)} of ${scale.toExponential(1)})` : ''}`;
        };
        for (const splits of sweep ? splitsList : []) {
          const row: string[] = [], chosen = be.cachedAttentionGqaLayout(splits * nKv * B, hd, nH / nKv, true);
          for (const block of [64, 128, 256, 512, 1024]) {
            if (cachedAttentionGqaSmem(hd, nH / nKv, block) > SMEM_DEFAULT) continue; // past the static shared memory
            for (const un of [1, 2, 4]) {
              const spec = attentionCachedGqa.make({ headDim: hd, group: nH / nKv, block, vec: 8, un, out: 'bf16', q: 'bf16', kc: 'bf16', vc: 'bf16', seqPos: false });
              try {
                row.push(timeIt(`${block}/${un}${block === chosen.block && un === chosen.un ? '*' : ''}`, spec, [splits, nKv, B], block,
                  [P(out), P(q), P(kc), P(vc), I(1), I(L - 1), I(tMax), I(nH), I(nKv), splits > 1 ? P(part) : { t: 'p', v: 0n }, I(splits)]));
              } catch (e) { row.push(`${block}/${un} failed (${(e as Error).message.slice(0, 60)})`); }
            }
          }
          console.log(`[attention-cached sweep] splits ${splits}${splits === planned ? '*' : ''}, block/un us: ${row.join(' | ')}`);
        }
        // the other kernels a call may take, launched directly: a block per query head, and the tensor-core group kernel
        // at every split count up to CACHED_MAX_SPLITS
        const head = attentionCached.make({ headDim: hd, block: cachedAttentionBlock(hd), out: 'bf16', q: 'bf16', kc: 'bf16', vc: 'bf16', seqPos: false });
        const others = [timeIt('head', head, [1, nH, B], cachedAttentionBlock(hd), [P(out), P(q), P(kc), P(vc), I(1), I(L - 1), I(tMax), I(nH), I(nKv)])];
        if (cachedMmaShape(hd, nH / nKv)) {
          for (const minBlocks of CACHED_MMA_MIN_BLOCKS) {
            const mma = attentionCachedMma.make({ headDim: hd, group: nH / nKv, out: 'bf16', seqPos: false, minBlocks });
            for (const splits of [1, 2, 3, 4, 6, 8, 12, 16].filter((x) => x <= CACHED_MAX_SPLITS && (x === 1 || B * nKv <= CACHED_COUNTERS))) {
              others.push(timeIt(`mma${minBlocks ? `(min ${minBlocks})` : ''}/${splits}`, mma, [splits, nKv, B], CACHED_MMA_THREADS, [P(out), P(q), P(kc), P(vc), I(1), I(L - 1), I(tMax), I(nH), I(nKv), splits > 1 ? P(part) : { t: 'p', v: 0n }, I(splits)]));
            }
          }
        }
        console.log(`[attention-cached sweep] other kernels us: ${others.join(' | ')}`);
      }
    }
  }
}
be.dispose();
