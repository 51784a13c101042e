/**
 * --eval-choices in a train/distill run: the student scores multiple-choice items (src/eval/choices.ts, as
 * `distillery eval --choices` scores them) at every evaluation, and a live teacher once, so that metrics.jsonl shows
 * how much of the teacher's accuracy the student has. The items are read, encoded and cut to the run's --seq (the
 * models' window) before anything is written or loaded (prepareRunChoices: a bad file costs nothing); the scoring runs
 * as the evaluation pass runs (a StepRunner with plain cross-entropy over the whole vocabulary, no gradient, a small
 * logits chunk, its own captured region: the kernels the pre-warm plan traces, src/train/kernel-plan.ts `choices`).
 * With several ranks each scores every world-th row and one host all-reduce gives every rank every score; with one,
 * the scoring yields between batches, so a signal stops it.
 */
import * as path from 'node:path';
import type { Communicator } from '../parallel/comm.js';
import type { Transformer } from '../model/transformer.js';
import type { Tokenizer } from '../tokenizer/bpe.js';
import type { ChatFormat } from '../tokenizer/chat.js';
import { StepRunner } from './step.js';
import { SCORING_CHUNK_FLOATS } from './head.js';
import { limitItems, readChoiceItems, type ChoiceItem } from '../eval/items.js';
import { encodeForModel } from '../eval/encode.js';
import { chatSaid, choiceBatches, choiceMetrics, choiceRows, choiceSlots, choiceWindow, metricsByFile, rowsSaid, scoreChoices, type ChoiceMetrics, type ChoiceRow, type ItemScores } from '../eval/choices.js';
import { fewshotSaid, type FewshotOptions } from '../eval/fewshot.js';
import type { BatchGenerator } from '../model/batch-generate.js';
import { DEFAULT_RUN_OPTIONS, type RunOptions } from './options.js';
import { prepareRunGeneration, RunGeneration, RUN_GENERATION_FIELDS, type ExactMatchScores, type PreparedGeneration } from './run-generation.js';
import { camelToKebab } from '../cli/args.js';

type GenerationField = (typeof RUN_GENERATION_FIELDS)[number];

/**
 * What a run scores and reports: acc and acc_norm over the multiple-choice items, the is_greedy fraction and the
 * continuations' perplexity over the continuation items, the word and byte perplexities and bits per byte over the text
 * items (each present when the items have that kind).
 */
export interface ChoiceScores {
  acc?: number; accNorm?: number;
  /** Multiple-choice items: acc over the log-likelihood per UTF-8 byte, and the Brier score (eval --choices' acc_bytes, brier_score). */
  accBytes?: number; brierScore?: number;
  greedy?: { acc: number; perplexity: number };
  rolling?: { wordPerplexity: number; bytePerplexity: number; bitsPerByte: number };
  /** Generation items: exact_match per filter pipeline (src/train/run-generation.ts). */
  exactMatch?: ExactMatchScores;
  /**
   * With several --eval-choices files (tasks): each file's own scores, as eval reports them per file; `file` is its tag
   * in metrics.jsonl (fileTags: its name without .jsonl).
   */
  files?: Array<{ file: string; scores: ChoiceScores }>;
}

/**
 * Each --eval-choices file's tag in metrics.jsonl (`val_acc:<tag>`): its base name without `.jsonl`, or, where two
 * files share one, the path as given.
 */
export function fileTags(files: readonly string[]): Map<string, string> {
  const stem = (f: string): string => path.basename(f).replace(/\.jsonl$/i, '');
  const shared = new Set(files.map(stem).filter((s, i, all) => all.indexOf(s) !== i));
  return new Map(files.map((f) => [f, shared.has(stem(f)) ? f : stem(f)]));
}

/** A run's scores as metrics.jsonl names them, `prefix` 'val' (the student's) or 'teacher'. */
export function choiceRow(prefix: 'val' | 'teacher', c: ChoiceScores): Record<string, number> {
  const out: Record<string, number> = {};
  if (c.acc !== undefined) out[`${prefix}_acc`] = c.acc;
  if (c.accNorm !== undefined) out[`${prefix}_acc_norm`] = c.accNorm;
  if (c.accBytes !== undefined) out[`${prefix}_acc_bytes`] = c.accBytes;
  if (c.brierScore !== undefined) out[`${prefix}_brier_score`] = c.brierScore;
  if (c.greedy) { out[`${prefix}_greedy`] = c.greedy.acc; out[`${prefix}_cont_ppl`] = c.greedy.perplexity; }
  if (c.rolling) {
    out[`${prefix}_word_ppl`] = c.rolling.wordPerplexity; out[`${prefix}_byte_ppl`] = c.rolling.bytePerplexity; out[`${prefix}_bits_per_byte`] = c.rolling.bitsPerByte;
  }
  for (const [filter, v] of Object.entries(c.exactMatch ?? {})) out[`${prefix}_${EXACT_MATCH}${filter}`] = v;
  // each file's scores under its tag, after the last ':' (`val_acc:arc-easy`, `val_exact_match_strict-match:gsm8k`)
  for (const f of c.files ?? []) for (const [k, v] of Object.entries(choiceRow(prefix, f.scores))) out[`${k}:${f.file}`] = v;
  return out;
}

