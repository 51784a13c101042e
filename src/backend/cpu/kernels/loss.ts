/**
 * The fused per-token loss kernel of the CPU backend: cross-entropy against the next token, optionally mixed
 * with a distillation divergence against teacher logits ('kl', 'reverse-kl', 'jsd' at temperature T, with the
 * T² factor), its per-row stats and its gradient. Every row is computed in float64 with max subtraction, and
 * all of a row is read before any of it is written, so dlogits may alias logits.
 *
 * With p = softmax, q_s = softmax(z_s/T), q_t = softmax(z_t/T):
 *   CE = −log p_s[y]                              ∂/∂z_s = p_s − onehot(y)
 *   kl  = T² Σ q_t (log q_t − log q_s)           ∂/∂z_s = T (q_s − q_t)
 *   rkl = T² Σ q_s (log q_s − log q_t)           ∂/∂z_s = T q_s ⊙ (g − Σ q_s g),  g = log q_s − log q_t
 *   jsd = T² [β Σ q_t log(q_t/m) + (1−β) Σ q_s log(q_s/m)], m = β q_t + (1−β) q_s
 *                                                 ∂/∂z_s = T q_s ⊙ (g − Σ q_s g),  g = (1−β) log(q_s/m)
 *   loss = CE for 'none', else α·div + (1−α)·CE; dlogits row = weights[i] · ∂loss/∂z_s.
 * Stats row (STAT_*): loss, CE, div, agreement [argmax z_s = argmax z_t], accuracy [argmax z_s = y], each argmax the
 * first index of the row's maximum (numpy's and torch's argmax).
 */
import type { LossSpec } from '../../backend.js';
import { LOSS_STATS, STAT_ACC, STAT_AGREE, STAT_CE, STAT_DIV, STAT_LOSS } from '../../backend.js';
import type { FArr } from './types.js';

/** log(e^a + e^b), exact for infinite arguments. */
function logAddExp(a: number, b: number): number {
  if (a === -Infinity) return b;
  if (b === -Infinity) return a;
  return a > b ? a + Math.log1p(Math.exp(b - a)) : b + Math.log1p(Math.exp(a - b));
}

/** What expRow found in a row: max of z·invT, Σ e, and the index of the first maximum of the raw z. */
interface RowExp { mx: number; sum: number; argmax: number }

/**
 * e[j] = exp(z[j]·invT − mx) with mx = max z·invT (one exp per element); p = e / sum is the softmax and
 * log p[j] = z[j]·invT − (mx + log sum).
 */
function expRow(e: Float64Array, z: ArrayLike<number>, zo: number, vocab: number, invT: number): RowExp {
  let mx = -Infinity, best = 0, bv = z[zo];
  for (let j = 0; j < vocab; j++) {
    const r = z[zo + j], x = r * invT;
    if (x > mx) mx = x;
    if (r > bv) { bv = r; best = j; }
  }
  let sum = 0;
  for (let j = 0; j < vocab; j++) { const v = Math.exp(z[zo + j] * invT - mx); e[j] = v; sum += v; }
  return { mx, sum, argmax: best };
}

/**
 * A row's target check, shared by the dense and sparse losses: a padding row (target −1, which must have weight 0) gets
 * zero stats and, with a gradient, a zero gradient row, and the caller skips it (true); any other target must lie in
 * [0, vocab).
 */
export function paddingRow(op: string, i: number, y: number, w: number, stats: FArr, dlogits: FArr | null, zo: number, ld: number, vocab: number): boolean {
  if (y === -1) {
    if (w !== 0) throw new RangeError(`${op}: row ${i} has target -1 (padding) but weight ${w} (must be 0)`);
    stats.fill(0, i * LOSS_STATS, (i + 1) * LOSS_STATS);
    if (dlogits !== null) dlogits.fill(0, zo, zo + ld);
    return true;
  }
  if (y < 0 || y >= vocab) throw new RangeError(`${op}: row ${i} target ${y} outside [0, ${vocab})`);
  return false;
}

/**
 * Rows [r0, r1) of the fused loss. See the file comment for the math. Each softmax is one exp per element
 * (expRow), reused for the probabilities; log-probabilities are z·invT − logsumexp, no second exp or log. All
 * sums are float64, in element order, so a row's result does not depend on which thread computes it.
 */
