/**
 * The models and the tokenizer of a run, chosen and checked before anything is computed: which tokenizer the run
 * uses (the checkpoint's on --resume, --tokenizer, the teacher's, --init's, else one trained on the data) and that
 * every model shares it; the student's config; the vocabulary rows the loss runs over; whether --seq fits the models
 * and the job fits the device. runTraining (run.ts) and --dry-run (dry-run.ts) both call these, so they cannot disagree.
 *
 * buildRunModels then builds them for runTraining, on the data prepareRunData (run-data.ts) read: the job's kernels
 * pre-warmed, the student (and its files: a full model or LoRA adapters), the teacher with its weights, the step
 * runner, the optimizer and the on-policy generator. The student's own weights are set by the run (run.ts).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Backend, LossSpec } from '../backend/backend.js';
import { readHfConfigFile, presetConfig, parameterCount, PRESET_NAMES, eosIds, describeBaked, type ModelConfig } from '../model/config.js';
import type { LoadedCheckpoint } from '../model/checkpoint.js';
import { parameterLayout } from '../model/params.js';
import { Transformer } from '../model/transformer.js';
import { baseShape } from '../model/adapter.js';
import { weightsHash } from '../model/weights-hash.js';
import { BatchGenerator } from '../model/batch-generate.js';
import { Tokenizer } from '../tokenizer/bpe.js';
import { trainBpe } from '../tokenizer/train-bpe.js';
import { assertSameTokenizer, lossVocabulary, tokenizerHash, type NamedTokenizer } from '../tokenizer/identity.js';
import { endOfTurnIds } from '../tokenizer/chat.js';
import { sparseSlots } from '../cache/sparse.js';
import { hubIdOfSnapshot } from '../io/hf-cache.js';
import { UsageError } from '../cli/args.js';
import { LocalComm, shardOf, type Communicator } from '../parallel/comm.js';
import { ShardedAdamW } from '../parallel/data-parallel.js';
import { DistilleryError, InputError } from '../util/errors.js';
import { estimateJobBytes, largestSeqThatFits, formatGiB, describeJob, type JobMemory } from '../model/memory.js';
import type { RunOptions } from './options.js';
import { jobClosures, runJobShape, type JobShape } from './kernel-plan.js';
import { AdamW, type Optimizer } from './optimizer.js';
import type { OnPolicyOptions } from './on-policy.js';
import type { ResolvedPrecision } from './precision.js';
import type { RunData } from './run-data.js';
import { StepRunner } from './step.js';
import { damagedCheckpoint } from './run-start.js';
import { fullStudentFiles, loraStudentFiles, type StudentFiles } from './student-files.js';

export const SPECIAL_TOKENS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];

/**
 * The tokenizer to resume with: the checkpoint's own copy, in its weights folder (`model/`, or `adapter/` for a LoRA
 * run); out/tokenizer.json only for checkpoints without one.
 */
export function resumeTokenizerPath(out: string, latest: string, log: (s: string) => void): string {
  for (const sub of ['model', 'adapter']) {
    const own = path.join(latest, sub, 'tokenizer.json');
    if (fs.existsSync(own)) return own;
  }
  log(`warning: --resume: the checkpoint has no tokenizer.json of its own; using ${path.join(out, 'tokenizer.json')}`);
  return path.join(out, 'tokenizer.json');
}

export function teacherFrom(o: RunOptions): string {
  return o.teacherCache ? `--teacher-cache ${o.teacherCache}` : `--teacher ${o.teacher}`;
}


export function describe(c: ModelConfig): string {
  return `${c.architecture} ${c.numLayers}L × ${c.hiddenSize} (${c.numHeads} heads, ${c.numKvHeads} kv), vocab ${c.vocabSize}, ${(parameterCount(c) / 1e6).toFixed(2)}M parameters`;
}

