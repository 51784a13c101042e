/**
 * Dense matrix-product kernels of the CPU backend.
 *
 * The one hot kernel is gemmNT: out[i, j] (+)= Σ_k A[i, k] · B[j, k], i.e. a product with the second operand
 * transposed, which is what a linear layer's forward pass is (y = x · Wᵀ with W in the HF [out, in] layout).
 * Both operands are then read row-contiguously along k. The backward products are reduced to the same kernel by
 * transposing one or two operands first (O(n·k + n·m) work against O(n·m·k) for the product):
 *   dinp    += dout · W      = gemmNT(dout, Wᵀ)         (Wᵀ is [k, m])
 *   dweight += doutᵀ · inp   = gemmNT(doutᵀ, inpᵀ)      ([m, n] and [k, n])
 *
 * Loop structure: B is walked in column blocks (rows of B) sized to stay in L2; inside a block, 4 rows of A
 * against 2 rows of B form a 4×2 register tile (8 independent accumulators, 6 loads per 8 multiply-adds), which
 * keeps V8's double registers busy without spilling. Row and column ranges let the caller split the product
 * among worker threads (see ../pool.ts).
 */
import type { FArr } from './types.js';

/** Bytes of B rows kept hot per column block (a typical per-core L2 share). */
const BLOCK_BYTES = 128 * 1024;

/**
 * out[i*ldo + j] (+)= bias[j] + Σ_{k<K} A[i*K + k] · B[j*K + k], for i in [i0, i1), j in [j0, j1).
 * With accumulate the previous value of out is added; bias may be null.
 */
export function gemmNT(
  out: FArr, A: FArr, B: FArr, bias: FArr | null, K: number, ldo: number,
  i0: number, i1: number, j0: number, j1: number, accumulate: boolean,
): void {
  const jBlock = Math.max(8, Math.floor(BLOCK_BYTES / Math.max(1, K * B.BYTES_PER_ELEMENT)));
  for (let jb = j0; jb < j1; jb += jBlock) {
    const je = Math.min(jb + jBlock, j1);
    let i = i0;
    for (; i + 4 <= i1; i += 4) {
      const a0 = i * K, a1 = a0 + K, a2 = a1 + K, a3 = a2 + K;
      const o0 = i * ldo, o1 = o0 + ldo, o2 = o1 + ldo, o3 = o2 + ldo;
      let j = jb;
      for (; j + 2 <= je; j += 2) {
        const b0 = j * K, b1 = b0 + K;
        let s00 = 0, s01 = 0, s10 = 0, s11 = 0, s20 = 0, s21 = 0, s30 = 0, s31 = 0;
        for (let k = 0; k < K; k++) {
          const y0 = B[b0 + k], y1 = B[b1 + k];
          const x0 = A[a0 + k], x1 = A[a1 + k], x2 = A[a2 + k], x3 = A[a3 + k];
          s00 += x0 * y0; s01 += x0 * y1;
          s10 += x1 * y0; s11 += x1 * y1;
          s20 += x2 * y0; s21 += x2 * y1;
          s30 += x3 * y0; s31 += x3 * y1;
        }
        if (bias !== null) {
          const c0 = bias[j], c1 = bias[j + 1];
          s00 += c0; s10 += c0; s20 += c0; s30 += c0;
          s01 += c1; s11 += c1; s21 += c1; s31 += c1;
        }
        if (accumulate) {
          out[o0 + j] += s00; out[o0 + j + 1] += s01;
          out[o1 + j] += s10; out[o1 + j + 1] += s11;
          out[o2 + j] += s20; out[o2 + j + 1] += s21;
          out[o3 + j] += s30; out[o3 + j + 1] += s31;
        } else {
          out[o0 + j] = s00; out[o0 + j + 1] = s01;
          out[o1 + j] = s10; out[o1 + j + 1] = s11;
          out[o2 + j] = s20; out[o2 + j + 1] = s21;
          out[o3 + j] = s30; out[o3 + j + 1] = s31;
        }
      }
      for (; j < je; j++) {
        const b0 = j * K;
        let s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (let k = 0; k < K; k++) {
          const y = B[b0 + k];
          s0 += A[a0 + k] * y; s1 += A[a1 + k] * y; s2 += A[a2 + k] * y; s3 += A[a3 + k] * y;
        }
        if (bias !== null) { const c = bias[j]; s0 += c; s1 += c; s2 += c; s3 += c; }
        if (accumulate) {
          out[o0 + j] += s0; out[o1 + j] += s1; out[o2 + j] += s2; out[o3 + j] += s3;
        } else {
          out[o0 + j] = s0; out[o1 + j] = s1; out[o2 + j] = s2; out[o3 + j] = s3;
        }
      }
    }
    for (; i < i1; i++) {
      const a0 = i * K, o0 = i * ldo;
      for (let j = jb; j < je; j++) {
        const b0 = j * K;
        let s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        let k = 0;
        for (; k + 4 <= K; k += 4) {
          s0 += A[a0 + k] * B[b0 + k];
          s1 += A[a0 + k + 1] * B[b0 + k + 1];
          s2 += A[a0 + k + 2] * B[b0 + k + 2];
          s3 += A[a0 + k + 3] * B[b0 + k + 3];
        }
        for (; k < K; k++) s0 += A[a0 + k] * B[b0 + k];
        let s = (s0 + s1) + (s2 + s3);
        if (bias !== null) s += bias[j];
        if (accumulate) out[o0 + j] += s; else out[o0 + j] = s;
      }
    }
  }
}

