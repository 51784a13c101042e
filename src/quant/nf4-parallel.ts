/**
 * NF4 quantization on every core: a model's frozen matrices are quantized on the host at load (src/model/frozen.ts),
 * one tensor at a time, and a 7B model's 6.5 billion matrix weights take about 100 s on one thread. A tensor larger
 * than one chunk of blocks is copied into shared memory and its blocks quantized by the CPU backend's worker pool
 * (the main thread working too), each thread claiming chunks of whole blocks (a block owns whole code bytes), so the
 * codes and scales are the ones quantizeNf4 computes, whatever the number of threads. The pool starts on the first
 * tensor that needs it and is disposed with the quantizer.
 */
import { availableParallelism } from 'node:os';
import { WorkerPool } from '../backend/cpu/pool.js';
import { NF4_DEFAULT_BLOCK, checkNf4BlockSize, quantizeNf4, type Nf4Tensor } from './nf4.js';

/** Blocks per chunk a thread claims (2^14 blocks of 64: a million weights). */
export const NF4_CHUNK_BLOCKS = 1 << 14;

export class Nf4Quantizer {
  private pool: WorkerPool | null = null;

  /** `threads`: threads in all (the calling one included; default: the machine's cores, at most 16). */
  constructor(readonly threads = Math.min(16, availableParallelism()), readonly chunkBlocks = NF4_CHUNK_BLOCKS) {}

  /**
   * quantizeNf4(x, blockSize), on several threads when x is a Float32Array of more than one chunk of blocks (other
   * inputs, float64 ones, run on this thread: copying them into float32 would round values near a level's midpoint).
   */
  quantize(x: ArrayLike<number>, blockSize = NF4_DEFAULT_BLOCK): Nf4Tensor {
    checkNf4BlockSize(blockSize);
    const n = x.length, blocks = Math.ceil(n / blockSize);
    if (this.threads <= 1 || blocks <= this.chunkBlocks || !(x instanceof Float32Array)) return quantizeNf4(x, blockSize);
    // a non-finite weight is refused here, by name, as quantizeNf4 does (a worker's error would come back as text)
    for (let i = 0; i < n; i++) if (!Number.isFinite(x[i]!)) return quantizeNf4(x.subarray(0, i + 1), blockSize);
    this.pool ??= new WorkerPool(this.threads - 1);
    const xs = new Float32Array(new SharedArrayBuffer(4 * n));
    xs.set(x);
    const codes = new Uint8Array(new SharedArrayBuffer(Math.ceil(n / 2))), absmax = new Float32Array(new SharedArrayBuffer(4 * blocks));
    const ranges: Array<[number, number]> = [];
    for (let b = 0; b < blocks; b += this.chunkBlocks) ranges.push([b, Math.min(blocks, b + this.chunkBlocks)]);
    this.pool.run({ op: 'nf4', x: xs, codes, absmax, n, blockSize, b0: 0, b1: blocks }, 'rows', ranges);
    return { n, blockSize, codes, absmax };
  }

  /** Stops the worker threads (if any started). */
  dispose(): void {
    this.pool?.dispose();
    this.pool = null;
  }
}
