/**
 * The sparse loss (a teacher cache's slots instead of teacher logits) against the dense loss in float64: top-K with
 * K = vocab equals it; top-K with K < vocab equals the divergence of the two distributions coarsened to the K tokens and
 * one tail bucket; the mean of the sample estimator over many draws converges to the dense divergence and its gradient;
 * the gradient it writes is the finite-difference gradient of the value it reports.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { Backend, LossSpec } from '../../src/backend/backend.js';
import { LOSS_STATS, STAT_ACC, STAT_AGREE, STAT_CE, STAT_DIV, STAT_LOSS } from '../../src/backend/backend.js';
import { sparseRow, parseSparse, type SparseEntry, type SparseRep } from '../../src/cache/sparse.js';
import { allocSparseHost, setSparseRow, SparseDevice } from '../../src/cache/targets.js';
import { Rng } from '../../src/util/rng.js';
import { assertClose, bufOf, randn } from '../backend/helpers.js';

const KINDS: LossSpec['kind'][] = ['kl', 'reverse-kl', 'jsd'];

interface Case { n: number; V: number; z: Float64Array; zt: Float64Array; y: Int32Array; w: Float64Array }

function makeCase(seed: number, n: number, V: number, scale = 2): Case {
  const rng = new Rng(seed);
  const y = new Int32Array(n);
  for (let i = 0; i < n; i++) y[i] = Math.floor(rng.next() * V);
  const w = new Float64Array(n).fill(1 / n);
  return { n, V, z: randn(rng, n * V, scale), zt: randn(rng, n * V, scale), y, w };
}

/** Runs the dense loss; returns stats and dlogits. */
function dense(be: Backend, c: Case, spec: LossSpec): { stats: Float64Array; grad: Float64Array } {
  const st = be.alloc(c.n * LOSS_STATS, 's'), dz = be.alloc(c.n * c.V, 'dz');
  const y = be.allocInt(c.n, 'y'); be.uploadInt(y, c.y);
  be.lossForward(st, dz, bufOf(be, c.z), bufOf(be, c.zt), y, bufOf(be, c.w), c.n, c.V, spec);
  return { stats: be.download(st) as Float64Array, grad: be.download(dz) as Float64Array };
}

/** Runs the sparse loss over the given entries; returns stats and dlogits. */
function sparse(be: Backend, c: Case, spec: LossSpec, entries: SparseEntry[], rep: SparseRep, z: ArrayLike<number> = c.z):
  { stats: Float64Array; grad: Float64Array } {
  const slots = rep.kind === 'sample' ? rep.n : Math.min(rep.k, c.V);
  const h = allocSparseHost(c.n, slots, be.dtype === 'f64' ? 'f64' : 'f32');
  entries.forEach((e, i) => setSparseRow(h, i, e, rep));
  const dev = new SparseDevice(be, c.n, rep.kind === 'top' ? { kind: 'top', k: slots } : rep);
  dev.stage(h, c.n);
  const st = be.alloc(c.n * LOSS_STATS, 's'), dz = be.alloc(c.n * c.V, 'dz');
  const y = be.allocInt(c.n, 'y'); be.uploadInt(y, c.y);
  be.sparseLossForward(st, dz, bufOf(be, z), y, bufOf(be, c.w), dev.targets, c.n, c.V, spec);
  return { stats: be.download(st) as Float64Array, grad: be.download(dz) as Float64Array };
}

function entriesOf(c: Case, T: number, rep: SparseRep, rng: Rng | null): SparseEntry[] {
  return Array.from({ length: c.n }, (_, i) => sparseRow(c.zt, i * c.V, c.V, T, rep, rng ? () => rng.next() : null));
}

/** Float64 softmax of a row at temperature T. */
function softmax(z: ArrayLike<number>, off: number, V: number, T: number): Float64Array {
  let mx = -Infinity;
  for (let j = 0; j < V; j++) mx = Math.max(mx, z[off + j]! / T);
  const p = new Float64Array(V);
  let s = 0;
  for (let j = 0; j < V; j++) { p[j] = Math.exp(z[off + j]! / T - mx); s += p[j]!; }
  for (let j = 0; j < V; j++) p[j]! /= s;
  return p;
}

/** The divergence of two discrete distributions, float64, straight from the definitions (with the 0·log 0 = 0 rule). */
function divergence(kind: LossSpec['kind'], beta: number, ps: ArrayLike<number>, pt: ArrayLike<number>): number {
  let d = 0;
  for (let j = 0; j < ps.length; j++) {
    const s = ps[j]!, t = pt[j]!;
    if (kind === 'kl') { if (t > 0) d += t * Math.log(t / s); } else if (kind === 'reverse-kl') { if (s > 0) d += s * Math.log(s / t); } else {
      const m = beta * t + (1 - beta) * s;
      if (t > 0) d += beta * t * Math.log(t / m);
      if (s > 0) d += (1 - beta) * s * Math.log(s / m);
    }
  }
  return d;
}

