/**
 * What a run keeps to resume and what it reads back: the state.json of checkpoints/latest (step, optimizer step, data
 * position, options, the data's hash), the AdamW moments, the options that may and may not change on --resume, and
 * metrics.jsonl (appended to without following links; read to restore the validation watch and the recent losses, rank
 * 0's reading shared with every rank; truncated to the checkpoint's step) and the loss plot drawn from it.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { LoaderState } from '../data/index.js';
import { readSafetensors } from '../io/safetensors.js';
import { writeFileAtomic } from '../io/atomic.js';
import { DistilleryError, fileError } from '../util/errors.js';
import { DEFAULT_RUN_OPTIONS, type RunOptions } from './options.js';
import { loraSpecOf } from '../model/lora.js';
import { lossPlotSvg } from '../report/loss-plot.js';
import type { Communicator } from '../parallel/comm.js';

export interface SavedState {
  /**
   * 1, or 2 where the model's storage order differs from the legacy one (q/k/v biases: paramOrder), so that a version
   * before the grouped order refuses the checkpoint ("unknown version") rather than load its moments misplaced.
   */
  version: 1 | 2;
  step: number;
  optimizerStep: number;
  loader: LoaderState;
  tokensTrained: number;
  initialTrainLoss: number;
  initialValLoss: number;
  initialValCe: number;
  options: RunOptions;
  /** SHA-256 of the training documents (hashDocuments); absent in checkpoints of older versions. */
  dataHash?: string;
  /** The number of data-parallel processes that wrote it (absent: 1). */
  world?: number;
  /**
   * The order of a full model's values in the flat optimizer moments: 'grouped' (each layer's q/k/v weights, then
   * their biases: parameterLayout's storage order); absent in checkpoints of older versions, which wrote the legacy
   * (Hugging Face) order: --resume moves those moments into place (reorderFlat).
   */
  paramOrder?: 'grouped';
  /**
   * true where the run's windows held documents that attend only to themselves ('bfd' windows, Window.positions);
   * absent in checkpoints of older versions, whose 'bfd' windows let a window's documents attend to each other.
   */
  documents?: boolean;
}

/** Reads and validates the AdamW moments of a checkpoint: tensors "m" and "v", float32, one per parameter, finite. */
export function readMoments(file: string, parameters: number): { m: Float32Array; v: Float32Array } {
  const hint = 'the checkpoint is damaged: restore it, or start afresh with --overwrite';
  if (!fs.existsSync(file)) throw new DistilleryError(`${file} is missing (the optimizer state of the checkpoint)`, hint);
  const f = readSafetensors(file);
  const names = [...f.tensors.keys()].sort();
  if (names.length !== 2 || names[0] !== 'm' || names[1] !== 'v') {
    throw new DistilleryError(`${file}: expected the tensors "m" and "v", found ${names.length ? names.map((n) => `"${n}"`).join(', ') : 'none'}`, hint);
  }
  const get = (name: 'm' | 'v'): Float32Array => {
    const t = f.tensors.get(name)!;
    if (t.dtype !== 'F32') throw new DistilleryError(`${file}: tensor "${name}" is ${t.dtype}, expected F32`, hint);
    if (t.data.length !== parameters) {
      throw new DistilleryError(`${file}: tensor "${name}" has ${t.data.length} values but the model has ${parameters} parameters`, hint);
    }
    for (let i = 0; i < t.data.length; i++) {
      const x = t.data[i]!;
      if (!Number.isFinite(x) || (name === 'v' && x < 0)) {
        throw new DistilleryError(`${file}: tensor "${name}" holds an invalid value (${x} at element ${i})`, hint);
      }
    }
    return t.data;
  };
  return { m: get('m'), v: get('v') };
}

/** Reads a checkpoint's state.json, refusing one that is not what saveLatest writes (one sentence, no stack). */
export function readSavedState(file: string): SavedState {
  const bad = (why: string): DistilleryError => new DistilleryError(`--resume: the checkpoint state ${file} is corrupt (${why})`,
    'the checkpoint cannot be resumed: start a new run in another --out folder, or restore the file from a backup');
  let j: unknown;
  try { j = JSON.parse(fs.readFileSync(file, 'utf8')); } catch (e) {
    const f = fileError(e, `--resume: cannot read ${file}`, 'check the file and its permissions');
    throw f instanceof DistilleryError ? f : bad((e as Error).message);
  }
  if (typeof j !== 'object' || j === null || Array.isArray(j)) throw bad('not a JSON object');
  const s = j as Record<string, unknown>;
  if (s.version !== 1 && s.version !== 2) throw bad(`unknown version ${JSON.stringify(s.version)}`);
  for (const k of ['step', 'optimizerStep', 'tokensTrained'] as const) {
    if (!(Number.isInteger(s[k]) && (s[k] as number) >= 0)) throw bad(`"${k}" must be an integer >= 0, got ${JSON.stringify(s[k])}`);
  }
  for (const k of ['loader', 'options'] as const) {
    if (typeof s[k] !== 'object' || s[k] === null) throw bad(`"${k}" is missing`);
  }
  return j as SavedState;
}

/** Options that may change between a checkpoint and its resume (they don't change what is computed). */
// (packing and lossOn: checked by prepareRunData, run-data.ts: the packing it resolves to, --loss-on refused)
const RESUME_FREE: ReadonlyArray<keyof RunOptions> = ['resume', 'overwrite', 'stopAfter', 'quiet', 'threads', 'device', 'evalEvery', 'saveEvery', 'evalBatches', 'out', 'saveDtype', 'packing', 'lossOn', 'evalChoices', 'evalChoicesChat', 'evalFewshot', 'evalFewshotFrom', 'evalFewshotSampler', 'evalFewshotSeed', 'evalSystemInstruction',
  'evalLimit', 'evalMaxGenToks', 'evalGenBatch', 'evalUntil', 'evalFilter', 'evalExactMatch', 'evalPreset'];

