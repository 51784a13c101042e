/**
 * The LM head and the loss, chunk by chunk: the full [tokens, vocab] logits of neither model ever exist.
 *
 * For each chunk of R rows (tokens): student logits zs[R, V'] = hidden_s[rows] · W_sᵀ (and teacher logits
 * zt[R, V'] = hidden_t[rows] · W_tᵀ), the fused loss op writes per-token statistics and, in a training pass,
 * dlogits over zs in place; the LM head's backward then accumulates dW_s += dzsᵀ · hidden_s[rows] and writes
 * dhidden_s[rows] = dzs · W_s. The student's backward continues from dhidden_s (Transformer.backwardHidden).
 *
 * V' (`lossVocab`) is the number of real tokens: a model whose embedding has padding rows past the tokenizer
 * (Qwen2.5-7B's 152064 against the 0.5B's 151936, both for a tokenizer of 151665) runs its head and the loss over
 * the first V' rows of W only, so padding rows get neither probability mass nor gradient. By default V' is the
 * student's vocab_size.
 *
 * Chunk rows: at most as many as keep one chunk of logits under `chunkFloats` floats (default 128 Mi, 512 MiB in f32;
 * more from a teacher cache, which has no teacher chunk: defaultChunkFloats; 2.5 times the rows for bf16 logits:
 * headRows), split evenly, so a 151936-token vocabulary runs 8192 rows as 10 chunks of 820 (bf16 logits: 4 of 2048),
 * and a small model runs the whole batch in one chunk. Each
 * chunk's dW GEMM reads and writes the whole fp32 head gradient (544 MB for Qwen2.5-0.5B), so fewer, larger chunks
 * cut that traffic: 64 Mi floats (442 rows) cost the H100 637 µs per chunk for it at 8×1024.
 */
import type { Backend, Buf, IntBuf, LossSpec } from '../backend/backend.js';
import { LOSS_STATS } from '../backend/backend.js';
import type { Transformer } from '../model/transformer.js';
import { DistilleryError } from '../util/errors.js';
import type { SparseRep } from '../cache/sparse.js';
import { SparseDevice, type SparseHost } from '../cache/targets.js';

/** Default bound on one chunk of logits, in floats. */
export const DEFAULT_HEAD_CHUNK_FLOATS = 128 * 2 ** 20;

/**
 * The dtype of the logits chunks: 'f32', or 'bf16' (a bf16 model's LM-head GEMMs write bf16 logits, as transformers and
 * PyTorch's autocast do, and the loss reads them as float32; the dlogits are then written over the student's logits in
 * place). bf16 rounds each logit once (a relative 2^-9), halves the head's logits traffic and memory, and so runs
 * 2.5 times the rows per chunk in the same memory.
 */
export type LogitsDtype = 'f32' | 'bf16';

/** A scoring head's logits chunk (floats; HeadOptions.chunkFloats of the --eval-choices runners): its batches are short, so a small chunk costs little (32 Mi floats, 128 MiB in f32). */
export const SCORING_CHUNK_FLOATS = 1 << 25;

export interface HeadOptions {
  /** Real tokens: the head and the loss run over the first lossVocab rows of each LM head (default: the student's vocab). */
  lossVocab?: number | undefined;
  /** Floats of one chunk of logits (default defaultChunkFloats). */
  chunkFloats?: number | undefined;
  /** Distill from a teacher cache of this representation (src/cache): no teacher model, the sparse loss. */
  sparse?: SparseRep | undefined;
  /** The logits chunks' dtype (default 'f32'; 'bf16' needs bf16 models: LogitsDtype). */
  logits?: LogitsDtype | undefined;
  /** Never computes gradients (a scoring head of a training model): no dlogits chunk. */
  noGrad?: boolean | undefined;
}

