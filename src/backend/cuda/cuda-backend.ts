/**
 * The CUDA backend: generated kernels (through the kernel cache) + cuBLAS GEMMs, implementing `Backend`.
 *
 * Two modes share every line that picks a kernel:
 * - 'device': real GPU memory and launches.
 * - 'trace': no GPU, no libraries. alloc returns fake handles, each op records the KernelSpec it would launch
 *   (through the same `launch()` call a device run makes), downloads return zeros and sumSquares returns 0.
 * So the set a trace records IS the set a device run asks the cache for (see plan.ts). That is what makes the
 * pre-warm complete by construction. The attention backward's choices (kernels, GQA split, chunks, scratch) are one
 * pure function of the call and the backend's scratch sizes (attention-plan.ts), which both modes issue.
 *
 * Mixed precision (see backend.ts): every kernel bakes the dtype of each float operand that may be either (f32 | bf16),
 * taken from the buffers at the call, so a bf16 call launches (and a trace plans) its own kernel; compute is float32 and
 * a bf16 store rounds once. Operands the seam fixes to float32 (rstd, lse, loss stats/weights, AdamW's
 * param/grad/m/v, embeddingBackward's dtable, sumSquares' partials) are checked: a bf16 buffer there is an Error naming
 * it. Matrix products: f32 operands run cublasSgemm (TF32 tensor cores with --tf32); bf16 operands run cublasGemmEx
 * (bf16 tensor cores, float32 accumulation and epilogue, C bf16 or f32 per the output buffer); operands of one product
 * share a dtype (checkMatmulDtypes). A bias is added after the GEMM (beta 0) by bias_add: into a bf16 output the
 * product is rounded, then the bias added and the sum rounded (Backend.matmulForward documents it; the CPU does the
 * same). Filling the bias first and letting the GEMM accumulate (beta 1) rounded once but made cuBLAS pick kernels
 * twice as slow: measured on the H100 at 8192×1536×1536, 119 µs against 57 µs + the add. The model adds a rotated q/k
 * projection's bias inside ropeForward instead (src/model/layer.ts), and runs q, k and v as one product whose split
 * (copyColumns, copy_cols) adds v's bias, so bias_add does not run for them.
 *
 * Memory: only alloc/allocInt allocate. Scratch (sumSquares partials, attention backward's D = rowsum(dout ∘ out) and
 * dK/dV partials, column-reduction partials, cuBLAS workspace) is allocated once at creation with a documented cap
 * (DEFAULT_SCRATCH_BLOCKS, DEFAULT_ATTN_DSUM, DEFAULT_ATTN_DKV_FLOATS, DEFAULT_COLSUM_FLOATS, DEFAULT_CUBLAS_WORKSPACE);
 * ops never allocate (adamwSegments builds its chunk table once per segment list, outside any graph). Everything runs on
 * one stream the backend creates, but a data-parallel step's gradient collectives, which run on a second stream beside
 * the backward pass (sideCollective, joinSide); the only host syncs inside ops are sumSquares and download, bounded in
 * time where a communicator set a WaitGuard (bounded-wait.ts).
 *
 * Captured regions (Backend.captured, graphs.ts): inside one, every launch, GEMM, memset and copy is recorded as an op
 * with its full arguments instead of being issued, then handed to the GraphRunner, which runs the ops, captures them
 * into a CUDA graph, or replays that graph. Kernels are loaded from the (sealed) cache while recording, so a miss there
 * is the same loud event as anywhere. Uploads inside a region are allowed only before its first op (they run at once,
 * ordered before the region's work on the stream); downloads and sumSquares are refused there. A region is handed to
 * the runner in segments (segmentOps) as it records, so the GPU starts on the first while the host records the rest;
 * a body that throws has issued every op recorded before the throw (the full segments through the runner, the rest
 * as launched), as an uncaptured body would have.
 */
import { planKernels } from './plan.js';
import koffi from 'koffi';
import type { AdamWSegment, AdamWStep, Backend, Buf, DocPositions, DType, HostStaging, IntBuf, LossSpec, QkNormWeights, Readback, RopeSpec, RopeStrides, SampleParams, SeqPositions, SparseRowsOut, SparseTargets } from '../backend.js';
import { LOSS_STATS, MAX_SPARSE_SLOTS, checkMatmulDtypes, copyColumnsExtent, dtypeBytes, penaltyAndMinP, plainHostStaging, ropeExtent, seenWords } from '../backend.js';
import { packBf16, unpackBf16 } from '../bf16.js';
import { DistilleryError } from '../../util/errors.js';
import type { KernelCache } from './kernel-cache.js';
import type { CudaDriver } from './ffi/driver.js';
import { CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_16BF, CUDA_R_32F, type Cublas } from './ffi/cublas.js';
import { formatBytes } from './ffi/status.js';
import type { KernelSpec } from './kernels/spec.js';
import { blocksFor } from './kernels/spec.js';
import {
  addRmsnormForward, rmsnormBackward, rmsnormForward, rmsnormRowsBackward, rmsnormRowsForward, ROWS_NORM_MAX_C, ROWS_NORM_WARPS,
} from './kernels/norm.js';
import { ropeKernel, ropeKvKernel } from './kernels/rope.js';
import { dequantNf4 } from './kernels/quant.js';
import { SMEM_DEFAULT, attentionForward } from './kernels/attention.js';
import {
  CACHED_COUNTERS, CACHED_GQA_MAX_GROUP, CACHED_SMALL_GRID, attentionCached, attentionCachedGqa, cachedAttentionBlock, cachedAttentionGqaSmem, cachedAttentionKernel,
  cachedAttentionLargeLayouts, cachedAttentionPickLayout, cachedAttentionPickSplits, cachedAttentionPlan, cachedAttentionSplits, kvCacheWrite, type CachedAttnPlan,
} from './kernels/attention-cached.js';
import { FA_QUERY_TILE, FA_THREADS, attentionForwardBf16, faSmem } from './kernels/attention-bf16.js';
import { CACHED_MMA_MIN_BLOCKS, CACHED_MMA_MIN_ROWS, CACHED_MMA_THREADS, attentionCachedMma, cachedMmaPickVariant, cachedMmaShape } from './kernels/attention-cached-mma.js';
import { MMA_MAX_HEAD_DIM, MMA_QUERY_TILE, attentionForwardMma, mmaForwardSmem } from './kernels/attention-tf32.js';
import {
  accumulateKernel, adamwKernel, addKernel, biasAdd, convertKernel, copyColumnsKernel, biasGrad, colReduce, EMB_BWD_MAX_PER, embeddingBackward, embeddingForward, scaleKernel,
  sumSquares, swigluBackward, swigluBackwardRows, swigluBackwardSet, swigluForward, swigluForwardRows,
} from './kernels/elementwise.js';
import { lossKernel } from './kernels/loss.js';
import { sparseLossKernel, SPARSE_TAIL_MAX_VOCAB } from './kernels/sparse-loss.js';
import { SAMPLE_MAX_TILES, SAMPLE_TILE, sampleRowsKernel, topRowsKernel } from './kernels/sparse-rows.js';
import { decodeAdvanceKernel, sampleTokensKernel } from './kernels/sample.js';
import { OpProfiler, formatProfile, profileFromEnv } from './profile.js';
import { GraphRunner, formatTimeline, graphsFromEnv, segmentFingerprint, timelineFromEnv, type GraphOp, type RegionMode, type TimelineRow } from './graphs.js';
import { ADAMW_CHUNK_WORDS, ADAMW_SCALARS, adamwChunkTable, adamwMultiKernel } from './kernels/elementwise.js';
import type { WaitGuard } from './bounded-wait.js';

import { ATTN_BLOCK, DECODE_ADVANCE_BLOCK, ELEM_BLOCK, EMB_BWD_BLOCK, LOSS_BLOCK, ROW_BLOCK, SAMPLE_ROWS_BLOCK } from './block-sizes.js';
import {
  DEFAULT_ATTN_BACKWARD, DEFAULT_ATTN_CACHED_FLOATS, DEFAULT_ATTN_DKV_FLOATS, DEFAULT_ATTN_DSUM, DEFAULT_ATTN_DS_ELEMS, attentionScratchSizes, bf16MmaOperands,
  maxScratch, planAttentionBackward, simtAttentionTile, type AttentionBackwardImpl, type AttentionScratch,
} from './attention-plan.js';

/** Cap on sumSquares partial sums (one double per block; the grid-stride loop covers any n). */
export const DEFAULT_SCRATCH_BLOCKS = 1024;
/** capturedRepeat checks a repeated region against its body at its first repeat and every this-many after. */
export const REPEAT_CHECK_EVERY = 64;
/** Column-reduction partials (the norms' backward, bias_grad → col_reduce): R row chunks (blocks) × C columns. */
export const DEFAULT_COLSUM_FLOATS = 1 << 20;
/** Row chunks of the two-stage column reductions (stage 1 grid's y) and the fewest rows one chunk sums. */
export const COLSUM_MAX_CHUNKS = 64;
/** Blocks of the warp-per-row norm backward (rmsnorm_rows_bwd): its weight-gradient partials are this many rows of C. */
export const ROWS_NORM_MAX_BLOCKS = 1024;
/**
 * Blocks of the block-per-row norm backward (rmsnorm_bwd, rows wider than ROWS_NORM_MAX_C): each loops over its share
 * of the rows (16 at 8 × 1024 tokens) and leaves one row of weight-gradient partials, so col_reduce sums this many.
 */
export const NORM_BWD_MAX_BLOCKS = 512;
export const COLSUM_MIN_ROWS = 16;
/** cuBLAS workspace, preallocated (cuBLAS recommends 32 MiB on Hopper). */
export const DEFAULT_CUBLAS_WORKSPACE = 32 * 1024 * 1024;

export type CudaMode = 'trace' | 'device';

class CudaBuf implements Buf, IntBuf {
  constructor(readonly length: number, readonly ptr: bigint, readonly label: string, readonly owner: CudaBackend,
    readonly root: boolean, readonly dtype: DType = 'f32', base?: CudaBuf, readonly byteOffset = 0) {
    this.base = base ?? this;
  }
  /** The allocation this buffer is (a view of), and its byte offset there: overlap checks work in trace mode too. */
  readonly base: CudaBuf;
  /** Bytes per element (int buffers are int32: 4, like f32). */
  get elem(): number { return dtypeBytes(this.dtype); }
}

type Arg = { t: 'p'; v: bigint } | { t: 'i'; v: number } | { t: 'l'; v: number } | { t: 'f'; v: number };
const P = (b: Buf | IntBuf | null): Arg => ({ t: 'p', v: b === null ? 0n : (b as CudaBuf).ptr });
const I = (v: number): Arg => ({ t: 'i', v });
const L = (v: number): Arg => ({ t: 'l', v });
const F = (v: number): Arg => ({ t: 'f', v });
const MAX_ARGS = 32;
/** The storage dtype of a float buffer (the baked operand dtype of the kernels that read or write it). */
const D = (b: Buf): DType => b.dtype;

export interface DeviceParts {
  driver: CudaDriver;
  cublas: Cublas;
  cache: KernelCache;
  tf32?: boolean;
  scratchBlocks?: number;
  /** Floats of attention backward's D scratch (default DEFAULT_ATTN_DSUM). */
  attnDsumFloats?: number;
  /** Floats of attention backward's dK/dV partials (default DEFAULT_ATTN_DKV_FLOATS). */
  attnDkvFloats?: number;
  /** bf16 elements of the stored-dS attention backward's scratch (default DEFAULT_ATTN_DS_ELEMS). */
  attnDsElems?: number;
  /** Floats of cached attention's split scratch (default DEFAULT_ATTN_CACHED_FLOATS). */
  attnCachedFloats?: number;
  /** The bf16 tensor-core attention backward (see AttentionBackwardImpl; default 'stored-ds'). */
  attnBackward?: AttentionBackwardImpl;
  /**
   * 'mma' runs the training attention forward on TF32 tensor cores (attention_fwd_mma, ~1e-3 relative) where the
   * head dim allows (multiple of 8, ≤ 128); createCudaBackend picks it with --tf32. Default 'simt' (fp32). prepare()
   * traces with the same choice, so the pre-warm plan holds exactly the kernels this backend launches.
   */
  attention?: 'simt' | 'mma';
  /** Floats of the column-reduction partials (default DEFAULT_COLSUM_FLOATS). */
  colsumFloats?: number;
  cublasWorkspaceBytes?: number;
  log?: (line: string) => void;
  /** Op-level GPU profile printed on dispose (default: DISTILLERY_CUDA_PROFILE=1). See profile.ts. */
  profile?: boolean;
  /** Replay captured regions as CUDA graphs (default on; DISTILLERY_CUDA_GRAPHS=0 turns them off). See graphs.ts. */
  graphs?: boolean;
  /** Print the region timeline on dispose (default: DISTILLERY_CUDA_TIMELINE=1, or with the profile). */
  timeline?: boolean;
}

/** A cached-attention call's kernel, block, splits (0: attention_cached) and split scratch need (CudaBackend.cachedAttentionLaunch). */
interface CachedLaunch { spec: KernelSpec; block: number; splits: number; need: number }

/** What a trace-mode backend must know to launch what a device backend would: its attention implementation. */
export interface TraceOptions {
  attention?: 'simt' | 'mma';
  attnBackward?: AttentionBackwardImpl;
  /**
   * The attention backward's scratch sizes (floats) of the device backend the trace stands for: whether dK/dV splits
   * over the GQA group (attention_dkv_reduce) and how the batch is chunked depend on them, so a plan traced with other
   * sizes than the device has can miss kernels. planKernels derives them (attentionScratchSizes) when not given.
   */
  attnDsumFloats?: number;
  attnDkvFloats?: number;
  attnDsElems?: number;
}

