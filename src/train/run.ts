/**
 * A whole training or distillation run: data → tokenizer → models → steps with evaluation, checkpoints,
 * metrics and a loss curve → the final model folder and a summary.
 *
 * Run folder layout (`out`):
 *   metrics.jsonl            one JSON object per step ({"step", "loss", ...}) and per evaluation ({"step", "val_loss", ...})
 *   loss.svg                 train and validation loss curves, titled with the run's name (distill: objective, CE, agreement)
 *   summary.json             initial and final losses, tokens/s, timings, how the run ended
 *   tokenizer.json           the tokenizer the run used (trained on the data when none was given)
 *   checkpoints/latest/      exact-resume checkpoint, replaced atomically: model/ (HF folder, float32),
 *                            optimizer.safetensors (AdamW moments), state.json (step, data position, options)
 *   final/                   the trained model as an HF folder (config.json, model.safetensors, tokenizer.json)
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Backend, LossSpec } from '../backend/backend.js';
import { createBackend, type CudaOptions } from '../backend/create.js';
import { parseHfConfig, presetConfig, parameterCount, type ModelConfig } from '../model/config.js';
import { initialWeights } from '../model/params.js';
import { Transformer } from '../model/transformer.js';
import { readCheckpoint, writeCheckpoint, type LoadedCheckpoint } from '../model/checkpoint.js';
import { Tokenizer } from '../tokenizer/bpe.js';
import { trainBpe } from '../tokenizer/train-bpe.js';
import { loadDocuments, packDocuments, splitTrainVal, BatchLoader, loadDocCorpus, type Window, type LoaderState } from '../data/index.js';
import { readSafetensors, writeSafetensors } from '../io/safetensors.js';
import { replaceDirAtomicSync, recoverDir, writeFileAtomic } from '../io/atomic.js';
import { lossPlotSvg } from '../report/loss-plot.js';
import { Progress } from '../report/progress.js';
import { Rng } from '../util/rng.js';
import { DistilleryError, InputError, fileError } from '../util/errors.js';
import { AdamW } from './optimizer.js';
import { lrAt } from './schedule.js';
import { StepRunner, NonFiniteLossError, type Batch } from './step.js';
import type { RunOptions } from './options.js';
import { jobClosures, runJobShape } from './kernel-plan.js';
import { estimateJobBytes, largestSeqThatFits, formatGiB, describeJob, type JobMemory } from '../model/memory.js';

export interface RunSummary {
  mode: 'train' | 'distill';
  out: string;
  finalDir: string | null;
  steps: number;
  /** Loss of the first training step and mean of the last min(10, steps) steps. */
  initialTrainLoss: number;
  finalTrainLoss: number;
  /** Validation loss (the run's objective) before the first step and after the last; CE and perplexity too. */
  initialValLoss: number;
  finalValLoss: number;
  initialValCe: number;
  finalValCe: number;
  finalValPerplexity: number;
  /** Student-teacher top-1 agreement on validation (distill only). */
  finalAgreement: number | null;
  tokensTrained: number;
  seconds: number;
  /** Training tokens per second of step time (evaluation and checkpoint writes excluded). */
  tokensPerSecond: number;
  parameters: number;
  teacherParameters: number | null;
  /** 'completed', 'stopped' (stopAfter), or the reason it failed. */
  status: string;
}

export const SPECIAL_TOKENS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];

interface SavedState {
  version: 1;
  step: number;
  optimizerStep: number;
  loader: LoaderState;
  tokensTrained: number;
  initialTrainLoss: number;
  initialValLoss: number;
  initialValCe: number;
  options: RunOptions;
}

export interface RunHooks {
  /** Messages for the user (default: stderr). */
  log?: (line: string) => void;
  /** A backend to use instead of creating one (tests, benchmarks). */
  backend?: Backend;
  /** CUDA settings for the backend runTraining creates (verbose/strict kernels, cache folder, TF32). */
  backendOptions?: CudaOptions;
  /**
   * Called while a checkpoint is being written (the model is in the temporary folder, the optimizer state not
   * yet). Tests throw from it to simulate a write that fails midway; the previous checkpoint must survive.
   */
  duringCheckpointWrite?: (tmpDir: string, step: number) => void;
}

