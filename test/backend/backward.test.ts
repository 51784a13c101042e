/**
 * CPU backend backward ops against central finite differences on the f64 backend: the objective is
 * L = Σ out ⊙ R with random R (for the loss, L = Σ weights_i · loss_i), and every check also asserts that
 * the backward op accumulates into its gradient outputs (a second call doubles them).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Backend, Buf } from '../../src/backend/backend.js';
import { LOSS_STATS } from '../../src/backend/backend.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { Rng } from '../../src/util/rng.js';
import { bufOf, checkGradients, dot, randn } from './helpers.js';
import { LOSS_SPECS } from './reference.js';
import { plainRope } from '../../src/backend/rope.js';

function f64(threads = 1): Backend {
  return createCpuBackend({ dtype: 'f64', threads });
}

/** L = Σ out ⊙ r. */
function objectiveOf(be: Backend, out: Buf, r: Float64Array): () => number {
  return () => dot(be.download(out), r);
}

test('embedding backward (repeated ids accumulate)', () => {
  const be = f64(), rng = new Rng(11);
  const vocab = 7, c = 5, n = 9;
  const table = bufOf(be, randn(rng, vocab * c)), dtable = be.alloc(vocab * c, 'dt');
  const ids = be.allocInt(n, 'ids');
  be.uploadInt(ids, Int32Array.from([1, 3, 3, 0, 6, 1, 1, 2, 5]));
  const out = be.alloc(n * c, 'o'), r = randn(rng, n * c), R = bufOf(be, r);
  checkGradients(be, rng, [{ name: 'table', buf: table, grad: dtable }],
    () => be.embeddingForward(out, ids, table, n, c), objectiveOf(be, out, r),
    () => be.embeddingBackward(dtable, R, ids, n, c));
  be.dispose();
});

test('rmsnorm backward', () => {
  const be = f64(), rng = new Rng(12);
  const n = 4, c = 10, eps = 1e-6;
  const x = bufOf(be, randn(rng, n * c, 2)), w = bufOf(be, randn(rng, c));
  const dx = be.alloc(n * c, 'dx'), dw = be.alloc(c, 'dw'), out = be.alloc(n * c, 'o'), rstd = be.alloc(n, 'r');
  const r = randn(rng, n * c), R = bufOf(be, r);
  checkGradients(be, rng, [{ name: 'inp', buf: x, grad: dx }, { name: 'weight', buf: w, grad: dw }],
    () => be.rmsnormForward(out, rstd, x, w, n, c, eps), objectiveOf(be, out, r),
    () => be.rmsnormBackward(dx, dw, R, x, w, rstd, n, c));
  be.dispose();
});

test('matmul backward: dinp, dweight, dbias, on the small-row and the transposed paths; null outputs skipped', () => {
  const be = f64(), rng = new Rng(13);
  for (const [n, k, m] of [[3, 5, 4], [13, 7, 9], [20, 9, 6]] as const) {
    const x = bufOf(be, randn(rng, n * k)), w = bufOf(be, randn(rng, m * k)), bias = bufOf(be, randn(rng, m));
    const dx = be.alloc(n * k, 'dx'), dw = be.alloc(m * k, 'dw'), db = be.alloc(m, 'db'), out = be.alloc(n * m, 'o');
    const r = randn(rng, n * m), R = bufOf(be, r);
    checkGradients(be, rng,
      [{ name: `inp ${n}x${k}x${m}`, buf: x, grad: dx }, { name: `weight ${n}x${k}x${m}`, buf: w, grad: dw }, { name: `bias ${n}x${k}x${m}`, buf: bias, grad: db }],
      () => be.matmulForward(out, x, w, bias, n, k, m), objectiveOf(be, out, r),
      () => be.matmulBackward(dx, dw, db, R, x, w, n, k, m));
    // Null outputs are skipped, and each product alone gives the same gradient.
    const dx2 = be.alloc(n * k, 'dx2'), dw2 = be.alloc(m * k, 'dw2');
    be.zero(dx); be.zero(dw);
    be.matmulBackward(dx, dw, null, R, x, w, n, k, m);
    be.matmulBackward(dx2, null, null, R, x, w, n, k, m);
    be.matmulBackward(null, dw2, null, R, x, w, n, k, m);
    assert.deepEqual(be.download(dx2), be.download(dx));
    assert.deepEqual(be.download(dw2), be.download(dw));
  }
  be.dispose();
});

