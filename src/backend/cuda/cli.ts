/**
 * `distillery kernels plan|warm|list|audit` (dispatched by src/cli/commands/kernels.ts; flags arrive in camelCase).
 *
 * - plan:  the pre-warm set of a job: planKernels(jobClosures(...)) for the student (preset, config.json or
 *          checkpoint folder), an optional teacher, batch, seq and loss, with training, evaluation and generation.
 *          One line per kernel: family, key prefix (the cache key for --arch and this machine's NVRTC; without
 *          NVRTC, the source hash), baked parameters. No GPU, no NVRTC needed.
 * - warm:  compiles that plan into the disk cache with NVRTC (no GPU needed given --arch), one line per compile
 *          with its milliseconds, then the totals.
 * - list:  the disk cache's entries: key, size, date; corrupt/foreign files are flagged, and what is not a regular
 *          file (a symbolic link, a FIFO, a device) is listed as skipped without being opened.
 * - audit: runs the job's real step code (StepRunner.trainStep with gradient accumulation over full and partial
 *          micro-batches, StepRunner.evaluate over padded and short batches, Generator.generate with other prompt
 *          lengths) at shapes OTHER than the plan's placeholders, on a trace backend, and checks every kernel it
 *          launches is in the plan. Exit 1 when one is not.
 */
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Backend, DistillKind, LossSpec } from '../backend.js';
import { readHfConfigFile, presetConfig, PRESET_NAMES, type ModelConfig } from '../../model/config.js';
import { Transformer } from '../../model/transformer.js';
import { Generator } from '../../model/generate.js';
import { describeRope } from '../rope.js';
import { jobClosures, type JobShape } from '../../train/kernel-plan.js';
import { resolvePrecision, type PrecisionFlag, type ResolvedPrecision } from '../../train/precision.js';
import { DEFAULT_RUN_OPTIONS as D } from '../../train/options.js';
import { StepRunner, type Batch } from '../../train/step.js';
import { AdamW, type AdamWOptions } from '../../train/optimizer.js';
import { DistilleryError, InputError } from '../../util/errors.js';
import { planKernels } from './plan.js';
import { attentionFor } from './attention-plan.js';
import { cacheKey, compileOptions, defaultCacheDir, fileKind, KernelCache, readEntryFile } from './kernel-cache.js';
import { tryNvrtc, type KernelCompiler } from './ffi/nvrtc.js';
import type { KernelSpec } from './kernels/spec.js';

type Args = Record<string, unknown>;
let write = (s: string): void => { process.stdout.write(s); };
const out = (s: string): void => { write(s + '\n'); };
/** Redirects the commands' output (tests); returns the previous writer. */
export function setKernelsOutput(w: (s: string) => void): (s: string) => void { const prev = write; write = w; return prev; }

const str = (a: Args, k: string): string | undefined => (typeof a[k] === 'string' ? a[k] : undefined);
/** --arch: an NVIDIA architecture as NVRTC names it (sm_75 and later: CUDA 13's NVRTC compiles for no older one), else usage. */
function archArg(a: Args): string | undefined {
  const v = str(a, 'arch');
  if (v === undefined) return undefined;
  const m = /^sm_(\d+)(a?)$/.exec(v);
  if (!m || Number(m[1]) < 75) throw new InputError(`--arch ${v} is not a GPU architecture distillery compiles for`, 'pass sm_XX for your GPU, e.g. --arch sm_80 (A100), sm_89 (L4, RTX 40), sm_90 (H100, H200)');
  return v;
}
const num = (a: Args, k: string, d: number): number => (typeof a[k] === 'number' ? a[k] : d);

/** A model config from a preset name, a config.json path or a checkpoint folder (config.json only is read). */
export function resolveModelConfig(spec: string, vocab: number): ModelConfig {
  let file: string | null = null;
  if (fs.existsSync(spec) && fs.statSync(spec).isDirectory()) file = path.join(spec, 'config.json');
  else if (spec.endsWith('.json')) file = spec;
  if (file === null) {
    if (!PRESET_NAMES.includes(spec)) throw new InputError(`--model/--teacher: '${spec}' is neither a preset, a config.json nor a checkpoint folder`, `use one of: ${PRESET_NAMES.join(', ')}`);
    return presetConfig(spec, vocab);
  }
  return readHfConfigFile(file, 'pass a preset name, a config.json or a checkpoint folder');
}