/**
 * Columns of the LM-head GEMM for a loss over the first lossVocab rows: lossVocab rounded up to a multiple of 16
 * when both heads have that many rows and some padding is excluded anyway (an odd leading dimension such as Qwen's 151665 real tokens made cuBLAS's
 * TF32 GEMMs 1.7-2.7x slower on the H100, measured), else lossVocab. The loss ignores the extra columns and gives
 * them no gradient.
 */
export function headWidth(lossVocab: number, ...vocabs: number[]): number {
  if (vocabs.every((v) => v === lossVocab)) return lossVocab; // no padding rows: the whole head
  const aligned = Math.ceil(lossVocab / 16) * 16;
  return vocabs.every((v) => v >= aligned) ? aligned : lossVocab;
}

/**
 * The chunk bound of a head by default: DEFAULT_HEAD_CHUNK_FLOATS, and for a teacher cache, which has no teacher logits
 * chunk beside the student's and no teacher weights, CACHED_HEAD_MEMORY times the logits memory of an online
 * distillation (per row, twice the rows for an fp32 student, 5/3 for a bf16 student, whose bf16 dlogits chunk grows with
 * the rows): fewer chunks, each of which reads and writes the whole fp32 head gradient once, and larger head GEMMs.
 */
export function defaultChunkFloats(sparse: boolean, bf16Grad = false): number {
  if (!sparse) return DEFAULT_HEAD_CHUNK_FLOATS;
  // online per row: zs + zt (+ a bf16 dz: half a float); cached: zs (+ dz)
  const g = bf16Grad ? 0.5 : 0;
  return Math.floor(CACHED_HEAD_MEMORY * DEFAULT_HEAD_CHUNK_FLOATS * (2 + g) / (1 + g));
}

/**
 * How many times an online distillation's logits memory a cached one's head may take: 2, which runs an 8×1024 batch
 * of Qwen's 151936-token vocabulary with bf16 logits as one chunk (2.5 GB) instead of two of 4096 rows (a cached step
 * holds no teacher: 3 GB of a 1.5B teacher's bf16 weights and its logits chunk go).
 */
export const CACHED_HEAD_MEMORY = 2;

/** Rows per chunk for n tokens over a vocabulary of v: at least 1, at most n. */
export function headChunkRows(n: number, v: number, chunkFloats = DEFAULT_HEAD_CHUNK_FLOATS): number {
  return Math.max(1, Math.min(n, Math.floor(chunkFloats / v)));
}

/**
 * Rows per chunk of a head with logits of dtype `logits`: at most headChunkRows of the f32 layout's bound, and for bf16
 * logits as many more as keep the same bytes (f32: zs, zt and a bf16 student's separate dlogits; bf16: zs and zt, the
 * dlogits written over zs), so fewer chunks each read and write the whole fp32 head gradient; then the n rows split
 * evenly over that many chunks (8192 rows in chunks of at most 2208: four of 2048, not three of 2208 and one of 1568),
 * which allocates less and gives every chunk's GEMMs one shape.
 */
export function headRows(n: number, v: number, withTeacher: boolean, chunkFloats = DEFAULT_HEAD_CHUNK_FLOATS, bf16Grad = false,
  logits: LogitsDtype = 'f32'): number {
  const f32Bytes = chunkBytesPerElement(withTeacher, bf16Grad, 'f32'), bytes = chunkBytesPerElement(withTeacher, bf16Grad, logits);
  const most = headChunkRows(n, v, Math.floor(chunkFloats * f32Bytes / bytes));
  return Math.ceil(n / Math.ceil(n / most));
}

/**
 * Bytes per element of a chunk row's logits buffers: f32 logits zs (and zt with a teacher), plus a bf16 student's
 * separate bf16 dlogits; bf16 logits zs (and zt), the dlogits written over zs.
 */
function chunkBytesPerElement(withTeacher: boolean, bf16Grad: boolean, logits: LogitsDtype): number {
  const models = withTeacher ? 2 : 1;
  return logits === 'bf16' ? 2 * models : 4 * models + (bf16Grad ? 2 : 0);
}

