/**
 * Test helpers for the CPU backend tests: seeded random data, closeness assertions, and a generic
 * finite-difference checker for backward ops (central differences of L = Σ out ⊙ R in float64),
 * which also checks that a backward op accumulates (running it twice doubles the gradient).
 */
import assert from 'node:assert/strict';
import type { Backend, Buf } from '../../src/backend/backend.js';
import { Rng } from '../../src/util/rng.js';

export function randn(rng: Rng, n: number, scale = 1): Float64Array {
  const a = new Float64Array(n);
  for (let i = 0; i < n; i++) a[i] = rng.normal() * scale;
  return a;
}

/** A backend buffer holding `data`. */
export function bufOf(be: Backend, data: ArrayLike<number>, label = 'test'): Buf {
  const b = be.alloc(data.length, label);
  be.upload(b, data);
  return b;
}

/** Asserts |a − e| ≤ atol + rtol·|e| elementwise; reports the worst element. */
export function assertClose(actual: ArrayLike<number>, expected: ArrayLike<number>, rtol: number, atol: number, what: string): void {
  assert.equal(actual.length, expected.length, `${what}: length ${actual.length} != ${expected.length}`);
  let worst = -1, worstExcess = 0;
  for (let i = 0; i < expected.length; i++) {
    const a = actual[i]!, e = expected[i]!;
    const excess = Math.abs(a - e) - (atol + rtol * Math.abs(e));
    if (!(excess <= 0) && (worst < 0 || !(excess <= worstExcess))) { worst = i; worstExcess = excess; }
  }
  if (worst >= 0) {
    assert.fail(`${what}: element ${worst}: got ${actual[worst]}, expected ${expected[worst]} (rtol ${rtol}, atol ${atol})`);
  }
}

export function dot(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i]! * b[i]!;
  return s;
}

export interface GradParam { name: string; buf: Buf; grad: Buf }

/**
 * Checks a backward op against central finite differences on an f64 backend.
 * forward() recomputes the outputs from the current parameter values; objective() returns L from them.
 * backward() must accumulate ∂L/∂param into each param's grad. At most maxChecks elements per param are
 * probed (chosen with rng). Also asserts that calling backward twice doubles every gradient.
 */
export function checkGradients(
  be: Backend, rng: Rng, params: GradParam[], forward: () => void, objective: () => number, backward: () => void,
  opts: { h?: number; rtol?: number; atol?: number; maxChecks?: number } = {},
): void {
  assert.equal(be.dtype, 'f64', 'finite differences need an f64 backend');
  const h = opts.h ?? 1e-5, rtol = opts.rtol ?? 1e-6, atol = opts.atol ?? 1e-8, maxChecks = opts.maxChecks ?? 48;
  forward();
  for (const p of params) be.zero(p.grad);
  backward();
  const g1 = params.map((p) => be.download(p.grad));
  backward();
  params.forEach((p, pi) => {
    const g2 = be.download(p.grad);
    const twice = Array.from(g1[pi]!, (x) => 2 * x);
    assertClose(g2, twice, 1e-12, 1e-14, `${p.name}: second backward call must accumulate (double the gradient)`);
  });
  let nonzero = 0;
  params.forEach((p, pi) => {
    const base = be.download(p.buf);
    const ana = g1[pi]!;
    const idx: number[] = [];
    if (base.length <= maxChecks) for (let i = 0; i < base.length; i++) idx.push(i);
    else for (let c = 0; c < maxChecks; c++) idx.push(rng.int(base.length));
    const num: number[] = [], an: number[] = [];
    for (const i of idx) {
      const x0 = base[i]!;
      be.upload(p.buf, [x0 + h], i); forward(); const lp = objective();
      be.upload(p.buf, [x0 - h], i); forward(); const lm = objective();
      be.upload(p.buf, [x0], i);
      num.push((lp - lm) / (2 * h));
      an.push(ana[i]!);
      if (Math.abs(ana[i]!) > 1e-9) nonzero++;
    }
    forward();
    assertClose(an, num, rtol, atol, `gradient of ${p.name} vs finite differences (probed ${idx.join(',')})`);
  });
  assert.ok(nonzero > 0, 'all probed gradients are zero: the check would be vacuous');
}
