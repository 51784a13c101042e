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
import type { Communicator } from '../parallel/comm.js';
import type { Transformer } from '../model/transformer.js';
import type { Tokenizer } from '../tokenizer/bpe.js';
import type { ChatFormat } from '../tokenizer/chat.js';
import { StepRunner } from './step.js';
import { SCORING_CHUNK_FLOATS } from './head.js';
import { readChoiceItems, type ChoiceItem } from '../eval/items.js';
import { InputError } from '../util/errors.js';
import { encodeForModel } from '../eval/encode.js';
import { chatSaid, choiceBatches, choiceMetrics, choiceRows, choiceSlots, choiceWindow, rowsSaid, scoreChoices, type ChoiceRow, type ItemScores } from '../eval/choices.js';
import { fewshotSaid, type FewshotOptions } from '../eval/fewshot.js';

/**
 * What a run scores and reports: acc and acc_norm over the multiple-choice items, the is_greedy fraction and the
 * continuations' perplexity over the continuation items, the word and byte perplexities and bits per byte over the text
 * items (each present when the items have that kind).
 */
export interface ChoiceScores {
  acc?: number; accNorm?: number; greedy?: { acc: number; perplexity: number };
  rolling?: { wordPerplexity: number; bytePerplexity: number; bitsPerByte: number };
}

/** A run's scores as metrics.jsonl names them, `prefix` 'val' (the student's) or 'teacher'. */
export function choiceRow(prefix: 'val' | 'teacher', c: ChoiceScores): Record<string, number> {
  const out: Record<string, number> = {};
  if (c.acc !== undefined) out[`${prefix}_acc`] = c.acc;
  if (c.accNorm !== undefined) out[`${prefix}_acc_norm`] = c.accNorm;
  if (c.greedy) { out[`${prefix}_greedy`] = c.greedy.acc; out[`${prefix}_cont_ppl`] = c.greedy.perplexity; }
  if (c.rolling) {
    out[`${prefix}_word_ppl`] = c.rolling.wordPerplexity; out[`${prefix}_byte_ppl`] = c.rolling.bytePerplexity; out[`${prefix}_bits_per_byte`] = c.rolling.bitsPerByte;
  }
  return out;
}

/**
 * choiceRow's inverse: the scores a metrics row holds under `prefix`, or null when it holds none. A perplexity too large
 * for a double was written as JSON's null (JSON.stringify(Infinity)): it reads back as Infinity.
 */
export function scoresOfRow(prefix: 'val' | 'teacher', m: Record<string, unknown>): ChoiceScores | null {
  const num = (k: string): number | undefined => (typeof m[`${prefix}_${k}`] === 'number' ? m[`${prefix}_${k}`] as number : undefined);
  const c: ChoiceScores = {};
  const acc = num('acc'), accNorm = num('acc_norm'), greedy = num('greedy');
  if (acc !== undefined && accNorm !== undefined) { c.acc = acc; c.accNorm = accNorm; }
  if (greedy !== undefined && `${prefix}_cont_ppl` in m) c.greedy = { acc: greedy, perplexity: num('cont_ppl') ?? Infinity };
  // a text's log-likelihood of -Infinity makes all three infinite (JSON null)
  if (`${prefix}_word_ppl` in m && `${prefix}_bits_per_byte` in m) {
    c.rolling = { wordPerplexity: num('word_ppl') ?? Infinity, bytePerplexity: num('byte_ppl') ?? Infinity, bitsPerByte: num('bits_per_byte') ?? Infinity };
  }
  return Object.keys(c).length ? c : null;
}

/** The items and rows of a run's --eval-choices, read and checked (prepareRunChoices). */
export interface PreparedChoices { items: ChoiceItem[]; rows: ChoiceRow[]; padId: number }

/** The graph region the choices' scoring records into (apart from the validation pass, whose graphs it would evict). */
export const CHOICES_REGION = 'choices pass';

