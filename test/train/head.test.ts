/**
 * The chunked LM head + loss (src/train/head.ts) against the unchunked path it replaces (full logits from
 * Transformer.forward, the fused loss over all rows, Transformer.backward), in float64: same per-token statistics
 * and same gradients, for every loss kind, tied and untied heads, chunks that do not divide the rows. And the
 * loss over the real tokens of padded embeddings against models with the padding rows cut off. And bf16 logits (bf16
 * models): the chunked head equals the full-logits path whose logits were rounded to bf16 before the loss, with the
 * gradient written over the student's logits in place; chunk rows and memory of that layout; --logits' resolution.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { Backend, LossSpec } from '../../src/backend/backend.js';
import { LOSS_STATS } from '../../src/backend/backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { CACHED_HEAD_MEMORY, ChunkedHead, DEFAULT_HEAD_CHUNK_FLOATS, defaultChunkFloats, headChunkRows, headFloats, headRows } from '../../src/train/head.js';
import { resolveLogits } from '../../src/train/precision.js';
import { DistilleryError } from '../../src/util/errors.js';
import { StepRunner } from '../../src/train/step.js';
import { Rng } from '../../src/util/rng.js';
import { LOSS_SPECS } from '../util/loss-specs.js';

function cfgOf(over: Partial<ModelConfig> = {}): ModelConfig {
  return {
    architecture: 'qwen2', vocabSize: 13, hiddenSize: 8, intermediateSize: 12, numLayers: 2, numHeads: 4,
    numKvHeads: 2, headDim: 2, rope: { type: 'default', theta: 1e6 }, rmsNormEps: 1e-6, tieWordEmbeddings: true,
    maxPositionEmbeddings: 64, qkvBias: true, qkNorm: false, noRopeLayers: [], ...over,
  };
}

function weightsOf(m: Transformer, seed: number): Float64Array {
  return Float64Array.from(initialWeights(m.layout, m.config, new Rng(seed), 0.5));
}

/** The unchunked reference: full logits, the loss over all rows at once, backward from dlogits. */
function fullPass(be: Backend, m: Transformer, t: Transformer | null, ids: Int32Array, targets: Int32Array, w: Float64Array,
  b: number, s: number, spec: LossSpec): { stats: Float64Array; grad: Float64Array } {
  const n = b * s, V = m.config.vocabSize;
  m.zeroGrad();
  const tl = t ? t.forward(ids, b, s) : null;
  const logits = m.forward(ids, b, s);
  const stats = be.alloc(n * LOSS_STATS, 'stats'), wb = be.alloc(n, 'w'), tg = be.allocInt(n, 'targets');
  be.upload(wb, w); be.uploadInt(tg, targets);
  be.lossForward(stats, logits, logits, tl, tg, wb, n, V, spec);
  m.backward(logits);
  return { stats: Float64Array.from(be.download(stats)), grad: Float64Array.from(be.download(m.grads!)) };
}

function chunkedPass(m: Transformer, t: Transformer | null, head: ChunkedHead, ids: Int32Array, targets: Int32Array,
  w: Float64Array, b: number, s: number): { stats: Float64Array; grad: Float64Array } {
  m.zeroGrad();
  const ht = t ? t.forwardHidden(ids, b, s) : null;
  const hs = m.forwardHidden(ids, b, s);
  const stats = head.run(hs, ht, targets, w, b * s, true);
  m.backwardHidden();
  return { stats: Float64Array.from(stats), grad: Float64Array.from(m.backend.download(m.grads!)) };
}

function maxRelDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  assert.equal(a.length, b.length);
  let d = 0, s = 0;
  for (let i = 0; i < a.length; i++) { d = Math.max(d, Math.abs(a[i]! - b[i]!)); s = Math.max(s, Math.abs(b[i]!)); }
  return d / Math.max(s, 1e-300);
}

const specs = LOSS_SPECS;

