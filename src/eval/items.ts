/**
 * The items lm-evaluation-harness-style scoring reads (src/eval/choices.ts scores them), one JSON line each:
 * - `{"context": "...", "choices": ["...", ...], "answer": <index | the choice's text>}`: a multiple-choice item (the
 *   harness's `multiple_choice` tasks: HellaSwag, ARC, PIQA, MMLU);
 * - `{"context": "...", "continuation": "..."}`: a `loglikelihood` item (LAMBADA's), scored as written;
 * - `{"contexts": ["...", ...], "continuation": "...", "answer": <index | the context's text>}`: a multiple-input item
 *   (Winogrande's): the continuation scored after each context, the prediction the context it is likeliest after;
 * - `{"text": "..."}` (no context): a `loglikelihood_rolling` item (wikitext's), scored whole in rolling windows, per
 *   word and per byte (`"words"`, `"bytes"`: the counts, default the harness's);
 * and an optional `"description"` before the context (the harness's task description) and `"gen_prefix"` after it (the
 * harness's gen_prefix: the start of the answer, e.g. Llama 3's "The best answer is"; not on text or multiple-input
 * items). Other keys are ignored, but
 * each line's whole object is kept (sorted) for few-shot sampling's equality. Text is measured as Python measures it:
 * `pyLen` (len: code points), `pyWords` (len(re.split(r"\s+"))), PY_TRAILING_SPACE (str.isspace).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { InputError } from '../util/errors.js';
import { PY_SPACE } from '../util/py-space.js';

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
  /**
   * A multiple-input item (`"contexts"`, the harness's Winogrande kind): `choices` are its contexts, each scored with
   * this one continuation after the delimiter; the prediction is the context under which it is likeliest.
   */
  shared?: string;
  /**
   * A generate_until item (`"target"`): generated, not scored; `choices` holds its first target (a few-shot example's
   * answer, as the harness takes a list's first), `targets` every one exact_match accepts.
   */
  generate?: { targets: string[]; noAnswer?: boolean };
  /** `file:line`, for messages. */
  where: string;
  /** The items file it was read from (per-file metrics). */
  file?: string;
  /** Text before everything else in its prompt (the harness's task description, e.g. MMLU's subject line). */
  description?: string;
  /**
   * The start of the answer after the context (the harness's gen_prefix): an assistant turn the chat template continues,
   * or text after the context; a few-shot example's answer follows its own.
   */
  genPrefix?: string;
  /** Its line's object with the keys sorted: few-shot sampling leaves out the items equal to it, as the harness does. */
  doc?: string;
}

const HINT = 'each line: {"context": "...", "choices": ["...", "..."], "answer": <index or the right choice\'s text>}, {"context": "...", "continuation": "..."}, {"contexts": ["...", "..."], "continuation": "...", "answer": <index or the right context\'s text>}, {"text": "..."}, or {"context": "...", "target": "..."}';

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
    // (null: none, as the harness's None)
    if (o.gen_prefix !== undefined && o.gen_prefix !== null && typeof o.gen_prefix !== 'string') throw new InputError(`${where}: "gen_prefix" must be a string`, 'the start of the answer, e.g. "The best answer is"');
    const textItem = o.text !== undefined && o.context === undefined && o.contexts === undefined;
    if (typeof o.gen_prefix === 'string' && o.gen_prefix !== '' && (textItem || o.contexts !== undefined)) {
      throw new InputError(`${where}: "gen_prefix" goes with a "context" (a multiple-choice, continuation or generation item), not ${textItem ? 'a text item' : 'a multiple-input item'}`, 'drop it from this line');
    }
    const extra = {
      where, file, doc: sortedJson(o), ...(typeof o.description === 'string' && o.description !== '' ? { description: o.description } : {}),
      ...(typeof o.gen_prefix === 'string' && o.gen_prefix !== '' ? { genPrefix: o.gen_prefix } : {}),
    };
    if (o.contexts !== undefined && o.context !== undefined) throw new InputError(`${where}: "contexts" goes without "context"`, 'a line has one context, or a list of them (a multiple-input item)');
    if (o.text !== undefined && o.context === undefined && o.contexts === undefined) {
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
    if (o.contexts !== undefined && o.context === undefined) {
      if (o.choices !== undefined) throw new InputError(`${where}: "contexts" goes without "choices"`, HINT);
      const contexts = options(o.contexts, 'contexts', where);
      if (typeof o.continuation !== 'string' || o.continuation === '') throw new InputError(`${where}: "continuation" must be a non-empty string (what each context is scored with)`, HINT);
      out.push({ context: '', choices: contexts, answer: answerOf(o.answer, contexts, 'context', where), shared: o.continuation, ...extra });
      return;
    }
    if (typeof o.context !== 'string') throw new InputError(`${where}: "context" must be a string${o.context === undefined ? ' (it is missing)' : ''}`, HINT);
    if (o.target !== undefined) {
      const other = ['choices', 'answer', 'continuation'].filter((k) => o[k] !== undefined);
      if (other.length) throw new InputError(`${where}: "target" goes without ${other.map((k) => `"${k}"`).join(', ')}`, HINT);
      const targets = typeof o.target === 'string' ? [o.target] : o.target;
      if (!Array.isArray(targets) || targets.length === 0 || !targets.every((t) => typeof t === 'string')) {
        throw new InputError(`${where}: "target" must be a string or a non-empty list of strings`, 'what the filtered answer is compared with (a list: any of them)');
      }
      // an empty string (not a list) is no answer to the harness: as an example, its context alone
      out.push({ context: o.context, choices: [targets[0] as string], answer: 0, generate: { targets: targets as string[], ...(o.target === '' ? { noAnswer: true } : {}) }, ...extra });
      return;
    }
    if (o.continuation !== undefined) {
      if (o.choices !== undefined || o.answer !== undefined) throw new InputError(`${where}: "continuation" goes without "choices" and "answer"`, HINT);
      if (typeof o.continuation !== 'string' || o.continuation === '') throw new InputError(`${where}: "continuation" must be a non-empty string`, HINT);
      out.push({ context: o.context, choices: [o.continuation], answer: 0, continuation: true, ...extra });
      return;
    }
    const choices = options(o.choices, 'choices', where);
    out.push({ context: o.context, choices, answer: answerOf(o.answer, choices, 'choice', where), ...extra });
  });
  return out;
}