/**
 * Reads, encodes and cuts the items to `seq` (host work only: before the run writes or loads anything). `log` gets
 * what was read and any left cut.
 */
export function prepareRunChoices(o: { files: string[]; chat: boolean; kwargs?: Record<string, unknown> | undefined; seq: number; systemInstruction?: string | undefined;
  fewshot?: Omit<FewshotOptions, 'pools'> | undefined; fewshotFrom?: string[] | undefined }, tokenizer: Tokenizer, chat: ChatFormat, log: (s: string) => void): PreparedChoices {
  const items = readChoiceItems(o.files);
  const gen = items.find((it) => it.generate);
  if (gen) {
    throw new InputError(`--eval-choices: ${gen.where} is a generation item ("target"), which a run does not score`,
      'score generation items on the run\'s checkpoints with distillery eval --choices (greedy generation and exact_match)');
  }
  const fewshot: FewshotOptions | undefined = o.fewshot && o.fewshot.n > 0
    ? { ...o.fewshot, ...(o.fewshotFrom?.length ? { pools: o.fewshotFrom.map((f) => readChoiceItems([f])) } : {}) } : undefined;
  // text items in rolling windows of the run's --seq (the harness's max_length)
  const encoded = encodeForModel(tokenizer, chat, items, { chat: o.chat, kwargs: o.kwargs, fewshot, rollingWindow: o.seq, warn: log, systemInstruction: o.systemInstruction || undefined });
  const rows = choiceRows(encoded, items, o.seq, (n) => `shorten or drop that item (the run's window is --seq ${o.seq}; it needs ${n})`);
  const cut = rows.filter((r) => r.cut).length;
  log(`choices: ${items.length} items, ${rowsSaid(items, rows)}${fewshotSaid(fewshot, o.fewshotFrom)}${o.chat ? chatSaid(items, fewshot?.n ?? 0, false) : ''} scored at every evaluation`);
  if (cut) log(`warning: --eval-choices: the context of ${cut} of ${rows.length} continuations is cut on the left to fit --seq ${o.seq} (the longest needs ${choiceWindow(encoded)})`);
  return { items, rows, padId: tokenizer.padId ?? tokenizer.eosId ?? 0 };
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

/** The run's scorer over its models. */
export function runChoices(p: PreparedChoices, batch: number, seq: number, student: Transformer, teacher: Transformer | null, comm: Communicator): RunChoices {
  const mine = p.rows.filter((_, i) => i % comm.world === comm.rank);
  const score = async (runner: StepRunner, stop: () => boolean): Promise<ChoiceScores | null> => {
    const sc = await scoreChoices(choiceSlots(p.items, p.rows), choiceBatches(mine, batch, seq, p.padId), (b) => runner.rowScores(b), async () => {
      if (comm.world > 1) return false; // several ranks stop together, at a step's end
      await new Promise<void>((resolve) => setImmediate(resolve)); // a signal's handler runs here
      return stop();
    });
    if (sc === null) return null;
    if (comm.world > 1) shareRowScores(p.rows, sc, comm);
    const m = choiceMetrics(p.items, sc);
    return {
      ...(m.acc !== undefined ? { acc: m.acc, accNorm: m.accNorm! } : {}), ...(m.greedy ? { greedy: { acc: m.greedy.acc, perplexity: m.greedy.perplexity } } : {}),
      ...(m.rolling ? { rolling: { wordPerplexity: m.rolling.wordPerplexity, bytePerplexity: m.rolling.bytePerplexity, bitsPerByte: m.rolling.bitsPerByte } } : {}),
    };
  };
  const studentRunner = choicesRunner(student);
  let teacherRunner: StepRunner | null = null;
  return {
    items: p.items.length,
    student: (stop) => score(studentRunner, stop),
    teacher: async (stop) => (teacher ? score(teacherRunner ??= choicesRunner(teacher), stop) : null),
  };
}
