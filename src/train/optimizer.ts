/**
 * AdamW over a model's flat parameter buffer: first and second moments in the same layout, one backend
 * `adamw` call per tensor so that weight decay applies to matrices and embeddings but not to norms and biases.
 * Global-norm clipping is folded into the update as a gradient scale (no extra pass over the gradients).
 */
import type { Backend, Buf } from '../backend/backend.js';
import type { Transformer } from '../model/transformer.js';

export interface AdamWOptions {
  beta1: number;
  beta2: number;
  eps: number;
  weightDecay: number;
}

export class AdamW {
  readonly m: Buf;
  readonly v: Buf;
  /** Number of updates applied so far (bias correction uses step + 1). */
  step = 0;
  private readonly be: Backend;

  constructor(private readonly model: Transformer, readonly opts: AdamWOptions) {
    this.be = model.backend;
    this.m = this.be.alloc(model.layout.total, 'optimizer first moment');
    this.v = this.be.alloc(model.layout.total, 'optimizer second moment');
  }

  /** The global L2 norm of the gradients. */
  gradNorm(): number {
    return Math.sqrt(this.be.sumSquares(this.model.grads!, this.model.layout.total));
  }

  /** Applies one update with learning rate lr; gradients are multiplied by gradScale first. */
  update(lr: number, gradScale: number): void {
    this.step++;
    const be = this.be, g = this.model.grads!, p = this.model.params, w = this.model.weights;
    for (const t of this.model.layout.tensors) {
      const view = (b: Buf): Buf => be.view(b, t.offset, t.size);
      // A bf16 model's compute copy is refreshed in the same launch (fp32: the weights are the parameters).
      be.adamw(view(p), view(g), view(this.m), view(this.v), t.size, {
        lr, beta1: this.opts.beta1, beta2: this.opts.beta2, eps: this.opts.eps,
        weightDecay: t.decay ? this.opts.weightDecay : 0, step: this.step, gradScale,
      }, w === p ? null : view(w));
    }
  }
}
