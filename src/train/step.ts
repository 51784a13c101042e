/**
 * One optimization step and one evaluation pass, for plain training and for distillation alike.
 *
 * Training step: zero gradients; for each micro-batch (gradient accumulation) run the teacher forward (if any),
 * the student forward, the fused loss op (which writes dlogits over the logits), and the student backward;
 * then the global gradient norm, clipping folded into AdamW as a gradient scale, and the update. Each token's
 * gradient weight is mask / (tokens counted in the whole step), so the gradient is that of the mean loss.
 * A non-finite loss or gradient norm stops before the update, so the weights stay those of the last good step.
 */
import type { Backend, Buf, IntBuf, LossSpec } from '../backend/backend.js';
import { LOSS_STATS, STAT_AGREE, STAT_CE, STAT_DIV, STAT_LOSS } from '../backend/backend.js';
import type { Transformer } from '../model/transformer.js';
import type { AdamW } from './optimizer.js';
import { DistilleryError } from '../util/errors.js';

/** b sequences of t tokens: inputs, next-token targets (−1 on padding) and a 0/1 mask of counted tokens. */
export interface Batch {
  inputs: Int32Array;
  targets: Int32Array;
  mask: Float32Array;
  b: number;
  t: number;
}

/** Token-weighted sums over a set of batches. */
export interface LossSums {
  tokens: number;
  loss: number;
  ce: number;
  div: number;
  agree: number;
}

export interface StepResult {
  loss: number;
  ce: number;
  div: number;
  gradNorm: number;
  tokens: number;
}

/** Thrown when a step's loss or gradient is NaN or infinite; the weights are left as before the step. */
export class NonFiniteLossError extends DistilleryError {
  constructor(readonly what: string, readonly value: number) {
    super(`${what} is ${value} (not finite)`, 'lower --lr, raise --warmup, or check the data');
  }
}

export class StepRunner {
  private readonly be: Backend;
  private readonly targets: IntBuf;
  private readonly weights: Buf;
  private readonly stats: Buf;
  private readonly n: number;

  /**
   * The vocabulary rows the loss runs over: the tokenizer's real tokens (Tokenizer.vocabSize). Rows past it are
   * embedding padding (a vocab_size rounded up, e.g. Qwen2.5-7B's 152064 for 151665 tokens) and are excluded.
   * Defaults to the student's vocab_size.
   */
  readonly lossVocab: number;

  constructor(readonly student: Transformer, readonly teacher: Transformer | null, readonly spec: LossSpec, lossVocab?: number) {
    this.be = student.backend;
    const vs = student.config.vocabSize, vt = teacher?.config.vocabSize;
    if (lossVocab !== undefined) {
      if (!(Number.isInteger(lossVocab) && lossVocab > 0)) throw new DistilleryError(`lossVocab must be a positive integer, got ${lossVocab}`);
      for (const [who, v] of [['student', vs], ['teacher', vt]] as const) {
        if (v !== undefined && v < lossVocab) {
          throw new DistilleryError(`the ${who}'s vocab_size (${v}) is smaller than the tokenizer (${lossVocab} tokens)`,
            `use a ${who} whose vocab_size covers the tokenizer`);
        }
      }
    }
    if (teacher) {
      if (vt !== vs && lossVocab === undefined) {
        throw new DistilleryError(
          `teacher and student vocabularies differ: teacher vocab_size ${vt}, student ${vs}`,
          'distillation compares the two models token by token: give the student the teacher\'s tokenizer and vocab_size');
      }
      if (teacher.backend !== student.backend) throw new DistilleryError('teacher and student must use the same backend');
      if (teacher.batch < student.batch || teacher.seq < student.seq) {
        throw new DistilleryError('the teacher was allocated for smaller batches than the student');
      }
    }
    this.lossVocab = lossVocab ?? vs;
    // TODO(lead): the chunked LM head + loss runs over the first lossVocab rows; until then, refuse padded rows.
    if (this.lossVocab < vs || (vt !== undefined && this.lossVocab < vt)) {
      throw new DistilleryError(
        `a loss over the first ${this.lossVocab} vocabulary rows (student vocab_size ${vs}${vt !== undefined ? `, teacher ${vt}` : ''}: padded embedding rows) is not yet supported`,
        'use models whose vocab_size equals the tokenizer\'s size for now');
    }
    if (spec.kind !== 'none' && !teacher) {
      throw new DistilleryError(`loss kind "${spec.kind}" needs a teacher`, 'pass --teacher <checkpoint folder> or use --loss none');
    }
    this.n = student.batch * student.seq;
    this.targets = this.be.allocInt(this.n, 'loss targets');
    this.weights = this.be.alloc(this.n, 'loss token weights');
    this.stats = this.be.alloc(this.n * LOSS_STATS, 'loss statistics');
  }