test('rope backward (with pos0)', () => {
  const be = f64(), rng = new Rng(14);
  const b = 2, t = 3, heads = 2, hd = 6;
  const len = b * t * heads * hd;
  const x = bufOf(be, randn(rng, len)), dx = be.alloc(len, 'dx'), out = be.alloc(len, 'o');
  const r = randn(rng, len), R = bufOf(be, r);
  checkGradients(be, rng, [{ name: 'inp', buf: x, grad: dx }],
    () => be.ropeForward(out, x, b, t, heads, hd, plainRope(10000), 5), objectiveOf(be, out, r),
    () => be.ropeBackward(dx, R, b, t, heads, hd, plainRope(10000), 5));
  be.dispose();
});

test('attention backward, GQA: dq, dk, dv', () => {
  const be = f64(), rng = new Rng(15);
  for (const [b, t, nH, nKv, hd] of [[2, 5, 4, 2, 4], [1, 4, 3, 1, 6]] as const) {
    const q = bufOf(be, randn(rng, b * t * nH * hd)), k = bufOf(be, randn(rng, b * t * nKv * hd)), v = bufOf(be, randn(rng, b * t * nKv * hd));
    const dq = be.alloc(b * t * nH * hd, 'dq'), dk = be.alloc(b * t * nKv * hd, 'dk'), dv = be.alloc(b * t * nKv * hd, 'dv');
    const out = be.alloc(b * t * nH * hd, 'o'), lse = be.alloc(b * nH * t, 'lse');
    const r = randn(rng, b * t * nH * hd), R = bufOf(be, r);
    checkGradients(be, rng,
      [{ name: 'q', buf: q, grad: dq }, { name: 'k', buf: k, grad: dk }, { name: 'v', buf: v, grad: dv }],
      () => be.attentionForward(out, lse, q, k, v, b, t, nH, nKv, hd), objectiveOf(be, out, r),
      () => be.attentionBackward(dq, dk, dv, R, q, k, v, out, lse, b, t, nH, nKv, hd));
  }
  be.dispose();
});

test('swiglu backward', () => {
  const be = f64(), rng = new Rng(16);
  const n = 23;
  const g = bufOf(be, randn(rng, n, 2)), u = bufOf(be, randn(rng, n));
  const dg = be.alloc(n, 'dg'), du = be.alloc(n, 'du'), out = be.alloc(n, 'o');
  const r = randn(rng, n), R = bufOf(be, r);
  checkGradients(be, rng, [{ name: 'gate', buf: g, grad: dg }, { name: 'up', buf: u, grad: du }],
    () => be.swigluForward(out, g, u, n), objectiveOf(be, out, r),
    () => be.swigluBackward(dg, du, R, g, u, n));
  be.dispose();
});

test('loss gradient, every kind: dlogits = weights · ∂loss/∂logits (FD of Σ weights·loss), aliasing allowed', () => {
  const be = f64(), rng = new Rng(17);
  const n = 4, vocab = 9;
  for (const spec of LOSS_SPECS) {
    const z = bufOf(be, randn(rng, n * vocab, 2)), zt = bufOf(be, randn(rng, n * vocab, 2));
    const teacher = spec.kind === 'none' ? null : zt;
    const y = be.allocInt(n, 'y');
    be.uploadInt(y, Int32Array.from([2, -1, 0, 8]));
    const wts = [0.5, 0, 0.25, 1.5], W = bufOf(be, wts);
    const stats = be.alloc(n * LOSS_STATS, 's'), dz = be.alloc(n * vocab, 'dz');
    const objective = () => {
      const st = be.download(stats);
      let s = 0;
      for (let i = 0; i < n; i++) s += wts[i]! * st[i * LOSS_STATS]!;
      return s;
    };
    // lossForward overwrites dlogits, so "backward" here adds its result into the gradient buffer itself.
    const tmp = be.alloc(n * vocab, 'tmp');
    checkGradients(be, rng, [{ name: `logits (${spec.kind}, T=${spec.temperature}, beta=${spec.beta})`, buf: z, grad: dz }],
      () => be.lossForward(stats, null, z, teacher, y, W, n, vocab, spec), objective,
      () => { be.lossForward(stats, tmp, z, teacher, y, W, n, vocab, spec); be.accumulate(dz, tmp, n * vocab); },
      { maxChecks: n * vocab });
    // dlogits aliasing logits gives the same gradient.
    be.lossForward(stats, tmp, z, teacher, y, W, n, vocab, spec);
    const zc = bufOf(be, be.download(z));
    be.lossForward(stats, zc, zc, teacher, y, W, n, vocab, spec);
    assert.deepEqual(be.download(zc), be.download(tmp), `${spec.kind}: aliased dlogits`);
  }
  be.dispose();
});

