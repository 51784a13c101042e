/**
 * Picks a backend for `--device`: the CPU backend (the default; typed arrays and worker threads) or the CUDA
 * backend (generated kernels + cuBLAS), which is loaded lazily so that CPU users never touch CUDA libraries.
 */
import type { Backend } from './backend.js';
import { createCpuBackend } from './cpu/cpu-backend.js';
import { DistilleryError, InputError } from '../util/errors.js';

/** The CUDA-only settings (`--verbose-kernels`, `--strict-kernels`, `--kernel-cache-dir`, `--tf32`). */
export interface CudaOptions {
  /** CUDA: print one line per kernel compile. */
  verbose?: boolean;
  /** CUDA: a kernel-cache miss after pre-warm is an error (default: NODE_ENV=test or DISTILLERY_STRICT_KERNELS=1). */
  strict?: boolean;
  /** CUDA: kernel cache folder (default: $DISTILLERY_CACHE_DIR, else ~/.cache/distillery/kernels). */
  cacheDir?: string;
  /** CUDA: allow TF32 tensor-core GEMMs (faster, ~1e-3 relative error). */
  tf32?: boolean;
  /** CUDA: the GPU ordinal (a data-parallel rank's LOCAL_RANK; default 0). */
  ordinal?: number;
}

export interface BackendOptions extends CudaOptions {
  device: 'cpu' | 'cuda';
  /** CPU worker threads for matrix products (0 = all cores). */
  threads?: number;
}

/** The CLI flags of CudaOptions, shared by train/distill/generate/eval. */
export const CUDA_FLAG_NAMES = ['verbose-kernels', 'strict-kernels', 'kernel-cache-dir', 'tf32'] as const;

/** CudaOptions from parsed flags (kebab-case names as in CUDA_FLAG_NAMES); absent flags stay unset. */
export function cudaOptionsFromFlags(values: Record<string, unknown>): CudaOptions {
  const o: CudaOptions = {};
  if (typeof values['verbose-kernels'] === 'boolean') o.verbose = values['verbose-kernels'];
  if (typeof values['strict-kernels'] === 'boolean') o.strict = values['strict-kernels'];
  if (typeof values['kernel-cache-dir'] === 'string') o.cacheDir = values['kernel-cache-dir'];
  if (typeof values.tf32 === 'boolean') o.tf32 = values.tf32;
  return o;
}

/** The most CPU threads --threads accepts (each is a worker thread with its own memory). */
export const MAX_THREADS = 1024;

/** What is wrong with a --threads value, or null when it is fine. */
export function threadsProblem(n: number): string | null {
  return Number.isInteger(n) && n >= 0 && n <= MAX_THREADS ? null : `an integer from 0 to ${MAX_THREADS} (0 = all cores)`;
}

type CudaFactory = (opts: CudaOptions & { device?: number }) => Promise<Backend> | Backend;

export async function createBackend(o: BackendOptions): Promise<Backend> {
  const bad = o.threads === undefined ? null : threadsProblem(o.threads);
  if (bad !== null) throw new InputError(`--threads must be ${bad}, got ${o.threads}`, 'use 0 for all cores, or the number of cores to use');
  if (o.device === 'cpu') return createCpuBackend(o.threads ? { threads: o.threads } : {});
  if (o.device === 'cuda') {
    let mod: { createCudaBackend?: CudaFactory };
    try {
      const where = './cuda/index.js'; // resolved at run time: CPU-only installs never load it
      mod = (await import(where)) as typeof mod;
    } catch (e) {
      throw new DistilleryError(`the CUDA backend could not be loaded: ${(e as Error).message}`, 'use --device cpu');
    }
    if (!mod.createCudaBackend) throw new DistilleryError('this build has no CUDA backend', 'use --device cpu');
    // createCudaBackend (cuda/index.ts) takes the GPU ordinal as `device`
    const c: CudaOptions & { device?: number } = { verbose: o.verbose ?? false };
    if (o.strict !== undefined) c.strict = o.strict;
    if (o.cacheDir !== undefined) c.cacheDir = o.cacheDir;
    if (o.tf32 !== undefined) c.tf32 = o.tf32;
    if (o.ordinal !== undefined) c.device = o.ordinal;
    return await mod.createCudaBackend(c);
  }
  throw new DistilleryError(`unknown device "${String(o.device)}"`, 'use --device cpu or --device cuda');
}