/** Floats the chunked head allocates for n rows (logits chunks for the student and, with one, the teacher; targets,
 * weights, stats). The memory estimate (src/model/memory.ts) uses the same numbers. */
export function headFloats(n: number, v: number, withTeacher: boolean, chunkFloats = DEFAULT_HEAD_CHUNK_FLOATS,
  bf16Grad = false, logits: LogitsDtype = 'f32'): number {
  // v: the GEMM width (headWidth); the chunk's buffers in floats (chunkBytesPerElement / 4 per element).
  const r = headRows(n, v, withTeacher, chunkFloats, bf16Grad, logits);
  const chunks = r * v * chunkBytesPerElement(withTeacher, bf16Grad, logits) / 4;
  // With a teacher, a second stats row per token: the teacher's own cross-entropy (on-policy batches).
  return chunks + n * (2 + LOSS_STATS) + (withTeacher ? n * LOSS_STATS : 0);
}

export class ChunkedHead {
  readonly lossVocab: number;
  /** A scoring head: compute() refuses a gradient (HeadOptions.noGrad). */
  private readonly noGrad: boolean;
  /** Columns of each logits row: lossVocab, or lossVocab rounded up for the GEMMs (headWidth). */
  readonly width: number;
  readonly chunkRows: number;
  /** The logits chunks' dtype (HeadOptions.logits). */
  readonly logits: LogitsDtype;
  private readonly be: Backend;
  private readonly zs: Buf;
  /** dlogits of a bf16 student over f32 logits (a bf16 operand of the head's backward products); null: written over zs in place. */
  private readonly dz: Buf | null;
  private readonly zt: Buf | null;
  private readonly targets: IntBuf;
  private readonly weights: Buf;
  private readonly stats: Buf;
  /** The sparse teacher's device buffers (a cached distillation), else null. */
  private readonly sparse: SparseDevice | null;
  /** Per-row statistics of the teacher's own cross-entropy against the targets (compute's teacherCe), with a teacher. */
  private readonly teacherStats: Buf | null;

  constructor(readonly student: Transformer, readonly teacher: Transformer | null, readonly spec: LossSpec,
    readonly maxRows: number, opts: HeadOptions = {}) {
    this.be = student.backend;
    const vs = student.config.vocabSize, vt = teacher?.config.vocabSize ?? vs;
    const lv = opts.lossVocab ?? vs;
    if (!Number.isInteger(lv) || lv < 1 || lv > vs || lv > vt) {
      throw new DistilleryError(`the loss vocabulary (${lv} tokens) must be between 1 and both models' vocab_size (student ${vs}${teacher ? `, teacher ${vt}` : ''})`,
        'the tokenizer must fit in both models\' embeddings');
    }
    this.lossVocab = lv;
    this.noGrad = opts.noGrad === true;
    this.width = headWidth(lv, vs, vt);
    const bf16Grad = student.compute !== 'f32' && student.training && !this.noGrad;
    const lg = this.logits = opts.logits ?? 'f32';
    if (lg === 'bf16') {
      const f32 = [student, ...(teacher ? [teacher] : [])].find((m) => m.compute !== 'bf16');
      if (f32) {
        throw new DistilleryError(`bf16 logits need bf16 models, and the ${f32 === student ? 'student' : 'teacher'} computes in ${f32.compute}`,
          'use --precision bf16, or --logits f32');
      }
    }
    this.chunkRows = headRows(maxRows, this.width, teacher !== null, opts.chunkFloats ?? defaultChunkFloats(opts.sparse !== undefined, bf16Grad), bf16Grad, lg);
    this.zs = this.be.alloc(this.chunkRows * this.width, `student logits (one chunk of rows${lg === 'bf16' ? '; its dlogits in place' : ''})`, lg);
    this.zt = teacher ? this.be.alloc(this.chunkRows * this.width, 'teacher logits (one chunk of rows)', lg) : null;
    this.dz = !bf16Grad || lg === 'bf16' ? null
      : this.be.alloc(this.chunkRows * this.width, 'student dlogits (one chunk of rows)', student.compute);
    this.targets = this.be.allocInt(maxRows, 'loss targets');
    this.weights = this.be.alloc(maxRows, 'loss token weights');
    this.stats = this.be.alloc(maxRows * LOSS_STATS, 'loss statistics');
    if (opts.sparse && teacher) throw new DistilleryError('a loss head takes a teacher model or a teacher cache, not both');
    this.sparse = opts.sparse ? new SparseDevice(this.be, maxRows, opts.sparse) : null;
    this.teacherStats = teacher ? this.be.alloc(maxRows * LOSS_STATS, 'teacher cross-entropy statistics') : null;
  }

