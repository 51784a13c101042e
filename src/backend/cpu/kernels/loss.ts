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
 */
import type { LossSpec } from '../../backend.js';
import { LOSS_STATS, STAT_AGREE, STAT_CE, STAT_DIV, STAT_LOSS } from '../../backend.js';
import type { FArr } from './types.js';

/** log(e^a + e^b), exact for infinite arguments. */
function logAddExp(a: number, b: number): number {
  if (a === -Infinity) return b;
  if (b === -Infinity) return a;
  return a > b ? a + Math.log1p(Math.exp(b - a)) : b + Math.log1p(Math.exp(a - b));
}

/** ls[j] = z[j]/T − logsumexp(z/T) (a log-softmax) from row z; returns nothing. */
function logSoftmax(ls: Float64Array, z: ArrayLike<number>, zo: number, vocab: number, invT: number): void {
  let mx = -Infinity;
  for (let j = 0; j < vocab; j++) { const x = z[zo + j] * invT; ls[j] = x; if (x > mx) mx = x; }
  let sum = 0;
  for (let j = 0; j < vocab; j++) sum += Math.exp(ls[j] - mx);
  const lse = mx + Math.log(sum);
  for (let j = 0; j < vocab; j++) ls[j] -= lse;
}

function argmax(z: ArrayLike<number>, zo: number, vocab: number): number {
  let best = 0, bv = z[zo];
  for (let j = 1; j < vocab; j++) if (z[zo + j] > bv) { bv = z[zo + j]; best = j; }
  return best;
}

/** Rows [r0, r1) of the fused loss. See the file comment for the math. */
export function lossRows(
  stats: FArr, dlogits: FArr | null, logits: FArr, teacher: FArr | null, targets: Int32Array, weights: FArr,
  vocab: number, spec: LossSpec, r0: number, r1: number,
): void {
  const kind = spec.kind;
  if (kind !== 'none' && teacher === null) throw new RangeError(`lossForward: loss kind '${kind}' needs teacher logits`);
  const T = spec.temperature, invT = 1 / T, alpha = spec.alpha, beta = spec.beta;
  const lp = new Float64Array(vocab); // log p_s (T = 1)
  const lqs = kind === 'none' ? lp : new Float64Array(vocab); // log q_s
  const lqt = kind === 'none' ? lp : new Float64Array(vocab); // log q_t
  const grad = new Float64Array(vocab);
  const logB = Math.log(beta), log1mB = Math.log(1 - beta);
  for (let i = r0; i < r1; i++) {
    const zo = i * vocab, so = i * LOSS_STATS;
    const y = targets[i], w = weights[i];
    if (y === -1) {
      if (w !== 0) throw new RangeError(`lossForward: row ${i} has target -1 (padding) but weight ${w} (must be 0)`);
      for (let s = 0; s < LOSS_STATS; s++) stats[so + s] = 0;
      if (dlogits !== null) dlogits.fill(0, zo, zo + vocab);
      continue;
    }
    if (y < 0 || y >= vocab) throw new RangeError(`lossForward: row ${i} target ${y} outside [0, ${vocab})`);
    logSoftmax(lp, logits, zo, vocab, 1);
    const ce = -lp[y];
    let div = 0;
    // agree is reported whenever teacher logits are given (also for kind 'none'); 0 without a teacher.
    const agree = teacher !== null && argmax(logits, zo, vocab) === argmax(teacher, zo, vocab) ? 1 : 0;
    // CE gradient, weighted by (1 − alpha) when mixed.
    const wCe = kind === 'none' ? 1 : 1 - alpha;
    for (let j = 0; j < vocab; j++) grad[j] = wCe * Math.exp(lp[j]);
    grad[y] -= wCe;
    if (kind !== 'none') {
      const tz = teacher as FArr;
      logSoftmax(lqs, logits, zo, vocab, invT);
      logSoftmax(lqt, tz, zo, vocab, invT);
      const gs = alpha * T; // chain rule through z/T, times T² → T, times alpha
      if (kind === 'kl') {
        let d = 0;
        for (let j = 0; j < vocab; j++) {
          const qt = Math.exp(lqt[j]), qs = Math.exp(lqs[j]);
          d += qt * (lqt[j] - lqs[j]);
          grad[j] += gs * (qs - qt);
        }
        div = T * T * d;
      } else {
        // reverse-kl and jsd share ∂/∂z_s = T q_s ⊙ (g − Σ q_s g); lqt is reused to hold g.
        let d = 0, mean = 0;
        for (let j = 0; j < vocab; j++) {
          const qs = Math.exp(lqs[j]);
          let g: number;
          if (kind === 'reverse-kl') {
            g = lqs[j] - lqt[j];
            d += qs * g;
          } else {
            const lm = logAddExp(logB + lqt[j], log1mB + lqs[j]);
            const qt = Math.exp(lqt[j]);
            if (beta > 0) d += beta * qt * (lqt[j] - lm);
            if (beta < 1) d += (1 - beta) * qs * (lqs[j] - lm);
            g = (1 - beta) * (lqs[j] - lm);
          }
          lqt[j] = g;
          mean += qs * g;
        }
        for (let j = 0; j < vocab; j++) grad[j] += gs * Math.exp(lqs[j]) * (lqt[j] - mean);
        div = T * T * d;
      }
    }
    const loss = kind === 'none' ? ce : alpha * div + (1 - alpha) * ce;
    stats[so + STAT_LOSS] = loss;
    stats[so + STAT_CE] = ce;
    stats[so + STAT_DIV] = div;
    stats[so + STAT_AGREE] = agree;
    if (dlogits !== null) for (let j = 0; j < vocab; j++) dlogits[zo + j] = w * grad[j];
  }
}
