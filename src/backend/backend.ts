/**
 * The backend interface: the only thing model, loss and training code may use to touch numbers.
 *
 * Model code (src/model) is written once against this interface, llm.c style: every layer has an explicit
 * forward and backward, shapes are passed explicitly, all tensors are flat row-major float buffers.
 * The CPU backend (src/backend/cpu) implements it with typed arrays; the CUDA backend (src/backend/cuda)
 * with generated kernels and cuBLAS. A tracing CUDA backend records which kernels each call would launch
 * without launching anything: that is how the pre-warm set is derived from the code path a step runs.
 *
 * Conventions (every implementation must follow them; the tests check them):
 * - Buffers hold `length` float elements of the buffer's `dtype`: 'f32' (float32; the CPU backend's reference mode
 *   keeps these in float64, which the finite-difference tests use) or 'bf16' (bfloat16: the top 16 bits of a
 *   float32). IntBuf holds int32 (token ids, targets).
 * - Mixed precision: ops read any float operand in either dtype unless the op says otherwise, compute in float32
 *   (or float64), and round ONCE, to nearest even, when they store into a bf16 buffer (an accumulating op reads the
 *   old bf16 value, adds in float, rounds the sum). The CPU backend emulates bf16 storage exactly that way (its bf16
 *   buffers hold bf16-representable values in float arrays), so CPU and CUDA agree on what is rounded where.
 *   The matrix products pair operands of one dtype (see matmulForward); everything saved in float32 for accuracy
 *   (rstd, lse, loss stats and weights, the loss's logits) is documented at the op.
 * - Every BACKWARD op ACCUMULATES (+=) into all of its gradient outputs. Callers zero gradient buffers first.
 * - Every FORWARD op OVERWRITES its outputs. An output may not alias an input unless the op says so.
 * - Linear layers use the Hugging Face weight layout: weight[out, in], y = x · Wᵀ + b.
 * - Activations are [rows, features]; q is [B, T, nHeads, headDim], k and v are [B, T, nKvHeads, headDim].
 */

import type { RopeSpec } from './rope.js';

export type { RopeSpec } from './rope.js';

/** Qwen3's per-head q/k RMSNorm as Backend.ropeKvCacheWrite applies it: the weights [headDim] and eps. */
export interface QkNormWeights { q: Buf; k: Buf; eps: number }

/**
 * Per-sequence start positions for the generation ops (ropeForward, kvCacheWrite, attentionCached): an int buffer of
 * B positions, one per sequence of the batch, read on the device (so a captured decode step replays with new ones).
 */
export interface SeqPositions { readonly seqPositions: IntBuf }

/**
 * Documents packed into one training window, each attending only to itself (padding-free packing, as transformers'
 * DataCollatorWithFlattening and FlashAttention's varlen kernels do it): an int buffer [B·T] holding each row's position
 * inside its document (0 at a document's first token, +1 a row after; a window's padding is a document of its own).
 * Row t then attends to keys t − pos[t] .. t only, and RoPE rotates it by pos[t]: each document computes what it would
 * alone. Positions are read on the device (a captured step replays with new ones). The caller keeps every pos[t] ≤ t,
 * 0 at t = 0 and pos[t] ∈ {0, pos[t − 1] + 1} (documents are contiguous; a backend reading them on the device cannot
 * check them: packDocuments makes them, checkDocPositions checks them on the host before an upload).
 */
export interface DocPositions { readonly docPositions: IntBuf }

/**
 * Throws unless `pos` holds valid document positions for b windows of t rows (DocPositions): 0 at each window's first
 * row, and every later row either 0 (a new document) or its predecessor's + 1.
 */
export function checkDocPositions(pos: ArrayLike<number>, b: number, t: number): void {
  if (pos.length < b * t) throw new RangeError(`document positions: ${pos.length} for ${b} windows of ${t} rows`);
  for (let w = 0; w < b; w++) {
    for (let i = 0; i < t; i++) {
      const p = pos[w * t + i]!, prev = i === 0 ? -1 : pos[w * t + i - 1]!;
      if (p !== 0 && p !== prev + 1) {
        throw new RangeError(`document positions: window ${w} row ${i} is at ${p} after ${prev} (a row starts a document at 0 or follows its predecessor)`);
      }
    }
  }
}

/**
 * Sampling settings of Backend.sampleTokens: temperature (0 = greedy), top-k (0 = off), top-p (1 = off), and as
 * transformers' generate() names them, repetition_penalty (absent or 1 = off; it needs the rows' seen-token bitmask)
 * and min_p (absent or 0 = off).
 */