/** The run's tokenizer and where it came from (the name it has in identity errors). */
export function chooseTokenizer(o: RunOptions, docs: () => string[], resumePath: string | null, teacher: LoadedCheckpoint | null,
  init: LoadedCheckpoint | null, log: (s: string) => void): NamedTokenizer & { role: 'resume' | 'tokenizer' | 'teacher' | 'init' | 'trained' } {
  if (resumePath) return { name: 'run', tokenizer: damagedCheckpoint(() => Tokenizer.fromFile(resumePath)), from: resumePath, role: 'resume' };
  if (o.tokenizer) return { name: 'data', tokenizer: Tokenizer.fromFile(o.tokenizer), from: `--tokenizer ${o.tokenizer}`, role: 'tokenizer' };
  if (teacher) {
    if (!teacher.tokenizer) throw new DistilleryError(`the teacher folder ${o.teacher} has no tokenizer.json`, 'copy the teacher\'s tokenizer.json into it or pass --tokenizer');
    return { name: 'teacher', tokenizer: teacher.tokenizer, from: teacherFrom(o), role: 'teacher' };
  }
  if (init?.tokenizer) return { name: 'student', tokenizer: init.tokenizer, from: `--init ${o.init}`, role: 'init' };
  const d = docs();
  const t0 = Date.now();
  const tok = trainBpe(d, { vocabSize: o.vocabSize, specialTokens: SPECIAL_TOKENS });
  log(`tokenizer: trained a byte-level BPE of ${tok.vocabSize} tokens on the data in ${((Date.now() - t0) / 1000).toFixed(1)}s`);
  return { name: 'data', tokenizer: tok, from: 'trained on the data', role: 'trained' };
}

/**
 * Refuses a teacher or an --init checkpoint whose tokenizer is not the run's (see identity.ts): same size is not
 * enough. A checkpoint without a tokenizer.json cannot be checked: the log says so.
 */
export function checkSameTokenizer(o: RunOptions, chosen: ReturnType<typeof chooseTokenizer>, teacher: LoadedCheckpoint | null,
  init: LoadedCheckpoint | null, log: (s: string) => void): void {
  const advice = o.mode === 'distill'
    ? 'distillation compares the two models token by token, so the teacher, the student (--init) and the data must use one tokenizer: use checkpoints trained with the same tokenizer, or drop --tokenizer to use the teacher\'s'
    : '--init continues a model trained with its own tokenizer; tokenizing the data with another would change what every token id means: drop --tokenizer to use the checkpoint\'s';
  const others: NamedTokenizer[] = [];
  if (teacher && chosen.role !== 'teacher') {
    if (teacher.tokenizer) others.push({ name: 'teacher', tokenizer: teacher.tokenizer, from: teacherFrom(o) });
    else log(`warning: the teacher ${o.teacher} has no tokenizer.json: cannot check that it uses the run's tokenizer (${chosen.from})`);
  }
  if (init && chosen.role !== 'init') {
    if (init.tokenizer) others.push({ name: 'student', tokenizer: init.tokenizer, from: `--init ${o.init}` });
    else log(`warning: the --init checkpoint ${o.init} has no tokenizer.json: cannot check that it uses the run's tokenizer (${chosen.from})`);
  }
  // The teacher first: "teacher vs student", "teacher vs data", then "student vs data".
  const all = [...others.filter((t) => t.name === 'teacher'), ...(chosen.role === 'teacher' ? [chosen] : []), ...others.filter((t) => t.name !== 'teacher'),
    ...(chosen.role !== 'teacher' ? [chosen] : [])];
  for (let i = 1; i < all.length; i++) assertSameTokenizer(all[0]!, all[i]!, advice);
  if (all.length > 1) {
    log(`tokenizer: ${chosen.tokenizer.vocabSize} tokens, identity ${tokenizerHash(chosen.tokenizer).slice(0, 16)}: the same for ${all.map((t) => t.name).join(', ')}`);
  }
}

/**
 * The vocabulary rows the loss runs over: with a teacher, the tokenizer's real tokens (lossVocabulary checks that the
 * teacher's and the student's vocab_size both cover them; padding rows past them are left out); without one, undefined
 * (the student's whole vocab_size). The run and --dry-run both call this, so they cannot disagree.
 */
export function runLossVocab(tokenizerSize: number, student: Pick<ModelConfig, 'vocabSize'>, teacher: Pick<ModelConfig, 'vocabSize'> | null):
  { lossVocab: number | undefined; note: string | null } {
  if (!teacher) return { lossVocab: undefined, note: null };
  return lossVocabulary(tokenizerSize, [{ name: 'teacher', vocabSize: teacher.vocabSize }, { name: 'student', vocabSize: student.vocabSize }]);
}

