/**
 * Scoring items by log-likelihood, the way lm-evaluation-harness scores its `multiple_choice`, `loglikelihood` and
 * `loglikelihood_rolling` tasks (the items: src/eval/items.ts; their tokens: src/eval/encode.ts):
 * - a multiple-choice item: each choice's continuation is scored by the model's summed log-probability of its tokens
 *   after the context; the prediction is the choice with the highest sum (`acc`), or with the highest sum per
 *   character of the choice (`acc_norm`, Python's len, without the delimiter) or per UTF-8 byte of it (`acc_bytes`);
 *   `brier_score` is the mean squared distance of the softmax of the sums from the answer's one-hot;
 * - a continuation item: `acc` is whether every token of it is the model's most likely next token (is_greedy, argmax's
 *   first index on ties), and its log-likelihood goes into `perplexity` = exp(−mean over items);
 * - a text item: its windows' log-likelihoods are summed, into `word_perplexity` = exp(−Σ ll / Σ words),
 *   `byte_perplexity` = exp(−Σ ll / Σ bytes) and `bits_per_byte` = −Σ ll / Σ bytes / ln 2.
 * Rows (an item's context and one continuation, or one window) longer than the window keep their last seq + 1 tokens
 * (the context cut on the left, as the harness cuts to the model's length); a continuation that does not fit is refused.
 * Rows run longest first in batches (choiceBatches); scoreChoices gathers each row's scores per item.
 */
import { InputError } from '../util/errors.js';
import type { Batch } from '../train/step.js';
import type { EncodedChoice } from './encode.js';
import { itemsByFile, pyLen, type ChoiceItem } from './items.js';

/** One scored sequence: an item's context followed by one of its choices. */
export interface ChoiceRow {
  item: number;
  choice: number;
  /** Context then continuation tokens, at most seq + 1 (the left cut already made). */
  ids: number[];
  /** Index in `ids` of the continuation's first token (≥ 1). */
  contStart: number;
  /** Whether the context was cut on the left to fit the window. */
  cut: boolean;
}

export interface ChoiceMetrics {
  /** Every item, of both kinds. */
  items: number;
  /** Continuations scored, over every item. */
  rows: number;
  /** Over the multiple-choice items (absent without any): the fraction whose highest-log-likelihood choice is the answer. */
  acc?: number;
  /** The same with each log-likelihood divided by its choice's length in characters. */
  accNorm?: number;
  /** The same divided by its choice's length in UTF-8 bytes (the harness's acc_bytes). */
  accBytes?: number;
  /**
   * The harness's brier_score: the mean over the items of Σ_k (softmax(log-likelihoods)_k − [k = answer])² (lower is
   * better; the harness needs every item to have as many choices, this takes any).
   */
  brierScore?: number;
  /** Over the continuation items (absent without any): how many, the is_greedy fraction, exp(−mean log-likelihood). */
  greedy?: GreedyMetrics;
  /** Over the text items (absent without any): word and byte perplexity, bits per byte. */
  rolling?: RollingMetrics;
}

/** The harness's metrics of a loglikelihood task (LAMBADA's `acc` and `perplexity`). */
export interface GreedyMetrics { items: number; acc: number; perplexity: number }

/** The harness's metrics of a loglikelihood_rolling task (wikitext's), over its texts' summed log-likelihoods. */
export interface RollingMetrics { items: number; windows: number; wordPerplexity: number; bytePerplexity: number; bitsPerByte: number }

/** The window that holds every row whole: the longest row's inputs (its tokens but the last). */
export function choiceWindow(encoded: readonly EncodedChoice[]): number {
  let most = 1;
  for (const e of encoded) most = Math.max(most, e.ctx.length + e.cont.length - 1);
  return most;
}

/**
 * The rows for a window of `seq` tokens: a row longer than seq + 1 tokens keeps its last seq + 1 (the context cut
 * on the left); a continuation longer than the window is refused.
 */