/**
 * AdamW settings from --beta1, --beta2, --adam-eps, validated as a run validates them. They are runtime arguments
 * of the adamw kernel (so they do not change the plan), but a plan is described with the values of its run.
 */
export function adamFromArgs(a: Args): AdamWOptions {
  const beta1 = num(a, 'beta1', D.beta1), beta2 = num(a, 'beta2', D.beta2), eps = num(a, 'adamEps', D.adamEps);
  for (const [flag, v] of [['--beta1', beta1], ['--beta2', beta2]] as const) {
    if (!(v >= 0 && v < 1)) throw new InputError(`${flag} must be >= 0 and < 1, got ${v}`, `pass the value the run uses (default ${flag === '--beta1' ? D.beta1 : D.beta2})`);
  }
  if (!(eps > 0) || !Number.isFinite(eps)) throw new InputError(`--adam-eps must be > 0, got ${eps}`, `pass the value the run uses (default ${D.adamEps})`);
  return { beta1, beta2, eps, weightDecay: D.weightDecay };
}

/** The job a `kernels` subcommand is about, from its flags. */
export function jobFromArgs(a: Args): JobShape {
  const model = str(a, 'model') ?? D.model;
  const teacherSpec = str(a, 'teacher');
  const vocabFlag = typeof a.vocabSize === 'number' ? a.vocabSize : undefined;
  let teacher: ModelConfig | null = null;
  if (teacherSpec !== undefined) teacher = resolveModelConfig(teacherSpec, vocabFlag ?? 151936);
  const student = resolveModelConfig(model, vocabFlag ?? teacher?.vocabSize ?? 151936);
  const kind = (str(a, 'loss') ?? (teacher ? D.loss : 'none')) as DistillKind;
  if (kind !== 'none' && !teacher) throw new InputError(`--loss ${kind} needs a teacher`, 'pass --teacher <preset|config.json|dir>, or --loss none');
  const loss: LossSpec = {
    kind, alpha: num(a, 'alpha', D.alpha), temperature: num(a, 'temperature', D.temperature), beta: num(a, 'beta', D.beta),
  };
  const batch = num(a, 'batch', D.batch), seq = num(a, 'seq', D.seq);
  if (!(Number.isInteger(batch) && batch >= 1)) throw new InputError(`--batch must be a positive integer, got ${batch}`, 'pass the run\'s micro-batch size, e.g. --batch 8');
  if (!(Number.isInteger(seq) && seq >= 1)) throw new InputError(`--seq must be a positive integer, got ${seq}`, 'pass the run\'s sequence length, e.g. --seq 1024');
  for (const [who, c] of [['the model', student], ['the teacher', teacher]] as const) {
    if (c && seq > c.maxPositionEmbeddings) throw new InputError(`--seq ${seq} exceeds ${who}'s max_position_embeddings (${c.maxPositionEmbeddings})`, `use --seq ${c.maxPositionEmbeddings} or less`);
  }
  for (const [flag, v, ok] of [['--alpha', loss.alpha, loss.alpha >= 0 && loss.alpha <= 1], ['--temperature', loss.temperature, loss.temperature > 0],
    ['--beta', loss.beta, loss.beta >= 0 && loss.beta <= 1]] as const) {
    if (!ok || !Number.isFinite(v)) throw new InputError(`${flag} out of range: ${v}`, 'pass the value the run uses (alpha and beta in [0, 1], temperature > 0)');
  }
  // A teacher and a student of different vocab_size (padding rows): the loss runs over the rows both have, as a
  // run's does over the tokenizer's real tokens (which the smaller vocab_size covers).
  const lossVocab = teacher && teacher.vocabSize !== student.vocabSize ? Math.min(teacher.vocabSize, student.vocabSize) : undefined;
  return {
    student, teacher, batch, seq, loss, train: true, evaluate: true, ...(lossVocab !== undefined ? { lossVocab } : {}),
    adam: adamFromArgs(a), precision: precisionFromArgs(a).model,
    generateLen: Math.min(student.maxPositionEmbeddings, Math.max(seq, 2)),
  };
}