test('sparse loss: top-K with K = vocab equals the dense loss (stats and gradient, every kind)', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const c = makeCase(7, 5, 37);
  for (const kind of KINDS) {
    for (const T of [1, 2]) {
      const spec: LossSpec = { kind, alpha: 0.7, temperature: T, beta: 0.3 };
      const d = dense(be, c, spec);
      const rep: SparseRep = { kind: 'top', k: c.V };
      const s = sparse(be, c, spec, entriesOf(c, T, rep, null), rep);
      assertClose(s.stats, d.stats, 1e-10, 1e-12, `${kind} T=${T} stats`);
      assertClose(s.grad, d.grad, 1e-10, 1e-13, `${kind} T=${T} dlogits`);
    }
  }
  be.dispose();
});

test('sparse loss: top-K with K < vocab is the divergence over the K tokens and one tail bucket', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const c = makeCase(11, 4, 29);
  const T = 2, K = 6;
  for (const kind of KINDS) {
    const spec: LossSpec = { kind, alpha: 1, temperature: T, beta: 0.4 };
    const rep: SparseRep = { kind: 'top', k: K };
    const ents = entriesOf(c, T, rep, null);
    const s = sparse(be, c, spec, ents, rep);
    for (let i = 0; i < c.n; i++) {
      const qs = softmax(c.z, i * c.V, c.V, T), qt = softmax(c.zt, i * c.V, c.V, T);
      const ids = ents[i]!.ids;
      // the K most likely teacher tokens, by an independent sort
      const order = Array.from({ length: c.V }, (_, j) => j).sort((a, b) => qt[b]! - qt[a]!);
      assert.deepEqual([...ids].sort((a, b) => a - b), order.slice(0, K).sort((a, b) => a - b));
      const ps = ids.map((j) => qs[j]!), pt = ids.map((j) => qt[j]!);
      ps.push(1 - ps.reduce((a, b) => a + b, 0)); pt.push(1 - pt.reduce((a, b) => a + b, 0));
      const want = T * T * divergence(kind, 0.4, ps, pt);
      assertClose([s.stats[i * LOSS_STATS + STAT_DIV]!], [want], 1e-9, 1e-12, `${kind} row ${i}`);
    }
  }
  be.dispose();
});

test('sparse loss: the sample estimator is unbiased (its mean over draws converges to the dense divergence and gradient)', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const c = makeCase(3, 2, 11, 1.5);
  const T = 2, draws = 3000;
  const rep: SparseRep = { kind: 'sample', n: 4 };
  for (const kind of KINDS) {
    const spec: LossSpec = { kind, alpha: 1, temperature: T, beta: 0.5 };
    const d = dense(be, c, spec);
    const rng = new Rng(99);
    const sumD = new Float64Array(c.n), sumD2 = new Float64Array(c.n);
    const sumG = new Float64Array(c.n * c.V), sumG2 = new Float64Array(c.n * c.V);
    for (let r = 0; r < draws; r++) {
      const s = sparse(be, c, spec, entriesOf(c, T, rep, rng), rep);
      for (let i = 0; i < c.n; i++) { const v = s.stats[i * LOSS_STATS + STAT_DIV]!; sumD[i]! += v; sumD2[i]! += v * v; }
      for (let j = 0; j < s.grad.length; j++) { sumG[j]! += s.grad[j]!; sumG2[j]! += s.grad[j]! ** 2; }
    }
    // Within 5 standard errors of the mean (and the estimate is not trivially exact: it has variance).
    const within = (sum: number, sum2: number, want: number, what: string): void => {
      const mean = sum / draws, sd = Math.sqrt(Math.max(sum2 / draws - mean * mean, 0)), se = sd / Math.sqrt(draws);
      assert.ok(Math.abs(mean - want) <= 5 * se + 1e-12, `${kind} ${what}: mean ${mean} vs dense ${want} (standard error ${se})`);
      return void 0;
    };
    let anyVariance = false;
    for (let i = 0; i < c.n; i++) {
      within(sumD[i]!, sumD2[i]!, d.stats[i * LOSS_STATS + STAT_DIV]!, `row ${i} divergence`);
      if (sumD2[i]! / draws - (sumD[i]! / draws) ** 2 > 1e-6) anyVariance = true;
    }
    for (let j = 0; j < sumG.length; j++) within(sumG[j]!, sumG2[j]!, d.grad[j]!, `dlogits[${j}]`);
    assert.ok(anyVariance, `${kind}: the sample estimate has no variance (it would not be a sample)`);
  }
  be.dispose();
});

