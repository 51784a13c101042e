/**
 * CPU backend forward ops against straightforward float64 references written here (not the kernels):
 * memory ops, elementwise ops, embedding, matmul, RMSNorm, RoPE, GQA attention, SwiGLU, every loss kind
 * and AdamW. Each op runs on both the f32 backend (float32 tolerances) and the f64 backend (tight ones).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Backend } from '../../src/backend/backend.js';
import { LOSS_STATS, STAT_ACC, STAT_AGREE } from '../../src/backend/backend.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { Rng } from '../../src/util/rng.js';
import { assertClose, bufOf, randn } from './helpers.js';
import { LOSS_SPECS, attentionRef, lossRef } from './reference.js';
import { plainRope } from '../../src/backend/rope.js';

const DTYPES = ['f32', 'f64'] as const;
/** Relative/absolute tolerance per dtype. */
const TOL = { f32: [2e-5, 2e-6], f64: [1e-12, 1e-13] } as const;

function withBackends(name: string, fn: (be: Backend, rtol: number, atol: number) => void): void {
  for (const dtype of DTYPES) {
    test(`${name} [${dtype}]`, () => {
      const be = createCpuBackend({ dtype, threads: 1 });
      try { fn(be, TOL[dtype][0], TOL[dtype][1]); } finally { be.dispose(); }
    });
  }
}

/** The values as the backend stores them (rounded to float32 in f32 mode), for building references. */
function stored(be: Backend, a: Float64Array): Float64Array {
  return be.dtype === 'f32' ? Float64Array.from(Float32Array.from(a)) : a;
}

test('memory ops: alloc zeroed, upload at offset, view shares storage, copy, zero, download is a copy', () => {
  const be = createCpuBackend({ threads: 1 });
  try {
    const b = be.alloc(6, 'b');
    assert.deepEqual(Array.from(be.download(b)), [0, 0, 0, 0, 0, 0]);
    be.upload(b, [1, 2, 3], 2);
    assert.deepEqual(Array.from(be.download(b)), [0, 0, 1, 2, 3, 0]);
    const v = be.view(b, 2, 3);
    assert.equal(v.length, 3);
    be.scale(v, 2, 3);
    assert.deepEqual(Array.from(be.download(b)), [0, 0, 2, 4, 6, 0]);
    const c = be.alloc(3, 'c');
    be.copy(c, v);
    const d = be.download(c);
    assert.deepEqual(Array.from(d), [2, 4, 6]);
    d[0] = 99;
    assert.equal(be.download(c)[0], 2, 'download must return a fresh copy');
    be.zero(v);
    assert.deepEqual(Array.from(be.download(b)), [0, 0, 0, 0, 0, 0]);
    const ib = be.allocInt(3, 'ids');
    be.uploadInt(ib, Int32Array.from([5, 6, 7]));
    assert.throws(() => be.view(b, 4, 3));
    assert.throws(() => be.upload(b, [1, 2], 5));
  } finally { be.dispose(); }
});

withBackends('add / accumulate / scale / sumSquares', (be, rtol, atol) => {
  const rng = new Rng(1);
  const n = 37;
  const a = stored(be, randn(rng, n)), b = stored(be, randn(rng, n));
  const A = bufOf(be, a), B = bufOf(be, b), O = be.alloc(n, 'o');
  be.add(O, A, B, n);
  assertClose(be.download(O), a.map((x, i) => x + b[i]!), rtol, atol, 'add');
  be.add(A, A, B, n); // aliasing allowed
  assertClose(be.download(A), a.map((x, i) => x + b[i]!), rtol, atol, 'add aliased');
  be.upload(A, a);
  be.accumulate(A, B, n - 1);
  assertClose(be.download(A), a.map((x, i) => (i < n - 1 ? x + b[i]! : x)), rtol, atol, 'accumulate (first n)');
  be.upload(A, a);
  be.scale(A, -0.5, n);
  assertClose(be.download(A), a.map((x) => -0.5 * x), rtol, atol, 'scale');
  let ss = 0;
  for (let i = 0; i < n - 2; i++) ss += b[i]! * b[i]!;
  assertClose([be.sumSquares(B, n - 2)], [ss], 1e-12, 0, 'sumSquares (float64 accumulation)');
});