export class CudaBackend implements Backend {
  readonly name: string;
  readonly recordsRegions = true;
  readonly dtype = 'f32' as const;
  readonly mode: CudaMode;
  /** Trace mode: every spec launched, by id, in first-launch order. */
  readonly traced = new Map<string, KernelSpec>();
  /** Kernel launches per family (both modes). */
  readonly launches = new Map<string, number>();
  private readonly dev: DeviceParts | null;
  private readonly fns = new Map<KernelSpec, unknown>();
  private readonly modules: unknown[] = [];
  private readonly allocations: CudaBuf[] = [];
  /** Page-locked host memory of readbacks and host stagings, and their completion events (freed at dispose). */
  private readonly hostAllocations: unknown[] = [];
  private readonly transferEvents: unknown[] = [];
  /** hostStaging's memory by its buffer: an upload from it is a copy queued by address, recorded by its event. */
  private readonly stagings = new Map<ArrayBuffer, { addr: bigint; event: unknown; queued: boolean }>();
  private bytesAllocated = 0;
  // Argument storage for cuLaunchKernel: 256 bytes, so V8 keeps it off-heap and its address never moves.
  private readonly argSlots = Buffer.alloc(MAX_ARGS * 8);
  private readonly argPtrs = Buffer.alloc(MAX_ARGS * 8);
  private partials: CudaBuf | null = null;
  private readonly partialsHost: Float64Array;
  private workspace: CudaBuf | null = null;
  private dsum: CudaBuf | null = null;
  private dsumFloats: number;
  private readonly attnImpl: 'simt' | 'mma';
  /** The training attention forward this backend launches (and traces with in prepare()). */
  get attention(): 'simt' | 'mma' { return this.attnImpl; }
  /** Dynamic shared memory each loaded function has been allowed (cuFuncSetAttribute) beyond the 48 KiB default. */
  private readonly smemAllowed = new Map<unknown, number>();
  /** How each shape of cached-attention call launches (cachedAttentionLaunch), by its shape, operands and split scratch. */
  private readonly cachedLaunches = new Map<string, CachedLaunch>();
  /** The blocks an SM holds of each loaded kernel at the block it launches with (occupancy, by spec). */
  private readonly blocksPerSm = new Map<KernelSpec, number>();
  /** Each loaded kernel's registers and local memory a thread (resources()). */
  private readonly kernelResources = new Map<KernelSpec, { registers: number; localBytes: number }>();
  private dkvPart: CudaBuf | null = null;
  private dkvFloats: number;
  private dsTiles: CudaBuf | null = null;
  private dsElems: number;
  /** Cached attention's split partials, after CACHED_COUNTERS ints of counters (zero between calls). */
  private cachedPart: CudaBuf | null = null;
  private cachedFloats: number;
  private readonly attnBwd: AttentionBackwardImpl;
  /** The bf16 tensor-core attention backward this backend runs (and traces with in prepare()). */
  get attentionBackwardImpl(): AttentionBackwardImpl { return this.attnBwd; }
  /** Whether the attention scratch sizes were given (tests): prepare() then keeps them. */
  private readonly scratchGiven: boolean;
  /** The largest attention-backward scratch a call asked for (both modes): D floats, dK/dV partial floats, dS elements. */
  readonly scratchNeed: AttentionScratch = { dsum: 0, dkv: 0, ds: 0, cached: 0 };
  private colPart: CudaBuf | null = null;
  private readonly colsumFloats: number;
  private disposed = false;
  readonly scratchBlocks: number;
  /** The op profiler (device mode with the profile on); null otherwise, and then each op pays one null check. */
  private readonly prof: OpProfiler | null = null;
  /** Captured regions and the timeline (device mode). */
  private readonly graphs: GraphRunner | null = null;
  private readonly printTimeline: boolean = false;
  /**
   * The captured region being recorded (null outside one): its ops since the last segment was handed to the runner,
   * the segment's index, the ops recorded in the whole region, and when the segment's recording began.
   */
  private rec: {
    label: string; ops: GraphOp[]; seg: number; total: number; t0: number;
    /** capturedRepeat: the region's segments, kept to issue again; `run` false: recorded only (a repeat's check). */
    kept?: GraphOp[][]; run?: boolean;
  } | null = null;
  /** The mode the last captured region ran in (tests and the bench read it). */
  lastRegionMode: RegionMode | null = null;
  /** AdamW's per-step values in device memory (ADAMW_SCALARS floats) and the chunk tables of adamwSegments. */
  private adamScalars: CudaBuf | null = null;
  private readonly chunkTables = new Map<string, { buf: CudaBuf; chunks: number }>();

  constructor(mode: 'trace', trace?: TraceOptions);
  constructor(mode: 'device', parts: DeviceParts);
  constructor(mode: CudaMode, partsOrTrace?: DeviceParts | TraceOptions) {
    this.mode = mode;
    const parts = mode === 'device' ? partsOrTrace as DeviceParts | undefined : undefined;
    this.dev = parts ?? null;
    if (mode === 'device' && !parts) throw new Error('CudaBackend device mode needs a driver, cuBLAS and a kernel cache');
    this.scratchBlocks = parts?.scratchBlocks ?? DEFAULT_SCRATCH_BLOCKS;
    this.partialsHost = new Float64Array(this.scratchBlocks);
    // The attention kernels' choices and scratch sizes: a device's, or the device's a trace stands for (TraceOptions).
    const o: TraceOptions | undefined = partsOrTrace;
    this.dsumFloats = o?.attnDsumFloats ?? DEFAULT_ATTN_DSUM;
    this.attnImpl = o?.attention ?? 'simt';
    this.attnBwd = o?.attnBackward ?? DEFAULT_ATTN_BACKWARD;
    this.dkvFloats = o?.attnDkvFloats ?? DEFAULT_ATTN_DKV_FLOATS;
    this.dsElems = o?.attnDsElems ?? DEFAULT_ATTN_DS_ELEMS;
    // (cached attention's split count depends on it, its kernel does not: a trace needs no size)
    this.cachedFloats = parts?.attnCachedFloats ?? DEFAULT_ATTN_CACHED_FLOATS;
    this.scratchGiven = parts?.attnDsumFloats !== undefined || parts?.attnDkvFloats !== undefined || parts?.attnDsElems !== undefined ||
      parts?.attnCachedFloats !== undefined;
    this.colsumFloats = parts?.colsumFloats ?? DEFAULT_COLSUM_FLOATS;
    this.name = mode === 'trace' ? 'cuda-trace' : `cuda (${parts!.driver.deviceName}, ${parts!.driver.arch})`;
    if (this.dev) {
      parts!.driver.useStream();
      const base = koffiAddress(this.argSlots);
      for (let i = 0; i < MAX_ARGS; i++) this.argPtrs.writeBigUInt64LE(base + BigInt(i * 8), i * 8);
      this.partials = this.rawAlloc(this.scratchBlocks * 2, 'sumSquares scratch');
      this.dsum = this.rawAlloc(this.dsumFloats, 'attention backward scratch');
      this.dkvPart = this.rawAlloc(this.dkvFloats, 'attention backward dK/dV partials');
      this.dsTiles = this.rawAlloc(this.dsElems, 'attention backward dS tiles', 'bf16');
      this.cachedPart = this.rawAlloc(this.cachedFloats, 'cached attention split partials');
      this.colPart = this.rawAlloc(this.colsumFloats, 'column-reduction partials');
      const ws = parts!.cublasWorkspaceBytes ?? DEFAULT_CUBLAS_WORKSPACE;
      this.workspace = this.rawAlloc(Math.ceil(ws / 4), 'cuBLAS workspace');
      // The stream first: cublasSetStream resets the workspace.
      this.dev.cublas.setStream(parts!.driver.currentStream);
      this.dev.cublas.setWorkspace(this.workspace.ptr, ws);
      this.dev.cublas.setMathMode(parts!.tf32 ?? false);
      this.adamScalars = this.rawAlloc(ADAMW_SCALARS, 'AdamW step values');
      if (parts!.profile ?? profileFromEnv()) this.prof = new OpProfiler(parts!.driver);
      const log = parts!.log ?? ((l: string) => process.stderr.write(`${l}\n`));
      this.graphs = new GraphRunner(parts!.driver, { enabled: parts!.graphs ?? graphsFromEnv(), log, profile: this.prof });
      this.printTimeline = parts!.timeline ?? (timelineFromEnv() || this.prof !== null);
    }
  }

  get cache(): KernelCache | null { return this.dev?.cache ?? null; }
  get bytesInUse(): number { return this.bytesAllocated; }

  /** Free and total memory of the GPU (cuMemGetInfo); null in trace mode, which has no GPU. */
  deviceMemory(): { free: number; total: number } | null {
    if (!this.dev) return null;
    if (this.disposed) throw new Error('CudaBackend used after dispose()');
    return this.dev.driver.memInfo();
  }

  // ---- kernel launch: the one place both modes meet -------------------------------------------------
  /** The loaded function of spec (compiled or read through the cache on first use). */
  private fnFor(spec: KernelSpec, dev: DeviceParts): unknown {
    let fn = this.fns.get(spec);
    if (fn === undefined) {
      const cubin = dev.cache.get(spec);
      const loaded = dev.driver.loadFunction(cubin, spec.entry, `loading kernel ${spec.describe()}`);
      this.modules.push(loaded.module);
      fn = loaded.fn;
      this.fns.set(spec, fn);
    }
    return fn;
  }

  /** The registers and local memory a thread of spec's kernel uses, as the driver reports. */
  private resources(spec: KernelSpec, dev: DeviceParts): { registers: number; localBytes: number } {
    let r = this.kernelResources.get(spec);
    if (r === undefined) {
      r = dev.driver.resources(this.fnFor(spec, dev), `reading the registers of ${spec.describe()}`);
      this.kernelResources.set(spec, r);
    }
    return r;
  }

  /** The blocks of `block` threads of spec's kernel (static shared memory only) one SM holds, as the driver reports. */
  private occupancy(spec: KernelSpec, block: number, dev: DeviceParts): number {
    let n = this.blocksPerSm.get(spec);
    if (n === undefined) {
      n = dev.driver.occupancy(this.fnFor(spec, dev), block, 0, `reading the occupancy of ${spec.describe()}`);
      this.blocksPerSm.set(spec, n);
    }
    return n;
  }

  /** `smem`: dynamic shared memory per block, bytes (above SMEM_DEFAULT the function is opted in once). */
  private launch(spec: KernelSpec, grid: readonly [number, number, number], block: number, args: Arg[], smem = 0): void {
    this.launches.set(spec.family, (this.launches.get(spec.family) ?? 0) + 1);
    if (!this.dev) {
      if (!this.traced.has(spec.id)) this.traced.set(spec.id, spec);
      return;
    }
    const fn = this.fnFor(spec, this.dev);
    if (smem > SMEM_DEFAULT && (this.smemAllowed.get(fn) ?? 0) < smem) {
      this.dev.driver.setMaxDynamicShared(fn, smem, `allowing ${smem} bytes of shared memory for ${spec.describe()}`);
      this.smemAllowed.set(fn, smem);
    }
    if (args.length > MAX_ARGS) throw new Error(`too many kernel arguments (${args.length})`);
    const s = this.argSlots;
    for (let i = 0; i < args.length; i++) {
      const a = args[i]!;
      const o = i * 8;
      switch (a.t) {
        case 'p': s.writeBigUInt64LE(a.v, o); break;
        // 4-byte arguments clear the slot's upper half: a recorded op's fingerprint is its whole argument bytes.
        case 'i': s.writeInt32LE(a.v, o); s.writeInt32LE(0, o + 4); break;
        case 'l': s.writeBigInt64LE(BigInt(a.v), o); break;
        case 'f': s.writeFloatLE(a.v, o); s.writeInt32LE(0, o + 4); break;
      }
    }
    const driver = this.dev.driver, ptrs = this.argPtrs;
    if (this.rec) {
      const bytes = Buffer.from(s.subarray(0, args.length * 8));
      const what = `launching ${spec.describe()} grid=${grid.join('x')}`;
      this.record({
        fp: `k ${spec.id} ${grid.join(',')} ${block} ${smem} ${bytes.toString('hex')}`, key: spec.family,
        issue: () => { bytes.copy(s); driver.launch(fn, grid, block, smem, ptrs, what); },
      });
      return;
    }
    const prof = this.prof;
    prof?.begin();
    driver.launch(fn, grid, block, smem, ptrs, `launching ${spec.describe()} grid=${grid.join('x')}`);
    prof?.end(spec.family);
  }

  /** Records a non-kernel op inside a captured region, or issues it now (profiled) outside one. */
  private emit(fp: string, key: string, issue: () => void): void {
    if (this.rec) { this.record({ fp, key, issue }); return; }
    const prof = this.prof;
    prof?.begin();
    issue();
    prof?.end(key);
  }

  /** A host transfer inside a captured region: uploads only before the region's first op; nothing read back. */
  private hostTransfer(what: string, upload: boolean): void {
    if (this.rec === null) return;
    if (this.rec.kept) throw new Error(`${what} inside the repeated region "${this.rec.label}": a repeat issues its recorded ops only; upload its inputs before it`);
    if (upload && this.rec.total === 0) return;
    throw new Error(upload
      ? `${what} inside the captured region "${this.rec.label}" after its first GPU op: upload a region's inputs before its work`
      : `${what} inside the captured region "${this.rec.label}": a region only issues GPU work; read results after it`);
  }

  /**
   * Adds an op to the region being recorded; a full segment goes to the runner at once (run, captured or replayed),
   * so the GPU works on it while the host records the next. Segment k holds segmentOps(k) ops: small first (the GPU
   * waits for the first segment's recording), larger after. Segment boundaries depend only on the op count and on
   * where the region forks a collective to the side stream (sideCollective), so the same region cuts into the same
   * segments every time.
   */
  private record(op: GraphOp): void {
    const r = this.rec!;
    r.ops.push(op);
    r.total++;
    if (r.ops.length >= segmentOps(r.seg)) this.flushSegment();
  }

  private flushSegment(): void {
    const r = this.rec!;
    if (r.ops.length === 0) return;
    const now = performance.now();
    r.kept?.push(r.ops);
    if (r.run !== false) this.lastRegionMode = this.graphs!.run(r.label, r.seg, r.ops, now - r.t0);
    r.ops = [];
    r.seg++;
    r.t0 = performance.now();
  }