export interface SampleParams { temperature: number; topK: number; topP: number; repetitionPenalty?: number; minP?: number }

/** 32-bit words a row of Backend.sampleTokens' seen-token bitmask takes over a vocabulary of `vocab` ids. */
export function seenWords(vocab: number): number { return Math.ceil(vocab / 32); }

/**
 * The settings' repetition penalty (1: off) and min-p (0: off), checked (a RangeError names the bad one), and that a
 * penalty comes with the seen-token bitmask `seen` (null or undefined: none).
 */
export function penaltyAndMinP(s: SampleParams, seen: unknown): { penalty: number; minP: number } {
  const penalty = s.repetitionPenalty ?? 1, minP = s.minP ?? 0;
  if (!(penalty > 0 && Number.isFinite(penalty))) throw new RangeError(`sampling: the repetition penalty must be a positive number, got ${penalty}`);
  if (!(minP >= 0 && minP <= 1)) throw new RangeError(`sampling: min-p must be in [0, 1], got ${minP}`);
  if (penalty !== 1 && (seen === null || seen === undefined)) throw new RangeError('sampling: a repetition penalty needs the seen-token bitmask');
  return { penalty, minP };
}

/** Storage type of a float buffer. */
export type DType = 'f32' | 'bf16';
export const DTYPES: readonly DType[] = ['f32', 'bf16'];
/** Bytes per element of a float buffer's storage on a device (the CPU backend stores bf16 in float arrays). */
export function dtypeBytes(d: DType): number { return d === 'bf16' ? 2 : 4; }

/** A float buffer owned by a backend. Opaque: only the backend that made it can read it. */
export interface Buf {
  readonly length: number;
  /** Storage type of the elements (a view has its buffer's). */
  readonly dtype: DType;
}

/** An int32 buffer owned by a backend (token ids, targets). */
export interface IntBuf {
  readonly length: number;
}

/** Which per-token loss the fused loss op computes. See docs in src/loss/README or the README's config reference. */
export type DistillKind = 'none' | 'kl' | 'reverse-kl' | 'jsd';

export interface LossSpec {
  /** 'none': plain next-token cross-entropy (training without a teacher). */
  kind: DistillKind;
  /** Weight of the distillation term; (1 - alpha) weighs the cross-entropy term. Ignored for kind 'none'. */
  alpha: number;
  /** Softmax temperature for the distillation term (the T^2 factor is applied). */
  temperature: number;
  /** Mixture weight of the teacher in generalized JSD: m = beta·p_t + (1-beta)·p_s. Only for 'jsd'. */
  beta: number;
}

/**
 * A sparse teacher distribution for n rows (src/cache): `slots` entries per row, row-major [n, slots].
 * ids: token ids, -1 for an empty slot, unique within a row. prob: the slot's weight π in the estimate (a sample
 * cache: count / N of N draws from the teacher; a top-K cache: the teacher's probability). logq: log q_t(id), the
 * teacher's log-probability at the cache's temperature. tail: [n], the teacher's probability outside the slots (a
 * top-K cache's remaining mass), or -1 where the row has no tail bucket. argmax: [n], the teacher's most likely id.
 * Every float is f32. At most MAX_SPARSE_SLOTS slots.
 */
export interface SparseTargets {
  slots: number;
  ids: IntBuf;
  prob: Buf;
  logq: Buf;
  tail: Buf;
  argmax: IntBuf;
  /** Rows may carry a tail bucket (a top-K cache): the CUDA backend then runs the kernel that sums Q_s outside the slots. */
  withTail?: boolean;
}
/**
 * What sparseTeacherRows writes for n rows: ids [n, slots] (−1 past a row's ids), logq [n, slots] (log q_t of each
 * id), tail [n] (a top-K row's remaining mass, −1 for sample rows and when K covers the vocabulary), argmax [n].
 */
export interface SparseRowsOut {
  slots: number;
  ids: IntBuf;
  logq: Buf;
  tail: Buf;
  argmax: IntBuf;
}

/**
 * Host copies of device buffers that overlap the device's work (the teacher-cache job reads one batch's rows while the
 * next batch runs): queue() orders the copies after everything queued so far and returns at once; wait() returns when
 * they are on the host. The arrays are the same every time (one per buffer given to Backend.readback, in order) and hold
 * the copies of the last queue() until the next one. CUDA: page-locked host memory and an event; CPU: copied at queue().
 */
export interface Readback {
  queue(): void;
  wait(): { floats: Array<Float32Array | Float64Array>; ints: Int32Array[] };
}