/** --precision / --tf32 as a CUDA run resolves them (auto = bf16). */
function precisionFromArgs(a: Args): ResolvedPrecision {
  return resolvePrecision(str(a, 'precision') as PrecisionFlag | undefined, a.tf32 === true ? true : undefined, 'cuda');
}

/** The attention forward the job's backend runs: --tf32 picks the tensor-core one, as createCudaBackend does. */
export function planOptionsFromArgs(a: Args): { attention: 'simt' | 'mma' } {
  return { attention: attentionFor(precisionFromArgs(a).tf32) };
}

const sourceHash = (s: KernelSpec): string => createHash('sha256').update(s.source()).digest('hex');

function paramsText(s: KernelSpec): string {
  return Object.entries(s.params).map(([k, v]) => `${k}=${String(v)}`).join(' ');
}

function describeJob(j: JobShape): string {
  const m = (c: ModelConfig): string => `${c.architecture} C=${c.hiddenSize} L=${c.numLayers} heads=${c.numHeads}/${c.numKvHeads} hd=${c.headDim} eps=${c.rmsNormEps} ${describeRope(c.rope)}`;
  const adam = j.train && j.adam ? `, adamw beta1=${j.adam.beta1} beta2=${j.adam.beta2} eps=${j.adam.eps}` : '';
  return `student ${m(j.student)}${j.teacher ? `; teacher ${m(j.teacher)}` : ''}; batch ${j.batch}, seq ${j.seq}, loss ${j.loss?.kind ?? 'none'}${adam}`;
}

function planCmd(a: Args): number {
  const job = jobFromArgs(a);
  const specs = planKernels(jobClosures(job), planOptionsFromArgs(a));
  const arch = archArg(a) ?? 'sm_90';
  const nvrtc = tryNvrtc();
  const key = (s: KernelSpec): string => (nvrtc ? cacheKey(s.source(), compileOptions(arch), arch, nvrtc) : sourceHash(s));
  if (a.json === true) {
    out(JSON.stringify({ arch, compiler: nvrtc?.version ?? null, compilerBuild: nvrtc?.build ?? null, kernels: specs.map((s) => ({ family: s.family, key: key(s), params: s.params })) }));
    return 0;
  }
  out(`# ${describeJob(job)}`);
  out(`# ${specs.length} kernels; ${nvrtc ? `cache keys for ${arch} with ${nvrtc.version} (${nvrtc.build})` : 'source hashes (NVRTC not found: cache keys need its version)'}`);
  for (const s of specs) out(`${s.family.padEnd(18)} ${key(s).slice(0, 16)}  ${paramsText(s)}`);
  return 0;
}

async function detectArch(): Promise<string | null> {
  try {
    const { requireLibraries } = await import('./ffi/libfind.js');
    const { CudaDriver } = await import('./ffi/driver.js');
    const libs = requireLibraries(['cuda']);
    const d = new CudaDriver(libs.cuda, 0);
    const arch = d.arch;
    d.release();
    return arch;
  } catch { return null; }
}

async function warmCmd(a: Args, compiler: KernelCompiler | null = tryNvrtc()): Promise<number> {
  const job = jobFromArgs(a);
  const specs = planKernels(jobClosures(job), planOptionsFromArgs(a));
  if (!compiler) throw new DistilleryError('kernels warm: NVRTC (libnvrtc) was not found', 'install NVRTC (e.g. Debian libnvrtc11.2 or the CUDA toolkit) or set DISTILLERY_CUDA_LIB_DIR');
  const arch = archArg(a) ?? await detectArch();
  if (!arch) throw new DistilleryError('kernels warm: no GPU found to take the architecture from', 'pass --arch, e.g. --arch sm_90 (H100) or --arch sm_80 (A100)');
  const dir = str(a, 'cacheDir') ?? defaultCacheDir();
  let compileMs = 0;
  const cache = new KernelCache({
    compiler, arch, dir, strict: false, verbose: true,
    log: (l) => { const m = /\s(\d+)ms$/.exec(l); if (m) compileMs += Number(m[1]); out(l); },
  });
  out(`# ${describeJob(job)}`);
  out(`# warming ${specs.length} kernels for ${arch} with ${compiler.version} (${compiler.build}) into ${dir}`);
  const t0 = performance.now();
  await cache.prewarm(specs);
  const c = cache.counters;
  out(`warm: ${specs.length} kernels: compiled ${c.compiled} (${compileMs} ms of compile time), already cached ${c.loadedFromDisk}` +
    `${c.diskRejected ? `, rejected corrupt ${c.diskRejected}` : ''}; ${(performance.now() - t0).toFixed(0)} ms wall`);
  return 0;
}

