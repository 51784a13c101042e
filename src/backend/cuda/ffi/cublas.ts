/**
 * cuBLAS bindings (koffi): handle, math mode, workspace, SGEMM (f32 operands) and GemmEx (bf16 operands: A/B
 * CUDA_R_16BF, C CUDA_R_16BF or CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), column-major (the backend maps
 * row-major). Pointer mode is host: alpha/beta are passed as host floats (the compute type is 32F). The workspace is preallocated by the backend so
 * no GEMM allocates (needed for a later CUDA-graph capture).
 */
import koffi from 'koffi';
import { CUBLAS_STATUS, CudaError, hintFor } from './status.js';
import type { FoundLib } from './libfind.js';

type Fn = ReturnType<ReturnType<typeof koffi.load>['func']>;

export const CUBLAS_OP_N = 0;
export const CUBLAS_OP_T = 1;
export const CUBLAS_DEFAULT_MATH = 0;
export const CUBLAS_TF32_TENSOR_OP_MATH = 3;
/** cudaDataType_t values (library_types.h). */
export const CUDA_R_32F = 0;
export const CUDA_R_16BF = 14;
/** cublasComputeType_t: float32 accumulation (and alpha/beta as float). */
export const CUBLAS_COMPUTE_32F = 68;
/** cublasGemmAlgo_t: let cuBLAS choose (tensor cores for bf16 operands). */
export const CUBLAS_GEMM_DEFAULT = -1;

export class Cublas {
  private readonly f: Record<string, Fn>;
  private handle: unknown = null;
  private readonly one = new Float32Array([1]);
  private readonly zero = new Float32Array([0]);

  constructor(found: FoundLib) {
    const l = found.lib;
    this.f = {
      create: l.func('int cublasCreate_v2(_Out_ void **handle)'),
      destroy: l.func('int cublasDestroy_v2(void *handle)'),
      setMathMode: l.func('int cublasSetMathMode(void *handle, int mode)'),
      setStream: l.func('int cublasSetStream_v2(void *handle, void *stream)'),
      setWorkspace: l.func('int cublasSetWorkspace_v2(void *handle, uint64_t workspace, size_t bytes)'),
      sgemm: l.func('int cublasSgemm_v2(void *handle, int transa, int transb, int m, int n, int k, const float *alpha, uint64_t A, int lda, uint64_t B, int ldb, const float *beta, uint64_t C, int ldc)'),
      gemmEx: l.func('int cublasGemmEx(void *handle, int transa, int transb, int m, int n, int k, const float *alpha, uint64_t A, int Atype, int lda, uint64_t B, int Btype, int ldb, const float *beta, uint64_t C, int Ctype, int ldc, int computeType, int algo)'),
    };
    const h: unknown[] = [null];
    this.check(this.f.create!(h), 'cublasCreate', 'creating the cuBLAS handle');
    this.handle = h[0];
  }

  check(rc: number, call: string, context: string): void {
    if (rc === 0) return;
    const name = CUBLAS_STATUS[rc] ?? `CUBLAS_STATUS_${rc}`;
    throw new CudaError(rc, name, call, context, hintFor(name));
  }

  setMathMode(tf32: boolean): void {
    this.check(this.f.setMathMode!(this.handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH), 'cublasSetMathMode', 'configuring cuBLAS');
  }
  /** Orders cuBLAS's work on `stream` (call before setWorkspace: setting the stream resets the workspace). */
  setStream(stream: unknown): void {
    this.check(this.f.setStream!(this.handle, stream), 'cublasSetStream', 'giving cuBLAS the backend\'s stream');
  }
  setWorkspace(ptr: bigint, bytes: number): void {
    this.check(this.f.setWorkspace!(this.handle, ptr, bytes), 'cublasSetWorkspace', 'giving cuBLAS its workspace');
  }

  /** C(m×n) = op(A)·op(B) + (accumulate ? C : 0), column-major. */
  sgemm(transA: number, transB: number, m: number, n: number, k: number, A: bigint, lda: number, B: bigint, ldb: number,
    C: bigint, ldc: number, accumulate: boolean, context: string): void {
    this.check(
      this.f.sgemm!(this.handle, transA, transB, m, n, k, this.one, A, lda, B, ldb, accumulate ? this.one : this.zero, C, ldc),
      `cublasSgemm(${m}x${n}x${k})`, context,
    );
  }

  /**
   * C(m×n) = op(A)·op(B) + (accumulate ? C : 0), column-major, with typed operands (cudaDataType_t: CUDA_R_16BF,
   * CUDA_R_32F), float32 compute (CUBLAS_COMPUTE_32F) and the default algorithm: bf16 A/B run on tensor cores, C is
   * read (accumulate) and written in its own type, rounded once.
   */
  gemmEx(transA: number, transB: number, m: number, n: number, k: number, A: bigint, aType: number, lda: number,
    B: bigint, bType: number, ldb: number, C: bigint, cType: number, ldc: number, accumulate: boolean, context: string): void {
    this.check(
      this.f.gemmEx!(this.handle, transA, transB, m, n, k, this.one, A, aType, lda, B, bType, ldb, accumulate ? this.one : this.zero,
        C, cType, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      `cublasGemmEx(${m}x${n}x${k}, types ${aType}/${bType}→${cType})`, context,
    );
  }

  /** Destroys the handle (once); a failure is thrown by name. */
  destroy(): void {
    if (this.handle === null) return;
    const h = this.handle;
    this.handle = null;
    this.check(this.f.destroy!(h), 'cublasDestroy', 'destroying the cuBLAS handle');
  }
}
