/**
 * Packed documents that attend only to themselves (Backend DocPositions, TransformerOptions.documents; 'bfd' windows):
 * the oracle is each document run alone. The backend's attention and RoPE over a window of several documents against
 * the float64 references run on each document's rows by themselves (f64 JS kernels and the f32 WASM ones, 1 and 3
 * threads); a whole model's logits and every parameter's gradient over packed windows against the same model run on
 * each document alone (float64), for RoPE kinds, GQA, q/k norms and NoPE layers; packDocuments' bfd positions.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { checkDocPositions, type Backend } from '../../src/backend/backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { documentPositions, packDocuments } from '../../src/data/pack.js';
import { Rng } from '../../src/util/rng.js';
import { BatchLoader } from '../../src/data/loader.js';
import { makeEvalBatches } from '../../src/train/run.js';
import { assertClose, bufOf, randn } from '../backend/helpers.js';
import { attentionBackwardRef, attentionRef, docPositionsOf, docSegments, rowsOf } from '../backend/reference.js';

/** Window layouts: (b, t, document lengths per window; what is left of t is the padding document). */
const LAYOUTS: Array<[number, number, number[][]]> = [
  [2, 18, [[5, 7, 4], [9, 9]]],
  [3, 11, [[1, 1, 9], [11], [3, 2, 2, 1]]],
];

test('documentPositions counts from each document\'s first row, the padding a document of its own; checkDocPositions refuses others', () => {
  assert.deepEqual(Array.from(documentPositions(8, [0, 2, 3], 5)), [0, 1, 0, 0, 1, 0, 1, 2]);
  assert.deepEqual(Array.from(documentPositions(4, [0], 4)), [0, 1, 2, 3]);
  checkDocPositions(docPositionsOf(2, 18, [[5, 7, 4], [9, 9]]), 2, 18);
  assert.throws(() => checkDocPositions(Int32Array.of(1, 2), 1, 2), /row 0 is at 1/);
  assert.throws(() => checkDocPositions(Int32Array.of(0, 1, 3), 1, 3), /row 2 is at 3 after 1/);
  assert.throws(() => checkDocPositions(Int32Array.of(0, 1, 2, 3), 2, 2), /window 1 row 0/);
});

