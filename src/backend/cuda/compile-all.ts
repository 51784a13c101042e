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
import { ropeKernel } from './kernels/rope.js';
import { cachedAttentionLargeLayouts, cachedAttentionPlan } from './kernels/attention-cached.js';
import { CACHED_MMA_MIN_BLOCKS, cachedMmaShape } from './kernels/attention-cached-mma.js';
import { yarnMscale, type RopeSpec } from '../rope.js';

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
 * eps 1e-5; every loss kind with and without gradient), in float32 and in the bf16 operand dtypes of the mixed-precision
 * data flow (bf16 activations and weights, f32 residual stream and gradients).
 */
export function representativeSpecs(): KernelSpec[] {
  const specs: KernelSpec[] = [];
  for (const f of ALL_FAMILIES) specs.push(f.make(f.example));
  const byName = new Map(ALL_FAMILIES.map((f) => [f.name, f]));
  const mk = (name: string, p: Record<string, number | string | boolean>): void => { specs.push(byName.get(name)!.make(p)); };
  const F = 'f32', B = 'bf16';
  // bf16 operand variants at one shape each (the bf16 toy steps and real bf16 plans add the others; the gates stay fast)
  // the SIMT attention kernels in f32 and with every float operand bf16 (the fallback for head dims the tensor-core
  // kernels do not take)
  const attn = (name: string, headDim: number): void => {
    for (const dt of ['f32', 'bf16']) {
      const p: Record<string, number | string | boolean> = { headDim, block: 128 };
      for (const k of Object.keys(byName.get(name)!.schema)) if (k !== 'headDim' && k !== 'block') p[k] = k === 'seqPos' ? false : k === 'accumulate' ? true : dt;
      mk(name, p);
    }
  };
  for (const [eps, C] of [[1e-6, 896], [1e-5, 2048], [1e-5, 4096], [1e-6, 64]] as const) {
    for (const [act, w] of C === 896 ? [[F, F], [B, B]] as const : [[F, F]] as const) {
      mk('rmsnorm_fwd', { eps, C, out: act, inp: F, weight: w, block: 256 });
      mk('add_rmsnorm_fwd', { eps, C, sum: F, out: act, a: F, b: F, weight: w, block: 256 });
      mk('rmsnorm_bwd', { C, dinp: F, dout: F, inp: F, weight: w, block: 256, copy: C === 896 ? B : 'none' });
    }
  }
  // warp-per-row norms (Qwen3's per-head q/k norms at head_dim 128 in bf16; a ragged 40 in f32)
  for (const [C, d] of [[128, B], [40, F]] as const) {
    mk('rmsnorm_rows_fwd', { eps: 1e-6, C, out: d, inp: d, weight: d });
    mk('rmsnorm_rows_bwd', { C, dinp: d, dout: d, inp: d, weight: d });
  }
  // the fused add + norm: a bf16 sum (rounded before the norm reads it), and rows past the register path (C > 8192)
  mk('add_rmsnorm_fwd', { eps: 1e-6, C: 896, sum: B, out: F, a: B, b: F, weight: F, block: 256 });
  mk('add_rmsnorm_fwd', { eps: 1e-5, C: 16384, sum: F, out: B, a: F, b: F, weight: B, block: 256 });
  for (const [headDim, theta] of [[64, 1e6], [128, 5e5], [128, 1e4], [16, 1e4]] as const) {
    for (const d of headDim === 64 ? [F, B] : [F]) {
      mk('rope_fwd', { headDim, theta, out: d, inp: d, seqPos: false, bias: 'none', block: 256 });
      mk('rope_fwd', { headDim, theta, out: d, inp: d, seqPos: false, bias: d, block: 256 });
      for (const acc of [true, false]) mk('rope_bwd', { headDim, theta, out: d, inp: d, seqPos: false, block: 256, acc });
    }
    for (const fam of ['attention_fwd', 'attention_bwd', 'attention_bwd_dkv', 'attention_cached']) attn(fam, headDim);
  }
  // generation's cached attention over GQA groups at the plans models get: GQA groups of 1 (MHA) to 7 (Qwen2.5-0.5B), rows loaded 8
  // elements at once and one at a time (a view off 16 bytes; a head dim not a multiple of 8)
  for (const [headDim, group] of [[64, 7], [64, 1], [128, 2], [128, 6], [80, 4], [256, 8], [36, 3]] as const) {
    // a small grid's layout (more rows in flight) and those a large grid picks among by occupancy
    for (const aligned of [true, false]) for (const plan of [cachedAttentionPlan(headDim, group, aligned, 1), ...cachedAttentionLargeLayouts(headDim, group, aligned)]) {
      for (const dt of ['f32', 'bf16']) mk('attention_cached_gqa', { headDim, group, ...plan, out: dt, q: dt, kc: dt, vc: dt, seqPos: !aligned });
    }
    // the tensor-core group kernel where it takes the shape (bf16 operands; the output in either dtype)
    if (cachedMmaShape(headDim, group)) for (const out of ['f32', 'bf16']) for (const seqPos of [false, true]) for (const minBlocks of CACHED_MMA_MIN_BLOCKS) mk('attention_cached_mma', { headDim, group, out, seqPos, minBlocks });
  }
  // the tensor-core group kernel's largest group
  for (const minBlocks of CACHED_MMA_MIN_BLOCKS) mk('attention_cached_mma', { headDim: 128, group: 16, out: 'bf16', seqPos: true, minBlocks });
  // every head dim configs use (Llama/Qwen 64, 128; Phi-style 80, 96; small 32; 256, which opts in to > 48 KiB shared memory)
  for (const headDim of [32, 80, 96, 256]) {
    for (const fam of ['attention_fwd', 'attention_bwd', 'attention_bwd_dkv']) attn(fam, headDim);
  }
  for (const headDim of [64, 128, 80]) {
    for (const dt of ['f32', 'bf16']) mk('attention_bwd_pre', { headDim, block: 256, dout: dt, out: dt });
  }
  for (const headDim of [32, 64, 80, 96, 128]) mk('attention_fwd_mma', { headDim });
  // bf16 tensor-core flash attention: every head dim it takes, bf16 and f32 outputs / gradients
  for (const headDim of [16, 32, 48, 64, 80, 96, 112, 128]) {
    for (const dt of ['f32', 'bf16']) {
      mk('attention_fwd_bf16', { headDim, out: dt });
      for (const accumulate of [true, false]) {
        mk('attention_bwd_dq_bf16', { headDim, dq: dt, out: dt, accumulate });
        mk('attention_bwd_dkv_bf16', { headDim, dk: dt, dv: dt, accumulate });
      }
    }
  }
  // the stored-dS backward pair (the default bf16 backward, attention-bf16.ts): the smallest head dim, 64-row query
  // tiles (32, 64) and 32-row ones (96, 128) in the dK/dV kernel, both stores
  for (const headDim of [16, 32, 64, 96, 128]) {
    for (const dt of ['f32', 'bf16']) {
      for (const accumulate of [true, false]) {
        mk('attention_bwd_dkv_ds_bf16', { headDim, dk: dt, dv: dt, accumulate });
        mk('attention_bwd_dq_ds_bf16', { headDim, dq: dt, accumulate });
      }
    }
  }
  for (const dt of ['f32', 'bf16']) {
    for (const accumulate of [true, false]) mk('attention_dkv_reduce', { block: 256, dk: dt, dv: dt, accumulate });
    mk('kv_cache_write', { block: 256, cache: dt, src: dt, seqPos: false });
    mk('kv_cache_write', { block: 256, cache: dt, src: dt, seqPos: true });
  }
  // Scaled RoPE as real checkpoints set it: Llama 3.1 8B (llama3, factor 8), Llama 3.2 1B (factor 32, head dim 64),
  // Qwen2.5 long context (yarn, factor 4 over 32768), and a linear factor.
  const scaled: Array<[RopeSpec, number]> = [
    [{ type: 'llama3', theta: 5e5, factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 }, 128],
    [{ type: 'llama3', theta: 5e5, factor: 32, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 }, 64],
    [{ type: 'yarn', theta: 1e6, factor: 4, originalMaxPositionEmbeddings: 32768, betaFast: 32, betaSlow: 1, attentionFactor: yarnMscale(4), truncate: true }, 128],
    [{ type: 'linear', theta: 1e4, factor: 2 }, 128],
  ];
  for (const [rope, headDim] of scaled) {
    for (const d of rope.type === 'yarn' ? [F, B] : [F]) {
      specs.push(ropeKernel(false, rope, headDim, 256, { out: d, inp: d }));
      for (const acc of [true, false]) specs.push(ropeKernel(true, rope, headDim, 256, { out: d, inp: d, acc }));
    }
  }
  for (const kind of ['none', 'kl', 'reverse-kl', 'jsd']) {
    mk('loss', { kind, withGrad: false, dlogits: F, logits: F, teacher: F, block: 512 });
    for (const dlogits of [F, B]) mk('loss', { kind, withGrad: true, dlogits, logits: F, teacher: F, block: 512 });
    mk('loss', { kind, withGrad: true, dlogits: B, logits: B, teacher: B, block: 512 }); // --logits bf16: the gradient in place
  }
  for (const copy of ['none', F, B]) { mk('adamw', { copy, block: 256 }); mk('adamw_multi', { copy, block: 256 }); }
  return specs;
}
