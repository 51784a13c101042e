/**
 * The training attention backward's dispatch on CUDA, as a pure function of the call (shapes, operand dtypes, whether it
 * adds into its outputs) and of the backend (its backward implementation and scratch sizes): which kernels run, with
 * which grids, whether dK/dV splits over the GQA group, how the batch is chunked, and what scratch the call needs.
 * CudaBackend.attentionBackward issues exactly this plan, in both its modes, so the kernels a trace records (and the
 * pre-warm compiles) are the ones a device run launches; the rules are unit-tested here, apart from any GPU.
 *
 * The scratch sizes and the split rule, with the measurements that set them, are defined here too.
 */
import type { DType } from '../backend.js';
import { DistilleryError } from '../../util/errors.js';
import type { KernelSpec } from './kernels/spec.js';
import {
  ATTN_KEY_TILE, MAX_TRAIN_HEAD_DIM, attentionBackward, attentionBackwardKv, attentionBackwardPre, attentionDkvReduce, attnPreRowsPerWarp, attnTile,
} from './kernels/attention.js';
import {
  FA_KEY_TILE, FA_QUERY_TILE, FA_THREADS, attentionBackwardDkvBf16, attentionBackwardDkvDsBf16, attentionBackwardDqBf16,
  attentionBackwardDqDsBf16, bf16MmaHeadDim, dqDsSmem, dsScratchElems, faSmem,
} from './kernels/attention-bf16.js';
import { ATTN_BLOCK, ELEM_BLOCK } from './block-sizes.js';

/**
 * Attention backward's D = rowsum(dout ∘ out) (one float per batch·head·query row, 16 MiB: one batch of 32 heads ×
 * 131072 positions); larger batches run in chunks.
 */
export const DEFAULT_ATTN_DSUM = 1 << 22;
/**
 * Attention backward's dK/dV partials (two floats per batch·query head·position·head dim): with room for at least
 * one batch, attention_bwd_dkv splits each kv head's query-head group over blocks and attention_dkv_reduce sums the
 * splits in order; without room it runs unsplit (one block per key tile and kv head). Larger batches run in chunks.
 * prepare() resizes both scratches to what the traced run needs (the D scratch down, the partials up to
 * MAX_ATTN_DKV_FLOATS), unless the backend was given explicit sizes: the 8 × 1024 batch of a 14-head, head-dim-64
 * student (Qwen2.5-0.5B) needs 14.7 Mi floats of partials; with 4 Mi its backward ran in 4 chunks of 2 sequences, each
 * too small to fill an H100 (732 µs per layer against 511 µs in one launch, measured).
 */
export const DEFAULT_ATTN_DKV_FLOATS = 1 << 22;
/** The most floats prepare() gives the dK/dV partials when the traced run needs more than the default (larger runs chunk). */
export const MAX_ATTN_DKV_FLOATS = 1 << 25;
/**
 * The stored-dS attention backward's scratch (bf16 elements, dsScratchElems: the causal triangle of 64 × 64 dS tiles of
 * every batch · query head): 32 MiB until prepare() sizes it to the traced run's need, at most MAX_ATTN_DS_ELEMS
 * (256 MiB: the 8 × 1024 batch of a 14-head student needs 119 MiB); larger batches run in chunks, and where one
 * sequence's triangle does not fit (past 4,288 positions at 14 heads) the backward recomputes S and dP instead. A
 * backend that never runs an attention backward keeps the 32 MiB (as it keeps the D and dK/dV scratch defaults).
 */
export const DEFAULT_ATTN_DS_ELEMS = 1 << 24;
export const MAX_ATTN_DS_ELEMS = 1 << 27;
/**
 * The bf16 tensor-core attention backward splits each kv head's query-head group over blocks (attention_dkv_reduce sums
 * the splits) only when the unsplit dK/dV grid, 64-key tiles × kv heads × batch, has fewer blocks than this: on an H100
 * at 8 × 1024 the split is worth it for 2 kv heads (256 blocks: 410 against 461 µs unsplit at 14/2 heads, hd 64) and
 * costs for 8 (1024 blocks: 885 against 822 µs at 16/8, hd 128; session 17, docs/measurements). Unsplit, a block sums
 * its group's heads in registers and scales once, split the reduction adds scaled per-head partials: dk and dv round
 * differently between the two (both deterministic). The SIMT kernels split whenever the group has several heads.
 */