test('loss forward overwrites dlogits (does not accumulate)', () => {
  const be = f64(), rng = new Rng(18);
  const n = 2, vocab = 5;
  const z = bufOf(be, randn(rng, n * vocab)), y = be.allocInt(n, 'y'), W = bufOf(be, [1, 1]);
  be.uploadInt(y, Int32Array.from([1, 2]));
  const stats = be.alloc(n * LOSS_STATS, 's'), d1 = be.alloc(n * vocab, 'd1'), d2 = bufOf(be, randn(rng, n * vocab));
  be.lossForward(stats, d1, z, null, y, W, n, vocab, LOSS_SPECS[0]!);
  be.lossForward(stats, d2, z, null, y, W, n, vocab, LOSS_SPECS[0]!);
  assert.deepEqual(be.download(d2), be.download(d1));
  be.dispose();
});

test('overwrite mode: matmulBackward with dinpAccumulate false and swigluBackward with accumulate false ignore what the output held', () => {
  const be = f64(), rng = new Rng(5);
  const n = 6, k = 5, m = 4;
  const dout = bufOf(be, randn(rng, n * m)), inp = bufOf(be, randn(rng, n * k)), w = bufOf(be, randn(rng, m * k));
  // reference: float64 sums of dout · W
  const d = be.download(dout), W = be.download(w);
  const want = new Float64Array(n * k);
  for (let i = 0; i < n; i++) for (let j = 0; j < k; j++) { let s = 0; for (let c = 0; c < m; c++) s += d[i * m + c]! * W[c * k + j]!; want[i * k + j] = s; }
  const dinp = bufOf(be, randn(rng, n * k).map((x) => 100 * x)), dw = be.alloc(m * k, 'dw');
  be.matmulBackward(dinp, dw, null, dout, inp, w, n, k, m, false);
  const got = be.download(dinp);
  for (let i = 0; i < n * k; i++) assert.ok(Math.abs(got[i]! - want[i]!) < 1e-12, `dinp[${i}] ${got[i]} vs ${want[i]}`);
  const dw1 = Float64Array.from(be.download(dw));
  be.matmulBackward(dinp, dw, null, dout, inp, w, n, k, m, false);
  assert.deepEqual([...be.download(dinp)], [...got], 'overwritten again, not accumulated');
  const dw2 = be.download(dw);
  for (let i = 0; i < m * k; i++) assert.ok(Math.abs(dw2[i]! - 2 * dw1[i]!) < 1e-12, 'the weight gradient still accumulates');
  const N = 9, g = bufOf(be, randn(rng, N)), u = bufOf(be, randn(rng, N)), dy = bufOf(be, randn(rng, N));
  const dg = bufOf(be, randn(rng, N).map((x) => 50 * x)), du = bufOf(be, randn(rng, N).map((x) => 50 * x));
  const dg0 = be.alloc(N, 'dg0'), du0 = be.alloc(N, 'du0');
  be.swigluBackward(dg, du, dy, g, u, N, false);
  be.swigluBackward(dg0, du0, dy, g, u, N);
  assert.deepEqual([...be.download(dg)], [...be.download(dg0)]);
  assert.deepEqual([...be.download(du)], [...be.download(du0)]);
});

test('attention and rope backward overwriting (accumulate false): the gradients equal one accumulation into zeros, whatever they held', () => {
  // f32 (rounded in place like a model's buffers) and the float64 reference backend
  for (const be of [f64(), createCpuBackend({ dtype: 'f32', threads: 2 })]) {
    const rng = new Rng(17), b = 2, t = 5, nH = 4, nKv = 2, hd = 6, qn = b * t * nH * hd, kn = b * t * nKv * hd;
    const q = bufOf(be, randn(rng, qn)), k = bufOf(be, randn(rng, kn)), v = bufOf(be, randn(rng, kn)), R = bufOf(be, randn(rng, qn));
    const out = be.alloc(qn, 'o'), lse = be.alloc(b * nH * t, 'lse');
    be.attentionForward(out, lse, q, k, v, b, t, nH, nKv, hd);
    const grads = (start: (n: number) => Float64Array, accumulate: boolean): Float64Array[] => {
      const g = [bufOf(be, start(qn)), bufOf(be, start(kn)), bufOf(be, start(kn))];
      be.attentionBackward(g[0]!, g[1]!, g[2]!, R, q, k, v, out, lse, b, t, nH, nKv, hd, accumulate);
      const r = bufOf(be, start(qn));
      be.ropeBackward(r, R, b, t, nH, hd, plainRope(10000), 3, accumulate);
      return [...g, r].map((x) => Float64Array.from(be.download(x)));
    };
    const added = grads((n) => new Float64Array(n), true), stored = grads((n) => randn(rng, n, 5), false);
    for (let i = 0; i < 4; i++) {
      assert.deepEqual(stored[i], added[i], `${['dq', 'dk', 'dv', 'rope dinp'][i]} (${be.download(q).constructor.name})`);
      assert.ok(added[i]!.some((x) => x !== 0), 'a non-zero gradient');
    }
    be.dispose();
  }
});