for (const spec of specs) {
  for (const tied of [true, false]) {
    test(`chunked head = full logits (stats and every gradient), loss ${spec.kind}, ${tied ? 'tied' : 'untied'}, chunks of 3 over 10 rows`, () => {
      const be = createCpuBackend({ dtype: 'f64', threads: 1 });
      try {
        const b = 2, s = 5, n = b * s, cfg = cfgOf({ tieWordEmbeddings: tied });
        const m = new Transformer(be, cfg, { batch: b, seq: s, training: true });
        m.setWeights(weightsOf(m, 1));
        let teacher: Transformer | null = null;
        if (spec.kind !== 'none') {
          teacher = new Transformer(be, cfgOf({ hiddenSize: 12, intermediateSize: 16, numHeads: 2, numKvHeads: 2, headDim: 6, tieWordEmbeddings: !tied }),
            { batch: b, seq: s, training: false });
          teacher.setWeights(weightsOf(teacher, 2));
        }
        const rng = new Rng(3);
        const ids = Int32Array.from({ length: n }, () => rng.int(cfg.vocabSize));
        const targets = Int32Array.from({ length: n }, () => rng.int(cfg.vocabSize));
        targets[4] = -1; // padding row
        const w = Float64Array.from({ length: n }, (_, i) => (i === 4 ? 0 : 1 / 9));
        const ref = fullPass(be, m, teacher, ids, targets, w, b, s, spec);
        const head = new ChunkedHead(m, teacher, spec, n, { chunkFloats: 3 * cfg.vocabSize });
        assert.equal(head.chunkRows, 3);
        const got = chunkedPass(m, teacher, head, ids, targets, w, b, s);
        assert.ok(maxRelDiff(got.stats, ref.stats) < 1e-13, `stats differ by ${maxRelDiff(got.stats, ref.stats)}`);
        assert.ok(maxRelDiff(got.grad, ref.grad) < 1e-12, `gradients differ by ${maxRelDiff(got.grad, ref.grad)}`);
        // The padding row contributes nothing, whatever chunk it falls in.
        for (let k = 0; k < LOSS_STATS; k++) assert.equal(got.stats[4 * LOSS_STATS + k], 0);
      } finally { be.dispose(); }
    });
  }
}

/** The weights of `small` (a config with fewer vocabulary rows) cut from a padded model's weights, tensor by name. */
function cutWeights(big: Transformer, bigW: Float64Array, small: Transformer): Float64Array {
  const out = new Float64Array(small.layout.total);
  const byName = new Map(big.layout.tensors.map((t) => [t.name, t]));
  for (const t of small.layout.tensors) {
    const src = byName.get(t.name)!;
    out.set(bigW.subarray(src.offset, src.offset + t.size), t.offset); // [vocab, C] rows: the first rows are the real ones
  }
  return out;
}

test('padded embeddings: the loss runs over the real tokens only, padding rows get no gradient (vs models cut to the real vocabulary)', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  try {
    const b = 2, s = 4, n = b * s, real = 13;
    const spec: LossSpec = { kind: 'kl', alpha: 0.6, temperature: 1.5, beta: 0.5 };
    const sCfg = cfgOf({ vocabSize: 16, tieWordEmbeddings: false }), tCfg = cfgOf({ vocabSize: 20, hiddenSize: 12, intermediateSize: 16, numHeads: 2, numKvHeads: 2, headDim: 6 });
    const m = new Transformer(be, sCfg, { batch: b, seq: s, training: true });
    const t = new Transformer(be, tCfg, { batch: b, seq: s, training: false });
    const mw = weightsOf(m, 5), tw = weightsOf(t, 6);
    m.setWeights(mw); t.setWeights(tw);
    const rng = new Rng(7);
    const ids = Int32Array.from({ length: n }, () => rng.int(real));
    const targets = Int32Array.from({ length: n }, () => rng.int(real));
    const w = new Float64Array(n).fill(1 / n);
    const runner = new StepRunner(m, t, spec, { lossVocab: real });
    assert.deepEqual(runner.headShape, { chunkRows: n, lossVocab: real });
    const head = new ChunkedHead(m, t, spec, n, { lossVocab: real, chunkFloats: 3 * real });
    assert.equal(head.width, 16, 'the GEMMs run 16 columns (13 rounded up), the loss 13');
    const got = chunkedPass(m, t, head, ids, targets, w, b, s);

    const mc = new Transformer(be, { ...sCfg, vocabSize: real }, { batch: b, seq: s, training: true });
    const tc = new Transformer(be, { ...tCfg, vocabSize: real }, { batch: b, seq: s, training: false });
    mc.setWeights(cutWeights(m, mw, mc)); tc.setWeights(cutWeights(t, tw, tc));
    const ref = fullPass(be, mc, tc, ids, targets, w, b, s, spec);
    assert.ok(maxRelDiff(got.stats, ref.stats) < 1e-13, `stats differ by ${maxRelDiff(got.stats, ref.stats)}`);
    const byName = new Map(m.layout.tensors.map((x) => [x.name, x]));
    for (const tc2 of mc.layout.tensors) {
      const big = byName.get(tc2.name)!;
      const g = got.grad.subarray(big.offset, big.offset + big.size);
      assert.ok(maxRelDiff(g.subarray(0, tc2.size), ref.grad.subarray(tc2.offset, tc2.offset + tc2.size)) < 1e-12, `${tc2.name} gradient`);
      for (let i = tc2.size; i < big.size; i++) assert.equal(g[i], 0, `${tc2.name}: padding row gradient at ${i}`);
    }
  } finally { be.dispose(); }
});

