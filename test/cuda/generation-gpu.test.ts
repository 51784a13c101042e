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
import type { Backend, DType } from '../../src/backend/backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { BatchGenerator } from '../../src/model/batch-generate.js';
import { Rng } from '../../src/util/rng.js';
import { ropeKvCacheWriteUnfused } from '../backend/reference.js';

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

test('ropeKvCacheWrite on CUDA stores what the ops it replaces store on CUDA (bit for bit), and the CPU backend\'s values (biases or none, q/k norms, per-sequence or scalar positions, every RoPE kind)', { skip }, () => {
  const cpu = createCpuBackend({ threads: 1 });
  const rng = new Rng(1130);
  const ropes: ModelConfig['rope'][] = [
    { type: 'default', theta: 1e6 }, { type: 'linear', theta: 1e4, factor: 4 },
    { type: 'llama3', theta: 5e5, factor: 32, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 },
    { type: 'yarn', theta: 1e6, factor: 4, originalMaxPositionEmbeddings: 32768, betaFast: 32, betaSlow: 1, attentionFactor: 1.1386, truncate: true },
  ];
  const B = 5, nKv = 2, tMax = 300;
  const rand = (n: number, s = 1): Float32Array => Float32Array.from({ length: n }, () => s * rng.normal());
  try {
    for (const rope of ropes) {
      // Qwen2.5-0.5B's heads with biases; Qwen3's (head_dim 128) with q/k norms
      for (const [nH, hd, norms] of [[14, 64, false], [16, 128, true]] as const) {
        const Q = nH * hd, KV = nKv * hd, W = Q + 2 * KV;
        // per-sequence positions (batched generation) and a scalar one (Generator's chunks), with and without biases
        const cases: Array<[DType, number, number | number[], boolean]> = [['bf16', 1, [0, 17, 299, 128, 5], true], ['f32', 1, [3, 0, 250, 1, 2], true],
          ['bf16', 3, [10, 0, 297, 40, 1], true], ['bf16', 4, 121, false], ['f32', 2, 298, false]];
        for (const [dt, t, pos, withBias] of cases) {
          const init = { qkv: rand(B * t * W), bias: rand(W), kc: rand(B * tMax * KV), vc: rand(B * tMax * KV), qw: rand(hd, 0.3).map((x) => 1 + x), kw: rand(hd, 0.3).map((x) => 1 + x) };
          const run = (be: Backend, fused: boolean): Float32Array[] => {
            const up = (x: Float32Array, w: string): ReturnType<Backend['alloc']> => { const b = be.alloc(x.length, w, dt); be.upload(b, x); return b; };
            const qkv = up(init.qkv, 'qkv'), bias = withBias ? up(init.bias, 'bias') : null, kc = up(init.kc, 'kc'), vc = up(init.vc, 'vc');
            const qkNorm = norms ? { q: up(init.qw, 'q_norm'), k: up(init.kw, 'k_norm'), eps: 1e-6 } : null;
            const q = be.alloc(B * t * Q, 'q', dt);
            let p0: number | { seqPositions: ReturnType<Backend['allocInt']> } = typeof pos === 'number' ? pos : 0;
            if (typeof pos !== 'number') { const seqPositions = be.allocInt(B, 'positions'); be.uploadInt(seqPositions, Int32Array.from(pos)); p0 = { seqPositions }; }
            if (fused) be.ropeKvCacheWrite(q, kc, vc, qkv, B, t, p0, tMax, nH, nKv, hd, rope, bias, qkNorm);
            else ropeKvCacheWriteUnfused(be, q, kc, vc, qkv, B, t, p0, tMax, nH, nKv, hd, rope, bias, qkNorm);
            return [q, kc, vc].map((x) => Float32Array.from(be.download(x)));
          };
          const f = run(cuda!, true), u = run(cuda!, false), c = run(cpu, true);
          ['q', 'k cache', 'v cache'].forEach((name, j) => {
            const what = `${rope.type} ${dt} t ${t} at ${String(pos)}${withBias ? ' biases' : ''}${norms ? ' q/k norms' : ''}: ${name}`;
            // bit for bit: every rope kernel rotates through rope_lo / rope_hi (explicit FMAs). Before them the compiler
            // contracted x1·c − x2·s into an FMA one way or the other, a last-bit difference of a product that
            // cancellation made several f32 ulps of the result (session 51 saw 3 on an H200) and that now and then
            // tipped a bf16 rounding (1 bf16 ulp, once in ~15k values); a value off by more than that fails at once
            // (within 2^-22 of the largest f32 value, one bf16 ulp of a bf16 one, v a copy), the count of values
            // differing at all below
            const f32Tol = 2 ** -22 * u[j]!.reduce((a, y) => Math.max(a, Math.abs(y)), 1);
            const tol = (x: number): number => (dt === 'bf16' ? 2 ** (Math.floor(Math.log2(Math.max(Math.abs(x), 2 ** -100))) - 7) : f32Tol);
            // the values written (q whole, the caches' rows [p, p + t) of each sequence): all the same bits
            const written = (i: number): boolean => {
              if (j === 0) return true;
              const row = Math.floor(i / KV), b = Math.floor(row / tMax), r = row % tMax, p = typeof pos === 'number' ? pos : pos[b]!;
              return r >= p && r < p + t;
            };
            let same = 0, count = 0;
            for (let i = 0; i < u[j]!.length; i++) {
              const a = f[j]![i]!, b = u[j]![i]!;
              if (written(i)) count++;
              if (Object.is(a, b)) { if (written(i)) same++; } else if (j === 2 || !written(i) || !(Math.abs(a - b) <= tol(Math.max(Math.abs(a), Math.abs(b))))) {
                assert.fail(`${what}: element ${i}: fused ${a}, the ops it replaces ${b}`);
              }
            }
            assert.equal(count, B * t * (j === 0 ? Q : KV), `${what}: the values written`);
            assert.equal(count - same, 0, `${what}: ${count - same} of ${count} values written differ in their last bit`);
            const e = maxRel(f[j]!, c[j]!);
            assert.ok(e < (dt === 'bf16' ? 8e-3 : norms ? 1e-5 : 1e-6), `${what}: CUDA vs CPU ${e}`);
          });
        }
      }
    }
  } finally { cpu.dispose(); }
});
