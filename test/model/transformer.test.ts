/**
 * Whole-model tests on the CPU backend: logits against an independent float64 reference (Qwen2 biases, GQA,
 * RoPE theta, tied and untied heads, Llama without biases), every parameter's gradient against central finite
 * differences in float64 (plain training and each distillation loss), KV-cache generation against the full
 * forward, and a tiny model whose loss falls when trained.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { Backend, LossSpec } from '../../src/backend/backend.js';
import { LOSS_STATS } from '../../src/backend/backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { Generator } from '../../src/model/generate.js';
import { AdamW } from '../../src/train/optimizer.js';
import { StepRunner, type Batch } from '../../src/train/step.js';
import { Rng } from '../../src/util/rng.js';
import { LOSS_SPECS } from '../util/loss-specs.js';
import { referenceLogits } from './reference.js';

function tinyConfig(over: Partial<ModelConfig> = {}): ModelConfig {
  return {
    architecture: 'qwen2', vocabSize: 13, hiddenSize: 8, intermediateSize: 12, numLayers: 2, numHeads: 4,
    numKvHeads: 2, headDim: 2, rope: { type: 'default', theta: 1e6 }, rmsNormEps: 1e-6, tieWordEmbeddings: true,
    maxPositionEmbeddings: 64, qkvBias: true, qkNorm: false, noRopeLayers: [], ...over,
  };
}

/** Random weights with non-trivial norms and biases, so every parameter matters. */
function randomWeights(m: Transformer, seed: number, std = 0.5): Float64Array {
  const rng = new Rng(seed);
  const w = Float64Array.from(initialWeights(m.layout, m.config, rng, std));
  for (const t of m.layout.tensors) {
    if (t.init === 'ones' || t.init === 'zeros') {
      for (let i = 0; i < t.size; i++) w[t.offset + i] = (t.init === 'ones' ? 1 : 0) + 0.3 * rng.normal();
    }
  }
  return w;
}

function randomIds(rng: Rng, n: number, V: number): Int32Array {
  return Int32Array.from({ length: n }, () => rng.int(V));
}

const configs: Array<[string, ModelConfig]> = [
  ['qwen2 tied, GQA, theta 1e6', tinyConfig()],
  ['qwen2 untied, MHA, theta 1e4', tinyConfig({ tieWordEmbeddings: false, numKvHeads: 4, rope: { type: 'default', theta: 1e4 }, rmsNormEps: 1e-5 })],
  ['llama no biases, head_dim 4', tinyConfig({ architecture: 'llama', qkvBias: false, numHeads: 2, numKvHeads: 1, headDim: 4 })],
  // Scaled RoPE at head_dim 8, theta 1e4, original context 64: every band of llama3 and of the yarn ramp is hit.
  ['llama3 rope scaling', tinyConfig({ architecture: 'llama', qkvBias: false, numHeads: 2, numKvHeads: 1, headDim: 8,
    rope: { type: 'llama3', theta: 1e4, factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 64 } })],
  ['yarn rope scaling (attention factor 1.3)', tinyConfig({ numHeads: 2, numKvHeads: 2, headDim: 8,
    rope: { type: 'yarn', theta: 1e4, factor: 4, originalMaxPositionEmbeddings: 64, betaFast: 32, betaSlow: 1, attentionFactor: 1.3, truncate: true } })],
  ['linear rope scaling', tinyConfig({ numHeads: 2, numKvHeads: 1, headDim: 4, rope: { type: 'linear', theta: 1e4, factor: 3 } })],
  // transformers' Llama attention_bias: biases on q/k/v AND o_proj (the reference adds o_proj.bias by that rule).
  ['llama attention_bias (q/k/v and o biases), GQA, untied', tinyConfig({ architecture: 'llama', qkvBias: true, tieWordEmbeddings: false })],
  // Qwen3: per-head q/k norms; head_dim 6 × 2 heads = a query width of 12 against hidden 8.
  ['qwen3 q/k norms, head_dim 6 (query width ≠ hidden), GQA, untied', tinyConfig({ architecture: 'qwen3', qkvBias: false, qkNorm: true,
    numHeads: 2, numKvHeads: 1, headDim: 6, tieWordEmbeddings: false })],
  ['qwen3 attention_bias (q/k/v and o), yarn', tinyConfig({ architecture: 'qwen3', qkvBias: true, qkNorm: true, numHeads: 2, numKvHeads: 2, headDim: 8,
    rope: { type: 'yarn', theta: 1e4, factor: 4, originalMaxPositionEmbeddings: 64, betaFast: 32, betaSlow: 1, attentionFactor: 1.3, truncate: true } })],
  // SmolLM3: RoPE off on layer 1 (of 3), biases on q/k/v/o; and on every layer.
  ['smollm3 NoPE layer 1 of 3, attention_bias', tinyConfig({ architecture: 'smollm3', qkvBias: true, numLayers: 3, noRopeLayers: [1] })],
  ['smollm3 every layer NoPE, no biases', tinyConfig({ architecture: 'smollm3', qkvBias: false, noRopeLayers: [0, 1] })],
];

