/**
 * Causal grouped-query attention kernels of the CPU backend (scale 1/sqrt(hd)), plus the KV-cache write and
 * the cached inference attention. Layouts: q/out [B, T, nHeads, hd]; k, v [B, T, nKv, hd]; lse [B, nHeads, T]
 * (natural-log log-sum-exp of each query row's scaled scores: the state forward saves for backward, linear in
 * T); caches [B, tMax, nKv, hd]. Query head h reads kv head floor(h / (nHeads / nKv)).
 *
 * Forward works on a range of (batch, head) units and backward on a range of (batch, kv-head) groups, so the
 * backend can split them among worker threads: a kv group owns its dk/dv rows, so ranges never race. Backward
 * recomputes each probability row from the scores and lse (P = exp(S − lse)), one query row at a time.
 * Scores and softmax are computed in float64 scratch rows whatever the buffer type. With document positions `pos`
 * ([B·T], Backend DocPositions; null: none), row t of sequence b attends to keys from docStart(pos, b, T, t) only.
 */
import type { FArr } from './types.js';

/** scale · q[qo..qo+hd) · k[ko..ko+hd): the one score formula forward and backward share (same bits in both). */
function score(q: FArr, qo: number, k: FArr, ko: number, hd: number, scale: number): number {
  let d0 = 0, d1 = 0, d = 0;
  for (; d + 2 <= hd; d += 2) { d0 += q[qo + d] * k[ko + d]; d1 += q[qo + d + 1] * k[ko + d + 1]; }
  for (; d < hd; d++) d0 += q[qo + d] * k[ko + d];
  return (d0 + d1) * scale;
}

/** The first key row t of sequence bi attends to: its document's first row (t − pos), or 0 without documents. */
export function docStart(pos: Int32Array | null, bi: number, T: number, t: number): number {
  return pos === null ? 0 : t - pos[bi * T + t]!;
}

/** Units [u0, u1) with u = b·nHeads + h. Writes out rows and lse[u·T + t]. */
export function attentionForward(
  out: FArr, lse: FArr, q: FArr, k: FArr, v: FArr,
  T: number, nHeads: number, nKv: number, hd: number, u0: number, u1: number, pos: Int32Array | null = null,
): void {
  const rep = nHeads / nKv, scale = 1 / Math.sqrt(hd);
  const qs = nHeads * hd, ks = nKv * hd;
  const row = new Float64Array(T), acc = new Float64Array(hd);
  for (let u = u0; u < u1; u++) {
    const bi = Math.floor(u / nHeads), h = u % nHeads, g = Math.floor(h / rep);
    for (let t = 0; t < T; t++) {
      const qo = (bi * T + t) * qs + h * hd, s0 = docStart(pos, bi, T, t);
      let mx = -Infinity;
      for (let s = s0; s <= t; s++) {
        const sc = score(q, qo, k, (bi * T + s) * ks + g * hd, hd, scale);
        row[s] = sc;
        if (sc > mx) mx = sc;
      }
      let sum = 0;
      for (let s = s0; s <= t; s++) { const e = Math.exp(row[s] - mx); row[s] = e; sum += e; }
      const inv = 1 / sum;
      acc.fill(0);
      for (let s = s0; s <= t; s++) {
        const p = row[s] * inv;
        const vo = (bi * T + s) * ks + g * hd;
        for (let d = 0; d < hd; d++) acc[d] += p * v[vo + d];
      }
      for (let d = 0; d < hd; d++) out[qo + d] = acc[d];
      lse[u * T + t] = mx + Math.log(sum);
    }
  }
}

/**
 * Groups [g0, g1) with gi = b·nKv + kvHead: all query heads of the group. Per query row, P = exp(S − lse) is
 * recomputed and D = rowsum(P ⊙ dP) = dout·out; dV += Pᵀ dO; dP = dO Vᵀ; dS = P ⊙ (dP − D); dQ += scale dS K;
 * dK += scale dSᵀ Q.
 */