/**
 * Host memory that uploads read in place: arrays a caller fills and uploads again and again (a cached run's sparse
 * teacher rows, src/cache/targets.ts). CUDA: page-locked, so an upload from it is a copy queued after the work before it
 * that returns at once (an upload from pageable memory of more than a few KiB waits inside the call for that work: a
 * batch staged while the previous step's optimizer runs would leave the GPU idle until the copy is done and the pass
 * queued). Uploads from it read the bytes later, so the arrays may be written again only after settle(). CPU: an
 * ordinary ArrayBuffer, uploads copy at once and settle() has nothing to wait for.
 */
export interface HostStaging {
  readonly buffer: ArrayBuffer;
  /** Returns when every upload issued from this memory so far has read it. */
  settle(): void;
}

/** A HostStaging of plain memory, for a backend whose uploads copy at the call (the CPU; CUDA's trace mode). */
export function plainHostStaging(bytes: number): HostStaging {
  return { buffer: new ArrayBuffer(bytes), settle: () => {} };
}

/** The most slots a sparse teacher row may have (one CUDA block of threads holds a row's slots). */
export const MAX_SPARSE_SLOTS = 256;

/** The most sequences one Backend.decodeAdvance takes (CUDA: one block, a thread a sequence); a larger batch generates in parts. */
export const MAX_DECODE_SEQUENCES = 1024;

/** Number of floats per row that lossForward writes into `stats`. */
export const LOSS_STATS = 5;
/** Column indices of the per-token stats row written by lossForward. */
export const STAT_LOSS = 0; // the combined loss the gradient is of (unweighted by `weights`)
export const STAT_CE = 1; // cross-entropy of the student (T = 1) against the next token
export const STAT_DIV = 2; // the distillation divergence (with the T^2 factor); 0 for kind 'none'
export const STAT_AGREE = 3; // 1 if argmax(student) == argmax(teacher) else 0; 0 without a teacher
export const STAT_ACC = 4; // 1 if argmax(student) == the target (the next token) else 0: token accuracy, and is_greedy per row

export interface AdamWStep {
  lr: number;
  beta1: number;
  beta2: number;
  eps: number;
  weightDecay: number;
  /** 1-based step number, for bias correction. */
  step: number;
  /** Gradients are multiplied by this before use (global-norm clipping folds in here). */
  gradScale: number;
}

/** A tensor of a flat parameter buffer, for the one-launch AdamW update (weight decay where `decay`). */
export interface AdamWSegment { offset: number; size: number; decay: boolean }

export interface Backend {
  readonly name: string;
  /**
   * Whether captured regions are recorded (CUDA: a region's body may only issue device work, see captured()) rather
   * than simply run (CPU: host work inside a region, such as a collective through the host, happens in order).
   */
  readonly recordsRegions: boolean;
  /** Element type of float buffers: 'f32' normally, 'f64' for the CPU backend's reference mode. */
  readonly dtype: 'f32' | 'f64';

