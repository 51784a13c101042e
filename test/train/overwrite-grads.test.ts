/**
 * Transformer.overwriteGrads (a training step's gradients without the pass that zeroes them): after it, the backward
 * pass overwrites each parameter gradient at its first write and accumulates the rest. Checked against zeroGrad() then
 * the same passes, with the gradient buffer filled with NaN first, so a gradient the pass failed to overwrite (or read
 * before writing) shows: the full-logits path (Transformer.backward) and the chunked head (ChunkedHead, chunks that
 * do not divide the rows, LM-head rows past the loss head's width), tied and untied heads, q/k/v biases, q/k norms
 * (Qwen3), one pass and two accumulated (gradient accumulation), f64 and a bf16 model.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { Backend, LossSpec } from '../../src/backend/backend.js';
import { LOSS_STATS } from '../../src/backend/backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { ChunkedHead } from '../../src/train/head.js';
import { Rng } from '../../src/util/rng.js';

function cfgOf(over: Partial<ModelConfig> = {}): ModelConfig {
  return {
    architecture: 'qwen2', vocabSize: 40, hiddenSize: 8, intermediateSize: 12, numLayers: 2, numHeads: 4,
    numKvHeads: 2, headDim: 2, rope: { type: 'default', theta: 1e6 }, rmsNormEps: 1e-6, tieWordEmbeddings: true,
    maxPositionEmbeddings: 64, qkvBias: true, qkNorm: false, noRopeLayers: [], ...over,
  };
}

const CASES: Array<[string, Partial<ModelConfig>]> = [
  ['qwen2 tied, q/k/v biases', {}],
  ['untied, no biases', { tieWordEmbeddings: false, qkvBias: false }],
  ['qwen3 q/k norms, untied', { architecture: 'qwen3', qkNorm: true, qkvBias: false, tieWordEmbeddings: false }],
];

const spec: LossSpec = { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0 };

/** Every element equal (−0 and +0 alike); a NaN left over from the fill never is. */
function assertSame(got: ArrayLike<number>, want: ArrayLike<number>, what: string): void {
  assert.equal(got.length, want.length, what);
  for (let i = 0; i < want.length; i++) {
    if (got[i] !== want[i]) assert.fail(`${what}: element ${i} is ${got[i]}, zeroGrad then the same passes give ${want[i]}`);
  }
}

interface Setup { be: Backend; m: Transformer; teacher: Transformer; b: number; s: number; batches: Array<{ ids: Int32Array; targets: Int32Array; w: Float64Array }> }

function setup(be: Backend, over: Partial<ModelConfig>, precision: 'f32' | 'bf16' = 'f32'): Setup {
  const b = 2, s = 5, n = b * s, cfg = cfgOf(over);
  const m = new Transformer(be, cfg, { batch: b, seq: s, training: true, ...(precision === 'bf16' ? { precision } : {}) });
  m.setWeights(Float64Array.from(initialWeights(m.layout, m.config, new Rng(1), 0.5)));
  const teacher = new Transformer(be, cfgOf({ hiddenSize: 12, intermediateSize: 16, numHeads: 2, numKvHeads: 2, headDim: 6 }),
    { batch: b, seq: s, training: false, ...(precision === 'bf16' ? { precision } : {}) });
  teacher.setWeights(Float64Array.from(initialWeights(teacher.layout, teacher.config, new Rng(2), 0.5)));
  const rng = new Rng(3);
  const batches = [0, 1].map(() => ({
    ids: Int32Array.from({ length: n }, () => rng.int(13)),
    targets: Int32Array.from({ length: n }, () => rng.int(13)),
    w: Float64Array.from({ length: n }, () => 1 / 20),
  }));
  return { be, m, teacher, b, s, batches };
}

function poison(m: Transformer): void {
  m.backend.upload(m.grads!, new Float64Array(m.grads!.length).fill(Number.NaN));
}

/**
 * zeroGrad then `passes` passes, against NaN-filled gradients then overwriteGrads then the same passes: asserts the two
 * gradients equal; returns the first.
 */
function sameAsZeroGrad(m: Transformer, pass: (k: number) => void, passes: number): Float64Array {
  m.zeroGrad();
  for (let k = 0; k < passes; k++) pass(k);
  const want = Float64Array.from(m.backend.download(m.grads!));
  poison(m);
  m.overwriteGrads();
  for (let k = 0; k < passes; k++) pass(k);
  assertSame(m.backend.download(m.grads!), want, `${passes} pass(es)`);
  return want;
}

