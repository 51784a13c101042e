/**
 * Multiple-choice scoring by log-likelihood, the way lm-evaluation-harness scores its `multiple_choice` tasks
 * (HellaSwag, ARC, PIQA, MMLU in its log-likelihood form): for every item, each choice's continuation is scored by the
 * model's summed log-probability of its tokens after the context; the prediction is the choice with the highest sum
 * (`acc`), or with the highest sum per character of the choice (`acc_norm`, the harness's length normalization).
 *
 * Items are JSON lines: `{"context": "...", "choices": ["...", ...], "answer": <index | the choice's text>}` (other
 * keys are ignored). The scored continuation is `delimiter + choice` (the harness's `target_delimiter`, a space by
 * default); `acc_norm` divides by the choice's length in characters (Unicode code points, Python's `len`), without the
 * delimiter.
 *
 * Tokenization follows the harness's `_encode_pair`: whitespace at the end of the context moves to the start of the
 * continuation; the context and context + continuation are encoded (as transformers' tokenizer(text,
 * add_special_tokens=False): no BOS added, special tokens written in the text read as themselves) and the continuation's
 * tokens are those of the whole past the context's, so a merge across the boundary is scored as the whole's tokens.
 * An empty context is the prefix token alone (the tokenizer's BOS, else its end-of-text token). A row longer than the
 * window keeps its last seq + 1 tokens (the context is cut on the left, as the harness cuts to the model's length);
 * a continuation that does not fit is refused.
 */
import * as fs from 'node:fs';
import type { Tokenizer } from '../tokenizer/bpe.js';
import { InputError } from '../util/errors.js';
import type { Batch } from '../train/step.js';

/** One multiple-choice item. */
export interface ChoiceItem {
  context: string;
  choices: string[];
  /** Index of the right choice. */
  answer: number;
  /** `file:line`, for messages. */
  where: string;
}

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
  items: number;
  /** Choices scored, over every item. */
  rows: number;
  /** Fraction of items whose highest-log-likelihood choice is the answer. */
  acc: number;
  /** The same with each log-likelihood divided by its choice's length in characters. */
  accNorm: number;
}

const HINT = 'each line: {"context": "...", "choices": ["...", "..."], "answer": <index or the right choice\'s text>}';

/** Parses the items of a JSON-lines file's text; `file` names it in errors. Blank lines are skipped. */
export function parseChoiceItems(text: string, file: string): ChoiceItem[] {
  const out: ChoiceItem[] = [];
  text.split(/\r?\n/).forEach((line, i) => {
    if (line.trim() === '') return;
    const where = `${file}:${i + 1}`;
    let j: unknown;
    try { j = JSON.parse(line); } catch (e) { throw new InputError(`${where}: invalid JSON (${(e as Error).message})`, HINT); }
    if (typeof j !== 'object' || j === null || Array.isArray(j)) throw new InputError(`${where}: expected a JSON object`, HINT);
    const o = j as Record<string, unknown>;
    if (typeof o.context !== 'string') throw new InputError(`${where}: "context" must be a string${o.context === undefined ? ' (it is missing)' : ''}`, HINT);
    const ch = o.choices;
    if (!Array.isArray(ch) || ch.length < 2 || !ch.every((c) => typeof c === 'string')) {
      throw new InputError(`${where}: "choices" must be a list of at least two strings`, HINT);
    }
    const choices = ch as string[];
    const empty = choices.findIndex((c) => c === '');
    if (empty >= 0) throw new InputError(`${where}: choice ${empty} is empty`, 'every choice needs text to score');
    let answer: number;
    if (typeof o.answer === 'number') {
      if (!Number.isInteger(o.answer) || o.answer < 0 || o.answer >= choices.length) {
        throw new InputError(`${where}: "answer" ${o.answer} is not the index of a choice (0 to ${choices.length - 1})`, HINT);
      }
      answer = o.answer;
    } else if (typeof o.answer === 'string') {
      answer = choices.indexOf(o.answer);
      if (answer < 0) throw new InputError(`${where}: "answer" ${JSON.stringify(o.answer)} is none of the choices`, 'give the right choice\'s index, or its exact text');
    } else {
      throw new InputError(`${where}: "answer" must be a choice's index or text${o.answer === undefined ? ' (it is missing)' : ''}`, HINT);
    }
    out.push({ context: o.context, choices, answer, where });
  });
  return out;
}

