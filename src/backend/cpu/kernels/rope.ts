/**
 * Rotary position embedding kernels (rotate-half / NeoX layout as in HF Llama and Qwen2) over [B, T, heads, hd].
 * For i < hd/2: angle = (pos0 + t) · inv[i] with inv = ropeInvFreq(rope, hd), computed in float64, and
 * c = A·cos(angle), s = A·sin(angle) with A = ropeAttentionFactor(rope);
 * out[i] = x[i] c − x[i+hd/2] s, out[i+hd/2] = x[i+hd/2] c + x[i] s. out may alias inp.
 */
import { ropeAttentionFactor, ropeInvFreq, type RopeSpec } from '../../rope.js';
import type { FArr } from './types.js';

/** cos and sin tables [t, hd/2] for positions pos0..pos0+t-1 (already scaled by the attention factor). */
function tables(t: number, hd: number, rope: RopeSpec, pos0: number): { cos: Float64Array; sin: Float64Array } {
  const half = hd >> 1;
  const inv = ropeInvFreq(rope, hd), scale = ropeAttentionFactor(rope);
  const cos = new Float64Array(t * half), sin = new Float64Array(t * half);
  for (let i = 0; i < half; i++) {
    const freq = inv[i]!;
    for (let p = 0; p < t; p++) {
      const a = (pos0 + p) * freq;
      cos[p * half + i] = scale * Math.cos(a);
      sin[p * half + i] = scale * Math.sin(a);
    }
  }
  return { cos, sin };
}

/**
 * Rotates each (x[i], x[i + hd/2]) pair of token rows [r0, r1) of the b·t rows (row r: sequence ⌊r / t⌋, position
 * pos0 + r mod t, or rowPos[r] with document positions (pos0 then 0; every rowPos[r] ≤ r mod t)) by angle·sign: sign +1 is the forward rotation R, sign −1 its transpose Rᵀ (the backward; the
 * attention factor scales both). With accumulate the result is added to out. out may alias inp with equal strides
 * (each pair is read first). Token rows of out and inp start `so` and `si` elements apart. Each row is computed from
 * its own inputs only, so any split of the rows gives the same bits (the CPU backend's worker pool runs the backward
 * and long forwards that way).
 */
export function rotateRows(
  out: FArr, inp: FArr, t: number, heads: number, hd: number, rope: RopeSpec, pos0: number, sign: 1 | -1,
  accumulate: boolean, what: string, bias: FArr | null, so: number, si: number, r0: number, r1: number, rowPos: Int32Array | null = null,
): void {
  if (hd % 2 !== 0) throw new RangeError(`${what}: head dim ${hd} must be even`);
  const half = hd >> 1;
  const { cos, sin } = tables(t, hd, rope, pos0);
  for (let r = r0; r < r1; r++) {
    const tb = (rowPos === null ? r % t : rowPos[r]!) * half;
    for (let h = 0; h < heads; h++) {
      const o = r * so + h * hd, e = r * si + h * hd;
      for (let i = 0; i < half; i++) {
        const x0 = inp[e + i] + (bias ? bias[h * hd + i] : 0), x1 = inp[e + i + half] + (bias ? bias[h * hd + i + half] : 0);
        const c = cos[tb + i], s = sign * sin[tb + i];
        const y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
        if (accumulate) { out[o + i] += y0; out[o + i + half] += y1; } else { out[o + i] = y0; out[o + i + half] = y1; }
      }
    }
  }
}

/** out = R(inp + bias) over b sequences of t rows: `bias` [heads · hd] (or null) added to every row before the rotation. Row strides so, si. */
export function ropeForward(
  out: FArr, inp: FArr, b: number, t: number, heads: number, hd: number, rope: RopeSpec, pos0: number, bias: FArr | null = null,
  so = heads * hd, si = heads * hd,
): void {
  rotateRows(out, inp, t, heads, hd, rope, pos0, 1, false, 'ropeForward', bias, so, si, 0, b * t);
}