  captured<R>(label: string, body: () => R): R {
    if (!this.dev || !this.graphs) return body();
    return this.recordRegion(label, body, null);
  }

  /**
   * Runs body as a captured region; with `keep`, its segments are kept in keep.kept (and with keep.run false recorded
   * only: nothing issued, a repeat's check). A body that throws has issued the ops it recorded, as uncaptured.
   */
  private recordRegion<R>(label: string, body: () => R, keep: { kept: GraphOp[][]; run: boolean } | null): R {
    if (this.rec) throw new Error(`captured region "${label}" opened inside "${this.rec.label}"`);
    this.rec = { label, ops: [], seg: 0, total: 0, t0: performance.now(), ...keep };
    try {
      const out = body();
      this.flushSegment();
      return out;
    } catch (err) {
      // The ops recorded before the throw run as launched, as an uncaptured body would have issued them.
      const pending = this.rec?.run === false ? [] : this.rec?.ops ?? [];
      this.rec = null;
      for (const op of pending) op.issue();
      throw err;
    } finally {
      this.rec = null;
    }
  }

  /**
   * Backend.capturedRepeat: the region is recorded once, as captured() records it, keeping its segments; `again` hands
   * the same segments to the graph runner (their fingerprints computed once), so a replay costs the host a graph launch
   * a segment and nothing a op. `again` records the body once more without issuing it at its first call and every
   * REPEAT_CHECK_EVERY-th after, and throws naming the region when what it records differs from what it repeats.
   */
  capturedRepeat(label: string, body: () => void): () => void {
    if (!this.dev || !this.graphs) { body(); return body; }
    const segs = this.recordKept(label, body, true);
    const fps = segs.map(segmentFingerprint);
    let calls = 0;
    return () => {
      if (this.rec) throw new Error(`captured region "${label}" repeated inside "${this.rec.label}"`);
      if (calls++ % REPEAT_CHECK_EVERY === 0) {
        const now = this.recordKept(label, body, false).map(segmentFingerprint);
        if (now.length !== fps.length || now.some((fp, i) => fp !== fps[i])) {
          throw new Error(`captured region "${label}" repeated: its body now issues other work than when it was recorded (a host value it reads changed); record it again instead`);
        }
      }
      const t0 = performance.now();
      segs.forEach((ops, i) => { this.lastRegionMode = this.graphs!.run(label, i, ops, i === 0 ? performance.now() - t0 : 0, fps[i]); });
    };
  }

  /** The segments of body recorded as a region (issued as captured() issues them, or with `run` false not at all). */
  private recordKept(label: string, body: () => void, run: boolean): GraphOp[][] {
    const kept: GraphOp[][] = [];
    this.recordRegion(label, body, { kept, run });
    return kept;
  }

  /** Regions replayed from CUDA graphs and graphs captured so far. */
  get graphStats(): { captures: number; replays: number; enabled: boolean } {
    return { captures: this.graphs?.captures ?? 0, replays: this.graphs?.replays ?? 0, enabled: this.graphs?.enabled ?? false };
  }

  /** The region timeline so far (waits for the GPU); empty in trace mode. */
  timeline(): TimelineRow[] { return this.graphs?.timeline() ?? []; }

  /**
   * C = op(A)·op(B) (+ C), column-major. A and B share a dtype (the callers check): f32 → cublasSgemm (the handle's
   * math mode: TF32 with --tf32); bf16 → cublasGemmEx (bf16 tensor cores, float32 compute; C bf16 or f32 per its
   * buffer). `profKey` names the GEMM in the op profile (op, dtype when bf16, shape).
   */
  private gemm(transA: number, transB: number, m: number, n: number, k: number, A: Buf, lda: number, B: Buf, ldb: number,
    C: Buf, ldc: number, accumulate: boolean, what: string, profKey: string): void {
    if (!this.dev) return;
    const cublas = this.dev.cublas;
    const a = (A as CudaBuf).ptr, b = (B as CudaBuf).ptr, c = (C as CudaBuf).ptr;
    const fp = `g ${A.dtype} ${C.dtype} ${transA} ${transB} ${m} ${n} ${k} ${a} ${lda} ${b} ${ldb} ${c} ${ldc} ${accumulate ? 1 : 0}`;
    if (A.dtype === 'bf16') {
      const cType = C.dtype === 'bf16' ? CUDA_R_16BF : CUDA_R_32F;
      this.emit(fp, profKey, () => cublas.gemmEx(transA, transB, m, n, k, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, c, cType, ldc, accumulate, what));
    } else {
      if (C.dtype !== 'f32') throw new Error(`${what}: an f32 matrix product cannot write the bf16 output ${(C as CudaBuf).label}`);
      this.emit(fp, profKey, () => cublas.sgemm(transA, transB, m, n, k, a, lda, b, ldb, c, ldc, accumulate, what));
    }
  }

  // ---- memory ---------------------------------------------------------------------------------------
  private rawAlloc(n: number, label: string, dtype: DType = 'f32'): CudaBuf {
    if (this.disposed) throw new Error('CudaBackend used after dispose()');
    if (!Number.isInteger(n) || n < 0) throw new Error(`alloc(${n}, ${label}): bad length`);
    if (dtype !== 'f32' && dtype !== 'bf16') throw new Error(`alloc(${n}, ${label}): unknown dtype ${String(dtype)}`);
    const bytes = n * dtypeBytes(dtype);
    let ptr = 0n;
    if (this.dev) {
      // 256-byte aligned (cuMemAlloc), so vectorized loads of whole buffers are aligned.
      ptr = this.dev.driver.memAlloc(Math.max(bytes, 4), `allocating ${label}`);
      this.dev.driver.memsetD8(ptr, 0, bytes, `zeroing ${label}`);
    }
    const b = new CudaBuf(n, ptr, label, this, true, dtype);
    this.allocations.push(b);
    this.bytesAllocated += bytes;
    return b;
  }

  alloc(n: number, label: string, dtype: DType = 'f32'): Buf { return this.rawAlloc(n, label, dtype); }
  allocInt(n: number, label: string): IntBuf { return this.rawAlloc(n, label); }

  view(buf: Buf, offset: number, length: number): Buf {
    const b = this.own(buf, 'view');
    if (offset < 0 || length < 0 || offset + length > b.length) {
      throw new Error(`view [${offset}, ${offset + length}) out of range for ${b.label} (${b.length})`);
    }
    return new CudaBuf(length, b.ptr + BigInt(offset * b.elem), `${b.label}[${offset}:${offset + length}]`, this, false, b.dtype,
      b.base, b.byteOffset + offset * b.elem);
  }

  viewInt(buf: IntBuf, offset: number, length: number): IntBuf { return this.view(this.own(buf, 'viewInt'), offset, length); }

  upload(dst: Buf, src: ArrayLike<number>, dstOffset = 0): void {
    const d = this.own(dst, 'upload');
    if (dstOffset + src.length > d.length) throw new Error(`upload of ${src.length} at ${dstOffset} overflows ${d.label} (${d.length})`);
    this.hostTransfer(`uploading ${d.label}`, true);
    if (!this.dev || src.length === 0) return;
    const f = d.dtype === 'bf16' ? packBf16(src) : src instanceof Float32Array ? src : Float32Array.from(src);
    this.htod(d.ptr + BigInt(dstOffset * d.elem), f, f.length * d.elem, `uploading ${d.label}`);
  }

  uploadBf16(dst: Buf, bits: Uint16Array): void {
    const d = this.own(dst, 'uploadBf16');
    if (d.dtype !== 'bf16') throw new Error(`uploadBf16 into ${d.label}, a ${d.dtype} buffer (bf16 only)`);
    if (bits.length > d.length) throw new Error(`uploadBf16 of ${bits.length} overflows ${d.label} (${d.length})`);
    this.hostTransfer(`uploading ${d.label}`, true);
    if (!this.dev || bits.length === 0) return;
    this.htod(d.ptr, bits, bits.length * 2, `uploading ${d.label}`);
  }

  uploadInt(dst: IntBuf, src: Int32Array): void {
    const d = this.own(dst, 'uploadInt');
    if (src.length > d.length) throw new Error(`uploadInt of ${src.length} overflows ${d.label} (${d.length})`);
    this.hostTransfer(`uploading ${d.label}`, true);
    if (!this.dev || src.length === 0) return;
    this.htod(d.ptr, src, src.length * 4, `uploading ${d.label}`);
  }

  /** An upload's copy: by address and recorded on its staging's event where src lies in a hostStaging, else from pageable memory. */
  private htod(dst: bigint, src: ArrayBufferView, bytes: number, what: string): void {
    const driver = this.dev!.driver;
    const st = this.stagings.get(src.buffer as ArrayBuffer);
    if (st === undefined) { driver.htod(dst, src, bytes, what); return; }
    driver.htodAsync(dst, st.addr + BigInt(src.byteOffset), bytes, what);
    driver.recordOn(st.event, what);
    st.queued = true;
  }

  hostStaging(bytes: number, label: string): HostStaging {
    if (this.disposed) throw new Error('CudaBackend used after dispose()');
    if (!Number.isInteger(bytes) || bytes < 0) throw new Error(`hostStaging(${bytes}, ${label}): bad size`);
    const dev = this.dev;
    if (!dev) return plainHostStaging(bytes); // trace mode: uploads copy nothing
    const host = dev.driver.hostAlloc(bytes, `allocating page-locked host memory for ${label}`);
    this.hostAllocations.push(host.ptr);
    const event = dev.driver.eventCreate(false);
    this.transferEvents.push(event);
    const st = { addr: host.addr, event, queued: false };
    this.stagings.set(host.buffer, st);
    return {
      buffer: host.buffer,
      settle: () => {
        if (!st.queued) return;
        dev.driver.waitEvent(event, `waiting for the uploads from ${label}`);
        st.queued = false;
      },
    };
  }

  downloadInt(src: IntBuf): Int32Array {
    const s = this.own(src, 'downloadInt');
    this.hostTransfer(`downloading ${s.label}`, false);
    const out = new Int32Array(s.length);
    if (this.dev && s.length > 0) this.dev.driver.dtoh(out, s.ptr, s.length * 4, `downloading ${s.label}`);
    return out;
  }

  /**
   * Page-locked host arrays (one allocation per readback, freed at dispose), an async copy per buffer and a completion
   * event; without a GPU (trace mode) the arrays stay zero.
   */
  readback(floats: Buf[], ints: IntBuf[], label: string): Readback {
    const parts = [...floats, ...ints].map((b) => this.own(b, 'readback'));
    for (const p of parts.slice(0, floats.length)) if (p.dtype !== 'f32') throw new Error(`readback of ${p.label}: a ${p.dtype} buffer (float32 only)`);
    const bytes = parts.reduce((a, p) => a + p.length * 4, 0);
    const dev = this.dev;
    const host = dev ? dev.driver.hostAlloc(bytes, `allocating page-locked host memory for ${label}`) : { ptr: null, addr: 0n, buffer: new ArrayBuffer(bytes) };
    if (dev) this.hostAllocations.push(host.ptr);
    const ev = dev ? dev.driver.eventCreate(false) : null;
    if (ev !== null) this.transferEvents.push(ev);
    let at = 0;
    const offsets = parts.map((p) => { const o = at; at += p.length * 4; return o; });
    const out = {
      floats: parts.slice(0, floats.length).map((p, k) => new Float32Array(host.buffer, offsets[k]!, p.length)),
      ints: parts.slice(floats.length).map((p, k) => new Int32Array(host.buffer, offsets[floats.length + k]!, p.length)),
    };
    let queued = false;
    return {
      queue: () => {
        this.hostTransfer(`reading back ${label}`, false);
        if (!dev) return;
        parts.forEach((p, k) => { if (p.length > 0) dev.driver.dtohAsync(host.addr + BigInt(offsets[k]!), p.ptr, p.length * 4, `reading back ${p.label}`); });
        dev.driver.recordOn(ev, `reading back ${label}`);
        queued = true;
      },
      wait: () => {
        if (dev && queued) { dev.driver.waitEvent(ev, `waiting for the readback of ${label}`); queued = false; }
        return out;
      },
    };
  }

  download(src: Buf, into?: Float32Array): Float32Array {
    const s = this.own(src, 'download');
    if (into !== undefined && into.length !== s.length) throw new Error(`download of ${s.label} (${s.length}) into ${into.length} floats`);
    this.hostTransfer(`downloading ${s.label}`, false);
    if (s.dtype === 'bf16') {
      const h = new Uint16Array(s.length);
      if (this.dev && s.length > 0) this.dev.driver.dtoh(h, s.ptr, s.length * 2, `downloading ${s.label}`);
      return unpackBf16(h, into);
    }
    const out = into ?? new Float32Array(s.length);
    if (this.dev && s.length > 0) this.dev.driver.dtoh(out, s.ptr, s.length * 4, `downloading ${s.label}`);
    else if (!this.dev && into) into.fill(0); // a trace has no values: zeros, as a new array would hold
    return out;
  }

  zero(buf: Buf): void {
    const b = this.own(buf, 'zero');
    if (this.dev && b.length > 0) {
      const driver = this.dev.driver, ptr = b.ptr, what = `zeroing ${b.label}`;
      if (b.dtype === 'f32') this.emit(`z32 ${ptr} ${b.length}`, 'memset (zero)', () => driver.memsetD32(ptr, 0, b.length, what));
      else this.emit(`z8 ${ptr} ${b.length * b.elem}`, 'memset (zero)', () => driver.memsetD8(ptr, 0, b.length * b.elem, what));
    }
  }

  copy(dst: Buf, src: Buf): void {
    const d = this.own(dst, 'copy'), s = this.own(src, 'copy');
    if (s.length > d.length) throw new Error(`copy of ${s.label} (${s.length}) into ${d.label} (${d.length}) overflows`);
    if (s.dtype !== d.dtype) {
      if (s.length > 0) this.elementwise(convertKernel.make({ out: d.dtype, inp: s.dtype, block: ELEM_BLOCK }), s.length, [P(d), P(s)]);
      return;
    }
    if (this.dev && s.length > 0) {
      const driver = this.dev.driver, dp = d.ptr, sp = s.ptr, bytes = s.length * s.elem, what = `copying ${s.label} to ${d.label}`;
      this.emit(`c ${dp} ${sp} ${bytes}`, 'memcpy (device to device)', () => driver.dtod(dp, sp, bytes, what));
    }
  }