  // ---- memory ---------------------------------------------------------------------------------------
  /** A zero-filled float buffer of n elements of `dtype` (default 'f32'). `label` names it in errors and memory reports. */
  alloc(n: number, label: string, dtype?: DType): Buf;
  allocInt(n: number, label: string): IntBuf;
  /** A window onto [offset, offset+length) of buf, sharing its storage. */
  view(buf: Buf, offset: number, length: number): Buf;
  /** A window onto [offset, offset+length) of an int buffer, sharing its storage. */
  viewInt(buf: IntBuf, offset: number, length: number): IntBuf;
  /**
   * Writes src into dst from dstOffset; into a bf16 buffer the values are rounded to nearest even. src may be changed as
   * soon as the call returns, unless it lies in a HostStaging's buffer: then only after that staging's settle().
   */
  upload(dst: Buf, src: ArrayLike<number>, dstOffset?: number): void;
  /**
   * Writes bfloat16 bit patterns into a bf16 buffer as they are (bits.length values from its start): a bf16 checkpoint's
   * weights with no float32 values in between; what upload of the values they stand for would store.
   */
  uploadBf16(dst: Buf, bits: Uint16Array): void;
  uploadInt(dst: IntBuf, src: Int32Array): void;
  /**
   * A host copy of buf (float64 in the CPU reference mode, else float32 — bf16 values widen exactly). With `into` (a
   * float32 array of buf's length) the values go there and `into` is returned: a caller that downloads the same buffer
   * again and again (each checkpoint's weights and moments) reuses host memory whose pages are already mapped.
   */
  download(src: Buf, into?: Float32Array): Float32Array | Float64Array;
  /** A host copy of an int buffer. */
  downloadInt(src: IntBuf): Int32Array;
  /** `bytes` of host memory that uploads read in place (HostStaging), freed at dispose. */
  hostStaging(bytes: number, label: string): HostStaging;
  /** Host copies of float32 and int buffers that a caller queues and later waits for (Readback). Not inside a captured region. */
  readback(floats: Buf[], ints: IntBuf[], label: string): Readback;
  zero(buf: Buf): void;
  /** dst[0..src.length) = src, converting between dtypes (into bf16: rounded to nearest even). */
  copy(dst: Buf, src: Buf): void;
  /**
   * A block of columns from one row-major matrix into another: dst[r, dstCol + c] = src[r, srcCol + c] (+ bias[c]) for
   * r < rows, c < width, where a dst row is dstCols wide and a src row srcCols wide; the bias is added in float and the
   * sum rounded once into dst's dtype (what a bias add after the product's store computes). The fused q/k/v projection
   * splits its output and joins its gradients with it (src/model/layer.ts). dst and src may not overlap.
   */
  copyColumns(dst: Buf, dstCols: number, dstCol: number, src: Buf, srcCols: number, srcCol: number, rows: number, width: number, bias?: Buf | null): void;
  /** Releases everything this backend allocated (worker threads too). */
  dispose(): void;
  /**
   * Called once before a job allocates its models or uploads weights, with closures that run the same code the
   * job will run (training/distillation step, evaluation, generation prefill and decode; see src/train/kernel-plan.ts).
   * A backend that compiles kernels traces them, compiles every kernel they need, then seals its cache, so the job
   * itself never compiles. The CPU backend has nothing to prepare.
   */
  prepare?(runs: ReadonlyArray<(b: Backend) => void>): Promise<void>;
  /**
   * Free and total bytes of the device's memory, for a pre-flight memory check. Absent (CPU) or returning null
   * (a backend without a device, e.g. the CUDA trace backend) means "unknown": skip the check.
   */
  deviceMemory?(): { free: number; total: number } | null;

  // ---- elementwise ----------------------------------------------------------------------------------
  /** out = a + b (n elements). out may alias a or b. */
  add(out: Buf, a: Buf, b: Buf, n: number): void;
  /** dst += src (n elements). */
  accumulate(dst: Buf, src: Buf, n: number): void;
  /** buf *= s (n elements). */
  scale(buf: Buf, s: number, n: number): void;
  /** Sum of squares of the first n elements, returned to the host (used for global-norm clipping). */
  sumSquares(buf: Buf, n: number): number;
  /**
   * Frozen weights in NF4 (src/quant/nf4.ts): out[i] = NF4_LEVELS[code(i)] · absmax[⌊i / blockSize⌋] for i < n, the
   * product rounded to float32 (then to out's dtype). codes holds two 4-bit codes per byte, the even element in the high
   * nibble, four bytes per int32 word (little-endian; nf4Words). absmax is f32.
   */
  dequantNf4(out: Buf, codes: IntBuf, absmax: Buf, n: number, blockSize: number): void;

  // ---- layers ---------------------------------------------------------------------------------------
  /** out[i, :] = table[ids[i], :] for i < n; table is [vocab, c]. */
  embeddingForward(out: Buf, ids: IntBuf, table: Buf, n: number, c: number): void;
  /** dtable[ids[i], :] += dout[i, :]. */
  embeddingBackward(dtable: Buf, dout: Buf, ids: IntBuf, n: number, c: number): void;

  /** out = inp / rms(inp) * weight per row; rstd[i] = 1/sqrt(mean(inp[i]^2) + eps) is saved for backward. */
  rmsnormForward(out: Buf, rstd: Buf, inp: Buf, weight: Buf, n: number, c: number, eps: number): void;
  /**
   * dinp += (d out / d inp)ᵀ dout and dweight += Σ_rows dout ⊙ inp · rstd (dweight null: a frozen weight). dinpCopy, when
   * given, receives dinp's new values as well, in its own dtype (what copy(dinpCopy, dinp) after would write): a bf16
   * model's residual gradient as the next products' operand. With `dweightAccumulate` false, dweight is overwritten
   * (dweight = Σ_rows ..., its old values never read), as matmulBackward's.
   */
  rmsnormBackward(dinp: Buf, dweight: Buf | null, dout: Buf, inp: Buf, weight: Buf, rstd: Buf, n: number, c: number, dinpCopy?: Buf | null,
    dweightAccumulate?: boolean): void;
  /**
   * The residual add fused with the norm that reads it: sum = a + b (n·c elements; the residual stream, normally f32),
   * then rmsnormForward(out, rstd, sum, weight, n, c, eps) over the stored sum. Results are identical to `add`
   * followed by `rmsnormForward`: the sum is rounded to sum's dtype first and the norm reads that stored value.
   * sum may alias a or b (the same buffer, exactly); out may not overlap sum, a or b. rstd is f32.
   */
  addRmsnormForward(sum: Buf, out: Buf, rstd: Buf, a: Buf, b: Buf, weight: Buf, n: number, c: number, eps: number): void;

