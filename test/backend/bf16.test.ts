/**
 * bfloat16 storage: host rounding (src/backend/bf16.ts) against an independent definition (the nearest of the two
 * neighbouring bf16 values by exact float64 distance, ties to the even one), and the CPU backend's emulation of bf16
 * buffers (the reference the CUDA bf16 path is tested against): every op rounds what it stores, once.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fromBf16Bits, packBf16, roundBf16, roundBf16InPlace, toBf16Bits, unpackBf16 } from '../../src/backend/bf16.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { Rng } from '../../src/util/rng.js';

/** Nearest bf16 by exact distance: the candidates are x's float32 truncated to 16 bits and the next one up in magnitude. */
function referenceRound(x: number): number {
  const f = new Float32Array([x]), u = new Uint32Array(f.buffer);
  const lo = u[0]! & 0xffff0000;
  const cand = [lo, (lo + 0x10000) >>> 0].map((b) => { const g = new Uint32Array([b]); return new Float32Array(g.buffer)[0]!; });
  const v = f[0]!;
  const d0 = Math.abs(cand[0]! - v), d1 = Math.abs(cand[1]! - v);
  if (d0 < d1) return cand[0]!;
  if (d1 < d0) return cand[1]!;
  return ((lo >>> 16) & 1) === 0 ? cand[0]! : cand[1]!; // tie: even mantissa
}

test('bf16 rounding: nearest, ties to even, matches an exact-distance definition on random and tie values', () => {
  const rng = new Rng(7);
  const xs: number[] = [0, -0, 1, -1, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -9, 3.14159, 65504, 1e-30, -2.5e-38];
  for (let i = 0; i < 20000; i++) xs.push((rng.next() * 2 - 1) * 2 ** Math.floor(rng.next() * 60 - 30));
  for (const x of xs) {
    const want = referenceRound(Math.fround(x));
    assert.equal(Object.is(roundBf16(x), want) || roundBf16(x) === want, true, `x=${x}: ${roundBf16(x)} vs ${want}`);
  }
  // Exact ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7; the even neighbour is 1.
  assert.equal(roundBf16(1 + 2 ** -8), 1);
  assert.equal(roundBf16(1 + 3 * 2 ** -8), 1 + 2 ** -6);
  assert.ok(Number.isNaN(roundBf16(NaN)));
  assert.equal(roundBf16(Infinity), Infinity);
  assert.equal(roundBf16(3.5e38), Infinity); // beyond the largest bf16 (~3.39e38)
  assert.equal(fromBf16Bits(toBf16Bits(-2)), -2);
});

test('bf16 packing: pack/unpack and the in-place rounding agree with roundBf16 (float32 and float64 arrays)', () => {
  const rng = new Rng(3);
  const xs = Float32Array.from({ length: 1000 }, () => (rng.next() - 0.5) * 100);
  const unpacked = unpackBf16(packBf16(xs));
  const f64 = Float64Array.from(xs), f32 = Float32Array.from(xs);
  roundBf16InPlace(f64); roundBf16InPlace(f32);
  for (let i = 0; i < xs.length; i++) {
    const r = roundBf16(xs[i]!);
    assert.equal(unpacked[i], r); assert.equal(f64[i], r); assert.equal(f32[i], r);
  }
  const part = Float32Array.from([1.001, 1.001, 1.001]);
  roundBf16InPlace(part, 1, 2);
  assert.deepEqual([...part], [Math.fround(1.001), 1, Math.fround(1.001)]);
});

