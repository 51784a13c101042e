/**
 * Return-code checking for CUDA driver, NVRTC and cuBLAS calls: every code is reported by NAME with the call,
 * its context and, where there is one, a fix. E.g.
 *   CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc(1.2 GiB) while allocating activations; lower --batch or --seq
 */
import { DistilleryError } from '../../../util/errors.js';

export class CudaError extends DistilleryError {
  constructor(readonly code: number, readonly codeName: string, readonly call: string, context: string, hint?: string) {
    // The hint is part of the one-line message (the CLI prints hints separately; no need to repeat it).
    super(`${codeName} in ${call}${context ? ` while ${context}` : ''}${hint ? `; ${hint}` : ''}`);
    this.name = 'CudaError';
  }
}

export const CUBLAS_STATUS: Readonly<Record<number, string>> = {
  0: 'CUBLAS_STATUS_SUCCESS', 1: 'CUBLAS_STATUS_NOT_INITIALIZED', 3: 'CUBLAS_STATUS_ALLOC_FAILED',
  7: 'CUBLAS_STATUS_INVALID_VALUE', 8: 'CUBLAS_STATUS_ARCH_MISMATCH', 11: 'CUBLAS_STATUS_MAPPING_ERROR',
  13: 'CUBLAS_STATUS_EXECUTION_FAILED', 14: 'CUBLAS_STATUS_INTERNAL_ERROR', 15: 'CUBLAS_STATUS_NOT_SUPPORTED',
  16: 'CUBLAS_STATUS_LICENSE_ERROR',
};

/** A few driver codes by number, for when cuGetErrorName itself is unavailable. */
export const CUDA_ERROR_FALLBACK: Readonly<Record<number, string>> = {
  1: 'CUDA_ERROR_INVALID_VALUE', 2: 'CUDA_ERROR_OUT_OF_MEMORY', 3: 'CUDA_ERROR_NOT_INITIALIZED',
  100: 'CUDA_ERROR_NO_DEVICE', 101: 'CUDA_ERROR_INVALID_DEVICE', 200: 'CUDA_ERROR_INVALID_IMAGE',
  209: 'CUDA_ERROR_NO_BINARY_FOR_GPU', 218: 'CUDA_ERROR_INVALID_PTX', 222: 'CUDA_ERROR_UNSUPPORTED_PTX_VERSION',
  500: 'CUDA_ERROR_NOT_FOUND', 700: 'CUDA_ERROR_ILLEGAL_ADDRESS', 701: 'CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES',
  702: 'CUDA_ERROR_LAUNCH_TIMEOUT', 719: 'CUDA_ERROR_LAUNCH_FAILED', 999: 'CUDA_ERROR_UNKNOWN',
};

/** Human size for messages: 1.2 GiB, 512 MiB, 64 KiB. */
export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n, u = 0;
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
  return `${u === 0 ? v : v.toFixed(1)} ${units[u]}`;
}

/** The hint for well-known failure codes. */
export function hintFor(codeName: string): string | undefined {
  if (codeName.includes('OUT_OF_MEMORY') || codeName === 'CUBLAS_STATUS_ALLOC_FAILED') return 'lower --batch or --seq';
  if (codeName === 'CUDA_ERROR_NO_DEVICE') return 'no CUDA GPU is visible; run with --device cpu or check CUDA_VISIBLE_DEVICES';
  if (codeName === 'CUDA_ERROR_NO_BINARY_FOR_GPU' || codeName === 'CUDA_ERROR_UNSUPPORTED_PTX_VERSION') {
    return 'the cached kernel does not match this GPU or driver; delete the kernel cache folder';
  }
  return undefined;
}