  /** Pre-warm: plan (planFor), compile every kernel the plan holds (in parallel), seal. */
  async prepare(runs: ReadonlyArray<(b: Backend) => void>): Promise<void> {
    if (!this.dev) return;
    const t0 = Date.now();
    const specs = this.planFor(runs);
    await this.dev.cache.prewarm(specs);
    this.dev.log?.(`[kernel-cache] pre-warm: ${specs.length} kernels ready in ${Date.now() - t0} ms; cache sealed`);
  }

  /**
   * The kernels `runs` launch on this backend: sizes the attention scratch for them first when it may (not given
   * explicitly, no graph holds the old address yet: attentionScratchSizes), then traces with this backend's attention
   * implementation and scratch sizes, so the plan takes the same branches the device will.
   */
  planFor(runs: ReadonlyArray<(b: Backend) => void>): KernelSpec[] {
    if (this.dev && !this.scratchGiven && (this.graphs?.captures ?? 0) === 0) {
      const need: AttentionScratch = { dsum: 0, dkv: 0, ds: 0, cached: 0 };
      // The needs are traced at the default sizes (as planKernels does), not at sizes an earlier prepare() chose.
      planKernels(runs, {
        attention: this.attnImpl, attnBackward: this.attnBwd,
        attnDsumFloats: DEFAULT_ATTN_DSUM, attnDkvFloats: DEFAULT_ATTN_DKV_FLOATS, attnDsElems: DEFAULT_ATTN_DS_ELEMS,
        onTraced: (b) => maxScratch(need, b.scratchNeed),
      });
      const sizes = attentionScratchSizes(need);
      if (sizes) this.sizeScratch(sizes);
    }
    return planKernels(runs, {
      attention: this.attnImpl, attnBackward: this.attnBwd, attnDsumFloats: this.dsumFloats, attnDkvFloats: this.dkvFloats, attnDsElems: this.dsElems,
    });
  }

  /**
   * Reallocates the attention scratch at the given sizes (D, partials and cached attention's split scratch in floats, dS
   * in bf16 elements); a new allocation is zeroed, so cached attention's counters start at zero.
   */
  private sizeScratch({ dsum, dkv, ds, cached }: AttentionScratch): void {
    if (!this.dev) return;
    const swap = (old: CudaBuf | null, n: number, label: string, dtype: DType = 'f32'): CudaBuf => {
      if (old) {
        this.allocations.splice(this.allocations.indexOf(old), 1);
        this.bytesAllocated -= old.length * old.elem;
        this.dev!.driver.memFree(old.ptr);
      }
      return this.rawAlloc(n, label, dtype);
    };
    if (dsum !== this.dsumFloats) { this.dsum = swap(this.dsum, dsum, 'attention backward scratch'); this.dsumFloats = dsum; }
    if (dkv !== this.dkvFloats) { this.dkvPart = swap(this.dkvPart, dkv, 'attention backward dK/dV partials'); this.dkvFloats = dkv; }
    if (ds !== this.dsElems) { this.dsTiles = swap(this.dsTiles, ds, 'attention backward dS tiles', 'bf16'); this.dsElems = ds; }
    if (cached !== this.cachedFloats) { this.cachedPart = swap(this.cachedPart, cached, 'cached attention split partials'); this.cachedFloats = cached; }
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    if (this.dev) {
      // Dispose never throws: every failure is logged by name (CudaError's message) and the teardown goes on.
      const dev = this.dev;
      const log = dev.log ?? ((l: string) => process.stderr.write(`${l}\n`));
      const attempt = (what: string, fn: () => void): void => {
        try { fn(); } catch (e) { log(`[cuda] dispose: ${what} failed: ${e instanceof Error ? e.message : String(e)}`); }
      };
      attempt('synchronize', () => dev.driver.synchronize('finishing before dispose'));
      log(dev.cache.summary());
      const graphs = this.graphs;
      if (graphs) {
        if (this.printTimeline) attempt('reading the timeline', () => log(formatTimeline(graphs.timeline())));
        const g = this.graphStats;
        if (g.captures > 0) log(`[cuda-graphs] ${g.captures} graphs captured, ${g.replays} replays`);
        graphs.dispose((e) => log(`[cuda] dispose: graphs: ${e instanceof Error ? e.message : String(e)}`));
      }
      const prof = this.prof;
      if (prof) {
        attempt('reading the op profile', () => log(this.profileTable()!));
        prof.dispose((e) => log(`[cuda] dispose: profile events: ${e instanceof Error ? e.message : String(e)}`));
      }
      for (const b of this.allocations) attempt(`freeing ${b.label}`, () => dev.driver.memFree(b.ptr));
      for (const h of this.hostAllocations) attempt('freeing page-locked host memory', () => dev.driver.hostFree(h));
      for (const ev of this.transferEvents) attempt('destroying a transfer event', () => dev.driver.eventDestroy(ev));
      this.hostAllocations.length = 0; this.transferEvents.length = 0; this.stagings.clear();
      for (const m of this.modules) attempt('unloading a kernel module', () => dev.driver.unloadModule(m));
      this.modules.length = 0;
      this.fns.clear();
      attempt('destroying the cuBLAS handle', () => dev.cublas.destroy());
      attempt('destroying the stream', () => dev.driver.destroyStream());
      attempt('releasing the CUDA context', () => dev.driver.release());
    }
    this.allocations.length = 0;
    this.bytesAllocated = 0;
  }

  /** The op profile table so far (null when the profile is off). See profile.ts. */
  profileTable(): string | null {
    return this.prof ? formatProfile(this.prof.rows(), this.prof.wallMs()) : null;
  }

  /**
   * A buffer as a collective operand (src/parallel/nccl.ts): its device address and dtype, and the stream every op of this
   * backend is ordered on, so that NCCL's collectives queue behind the step's work. Not inside a captured region.
   */
  collectiveOperand(buf: Buf, offset = 0): { ptr: bigint; dtype: DType; elem: number; stream: unknown } {
    const b = this.own(buf, 'collective');
    if (!this.dev) throw new Error('collective: a trace backend has no device memory');
    return { ptr: b.ptr + BigInt(offset * b.elem), dtype: buf.dtype, elem: b.elem, stream: this.dev.driver.currentStream };
  }

  /**
   * Issues collective work on the side stream, after all the work issued so far: inside a captured region the ops
   * recorded so far go to the graph runner first (a segment ends here), so the fork sits between two graphs and the
   * collective runs beside the region's later segments. The main stream waits for it at joinSide(). Not in trace mode.
   */
  sideCollective(what: string, issue: (stream: unknown) => void): void {
    if (!this.dev) throw new Error('sideCollective: a trace backend has no device');
    if (this.rec?.kept) throw new Error(`captured region "${this.rec.label}" forks a collective to the side stream: it cannot be repeated`);
    if (this.rec) this.flushSegment();
    this.dev.driver.forkSide(what);
    issue(this.dev.driver.sideStream);
    this.sidePending = true;
  }
  private sidePending = false;

  /** The main stream waits for the side stream's collectives (outside a captured region: a host call, no wait). */
  joinSide(): void {
    if (!this.sidePending || !this.dev) return;
    if (this.rec) throw new Error(`joinSide inside the captured region "${this.rec.label}"`);
    this.dev.driver.joinSide('waiting for the side stream\'s collectives');
    this.sidePending = false;
  }

  /** Bounds the host's waits for the GPU (bounded-wait.ts; NCCL installs one); null: plain synchronizing waits. */
  setWaitGuard(g: WaitGuard | null): void { if (this.dev) this.dev.driver.waitGuard = g; }

  /** Waits for all queued GPU work (tests and timings; ops never need it). */
  synchronize(): void { this.dev?.driver.synchronize('synchronizing'); }

  memoryReport(): string {
    const lines = this.allocations.filter((b) => b.root).map((b) => `${b.label}: ${formatBytes(b.length * b.elem)}`);
    return `${formatBytes(this.bytesAllocated)} in ${lines.length} buffers\n${lines.join('\n')}`;
  }

  private own(b: Buf | IntBuf, op: string): CudaBuf {
    if (!(b instanceof CudaBuf) || b.owner !== this) throw new Error(`${op}: buffer does not belong to this CUDA backend`);
    return b;
  }

  private need(b: Buf | IntBuf, n: number, what: string): void {
    const c = this.own(b, what);
    if (n > c.length) throw new Error(`${what}: ${c.label} has ${c.length} elements, needs ${n}`);
  }

  /** Operands the seam fixes to float32 (backend.ts documents which): a bf16 buffer there is refused by name. */
  private f32Only(what: string, operands: ReadonlyArray<readonly [string, Buf | null]>): void {
    for (const [name, b] of operands) {
      if (b !== null && b.dtype !== 'f32') {
        throw new Error(`${what}: ${name} (${(b as CudaBuf).label}) is ${b.dtype}, but the CUDA backend keeps ${name} in f32`);
      }
    }
  }

  /**
   * The vectorized elementwise kernels (kernels/elementwise.ts `typed`): 8 elements per thread step when every operand
   * is 16-byte aligned (the kernel checks the same), so the grid is sized for n/8; else for n (scalar loop).
   */
  private elementwise(spec: KernelSpec, n: number, args: Arg[]): void {
    if (n <= 0) return;
    const aligned = args.every((a) => a.t !== 'p' || (a.v & 15n) === 0n);
    this.launch(spec, [blocksFor(aligned ? Math.ceil(n / 8) : n, ELEM_BLOCK), 1, 1], ELEM_BLOCK, [...args, L(n)]);
  }

  // ---- elementwise ----------------------------------------------------------------------------------
  add(out: Buf, a: Buf, b: Buf, n: number): void {
    this.need(out, n, 'add'); this.need(a, n, 'add'); this.need(b, n, 'add');
    this.elementwise(addKernel.make({ out: D(out), a: D(a), b: D(b), block: ELEM_BLOCK }), n, [P(out), P(a), P(b)]);
  }

  accumulate(dst: Buf, src: Buf, n: number): void {
    this.need(dst, n, 'accumulate'); this.need(src, n, 'accumulate');
    this.elementwise(accumulateKernel.make({ dst: D(dst), src: D(src), block: ELEM_BLOCK }), n, [P(dst), P(src)]);
  }

  scale(buf: Buf, s: number, n: number): void {
    this.need(buf, n, 'scale');
    this.elementwise(scaleKernel.make({ buf: D(buf), block: ELEM_BLOCK }), n, [P(buf), F(s)]);
  }

  dequantNf4(out: Buf, codes: IntBuf, absmax: Buf, n: number, blockSize: number): void {
    this.need(out, n, 'dequantNf4'); this.need(codes, Math.ceil(n / 8), 'dequantNf4'); this.need(absmax, Math.ceil(n / blockSize), 'dequantNf4');
    this.f32Only('dequantNf4', [['absmax', absmax]]);
    if (n <= 0) return;
    this.launch(dequantNf4.make({ out: D(out), block: ELEM_BLOCK, nf4Block: blockSize }), [blocksFor(Math.ceil(n / 8), ELEM_BLOCK), 1, 1], ELEM_BLOCK,
      [P(out), P(codes), P(absmax), L(n)]);
  }

  sumSquares(buf: Buf, n: number): number {
    this.need(buf, n, 'sumSquares');
    if (n <= 0) return 0;
    this.hostTransfer('sumSquares', false);
    const blocks = Math.min(this.scratchBlocks, Math.ceil(n / ELEM_BLOCK));
    const spec = sumSquares.make({ x: D(buf), block: ELEM_BLOCK });
    this.launch(spec, [blocks, 1, 1], ELEM_BLOCK, [P(this.partials), P(buf), L(n)]);
    if (!this.dev) return 0;
    this.dev.driver.dtoh(this.partialsHost, this.partials!.ptr, blocks * 8, 'reading sumSquares partials');
    let s = 0;
    for (let i = 0; i < blocks; i++) s += this.partialsHost[i]!;
    return s;
  }

  // ---- layers ---------------------------------------------------------------------------------------
  embeddingForward(out: Buf, ids: IntBuf, table: Buf, n: number, c: number): void {
    this.need(out, n * c, 'embeddingForward'); this.need(ids, n, 'embeddingForward'); this.own(table, 'embeddingForward');
    if (n * c <= 0) return;
    this.launch(embeddingForward.make({ out: D(out), table: D(table), block: ELEM_BLOCK }), [blocksFor(n * c, ELEM_BLOCK), 1, 1], ELEM_BLOCK,
      [P(out), P(ids), P(table), L(n * c), I(c)]);
  }

  embeddingBackward(dtable: Buf, dout: Buf, ids: IntBuf, n: number, c: number): void {
    this.need(dout, n * c, 'embeddingBackward'); this.need(ids, n, 'embeddingBackward'); this.own(dtable, 'embeddingBackward');
    this.f32Only('embeddingBackward', [['dtable', dtable]]);
    if (n * c <= 0) return;
    const per = Math.ceil(c / EMB_BWD_BLOCK);
    if (per > EMB_BWD_MAX_PER) throw new Error(`embeddingBackward: rows of ${c} exceed the kernel's ${EMB_BWD_MAX_PER * EMB_BWD_BLOCK} columns`);
    this.launch(embeddingBackward.make({ dout: D(dout), per, block: EMB_BWD_BLOCK }), [n, 1, 1], EMB_BWD_BLOCK,
      [P(dtable), P(dout), P(ids), I(n), I(c)]);
  }

