/**
 * bfloat16 on the host: rounding float32 to bf16 (round to nearest even, as PTX cvt.rn.bf16.f32 does on the GPU),
 * and packing / unpacking bf16 bit patterns. The CPU backend emulates bf16 buffers with these (float arrays holding
 * bf16-representable values); the CUDA backend uses them to upload to and download from bf16 device buffers.
 */
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The bf16 bit pattern of the float32 with bits u: round to nearest even; NaN stays a quiet NaN, ±Inf and overflow give ±Inf. */
function bf16OfBits(u: number): number {
  if ((u & 0x7fffffff) > 0x7f800000) return ((u >>> 16) | 0x40) & 0xffff;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

/** The bf16 bit pattern of x (rounded to nearest even; NaN stays a quiet NaN, ±Inf and overflow give ±Inf). */
export function toBf16Bits(x: number): number {
  f32[0] = x;
  return bf16OfBits(u32[0]!);
}

/** The float value of a bf16 bit pattern (exact). */
export function fromBf16Bits(h: number): number {
  u32[0] = (h & 0xffff) << 16;
  return f32[0]!;
}

/** x rounded to the nearest bf16 value (as a number). */
export function roundBf16(x: number): number { return fromBf16Bits(toBf16Bits(x)); }

/** Rounds a[i0, i1) to bf16 in place (a Float32Array fast path works on the bits; Float64Array per element). */
export function roundBf16InPlace(a: Float32Array | Float64Array, i0 = 0, i1 = a.length): void {
  if (a instanceof Float32Array) {
    const u = new Uint32Array(a.buffer, a.byteOffset, a.length);
    for (let i = i0; i < i1; i++) u[i] = bf16OfBits(u[i]!) << 16;
    return;
  }
  for (let i = i0; i < i1; i++) a[i] = roundBf16(a[i]!);
}

/** bf16 bit patterns of src (for an upload into a bf16 device buffer). */
export function packBf16(src: ArrayLike<number>): Uint16Array {
  const out = new Uint16Array(src.length);
  if (src instanceof Float32Array) {
    const u = new Uint32Array(src.buffer, src.byteOffset, src.length);
    for (let i = 0; i < src.length; i++) out[i] = bf16OfBits(u[i]!);
    return out;
  }
  for (let i = 0; i < src.length; i++) out[i] = toBf16Bits(src[i]!);
  return out;
}

/** Float32 values of bf16 bit patterns (for a download from a bf16 device buffer), in `into` when given (h.length floats of it). */
export function unpackBf16(h: Uint16Array, into?: Float32Array): Float32Array {
  const out = into ?? new Float32Array(h.length);
  const u = new Uint32Array(out.buffer, out.byteOffset, h.length);
  for (let i = 0; i < h.length; i++) u[i] = h[i]! << 16;
  return out;
}