export function choiceRows(encoded: readonly EncodedChoice[], items: readonly ChoiceItem[], seq: number,
  hint: (tokens: number) => string = (n) => `use --seq ${n} or more`): ChoiceRow[] {
  return encoded.map(({ item, choice, ctx, cont }) => {
    if (items[item]!.rolling && ctx.length + cont.length > seq + 1) throw new Error(`${items[item]!.where}: a rolling window of ${ctx.length + cont.length - 1} inputs in a window of ${seq}`);
    if (cont.length > seq) {
      throw new InputError(`${items[item]!.where}: ${items[item]!.continuation || items[item]!.shared !== undefined ? 'the continuation' : `choice ${choice}`} is ${cont.length} tokens, more than the window (--seq ${seq}) holds`, hint(cont.length));
    }
    let ids = [...ctx, ...cont];
    const cut = ids.length > seq + 1;
    if (cut) ids = ids.slice(ids.length - (seq + 1));
    return { item, choice, ids, contStart: ids.length - cont.length, cut };
  });
}

/** Batch lengths are rounded up to a multiple of this (fewer shapes: fewer CUDA graphs), at most the window. */
export const CHOICE_LENGTH_STEP = 32;

/**
 * Batches of up to `b` rows, longest first (as the harness orders them), each as long as its longest row's inputs
 * rounded up to CHOICE_LENGTH_STEP (at most `seq`): inputs are a row's tokens but the last, targets the next tokens; the
 * mask counts the continuation's tokens only. Short rows are padded at the end with `padId` (causal attention: padding
 * after a row's tokens changes nothing before it). Made one batch at a time.
 */
export function* choiceBatches(rows: readonly ChoiceRow[], b: number, seq: number, padId: number): Generator<{ batch: Batch; rows: ChoiceRow[] }> {
  const order = rows.map((_, i) => i).sort((x, y) => rows[y]!.ids.length - rows[x]!.ids.length || x - y);
  for (let s = 0; s < order.length; s += b) {
    const part = order.slice(s, s + b).map((i) => rows[i]!);
    const longest = part[0]!.ids.length - 1;
    if (longest > seq) throw new Error(`a row of ${longest} inputs in a window of ${seq}`);
    const t = Math.min(seq, Math.ceil(longest / CHOICE_LENGTH_STEP) * CHOICE_LENGTH_STEP), n = part.length * t;
    const inputs = new Int32Array(n).fill(padId), targets = new Int32Array(n).fill(-1), mask = new Float32Array(n);
    part.forEach((r, i) => {
      const L = r.ids.length - 1;
      for (let p = 0; p < L; p++) {
        inputs[i * t + p] = r.ids[p]!;
        targets[i * t + p] = r.ids[p + 1]!;
        if (p + 1 >= r.contStart) mask[i * t + p] = 1;
      }
    });
    yield { batch: { inputs, targets, mask, b: part.length, t }, rows: part };
  }
}

/** The index of the largest value (the first on a tie, and the first NaN if any, as numpy's argmax). */
function argmax(v: readonly number[]): number {
  const nan = v.findIndex((x) => Number.isNaN(x));
  if (nan >= 0) return nan;
  let best = 0;
  for (let i = 1; i < v.length; i++) if (v[i]! > v[best]!) best = i;
  return best;
}

/**
 * Each item's predictions: by log-likelihood, by log-likelihood per character of the choice and per UTF-8 byte of it
 * (0 for a text item).
 */
export function predictions(items: readonly ChoiceItem[], logliks: readonly number[][]): Array<{ pred: number; predNorm: number; predBytes: number }> {
  return items.map((it, i) => {
    const ll = logliks[i]!;
    if (it.rolling) return { pred: 0, predNorm: 0, predBytes: 0 };
    return {
      pred: argmax(ll), predNorm: argmax(ll.map((x, k) => x / pyLen(it.choices[k]!))),
      predBytes: argmax(ll.map((x, k) => x / Buffer.byteLength(it.choices[k]!, 'utf8'))),
    };
  });
}

/**
 * The harness's brier_score term of one item: Σ over its choices of (p_k − [k = answer])², p = softmax of the choices'
 * log-likelihoods (its utils.softmax: exp(x − max) / Σ).
 */
export function brierTerm(ll: readonly number[], answer: number): number {
  const top = Math.max(...ll), e = ll.map((x) => Math.exp(x - top)), z = e.reduce((a, b) => a + b, 0);
  return e.reduce((a, x, k) => a + (x / z - (k === answer ? 1 : 0)) ** 2, 0);
}

/** What scoring gives per item and choice: the summed log-likelihood, and whether every token was the greedy one. */
export interface ItemScores {
  ll: number[][];
  greedy: boolean[][];
}

