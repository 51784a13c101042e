/**
 * Backend.ropeKvCacheWrite (generation's rotation and KV-cache write from the fused q/k/v product, one pass) against
 * what it replaces: copyColumns (v with its bias), ropeForward on the product's q and k columns (with their biases)
 * and kvCacheWrite (k, v), and with Qwen3's q/k norms the split copies and rmsnormForward before the rotation. On the
 * CPU backend they must agree bit for bit (f32, f64, and bf16 buffers), over every RoPE kind, with and without biases
 * and norms, from a scalar start position and from per-sequence positions; cache rows it does not write keep their old
 * values. A float64 norm and rotation written here check the values themselves once more.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Backend, Buf, DType, SeqPositions } from '../../src/backend/backend.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { ropeAttentionFactor, ropeInvFreq, plainRope, type RopeSpec } from '../../src/backend/rope.js';
import { Rng } from '../../src/util/rng.js';
import { randn } from './helpers.js';
import { ropeKvCacheWriteUnfused } from './reference.js';

const ROPES: RopeSpec[] = [
  plainRope(10000),
  { type: 'linear', theta: 10000, factor: 4 },
  { type: 'llama3', theta: 500000, factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 64 },
  { type: 'yarn', theta: 1e6, factor: 4, originalMaxPositionEmbeddings: 64, betaFast: 32, betaSlow: 1, attentionFactor: 1.2, truncate: true },
];

interface Shape { b: number; t: number; nH: number; nKv: number; hd: number; tMax: number; pos: number | number[] }

/** norm: Qwen3's q/k norm weights [hd] each (null: none). */
interface Inputs { qkv: Float64Array; bias: Float64Array | null; kc: Float64Array; vc: Float64Array; norm: { q: Float64Array; k: Float64Array } | null }

const EPS = 1e-6;

function upload(be: Backend, x: ArrayLike<number>, dt: DType, what: string): Buf {
  const buf = be.alloc(x.length, what, dt);
  be.upload(buf, Float32Array.from(x));
  return buf;
}

function positions(be: Backend, s: Shape): number | SeqPositions {
  if (typeof s.pos === 'number') return s.pos;
  const seqPositions = be.allocInt(s.b, 'positions');
  be.uploadInt(seqPositions, Int32Array.from(s.pos));
  return { seqPositions };
}

/** q, kCache, vCache after the fused op (`fused`) or after the ops it replaces. */
function run(be: Backend, s: Shape, rope: RopeSpec, inp: Inputs, dt: DType, fused: boolean): { q: Float32Array; kc: Float32Array; vc: Float32Array } {
  const { b, t, nH, nKv, hd, tMax } = s, N = b * t, Q = nH * hd;
  const qkv = upload(be, inp.qkv, dt, 'qkv'), bias = inp.bias && upload(be, inp.bias, dt, 'bias');
  const kc = upload(be, inp.kc, dt, 'k cache'), vc = upload(be, inp.vc, dt, 'v cache');
  const q = upload(be, new Float64Array(N * Q).fill(NaN), dt, 'q');
  const pos0 = positions(be, s);
  const norm = inp.norm && { q: upload(be, inp.norm.q, dt, 'q_norm'), k: upload(be, inp.norm.k, dt, 'k_norm'), eps: EPS };
  if (fused) be.ropeKvCacheWrite(q, kc, vc, qkv, b, t, pos0, tMax, nH, nKv, hd, rope, bias, norm);
  else ropeKvCacheWriteUnfused(be, q, kc, vc, qkv, b, t, pos0, tMax, nH, nKv, hd, rope, bias, norm);
  return { q: Float32Array.from(be.download(q)), kc: Float32Array.from(be.download(kc)), vc: Float32Array.from(be.download(vc)) };
}

