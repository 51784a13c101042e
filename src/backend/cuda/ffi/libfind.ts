/**
 * Finds and opens the CUDA shared libraries (driver, NVRTC, cuBLAS).
 *
 * Search order for each library, first hit wins:
 *   1. $DISTILLERY_CUDA_LIB_DIR (when set)
 *   2. the dynamic loader's own search (dlopen of the bare versioned name: LD_LIBRARY_PATH, ld.so.cache, ...)
 *   3. `ldconfig -p`
 *   4. /usr/local/cuda/lib64, /usr/local/cuda/targets/x86_64-linux/lib, /usr/lib/x86_64-linux-gnu, /lib/x86_64-linux-gnu
 * Candidate names are versioned, newest first (libnvrtc.so.13, .12, .11.2; libcublas.so.13, 12, 11).
 * Everything touching the system is injectable (`FinderEnv`) so the tests can simulate missing libraries.
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import koffi from 'koffi';
import { DistilleryError } from '../../../util/errors.js';

export type CudaLibName = 'cuda' | 'nvrtc' | 'cublas';

export const LIB_CANDIDATES: Readonly<Record<CudaLibName, readonly string[]>> = {
  cuda: ['libcuda.so.1', 'libcuda.so'],
  nvrtc: ['libnvrtc.so.13', 'libnvrtc.so.12', 'libnvrtc.so.11.2', 'libnvrtc.so'],
  cublas: ['libcublas.so.13', 'libcublas.so.12', 'libcublas.so.11', 'libcublas.so'],
};

export const DEFAULT_DIRS = [
  '/usr/local/cuda/lib64', '/usr/local/cuda/targets/x86_64-linux/lib', '/usr/lib/x86_64-linux-gnu', '/lib/x86_64-linux-gnu',
];

export type LibHandle = ReturnType<typeof koffi.load>;

export interface FinderEnv {
  env: Record<string, string | undefined>;
  exists(path: string): boolean;
  /** Output of `ldconfig -p` ('' when unavailable). */
  ldconfig(): string;
  /** dlopen; throws when the library cannot be opened. */
  open(pathOrName: string): LibHandle;
  dirs: readonly string[];
}

let ldconfigMemo: string | undefined;
export const systemFinderEnv: FinderEnv = {
  env: process.env,
  exists: existsSync,
  ldconfig() {
    if (ldconfigMemo !== undefined) return ldconfigMemo;
    for (const bin of ['ldconfig', '/sbin/ldconfig', '/usr/sbin/ldconfig']) {
      try {
        ldconfigMemo = execFileSync(bin, ['-p'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 5000 });
        return ldconfigMemo;
      } catch { /* try the next */ }
    }
    ldconfigMemo = '';
    return ldconfigMemo;
  },
  open: (p) => koffi.load(p),
  dirs: DEFAULT_DIRS,
};

export interface FoundLib { name: CudaLibName; path: string; lib: LibHandle }

/** Paths from `ldconfig -p` output for the given soname. */
function fromLdconfig(out: string, soname: string): string[] {
  const res: string[] = [];
  for (const line of out.split('\n')) {
    const m = /^\s*(\S+)\s.*=>\s*(\S+)\s*$/.exec(line);
    if (m && m[1] === soname) res.push(m[2]!);
  }
  return res;
}

/** Opens the library or returns null with the list of what was tried. */
export function openLibrary(name: CudaLibName, fe: FinderEnv = systemFinderEnv): { found: FoundLib | null; tried: string[] } {
  const tried: string[] = [];
  const attempt = (p: string): FoundLib | null => {
    tried.push(p);
    try { return { name, path: p, lib: fe.open(p) }; } catch { return null; }
  };
  const names = LIB_CANDIDATES[name];
  const override = fe.env.DISTILLERY_CUDA_LIB_DIR;
  if (override) {
    for (const n of names) {
      const p = join(override, n);
      if (fe.exists(p)) { const r = attempt(p); if (r) return { found: r, tried }; }
    }
  }
  for (const n of names) { const r = attempt(n); if (r) return { found: r, tried }; }
  const ld = fe.ldconfig();
  for (const n of names) {
    for (const p of fromLdconfig(ld, n)) { const r = attempt(p); if (r) return { found: r, tried }; }
  }
  for (const d of fe.dirs) {
    for (const n of names) {
      const p = join(d, n);
      if (fe.exists(p)) { const r = attempt(p); if (r) return { found: r, tried }; }
    }
  }
  return { found: null, tried };
}

const HUMAN: Record<CudaLibName, string> = {
  cuda: 'the NVIDIA driver library (libcuda.so.1)',
  nvrtc: 'NVRTC (libnvrtc.so)',
  cublas: 'cuBLAS (libcublas.so)',
};

/** The one-sentence error for `--device cuda` without the libraries. */
export function missingLibraryError(missing: CudaLibName[]): DistilleryError {
  const what = missing.map((m) => HUMAN[m]).join(', ');
  return new DistilleryError(
    `--device cuda needs ${what}, which ${missing.length > 1 ? 'were' : 'was'} not found on this machine; run with --device cpu instead.`,
    'if CUDA is installed in an unusual place, set DISTILLERY_CUDA_LIB_DIR to the folder holding its libraries',
  );
}

/** Opens every named library or throws the clear DistilleryError naming all that are missing. */
export function requireLibraries<N extends CudaLibName>(names: readonly N[], fe: FinderEnv = systemFinderEnv): Record<N, FoundLib> {
  const out = {} as Record<N, FoundLib>;
  const missing: CudaLibName[] = [];
  for (const n of names) {
    const { found } = openLibrary(n, fe);
    if (found) out[n] = found; else missing.push(n);
  }
  if (missing.length) throw missingLibraryError(missing);
  return out;
}
