/**
 * Frozen 4-bit weights (src/model/frozen.ts) on the CPU backend: the NF4 storage plan places every tensor once; the
 * backend's dequantNf4 equals the format's host reference; a model whose projection matrices are stored in NF4
 * computes exactly what the same model computes from the dequantized weights (forward, evaluation, generation), in
 * fp32 and bf16; LoRA on an NF4 base has exactly the adapter gradients of LoRA on the dequantized base (the backward
 * re-expands each layer's matrices); a model that trains every weight refuses NF4.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer, type Precision } from '../../src/model/transformer.js';
import { Generator } from '../../src/model/generate.js';
import { nf4Plan, nf4StorageBytes } from '../../src/model/frozen.js';
import { LORA_TARGETS, loraLayout } from '../../src/model/lora.js';
import { dequantizeNf4, nf4Words, quantizeNf4, nf4Bytes } from '../../src/quant/nf4.js';
import { estimateJobBytes } from '../../src/model/memory.js';
import { roundBf16 } from '../../src/backend/bf16.js';
import { DistilleryError } from '../../src/util/errors.js';
import { Rng } from '../../src/util/rng.js';

const V = 41;
function cfg(over: Partial<ModelConfig> = {}): ModelConfig {
  return {
    architecture: 'qwen2', vocabSize: V, hiddenSize: 24, intermediateSize: 40, numLayers: 3, numHeads: 4, numKvHeads: 2, headDim: 6,
    rope: { type: 'default', theta: 10000 }, rmsNormEps: 1e-6, tieWordEmbeddings: false, maxPositionEmbeddings: 64, qkvBias: true, qkNorm: false,
    noRopeLayers: [], ...over,
  };
}
const B = 2, T = 6;
const IDS = Int32Array.from({ length: B * T }, (_, i) => (i * 11 + 2) % V);

/** The weights the NF4 model computes with: matrices quantized and dequantized on the host, the rest unchanged. */
function dequantizedWeights(c: ModelConfig, w: Float32Array): Float32Array {
  const lay = parameterLayout(c), out = Float32Array.from(w);
  for (const t of nf4Plan(lay).quant.keys()) out.set(dequantizeNf4(quantizeNf4(w.subarray(t.offset, t.offset + t.size))), t.offset);
  return out;
}

test('the NF4 plan stores each projection matrix in NF4 and every other tensor densely, once; its bytes are 4.5 bits per matrix weight', () => {
  const c = cfg({ tieWordEmbeddings: true, qkNorm: true, architecture: 'qwen3', qkvBias: false });
  const lay = parameterLayout(c), plan = nf4Plan(lay);
  assert.equal(plan.quant.size, 7 * c.numLayers);
  assert.equal(plan.dense.size + plan.quant.size, lay.tensors.length);
  const qElems = [...plan.quant.keys()].reduce((a, t) => a + t.size, 0);
  assert.equal(plan.denseTotal + qElems, lay.total);
  assert.ok([...plan.quant.keys()].every((t) => /\.(q|k|v|o|gate|up|down)_proj\.weight$/.test(t.name)));
  assert.ok([...plan.dense.keys()].every((t) => !/_proj\.weight$/.test(t.name)));
  const perLayer = lay.layers[0]!;
  assert.equal(plan.scratchTotal, ['wq', 'wk', 'wv', 'wo', 'wGate', 'wUp', 'wDown'].reduce((a, k) => a + (perLayer[k as 'wq']).size, 0));
  const qBytes = [...plan.quant.keys()].reduce((a, t) => a + nf4Bytes(t.size), 0);
  // word padding aside (at most 3 bytes per tensor), the codes and scales are the format's bytes
  const stored = nf4StorageBytes(plan, 2) - (plan.denseTotal + plan.scratchTotal) * 2;
  assert.ok(stored >= qBytes && stored <= qBytes + 3 * plan.quant.size, `${stored} vs ${qBytes}`);
});

test('Backend.dequantNf4 (CPU) equals the host reference of the format, into f32 and bf16, for lengths inside a word and a block', () => {
  const be = createCpuBackend({ threads: 1 });
  const r = new Rng(9);
  for (const [n, bs] of [[1, 64], [13, 64], [200, 64], [130, 32]] as const) {
    const x = Float32Array.from({ length: n }, () => r.normal() * 0.1);
    const q = quantizeNf4(x, bs);
    const codes = be.allocInt(nf4Words(q).length, 'codes'); be.uploadInt(codes, nf4Words(q));
    const absmax = be.alloc(q.absmax.length, 'absmax'); be.upload(absmax, q.absmax);
    const want = dequantizeNf4(q);
    for (const d of ['f32', 'bf16'] as const) {
      const out = be.alloc(n, 'out', d);
      be.dequantNf4(out, codes, absmax, n, bs);
      const got = be.download(out);
      for (let i = 0; i < n; i++) assert.equal(got[i], d === 'f32' ? want[i] : roundBf16(want[i]!), `n=${n} ${d} element ${i}`);
    }
  }
  be.dispose();
});

