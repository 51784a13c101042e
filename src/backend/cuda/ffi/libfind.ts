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
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import { existsSync } from 'node:fs';
import { basename, join } from 'node:path';
import koffi from 'koffi';
import { DistilleryError } from '../../../util/errors.js';

export type CudaLibName = 'cuda' | 'nvrtc' | 'cublas' | 'nccl';

export const LIB_CANDIDATES: Readonly<Record<CudaLibName, readonly string[]>> = {
  cuda: ['libcuda.so.1', 'libcuda.so'],
  nvrtc: ['libnvrtc.so.13', 'libnvrtc.so.12', 'libnvrtc.so.11.2', 'libnvrtc.so'],
  cublas: ['libcublas.so.13', 'libcublas.so.12', 'libcublas.so.11', 'libcublas.so'],
  nccl: ['libnccl.so.2', 'libnccl.so'],
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
  nccl: 'NCCL (libnccl.so.2)',
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

/** What libraryFile() reads from the system (injectable for tests). */
export interface FileProbe {
  exists(path: string): boolean;
  realpath(path: string): string;
  /** /proc/self/maps ('' when unavailable). */
  maps(): string;
  /** `ldconfig -p` output ('' when unavailable). */
  ldconfig(): string;
}

export const systemFileProbe: FileProbe = {
  exists: existsSync,
  realpath: (p) => fs.realpathSync(p),
  maps: () => { try { return fs.readFileSync('/proc/self/maps', 'utf8'); } catch { return ''; } },
  ldconfig: () => systemFinderEnv.ldconfig(),
};

/**
 * The real file a library was opened from, given what openLibrary() passed to dlopen (a path, or a bare soname
 * the loader resolved): the path itself when it is one; else the mapped file of this process whose name starts
 * with the same `lib<name>.so` (the loader's actual choice); else ldconfig's entry for the soname. Symlinks are
 * resolved. Null when nothing is found.
 */
export function libraryFile(opened: string, probe: FileProbe = systemFileProbe): string | null {
  const real = (p: string): string | null => { try { return probe.exists(p) ? probe.realpath(p) : null; } catch { return null; } };
  if (opened.includes('/')) return real(opened);
  const base = basename(opened);
  const i = base.indexOf('.so');
  const stem = i >= 0 ? base.slice(0, i + 3) : base;
  for (const line of probe.maps().split('\n')) {
    const m = /\s(\/\S+)\s*$/.exec(line);
    if (!m) continue;
    const b = basename(m[1]!);
    if (b === stem || b.startsWith(`${stem}.`)) { const r = real(m[1]!); if (r) return r; }
  }
  for (const p of fromLdconfig(probe.ldconfig(), base)) { const r = real(p); if (r) return r; }
  return null;
}

/**
 * Identifies one build of a library file: `<real file name> <size in bytes> sha256:<first 16 hex digits of the
 * hash of its first MiB>`. Two builds with one version number (11.8.89 vs a patched 11.8.x) differ here.
 */
export function fileBuildId(file: string): string {
  const st = fs.statSync(file);
  const fd = fs.openSync(file, 'r');
  try {
    const buf = Buffer.alloc(Math.min(st.size, 1 << 20));
    let got = 0;
    while (got < buf.length) {
      const n = fs.readSync(fd, buf, got, buf.length - got, got);
      if (n <= 0) break;
      got += n;
    }
    const h = createHash('sha256').update(buf.subarray(0, got)).digest('hex').slice(0, 16);
    return `${basename(file)} ${st.size} sha256:${h}`;
  } finally {
    fs.closeSync(fd);
  }
}
