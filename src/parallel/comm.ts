/**
 * The communicator seam of data-parallel runs: the collectives a step needs, on a backend's buffers. One process
 * (LocalComm) needs none of them; HostComm (host-comm.ts) moves the data through the host over TCP (the CPU backend,
 * and tests of the sharding logic with real processes); NcclComm (nccl.ts) runs them on the GPU's stream.
 * Collectives are SPMD: every rank calls the same ones in the same order. They are blocking, but for the gradient
 * reduction (reduceScatterStart), which returns at once and completes when waited on, so that it overlaps the backward
 * pass (src/parallel/grad-reducer.ts).
 */
import type { Backend, Buf } from '../backend/backend.js';

/** A collective in flight: wait() blocks until it has completed (its result is then in the buffer); once only. */
export interface CommWork { wait(): void }

const DONE: CommWork = { wait(): void {} };

export interface Communicator {
  readonly rank: number;
  readonly world: number;
  /** buf[0, n) = the sum over ranks of each rank's buf[0, n). */
  allReduceSum(be: Backend, buf: Buf, n: number): void;
  /**
   * Starts summing buf[begin, end) over ranks where each rank needs the sum only inside its own shard of `shard`
   * elements, [rank·shard, (rank+1)·shard) (ZeRO: the gradients of the optimizer shard it updates). After wait(), the
   * part of [begin, end) inside this rank's shard holds the sum; the rest of the range is unspecified. The range must
   * not be written until then. Returns at once where the transport allows (the host's thread, the GPU's stream).
   */
  reduceScatterStart(be: Backend, buf: Buf, begin: number, end: number, shard: number): CommWork;
  /**
   * reduceScatterStart may be called inside a captured region (the reduction is queued on the GPU beside the region's
   * later work, nothing is copied to the host), and its works' wait() only orders the GPU's streams, outside regions.
   */
  readonly overlapsRegions?: boolean;
  /** Host numbers summed over ranks (token counts, loss sums). */
  allReduceHost(x: Float64Array | number[]): Float64Array;
  /**
   * Every rank's shard of `shard` elements, buf[rank·shard, (rank+1)·shard), gathered into buf[0, world·shard) on every
   * rank (ZeRO-1: the updated parameters of each rank's shard).
   */
  allGather(be: Backend, buf: Buf, shard: number): void;
  /** Host arrays of `shard` elements from every rank, concatenated in rank order (a checkpoint's optimizer moments). */
  allGatherHost(x: Float32Array, shard: number): Float32Array;
  /** Bytes from rank 0 to every rank (what rank 0 decided: a stop, the NCCL id). */
  broadcast(bytes: Uint8Array): Uint8Array;
  /** Waits for every rank (`timeoutMs`: longer than a collective's, e.g. around rank 0's checkpoint writes). */
  barrier(timeoutMs?: number): void;
  /** Ends the communicator; `failed`: the run stops on an error, so nothing may wait for the other ranks (NCCL aborts). */
  close(failed?: boolean): void;
}

/** One process: every collective is the identity. */
export class LocalComm implements Communicator {
  readonly rank = 0;
  readonly world = 1;
  allReduceSum(): void {}
  reduceScatterStart(): CommWork { return DONE; }
  allReduceHost(x: Float64Array | number[]): Float64Array { return Float64Array.from(x); }
  allGather(): void {}
  allGatherHost(x: Float32Array): Float32Array { return x.slice(); }
  broadcast(bytes: Uint8Array): Uint8Array { return bytes; }
  barrier(): void {}
  close(): void {}
}

/** The part of [begin, end) inside each rank's shard of `shard` elements: [r] = [from, to) (from = to where none). */
export function shardParts(begin: number, end: number, shard: number, world: number): Array<[number, number]> {
  return Array.from({ length: world }, (_, r): [number, number] => {
    const from = Math.min(end, Math.max(begin, r * shard)), to = Math.max(from, Math.min(end, (r + 1) * shard));
    return [from, to];
  });
}

/** The contiguous shard of a flat buffer of `total` elements that rank r owns: [r·size, min(total, (r+1)·size)). */
export function shardOf(total: number, world: number, rank: number): { size: number; begin: number; end: number } {
  const size = Math.ceil(total / world);
  const begin = Math.min(total, rank * size), end = Math.min(total, begin + size);
  return { size, begin, end };
}

/**
 * Whether a run uses NCCL (src/parallel/nccl.ts) for its device collectives: a CUDA run of several ranks, unless
 * DISTILLERY_NCCL=0 moves them through the host communicator (correct, and slow); DISTILLERY_NCCL=1 uses NCCL on one
 * rank too (the check that the NCCL path equals the plain one: scripts/cuda/data-parallel-check.sh). NCCL became the
 * default once it had run on GPUs (2 H200s, session 10: 97.7% scaling at 8x1024 per GPU, docs/measurements).
 */
export function ncclWanted(device: 'cpu' | 'cuda', world: number, env: NodeJS.ProcessEnv = process.env): boolean {
  if (device !== 'cuda' || env.DISTILLERY_NCCL === '0') return false;
  return env.DISTILLERY_NCCL === '1' ? world >= 1 : world > 1;
}