  /**
   * out[n, m] = inp[n, k] · weight[m, k]ᵀ (+ bias[m]). On CUDA: cuBLAS (bf16 operands: tensor cores, fp32
   * accumulation). inp and weight share one dtype (checkMatmulDtypes); out and bias may be either. Into a bf16 out
   * with a bias, the product is rounded, then the bias added and the sum rounded (the GEMM's store, then a bias add).
   * With `accumulate`, out += inp · weightᵀ (the GEMM reads out and rounds the sum once; no bias).
   */
  matmulForward(out: Buf, inp: Buf, weight: Buf, bias: Buf | null, n: number, k: number, m: number, accumulate?: boolean): void;
  /**
   * dinp += dout · weight; dweight += doutᵀ · inp; dbias += Σ_rows dout. Any gradient output may be null (skipped).
   * dout, inp and weight share one dtype (checkMatmulDtypes); the gradient outputs may be either (weight gradients
   * are normally f32). With `dinpAccumulate` false, dinp is overwritten (dinp = dout · weight: the product's own store,
   * no zeroing pass and no read of the old values). With `dweightAccumulate` false, dweight and dbias are overwritten
   * the same way (dweight = doutᵀ · inp, dbias = Σ_rows dout: a training step's first write of a parameter's gradient,
   * Transformer.overwriteGrads, so the step needs no pass that zeroes the gradients first).
   */
  matmulBackward(
    dinp: Buf | null, dweight: Buf | null, dbias: Buf | null,
    dout: Buf, inp: Buf, weight: Buf, n: number, k: number, m: number, dinpAccumulate?: boolean, dweightAccumulate?: boolean,
  ): void;

  /**
   * Rotary embedding, rotate-half (NeoX / HF Llama, Qwen2) layout, in [B, T, heads, headDim].
   * Position of row t is pos0 + t; with documents (DocPositions), row r of the B·T rows is at pos[r]; with per-sequence start positions (a SeqPositions int buffer [B], batched generation
   * of prompts of different lengths), row t of sequence b is at pos0[b] + t. angle(p, i) = p · ropeInvFreq(rope, headDim)[i] for i < headDim/2, and cos and
   * sin are multiplied by ropeAttentionFactor(rope) (src/backend/rope.ts: plain, linear, llama3 and yarn RoPE as
   * HF transformers computes them). out may alias inp. `bias` [heads · headDim] (a q/k projection's): added to every row
   * first, out = R(inp + bias), in float with one rounding into a bf16 out (so no separate pass adds it). `strides`: the
   * row strides of out and inp (RopeStrides; a rotation in place needs equal ones).
   */
  ropeForward(out: Buf, inp: Buf, b: number, t: number, heads: number, headDim: number, rope: RopeSpec, pos0: number | SeqPositions | DocPositions,
    bias?: Buf | null, strides?: RopeStrides): void;
  /**
   * dinp += Rᵀ dout; with `accumulate` false, dinp = Rᵀ dout (overwritten, never read: the caller need not zero it).
   * dinp may alias dout with equal strides (each element is read before it is written). `strides`: out is dinp's, inp
   * is dout's (RopeStrides).
   */
  ropeBackward(dinp: Buf, dout: Buf, b: number, t: number, heads: number, headDim: number, rope: RopeSpec, pos0: number | DocPositions,
    accumulate?: boolean, strides?: RopeStrides): void;

  /**
   * Causal grouped-query attention with scale 1/sqrt(headDim).
   * q/out: [B, T, nHeads, hd]; k, v: [B, T, nKv, hd]; query head h reads kv head floor(h / (nHeads / nKv)).
   * lse: [B, nHeads, T], written with the natural-log log-sum-exp of each query row's scaled, causally masked
   * scores, lse[b, h, i] = log Σ_{j ≤ i} exp(q_i·k_j / sqrt(hd)): the only state saved for backward (memory is
   * linear in T; no [T, T] probabilities exist). With `docs` (DocPositions), row i attends to keys i − pos[i] .. i only
   * (its document's), and the sums above run over those keys.
   */
  attentionForward(out: Buf, lse: Buf, q: Buf, k: Buf, v: Buf, b: number, t: number, nHeads: number, nKv: number, hd: number,
    docs?: DocPositions | null): void;
  /**
   * dq += ..., dk += ..., dv += ... from the forward's inputs, its output `out` and its `lse`; with `accumulate` false,
   * dq, dk and dv are overwritten (never read: the caller need not zero them). Backends recompute
   * P = exp(scale·q·kᵀ − lse) and use rowsum(P ⊙ dP) = Σ_d dout·out (they may keep that D in scratch they own).
   * `docs`: the forward's (P is 0 outside a row's document).
   */
  attentionBackward(
    dq: Buf, dk: Buf, dv: Buf, dout: Buf, q: Buf, k: Buf, v: Buf, out: Buf, lse: Buf,
    b: number, t: number, nHeads: number, nKv: number, hd: number, accumulate?: boolean, docs?: DocPositions | null,
  ): void;

