/**
 * The gradient reduction of a data-parallel step (ZeRO-1): the flat gradient buffer is summed over ranks in buckets,
 * each rank receiving the sums of its optimizer shard only (Communicator.reduceScatterStart), while the backward pass
 * goes on. The model reports ranges of the trainable buffer whose gradients are final (Transformer.backwardHidden's
 * `ready`: the final norm and an untied LM head first, then each layer from the last, the embedding last, or each
 * layer's adapters); consecutive ranges are contiguous, downward in the buffer, so they join into one pending range
 * that is started as a bucket once it holds `bucket` elements. finish() starts what is still pending, reduces every
 * part of the buffer that was never reported (all of it when the step reported nothing: a captured pass whose
 * communicator cannot work inside it, the host's, reduces after the pass), and waits for every bucket. Each element
 * is reduced exactly once. On the GPU with NCCL (overlapsRegions) the buckets start inside the captured pass, on a
 * second stream, as the backward reports them; finish()'s waits make the main stream wait for them.
 */
import type { Backend, Buf } from '../backend/backend.js';
import { DistilleryError, InputError } from '../util/errors.js';
import type { CommWork, Communicator } from './comm.js';

/** Elements per bucket by default: 2^22 (16 MiB of float32; PyTorch DDP's default is 25 MB). */
export const DEFAULT_BUCKET = 1 << 22;
/** Buckets a step keeps in flight at most (a transport through the host holds a copy of each). */
export const MAX_IN_FLIGHT = 4;

/** Elements per bucket: DISTILLERY_GRAD_BUCKET_MB MiB of float32 gradients where set (refused unless a positive number). */
export function gradBucketElements(env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.DISTILLERY_GRAD_BUCKET_MB;
  if (raw === undefined || raw === '') return DEFAULT_BUCKET;
  const mb = Number(raw);
  if (!(Number.isFinite(mb) && mb > 0)) throw new InputError(`DISTILLERY_GRAD_BUCKET_MB=${raw} is not a positive number of MiB`, 'unset it for 16 MiB buckets, or set e.g. 25');
  return Math.max(1, Math.round(mb * (1 << 20) / 4));
}

export class GradReducer {
  /** The pending range [lo, hi): reported ready, not yet started (empty when lo === hi). */
  private lo = 0;
  private hi = 0;
  /** Ranges started, as [begin, end), in order. */
  readonly started: Array<[number, number]> = [];
  /** Buckets in flight, oldest first, with their sizes (at most MAX_IN_FLIGHT buckets' worth: bounded host copies). */
  private readonly works: Array<{ work: CommWork; size: number }> = [];
  private inFlight = 0;
  private finished = false;

  constructor(private readonly comm: Communicator, private readonly be: Backend, private readonly grads: Buf,
    private readonly total: number, private readonly shard: number, private readonly bucket = DEFAULT_BUCKET) {}

  /** The gradients of [begin, end) are final: joined to the pending range, started once the bucket is full. */
  ready(begin: number, end: number): void {
    if (this.finished) throw new DistilleryError(`gradient range [${begin}, ${end}) reported after the reduction finished`);
    if (!(begin >= 0 && end <= this.total && begin < end)) throw new DistilleryError(`gradient range [${begin}, ${end}) is not inside [0, ${this.total})`);
    for (const [a, b] of [...this.started, [this.lo, this.hi]]) {
      if (begin < b! && a! < end) throw new DistilleryError(`gradient range [${begin}, ${end}) reported twice (it meets [${a}, ${b}))`);
    }
    if (this.lo === this.hi) { this.lo = begin; this.hi = end; } else if (end === this.lo) this.lo = begin;
    else if (begin === this.hi) this.hi = end;
    else { this.flush(); this.lo = begin; this.hi = end; }
    if (this.hi - this.lo >= this.bucket) this.flush();
  }

  private flush(): void {
    if (this.lo === this.hi) return;
    this.start(this.lo, this.hi);
    this.lo = this.hi = 0;
  }

  private start(begin: number, end: number): void {
    // a transport that copies each bucket (the host's) holds at most MAX_IN_FLIGHT buckets' worth: the oldest first
    // (one that queues on the GPU copies nothing, and may be inside a captured region, where nothing may wait)
    if (!this.comm.overlapsRegions) while (this.works.length > 0 && this.inFlight + (end - begin) > MAX_IN_FLIGHT * this.bucket) this.waitOldest();
    this.started.push([begin, end]);
    this.works.push({ work: this.comm.reduceScatterStart(this.be, this.grads, begin, end, this.shard), size: end - begin });
    this.inFlight += end - begin;
  }

  private waitOldest(): void {
    const w = this.works.shift()!;
    w.work.wait();
    this.inFlight -= w.size;
  }

  /** The step failed: waits for the buckets started (nothing else is started); the reduction is over. */
  abandon(): void {
    this.finished = true;
    this.lo = this.hi = 0;
    while (this.works.length > 0) this.waitOldest();
  }

  /** Starts what is pending and every range never reported (in buckets), then waits for all of them. */
  finish(): void {
    if (this.finished) return;
    this.flush();
    const done = [...this.started].sort((x, y) => x[0] - y[0]);
    const gaps: Array<[number, number]> = [];
    let at = 0;
    for (const [a, b] of done) { if (a > at) gaps.push([at, a]); at = Math.max(at, b); }
    if (at < this.total) gaps.push([at, this.total]);
    // from the end of the buffer down, as the backward reports them
    for (const [a, b] of gaps.reverse()) for (let e = b; e > a; e -= this.bucket) this.start(Math.max(a, e - this.bucket), e);
    this.finished = true;
    while (this.works.length > 0) this.waitOldest();
  }
}
