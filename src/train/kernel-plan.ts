/**
 * The closures a job runs, for pre-warming: each builds the job's models on the backend it is given and runs the
 * job's own step code (StepRunner.trainStep, StepRunner.evaluate, Generator.step) once on placeholder data of the
 * job's shapes. A compiling backend (CUDA) runs them on a tracing backend to learn every kernel the job will launch
 * (Backend.prepare), so the pre-warm set comes from the same code path as the job and cannot miss a kernel.
 * Shapes that vary during a job (evaluation batches, prompt lengths) are padded to or exercised at the sizes the
 * job uses; kernels bake model constants (eps, theta, head dim, widths, loss kind), not batch shapes.
 */
import type { Backend, LossSpec } from '../backend/backend.js';
import type { ModelConfig } from '../model/config.js';
import { Transformer, type Precision } from '../model/transformer.js';
import { loraLayout, loraSpecOf, type LoraLayout } from '../model/lora.js';
import type { FrozenDtype } from '../model/frozen.js';
import { Generator } from '../model/generate.js';
import { BatchGenerator } from '../model/batch-generate.js';
import { AdamW, type AdamWOptions } from './optimizer.js';
import { StepRunner, type Batch } from './step.js';
import { DEFAULT_RUN_OPTIONS as D, type RunOptions } from './options.js';
import { sparseSlots, type SparseRep } from '../cache/sparse.js';
import { allocSparseHost } from '../cache/targets.js';
import { TeacherPass } from '../cache/teacher-pass.js';
import type { LogitsDtype } from './head.js';
import { resolveLogits } from './precision.js';
import { choicesRunner } from './run-choices.js';

const NO_DISTILL: LossSpec = { kind: 'none', alpha: 0, temperature: 1, beta: 0 };

export interface JobShape {
  student: ModelConfig;
  teacher?: ModelConfig | null;
  batch: number;
  seq: number;
  /** The loss (default: plain cross-entropy, kind 'none'). */
  loss?: LossSpec;
  /** AdamW settings (default: DEFAULT_RUN_OPTIONS'; only used with `train`). */
  adam?: AdamWOptions;
  /** Include evaluation (validation during training, `distillery eval`). */
  evaluate?: boolean;
  /** Include the optimizer step (training, distillation). */
  train?: boolean;
  /**
   * Multiple-choice scoring in the run (--eval-choices, src/train/run-choices.ts): the student, and a teacher, each scored
   * alone with plain cross-entropy over its whole vocabulary (f32 logits), as `eval --choices` scores them.
   */
  choices?: boolean;
  /** Generation with a KV cache of this many positions (prefill + decode); 0 = none. */
  generateLen?: number;
  /** Batched generation of this many sequences (prompts of different lengths; src/model/batch-generate.ts), with generateLen. */
  generateBatch?: number;
  /** On-policy distillation: the student generates (batched, seq long) and the step measures the teacher's cross-entropy. */
  onPolicy?: boolean;
  /**
   * Generation items in the run's --eval-choices (src/train/run-generation.ts): the run's student, and a teacher, each
   * generate greedily on a generator of the run's batch × seq.
   */
  generateItems?: boolean;
  /** With generateItems: the sequences generated together (default: batch). */
  itemsBatch?: number | undefined;
  /** Vocabulary rows the loss runs over (padded embeddings; default: the student's vocab_size). */
  lossVocab?: number | undefined;
  /** The models' precision (default fp32): it decides the operand dtypes, so the kernels. */
  precision?: Precision;
  /** The LM heads' logits dtype (default f32): the loss kernels' operand dtype. */
  logits?: LogitsDtype | undefined;
  /** Distill from a teacher cache of this representation instead of a teacher model (the sparse loss). */
  teacherCache?: SparseRep | undefined;
  /** The teacher-cache job of this representation: the teacher's forward, LM head and sparse rows (no student step). */
  cacheTeacher?: SparseRep | undefined;
  /** The student trains LoRA adapters of this layout (frozen base; src/model/lora.ts). */
  lora?: LoraLayout | undefined;
  /** Frozen weights in NF4 (src/model/frozen.ts): the teacher's; the student's base (with `lora`, or an inference job). */
  teacherFrozen?: FrozenDtype | undefined;
  studentFrozen?: FrozenDtype | undefined;
}