test('cpu backend bf16 buffers: alloc, views keep the dtype, upload/copy round, ops round what they store once', () => {
  const be = createCpuBackend({ threads: 1 });
  try {
    const rng = new Rng(11);
    const n = 6, k = 16, m = 5;
    const xv = Array.from({ length: n * k }, () => rng.next() - 0.5), wv = Array.from({ length: m * k }, () => rng.next() - 0.5);
    const x = be.alloc(n * k, 'x', 'bf16'), w = be.alloc(m * k, 'w', 'bf16');
    assert.equal(x.dtype, 'bf16');
    assert.equal(be.view(x, 2, 3).dtype, 'bf16');
    be.upload(x, xv); be.upload(w, wv);
    const xr = xv.map(roundBf16), wr = wv.map(roundBf16);
    assert.deepEqual([...be.download(x)], xr.map(Math.fround));
    // A product of bf16 operands into f32 is the float product of the rounded values; into bf16 it is that, rounded.
    const o32 = be.alloc(n * m, 'o32'), o16 = be.alloc(n * m, 'o16', 'bf16');
    be.matmulForward(o32, x, w, null, n, k, m);
    be.matmulForward(o16, x, w, null, n, k, m);
    const a32 = be.download(o32), a16 = be.download(o16);
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < m; j++) {
        let s = 0;
        for (let c = 0; c < k; c++) s += xr[i * k + c]! * wr[j * k + c]!;
        assert.ok(Math.abs(a32[i * m + j]! - s) <= 1e-6 * Math.max(1, Math.abs(s)), `f32 out ${i},${j}`);
        assert.equal(a16[i * m + j], roundBf16(a32[i * m + j]!), `bf16 out ${i},${j} is the f32 result rounded once`);
      }
    }
    // Accumulating (LoRA's B product into a projection's output): out + product, rounded once into a bf16 out.
    const prev = Array.from({ length: n * m }, () => rng.next() - 0.5);
    const acc32 = be.alloc(n * m, 'acc32'), acc16 = be.alloc(n * m, 'acc16', 'bf16');
    be.upload(acc32, prev); be.upload(acc16, prev);
    be.matmulForward(acc32, x, w, null, n, k, m, true);
    be.matmulForward(acc16, x, w, null, n, k, m, true);
    const s32 = be.download(acc32), s16 = be.download(acc16);
    for (let i = 0; i < n * m; i++) {
      assert.ok(Math.abs(s32[i]! - (Math.fround(prev[i]!) + a32[i]!)) <= 1e-6, `f32 accumulate ${i}`);
      assert.equal(s16[i], roundBf16(roundBf16(prev[i]!) + a32[i]!), `bf16 accumulate ${i}: one rounding of the sum`);
    }
    assert.throws(() => be.matmulForward(acc32, x, w, be.alloc(m, 'b'), n, k, m, true), /without a bias/);
    // copy converts both ways.
    const back = be.alloc(n * m, 'back');
    be.copy(back, o16);
    assert.deepEqual([...be.download(back)], [...a16]);
    const c16 = be.alloc(n * m, 'c16', 'bf16');
    be.copy(c16, o32);
    assert.deepEqual([...be.download(c16)], [...a32].map(roundBf16));
    // Mixed operand dtypes are refused, naming both.
    const w32 = be.alloc(m * k, 'w32');
    assert.throws(() => be.matmulForward(o32, x, w32, null, n, k, m), /inp is bf16 but weight is f32/);
    assert.throws(() => be.matmulBackward(null, null, null, o32, x, w, n, k, m), /dout is f32 but weight is bf16/);
    // Accumulating ops read the old bf16 value, add in float, round the sum.
    const acc = be.alloc(4, 'acc', 'bf16'), one = be.alloc(4, 'one');
    be.upload(one, [2 ** -9, 2 ** -9, 2 ** -9, 2 ** -9]);
    be.upload(acc, [1, 1, 1, 1]);
    be.accumulate(acc, one, 4);
    assert.deepEqual([...be.download(acc)], [1, 1, 1, 1]); // 1 + 2^-9 rounds back to 1 in bf16
  } finally {
    be.dispose();
  }
});

test('cpu backend adamw: the optional copy receives the updated parameters, rounded to bf16', () => {
  const be = createCpuBackend({ threads: 1 });
  try {
    const n = 9, rng = new Rng(5);
    const p = be.alloc(n, 'p'), g = be.alloc(n, 'g'), m = be.alloc(n, 'm'), v = be.alloc(n, 'v'), c = be.alloc(n, 'c', 'bf16');
    be.upload(p, Array.from({ length: n }, () => rng.next()));
    be.upload(g, Array.from({ length: n }, () => rng.next() - 0.5));
    be.adamw(p, g, m, v, n, { lr: 0.01, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1, step: 1, gradScale: 1 }, c);
    assert.deepEqual([...be.download(c)], [...be.download(p)].map(roundBf16));
  } finally {
    be.dispose();
  }
});

test('unpackBf16 into a view at an offset fills only that view', () => {
  const bits = packBf16([1.5, -2, 3.25]);
  const whole = new Float32Array(6).fill(9), view = whole.subarray(2, 5);
  assert.equal(unpackBf16(bits, view), view);
  assert.deepEqual([...whole], [9, 9, 1.5, -2, 3.25, 9]);
});