for (const [name, cfg] of configs) {
  test(`logits match the float64 reference: ${name}`, () => {
    const be = createCpuBackend({ dtype: 'f32', threads: 1 });
    try {
      const b = 2, t = 5;
      const m = new Transformer(be, cfg, { batch: b, seq: t, training: false });
      const w = randomWeights(m, 1);
      m.setWeights(w);
      const ids = randomIds(new Rng(2), b * t, cfg.vocabSize);
      const got = be.download(m.forward(ids, b, t));
      const ref = referenceLogits(cfg, m.layout, Float32Array.from(w), ids, b, t);
      let num = 0, den = 0;
      for (let i = 0; i < ref.length; i++) { num += (got[i]! - ref[i]!) ** 2; den += ref[i]! ** 2; }
      assert.ok(Math.sqrt(num / den) < 1e-5, `relative error ${Math.sqrt(num / den)}`);
    } finally { be.dispose(); }
  });
}

/** Σ_i weight_i · loss_i for a batch, evaluated with the current weights (no gradient). */
function weightedLoss(be: Backend, m: Transformer, teacher: Transformer | null, batch: Batch, weights: Float64Array, spec: LossSpec): number {
  const n = batch.b * batch.t, V = m.config.vocabSize;
  const tl = teacher ? teacher.forward(batch.inputs, batch.b, batch.t) : null;
  const logits = m.forward(batch.inputs, batch.b, batch.t);
  const stats = be.alloc(n * LOSS_STATS, 'stats'), wb = be.alloc(n, 'w'), tg = be.allocInt(n, 'targets');
  be.upload(wb, weights); be.uploadInt(tg, batch.targets);
  be.lossForward(stats, null, logits, tl, tg, wb, n, V, spec);
  const s = be.download(stats);
  let sum = 0;
  for (let i = 0; i < n; i++) sum += weights[i]! * s[i * LOSS_STATS]!;
  return sum;
}

const specs = LOSS_SPECS;

for (const spec of specs) {
  for (const [name, cfg] of [configs[0]!, configs[2]!, configs[6]!, configs[7]!, configs[9]!,
    ...(spec.kind === 'none' ? [configs[3]!, configs[4]!, configs[8]!, configs[10]!] : [])]) {
    test(`every parameter's gradient matches central finite differences (float64), loss ${spec.kind}, ${name}`, () => {
      const be = createCpuBackend({ dtype: 'f64', threads: 1 });
      try {
        const b = 2, t = 4, n = b * t;
        const m = new Transformer(be, cfg, { batch: b, seq: t, training: true });
        const w = randomWeights(m, 3);
        m.setWeights(w);
        let teacher: Transformer | null = null;
        if (spec.kind !== 'none') {
          teacher = new Transformer(be, { ...cfg, hiddenSize: 12, intermediateSize: 16, numHeads: 2, numKvHeads: 2, headDim: 6 },
            { batch: b, seq: t, training: false });
          teacher.setWeights(randomWeights(teacher, 4, 0.8));
        }
        const rng = new Rng(5);
        const inputs = randomIds(rng, n, cfg.vocabSize);
        const targets = randomIds(rng, n, cfg.vocabSize);
        const mask = Float32Array.from({ length: n }, (_, i) => (i === n - 1 ? 0 : 1));
        targets[n - 1] = -1; // padding
        const batch: Batch = { inputs, targets, mask, b, t };
        const weights = Float64Array.from(mask, (x) => x / 7);
        // Analytic gradient through the model's backward.
        const tl = teacher ? teacher.forward(inputs, b, t) : null;
        const logits = m.forward(inputs, b, t);
        const stats = be.alloc(n * LOSS_STATS, 's'), wb = be.alloc(n, 'w'), tg = be.allocInt(n, 't');
        be.upload(wb, weights); be.uploadInt(tg, targets);
        m.zeroGrad();
        be.lossForward(stats, logits, logits, tl, tg, wb, n, cfg.vocabSize, spec);
        m.backward(logits);
        const grad = be.download(m.grads!);
        // Check a sample of coordinates in every tensor.
        const eps = 1e-6;
        let checked = 0;
        for (const ti of m.layout.tensors) {
          const picks = new Set<number>();
          for (let j = 0; j < Math.min(3, ti.size); j++) picks.add(ti.offset + rng.int(ti.size));
          for (const idx of picks) {
            const orig = w[idx]!;
            w[idx] = orig + eps; m.setWeights(w);
            const lp = weightedLoss(be, m, teacher, batch, weights, spec);
            w[idx] = orig - eps; m.setWeights(w);
            const lm = weightedLoss(be, m, teacher, batch, weights, spec);
            w[idx] = orig;
            const fd = (lp - lm) / (2 * eps);
            const an = grad[idx]!;
            assert.ok(Math.abs(fd - an) <= 1e-6 + 1e-5 * Math.abs(fd),
              `${ti.name}[${idx - ti.offset}]: analytic ${an} vs finite difference ${fd}`);
            checked++;
          }
        }
        m.setWeights(w);
        assert.ok(checked >= m.layout.tensors.length);
      } finally { be.dispose(); }
    });
  }
}