/** The job a train/distill run with options `o` runs (its step, its evaluation): what it pre-warms and what --dry-run plans. */
export function runJobShape(o: RunOptions, student: ModelConfig, teacher: ModelConfig | null, lossVocab?: number,
  precision: Precision = 'fp32', teacherCache?: SparseRep, items: { generateItems?: boolean } = {}): JobShape {
  const loss: LossSpec = o.mode === 'train'
    ? { kind: 'none', alpha: 0, temperature: 1, beta: o.beta }
    : { kind: o.loss, alpha: o.alpha, temperature: o.temperature, beta: o.beta };
  const lora = loraSpecOf(o);
  return {
    student, teacher, batch: o.batch, seq: o.seq, loss, train: true, evaluate: true, lossVocab, precision, teacherCache,
    ...(o.evalChoices.length ? { choices: true } : {}),
    ...(o.evalChoices.length && items.generateItems ? { generateItems: true, itemsBatch: o.evalGenBatch || o.batch } : {}),
    logits: resolveLogits(o.logits, precision),
    ...(lora ? { lora: loraLayout(student, lora) } : {}),
    ...(o.mode === 'distill' && o.teacherDtype === 'nf4' && teacher ? { teacherFrozen: 'nf4' as const } : {}),
    ...(lora && o.baseDtype === 'nf4' ? { studentFrozen: 'nf4' as const } : {}),
    ...(o.mode === 'distill' && o.onPolicy > 0 ? { onPolicy: true } : {}),
    adam: { beta1: o.beta1, beta2: o.beta2, eps: o.adamEps, weightDecay: o.weightDecay },
  };
}

function placeholderBatch(b: number, t: number, vocab: number, cache?: SparseRep): Batch {
  const n = b * t;
  const inputs = Int32Array.from({ length: n }, (_, i) => (i * 7919) % vocab);
  const targets = Int32Array.from({ length: n }, (_, i) => (i * 104729 + 1) % vocab);
  const batch: Batch = { inputs, targets, mask: new Float32Array(n).fill(1), b, t };
  if (cache) {
    // Every row's slots full of distinct ids, a tail where the representation has one.
    const S = sparseSlots(cache), h = allocSparseHost(n, S);
    for (let r = 0; r < n; r++) {
      for (let k = 0; k < S; k++) { h.ids[r * S + k] = (r + k) % vocab; h.prob[r * S + k] = 1 / S; h.logq[r * S + k] = -Math.log(S + 1); }
      h.tail[r] = cache.kind === 'top' ? 1 / (S + 1) : -1;
      h.argmax[r] = r % vocab;
    }
    batch.sparse = h;
  }
  return batch;
}

