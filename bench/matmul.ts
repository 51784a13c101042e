/**
 * Matrix-product benchmark of the CPU backend: GFLOP/s of matmulForward and matmulBackward (all three
 * products) at a few shapes n×k×m, for the JS and the WebAssembly SIMD kernels, with threads=1 and threads=N
 * (default: the backend's default thread count).
 *
 *   node dist/bench/matmul.js [threads] [js|wasm|both]
 *
 * Flops: forward 2·n·k·m; backward 4·n·k·m (dinp and dweight; dbias is negligible).
 */
import { CpuBackend, defaultThreads } from '../src/backend/cpu/cpu-backend.js';
import { Rng } from '../src/util/rng.js';

const SHAPES: Array<[number, number, number]> = [
  [256, 256, 256],
  [1024, 512, 512],
  [4096, 128, 512],
  [512, 896, 4864],
  [1, 896, 4864],
];

/** Best (smallest) mean time per call in ms over `rounds` windows of at least minMs each. */
function timeIt(fn: () => void, minMs: number, rounds = 3): number {
  fn(); // warm-up (JIT, worker start)
  let best = Infinity;
  for (let r = 0; r < rounds; r++) {
    let reps = 0;
    const t0 = performance.now();
    let t = t0;
    while (t - t0 < minMs || reps < 2) { fn(); reps++; t = performance.now(); }
    best = Math.min(best, (t - t0) / reps);
  }
  return best;
}

/**
 * Threads 1 and N are measured shape by shape, one after the other, and each figure is the best of 3 windows,
 * so that load from other processes on a shared machine distorts the comparison as little as possible.
 */
function bench(threadCounts: number[], kernels: Array<'js' | 'wasm'>): void {
  const backends = threadCounts.flatMap((threads) => kernels.map((kernel) => new CpuBackend({ threads, kernel })));
  const rng = new Rng(1);
  for (const [n, k, m] of SHAPES) {
    for (const be of backends) {
      const fill = (len: number) => { const b = be.alloc(len, 'x'); be.upload(b, Float32Array.from({ length: len }, () => rng.normal())); return b; };
      const inp = fill(n * k), w = fill(m * k), bias = fill(m), dout = fill(n * m);
      const out = be.alloc(n * m, 'out'), dinp = be.alloc(n * k, 'dinp'), dw = be.alloc(m * k, 'dw'), db = be.alloc(m, 'db');
      const fwd = timeIt(() => be.matmulForward(out, inp, w, bias, n, k, m), 200);
      const bwd = timeIt(() => be.matmulBackward(dinp, dw, db, dout, inp, w, n, k, m), 200);
      const gf = (flops: number, ms: number) => (flops / ms / 1e6).toFixed(2);
      console.log(`${`${n}x${k}x${m}`.padEnd(14)} ${be.kernel.padEnd(4)} threads=${be.threads}  forward ${gf(2 * n * k * m, fwd).padStart(6)} GFLOP/s (${fwd.toFixed(2).padStart(8)} ms)`
        + `   backward ${gf(4 * n * k * m, bwd).padStart(6)} GFLOP/s (${bwd.toFixed(2).padStart(8)} ms)`);
    }
  }
  for (const be of backends) be.dispose();
}

const nArg = process.argv[2] !== undefined ? Number(process.argv[2]) : defaultThreads();
const kArg = process.argv[3] ?? 'both';
bench(nArg > 1 ? [1, nArg] : [1], kArg === 'js' || kArg === 'wasm' ? [kArg] : ['js', 'wasm']);
