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
 * An item with `"continuation": "..."` instead of choices is one of the harness's `loglikelihood` tasks (LAMBADA's):
 * the continuation is scored as written, with no delimiter (the harness sends a loglikelihood task's target as it is:
 * LAMBADA's carries its own leading space); its `acc` is whether every token of it is the model's most likely next
 * token (the harness's is_greedy, argmax's first index on ties), and its log-likelihood goes into `perplexity` =
 * exp(−mean over items).
 *
 * An item with `"text": "..."` is one of the harness's `loglikelihood_rolling` tasks (wikitext's): the whole text is
 * scored in the harness's rolling windows (rollingWindows: the prefix token, then windows of up to `window` tokens, each
 * conditioned on the tokens before it that fit), and its summed log-likelihood goes into `word_perplexity` =
 * exp(−Σ ll / Σ words), `byte_perplexity` = exp(−Σ ll / Σ bytes) and `bits_per_byte` = −Σ ll / Σ bytes / ln 2, words
 * counted as the harness counts them (Python's re.split(r"\s+")) unless the item gives `"words"` (and `"bytes"`).
 *
 * Tokenization follows the harness's HF backend (ChoiceEncoder): text is encoded as transformers' tokenizer.encode
 * encodes it, with the tokenizer's own special tokens (Llama 3's BOS; none for Qwen); whitespace at the end of the
 * context moves to the start of the continuation, and the continuation's tokens are those of context + continuation
 * past the context's, so a merge across the boundary is scored as the whole's tokens. An empty context is the prefix
 * token alone (tokenizer_config.json's bos_token, else its eos_token). A row longer than the window keeps its last
 * seq + 1 tokens (the context is cut on the left, as the harness cuts to the model's length); a continuation that does
 * not fit is refused.
 */
import * as fs from 'node:fs';
import type { Tokenizer } from '../tokenizer/bpe.js';
import { DistilleryError, InputError } from '../util/errors.js';
import type { Batch } from '../train/step.js';
import { renderChat, type ChatFormat } from '../tokenizer/chat.js';
import { promptTurns, turnsMessages, turnsText, type FewshotOptions } from './fewshot.js';

/** One multiple-choice item. */
export interface ChoiceItem {
  context: string;
  /** The choices; a continuation item's one continuation. */
  choices: string[];
  /** Index of the right choice (0 for a continuation item). */
  answer: number;
  /** A loglikelihood item (`"continuation"`): scored by is_greedy and perplexity instead of by the best choice. */
  continuation?: boolean;
  /**
   * A loglikelihood_rolling item (`"text"`, its text the one choice): scored whole in rolling windows, per word and per
   * byte (the harness's counts, or the item's own `"words"` / `"bytes"`).
   */
  rolling?: { words: number; bytes: number };
  /** `file:line`, for messages. */
  where: string;
  /** The items file it was read from (per-file metrics). */
  file?: string;
  /** Text before everything else in its prompt (the harness's task description, e.g. MMLU's subject line). */
  description?: string;
  /** Its line's object with the keys sorted: few-shot sampling leaves out the items equal to it, as the harness does. */
  doc?: string;
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
  /** Every item, of both kinds. */
  items: number;
  /** Continuations scored, over every item. */
  rows: number;
  /** Over the multiple-choice items (absent without any): the fraction whose highest-log-likelihood choice is the answer. */
  acc?: number;
  /** The same with each log-likelihood divided by its choice's length in characters. */
  accNorm?: number;
  /** Over the continuation items (absent without any): how many, the is_greedy fraction, exp(−mean log-likelihood). */
  greedy?: GreedyMetrics;
  /** Over the text items (absent without any): word and byte perplexity, bits per byte. */
  rolling?: RollingMetrics;
}

/** The harness's metrics of a loglikelihood task (LAMBADA's `acc` and `perplexity`). */
export interface GreedyMetrics { items: number; acc: number; perplexity: number }

/** The harness's metrics of a loglikelihood_rolling task (wikitext's), over its texts' summed log-likelihoods. */
export interface RollingMetrics { items: number; windows: number; wordPerplexity: number; bytePerplexity: number; bitsPerByte: number }

const HINT = 'each line: {"context": "...", "choices": ["...", "..."], "answer": <index or the right choice\'s text>}, {"context": "...", "continuation": "..."}, or {"text": "..."}';

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
    if (o.description !== undefined && typeof o.description !== 'string') throw new InputError(`${where}: "description" must be a string`, HINT);
    const extra = { where, file, doc: sortedJson(o), ...(typeof o.description === 'string' && o.description !== '' ? { description: o.description } : {}) };
    if (o.text !== undefined && o.context === undefined) {
      const other = ['choices', 'answer', 'continuation', 'description'].filter((k) => o[k] !== undefined);
      if (other.length) throw new InputError(`${where}: "text" goes without ${other.map((k) => `"${k}"`).join(', ')}`, HINT);
      if (typeof o.text !== 'string' || o.text === '') throw new InputError(`${where}: "text" must be a non-empty string`, HINT);
      const count = (k: 'words' | 'bytes', d: number): number => {
        const v = o[k];
        if (v === undefined) return d;
        if (typeof v !== 'number' || !Number.isInteger(v) || v < 1) throw new InputError(`${where}: "${k}" must be a positive integer`, `the count the ${k === 'words' ? 'word' : 'byte'} perplexity divides by (default: the text's, as the harness counts it)`);
        return v;
      };
      out.push({ context: '', choices: [o.text], answer: 0, rolling: { words: count('words', pyWords(o.text)), bytes: count('bytes', Buffer.byteLength(o.text, 'utf8')) }, ...extra });
      return;
    }
    if (typeof o.context !== 'string') throw new InputError(`${where}: "context" must be a string${o.context === undefined ? ' (it is missing)' : ''}`, HINT);
    if (o.continuation !== undefined) {
      if (o.choices !== undefined || o.answer !== undefined) throw new InputError(`${where}: "continuation" goes without "choices" and "answer"`, HINT);
      if (typeof o.continuation !== 'string' || o.continuation === '') throw new InputError(`${where}: "continuation" must be a non-empty string`, HINT);
      out.push({ context: o.context, choices: [o.continuation], answer: 0, continuation: true, ...extra });
      return;
    }
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
    out.push({ context: o.context, choices, answer, ...extra });
  });
  return out;
}