/** --model: a preset by name (sized to `vocab`), else a config.json file (any file name: the options checked it exists). */
function modelOption(model: string, vocab: number): ModelConfig {
  return PRESET_NAMES.includes(model) ? presetConfig(model, vocab) : readHfConfigFile(model, 'pass a valid config.json or a preset name');
}

/** The student's config: --init's, a config.json, or a preset sized to the tokenizer (the teacher's vocab_size when distilling). */
export function studentConfig(o: RunOptions, tok: Pick<Tokenizer, 'vocabSize' | 'eosId'>, teacher: Pick<LoadedCheckpoint, 'config'> | null,
  init: Pick<LoadedCheckpoint, 'config'> | null): ModelConfig {
  let cfg: ModelConfig;
  const vocab = teacher ? teacher.config.vocabSize : tok.vocabSize;
  if (init) cfg = init.config;
  else cfg = modelOption(o.model, vocab);
  if (cfg.eosTokenId === undefined && tok.eosId !== undefined) cfg = { ...cfg, eosTokenId: tok.eosId };
  // The teacher's and the student's vocab_size may differ (padded rows): lossVocabulary checks both cover the tokenizer.
  return cfg;
}

/**
 * Refuses a --seq longer than the student's (or teacher's) max_position_embeddings before the data is packed into
 * windows of that length (an absurd --seq would otherwise fail allocating them).
 */
export function checkSeqFits(o: RunOptions, teacher: LoadedCheckpoint | null, init: LoadedCheckpoint | null): void {
  let student: ModelConfig;
  if (init) student = init.config;
  else student = modelOption(o.model, 256);
  for (const [who, c] of [['the model', student], ['the teacher', teacher?.config]] as const) {
    if (c && o.seq > c.maxPositionEmbeddings) {
      throw new InputError(`--seq ${o.seq} exceeds ${who}'s max_position_embeddings (${c.maxPositionEmbeddings})`,
        `use --seq ${c.maxPositionEmbeddings} or less`);
    }
  }
}

/** On a GPU, refuses a job whose allocations cannot fit, naming the largest --seq that would (before any allocation). */
export function checkDeviceMemory(backend: Backend, j: JobMemory): void {
  const mem = backend.deviceMemory?.();
  if (!mem) return;
  const need = estimateJobBytes(j);
  const budget = mem.free * 0.95;
  if (need <= budget) return;
  const fit = largestSeqThatFits(j, budget);
  throw new DistilleryError(
    `this job needs about ${formatGiB(need)} on the device (${describeJob(j)}) but ${formatGiB(mem.free)} of ${formatGiB(mem.total)} is free`,
    fit > 0 ? `the largest --seq that fits with --batch ${j.batch} is about ${fit}; or lower --batch` : 'even a sequence of 1 token does not fit: use a smaller model or --device cpu');
}

/** The models of a train/distill run, built (buildRunModels). */
export interface RunModels {
  cfg: ModelConfig;
  job: JobShape;
  /** The student, without its weights yet (run.ts sets them: --init's, fresh, or the --resume checkpoint's). */
  student: Transformer;
  /** The live teacher with its weights, null when training or distilling from a teacher cache. */
  teacher: Transformer | null;
  files: StudentFiles;
  runner: StepRunner;
  opt: Optimizer;
  /** The whole masters when this rank keeps a shard of them (a collective), else undefined. */
  gatheredMasters: () => Float32Array | undefined;
  /** On-policy distillation (--on-policy): its options, the student's generator and the ids its completions stop at; null without. */
  onPolicy: OnPolicyOptions | null;
  onPolicyGen: BatchGenerator | null;
  genStops: { stopIds: number[]; turnEndIds: number[] };
}

/**
 * The ids a run's generation ends at (on-policy completions, generation items): the tokenizer's end of text, the
 * student's config's eos ids, and the generation configs' of --init (whose generation_config.json the final model
 * carries, so `eval` on it stops there too) and of the teacher.
 */
export function runStopIds(eosId: number, cfg: ModelConfig, initCk: Pick<LoadedCheckpoint, 'generationEosIds'> | null,
  teacherCk: Pick<LoadedCheckpoint, 'generationEosIds'> | null): number[] {
  return [...new Set([eosId, ...eosIds(cfg), ...(initCk?.generationEosIds ?? []), ...(teacherCk?.generationEosIds ?? [])])];
}

