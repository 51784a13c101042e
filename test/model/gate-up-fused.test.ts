/**
 * The fused gate/up product: each layer's gate_proj and up_proj weights are adjacent (gate first), so one product
 * [N, 2·I] feeds SwiGLU through swigluForwardRows / swigluBackwardRows. Checked: the two row ops on the CPU against
 * plain loops (bf16 stores too); a model that runs one product equal to one that runs two (float64: logits and every
 * gradient, Qwen2/Qwen3/Llama shapes, with and without every weight training: LoRA recomputes SwiGLU in the backward);
 * an adapter on gate_proj or up_proj keeps the two products; an NF4 base fuses too.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { roundBf16 } from '../../src/backend/bf16.js';
import type { ModelConfig } from '../../src/model/config.js';
import { fusesGateUp, gateUpSpan, initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { loraLayout } from '../../src/model/lora.js';
import { Rng } from '../../src/util/rng.js';
import { assertFusedMatches, logitsAndGrads } from './probe.js';

function cfg(over: Partial<ModelConfig> = {}): ModelConfig {
  return {
    architecture: 'qwen2', vocabSize: 11, hiddenSize: 8, intermediateSize: 12, numLayers: 2, numHeads: 4,
    numKvHeads: 2, headDim: 2, rope: { type: 'default', theta: 1e4 }, rmsNormEps: 1e-6, tieWordEmbeddings: true,
    maxPositionEmbeddings: 64, qkvBias: true, qkNorm: false, noRopeLayers: [], ...over,
  };
}

const silu = (g: number): number => g / (1 + Math.exp(-g));

test('swigluForwardRows / swigluBackwardRows on the CPU: each row\'s gate and up halves, against plain loops (f64, and bf16 stores rounded once)', () => {
  for (const dtype of ['f64', 'bf16'] as const) {
    const be = createCpuBackend({ dtype: dtype === 'f64' ? 'f64' : 'f32', threads: 1 });
    try {
      const rows = 3, cols = 5, r = new Rng(4);
      const gu = Array.from({ length: 2 * rows * cols }, () => 2 * r.normal()), dy = Array.from({ length: rows * cols }, () => r.normal());
      const round = (x: number): number => (dtype === 'bf16' ? roundBf16(x) : x);
      const bt = dtype === 'bf16' ? 'bf16' : 'f32';
      const guB = be.alloc(2 * rows * cols, 'gu', bt), dyB = be.alloc(rows * cols, 'dy', bt), out = be.alloc(rows * cols, 'out', bt);
      const dgu = be.alloc(2 * rows * cols, 'dgu', bt);
      be.upload(guB, Float64Array.from(gu)); be.upload(dyB, Float64Array.from(dy));
      be.upload(dgu, new Float64Array(2 * rows * cols).fill(Number.NaN)); // overwritten, never read
      be.swigluForwardRows(out, guB, rows, cols);
      be.swigluBackwardRows(dgu, dyB, guB, rows, cols);
      const o = be.download(out), d = be.download(dgu);
      for (let i = 0; i < rows; i++) {
        for (let c = 0; c < cols; c++) {
          const g = round(gu[2 * i * cols + c]!), u = round(gu[(2 * i + 1) * cols + c]!), y = round(dy[i * cols + c]!), s = 1 / (1 + Math.exp(-g));
          const tol = dtype === 'bf16' ? 2 ** -7 : 1e-14;
          const near = (got: number, want: number, what: string): void => assert.ok(Math.abs(got - want) <= tol * Math.max(1, Math.abs(want)), `${dtype} ${what} [${i}, ${c}]: ${got} vs ${want}`);
          near(o[i * cols + c]!, silu(g) * u, 'out');
          near(d[2 * i * cols + c]!, y * u * s * (1 + g * (1 - s)), 'dgate');
          near(d[(2 * i + 1) * cols + c]!, y * g * s, 'dup');
        }
      }
    } finally { be.dispose(); }
  }
});

test('layout: gate_proj then up_proj adjacent in every layer; fused unless an adapter sits on either, by default in a model that trains', () => {
  const l = parameterLayout(cfg());
  for (const w of l.layers) assert.deepEqual(gateUpSpan(w), [w.wGate.offset, w.wGate.size + w.wUp.size]);
  assert.ok(fusesGateUp(l));
  assert.ok(fusesGateUp(l, { spec: { targets: ['q_proj', 'v_proj'] } }));
  assert.ok(!fusesGateUp(l, { spec: { targets: ['up_proj'] } }));
  assert.ok(!fusesGateUp(l, { spec: { targets: ['gate_proj', 'o_proj'] } }));
  // by default a model that trains fuses (its backward gains), one that only runs forward (a teacher) does not
  const be = createCpuBackend({ dtype: 'f32', threads: 1 });
  try {
    assert.ok(new Transformer(be, cfg(), { batch: 1, seq: 4, training: true }).layerW.every((w) => w.wgu !== null));
    assert.ok(new Transformer(be, cfg(), { batch: 1, seq: 4, training: false }).layerW.every((w) => w.wgu === null));
    assert.ok(new Transformer(be, cfg(), { batch: 1, seq: 4, training: false, fuseGateUp: true }).layerW.every((w) => w.wgu !== null));
  } finally { be.dispose(); }
});

const variants: Array<[string, ModelConfig]> = [
  ['qwen2 biases, GQA, tied', cfg()],
  ['qwen3 q/k norms', cfg({ architecture: 'qwen3', qkNorm: true, qkvBias: false, numHeads: 2, numKvHeads: 1, headDim: 4, tieWordEmbeddings: false })],
  ['llama no biases, intermediate 13 (not a multiple of 8)', cfg({ architecture: 'llama', qkvBias: false, intermediateSize: 13 })],
];

for (const [name, c] of variants) {
  for (const lora of [false, true]) {
    test(`one fused gate/up product gives the two products' logits and gradients (float64): ${name}${lora ? ', LoRA on q/v (SwiGLU recomputed in the backward)' : ''}`, () => {
      const be = createCpuBackend({ dtype: 'f64', threads: 1 });
      try {
        const b = 2, t = 5;
        const run = (fuse: boolean): { logits: Float64Array; grads: Float64Array } => {
          const m = new Transformer(be, c, {
            batch: b, seq: t, training: true, fuseGateUp: fuse,
            ...(lora ? { lora: loraLayout(c, { rank: 2, alpha: 4, targets: ['q_proj', 'v_proj'] }) } : {}),
          });
          assert.equal(m.layerW.every((w) => w.wgu !== null), fuse, 'the model runs what was asked');
          const rng = new Rng(5);
          m.setWeights(Float64Array.from(initialWeights(m.layout, c, rng, 0.5)));
          if (lora) m.lora!.setWeights(Float64Array.from({ length: m.lora!.layout.total }, (_, i) => 0.1 * Math.cos(i)));
          return logitsAndGrads(be, m, b, t);
        };
        assertFusedMatches(run);
      } finally { be.dispose(); }
    });
  }
}

test('an NF4 base fuses gate/up too (adjacent in the one-layer scratch): logits as with two products', () => {
  const be = createCpuBackend({ dtype: 'f32', threads: 1 });
  try {
    const c = cfg(), b = 2, t = 4;
    const w = initialWeights(parameterLayout(c), c, new Rng(6), 0.5);
    const ids = Int32Array.from({ length: b * t }, (_, i) => (i * 5 + 1) % c.vocabSize);
    const logits = (fuse: boolean): Float32Array => {
      const m = new Transformer(be, c, { batch: b, seq: t, training: false, frozenDtype: 'nf4', fuseGateUp: fuse });
      assert.equal(m.layerW.every((x) => x.wgu !== null), fuse);
      m.setWeights(w);
      return Float32Array.from(be.download(m.forward(ids, b, t)));
    };
    const f = logits(true), u = logits(false);
    let worst = 0;
    for (let i = 0; i < u.length; i++) worst = Math.max(worst, Math.abs(f[i]! - u[i]!));
    assert.ok(worst <= 1e-5, `largest difference ${worst}`);
  } finally { be.dispose(); }
});

test('generation joins gate and up in a forward-only model too (decodeLayerW), with the logits of two products, bit for bit; not where an adapter sits on either, nor with fuseGateUp false', async () => {
  const { BatchGenerator } = await import('../../src/model/batch-generate.js');
  const be = createCpuBackend({ dtype: 'f32', threads: 1 });
  try {
    for (const c of [cfg(), cfg({ architecture: 'qwen3', qkvBias: false, qkNorm: true })]) {
      const w = initialWeights(parameterLayout(c), c, new Rng(7), 0.5);
      const make = (fuseGateUp?: boolean): Transformer => {
        const m = new Transformer(be, c, { batch: 2, seq: 16, training: false, ...(fuseGateUp === undefined ? {} : { fuseGateUp }) });
        m.setWeights(w);
        return m;
      };
      const joined = make(), two = make(false);
      assert.ok(joined.layerW.every((x) => x.wgu === null), 'the forward keeps two products');
      assert.ok(joined.decodeLayerW.every((x) => x.wgu !== null), 'generation runs one');
      assert.ok(two.decodeLayerW.every((x) => x.wgu === null), 'fuseGateUp false: two products in generation too');
      const ga = new BatchGenerator(joined, 2, 16), gb = new BatchGenerator(two, 2, 16);
      const prompts = [[1, 2, 3, 4], [5, 6]];
      assert.deepEqual([...ga.prefill(prompts)], [...gb.prefill(prompts)], `${c.architecture} prefill`);
      for (let s = 0; s < 3; s++) {
        const next = Int32Array.of(3 + s, 7 - s);
        assert.deepEqual([...ga.decode(next)], [...gb.decode(next)], `${c.architecture} decode step ${s}`);
      }
    }
    const lora = new Transformer(be, cfg(), { batch: 1, seq: 4, training: false, lora: loraLayout(cfg(), { rank: 2, alpha: 4, targets: ['up_proj'] }) });
    assert.ok(lora.decodeLayerW.every((x) => x.wgu === null), 'an adapter on up_proj keeps two products');
  } finally { be.dispose(); }
});