/**
 * The metrics over the items: acc and acc_norm over the multiple-choice items, is_greedy and perplexity over the
 * continuation items (each absent without items of its kind).
 */
export function choiceMetrics(items: readonly ChoiceItem[], scores: ItemScores): ChoiceMetrics {
  const p = predictions(items, scores.ll);
  let mc = 0, acc = 0, accNorm = 0, accBytes = 0, brier = 0, rows = 0, cont = 0, greedy = 0, llSum = 0, texts = 0, windows = 0, textLl = 0, words = 0, bytes = 0;
  items.forEach((it, i) => {
    rows += scores.ll[i]!.length;
    if (it.rolling) { texts++; windows += scores.ll[i]!.length; textLl += textLoglik(scores.ll[i]!); words += it.rolling.words; bytes += it.rolling.bytes; return; }
    if (it.continuation) { cont++; greedy += scores.greedy[i]![0] ? 1 : 0; llSum += scores.ll[i]![0]!; return; }
    mc++; acc += p[i]!.pred === it.answer ? 1 : 0; accNorm += p[i]!.predNorm === it.answer ? 1 : 0; accBytes += p[i]!.predBytes === it.answer ? 1 : 0;
    brier += brierTerm(scores.ll[i]!, it.answer);
  });
  return {
    items: items.length, rows,
    ...(mc ? { acc: acc / mc, accNorm: accNorm / mc, accBytes: accBytes / mc, brierScore: brier / mc } : {}),
    ...(cont ? { greedy: { items: cont, acc: greedy / cont, perplexity: Math.exp(-llSum / cont) } } : {}),
    ...(texts ? { rolling: { items: texts, windows, wordPerplexity: Math.exp(-textLl / words), bytePerplexity: Math.exp(-textLl / bytes), bitsPerByte: -textLl / bytes / Math.LN2 } } : {}),
  };
}

/** A text item's log-likelihood: its windows' sum (the harness sums a request's windows). */
export function textLoglik(windows: readonly number[]): number {
  let sum = 0;
  for (const x of windows) sum += x;
  return sum;
}

/** How many rows each item has (its choices; a text item's windows): the shape of its scores. */
export function choiceSlots(items: readonly ChoiceItem[], rows: readonly ChoiceRow[]): number[] {
  const slots = items.map((it) => (it.rolling ? 0 : it.choices.length));
  for (const r of rows) if (items[r.item]!.rolling) slots[r.item] = Math.max(slots[r.item]!, r.choice + 1);
  return slots;
}

/** Each row's scores (StepRunner.rowScores): Σ log p of its counted targets, and whether each was the argmax. */
export interface RowScores { ll: Float64Array; greedy: Uint8Array }

/**
 * Scores every row of the batches: `score(batch)` returns each row's summed log-probability of its counted targets
 * and whether all of them were the model's most likely tokens. Returns the scores per item and choice (NaN and false
 * for rows the batches did not hold), or null when `after` (called after each batch with the rows scored so far)
 * says to stop. `slots`: each item's row count (choiceSlots).
 */
export async function scoreChoices(slots: readonly number[], batches: Iterable<{ batch: Batch; rows: readonly ChoiceRow[] }>,
  score: (batch: Batch) => RowScores, after: (done: number) => boolean | void | Promise<boolean | void> = () => {}): Promise<ItemScores | null> {
  const out: ItemScores = {
    ll: slots.map((n) => new Array<number>(n).fill(NaN)),
    greedy: slots.map((n) => new Array<boolean>(n).fill(false)),
  };
  let done = 0;
  for (const { batch, rows } of batches) {
    const got = score(batch);
    rows.forEach((r, i) => { out.ll[r.item]![r.choice] = got.ll[i]!; out.greedy[r.item]![r.choice] = got.greedy[i] === 1; });
    done += rows.length;
    if ((await after(done)) === true) return null;
  }
  return out;
}

/** Each items file's metrics (ChoiceItem.file), in the order the files were read: the harness reports a task's own. */
export function metricsByFile(items: readonly ChoiceItem[], scores: ItemScores): Array<{ file: string } & ChoiceMetrics> {
  return itemsByFile(items).map(({ file, idx }) => ({
    file, ...choiceMetrics(idx.map((i) => items[i]!), { ll: idx.map((i) => scores.ll[i]!), greedy: idx.map((i) => scores.greedy[i]!) }),
  }));
}