  /**
   * Writes rows [pos0, pos0+t) of a KV cache laid out [B, tMax, nKv, hd] from src [B, t, nKv, hd] (per-sequence start
   * positions: sequence b's rows [pos0[b], pos0[b]+t)). Every row written must lie inside the cache (the caller keeps
   * the positions below tMax − t + 1; a backend reading positions from device memory cannot check them).
   */
  kvCacheWrite(cache: Buf, src: Buf, b: number, t: number, pos0: number | SeqPositions, tMax: number, nKv: number, hd: number): void;
  /**
   * Generation's step from the fused q/k/v product to attentionCached, in one pass: for each of the b·t token rows of
   * qkv [b·t, Q + 2·KV] (columns q | k | v; Q = nHeads·hd, KV = nKv·hd), q = R(q_cols + bias_q) into `q` [b·t, Q],
   * R(k_cols + bias_k) into kCache and v_cols + bias_v into vCache at the row's position (as kvCacheWrite), R the
   * rotation of ropeForward at that position. It stores what copyColumns (v, with its bias), ropeForward (q and k from
   * qkv's columns, with their biases) and kvCacheWrite (k, v) store: each value summed and rotated in float and rounded
   * once (the same bits, on the CPU and on CUDA). q, kCache and vCache share one dtype. `bias`: the q, k and v biases joined [Q + 2·KV], or null.
   * `qkNorm` (Qwen3): each q and k head is first normed as rmsnormForward norms a row of hd (weights [hd], eps), as the
   * split copy (copyColumns, with its bias) and the norm would store it in q's dtype, then rotated (only rstd is not kept).
   */
  ropeKvCacheWrite(q: Buf, kCache: Buf, vCache: Buf, qkv: Buf, b: number, t: number, pos0: number | SeqPositions, tMax: number,
    nHeads: number, nKv: number, hd: number, rope: RopeSpec, bias: Buf | null, qkNorm?: QkNormWeights | null): void;
  /**
   * Inference attention against a KV cache: queries q [B, t, nHeads, hd] at positions pos0..pos0+t-1 attend
   * causally to cache rows 0..pos0+t-1 (the caller has written them with kvCacheWrite). out: [B, t, nHeads, hd].
   * With per-sequence start positions, sequence b's queries are at pos0[b]..pos0[b]+t-1 and attend to its rows
   * 0..pos0[b]+i.
   */
  attentionCached(out: Buf, q: Buf, kCache: Buf, vCache: Buf, b: number, t: number, pos0: number | SeqPositions, tMax: number, nHeads: number, nKv: number, hd: number): void;

  /** out = silu(gate) * up (n elements). */
  swigluForward(out: Buf, gate: Buf, up: Buf, n: number): void;
  /** dgate += ..., dup += ... (with `accumulate` false: dgate = ..., dup = ..., overwritten) */
  swigluBackward(dgate: Buf, dup: Buf, dout: Buf, gate: Buf, up: Buf, n: number, accumulate?: boolean): void;
  /**
   * SwiGLU over the rows of a fused gate/up product: gu [rows, 2·cols] holds gate_r then up_r in row r (one matrix product
   * over the adjacent gate_proj and up_proj weights); out [rows, cols] = silu(gate) · up, the values swigluForward gives.
   */
  swigluForwardRows(out: Buf, gu: Buf, rows: number, cols: number): void;
  /** swigluBackward (overwriting) into the fused layout: dgu [rows, 2·cols] = [dgate_r | dup_r] from dout [rows, cols] and gu. */
  swigluBackwardRows(dgu: Buf, dout: Buf, gu: Buf, rows: number, cols: number): void;

