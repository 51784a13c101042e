/**
 * Shared types of the CPU kernels: every kernel is generic over the float element type of the backend
 * (float32 normally, float64 in the reference mode used by finite-difference tests).
 */
export type FArr = Float32Array | Float64Array;