/**
 * choiceRow's inverse: the scores a metrics row holds under `prefix`, or null when it holds none. A perplexity too large
 * for a double was written as JSON's null (JSON.stringify(Infinity)): it reads back as Infinity.
 */
export function scoresOfRow(prefix: 'val' | 'teacher', row: Record<string, unknown>): ChoiceScores | null {
  // the whole run's keys, and each file's (after the last ':') apart
  const m: Record<string, unknown> = {}, byFile = new Map<string, Record<string, unknown>>();
  for (const [k, v] of Object.entries(row)) {
    const at = k.lastIndexOf(':');
    if (at < 0) { m[k] = v; continue; }
    const tag = k.slice(at + 1);
    if (!byFile.has(tag)) byFile.set(tag, {});
    byFile.get(tag)![k.slice(0, at)] = v;
  }
  const num = (k: string): number | undefined => (typeof m[`${prefix}_${k}`] === 'number' ? m[`${prefix}_${k}`] as number : undefined);
  const c: ChoiceScores = {};
  const acc = num('acc'), accNorm = num('acc_norm'), greedy = num('greedy');
  if (acc !== undefined && accNorm !== undefined) { c.acc = acc; c.accNorm = accNorm; }
  // (rows of an earlier version have no acc_bytes or brier_score)
  const accBytes = num('acc_bytes'), brierScore = num('brier_score');
  if (c.acc !== undefined && accBytes !== undefined && brierScore !== undefined) { c.accBytes = accBytes; c.brierScore = brierScore; }
  if (greedy !== undefined && `${prefix}_cont_ppl` in m) c.greedy = { acc: greedy, perplexity: num('cont_ppl') ?? Infinity };
  // a text's log-likelihood of -Infinity makes all three infinite (JSON null)
  if (`${prefix}_word_ppl` in m && `${prefix}_bits_per_byte` in m) {
    c.rolling = { wordPerplexity: num('word_ppl') ?? Infinity, bytePerplexity: num('byte_ppl') ?? Infinity, bitsPerByte: num('bits_per_byte') ?? Infinity };
  }
  const em = Object.keys(m).filter((k) => k.startsWith(`${prefix}_${EXACT_MATCH}`) && typeof m[k] === 'number');
  if (em.length) c.exactMatch = Object.fromEntries(em.map((k) => [k.slice(`${prefix}_${EXACT_MATCH}`.length), m[k] as number]));
  const files = [...byFile].flatMap(([file, keys]) => { const s = scoresOfRow(prefix, keys); return s ? [{ file, scores: s }] : []; });
  if (files.length) c.files = files;
  return Object.keys(c).length ? c : null;
}

/** metrics.jsonl's exact_match keys: `val_exact_match_<filter>` (the harness prints "exact_match,<filter>"). */
const EXACT_MATCH = 'exact_match_';

/**
 * The items and rows of a run's --eval-choices, read and checked (prepareRunChoices): the scored items (multiple
 * choice, continuations, texts) and their rows, and the generation items (null without).
 */
export interface PreparedChoices {
  items: ChoiceItem[]; rows: ChoiceRow[]; padId: number; generation: PreparedGeneration | null;
  /** The --eval-choices files in their order (each file's scores go apart when there are several). */
  files: string[];
}

/** The graph region the choices' scoring records into (apart from the validation pass, whose graphs it would evict). */
export const CHOICES_REGION = 'choices pass';

/**
 * Reads, encodes and cuts the items to `seq` (host work only: before the run writes or loads anything). `log` gets
 * what was read and any left cut.
 */
