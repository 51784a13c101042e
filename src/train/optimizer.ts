/**
 * AdamW over a model's flat parameter buffer: first and second moments in the same layout, one backend
 * `adamwSegments` update over every tensor, with weight decay on matrices and embeddings but not on norms and biases.
 * Global-norm clipping is folded into the update as a gradient scale (no extra pass over the gradients).
 */
import type { AdamWSegment, Backend, Buf } from '../backend/backend.js';
import { sharedFloat32, storageOrder, type TensorInfo } from '../model/params.js';

/** What AdamW trains: a flat buffer of tensors (a model's parameters, or its LoRA adapters), its gradients, its compute copy. */
export interface Trainable {
  readonly backend: Backend;
  readonly params: Buf;
  readonly weights: Buf;
  readonly grads: Buf | null;
  readonly layout: { readonly tensors: readonly TensorInfo[]; readonly total: number };
  /** With sharded masters (data parallel): `params` holds [masterOffset, masterOffset + masterLength) of the layout only. */
  readonly masterOffset?: number;
  readonly masterLength?: number;
}

/** What a training step asks of its optimizer (AdamW; ShardedAdamW, src/parallel/data-parallel.ts, for data parallelism). */
export interface Optimizer {
  /** Updates applied so far. */
  step: number;
  /**
   * Called at the start of a step's gradients (data parallel): a receiver for the ranges of the trainable buffer whose
   * gradients the last micro-batch's backward pass has made final, or undefined.
   */
  beginStep?(): ((begin: number, end: number) => void) | undefined;
  /**
   * The step failed between beginStep and gradNorm (a non-finite loss, an error in the pass): waits for the reductions
   * it started (on the GPU: the main stream joins the side stream, so the next step's zeroing cannot race them) and
   * drops the rest. Ranks that started different buckets cannot go on together: in a run such an error is fatal.
   */
  abandonStep?(): void;
  /** The global L2 norm of the gradients (after summing them over ranks, when there are several). */
  gradNorm(): number;
  /** One update with learning rate lr, the gradients multiplied by gradScale first. */
  update(lr: number, gradScale: number): void;
  /** The whole first and second moments, for a checkpoint; the arrays may be reused by the next call (AdamW keeps them). */
  gatherMoments(): { m: Float32Array; v: Float32Array };
  /** The host arrays gatherMoments fills again at each call (allocated now if needed), where it keeps them; else null. */
  keptMoments?(): { m: Float32Array; v: Float32Array } | null;
  /** Loads whole moments from a checkpoint. */
  loadMoments(m: Float32Array, v: Float32Array): void;
}

export interface AdamWOptions {
  beta1: number;
  beta2: number;
  eps: number;
  weightDecay: number;
}

export class AdamW implements Optimizer {
  readonly m: Buf;
  readonly v: Buf;
  /** Number of updates applied so far (bias correction uses step + 1). */
  step = 0;
  private readonly be: Backend;

  constructor(private readonly model: Trainable, readonly opts: AdamWOptions) {
    if (!model.grads) throw new Error('AdamW: the trainable has no gradients');
    this.be = model.backend;
    this.m = this.be.alloc(model.layout.total, 'optimizer first moment');
    this.v = this.be.alloc(model.layout.total, 'optimizer second moment');
    this.segments = storageOrder(model.layout).map((t) => ({ offset: t.offset, size: t.size, decay: t.decay }));
  }

  /** The tensors of the flat buffer, with weight decay on matrices and embeddings only. */
  private readonly segments: AdamWSegment[];

  /**
   * The moments as float32 host arrays the optimizer keeps for checkpoints and fills again at each call (valid until
   * the next): each save downloads into pages already mapped (Transformer.checkpointWeights says why). Steady host
   * memory: 8 bytes per trained parameter from the first call of this or keptMoments (a run makes them at its start).
   */
  gatherMoments(): { m: Float32Array; v: Float32Array } {
    const host = this.keptMoments();
    this.be.download(this.m, host.m);
    this.be.download(this.v, host.v);
    return host;
  }

  keptMoments(): { m: Float32Array; v: Float32Array } {
    const n = this.model.layout.total;
    this.host ??= { m: sharedFloat32(n), v: sharedFloat32(n) }; // shared with the checkpoint writer's thread
    return this.host;
  }
  private host: { m: Float32Array; v: Float32Array } | null = null;

  loadMoments(m: Float32Array, v: Float32Array): void {
    this.be.upload(this.m, m);
    this.be.upload(this.v, v);
  }

  /** The global L2 norm of the gradients. */
  gradNorm(): number {
    return Math.sqrt(this.be.sumSquares(this.model.grads!, this.model.layout.total));
  }

  /** Applies one update with learning rate lr; gradients are multiplied by gradScale first. */
  update(lr: number, gradScale: number): void {
    this.step++;
    const be = this.be, g = this.model.grads!, p = this.model.params, w = this.model.weights;
    // One update over every tensor (one launch on the GPU, whose per-step values it reads from device memory), as a
    // captured region: the same graph replays every step. A bf16 model's compute copy is refreshed by the same update.
    be.captured('optimizer', () => be.adamwSegments(p, g, this.m, this.v, this.segments, {
      lr, beta1: this.opts.beta1, beta2: this.opts.beta2, eps: this.opts.eps, weightDecay: this.opts.weightDecay, step: this.step, gradScale,
    }, w === p ? null : w));
  }
}
