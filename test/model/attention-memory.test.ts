/**
 * Attention memory is linear in the sequence length: the saved state is the per-row log-sum-exp ([B, heads, T]),
 * so the job estimate (and the pre-flight "largest --seq that fits") and what a Transformer really allocates grow
 * linearly in T, and a long sequence trains on the CPU without a [T, T] buffer anywhere.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Backend } from '../../src/backend/backend.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { presetConfig } from '../../src/model/config.js';
import { estimateJobBytes } from '../../src/model/memory.js';
import { DEFAULT_HEAD_CHUNK_FLOATS, headFloats } from '../../src/train/head.js';
import { LOSS_STATS } from '../../src/backend/backend.js';
import { initialWeights } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { Rng } from '../../src/util/rng.js';

const LONG: ModelConfig = {
  architecture: 'qwen2', vocabSize: 50, hiddenSize: 16, intermediateSize: 24, numLayers: 1, numHeads: 2, numKvHeads: 1,
  headDim: 8, rope: { type: 'default', theta: 10000 }, rmsNormEps: 1e-6, tieWordEmbeddings: true, maxPositionEmbeddings: 8192, qkvBias: true, qkNorm: false, noRopeLayers: [],
};

/** A backend that counts allocated elements and remembers the largest single allocation. */
function counting(be: Backend): { be: Backend; floats: () => number; largest: () => [number, string] } {
  let floats = 0, big = 0, bigLabel = '';
  const note = (n: number, label: string): void => { floats += n; if (n > big) { big = n; bigLabel = label; } };
  const proxy = new Proxy(be, {
    get(target, prop, recv) {
      if (prop === 'alloc') return (n: number, label: string) => { note(n, label); return target.alloc(n, label); };
      if (prop === 'allocInt') return (n: number, label: string) => { note(n, label); return target.allocInt(n, label); };
      const v = Reflect.get(target, prop, recv) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  }) as Backend;
  return { be: proxy, floats: () => floats, largest: () => [big, bigLabel] };
}

test('the job memory estimate is affine in the sequence length (no T² attention term) but for the bounded LM-head chunk, training and inference', () => {
  const student = presetConfig('qwen2.5-0.5b', 151936), teacher = presetConfig('qwen2.5-1.5b', 151936);
  for (const training of [true, false]) {
    // The head's logits chunk holds the rows split evenly over the fewest chunks (src/train/head.ts headRows): it varies
    // with T, below a fixed bound; the rest is affine.
    const head = (seq: number): number => 4 * headFloats(4 * seq, 151936, training, DEFAULT_HEAD_CHUNK_FLOATS, false);
    for (const seq of [1024, 3072, 8192]) {
      const chunk = head(seq) / 4 - 4 * seq * (2 + LOSS_STATS + (training ? LOSS_STATS : 0));
      assert.ok(chunk <= (training ? 2 : 1) * DEFAULT_HEAD_CHUNK_FLOATS, `training=${training} T=${seq}: a head chunk of ${chunk} floats`);
    }
    const e = (seq: number) => estimateJobBytes({ student, teacher: training ? teacher : null, batch: 4, seq, training }) - head(seq);
    // e(T) = a + b·T exactly: equal steps between 1024 → 2048 → 3072 → 4096, and 8192 costs 2·e(4096) − e(0)
    const d1 = e(2048) - e(1024), d2 = e(3072) - e(2048), d3 = e(4096) - e(3072);
    assert.equal(d2, d1, `training=${training}: step 2048→3072 differs from 1024→2048`);
    assert.equal(d3, d1, `training=${training}: step 3072→4096 differs from 1024→2048`);
    assert.equal(e(8192) - e(4096), 4 * d1, `training=${training}: 4096→8192`);
  }
});

test('a training Transformer allocates linearly in T (largest buffer is not [T, T]) and runs forward + backward at T = 2048', () => {
  const alloc = (seq: number): number => {
    const c = counting(createCpuBackend({ threads: 1 }));
    try { new Transformer(c.be, LONG, { batch: 1, seq, training: true }); return c.floats(); } finally { c.be.dispose(); }
  };
  assert.equal(alloc(2048) - alloc(1024), 2 * (alloc(1024) - alloc(512)), 'allocations are affine in T');

  const c = counting(createCpuBackend({ threads: 2 }));
  try {
    const T = 2048;
    const m = new Transformer(c.be, LONG, { batch: 1, seq: T, training: true });
    c.be.upload(m.params, initialWeights(m.layout, LONG, new Rng(5)));
    const [big, label] = c.largest();
    assert.ok(big < T * T / 4, `largest allocation ${label} holds ${big} elements (≥ T²/4 = ${T * T / 4})`);
    const rng = new Rng(9);
    const ids = Int32Array.from({ length: T }, () => rng.int(LONG.vocabSize));
    m.zeroGrad();
    const logits = m.forward(ids, 1, T);
    const z = c.be.download(logits);
    assert.ok(z.every(Number.isFinite), 'logits finite');
    // dlogits: a fixed pseudo-random direction, so every position's attention backward contributes
    const dz = Float32Array.from({ length: z.length }, () => rng.normal() * 1e-3);
    c.be.upload(logits, dz);
    m.backward(logits);
    const g = c.be.download(m.grads!);
    assert.ok(g.every(Number.isFinite), 'gradients finite');
    assert.ok(g.some((x) => x !== 0), 'gradients non-zero');
  } finally { c.be.dispose(); }
});