export function prepareRunChoices(o: { files: string[]; chat: boolean; kwargs?: Record<string, unknown> | undefined; seq: number; systemInstruction?: string | undefined;
  fewshot?: Omit<FewshotOptions, 'pools'> | undefined; fewshotFrom?: string[] | undefined; generation?: Pick<RunOptions, GenerationField> | undefined;
  /** Whether the run's --eval-fewshot was given (0 too): without it, a --eval-preset's own examples go before generation items. */
  fewshotGiven?: boolean | undefined;
  /** The first n items of each file (below 1: that fraction; 0 or none: all), their examples from the whole file. */
  limit?: number | undefined },
  tokenizer: Tokenizer, chat: ChatFormat, log: (s: string) => void): PreparedChoices {
  const read = readChoiceItems(o.files);
  const all = o.limit ? limitItems(read, o.limit) : read;
  if (o.limit) log(`choices: --eval-limit ${o.limit}: ${all.length} of ${read.length} items (the first of each file)`);
  // scored items and generation items each go their own way; a file holds one kind (a task), its examples its own
  const items = all.filter((it) => !it.generate), generated = all.filter((it) => it.generate);
  // examples from --eval-fewshot-from, else (under a limit) from each file's whole items, the item itself left out
  const from = o.fewshotFrom?.length ? o.fewshotFrom : undefined;
  const pools = from ? from.map((f) => readChoiceItems([f])) : o.limit ? o.files.map((f) => read.filter((it) => it.file === f)) : undefined;
  const poolsOf = (part: readonly ChoiceItem[]): Pick<FewshotOptions, 'pools' | 'ownPools'> =>
    (pools ? { pools: o.files.flatMap((f, k) => (part.some((it) => it.file === f) ? [pools[k]!] : [])), ...(from ? {} : { ownPools: true }) } : {});
  const fewshot: FewshotOptions | undefined = o.fewshot && o.fewshot.n > 0 ? { ...o.fewshot, ...poolsOf(items) } : undefined;
  const g = o.generation ?? DEFAULT_RUN_OPTIONS;
  const generation = generated.length ? prepareRunGeneration(generated, { ...g, seq: o.seq, chat: o.chat, kwargs: o.kwargs, systemInstruction: o.systemInstruction,
    fewshot: o.fewshot ? { ...o.fewshot, ...poolsOf(generated) } : undefined, fewshotFrom: o.fewshotFrom, fewshotGiven: o.fewshotGiven }, tokenizer, chat, log) : null;
  const given = RUN_GENERATION_FIELDS.filter((f) => JSON.stringify(g[f]) !== JSON.stringify(DEFAULT_RUN_OPTIONS[f]));
  if (!generated.length && given.length) {
    log(`warning: ${given.map((f) => `--${camelToKebab(f)}`).join(', ')} ha${given.length === 1 ? 's' : 've'} no effect: no --eval-choices file holds generation items ("target")`);
  }
  if (!items.length) return { items, rows: [], padId: tokenizer.padId ?? tokenizer.eosId ?? 0, generation, files: o.files };
  // text items in rolling windows of the run's --seq (the harness's max_length)
  const encoded = encodeForModel(tokenizer, chat, items, { chat: o.chat, kwargs: o.kwargs, fewshot, rollingWindow: o.seq, warn: log, systemInstruction: o.systemInstruction || undefined });
  const rows = choiceRows(encoded, items, o.seq, (n) => `shorten or drop that item (the run's window is --seq ${o.seq}; it needs ${n})`);
  const cut = rows.filter((r) => r.cut).length;
  log(`choices: ${items.length} items, ${rowsSaid(items, rows)}${fewshotSaid(fewshot, o.fewshotFrom)}${o.chat ? chatSaid(items, fewshot?.n ?? 0, false) : ''} scored at every evaluation`);
  if (cut) log(`warning: --eval-choices: the context of ${cut} of ${rows.length} continuations is cut on the left to fit --seq ${o.seq} (the longest needs ${choiceWindow(encoded)})`);
  return { items, rows, padId: tokenizer.padId ?? tokenizer.eosId ?? 0, generation, files: o.files };
}

/** The options of a choices runner (the plan's closure builds the same). */
export function choicesRunner(m: Transformer): StepRunner {
  return new StepRunner(m, null, { kind: 'none', alpha: 0, temperature: 1, beta: 0.5 }, { chunkFloats: SCORING_CHUNK_FLOATS, noGrad: true, region: CHOICES_REGION });
}

export interface RunChoices {
  items: number;
  /** The student's scores now; null when `stop()` said so between batches (one rank only). */
  student(stop: () => boolean): Promise<ChoiceScores | null>;
  /** The teacher's (null without a live teacher, or when stopped). */
  teacher(stop: () => boolean): Promise<ChoiceScores | null>;
}

/** What a run's generation items generate with: the tokenizer, the ids generation stops at, and each model's generator (made at first use). */
export interface RunGenerators {
  tokenizer: Tokenizer;
  stopIds: readonly number[];
  student: () => BatchGenerator;
  teacher: () => BatchGenerator;
  /** Gets a line per generation (its tokens, items and time). */
  log?: (s: string) => void;
}