  /** Whether the head distills from a teacher cache (stage() then needs the batch's sparse rows). */
  get sparseTeacher(): boolean { return this.sparse !== null; }

  /**
   * Head + loss over n rows of hidden states (the models' last forwardHidden outputs). With `grad`, the student's
   * head gradient is accumulated (overwritten by the pass's first write after Transformer.overwriteGrads) and
   * dL/d(hidden) is written into student.hiddenGrad() (each chunk's rows overwritten).
   * Returns the per-row statistics [n, LOSS_STATS] on the host.
   */
  /**
   * Every target is a token of the loss vocabulary, or -1 (padding) with weight 0. Checked on the host for every
   * backend: the CUDA loss kernel reads any negative target as padding and does not range-check (an id past the
   * vocabulary would read another row's logits), where the CPU kernel throws.
   */
  private checkTargets(targets: Int32Array, weights: Float32Array | Float64Array, n: number): void {
    if (targets.length < n || weights.length < n) {
      throw new DistilleryError(`the loss head got ${targets.length} targets and ${weights.length} weights for ${n} rows`);
    }
    const lv = this.lossVocab;
    for (let i = 0; i < n; i++) {
      const y = targets[i]!;
      if (y >= 0 && y < lv) continue;
      if (y === -1) {
        if (weights[i] === 0) continue;
        throw new DistilleryError(`loss target of row ${i} is -1 (padding) but its weight is ${weights[i]} (must be 0)`,
          'padding positions need token weight 0 (mask them out)');
      }
      throw new DistilleryError(`loss target of row ${i} is ${y}, outside the loss vocabulary [0, ${lv}) (or -1 for padding)`,
        `token ids must come from the tokenizer the run uses (${lv} tokens)`);
    }
  }

  run(hs: Buf, ht: Buf | null, targets: Int32Array, weights: Float32Array | Float64Array, n: number, grad: boolean,
    sparse?: SparseHost): Float32Array | Float64Array {
    this.stage(targets, weights, n, sparse);
    this.compute(hs, ht, n, grad);
    return this.readStats(n);
  }

  /** Checks and uploads n rows of targets and token weights for compute() (before a captured region's work). */
  stage(targets: Int32Array, weights: Float32Array | Float64Array, n: number, sparse?: SparseHost): void {
    if (n > this.maxRows) throw new DistilleryError(`the loss head got ${n} rows, it was allocated for ${this.maxRows}`);
    this.checkTargets(targets, weights, n);
    this.be.uploadInt(this.targets, targets.subarray(0, n));
    this.be.upload(this.weights, weights.subarray(0, n));
    if (this.sparse) {
      if (!sparse) throw new DistilleryError('a loss head over a teacher cache needs the batch\'s sparse teacher rows');
      this.sparse.stage(sparse, n);
    }
  }

  /** The per-row statistics [n, LOSS_STATS] of the last compute(), on the host. */
  readStats(n: number): Float32Array | Float64Array {
    return this.be.download(this.be.view(this.stats, 0, n * LOSS_STATS));
  }