/** Runs training or distillation as configured. Throws DistilleryError for bad input; never loses the last checkpoint. */
export async function runTraining(o: RunOptions, hooks: RunHooks = {}): Promise<RunSummary> {
  const log = hooks.log ?? ((s: string) => process.stderr.write(s + '\n'));
  const out = path.resolve(o.out);
  try { fs.mkdirSync(out, { recursive: true }); } catch (e) {
    const f = fileError(e, `--out ${o.out}: cannot create the run folder`, 'pass a folder path you can write to, e.g. --out runs/my-run');
    // A path that cannot be a folder, or one the user may not write, is bad input (exit 2); a full disk is not.
    const input = ['ENOTDIR', 'EEXIST', 'EACCES', 'EPERM', 'EROFS'].includes(String((e as NodeJS.ErrnoException).code));
    throw input && f instanceof DistilleryError ? new InputError(f.message, f.hint) : f;
  }
  const latest = path.join(out, 'checkpoints', 'latest');
  recoverDir(latest);
  let saved: SavedState | null = null;
  if (o.resume) {
    const statePath = path.join(latest, 'state.json');
    if (!fs.existsSync(statePath)) {
      throw new DistilleryError(`--resume: no checkpoint at ${latest}`, 'run without --resume to start fresh, or point --out at the run folder');
    }
    saved = readSavedState(statePath);
    checkResumeCompatible(saved.options, o, log);
  }

  // The backend first: a missing GPU is reported before any data work is done.
  const backend = hooks.backend ?? await createBackend({ ...hooks.backendOptions, device: o.device, threads: o.threads });
  const ownBackend = !hooks.backend;
  try {
    return await runWithBackend(o, hooks, backend, log, out, latest, saved);
  } finally {
    if (ownBackend) backend.dispose();
  }
}