export const DKV_SPLIT_BELOW_BLOCKS = 512;

/**
 * The bf16 tensor-core attention backward. 'stored-ds': D = rowsum(dout ∘ out) first (attention_bwd_pre), then the
 * dK/dV kernel writes every dSᵀ tile it computes to a bf16 scratch (attention_bwd_dkv_ds_bf16) and the dQ kernel forms
 * dQ = scale·dS·K from it (attention_bwd_dq_ds_bf16): S and dP once per (query tile, key tile) pair, five products
 * against seven; where one sequence's dS triangle does not fit the scratch it falls back to 'recompute'. 'recompute':
 * the dQ kernel (which also writes D) and the dK/dV kernel each compute S and dP. Both deterministic and atomic-free.
 */
export type AttentionBackwardImpl = 'stored-ds' | 'recompute';
/** The default attention backward (measured faster at the 8 × 1024 student and teacher shapes on an H100, session 20). */
export const DEFAULT_ATTN_BACKWARD: AttentionBackwardImpl = 'stored-ds';

/**
 * Generation's cached attention splits a short grid's cache rows over blocks (attention_cached_gqa and attention_cached_mma, cachedAttentionSplits)
 * whose partials, and the counters that elect the block merging them, live in this scratch (floats): 4 MiB until
 * prepare() sizes it to the traced run's need, at most MAX_ATTN_CACHED_FLOATS. A call whose splits do not fit takes at
 * most as many as do (at least 2, else none); of those, the count with the fewest waves (cachedAttentionPickSplits).
 */
export const DEFAULT_ATTN_CACHED_FLOATS = 1 << 20;
export const MAX_ATTN_CACHED_FLOATS = 1 << 24;

/** The attention scratch: the backward's D floats, dK/dV partial floats and dS bf16 elements; cached attention's split floats. */
export interface AttentionScratch { dsum: number; dkv: number; ds: number; cached: number }

/**
 * The attention backward's scratch sizes for a run whose traced calls needed `need` (D for every batch · head ·
 * position, dK/dV partials and dS tiles for the whole batch): the D scratch down to the need (at most
 * DEFAULT_ATTN_DSUM), the partials and the dS scratch to it (at most MAX_ATTN_DKV_FLOATS, MAX_ATTN_DS_ELEMS; beyond
 * that the batch runs in chunks), and cached attention's split scratch to its need (DEFAULT_ATTN_CACHED_FLOATS to
 * MAX_ATTN_CACHED_FLOATS). null: the run has neither (the defaults stay); without a backward the backward's defaults
 * stay. The one rule prepare() applies and planKernels plans with.
 */
export function attentionScratchSizes(need: AttentionScratch): AttentionScratch | null {
  if (need.dsum === 0 && need.cached === 0) return null;
  const cached = Math.min(Math.max(need.cached, DEFAULT_ATTN_CACHED_FLOATS), MAX_ATTN_CACHED_FLOATS);
  if (need.dsum === 0) return { dsum: DEFAULT_ATTN_DSUM, dkv: DEFAULT_ATTN_DKV_FLOATS, ds: DEFAULT_ATTN_DS_ELEMS, cached };
  return {
    dsum: Math.min(need.dsum, DEFAULT_ATTN_DSUM), dkv: Math.min(Math.max(need.dkv, 1), MAX_ATTN_DKV_FLOATS),
    ds: Math.min(Math.max(need.ds, 1), MAX_ATTN_DS_ELEMS), cached,
  };
}

/** Raises each of `into`'s scratch needs to `from`'s where that is larger. */
export function maxScratch(into: AttentionScratch, from: Readonly<AttentionScratch>): void {
  into.dsum = Math.max(into.dsum, from.dsum); into.dkv = Math.max(into.dkv, from.dkv); into.ds = Math.max(into.ds, from.ds);
  into.cached = Math.max(into.cached, from.cached);
}

/**
 * The training attention forward a device backend runs by default: --tf32 already trades ~1e-3 relative error for
 * tensor cores in the GEMMs, so the attention forward follows it ('mma'); else fp32 'simt'. createCudaBackend and
 * --dry-run both use this rule, so the dry run plans exactly what the run pre-warms.
 */
