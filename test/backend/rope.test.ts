/**
 * Scaled RoPE (linear, llama3, yarn) against an independent float64 reference of transformers' formulas
 * (test/model/rope-reference.ts): the inverse frequencies of real configurations, the CPU rotation of each kind
 * (f32 and f64, with a position offset), and its backward by finite differences.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { ropeAttentionFactor, ropeInvFreq, yarnMscale, type RopeSpec } from '../../src/backend/rope.js';
import { Rng } from '../../src/util/rng.js';
import { assertClose, bufOf, checkGradients, dot, randn } from './helpers.js';
import { refInvFreq, refRotate } from '../model/rope-reference.js';

const LLAMA32: RopeSpec = { type: 'llama3', theta: 5e5, factor: 32, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 };
const LLAMA31: RopeSpec = { type: 'llama3', theta: 5e5, factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 };
const QWEN_YARN: RopeSpec = { type: 'yarn', theta: 1e6, factor: 4, originalMaxPositionEmbeddings: 32768, betaFast: 32, betaSlow: 1, attentionFactor: yarnMscale(4), truncate: true };

/** [rope, head dim] pairs: the published configurations, plus kinds at small head dims where every band is hit. */
const CASES: Array<[string, RopeSpec, number]> = [
  ['llama 3.2 1B', LLAMA32, 64],
  ['llama 3.1 8B', LLAMA31, 128],
  ['qwen2.5 yarn x4', QWEN_YARN, 128],
  ['yarn no truncate', { ...QWEN_YARN, truncate: false, betaFast: 20, betaSlow: 2 }, 64],
  ['yarn equal bounds', { ...QWEN_YARN, betaFast: 4, betaSlow: 4 }, 16],
  ['linear x2', { type: 'linear', theta: 1e4, factor: 2 }, 32],
  ['llama3 small', { type: 'llama3', theta: 5e5, factor: 32, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 64 }, 16],
  ['yarn small', { type: 'yarn', theta: 1e4, factor: 4, originalMaxPositionEmbeddings: 64, betaFast: 32, betaSlow: 1, attentionFactor: 1.2, truncate: true }, 16],
];

test('inverse frequencies of each kind match the float64 reference of transformers\' formulas', () => {
  for (const [name, r, d] of CASES) {
    const got = ropeInvFreq(r, d), want = refInvFreq(r, d);
    assert.equal(got.length, d / 2, name);
    assertClose(got, want, 1e-13, 0, name);
  }
});

test('scaled kinds differ from plain RoPE where they should, and only there', () => {
  for (const [name, r, d] of CASES) {
    const plain = ropeInvFreq({ type: 'default', theta: r.theta }, d), got = ropeInvFreq(r, d);
    const f = r.type === 'default' ? 1 : r.factor;
    // The highest frequency (pair 0) is kept by llama3 and yarn, divided by linear; the lowest is divided by factor.
    assert.ok(Math.abs(got[0]! - (r.type === 'linear' ? plain[0]! / f : plain[0]!)) < 1e-15, `${name}: pair 0`);
    assert.ok(Math.abs(got[d / 2 - 1]! - plain[d / 2 - 1]! / f) <= 1e-15 * plain[d / 2 - 1]!, `${name}: last pair`);
    for (let i = 0; i < d / 2; i++) {
      assert.ok(got[i]! <= plain[i]! * (1 + 1e-15) && got[i]! >= (plain[i]! / f) * (1 - 1e-15), `${name}: pair ${i} between f/factor and f`);
    }
  }
  // Llama 3.2: the medium band (wavelengths between 2048 and 8192 positions) is blended, not switched.
  const inv = ropeInvFreq(LLAMA32, 64), plain = ropeInvFreq({ type: 'default', theta: 5e5 }, 64);
  const blended = Array.from(inv).filter((v, i) => v < plain[i]! * (1 - 1e-12) && v > (plain[i]! / 32) * (1 + 1e-12));
  assert.ok(blended.length >= 2, `llama3 blends some pairs (got ${blended.length})`);
  assert.equal(ropeAttentionFactor(QWEN_YARN), 1 + 0.1 * Math.log(4));
  assert.equal(ropeAttentionFactor(LLAMA32), 1);
});

for (const dtype of ['f32', 'f64'] as const) {
  test(`CPU rope forward of each kind matches the reference rotation, with a position offset, in place [${dtype}]`, () => {
    const be = createCpuBackend({ dtype, threads: 1 });
    const rng = new Rng(21);
    // f64: the two float64 formulas round differently; at position 9000 that is ~1e-12 of an angle.
    const [rtol, atol] = dtype === 'f32' ? [2e-5, 2e-6] : [1e-10, 1e-11];
    try {
      for (const [name, r, d] of CASES) {
        const b = 2, t = 3, heads = 2;
        const x = randn(rng, b * t * heads * d);
        for (const pos0 of [0, 5, 9000]) {
          const X = bufOf(be, x), O = be.alloc(x.length, 'o');
          be.ropeForward(O, X, b, t, heads, d, r, pos0);
          const want = Float64Array.from(x);
          refRotate(want, r, b, t, heads, d, pos0);
          assertClose(be.download(O), want, rtol * Math.max(1, ropeAttentionFactor(r)), atol, `${name} pos0=${pos0}`);
          be.ropeForward(X, X, b, t, heads, d, r, pos0);
          assertClose(be.download(X), want, rtol, atol, `${name} pos0=${pos0} in place`);
        }
      }
    } finally {
      be.dispose();
    }
  });
}

