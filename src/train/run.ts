/**
 * A whole training or distillation run: data → tokenizer → models → steps with evaluation, checkpoints,
 * metrics and a loss curve → the final model folder and a summary.
 *
 * Run folder layout (`out`):
 *   metrics.jsonl            one JSON object per step ({"step", "loss", ...}) and per evaluation ({"step", "val_loss", ...})
 *   loss.svg                 train and validation loss curves, titled with the run's name (distill: objective, CE, agreement)
 *   summary.json             initial and final losses, tokens/s, timings, how the run ended
 *   tokenizer.json           the tokenizer the run used (trained on the data when none was given)
 *   checkpoints/latest/      exact-resume checkpoint, replaced atomically: model/ (HF folder, float32, with the
 *                            run's tokenizer.json), optimizer.safetensors (AdamW moments), state.json (step, data
 *                            position, options, a hash of the training data)
 *   checkpoints/best/        the model (HF folder) of the lowest validation loss so far, best.json its step and loss
 *   final/                   the trained model as an HF folder (config.json, model.safetensors, tokenizer.json)
 *   run.lock                 held while a run writes the folder (run-folder.ts)
 *
 * A checkpoint is "good", and only then replaces checkpoints/latest, when its weights are finite and the loss they
 * give is finite (the validation loss of that step, else the loss of the step's first batch recomputed on the new
 * weights). A run that meets a non-finite loss or weights stops, naming the step of the last good checkpoint.
 * SIGINT / SIGTERM end the current step, write a checkpoint, the summary and the plot; the summary's `signal` says
 * which (the CLI exits 130 / 143).
 *
 * Tokenizer identity: the teacher, the student's --init checkpoint and the data (--tokenizer, or the run folder's
 * on --resume) must use one tokenizer (src/tokenizer/identity.ts), or the run is refused before anything is
 * computed. The models' vocab_size may differ (padded embedding rows) as long as each covers the tokenizer; the
 * distillation loss then runs over the tokenizer's real tokens (StepRunner's lossVocab) and the log says so.
 * The chat template, tokenizer_config.json and generation_config.json of the teacher (else of --init, else next to
 * --tokenizer) render the data's chat lines and are carried into the checkpoints and the final model.
 *
 * The data and tokenizer are read and checked by prepareRunData (run-data.ts), the models built by buildRunModels
 * (run-models.ts), the folder opened by createRunFolder and openRunFolder (run-start.ts); the evaluations run by
 * RunEvaluation (run-evaluation.ts) and the model written by RunCheckpoints (run-checkpoints.ts); this module holds
 * the training loop: when to evaluate and save, the metrics, best/, signals and the summary.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Backend } from '../backend/backend.js';
import { createBackend, type CudaOptions } from '../backend/create.js';
import { parameterCount } from '../model/config.js';
import { initialWeights, parameterLayout, reorderFlat } from '../model/params.js';
import { BatchLoader, stackWindows, type LoaderState, type Window } from '../data/index.js';
import { writeFileAtomic } from '../io/atomic.js';
import { RunCheckpoints } from './run-checkpoints.js';
import { ValidationWatch } from './validation-watch.js';
import { lockRunFolder } from './run-folder.js';
import { createRunFolder, damagedCheckpoint, openRunFolder, removeIfEmpty } from './run-start.js';
import { Progress } from '../report/progress.js';
import { Rng } from '../util/rng.js';
import { DistilleryError, fileError } from '../util/errors.js';
import { distEnv } from '../parallel/env.js';
import { LocalComm, ncclWanted, type Communicator } from '../parallel/comm.js';
import { HostComm } from '../parallel/host-comm.js';
import { lrAt } from './schedule.js';
import { NonFiniteLossError, type Batch, type EvalSums } from './step.js';
import type { RunOptions } from './options.js';
import { prepareRunData } from './run-data.js';
import { isOnPolicyStep, onPolicyMicroBatch } from './on-policy.js';
import { StopRequests } from './stop-requests.js';
import { appendNoFollow, readMetrics, readMoments, shareHistory, truncateMetrics, writeLossSvg, type SavedState } from './run-state.js';
import { allocSparseHost, SparseRing, type SparseHost } from '../cache/targets.js';
import { sparseSlots } from '../cache/sparse.js';
import { FEWSHOT_DEFAULTS } from '../eval/fewshot.js';
import { prepareRunChoices, runChoices, type ChoiceScores } from './run-choices.js';
import { checkGenerationRoom } from './run-generation.js';
import { BatchGenerator } from '../model/batch-generate.js';
import { RunEvaluation } from './run-evaluation.js';
import { parseTemplateKwargs } from '../cli/options.js';
import { resolvePrecision, type ResolvedPrecision } from './precision.js';
import { buildRunModels } from './run-models.js';
import { loraInitialWeights } from '../model/lora.js';
import type { CudaBackend } from '../backend/cuda/cuda-backend.js';

export interface RunSummary {
  /**
   * --eval-choices: the item count, the student's scores at its last scored evaluation (`step`: acc and acc_norm over
   * multiple-choice items, greedy's acc and perplexity over continuation items), and a live teacher's, scored at the start of a new run.
   */
  choices?: { items: number; step?: number; teacher?: ChoiceScores } & ChoiceScores;
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
  /** The validation tokens whose target is the student's most likely token (TRL's mean_token_accuracy), after the last step. */
  finalValTokenAccuracy: number;
  /** Tokens trained on: those the loss counted (on chat data under --loss-on assistant, the assistant replies'). */
  tokensTrained: number;
  /** The packed data: its tokens and those that carry loss (fewer than all on chat data under --loss-on assistant). */
  dataTokens: number;
  dataLossTokens: number;
  seconds: number;
  /** Training tokens per second of step time (evaluation and checkpoint writes excluded). */
  tokensPerSecond: number;
  parameters: number;
  /** Parameters the run trained: all of them, or the LoRA adapters' (--lora-rank). */
  trainableParameters: number;
  teacherParameters: number | null;
  /** 'completed', 'stopped' (stopAfter), 'interrupted by SIGINT|SIGTERM', or the reason it failed. */
  status: string;
  /** Step of the checkpoint in checkpoints/latest (the last good one), null when none was written. */
  lastGoodStep: number | null;
  /** The lowest validation loss after a training step and its step (checkpoints/best), null when none. */
  bestValLoss: number | null;
  bestStep: number | null;
  /** Warnings about the outcome: a loss that ended above where it started, a validation loss that kept rising. */
  warnings: string[];
  /** The signal that interrupted the run, null when none did. */
  signal: 'SIGINT' | 'SIGTERM' | null;
}