withBackends('embedding forward', (be, rtol, atol) => {
  const rng = new Rng(2);
  const vocab = 11, c = 6, n = 9;
  const table = stored(be, randn(rng, vocab * c));
  const ids = Int32Array.from({ length: n }, () => rng.int(vocab));
  const T = bufOf(be, table), I = be.allocInt(n, 'ids'), O = be.alloc(n * c, 'o');
  be.uploadInt(I, ids);
  be.embeddingForward(O, I, T, n, c);
  const ref = new Float64Array(n * c);
  for (let i = 0; i < n; i++) for (let j = 0; j < c; j++) ref[i * c + j] = table[ids[i]! * c + j]!;
  assertClose(be.download(O), ref, rtol, atol, 'embedding');
  be.uploadInt(I, Int32Array.from([vocab]));
  assert.throws(() => be.embeddingForward(O, I, T, 1, c), /outside/);
});

withBackends('matmul forward with and without bias, odd shapes', (be, rtol, atol) => {
  const rng = new Rng(3);
  for (const [n, k, m] of [[1, 1, 1], [5, 7, 3], [9, 16, 11], [13, 33, 6]] as const) {
    const x = stored(be, randn(rng, n * k)), w = stored(be, randn(rng, m * k)), bias = stored(be, randn(rng, m));
    const X = bufOf(be, x), W = bufOf(be, w), Bb = bufOf(be, bias), O = bufOf(be, randn(rng, n * m));
    for (const withBias of [false, true]) {
      be.matmulForward(O, X, W, withBias ? Bb : null, n, k, m);
      const ref = new Float64Array(n * m);
      for (let i = 0; i < n; i++) {
        for (let j = 0; j < m; j++) {
          let s = withBias ? bias[j]! : 0;
          for (let l = 0; l < k; l++) s += x[i * k + l]! * w[j * k + l]!;
          ref[i * m + j] = s;
        }
      }
      assertClose(be.download(O), ref, rtol, atol * k, `matmul ${n}x${k}x${m} bias=${withBias}`);
    }
  }
});

withBackends('rmsnorm forward', (be, rtol, atol) => {
  const rng = new Rng(4);
  const n = 5, c = 24, eps = 1e-5;
  const x = stored(be, randn(rng, n * c, 3)), w = stored(be, randn(rng, c));
  const O = be.alloc(n * c, 'o'), R = be.alloc(n, 'rstd');
  be.rmsnormForward(O, R, bufOf(be, x), bufOf(be, w), n, c, eps);
  const ref = new Float64Array(n * c), rref = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    let ms = 0;
    for (let j = 0; j < c; j++) ms += x[i * c + j]! ** 2;
    ms /= c;
    rref[i] = 1 / Math.sqrt(ms + eps);
    for (let j = 0; j < c; j++) ref[i * c + j] = (x[i * c + j]! / Math.sqrt(ms + eps)) * w[j]!;
  }
  assertClose(be.download(O), ref, rtol, atol, 'rmsnorm out');
  assertClose(be.download(R), rref, rtol, atol, 'rmsnorm rstd');
});

/** RoPE reference: each pair (x[i], x[i+hd/2]) as a complex number rotated by e^{i·angle}. */
function ropeRef(x: Float64Array, b: number, t: number, heads: number, hd: number, theta: number, pos0: number): Float64Array {
  const out = new Float64Array(x.length), half = hd / 2;
  for (let bi = 0; bi < b; bi++) for (let p = 0; p < t; p++) for (let h = 0; h < heads; h++) {
    const o = ((bi * t + p) * heads + h) * hd;
    for (let i = 0; i < half; i++) {
      const ang = (pos0 + p) / theta ** ((2 * i) / hd);
      const re = x[o + i]!, im = x[o + i + half]!;
      out[o + i] = re * Math.cos(ang) - im * Math.sin(ang);
      out[o + i + half] = re * Math.sin(ang) + im * Math.cos(ang);
    }
  }
  return out;
}

