/** Identity of a model's weights: what a teacher cache and a LoRA adapter record of the model they were made from. */
import { createHash, type Hash } from 'node:crypto';
import { TensorWeights, type TensorInfo, type Weights } from './params.js';

/**
 * SHA-256 of a model's float32 weights as distillery loads them, tensor after tensor in the Hugging Face order of
 * `layout.tensors` (the flat order of versions before q/k/v were grouped: parameterLayout, so caches and adapters
 * recorded then still match), so a bf16 and an f32 copy of the same values hash alike, and a model kept tensor by tensor
 * (TensorWeights) hashes as its flat array would. In chunks: one Uint8Array view of a 1.5B-parameter model's 6 GB exceeds
 * V8's typed-array limit.
 */
export function weightsHash(w: Weights, layout: { readonly tensors: ReadonlyArray<Pick<TensorInfo, 'offset' | 'size'>> }, chunkBytes = 1 << 28): string {
  const h = createHash('sha256');
  if (w instanceof TensorWeights) {
    for (const t of w.layout.tensors) update(h, w.tensor(t), chunkBytes);
  } else {
    const covered = layout.tensors.reduce((s, t) => s + t.size, 0);
    if (covered !== w.length) throw new Error(`weightsHash: the layout's tensors hold ${covered} values, the weights ${w.length}`);
    for (const t of layout.tensors) update(h, w.subarray(t.offset, t.offset + t.size), chunkBytes);
  }
  return h.digest('hex');
}

function update(h: Hash, w: Float32Array, chunkBytes: number): void {
  const step = Math.max(4, chunkBytes - (chunkBytes % 4));
  for (let off = 0; off < w.byteLength; off += step) {
    h.update(new Uint8Array(w.buffer, w.byteOffset + off, Math.min(step, w.byteLength - off)));
  }
}
