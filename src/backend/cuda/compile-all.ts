/**
 * The compile gate: compile a set of specs for several architectures with NVRTC and report every failure
 * (with NVRTC's log). Used by test/cuda/compile-gate.test.ts over the representative spec set and, once the
 * model exists, over the traced Qwen2.5-0.5B- and Llama-shaped plans.
 */
import { availableParallelism } from 'node:os';
import type { KernelSpec } from './kernels/spec.js';
import { compileOptions } from './kernel-cache.js';
import type { KernelCompiler } from './ffi/nvrtc.js';
import { tryNvrtc } from './ffi/nvrtc.js';
import { ALL_FAMILIES } from './kernels/index.js';

export interface CompileResult { arch: string; spec: KernelSpec; ok: boolean; ms: number; bytes: number; error?: string }

export async function compileAll(specs: readonly KernelSpec[], archs: readonly string[], opts: {
  compiler?: KernelCompiler; concurrency?: number;
} = {}): Promise<CompileResult[]> {
  const compiler = opts.compiler ?? tryNvrtc();
  if (!compiler) throw new Error('compileAll: NVRTC not found');
  const jobs: Array<{ arch: string; spec: KernelSpec }> = [];
  for (const arch of archs) for (const spec of specs) jobs.push({ arch, spec });
  const results: CompileResult[] = new Array(jobs.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < jobs.length) {
      const i = next++;
      const { arch, spec } = jobs[i]!;
      const t0 = performance.now();
      try {
        const cubin = await compiler.compile(spec.source(), spec.entry, compileOptions(arch), spec.describe());
        results[i] = { arch, spec, ok: true, ms: performance.now() - t0, bytes: cubin.length };
      } catch (e) {
        results[i] = { arch, spec, ok: false, ms: performance.now() - t0, bytes: 0, error: (e as Error).message };
      }
    }
  };
  const n = Math.max(1, Math.min(opts.concurrency ?? availableParallelism(), jobs.length));
  await Promise.all(Array.from({ length: n }, worker));
  return results;
}

/**
 * A representative spec set: every family's example plus variants over the parameters real models use
 * (Qwen2.5-0.5B: C 896, headDim 64, theta 1e6, eps 1e-6; Llama: C 2048/4096, headDim 128, theta 5e5/1e4,
 * eps 1e-5; every loss kind with and without gradient).
 */
export function representativeSpecs(): KernelSpec[] {
  const specs: KernelSpec[] = [];
  for (const f of ALL_FAMILIES) specs.push(f.make(f.example));
  const byName = new Map(ALL_FAMILIES.map((f) => [f.name, f]));
  const mk = (name: string, p: Record<string, number | string | boolean>): void => { specs.push(byName.get(name)!.make(p)); };
  for (const [eps, C] of [[1e-6, 896], [1e-5, 2048], [1e-5, 4096], [1e-6, 64]] as const) {
    mk('rmsnorm_fwd', { eps, C, block: 256 });
    mk('rmsnorm_bwd', { C, block: 256 });
    mk('rmsnorm_dweight', { C, block: 256 });
  }
  for (const [headDim, theta] of [[64, 1e6], [128, 5e5], [128, 1e4], [16, 1e4]] as const) {
    mk('rope_fwd', { headDim, theta, block: 256 });
    mk('rope_bwd', { headDim, theta, block: 256 });
    for (const fam of ['attention_fwd', 'attention_bwd', 'attention_bwd_dkv', 'attention_cached']) mk(fam, { headDim, block: 128 });
  }
  for (const fam of ['attention_fwd', 'attention_bwd', 'attention_bwd_dkv']) mk(fam, { headDim: 256, block: 128 });
  for (const kind of ['none', 'kl', 'reverse-kl', 'jsd']) {
    for (const withGrad of [true, false]) {
      mk('loss', { kind, withGrad, block: 512 });
    }
  }
  mk('adamw', { block: 256 });
  return specs;
}