export function attentionFor(tf32: boolean): 'simt' | 'mma' {
  return tf32 ? 'mma' : 'simt';
}

/** Whether the bf16 tensor-core attention kernels run for operands of these dtypes: all bf16 and a head dim they take. */
export function bf16MmaOperands(hd: number, dtypes: readonly DType[]): boolean {
  return bf16MmaHeadDim(hd) && dtypes.every((d) => d === 'bf16');
}

/** The tile of a SIMT training attention kernel (attnTile), or a DistilleryError for a head dim beyond the kernels. */
export function simtAttentionTile(kind: 'fwd' | 'dq' | 'dkv', hd: number): { tq: number; smem: number } {
  const t = hd <= MAX_TRAIN_HEAD_DIM ? attnTile(kind, hd, ATTN_BLOCK) : null;
  if (!t) {
    throw new DistilleryError(`attention: head dimension ${hd} is above the CUDA training kernels' limit of ${MAX_TRAIN_HEAD_DIM}`, 'use --device cpu');
  }
  return t;
}

/** One attention backward call: its shape, the dtypes of its float operands, and whether it adds into dq, dk and dv. */
export interface AttentionBackwardCall {
  b: number; t: number; nHeads: number; nKv: number; hd: number;
  dtypes: { dq: DType; dk: DType; dv: DType; dout: DType; q: DType; k: DType; v: DType; out: DType };
  accumulate: boolean;
}

/** What the backend brings: its backward implementation and its scratch sizes (D and partials in floats, dS in bf16 elements). */
export interface AttentionBackwardBackend {
  impl: AttentionBackwardImpl;
  dsumFloats: number; dkvFloats: number; dsElems: number;
}

/** A kernel of the plan with its launch: grid x (y and z are the call's: heads or kv heads·S, and the chunk's batch), threads, dynamic shared memory. */
export interface PlannedKernel { spec: KernelSpec; gridX: number; block: number; smem: number }

export interface AttentionBackwardPlan {
  /** The bf16 tensor-core kernels (else the SIMT ones, any operand dtypes). */
  mma: boolean;
  /** dq, dk and dv are zeroed first (the SIMT kernels always add; an overwriting call zeroes their outputs). */
  zeroFirst: boolean;
  /** The dK/dV kernel's split of each kv head's query-head group (1: unsplit, no reduction). */
  S: number;
  /** Sequences per chunk: the batch runs in chunks of this many (the scratch holds that many). */
  bPer: number;
  /** The stored-dS backward: dK/dV first (writing the dS tiles), dQ from them after. */
  storedDs: boolean;
  /** D = rowsum(dout ∘ out) in a pass of its own, or null where the recomputing dQ kernel writes it. */
  pre: KernelSpec | null;
  /** Rows a warp of `pre` takes (attnPreRowsPerWarp): its grid is blocksFor(ceil(rows / this)·32, ELEM_BLOCK). */
  preRowsPerWarp: number;
  dq: PlannedKernel;
  dkv: PlannedKernel;
  /** attention_dkv_reduce (S > 1), or null. */
  reduce: KernelSpec | null;
  /** The scratch this call asks for (the whole batch's: prepare() sizes the scratch to the largest call's). */
  need: AttentionScratch;
}

/**
 * The plan of one attention backward call (see the module comment). Throws a DistilleryError where the D scratch cannot
 * hold one sequence's rows or a SIMT kernel cannot take the head dim.
 */