export function lossRows(
  stats: FArr, dlogits: FArr | null, logits: FArr, teacher: FArr | null, targets: Int32Array, weights: FArr,
  vocab: number, spec: LossSpec, r0: number, r1: number, ld: number = vocab,
): void {
  const kind = spec.kind;
  if (kind !== 'none' && teacher === null) throw new RangeError(`lossForward: loss kind '${kind}' needs teacher logits`);
  const T = spec.temperature, invT = 1 / T, alpha = spec.alpha, beta = spec.beta;
  const ep = new Float64Array(vocab); // exp(z − max), T = 1
  const distill = kind !== 'none';
  const eqs = distill && T !== 1 ? new Float64Array(vocab) : ep; // exp(z/T − max)
  const eqt = distill ? new Float64Array(vocab) : ep; // exp(zt/T − max), then g for reverse-kl / jsd
  const grad = new Float64Array(vocab);
  const logB = Math.log(beta), log1mB = Math.log(1 - beta);
  for (let i = r0; i < r1; i++) {
    const zo = i * ld, so = i * LOSS_STATS;
    const y = targets[i], w = weights[i];
    if (paddingRow('lossForward', i, y!, w!, stats, dlogits, zo, ld, vocab)) continue;
    const rp = expRow(ep, logits, zo, vocab, 1);
    const ce = rp.mx + Math.log(rp.sum) - logits[zo + y];
    let div = 0;
    // agree is reported whenever teacher logits are given (also for kind 'none'); 0 without a teacher.
    let agree = 0;
    if (teacher !== null && !distill) agree = rp.argmax === expRow(grad, teacher, zo, vocab, 1).argmax ? 1 : 0;
    // CE gradient, weighted by (1 − alpha) when mixed.
    const wCe = distill ? 1 - alpha : 1;
    const cp = wCe / rp.sum;
    for (let j = 0; j < vocab; j++) grad[j] = cp * ep[j];
    grad[y] -= wCe;
    if (distill) {
      const tz = teacher as FArr;
      const rs = T === 1 ? rp : expRow(eqs, logits, zo, vocab, invT);
      const rt = expRow(eqt, tz, zo, vocab, invT);
      agree = rp.argmax === rt.argmax ? 1 : 0;
      const lses = rs.mx + Math.log(rs.sum), lset = rt.mx + Math.log(rt.sum);
      const invS = 1 / rs.sum, invTt = 1 / rt.sum;
      const gs = alpha * T; // chain rule through z/T, times T² → T, times alpha
      if (kind === 'kl') {
        let d = 0;
        for (let j = 0; j < vocab; j++) {
          const qt = eqt[j] * invTt, qs = eqs[j] * invS;
          d += qt * ((tz[zo + j] * invT - lset) - (logits[zo + j] * invT - lses));
          grad[j] += gs * (qs - qt);
        }
        div = T * T * d;
      } else {
        // reverse-kl and jsd share ∂/∂z_s = T q_s ⊙ (g − Σ q_s g); eqt is reused to hold g.
        let d = 0, mean = 0;
        for (let j = 0; j < vocab; j++) {
          const qs = eqs[j] * invS;
          const lqs = logits[zo + j] * invT - lses, lqt = tz[zo + j] * invT - lset;
          let g: number;
          if (kind === 'reverse-kl') {
            g = lqs - lqt;
            d += qs * g;
          } else {
            const lm = logAddExp(logB + lqt, log1mB + lqs);
            const qt = eqt[j] * invTt;
            if (beta > 0) d += beta * qt * (lqt - lm);
            if (beta < 1) d += (1 - beta) * qs * (lqs - lm);
            g = (1 - beta) * (lqs - lm);
          }
          eqt[j] = g;
          mean += qs * g;
        }
        for (let j = 0; j < vocab; j++) grad[j] += gs * (eqs[j] * invS) * (eqt[j] - mean);
        div = T * T * d;
      }
    }
    const loss = distill ? alpha * div + (1 - alpha) * ce : ce;
    stats[so + STAT_LOSS] = loss;
    stats[so + STAT_CE] = ce;
    stats[so + STAT_DIV] = div;
    stats[so + STAT_AGREE] = agree;
    stats[so + STAT_ACC] = rp.argmax === y ? 1 : 0;
    if (dlogits !== null) {
      for (let j = 0; j < vocab; j++) dlogits[zo + j] = w * grad[j];
      if (ld > vocab) dlogits.fill(0, zo + vocab, zo + ld); // columns past the loss vocabulary get no gradient
    }
  }
}