withBackends('rope forward: reference, pos0 offset, theta matters, in place', (be, rtol, atol) => {
  const rng = new Rng(5);
  const b = 2, t = 5, heads = 3, hd = 8;
  const x = stored(be, randn(rng, b * t * heads * hd));
  const X = bufOf(be, x), O = be.alloc(x.length, 'o');
  for (const [theta, pos0] of [[10000, 0], [10000, 7], [1e6, 3], [500, 1000]] as const) {
    be.ropeForward(O, X, b, t, heads, hd, plainRope(theta), pos0);
    assertClose(be.download(O), ropeRef(x, b, t, heads, hd, theta, pos0), rtol, atol, `rope theta=${theta} pos0=${pos0}`);
  }
  // Position 0 is the identity.
  be.ropeForward(O, X, b, 1, heads * t, hd, plainRope(10000), 0);
  assertClose(be.download(O), x, 0, 0, 'rope at position 0 is the identity');
  // Two thetas give different outputs; so do two offsets.
  const o1 = be.download((be.ropeForward(O, X, b, t, heads, hd, plainRope(10000), 2), O));
  const o2 = be.download((be.ropeForward(O, X, b, t, heads, hd, plainRope(1e6), 2), O));
  const o3 = be.download((be.ropeForward(O, X, b, t, heads, hd, plainRope(10000), 3), O));
  assert.ok(o1.some((v, i) => Math.abs(v - o2[i]!) > 1e-3), 'theta must change the output');
  assert.ok(o1.some((v, i) => Math.abs(v - o3[i]!) > 1e-3), 'pos0 must change the output');
  // pos0 shifts positions: with every time step holding the same vector, row p+1 at pos0 = 2 equals row p at pos0 = 3.
  const rowLen = heads * hd, rep = new Float64Array(t * rowLen);
  for (let p = 0; p < t; p++) rep.set(x.subarray(0, rowLen), p * rowLen);
  const R = bufOf(be, rep);
  const a2 = be.download((be.ropeForward(O, R, 1, t, heads, hd, plainRope(10000), 2), O));
  const a3 = be.download((be.ropeForward(O, R, 1, t, heads, hd, plainRope(10000), 3), O));
  assertClose(a2.subarray(rowLen, t * rowLen), a3.subarray(0, (t - 1) * rowLen), rtol, atol, 'rope pos0 shift');
  be.ropeForward(X, X, b, t, heads, hd, plainRope(10000), 7); // in place
  assertClose(be.download(X), ropeRef(x, b, t, heads, hd, 10000, 7), rtol, atol, 'rope in place');
});

withBackends('attention forward, causal GQA (and MHA): out and the saved per-row log-sum-exp vs float64', (be, rtol, atol) => {
  const rng = new Rng(6);
  for (const [b, t, nH, nKv, hd] of [[2, 6, 4, 2, 8], [1, 5, 3, 3, 4], [2, 4, 6, 1, 6], [1, 40, 2, 1, 3]] as const) {
    // scale 3: scores of several units, so exp(s − max) is far from 1 and a wrong lse (e.g. log without the max) shows
    const q = stored(be, randn(rng, b * t * nH * hd, 3)), k = stored(be, randn(rng, b * t * nKv * hd)), v = stored(be, randn(rng, b * t * nKv * hd));
    const O = be.alloc(q.length, 'o'), L = bufOf(be, randn(rng, b * nH * t)); // garbage must be overwritten
    be.attentionForward(O, L, bufOf(be, q), bufOf(be, k), bufOf(be, v), b, t, nH, nKv, hd);
    const [out, lse] = attentionRef(q, k, v, b, t, nH, nKv, hd);
    assertClose(be.download(O), out, rtol, atol, `attention out ${b},${t},${nH},${nKv},${hd}`);
    assertClose(be.download(L), lse, rtol, atol, `attention lse ${b},${t},${nH},${nKv},${hd}`);
    // the first query row sees one key: lse = its score exactly
    const l = be.download(L);
    for (let h = 0; h < nH; h++) {
      const g = Math.floor(h / (nH / nKv));
      let s = 0;
      for (let e = 0; e < hd; e++) s += q[h * hd + e]! * k[g * hd + e]!;
      assert.ok(Math.abs(l[h * t]! - s / Math.sqrt(hd)) <= atol + rtol * Math.abs(s), `lse of row 0, head ${h}`);
    }
  }
});

