/**
 * The CUDA backend's entry point (loaded lazily by src/backend/create.ts for `--device cuda`).
 *
 * createCudaBackend() opens libcuda, NVRTC and cuBLAS (a clear DistilleryError suggesting --device cpu when any is
 * missing), creates the kernel cache for this GPU's arch and returns a device-mode CudaBackend. Pre-warm with
 * `prewarm(backend, runs)`: plan by tracing the closures, compile what is missing, seal.
 */
import type { Backend } from '../backend.js';
import { CudaBackend } from './cuda-backend.js';
import { attentionFor, type AttentionBackwardImpl } from './attention-plan.js';
import { Cublas } from './ffi/cublas.js';
import { CudaDriver } from './ffi/driver.js';
import { requireLibraries, systemFinderEnv, type FinderEnv } from './ffi/libfind.js';
import { Nvrtc } from './ffi/nvrtc.js';
import { KernelCache } from './kernel-cache.js';

export { CudaBackend, createTraceBackend } from './cuda-backend.js';
export { attentionFor } from './attention-plan.js';
export { KernelCache } from './kernel-cache.js';
export { planKernels } from './plan.js';
export { compileAll, representativeSpecs } from './compile-all.js';

export interface CudaBackendOptions {
  /** Print one line per kernel compile. */
  verbose?: boolean;
  /** Throw on a kernel-cache miss after pre-warm (default: NODE_ENV=test or DISTILLERY_STRICT_KERNELS=1). */
  strict?: boolean;
  /** Kernel cache folder (null: memory only). */
  cacheDir?: string | null;
  /** Allow TF32 tensor-core GEMMs (faster, ~1e-3 relative error). Default off. */
  tf32?: boolean;
  /** GPU ordinal. */
  device?: number;
  log?: (line: string) => void;
  finder?: FinderEnv;
  /** Floats of attention backward's D scratch and dK/dV partials (defaults DEFAULT_ATTN_DSUM, DEFAULT_ATTN_DKV_FLOATS; tests shrink them). */
  attnDsumFloats?: number;
  attnDkvFloats?: number;
  /** bf16 elements of the stored-dS attention backward's scratch (default DEFAULT_ATTN_DS_ELEMS; prepare() sizes it). */
  attnDsElems?: number;
  /** Floats of cached attention's split scratch (default DEFAULT_ATTN_CACHED_FLOATS; prepare() sizes it). */
  attnCachedFloats?: number;
  /** The bf16 tensor-core attention backward (AttentionBackwardImpl; default DEFAULT_ATTN_BACKWARD). */
  attnBackward?: AttentionBackwardImpl;
  /** Training attention forward on TF32 tensor cores (see DeviceParts.attention); default: 'mma' with tf32, else 'simt'. */
  attention?: 'simt' | 'mma';
  /** Replay captured regions as CUDA graphs (default on; DISTILLERY_CUDA_GRAPHS=0 turns them off). */
  graphs?: boolean;
  /** Op profile (default DISTILLERY_CUDA_PROFILE). */
  profile?: boolean;
}

export function createCudaBackend(o: CudaBackendOptions = {}): CudaBackend {
  const libs = requireLibraries(['cuda', 'nvrtc', 'cublas'], o.finder ?? systemFinderEnv);
  const log = o.log ?? ((l: string) => process.stderr.write(`${l}\n`));
  const driver = new CudaDriver(libs.cuda, o.device ?? 0);
  const nvrtc = new Nvrtc(o.finder ?? systemFinderEnv);
  const cublas = new Cublas(libs.cublas);
  const cache = new KernelCache({
    compiler: nvrtc, arch: driver.arch, log,
    ...(o.cacheDir !== undefined ? { dir: o.cacheDir } : {}),
    ...(o.strict !== undefined ? { strict: o.strict } : {}),
    ...(o.verbose !== undefined ? { verbose: o.verbose } : {}),
  });
  return new CudaBackend('device', {
    driver, cublas, cache, tf32: o.tf32 ?? false, log,
    ...(o.attnDsumFloats !== undefined ? { attnDsumFloats: o.attnDsumFloats } : {}),
    ...(o.attnDkvFloats !== undefined ? { attnDkvFloats: o.attnDkvFloats } : {}),
    ...(o.attnDsElems !== undefined ? { attnDsElems: o.attnDsElems } : {}),
    ...(o.attnCachedFloats !== undefined ? { attnCachedFloats: o.attnCachedFloats } : {}),
    ...(o.attnBackward !== undefined ? { attnBackward: o.attnBackward } : {}),
    attention: o.attention ?? attentionFor(o.tf32 ?? false),
    ...(o.graphs !== undefined ? { graphs: o.graphs } : {}),
    ...(o.profile !== undefined ? { profile: o.profile } : {}),
  });
}

/** Traces `runs`, compiles every kernel they need that is not cached yet, and seals the cache. */
export async function prewarm(backend: CudaBackend, runs: ReadonlyArray<(b: Backend) => void>,
  opts: { concurrency?: number } = {}): Promise<number> {
  // Trace with the backend's own attention choice (as prepare() does), so the plan holds what it launches.
  // The backend's own plan: its attention implementation and its attention scratch, sized for these runs.
  const specs = backend.planFor(runs);
  if (backend.cache) await backend.cache.prewarm(specs, opts);
  return specs.length;
}