/** dst[c, r] = src[r, c] for src [rows, cols] (blocked for cache reuse). dst must not alias src. */
export function transpose(dst: FArr, src: FArr, rows: number, cols: number): void {
  const T = 32;
  for (let r0 = 0; r0 < rows; r0 += T) {
    const r1 = Math.min(r0 + T, rows);
    for (let c0 = 0; c0 < cols; c0 += T) {
      const c1 = Math.min(c0 + T, cols);
      for (let r = r0; r < r1; r++) {
        const s = r * cols;
        for (let c = c0; c < c1; c++) dst[c * rows + r] = src[s + c];
      }
    }
  }
}

/** dbias[j] += Σ_i dout[i, j] for dout [n, m]. */
export function biasBackward(dbias: FArr, dout: FArr, n: number, m: number): void {
  for (let i = 0; i < n; i++) {
    const o = i * m;
    for (let j = 0; j < m; j++) dbias[j] += dout[o + j];
  }
}

/**
 * out[i, c] += Σ_{j<J} A[i*J + j] · B[j*C + c] for i in [i0, i1): a product without transposes, in axpy form
 * (each output row is updated with 4 rows of B at a time). Slower per flop than gemmNT, but it streams B
 * as it is, so the backward pass uses it when the row count is too small to pay for transposing an operand.
 */
export function gemmNNAcc(out: FArr, A: FArr, B: FArr, J: number, C: number, i0: number, i1: number): void {
  for (let i = i0; i < i1; i++) {
    const ao = i * J, oo = i * C;
    let j = 0;
    for (; j + 4 <= J; j += 4) {
      const x0 = A[ao + j], x1 = A[ao + j + 1], x2 = A[ao + j + 2], x3 = A[ao + j + 3];
      const b0 = j * C, b1 = b0 + C, b2 = b1 + C, b3 = b2 + C;
      for (let c = 0; c < C; c++) out[oo + c] += x0 * B[b0 + c] + x1 * B[b1 + c] + x2 * B[b2 + c] + x3 * B[b3 + c];
    }
    for (; j < J; j++) {
      const x = A[ao + j], b0 = j * C;
      for (let c = 0; c < C; c++) out[oo + c] += x * B[b0 + c];
    }
  }
}