  /** Runs forward + loss for one batch; with `grad`, also the backward (accumulating) with the given weight scale. */
  private lossPass(batch: Batch, weightScale: number, grad: boolean): LossSums {
    const be = this.be, V = this.student.config.vocabSize, n = batch.b * batch.t;
    const teacherLogits = this.teacher ? this.teacher.forward(batch.inputs, batch.b, batch.t) : null;
    const logits = this.student.forward(batch.inputs, batch.b, batch.t);
    const w = new Float32Array(n);
    for (let i = 0; i < n; i++) w[i] = batch.mask[i]! * weightScale;
    be.uploadInt(this.targets, batch.targets.subarray(0, n));
    be.upload(this.weights, w);
    const stats = be.view(this.stats, 0, n * LOSS_STATS);
    be.lossForward(stats, grad ? logits : null, logits, teacherLogits, this.targets, be.view(this.weights, 0, n), n, V, this.spec);
    if (grad) this.student.backward(logits);
    const s = be.download(stats);
    const sums: LossSums = { tokens: 0, loss: 0, ce: 0, div: 0, agree: 0 };
    for (let i = 0; i < n; i++) {
      const m = batch.mask[i]!;
      if (m === 0) continue;
      const r = i * LOSS_STATS;
      sums.tokens += m;
      sums.loss += m * s[r + STAT_LOSS]!;
      sums.ce += m * s[r + STAT_CE]!;
      sums.div += m * s[r + STAT_DIV]!;
      sums.agree += m * s[r + STAT_AGREE]!;
    }
    return sums;
  }

  /** One optimizer step over the micro-batches (gradient accumulation when there are several). */
  trainStep(micro: Batch[], optimizer: AdamW, lr: number, clip: number): StepResult {
    let total = 0;
    for (const b of micro) for (let i = 0; i < b.b * b.t; i++) total += b.mask[i]!;
    if (total === 0) throw new DistilleryError('a training step got no counted tokens', 'check the dataset: every window is padding');
    this.student.zeroGrad();
    const acc: LossSums = { tokens: 0, loss: 0, ce: 0, div: 0, agree: 0 };
    for (const b of micro) addSums(acc, this.lossPass(b, 1 / total, true));
    const loss = acc.loss / acc.tokens;
    if (!Number.isFinite(loss)) throw new NonFiniteLossError('the training loss', loss);
    const gradNorm = optimizer.gradNorm();
    if (!Number.isFinite(gradNorm)) throw new NonFiniteLossError('the gradient norm', gradNorm);
    const scale = clip > 0 && gradNorm > clip ? clip / gradNorm : 1;
    optimizer.update(lr, scale);
    return { loss, ce: acc.ce / acc.tokens, div: acc.div / acc.tokens, gradNorm, tokens: acc.tokens };
  }

  /** Mean loss, cross-entropy, divergence and teacher agreement over the given batches (no gradients). */
  evaluate(batches: Iterable<Batch>): LossSums & { meanLoss: number; meanCe: number; meanDiv: number; agreement: number; perplexity: number } {
    const acc: LossSums = { tokens: 0, loss: 0, ce: 0, div: 0, agree: 0 };
    for (const b of batches) addSums(acc, this.lossPass(b, 0, false));
    const d = Math.max(acc.tokens, 1);
    return {
      ...acc, meanLoss: acc.loss / d, meanCe: acc.ce / d, meanDiv: acc.div / d, agreement: acc.agree / d,
      perplexity: Math.exp(acc.ce / d),
    };
  }
}

function addSums(a: LossSums, b: LossSums): void {
  a.tokens += b.tokens; a.loss += b.loss; a.ce += b.ce; a.div += b.div; a.agree += b.agree;
}
