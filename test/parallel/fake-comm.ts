/**
 * Rank 0 of `world` ranks for tests that run one process: host collectives answer with this rank's own values, device
 * collectives do nothing; subclasses record what a step asks of the reduction (reduceScatterStart).
 */
import type { Backend, Buf } from '../../src/backend/backend.js';
import type { CommWork, Communicator } from '../../src/parallel/comm.js';

export class OneRankView implements Communicator {
  readonly rank = 0;
  constructor(readonly world: number) {}
  allReduceSum(): void {}
  allReduceHost(x: Float64Array | number[]): Float64Array { return Float64Array.from(x); }
  allGather(): void {}
  allGatherHost(x: Float32Array): Float32Array { return x.slice(); }
  broadcast(b: Uint8Array): Uint8Array { return b; }
  barrier(): void {}
  close(): void {}
  reduceScatterStart(_be: Backend, _buf: Buf, _begin: number, _end: number): CommWork { return { wait(): void {} }; }
}
