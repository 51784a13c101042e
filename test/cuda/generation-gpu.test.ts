/**
 * Generation on CUDA against the CPU backend, per family: the prefill's logits (training's causal attention over the
 * rows it writes), then decode steps' logits (the cache-reading kernel at per-sequence positions), through the layers
 * as the model runs them: an inference model's fused q/k/v product (rotated from its columns for Qwen2's biases, split
 * for Qwen3's q/k norms, a NoPE layer for SmolLM3) and a training model's fused gate/up product (the on-policy student).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createCudaBackend } from '../../src/backend/cuda/index.js';
import type { CudaBackend } from '../../src/backend/cuda/cuda-backend.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { Backend } from '../../src/backend/backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { BatchGenerator } from '../../src/model/batch-generate.js';
import { Rng } from '../../src/util/rng.js';

const dir = process.env.DISTILLERY_CACHE_DIR ?? mkdtempSync(join(tmpdir(), 'dk-generation-'));
let cuda: CudaBackend | null = null, reason = '';
try { cuda = createCudaBackend({ strict: false, cacheDir: dir, log: () => {} }); } catch (e) { reason = (e as Error).message; }
const skip = cuda ? false : `no CUDA GPU here (${reason})`;
after(() => cuda?.dispose());

const base = {
  vocabSize: 300, hiddenSize: 128, intermediateSize: 192, numLayers: 3, numHeads: 4, numKvHeads: 2, headDim: 32,
  rmsNormEps: 1e-6, tieWordEmbeddings: false, maxPositionEmbeddings: 256, noRopeLayers: [] as number[],
};
const FAMILIES: Array<[string, ModelConfig]> = [
  ['Qwen2 (q/k/v biases, tied)', { ...base, architecture: 'qwen2', rope: { type: 'default', theta: 1e6 }, qkvBias: true, qkNorm: false, tieWordEmbeddings: true }],
  ['Qwen3 (q/k norms, head_dim 64)', { ...base, architecture: 'qwen3', headDim: 64, rope: { type: 'default', theta: 1e6 }, qkvBias: false, qkNorm: true }],
  ['SmolLM3 (NoPE layer 1)', { ...base, architecture: 'smollm3', rope: { type: 'default', theta: 5e6 }, qkvBias: false, qkNorm: false, noRopeLayers: [1] }],
];

function maxRel(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let e = 0, s = 0;
  for (let i = 0; i < a.length; i++) { e = Math.max(e, Math.abs(a[i]! - b[i]!)); s = Math.max(s, Math.abs(b[i]!)); }
  return e / s;
}

for (const [name, cfg] of FAMILIES) {
  test(`generation on CUDA equals the CPU backend: ${name}, an inference model and a training model, prefill and decode logits`, { skip, timeout: 300_000 }, () => {
    const w = initialWeights(parameterLayout(cfg), cfg, new Rng(11), 0.5);
    for (const training of [false, true]) {
      const make = (be: Backend): { g: BatchGenerator; m: Transformer } => {
        const m = new Transformer(be, cfg, { batch: 3, seq: 40, training, precision: 'fp32' });
        m.setWeights(w);
        return { g: new BatchGenerator(m, 3, 120), m };
      };
      const cpu = createCpuBackend({ threads: 1 });
      try {
        const g = make(cuda!), c = make(cpu);
        if (training) assert.ok(g.m.layerW.every((x) => x.wgu !== null), 'a training model runs the fused gate/up product');
        assert.ok(g.m.layerW.every((x) => x.wqkv !== null), 'the model runs the fused q/k/v product');
        // one prompt longer than a round of the decode kernel's warps (16 warps, 4 rows each: 64 rows), so the decode
        // steps merge several rounds per warp; the others short
        const prompts = [Array.from({ length: 90 }, (_, i) => (i * 37 + 5) % cfg.vocabSize), [40, 41], [7, 8, 200, 3]];
        const e0 = maxRel(g.g.prefill(prompts), c.g.prefill(prompts));
        assert.ok(e0 < 1e-4, `${training ? 'training' : 'inference'} prefill: ${e0}`);
        for (let s = 0; s < 4; s++) {
          const next = Int32Array.of(10 + s, 60 + 3 * s, 250 - s);
          const e = maxRel(g.g.decode(next), c.g.decode(next));
          assert.ok(e < 1e-4, `${training ? 'training' : 'inference'} decode step ${s}: ${e}`);
        }
        // greedy ids over 12 steps from the same prompts: the same on both
        const opts = { temperature: 0, topP: 1, topK: 0, maxNewTokens: 12 };
        assert.deepEqual(g.g.generateOnDevice(prompts, opts).tokens, c.g.generateOnDevice(prompts, opts).tokens);
      } finally { cpu.dispose(); }
    }
  });
}