export function attentionBackward(
  dq: FArr, dk: FArr, dv: FArr, dout: FArr, q: FArr, k: FArr, v: FArr, out: FArr, lse: FArr,
  T: number, nHeads: number, nKv: number, hd: number, g0: number, g1: number, pos: Int32Array | null = null,
): void {
  const rep = nHeads / nKv, scale = 1 / Math.sqrt(hd);
  const qs = nHeads * hd, ks = nKv * hd;
  const pr = new Float64Array(T), dp = new Float64Array(T), dqAcc = new Float64Array(hd);
  for (let gi = g0; gi < g1; gi++) {
    const bi = Math.floor(gi / nKv), g = gi % nKv;
    for (let r = 0; r < rep; r++) {
      const h = g * rep + r;
      const u = bi * nHeads + h;
      for (let t = 0; t < T; t++) {
        const qo = (bi * T + t) * qs + h * hd, s0 = docStart(pos, bi, T, t);
        const l = lse[u * T + t];
        let dsum = 0;
        for (let d = 0; d < hd; d++) dsum += dout[qo + d] * out[qo + d];
        for (let s = s0; s <= t; s++) {
          const o = (bi * T + s) * ks + g * hd;
          pr[s] = Math.exp(score(q, qo, k, o, hd, scale) - l);
          let d0 = 0;
          for (let d = 0; d < hd; d++) d0 += dout[qo + d] * v[o + d];
          dp[s] = d0;
        }
        dqAcc.fill(0);
        for (let s = s0; s <= t; s++) {
          const p = pr[s];
          const o = (bi * T + s) * ks + g * hd;
          const ds = p * (dp[s] - dsum) * scale;
          for (let d = 0; d < hd; d++) {
            dv[o + d] += p * dout[qo + d];
            dqAcc[d] += ds * k[o + d];
            dk[o + d] += ds * q[qo + d];
          }
        }
        for (let d = 0; d < hd; d++) dq[qo + d] += dqAcc[d];
      }
    }
  }
}

/** cache[b, pos0 + i, :, :] = src[b, i, :, :] for i < t. */
export function kvCacheWrite(cache: FArr, src: FArr, b: number, t: number, pos0: number, tMax: number, nKv: number, hd: number): void {
  if (pos0 < 0 || pos0 + t > tMax) throw new RangeError(`kvCacheWrite: rows [${pos0}, ${pos0 + t}) outside the cache of ${tMax}`);
  const rowLen = nKv * hd;
  for (let bi = 0; bi < b; bi++) {
    const s = bi * t * rowLen;
    cache.set(src.subarray(s, s + t * rowLen), (bi * tMax + pos0) * rowLen);
  }
}

/** Queries at positions pos0..pos0+t-1 attend to cache rows 0..pos (inclusive); out [B, t, nHeads, hd]. */
export function attentionCached(
  out: FArr, q: FArr, kCache: FArr, vCache: FArr, b: number, t: number, pos0: number, tMax: number,
  nHeads: number, nKv: number, hd: number,
): void {
  if (pos0 < 0 || pos0 + t > tMax) throw new RangeError(`attentionCached: positions [${pos0}, ${pos0 + t}) outside the cache of ${tMax}`);
  const rep = nHeads / nKv, scale = 1 / Math.sqrt(hd);
  const qs = nHeads * hd, ks = nKv * hd;
  const row = new Float64Array(pos0 + t), acc = new Float64Array(hd);
  for (let bi = 0; bi < b; bi++) {
    for (let h = 0; h < nHeads; h++) {
      const g = Math.floor(h / rep);
      for (let i = 0; i < t; i++) {
        const pos = pos0 + i;
        const qo = (bi * t + i) * qs + h * hd;
        let mx = -Infinity;
        for (let s = 0; s <= pos; s++) {
          const ko = (bi * tMax + s) * ks + g * hd;
          let d0 = 0;
          for (let d = 0; d < hd; d++) d0 += q[qo + d] * kCache[ko + d];
          const sc = d0 * scale;
          row[s] = sc;
          if (sc > mx) mx = sc;
        }
        let sum = 0;
        for (let s = 0; s <= pos; s++) { const e = Math.exp(row[s] - mx); row[s] = e; sum += e; }
        const inv = 1 / sum;
        acc.fill(0);
        for (let s = 0; s <= pos; s++) {
          const p = row[s] * inv;
          const vo = (bi * tMax + s) * ks + g * hd;
          for (let d = 0; d < hd; d++) acc[d] += p * vCache[vo + d];
        }
        for (let d = 0; d < hd; d++) out[qo + d] = acc[d];
      }
    }
  }
}