for (const [dtype, threads] of [['f64', 1], ['f32', 1], ['f32', 3]] as const) {
  test(`attention and RoPE over packed documents equal each document alone (${dtype}, ${threads} thread${threads > 1 ? 's' : ''})`, () => {
    const be: Backend = createCpuBackend({ dtype, threads });
    try {
      const tol = dtype === 'f64' ? 1e-12 : 2e-5;
      for (const [b, t, docs] of LAYOUTS) {
        for (const [nH, nKv, hd] of [[4, 2, 6], [3, 3, 4]] as const) {
          const rng = new Rng(b * 100 + t + nH);
          const pos = docPositionsOf(b, t, docs);
          const pb = be.allocInt(b * t, 'positions');
          be.uploadInt(pb, pos);
          const dp = { docPositions: pb };
          const qn = b * t * nH * hd, kn = b * t * nKv * hd;
          const q = randn(rng, qn), k = randn(rng, kn), v = randn(rng, kn), g = randn(rng, qn);
          const Q = bufOf(be, q), K = bufOf(be, k), V = bufOf(be, v), G = bufOf(be, g);
          const out = be.alloc(qn, 'out'), lse = be.alloc(b * nH * t, 'lse');
          const dq = be.alloc(qn, 'dq'), dk = be.alloc(kn, 'dk'), dv = be.alloc(kn, 'dv');
          be.attentionForward(out, lse, Q, K, V, b, t, nH, nKv, hd, dp);
          be.attentionBackward(dq, dk, dv, G, Q, K, V, out, lse, b, t, nH, nKv, hd, false, dp);
          const [o, l, gq, gk, gv] = [out, lse, dq, dk, dv].map((x) => be.download(x));
          // RoPE forward and backward by document positions
          const rope = { type: 'default' as const, theta: 1e4 };
          const rq = be.alloc(qn, 'rq'), rb = be.alloc(qn, 'rb');
          be.ropeForward(rq, Q, b, t, nH, hd, rope, dp);
          be.ropeBackward(rb, G, b, t, nH, hd, rope, dp, false);
          const [rqh, rbh] = [rq, rb].map((x) => be.download(x));
          const one: Backend = createCpuBackend({ dtype: 'f64', threads: 1 });
          try {
            for (let w = 0; w < b; w++) {
              for (const [s, e] of docSegments(pos, w, t)) {
                const L = e - s, what = `${b}x${t} window ${w} rows ${s}..${e} (${nH}/${nKv} heads, hd ${hd})`;
                const qs = rowsOf(q, w, t, nH * hd, s, e), ks = rowsOf(k, w, t, nKv * hd, s, e), vs = rowsOf(v, w, t, nKv * hd, s, e), gs = rowsOf(g, w, t, nH * hd, s, e);
                const [oR, lR] = attentionRef(qs, ks, vs, 1, L, nH, nKv, hd);
                const [dqR, dkR, dvR] = attentionBackwardRef(gs, qs, ks, vs, 1, L, nH, nKv, hd);
                assertClose(rowsOf(o!, w, t, nH * hd, s, e), oR, tol, tol, `out ${what}`);
                assertClose(rowsOf(gq!, w, t, nH * hd, s, e), dqR, tol, tol, `dq ${what}`);
                assertClose(rowsOf(gk!, w, t, nKv * hd, s, e), dkR, tol, tol, `dk ${what}`);
                assertClose(rowsOf(gv!, w, t, nKv * hd, s, e), dvR, tol, tol, `dv ${what}`);
                for (let h = 0; h < nH; h++) {
                  const got = Array.from({ length: L }, (_, i) => l![(w * nH + h) * t + s + i]!);
                  assertClose(got, Array.from({ length: L }, (_, i) => lR[h * L + i]!), tol, tol, `lse head ${h} ${what}`);
                }
                // RoPE of the document alone: positions 0 .. L − 1
                const X = bufOf(one, qs), Y = one.alloc(qs.length, 'y'), Gs = bufOf(one, gs), Z = one.alloc(gs.length, 'z');
                one.ropeForward(Y, X, 1, L, nH, hd, rope, 0);
                one.ropeBackward(Z, Gs, 1, L, nH, hd, rope, 0, false);
                assertClose(rowsOf(rqh!, w, t, nH * hd, s, e), one.download(Y), tol, tol, `rope forward ${what}`);
                assertClose(rowsOf(rbh!, w, t, nH * hd, s, e), one.download(Z), tol, tol, `rope backward ${what}`);
              }
            }
          } finally { one.dispose(); }
        }
      }
    } finally { be.dispose(); }
  });
}

function tinyConfig(over: Partial<ModelConfig> = {}): ModelConfig {
  return {
    architecture: 'qwen2', vocabSize: 13, hiddenSize: 8, intermediateSize: 12, numLayers: 2, numHeads: 4,
    numKvHeads: 2, headDim: 2, rope: { type: 'default', theta: 1e6 }, rmsNormEps: 1e-6, tieWordEmbeddings: true,
    maxPositionEmbeddings: 64, qkvBias: true, qkNorm: false, noRopeLayers: [], ...over,
  };
}

const CONFIGS: Array<[string, ModelConfig]> = [
  ['qwen2 tied, GQA, biases', tinyConfig()],
  ['llama3 rope scaling, head_dim 8', tinyConfig({ architecture: 'llama', qkvBias: false, numHeads: 2, numKvHeads: 1, headDim: 8,
    rope: { type: 'llama3', theta: 1e4, factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 64 } })],
  ['qwen3 q/k norms, untied', tinyConfig({ architecture: 'qwen3', qkvBias: false, qkNorm: true, numHeads: 2, numKvHeads: 1, headDim: 6, tieWordEmbeddings: false })],
  ['smollm3 NoPE layer 1 of 3', tinyConfig({ architecture: 'smollm3', qkvBias: true, numLayers: 3, noRopeLayers: [1] })],
];

