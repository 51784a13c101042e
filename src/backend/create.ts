/**
 * Picks a backend for `--device`: the CPU backend (the default; typed arrays and worker threads) or the CUDA
 * backend (generated kernels + cuBLAS), which is loaded lazily so that CPU users never touch CUDA libraries.
 */
import type { Backend } from './backend.js';
import { createCpuBackend } from './cpu/cpu-backend.js';
import { DistilleryError } from '../util/errors.js';

export interface BackendOptions {
  device: 'cpu' | 'cuda';
  /** CPU worker threads for matrix products (0 = all cores). */
  threads?: number;
  /** CUDA: print one line per kernel compile. */
  verbose?: boolean;
}

export async function createBackend(o: BackendOptions): Promise<Backend> {
  if (o.device === 'cpu') return createCpuBackend(o.threads ? { threads: o.threads } : {});
  if (o.device === 'cuda') {
    let mod: { createCudaBackend?: (opts: { verbose?: boolean }) => Promise<Backend> | Backend };
    try {
      const where = './cuda/index.js'; // resolved at run time: CPU-only installs never load it
      mod = (await import(where)) as typeof mod;
    } catch (e) {
      throw new DistilleryError(`the CUDA backend could not be loaded: ${(e as Error).message}`, 'use --device cpu');
    }
    if (!mod.createCudaBackend) throw new DistilleryError('this build has no CUDA backend', 'use --device cpu');
    return await mod.createCudaBackend({ verbose: o.verbose ?? false });
  }
  throw new DistilleryError(`unknown device "${String(o.device)}"`, 'use --device cpu or --device cuda');
}