/** An item's options ("choices" or "contexts"): at least two non-empty strings. */
function options(v: unknown, key: 'choices' | 'contexts', where: string): string[] {
  if (!Array.isArray(v) || v.length < 2 || !v.every((c) => typeof c === 'string')) throw new InputError(`${where}: "${key}" must be a list of at least two strings`, HINT);
  const empty = (v as string[]).findIndex((c) => c === '');
  if (empty >= 0) throw new InputError(`${where}: ${key === 'choices' ? 'choice' : 'context'} ${empty} is empty`, `every ${key === 'choices' ? 'choice' : 'context'} needs text to score`);
  return v as string[];
}

/** The right option's index, from "answer" as an index or as the option's exact text. */
function answerOf(a: unknown, opts: readonly string[], what: 'choice' | 'context', where: string): number {
  if (typeof a === 'number') {
    if (!Number.isInteger(a) || a < 0 || a >= opts.length) throw new InputError(`${where}: "answer" ${a} is not the index of a ${what} (0 to ${opts.length - 1})`, HINT);
    return a;
  }
  if (typeof a === 'string') {
    const i = opts.indexOf(a);
    if (i < 0) throw new InputError(`${where}: "answer" ${JSON.stringify(a)} is none of the ${what}s`, `give the right ${what}'s index, or its exact text`);
    return i;
  }
  throw new InputError(`${where}: "answer" must be a ${what}'s index or text${a === undefined ? ' (it is missing)' : ''}`, HINT);
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
    // a file is one task, and a harness task has one output type: generation items go in files of their own
    const gen = got.find((it) => it.generate), other = got.find((it) => !it.generate);
    if (gen && other) throw new InputError(`${f} mixes generation items ("target", e.g. ${gen.where}) with scored ones (${other.where})`, 'put the generation items in a file of their own: each file is a task');
    items.push(...got);
  }
  return items;
}

/** The items' indices grouped by the file each came from (a task), the files in the order they first appear. */
export function itemsByFile(items: readonly ChoiceItem[]): Array<{ file: string; idx: number[] }> {
  const groups = new Map<string, number[]>();
  items.forEach((it, i) => {
    const f = it.file ?? '';
    const g = groups.get(f);
    if (g) g.push(i); else groups.set(f, [i]);
  });
  return [...groups].map(([file, idx]) => ({ file, idx }));
}

/** The first items file named twice (the same path however written), or undefined: each file is a task of its own. */
export function repeatedFile(files: readonly string[]): string | undefined {
  return files.find((f, i) => files.findIndex((g) => path.resolve(g) === path.resolve(f)) !== i);
}

export const REPEATED_FILE_HINT = 'give each items file once (each is a task, with its own metrics and examples)';

/**
 * Why `examples` few-shot files do not pair with `items` items files (one per items file, in their order), or null;
 * the flags name them in the message.
 */
export function examplesPairing(examples: number, items: number, examplesFlag: string, itemsFlag: string): { message: string; hint: string } | null {
  if (examples === items) return null;
  return {
    message: `${examples} ${examplesFlag} file${examples === 1 ? '' : 's'} for ${items} ${itemsFlag} file${items === 1 ? '' : 's'}`,
    hint: `give one examples file per ${itemsFlag} file, in the same order, or none (each file's own items are its examples)`,
  };
}

export const PY_TRAILING_SPACE = new RegExp(`${PY_SPACE}$`, 'u');
const PY_SPACE_RUN = new RegExp(PY_SPACE, 'u');
const PY_SPACE_ONE = new RegExp(`^${PY_SPACE}$`, 'u');

/** Python's `ch.isspace()` for one character. */
export function pyIsSpace(ch: string): boolean {
  return PY_SPACE_ONE.test(ch);
}

/** The harness's word count of a text (Task.count_words): len(re.split(r"\s+", text)), empty pieces at the ends counted. */
export function pyWords(text: string): number {
  return text.split(PY_SPACE_RUN).length;
}

/** Length in characters as Python's len counts them (code points, not UTF-16 units). */
export function pyLen(s: string): number {
  let n = 0;
  for (const _ of s) n++;
  return n;
}

/**
 * The first `limit` items of each file (below 1: that fraction of each, rounded up), in the items' order: the
 * harness's --limit (eval --limit, a run's --eval-limit).
 */
export function limitItems(items: readonly ChoiceItem[], limit: number): ChoiceItem[] {
  return itemsByFile(items).flatMap(({ idx }) => idx.slice(0, limit < 1 ? Math.ceil(idx.length * limit) : limit).map((i) => items[i]!));
}

/** A --limit's value is a whole number of items or a fraction between 0 and 1 (null), else what it must be. */
export function limitProblem(limit: number): string | null {
  return limit > 0 && (limit < 1 || Number.isSafeInteger(limit)) ? null : 'a whole number of items or a fraction between 0 and 1';
}