withBackends('swiglu forward', (be, rtol, atol) => {
  const rng = new Rng(7);
  const n = 41;
  const g = stored(be, randn(rng, n, 3)), u = stored(be, randn(rng, n));
  const O = be.alloc(n, 'o');
  be.swigluForward(O, bufOf(be, g), bufOf(be, u), n);
  assertClose(be.download(O), g.map((x, i) => (x / (1 + Math.exp(-x))) * u[i]!), rtol, atol, 'swiglu');
});

withBackends('loss forward: stats per kind, padding rows, dlogits sums to zero', (be, rtol, atol) => {
  const rng = new Rng(8);
  const n = 6, vocab = 13;
  for (const spec of LOSS_SPECS) {
    const zs = stored(be, randn(rng, n * vocab, 2)), zt = stored(be, randn(rng, n * vocab, 2));
    // Make row 1 agree on the argmax, so both values of `agree` occur.
    zt[vocab + 3] = 50; zs[vocab + 3] = 50;
    const y = Int32Array.from({ length: n }, () => rng.int(vocab));
    y[4] = -1; // padding
    // Accuracy (argmax == target, first index on ties): row 1's target is its maximum, row 2 ties at 5 and 9 with y = 9.
    y[1] = 3;
    zs[2 * vocab + 5] = 40; zs[2 * vocab + 9] = 40; y[2] = 9;
    const w = Float64Array.from({ length: n }, (_, i) => (i === 4 ? 0 : 0.25));
    const S = bufOf(be, randn(rng, n * LOSS_STATS)), D = be.alloc(n * vocab, 'd'), Y = be.allocInt(n, 'y');
    be.uploadInt(Y, y);
    const teacher = spec.kind === 'none' ? null : bufOf(be, zt);
    be.lossForward(S, D, bufOf(be, zs), teacher, Y, bufOf(be, w), n, vocab, spec);
    const ref: number[] = [];
    for (let i = 0; i < n; i++) {
      if (y[i] === -1) { ref.push(0, 0, 0, 0, 0); continue; }
      ref.push(...lossRef(zs.subarray(i * vocab, (i + 1) * vocab), spec.kind === 'none' ? null : zt.subarray(i * vocab, (i + 1) * vocab), y[i]!, spec));
    }
    assertClose(be.download(S), ref, rtol * 10, atol * 10, `loss stats ${spec.kind}`);
    const st = be.download(S);
    if (spec.kind !== 'none') assert.equal(st[1 * LOSS_STATS + STAT_AGREE], 1, 'row 1 agrees on the argmax');
    assert.deepEqual([st[1 * LOSS_STATS + STAT_ACC], st[2 * LOSS_STATS + STAT_ACC]], [1, 0], 'row 1 predicts its target; row 2 ties before its target');
    const d = be.download(D);
    for (let i = 0; i < n; i++) {
      let s = 0;
      for (let j = 0; j < vocab; j++) s += d[i * vocab + j]!;
      assert.ok(Math.abs(s) < 1e-5, `dlogits row ${i} of ${spec.kind} sums to ${s}`);
    }
    assert.ok(d.subarray(4 * vocab, 5 * vocab).every((x) => x === 0), 'padding row has zero gradient');
    // Without dlogits: the same stats.
    be.lossForward(S, null, bufOf(be, zs), teacher, Y, bufOf(be, w), n, vocab, spec);
    assertClose(be.download(S), ref, rtol * 10, atol * 10, `loss stats ${spec.kind} without dlogits`);
  }
});

