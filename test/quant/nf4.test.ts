/**
 * NF4 against float64 references of the format: the code book rebuilt from its definition (normal quantiles), the
 * block absolute maxima, nearest-level codes by brute force, the packing order, and the dequantized values.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { NF4_LEVELS, NF4_OFFSET, dequantizeNf4, nf4Bytes, nf4Code, quantizeNf4 } from '../../src/quant/nf4.js';
import { DistilleryError } from '../../src/util/errors.js';
import { Rng } from '../../src/util/rng.js';

/** Φ(x) in float64 from the Maclaurin series of erf (|x| ≤ 3 here: the terms stay small, the sum exact to ~1e-15). */
function normalCdf(x: number): number {
  const z = x / Math.SQRT2;
  let term = z, sum = z;
  for (let n = 1; n < 200; n++) {
    term *= -z * z / n;
    const add = term / (2 * n + 1);
    sum += add;
    if (Math.abs(add) < 1e-18) break;
  }
  return 0.5 + sum / Math.sqrt(Math.PI);
}
/** Φ⁻¹(p) by bisection on normalCdf. */
function normalPpf(p: number): number {
  let lo = -4, hi = 4;
  for (let i = 0; i < 200; i++) { const m = (lo + hi) / 2; if (normalCdf(m) < p) lo = m; else hi = m; }
  return (lo + hi) / 2;
}
const linspace = (a: number, b: number, k: number): number[] => Array.from({ length: k }, (_, i) => a + (b - a) * i / (k - 1));

test('NF4 code book: the 16 levels are the normalized normal quantiles of QLoRA\'s definition (within 2e-7)', () => {
  assert.ok(Math.abs(NF4_OFFSET - (1 - 0.5 * (1 / 32 + 1 / 30))) < 1e-7);
  const pos = linspace(NF4_OFFSET, 0.5, 9).slice(0, -1).map(normalPpf);
  const neg = linspace(NF4_OFFSET, 0.5, 8).slice(0, -1).map((p) => -normalPpf(p));
  const top = Math.max(...pos);
  const book = [...pos, 0, ...neg].map((v) => v / top).sort((a, b) => a - b);
  assert.equal(book.length, 16);
  // The published levels were computed in float32 (quantiles near ±1.85, then divided): within 2e-7 absolute — two
  // float32 ulps of the unnormalized quantiles — of the float64 definition.
  book.forEach((v, i) => assert.ok(Math.abs(v - NF4_LEVELS[i]!) <= 2e-7, `level ${i}: ${NF4_LEVELS[i]} vs the definition's ${v}`));
  // and no level is nearer another level's definition than its own
  book.forEach((v, i) => NF4_LEVELS.forEach((l, j) => assert.ok(j === i || Math.abs(v - l) > 1e-3)));
  assert.equal(NF4_LEVELS[0], -1); assert.equal(NF4_LEVELS[7], 0); assert.equal(NF4_LEVELS[15], 1);
});

test('NF4 quantization against a float64 reference: block absmax, nearest level (ties low), packing, values', () => {
  const rng = new Rng(13);
  for (const [n, block] of [[1000, 64], [999, 32], [130, 128], [7, 2]] as const) {
    const x = Float32Array.from({ length: n }, () => rng.normal() * 0.02);
    if (n > 100) x[n - 1] = 0.5; // an outlier in the last (partial) block
    const q = quantizeNf4(x, block);
    assert.equal(q.absmax.length, Math.ceil(n / block));
    assert.equal(q.codes.length, Math.ceil(n / 2));
    assert.equal(nf4Bytes(n, block), q.codes.length + 4 * q.absmax.length);
    const back = dequantizeNf4(q);
    for (let b = 0; b < q.absmax.length; b++) {
      let m = 0;
      for (let i = b * block; i < Math.min(n, (b + 1) * block); i++) m = Math.max(m, Math.abs(x[i]!));
      assert.equal(q.absmax[b], Math.fround(m), `block ${b}`);
    }
    for (let i = 0; i < n; i++) {
      const s = q.absmax[Math.floor(i / block)]!, y = x[i]! / s;
      // brute force: the level with the smallest distance, the lower one on a tie
      let best = 0;
      for (let c = 1; c < 16; c++) if (Math.abs(y - NF4_LEVELS[c]!) < Math.abs(y - NF4_LEVELS[best]!)) best = c;
      const byte = q.codes[i >> 1]!, code = i % 2 === 0 ? byte >> 4 : byte & 15;
      assert.equal(code, best, `element ${i}: y = ${y}`);
      assert.equal(back[i], Math.fround(NF4_LEVELS[best]! * s));
      assert.ok(Math.abs(back[i]! - x[i]!) <= s * 0.5 * (NF4_LEVELS[1]! - NF4_LEVELS[0]!) + 1e-9);
    }
  }
});

test('NF4 edge cases: exact levels and midpoints, zero blocks, the even element in the high nibble, refusals', () => {
  NF4_LEVELS.forEach((v, c) => assert.equal(nf4Code(v), c));
  for (let c = 0; c < 15; c++) assert.equal(nf4Code((NF4_LEVELS[c]! + NF4_LEVELS[c + 1]!) / 2), c, `midpoint ${c}`);
  const q = quantizeNf4(Float32Array.of(1, -1, 0, 0), 2);
  assert.deepEqual([...q.codes], [0xf0, 0x77]);
  assert.deepEqual([...q.absmax], [1, 0]);
  assert.deepEqual([...dequantizeNf4(q)], [1, -1, 0, 0]);
  assert.throws(() => quantizeNf4(Float32Array.of(1, NaN)), (e: unknown) => e instanceof DistilleryError && /non-finite/.test(e.message));
  assert.throws(() => quantizeNf4(Float32Array.of(1, 2), 3), /even number/);
});