const noGen = (): BatchGenerator => { throw new Error('no generator'); };

/** The scores a run reports of a set of items' metrics. */
function scoresOf(m: ChoiceMetrics): ChoiceScores {
  return {
    ...(m.acc !== undefined ? { acc: m.acc, accNorm: m.accNorm!, accBytes: m.accBytes!, brierScore: m.brierScore! } : {}), ...(m.greedy ? { greedy: { acc: m.greedy.acc, perplexity: m.greedy.perplexity } } : {}),
    ...(m.rolling ? { rolling: { wordPerplexity: m.rolling.wordPerplexity, bytePerplexity: m.rolling.bytePerplexity, bitsPerByte: m.rolling.bitsPerByte } } : {}),
  };
}

/**
 * Several ranks: each scored every world-th of `rows` into `sc`; one host all-reduce of the rows' log-likelihoods and
 * greedy flags (0 where another rank scored) gives every rank every row's scores, in place.
 */
export function shareRowScores(rows: readonly ChoiceRow[], sc: ItemScores, comm: Pick<Communicator, 'world' | 'rank' | 'allReduceHost'>): void {
  const R = rows.length, flat = new Float64Array(2 * R);
  rows.forEach((r, i) => {
    if (i % comm.world === comm.rank) { flat[i] = sc.ll[r.item]![r.choice]!; flat[R + i] = sc.greedy[r.item]![r.choice] ? 1 : 0; }
  });
  const all = comm.allReduceHost(flat);
  rows.forEach((r, i) => { sc.ll[r.item]![r.choice] = all[i]!; sc.greedy[r.item]![r.choice] = all[R + i] === 1; });
}

/** The run's scorer over its models (`gens`: what generation items need; required with them). */
export function runChoices(p: PreparedChoices, batch: number, seq: number, student: Transformer, teacher: Transformer | null, comm: Communicator,
  gens?: RunGenerators): RunChoices {
  const mine = p.rows.filter((_, i) => i % comm.world === comm.rank);
  if (p.generation && !gens) throw new Error('runChoices: generation items need the run\'s generators');
  const generation = p.generation && gens ? new RunGeneration(p.generation, gens.tokenizer, gens.stopIds, comm, gens.log) : null;
  // several files (tasks): each one's scores apart too, under its tag
  const several = p.files.length > 1, tags = fileTags(p.files), tagOrder = [...tags.values()];
  const order = (tag: string): number => tagOrder.indexOf(tag);
  const score = async (runner: StepRunner, stop: () => boolean): Promise<ChoiceScores | null> => {
    if (!p.rows.length) return {};
    const sc = await scoreChoices(choiceSlots(p.items, p.rows), choiceBatches(mine, batch, seq, p.padId), (b) => runner.rowScores(b), async () => {
      if (comm.world > 1) return false; // several ranks stop together, at a step's end
      await new Promise<void>((resolve) => setImmediate(resolve)); // a signal's handler runs here
      return stop();
    });
    if (sc === null) return null;
    if (comm.world > 1) shareRowScores(p.rows, sc, comm);
    const s: ChoiceScores = scoresOf(choiceMetrics(p.items, sc));
    if (several) s.files = metricsByFile(p.items, sc).map((f) => ({ file: tags.get(f.file) ?? f.file, scores: scoresOf(f) }));
    return s;
  };
  /** The scored items' scores, then the generation items' exact_match (each file's apart with several). */
  const both = async (m: Transformer, runner: StepRunner, gen: () => BatchGenerator, stop: () => boolean, who: string): Promise<ChoiceScores | null> => {
    const c = await score(runner, stop);
    if (c === null || !generation) return c;
    const em = await generation.score(m, gen(), stop, who);
    if (em === null) return null;
    const files = several ? [...(c.files ?? []), ...em.files.map((f) => ({ file: tags.get(f.file) ?? f.file, scores: { exactMatch: f.exactMatch } }))] : undefined;
    // in the --eval-choices order
    files?.sort((a, b) => order(a.file) - order(b.file));
    return { ...c, exactMatch: em.all, ...(files ? { files } : {}) };
  };
  const studentRunner = choicesRunner(student);
  let teacherRunner: StepRunner | null = null;
  return {
    items: p.items.length + (p.generation?.items.length ?? 0),
    student: (stop) => both(student, studentRunner, gens?.student ?? noGen, stop, 'the student'),
    teacher: async (stop) => (teacher ? both(teacher, teacherRunner ??= choicesRunner(teacher), gens?.teacher ?? noGen, stop, 'the teacher') : null),
  };
}
