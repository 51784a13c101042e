/**
 * Straightforward float64 references for the CPU backend tests (written independently of the kernels):
 * causal GQA attention and the fused per-token loss, plus the loss configurations the tests sweep.
 */
import type { Backend, Buf, LossSpec, QkNormWeights, RopeSpec, SeqPositions } from '../../src/backend/backend.js';

/**
 * Causal GQA attention reference: returns [out, lse], lse [B, nH, T] = log Σ_{j ≤ i} exp(q_i·k_j / sqrt(hd)) (natural
 * log), computed as max + log(Σ exp(s − max)) in float64.
 */
export function attentionRef(
  q: ArrayLike<number>, k: ArrayLike<number>, v: ArrayLike<number>, b: number, t: number, nH: number, nKv: number, hd: number,
): [Float64Array, Float64Array] {
  const out = new Float64Array(b * t * nH * hd), lse = new Float64Array(b * nH * t);
  const group = nH / nKv;
  for (let bi = 0; bi < b; bi++) for (let h = 0; h < nH; h++) {
    const g = Math.floor(h / group);
    for (let i = 0; i < t; i++) {
      const s = new Float64Array(i + 1);
      for (let j = 0; j <= i; j++) {
        let d = 0;
        for (let e = 0; e < hd; e++) d += q[((bi * t + i) * nH + h) * hd + e]! * k[((bi * t + j) * nKv + g) * hd + e]!;
        s[j] = d / Math.sqrt(hd);
      }
      let mx = -Infinity;
      for (const x of s) mx = Math.max(mx, x);
      const ex = s.map((x) => Math.exp(x - mx));
      const z = ex.reduce((a, c) => a + c, 0);
      lse[(bi * nH + h) * t + i] = mx + Math.log(z);
      for (let e = 0; e < hd; e++) {
        let acc = 0;
        for (let j = 0; j <= i; j++) acc += (ex[j]! / z) * v[((bi * t + j) * nKv + g) * hd + e]!;
        out[((bi * t + i) * nH + h) * hd + e] = acc;
      }
    }
  }
  return [out, lse];
}

/**
 * Float64 attention backward reference, written from the definition P = softmax(S) (not the kernels' lse / D
 * shortcut): dV = Pᵀ dO, dP = dO Vᵀ, dS = P ⊙ (dP − rowsum(P ⊙ dP)), dQ = scale dS K, dK = scale dSᵀ Q, summed over
 * the query heads of each kv head. Returns fresh [dq, dk, dv].
 */
export function attentionBackwardRef(
  dout: ArrayLike<number>, q: ArrayLike<number>, k: ArrayLike<number>, v: ArrayLike<number>,
  b: number, t: number, nH: number, nKv: number, hd: number,
): [Float64Array, Float64Array, Float64Array] {
  const dq = new Float64Array(b * t * nH * hd), dk = new Float64Array(b * t * nKv * hd), dv = new Float64Array(b * t * nKv * hd);
  const group = nH / nKv, scale = 1 / Math.sqrt(hd);
  const qi = (bi: number, i: number, h: number): number => ((bi * t + i) * nH + h) * hd;
  const ki = (bi: number, j: number, g: number): number => ((bi * t + j) * nKv + g) * hd;
  for (let bi = 0; bi < b; bi++) for (let h = 0; h < nH; h++) {
    const g = Math.floor(h / group);
    for (let i = 0; i < t; i++) {
      const s = new Float64Array(i + 1), dp = new Float64Array(i + 1);
      for (let j = 0; j <= i; j++) {
        let d = 0, e2 = 0;
        for (let e = 0; e < hd; e++) { d += q[qi(bi, i, h) + e]! * k[ki(bi, j, g) + e]!; e2 += dout[qi(bi, i, h) + e]! * v[ki(bi, j, g) + e]!; }
        s[j] = d * scale; dp[j] = e2;
      }
      let mx = -Infinity;
      for (const x of s) mx = Math.max(mx, x);
      const p = s.map((x) => Math.exp(x - mx));
      const z = p.reduce((a, c) => a + c, 0);
      for (let j = 0; j <= i; j++) p[j]! /= z;
      let rs = 0;
      for (let j = 0; j <= i; j++) rs += p[j]! * dp[j]!;
      for (let j = 0; j <= i; j++) {
        const ds = p[j]! * (dp[j]! - rs) * scale;
        for (let e = 0; e < hd; e++) {
          dv[ki(bi, j, g) + e] += p[j]! * dout[qi(bi, i, h) + e]!;
          dq[qi(bi, i, h) + e] += ds * k[ki(bi, j, g) + e]!;
          dk[ki(bi, j, g) + e] += ds * q[qi(bi, i, h) + e]!;
        }
      }
    }
  }
  return [dq, dk, dv];
}