for (const [name, cfg] of CONFIGS) {
  test(`a model over packed documents gives each document's logits and gradients as alone (float64): ${name}`, () => {
    const be = createCpuBackend({ dtype: 'f64', threads: 1 });
    try {
      const [b, t, docs] = LAYOUTS[0]!;
      const pos = docPositionsOf(b, t, docs);
      const packed = new Transformer(be, cfg, { batch: b, seq: t, training: true, documents: true });
      const alone = new Transformer(be, cfg, { batch: 1, seq: t, training: true });
      const rng = new Rng(7);
      const w = Float64Array.from(initialWeights(packed.layout, cfg, rng, 0.5));
      for (const ti of packed.layout.tensors) if (ti.init === 'ones') for (let i = 0; i < ti.size; i++) w[ti.offset + i] = 1 + 0.3 * rng.normal();
      packed.setWeights(w); alone.setWeights(w);
      const V = cfg.vocabSize, ids = Int32Array.from({ length: b * t }, () => rng.int(V));
      // the gradient of Σ R ⊙ logits over the documents' rows (the padding rows weigh 0)
      const R = randn(rng, b * t * V);
      for (let wi = 0; wi < b; wi++) {
        const segs = docSegments(pos, wi, t), real = docs[wi]!.reduce((a, x) => a + x, 0);
        for (const [s, e] of segs) if (s >= real) R.fill(0, (wi * t + s) * V, (wi * t + e) * V);
      }
      const logits = be.download(packed.forward(ids, b, t, pos));
      packed.zeroGrad();
      const dl = be.alloc(b * t * V, 'dlogits');
      be.upload(dl, R);
      packed.backward(dl);
      const grad = be.download(packed.grads!);
      const want = new Float64Array(grad.length);
      alone.zeroGrad();
      for (let wi = 0; wi < b; wi++) {
        const real = docs[wi]!.reduce((a, x) => a + x, 0);
        for (const [s, e] of docSegments(pos, wi, t)) {
          if (s >= real) continue;
          const L = e - s;
          const got = rowsOf(logits, wi, t, V, s, e);
          const ref = be.download(alone.forward(ids.subarray(wi * t + s, wi * t + e), 1, L));
          assertClose(got, ref.subarray(0, L * V), 1e-11, 1e-11, `logits window ${wi} rows ${s}..${e}`);
          const dla = be.alloc(L * V, 'dl alone');
          be.upload(dla, rowsOf(R, wi, t, V, s, e));
          alone.backward(dla);
        }
      }
      want.set(be.download(alone.grads!));
      assertClose(grad, want, 1e-10, 1e-10, 'every parameter\'s gradient');
      assert.ok(want.some((x) => x !== 0));
    } finally { be.dispose(); }
  });
}

test('packDocuments: bfd windows carry each document\'s positions, wrapped and none windows none', () => {
  const enc = { encode: (s: string) => Array.from(s, (ch) => ch.charCodeAt(0) - 96) };
  const docs = ['abcde', 'fg', 'hijklmnop', 'q', 'rstu'];
  const bfd = packDocuments(enc, docs, { seqLen: 8, eosId: 0, packing: 'bfd' });
  for (const w of bfd.windows) {
    assert.ok(w.positions, 'bfd windows have positions');
    checkDocPositions(w.positions, 1, 8);
    // a document starts after each EOS (id 0) and its tokens count up from 0
    for (let i = 1; i < 8; i++) {
      if (w.inputs[i - 1] === 0 && w.targets[i - 1] !== -1) assert.equal(w.positions[i], 0, `row ${i} follows an EOS`);
      else if (w.targets[i - 1] !== -1 && w.targets[i] !== -1) assert.equal(w.positions[i], w.positions[i - 1]! + 1, `row ${i} continues`);
    }
  }
  assert.ok(bfd.windows.some((w) => w.positions!.some((p, i) => i > 0 && p === 0 && w.targets[i] !== -1)), 'some window packs two documents');
  // the row before a document's first token (the previous document's EOS) has that token as its target, which it cannot
  // see coming: not counted (as TRL's padding-free collator drops it)
  for (const w of bfd.windows) for (let i = 0; i + 1 < 8; i++) if (w.positions![i + 1] === 0) assert.equal(w.mask[i], 0, `row ${i} of window ${w.id}`);
  const counted = bfd.windows.reduce((a, w) => a + w.mask.reduce((x, y) => x + y, 0), 0);
  assert.equal(counted, bfd.targetTokens);
  // each document counts as many targets as it does alone: its tokens and EOS less one
  assert.equal(counted, docs.reduce((a, d) => a + d.length, 0));
  for (const packing of ['wrapped', 'none'] as const) {
    assert.ok(packDocuments(enc, docs, { seqLen: 8, eosId: 0, packing }).windows.every((w) => w.positions === undefined), packing);
  }
});

