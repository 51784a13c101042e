/**
 * Data parallelism with a sharded optimizer (ZeRO-1), over a Communicator (comm.ts):
 *
 * - data: rank r takes micro-batches r, r + N, r + 2N, ... of the one deterministic loader order, so N ranks at batch
 *   b see, step for step, the batches one process sees with gradient accumulation over N micro-batches;
 * - loss weights: every token is weighted by 1 / (the step's counted tokens over all ranks), so the summed gradients are
 *   the single-process gradient of the global batch;
 * - gradients: reduce-scattered (grad-reducer.ts): each rank gets the sums over ranks of its shard only, in buckets
 *   started while the backward pass still runs: where the backend runs passes inline (the CPU), and on CUDA with NCCL,
 *   whose buckets queue on a second stream inside the captured pass (the host transport's go after the pass); the
 *   global norm (clipping uses it) is the sum over ranks of each shard's sum of squares;
 * - optimizer: each rank keeps the AdamW moments of its contiguous shard of the trainable buffer only (shardOf), and a
 *   bf16 model the fp32 masters of that shard only (Transformer masterRange); it updates that shard of the masters and of
 *   their compute copy, then the updated shards are all-gathered (the bf16 compute copy when the masters are sharded,
 *   else the fp32 weights), so every rank holds the whole updated model. Checkpoints gather masters and moments.
 */
import type { Backend, AdamWSegment, Buf } from '../backend/backend.js';
import type { AdamWOptions, Optimizer, Trainable } from '../train/optimizer.js';
import { shardOf, type Communicator } from './comm.js';
import { GradReducer, gradBucketElements } from './grad-reducer.js';
import { float32Of, storageOrder } from '../model/params.js';

export class ShardedAdamW implements Optimizer {
  readonly m: Buf;
  readonly v: Buf;
  step = 0;
  readonly shard: { size: number; begin: number; end: number };
  /** The model keeps the fp32 masters of this shard only (Transformer masterRange): the compute copy is what is gathered. */
  readonly shardedMasters: boolean;
  private readonly be: Backend;
  private readonly segments: AdamWSegment[];

  constructor(private readonly model: Trainable, readonly opts: AdamWOptions, readonly comm: Communicator) {
    if (!model.grads) throw new Error('ShardedAdamW: the trainable has no gradients');
    this.be = model.backend;
    this.shard = shardOf(model.layout.total, comm.world, comm.rank);
    this.shardedMasters = (model.masterLength ?? model.layout.total) < model.layout.total;
    if (this.shardedMasters && (model.masterOffset !== this.shard.begin || model.masterLength !== this.shard.end - this.shard.begin)) {
      throw new Error(`ShardedAdamW: the model's masters [${model.masterOffset}, +${model.masterLength}) are not rank ${comm.rank}'s shard [${this.shard.begin}, ${this.shard.end})`);
    }
    const n = Math.max(1, this.shard.end - this.shard.begin);
    this.m = this.be.alloc(n, `optimizer first moment (shard ${comm.rank} of ${comm.world})`);
    this.v = this.be.alloc(n, `optimizer second moment (shard ${comm.rank} of ${comm.world})`);
    // the tensors' parts inside the shard, relative to its start, in storage order
    const { begin, end } = this.shard;
    this.segments = storageOrder(model.layout)
      .map((t) => ({ offset: Math.max(t.offset, begin), end: Math.min(t.offset + t.size, end), decay: t.decay }))
      .filter((s) => s.end > s.offset)
      .map((s) => ({ offset: s.offset - begin, size: s.end - s.offset, decay: s.decay }));
  }

  /** The reduction of the step in progress (beginStep), finished by gradNorm(). */
  private reducer: GradReducer | null = null;
  /** Elements per gradient bucket (DISTILLERY_GRAD_BUCKET_MB). */
  bucket = gradBucketElements();

  /**
   * A step's reduction: in buckets during the backward pass where the backend runs the pass inline (the CPU) or the
   * communicator works inside a captured pass (NCCL); else after the pass, in one range, since nothing would overlap.
   */
  private newReducer(): GradReducer {
    const total = this.model.layout.total;
    return new GradReducer(this.comm, this.be, this.model.grads!, total, this.shard.size, this.afterPass ? total : this.bucket);
  }

  /** The reduction waits for the pass: it is a captured region and the communicator cannot work inside one (the host's). */
  private get afterPass(): boolean { return this.be.recordsRegions && this.comm.overlapsRegions !== true; }

  /** A new step's gradient reduction: what the last backward pass reports its final ranges to (undefined: after it). */
  beginStep(): ((begin: number, end: number) => void) | undefined {
    const red = this.reducer = this.newReducer();
    return this.afterPass ? undefined : (begin, end) => red.ready(begin, end);
  }

  abandonStep(): void {
    const red = this.reducer;
    this.reducer = null;
    red?.abandon();
  }

  /** Finishes the reduction of the shard's gradients, then their global L2 norm (the same on every rank). */
  gradNorm(): number {
    (this.reducer ?? this.newReducer()).finish();
    this.reducer = null;
    const { begin, end } = this.shard, n = end - begin;
    const local = n > 0 ? this.be.sumSquares(this.be.view(this.model.grads!, begin, n), n) : 0;
    return Math.sqrt(this.comm.world > 1 ? this.comm.allReduceHost([local])[0]! : local);
  }

  update(lr: number, gradScale: number): void {
    this.step++;
    const be = this.be, { begin, end, size } = this.shard, n = end - begin;
    const p = this.model.params, w = this.model.weights, g = this.model.grads!;
    if (n > 0) {
      const view = (b: Buf): Buf => be.view(b, begin, n);
      be.adamwSegments(this.shardedMasters ? be.view(p, 0, n) : view(p), view(g), be.view(this.m, 0, n), be.view(this.v, 0, n), this.segments, {
        lr, beta1: this.opts.beta1, beta2: this.opts.beta2, eps: this.opts.eps, weightDecay: this.opts.weightDecay, step: this.step, gradScale,
      }, w === p ? null : view(w));
    }
    if (this.shardedMasters) {
      // every rank's updated compute copy of its shard, gathered (ZeRO-1: the masters stay sharded)
      this.comm.allGather(be, w, size);
      return;
    }
    this.comm.allGather(be, p, size);
    if (w !== p) be.copy(w, p);
  }

  /** The whole fp32 master weights (for a checkpoint; the same on every rank: a collective when they are sharded). */
  gatherMasters(): Float32Array {
    if (!this.shardedMasters) return float32Of(this.be.download(this.model.params));
    return this.gatherShard(this.model.params);
  }

  /** The whole moments, gathered from every rank's shard (for a checkpoint; the same on every rank). */
  gatherMoments(): { m: Float32Array; v: Float32Array } {
    return { m: this.gatherShard(this.m), v: this.gatherShard(this.v) };
  }

  /** This rank's shard of b (its first shard-length floats) from every rank, gathered into the whole (a collective). */
  private gatherShard(b: Buf): Float32Array {
    const n = this.shard.end - this.shard.begin;
    const part = n > 0 ? float32Of(this.be.download(this.be.view(b, 0, n))) : new Float32Array(0);
    return this.comm.allGatherHost(part, this.shard.size).subarray(0, this.model.layout.total);
  }

  /** Loads this rank's shard of whole moments (--resume). */
  loadMoments(m: Float32Array, v: Float32Array): void {
    const { begin, end } = this.shard;
    if (end > begin) { this.be.upload(this.m, m.subarray(begin, end)); this.be.upload(this.v, v.subarray(begin, end)); }
  }
}
