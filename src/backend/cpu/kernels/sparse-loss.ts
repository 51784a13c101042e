/**
 * The fused per-token loss against a SPARSE teacher distribution (a teacher cache, src/cache), CPU backend, float64.
 *
 * A row's teacher is S slots (id k, weight π_k, log q_t(k)) and an optional tail mass r (the teacher's probability
 * outside the slots). Every divergence distillery offers is a sum over the vocabulary of one term per token,
 * D = T² Σ_j h(q_s(j), q_t(j)), and the sparse loss estimates it as
 *
 *   D̂ = T² [ Σ_k a_k h(q_s(k), q_t(k)) + h(Q_s, r) ],  a_k = π_k / q_t(k),  Q_s = 1 − Σ_k q_s(k)
 *
 * (the tail term only when the row has one). For `sample:N` slots (π_k = count_k / N of N draws from q_t) a_k is the
 * importance weight and D̂ is an unbiased estimate of D; its gradient, the exact gradient of D̂, is an unbiased
 * estimate of D's. For `top:K` slots (π_k = q_t(k)) a_k = 1 and D̂ is the divergence between the two distributions
 * coarsened to the K tokens plus one "everything else" bucket: exact when the slots cover the vocabulary.
 *
 *   kl          h = q_t (ℓ_t − ℓ_s)          ∂h/∂ℓ_s = −q_t                     (ℓ = log q)
 *   reverse-kl  h = q_s (ℓ_s − ℓ_t)          ∂h/∂ℓ_s = q_s (ℓ_s − ℓ_t + 1)
 *   jsd         h = β q_t (ℓ_t − ℓ_m) + (1−β) q_s (ℓ_s − ℓ_m),  m = β q_t + (1−β) q_s
 *                                            ∂h/∂ℓ_s = (1−β) q_s (ℓ_s − ℓ_m)
 *
 * With γ_k = a_k ∂h_k/∂ℓ_s, γ_r the tail's and Γ = Σ_k γ_k + γ_r, and ∂ℓ_s(j)/∂z_i = (δ_ij − q_s(i))/T:
 *   ∂D̂/∂z_i = T [ γ_i [i in slots] + γ_r q_s(i)/Q_s [i not in slots] − Γ q_s(i) ]
 * The CE term (against the data's next token), α mixing, weights and the stats row are those of the dense loss
 * (src/backend/cpu/kernels/loss.ts); `agree` compares the student's argmax with the teacher's argmax id.
 */
import type { LossSpec } from '../../backend.js';
import { LOSS_STATS, STAT_ACC, STAT_AGREE, STAT_CE, STAT_DIV, STAT_LOSS } from '../../backend.js';
import type { FArr } from './types.js';
import { paddingRow } from './loss.js';

/** The host arrays of a SparseTargets (see Backend.sparseLossForward). */
export interface SparseRows {
  slots: number;
  ids: Int32Array;
  prob: FArr;
  logq: FArr;
  tail: FArr;
  argmax: Int32Array;
}

function logAddExp(a: number, b: number): number {
  if (a === -Infinity) return b;
  if (b === -Infinity) return a;
  return a > b ? a + Math.log1p(Math.exp(b - a)) : b + Math.log1p(Math.exp(a - b));
}

/** h(q_s, q_t) and ∂h/∂ℓ_s for one token (or the tail bucket), with the 0·log 0 = 0 convention. */
export function sparseTerm(kind: LossSpec['kind'], beta: number, ls: number, lt: number): { h: number; dh: number } {
  const qs = Math.exp(ls), qt = Math.exp(lt);
  if (kind === 'kl') return { h: qt === 0 ? 0 : qt * (lt - ls), dh: -qt };
  if (kind === 'reverse-kl') return qs === 0 ? { h: 0, dh: 0 } : { h: qs * (ls - lt), dh: qs * (ls - lt + 1) };
  // jsd
  const lm = logAddExp(beta > 0 ? Math.log(beta) + lt : -Infinity, beta < 1 ? Math.log(1 - beta) + ls : -Infinity);
  let h = 0;
  if (beta > 0 && qt > 0) h += beta * qt * (lt - lm);
  if (beta < 1 && qs > 0) h += (1 - beta) * qs * (ls - lm);
  return { h, dh: beta < 1 && qs > 0 ? (1 - beta) * qs * (ls - lm) : 0 };
}