test('the loader and the evaluation batches carry bfd windows\' positions (padding rows: one document each), wrapped windows none', () => {
  const enc = { encode: (s: string) => Array.from(s, (ch) => ch.charCodeAt(0) - 96) };
  const docs = ['abcde', 'fg', 'hijklmnop', 'q', 'rstu', 'vw', 'xyz'];
  const bfd = packDocuments(enc, docs, { seqLen: 8, eosId: 0, packing: 'bfd' }).windows;
  const loader = new BatchLoader(bfd, { batchSize: 2, seed: 3 });
  for (let k = 0; k < 4; k++) {
    const b = loader.next();
    assert.ok(b.positions, 'a batch of bfd windows has positions');
    for (let r = 0; r < 2; r++) {
      const w = bfd.find((x) => x.id === b.windows[r])!;
      assert.deepEqual(Array.from(b.positions.subarray(r * 8, r * 8 + 8)), Array.from(w.positions!), `batch ${k} row ${r}`);
    }
  }
  const evalBatches = makeEvalBatches(bfd.slice(0, 1), 3, 0);
  assert.equal(evalBatches.length, 1);
  const p = evalBatches[0]!.positions!;
  assert.deepEqual(Array.from(p.subarray(0, 8)), Array.from(bfd[0]!.positions!));
  assert.deepEqual(Array.from(p.subarray(8, 24)), [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7]);
  checkDocPositions(p, 3, 8);
  // the padding rows have no window and no targets
  const e = evalBatches[0]!;
  assert.deepEqual(Array.from(e.windows), [bfd[0]!.id ?? -1, -1, -1]);
  assert.ok(e.targets.subarray(8).every((x) => x === -1) && e.mask.subarray(8).every((x) => x === 0) && e.inputs.subarray(8).every((x) => x === 0));
  assert.deepEqual(Array.from(e.targets.subarray(0, 8)), Array.from(bfd[0]!.targets));
  const lb = new BatchLoader(bfd, { batchSize: 3, seed: 5 }).next();
  assert.equal(lb.tokens, lb.mask.reduce((a, x) => a + x, 0));
  const wrapped = packDocuments(enc, docs, { seqLen: 8, eosId: 0, packing: 'wrapped' }).windows;
  assert.equal(new BatchLoader(wrapped, { batchSize: 2, seed: 3 }).next().positions, undefined);
  assert.equal(makeEvalBatches(wrapped, 2, 0)[0]!.positions, undefined);
});

test('a model made without documents refuses positions; one made with them takes a batch without as one document a window', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  try {
    const cfg = tinyConfig();
    const plain = new Transformer(be, cfg, { batch: 1, seq: 6, training: false });
    assert.throws(() => plain.stageInputs(new Int32Array(6), 1, 6, new Int32Array(6)), /made without documents/);
    const m = new Transformer(be, cfg, { batch: 1, seq: 6, training: false, documents: true });
    assert.throws(() => m.stageInputs(new Int32Array(6), 1, 6, Int32Array.of(0, 1, 2, 4, 5, 6)), /row 3 is at 4 after 2/);
    const w = initialWeights(m.layout, cfg, new Rng(1), 0.5);
    m.setWeights(w); plain.setWeights(w);
    const ids = Int32Array.of(1, 2, 3, 4, 5, 6);
    assertClose(be.download(m.forward(ids, 1, 6)), be.download(plain.forward(ids, 1, 6)), 0, 0, 'one document a window is the causal window');
  } finally { be.dispose(); }
});
