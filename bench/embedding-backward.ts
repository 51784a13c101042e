/**
 * The CUDA embedding backward (embedding_bwd: deterministic, the first row of each id sums that id's rows in order) at
 * the 8×1024 student shape (8192 rows × 896, vocab 151936), by how the ids repeat: all distinct-ish (random ids), each
 * id 64 times, and the worst case, one id filling half the rows (a padded batch) or all of them, where one block adds
 * thousands of rows in turn. Prints µs per call (run on the GPU machine: `node dist/bench/embedding-backward.js`).
 */
import { createCudaBackend } from '../src/backend/cuda/index.js';
import { usPerCall } from './gpu-timing.js';

const be = createCudaBackend({ log: (l) => { if (!l.startsWith('[kernel-cache]') && !l.startsWith('[cuda-timeline]')) process.stderr.write(`${l}\n`); } });
const N = 8192, C = 896, V = 151936, REPS = 20;
const dtable = be.alloc(V * C, 'dtable'), dout = be.alloc(N * C, 'dout'), ids = be.allocInt(N, 'ids');
const g = new Float32Array(N * C);
for (let i = 0; i < g.length; i++) g[i] = Math.sin(i * 0.37) * 1e-3;
be.upload(dout, g);
let x = 12345;
const rand = (): number => { x = (x * 1103515245 + 12345) >>> 0; return x % V; };
const cases: Array<[string, (i: number) => number]> = [
  ['random ids', () => rand()],
  ['each id 64 times', (i) => (i % (N / 64)) * 7],
  ['one id in half the rows', (i) => (i % 2 === 0 ? 151643 : rand())],
  ['one id in every row', () => 151643],
];
const time = (f: () => void): number => usPerCall(be, f, REPS);
// the table is zeroed before each call (the kernel adds into it once per id); its memset is timed alone and subtracted
const zeroUs = time(() => be.zero(dtable));
for (const [name, id] of cases) {
  be.uploadInt(ids, Int32Array.from({ length: N }, (_, i) => id(i)));
  const us = time(() => { be.zero(dtable); be.embeddingBackward(dtable, dout, ids, N, C); }) - zeroUs;
  console.log(`[embedding-backward] ${N} rows × ${C}, ${name}: ${us.toFixed(1)} us per call (the table's zeroing, ${zeroUs.toFixed(1)} us, subtracted)`);
}
be.dispose();