  /** The teacher's per-row statistics of the last compute(…, teacherCe = true): column STAT_CE is −log p_teacher(target). */
  readTeacherStats(n: number): Float32Array | Float64Array {
    if (!this.teacherStats) throw new DistilleryError('the teacher\'s cross-entropy needs a loss head with a teacher');
    return this.be.download(this.be.view(this.teacherStats, 0, n * LOSS_STATS));
  }

  /** run() over the rows stage() uploaded: device work only (it fits in a captured region). */
  /**
   * `teacherCe`: also the teacher's own cross-entropy against the targets (a plain loss over its logits, no gradient),
   * for readTeacherStats: how likely the teacher finds the tokens (on-policy batches: the student's samples).
   */
  compute(hs: Buf, ht: Buf | null, n: number, grad: boolean, teacherCe = false): void {
    if (grad && this.noGrad) throw new Error('a scoring head (HeadOptions.noGrad) computes no gradient');
    const be = this.be, V = this.width, C = this.student.config.hiddenSize, R = this.chunkRows;
    if (n > this.maxRows) throw new DistilleryError(`the loss head got ${n} rows, it was allocated for ${this.maxRows}`);
    if ((ht === null) !== (this.teacher === null)) throw new DistilleryError('the loss head needs the teacher\'s hidden states exactly when it has a teacher');
    const Ct = this.teacher?.config.hiddenSize ?? 0;
    const ws = be.view(this.student.headWeight(), 0, V * C);
    const wt = this.teacher ? be.view(this.teacher.headWeight(), 0, V * Ct) : null;
    const dW = grad ? this.student.headGrad() : null;
    if (grad && !this.student.training) throw new DistilleryError('a training pass needs a student created with training: true');
    // dW null in a training pass: the LM head is frozen (LoRA); the hidden states' gradient still flows.
    const dWs = dW ? be.view(dW, 0, V * C) : null;
    const dh = grad ? be.view(this.student.hiddenGrad(), 0, n * C) : null;
    // The first chunk's weight gradient overwrites the head's after overwriteGrads() (the rows past the width, which no
    // chunk writes, are zeroed then); each chunk overwrites its own rows of dh.
    let dWacc = dWs ? this.student.headGradAccumulates() : true;
    if (!dWacc && dW && V * C < dW.length) be.zero(be.view(dW, V * C, dW.length - V * C));
    if (!dWacc && dWs && n === 0) be.zero(dWs);
    for (let r0 = 0; r0 < n; r0 += R) {
      const rows = Math.min(R, n - r0);
      const zs = be.view(this.zs, 0, rows * V);
      const hsRows = be.view(hs, r0 * C, rows * C);
      be.matmulForward(zs, hsRows, ws, null, rows, C, V);
      let zt: Buf | null = null;
      if (this.zt && ht && wt) {
        zt = be.view(this.zt, 0, rows * V);
        be.matmulForward(zt, be.view(ht, r0 * Ct, rows * Ct), wt, null, rows, Ct, V);
      }
      const dz = this.dz ? be.view(this.dz, 0, rows * V) : zs;
      const st = be.view(this.stats, r0 * LOSS_STATS, rows * LOSS_STATS), y = be.viewInt(this.targets, r0, rows), w = be.view(this.weights, r0, rows);
      if (this.sparse) be.sparseLossForward(st, grad ? dz : null, zs, y, w, this.sparse.view(r0, rows), rows, this.lossVocab, this.spec, V);
      else be.lossForward(st, grad ? dz : null, zs, zt, y, w, rows, this.lossVocab, this.spec, V);
      if (teacherCe && zt && this.teacherStats) {
        be.lossForward(be.view(this.teacherStats, r0 * LOSS_STATS, rows * LOSS_STATS), null, zt, null, y, w, rows, this.lossVocab,
          { kind: 'none', alpha: 0, temperature: 1, beta: 0 }, V);
      }
      if (dh) be.matmulBackward(be.view(dh, r0 * C, rows * C), dWs, null, dz, hsRows, ws, rows, C, V, false, dWacc);
      dWacc = true;
    }
  }
}