/** The float64 result, written out: R(x + bias) by the angle p · inv[i], cos and sin scaled by the attention factor. */
function reference(s: Shape, rope: RopeSpec, inp: Inputs): { q: Float64Array; kc: Float64Array; vc: Float64Array } {
  const { b, t, nH, nKv, hd, tMax } = s, Q = nH * hd, KV = nKv * hd, W = Q + 2 * KV, half = hd / 2;
  const inv = ropeInvFreq(rope, hd), A = ropeAttentionFactor(rope);
  const q = new Float64Array(b * t * Q), kc = Float64Array.from(inp.kc), vc = Float64Array.from(inp.vc);
  const bias = (col: number): number => (inp.bias ? inp.bias[col]! : 0);
  for (let bi = 0; bi < b; bi++) {
    const p0 = typeof s.pos === 'number' ? s.pos : s.pos[bi]!;
    for (let r = 0; r < t; r++) {
      const row = (bi * t + r) * W, p = p0 + r, cache = (bi * tMax + p) * KV;
      const rotate = (dst: Float64Array, d0: number, col0: number, heads: number): void => {
        for (let h = 0; h < heads; h++) {
          // the head's elements (with their biases), RMS-normed with q's or k's weights where there are norms
          const xs = Array.from({ length: hd }, (_, e) => inp.qkv[row + col0 + h * hd + e]! + bias(col0 + h * hd + e));
          if (inp.norm) {
            const w = col0 === 0 ? inp.norm.q : inp.norm.k, r = 1 / Math.sqrt(xs.reduce((a, x) => a + x * x, 0) / hd + EPS);
            xs.forEach((x, e) => { xs[e] = x * r * w[e]!; });
          }
          for (let i = 0; i < half; i++) {
            const c = A * Math.cos(p * inv[i]!), sn = A * Math.sin(p * inv[i]!);
            const x0 = xs[i]!, x1 = xs[i + half]!;
            dst[d0 + h * hd + i] = x0 * c - x1 * sn;
            dst[d0 + h * hd + i + half] = x1 * c + x0 * sn;
          }
        }
      };
      rotate(q, (bi * t + r) * Q, 0, nH);
      rotate(kc, cache, Q, nKv);
      for (let e = 0; e < KV; e++) vc[cache + e] = inp.qkv[row + Q + KV + e]! + bias(Q + KV + e);
    }
  }
  return { q, kc, vc };
}

const SHAPES: Shape[] = [
  { b: 3, t: 1, nH: 4, nKv: 2, hd: 8, tMax: 9, pos: [0, 5, 8] }, // decode steps at per-sequence positions, the last row of the cache included
  { b: 2, t: 3, nH: 6, nKv: 6, hd: 6, tMax: 8, pos: 4 }, // a chunk at a scalar position; HALF odd; MHA
  { b: 2, t: 2, nH: 5, nKv: 1, hd: 4, tMax: 6, pos: [1, 3] }, // several rows per sequence at per-sequence positions
];

function inputs(rng: Rng, s: Shape, withBias: boolean, withNorm = false): Inputs {
  const W = (s.nH + 2 * s.nKv) * s.hd, C = s.b * s.tMax * s.nKv * s.hd;
  const norm = withNorm ? { q: randn(rng, s.hd, 0.5).map((x) => 1 + x), k: randn(rng, s.hd, 0.5).map((x) => 1 + x) } : null;
  return { qkv: randn(rng, s.b * s.t * W), bias: withBias ? randn(rng, W, 0.5) : null, kc: randn(rng, C), vc: randn(rng, C), norm };
}

const bits = (x: Float32Array): Uint32Array => new Uint32Array(x.buffer, x.byteOffset, x.length);

test('ropeKvCacheWrite stores what copyColumns, (q/k norms,) ropeForward and kvCacheWrite store, bit for bit (every RoPE kind, biases, norms, positions, f32/bf16 buffers)', () => {
  const rng = new Rng(1105);
  const be = createCpuBackend({ dtype: 'f32', threads: 1 });
  try {
    for (const s of SHAPES) {
      for (const rope of ROPES) {
        for (const [withBias, withNorm] of [[false, false], [true, false], [false, true], [true, true]]) {
          for (const dt of ['f32', 'bf16'] as const) {
            const inp = inputs(rng, s, withBias!, withNorm);
            const f = run(be, s, rope, inp, dt, true), u = run(be, s, rope, inp, dt, false);
            const what = `${rope.type} ${JSON.stringify(s)} bias ${withBias} norms ${withNorm} ${dt}`;
            assert.deepEqual(bits(f.q), bits(u.q), `q: ${what}`);
            assert.deepEqual(bits(f.kc), bits(u.kc), `k cache: ${what}`);
            assert.deepEqual(bits(f.vc), bits(u.vc), `v cache: ${what}`);
          }
        }
      }
    }
  } finally {
    be.dispose();
  }
});