/** Consecutive rises of the validation loss after which the run warns (overfitting or divergence). */
export const VAL_RISE_WARN = 3;

export { SPECIAL_TOKENS, runLossVocab, studentConfig } from './run-models.js';

export interface RunHooks {
  /** Messages for the user (default: stderr). */
  log?: (line: string) => void;
  /** A backend to use instead of creating one (tests, benchmarks). */
  backend?: Backend;
  /** A communicator to use instead of the one the process-group variables name (tests). */
  comm?: Communicator;
  /** CUDA settings for the backend runTraining creates (verbose/strict kernels, cache folder, TF32). */
  backendOptions?: CudaOptions;
  /**
   * Called while a checkpoint is being written (the model is in the temporary folder, the optimizer state not
   * yet). Tests throw from it to simulate a write that fails midway; the previous checkpoint must survive.
   */
  duringCheckpointWrite?: (tmpDir: string, step: number) => void;
  /** Tests: every job of the background checkpoint writer starts this many milliseconds late (a slow disk). */
  checkpointWriteDelayMs?: number;
  /** Called on the run's thread when checkpoints/latest has come to hold step's checkpoint (tests read it there). */
  afterCheckpointWrite?: (step: number, latestDir: string) => void;
}

/** Runs training or distillation as configured. Throws DistilleryError for bad input; never loses the last checkpoint. */
export async function runTraining(o: RunOptions, hooks: RunHooks = {}): Promise<RunSummary> {
  // Data parallel (src/parallel): one process per rank, from RANK/WORLD_SIZE/... (torchrun's variables). Rank 0 owns
  // the run folder (the lock, metrics, checkpoints, the final model) and the log; every rank reads.
  const group = distEnv();
  const comm: Communicator = hooks.comm ?? (group ? await HostComm.connect(group) : new LocalComm());
  try {
    return await runRank(o, hooks, comm, group?.localRank);
  } finally {
    if (!hooks.comm) comm.close();
  }
}