  // ---- loss -----------------------------------------------------------------------------------------
  /**
   * Fused per-token loss over logits [n, vocab] (and its gradient when dlogits is given).
   * stats[i, :] gets LOSS_STATS floats (see STAT_*). teacher: teacher logits [n, vocab] or null.
   * weights[i] multiplies row i's gradient (0 masks padding; typically 1/number-of-counted-tokens).
   * dlogits (may alias logits) is OVERWRITTEN with weights[i] · d(loss_i)/d(logits_i).
   * Targets may be -1 only where weights[i] is 0 (padding). stats and weights are f32; logits and teacher are f32 or
   * bf16 (--logits, src/train/head.ts: read as float32); dlogits may be bf16 (the LM head's backward products read it as
   * a bf16 operand) and may be the logits themselves (in place, same dtype), never a partial overlap of them.
   * `ld` (default vocab): the row stride of logits, teacher and dlogits. The loss runs over the first `vocab`
   * columns of each row; with dlogits, columns [vocab, ld) are written as 0. (The chunked head pads rows to an
   * aligned width so the LM-head GEMMs stay fast when the loss vocabulary is odd, e.g. Qwen's 151665 real tokens.)
   */
  lossForward(
    stats: Buf, dlogits: Buf | null, logits: Buf, teacher: Buf | null, targets: IntBuf, weights: Buf,
    n: number, vocab: number, spec: LossSpec, ld?: number,
  ): void;
  /**
   * The fused per-token loss against a sparse teacher (a teacher cache, src/cache) instead of teacher logits: the same
   * stats row and gradient conventions as lossForward, with the divergence estimated from the row's slots (see
   * src/backend/cpu/kernels/sparse-loss.ts for the estimator and its gradient). spec.kind must not be 'none'.
   */
  sparseLossForward(
    stats: Buf, dlogits: Buf | null, logits: Buf, targets: IntBuf, weights: Buf, sparse: SparseTargets,
    n: number, vocab: number, spec: LossSpec, ld?: number,
  ): void;
  /**
   * The sparse rows of a teacher's logits (the teacher-cache job; src/backend/cpu/kernels/sparse-rows.ts is the
   * reference): each of n rows of logits [n, ld] over the first `vocab` columns, at temperature T, becomes 'sample' —
   * the distinct ids of out.slots systematic draws at the points (i + uniforms[row]) / slots of the cumulative
   * distribution, ascending — or 'top' — the out.slots most likely ids, by descending probability (ties: lower id),
   * with the remaining mass. logits and uniforms are f32.
   */
  sparseTeacherRows(out: SparseRowsOut, logits: Buf, uniforms: Buf, n: number, vocab: number, temperature: number,
    kind: 'sample' | 'top', ld?: number): void;
  /**
   * Samples one token per row of logits [n, ld] over the first `vocab` columns into out[n]: greedy at temperature 0,
   * else from softmax(z / temperature) cut to the top-k logits and the top-p nucleus (thresholds on logit values, ties
   * kept), drawn with uniforms[row] by inverse CDF in index order (src/backend/cpu/kernels/sample.ts is the reference).
   * With a repetition penalty, `seen` is the rows' seen-token bitmask (seenWords(vocab) int32 words a row, bit j & 31 of
   * word j >> 5): the marked ids' logits are penalized first, IN PLACE (`logits` is the step's scratch: a second call on
   * the same rows would penalize them again), and each row's drawn id is marked in `seen` (so a replayed decode step
   * keeps it current). No logits leave the device. logits and uniforms are f32.
   */
  sampleTokens(out: IntBuf, logits: Buf, uniforms: Buf, n: number, vocab: number, s: SampleParams, ld?: number, seen?: IntBuf | null): void;
  /**
   * Advances a batched generation's decode loop on the device, after a step sampled its tokens into `sampled`: for each
   * of n ≤ MAX_DECODE_SEQUENCES sequences, ids[b] = sampled[b] (the next step's input), positions[b] += 1, and uniforms[b] =
   * table[(step + 1) · n + b] with step = counter[0] (0 where step + 1 ≥ rows, the table's rows of n draws each), then
   * counter[0] = step + 1. A decode step captured with it reads nothing from the host, so steps can be queued ahead of
   * their results (BatchGenerator.generateOnDevice).
   */
  decodeAdvance(ids: IntBuf, positions: IntBuf, sampled: IntBuf, uniforms: Buf, table: Buf, counter: IntBuf, n: number, rows: number): void;