/** The closures of a job (see the module comment). */
export function jobClosures(j: JobShape): Array<(b: Backend) => void> {
  const runs: Array<(b: Backend) => void> = [];
  if (j.train || j.evaluate || j.choices) {
    runs.push((be) => {
      const precision = j.precision ?? 'fp32';
      const student = new Transformer(be, j.student, { batch: j.batch, seq: j.seq, training: Boolean(j.train), precision, lora: j.lora, frozenDtype: j.studentFrozen });
      const teacher = j.teacher ? new Transformer(be, j.teacher, { batch: j.batch, seq: j.seq, training: false, precision, frozenDtype: j.teacherFrozen }) : null;
      const runner = new StepRunner(student, teacher, j.loss ?? NO_DISTILL, { lossVocab: j.lossVocab, sparse: j.teacherCache, logits: j.logits });
      const batch = placeholderBatch(j.batch, j.seq, j.lossVocab ?? j.student.vocabSize, j.teacherCache);
      // A run loads weights before its first step (setWeights, a resumed checkpoint): a bf16 student's fp32 masters are
      // copied into its bf16 compute copy (syncWeights), a conversion no step repeats; so are its LoRA adapters'.
      student.syncWeights();
      student.lora?.syncWeights();
      teacher?.syncWeights();
      const adam = j.adam ?? { beta1: D.beta1, beta2: D.beta2, eps: D.adamEps, weightDecay: D.weightDecay };
      if (j.train) runner.trainStep([batch], new AdamW(student.trainable(), adam), 1e-3, 1);
      // an on-policy step also measures the teacher's cross-entropy of the student's samples
      if (j.train && j.onPolicy && teacher) runner.trainStep([{ ...batch, teacherCe: true }], new AdamW(student.trainable(), adam), 1e-3, 1);
      if (j.evaluate) runner.evaluate([batch]);
      if (j.choices) {
        choicesRunner(student).evaluate([batch]);
        if (teacher) choicesRunner(teacher).evaluate([{ ...batch, targets: batch.targets.map((x) => x % j.teacher!.vocabSize) }]);
      }
    });
  }
  if (j.cacheTeacher) {
    runs.push((be) => {
      if (!j.teacher) throw new Error('a teacher-cache job needs the teacher\'s config');
      const m = new Transformer(be, j.teacher, { batch: j.batch, seq: j.seq, training: false, precision: j.precision ?? 'fp32', frozenDtype: j.teacherFrozen });
      const pass = new TeacherPass(m, j.lossVocab ?? j.teacher.vocabSize, 1, j.cacheTeacher!);
      pass.run(placeholderBatch(j.batch, j.seq, j.lossVocab ?? j.teacher.vocabSize).inputs, j.batch, j.seq, () => 0.5, () => undefined);
    });
  }
  if ((j.onPolicy || j.generateItems) && j.seq >= 2) {
    runs.push((be) => {
      // Generation inside a run (on-policy completions, --eval-choices generation items) runs on a generator of the
      // run's batch × seq over the run's own student (a training model: its fused products, its LoRA adapters unmerged
      // over its own rows), as src/train/run-models.ts and src/train/run.ts build them, and a live teacher's.
      const precision = j.precision ?? 'fp32';
      const m = new Transformer(be, j.student, { batch: j.batch, seq: j.seq, training: Boolean(j.train), precision, lora: j.lora, frozenDtype: j.studentFrozen });
      const g = new BatchGenerator(m, j.batch, j.seq);
      // prompts of two lengths (prefill), then decode steps at per-sequence positions, sampled on the device: on-policy
      // samples, generation items are greedy
      // (sized to the window: 2 new tokens run a decode step, which a window of 2 never has room for)
      const P = j.seq >= 4 ? 2 : 1, N = j.seq >= 3 ? 2 : 1;
      const prompts = Array.from({ length: j.batch }, (_, b) => [0, 1].slice(0, 1 + (b % P)));
      if (j.onPolicy) g.generateOnDevice(prompts, { temperature: 1, topP: 0.9, topK: 8, maxNewTokens: N });
      if (j.generateItems) {
        // the items' generator: the on-policy one where their batches agree (src/train/run.ts), else one of its own
        const IB = j.itemsBatch ?? j.batch;
        const items = Array.from({ length: IB }, (_, b) => [0, 1].slice(0, 1 + (b % P)));
        (IB === j.batch ? g : new BatchGenerator(m, IB, j.seq)).generateOnDevice(items, { temperature: 0, topP: 1, maxNewTokens: N });
        if (j.teacher) {
          const t = new Transformer(be, j.teacher, { batch: j.batch, seq: j.seq, training: false, precision, frozenDtype: j.teacherFrozen });
          new BatchGenerator(t, IB, j.seq).generateOnDevice(items, { temperature: 0, topP: 1, maxNewTokens: N });
        }
      }
    });
  }
  if (j.generateLen && j.generateLen > 2 && j.generateBatch && j.generateBatch > 1) {
    const len = j.generateLen, B = j.generateBatch;
    runs.push((be) => {
      // eval and generate generate with an inference model of their own (a LoRA adapter unmerged over the generator's rows)
      const m = new Transformer(be, j.student, { ...(j.lora ? { batch: B, seq: len } : { batch: 1, seq: 1 }), training: false, precision: j.precision ?? 'fp32', lora: j.lora, frozenDtype: j.studentFrozen });
      const g = new BatchGenerator(m, B, len);
      // prompts of two lengths (prefill), then decode steps at per-sequence positions, sampled on the device
      g.generateOnDevice(Array.from({ length: B }, (_, b) => [0, 1].slice(0, 1 + (b % 2))), { temperature: 1, topP: 0.9, topK: 8, maxNewTokens: 2 });
    });
  }
  if (j.generateLen && j.generateLen > 1) {
    const len = j.generateLen;
    runs.push((be) => {
      const m = new Transformer(be, j.student, { batch: 1, seq: 1, training: false, precision: j.precision ?? 'fp32' });
      const g = new Generator(m, len);
      g.step(Int32Array.from([0, 1].slice(0, Math.min(2, len - 1)))); // prefill
      g.step(Int32Array.of(2 % j.student.vocabSize)); // decode
    });
  }
  return runs;
}