async function runRank(o: RunOptions, hooks: RunHooks, comm: Communicator, localRank: number | undefined): Promise<RunSummary> {
  const root = comm.rank === 0;
  const log = !root ? () => {} : hooks.log ?? ((s: string) => process.stderr.write(s + '\n'));
  // generation items that --seq leaves no room for are refused before the folder, the data or the models
  checkGenerationRoom(o);
  const { out, created } = createRunFolder(o, root);
  const lock = root ? lockRunFolder(out) : null;
  try {
    const { latest, saved, replaceOld } = openRunFolder(o, comm, out, log);

    // The backend first: a missing GPU is reported before any data work is done.
    // The precision first too: a contradictory --precision / --tf32 is a usage error before anything runs.
    const prec = resolvePrecision(o.precision, hooks.backendOptions?.tf32, o.device);
    // A data-parallel rank computes on the GPU of its LOCAL_RANK (among those CUDA_VISIBLE_DEVICES shows).
    const backend = hooks.backend ?? await createBackend({ ...hooks.backendOptions, tf32: prec.tf32, device: o.device, threads: o.threads,
      ...(localRank !== undefined && o.device === 'cuda' ? { ordinal: localRank } : {}) });
    const ownBackend = !hooks.backend;
    // NCCL for the device collectives of a CUDA run of several ranks (ncclWanted; DISTILLERY_NCCL=0: through the host)
    let dcomm: Communicator = comm;
    if (!hooks.comm && ncclWanted(o.device, comm.world) && backend.name.startsWith('cuda')) {
      const { NcclComm } = await import('../parallel/nccl.js');
      const nccl = await NcclComm.create(comm, backend as CudaBackend);
      log(`data parallel: NCCL ${nccl.version()} for the gradients and parameters (NCCL_NVLS_ENABLE=0)`);
      dcomm = nccl;
    }
    // Signals are taken from here to the end (the first writes, the step-0 evaluation, final/ and the summary
    // included): a Ctrl-C anywhere stops at the next safe point instead of killing a write half done.
    const stops = new StopRequests(log);
    let ok = false;
    try {
      const summary = await runWithBackend(o, hooks, backend, log, out, latest, saved, prec, dcomm, replaceOld, stops);
      ok = true;
      return summary;
    } finally {
      stops.dispose();
      // after an error NCCL is aborted, not destroyed: destroying waits for collectives a failed peer never joins
      if (dcomm !== comm) dcomm.close(!ok);
      if (ownBackend) backend.dispose();
    }
  } catch (e) {
    lock?.release();
    if (created) removeIfEmpty(out);
    throw e;
  } finally {
    lock?.release();
  }
}