async function runWithBackend(o: RunOptions, hooks: RunHooks, backend: Backend, log: (s: string) => void, out: string,
  latest: string, saved: SavedState | null): Promise<RunSummary> {
  // ---- data and tokenizer ----------------------------------------------------------------------------
  const teacherCk: LoadedCheckpoint | null = o.mode === 'distill' ? loadTeacher(o) : null;
  const initCk: LoadedCheckpoint | null = o.init ? readCheckpoint(o.init) : null;
  checkSeqFits(o, teacherCk, initCk);
  const docs = readData(o, log);
  const tokenizer = chooseTokenizer(o, docs, saved ? path.join(out, 'tokenizer.json') : null, teacherCk, initCk, log);
  if (!saved) writeFileAtomic(path.join(out, 'tokenizer.json'), JSON.stringify(tokenizer.toJSON()));
  const eosId = tokenizer.eosId ?? tokenizer.tokenToId('<|endoftext|>');
  if (eosId === undefined) throw new DistilleryError('the tokenizer has no end-of-text token', 'use a tokenizer.json with <|endoftext|> or </s>');
  const packed = packDocuments(tokenizer, docs, { seqLen: o.seq, eosId });
  const { train, val } = splitTrainVal(packed.windows, o.valFraction, new Rng(o.seed));
  if (val.length === 0) log('warning: no validation windows (dataset too small or --val-fraction 0): validation loss is not measured');
  log(`data: ${docs.length} documents, ${packed.totalTokens} tokens, ${train.length} training and ${val.length} validation windows of ${o.seq}`);

  // ---- models ----------------------------------------------------------------------------------------
  const cfg = studentConfig(o, tokenizer, teacherCk, initCk);
  if (tokenizer.vocabSize > cfg.vocabSize) {
    throw new DistilleryError(`the tokenizer has ${tokenizer.vocabSize} tokens but the model's vocab_size is ${cfg.vocabSize}`,
      'use a config.json whose vocab_size covers the tokenizer');
  }
  // One description of the job for the pre-warm, the step and --dry-run: they cannot disagree.
  const job = runJobShape(o, cfg, teacherCk?.config ?? null);
  const spec: LossSpec = job.loss!, adam = job.adam!;
  checkDeviceMemory(backend, { student: cfg, teacher: teacherCk?.config ?? null, batch: o.batch, seq: o.seq, training: true });
  // Pre-warm (CUDA): compile every kernel this job's step and evaluation launch, then seal, before any weights.
  if (backend.prepare) {
    await backend.prepare(jobClosures(job));
  }
  const student = new Transformer(backend, cfg, { batch: o.batch, seq: o.seq, training: true, label: 'student' });
  const teacher = teacherCk
    ? new Transformer(backend, teacherCk.config, { batch: o.batch, seq: o.seq, training: false, label: 'teacher' })
    : null;
  if (teacher && teacherCk) teacher.setWeights(teacherCk.weights);
  const runner = new StepRunner(student, teacher, spec);
  const opt = new AdamW(student, adam);
  const loader = new BatchLoader(train, { batchSize: o.batch, seed: o.seed });
  log(`student: ${describe(cfg)}${teacher ? `; teacher: ${describe(teacher.config)}` : ''}; device ${backend.name}`);

  let step = 0, tokensTrained = 0;
  let initialTrainLoss = NaN, initialValLoss = NaN, initialValCe = NaN;
  const metricsPath = path.join(out, 'metrics.jsonl');
  if (saved) {
    const s = saved;
    student.setWeights(readCheckpoint(path.join(latest, 'model')).weights);
    const moments = readSafetensors(path.join(latest, 'optimizer.safetensors')).tensors;
    backend.upload(opt.m, moments.get('m')!.data);
    backend.upload(opt.v, moments.get('v')!.data);
    opt.step = s.optimizerStep;
    loader.restore(s.loader);
    step = s.step; tokensTrained = s.tokensTrained;
    initialTrainLoss = s.initialTrainLoss; initialValLoss = s.initialValLoss; initialValCe = s.initialValCe;
    truncateMetrics(metricsPath, step);
    log(`resumed from ${latest} at step ${step}`);
  } else {
    student.setWeights(initCk ? initCk.weights : initialWeights(student.layout, cfg, new Rng(o.seed)));
    try { fs.writeFileSync(metricsPath, ''); } catch (e) { throw fileError(e, `cannot write ${metricsPath}`, 'free disk space (or fix permissions) and retry'); }
  }
  const evalBatches = makeEvalBatches(val, o.batch, o.evalBatches);
  const evaluate = (): ReturnType<StepRunner['evaluate']> | null => (evalBatches.length ? runner.evaluate(evalBatches) : null);
  const appendMetric = (m: Record<string, unknown>): void => {
    try { fs.appendFileSync(metricsPath, JSON.stringify(m) + '\n'); } catch (e) {
      throw fileError(e, `cannot append to ${metricsPath}`,
        `free disk space, then continue with --resume${fs.existsSync(latest) ? ` (the last checkpoint, ${latest}, is intact)` : ''}`);
    }
  };
  if (!saved) {
    const e = evaluate();
    if (e) {
      initialValLoss = e.meanLoss; initialValCe = e.meanCe;
      appendMetric({ step: 0, val_loss: e.meanLoss, val_ce: e.meanCe, val_ppl: e.perplexity, ...(teacher ? { val_div: e.meanDiv, agreement: e.agreement } : {}) });
      log(`step 0: validation loss ${e.meanLoss.toFixed(4)} (ce ${e.meanCe.toFixed(4)})`);
    }
  }

  const saveLatest = (): void => {
    const state: SavedState = {
      version: 1, step, optimizerStep: opt.step, loader: loader.state(), tokensTrained,
      initialTrainLoss, initialValLoss, initialValCe, options: o,
    };
    const weights = Float32Array.from(student.getWeights());
    const m = Float32Array.from(backend.download(opt.m)), v = Float32Array.from(backend.download(opt.v));
    replaceDirAtomicSync(latest, (tmp) => {
      writeCheckpoint(path.join(tmp, 'model'), cfg, weights, { dtype: 'f32', tokenizerJson: tokenizer.toJSON() });
      hooks.duringCheckpointWrite?.(tmp, step);
      writeSafetensors(path.join(tmp, 'optimizer.safetensors'), new Map([
        ['m', { shape: [m.length], data: m }], ['v', { shape: [v.length], data: v }],
      ]), { dtype: 'f32' });
      fs.writeFileSync(path.join(tmp, 'state.json'), JSON.stringify(state, null, 1));
    });
  };

  const started = Date.now();
  const startStep = step, tokensAtStart = tokensTrained;
  // Throughput counts training steps only (evaluation and checkpoint writes are excluded).
  let stepSeconds = 0;
  // The mean of the last 10 step losses (restored from metrics.jsonl on resume, so it matches an uninterrupted run).
  const recent: number[] = readMetrics(metricsPath).filter((r) => r.loss !== undefined).map((r) => r.loss!).slice(-10);
  const progress = new Progress(o.steps, o.mode === 'distill' ? 'distill' : 'train', Math.max(1, Math.floor(o.steps / 20)),
    process.stderr, startStep);
  let status = 'completed';
  let lastEval = null as ReturnType<typeof evaluate>;
  /** summary.json: written at the end of every run, failed ones included. */
  const writeSummary = (finalDir: string | null): RunSummary => {
    const summary: RunSummary = {
      mode: o.mode, out, finalDir, steps: step,
      initialTrainLoss, finalTrainLoss: recent.length ? recent.reduce((a, b) => a + b, 0) / recent.length : NaN,
      initialValLoss, finalValLoss: lastEval?.meanLoss ?? NaN, initialValCe, finalValCe: lastEval?.meanCe ?? NaN,
      finalValPerplexity: lastEval?.perplexity ?? NaN, finalAgreement: teacher && lastEval ? lastEval.agreement : null,
      tokensTrained, seconds: (Date.now() - started) / 1000,
      tokensPerSecond: (tokensTrained - tokensAtStart) / Math.max(stepSeconds, 1e-9),
      parameters: parameterCount(cfg), teacherParameters: teacher ? parameterCount(teacher.config) : null, status,
    };
    writeFileAtomic(path.join(out, 'summary.json'), JSON.stringify(summary, null, 2) + '\n');
    return summary;
  };
  try {
    while (step < o.steps) {
      const micro: Batch[] = [];
      for (let a = 0; a < o.gradAccum; a++) {
        const b = loader.next();
        micro.push({ inputs: b.inputs, targets: b.targets, mask: b.mask, b: o.batch, t: o.seq });
      }
      const lr = lrAt(step, { lr: o.lr, warmup: o.warmup, total: o.steps, minLrRatio: o.minLrRatio });
      let r;
      const stepStart = process.hrtime.bigint();
      try {
        r = runner.trainStep(micro, opt, lr, o.clip);
        stepSeconds += Number(process.hrtime.bigint() - stepStart) / 1e9;
      } catch (e) {
        if (e instanceof NonFiniteLossError) {
          status = `failed at step ${step + 1}: ${e.message}`;
          writeSummary(null);
          throw new DistilleryError(`training stopped at step ${step + 1}: ${e.message}`,
            `${fs.existsSync(latest) ? `the last good checkpoint is ${latest} (resume with --resume)` : 'no checkpoint had been saved yet'}; ${e.hint ?? ''}`);
        }
        throw e;
      }
      step++;
      tokensTrained += r.tokens;
      if (step === 1 && !saved) initialTrainLoss = r.loss;
      recent.push(r.loss); if (recent.length > 10) recent.shift();
      const secs = (Date.now() - started) / 1000;
      const tps = (tokensTrained - tokensAtStart) / Math.max(stepSeconds, 1e-9);
      appendMetric({ step, lr, loss: r.loss, ce: r.ce, ...(teacher ? { div: r.div } : {}), grad_norm: r.gradNorm, tokens: tokensTrained, tokens_per_s: Math.round(tps), seconds: +secs.toFixed(2) });
      if (!o.quiet) progress.update(step, { loss: r.loss, 'tok/s': Math.round(tps), lr: lr.toExponential(2) });
      const last = step === o.steps || (o.stopAfter > 0 && step >= o.stopAfter);
      if (step % o.evalEvery === 0 || last) {
        lastEval = evaluate();
        if (lastEval) {
          appendMetric({ step, val_loss: lastEval.meanLoss, val_ce: lastEval.meanCe, val_ppl: lastEval.perplexity, ...(teacher ? { val_div: lastEval.meanDiv, agreement: lastEval.agreement } : {}) });
          if (!o.quiet) { progress.done(); log(`step ${step}: validation loss ${lastEval.meanLoss.toFixed(4)} (ce ${lastEval.meanCe.toFixed(4)}, ppl ${lastEval.perplexity.toFixed(2)})`); }
        }
      }
      if (step % o.saveEvery === 0 || last) saveLatest();
      if (o.stopAfter > 0 && step >= o.stopAfter && step < o.steps) { status = 'stopped'; break; }
    }
  } finally {
    if (!o.quiet) progress.done();
    // The plot is a convenience: failing to write it (disk full) must not hide why the run stopped.
    try { writeLossSvg(out, metricsPath, o.mode); } catch (e) { log(`warning: could not write loss.svg: ${e instanceof Error ? e.message : String(e)}`); }
  }
  let finalDir: string | null = null;
  if (status === 'completed') {
    finalDir = path.join(out, 'final');
    writeCheckpoint(finalDir, cfg, student.getWeights(), { dtype: o.saveDtype, tokenizerJson: tokenizer.toJSON() });
  }
  const summary = writeSummary(finalDir);
  log(`${o.mode}: loss ${fmt(summary.initialTrainLoss)} → ${fmt(summary.finalTrainLoss)} (train), ` +
    `${fmt(summary.initialValLoss)} → ${fmt(summary.finalValLoss)} (validation); ${Math.round(summary.tokensPerSecond)} tokens/s; ${status}`);
  return summary;
}

