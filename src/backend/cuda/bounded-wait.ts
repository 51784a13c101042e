/**
 * A bounded wait for the GPU: where the stream may hold a collective that waits on another process (NCCL), the host
 * must not block in cuStreamSynchronize, since a rank that hangs (or runs other collectives) would leave it there for
 * ever. With a WaitGuard installed (src/parallel/nccl.ts installs one), each host wait of the CUDA driver becomes an
 * event recorded on the stream and polled: every poll also asks the guard for an asynchronous error (NCCL's
 * ncclCommGetAsyncError), and a wait longer than the guard's timeout aborts the guard (ncclCommAbort: NCCL's kernels
 * leave the stream) and throws one sentence naming what waited. Polls sleep 50 µs, then up to 1 ms, so a step's waits
 * (of tens of ms) cost well under a millisecond.
 */
import { DistilleryError } from '../../util/errors.js';

export interface WaitGuard {
  /** How long one host wait for the GPU may take (ms). */
  readonly timeoutMs: number;
  /** Why the work cannot finish (an asynchronous error of the communicator), or null. */
  poll(): string | null;
  /** Ends what the stream waits for (NCCL: aborts the communicator); called once, before the error is thrown. */
  abort(why: string): void;
  /** Who waits, for the message ("rank 1"). */
  readonly who: string;
  /** What sets the timeout, for the hint (default DISTILLERY_COMM_TIMEOUT_S). */
  readonly setting?: string;
}

export interface WaitClock {
  now(): number;
  sleep(ms: number): void;
}

const sleeper = new Int32Array(new SharedArrayBuffer(4));
export const realClock: WaitClock = {
  now: () => performance.now(),
  sleep: (ms) => { Atomics.wait(sleeper, 0, 0, ms); },
};

/** Polls between sleeps of 50 µs growing to 1 ms; the guard's asynchronous error at most every 100 ms. */
export function boundedWait(done: () => boolean, guard: WaitGuard, what: string, clock: WaitClock = realClock): void {
  if (done()) return;
  const t0 = clock.now();
  let nap = 0.05, lastPoll = t0;
  for (;;) {
    clock.sleep(nap);
    if (done()) return;
    nap = Math.min(1, nap * 1.5);
    const t = clock.now();
    if (t - lastPoll >= 100) {
      lastPoll = t;
      const err = guard.poll();
      if (err !== null) {
        const why = `${guard.who}: ${what}: the GPU's collectives failed (${err})`;
        guard.abort(why);
        throw new DistilleryError(why, 'set NCCL_DEBUG=WARN for NCCL\'s own account; every rank stops; continue with --resume from the last checkpoint');
      }
    }
    if (t - t0 >= guard.timeoutMs) {
      const why = `${guard.who}: ${what}: the GPU's work did not finish within ${Math.round(guard.timeoutMs / 1000)} s (a collective waits for a rank that hangs or died)`;
      guard.abort(why);
      throw new DistilleryError(why, `every rank stops; continue with --resume from the last checkpoint (${guard.setting ?? 'DISTILLERY_COMM_TIMEOUT_S'} sets the wait)`);
    }
  }
}