for (const precision of ['fp32', 'bf16'] as Precision[]) {
  test(`an NF4 model (${precision}) computes exactly what the model with the dequantized weights computes: logits, getWeights, generation`, () => {
    for (const c of [cfg(), cfg({ architecture: 'qwen3', qkNorm: true, qkvBias: false, tieWordEmbeddings: true })]) {
      const be = createCpuBackend({ threads: 1 });
      const w = initialWeights(parameterLayout(c), c, new Rng(2), 0.5);
      const dq = dequantizedWeights(c, w);
      const q = new Transformer(be, c, { batch: B, seq: T, training: false, precision, frozenDtype: 'nf4' });
      q.setWeights(w);
      const ref = new Transformer(be, c, { batch: B, seq: T, training: false, precision });
      ref.setWeights(dq);
      assert.deepEqual(Array.from(q.getWeights()), Array.from(precision === 'bf16' ? dq.map((x, i) => (nf4Plan(q.layout).dense.has(q.layout.tensors.find((t) => i >= t.offset && i < t.offset + t.size)!) ? roundBf16(x) : x)) : dq));
      const a = Array.from(be.download(q.forward(IDS, B, T))), b = Array.from(be.download(ref.forward(IDS, B, T)));
      assert.deepEqual(a, b);
      // and it is not the unquantized model
      const full = new Transformer(be, c, { batch: B, seq: T, training: false, precision });
      full.setWeights(w);
      assert.notDeepEqual(Array.from(be.download(full.forward(IDS, B, T))), a);
      const gq = new Transformer(be, c, { batch: 1, seq: 1, training: false, precision, frozenDtype: 'nf4' }); gq.setWeights(w);
      const gr = new Transformer(be, c, { batch: 1, seq: 1, training: false, precision }); gr.setWeights(dq);
      const opts = { temperature: 0, topP: 1, maxNewTokens: 6 };
      assert.deepEqual(new Generator(gq, 12).generate([1, 5, 9], opts), new Generator(gr, 12).generate([1, 5, 9], opts));
      be.dispose();
    }
  });
}

test('LoRA on an NF4 base (QLoRA): loss and adapter gradients equal LoRA on the dequantized base exactly', () => {
  const c = cfg();
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const lay = loraLayout(c, { rank: 3, alpha: 6, targets: [...LORA_TARGETS] });
  const w = initialWeights(parameterLayout(c), c, new Rng(3), 0.5);
  const r = new Rng(4);
  const ad = Float64Array.from({ length: lay.total }, () => r.normal() * 0.3);
  const R = Float64Array.from({ length: B * T * V }, () => r.normal());
  const run = (m: Transformer): { z: number[]; g: number[] } => {
    m.lora!.setWeights(ad);
    m.zeroGrad();
    const z = m.forward(IDS, B, T);
    const zs = Array.from(be.download(z));
    be.upload(z, R);
    m.backward(z);
    return { z: zs, g: Array.from(be.download(m.lora!.grads!)) };
  };
  const q = new Transformer(be, c, { batch: B, seq: T, training: true, lora: lay, frozenDtype: 'nf4' }); q.setWeights(w);
  const ref = new Transformer(be, c, { batch: B, seq: T, training: true, lora: lay }); ref.setWeights(dequantizedWeights(c, Float32Array.from(w)));
  const a = run(q), b = run(ref);
  assert.deepEqual(a.z, b.z);
  assert.deepEqual(a.g, b.g);
  assert.throws(() => new Transformer(be, c, { batch: B, seq: T, training: true, frozenDtype: 'nf4' }), (e) => e instanceof DistilleryError && /4-bit \(nf4\) weights are frozen/.test(e.message));
  be.dispose();
});

test('the memory estimate counts an NF4 teacher at about a quarter of bf16 (0.5B-shaped teacher of a 1.5B shape)', async () => {
  const { presetConfig } = await import('../../src/model/config.js');
  const student = presetConfig('qwen2.5-0.5b', 151936), teacher = presetConfig('qwen2.5-7b', 152064);
  const j = { student, teacher, batch: 8, seq: 1024, training: true, precision: 'bf16' as const };
  const bf = estimateJobBytes(j), nf = estimateJobBytes({ ...j, teacherFrozen: 'nf4' });
  const lay = parameterLayout(teacher), plan = nf4Plan(lay);
  const matrices = lay.total - plan.denseTotal;
  // bf16 matrices (2 bytes) become 0.5 + 4/64 bytes, plus one layer's bf16 scratch
  const want = matrices * 2 - (matrices * (0.5 + 4 / 64) + plan.scratchTotal * 2);
  assert.ok(Math.abs((bf - nf) - want) < 1e-3 * want, `saved ${bf - nf} bytes, expected about ${want}`);
});
