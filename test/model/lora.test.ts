/**
 * LoRA adapters on the CPU backend in float64: adapter gradients against central finite differences of the model's
 * own forward, a fresh adapter (B = 0) leaves the model exactly as it was, the adapted model equals the base with
 * merged weights W + (alpha / r)·B·A, the base is frozen (no gradients), and PEFT's tensor names and shapes.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { Generator } from '../../src/model/generate.js';
import { LORA_TARGETS, loraInitialWeights, loraLayout, mergeLora, parseLoraTargets, type LoraSpec } from '../../src/model/lora.js';
import { DistilleryError } from '../../src/util/errors.js';
import { Rng } from '../../src/util/rng.js';

const V = 37;
function cfg(over: Partial<ModelConfig> = {}): ModelConfig {
  return {
    architecture: 'qwen2', vocabSize: V, hiddenSize: 16, intermediateSize: 24, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 4,
    rope: { type: 'default', theta: 10000 }, rmsNormEps: 1e-6, tieWordEmbeddings: false, maxPositionEmbeddings: 64, qkvBias: true, qkNorm: false,
    noRopeLayers: [], ...over,
  };
}
const CONFIGS: Array<[string, ModelConfig, LoraSpec]> = [
  ['qwen2, every projection', cfg(), { rank: 3, alpha: 6, targets: [...LORA_TARGETS] }],
  ['qwen3 q/k norms, tied, attention only', cfg({ architecture: 'qwen3', qkvBias: false, qkNorm: true, tieWordEmbeddings: true }), { rank: 2, alpha: 5, targets: ['q_proj', 'v_proj', 'o_proj'] }],
  ['llama, MLP only', cfg({ architecture: 'llama', qkvBias: false }), { rank: 4, alpha: 4, targets: ['gate_proj', 'up_proj', 'down_proj'] }],
];
const B = 2, T = 5;
const IDS = Int32Array.from({ length: B * T }, (_, i) => (i * 7 + 3) % V);

for (const [name, c, spec] of CONFIGS) {
  test(`LoRA (${name}): adapter gradients equal central finite differences; the base is frozen`, () => {
    const be = createCpuBackend({ dtype: 'f64', threads: 1 });
    const lay = loraLayout(c, spec);
    const m = new Transformer(be, c, { batch: B, seq: T, training: true, lora: lay });
    assert.equal(m.grads, null);
    assert.equal(m.trainable(), m.lora);
    const rng = new Rng(4);
    m.setWeights(initialWeights(parameterLayout(c), c, new Rng(3), 0.5));
    // B ≠ 0 so that every adapter tensor has a gradient
    const ad = Float64Array.from({ length: lay.total }, () => rng.normal() * 0.3);
    m.lora!.setWeights(ad);
    const R = Float64Array.from({ length: B * T * V }, () => rng.normal());
    const loss = (): number => { const z = be.download(m.forward(IDS, B, T)); let s = 0; for (let i = 0; i < z.length; i++) s += z[i]! * R[i]!; return s; };
    m.zeroGrad();
    const z = m.forward(IDS, B, T);
    be.upload(z, R);
    m.backward(z);
    const g = be.download(m.lora!.grads!);
    // every tensor, a few entries each
    let worst = 0;
    for (const t of lay.tensors) {
      for (const k of [0, Math.floor(t.size / 2), t.size - 1]) {
        const i = t.offset + k, h = 1e-5, w = Float64Array.from(ad);
        w[i] = ad[i]! + h; m.lora!.setWeights(w); const up = loss();
        w[i] = ad[i]! - h; m.lora!.setWeights(w); const dn = loss();
        const fd = (up - dn) / (2 * h);
        const err = Math.abs(fd - g[i]!) / Math.max(1e-3, Math.abs(fd));
        worst = Math.max(worst, err);
        assert.ok(err < 1e-6, `${t.name}[${k}]: finite difference ${fd}, backward ${g[i]}`);
      }
    }
    assert.ok(worst < 1e-6);
    be.dispose();
  });

  test(`LoRA (${name}): a fresh adapter (B = 0) leaves the logits exactly; the adapted model equals the merged weights`, () => {
    const be = createCpuBackend({ dtype: 'f64', threads: 1 });
    const lay = loraLayout(c, spec);
    const base = initialWeights(parameterLayout(c), c, new Rng(5), 0.5);
    const plain = new Transformer(be, c, { batch: B, seq: T, training: false });
    plain.setWeights(base);
    const m = new Transformer(be, c, { batch: B, seq: T, training: false, lora: lay });
    m.setWeights(base);
    const fresh = loraInitialWeights(lay, new Rng(6));
    for (const row of lay.layers) for (const t of row) {
      assert.ok(fresh.subarray(t.b.offset, t.b.offset + t.b.size).every((x) => x === 0), 'B starts at zero');
      const bound = 1 / Math.sqrt(t.in);
      assert.ok(fresh.subarray(t.a.offset, t.a.offset + t.a.size).every((x) => Math.abs(x) <= bound) && fresh.subarray(t.a.offset, t.a.offset + t.a.size).some((x) => x !== 0));
    }
    m.lora!.setWeights(fresh);
    assert.deepEqual(be.download(m.forward(IDS, B, T)), be.download(plain.forward(IDS, B, T)));
    // a trained adapter: the same logits as the base with W + s·B·A
    const rng = new Rng(8);
    const ad = Float64Array.from({ length: lay.total }, () => rng.normal() * 0.2);
    m.lora!.setWeights(ad);
    const merged = new Transformer(be, c, { batch: B, seq: T, training: false });
    merged.setWeights(mergeLora(Float64Array.from(base), parameterLayout(c).layers, lay, ad));
    const za = be.download(m.forward(IDS, B, T)), zm = be.download(merged.forward(IDS, B, T));
    let worst = 0;
    for (let i = 0; i < za.length; i++) worst = Math.max(worst, Math.abs(za[i]! - zm[i]!));
    assert.ok(worst < 1e-5, `adapted vs merged: ${worst}`); // merged weights are float32
    assert.ok(za.some((x, i) => Math.abs(x - be.download(plain.forward(IDS, B, T))[i]!) > 1e-3), 'the adapter changes the logits');
    be.dispose();
  });
}

test('LoRA layout: PEFT\'s tensor names and shapes; --lora-targets parsing and refusals; generation runs the adapters unmerged (as the merged weights) when the model has rows for it', () => {
  const c = cfg();
  const lay = loraLayout(c, { rank: 8, alpha: 16, targets: ['q_proj', 'down_proj'] });
  assert.equal(lay.scale, 2);
  assert.deepEqual(lay.tensors.slice(0, 4).map((t) => [t.name, t.shape]), [
    ['base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight', [8, 16]],
    ['base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight', [16, 8]],
    ['base_model.model.model.layers.0.mlp.down_proj.lora_A.weight', [8, 24]],
    ['base_model.model.model.layers.0.mlp.down_proj.lora_B.weight', [16, 8]],
  ]);
  assert.equal(lay.total, 2 * (8 * 16 + 16 * 8 + 8 * 24 + 16 * 8));
  assert.deepEqual(parseLoraTargets('all'), [...LORA_TARGETS]);
  assert.deepEqual(parseLoraTargets('q_proj, v_proj,q_proj'), ['q_proj', 'v_proj']);
  assert.throws(() => parseLoraTargets('q_proj,qkv'), (e: unknown) => e instanceof DistilleryError && /unknown projection "qkv"/.test(e.message));
  assert.throws(() => loraLayout(c, { rank: 0, alpha: 1, targets: ['q_proj'] }), /--lora-rank/);
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const m = new Transformer(be, c, { batch: 1, seq: 8, training: false, lora: lay });
  assert.throws(() => new Generator(m, 9), /generation with LoRA adapters needs a model allocated for 9 rows, this one has 8/);
  const base = initialWeights(parameterLayout(c), c, new Rng(8), 0.5);
  const r = new Rng(9), ad = Float64Array.from({ length: lay.total }, () => r.normal() * 0.3);
  m.setWeights(base); m.lora!.setWeights(ad);
  const merged = new Transformer(be, c, { batch: 1, seq: 1, training: false });
  merged.setWeights(mergeLora(Float64Array.from(base), parameterLayout(c).layers, lay, ad));
  const g1 = new Generator(m, 8), g2 = new Generator(merged, 8);
  for (const step of [Int32Array.of(3, 1, 4), Int32Array.of(5), Int32Array.of(9)]) {
    const a = g1.step(step), b = g2.step(step);
    const d = Math.max(...Array.from(a, (x, i) => Math.abs(x - b[i]!)));
    assert.ok(d < 1e-5, `unmerged vs merged logits differ by ${d}`);
    assert.ok(Math.max(...Array.from(a, Math.abs)) > 0.1);
  }
  be.dispose();
});