/** Reads the items of JSON-lines files, in order. */
export function readChoiceItems(files: readonly string[]): ChoiceItem[] {
  const items: ChoiceItem[] = [];
  for (const f of files) {
    let text: string;
    try { text = fs.readFileSync(f, 'utf8'); } catch (e) { throw new InputError(`cannot read --choices file ${f} (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`, 'check the path'); }
    const got = parseChoiceItems(text, f);
    if (got.length === 0) throw new InputError(`--choices file ${f} holds no items`, HINT);
    items.push(...got);
  }
  return items;
}

/**
 * The context's and the continuation's tokens as lm-evaluation-harness splits them (its `_encode_pair`): trailing
 * whitespace of the context moves to the continuation; the continuation is the whole's tokens past the context's.
 */
export function encodePair(tok: Tokenizer, context: string, continuation: string, prefixId: number): { ctx: number[]; cont: number[] } {
  const trimmed = context.replace(/[\s\x1c-\x1f]+$/u, ''); // Python's str.rstrip()
  const moved = context.slice(trimmed.length);
  const cont = moved + continuation;
  if (trimmed === '') return { ctx: [prefixId], cont: tok.encode(cont) };
  const whole = tok.encode(trimmed + cont);
  const ctx = tok.encode(trimmed);
  return { ctx, cont: whole.slice(ctx.length) };
}

/** The token the harness puts before an empty context: the tokenizer's BOS, else its end-of-text token. */
export function prefixTokenOf(tok: Tokenizer): number {
  const id = tok.bosId ?? tok.eosId;
  if (id === undefined) throw new InputError('the tokenizer has neither a BOS nor an end-of-text token to put before an empty context', 'give every item a non-empty "context"');
  return id;
}

/** Rows of a window of `seq` tokens, one per (item, choice), in item order. */
export function choiceRows(tok: Tokenizer, items: readonly ChoiceItem[], seq: number, delimiter: string): ChoiceRow[] {
  const prefix = prefixTokenOf(tok);
  const rows: ChoiceRow[] = [];
  items.forEach((it, i) => {
    it.choices.forEach((c, k) => {
      const { ctx, cont } = encodePair(tok, it.context, delimiter + c, prefix);
      if (cont.length === 0) throw new InputError(`${it.where}: choice ${k} encodes to no tokens past the context`, 'check the choice\'s text');
      if (cont.length > seq) {
        throw new InputError(`${it.where}: choice ${k} is ${cont.length} tokens, more than the window (--seq ${seq}) holds`, `use --seq ${cont.length + 1} or more`);
      }
      let ids = [...ctx, ...cont];
      const cut = ids.length > seq + 1;
      if (cut) ids = ids.slice(ids.length - (seq + 1));
      rows.push({ item: i, choice: k, ids, contStart: ids.length - cont.length, cut });
    });
  });
  return rows;
}

/** The window that holds every row whole: the longest row's inputs (its tokens but the last). */
export function choiceWindow(tok: Tokenizer, items: readonly ChoiceItem[], delimiter: string): number {
  const prefix = prefixTokenOf(tok);
  let most = 1;
  for (const it of items) for (const c of it.choices) {
    const { ctx, cont } = encodePair(tok, it.context, delimiter + c, prefix);
    most = Math.max(most, ctx.length + cont.length - 1);
  }
  return most;
}

/**
 * Batches of up to `b` rows in windows of `t` tokens: inputs are a row's tokens but the last, targets the next tokens;
 * the mask counts the continuation's tokens only. Short rows are padded at the end (causal attention: padding after
 * a row's tokens changes nothing before it) with `padId`.
 */