/** Scores as the logs say them: acc and acc_norm of multiple-choice items, greedy and perplexity of continuations. */
export function scoresSaid(c: { acc?: number | undefined; accNorm?: number | undefined; greedy?: { acc: number; perplexity: number } | undefined;
  rolling?: { wordPerplexity: number; bitsPerByte: number } | undefined; exactMatch?: Record<string, number> | undefined }): string {
  const em = Object.entries(c.exactMatch ?? {});
  return [
    c.acc !== undefined ? `choices acc ${percent(c.acc)}, acc_norm ${percent(c.accNorm!)}` : '',
    c.greedy ? `continuations greedy ${percent(c.greedy.acc)}, ppl ${c.greedy.perplexity.toFixed(3)}` : '',
    c.rolling ? `texts word ppl ${c.rolling.wordPerplexity.toFixed(3)}, bits/byte ${c.rolling.bitsPerByte.toFixed(4)}` : '',
    em.length ? `generation exact_match ${em.map(([f, v]) => `${f} ${percent(v)}`).join(', ')}` : '',
  ].filter((x) => x).join(', ');
}

/** What the rows are, for a log line: "12 continuations", "3 continuations and 5 text windows", "5 text windows". */
export function rowsSaid(items: readonly ChoiceItem[], rows: readonly ChoiceRow[]): string {
  const windows = rows.filter((r) => items[r.item]!.rolling).length;
  return rowCounts(rows.length - windows, windows);
}

/** "N continuations", "N continuations and W text windows" or "W text windows" (singular for one). */
export function rowCounts(continuations: number, windows: number): string {
  const n = (k: number, what: string): string => `${k} ${what}${k === 1 ? '' : 's'}`;
  return [continuations || !windows ? n(continuations, 'continuation') : '', windows ? n(windows, 'text window') : ''].filter((x) => x).join(' and ');
}

/** With --choices-chat: how the prompts go to the template ('' when every item is a text, scored as it is). */
export function chatSaid(items: readonly ChoiceItem[], fewshot: number, singleTurn: boolean): string {
  const prompts = items.filter((it) => !it.rolling);
  if (!prompts.length) return '';
  const turns = prompts.some((it) => it.description || it.genPrefix) || (fewshot > 0 && !singleTurn);
  const continued = prompts.some((it) => it.genPrefix) ? ', each gen_prefix an assistant turn continued' : '';
  return ` (contexts as ${turns ? 'turns' : 'a user turn'} of the chat template${continued})`;
}

/** A fraction as a percentage with two decimals, as the reports print acc and acc_norm. */
export function percent(x: number): string {
  return `${(100 * x).toFixed(2)}%`;
}

/**
 * Each item's log-likelihoods and predictions as JSON lines (eval --choices-out): `where`, then for a multiple-choice
 * item `answer`, `logliks`, `pred`, `pred_norm`, for a continuation item `loglik` and `greedy`, for a text item `loglik`
 * (its windows' sum), `words`, `bytes` and `windows`; with a teacher the same prefixed `teacher_`.
 */
export function choiceSamples(items: readonly ChoiceItem[], scores: ItemScores, teacher: ItemScores | null): string {
  const p = predictions(items, scores.ll), tp = teacher ? predictions(items, teacher.ll) : null;
  return items.map((it, i) => JSON.stringify(it.rolling
    ? {
      where: it.where, loglik: textLoglik(scores.ll[i]!), words: it.rolling.words, bytes: it.rolling.bytes, windows: scores.ll[i]!.length,
      ...(teacher ? { teacher_loglik: textLoglik(teacher.ll[i]!) } : {}),
    }
    : it.continuation
    ? {
      where: it.where, loglik: scores.ll[i]![0], greedy: scores.greedy[i]![0],
      ...(teacher ? { teacher_loglik: teacher.ll[i]![0], teacher_greedy: teacher.greedy[i]![0] } : {}),
    }
    : {
      where: it.where, answer: it.answer, logliks: scores.ll[i], pred: p[i]!.pred, pred_norm: p[i]!.predNorm,
      ...(tp ? { teacher_logliks: teacher!.ll[i], teacher_pred: tp[i]!.pred, teacher_pred_norm: tp[i]!.predNorm } : {}),
    }) + '\n').join('');
}