function listCmd(a: Args): number {
  const dir = str(a, 'cacheDir') ?? defaultCacheDir();
  let names: string[];
  try { names = fs.readdirSync(dir); } catch {
    out(`kernel cache ${dir}: empty (no such folder)`);
    return 0;
  }
  type Row = { key: string; bytes: number; date: string; ok: boolean; skipped?: boolean; problem?: string };
  const rows: Row[] = [];
  for (const n of names.sort()) {
    const p = path.join(dir, n);
    let st: fs.Stats;
    try { st = fs.lstatSync(p); } catch { continue; } // removed meanwhile
    const date = st.mtime.toISOString().replace(/\.\d+Z$/, 'Z');
    if (!st.isFile()) {
      // Never opened: a FIFO would block, a link to /dev/zero would read forever. Shown, so the user can remove it.
      if (!st.isDirectory()) rows.push({ key: n, bytes: 0, date, ok: false, skipped: true, problem: `a ${fileKind(st)}, not a regular file` });
      continue;
    }
    const m = /^([0-9a-f]{64})\.cubin$/.exec(n);
    if (!m) { rows.push({ key: n, bytes: st.size, date, ok: false, problem: n.includes('.tmp-') ? 'leftover temp file' : 'not a cache entry' }); continue; }
    const r = readEntryFile(p, m[1]!);
    if ('missing' in r) continue;
    rows.push({ key: m[1]!, bytes: st.size, date, ok: !('bad' in r), ...('bad' in r ? { problem: r.bad, ...(r.skipped ? { skipped: true } : {}) } : {}) });
  }
  if (a.json === true) { out(JSON.stringify({ dir, entries: rows })); return 0; }
  out(`# kernel cache ${dir}: ${rows.length} files, ${rows.reduce((s, r) => s + r.bytes, 0)} bytes`);
  for (const r of rows) {
    out(`${r.key}  ${String(r.bytes).padStart(8)}  ${r.date}${r.ok ? '' : `  ${r.skipped ? 'SKIPPED' : 'CORRUPT'}: ${r.problem}`}`);
  }
  const skipped = rows.filter((r) => r.skipped).length;
  const bad = rows.filter((r) => !r.ok && !r.skipped).length;
  if (bad) out(`# ${bad} corrupt or foreign file(s): the cache ignores and rewrites them; delete them to reclaim space`);
  if (skipped) out(`# ${skipped} skipped: not regular files (links, FIFOs, devices); the cache never reads them and replaces a link or FIFO named like an entry when it compiles that kernel; delete them`);
  return 0;
}

function batchOf(b: number, t: number, vocab: number, seed: number, padRows: number): Batch {
  const n = b * t;
  const inputs = Int32Array.from({ length: n }, (_, i) => (i * 31 + seed) % vocab);
  const targets = Int32Array.from({ length: n }, (_, i) => (i * 17 + seed + 1) % vocab);
  const mask = new Float32Array(n).fill(1);
  for (let r = b - padRows; r < b; r++) for (let i = r * t; i < (r + 1) * t; i++) { mask[i] = 0; targets[i] = -1; }
  if (padRows < b) mask[0] = 1;
  return { inputs, targets, mask, b, t };
}

/**
 * The job's real step code at shapes other than the plan's placeholders (see the module comment): gradient
 * accumulation with a full and a partial micro-batch, evaluation with padded rows and a short batch, generation
 * with a longer prompt and several decode steps.
 */
