/**
 * One optimization step and one evaluation pass, for plain training and for distillation alike.
 *
 * Training step: zero gradients; for each micro-batch (gradient accumulation) upload its inputs, then, as one captured
 * region (Backend.captured: a CUDA graph on the GPU once the same pass repeats), run the teacher forward (if any)
 * and the student forward up to their final hidden states, the LM heads and the fused loss op chunk by chunk
 * (src/train/head.ts: the full logits never exist), and the student backward from its hidden states;
 * then the global gradient norm, clipping folded into AdamW as a gradient scale, and the update. Each token's
 * gradient weight is mask / (tokens counted in the whole step), so the gradient is that of the mean loss.
 * A non-finite loss or gradient norm stops before the update, so the weights stay those of the last good step.
 */
import type { LossSpec } from '../backend/backend.js';
import { LOSS_STATS, STAT_ACC, STAT_AGREE, STAT_CE, STAT_DIV, STAT_LOSS } from '../backend/backend.js';
import type { Transformer } from '../model/transformer.js';
import type { Optimizer } from './optimizer.js';
import type { Communicator } from '../parallel/comm.js';
import { DistilleryError } from '../util/errors.js';
import { ChunkedHead, type HeadOptions } from './head.js';
import type { SparseHost } from '../cache/targets.js';
import type { RowScores } from '../eval/choices.js';

/** b sequences of t tokens: inputs, next-token targets (−1 on padding) and a 0/1 mask of counted tokens. */
export interface Batch {
  inputs: Int32Array;
  targets: Int32Array;
  mask: Float32Array;
  b: number;
  t: number;
  /** The sparse teacher of every row (b·t rows), for a runner over a teacher cache. */
  sparse?: SparseHost | undefined;
  /** Also measure the teacher's cross-entropy of the targets (LossSums.teacherCe): on-policy batches, the student's samples. */
  teacherCe?: boolean | undefined;
  /** [b·t]: each row's position in its document ('bfd' windows, Window.positions), for models made with `documents`. */
  positions?: Int32Array | undefined;
}

/** Token-weighted sums over a set of batches. */
export interface LossSums {
  tokens: number;
  loss: number;
  ce: number;
  div: number;
  agree: number;
  /** Σ [argmax of the student == the target]: the tokens it predicts (TRL's mean_token_accuracy once divided). */
  correct: number;
  /** Σ −log p_teacher(target) over the batches that asked for it (Batch.teacherCe), and their tokens. */
  teacherCe?: number;
  teacherCeTokens?: number;
}

export interface StepResult {
  loss: number;
  ce: number;
  div: number;
  gradNorm: number;
  tokens: number;
  /** The fraction of counted tokens whose target is the student's most likely token (TRL's mean_token_accuracy). */
  tokenAccuracy: number;
  /** The teacher's mean log-likelihood of the targets of the batches that asked for it (on-policy: the student's samples). */
  teacherLogLik?: number;
}

/** Thrown when a step's loss or gradient is NaN or infinite; the weights are left as before the step. */
export class NonFiniteLossError extends DistilleryError {
  constructor(readonly what: string, readonly value: number) {
    super(`${what} is ${value} (not finite)`, 'lower --lr, raise --warmup, or check the data');
  }
}

export class StepRunner {
  private readonly head: ChunkedHead;
  /** The captured region of a pass without gradients (default 'evaluation pass'). */
  private readonly region: string;

  /**
   * `opts.lossVocab`: the vocabulary rows the loss runs over, the tokenizer's real tokens (Tokenizer.vocabSize).
   * Rows past it are embedding padding (a vocab_size rounded up, e.g. Qwen2.5-7B's 152064 for 151665 tokens) and
   * get neither probability nor gradient (src/train/head.ts). Default: the student's vocab_size. `opts.region`: the
   * captured region of its passes without gradients (a scoring runner's own, so its graphs do not evict validation's).
   */
  constructor(readonly student: Transformer, readonly teacher: Transformer | null, readonly spec: LossSpec, opts: HeadOptions & { region?: string } = {}) {
    this.region = opts.region ?? 'evaluation pass';
    const vs = student.config.vocabSize, vt = teacher?.config.vocabSize;
    const lv = opts.lossVocab;
    if (lv !== undefined) {
      if (!(Number.isInteger(lv) && lv > 0)) throw new DistilleryError(`lossVocab must be a positive integer, got ${lv}`);
      for (const [who, v] of [['student', vs], ['teacher', vt]] as const) {
        if (v !== undefined && v < lv) {
          throw new DistilleryError(`the ${who}'s vocab_size (${v}) is smaller than the tokenizer (${lv} tokens)`,
            `use a ${who} whose vocab_size covers the tokenizer`);
        }
      }
    }
    if (teacher) {
      if (vt !== vs && lv === undefined) {
        throw new DistilleryError(
          `teacher and student vocabularies differ: teacher vocab_size ${vt}, student ${vs}`,
          'distillation compares the two models token by token: give the student the teacher\'s tokenizer and vocab_size');
      }
      if (teacher.backend !== student.backend) throw new DistilleryError('teacher and student must use the same backend');
      if (teacher.batch < student.batch || teacher.seq < student.seq) {
        throw new DistilleryError('the teacher was allocated for smaller batches than the student');
      }
    }
    if (spec.kind !== 'none' && !teacher && !opts.sparse) {
      throw new DistilleryError(`loss kind "${spec.kind}" needs a teacher`, 'pass --teacher <checkpoint folder> (or --teacher-cache <folder>), or use --loss none');
    }
    if (opts.sparse && spec.kind === 'none') {
      throw new DistilleryError('a teacher cache needs a distillation loss', 'use --loss kl, reverse-kl or jsd with --teacher-cache');
    }
    this.head = new ChunkedHead(student, teacher, spec, student.batch * student.seq, opts);
  }