export function softmax(z: ArrayLike<number>, T = 1): number[] {
  const s = Array.from(z, (x) => x / T);
  const mx = Math.max(...s);
  const e = s.map((x) => Math.exp(x - mx));
  const sum = e.reduce((a, c) => a + c, 0);
  return e.map((x) => x / sum);
}

/** Per-row reference of the fused loss: [loss, ce, div, agree, acc]. */
export function lossRef(zs: ArrayLike<number>, zt: ArrayLike<number> | null, y: number, spec: LossSpec): number[] {
  // argmax: the first index of the maximum (numpy's and torch's)
  const am = (a: ArrayLike<number>) => { let b = 0; for (let j = 1; j < a.length; j++) if (a[j]! > a[b]!) b = j; return b; };
  const acc = am(zs) === y ? 1 : 0;
  const p = softmax(zs);
  const ce = -Math.log(p[y]!);
  if (spec.kind === 'none' || zt === null) return [ce, ce, 0, 0, acc];
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
  return [spec.alpha * div + (1 - spec.alpha) * ce, ce, div, am(zs) === am(zt) ? 1 : 0, acc];
}

export const LOSS_SPECS: LossSpec[] = [
  { kind: 'none', alpha: 0.3, temperature: 1, beta: 0.5 },
  { kind: 'kl', alpha: 0.7, temperature: 2, beta: 0.5 },
  { kind: 'reverse-kl', alpha: 0.4, temperature: 1.5, beta: 0.5 },
  { kind: 'jsd', alpha: 0.6, temperature: 2.5, beta: 0.3 },
  { kind: 'jsd', alpha: 1, temperature: 1, beta: 0.5 },
];

/**
 * Document positions (Backend DocPositions) of b windows of t rows, window w holding documents of the lengths
 * docs[w % docs.length] in order (what they leave of the window: the padding document).
 */
export function docPositionsOf(b: number, t: number, docs: number[][]): Int32Array {
  const pos = new Int32Array(b * t);
  for (let w = 0; w < b; w++) {
    let at = 0;
    for (const len of docs[w % docs.length]!) { for (let i = 0; i < len && at + i < t; i++) pos[w * t + at + i] = i; at += len; }
    for (let i = at; i < t; i++) pos[w * t + i] = i - at;
  }
  return pos;
}

/** The documents of window w of t rows as [start, end) ranges, from document positions (Backend DocPositions). */
export function docSegments(pos: ArrayLike<number>, w: number, t: number): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (let i = 0; i < t; i++) {
    if (pos[w * t + i] === 0) { if (out.length) out[out.length - 1]![1] = i; out.push([i, t]); }
  }
  return out;
}

/** Rows [s, e) of window w of a [b, t, width] tensor. */
export function rowsOf(x: ArrayLike<number>, w: number, t: number, width: number, s: number, e: number): Float64Array {
  return Float64Array.from({ length: (e - s) * width }, (_, i) => x[(w * t + s) * width + i]!);
}

/**
 * attentionRef and attentionBackwardRef over windows of several documents (positions [b·t], Backend DocPositions):
 * each document's rows run alone through the references (the definition of attention within documents).
 * Returns fresh [out, lse, dq, dk, dv] (lse [b, nH, t]).
 */
