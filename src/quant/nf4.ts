/**
 * NF4 ("4-bit NormalFloat", Dettmers et al., QLoRA, 2023): frozen weights stored as 4-bit codes in blocks of
 * consecutive elements, each block scaled by its absolute maximum.
 *
 *   code book   16 levels in [−1, 1]: 0; eight positive levels Φ⁻¹(p) for the 9 values of p evenly spaced from δ down
 *               to 0.5, 0.5 left out; seven negative levels −Φ⁻¹(p) for the 8 values evenly spaced from δ to 0.5, 0.5
 *               left out; all divided by Φ⁻¹(δ), so the extremes are ±1 — an asymmetric book with an exact zero.
 *               δ = 1 − ½(1/32 + 1/30) = 0.9677083 (QLoRA's offset). NF4_LEVELS holds the levels as float32 (the
 *               format's constants); test/quant/nf4.test.ts rebuilds them from this definition in float64.
 *   block       `blockSize` consecutive elements of the flattened tensor (64 by default, QLoRA's) share one float32
 *               scale: their absolute maximum (a block of zeros has scale 0).
 *   code        the index of the level nearest to x / absmax (ties to the lower index), 4 bits; two per byte, the
 *               even element in the high nibble (bitsandbytes' order).
 *   value       NF4_LEVELS[code] · absmax.
 */
import { DistilleryError } from '../util/errors.js';

export const NF4_LEVELS: Float32Array = Float32Array.of(
  -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635, -0.18477343022823334,
  -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
  0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
);

/** QLoRA's offset δ: the largest quantile the code book uses. */
export const NF4_OFFSET = 0.9677083;
export const NF4_DEFAULT_BLOCK = 64;

/** A tensor in NF4: `n` elements, codes packed two per byte, one float32 absmax per block. */
export interface Nf4Tensor {
  n: number;
  blockSize: number;
  codes: Uint8Array;
  absmax: Float32Array;
}

/** Midpoints between consecutive levels: code = the number of midpoints below x (ties to the lower level). */
const MIDS: Float64Array = Float64Array.from({ length: 15 }, (_, i) => (NF4_LEVELS[i]! + NF4_LEVELS[i + 1]!) / 2);

/** The code of a normalized value y ∈ [−1, 1]. */
export function nf4Code(y: number): number {
  let lo = 0, hi = 15; // binary search over the 15 midpoints
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (y > MIDS[mid]!) lo = mid + 1; else hi = mid;
  }
  return lo;
}

export function quantizeNf4(x: ArrayLike<number>, blockSize = NF4_DEFAULT_BLOCK): Nf4Tensor {
  checkNf4BlockSize(blockSize);
  const n = x.length, blocks = Math.ceil(n / blockSize);
  const t = { n, blockSize, codes: new Uint8Array(Math.ceil(n / 2)), absmax: new Float32Array(blocks) };
  quantizeNf4Blocks(x, t, 0, blocks);
  return t;
}

export function checkNf4BlockSize(blockSize: number): void {
  if (!(Number.isInteger(blockSize) && blockSize >= 2 && blockSize % 2 === 0)) {
    throw new DistilleryError(`an NF4 block holds an even number of elements (2 or more), not ${blockSize}`);
  }
}

/**
 * Quantizes blocks [b0, b1) of x into t's codes and scales (zeroed codes expected). Blocks hold an even number of
 * elements, so each owns whole code bytes: ranges of blocks can be quantized by different threads.
 */
export function quantizeNf4Blocks(x: ArrayLike<number>, t: Nf4Tensor, b0: number, b1: number): void {
  const { n, blockSize, codes, absmax } = t;
  for (let b = b0; b < b1; b++) {
    const i0 = b * blockSize, i1 = Math.min(n, i0 + blockSize);
    let m = 0;
    for (let i = i0; i < i1; i++) {
      const v = x[i]!;
      if (!Number.isFinite(v)) throw new DistilleryError(`cannot quantize a non-finite weight (${v} at element ${i}) to NF4`);
      m = Math.max(m, Math.abs(v));
    }
    const scale = Math.fround(m);
    absmax[b] = scale;
    for (let i = i0; i < i1; i++) {
      const c = scale === 0 ? 7 : nf4Code(x[i]! / scale);
      codes[i >> 1]! |= (i & 1) === 0 ? c << 4 : c;
    }
  }
}

/** The element values of an NF4 tensor (float32 products of level and scale). */
export function dequantizeNf4(t: Nf4Tensor, out: Float32Array = new Float32Array(t.n)): Float32Array {
  if (out.length < t.n) throw new RangeError(`dequantizeNf4: ${out.length} outputs for ${t.n} elements`);
  for (let i = 0; i < t.n; i++) {
    const byte = t.codes[i >> 1]!, c = (i & 1) === 0 ? byte >> 4 : byte & 15;
    out[i] = Math.fround(NF4_LEVELS[c]! * t.absmax[Math.floor(i / t.blockSize)]!);
  }
  return out;
}

/** Bytes an NF4 tensor of n elements takes: half a byte per element and four per block. */
export function nf4Bytes(n: number, blockSize = NF4_DEFAULT_BLOCK): number {
  return Math.ceil(n / 2) + 4 * Math.ceil(n / blockSize);
}

/** int32 words of an NF4 tensor's codes (little-endian: byte j of word w is codes[4w + j]), zero-padded to a whole word. */
export function nf4Words(t: Nf4Tensor): Int32Array {
  const words = new Int32Array(nf4WordCount(t.n));
  new Uint8Array(words.buffer).set(t.codes);
  return words;
}

/** int32 words that hold the codes of n elements (8 per word). */
export function nf4WordCount(n: number): number {
  return Math.ceil(n / 8);
}