test('chunk rows: bounded by the chunk size, at least 1, at most the rows (151936-token vocabulary: 883 rows per 512 MiB of float32 logits)', () => {
  assert.equal(headChunkRows(8192, 151936), Math.floor(DEFAULT_HEAD_CHUNK_FLOATS / 151936));
  assert.equal(DEFAULT_HEAD_CHUNK_FLOATS, 128 * 2 ** 20);
  assert.equal(headChunkRows(10, 300), 10);
  assert.equal(headChunkRows(10, 300, 100), 1);
  const be = createCpuBackend({ dtype: 'f32', threads: 1 });
  try {
    const m = new Transformer(be, cfgOf(), { batch: 1, seq: 4, training: true });
    assert.throws(() => new ChunkedHead(m, null, specs[0]!, 4, { lossVocab: 14 }), /loss vocabulary \(14 tokens\)/);
  } finally { be.dispose(); }
});

test('lossForward with a row stride (ld > vocab) equals the loss on compact rows; columns past the vocabulary get zero gradient', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  try {
    const n = 3, V = 7, LD = 10, rng = new Rng(11);
    const z = Float64Array.from({ length: n * LD }, () => rng.normal() * 3), zt = Float64Array.from({ length: n * LD }, () => rng.normal() * 3);
    const compact = (a: Float64Array): Float64Array => Float64Array.from({ length: n * V }, (_, i) => a[Math.floor(i / V) * LD + (i % V)]!);
    const spec: LossSpec = { kind: 'jsd', alpha: 0.6, temperature: 1.7, beta: 0.3 };
    const tg = be.allocInt(n, 't'); be.uploadInt(tg, Int32Array.from([2, -1, 6]));
    const wb = be.alloc(n, 'w'); be.upload(wb, [0.5, 0, 0.25]);
    const run = (zz: Float64Array, tt: Float64Array, ld: number): { st: Float64Array; dz: Float64Array } => {
      const zb = be.alloc(zz.length, 'z'), tb = be.alloc(tt.length, 'zt'), st = be.alloc(n * LOSS_STATS, 'st');
      be.upload(zb, zz); be.upload(tb, tt);
      be.lossForward(st, zb, zb, tb, tg, wb, n, V, spec, ld);
      return { st: Float64Array.from(be.download(st)), dz: Float64Array.from(be.download(zb)) };
    };
    const strided = run(z, zt, LD), plain = run(compact(z), compact(zt), V);
    assert.deepEqual(strided.st, plain.st);
    assert.deepEqual(compact(strided.dz), plain.dz);
    for (let i = 0; i < n; i++) for (let j = V; j < LD; j++) assert.equal(strided.dz[i * LD + j], 0, `row ${i} column ${j}`);
  } finally { be.dispose(); }
});

