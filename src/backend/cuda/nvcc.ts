/**
 * The cross-architecture compile gate's second compiler: nvcc, for the GPU generations NVRTC from Debian (CUDA
 * 11.8, up to sm_90) cannot target — Ada (sm_89), Blackwell (sm_100), consumer Blackwell and GB10 (sm_120, sm_121).
 * Each kernel's generated source is compiled once into a fatbin with one SASS image per architecture, with the same
 * language options NVRTC gets (compileOptions), so a kernel that compiles here compiles at run time on that GPU.
 * Found as $DISTILLERY_NVCC, `nvcc` on PATH, /usr/local/bin/nvcc or /usr/local/cuda/bin/nvcc; absent: the gate skips.
 */
import { execFile, execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import * as path from 'node:path';
import type { KernelSpec } from './kernels/spec.js';

/** The architectures the gate covers: Ampere, Ada, Hopper, Blackwell, Blackwell consumer, GB10. */
export const GATE_ARCHS = ['sm_80', 'sm_89', 'sm_90', 'sm_100', 'sm_120', 'sm_121'] as const;

export interface Nvcc {
  path: string;
  /** e.g. 'release 13.0, V13.0.88' */
  version: string;
  /** Real architectures this nvcc can generate code for (from --list-gpu-arch), as 'sm_NN'. */
  archs: string[];
}

function tryRun(file: string, args: string[]): string | null {
  try {
    return execFileSync(file, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 30_000 });
  } catch { return null; }
}

/** The nvcc to use, or null (with nothing thrown) when there is none. */
export function findNvcc(env: NodeJS.ProcessEnv = process.env): Nvcc | null {
  const candidates = [env.DISTILLERY_NVCC, 'nvcc', '/usr/local/bin/nvcc', '/usr/local/cuda/bin/nvcc'].filter((c): c is string => Boolean(c));
  for (const c of candidates) {
    const v = tryRun(c, ['--version']);
    if (v === null) continue;
    const version = /release [^\n]*/.exec(v)?.[0] ?? 'unknown version';
    const list = tryRun(c, ['--list-gpu-arch']) ?? '';
    const archs = [...list.matchAll(/compute_(\d+)/g)].map((m) => `sm_${m[1]}`);
    return { path: c, version, archs };
  }
  return null;
}

export interface NvccResult { spec: KernelSpec; archs: string[]; ok: boolean; ms: number; bytes: number; error?: string }

/** Compiles each spec once for all `archs` (one fatbin per spec), `concurrency` nvcc processes at a time. */
export async function compileWithNvcc(nvcc: Nvcc, specs: readonly KernelSpec[], archs: readonly string[],
  concurrency = availableParallelism()): Promise<NvccResult[]> {
  const dir = fs.mkdtempSync(path.join(tmpdir(), 'distillery-nvcc-'));
  const gencode = archs.flatMap((a) => ['-gencode', `arch=${a.replace('sm_', 'compute_')},code=${a}`]);
  const results: NvccResult[] = new Array(specs.length);
  let next = 0;
  const one = (i: number): Promise<void> => new Promise((resolve) => {
    const spec = specs[i]!;
    const src = path.join(dir, `k${i}.cu`), out = path.join(dir, `k${i}.fatbin`);
    fs.writeFileSync(src, spec.source());
    const t0 = performance.now();
    // The NVRTC options of compileOptions minus the architecture (given per gencode above).
    execFile(nvcc.path, ['-fatbin', '-std=c++17', ...gencode, '-o', out, src], { timeout: 300_000, maxBuffer: 16 << 20 }, (err, _o, stderr) => {
      const ms = performance.now() - t0;
      if (err) results[i] = { spec, archs: [...archs], ok: false, ms, bytes: 0, error: `${err.message}\n${stderr}` };
      else results[i] = { spec, archs: [...archs], ok: true, ms, bytes: fs.statSync(out).size };
      resolve();
    });
  });
  const worker = async (): Promise<void> => { while (next < specs.length) await one(next++); };
  try {
    await Promise.all(Array.from({ length: Math.max(1, Math.min(concurrency, specs.length)) }, worker));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
  return results;
}