test('KV-cache generation reproduces the full forward pass logits at every position (plain, llama3 and yarn RoPE, llama o bias, qwen3 q/k norms, smollm3 NoPE)', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  try {
    for (const cfg of [tinyConfig({ rope: { type: 'default', theta: 100 } }), configs[3]![1], configs[4]![1], configs[6]![1], configs[7]![1], configs[8]![1], configs[9]![1]]) {
    const T = 9;
    const m = new Transformer(be, cfg, { batch: 1, seq: T, training: false });
    m.setWeights(randomWeights(m, 8));
    const ids = randomIds(new Rng(9), T, cfg.vocabSize);
    const full = be.download(m.forward(ids, 1, T));
    const gen = new Generator(m, T);
    const V = cfg.vocabSize;
    // Prefill 4 tokens, then decode one at a time.
    const check = (logits: ArrayLike<number>, pos: number): void => {
      for (let i = 0; i < V; i++) assert.ok(Math.abs(logits[i]! - full[pos * V + i]!) < 1e-10, `position ${pos}, token ${i}`);
    };
    check(gen.step(ids.subarray(0, 4)), 3);
    for (let p = 4; p < T; p++) check(gen.step(ids.subarray(p, p + 1)), p);
    }
  } finally { be.dispose(); }
});

test('greedy generation is deterministic and follows the argmax of the full forward pass', () => {
  const be = createCpuBackend({ dtype: 'f32', threads: 1 });
  try {
    const cfg = tinyConfig();
    const m = new Transformer(be, cfg, { batch: 1, seq: 16, training: false });
    m.setWeights(randomWeights(m, 10));
    const gen = new Generator(m, 16);
    const prompt = [1, 2, 3];
    const out = gen.generate(prompt, { temperature: 0, topP: 1, maxNewTokens: 5 });
    assert.equal(out.length, 5);
    const seq = Int32Array.from([...prompt, ...out]);
    const logits = be.download(m.forward(seq, 1, seq.length));
    for (let i = 0; i < out.length; i++) {
      const row = logits.subarray((prompt.length - 1 + i) * cfg.vocabSize, (prompt.length + i) * cfg.vocabSize);
      let best = 0;
      for (let j = 1; j < row.length; j++) if (row[j]! > row[best]!) best = j;
      assert.equal(out[i], best);
    }
    assert.deepEqual(gen.generate(prompt, { temperature: 0.8, topP: 0.9, maxNewTokens: 6, seed: 4 }),
      gen.generate(prompt, { temperature: 0.8, topP: 0.9, maxNewTokens: 6, seed: 4 }));
  } finally { be.dispose(); }
});

test('a tiny model trained on a repeating pattern: loss falls well below its initial value', () => {
  const be = createCpuBackend({ dtype: 'f32' });
  try {
    const cfg = tinyConfig({ vocabSize: 16, hiddenSize: 32, intermediateSize: 64, numHeads: 4, numKvHeads: 2, headDim: 8 });
    const b = 4, t = 16;
    const m = new Transformer(be, cfg, { batch: b, seq: t, training: true });
    m.setWeights(initialWeights(m.layout, cfg, new Rng(1)));
    const opt = new AdamW(m, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.01 });
    const runner = new StepRunner(m, null, { kind: 'none', alpha: 0, temperature: 1, beta: 0.5 });
    const rng = new Rng(2);
    const makeBatch = (): Batch => {
      const inputs = new Int32Array(b * t), targets = new Int32Array(b * t);
      for (let r = 0; r < b; r++) {
        const start = rng.int(16);
        for (let i = 0; i < t; i++) { inputs[r * t + i] = (start + 3 * i) % 16; targets[r * t + i] = (start + 3 * i + 3) % 16; }
      }
      return { inputs, targets, mask: new Float32Array(b * t).fill(1), b, t };
    };
    const first = runner.trainStep([makeBatch()], opt, 3e-3, 1).loss;
    let last = first;
    for (let s = 0; s < 60; s++) last = runner.trainStep([makeBatch()], opt, 3e-3, 1).loss;
    assert.ok(first > 2.0, `initial loss ${first} should be near ln(16)`);
    assert.ok(last < 0.3 * first, `loss fell only from ${first} to ${last}`);
  } finally { be.dispose(); }
});