  /** The vocabulary rows the loss runs over. */
  get lossVocab(): number { return this.head.lossVocab; }

  /** Rows of logits the LM head computes at a time, and the vocabulary rows the loss runs over. */
  get headShape(): { chunkRows: number; lossVocab: number } {
    return { chunkRows: this.head.chunkRows, lossVocab: this.head.lossVocab };
  }

  /**
   * Runs forward + loss for one batch; with `grad`, also the backward (accumulating) with the given weight scale.
   * Returns the per-token statistics (LOSS_STATS a row).
   */
  private pass(batch: Batch, weightScale: number, grad: boolean, whileQueued?: () => void, ready?: (begin: number, end: number) => void): Float32Array | Float64Array {
    const n = batch.b * batch.t, { b, t } = batch;
    const w = new Float32Array(n);
    for (let i = 0; i < n; i++) w[i] = batch.mask[i]! * weightScale;
    // Inputs first, then the pass as one captured region (a CUDA graph once it repeats): forwards, head and loss, backward.
    this.teacher?.stageInputs(batch.inputs, b, t, batch.positions ?? null);
    this.student.stageInputs(batch.inputs, b, t, batch.positions ?? null);
    this.head.stage(batch.targets, w, n, batch.sparse);
    this.student.backend.captured(grad ? 'training pass' : this.region, () => {
      const ht = this.teacher ? this.teacher.forwardStaged(b, t) : null;
      const hs = this.student.forwardStaged(b, t);
      this.head.compute(hs, ht, n, grad, batch.teacherCe === true && ht !== null);
      if (grad) this.student.backwardHidden(ready);
    });
    // The pass is queued on the device (asynchronous on CUDA); host work that does not touch it overlaps it here.
    whileQueued?.();
    return this.head.readStats(n);
  }

  /** pass() summed over the batch's counted tokens (and the teacher's cross-entropy where the batch asks for it). */
  private lossPass(batch: Batch, weightScale: number, grad: boolean, whileQueued?: () => void, ready?: (begin: number, end: number) => void): LossSums {
    const s = this.pass(batch, weightScale, grad, whileQueued, ready);
    const n = batch.b * batch.t;
    const sums: LossSums = emptySums();
    if (batch.teacherCe === true && this.teacher) {
      const ts = this.head.readTeacherStats(n);
      let ce = 0, tok = 0;
      for (let i = 0; i < n; i++) { const m = batch.mask[i]!; if (m !== 0) { ce += m * ts[i * LOSS_STATS + STAT_CE]!; tok += m; } }
      sums.teacherCe = ce; sums.teacherCeTokens = tok;
    }
    for (let i = 0; i < n; i++) {
      const m = batch.mask[i]!;
      if (m === 0) continue;
      const r = i * LOSS_STATS;
      sums.tokens += m;
      sums.loss += m * s[r + STAT_LOSS]!;
      sums.ce += m * s[r + STAT_CE]!;
      sums.div += m * s[r + STAT_DIV]!;
      sums.agree += m * s[r + STAT_AGREE]!;
      sums.correct += m * s[r + STAT_ACC]!;
    }
    return sums;
  }

