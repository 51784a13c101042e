/**
 * The fused q/k/v projection: the layout that keeps each layer's q, k and v weights (and biases) adjacent, the identity
 * of weights across that change (weightsHash in the Hugging Face order), Backend.copyColumns on the CPU against a
 * plain loop, and a model that runs one product equal to one that runs three (float64: forward and every gradient).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { roundBf16 } from '../../src/backend/bf16.js';
import type { ModelConfig } from '../../src/model/config.js';
import { fusesQkv, initialWeights, parameterLayout, qkvSpans, reorderFlat } from '../../src/model/params.js';
import { weightsHash } from '../../src/model/weights-hash.js';
import { Transformer } from '../../src/model/transformer.js';
import { Rng } from '../../src/util/rng.js';
import { assertNear } from '../util/compare.js';
import { assertFusedMatches, logitsAndGrads } from './probe.js';

function cfg(over: Partial<ModelConfig> = {}): ModelConfig {
  return {
    architecture: 'qwen2', vocabSize: 11, hiddenSize: 8, intermediateSize: 12, numLayers: 2, numHeads: 4,
    numKvHeads: 2, headDim: 2, rope: { type: 'default', theta: 1e4 }, rmsNormEps: 1e-6, tieWordEmbeddings: true,
    maxPositionEmbeddings: 64, qkvBias: true, qkNorm: false, noRopeLayers: [], ...over,
  };
}

test('layout: tensors listed in the Hugging Face order; stored with each layer\'s q/k/v weights adjacent, then their biases', () => {
  const c = cfg(), g = parameterLayout(c), l = parameterLayout(c, 'legacy');
  assert.deepEqual(g.tensors.map((t) => t.name), l.tensors.map((t) => t.name));
  assert.deepEqual(g.tensors.slice(1, 8).map((t) => t.name.replace('model.layers.0.', '')), ['input_layernorm.weight',
    'self_attn.q_proj.weight', 'self_attn.q_proj.bias', 'self_attn.k_proj.weight', 'self_attn.k_proj.bias', 'self_attn.v_proj.weight', 'self_attn.v_proj.bias']);
  // legacy: offsets follow the listed order (what versions before stored); grouped: wq wk wv bq bk bv
  for (let i = 1; i < l.tensors.length; i++) assert.equal(l.tensors[i]!.offset, l.tensors[i - 1]!.offset + l.tensors[i - 1]!.size);
  const w = g.layers[1]!, Q = 8, KV = 4, C = 8;
  assert.deepEqual([w.wk.offset - w.wq.offset, w.wv.offset - w.wk.offset, w.bq!.offset - w.wv.offset, w.bk!.offset - w.bq!.offset, w.bv!.offset - w.bk!.offset],
    [Q * C, KV * C, KV * C, Q, KV]);
  assert.deepEqual(qkvSpans(w), { weight: [w.wq.offset, (Q + 2 * KV) * C], bias: [w.bq!.offset, Q + 2 * KV] });
  assert.equal(qkvSpans(l.layers[1]!), null, 'the legacy order with biases has no fused span');
  assert.ok(fusesQkv(g) && !fusesQkv(l));
  assert.ok(!fusesQkv(g, { spec: { targets: ['o_proj', 'k_proj'] } }) && fusesQkv(g, { spec: { targets: ['o_proj'] } }));
  // without biases the two orders are one
  const nb = cfg({ qkvBias: false, architecture: 'llama' });
  assert.deepEqual(parameterLayout(nb).tensors.map((t) => t.offset), parameterLayout(nb, 'legacy').tensors.map((t) => t.offset));
  assert.ok(fusesQkv(parameterLayout(nb, 'legacy')));
});

test('weightsHash: the SHA-256 of the tensors in the Hugging Face order, so a grouped and a legacy flat array of one model hash alike', () => {
  const c = cfg(), g = parameterLayout(c), l = parameterLayout(c, 'legacy');
  const w = initialWeights(g, c, new Rng(4), 0.5);
  const h = createHash('sha256');
  for (const t of g.tensors) { const v = w.slice(t.offset, t.offset + t.size); h.update(Buffer.from(v.buffer)); }
  const expect = h.digest('hex');
  assert.equal(weightsHash(w, g), expect);
  const old = reorderFlat(w, g, l);
  assert.equal(createHash('sha256').update(Buffer.from(old.buffer)).digest('hex'), expect, 'a legacy flat array hashed whole, as versions before did');
  assert.equal(weightsHash(old, l), expect);
  assert.notEqual(createHash('sha256').update(Buffer.from(w.buffer)).digest('hex'), expect, 'the grouped storage itself is another byte order');
  // reorderFlat puts each tensor's values where the other layout keeps them, and back
  for (const t of l.tensors) {
    const gt = g.tensors.find((x) => x.name === t.name)!;
    assert.deepEqual(old.subarray(t.offset, t.offset + t.size), w.subarray(gt.offset, gt.offset + gt.size), t.name);
  }
  assert.deepEqual(reorderFlat(old, l, g), w);
});

test('copyColumns (CPU): a block of columns between row-major matrices, a bias added in float and rounded once into bf16', () => {
  for (const dtype of ['f32', 'bf16'] as const) {
    const be = createCpuBackend({ dtype: 'f32', threads: 1 });
    try {
      const rows = 5, srcCols = 11, dstCols = 7, width = 4, srcCol = 6, dstCol = 2;
      const rng = new Rng(9);
      const s = Float32Array.from({ length: rows * srcCols }, () => rng.normal());
      const b = Float32Array.from({ length: width }, () => rng.normal());
      const d0 = Float32Array.from({ length: rows * dstCols }, () => rng.normal());
      const src = be.alloc(s.length, 's', dtype), bias = be.alloc(width, 'b', dtype), dst = be.alloc(d0.length, 'd', dtype);
      be.upload(src, s); be.upload(bias, b); be.upload(dst, d0);
      const S = be.download(src), B = be.download(bias), D0 = be.download(dst);
      for (const withBias of [false, true]) {
        be.upload(dst, D0);
        be.copyColumns(dst, dstCols, dstCol, src, srcCols, srcCol, rows, width, withBias ? bias : null);
        const got = be.download(dst);
        for (let r = 0; r < rows; r++) {
          for (let c = 0; c < dstCols; c++) {
            const inside = c >= dstCol && c < dstCol + width;
            const x = inside ? S[r * srcCols + srcCol + c - dstCol]! + (withBias ? B[c - dstCol]! : 0) : D0[r * dstCols + c]!;
            const want = dtype === 'bf16' ? roundBf16(Math.fround(x)) : Math.fround(x);
            assert.equal(got[r * dstCols + c], want, `${dtype} bias ${withBias} [${r}, ${c}]`);
          }
        }
      }
      assert.throws(() => be.copyColumns(dst, dstCols, 4, src, srcCols, 0, rows, width), /copyColumns/);
    } finally { be.dispose(); }
  }
});

const variants: Array<[string, ModelConfig]> = [
  ['qwen2 biases, GQA', cfg()],
  ['qwen3 q/k norms and biases', cfg({ architecture: 'qwen3', qkNorm: true, numHeads: 2, numKvHeads: 1, headDim: 4 })],
  ['smollm3 NoPE layer 1, biases', cfg({ architecture: 'smollm3', numLayers: 2, noRopeLayers: [1] })],
  ['llama no biases', cfg({ architecture: 'llama', qkvBias: false })],
];

for (const [name, c] of variants) {
  test(`one fused q/k/v product gives the three products' logits and gradients (float64): ${name}`, () => {
    const be = createCpuBackend({ dtype: 'f64', threads: 1 });
    try {
      const b = 2, t = 5;
      const run = (fuse: boolean): { logits: Float64Array; grads: Float64Array } => {
        const m = new Transformer(be, c, { batch: b, seq: t, training: true, fuseQkv: fuse });
        const rng = new Rng(5);
        const w = Float64Array.from(initialWeights(m.layout, c, rng, 0.5));
        for (const x of m.layout.tensors) if (x.init !== 'normal' && x.init !== 'normal-residual') for (let i = 0; i < x.size; i++) w[x.offset + i] = (x.init === 'ones' ? 1 : 0) + 0.3 * rng.normal();
        m.setWeights(w);
        return logitsAndGrads(be, m, b, t);
      };
      assertFusedMatches(run);
    } finally { be.dispose(); }
  });
}

test('an NF4 model fuses too (its q/k/v matrices adjacent in the one-layer scratch, the biases in the dense part): logits as with three products', () => {
  const be = createCpuBackend({ dtype: 'f32', threads: 1 });
  try {
    const c = cfg(), b = 2, t = 4;
    const w = initialWeights(parameterLayout(c), c, new Rng(6), 0.5);
    const ids = Int32Array.from({ length: b * t }, (_, i) => (i * 5 + 1) % c.vocabSize);
    const logits = (fuse: boolean): Float32Array => {
      const m = new Transformer(be, c, { batch: b, seq: t, training: false, frozenDtype: 'nf4', fuseQkv: fuse });
      assert.equal(m.layerW.every((l) => l.wqkv !== null && l.bqkv !== null), fuse);
      m.setWeights(w);
      return Float32Array.from(be.download(m.forward(ids, b, t)));
    };
    assertNear(logits(true), logits(false), 1e-6, 'logits');
  } finally { be.dispose(); }
});

test('float32 on the CPU, JS and WASM kernels: the fused projection\'s logits equal the three products\' bit for bit (a bias added after the store in both)', () => {
  for (const kernel of ['js', 'wasm'] as const) {
    for (const c of [cfg(), cfg({ architecture: 'smollm3', noRopeLayers: [0] }), cfg({ architecture: 'qwen3', qkNorm: true, numHeads: 2, numKvHeads: 1, headDim: 4 })]) {
      const be = createCpuBackend({ dtype: 'f32', threads: 1, kernel });
      try {
        const b = 2, t = 4;
        const w = initialWeights(parameterLayout(c), c, new Rng(8), 0.5);
        const bias = parameterLayout(c).tensors.filter((x) => x.name.endsWith('proj.bias'));
        for (const x of bias) for (let i = 0; i < x.size; i++) w[x.offset + i] = 0.37 * Math.sin(i + x.offset);
        const ids = Int32Array.from({ length: b * t }, (_, i) => (i * 3 + 2) % c.vocabSize);
        const logits = (fuse: boolean): number[] => {
          const m = new Transformer(be, c, { batch: b, seq: t, training: false, fuseQkv: fuse });
          m.setWeights(w);
          return [...be.download(m.forward(ids, b, t))];
        };
        assert.deepEqual(logits(true), logits(false), `${kernel} ${c.architecture}`);
      } finally { be.dispose(); }
    }
  }
});

test('the pre-RoPE dq/dk scratch is allocated only where a layer writes into it (three projections, q/k norms), and the training step runs without it', () => {
  const be = createCpuBackend({ dtype: 'f32', threads: 1 });
  try {
    const labels: string[] = [];
    const counting = new Proxy(be, {
      get(target, prop, recv) {
        if (prop === 'alloc') return (n: number, label: string, d?: 'f32' | 'bf16') => { labels.push(label); return target.alloc(n, label, d); };
        const v = Reflect.get(target, prop, recv) as unknown;
        return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
      },
    });
    for (const [name, c] of variants) {
      for (const fuse of [true, false]) {
        labels.length = 0;
        const m = new Transformer(counting, c, { batch: 2, seq: 3, training: true, fuseQkv: fuse });
        const pre = labels.filter((l) => l.includes('pre-rope')).length;
        assert.equal(pre, c.qkNorm || !fuse ? 2 : 0, `${name}, ${fuse ? 'fused' : 'three products'}: ${pre} pre-RoPE buffers`);
        m.setWeights(initialWeights(m.layout, c, new Rng(3), 0.5));
        const logits = m.forward(Int32Array.from([1, 2, 3, 4, 5, 6]), 2, 3);
        const dl = be.alloc(6 * c.vocabSize, 'dlogits');
        be.upload(dl, Float32Array.from({ length: 6 * c.vocabSize }, (_, i) => Math.cos(i)));
        m.zeroGrad();
        m.backward(dl);
        assert.ok((be.download(m.grads!) as Float32Array).every(Number.isFinite), `${name}: finite gradients`);
        assert.ok(be.download(logits).length === 6 * c.vocabSize);
      }
    }
  } finally { be.dispose(); }
});
