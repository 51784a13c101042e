/**
 * An independent float64 reference of the RoPE frequencies transformers computes (modeling_rope_utils.py), written
 * from the formulas' definitions rather than from src/backend/rope.ts: for each rotated pair i < d/2 the base
 * frequency f = theta^(-2i/d), and
 * - linear: f / factor;
 * - llama3: r = L·f/(2π) is how many turns the pair makes over the original context L; r > high_freq_factor keeps f,
 *   r < low_freq_factor gives f / factor, and in between f·(s + (1 − s)/factor) with s = (r − low)/(high − low);
 * - yarn: the pair index at which a pair makes `n` turns over L is d·ln(L/(2πn)) / (2 ln theta); between the index
 *   of beta_fast turns (floored) and of beta_slow turns (ceiled; both unrounded when truncate is false, clamped to
 *   [0, d − 1]) a linear ramp m moves f to f / factor: f·(1 − m·(1 − 1/factor)). cos and sin are scaled by the
 *   attention factor (default 1 + 0.1·ln(factor) for factor > 1).
 */
import type { RopeSpec } from '../../src/backend/rope.js';

export function refInvFreq(r: RopeSpec, d: number): number[] {
  const out: number[] = [];
  for (let i = 0; i < d / 2; i++) {
    const f = r.theta ** (-(2 * i) / d);
    if (r.type === 'default') out.push(f);
    else if (r.type === 'linear') out.push(f / r.factor);
    else if (r.type === 'llama3') {
      const turns = (r.originalMaxPositionEmbeddings * f) / (2 * Math.PI);
      if (turns > r.highFreqFactor) out.push(f);
      else if (turns < r.lowFreqFactor) out.push(f / r.factor);
      else {
        const s = (turns - r.lowFreqFactor) / (r.highFreqFactor - r.lowFreqFactor);
        out.push(f * (s + (1 - s) / r.factor));
      }
    } else {
      const indexOfTurns = (n: number): number =>
        (d * Math.log(r.originalMaxPositionEmbeddings / (2 * Math.PI * n))) / (2 * Math.log(r.theta));
      let from = indexOfTurns(r.betaFast), to = indexOfTurns(r.betaSlow);
      if (r.truncate) { from = Math.floor(from); to = Math.ceil(to); }
      from = Math.max(0, from); to = Math.min(d - 1, to);
      if (to === from) to = from + 0.001;
      const m = i <= from ? 0 : i >= to ? 1 : (i - from) / (to - from);
      out.push(f * (1 - m * (1 - 1 / r.factor)));
    }
  }
  return out;
}

export function refAttentionScale(r: RopeSpec): number {
  return r.type === 'yarn' ? r.attentionFactor : 1;
}

/** Rotates x [b, t, heads, d] in place at positions pos0 + t (the float64 reference rotation). */
export function refRotate(x: Float64Array, r: RopeSpec, b: number, t: number, heads: number, d: number, pos0: number, transpose = false): void {
  const inv = refInvFreq(r, d), a = refAttentionScale(r), half = d / 2;
  for (let bb = 0; bb < b; bb++) for (let tt = 0; tt < t; tt++) for (let h = 0; h < heads; h++) {
    const o = ((bb * t + tt) * heads + h) * d;
    for (let i = 0; i < half; i++) {
      const ang = (pos0 + tt) * inv[i]!;
      const c = a * Math.cos(ang), s = (transpose ? -a : a) * Math.sin(ang);
      const x1 = x[o + i]!, x2 = x[o + i + half]!;
      x[o + i] = x1 * c - x2 * s;
      x[o + i + half] = x2 * c + x1 * s;
    }
  }
}