async function runWithBackend(o: RunOptions, hooks: RunHooks, backend: Backend, log: (s: string) => void, out: string,
  latest: string, saved: SavedState | null, prec: ResolvedPrecision, comm: Communicator, replaceOld: () => void, stops: StopRequests): Promise<RunSummary> {
  const root = comm.rank === 0, world = comm.world;
  // ---- data and tokenizer ----------------------------------------------------------------------------
  const data = prepareRunData(o, log, out, latest, saved);
  const { cache, initCk, tokenizer, eosId, dataHash, packed, train, val, chat } = data;
  // --eval-choices: the items read and checked before anything is loaded or written (a bad file costs nothing)
  const preparedChoices = o.evalChoices.length ? prepareRunChoices({ files: o.evalChoices, chat: o.evalChoicesChat, seq: o.seq, systemInstruction: o.evalSystemInstruction,
    fewshot: { n: o.evalFewshot ?? 0, sampler: o.evalFewshotSampler, seed: o.evalFewshotSeed, delimiter: FEWSHOT_DEFAULTS.delimiter }, fewshotFrom: o.evalFewshotFrom, fewshotGiven: o.evalFewshot !== undefined, generation: o, limit: o.evalLimit,
    ...(o.chatTemplateKwargs !== undefined ? { kwargs: parseTemplateKwargs(o.chatTemplateKwargs) } : {}) }, tokenizer, chat, log) : null;

  // ---- models ----------------------------------------------------------------------------------------
  const { cfg, job, student, teacher, files, runner, opt, gatheredMasters, onPolicy, onPolicyGen, genStops } =
    await buildRunModels(o, backend, prec, comm, data, log, { generateItems: Boolean(preparedChoices?.generation) });
  const distilling = teacher !== null || cache !== null;

  // ---- training: batches, weights, evaluation, steps, checkpoints ---------------------------------------
  // the host rows in the backend's float dtype (float64 only for the CPU backend's reference mode)
  const hostDtype = backend.dtype === 'f64' ? 'f64' : 'f32';
  /** A batch's sparse teacher rows from the cache (undefined without one), decoded into `into` or a new SparseHost. */
  const sparseOf = (windows: Int32Array, mask: Float32Array, into?: SparseHost): SparseHost | undefined => {
    if (!cache) return undefined;
    const h = into ?? allocSparseHost(windows.length * o.seq, sparseSlots(cache.rep), hostDtype);
    cache.fillBatch(h, windows, mask, o.seq);
    return h;
  };
  // Training batches decode into reused host buffers that uploads read in place: two steps' micro-batches (SparseRing says why).
  const sparseRing = cache ? new SparseRing(2 * o.gradAccum, o.batch * o.seq, sparseSlots(cache.rep), hostDtype,
    (bytes, label) => backend.hostStaging(bytes, label)) : null;
  const loader = new BatchLoader(train, { batchSize: o.batch, seed: o.seed });
  /** This rank's next batch: rank r takes batches r, r + N, ... of the one loader order (src/parallel/data-parallel.ts). */
  const nextBatch = (): ReturnType<BatchLoader['next']> => {
    let mine: ReturnType<BatchLoader['next']> | null = null;
    for (let k = 0; k < world; k++) { const b = loader.next(); if (k === comm.rank) mine = b; }
    return mine!;
  };

  let step = 0, tokensTrained = 0;
  let initialTrainLoss = NaN, initialValLoss = NaN, initialValCe = NaN;
  const metricsPath = path.join(out, 'metrics.jsonl');
  if (job.lora) {
    const t0 = Date.now();
    student.setWeights(initCk!.weights);
    if (job.studentFrozen === 'nf4') log(`LoRA: the base quantized to nf4 in ${((Date.now() - t0) / 1000).toFixed(1)}s`);
  }
  // A full model whose storage order (q/k/v grouped) differs from the legacy one: its moments' order is recorded (paramOrder,
  // state version 2), and a checkpoint of an older version has its moments moved into place.
  const legacyOrder = job.lora ? null : parameterLayout(cfg, 'legacy');
  const legacyOrderDiffers = legacyOrder !== null && legacyOrder.tensors.some((t, i) => t.offset !== student.layout.tensors[i]!.offset);
  if (saved) {
    const s = saved;
    let moments = damagedCheckpoint(() => {
      files.restore(path.join(latest, files.resumeDir));
      return readMoments(path.join(latest, 'optimizer.safetensors'), files.trainable.layout.total);
    });
    if (legacyOrderDiffers && s.paramOrder !== 'grouped') {
      // a checkpoint of a version before q/k/v were grouped, of a model whose orders differ: its moments are in the legacy order
      moments = { m: reorderFlat(moments.m, legacyOrder!, student.layout), v: reorderFlat(moments.v, legacyOrder!, student.layout) };
    }
    opt.loadMoments(moments.m, moments.v);
    opt.step = s.optimizerStep;
    loader.restore(s.loader);
    step = s.step; tokensTrained = s.tokensTrained;
    initialTrainLoss = s.initialTrainLoss; initialValLoss = s.initialValLoss; initialValCe = s.initialValCe;
    if (root) {
      truncateMetrics(metricsPath, step);
      // a best/ saved after the checkpoint (the run went on, then crashed) belongs to steps this run does again, maybe
      // otherwise (a lower --lr after a divergence): it goes, as their metrics rows do
      const b = bestStepOnDisk(out);
      if (b !== null && b > step) fs.rmSync(path.join(out, 'checkpoints', 'best'), { recursive: true, force: true });
    }
    log(`resumed from ${latest} at step ${step}`);
  } else {
    if (student.lora) student.lora.setWeights(loraInitialWeights(student.lora.layout, new Rng(o.seed)));
    else student.setWeights(initCk ? initCk.weights : initialWeights(student.layout, cfg, new Rng(o.seed)));
    // The first writes of a new run: data, tokenizer and models are all read and checked by now.
    replaceOld();
    if (root) writeFileAtomic(path.join(out, 'tokenizer.json'), JSON.stringify(tokenizer.toJSON()));
    if (root) try { writeFileAtomic(metricsPath, ''); } catch (e) { throw fileError(e, `cannot write ${metricsPath}`, 'free disk space (or fix permissions) and retry'); }
  }
  const evalBatches = makeEvalBatches(val, o.batch, o.evalBatches);
  for (const b of evalBatches) b.sparse = sparseOf(b.windows, b.mask);
  // the validation pass and --eval-choices' scores beside it (src/train/run-choices.ts)
  let itemGen: BatchGenerator | null = null, teacherItemGen: BatchGenerator | null = null;
  // (the batch the job's plan and memory check sized them for)
  const itemsBatch = job.itemsBatch ?? o.batch;
  const evals = new RunEvaluation(runner, evalBatches, preparedChoices ? runChoices(preparedChoices, o.batch, o.seq, student, teacher, comm, {
    // generation items: the student's generator (the on-policy one where the run has it) and a teacher's, made at first use
    tokenizer, stopIds: genStops.stopIds,
    student: () => (itemGen ??= onPolicyGen && itemsBatch === o.batch ? onPolicyGen : new BatchGenerator(student, itemsBatch, o.seq)),
    teacher: () => (teacherItemGen ??= new BatchGenerator(teacher!, itemsBatch, o.seq)), log,
  }) : null,
    comm, stops, distilling);
  const appendMetric = (m: Record<string, unknown>): void => {
    if (!root) return;
    try { appendNoFollow(metricsPath, JSON.stringify(m) + '\n'); } catch (e) {
      if (e instanceof DistilleryError) throw e;
      throw fileError(e, `cannot append to ${metricsPath}`,
        `free disk space, then continue with --resume${fs.existsSync(latest) ? ` (the last checkpoint, ${latest}, is intact)` : ''}`);
    }
  };
  // a signal during the first evaluation stops the run before its first step (nothing trained, no checkpoint); with
  // --eval-choices the student's scores come beside the loss, and a live teacher's once, at the start: what the
  // student's are measured against (also without validation windows)
  let stoppedBeforeFirstStep = false;
  if (!saved) {
    const ev = await evals.run(0, true);
    // (with several ranks a signal stops them together at a step's end: no rank stops here alone)
    stoppedBeforeFirstStep = ev.stopped !== null || (world === 1 && stops.signal !== null);
    if (!stoppedBeforeFirstStep) {
      if (ev.pass) { initialValLoss = ev.pass.meanLoss; initialValCe = ev.pass.meanCe; }
      const row = evals.row(0, ev);
      if (row) appendMetric(row);
      const said = [ev.pass ? `validation loss ${ev.pass.meanLoss.toFixed(4)} (ce ${ev.pass.meanCe.toFixed(4)})` : '', evals.said(0, ev)].filter((x) => x);
      if (said.length) log(`step 0: ${said.join('; ')}`);
    }
  }

  const ckpt = new RunCheckpoints({ backend, comm, log, hooks, latest, files, opt, runner, gatheredMasters, saveDtype: o.saveDtype, lastGoodStep: saved ? saved.step : null });
  /** The state checkpoints/latest records now (the loader position before any batches built ahead). */
  const stateNow = (): SavedState => ({
    version: legacyOrderDiffers ? 2 : 1, step, optimizerStep: opt.step, loader: ahead ? ahead.loaderBefore : loader.state(), tokensTrained,
    initialTrainLoss, initialValLoss, initialValCe, options: o, dataHash, ...(world > 1 ? { world } : {}), paramOrder: 'grouped',
    ...(packed.windows[0]?.positions ? { documents: true } : {}),
  });
  /** Writes checkpoints/latest if the weights are good; why they are not, or null. */
  const saveLatest = (lossOnWeights: number | null, probe: Batch): string | null => ckpt.saveLatest(step, stateNow, lossOnWeights, probe);

  // Best validation checkpoint and the rising-validation warning, restored from metrics.jsonl on resume.
  const bestDir = path.join(out, 'checkpoints', 'best');
  const watch = new ValidationWatch(VAL_RISE_WARN);
  // The run's history (validation losses, the last step losses) as rank 0 reads it after its resume cut, the same on
  // every rank: the others' decisions (a new best/: a collective) must not depend on a file only rank 0 writes.
  const metricsSoFar = root ? readMetrics(metricsPath) : [];
  const history = shareHistory(comm, metricsSoFar, root ? bestStepOnDisk(out) : null);
  const warnings: string[] = [];
  const warn = (w: string): void => { warnings.push(w); log(`warning: ${w}`); };
  /** The validation loss at `at` observed; the rising-loss warning it makes, if any (with what best/ holds before it). */
  const observe = (at: number, valLoss: number): { best: boolean; warning: string | null } => {
    const bestBefore = watch.bestStep, bestLossBefore = watch.bestLoss;
    const v = watch.observe(at, valLoss);
    return {
      best: v.best,
      warning: v.risingStreak ? `the validation loss has risen for ${VAL_RISE_WARN} evaluations in a row (${v.risingStreak.map(fmt).join(' → ')}, step ${at}): ` +
        `the model may be overfitting or diverging${bestBefore !== null ? `; ${bestDir} holds step ${bestBefore} (validation loss ${fmt(bestLossBefore!)})` : ''}` : null,
    };
  };
  // --eval-choices on resume: the scores before the checkpoint, for the summary, which rank 0 writes
  if (saved && root) evals.restore(metricsSoFar as Array<Record<string, unknown>>);
  // the evaluations before the checkpoint, replayed: their warnings stay in the summary (logged when they were made)
  for (const [st, loss] of history.val) { const w = observe(st, loss).warning; if (w) warnings.push(w); }
  // the replayed best must be the model best/ holds; where it is not (best/ went with a crash's steps), none is known
  // yet and the next evaluation writes best/ afresh
  if (watch.bestStep !== history.bestStep) { watch.bestStep = null; watch.bestLoss = null; }
  /** After an evaluation at `step`: best/ when the loss is the lowest so far, a warning when it kept rising. */
  const afterEval = (valLoss: number): void => {
    const v = observe(step, valLoss);
    if (v.warning) warn(v.warning);
    if (v.best) {
      ckpt.join();
      ckpt.writeUser(bestDir, { 'best.json': JSON.stringify({ step, val_loss: valLoss }, null, 1) + '\n' });
    }
  };

  const started = Date.now();
  const startStep = step, tokensAtStart = tokensTrained;
  // Throughput counts training steps only (evaluation and checkpoint writes are excluded).
  let stepSeconds = 0;
  // The mean of the last 10 step losses (restored from metrics.jsonl on resume, so it matches an uninterrupted run).
  const recent: number[] = history.losses;
  const progress = new Progress(o.steps, o.mode === 'distill' ? 'distill' : 'train', Math.max(1, Math.floor(o.steps / 20)),
    process.stderr, startStep);
  let status = 'completed';
  let lastEval = null as EvalSums | null;
  let lastEvalStep = -1;
  /** The next step's batches when they were built ahead (see lookAhead), with the loader position before them. */
  let ahead = null as { step: number; micro: Batch[]; loaderBefore: LoaderState } | null;
  const finalTrainLossOf = (): number => (recent.length ? recent.reduce((a, b) => a + b, 0) / recent.length : NaN);
  /** Ends a failed run: the summary says why, the error names the last good checkpoint. */
  const fail = (atStep: number, why: string, hint: string | undefined): DistilleryError => {
    // the message names the last checkpoint on disk: a write in flight ends first (its failure is only a warning here)
    try { ckpt.finishWrite(); } catch (e) { log(`warning: writing ${latest} failed too: ${e instanceof Error ? e.message : String(e)}`); }
    status = `failed at step ${atStep}: ${why}`;
    writeSummary(null);
    return new DistilleryError(`training stopped at step ${atStep}: ${why}`,
      `${ckpt.lastGoodStep !== null && fs.existsSync(latest) ? `the last good checkpoint is ${latest} (step ${ckpt.lastGoodStep}; resume with --resume)` : 'no good checkpoint had been saved yet'}; ${hint ?? ''}`);
  };
  /** summary.json: written at the end of every run, failed ones included. */
  const writeSummary = (finalDir: string | null): RunSummary => {
    const summary: RunSummary = {
      mode: o.mode, out, finalDir, steps: step,
      initialTrainLoss, finalTrainLoss: finalTrainLossOf(),
      initialValLoss, finalValLoss: lastEval?.meanLoss ?? NaN, initialValCe, finalValCe: lastEval?.meanCe ?? NaN,
      finalValPerplexity: lastEval?.perplexity ?? NaN, finalAgreement: distilling && lastEval ? lastEval.agreement : null,
      finalValTokenAccuracy: lastEval?.tokenAccuracy ?? NaN,
      tokensTrained, dataTokens: packed.totalTokens, dataLossTokens: packed.targetTokens, seconds: (Date.now() - started) / 1000,
      tokensPerSecond: (tokensTrained - tokensAtStart) / Math.max(stepSeconds, 1e-9),
      parameters: parameterCount(cfg), trainableParameters: files.trainable.layout.total, teacherParameters: teacher ? parameterCount(teacher.config) : cache ? cache.manifest.teacher.parameters : null, status,
      lastGoodStep: ckpt.lastGoodStep, bestValLoss: watch.bestLoss, bestStep: watch.bestStep, warnings: [...warnings, ...divergenceWarnings(initialTrainLoss, finalTrainLossOf(), initialValLoss, lastEval?.meanLoss ?? NaN)],
      signal: stops.signal,
      ...(evals.summary() ? { choices: evals.summary() } : {}),
    };
    if (root) writeFileAtomic(path.join(out, 'summary.json'), JSON.stringify(summary, null, 2) + '\n');
    return summary;
  };
  /** An off-policy step's micro-batches (with a teacher cache, its sparse rows decoded on the host). */
  const offPolicyMicro = (): Batch[] => Array.from({ length: o.gradAccum }, () => {
    const b = nextBatch();
    return { inputs: b.inputs, targets: b.targets, mask: b.mask, b: o.batch, t: o.seq, sparse: sparseOf(b.windows, b.mask, sparseRing?.take()), positions: b.positions };
  });
  // With a teacher cache, the next step's batches are built while the device runs this one (decoding its sparse rows
  // is host work, ~10 ms per 8×1024 batch, that would otherwise leave the GPU idle); a checkpoint records the loader
  // position before them, so --resume replays exactly the batches that come next.
  const lookAhead = (nextStep: number): void => {
    if (!cache || nextStep >= o.steps || (onPolicy !== null && isOnPolicyStep(o.seed, nextStep, onPolicy.fraction))) return;
    const loaderBefore = loader.state();
    ahead = { step: nextStep, micro: offPolicyMicro(), loaderBefore };
  };
  if (stoppedBeforeFirstStep) status = `interrupted by ${stops.signal}`;
  try {
    while (step < o.steps && !stoppedBeforeFirstStep) {
      let micro: Batch[] = [];
      const onPolicyStep = onPolicy !== null && isOnPolicyStep(o.seed, step, onPolicy.fraction);
      let generated = 0;
      const genStart = process.hrtime.bigint();
      if (ahead !== null && ahead.step === step) { micro = ahead.micro; ahead = null; }
      else if (!onPolicyStep) micro = offPolicyMicro();
      for (let a = 0; a < o.gradAccum && onPolicyStep; a++) {
        const b = nextBatch();
        // sampling seeded by the global micro-batch index: N ranks draw what one process with N× accumulation would
        const g = onPolicyMicroBatch(onPolicyGen!, onPolicy, { inputs: b.inputs, mask: b.mask, b: o.batch, t: o.seq, positions: b.positions }, o.seed, step,
          { index: a * world + comm.rank, perStep: o.gradAccum * world }, genStops, eosId);
        micro.push(g.batch);
        generated += g.generated;
      }
      const genSeconds = onPolicyStep ? Number(process.hrtime.bigint() - genStart) / 1e9 : 0;
      // the step's completions over every rank (the metrics describe the global batch)
      if (onPolicyStep && world > 1) generated = comm.allReduceHost([generated])[0]!;
      const lr = lrAt(step, { lr: o.lr, warmup: o.warmup, total: o.steps, minLrRatio: o.minLrRatio });
      let r;
      const stepStart = process.hrtime.bigint();
      try {
        r = runner.trainStep(micro, opt, lr, o.clip, () => lookAhead(step + 1), comm);
      } catch (e) {
        if (e instanceof NonFiniteLossError) throw fail(step + 1, e.message, e.hint);
        throw e;
      }
      const thisStep = Number(process.hrtime.bigint() - stepStart) / 1e9;
      stepSeconds += thisStep;
      step++;
      tokensTrained += r.tokens;
      if (step === 1 && !saved) initialTrainLoss = r.loss;
      recent.push(r.loss); if (recent.length > 10) recent.shift();
      const secs = (Date.now() - started) / 1000;
      const tps = (tokensTrained - tokensAtStart) / Math.max(stepSeconds, 1e-9);
      appendMetric({
        step, lr, loss: r.loss, ce: r.ce, ...(distilling ? { div: r.div } : {}), token_acc: r.tokenAccuracy, grad_norm: r.gradNorm, tokens: tokensTrained, tokens_per_s: Math.round(tps), seconds: +secs.toFixed(2),
        step_ms: +(thisStep * 1000).toFixed(2),
        ...(onPolicy ? {
          on_policy: onPolicyStep ? 1 : 0,
          ...(onPolicyStep ? {
            gen_len: +(generated / (world * o.batch * o.gradAccum)).toFixed(2), gen_tokens_per_s: Math.round(generated / Math.max(genSeconds, 1e-9)),
            teacher_loglik: r.teacherLogLik ?? null,
          } : {}),
        } : {}),
      });
      if (!o.quiet && root) progress.update(step, { loss: r.loss, 'tok/s': Math.round(tps), lr: lr.toExponential(2) });
      const last = step === o.steps || (o.stopAfter > 0 && step >= o.stopAfter);
      // evaluations on their schedule and after the final step, not at a --stop-after stop: a stopped-and-resumed run
      // then evaluates (and picks best/) as the uninterrupted one does; the stop's checkpoint is checked on a batch
      const evalNow = step % o.evalEvery === 0 || step === o.steps;
      if (evalNow) {
        // a signal during the pass or the choices' scoring abandons it: the stop below writes the checkpoint of this step
        const ev = await evals.run(step);
        lastEval = ev.pass;
        lastEvalStep = step;
        const row = evals.row(step, ev), said = evals.said(step, ev);
        if (row) appendMetric(row);
        if (lastEval) {
          if (!o.quiet && root) {
            progress.done();
            log(`step ${step}: validation loss ${lastEval.meanLoss.toFixed(4)} (ce ${lastEval.meanCe.toFixed(4)}, ppl ${lastEval.perplexity.toFixed(2)})${said ? `; ${said}` : ''}`);
          }
          afterEval(lastEval.meanLoss);
        } else if (said && !o.quiet && root) { progress.done(); log(`step ${step}: ${said}`); }
      }
      const evaluatedNow = lastEval !== null && evalNow ? lastEval.meanLoss : null;
      let savedNow = false;
      if (step % o.saveEvery === 0 || last) {
        const bad = saveLatest(evaluatedNow, micro[0]!);
        if (bad !== null) throw fail(step, bad, 'lower --lr, raise --warmup, or check the data');
        savedNow = true;
      }
      if (o.stopAfter > 0 && step >= o.stopAfter && step < o.steps) { status = 'stopped'; break; }
      // Let a pending SIGINT / SIGTERM be delivered (the step itself runs without yielding).
      if (!last) await new Promise<void>((resolve) => setImmediate(resolve));
      // With several ranks, rank 0's signal stops every rank at this same step.
      if (world > 1 && !last) {
        const s0: number = comm.broadcast(Uint8Array.of(stops.signal === 'SIGINT' ? 1 : stops.signal === 'SIGTERM' ? 2 : 0))[0]!;
        stops.signal = s0 === 1 ? 'SIGINT' : s0 === 2 ? 'SIGTERM' : null;
      }
      if (stops.signal !== null && !last) {
        if (!savedNow) {
          const bad = saveLatest(evaluatedNow, micro[0]!);
          if (bad !== null) throw fail(step, bad, 'lower --lr, raise --warmup, or check the data');
        }
        status = `interrupted by ${stops.signal}`;
        break;
      }
    }
  } catch (e) {
    // the checkpoint write in flight ends before the run stops; the run's own error is the one that counts
    ckpt.close(true);
    // summary.json says the run failed (not a previous run's status), where it can still be written
    if (!status.startsWith('failed')) {
      status = `failed at step ${step}: ${e instanceof Error ? e.message : String(e)}`;
      try { writeSummary(null); } catch { /* the error below says why the folder cannot be written */ }
    }
    throw e;
  } finally {
    if (!o.quiet && root) progress.done();
    // The plot is a convenience: failing to write it (disk full) must not hide why the run stopped.
    if (root) try { writeLossSvg(out, metricsPath, o.mode); } catch (e) { log(`warning: could not write loss.svg: ${e instanceof Error ? e.message : String(e)}`); }
  }
  // the checkpoint write in flight ends before the run goes on (final/, the summary): a failed write is the run's error
  ckpt.join(true);
  ckpt.close();
  // the summary's final validation figures are of the weights the run ends with, also when it did not evaluate them
  // (a --stop-after or a signal between evaluations, a --resume of a finished run): not a metrics row, not a best/
  // (a run a signal stopped skips it: the summary then has no final validation figures)
  if (stops.signal !== null && (lastEval === null || lastEvalStep !== step)) lastEval = null;
  else if (lastEval === null || lastEvalStep !== step) lastEval = evals.pass();
  let finalDir: string | null = null;
  if (status === 'completed') {
    finalDir = path.join(out, 'final');
    ckpt.writeUser(finalDir);
  }
  const summary = writeSummary(finalDir);
  log(`${o.mode}: loss ${fmt(summary.initialTrainLoss)} → ${fmt(summary.finalTrainLoss)} (train), ` +
    `${fmt(summary.initialValLoss)} → ${fmt(summary.finalValLoss)} (validation); ${Math.round(summary.tokensPerSecond)} tokens/s; ${status}`);
  for (const w of summary.warnings.slice(warnings.length)) log(`warning: ${w}`);
  if (stops.signal !== null) {
    log(stoppedBeforeFirstStep ? `${stops.signal}: stopped before the first step (nothing trained, no checkpoint)`
      : `${stops.signal}: stopped after step ${step}; checkpoint ${latest} (continue with --resume)`);
  }
  return summary;
}