/** JSON with every object's keys sorted: equal for lines Python would read as equal dicts. */
function sortedJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(sortedJson).join(',')}]`;
  if (v !== null && typeof v === 'object') {
    const o = v as Record<string, unknown>;
    return `{${Object.keys(o).sort().map((k) => `${JSON.stringify(k)}:${sortedJson(o[k])}`).join(',')}}`;
  }
  return JSON.stringify(v);
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

/** Python's str.isspace() characters: what str.rstrip() removes and `\s` matches in a str pattern (U+001C..U+001F among them, not U+FEFF). */
const PY_SPACE = '[\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]+';
const PY_TRAILING_SPACE = new RegExp(`${PY_SPACE}$`, 'u');
const PY_SPACE_RUN = new RegExp(PY_SPACE, 'u');

/** The harness's word count of a text (Task.count_words): len(re.split(r"\s+", text)), empty pieces at the ends counted. */
export function pyWords(text: string): number {
  return text.split(PY_SPACE_RUN).length;
}

/** tokenizer_config.json's special tokens as strings ('' where it has none), e.g. ChatFormat's bosToken / eosToken. */
export interface SpecialTokens { bosToken: string; eosToken: string }

/**
 * Encodes text as lm-evaluation-harness's HF backend does (`HFLM.tok_encode` with its default `add_bos_token=None`):
 * transformers' `tokenizer.encode(text)` with the tokenizer's own special tokens (its post-processor's: Llama 3's
 * `<|begin_of_text|>`, nothing for Qwen), except for text that already starts with the prefix token's text.
 */
export class ChoiceEncoder {
  private prefix: { id: number; text: string } | null | undefined;
  constructor(readonly tok: Tokenizer, private readonly special: SpecialTokens) {}

  /**
   * The harness's `prefix_token_id`, put before an empty context: tokenizer_config.json's bos_token, else its eos_token
   * (else, for a folder without one, the tokenizer's BOS or end-of-text token by name); null when there is none.
   */
  prefixToken(): { id: number; text: string } | null {
    if (this.prefix === undefined) {
      const named = [this.special.bosToken, this.special.eosToken].find((t) => t !== '' && this.tok.tokenToId(t) !== undefined);
      const id = named !== undefined ? this.tok.tokenToId(named)! : this.tok.bosId ?? this.tok.eosId;
      this.prefix = id === undefined ? null : { id, text: this.tok.idToToken(id)! };
    }
    return this.prefix;
  }

  /** transformers' tokenizer.encode(text) (add_special_tokens: the tokenizer's own, unless the text starts with the prefix token's text). */
  encode(text: string, specialTokens = true): number[] {
    const ids = this.tok.encode(text);
    const p = this.prefixToken();
    if (!specialTokens || (p !== null && text.startsWith(p.text))) return ids;
    const { documentPrefix: pre, documentSuffix: suf } = this.tok;
    return pre.length || suf.length ? [...pre, ...ids, ...suf] : ids;
  }

  /**
   * The context's and the continuation's tokens as the harness splits them: an empty context (or one of whitespace
   * alone, which the harness cannot score) is the prefix token, the continuation encoded without special tokens (the
   * prefix taken from its start when it begins with it); otherwise (its `_encode_pair`) trailing whitespace of the
   * context moves to the continuation, and the continuation's tokens are the whole's past the context's.
   */
  pair(context: string, continuation: string, where: string): { ctx: number[]; cont: number[] } {
    const trimmed = context.replace(PY_TRAILING_SPACE, '');
    const cont = context.slice(trimmed.length) + continuation;
    if (trimmed === '') {
      const p = this.prefixToken();
      if (p === null) throw new InputError(`${where}: an empty context needs a token to stand for it, and the tokenizer has no BOS or end-of-text token`, 'give the item a context');
      const ids = this.encode(cont, false);
      return ids[0] === p.id ? { ctx: ids.slice(0, 1), cont: ids.slice(1) } : { ctx: [p.id], cont: ids };
    }
    const whole = this.encode(trimmed + cont);
    const ctx = this.encode(trimmed);
    return { ctx, cont: whole.slice(ctx.length) };
  }
}

/** One (item, choice) pair's tokens, uncut. */
export interface EncodedChoice { item: number; choice: number; ctx: number[]; cont: number[] }

/**
 * Every item's choices encoded: the context (`context(item, index)`, default the item's own; its prompt with a
 * description, examples or a chat template: encodeForModel) and `delimiter + choice` (a continuation item's continuation as written).
 */
export function encodeChoices(enc: ChoiceEncoder, items: readonly ChoiceItem[], delimiter: string,
  context: (it: ChoiceItem, i: number) => string = (it) => it.context, window?: number): EncodedChoice[] {
  const out: EncodedChoice[] = [];
  items.forEach((it, i) => {
    if (it.rolling) {
      if (window === undefined) throw new Error('text items need the rolling window');
      const p = enc.prefixToken();
      if (p === null) throw new InputError(`${it.where}: a text is scored after a token that stands for its start, and the tokenizer has no BOS or end-of-text token`, 'score it as a continuation item with a context instead');
      rollingWindows(enc.encode(it.choices[0]!), p.id, window).forEach(([ctx, cont], w) => out.push({ item: i, choice: w, ctx, cont }));
      return;
    }
    const c = context(it, i);
    it.choices.forEach((ch, k) => {
      // a loglikelihood task's target goes as written (the harness puts target_delimiter before choices only)
      const { ctx, cont } = enc.pair(c, (it.continuation ? '' : delimiter) + ch, it.where);
      if (cont.length === 0) throw new InputError(`${it.where}: ${it.continuation ? 'the continuation' : `choice ${k}`} encodes to no tokens past the context`, 'check its text');
      out.push({ item: i, choice: k, ctx, cont });
    });
  });
  return out;
}

/**
 * The harness's rolling windows of a text's tokens (utils.get_rolling_token_windows with context_len 1, then
 * make_disjoint_window, as HFLM.loglikelihood_rolling calls them): [context, scored tokens] pairs. The first window
 * scores the first `window` tokens after `prefix`; each later one the next `window` (the last: what is left), after as
 * many of the tokens before them as fill the window's inputs (one, but for the last).
 */
export function rollingWindows(tokens: readonly number[], prefix: number, window: number): Array<[number[], number[]]> {
  if (!(Number.isInteger(window) && window >= 1)) throw new Error(`rollingWindows: window ${window}`);
  const out: Array<[number[], number[]]> = [];
  if (tokens.length === 0) return out;
  const first = Math.min(window, tokens.length);
  out.push([[prefix], tokens.slice(0, first)]);
  for (let done = first; done < tokens.length;) {
    const len = Math.min(tokens.length - done, window), end = done + len;
    // inputs tokens[end - window - 1, end - 1), of which the ones before the scored tokens are the context
    out.push([tokens.slice(end - window - 1, end - len), tokens.slice(end - len, end)]);
    done = end;
  }
  return out;
}

/** How an item's context is presented, and the delimiter before each choice. */
export interface ChoicePrompt {
  /** As turns of the chat template with the assistant turn opened (the harness's --apply_chat_template). */
  chat: boolean;
  /** The template's options (--chat-template-kwargs). */
  kwargs?: Record<string, unknown> | undefined;
  /** Default: '' with `chat` (the harness drops its target_delimiter then), else ' '. */
  delimiter?: string | undefined;
  /** Examples before each item (src/eval/fewshot.ts; default none). */
  fewshot?: FewshotOptions | undefined;
  /** With `chat` and examples: the examples and the item as one user turn (default: a turn each, the harness's default). */
  singleTurn?: boolean | undefined;
  /** The rolling windows' length for text items (the harness's max_length; required with text items). */
  rollingWindow?: number | undefined;
  /** Where a warning goes (a template that refused the description's system turn). */
  warn?: ((line: string) => void) | undefined;
}

/**
 * Every item's choices encoded for a model: its tokenizer, and its chat format (tokenizer_config.json's special
 * tokens, and its template with `prompt.chat`). The context is the item's prompt (src/eval/fewshot.ts): its
 * description, its examples and its own context, as text or as the chat template's turns.
 */
export function encodeForModel(tok: Tokenizer, format: ChatFormat, items: readonly ChoiceItem[], prompt: ChoicePrompt): EncodedChoice[] {
  const kwargs = prompt.kwargs;
  // the examples keep the target delimiter in chat mode too (the harness drops it before the scored choice alone)
  const turns = promptTurns(items, prompt.fewshot ?? null, prompt.delimiter ?? ' ');
  const opts = { addGenerationPrompt: true, ...(kwargs ? { kwargs } : {}) };
  let warned = false;
  // as the harness's apply_chat_template: a template that refuses the conversation gets it again without the system turn
  const chat = (i: number): string => {
    const msgs = turnsMessages(turns[i]!, prompt.singleTurn === true);
    try { return renderChat(format, msgs, opts); } catch (e) {
      if (!(e instanceof DistilleryError) || msgs[0]?.role !== 'system') throw e;
      if (!warned) { warned = true; prompt.warn?.(`warning: ${format.from}'s chat template refused a system turn (${e.message.replace(/^.*refused the conversation: /, '')}): the descriptions go without it, as the harness retries`); }
      return renderChat(format, msgs.slice(1), opts);
    }
  };
  return encodeChoices(new ChoiceEncoder(tok, format), items, prompt.delimiter ?? (prompt.chat ? '' : ' '),
    prompt.chat ? (_it, i) => chat(i) : (_it, i) => turnsText(turns[i]!), prompt.rollingWindow);
}

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
      throw new InputError(`${items[item]!.where}: ${items[item]!.continuation ? 'the continuation' : `choice ${choice}`} is ${cont.length} tokens, more than the window (--seq ${seq}) holds`, hint(cont.length));
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