  /**
   * One optimizer step over the micro-batches (gradient accumulation when there are several). `whileQueued` runs once,
   * after the last micro-batch's pass is queued and before its results are read: host work (the next batch) that
   * overlaps the device's.
   */
  trainStep(micro: Batch[], optimizer: Optimizer, lr: number, clip: number, whileQueued?: () => void, comm?: Communicator): StepResult {
    let total = 0;
    for (const b of micro) for (let i = 0; i < b.b * b.t; i++) total += b.mask[i]!;
    // Data parallel: every token is weighted by 1 / (the step's counted tokens over all ranks).
    if (comm && comm.world > 1) total = comm.allReduceHost([total])[0]!;
    if (total === 0) throw new DistilleryError('a training step got no counted tokens', 'check the dataset: every window is padding');
    // No pass zeroes the gradients: the first micro-batch's backward overwrites them (Transformer.overwriteGrads).
    this.student.overwriteGrads();
    // Data parallel: the last micro-batch's backward pass hands its final gradients to the reduction as it goes.
    const ready = optimizer.beginStep?.();
    const acc: LossSums = emptySums();
    let loss: number, gradNorm: number;
    try {
      micro.forEach((b, i) => {
        const last = i === micro.length - 1;
        addSums(acc, this.lossPass(b, 1 / total, true, last ? whileQueued : undefined, last ? ready : undefined));
      });
      if (comm && comm.world > 1) {
        const g = comm.allReduceHost([acc.tokens, acc.loss, acc.ce, acc.div, acc.agree, acc.correct, acc.teacherCe ?? 0, acc.teacherCeTokens ?? 0]);
        Object.assign(acc, { tokens: g[0]!, loss: g[1]!, ce: g[2]!, div: g[3]!, agree: g[4]!, correct: g[5]! }, acc.teacherCeTokens !== undefined ? { teacherCe: g[6]!, teacherCeTokens: g[7]! } : {});
      }
      loss = acc.loss / acc.tokens;
      if (!Number.isFinite(loss)) throw new NonFiniteLossError('the training loss', loss);
      gradNorm = optimizer.gradNorm();
    } catch (e) {
      // the reductions this step started are waited for (the next step's zeroing must not race them); the error stands
      try { optimizer.abandonStep?.(); } catch { /* the first error says what happened */ }
      throw e;
    }
    if (!Number.isFinite(gradNorm)) throw new NonFiniteLossError('the gradient norm', gradNorm);
    const scale = clip > 0 && gradNorm > clip ? clip / gradNorm : 1;
    optimizer.update(lr, scale);
    return {
      loss, ce: acc.ce / acc.tokens, div: acc.div / acc.tokens, gradNorm, tokens: acc.tokens, tokenAccuracy: acc.correct / acc.tokens,
      ...(acc.teacherCeTokens ? { teacherLogLik: -acc.teacherCe! / acc.teacherCeTokens } : {}),
    };
  }

  /**
   * Each row's log-likelihood of its counted targets, Σ mask · log p(target), summed in float64, and whether every
   * counted target is the model's most likely token (lm-evaluation-harness's is_greedy), no gradients: the scores of a
   * continuation (src/eval/choices.ts). The loss vocabulary is the runner's.
   */
  rowScores(batch: Batch): RowScores {
    const s = this.pass(batch, 0, false);
    const ll = new Float64Array(batch.b), greedy = new Uint8Array(batch.b);
    for (let r = 0; r < batch.b; r++) {
      let sum = 0, all = 1;
      for (let p = 0; p < batch.t; p++) {
        const i = r * batch.t + p, m = batch.mask[i]!;
        if (m === 0) continue;
        sum -= m * s[i * LOSS_STATS + STAT_CE]!;
        if (s[i * LOSS_STATS + STAT_ACC] !== 1) all = 0;
      }
      ll[r] = sum; greedy[r] = all;
    }
    return { ll, greedy };
  }

  /** Mean loss, cross-entropy, divergence and teacher agreement over the given batches (no gradients). */
  evaluate(batches: Iterable<Batch>): EvalSums {
    const acc: LossSums = emptySums();
    for (const b of batches) addSums(acc, this.lossPass(b, 0, false));
    return means(acc);
  }

  /**
   * evaluate() with the event loop let in between batches (a signal's handler runs there), the same sums in the same
   * order; null as soon as `stop()` holds after a batch (the pass is abandoned).
   */
  async evaluateYielding(batches: Iterable<Batch>, stop: () => boolean): Promise<EvalSums | null> {
    const acc: LossSums = emptySums();
    for (const b of batches) {
      addSums(acc, this.lossPass(b, 0, false));
      await new Promise<void>((resolve) => setImmediate(resolve));
      if (stop()) return null;
    }
    return means(acc);
  }
}

/** Sums over a validation pass and the means the run reports. */
export type EvalSums = LossSums & { meanLoss: number; meanCe: number; meanDiv: number; agreement: number; tokenAccuracy: number; perplexity: number };

function means(acc: LossSums): EvalSums {
  const d = Math.max(acc.tokens, 1);
  return {
    ...acc, meanLoss: acc.loss / d, meanCe: acc.ce / d, meanDiv: acc.div / d, agreement: acc.agree / d, tokenAccuracy: acc.correct / d,
    perplexity: Math.exp(acc.ce / d),
  };
}

/** Sums over no tokens yet. */
function emptySums(): LossSums {
  return { tokens: 0, loss: 0, ce: 0, div: 0, agree: 0, correct: 0 };
}

function addSums(a: LossSums, b: LossSums): void {
  a.tokens += b.tokens; a.loss += b.loss; a.ce += b.ce; a.div += b.div; a.agree += b.agree; a.correct += b.correct;
  if (b.teacherCe !== undefined) { a.teacherCe = (a.teacherCe ?? 0) + b.teacherCe; a.teacherCeTokens = (a.teacherCeTokens ?? 0) + b.teacherCeTokens!; }
}
