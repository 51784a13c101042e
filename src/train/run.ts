/**
 * A whole training or distillation run: data → tokenizer → models → steps with evaluation, checkpoints,
 * metrics and a loss curve → the final model folder and a summary.
 *
 * Run folder layout (`out`):
 *   metrics.jsonl            one JSON object per step ({"step", "loss", ...}) and per evaluation ({"step", "val_loss", ...})
 *   loss.svg                 train and validation loss curves
 *   summary.json             initial and final losses, tokens/s, timings, how the run ended
 *   tokenizer.json           the tokenizer the run used (trained on the data when none was given)
 *   checkpoints/latest/      exact-resume checkpoint, replaced atomically: model/ (HF folder, float32),
 *                            optimizer.safetensors (AdamW moments), state.json (step, data position, options)
 *   final/                   the trained model as an HF folder (config.json, model.safetensors, tokenizer.json,
 *                            tokenizer_config.json with a chat_template, generation_config.json)
 *
 * Tokenizer identity: the teacher, the student's --init checkpoint and the data (--tokenizer, or the run folder's
 * on --resume) must use one tokenizer (src/tokenizer/identity.ts), or the run is refused before anything is
 * computed. The models' vocab_size may differ (padded embedding rows) as long as each covers the tokenizer; the
 * distillation loss then runs over the tokenizer's real tokens (StepRunner's lossVocab) and the log says so.
 * The chat template, tokenizer_config.json and generation_config.json of the teacher (else of --init, else next to
 * --tokenizer) render the data's chat lines and are carried into the checkpoints and the final model.
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
import { assertSameTokenizer, lossVocabulary, tokenizerHash, type NamedTokenizer } from '../tokenizer/identity.js';
import { chatFormatOf, renderChat, DEFAULT_CHAT_FORMAT, type ChatFormat } from '../tokenizer/chat.js';
import { readModelDirExtras } from '../io/checkpoint-dir.js';
import { loadDocuments, packDocuments, splitTrainVal, BatchLoader, loadDocCorpus, type Window, type LoaderState } from '../data/index.js';
import { readSafetensors, writeSafetensors } from '../io/safetensors.js';
import { replaceDirAtomicSync, recoverDir, writeFileAtomic } from '../io/atomic.js';
import { lineChartSvg } from '../report/svg-plot.js';
import { Progress } from '../report/progress.js';
import { Rng } from '../util/rng.js';
import { DistilleryError } from '../util/errors.js';
import { AdamW } from './optimizer.js';
import { lrAt } from './schedule.js';
import { StepRunner, NonFiniteLossError, type Batch } from './step.js';
import type { RunOptions } from './options.js';
import { jobClosures } from './kernel-plan.js';
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
  fs.mkdirSync(out, { recursive: true });
  const latest = path.join(out, 'checkpoints', 'latest');
  recoverDir(latest);
  let saved: SavedState | null = null;
  if (o.resume) {
    const statePath = path.join(latest, 'state.json');
    if (!fs.existsSync(statePath)) {
      throw new DistilleryError(`--resume: no checkpoint at ${latest}`, 'run without --resume to start fresh, or point --out at the run folder');
    }
    saved = JSON.parse(fs.readFileSync(statePath, 'utf8')) as SavedState;
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
  const extras = modelExtras(o, teacherCk, initCk);
  const chat: ChatFormat = extras ? chatFormatOf(extras.chatTemplate, extras.from) : DEFAULT_CHAT_FORMAT;
  // The tokenizers are checked before the data is read (unless one has to be trained on it).
  let docsRead: string[] | null = null;
  const getDocs = (): string[] => (docsRead ??= readData(o, log, chat));
  const chosen = chooseTokenizer(o, getDocs, saved ? path.join(out, 'tokenizer.json') : null, teacherCk, initCk, log);
  const tokenizer = chosen.tokenizer;
  checkSameTokenizer(o, chosen, teacherCk, initCk, log);
  const docs = getDocs();
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
  // Distillation compares the models over the tokenizer's real tokens; padding rows past them are left out.
  let lossVocab: number | undefined;
  if (teacherCk) {
    const lv = lossVocabulary(tokenizer.vocabSize, [{ name: 'teacher', vocabSize: teacherCk.config.vocabSize }, { name: 'student', vocabSize: cfg.vocabSize }]);
    if (lv.note) log(lv.note);
    lossVocab = lv.lossVocab;
  }
  const carry = {
    tokenizerJson: tokenizer.toJSON(), tokenizerConfig: extras?.tokenizerConfig ?? null, chatTemplate: extras?.chatTemplate ?? null,
    generationConfig: extras?.generationConfig ?? null,
  };
  const spec: LossSpec = o.mode === 'train'
    ? { kind: 'none', alpha: 0, temperature: 1, beta: o.beta }
    : { kind: o.loss, alpha: o.alpha, temperature: o.temperature, beta: o.beta };
  const adam = { beta1: o.beta1, beta2: o.beta2, eps: o.adamEps, weightDecay: o.weightDecay };
  checkDeviceMemory(backend, { student: cfg, teacher: teacherCk?.config ?? null, batch: o.batch, seq: o.seq, training: true });
  // Pre-warm (CUDA): compile every kernel this job's step and evaluation launch, then seal, before any weights.
  if (backend.prepare) {
    await backend.prepare(jobClosures({ student: cfg, teacher: teacherCk?.config ?? null, batch: o.batch, seq: o.seq,
      loss: spec, adam, train: true, evaluate: true, ...(lossVocab !== undefined ? { lossVocab } : {}) }));
  }
  const student = new Transformer(backend, cfg, { batch: o.batch, seq: o.seq, training: true, label: 'student' });
  const teacher = teacherCk
    ? new Transformer(backend, teacherCk.config, { batch: o.batch, seq: o.seq, training: false, label: 'teacher' })
    : null;
  if (teacher && teacherCk) teacher.setWeights(teacherCk.weights);
  const runner = new StepRunner(student, teacher, spec, lossVocab);
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
    fs.writeFileSync(metricsPath, '');
  }
  const evalBatches = makeEvalBatches(val, o.batch, o.evalBatches);
  const evaluate = (): ReturnType<StepRunner['evaluate']> | null => (evalBatches.length ? runner.evaluate(evalBatches) : null);
  const appendMetric = (m: Record<string, unknown>): void => fs.appendFileSync(metricsPath, JSON.stringify(m) + '\n');
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
      writeCheckpoint(path.join(tmp, 'model'), cfg, weights, { dtype: 'f32', ...carry });
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
    writeLossSvg(out, metricsPath, o.mode);
  }
  let finalDir: string | null = null;
  if (status === 'completed') {
    finalDir = path.join(out, 'final');
    writeCheckpoint(finalDir, cfg, student.getWeights(), { dtype: o.saveDtype, ...carry });
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

function readData(o: RunOptions, log: (s: string) => void, chat: ChatFormat): string[] {
  if (o.data.length === 1 && o.data[0] === 'builtin:docs') {
    const corpus = loadDocCorpus(o.maxChars > 0 ? { maxChars: o.maxChars } : {});
    log(`data: builtin:docs — ${corpus.documents.length} documentation comments (${corpus.totalChars} characters) from TypeScript ${corpus.typescriptVersion}'s ${corpus.files.length} lib .d.ts files`);
    return corpus.documents;
  }
  if (o.data.length === 0) throw new DistilleryError('no training data given', 'pass --data <file> (text or .jsonl), or --data builtin:docs');
  let docs = loadDocuments(o.data, { renderChat: (msgs) => renderChat(chat, msgs) });
  if (o.maxChars > 0) {
    const kept: string[] = [];
    let n = 0;
    for (const d of docs) { if (n >= o.maxChars) break; kept.push(d.slice(0, o.maxChars - n)); n += d.length; }
    docs = kept;
  }
  return docs;
}

/** The run's tokenizer and where it came from (the name it has in identity errors). */
function chooseTokenizer(o: RunOptions, docs: () => string[], resumePath: string | null, teacher: LoadedCheckpoint | null,
  init: LoadedCheckpoint | null, log: (s: string) => void): NamedTokenizer & { role: 'resume' | 'tokenizer' | 'teacher' | 'init' | 'trained' } {
  if (resumePath) return { name: 'run', tokenizer: Tokenizer.fromFile(resumePath), from: resumePath, role: 'resume' };
  if (o.tokenizer) return { name: 'data', tokenizer: Tokenizer.fromFile(o.tokenizer), from: `--tokenizer ${o.tokenizer}`, role: 'tokenizer' };
  if (teacher) {
    if (!teacher.tokenizer) throw new DistilleryError(`the teacher folder ${o.teacher} has no tokenizer.json`, 'copy the teacher\'s tokenizer.json into it or pass --tokenizer');
    return { name: 'teacher', tokenizer: teacher.tokenizer, from: `--teacher ${o.teacher}`, role: 'teacher' };
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
function checkSameTokenizer(o: RunOptions, chosen: ReturnType<typeof chooseTokenizer>, teacher: LoadedCheckpoint | null,
  init: LoadedCheckpoint | null, log: (s: string) => void): void {
  const advice = o.mode === 'distill'
    ? 'distillation compares the two models token by token, so the teacher, the student (--init) and the data must use one tokenizer: use checkpoints trained with the same tokenizer, or drop --tokenizer to use the teacher\'s'
    : '--init continues a model trained with its own tokenizer; tokenizing the data with another would change what every token id means: drop --tokenizer to use the checkpoint\'s';
  const others: NamedTokenizer[] = [];
  if (teacher && chosen.role !== 'teacher') {
    if (teacher.tokenizer) others.push({ name: 'teacher', tokenizer: teacher.tokenizer, from: `--teacher ${o.teacher}` });
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

interface ModelExtras {
  tokenizerConfig: Record<string, unknown> | null;
  chatTemplate: string | null;
  generationConfig: Record<string, unknown> | null;
  /** For messages: 'the teacher runs/t'. */
  from: string;
}

/** tokenizer_config.json, chat template and generation_config.json of the teacher, else --init, else next to --tokenizer. */
function modelExtras(o: RunOptions, teacher: LoadedCheckpoint | null, init: LoadedCheckpoint | null): ModelExtras | null {
  const of = (ck: LoadedCheckpoint, from: string): ModelExtras => ({ tokenizerConfig: ck.tokenizerConfig, chatTemplate: ck.chatTemplate, generationConfig: ck.generationConfig, from });
  // Only from a checkpoint whose tokenizer.json is there (and so checked to be the run's).
  if (teacher?.tokenizerJson) return of(teacher, `the teacher ${o.teacher}`);
  if (init?.tokenizerJson) return of(init, `the --init checkpoint ${o.init}`);
  if (o.tokenizer) {
    const dir = fs.existsSync(o.tokenizer) && fs.statSync(o.tokenizer).isDirectory() ? o.tokenizer : path.dirname(o.tokenizer);
    const x = readModelDirExtras(dir, { tokenizerJson: false });
    if (x.tokenizerConfig || x.chatTemplate) {
      return { tokenizerConfig: x.tokenizerConfig ?? null, chatTemplate: x.chatTemplate ?? null, generationConfig: x.generationConfig ?? null, from: `${dir} (--tokenizer)` };
    }
  }
  return null;
}

function studentConfig(o: RunOptions, tok: Tokenizer, teacher: LoadedCheckpoint | null, init: LoadedCheckpoint | null): ModelConfig {
  let cfg: ModelConfig;
  const vocab = teacher ? teacher.config.vocabSize : tok.vocabSize;
  if (init) cfg = init.config;
  else if (o.model.endsWith('.json')) {
    let j: unknown;
    try { j = JSON.parse(fs.readFileSync(o.model, 'utf8')); } catch (e) {
      throw new DistilleryError(`cannot read model config ${o.model}: ${(e as Error).message}`, 'pass a valid config.json or a preset name');
    }
    cfg = parseHfConfig(j as Record<string, unknown>);
  } else cfg = presetConfig(o.model, vocab);
  if (cfg.eosTokenId === undefined && tok.eosId !== undefined) cfg = { ...cfg, eosTokenId: tok.eosId };
  // The teacher's and the student's vocab_size may differ (padded rows): lossVocabulary checks both cover the tokenizer.
  return cfg;
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
  const rows = readMetrics(metricsPath);
  const trainPts = rows.filter((r) => r.loss !== undefined).map((r) => [r.step!, r.loss!] as [number, number]);
  const valPts = rows.filter((r) => r.val_loss !== undefined).map((r) => [r.step!, r.val_loss!] as [number, number]);
  const svg = lineChartSvg([
    { name: 'train loss', color: '#1f77b4', points: trainPts },
    { name: 'validation loss', color: '#d62728', points: valPts },
  ], { title: `${mode} loss`, xLabel: 'step', yLabel: 'loss' });
  writeFileAtomic(path.join(out, 'loss.svg'), svg);
}