  rmsnormForward(out: Buf, rstd: Buf, inp: Buf, weight: Buf, n: number, c: number, eps: number): void {
    this.need(out, n * c, 'rmsnormForward'); this.need(rstd, n, 'rmsnormForward'); this.need(inp, n * c, 'rmsnormForward');
    this.need(weight, c, 'rmsnormForward');
    this.f32Only('rmsnormForward', [['rstd', rstd]]);
    if (n <= 0) return;
    if (c <= ROWS_NORM_MAX_C) {
      // Short rows (Qwen3's per-head q/k norms): one warp per row.
      this.launch(rmsnormRowsForward.make({ eps, C: c, out: D(out), inp: D(inp), weight: D(weight) }), [Math.ceil(n / ROWS_NORM_WARPS), 1, 1],
        32 * ROWS_NORM_WARPS, [P(out), P(rstd), P(inp), P(weight), I(n)]);
      return;
    }
    this.launch(rmsnormForward.make({ eps, C: c, out: D(out), inp: D(inp), weight: D(weight), block: ROW_BLOCK }), [n, 1, 1], ROW_BLOCK, [P(out), P(rstd), P(inp), P(weight), I(n)]);
  }

  addRmsnormForward(sum: Buf, out: Buf, rstd: Buf, a: Buf, b: Buf, weight: Buf, n: number, c: number, eps: number): void {
    for (const x of [sum, out, a, b]) this.need(x, n * c, 'addRmsnormForward');
    this.need(rstd, n, 'addRmsnormForward'); this.need(weight, c, 'addRmsnormForward');
    this.f32Only('addRmsnormForward', [['rstd', rstd]]);
    for (const [name, x] of [['a', a], ['b', b]] as const) {
      const s = sum as CudaBuf, y = x as CudaBuf;
      if (overlaps(s, y) && !(s.byteOffset === y.byteOffset && s.dtype === y.dtype)) {
        throw new Error(`addRmsnormForward: sum (${s.label}) overlaps ${name} (${y.label}) without being the same buffer`);
      }
    }
    for (const [name, x] of [['sum', sum], ['a', a], ['b', b]] as const) {
      if (overlaps(out as CudaBuf, x as CudaBuf)) throw new Error(`addRmsnormForward: out (${(out as CudaBuf).label}) may not overlap ${name}`);
    }
    if (n <= 0) return;
    const spec = addRmsnormForward.make({ eps, C: c, sum: D(sum), out: D(out), a: D(a), b: D(b), weight: D(weight), block: ROW_BLOCK });
    this.launch(spec, [n, 1, 1], ROW_BLOCK, [P(sum), P(out), P(rstd), P(a), P(b), P(weight), I(n)]);
  }

  rmsnormBackward(dinp: Buf, dweight: Buf | null, dout: Buf, inp: Buf, weight: Buf, rstd: Buf, n: number, c: number,
    dinpCopy: Buf | null = null, dweightAccumulate = true): void {
    // dweight null: a frozen weight (LoRA's base) — dinp only; the weight-gradient partials are not reduced.
    this.need(dinp, n * c, 'rmsnormBackward'); if (dweight) this.need(dweight, c, 'rmsnormBackward'); this.need(dout, n * c, 'rmsnormBackward');
    this.need(inp, n * c, 'rmsnormBackward'); this.need(weight, c, 'rmsnormBackward'); this.need(rstd, n, 'rmsnormBackward');
    this.f32Only('rmsnormBackward', [['rstd', rstd]]);
    if (dinpCopy) {
      this.need(dinpCopy, n * c, 'rmsnormBackward');
      if (overlaps(dinpCopy as CudaBuf, dinp as CudaBuf)) throw new Error(`rmsnormBackward: the copy ${(dinpCopy as CudaBuf).label} overlaps dinp ${(dinp as CudaBuf).label}`);
    }
    if (n <= 0) {
      if (!dweightAccumulate && dweight) this.zero(this.view(dweight, 0, c)); // the empty sum, overwritten
      return;
    }
    if (c <= ROWS_NORM_MAX_C) {
      // Short rows: one warp per row, dinp and each block's weight-gradient partial in one pass; R depends on n and c only.
      const R = Math.min(Math.ceil(n / ROWS_NORM_WARPS), ROWS_NORM_MAX_BLOCKS, Math.floor(this.colsumFloats / c));
      this.launch(rmsnormRowsBackward.make({ C: c, dinp: D(dinp), dout: D(dout), inp: D(inp), weight: D(weight) }), [R, 1, 1], 32 * ROWS_NORM_WARPS,
        [P(dinp), P(this.colPart), P(dout), P(inp), P(weight), P(rstd), I(n)]);
      if (dweight) this.colReduce(dweight, R, c, dweightAccumulate);
      if (dinpCopy) this.copy(this.view(dinpCopy, 0, n * c), this.view(dinp, 0, n * c));
      return;
    }
    // Wider rows: a block per row, R blocks over the rows; dinp and each block's weight-gradient partial in one pass.
    const R = Math.min(n, NORM_BWD_MAX_BLOCKS, dweight ? this.colsumRows(c, 'rmsnormBackward') : Infinity);
    // With a copy: each new dinp value also goes to dinpCopy in its dtype (no conversion pass after).
    this.launch(rmsnormBackward.make({ C: c, dinp: D(dinp), dout: D(dout), inp: D(inp), weight: D(weight), block: ROW_BLOCK, copy: dinpCopy ? D(dinpCopy) : 'none' }),
      [R, 1, 1], ROW_BLOCK, [P(dinp), P(dweight ? this.colPart : null), P(dout), P(inp), P(weight), P(rstd), I(n), ...(dinpCopy ? [P(dinpCopy)] : [])]);
    if (dweight) this.colReduce(dweight, R, c, dweightAccumulate);
  }

  /**
   * dst[c] += Σ_{y < R} colPart[y·m + c] (col_reduce: 32 columns per block, the partials summed in y order); with
   * `accumulate` false, dst[c] = the sum (the old value never read).
   */
  private colReduce(dst: Buf, R: number, m: number, accumulate: boolean): void {
    this.launch(colReduce.make({ dst: D(dst), block: ROW_BLOCK }), [Math.ceil(m / 32), 1, 1], ROW_BLOCK,
      [P(dst), P(this.colPart), I(R), I(m), I(accumulate ? 1 : 0)]);
  }

  /** Rows of c columns the column-reduction partials hold (at least 1, else an error naming `what`). */
  private colsumRows(c: number, what: string): number {
    const fit = Math.floor(this.colsumFloats / c);
    if (fit < 1) throw new DistilleryError(`${what}: ${c} columns exceed the ${this.colsumFloats}-float column-reduction scratch`);
    return fit;
  }

  /** Row chunks [R, rowsPer] of a two-stage column reduction over n rows of c columns (R·c fits the partials). */
  private colChunks(n: number, c: number, what: string): [number, number] {
    const want = Math.min(COLSUM_MAX_CHUNKS, this.colsumRows(c, what), Math.max(1, Math.ceil(n / COLSUM_MIN_ROWS)));
    const rowsPer = Math.ceil(n / want);
    return [Math.ceil(n / rowsPer), rowsPer];
  }

  copyColumns(dst: Buf, dstCols: number, dstCol: number, src: Buf, srcCols: number, srcCol: number, rows: number, width: number, bias: Buf | null = null): void {
    const ext = copyColumnsExtent(dstCols, dstCol, srcCols, srcCol, rows, width);
    if (!ext) return;
    this.need(dst, ext.dst, 'copyColumns'); this.need(src, ext.src, 'copyColumns');
    if (bias) this.need(bias, width, 'copyColumns');
    if (overlaps(dst as CudaBuf, src as CudaBuf)) throw new Error('copyColumns: dst and src may not overlap');
    const ptrs = [P(dst), P(src), ...(bias ? [P(bias)] : [])];
    const vec = [width, dstCols, dstCol, srcCols, srcCol].every((x) => x % 8 === 0) && ptrs.every((a) => ((a.v as bigint) & 15n) === 0n);
    const spec = copyColumnsKernel.make({ dst: D(dst), src: D(src), bias: bias ? D(bias) : 'none', block: ELEM_BLOCK });
    this.launch(spec, [blocksFor(vec ? rows * width / 8 : rows * width, ELEM_BLOCK), 1, 1], ELEM_BLOCK,
      [P(dst), P(src), P(bias), L(rows), I(width), I(dstCols), I(dstCol), I(srcCols), I(srcCol), I(vec ? 1 : 0)]);
  }

  matmulForward(out: Buf, inp: Buf, weight: Buf, bias: Buf | null, n: number, k: number, m: number, accumulate = false): void {
    this.need(out, n * m, 'matmulForward'); this.need(inp, n * k, 'matmulForward'); this.need(weight, m * k, 'matmulForward');
    if (bias) this.need(bias, m, 'matmulForward');
    if (bias && accumulate) throw new Error('matmulForward: accumulates without a bias');
    checkMatmulDtypes('matmulForward', [['inp', inp, 'weight', weight]]);
    if (n <= 0 || m <= 0) return;
    // row-major out[n,m] = inp[n,k]·W[m,k]ᵀ  ⇔  column-major outᵀ(m×n) = Wᵀ... : sgemm(T, N, m, n, k, W, k, inp, k, out, m)
    this.gemm(CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, weight, k, inp, k, out, m, accumulate, `matmul ${n}x${k}·${m}x${k}ᵀ`,
      `cublas matmulForward${gemmTag(inp)}${out.dtype !== inp.dtype ? `->${out.dtype}` : ''}${accumulate ? ' +=' : ''} n=${n} k=${k} m=${m}`);
    if (bias) {
      // 2-D grid: x over the m columns (a bias element read once per thread), y over row groups (grid-stride).
      this.launch(biasAdd.make({ out: D(out), bias: D(bias), block: ELEM_BLOCK }), [Math.ceil(m / ELEM_BLOCK), Math.min(n, 1024), 1], ELEM_BLOCK,
        [P(out), P(bias), I(n), I(m)]);
    }
  }

  matmulBackward(dinp: Buf | null, dweight: Buf | null, dbias: Buf | null, dout: Buf, inp: Buf, weight: Buf,
    n: number, k: number, m: number, dinpAccumulate = true, dweightAccumulate = true): void {
    this.need(dout, n * m, 'matmulBackward'); this.need(inp, n * k, 'matmulBackward'); this.need(weight, m * k, 'matmulBackward');
    checkMatmulDtypes('matmulBackward', [['dout', dout, 'weight', weight], ['dout', dout, 'inp', inp]]);
    if (n <= 0) {
      // no rows: an overwritten weight (and bias) gradient is the empty sum, zero (as the CPU backend's)
      if (!dweightAccumulate && dweight) this.zero(this.view(dweight, 0, m * k));
      if (!dweightAccumulate && dbias) this.zero(this.view(dbias, 0, m));
      return;
    }
    if (dinp) {
      this.need(dinp, n * k, 'matmulBackward');
      // dinp[n,k] += dout[n,m]·W[m,k]  ⇔  col-major (k×n) += W(k×m)·dout(m×n)
      this.gemm(CUBLAS_OP_N, CUBLAS_OP_N, k, n, m, weight, k, dout, m, dinp, k, dinpAccumulate, `matmul backward (input) ${n}x${m}·${m}x${k}`,
        `cublas matmulBackward${gemmTag(dout)} dinp n=${n} k=${k} m=${m}`);
    }
    if (dweight) {
      this.need(dweight, m * k, 'matmulBackward');
      // dW[m,k] += doutᵀ[m,n]·inp[n,k]  ⇔  col-major (k×m) += inp(k×n)·dout(m×n)ᵀ
      this.gemm(CUBLAS_OP_N, CUBLAS_OP_T, k, m, n, inp, k, dout, m, dweight, k, dweightAccumulate, `matmul backward (weight) ${m}x${n}·${n}x${k}`,
        `cublas matmulBackward${gemmTag(dout)} dweight n=${n} k=${k} m=${m}`);
    }
    if (dbias) {
      this.need(dbias, m, 'matmulBackward');
      const [R, rowsPer] = this.colChunks(n, m, 'matmulBackward (bias)');
      this.launch(biasGrad.make({ dout: D(dout), block: ELEM_BLOCK }), [Math.ceil(m / 32), R, 1], ELEM_BLOCK,
        [P(this.colPart), P(dout), I(n), I(m), I(rowsPer)]);
      this.colReduce(dbias, R, m, dweightAccumulate);
    }
  }

  private rope(fwd: boolean, out: Buf, inp: Buf, b: number, t: number, heads: number, headDim: number, rope: RopeSpec,
    pos0: number | SeqPositions | DocPositions, bias: Buf | null = null, accumulate = true, strides?: RopeStrides): void {
    const what = fwd ? 'ropeForward' : 'ropeBackward';
    const n = b * t * heads * headDim, ext = ropeExtent(what, b * t, heads * headDim, strides, overlaps(this.own(out, what), this.own(inp, what)));
    this.need(out, ext.out, what); this.need(inp, ext.inp, what);
    if (headDim % 2 !== 0) throw new DistilleryError(`RoPE needs an even head dimension, got ${headDim}`);
    if (n <= 0) return;
    const docs = typeof pos0 === 'object' && 'docPositions' in pos0 ? pos0.docPositions : null;
    const seq = typeof pos0 === 'object' && 'seqPositions' in pos0 ? pos0.seqPositions : null;
    if (seq) this.need(seq, b, what);
    if (docs) this.need(docs, b * t, what);
    if (bias) this.need(bias, heads * headDim, what);
    const spec = ropeKernel(!fwd, rope, headDim, ELEM_BLOCK,
      { out: D(out), inp: D(inp), seqPos: seq !== null, bias: bias ? D(bias) : 'none', ...(fwd ? {} : { acc: accumulate }) });
    // One thread per (token row of B·T, rotated pair), looping over the heads (kernels/rope.ts): n / heads / 2 of them.
    this.launch(spec, [blocksFor(b * t * (headDim / 2), ELEM_BLOCK), 1, 1], ELEM_BLOCK,
      [P(out), P(inp), L(b * t), I(t), I(heads), I(typeof pos0 === 'number' ? pos0 : 0), L(ext.so), L(ext.si), P(docs), ...(seq ? [P(seq)] : []), ...(bias ? [P(bias)] : [])]);
  }