/** Rows [r0, r1) of the sparse loss (see the file comment). dlogits may alias logits: a row is read before it is written. */
export function sparseLossRows(
  stats: FArr, dlogits: FArr | null, logits: FArr, targets: Int32Array, weights: FArr, sp: SparseRows,
  vocab: number, spec: LossSpec, r0: number, r1: number, ld: number = vocab,
): void {
  const kind = spec.kind;
  if (kind === 'none') throw new RangeError('sparseLossForward: the sparse loss needs a distillation kind (kl, reverse-kl or jsd)');
  const T = spec.temperature, invT = 1 / T, alpha = spec.alpha, beta = spec.beta, S = sp.slots;
  const grad = new Float64Array(vocab);
  const qsRow = new Float64Array(vocab);
  const inSlots = new Uint8Array(vocab);
  const gammaK = new Float64Array(S); // a_k ∂h_k/∂ℓ_s of each slot: the value pass computes it, the gradient pass reuses it
  for (let i = r0; i < r1; i++) {
    const zo = i * ld, so = i * LOSS_STATS;
    const y = targets[i]!, w = weights[i]!;
    if (paddingRow('sparseLossForward', i, y, w, stats, dlogits, zo, ld, vocab)) continue;
    // Softmaxes at T = 1 (CE) and at T (the divergence), in float64 with max subtraction.
    let mx = -Infinity, best = 0;
    for (let j = 0; j < vocab; j++) { const x = logits[zo + j]!; if (x > mx) { mx = x; best = j; } }
    let s1 = 0, sT = 0;
    for (let j = 0; j < vocab; j++) {
      const x = logits[zo + j]! - mx;
      s1 += Math.exp(x);
      const e = Math.exp(x * invT);
      qsRow[j] = e; sT += e;
    }
    const lse1 = mx + Math.log(s1), lseT = mx * invT + Math.log(sT);
    for (let j = 0; j < vocab; j++) qsRow[j]! /= sT;
    const ce = lse1 - logits[zo + y]!;
    // The slots: the estimate and the γ_k.
    let div = 0, gammaSum = 0;
    const base = i * S;
    const tail = sp.tail[i]!;
    for (let k = 0; k < S; k++) {
      const id = sp.ids[base + k]!;
      if (id < 0) continue;
      if (id >= vocab) throw new RangeError(`sparseLossForward: row ${i} slot ${k} holds id ${id}, outside [0, ${vocab})`);
      const pi = sp.prob[base + k]!, lt = sp.logq[base + k]!;
      const a = pi === 0 ? 0 : pi / Math.exp(lt);
      const ls = logits[zo + id]! * invT - lseT;
      const t = sparseTerm(kind, beta, ls, lt);
      div += a * t.h;
      gammaK[k] = a * t.dh;
      gammaSum += gammaK[k]!;
      inSlots[id] = 1;
    }
    let gammaTail = 0, Qs = 0;
    if (tail >= 0) {
      // The student's mass outside the slots, summed over those tokens (not 1 − Σ slots: no cancellation).
      for (let j = 0; j < vocab; j++) if (inSlots[j] === 0) Qs += qsRow[j]!;
      const t = sparseTerm(kind, beta, Qs > 0 ? Math.log(Qs) : -Infinity, tail > 0 ? Math.log(tail) : -Infinity);
      div += t.h;
      gammaTail = t.dh;
    }
    div *= T * T;
    const loss = alpha * div + (1 - alpha) * ce;
    stats[so + STAT_LOSS] = loss;
    stats[so + STAT_CE] = ce;
    stats[so + STAT_DIV] = div;
    stats[so + STAT_AGREE] = best === sp.argmax[i] ? 1 : 0;
    stats[so + STAT_ACC] = best === y ? 1 : 0;
    if (dlogits === null) { for (let k = 0; k < S; k++) { const id = sp.ids[base + k]!; if (id >= 0) inSlots[id] = 0; } continue; }
    // CE gradient (1 − α)(p − onehot(y)), then the divergence's α T [γ [slots] + γ_r q_s/Q_s [others] − Γ q_s].
    // Each token's own term (never a huge tail rate added and then subtracted at a slot: that cancels when Q_s is tiny).
    const Gamma = gammaSum + gammaTail;
    const tailRate = gammaTail !== 0 && Qs > 0 ? gammaTail / Qs : 0;
    const gs = alpha * T, cp = (1 - alpha) / s1;
    for (let j = 0; j < vocab; j++) {
      const tailPart = inSlots[j] === 0 ? tailRate * qsRow[j]! : 0;
      grad[j] = cp * Math.exp(logits[zo + j]! - mx) + gs * (tailPart - Gamma * qsRow[j]!);
    }
    grad[y]! -= 1 - alpha;
    for (let k = 0; k < S; k++) {
      const id = sp.ids[base + k]!;
      if (id < 0) continue;
      grad[id]! += gs * gammaK[k]!;
      inSlots[id] = 0;
    }
    for (let j = 0; j < vocab; j++) dlogits[zo + j] = w * grad[j]!;
    if (ld > vocab) dlogits.fill(0, zo + vocab, zo + ld);
  }
}