/** Length in characters as Python's len counts them (code points, not UTF-16 units). */
export function pyLen(s: string): number {
  let n = 0;
  for (const _ of s) n++;
  return n;
}

/** The index of the largest value (the first on a tie, and the first NaN if any, as numpy's argmax). */
function argmax(v: readonly number[]): number {
  const nan = v.findIndex((x) => Number.isNaN(x));
  if (nan >= 0) return nan;
  let best = 0;
  for (let i = 1; i < v.length; i++) if (v[i]! > v[best]!) best = i;
  return best;
}

/** Each item's predictions: by log-likelihood, and by log-likelihood per character of the choice (0 for a text item). */
export function predictions(items: readonly ChoiceItem[], logliks: readonly number[][]): Array<{ pred: number; predNorm: number }> {
  return items.map((it, i) => {
    const ll = logliks[i]!;
    if (it.rolling) return { pred: 0, predNorm: 0 };
    return { pred: argmax(ll), predNorm: argmax(ll.map((x, k) => x / pyLen(it.choices[k]!))) };
  });
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
  let mc = 0, acc = 0, accNorm = 0, rows = 0, cont = 0, greedy = 0, llSum = 0, texts = 0, windows = 0, textLl = 0, words = 0, bytes = 0;
  items.forEach((it, i) => {
    rows += scores.ll[i]!.length;
    if (it.rolling) { texts++; windows += scores.ll[i]!.length; textLl += textLoglik(scores.ll[i]!); words += it.rolling.words; bytes += it.rolling.bytes; return; }
    if (it.continuation) { cont++; greedy += scores.greedy[i]![0] ? 1 : 0; llSum += scores.ll[i]![0]!; return; }
    mc++; acc += p[i]!.pred === it.answer ? 1 : 0; accNorm += p[i]!.predNorm === it.answer ? 1 : 0;
  });
  return {
    items: items.length, rows,
    ...(mc ? { acc: acc / mc, accNorm: accNorm / mc } : {}),
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
  const groups = new Map<string, number[]>();
  items.forEach((it, i) => {
    const f = it.file ?? '';
    const g = groups.get(f);
    if (g) g.push(i); else groups.set(f, [i]);
  });
  return [...groups].map(([file, idx]) => ({
    file, ...choiceMetrics(idx.map((i) => items[i]!), { ll: idx.map((i) => scores.ll[i]!), greedy: idx.map((i) => scores.greedy[i]!) }),
  }));
}

/** Scores as the logs say them: acc and acc_norm of multiple-choice items, greedy and perplexity of continuations. */
export function scoresSaid(c: { acc?: number | undefined; accNorm?: number | undefined; greedy?: { acc: number; perplexity: number } | undefined;
  rolling?: { wordPerplexity: number; bitsPerByte: number } | undefined }): string {
  return [
    c.acc !== undefined ? `choices acc ${percent(c.acc)}, acc_norm ${percent(c.accNorm!)}` : '',
    c.greedy ? `continuations greedy ${percent(c.greedy.acc)}, ppl ${c.greedy.perplexity.toFixed(3)}` : '',
    c.rolling ? `texts word ppl ${c.rolling.wordPerplexity.toFixed(3)}, bits/byte ${c.rolling.bitsPerByte.toFixed(4)}` : '',
  ].filter((x) => x).join(', ');
}

/**
 * What the rows are, for a log line: "12 continuations", "3 continuations and 5 text windows", "5 text windows"; and
 * how the contexts meet the chat template (with `chat`: turns where some prompt has a system turn or examples).
 */
export function rowsSaid(items: readonly ChoiceItem[], rows: readonly ChoiceRow[]): string {
  const windows = rows.filter((r) => items[r.item]!.rolling).length, cont = rows.length - windows;
  return [cont || !windows ? `${cont} continuation${cont === 1 ? '' : 's'}` : '', windows ? `${windows} text window${windows === 1 ? '' : 's'}` : ''].filter((x) => x).join(' and ');
}

/** With --choices-chat: how the prompts go to the template ('' when every item is a text, scored as it is). */
export function chatSaid(items: readonly ChoiceItem[], fewshot: number, singleTurn: boolean): string {
  const prompts = items.filter((it) => !it.rolling);
  if (!prompts.length) return '';
  const turns = prompts.some((it) => it.description) || (fewshot > 0 && !singleTurn);
  return ` (contexts as ${turns ? 'turns' : 'a user turn'} of the chat template)`;
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