  ropeForward(out: Buf, inp: Buf, b: number, t: number, heads: number, headDim: number, rope: RopeSpec, pos0: number | SeqPositions | DocPositions,
    bias?: Buf | null, strides?: RopeStrides): void {
    this.rope(true, out, inp, b, t, heads, headDim, rope, pos0, bias ?? null, true, strides);
  }

  ropeBackward(dinp: Buf, dout: Buf, b: number, t: number, heads: number, headDim: number, rope: RopeSpec, pos0: number | DocPositions,
    accumulate = true, strides?: RopeStrides): void {
    this.rope(false, dinp, dout, b, t, heads, headDim, rope, pos0, null, accumulate, strides);
  }

  private checkHeads(nHeads: number, nKv: number): void {
    if (nKv <= 0 || nHeads % nKv !== 0) throw new DistilleryError(`attention: ${nHeads} heads are not a multiple of ${nKv} KV heads`);
  }

  attentionForward(out: Buf, lse: Buf, q: Buf, k: Buf, v: Buf, b: number, t: number, nHeads: number, nKv: number, hd: number,
    docs?: DocPositions | null): void {
    this.checkHeads(nHeads, nKv);
    if (docs) this.need(docs.docPositions, b * t, 'attentionForward');
    this.need(out, b * t * nHeads * hd, 'attentionForward'); this.need(q, b * t * nHeads * hd, 'attentionForward');
    this.need(k, b * t * nKv * hd, 'attentionForward'); this.need(v, b * t * nKv * hd, 'attentionForward');
    this.need(lse, b * nHeads * t, 'attentionForward');
    this.f32Only('attentionForward', [['lse', lse]]);
    if (b * t <= 0) return;
    const args = [P(out), P(lse), P(q), P(k), P(v), I(t), I(nHeads), I(nKv), P(docs ? docs.docPositions : null)];
    // bf16 q, k, v: tensor cores (bf16 mma, fp32 accumulation) wherever the head dim fits, whatever `attention` says.
    if (bf16MmaOperands(hd, [q.dtype, k.dtype, v.dtype])) {
      this.aligned16('attentionForward', q, k, v);
      this.launch(attentionForwardBf16.make({ headDim: hd, out: out.dtype }), [Math.ceil(t / FA_QUERY_TILE), nHeads, b], FA_THREADS,
        args, faSmem('fwd', hd));
      return;
    }
    if (this.attnImpl === 'mma' && hd % 8 === 0 && hd <= MMA_MAX_HEAD_DIM && [out, q, k, v].every((x) => x.dtype === 'f32')) {
      this.launch(attentionForwardMma.make({ headDim: hd }), [Math.ceil(t / MMA_QUERY_TILE), nHeads, b], 128, args, mmaForwardSmem(hd));
      return;
    }
    const tl = simtAttentionTile('fwd', hd);
    this.launch(attentionForward.make({ headDim: hd, block: ATTN_BLOCK, out: out.dtype, q: q.dtype, k: k.dtype, v: v.dtype }),
      [Math.ceil(t / tl.tq), nHeads, b], ATTN_BLOCK, args, tl.smem);
  }

  /** The tensor-core kernels stage rows with 16-byte loads: their bf16 operands must start 16-byte aligned. */
  private aligned16(what: string, ...xs: Buf[]): void {
    for (const x of xs) {
      const c = this.own(x, what);
      if (c.ptr % 16n !== 0n) throw new Error(`${what}: ${c.label} is not 16-byte aligned (a view at an odd offset); the bf16 tensor-core attention needs aligned rows`);
    }
  }


  attentionBackward(dq: Buf, dk: Buf, dv: Buf, dout: Buf, q: Buf, k: Buf, v: Buf, out: Buf, lse: Buf,
    b: number, t: number, nHeads: number, nKv: number, hd: number, accumulate = true, docs?: DocPositions | null): void {
    this.checkHeads(nHeads, nKv);
    if (docs) this.need(docs.docPositions, b * t, 'attentionBackward');
    for (const [x, n] of [[dq, nHeads], [dout, nHeads], [q, nHeads], [out, nHeads], [dk, nKv], [dv, nKv], [k, nKv], [v, nKv]] as const) {
      this.need(x, b * t * n * hd, 'attentionBackward');
    }
    this.need(lse, b * nHeads * t, 'attentionBackward');
    this.f32Only('attentionBackward', [['lse', lse]]);
    if (b * t <= 0) return;
    // The kernels, split, chunks and scratch: attention-plan.ts (a pure function of the call and this backend).
    const plan = planAttentionBackward(
      { b, t, nHeads, nKv, hd, accumulate, dtypes: { dq: dq.dtype, dk: dk.dtype, dv: dv.dtype, dout: dout.dtype, q: q.dtype, k: k.dtype, v: v.dtype, out: out.dtype } },
      { impl: this.attnBwd, dsumFloats: this.dsumFloats, dkvFloats: this.dkvFloats, dsElems: this.dsElems },
    );
    maxScratch(this.scratchNeed, plan.need);
    const { mma, S, bPer, storedDs, pre: fpre, dq: fq, dkv: fkv, reduce: fred } = plan;
    if (mma) this.aligned16('attentionBackward', q, k, v, dout, out);
    if (plan.zeroFirst) { this.zero(this.view(dq, 0, b * t * nHeads * hd)); this.zero(this.view(dk, 0, b * t * nKv * hd)); this.zero(this.view(dv, 0, b * t * nKv * hd)); }
    const qn = t * nHeads * hd, kn = t * nKv * hd, ln = nHeads * t;
    for (let b0 = 0; b0 < b; b0 += bPer) {
      const bc = Math.min(bPer, b - b0);
      const vw = (x: Buf, per: number): Buf => (b0 === 0 && bc === b ? x : this.view(x, b0 * per, bc * per));
      const rows = bc * t * nHeads;
      const dp = P(docs ? (b0 === 0 && bc === b ? docs.docPositions : this.viewInt(docs.docPositions, b0 * t, bc * t)) : null);
      // D: the recomputing tensor-core dQ kernel computes it for its rows (and writes it for dK/dV); the SIMT path and
      // the stored-dS path (dK/dV runs first) have a pass of their own
      if (fpre) {
        this.launch(fpre, [blocksFor(Math.ceil(rows / plan.preRowsPerWarp) * 32, ELEM_BLOCK), 1, 1], ELEM_BLOCK,
          [P(this.dsum), P(vw(dout, qn)), P(vw(out, qn)), L(rows), I(t), I(nHeads)]);
      }
      const launchDq = (): void => this.launch(fq.spec, [fq.gridX, nHeads, bc], fq.block, storedDs
        ? [P(vw(dq, qn)), P(this.dsTiles), P(vw(k, kn)), I(t), I(nHeads), I(nKv), dp]
        : [P(vw(dq, qn)), P(this.dsum), P(vw(lse, ln)), P(vw(dout, qn)), ...(mma ? [P(vw(out, qn))] : []), P(vw(q, qn)), P(vw(k, kn)), P(vw(v, kn)),
          I(t), I(nHeads), I(nKv), dp], fq.smem);
      if (!storedDs) launchDq();
      this.launch(fkv.spec, [fkv.gridX, nKv * S, bc], fkv.block,
        [P(vw(dk, kn)), P(vw(dv, kn)), P(S > 1 ? this.dkvPart : null), ...(storedDs ? [P(this.dsTiles)] : []), P(this.dsum), P(vw(lse, ln)),
          P(vw(dout, qn)), P(vw(q, qn)), P(vw(k, kn)), P(vw(v, kn)), I(t), I(nHeads), I(nKv), dp], fkv.smem);
      if (fred) {
        // (four head dims a thread where hd is a multiple of 4: attention_dkv_reduce)
        this.launch(fred, [blocksFor(hd % 4 === 0 ? bc * kn / 4 : bc * kn, ELEM_BLOCK), 1, 1], ELEM_BLOCK,
          [P(vw(dk, kn)), P(vw(dv, kn)), P(this.dkvPart), L(bc * kn), I(t), I(nKv), I(S), I(hd)]);
      }
      if (storedDs) launchDq(); // dQ from the dS tiles the dK/dV kernel wrote
    }
  }

  /**
   * The positions of a KV-cache op's t rows from pos0, checked: per-sequence positions (true) live on the device, and
   * the caller keeps them inside the cache (Backend.kvCacheWrite); a scalar start must leave its rows inside it.
   */
  private cacheRows(pos0: number | SeqPositions, b: number, t: number, tMax: number, op: string): pos0 is SeqPositions {
    if (typeof pos0 !== 'number') { this.need(pos0.seqPositions, b, op); return true; }
    if (pos0 + t > tMax) throw new DistilleryError(`KV cache overflow: positions up to ${pos0 + t} but the cache holds ${tMax}`, 'raise the generation length limit');
    return false;
  }

  kvCacheWrite(cache: Buf, src: Buf, b: number, t: number, pos0: number | SeqPositions, tMax: number, nKv: number, hd: number): void {
    this.need(cache, b * tMax * nKv * hd, 'kvCacheWrite'); this.need(src, b * t * nKv * hd, 'kvCacheWrite');
    const seq = this.cacheRows(pos0, b, t, tMax, 'kvCacheWrite');
    const n = b * t * nKv * hd;
    if (n <= 0) return;
    this.launch(kvCacheWrite.make({ block: ELEM_BLOCK, cache: cache.dtype, src: src.dtype, seqPos: seq }), [blocksFor(n, ELEM_BLOCK), 1, 1], ELEM_BLOCK,
      [P(cache), P(src), I(b), I(t), I(seq ? 0 : pos0), I(tMax), I(nKv * hd), ...(seq ? [P(pos0.seqPositions)] : [])]);
  }

  ropeKvCacheWrite(q: Buf, kCache: Buf, vCache: Buf, qkv: Buf, b: number, t: number, pos0: number | SeqPositions, tMax: number,
    nHeads: number, nKv: number, hd: number, rope: RopeSpec, bias: Buf | null, qkNorm: QkNormWeights | null = null): void {
    const op = 'ropeKvCacheWrite', Q = nHeads * hd, KV = nKv * hd, W = Q + 2 * KV, n = b * t;
    this.checkHeads(nHeads, nKv);
    if (hd % 2 !== 0) throw new DistilleryError(`RoPE needs an even head dimension, got ${hd}`);
    if (q.dtype !== kCache.dtype || vCache.dtype !== kCache.dtype) throw new Error(`${op}: q (${q.dtype}) and the caches (${kCache.dtype}, ${vCache.dtype}) need one dtype`);
    this.need(q, n * Q, op); this.need(kCache, b * tMax * KV, op); this.need(vCache, b * tMax * KV, op); this.need(qkv, n * W, op);
    if (bias) this.need(bias, W, op);
    if (qkNorm) {
      this.need(qkNorm.q, hd, op); this.need(qkNorm.k, hd, op);
      if (qkNorm.q.dtype !== qkNorm.k.dtype) throw new Error(`${op}: the q and k norm weights need one dtype`);
    }
    for (const o of [q, kCache, vCache]) if (overlaps(this.own(o, op), this.own(qkv, op))) throw new Error(`${op}: an output overlaps the q/k/v product`);
    const seq = this.cacheRows(pos0, b, t, tMax, op);
    if (n <= 0) return;
    const spec = ropeKvKernel(rope, hd, ELEM_BLOCK,
      { out: D(q), inp: D(qkv), seqPos: seq, bias: bias ? D(bias) : 'none', norm: qkNorm ? D(qkNorm.q) : 'none', eps: qkNorm?.eps ?? 0 });
    // kernels/rope.ts: one thread per (token row, head of q, k or v, pair), or with norms one warp per (row, head)
    const units = n * (nHeads + 2 * nKv), threads = qkNorm ? units * 32 : units * (hd / 2);
    this.launch(spec, [blocksFor(threads, ELEM_BLOCK), 1, 1], ELEM_BLOCK,
      [P(q), P(kCache), P(vCache), P(qkv), L(n), I(t), I(nHeads), I(nKv), I(seq ? 0 : pos0), I(tMax), ...(seq ? [P(pos0.seqPositions)] : []), ...(bias ? [P(bias)] : []),
        ...(qkNorm ? [P(qkNorm.q), P(qkNorm.k)] : [])]);
  }

  attentionCached(out: Buf, q: Buf, kCache: Buf, vCache: Buf, b: number, t: number, pos0: number | SeqPositions, tMax: number,
    nHeads: number, nKv: number, hd: number): void {
    this.checkHeads(nHeads, nKv);
    this.need(out, b * t * nHeads * hd, 'attentionCached'); this.need(q, b * t * nHeads * hd, 'attentionCached');
    this.need(kCache, b * tMax * nKv * hd, 'attentionCached'); this.need(vCache, b * tMax * nKv * hd, 'attentionCached');
    const seq = this.cacheRows(pos0, b, t, tMax, 'attentionCached');
    if (b * t <= 0) return;
    // 16-byte aligned rows: q and the caches at 16-byte offsets of their allocations (cuMemAlloc's are 256-byte aligned).
    // The offset, not the address, so a trace (addresses from 0) plans the kernel a device launches.
    const aligned = [q, kCache, vCache].every((x) => this.own(x, 'attentionCached').byteOffset % 16 === 0);
    // how this shape launches, decided once (a decode step makes the same calls every step, each layer alike): keyed by
    // every argument of the decision, which reads nothing else of this backend but its GPU
    const args = [b, t, nHeads, nKv, hd, tMax, aligned, seq, out.dtype, q.dtype, kCache.dtype, vCache.dtype, this.cachedFloats] as const;
    const key = args.join(',');
    let c = this.cachedLaunches.get(key);
    if (c === undefined) {
      c = this.cachedAttentionLaunch(...args);
      if (this.cachedLaunches.size >= 4096) this.cachedLaunches.clear(); // a run of ever new cache capacities stays bounded
      this.cachedLaunches.set(key, c);
    }
    if (c.splits === 0) {
      this.launch(c.spec, [t, nHeads, b], c.block,
        [P(out), P(q), P(kCache), P(vCache), I(t), I(seq ? 0 : pos0), I(tMax), I(nHeads), I(nKv), ...(seq ? [P(pos0.seqPositions)] : [])]);
      return;
    }
    this.scratchNeed.cached = Math.max(this.scratchNeed.cached, c.need);
    this.launch(c.spec, [t * c.splits, nKv, b], c.block,
      [P(out), P(q), P(kCache), P(vCache), I(t), I(seq ? 0 : pos0), I(tMax), I(nHeads), I(nKv), P(c.splits > 1 ? this.cachedPart : null), I(c.splits),
        ...(seq ? [P(pos0.seqPositions)] : [])]);
  }

