/**
 * Elementwise and small row-wise kernels of the CPU backend: add/accumulate/scale, sum of squares, embedding
 * lookup, RMSNorm, SwiGLU and AdamW. All are single-pass loops. The backend runs SwiGLU and AdamW over element
 * ranges on its worker threads when they are large (an element's result does not depend on the range).
 */
import type { AdamWStep } from '../../backend.js';
import type { FArr } from './types.js';

export function add(out: FArr, a: FArr, b: FArr, n: number): void {
  for (let i = 0; i < n; i++) out[i] = a[i] + b[i];
}

export function accumulate(dst: FArr, src: FArr, n: number): void {
  for (let i = 0; i < n; i++) dst[i] += src[i];
}

export function scale(buf: FArr, s: number, n: number): void {
  for (let i = 0; i < n; i++) buf[i] *= s;
}

/** Σ buf[i]² over the first n elements, accumulated in float64 (JS numbers) with 4 partial sums. */
export function sumSquares(buf: FArr, n: number): number {
  let s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  let i = 0;
  for (; i + 4 <= n; i += 4) {
    const a = buf[i], b = buf[i + 1], c = buf[i + 2], d = buf[i + 3];
    s0 += a * a; s1 += b * b; s2 += c * c; s3 += d * d;
  }
  for (; i < n; i++) s0 += buf[i] * buf[i];
  return (s0 + s1) + (s2 + s3);
}

/** out[i, :] = table[ids[i], :]. ids are checked against the table size (vocab = table.length / c). */
export function embeddingForward(out: FArr, ids: Int32Array, table: FArr, n: number, c: number): void {
  const vocab = Math.floor(table.length / c);
  for (let i = 0; i < n; i++) {
    const id = ids[i];
    if (id < 0 || id >= vocab) throw new RangeError(`embeddingForward: token id ${id} at row ${i} outside [0, ${vocab})`);
    out.set(table.subarray(id * c, id * c + c), i * c);
  }
}

/** dtable[ids[i], :] += dout[i, :]. */
export function embeddingBackward(dtable: FArr, dout: FArr, ids: Int32Array, n: number, c: number): void {
  const vocab = Math.floor(dtable.length / c);
  for (let i = 0; i < n; i++) {
    const id = ids[i];
    if (id < 0 || id >= vocab) throw new RangeError(`embeddingBackward: token id ${id} at row ${i} outside [0, ${vocab})`);
    const d = id * c, s = i * c;
    for (let j = 0; j < c; j++) dtable[d + j] += dout[s + j];
  }
}

/** out = x · rstd · w per row, rstd = 1/sqrt(mean(x²) + eps) saved per row. */
export function rmsnormForward(out: FArr, rstd: FArr, inp: FArr, weight: FArr, n: number, c: number, eps: number): void {
  for (let i = 0; i < n; i++) {
    const o = i * c;
    let ss = 0;
    for (let j = 0; j < c; j++) { const x = inp[o + j]; ss += x * x; }
    const r = 1 / Math.sqrt(ss / c + eps);
    rstd[i] = r;
    for (let j = 0; j < c; j++) out[o + j] = inp[o + j] * r * weight[j];
  }
}

/**
 * With y_j = x_j r w_j and r = (mean(x²) + eps)^(-1/2):
 * dw_j += Σ_rows dy_j x_j r;  dx_j += r w_j dy_j − x_j r³ (1/c) Σ_l dy_l w_l x_l.
 * Uses the saved rstd (float64 math on it, whatever the buffer type).
 */
export function rmsnormBackward(
  dinp: FArr, dweight: FArr, dout: FArr, inp: FArr, weight: FArr, rstd: FArr, n: number, c: number,
): void {
  for (let i = 0; i < n; i++) {
    const o = i * c;
    const r = rstd[i];
    let dot = 0;
    for (let j = 0; j < c; j++) dot += dout[o + j] * weight[j] * inp[o + j];
    const k = dot * r * r * r / c;
    for (let j = 0; j < c; j++) {
      const x = inp[o + j], dy = dout[o + j];
      dweight[j] += dy * x * r;
      dinp[o + j] += r * weight[j] * dy - x * k;
    }
  }
}

/** out = gate · sigmoid(gate) · up. */
export function swigluForward(out: FArr, gate: FArr, up: FArr, n: number): void {
  for (let i = 0; i < n; i++) {
    const g = gate[i];
    out[i] = g / (1 + Math.exp(-g)) * up[i];
  }
}

/** dgate += dout · up · s(1 + g(1 − s)); dup += dout · g s, with s = sigmoid(g). */
export function swigluBackward(dgate: FArr, dup: FArr, dout: FArr, gate: FArr, up: FArr, n: number): void {
  for (let i = 0; i < n; i++) {
    const g = gate[i], s = 1 / (1 + Math.exp(-g)), d = dout[i];
    dgate[i] += d * up[i] * s * (1 + g * (1 - s));
    dup[i] += d * g * s;
  }
}

/** swigluForward over rows [r0, r1) of a joined gate/up [rows, 2·cols] (each row its gate half, then its up half). */
export function swigluForwardRows(out: FArr, gu: FArr, r0: number, r1: number, cols: number): void {
  for (let r = r0; r < r1; r++) {
    swigluForward(out.subarray(r * cols, (r + 1) * cols), gu.subarray(2 * r * cols, (2 * r + 1) * cols),
      gu.subarray((2 * r + 1) * cols, (2 * r + 2) * cols), cols);
  }
}

/** swigluBackward over rows [r0, r1), overwriting their dgate/dup halves of dgu (zeroed, then added to: 0 + x is exact). */
export function swigluBackwardRows(dgu: FArr, dout: FArr, gu: FArr, r0: number, r1: number, cols: number): void {
  dgu.subarray(2 * r0 * cols, 2 * r1 * cols).fill(0);
  for (let r = r0; r < r1; r++) {
    const a = 2 * r * cols, b = (2 * r + 1) * cols, e = (2 * r + 2) * cols;
    swigluBackward(dgu.subarray(a, b), dgu.subarray(b, e), dout.subarray(r * cols, (r + 1) * cols), gu.subarray(a, b), gu.subarray(b, e), cols);
  }
}

/**
 * AdamW as torch.optim.AdamW: p *= 1 − lr·wd; m = b1 m + (1−b1) g; v = b2 v + (1−b2) g²;
 * p −= lr · m̂ / (sqrt(v̂) + eps) with m̂ = m / (1 − b1^step), v̂ = v / (1 − b2^step); g = grad · gradScale.
 */
export function adamw(param: FArr, grad: FArr, m: FArr, v: FArr, n: number, s: AdamWStep): void {
  const { lr, beta1: b1, beta2: b2, eps, weightDecay: wd, step, gradScale } = s;
  const bc1 = 1 - Math.pow(b1, step), bc2 = 1 - Math.pow(b2, step);
  const decay = 1 - lr * wd;
  for (let i = 0; i < n; i++) {
    const g = grad[i] * gradScale;
    const mi = b1 * m[i] + (1 - b1) * g;
    const vi = b2 * v[i] + (1 - b2) * g * g;
    m[i] = mi; v[i] = vi;
    param[i] = param[i] * decay - lr * (mi / bc1) / (Math.sqrt(vi / bc2) + eps);
  }
}