export function planAttentionBackward(call: AttentionBackwardCall, be: AttentionBackwardBackend): AttentionBackwardPlan {
  const { b, t, nHeads, nKv, hd, dtypes: d, accumulate } = call;
  // bf16 q, k, v and dout: the tensor-core dQ and dK/dV kernels; else the SIMT ones (any operand dtypes).
  const mma = bf16MmaOperands(hd, [d.q, d.k, d.v, d.dout]);
  const tq = mma ? null : simtAttentionTile('dq', hd), tkv = mma ? null : simtAttentionTile('dkv', hd);
  // Overwriting: the tensor-core kernels and the reduction store instead of adding (each element has one writer);
  // the SIMT kernels always add, so their outputs are zeroed first.
  const store = !accumulate && mma;
  // Deterministic, atomic-free: D = rowsum(dout ∘ out) into the backend's scratch, dq per query tile, dk/dv per
  // key tile (split over the GQA group with a fixed-order reduction when the partials fit). The D scratch holds
  // bPer batches; larger batches run in chunks over views.
  const perBatch = nHeads * t;
  // (the bound is the tensor-core kernels', measured; the SIMT kernels split whenever the group has several heads)
  const splits = nHeads > nKv && (!mma || Math.ceil(t / FA_KEY_TILE) * nKv * b < DKV_SPLIT_BELOW_BLOCKS);
  const dsPer = dsScratchElems(1, nHeads, t), wantsDs = mma && be.impl === 'stored-ds';
  const need: AttentionScratch = { dsum: perBatch * b, dkv: splits ? 2 * nHeads * t * hd * b : 0, ds: wantsDs ? dsPer * b : 0, cached: 0 };
  let bPer = Math.min(b, Math.floor(be.dsumFloats / perBatch));
  if (bPer < 1) {
    throw new DistilleryError(`attention backward: ${nHeads} heads × ${t} positions exceed the ${be.dsumFloats}-float scratch`,
      'use a shorter sequence');
  }
  // Split each kv head's query-head group over S = G blocks when the unsplit grid is too small to fill the GPU and one
  // batch's dK/dV partials fit (S fixed by the shape alone, so the plan and the run agree).
  const G = nHeads / nKv;
  const dkvFit = Math.floor(be.dkvFloats / (2 * nHeads * t * hd));
  const S = splits && dkvFit >= 1 ? G : 1;
  if (S > 1) bPer = Math.min(bPer, dkvFit);
  // The stored-dS backward where one sequence's dS triangle fits the scratch, in chunks of whole sequences; else the dQ
  // and dK/dV kernels each recompute S and dP.
  const storedDs = wantsDs && be.dsElems >= dsPer;
  if (storedDs) bPer = Math.min(bPer, Math.floor(be.dsElems / dsPer));
  const preP = { headDim: hd, block: ELEM_BLOCK, dout: d.dout, out: d.out };
  const pre = mma && !storedDs ? null : attentionBackwardPre.make(preP);
  const reduce = S > 1 ? attentionDkvReduce.make({ block: ELEM_BLOCK, dk: d.dk, dv: d.dv, accumulate: !store }) : null;
  const dq: PlannedKernel = storedDs
    ? { spec: attentionBackwardDqDsBf16.make({ headDim: hd, dq: d.dq, accumulate: !store }), gridX: Math.ceil(t / FA_QUERY_TILE), block: FA_THREADS, smem: dqDsSmem(hd) }
    : mma
      ? { spec: attentionBackwardDqBf16.make({ headDim: hd, dq: d.dq, out: d.out, accumulate: !store }), gridX: Math.ceil(t / FA_QUERY_TILE), block: FA_THREADS, smem: faSmem('dq', hd) }
      : {
        spec: attentionBackward.make({ headDim: hd, block: ATTN_BLOCK, dq: d.dq, dout: d.dout, q: d.q, k: d.k, v: d.v }),
        gridX: Math.ceil(t / tq!.tq), block: ATTN_BLOCK, smem: tq!.smem,
      };
  const dkv: PlannedKernel = mma
    ? {
      spec: (storedDs ? attentionBackwardDkvDsBf16 : attentionBackwardDkvBf16).make({ headDim: hd, dk: d.dk, dv: d.dv, accumulate: !store }),
      gridX: Math.ceil(t / FA_KEY_TILE), block: FA_THREADS, smem: faSmem('dkv', hd),
    }
    : {
      spec: attentionBackwardKv.make({ headDim: hd, block: ATTN_BLOCK, dk: d.dk, dv: d.dv, dout: d.dout, q: d.q, k: d.k, v: d.v }),
      gridX: Math.ceil(t / ATTN_KEY_TILE), block: ATTN_BLOCK, smem: tkv!.smem,
    };
  return { mma, zeroFirst: !accumulate && !mma, S, bPer, storedDs, pre, preRowsPerWarp: attnPreRowsPerWarp(preP), dq, dkv, reduce, need };
}