  /**
   * The kernel a cached-attention call of this shape launches, its block and splits (0: attention_cached, a block per
   * query head), and the split scratch it needs; a trace also plans every kernel a call of this shape can take.
   */
  private cachedAttentionLaunch(b: number, t: number, nHeads: number, nKv: number, hd: number, tMax: number, aligned: boolean, seq: boolean,
    outDt: DType, qDt: DType, kcDt: DType, vcDt: DType, scratchFloats: number): CachedLaunch {
    const group = nHeads / nKv, dt = { out: outDt, q: qDt, kc: kcDt, vc: vcDt };
    const head = attentionCached.make({ headDim: hd, block: cachedAttentionBlock(hd), ...dt, seqPos: seq });
    // the group kernel where it fits the static shared memory (a small grid's layout has at most the block of a large
    // one's), laid out for the grid it launches (cachedAttentionGqaGrid: a small grid keeps more rows in flight, a large
    // one takes the layout of fewest waves)
    const large = cachedAttentionLargeLayouts(hd, group, aligned);
    const gqaFits = group <= CACHED_GQA_MAX_GROUP && cachedAttentionGqaSmem(hd, group, large[0]!.block) <= SMEM_DEFAULT;
    const gqaSpec = (plan: CachedAttnPlan): KernelSpec => attentionCachedGqa.make({ headDim: hd, group, ...plan, ...dt, seqPos: seq });
    // the group on the tensor cores where the operands are bf16, 16-byte aligned, of a head dim and group it takes
    const mma = qDt === 'bf16' && kcDt === 'bf16' && vcDt === 'bf16' && aligned && cachedMmaShape(hd, group)
      ? CACHED_MMA_MIN_BLOCKS.map((minBlocks) => attentionCachedMma.make({ headDim: hd, group, out: outDt, seqPos: seq, minBlocks })) : null;
    // The kernel and its layout depend on the call's sequences and rows, which a run's traced call need not share (a last,
    // shorter group of prompts; a chunk of another length): a trace plans every kernel a call of this shape can take, and
    // every layout a large grid may pick by occupancy.
    if (!this.dev) {
      const all = mma ?? (gqaFits ? [cachedAttentionPlan(hd, group, aligned, 0), ...large].map(gqaSpec) : []);
      for (const spec of [head, ...all]) if (!this.traced.has(spec.id)) this.traced.set(spec.id, spec);
    }
    if (cachedAttentionKernel(b, t, nKv, group, tMax, mma !== null) === 'head' || !(gqaFits || mma)) return { spec: head, block: head.params.block, splits: 0, need: 0 };
    if (mma) {
      // the variant cachedMmaPickVariant picks for a grid of `blocks` by the compiled kernels (a trace, with no GPU: the first)
      const dev = this.dev;
      const variants = dev ? mma.map((spec) => ({ blocksPerSm: this.occupancy(spec, CACHED_MMA_THREADS, dev), ...this.resources(spec, dev) })) : [];
      const pick = (blocks: number): number => (dev ? cachedMmaPickVariant(blocks, dev.driver.smCount, variants) : 0);
      const { splits, need } = this.cachedAttentionSplitsFor(b, t, nHeads, nKv, hd, tMax, (blocks) => variants[pick(blocks)]?.blocksPerSm ?? 0, scratchFloats, CACHED_MMA_MIN_ROWS);
      return { spec: mma[pick(t * splits * nKv * b)]!, block: CACHED_MMA_THREADS, splits, need };
    }
    // A short grid splits the cache rows over blocks, up to as many splits as the scratch holds (the kernel is the same either way)
    const { splits, plan, need } = this.cachedAttentionGqaGrid(b, t, nHeads, nKv, hd, tMax, aligned, gqaSpec, scratchFloats);
    return { spec: gqaSpec(plan), block: plan.block, splits, need };
  }

  /**
   * How attention_cached_gqa runs a call (b sequences of t query rows, nHeads/nKv heads of head dim hd, a cache of tMax
   * rows, `aligned` as in cachedAttentionGqaLayout): into how many blocks each (query row, KV head)'s rows split, and the
   * layout. Of cachedAttentionSplits' count, or the fewer the split scratch holds, the count that runs the grid in the
   * fewest waves on this GPU, then the most (cachedAttentionPickSplits; a trace, with no GPU, has the most). `need`: the
   * split scratch (floats) cachedAttentionSplits' count needs, which prepare() sizes it to; `scratchFloats`: the split
   * scratch there is (by default this backend's).
   */
  cachedAttentionGqaGrid(b: number, t: number, nHeads: number, nKv: number, hd: number, tMax: number, aligned: boolean,
    spec?: (plan: CachedAttnPlan) => KernelSpec, scratchFloats = this.cachedFloats): { splits: number; plan: CachedAttnPlan; need: number } {
    const group = nHeads / nKv, pairs = t * nKv * b, dev = this.dev;
    const { splits, need } = this.cachedAttentionSplitsFor(b, t, nHeads, nKv, hd, tMax, (blocks) => {
      const p = this.cachedAttentionGqaLayout(blocks, hd, group, aligned, spec);
      return dev ? this.occupancy((spec ?? this.gqaBf16(hd, group))(p), p.block, dev) : 0;
    }, scratchFloats);
    return { splits, plan: this.cachedAttentionGqaLayout(pairs * splits, hd, group, aligned, spec), need };
  }

  /**
   * Into how many blocks a group kernel (attention_cached_gqa or attention_cached_mma) splits each (query row, KV head)'s
   * rows: of cachedAttentionSplits' count, or the fewer the split scratch (`scratchFloats`) holds, the count that runs the
   * grid in the fewest waves on this GPU, then the most (cachedAttentionPickSplits, `blocksPerSm(blocks)` the blocks an SM
   * holds of the kernel a grid of that many blocks launches; a trace, with no GPU, has the most; `minRows`: the rows a
   * split takes at least, cachedAttentionSplits'); `need` is the split scratch (floats) cachedAttentionSplits' count
   * needs, which prepare() sizes it to.
   */
  private cachedAttentionSplitsFor(b: number, t: number, nHeads: number, nKv: number, hd: number, tMax: number,
    blocksPerSm: (blocks: number) => number, scratchFloats: number, minRows?: number): { splits: number; need: number } {
    const per = b * t * nHeads * (hd + 2), pairs = t * nKv * b, want = cachedAttentionSplits(b, t, nKv, tMax, minRows);
    const fit = Math.min(want, Math.floor((scratchFloats - CACHED_COUNTERS) / per)), most = fit >= 2 ? fit : 1;
    const dev = this.dev;
    return { splits: dev && most > 1 ? cachedAttentionPickSplits(most, pairs, dev.driver.smCount, blocksPerSm) : most, need: want > 1 ? CACHED_COUNTERS + want * per : 0 };
  }

  /**
   * The kernel a cached-attention call of this shape launches (bf16 operands unless given; rows 16-byte aligned; one
   * position for every sequence), its block and split count (0: attention_cached), and the blocks an SM holds of it (0
   * without a GPU): what a benchmark prints beside its time.
   */
  cachedAttentionLaunchOf(b: number, t: number, nHeads: number, nKv: number, hd: number, tMax: number, dtype: DType = 'bf16'): { kernel: string; block: number; splits: number; params: Readonly<Record<string, unknown>>; blocksPerSm: number } {
    const c = this.cachedAttentionLaunch(b, t, nHeads, nKv, hd, tMax, true, false, dtype, dtype, dtype, dtype, this.cachedFloats);
    return { kernel: c.spec.family, block: c.block, splits: c.splits, params: c.spec.params, blocksPerSm: this.dev ? this.occupancy(c.spec, c.block, this.dev) : 0 };
  }

  /** attention_cached_gqa's kernel for a layout over bf16 operands without per-sequence positions (a layout's registers, so its pick, hardly depend on them). */
  private gqaBf16(hd: number, group: number): (plan: CachedAttnPlan) => KernelSpec {
    return (plan) => attentionCachedGqa.make({ headDim: hd, group, ...plan, out: 'bf16', q: 'bf16', kc: 'bf16', vc: 'bf16', seqPos: false });
  }

  /**
   * The layout attention_cached_gqa launches with over a grid of `blocks` blocks (head dim `hd`, a GQA group of `group`, rows
   * `aligned` to 16 bytes): a small grid's (cachedAttentionPlan), or of a large grid's layouts (cachedAttentionLargeLayouts)
   * the one that runs it in the fewest waves on this GPU, by the compiled kernels' occupancy (cachedAttentionPickLayout; a
   * trace, with no GPU, has the plan's). `spec` builds a layout's kernel (the call's operand dtypes; by default gqaBf16's,
   * whose occupancy stands for the others': bf16 calls whose rows are off 16 bytes or of a head dim attention_cached_mma
   * does not take run it; aligned ones take attention_cached_mma, so a sealed cache of such a run has no gqaBf16 kernel).
   */
  cachedAttentionGqaLayout(blocks: number, hd: number, group: number, aligned: boolean, spec = this.gqaBf16(hd, group)): CachedAttnPlan {
    const large = cachedAttentionLargeLayouts(hd, group, aligned);
    const dev = this.dev;
    if (blocks <= CACHED_SMALL_GRID || large.length === 1 || !dev) return cachedAttentionPlan(hd, group, aligned, blocks);
    return large[cachedAttentionPickLayout(blocks, dev.driver.smCount, large.map((p) => this.occupancy(spec(p), p.block, dev)))]!;
  }

  swigluForward(out: Buf, gate: Buf, up: Buf, n: number): void {
    this.need(out, n, 'swigluForward'); this.need(gate, n, 'swigluForward'); this.need(up, n, 'swigluForward');
    this.elementwise(swigluForward.make({ out: D(out), gate: D(gate), up: D(up), block: ELEM_BLOCK }), n, [P(out), P(gate), P(up)]);
  }

  swigluBackward(dgate: Buf, dup: Buf, dout: Buf, gate: Buf, up: Buf, n: number, accumulate = true): void {
    for (const x of [dgate, dup, dout, gate, up]) this.need(x, n, 'swigluBackward');
    this.elementwise((accumulate ? swigluBackward : swigluBackwardSet).make({
      dgate: D(dgate), dup: D(dup), dout: D(dout), gate: D(gate), up: D(up), block: ELEM_BLOCK,
    }), n, [P(dgate), P(dup), P(dout), P(gate), P(up)]);
  }

  swigluForwardRows(out: Buf, gu: Buf, rows: number, cols: number): void {
    this.need(out, rows * cols, 'swigluForwardRows'); this.need(gu, 2 * rows * cols, 'swigluForwardRows');
    this.swigluRows(swigluForwardRows.make({ out: D(out), gu: D(gu), block: ELEM_BLOCK }), rows, cols, [P(out), P(gu)]);
  }

  swigluBackwardRows(dgu: Buf, dout: Buf, gu: Buf, rows: number, cols: number): void {
    this.need(dgu, 2 * rows * cols, 'swigluBackwardRows'); this.need(dout, rows * cols, 'swigluBackwardRows'); this.need(gu, 2 * rows * cols, 'swigluBackwardRows');
    this.swigluRows(swigluBackwardRows.make({ dgu: D(dgu), dout: D(dout), gu: D(gu), block: ELEM_BLOCK }), rows, cols, [P(dgu), P(dout), P(gu)]);
  }

  /** A swiglu_*_rows launch: one thread per 8 columns of a row where the kernel takes its 128-bit path (the same test), else per element. */
  private swigluRows(spec: KernelSpec, rows: number, cols: number, args: Arg[]): void {
    if (rows <= 0 || cols <= 0) return;
    const vec = cols % 8 === 0 && args.every((a) => a.t !== 'p' || (a.v & 15n) === 0n);
    this.launch(spec, [blocksFor(vec ? rows * cols / 8 : rows * cols, ELEM_BLOCK), 1, 1], ELEM_BLOCK, [...args, L(rows), I(cols)]);
  }

  // ---- loss -----------------------------------------------------------------------------------------
  lossForward(stats: Buf, dlogits: Buf | null, logits: Buf, teacher: Buf | null, targets: IntBuf, weights: Buf,
    n: number, vocab: number, spec: LossSpec, ld: number = vocab): void {
    if (!(Number.isInteger(ld) && ld >= vocab)) throw new DistilleryError(`lossForward: row stride ${ld} below the vocabulary ${vocab}`);
    const rows = n > 0 ? (n - 1) * ld + vocab : 0;
    this.need(stats, n * LOSS_STATS, 'lossForward'); this.need(logits, rows, 'lossForward');
    this.need(targets, n, 'lossForward'); this.need(weights, n, 'lossForward');
    if (dlogits) this.need(dlogits, n * ld, 'lossForward');
    if (teacher) this.need(teacher, rows, 'lossForward');
    checkInPlace('lossForward', dlogits, logits);
    this.f32Only('lossForward', [['stats', stats], ['weights', weights]]);
    const dist = spec.kind !== 'none';
    if (dist && !teacher) {
      throw new DistilleryError(`loss kind "${spec.kind}" needs teacher logits`, 'give a teacher, or set the distillation kind to "none"');
    }
    if (n <= 0) return;
    // Baked: what shapes the code. Temperature, alpha and beta are arguments, so a schedule never recompiles.
    const k = lossKernel.make({ kind: spec.kind, withGrad: dlogits !== null, dlogits: dlogits ? D(dlogits) : 'f32', logits: D(logits),
      teacher: teacher ? D(teacher) : 'f32', block: LOSS_BLOCK });
    this.launch(k, [n, 1, 1], LOSS_BLOCK, [P(stats), P(dlogits), P(logits), P(teacher), P(targets), P(weights), I(n), I(vocab), I(ld),
      F(dist ? spec.temperature : 1), F(dist ? spec.alpha : 0), F(spec.kind === 'jsd' ? spec.beta : 0)]);
  }