test('targets are checked on the host for every backend: in [0, lossVocab), or -1 only with weight 0; the error names the row', async () => {
  const { DistilleryError } = await import('../../src/util/errors.js');
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  try {
    const b = 2, s = 3, n = b * s, real = 13;
    const spec: LossSpec = { kind: 'kl', alpha: 0.5, temperature: 1, beta: 0.5 };
    const m = new Transformer(be, cfgOf({ vocabSize: 16 }), { batch: b, seq: s, training: true });
    const t = new Transformer(be, cfgOf({ vocabSize: 20 }), { batch: b, seq: s, training: false });
    m.setWeights(weightsOf(m, 1)); t.setWeights(weightsOf(t, 2));
    const head = new ChunkedHead(m, t, spec, n, { lossVocab: real });
    const ids = Int32Array.from({ length: n }, (_, i) => i);
    const run = (targets: number[], w: number[]): Float64Array | Float32Array => {
      const ht = t.forwardHidden(ids, b, s), hs = m.forwardHidden(ids, b, s);
      return head.run(hs, ht, Int32Array.from(targets), Float64Array.from(w), n, true);
    };
    const ones = new Array<number>(n).fill(1 / n);
    // Valid: real tokens, and padding (-1) at weight 0.
    const ok = run([0, 12, 3, -1, 5, -1], [1, 1, 1, 0, 1, 0]);
    assert.ok(Array.from(ok).every(Number.isFinite));
    const bad: Array<[number[], number[], RegExp]> = [
      [[0, 1, 2, 3, 4, 13], ones, /row 5 is 13, outside the loss vocabulary \[0, 13\)/], // a padding row of the student's embeddings
      [[0, 1, 2, 16, 4, 5], ones, /row 3 is 16, outside/], // past the student's vocab_size (inside the teacher's)
      [[0, -2, 2, 3, 4, 5], ones, /row 1 is -2, outside/],
      [[0, 1, -1, 3, 4, 5], ones, /row 2 is -1 \(padding\) but its weight is/],
    ];
    for (const [targets, w, re] of bad) {
      assert.throws(() => run(targets, w), (e: unknown) => e instanceof DistilleryError && re.test(e.message), `${targets.join(',')}`);
    }
  } finally { be.dispose(); }
});

for (const spec of specs) {
  test(`bf16 logits: the chunked head = full logits rounded to bf16 (stats and every gradient), loss ${spec.kind}, chunks of 3 over 10 rows`, () => {
    const be = createCpuBackend({ dtype: 'f32', threads: 1 });
    try {
      const b = 2, s = 5, n = b * s, cfg = cfgOf();
      const m = new Transformer(be, cfg, { batch: b, seq: s, training: true, precision: 'bf16' });
      m.setWeights(weightsOf(m, 1));
      let teacher: Transformer | null = null;
      if (spec.kind !== 'none') {
        teacher = new Transformer(be, cfgOf({ hiddenSize: 12, intermediateSize: 16, numHeads: 2, numKvHeads: 2, headDim: 6, tieWordEmbeddings: false }),
          { batch: b, seq: s, training: false, precision: 'bf16' });
        teacher.setWeights(weightsOf(teacher, 2));
      }
      const rng = new Rng(3);
      const ids = Int32Array.from({ length: n }, () => rng.int(cfg.vocabSize));
      const targets = Int32Array.from({ length: n }, () => rng.int(cfg.vocabSize));
      targets[4] = -1;
      const w = Float64Array.from({ length: n }, (_, i) => (i === 4 ? 0 : 1 / 9));
      // The reference: full logits (f32), rounded to bf16 by the upload into bf16 buffers, the loss writing its bf16
      // gradient over the student's, the backward from there.
      m.zeroGrad();
      const tl = teacher ? teacher.forward(ids, b, s) : null;
      const logits = m.forward(ids, b, s);
      const V = cfg.vocabSize, zb = be.alloc(n * V, 'zb', 'bf16'), tb = be.alloc(n * V, 'tb', 'bf16');
      be.upload(zb, be.download(logits));
      if (tl) be.upload(tb, be.download(tl));
      const stats = be.alloc(n * LOSS_STATS, 'stats'), wb = be.alloc(n, 'w'), tg = be.allocInt(n, 'targets');
      be.upload(wb, w); be.uploadInt(tg, targets);
      be.lossForward(stats, zb, zb, tl ? tb : null, tg, wb, n, V, spec);
      m.backward(zb);
      const ref = { stats: Float64Array.from(be.download(stats)), grad: Float64Array.from(be.download(m.grads!)) };
      const head = new ChunkedHead(m, teacher, spec, n, { chunkFloats: 3 * cfg.vocabSize, logits: 'bf16' });
      assert.equal(head.logits, 'bf16');
      assert.ok(head.chunkRows > 3, 'bf16 logits: more rows per chunk in the same memory');
      const small = new ChunkedHead(m, teacher, spec, n, { chunkFloats: cfg.vocabSize, logits: 'bf16' });
      assert.ok(small.chunkRows < n, `chunks: ${small.chunkRows}`);
      const got = chunkedPass(m, teacher, small, ids, targets, w, b, s);
      assert.ok(maxRelDiff(got.stats, ref.stats) < 1e-6, `stats differ by ${maxRelDiff(got.stats, ref.stats)}`);
      assert.ok(maxRelDiff(got.grad, ref.grad) < 1e-5, `gradients differ by ${maxRelDiff(got.grad, ref.grad)}`);
      // ...and the rounding is real: the f32-logits head of the same models differs.
      const f32 = chunkedPass(m, teacher, new ChunkedHead(m, teacher, spec, n, { chunkFloats: cfg.vocabSize }), ids, targets, w, b, s);
      assert.ok(maxRelDiff(f32.stats, ref.stats) > 1e-5, 'bf16 logits round');
      for (let k = 0; k < LOSS_STATS; k++) assert.equal(got.stats[4 * LOSS_STATS + k], 0);
    } finally { be.dispose(); }
  });
}