export function attentionDocsRef(
  dout: ArrayLike<number>, q: ArrayLike<number>, k: ArrayLike<number>, v: ArrayLike<number>, pos: ArrayLike<number>,
  b: number, t: number, nH: number, nKv: number, hd: number,
): [Float64Array, Float64Array, Float64Array, Float64Array, Float64Array] {
  const out = new Float64Array(b * t * nH * hd), lse = new Float64Array(b * nH * t);
  const dq = new Float64Array(b * t * nH * hd), dk = new Float64Array(b * t * nKv * hd), dv = new Float64Array(b * t * nKv * hd);
  for (let w = 0; w < b; w++) {
    for (const [s, e] of docSegments(pos, w, t)) {
      const L = e - s;
      const qs = rowsOf(q, w, t, nH * hd, s, e), ks = rowsOf(k, w, t, nKv * hd, s, e), vs = rowsOf(v, w, t, nKv * hd, s, e);
      const [o, l] = attentionRef(qs, ks, vs, 1, L, nH, nKv, hd);
      const [gq, gk, gv] = attentionBackwardRef(rowsOf(dout, w, t, nH * hd, s, e), qs, ks, vs, 1, L, nH, nKv, hd);
      out.set(o, (w * t + s) * nH * hd); dq.set(gq, (w * t + s) * nH * hd);
      dk.set(gk, (w * t + s) * nKv * hd); dv.set(gv, (w * t + s) * nKv * hd);
      for (let h = 0; h < nH; h++) lse.set(l.subarray(h * L, h * L + L), (w * nH + h) * t + s);
    }
  }
  return [out, lse, dq, dk, dv];
}

/**
 * What Backend.ropeKvCacheWrite replaces, in layer.ts's own sequence of ops: the split copies (with the biases), the q/k
 * norms and the rotation in place, or the rotation from the product's columns; then the two cache writes. Its arguments
 * are ropeKvCacheWrite's (q, k and v scratch in q's dtype). Used by test/backend/rope-kv-cache.test.ts and test/cuda/generation-gpu.test.ts.
 */
export function ropeKvCacheWriteUnfused(be: Backend, q: Buf, kc: Buf, vc: Buf, qkv: Buf, b: number, t: number, pos0: number | SeqPositions, tMax: number,
  nH: number, nKv: number, hd: number, rope: RopeSpec, bias: Buf | null, norm: QkNormWeights | null): void {
  const Q = nH * hd, KV = nKv * hd, W = Q + 2 * KV, N = b * t, dt = q.dtype;
  const k = be.alloc(N * KV, 'k', dt), v = be.alloc(N * KV, 'v', dt);
  const part = (o: number, n: number): Buf | null => (bias ? be.view(bias, o, n) : null);
  be.copyColumns(v, KV, 0, qkv, W, Q + KV, N, KV, part(Q + KV, KV));
  if (norm) {
    const qRaw = be.alloc(N * Q, 'q raw', dt), kRaw = be.alloc(N * KV, 'k raw', dt);
    be.copyColumns(qRaw, Q, 0, qkv, W, 0, N, Q, part(0, Q));
    be.copyColumns(kRaw, KV, 0, qkv, W, Q, N, KV, part(Q, KV));
    be.rmsnormForward(q, be.alloc(N * nH, 'rstd q'), qRaw, norm.q, N * nH, hd, norm.eps);
    be.rmsnormForward(k, be.alloc(N * nKv, 'rstd k'), kRaw, norm.k, N * nKv, hd, norm.eps);
    be.ropeForward(q, q, b, t, nH, hd, rope, pos0);
    be.ropeForward(k, k, b, t, nKv, hd, rope, pos0);
  } else {
    be.ropeForward(q, be.view(qkv, 0, N * W), b, t, nH, hd, rope, pos0, part(0, Q), { inp: W });
    be.ropeForward(k, be.view(qkv, Q, N * W - Q), b, t, nKv, hd, rope, pos0, part(Q, KV), { inp: W });
  }
  be.kvCacheWrite(kc, k, b, t, pos0, tMax, nKv, hd);
  be.kvCacheWrite(vc, v, b, t, pos0, tMax, nKv, hd);
}