/** How far above its start a loss may end before the run is called divergent (a fraction of the start). */
const DIVERGENCE_MARGIN = 0.1;

/** Warnings for a run whose training or validation loss ended well above where it started (finite divergence). */
export function divergenceWarnings(initialTrain: number, finalTrain: number, initialVal: number, finalVal: number): string[] {
  const out: string[] = [];
  const above = (a: number, b: number): boolean => Number.isFinite(a) && Number.isFinite(b) && b > a + DIVERGENCE_MARGIN * Math.abs(a);
  if (above(initialTrain, finalTrain)) {
    out.push(`training diverged: the final training loss ${fmt(finalTrain)} is well above the first step's ${fmt(initialTrain)}; lower --lr or raise --warmup`);
  }
  if (above(initialVal, finalVal)) {
    out.push(`the final validation loss ${fmt(finalVal)} is well above the initial ${fmt(initialVal)}: the trained model is worse than the untrained one`);
  }
  return out;
}

/** The step of the model checkpoints/best holds (best.json), null when there is none. */
function bestStepOnDisk(out: string): number | null {
  try {
    const b = JSON.parse(fs.readFileSync(path.join(out, 'checkpoints', 'best', 'best.json'), 'utf8')) as { step?: unknown };
    return typeof b.step === 'number' ? b.step : null;
  } catch { return null; }
}

function fmt(x: number): string {
  return Number.isFinite(x) ? x.toFixed(4) : 'n/a';
}

/** Validation batches, each padded to the full batch size (masked rows) so evaluation runs the training shapes. */
export function makeEvalBatches(val: Window[], batch: number, maxBatches: number): Array<Batch & { windows: Int32Array }> {
  const out: Array<Batch & { windows: Int32Array }> = [];
  if (val.length === 0) return out;
  const T = val[0]!.inputs.length;
  for (let i = 0; i < val.length; i += batch) {
    if (maxBatches > 0 && out.length >= maxBatches) break;
    // a short last batch is padded with rows of no window (no targets, each one document of its own)
    const rows = Array.from({ length: batch }, (_, r) => val[i + r] ?? null);
    const { inputs, targets, mask, windows, positions } = stackWindows(rows, T);
    out.push({ inputs, targets, mask, b: batch, t: T, windows, ...(positions ? { positions } : {}) });
  }
  return out;
}

