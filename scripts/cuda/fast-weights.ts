/**
 * Random weights for a preset, fast: uniform with std 0.02 from an xorshift generator (norms 1, biases 0). The values
 * do not matter for throughput or pre-warm, and a per-element Box-Muller over billions of parameters takes minutes in
 * JavaScript. A model above one typed array (MAX_FLAT_WEIGHTS: 7B and up) gets its weights tensor by tensor, as
 * readCheckpoint gives them. Used by the GPU benchmarks (make-teacher.ts, lora-step.ts).
 */
import type { ModelConfig } from '../../src/model/config.js';
import { MAX_FLAT_WEIGHTS, TensorWeights, parameterLayout, type TensorInfo, type Weights } from '../../src/model/params.js';

export function fastWeights(c: ModelConfig): Weights {
  const layout = parameterLayout(c);
  let x = 0x9e3779b9 | 0;
  const a = 0.02 * Math.sqrt(3) / 2147483648;
  const fill = (t: TensorInfo, w: Float32Array, at: number): void => {
    if (t.init === 'ones') { w.fill(1, at, at + t.size); return; }
    if (t.init === 'zeros') return;
    for (let i = at, e = at + t.size; i < e; i++) { x ^= x << 13; x ^= x >>> 17; x ^= x << 5; w[i] = x * a; }
  };
  if (layout.total > MAX_FLAT_WEIGHTS) {
    return TensorWeights.of(layout, new Map(layout.tensors.map((t) => { const w = new Float32Array(t.size); fill(t, w, 0); return [t.name, w]; })));
  }
  const w = new Float32Array(layout.total);
  for (const t of layout.tensors) fill(t, w, t.offset);
  return w;
}