/**
 * Builds the run's models on `backend` for the data and tokenizer `data` (see the module comment), refusing a job
 * that cannot fit the device before anything is allocated, and logs what was built. Writes nothing to the run folder.
 */
export async function buildRunModels(o: RunOptions, backend: Backend, prec: ResolvedPrecision, comm: Communicator, data: RunData,
  log: (s: string) => void, items: { generateItems?: boolean } = {}): Promise<RunModels> {
  const world = comm.world;
  const { cache, teacherCk, initCk, extras, tokenizer, eosId } = data;
  const cfg = studentConfig(o, tokenizer, teacherCk, initCk);
  if (tokenizer.vocabSize > cfg.vocabSize) {
    throw new DistilleryError(`the tokenizer has ${tokenizer.vocabSize} tokens but the model's vocab_size is ${cfg.vocabSize}`,
      'use a config.json whose vocab_size covers the tokenizer');
  }
  // Distillation compares the models over the tokenizer's real tokens; padding rows past them are left out.
  const lv = runLossVocab(tokenizer.vocabSize, cfg, teacherCk?.config ?? null);
  if (lv.note) log(lv.note);
  const lossVocab = lv.lossVocab;
  const carry = {
    tokenizerJson: tokenizer.toJSON(), tokenizerConfig: extras?.tokenizerConfig ?? null, chatTemplate: extras?.chatTemplate ?? null,
    generationConfig: extras?.generationConfig ?? null,
  };
  // One description of the job for the pre-warm, the step and --dry-run: they cannot disagree.
  const precision = prec.model;
  const job = runJobShape(o, cfg, cache ? null : teacherCk?.config ?? null, lossVocab, precision, cache?.rep, items);
  const spec: LossSpec = job.loss!, adam = job.adam!;
  checkDeviceMemory(backend, { student: cfg, teacher: cache ? null : teacherCk?.config ?? null, teacherCacheSlots: cache ? sparseSlots(cache.rep) : undefined,
    onPolicy: o.mode === 'distill' && (o.onPolicy ?? 0) > 0, batch: o.batch, seq: o.seq, training: true, lossVocab, precision, lora: job.lora,
    teacherFrozen: job.teacherFrozen, studentFrozen: job.studentFrozen, world, logits: job.logits, documents: data.packed.windows[0]?.positions !== undefined,
    choices: job.choices, generateItems: job.generateItems, itemsBatch: job.itemsBatch });
  // Pre-warm (CUDA): compile every kernel this job's step and evaluation launch, then seal, before any weights.
  if (backend.prepare) {
    await backend.prepare(jobClosures(job));
  }
  // Data parallel in bf16: each rank keeps the fp32 masters of its optimizer shard only (ZeRO-1; src/parallel/data-parallel.ts).
  const masterRange = world > 1 && !job.lora && precision === 'bf16' ? shardOf(parameterLayout(cfg).total, world, comm.rank) : undefined;
  // 'bfd' windows hold several documents, each attending only to itself (Window.positions)
  const documents = data.packed.windows[0]?.positions !== undefined;
  const student = new Transformer(backend, cfg, { batch: o.batch, seq: o.seq, training: true, label: 'student', precision, lora: job.lora, frozenDtype: job.studentFrozen, masterRange, documents });
  /** The whole masters when this rank keeps a shard of them (a collective: every rank calls it at the same point), else undefined. */
  const gatheredMasters = (): Float32Array | undefined => (student.masterLength < student.layout.total ? (opt as ShardedAdamW).gatherMasters() : undefined);
  // A LoRA run's base is --init, frozen; its folders name the base and the SHA-256 of its weights.
  let files: StudentFiles;
  if (job.lora) {
    if (!initCk || !o.init) throw new UsageError('--lora-rank trains adapters on a pretrained model, but no --init names one', 'pass --init <model folder>');
    const base = { path: path.resolve(o.init), weights_sha256: weightsHash(initCk.weights, parameterLayout(initCk.config)), shape: baseShape(cfg) };
    // PEFT names the base by its Hub id when it came from the Hub (here: a folder of the local Hub cache)
    files = loraStudentFiles(student, cfg, carry, base, hubIdOfSnapshot(o.init) ?? undefined);
    const n = job.lora.total, all = parameterCount(cfg), sp = job.lora.spec;
    log(`LoRA: rank ${sp.rank}, alpha ${sp.alpha} (scale ${+job.lora.scale.toFixed(6)}) on ${sp.targets.join(', ')}: ${n.toLocaleString('en-US')} trainable parameters ` +
      `(${(100 * n / all).toFixed(2)}% of ${all.toLocaleString('en-US')}); the base (--init ${o.init}) is frozen in ${job.studentFrozen === 'nf4' ? `nf4 (its projection matrices; the rest in ${student.compute})` : student.compute}`);
  } else {
    files = fullStudentFiles(student, cfg, carry);
  }
  const teacher = teacherCk && !cache
    ? new Transformer(backend, teacherCk.config, { batch: o.batch, seq: o.seq, training: false, label: 'teacher', precision, frozenDtype: job.teacherFrozen, documents })
    : null;
  if (teacher && teacherCk) {
    const t0 = Date.now();
    if (job.teacherFrozen === 'nf4') log(`teacher: quantizing its projection matrices to nf4 (4.5 bits per weight, blocks of 64; QLoRA's format) on the host; the rest in ${teacher.compute}`);
    teacher.setWeights(teacherCk.weights);
    if (job.teacherFrozen === 'nf4') log(`teacher: quantized in ${((Date.now() - t0) / 1000).toFixed(1)}s`);
  }
  const runner = new StepRunner(student, teacher, spec, { lossVocab, sparse: cache?.rep, logits: job.logits });
  // A device communicator of one rank (NCCL with --gpus 1) still runs the sharded path: it must equal AdamW bit for bit.
  const opt: Optimizer = world > 1 || !(comm instanceof LocalComm) ? new ShardedAdamW(files.trainable, adam, comm) : new AdamW(files.trainable, adam);
  if (world > 1) {
    log(`data parallel: ${world} processes, each a batch of ${o.batch} × ${o.gradAccum} per step (a global batch of ${world * o.batch * o.gradAccum}); ` +
      `the optimizer's moments${masterRange ? ' and fp32 masters' : ''} sharded (${(opt as ShardedAdamW).shard.size} values per rank)`);
  }
  // On-policy distillation: the student writes the completions of a fraction of the steps (src/train/on-policy.ts).
  const onPolicy: OnPolicyOptions | null = o.mode === 'distill' && (o.onPolicy ?? 0) > 0 ? {
    fraction: o.onPolicy, promptLen: o.promptLen || Math.max(1, Math.floor(o.seq / 2)), genLen: o.genLen || o.seq,
    temperature: o.genTemperature, topP: o.genTopP, topK: o.genTopK, vocab: lossVocab ?? tokenizer.vocabSize,
  } : null;
  if (onPolicy && !teacher) throw new DistilleryError('on-policy distillation needs a live teacher (--teacher)', 'drop --on-policy, or pass --teacher');
  const onPolicyGen = onPolicy ? new BatchGenerator(student, o.batch, o.seq) : null;
  // the student's completions end at an end-of-text id; a reply to a conversation also at the end of its turn
  const genStops = { stopIds: runStopIds(eosId, cfg, initCk, teacherCk), turnEndIds: endOfTurnIds(tokenizer) };
  if (onPolicy) {
    log(`on-policy: ${(100 * onPolicy.fraction).toFixed(0)}% of the steps train on the student's completions (prompts of up to ${onPolicy.promptLen} tokens, ` +
      `up to ${onPolicy.genLen} new; temperature ${onPolicy.temperature}, top-p ${onPolicy.topP}, top-k ${onPolicy.topK}), scored by the teacher`);
  }
  log(`student: ${describe(cfg)}${teacher ? `; teacher: ${describe(teacher.config)}` : ''}; device ${backend.name}; precision ${prec.name}` +
    `${job.logits === 'bf16' ? '; logits bf16' : ''}`);
  if (cache) log(cache.describe());
  log(`student: ${describeBaked(cfg)}`);
  if (teacher) log(`teacher: ${describeBaked(teacher.config)}`);
  return { cfg, job, student, teacher, files, runner, opt, gatheredMasters, onPolicy, onPolicyGen, genStops };
}
