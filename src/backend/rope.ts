/**
 * Rotary position embedding: the kinds HF transformers computes for Qwen2 and Llama checkpoints, as one resolved
 * description (every default already applied) and the two numbers a kernel needs from it: the inverse frequency
 * of each rotated pair and the factor that scales cos and sin.
 *
 * The formulas are transformers' (modeling_rope_utils.py, transformers 5; late 4.x computes the same):
 * - default: inv[i] = theta^(-2i/d) for i < d/2 (d = head_dim);
 * - linear: inv[i] / factor;
 * - llama3 (Llama 3.1 / 3.2): with wavelength w = 2π / inv[i], L = original_max_position_embeddings,
 *   frequencies with w < L / high_freq_factor are kept, those with w > L / low_freq_factor are divided by factor,
 *   and the band between blends the two with s = (L / w − low_freq_factor) / (high_freq_factor − low_freq_factor):
 *   (1 − s) · inv / factor + s · inv;
 * - yarn: per pair a blend of the extrapolated inv[i] and the interpolated inv[i] / factor, with a linear ramp over
 *   the pair index between the "correction dimensions" of beta_fast and beta_slow (floor/ceil'ed unless
 *   truncate is false, clamped to [0, d − 1]); cos and sin are scaled by attention_factor.
 * Everything here is float64 (transformers computes the tables in float32; the difference is far below 1e-5).
 */

export type RopeSpec =
  | { readonly type: 'default'; readonly theta: number }
  | { readonly type: 'linear'; readonly theta: number; readonly factor: number }
  | {
    readonly type: 'llama3'; readonly theta: number; readonly factor: number; readonly lowFreqFactor: number;
    readonly highFreqFactor: number; readonly originalMaxPositionEmbeddings: number;
  }
  | {
    readonly type: 'yarn'; readonly theta: number; readonly factor: number; readonly originalMaxPositionEmbeddings: number;
    readonly betaFast: number; readonly betaSlow: number;
    /** Resolved: the config's attention_factor, or the one transformers derives from factor (and mscale). */
    readonly attentionFactor: number; readonly truncate: boolean;
  };

export type RopeType = RopeSpec['type'];
export const ROPE_TYPES: readonly RopeType[] = ['default', 'linear', 'llama3', 'yarn'];

/** Plain RoPE with this theta. */
export function plainRope(theta: number): RopeSpec {
  return { type: 'default', theta };
}

/** YaRN's default attention factor for a scale s (with transformers' optional mscale multiplier). */
export function yarnMscale(s: number, mscale = 1): number {
  return s <= 1 ? 1 : 0.1 * mscale * Math.log(s) + 1;
}

const memo = new Map<string, Float64Array>();

/** The inverse frequency of each of the headDim/2 rotated pairs (memoized; do not modify the result). */
export function ropeInvFreq(r: RopeSpec, headDim: number): Float64Array {
  const key = `${headDim} ${JSON.stringify(r)}`;
  const hit = memo.get(key);
  if (hit) return hit;
  const d = headDim, half = d >> 1;
  const base = new Float64Array(half);
  for (let i = 0; i < half; i++) base[i] = 1 / Math.pow(r.theta, (2 * i) / d);
  let inv: Float64Array;
  switch (r.type) {
    case 'default':
      inv = base;
      break;
    case 'linear':
      inv = base.map((f) => f / r.factor);
      break;
    case 'llama3': {
      const lowWavelen = r.originalMaxPositionEmbeddings / r.lowFreqFactor;
      const highWavelen = r.originalMaxPositionEmbeddings / r.highFreqFactor;
      inv = base.map((f) => {
        const wavelen = (2 * Math.PI) / f;
        if (wavelen < highWavelen) return f;
        if (wavelen > lowWavelen) return f / r.factor;
        const s = (r.originalMaxPositionEmbeddings / wavelen - r.lowFreqFactor) / (r.highFreqFactor - r.lowFreqFactor);
        return ((1 - s) * f) / r.factor + s * f;
      });
      break;
    }
    case 'yarn': {
      // The pair index at which a frequency turns `rotations` times over the original context.
      const correction = (rotations: number): number =>
        (d * Math.log(r.originalMaxPositionEmbeddings / (rotations * 2 * Math.PI))) / (2 * Math.log(r.theta));
      let lo = correction(r.betaFast), hi = correction(r.betaSlow);
      if (r.truncate) { lo = Math.floor(lo); hi = Math.ceil(hi); }
      lo = Math.max(lo, 0); hi = Math.min(hi, d - 1);
      if (lo === hi) hi += 0.001;
      inv = base.map((f, i) => {
        const ramp = Math.min(1, Math.max(0, (i - lo) / (hi - lo)));
        const keep = 1 - ramp; // weight of the unscaled (extrapolated) frequency
        return (f / r.factor) * (1 - keep) + f * keep;
      });
      break;
    }
  }
  memo.set(key, inv);
  return inv;
}

/** The factor that multiplies cos and sin (yarn's attention factor; 1 for the other kinds). */
export function ropeAttentionFactor(r: RopeSpec): number {
  return r.type === 'yarn' ? r.attentionFactor : 1;
}

/** `theta 1000000 rope default` / `theta 500000 rope llama3 factor 32 low_freq_factor 1 ...`. */
export function describeRope(r: RopeSpec): string {
  const head = `theta ${r.theta} rope ${r.type}`;
  switch (r.type) {
    case 'default': return head;
    case 'linear': return `${head} factor ${r.factor}`;
    case 'llama3':
      return `${head} factor ${r.factor} low_freq_factor ${r.lowFreqFactor} high_freq_factor ${r.highFreqFactor} ` +
        `original_max_position_embeddings ${r.originalMaxPositionEmbeddings}`;
    case 'yarn':
      return `${head} factor ${r.factor} original_max_position_embeddings ${r.originalMaxPositionEmbeddings} ` +
        `beta_fast ${r.betaFast} beta_slow ${r.betaSlow} attention_factor ${Number(r.attentionFactor.toPrecision(6))}` +
        `${r.truncate ? '' : ' truncate no'}`;
  }
}