test('loss: identical teacher and student give zero divergence; -1 target with nonzero weight throws', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const rng = new Rng(9);
  const n = 3, vocab = 7, z = randn(rng, n * vocab);
  const S = be.alloc(n * LOSS_STATS, 's'), Y = be.allocInt(n, 'y'), W = bufOf(be, [1, 1, 1]);
  be.uploadInt(Y, Int32Array.from([0, 1, 2]));
  for (const kind of ['kl', 'reverse-kl', 'jsd'] as const) {
    be.lossForward(S, null, bufOf(be, z), bufOf(be, z), Y, W, n, vocab, { kind, alpha: 0.5, temperature: 2, beta: 0.5 });
    const st = be.download(S);
    for (let i = 0; i < n; i++) {
      assert.ok(Math.abs(st[i * LOSS_STATS + 2]!) < 1e-12, `${kind}: div of identical distributions`);
      assert.equal(st[i * LOSS_STATS + 3], 1);
    }
  }
  // Kind 'none' with teacher logits given: plain CE, no divergence, agreement still reported.
  be.lossForward(S, null, bufOf(be, z), bufOf(be, z), Y, W, n, vocab, LOSS_SPECS[0]!);
  const st0 = be.download(S);
  for (let i = 0; i < n; i++) {
    assert.equal(st0[i * LOSS_STATS + 0], st0[i * LOSS_STATS + 1], "kind 'none': loss = CE");
    assert.equal(st0[i * LOSS_STATS + 2], 0);
    assert.equal(st0[i * LOSS_STATS + 3], 1);
  }
  be.uploadInt(Y, Int32Array.from([0, -1, 2]));
  assert.throws(() => be.lossForward(S, null, bufOf(be, z), null, Y, W, n, vocab, LOSS_SPECS[0]!), /-1/);
  be.dispose();
});

withBackends('adamw: several steps against a scalar torch.optim.AdamW reference', (be, rtol, atol) => {
  const rng = new Rng(10);
  const n = 17;
  const p0 = stored(be, randn(rng, n));
  const P = bufOf(be, p0), G = be.alloc(n, 'g'), M = be.alloc(n, 'm'), V = be.alloc(n, 'v');
  const p = Array.from(p0), m = new Array<number>(n).fill(0), v = new Array<number>(n).fill(0);
  const lr = 0.01, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  for (let step = 1; step <= 4; step++) {
    const g = stored(be, randn(rng, n));
    be.upload(G, g);
    const gradScale = step === 3 ? 0.5 : 1;
    be.adamw(P, G, M, V, n, { lr, beta1: b1, beta2: b2, eps, weightDecay: wd, step, gradScale });
    for (let i = 0; i < n; i++) {
      const gi = g[i]! * gradScale;
      p[i] = p[i]! * (1 - lr * wd);
      m[i] = b1 * m[i]! + (1 - b1) * gi;
      v[i] = b2 * v[i]! + (1 - b2) * gi * gi;
      const mh = m[i]! / (1 - b1 ** step), vh = v[i]! / (1 - b2 ** step);
      p[i] = p[i]! - (lr * mh) / (Math.sqrt(vh) + eps);
    }
    // f32 rounding of p, m and v compounds over the steps: compare with a float32 tolerance.
    assertClose(be.download(P), p, rtol * 5, atol * 5, `adamw param after step ${step}`);
    assertClose(be.download(M), m, rtol * 5, atol * 5, `adamw m after step ${step}`);
    assertClose(be.download(V), v, rtol * 5, atol * 5, `adamw v after step ${step}`);
  }
});
