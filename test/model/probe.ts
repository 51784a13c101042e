/**
 * A model's logits and gradients on one fixed probe, for tests that compare two ways of running the same model (a
 * fused product against separate ones): token ids (7i + 3) mod vocab, the forward's logits, then the backward of the
 * logit gradient sin(i) from zeroed gradients, and the trainable buffer's gradients (the adapters' with LoRA).
 */
import assert from 'node:assert/strict';
import type { Backend } from '../../src/backend/backend.js';
import type { Transformer } from '../../src/model/transformer.js';
import { assertNear } from '../util/compare.js';

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

/**
 * The probe of a model run fused and of the same model run unfused (run(true), run(false)): logits and gradients within
 * tol of each other, and the gradients not all zero (so the comparison says something).
 */
export function assertFusedMatches(run: (fuse: boolean) => { logits: Float64Array; grads: Float64Array }, tol = 1e-12): void {
  const f = run(true), u = run(false);
  assertNear(f.logits, u.logits, tol, 'logits');
  assertNear(f.grads, u.grads, tol, 'gradients');
  assert.ok(u.grads.some((x) => x !== 0), 'the unfused gradients are not all zero');
}
