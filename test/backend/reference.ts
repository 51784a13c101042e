/**
 * Straightforward float64 references for the CPU backend tests (written independently of the kernels):
 * causal GQA attention and the fused per-token loss, plus the loss configurations the tests sweep.
 */
import type { LossSpec } from '../../src/backend/backend.js';

/** Causal GQA attention reference: returns [out, probs]. */
export function attentionRef(
  q: Float64Array, k: Float64Array, v: Float64Array, b: number, t: number, nH: number, nKv: number, hd: number,
): [Float64Array, Float64Array] {
  const out = new Float64Array(b * t * nH * hd), probs = new Float64Array(b * nH * t * t);
  const group = nH / nKv;
  for (let bi = 0; bi < b; bi++) for (let h = 0; h < nH; h++) {
    const g = Math.floor(h / group);
    for (let i = 0; i < t; i++) {
      const s = new Float64Array(t).fill(-Infinity);
      for (let j = 0; j <= i; j++) {
        let d = 0;
        for (let e = 0; e < hd; e++) d += q[((bi * t + i) * nH + h) * hd + e]! * k[((bi * t + j) * nKv + g) * hd + e]!;
        s[j] = d / Math.sqrt(hd);
      }
      const mx = Math.max(...s);
      const ex = s.map((x) => Math.exp(x - mx));
      const z = ex.reduce((a, c) => a + c, 0);
      for (let j = 0; j < t; j++) probs[((bi * nH + h) * t + i) * t + j] = ex[j]! / z;
      for (let e = 0; e < hd; e++) {
        let acc = 0;
        for (let j = 0; j <= i; j++) acc += (ex[j]! / z) * v[((bi * t + j) * nKv + g) * hd + e]!;
        out[((bi * t + i) * nH + h) * hd + e] = acc;
      }
    }
  }
  return [out, probs];
}

export function softmax(z: ArrayLike<number>, T = 1): number[] {
  const s = Array.from(z, (x) => x / T);
  const mx = Math.max(...s);
  const e = s.map((x) => Math.exp(x - mx));
  const sum = e.reduce((a, c) => a + c, 0);
  return e.map((x) => x / sum);
}

/** Per-row reference of the fused loss: [loss, ce, div, agree]. */
export function lossRef(zs: ArrayLike<number>, zt: ArrayLike<number> | null, y: number, spec: LossSpec): number[] {
  const p = softmax(zs);
  const ce = -Math.log(p[y]!);
  if (spec.kind === 'none' || zt === null) return [ce, ce, 0, 0];
  const T = spec.temperature, qs = softmax(zs, T), qt = softmax(zt, T);
  let div = 0;
  for (let j = 0; j < qs.length; j++) {
    if (spec.kind === 'kl') div += qt[j]! * Math.log(qt[j]! / qs[j]!);
    else if (spec.kind === 'reverse-kl') div += qs[j]! * Math.log(qs[j]! / qt[j]!);
    else {
      const m = spec.beta * qt[j]! + (1 - spec.beta) * qs[j]!;
      div += spec.beta * qt[j]! * Math.log(qt[j]! / m) + (1 - spec.beta) * qs[j]! * Math.log(qs[j]! / m);
    }
  }
  div *= T * T;
  const am = (a: ArrayLike<number>) => { let b = 0; for (let j = 1; j < a.length; j++) if (a[j]! > a[b]!) b = j; return b; };
  return [spec.alpha * div + (1 - spec.alpha) * ce, ce, div, am(zs) === am(zt) ? 1 : 0];
}

export const LOSS_SPECS: LossSpec[] = [
  { kind: 'none', alpha: 0.3, temperature: 1, beta: 0.5 },
  { kind: 'kl', alpha: 0.7, temperature: 2, beta: 0.5 },
  { kind: 'reverse-kl', alpha: 0.4, temperature: 1.5, beta: 0.5 },
  { kind: 'jsd', alpha: 0.6, temperature: 2.5, beta: 0.3 },
  { kind: 'jsd', alpha: 1, temperature: 1, beta: 0.5 },
];