export function checkResumeCompatible(a: RunOptions, b: RunOptions, log: (s: string) => void): void {
  const keys: Array<keyof RunOptions> = ['mode', 'model', 'batch', 'seq', 'seed', 'valFraction', 'gradAccum', 'loss', 'teacher', 'teacherCache', 'vocabSize', 'maxChars',
    'loraRank', 'loraAlpha', 'loraTargets'];
  // A checkpoint of an older version lacks the options added since: it ran with their defaults. The LoRA options are
  // compared as the adapters they make (alpha 0 is 2 × rank; the order of the targets does not matter).
  const val = (o: RunOptions, k: keyof RunOptions): string => {
    const spec = k === 'loraAlpha' || k === 'loraTargets' ? loraSpecOf(o) : null;
    if (spec) return JSON.stringify(k === 'loraAlpha' ? spec.alpha : spec.targets);
    return JSON.stringify(o[k] ?? (DEFAULT_RUN_OPTIONS as Partial<RunOptions>)[k]);
  };
  for (const k of keys) {
    if (val(a, k) !== val(b, k)) {
      throw new DistilleryError(`--resume: ${flagName(k)} was ${val(a, k)} in the checkpoint but is ${val(b, k)} now`,
        'resume with the same options, or start a new run in another --out folder');
    }
  }
  if (JSON.stringify(a.data) !== JSON.stringify(b.data)) {
    throw new DistilleryError('--resume: the data files differ from the checkpoint\'s', 'resume with the same --data');
  }
  // Everything else may change (e.g. a lower --lr after a divergence), but the run is then no longer exact: say so.
  const changed = (Object.keys(b) as Array<keyof RunOptions>)
    .filter((k) => !keys.includes(k) && !RESUME_FREE.includes(k) && k !== 'data' && val(a, k) !== val(b, k));
  const shown = (o: RunOptions, k: keyof RunOptions): string => val(o, k) ?? 'none';
  for (const k of changed) log(`warning: --resume with ${flagName(k)} ${shown(b, k)} (the checkpoint used ${shown(a, k)}): the run will differ from an uninterrupted one`);
}

/** The flag a run option comes from, as the user writes it: gradAccum → --grad-accum. */
function flagName(k: keyof RunOptions): string {
  return k === 'mode' ? 'the command (train or distill)' : `--${String(k).replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`;
}

/** Keeps only the metrics lines up to `step` (a resumed run rewrites what came after its checkpoint). */
export function truncateMetrics(file: string, step: number): void {
  if (!fs.lstatSync(file, { throwIfNoEntry: false })?.isFile()) return;
  const keep = fs.readFileSync(file, 'utf8').split('\n').filter((l) => {
    if (!l.trim()) return false;
    try { return (JSON.parse(l) as { step: number }).step <= step; } catch { return false; }
  });
  writeFileAtomic(file, keep.map((l) => l + '\n').join(''));
}

/** The rows of metrics.jsonl; a missing file or a symbolic link gives none, a line that is not JSON is skipped. */
export function readMetrics(file: string): Array<Record<string, number>> {
  const st = fs.lstatSync(file, { throwIfNoEntry: false });
  if (!st || !st.isFile()) return [];
  const rows: Array<Record<string, number>> = [];
  for (const l of fs.readFileSync(file, 'utf8').split('\n')) {
    if (!l.trim()) continue;
    try {
      const r = JSON.parse(l) as unknown;
      if (typeof r === 'object' && r !== null && typeof (r as { step?: unknown }).step === 'number') rows.push(r as Record<string, number>);
    } catch { /* a torn or foreign line */ }
  }
  return rows;
}

/** Appends to a run-folder file without following a symbolic link (O_NOFOLLOW). */
export function appendNoFollow(file: string, text: string): void {
  try {
    // Node takes numeric open flags here (as in fs.openSync); its typings only list the string ones.
    const flag = (fs.constants.O_WRONLY | fs.constants.O_APPEND | fs.constants.O_CREAT | fs.constants.O_NOFOLLOW) as unknown as string;
    fs.appendFileSync(file, text, { flag, mode: 0o644 });
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ELOOP') {
      throw new DistilleryError(`${file} became a symbolic link during the run; distillery does not write through links`, 'remove the link and resume with --resume');
    }
    throw e;
  }
}

/**
 * Validation losses by step and the last 10 step losses of metrics rows, and the step of the model checkpoints/best
 * holds: rank 0's on every rank.
 */
export function shareHistory(comm: Communicator, rows: ReturnType<typeof readMetrics>, bestStep: number | null):
  { val: Array<[number, number]>; losses: number[]; bestStep: number | null } {
  const mine = {
    val: rows.filter((r) => r.val_loss !== undefined).map((r): [number, number] => [r.step!, r.val_loss!]),
    losses: rows.filter((r) => r.loss !== undefined).map((r) => r.loss!).slice(-10),
    bestStep,
  };
  if (comm.world === 1) return mine;
  const bytes = comm.broadcast(comm.rank === 0 ? new TextEncoder().encode(JSON.stringify(mine)) : new Uint8Array(0));
  return JSON.parse(new TextDecoder().decode(bytes)) as typeof mine;
}

/** loss.svg of the run folder, from its metrics.jsonl. */
export function writeLossSvg(out: string, metricsPath: string, mode: string): void {
  const svg = lossPlotSvg(readMetrics(metricsPath), { mode, runName: path.basename(out) });
  writeFileAtomic(path.join(out, 'loss.svg'), svg);
}