test('ropeKvCacheWrite on the float64 backend equals a float64 rotation (and q/k norm) written out, and leaves the rows it does not write', () => {
  const rng = new Rng(1106);
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  try {
    for (const s of SHAPES) {
      for (const [rope, withNorm] of ROPES.flatMap((r) => [[r, false], [r, true]] as const)) {
        const inp = inputs(rng, s, true, withNorm);
        const { b, t, nH, nKv, hd, tMax } = s, Q = nH * hd, KV = nKv * hd;
        const qkv = be.alloc(inp.qkv.length, 'qkv'), bias = be.alloc(inp.bias!.length, 'bias');
        const kc = be.alloc(inp.kc.length, 'k cache'), vc = be.alloc(inp.vc.length, 'v cache'), q = be.alloc(b * t * Q, 'q');
        be.upload(qkv, inp.qkv); be.upload(bias, inp.bias!); be.upload(kc, inp.kc); be.upload(vc, inp.vc);
        let norm = null;
        if (inp.norm) {
          norm = { q: be.alloc(hd, 'q_norm'), k: be.alloc(hd, 'k_norm'), eps: EPS };
          be.upload(norm.q, inp.norm.q); be.upload(norm.k, inp.norm.k);
        }
        be.ropeKvCacheWrite(q, kc, vc, qkv, b, t, positions(be, s), tMax, nH, nKv, hd, rope, bias, norm);
        const ref = reference(s, rope, inp), what = `${rope.type} ${JSON.stringify(s)} norms ${withNorm}`;
        const close = (got: ArrayLike<number>, want: Float64Array, name: string): void => {
          assert.equal(got.length, want.length);
          for (let i = 0; i < want.length; i++) {
            if (!(Math.abs(got[i]! - want[i]!) <= 1e-12 * (1 + Math.abs(want[i]!)))) assert.fail(`${name} ${what}: element ${i} = ${got[i]}, expected ${want[i]}`);
          }
        };
        close(be.download(q), ref.q, 'q');
        close(be.download(kc), ref.kc, 'k cache');
        close(be.download(vc), ref.vc, 'v cache');
        // the rows outside [p, p + t) of each sequence are the old ones exactly
        const got = be.download(kc);
        let kept = 0;
        for (let bi = 0; bi < b; bi++) {
          const p = typeof s.pos === 'number' ? s.pos : s.pos[bi]!;
          for (let r = 0; r < tMax; r++) {
            if (r >= p && r < p + t) continue;
            for (let e = 0; e < KV; e++) { assert.equal(got[(bi * tMax + r) * KV + e], inp.kc[(bi * tMax + r) * KV + e]); kept++; }
          }
        }
        assert.ok(kept > 0);
      }
    }
  } finally {
    be.dispose();
  }
});

test('ropeKvCacheWrite refuses rows past the cache, and q of another dtype than the caches', () => {
  const be = createCpuBackend({ dtype: 'f32', threads: 1 });
  try {
    const nH = 2, nKv = 1, hd = 4, W = (nH + 2 * nKv) * hd, tMax = 4;
    const qkv = be.alloc(2 * W, 'qkv'), kc = be.alloc(tMax * nKv * hd, 'kc'), vc = be.alloc(tMax * nKv * hd, 'vc'), q = be.alloc(2 * nH * hd, 'q');
    assert.throws(() => be.ropeKvCacheWrite(q, kc, vc, qkv, 1, 2, 3, tMax, nH, nKv, hd, plainRope(1e4), null), /outside the cache of 4/);
    const seqPositions = be.allocInt(1, 'positions');
    be.uploadInt(seqPositions, Int32Array.of(3));
    assert.throws(() => be.ropeKvCacheWrite(q, kc, vc, qkv, 1, 2, { seqPositions }, tMax, nH, nKv, hd, plainRope(1e4), null), /outside the cache of 4/);
    const qb = be.alloc(2 * nH * hd, 'q', 'bf16');
    assert.throws(() => be.ropeKvCacheWrite(qb, kc, vc, qkv, 1, 2, 0, tMax, nH, nKv, hd, plainRope(1e4), null), /one dtype/);
  } finally {
    be.dispose();
  }
});