function fmt(x: number): string {
  return Number.isFinite(x) ? x.toFixed(4) : 'n/a';
}

function describe(c: ModelConfig): string {
  return `${c.architecture} ${c.numLayers}L × ${c.hiddenSize} (${c.numHeads} heads, ${c.numKvHeads} kv), vocab ${c.vocabSize}, ${(parameterCount(c) / 1e6).toFixed(2)}M parameters`;
}

function loadTeacher(o: RunOptions): LoadedCheckpoint {
  if (!o.teacher) throw new DistilleryError('distill needs a teacher', 'pass --teacher <checkpoint folder>');
  return readCheckpoint(o.teacher);
}

function readData(o: RunOptions, log: (s: string) => void): string[] {
  if (o.data.length === 1 && o.data[0] === 'builtin:docs') {
    const corpus = loadDocCorpus(o.maxChars > 0 ? { maxChars: o.maxChars } : {});
    log(`data: builtin:docs — ${corpus.documents.length} documentation comments (${corpus.totalChars} characters) from TypeScript ${corpus.typescriptVersion}'s ${corpus.files.length} lib .d.ts files`);
    return corpus.documents;
  }
  if (o.data.length === 0) throw new DistilleryError('no training data given', 'pass --data <file> (text or .jsonl), or --data builtin:docs');
  let docs = loadDocuments(o.data);
  if (o.maxChars > 0) {
    const kept: string[] = [];
    let n = 0;
    for (const d of docs) { if (n >= o.maxChars) break; kept.push(d.slice(0, o.maxChars - n)); n += d.length; }
    docs = kept;
  }
  return docs;
}