  sparseLossForward(stats: Buf, dlogits: Buf | null, logits: Buf, targets: IntBuf, weights: Buf, sparse: SparseTargets,
    n: number, vocab: number, spec: LossSpec, ld: number = vocab): void {
    if (!(Number.isInteger(ld) && ld >= vocab)) throw new DistilleryError(`sparseLossForward: row stride ${ld} below the vocabulary ${vocab}`);
    if (spec.kind === 'none') throw new DistilleryError('the sparse loss needs a distillation kind', 'use --loss kl, reverse-kl or jsd with a teacher cache');
    const S = sparse.slots;
    if (!(Number.isInteger(S) && S >= 1 && S <= MAX_SPARSE_SLOTS && S <= LOSS_BLOCK)) {
      throw new DistilleryError(`sparseLossForward: ${S} slots per row (1 to ${MAX_SPARSE_SLOTS})`);
    }
    const rows = n > 0 ? (n - 1) * ld + vocab : 0;
    this.need(stats, n * LOSS_STATS, 'sparseLossForward'); this.need(logits, rows, 'sparseLossForward');
    this.need(targets, n, 'sparseLossForward'); this.need(weights, n, 'sparseLossForward');
    if (dlogits) this.need(dlogits, n * ld, 'sparseLossForward');
    for (const b of [sparse.ids, sparse.prob, sparse.logq]) this.need(b, n * S, 'sparseLossForward');
    this.need(sparse.tail, n, 'sparseLossForward'); this.need(sparse.argmax, n, 'sparseLossForward');
    checkInPlace('sparseLossForward', dlogits, logits);
    this.f32Only('sparseLossForward', [['stats', stats], ['weights', weights], ['prob', sparse.prob], ['logq', sparse.logq], ['tail', sparse.tail]]);
    // A top-K cache's rows carry a tail bucket (the caller says so by its tail values): the kernel that marks the slots.
    const withTail = sparse.withTail === true;
    if (withTail && vocab > SPARSE_TAIL_MAX_VOCAB) {
      throw new DistilleryError(`a top-K teacher cache over ${vocab} tokens is more than the CUDA sparse loss covers (${SPARSE_TAIL_MAX_VOCAB})`,
        'use a sample cache (--sparse sample:N) for this vocabulary');
    }
    if (n <= 0) return;
    const k = sparseLossKernel.make({ kind: spec.kind, withGrad: dlogits !== null, dlogits: dlogits ? D(dlogits) : 'f32', logits: D(logits), withTail,
      block: LOSS_BLOCK });
    this.launch(k, [n, 1, 1], LOSS_BLOCK, [P(stats), P(dlogits), P(logits), P(targets), P(weights), P(sparse.ids), P(sparse.prob),
      P(sparse.logq), P(sparse.tail), P(sparse.argmax), I(n), I(vocab), I(ld), I(S), F(spec.temperature), F(spec.alpha), F(spec.kind === 'jsd' ? spec.beta : 0)]);
  }

  /** Sample rows: the sample_rows kernel; top-K rows: top_rows (one block per row each; kernels/sparse-rows.ts). */
  sparseTeacherRows(out: SparseRowsOut, logits: Buf, uniforms: Buf, n: number, vocab: number, temperature: number,
    kind: 'sample' | 'top', ld: number = vocab): void {
    const S = out.slots;
    if (!(Number.isInteger(S) && S >= 1 && S <= MAX_SPARSE_SLOTS)) throw new DistilleryError(`sparseTeacherRows: ${S} slots per row (1 to ${MAX_SPARSE_SLOTS})`);
    if (!(Number.isInteger(ld) && ld >= vocab)) throw new DistilleryError(`sparseTeacherRows: row stride ${ld} below the vocabulary ${vocab}`);
    if (!(temperature > 0)) throw new DistilleryError(`sparseTeacherRows: temperature must be > 0, got ${temperature}`);
    this.need(logits, n > 0 ? (n - 1) * ld + vocab : 0, 'sparseTeacherRows'); this.need(uniforms, n, 'sparseTeacherRows');
    this.need(out.ids, n * S, 'sparseTeacherRows'); this.need(out.logq, n * S, 'sparseTeacherRows');
    this.need(out.tail, n, 'sparseTeacherRows'); this.need(out.argmax, n, 'sparseTeacherRows');
    this.f32Only('sparseTeacherRows', [['logits', logits], ['uniforms', uniforms], ['logq', out.logq], ['tail', out.tail]]);
    if (n <= 0) return;
    if (kind === 'sample') {
      if (vocab > SAMPLE_TILE * SAMPLE_MAX_TILES) {
        throw new DistilleryError(`sparseTeacherRows: a vocabulary of ${vocab} tokens is more than sample_rows holds (${SAMPLE_TILE * SAMPLE_MAX_TILES})`,
          'use --sparse top:K for this model, or --device cpu');
      }
      this.launch(sampleRowsKernel.make({ block: SAMPLE_ROWS_BLOCK }), [n, 1, 1], SAMPLE_ROWS_BLOCK, [P(logits), P(uniforms), P(out.ids), P(out.logq),
        P(out.tail), P(out.argmax), I(n), I(vocab), I(ld), I(S), F(temperature)]);
      return;
    }
    this.launch(topRowsKernel.make({ block: LOSS_BLOCK }), [n, 1, 1], LOSS_BLOCK, [P(logits), P(out.ids), P(out.logq),
      P(out.tail), P(out.argmax), I(n), I(vocab), I(ld), I(S), F(temperature)]);
  }

  sampleTokens(out: IntBuf, logits: Buf, uniforms: Buf, n: number, vocab: number, s: SampleParams, ld: number = vocab, seen: IntBuf | null = null): void {
    if (!(Number.isInteger(ld) && ld >= vocab)) throw new DistilleryError(`sampleTokens: row stride ${ld} below the vocabulary ${vocab}`);
    if (!(Number.isInteger(s.topK) && s.topK >= 0) || !(s.topP > 0 && s.topP <= 1)) throw new DistilleryError(`sampleTokens: top-k ${s.topK}, top-p ${s.topP}`);
    let pm: { penalty: number; minP: number };
    try { pm = penaltyAndMinP(s, seen); } catch (e) { throw new DistilleryError(`sampleTokens: ${(e as Error).message}`); }
    const W = seenWords(vocab);
    this.need(out, n, 'sampleTokens'); this.need(uniforms, n, 'sampleTokens'); this.need(logits, n > 0 ? (n - 1) * ld + vocab : 0, 'sampleTokens');
    if (seen) this.need(seen, n * W, 'sampleTokens');
    this.f32Only('sampleTokens', [['logits', logits], ['uniforms', uniforms]]);
    if (n <= 0) return;
    this.launch(sampleTokensKernel.make({ block: LOSS_BLOCK }), [n, 1, 1], LOSS_BLOCK,
      [P(out), P(logits), P(uniforms), I(n), I(vocab), I(ld), F(s.temperature), I(s.topK), F(s.topP),
        P(seen), I(W), F(pm.penalty), F(pm.minP)]);
  }

  decodeAdvance(ids: IntBuf, positions: IntBuf, sampled: IntBuf, uniforms: Buf, table: Buf, counter: IntBuf, n: number, rows: number): void {
    if (!(Number.isInteger(n) && n >= 0 && n <= DECODE_ADVANCE_BLOCK)) throw new DistilleryError(`decodeAdvance: ${n} sequences (at most ${DECODE_ADVANCE_BLOCK})`);
    if (!(Number.isInteger(rows) && rows >= 0)) throw new DistilleryError(`decodeAdvance: ${rows} table rows`);
    for (const [b, k] of [[ids, n], [positions, n], [sampled, n], [uniforms, n], [table, rows * n], [counter, 1]] as const) this.need(b, k, 'decodeAdvance');
    this.f32Only('decodeAdvance', [['uniforms', uniforms], ['table', table]]);
    if (n === 0) return;
    this.launch(decodeAdvanceKernel.make({ block: DECODE_ADVANCE_BLOCK }), [1, 1, 1], DECODE_ADVANCE_BLOCK,
      [P(ids), P(positions), P(sampled), P(uniforms), P(table), P(counter), I(n), I(rows)]);
  }

  // ---- optimizer ------------------------------------------------------------------------------------
  adamw(param: Buf, grad: Buf, m: Buf, v: Buf, n: number, s: AdamWStep, copy: Buf | null = null): void {
    for (const x of [param, grad, m, v]) this.need(x, n, 'adamw');
    this.f32Only('adamw', [['param', param], ['grad', grad], ['m', m], ['v', v]]);
    if (copy !== null) {
      this.need(copy, n, 'adamw');
      if (overlaps(copy as CudaBuf, param as CudaBuf)) throw new Error('adamw: the compute copy may not alias param');
    }
    const spec = adamwKernel.make({ copy: copy === null ? 'none' : D(copy), block: ELEM_BLOCK });
    const bc1 = 1 - Math.pow(s.beta1, s.step);
    const bc2 = 1 - Math.pow(s.beta2, s.step);
    if (n <= 0) return;
    this.launch(spec, [blocksFor(Math.ceil(n / 4), ELEM_BLOCK), 1, 1], ELEM_BLOCK,
      [P(param), P(grad), P(m), P(v), P(copy), L(n), F(s.beta1), F(s.beta2), F(s.eps), F(s.lr), F(s.weightDecay), F(s.gradScale), F(bc1), F(bc2)]);
  }

  /**
   * One launch over every segment (adamw_multi): the chunk table is built and uploaded the first time a segment list
   * is seen; the step's lr, gradient scale and bias corrections are uploaded into a device buffer the kernel reads (a
   * captured optimizer region replays with each step's values: upload first, then the launch).
   */
  adamwSegments(param: Buf, grad: Buf, m: Buf, v: Buf, segments: readonly AdamWSegment[], s: AdamWStep, copy: Buf | null = null): void {
    let end = 0;
    for (const t of segments) {
      if (!(Number.isInteger(t.offset) && Number.isInteger(t.size) && t.offset >= 0 && t.size >= 0)) {
        throw new Error(`adamwSegments: bad segment [${t.offset}, +${t.size})`);
      }
      end = Math.max(end, t.offset + t.size);
    }
    for (const x of [param, grad, m, v]) this.need(x, end, 'adamwSegments');
    this.f32Only('adamwSegments', [['param', param], ['grad', grad], ['m', m], ['v', v]]);
    if (copy !== null) {
      this.need(copy, end, 'adamwSegments');
      if (overlaps(copy as CudaBuf, param as CudaBuf)) throw new Error('adamwSegments: the compute copy may not alias param');
    }
    if (!(s.step >= 1)) throw new Error(`adamwSegments: step must be >= 1 (1-based), got ${s.step}`);
    const key = segmentsKey(segments);
    let table = this.chunkTables.get(key);
    if (!table) {
      const host = adamwChunkTable(segments);
      const buf = this.rawAlloc(Math.max(host.length, ADAMW_CHUNK_WORDS), 'AdamW chunk table');
      // Set-up, not region work: issued at once even while a region records (it is ordered before the region's ops).
      if (this.dev && host.length > 0) this.dev.driver.htod(buf.ptr, host, host.length * 4, 'uploading the AdamW chunk table');
      table = { buf, chunks: host.length / ADAMW_CHUNK_WORDS };
      this.chunkTables.set(key, table);
    }
    if (table.chunks === 0) return;
    const scal = this.adamScalars ?? this.rawAlloc(ADAMW_SCALARS, 'AdamW step values');
    this.adamScalars = scal;
    this.upload(scal, [s.lr, s.gradScale, 1 - Math.pow(s.beta1, s.step), 1 - Math.pow(s.beta2, s.step)]);
    const spec = adamwMultiKernel.make({ copy: copy === null ? 'none' : D(copy), block: ELEM_BLOCK });
    this.launch(spec, [table.chunks, 1, 1], ELEM_BLOCK,
      [P(param), P(grad), P(m), P(v), P(copy), P(table.buf), P(scal), F(s.beta1), F(s.beta2), F(s.eps), F(s.weightDecay)]);
  }
}

function koffiAddress(b: Buffer): bigint { return koffi.address(b); }

/** Ops in segment k of a captured region: 32, 64, 128, 256, then 512 each. */
export function segmentOps(k: number): number { return Math.min(512, 32 << Math.min(k, 4)); }

/** The key of a segment list (its chunk table is built once per distinct list). */
function segmentsKey(segs: readonly AdamWSegment[]): string {
  return segs.map((t) => `${t.offset}:${t.size}:${t.decay ? 1 : 0}`).join(',');
}

/** The profile key's dtype tag of a matrix product: '' for f32 (the keys as before), ' bf16' for bf16 operands. */
function gemmTag(a: Buf): string { return a.dtype === 'f32' ? '' : ` ${a.dtype}`; }

/** Whether two buffers' storage overlaps (views of one allocation with intersecting byte ranges; both modes). */
function overlaps(a: CudaBuf, b: CudaBuf): boolean {
  if (a.base !== b.base) return false;
  return a.byteOffset < b.byteOffset + b.length * b.elem && b.byteOffset < a.byteOffset + a.length * a.elem;
}

/**
 * A loss op's dlogits either do not overlap its logits or are them (same allocation, start and dtype: the gradient
 * written in place); a partial overlap is refused by name. Shared by lossForward and sparseLossForward.
 */
function checkInPlace(what: string, dlogits: Buf | null, logits: Buf): void {
  if (dlogits === null) return;
  const d = dlogits as CudaBuf, z = logits as CudaBuf;
  if (overlaps(d, z) && !(d.byteOffset === z.byteOffset && d.dtype === z.dtype)) {
    throw new Error(`${what}: the dlogits (${d.label}) overlap the logits (${z.label}) without being them (in place)`);
  }
}

/** A backend that records kernel specs without a GPU (see plan.ts). */
export function createTraceBackend(trace?: TraceOptions): CudaBackend { return new CudaBackend('trace', trace); }