  // ---- optimizer ------------------------------------------------------------------------------------
  /**
   * Decoupled-weight-decay Adam with bias correction over n elements (param, grad, first and second moment: f32).
   * `copy` (optional, usually bf16): also receives the updated parameters, converted — the compute copy of the
   * weights that mixed-precision forward and backward passes read (one launch updates master weights and copy).
   */
  adamw(param: Buf, grad: Buf, m: Buf, v: Buf, n: number, s: AdamWStep, copy?: Buf | null): void;
  /**
   * AdamW over every segment (tensor) of flat buffers in one update: segment i is updated as adamw over
   * [offset, offset + size) with weight decay s.weightDecay where `decay`, else 0. The CUDA backend runs it as one
   * launch (adamw_multi) that reads the step's lr, gradient scale and bias corrections from device memory.
   */
  adamwSegments(param: Buf, grad: Buf, m: Buf, v: Buf, segments: readonly AdamWSegment[], s: AdamWStep, copy?: Buf | null): void;

  // ---- captured regions -----------------------------------------------------------------------------
  /**
   * Runs `body` and returns what it returns. The body only issues device work: no download or other host read
   * (sumSquares), and uploads only before its first op. The CUDA backend records the ops, replays a recorded region
   * as a CUDA graph when it has seen the same ops with the same arguments before (src/backend/cuda/graphs.ts), and
   * otherwise runs them as launched; the CPU backend runs the body. `label` names the region in the timeline.
   */
  captured<R>(label: string, body: () => R): R;
  /**
   * captured() for a loop whose every step issues the same work, only the contents of device buffers changing (a decode
   * step: BatchGenerator.generateOnDevice): runs `body` once as a captured region and returns `again`, which issues that
   * work once more without the host walking the body op by op (CUDA: the recorded ops go back to the graph runner, one
   * graph launch a segment). For as long as nothing the body reads on the host changes (the loop's constants). The CUDA
   * backend records the body again at again's first call and every REPEAT_CHECK_EVERY-th after, without issuing it, and
   * throws when that differs from what it repeats; the CPU backend runs the body at each call.
   */
  capturedRepeat(label: string, body: () => void): () => void;
}

/**
 * copyColumns' argument rule, shared by every backend so CPU and CUDA refuse the same calls: the block of `width`
 * columns lies inside both row widths. Returns how many elements dst and src must hold, or null when nothing is copied.
 */
export function copyColumnsExtent(dstCols: number, dstCol: number, srcCols: number, srcCol: number, rows: number, width: number): { dst: number; src: number } | null {
  if (!(width >= 0 && rows >= 0 && dstCol >= 0 && srcCol >= 0 && dstCol + width <= dstCols && srcCol + width <= srcCols)) {
    throw new Error(`copyColumns: columns [${srcCol}, +${width}) of ${srcCols} into [${dstCol}, +${width}) of ${dstCols}`);
  }
  if (rows === 0 || width === 0) return null;
  return { dst: (rows - 1) * dstCols + dstCol + width, src: (rows - 1) * srcCols + srcCol + width };
}

/**
 * Row strides of a RoPE's operands (elements from one token row of heads·headDim to the next): a packed [B, T, heads,
 * headDim] tensor's is heads·headDim (the default); the q or k columns of a fused q/k/v product's [N, Q + 2·KV] output
 * or gradient have Q + 2·KV.
 */
export interface RopeStrides { out?: number | undefined; inp?: number | undefined }

/**
 * RoPE's stride rule, shared by every backend: each stride at least the row width (rows never overlap), and operands
 * that overlap (`overlap`, as the backend tells) only with equal strides (a rotation in place reads each pair before it
 * writes it only where rows coincide). Returns how many elements out and inp must hold for `rows` token rows.
 */
export function ropeExtent(what: string, rows: number, width: number, strides: RopeStrides | undefined, overlap: boolean): { out: number; inp: number; so: number; si: number } {
  const so = strides?.out ?? width, si = strides?.inp ?? width;
  if (!(Number.isInteger(so) && Number.isInteger(si) && so >= width && si >= width)) {
    throw new Error(`${what}: row strides out ${so}, inp ${si} below the row width ${width}`);
  }
  if (so !== si && overlap) throw new Error(`${what}: out and inp overlap with different row strides (${so}, ${si})`);
  return rows === 0 ? { out: 0, inp: 0, so, si } : { out: (rows - 1) * so + width, inp: (rows - 1) * si + width, so, si };
}

/**
 * The matrix products' dtype rule, shared by every backend so CPU and CUDA refuse the same calls: the two operands
 * of each product have one dtype (cuBLAS multiplies bf16 by bf16 or f32 by f32, never a mix).
 */
export function checkMatmulDtypes(what: string, pairs: ReadonlyArray<readonly [string, Buf, string, Buf]>): void {
  for (const [an, a, bn, b] of pairs) {
    if (a.dtype !== b.dtype) {
      throw new Error(`${what}: ${an} is ${a.dtype} but ${bn} is ${b.dtype}; the two operands of a matrix product must share a dtype`);
    }
  }
}