test('bf16 logits: 2.5 times the rows per chunk online and 3 times from a cache (the same bytes), fp32 models refused; --logits auto follows the models', () => {
  const v = 151936;
  // The rows split evenly over the fewest chunks the bound allows: f32 logits at most 883 rows (10 chunks of 820),
  // bf16 online at most 2208 (2.5 times: 4 chunks of 2048), bf16 from a cache at most 3 times the f32 cached bound.
  assert.equal(headChunkRows(8192, v), 883);
  assert.equal(headRows(8192, v, true), 820);
  assert.equal(Math.floor(DEFAULT_HEAD_CHUNK_FLOATS * 10 / 4 / v), 2208);
  assert.equal(headRows(8192, v, true, DEFAULT_HEAD_CHUNK_FLOATS, true, 'bf16'), 2048);
  assert.equal(headRows(8192, v, false, DEFAULT_HEAD_CHUNK_FLOATS, true, 'bf16'), Math.ceil(8192 / Math.ceil(8192 / Math.floor(DEFAULT_HEAD_CHUNK_FLOATS * 6 / 2 / v))));
  assert.equal(headRows(10, 300, true, 4 * 300), 4, 'at most 4 rows: 3 chunks of 4, 4, 2 rows');
  // No more logits memory than the f32 layout with its bf16 dlogits: rows × v × (2 + 2) bytes against rows × v × 10.
  const f32Bytes = 4 * headFloats(8192, v, true, DEFAULT_HEAD_CHUNK_FLOATS, true), bf16Bytes = 4 * headFloats(8192, v, true, DEFAULT_HEAD_CHUNK_FLOATS, true, 'bf16');
  assert.ok(bf16Bytes <= f32Bytes + 10 * v, `${bf16Bytes} vs ${f32Bytes}`);
  assert.equal(resolveLogits('auto', 'bf16'), 'bf16');
  // The default bounds: a cached head may take CACHED_HEAD_MEMORY times an online head's logits memory, so a bf16
  // student's 8×1024 batch from a cache is one chunk (online: four of 2048), and an fp32 one's three chunks of 2731 (online: ten of 820).
  const online = (bf16: boolean): number => headFloats(8192, v, true, defaultChunkFloats(false, bf16), bf16, bf16 ? 'bf16' : 'f32') - 8192 * (2 + 2 * LOSS_STATS);
  const cached = (bf16: boolean): number => headFloats(8192, v, false, defaultChunkFloats(true, bf16), bf16, bf16 ? 'bf16' : 'f32') - 8192 * (2 + LOSS_STATS);
  assert.equal(headRows(8192, v, false, defaultChunkFloats(true, true), true, 'bf16'), 8192);
  assert.equal(headRows(8192, v, true, defaultChunkFloats(false, true), true, 'bf16'), 2048);
  assert.equal(headRows(8192, v, false, defaultChunkFloats(true, false)), 2731);
  for (const bf16 of [true, false]) {
    assert.ok(cached(bf16) <= CACHED_HEAD_MEMORY * online(bf16) + 4 * v, `${bf16}: cached ${cached(bf16)} floats of logits, online ${online(bf16)}`);
  }
  assert.equal(resolveLogits('auto', 'fp32'), 'f32');
  assert.equal(resolveLogits('f32', 'bf16'), 'f32');
  assert.throws(() => resolveLogits('bf16', 'fp32'), /--logits bf16 needs bf16 models/);
  const be = createCpuBackend({ dtype: 'f32', threads: 1 });
  try {
    const m = new Transformer(be, cfgOf(), { batch: 1, seq: 4, training: true });
    assert.throws(() => new ChunkedHead(m, null, specs[0]!, 4, { logits: 'bf16' }),
      (e: unknown) => e instanceof DistilleryError && /bf16 logits need bf16 models, and the student computes in f32/.test(e.message));
  } finally { be.dispose(); }
});