function chooseTokenizer(o: RunOptions, docs: string[], resumePath: string | null, teacher: LoadedCheckpoint | null,
  init: LoadedCheckpoint | null, log: (s: string) => void): Tokenizer {
  if (resumePath) return Tokenizer.fromFile(resumePath);
  if (o.tokenizer) return Tokenizer.fromFile(o.tokenizer);
  if (teacher) {
    if (!teacher.tokenizer) throw new DistilleryError(`the teacher folder ${o.teacher} has no tokenizer.json`, 'copy the teacher\'s tokenizer.json into it or pass --tokenizer');
    return teacher.tokenizer;
  }
  if (init?.tokenizer) return init.tokenizer;
  const t0 = Date.now();
  const tok = trainBpe(docs, { vocabSize: o.vocabSize, specialTokens: SPECIAL_TOKENS });
  log(`tokenizer: trained a byte-level BPE of ${tok.vocabSize} tokens on the data in ${((Date.now() - t0) / 1000).toFixed(1)}s`);
  return tok;
}

function readModelJson(file: string): ModelConfig {
  let j: unknown;
  try { j = JSON.parse(fs.readFileSync(file, 'utf8')); } catch (e) {
    throw new DistilleryError(`cannot read model config ${file}: ${(e as Error).message}`, 'pass a valid config.json or a preset name');
  }
  return parseHfConfig(j as Record<string, unknown>);
}

