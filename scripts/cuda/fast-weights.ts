/**
 * Random weights for a preset, fast: uniform with std 0.02 from an xorshift generator (norms 1, biases 0). The values
 * do not matter for throughput or pre-warm, and a per-element Box-Muller over billions of parameters takes minutes in
 * JavaScript. Used by the GPU benchmarks (make-teacher.ts, lora-step.ts).
 */
import type { ModelConfig } from '../../src/model/config.js';
import { parameterLayout } from '../../src/model/params.js';

export function fastWeights(c: ModelConfig): Float32Array {
  const layout = parameterLayout(c), w = new Float32Array(layout.total);
  let x = 0x9e3779b9 | 0;
  const a = 0.02 * Math.sqrt(3) / 2147483648;
  for (const t of layout.tensors) {
    if (t.init === 'ones') { w.fill(1, t.offset, t.offset + t.size); continue; }
    if (t.init === 'zeros') continue;
    for (let i = t.offset, e = t.offset + t.size; i < e; i++) { x ^= x << 13; x ^= x >>> 17; x ^= x << 5; w[i] = x * a; }
  }
  return w;
}