export function choiceBatches(rows: readonly ChoiceRow[], b: number, t: number, padId: number): Batch[] {
  const out: Batch[] = [];
  for (let s = 0; s < rows.length; s += b) {
    const part = rows.slice(s, s + b), n = part.length * t;
    const inputs = new Int32Array(n).fill(padId), targets = new Int32Array(n).fill(-1), mask = new Float32Array(n);
    part.forEach((r, i) => {
      const L = r.ids.length - 1;
      if (L > t) throw new Error(`a row of ${L} inputs in a window of ${t}`);
      for (let p = 0; p < L; p++) {
        inputs[i * t + p] = r.ids[p]!;
        targets[i * t + p] = r.ids[p + 1]!;
        if (p + 1 >= r.contStart) mask[i * t + p] = 1;
      }
    });
    out.push({ inputs, targets, mask, b: part.length, t });
  }
  return out;
}

/** Length in characters as Python's len counts them (code points, not UTF-16 units). */
export function pyLen(s: string): number {
  let n = 0;
  for (const _ of s) n++;
  return n;
}

/** The index of the largest value (the first on a tie, as numpy's argmax). */
function argmax(v: readonly number[]): number {
  let best = 0;
  for (let i = 1; i < v.length; i++) if (v[i]! > v[best]!) best = i;
  return best;
}

/** Each item's predictions: by log-likelihood, and by log-likelihood per character of the choice. */
export function predictions(items: readonly ChoiceItem[], logliks: readonly number[][]): Array<{ pred: number; predNorm: number }> {
  return items.map((it, i) => {
    const ll = logliks[i]!;
    return { pred: argmax(ll), predNorm: argmax(ll.map((x, k) => x / pyLen(it.choices[k]!))) };
  });
}

/** acc and acc_norm over the items, from each item's choices' log-likelihoods. */
export function choiceMetrics(items: readonly ChoiceItem[], logliks: readonly number[][]): ChoiceMetrics {
  const p = predictions(items, logliks);
  let acc = 0, accNorm = 0, rows = 0;
  items.forEach((it, i) => { acc += p[i]!.pred === it.answer ? 1 : 0; accNorm += p[i]!.predNorm === it.answer ? 1 : 0; rows += it.choices.length; });
  return { items: items.length, rows, acc: acc / items.length, accNorm: accNorm / items.length };
}

/**
 * Scores every row: `rowLogLik(batch)` returns each row's summed log-probability of its counted targets. Returns the
 * log-likelihoods per item and choice, and reports progress after each batch.
 */
export function scoreChoices(items: readonly ChoiceItem[], rows: readonly ChoiceRow[], batches: readonly Batch[],
  rowLogLik: (batch: Batch) => Float64Array, progress: (done: number, total: number) => void = () => {}): number[][] {
  const ll = items.map((it) => new Array<number>(it.choices.length).fill(NaN));
  let r = 0;
  for (const batch of batches) {
    const got = rowLogLik(batch);
    for (let i = 0; i < batch.b; i++, r++) ll[rows[r]!.item]![rows[r]!.choice] = got[i]!;
    progress(r, rows.length);
  }
  return ll;
}

/**
 * Each item's log-likelihoods and predictions as JSON lines (eval --choices-out): `where`, `answer`, `logliks`,
 * `pred`, `pred_norm`, and with a teacher the same three prefixed `teacher_`.
 */
export function choiceSamples(items: readonly ChoiceItem[], ll: readonly number[][], teacher: readonly number[][] | null): string {
  const p = predictions(items, ll), tp = teacher ? predictions(items, teacher) : null;
  return items.map((it, i) => JSON.stringify({
    where: it.where, answer: it.answer, logliks: ll[i], pred: p[i]!.pred, pred_norm: p[i]!.predNorm,
    ...(tp ? { teacher_logliks: teacher![i], teacher_pred: tp[i]!.pred, teacher_pred_norm: tp[i]!.predNorm } : {}),
  }) + '\n').join('');
}