/** The student's config: --init's, a config.json, or a preset sized to the tokenizer (the teacher's vocab_size when distilling). */
export function studentConfig(o: RunOptions, tok: Pick<Tokenizer, 'vocabSize' | 'eosId'>, teacher: Pick<LoadedCheckpoint, 'config'> | null,
  init: Pick<LoadedCheckpoint, 'config'> | null): ModelConfig {
  let cfg: ModelConfig;
  const vocab = teacher ? teacher.config.vocabSize : tok.vocabSize;
  if (init) cfg = init.config;
  else if (o.model.endsWith('.json')) cfg = readModelJson(o.model);
  else cfg = presetConfig(o.model, vocab);
  if (cfg.eosTokenId === undefined && tok.eosId !== undefined) cfg = { ...cfg, eosTokenId: tok.eosId };
  if (teacher && teacher.config.vocabSize !== cfg.vocabSize) {
    throw new DistilleryError(
      `teacher and student vocabularies differ: teacher vocab_size ${teacher.config.vocabSize}, student ${cfg.vocabSize}`,
      'distillation compares the models token by token: give the student the teacher\'s vocab_size and tokenizer');
  }
  return cfg;
}

/**
 * Refuses a --seq longer than the student's (or teacher's) max_position_embeddings before the data is packed into
 * windows of that length (an absurd --seq would otherwise fail allocating them).
 */
function checkSeqFits(o: RunOptions, teacher: LoadedCheckpoint | null, init: LoadedCheckpoint | null): void {
  let student: ModelConfig;
  if (init) student = init.config;
  else if (o.model.endsWith('.json')) student = readModelJson(o.model);
  else student = presetConfig(o.model, 256);
  for (const [who, c] of [['the model', student], ['the teacher', teacher?.config]] as const) {
    if (c && o.seq > c.maxPositionEmbeddings) {
      throw new InputError(`--seq ${o.seq} exceeds ${who}'s max_position_embeddings (${c.maxPositionEmbeddings})`,
        `use --seq ${c.maxPositionEmbeddings} or less`);
    }
  }
}