for (const [name, over] of CASES) {
  test(`overwriteGrads then backward = zeroGrad then backward, full logits, ${name}: one pass and two accumulated, gradients NaN before`, () => {
    const be = createCpuBackend({ dtype: 'f64', threads: 1 });
    try {
      const { m, teacher, b, s, batches } = setup(be, over);
      const n = b * s, V = m.config.vocabSize;
      const pass = (k: number): void => {
        const { ids, targets, w } = batches[k]!;
        const tl = teacher.forward(ids, b, s);
        const logits = m.forward(ids, b, s);
        const stats = be.alloc(n * LOSS_STATS, 'stats'), wb = be.alloc(n, 'w'), tg = be.allocInt(n, 'targets');
        be.upload(wb, w); be.uploadInt(tg, targets);
        be.lossForward(stats, logits, logits, tl, tg, wb, n, V, spec);
        m.backward(logits);
      };
      for (const passes of [1, 2]) {
        const want = sameAsZeroGrad(m, pass, passes);
        assert.ok(want.some((x) => x !== 0), 'the passes produce gradients');
      }
    } finally { be.dispose(); }
  });

  test(`overwriteGrads then the chunked head and backwardHidden = zeroGrad then the same, ${name}: head rows past the width, chunks of 3 over 10 rows`, () => {
    const be = createCpuBackend({ dtype: 'f64', threads: 1 });
    try {
      const { m, teacher, b, s, batches } = setup(be, over);
      // a loss vocabulary of 13 over 40-row heads: the head runs 16 rows (headWidth), rows 16..39 no chunk writes
      const head = new ChunkedHead(m, teacher, spec, b * s, { chunkFloats: 3 * 16, lossVocab: 13 });
      assert.ok(head.width < m.config.vocabSize && head.chunkRows === 3, `width ${head.width}, chunk rows ${head.chunkRows}`);
      const pass = (k: number): void => {
        const { ids, targets, w } = batches[k]!;
        const ht = teacher.forwardHidden(ids, b, s);
        const hs = m.forwardHidden(ids, b, s);
        head.run(hs, ht, targets, w, b * s, true);
        m.backwardHidden();
      };
      for (const passes of [1, 2]) sameAsZeroGrad(m, pass, passes);
    } finally { be.dispose(); }
  });
}

test('overwriteGrads with a bf16 model and bf16 logits (the gradient written over the logits in place): the same gradients as zeroGrad', () => {
  const be = createCpuBackend({ dtype: 'f32', threads: 1 });
  try {
    const { m, teacher, b, s, batches } = setup(be, { tieWordEmbeddings: false }, 'bf16');
    const head = new ChunkedHead(m, teacher, spec, b * s, { chunkFloats: 40, logits: 'bf16' });
    assert.ok(head.chunkRows < b * s, `chunk rows ${head.chunkRows}`);
    const pass = (): void => {
      const { ids, targets, w } = batches[0]!;
      const ht = teacher.forwardHidden(ids, b, s);
      const hs = m.forwardHidden(ids, b, s);
      head.run(hs, ht, targets, w, b * s, true);
      m.backwardHidden();
    };
    sameAsZeroGrad(m, pass, 1);
  } finally { be.dispose(); }
});

test('a backward pass without the LM head\'s gradient after overwriteGrads (backwardHidden alone) leaves that gradient zero, as zeroGrad did, and every range is final when reported', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  try {
    for (const tied of [true, false]) {
      const { m, b, s, batches } = setup(be, { tieWordEmbeddings: tied });
      const { ids } = batches[0]!;
      const pass = (): void => {
        m.forwardHidden(ids, b, s);
        be.upload(m.hiddenGrad(), Float64Array.from({ length: b * s * 8 }, (_, i) => Math.sin(i)));
        m.backwardHidden();
      };
      m.zeroGrad(); pass();
      const want = Float64Array.from(be.download(m.grads!));
      poison(m);
      m.overwriteGrads();
      // each range handed on as final (data parallel reduces it then) already holds its final values
      const seen: Array<[number, number, Float64Array]> = [];
      m.forwardHidden(ids, b, s);
      be.upload(m.hiddenGrad(), Float64Array.from({ length: b * s * 8 }, (_, i) => Math.sin(i)));
      m.backwardHidden((lo, hi) => seen.push([lo, hi, Float64Array.from(be.download(m.grads!)).subarray(lo, hi)]));
      assertSame(be.download(m.grads!), want, tied ? 'tied' : 'untied');
      assert.ok(seen.length >= 3, 'ranges reported');
      for (const [lo, hi, v] of seen) assertSame(v, want.subarray(lo, hi), `${tied ? 'tied' : 'untied'}: range [${lo}, ${hi}) when reported`);
    }
  } finally { be.dispose(); }
});