test('sparse loss: dlogits is the finite-difference gradient of the reported loss (samples, top-K with a tail, CE mixed in)', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const c = makeCase(21, 3, 13);
  c.y[0] = c.z.subarray(0, c.V).reduce((b, x, j, a) => (x > a[b]! ? j : b), 0); // row 0 predicts its target (accuracy 1)
  const T = 1.7, h = 1e-6;
  for (const rep of [{ kind: 'sample', n: 5 }, { kind: 'top', k: 4 }] as SparseRep[]) {
    const ents = entriesOf(c, T, rep, new Rng(5));
    for (const kind of KINDS) {
      const spec: LossSpec = { kind, alpha: 0.6, temperature: T, beta: 0.3 };
      const s = sparse(be, c, spec, ents, rep);
      const total = (z: Float64Array): number => {
        const r = sparse(be, c, spec, ents, rep, z);
        let L = 0;
        for (let i = 0; i < c.n; i++) L += c.w[i]! * r.stats[i * LOSS_STATS + STAT_LOSS]!;
        return L;
      };
      for (let j = 0; j < c.n * c.V; j++) {
        const zp = Float64Array.from(c.z), zm = Float64Array.from(c.z);
        zp[j]! += h; zm[j]! -= h;
        const fd = (total(zp) - total(zm)) / (2 * h);
        assertClose([s.grad[j]!], [fd], 1e-5, 1e-9, `${rep.kind} ${kind} dlogits[${j}]`);
      }
      // CE and accuracy are the data's, independent of the teacher; agreement compares argmaxes.
      const d = dense(be, c, spec);
      for (let i = 0; i < c.n; i++) {
        assertClose([s.stats[i * LOSS_STATS + STAT_CE]!], [d.stats[i * LOSS_STATS + STAT_CE]!], 1e-12, 1e-12, 'ce');
        assert.equal(s.stats[i * LOSS_STATS + STAT_AGREE], d.stats[i * LOSS_STATS + STAT_AGREE]);
        assert.equal(s.stats[i * LOSS_STATS + STAT_ACC], d.stats[i * LOSS_STATS + STAT_ACC]);
      }
      assert.equal(s.stats[STAT_ACC], 1, 'row 0 predicts its target');
    }
  }
  be.dispose();
});

test('sparse loss: padding rows get zero stats and gradient; a mask weight scales the gradient', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const c = makeCase(2, 3, 9);
  c.y[1] = -1; c.w[1] = 0; c.w[2] = 0.25;
  const rep: SparseRep = { kind: 'sample', n: 3 };
  const ents = entriesOf(c, 2, rep, new Rng(1));
  const s = sparse(be, c, { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0.5 }, ents, rep);
  assert.deepEqual([...s.stats.subarray(LOSS_STATS, 2 * LOSS_STATS)], new Array<number>(LOSS_STATS).fill(0));
  assert.ok(s.grad.subarray(c.V, 2 * c.V).every((x) => x === 0));
  assert.ok(s.grad.subarray(2 * c.V).some((x) => x !== 0));
  be.dispose();
});

test('dense and sparse loss refuse a padding row with a weight and a target outside the vocabulary, naming the row', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  try {
    const rep: SparseRep = { kind: 'top', k: 4 };
    const spec: LossSpec = { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0.5 };
    for (const [y, w, msg] of [[-1, 0.5, /row 1 has target -1 \(padding\) but weight 0.5/], [9, 0.25, /row 1 target 9 outside \[0, 9\)/]] as const) {
      const c = makeCase(4, 3, 9);
      const ents = entriesOf(c, 2, rep, null);
      c.y[1] = y; c.w[1] = w;
      assert.throws(() => dense(be, c, spec), (e: Error) => e instanceof RangeError && /^lossForward: /.test(e.message) && msg.test(e.message));
      assert.throws(() => sparse(be, c, spec, ents, rep), (e: Error) => e instanceof RangeError && /^sparseLossForward: /.test(e.message) && msg.test(e.message));
    }
  } finally { be.dispose(); }
});

test('sparse rows: samples count N draws over distinct ascending ids; top-K is by probability; --sparse parses and refuses', () => {
  const rng = new Rng(4);
  const z = randn(rng, 50, 3);
  const e = sparseRow(z, 0, 50, 2, { kind: 'sample', n: 16 }, () => rng.next());
  assert.equal(e.counts.reduce((a, b) => a + b, 0), 16);
  for (let k = 1; k < e.ids.length; k++) assert.ok(e.ids[k]! > e.ids[k - 1]!);
  let best = 0;
  for (let j = 1; j < 50; j++) if (z[j]! > z[best]!) best = j;
  assert.equal(e.argmax, best);
  const t = sparseRow(z, 0, 50, 2, { kind: 'top', k: 5 }, null);
  assert.equal(t.ids[0], best);
  for (let k = 1; k < 5; k++) assert.ok(t.logq[k]! <= t.logq[k - 1]!);
  const mass = t.logq.reduce((a, l) => a + Math.exp(l), 0);
  assertClose([mass + t.tail], [1], 1e-12, 1e-12, 'top-K mass + tail');
  assert.deepEqual(parseSparse('sample:8'), { kind: 'sample', n: 8 });
  assert.deepEqual(parseSparse('top:32'), { kind: 'top', k: 32 });
  for (const bad of ['sample', 'top:0', 'sample:257', 'random:4', 'top:3.5']) assert.throws(() => parseSparse(bad), /--sparse/);
});