/** On a GPU, refuses a job whose allocations cannot fit, naming the largest --seq that would (before any allocation). */
function checkDeviceMemory(backend: Backend, j: JobMemory): void {
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

/** Reads a checkpoint's state.json, refusing one that is not what saveLatest writes (one sentence, no stack). */
function readSavedState(file: string): SavedState {
  const bad = (why: string): DistilleryError => new DistilleryError(`--resume: the checkpoint state ${file} is corrupt (${why})`,
    'the checkpoint cannot be resumed: start a new run in another --out folder, or restore the file from a backup');
  let j: unknown;
  try { j = JSON.parse(fs.readFileSync(file, 'utf8')); } catch (e) {
    const f = fileError(e, `--resume: cannot read ${file}`, 'check the file and its permissions');
    throw f instanceof DistilleryError ? f : bad((e as Error).message);
  }
  if (typeof j !== 'object' || j === null || Array.isArray(j)) throw bad('not a JSON object');
  const s = j as Record<string, unknown>;
  if (s.version !== 1) throw bad(`unknown version ${JSON.stringify(s.version)}`);
  for (const k of ['step', 'optimizerStep', 'tokensTrained'] as const) {
    if (!(Number.isInteger(s[k]) && (s[k] as number) >= 0)) throw bad(`"${k}" must be an integer >= 0, got ${JSON.stringify(s[k])}`);
  }
  for (const k of ['loader', 'options'] as const) {
    if (typeof s[k] !== 'object' || s[k] === null) throw bad(`"${k}" is missing`);
  }
  return j as SavedState;
}

/** Options that may change between a checkpoint and its resume (they don't change what is computed). */
const RESUME_FREE: ReadonlyArray<keyof RunOptions> = ['resume', 'stopAfter', 'quiet', 'threads', 'device', 'evalEvery', 'saveEvery', 'evalBatches', 'out', 'saveDtype'];

function checkResumeCompatible(a: RunOptions, b: RunOptions, log: (s: string) => void): void {
  const keys: Array<keyof RunOptions> = ['mode', 'model', 'batch', 'seq', 'seed', 'valFraction', 'gradAccum', 'loss', 'teacher', 'vocabSize', 'maxChars'];
  for (const k of keys) {
    if (JSON.stringify(a[k]) !== JSON.stringify(b[k])) {
      throw new DistilleryError(`--resume: option "${k}" was ${JSON.stringify(a[k])} in the checkpoint but is ${JSON.stringify(b[k])} now`,
        'resume with the same options, or start a new run in another --out folder');
    }
  }
  if (JSON.stringify(a.data) !== JSON.stringify(b.data)) {
    throw new DistilleryError('--resume: the data files differ from the checkpoint\'s', 'resume with the same --data');
  }
  // Everything else may change (e.g. a lower --lr after a divergence), but the run is then no longer exact: say so.
  const changed = (Object.keys(b) as Array<keyof RunOptions>)
    .filter((k) => !keys.includes(k) && !RESUME_FREE.includes(k) && k !== 'data' && JSON.stringify(a[k]) !== JSON.stringify(b[k]));
  for (const k of changed) log(`warning: --resume with ${String(k)} ${JSON.stringify(b[k])} (the checkpoint used ${JSON.stringify(a[k])}): the run will differ from an uninterrupted one`);
}

/** Validation batches, each padded to the full batch size (masked rows) so evaluation runs the training shapes. */
export function makeEvalBatches(val: Window[], batch: number, maxBatches: number): Batch[] {
  const out: Batch[] = [];
  if (val.length === 0) return out;
  const T = val[0]!.inputs.length;
  for (let i = 0; i < val.length; i += batch) {
    if (maxBatches > 0 && out.length >= maxBatches) break;
    const rows = val.slice(i, i + batch);
    const b = batch;
    const inputs = new Int32Array(b * T), targets = new Int32Array(b * T).fill(-1), mask = new Float32Array(b * T);
    rows.forEach((w, r) => { inputs.set(w.inputs, r * T); targets.set(w.targets, r * T); mask.set(w.mask, r * T); });
    out.push({ inputs, targets, mask, b, t: T });
  }
  return out;
}

/** Keeps only the metrics lines up to `step` (a resumed run rewrites what came after its checkpoint). */
function truncateMetrics(file: string, step: number): void {
  if (!fs.existsSync(file)) return;
  const keep = fs.readFileSync(file, 'utf8').split('\n').filter((l) => {
    if (!l.trim()) return false;
    try { return (JSON.parse(l) as { step: number }).step <= step; } catch { return false; }
  });
  fs.writeFileSync(file, keep.map((l) => l + '\n').join(''));
}

export function readMetrics(file: string): Array<Record<string, number>> {
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l) as Record<string, number>);
}

function writeLossSvg(out: string, metricsPath: string, mode: string): void {
  const svg = lossPlotSvg(readMetrics(metricsPath), { mode, runName: path.basename(out) });
  writeFileAtomic(path.join(out, 'loss.svg'), svg);
}