test('CPU rope forward with a bias [heads · hd]: the reference rotation of (x + bias) for every row, in place too (f64)', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const rng = new Rng(23);
  try {
    for (const [name, r, d] of CASES) {
      const b = 2, t = 3, heads = 3;
      const x = randn(rng, b * t * heads * d), bias = randn(rng, heads * d);
      const want = Float64Array.from(x, (v, i) => v + bias[i % (heads * d)]!);
      refRotate(want, r, b, t, heads, d, 7);
      const X = bufOf(be, x), O = be.alloc(x.length, 'o'), B = bufOf(be, bias);
      be.ropeForward(O, X, b, t, heads, d, r, 7, B);
      assertClose(be.download(O), want, 1e-10, 1e-11, `${name}`);
      be.ropeForward(X, X, b, t, heads, d, r, 7, B);
      assertClose(be.download(X), want, 1e-10, 1e-11, `${name} in place`);
    }
  } finally {
    be.dispose();
  }
});

test('CPU rope backward of each kind: finite differences (yarn\'s attention factor included)', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const rng = new Rng(22);
  try {
    for (const [, r, d] of CASES.filter(([, , hd]) => hd <= 32)) {
      const b = 1, t = 3, heads = 2, len = b * t * heads * d;
      const x = bufOf(be, randn(rng, len)), dx = be.alloc(len, 'dx'), out = be.alloc(len, 'o');
      const w = randn(rng, len), W = bufOf(be, w);
      checkGradients(be, rng, [{ name: 'inp', buf: x, grad: dx }],
        () => be.ropeForward(out, x, b, t, heads, d, r, 7), () => dot(be.download(out), w),
        () => be.ropeBackward(dx, W, b, t, heads, d, r, 7));
    }
  } finally {
    be.dispose();
  }
});

test('CPU rope with row strides (the q or k columns of a fused q/k/v buffer): the packed rotation of those columns, and nothing else touched', () => {
  for (const dtype of ['f64', 'f32'] as const) {
    const be = createCpuBackend({ dtype });
    const rng = new Rng(23), b = 2, t = 5, heads = 3, hd = 8, W = heads * hd + 20, off = 7, N = b * t, width = heads * hd;
    const rope: RopeSpec = QWEN_YARN;
    // the rotated columns [off, off + width) of an [N, W] buffer, against the same columns packed
    const wide = randn(rng, N * W), bias = randn(rng, width);
    const packed = new Float64Array(N * width);
    for (let r = 0; r < N; r++) for (let c = 0; c < width; c++) packed[r * width + c] = wide[r * W + off + c]!;
    const X = bufOf(be, wide), Bi = bufOf(be, bias), P = bufOf(be, packed);
    const outS = be.alloc(N * width, 'o strided'), outP = be.alloc(N * width, 'o packed');
    be.ropeForward(outS, be.view(X, off, N * W - off), b, t, heads, hd, rope, 3, Bi, { inp: W });
    be.ropeForward(outP, P, b, t, heads, hd, rope, 3, Bi);
    assert.deepEqual(be.download(outS), be.download(outP), `${dtype} forward`);
    // the backward into those columns, overwriting (and the other columns keep their values)
    const G = bufOf(be, randn(rng, N * width)), D = bufOf(be, wide), DP = be.alloc(N * width, 'dp');
    be.ropeBackward(be.view(D, off, N * W - off), G, b, t, heads, hd, rope, 3, false, { out: W });
    be.ropeBackward(DP, G, b, t, heads, hd, rope, 3, false);
    const d = be.download(D), dp = be.download(DP), x = be.download(X);
    for (let r = 0; r < N; r++) {
      for (let c = 0; c < W; c++) {
        const inside = c >= off && c < off + width;
        assert.equal(d[r * W + c], inside ? dp[r * width + c - off] : x[r * W + c], `${dtype} backward row ${r} col ${c}`);
      }
    }
    assert.throws(() => be.ropeForward(X, X, b, t, heads, hd, rope, 0, null, { inp: W, out: W + 1 }), /different row strides/);
    assert.throws(() => be.ropeForward(outP, X, b, t, heads, hd, rope, 0, null, { inp: width - 1 }), /below the row width/);
    be.dispose();
  }
});
