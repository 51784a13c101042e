/**
 * Rotary position embedding kernels (rotate-half / NeoX layout as in HF Llama and Qwen2) over [B, T, heads, hd].
 * For i < hd/2: angle = (pos0 + t) · theta^(-2i/hd), computed in float64;
 * out[i] = x[i] cos − x[i+hd/2] sin, out[i+hd/2] = x[i+hd/2] cos + x[i] sin. out may alias inp.
 */
import type { FArr } from './types.js';

/** cos and sin tables [t, hd/2] for positions pos0..pos0+t-1. */
function tables(t: number, hd: number, theta: number, pos0: number): { cos: Float64Array; sin: Float64Array } {
  const half = hd >> 1;
  const cos = new Float64Array(t * half), sin = new Float64Array(t * half);
  for (let i = 0; i < half; i++) {
    const freq = Math.pow(theta, -2 * i / hd);
    for (let p = 0; p < t; p++) {
      const a = (pos0 + p) * freq;
      cos[p * half + i] = Math.cos(a);
      sin[p * half + i] = Math.sin(a);
    }
  }
  return { cos, sin };
}

export function ropeForward(
  out: FArr, inp: FArr, b: number, t: number, heads: number, hd: number, theta: number, pos0: number,
): void {
  if (hd % 2 !== 0) throw new RangeError(`ropeForward: head dim ${hd} must be even`);
  const half = hd >> 1;
  const { cos, sin } = tables(t, hd, theta, pos0);
  for (let bi = 0; bi < b; bi++) {
    for (let p = 0; p < t; p++) {
      const tb = p * half;
      for (let h = 0; h < heads; h++) {
        const o = ((bi * t + p) * heads + h) * hd;
        for (let i = 0; i < half; i++) {
          const x0 = inp[o + i], x1 = inp[o + i + half];
          const c = cos[tb + i], s = sin[tb + i];
          out[o + i] = x0 * c - x1 * s;
          out[o + i + half] = x1 * c + x0 * s;
        }
      }
    }
  }
}

/** dinp += Rᵀ dout. */
export function ropeBackward(
  dinp: FArr, dout: FArr, b: number, t: number, heads: number, hd: number, theta: number, pos0: number,
): void {
  if (hd % 2 !== 0) throw new RangeError(`ropeBackward: head dim ${hd} must be even`);
  const half = hd >> 1;
  const { cos, sin } = tables(t, hd, theta, pos0);
  for (let bi = 0; bi < b; bi++) {
    for (let p = 0; p < t; p++) {
      const tb = p * half;
      for (let h = 0; h < heads; h++) {
        const o = ((bi * t + p) * heads + h) * hd;
        for (let i = 0; i < half; i++) {
          const d0 = dout[o + i], d1 = dout[o + i + half];
          const c = cos[tb + i], s = sin[tb + i];
          dinp[o + i] += d0 * c + d1 * s;
          dinp[o + i + half] += d1 * c - d0 * s;
        }
      }
    }
  }
}