export function auditClosures(j: JobShape): Array<(b: Backend) => void> {
  // Token ids the loss can score: below the loss vocabulary when the models' vocab_size differ.
  const V = j.lossVocab ?? j.student.vocabSize;
  const runs: Array<(b: Backend) => void> = [];
  // The run's precision: it picks every operand dtype, so the kernels (a bf16 run launches bf16 variants).
  const precision = j.precision ?? 'fp32';
  runs.push((be) => {
    const student = new Transformer(be, j.student, { batch: j.batch, seq: j.seq, training: true, precision });
    const teacher = j.teacher ? new Transformer(be, j.teacher, { batch: j.batch, seq: j.seq, training: false, precision }) : null;
    const runner = new StepRunner(student, teacher, j.loss ?? { kind: 'none', alpha: 0, temperature: 1, beta: 0 },
      { ...(j.lossVocab !== undefined ? { lossVocab: j.lossVocab } : {}), logits: j.logits });
    const opt = new AdamW(student.trainable(), j.adam ?? { beta1: D.beta1, beta2: D.beta2, eps: D.adamEps, weightDecay: D.weightDecay });
    const bs = Math.max(1, j.batch - 1), ts = Math.max(1, j.seq - 3);
    runner.trainStep([batchOf(j.batch, j.seq, V, 1, 0), batchOf(bs, ts, V, 2, 0)], opt, 3e-4, 1);
    runner.trainStep([batchOf(j.batch, j.seq, V, 3, j.batch > 1 ? 1 : 0)], opt, 1e-4, 0);
    runner.evaluate([batchOf(j.batch, j.seq, V, 4, Math.floor(j.batch / 2)), batchOf(bs, ts, V, 5, 0)]);
  });
  const len = Math.min(j.student.maxPositionEmbeddings, Math.max(8, Math.min(j.seq, 64)));
  runs.push((be) => {
    const m = new Transformer(be, j.student, { batch: 1, seq: 1, training: false, precision });
    const g = new Generator(m, len);
    const promptLen = Math.max(1, len - 4);
    g.generate(Array.from({ length: promptLen }, (_, i) => (i * 13 + 5) % V), { temperature: 0.7, topP: 0.9, maxNewTokens: 3, seed: 1 });
    g.generate([1], { temperature: 0, topP: 1, maxNewTokens: 2 });
  });
  return runs;
}

/** Kernels traced by `runs` that are not in `plan` (by source hash, i.e. by cache key). */
export function notInPlan(plan: readonly KernelSpec[], runs: ReadonlyArray<(b: Backend) => void>,
  opts: { attention?: 'simt' | 'mma' } = {}): { traced: KernelSpec[]; missing: KernelSpec[] } {
  const have = new Set(plan.map(sourceHash));
  const traced = planKernels(runs, opts);
  return { traced, missing: traced.filter((s) => !have.has(sourceHash(s))) };
}

function auditCmd(a: Args): number {
  const job = jobFromArgs(a);
  const plan = planKernels(jobClosures(job), planOptionsFromArgs(a));
  const { traced, missing } = notInPlan(plan, auditClosures(job), planOptionsFromArgs(a));
  out(`# ${describeJob(job)}`);
  if (missing.length === 0) {
    out(`audit: OK: the ${traced.length} kernels the real step, evaluation and generation code launch at other shapes are all in the ${plan.length}-kernel plan`);
    return 0;
  }
  out(`audit: FAIL: ${missing.length} of ${traced.length} traced kernels are not in the ${plan.length}-kernel plan (a run would compile after pre-warm):`);
  for (const s of missing) out(`  ${s.describe()}`);
  return 1;
}

/** Entry point for `distillery kernels <sub>` (see src/cli/commands/kernels.ts). Returns the exit code. */
export async function kernelsCommand(sub: string, args: Args): Promise<number> {
  switch (sub) {
    case 'plan': return planCmd(args);
    case 'warm': return warmCmd(args);
    case 'list': return listCmd(args);
    case 'audit': return auditCmd(args);
    default: throw new DistilleryError(`kernels: unknown subcommand '${sub}'`, 'use plan, warm, list or audit');
  }
}
