/**
 * A model's logits and gradients on one fixed probe, for tests that compare two ways of running the same model (a
 * fused product against separate ones): token ids (7i + 3) mod vocab, the forward's logits, then the backward of the
 * logit gradient sin(i) from zeroed gradients, and the trainable buffer's gradients (the adapters' with LoRA).
 */
import type { Backend } from '../../src/backend/backend.js';
import type { Transformer } from '../../src/model/transformer.js';

export function logitsAndGrads(be: Backend, m: Transformer, b: number, t: number): { logits: Float64Array; grads: Float64Array } {
  const n = b * t, v = m.config.vocabSize;
  const ids = Int32Array.from({ length: n }, (_, i) => (i * 7 + 3) % v);
  const logits = Float64Array.from(be.download(m.forward(ids, b, t)));
  const dl = be.alloc(n * v, 'dlogits');
  be.upload(dl, Float64Array.from({ length: n * v }, (_, i) => Math.sin(i)));
  m.zeroGrad();
  m.backward(dl);
  return { logits, grads: Float64Array.from(be.download(m.trainable().grads!)) };
}
