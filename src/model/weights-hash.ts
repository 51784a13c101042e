/** Identity of a model's weights: what a teacher cache and a LoRA adapter record of the model they were made from. */
import { createHash } from 'node:crypto';

/**
 * SHA-256 of a flat float32 weight array as distillery loads it (layout order), so a bf16 and an f32 copy of the same
 * values hash alike. In chunks: one Uint8Array view of a 1.5B-parameter model's 6 GB exceeds V8's typed-array limit.
 */
export function weightsHash(w: Float32Array, chunkBytes = 1 << 28): string {
  const h = createHash('sha256');
  const step = Math.max(4, chunkBytes - (chunkBytes % 4));
  for (let off = 0; off < w.byteLength; off += step) {
    h.update(new Uint8Array(w.buffer, w.byteOffset + off, Math.min(step, w.byteLength - off)));
  }
  return h.digest('hex');
}
