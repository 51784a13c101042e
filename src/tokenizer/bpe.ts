/**
 * Byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json` (GPT-2, Qwen2/2.5/3, Llama 3 style).
 *
 * Pipeline, as in the Rust `tokenizers` crate:
 *   1. added tokens (e.g. `<|im_start|>`) are split out first, leftmost-longest; with `allowSpecial: false` only the
 *      non-special added tokens are matched and special ones are encoded as plain text;
 *   2. the normalizer (NFC / NFD / NFKC / NFKD / Lowercase, or a Sequence of them) runs on the remaining text;
 *   3. the pre-tokenizer splits it: `Split` with the file's regex (translated from Oniguruma, see regex.ts),
 *      `ByteLevel` (with `use_regex` it splits with the GPT-2 pattern; `add_prefix_space` prepends a space),
 *      `Digits`, or a `Sequence` of these;
 *   4. each piece becomes UTF-8 bytes, each byte one initial token, and merges are applied lowest rank first
 *      (`ignore_merges`: a piece that is itself in the vocabulary is emitted whole).
 * Encoding never adds BOS/EOS (the post-processor is not applied); callers append EOS where they need one.
 * Decoding maps byte-level tokens back to bytes and decodes UTF-8 (invalid sequences become U+FFFD); ids with no
 * token are skipped.
 *
 * Speed: merges are looked up in a Map keyed by the numeric id pair, and encoded pieces are cached per tokenizer.
 */
import * as fs from 'node:fs';
import { DistilleryError, InputError } from '../util/errors.js';
import { compileOnigRegex } from './regex.js';

type Json = Record<string, unknown>;

/** Pre-tokens longer than this (bytes) take the heap-based BPE (bpeLong); shorter ones the simple passes. */
const LONG_PIECE = 64;

/** A combining mark (general category M): it may compose with the character before it. */
const MARK = /^\p{M}$/u;

/** The GPT-2 pre-tokenization pattern used by ByteLevel with use_regex: true. */
export const GPT2_PATTERN = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/** GPT-2's reversible byte → printable character map (bytes 0..255 → BMP characters). */
export const BYTE_TO_CHAR: readonly string[] = (() => {
  const bs: number[] = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) { bs.push(b); cs.push(256 + n); n++; }
  }
  const out = new Array<string>(256);
  for (let i = 0; i < 256; i++) out[bs[i]!] = String.fromCharCode(cs[i]!);
  return out;
})();

const CHAR_TO_BYTE = (() => {
  const m = new Int16Array(512).fill(-1);
  BYTE_TO_CHAR.forEach((ch, b) => { m[ch.charCodeAt(0)] = b; });
  return m;
})();

/** Maps a string's UTF-8 bytes to GPT-2 byte-level characters. */
export function toByteLevel(s: string): string {
  const bytes = Buffer.from(s, 'utf8');
  let out = '';
  for (const b of bytes) out += BYTE_TO_CHAR[b];
  return out;
}

export interface EncodeOptions {
  /** Match special added tokens (e.g. `<|im_start|>`) in the text (default true). */
  allowSpecial?: boolean;
}

export interface DecodeOptions {
  /** Leave special added tokens out of the text (default false). */
  skipSpecialTokens?: boolean;
}

interface AddedToken {
  id: number;
  content: string;
  special: boolean;
  lstrip: boolean;
  rstrip: boolean;
}

type PreStep =
  | { kind: 'split'; re: RegExp; behavior: 'Isolated' | 'Removed' | 'MergedWithPrevious' | 'MergedWithNext'; invert: boolean }
  | { kind: 'splitString'; s: string; behavior: 'Isolated' | 'Removed' }
  | { kind: 'prefixSpace' }
  | { kind: 'digits'; individual: boolean };

type Norm = (s: string) => string;

function bad(msg: string, hint = 'distillery supports byte-level BPE tokenizer.json files (GPT-2, Qwen2, Llama 3 style)'): never {
  throw new DistilleryError(`tokenizer.json: ${msg}`, hint);
}

function parseNormalizer(n: unknown): Norm[] {
  if (n === null || n === undefined) return [];
  const o = n as Json;
  switch (o.type) {
    case 'NFC': case 'NFD': case 'NFKC': case 'NFKD': {
      const form = o.type;
      return [(s) => s.normalize(form)];
    }
    case 'Lowercase': return [(s) => s.toLowerCase()];
    case 'Sequence': return ((o.normalizers as unknown[]) ?? []).flatMap(parseNormalizer);
    default: return bad(`unsupported normalizer ${JSON.stringify(o.type)}`);
  }
}

function parsePattern(p: unknown): { regex: string } | { string: string } {
  const o = p as Json;
  if (o && typeof o.Regex === 'string') return { regex: o.Regex };
  if (o && typeof o.String === 'string') return { string: o.String };
  return bad(`unsupported Split pattern ${JSON.stringify(p)}`);
}

function parsePreTokenizer(p: unknown, out: { steps: PreStep[]; byteLevel: boolean }): void {
  if (p === null || p === undefined) return;
  const o = p as Json;
  switch (o.type) {
    case 'Sequence':
      for (const q of (o.pretokenizers as unknown[]) ?? []) parsePreTokenizer(q, out);
      return;
    case 'Split': {
      const pat = parsePattern(o.pattern);
      const behavior = String(o.behavior ?? 'Isolated');
      const invert = Boolean(o.invert);
      if ('regex' in pat) {
        if (!['Isolated', 'Removed', 'MergedWithPrevious', 'MergedWithNext'].includes(behavior)) bad(`unsupported Split behavior ${behavior}`);
        out.steps.push({ kind: 'split', re: compileOnigRegex(pat.regex), behavior: behavior as 'Isolated', invert });
      } else {
        if (invert || !['Isolated', 'Removed'].includes(behavior)) bad(`unsupported string Split behavior ${behavior}`);
        out.steps.push({ kind: 'splitString', s: pat.string, behavior: behavior as 'Isolated' });
      }
      return;
    }
    case 'ByteLevel':
      out.byteLevel = true;
      if (o.add_prefix_space) out.steps.push({ kind: 'prefixSpace' });
      if (o.use_regex !== false) {
        out.steps.push({ kind: 'split', re: compileOnigRegex(GPT2_PATTERN), behavior: 'Isolated', invert: false });
      }
      return;
    case 'Digits':
      out.steps.push({ kind: 'digits', individual: Boolean(o.individual_digits) });
      return;
    default:
      bad(`unsupported pre-tokenizer ${JSON.stringify(o.type)}`);
  }
}

function applyStep(step: PreStep, piece: string, out: string[]): void {
  switch (step.kind) {
    case 'prefixSpace':
      out.push(piece.startsWith(' ') ? piece : ' ' + piece);
      return;
    case 'digits': {
      const re = step.individual ? /\p{N}|[^\p{N}]+/gu : /\p{N}+|[^\p{N}]+/gu;
      for (const m of piece.matchAll(re)) out.push(m[0]);
      return;
    }
    case 'splitString': {
      if (step.s === '') { out.push(piece); return; }
      const parts = piece.split(step.s);
      parts.forEach((p, i) => {
        if (p) out.push(p);
        if (i < parts.length - 1 && step.behavior === 'Isolated') out.push(step.s);
      });
      return;
    }
    case 'split': {
      // Pieces: alternating gaps (not matched) and matches, per behaviour; invert swaps the two roles.
      const segs: Array<{ s: string; match: boolean }> = [];
      let last = 0;
      step.re.lastIndex = 0;
      for (const m of piece.matchAll(step.re)) {
        if (m[0] === '') continue;
        if (m.index > last) segs.push({ s: piece.slice(last, m.index), match: false });
        segs.push({ s: m[0], match: true });
        last = m.index + m[0].length;
      }
      if (last < piece.length) segs.push({ s: piece.slice(last), match: false });
      if (step.invert) for (const g of segs) g.match = !g.match;
      if (step.behavior === 'Isolated') { for (const g of segs) out.push(g.s); return; }
      if (step.behavior === 'Removed') { for (const g of segs) if (!g.match) out.push(g.s); return; }
      if (step.behavior === 'MergedWithPrevious') {
        const res: string[] = [];
        for (const g of segs) {
          if (g.match && res.length) res[res.length - 1] += g.s;
          else res.push(g.s);
        }
        out.push(...res);
        return;
      }
      // MergedWithNext
      let pending = '';
      for (const g of segs) {
        if (g.match) pending += g.s;
        else { out.push(pending + g.s); pending = ''; }
      }
      if (pending) out.push(pending);
      return;
    }
  }
}

function escapeRegex(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\/-]/g, '\\$&');
}

/** Key of an ordered id pair in the merge map (ids stay well below 2^21). */
function pairKey(a: number, b: number): number {
  return a * 2097152 + b;
}

/**
 * The special tokens a post-processor's TemplateProcessing puts before and after sequence A of its `single` template
 * (found alone or inside a Sequence of processors); none for the other processors (ByteLevel, absent). A token the
 * template names that the vocabulary lacks is an error.
 */
function singleTemplate(pp: unknown, idOf: (t: string) => number | undefined): { prefix: number[]; suffix: number[] } {
  const none = { prefix: [], suffix: [] };
  if (!pp || typeof pp !== 'object') return none;
  const p = pp as Json;
  if (p.type === 'Sequence' && Array.isArray(p.processors)) {
    for (const q of p.processors as unknown[]) {
      const r = singleTemplate(q, idOf);
      if (r.prefix.length || r.suffix.length) return r;
    }
    return none;
  }
  if (p.type !== 'TemplateProcessing' || !Array.isArray(p.single)) return none;
  const prefix: number[] = [], suffix: number[] = [];
  let seen = false;
  for (const piece of p.single as Json[]) {
    if (piece && typeof piece === 'object' && 'Sequence' in piece) { seen = true; continue; }
    const sp = piece && typeof piece === 'object' ? (piece.SpecialToken as Json | undefined) : undefined;
    if (!sp || typeof sp.id !== 'string') continue;
    // the template names a key of special_tokens, whose `ids` are the tokens (else the vocabulary's token of that name)
    const entry = (p.special_tokens as Record<string, Json> | undefined)?.[sp.id];
    const listed = Array.isArray(entry?.ids) ? (entry.ids as unknown[]) : null;
    const ids = listed ?? [idOf(sp.id)];
    if (ids.some((id) => !Number.isInteger(id))) bad(`post_processor: the special token ${JSON.stringify(sp.id)} of its template is not in the vocabulary`);
    (seen ? suffix : prefix).push(...(ids as number[]));
  }
  return { prefix, suffix };
}

export class Tokenizer {
  private readonly json: Json;
  private readonly vocab = new Map<string, number>();
  private readonly idTokens: Array<string | undefined> = [];
  /** pairKey(a, b) → merge rank. */
  private readonly mergeRank = new Map<number, number>();
  /** rank → id of the merged token. */
  private readonly mergeResult: Int32Array;
  private readonly byteIds = new Int32Array(256);
  private readonly ignoreMerges: boolean;
  private readonly norms: Norm[];
  private readonly steps: PreStep[];
  private readonly added: AddedToken[];
  private readonly addedById = new Map<number, AddedToken>();
  private readonly addedReAll: RegExp | null;
  private readonly addedReNonSpecial: RegExp | null;
  private readonly cache = new Map<string, number[]>();
  /** Max id + 1 over the BPE vocabulary and the added tokens. */
  readonly vocabSize: number;
  /** Number of entries in the BPE model's vocabulary (without added tokens). */
  readonly bpeVocabSize: number;
  readonly eosId: number | undefined;
  readonly padId: number | undefined;
  readonly bosId: number | undefined;
  /**
   * The special tokens the tokenizer's post-processor puts around one sequence (a TemplateProcessing `single`
   * template, alone or in a Sequence): Llama 3's <|begin_of_text|> before it; none for Qwen's (ByteLevel only).
   * transformers' `tokenizer(text)` adds them (add_special_tokens=True), and TRL tokenizes text examples that way.
   */
  readonly documentPrefix: readonly number[];
  readonly documentSuffix: readonly number[];

  private constructor(json: Json) {
    this.json = json;
    const model = json.model as Json | undefined;
    if (!model || typeof model !== 'object') bad('no "model" section');
    if (model.type !== undefined && model.type !== 'BPE') bad(`model type ${JSON.stringify(model.type)} is not BPE`);
    const vocab = model.vocab as Record<string, number> | undefined;
    if (!vocab || typeof vocab !== 'object' || Array.isArray(vocab)) bad('model.vocab is missing or not an object');
    if (model.continuing_subword_prefix || model.end_of_word_suffix) bad('continuing_subword_prefix / end_of_word_suffix are not supported');
    if (model.byte_fallback) bad('byte_fallback (SentencePiece-style BPE) is not supported');
    let maxId = -1;
    for (const [tok, id] of Object.entries(vocab)) {
      if (!Number.isInteger(id) || id < 0) bad(`vocab entry ${JSON.stringify(tok)} has invalid id ${JSON.stringify(id)}`);
      this.vocab.set(tok, id);
      this.idTokens[id] = tok;
      if (id > maxId) maxId = id;
    }
    this.bpeVocabSize = this.vocab.size;
    for (let b = 0; b < 256; b++) {
      const id = this.vocab.get(BYTE_TO_CHAR[b]!);
      if (id === undefined) bad(`byte token ${JSON.stringify(BYTE_TO_CHAR[b])} (byte ${b}) is missing from the vocab`, 'only byte-level BPE vocabularies (all 256 byte tokens present) are supported');
      this.byteIds[b] = id;
    }
    const merges = (model.merges as unknown[]) ?? [];
    if (!Array.isArray(merges)) bad('model.merges is not an array');
    this.mergeResult = new Int32Array(merges.length);
    merges.forEach((m, rank) => {
      let a: string, b: string;
      if (typeof m === 'string') {
        const sp = m.indexOf(' ', 1);
        if (sp < 0) bad(`merge ${rank} ${JSON.stringify(m)} is not "left right"`);
        a = m.slice(0, sp); b = m.slice(sp + 1);
      } else if (Array.isArray(m) && m.length === 2 && typeof m[0] === 'string' && typeof m[1] === 'string') {
        [a, b] = m as [string, string];
      } else {
        return bad(`merge ${rank} ${JSON.stringify(m)} is neither "a b" nor ["a", "b"]`);
      }
      const ia = this.vocab.get(a), ib = this.vocab.get(b), ir = this.vocab.get(a + b);
      if (ia === undefined || ib === undefined || ir === undefined) bad(`merge ${rank} (${JSON.stringify(a)}, ${JSON.stringify(b)}) uses a token that is not in the vocab`);
      const k = pairKey(ia, ib);
      if (!this.mergeRank.has(k)) this.mergeRank.set(k, rank);
      this.mergeResult[rank] = ir;
    });
    this.ignoreMerges = Boolean(model.ignore_merges);
    this.norms = parseNormalizer(json.normalizer);
    const pre = { steps: [] as PreStep[], byteLevel: false };
    parsePreTokenizer(json.pre_tokenizer, pre);
    if (!pre.byteLevel) bad('the pre-tokenizer is not ByteLevel (or a Sequence containing ByteLevel)');
    this.steps = pre.steps;

    this.added = [];
    for (const t of (json.added_tokens as Json[] | undefined) ?? []) {
      const id = t.id as number, content = t.content as string;
      if (!Number.isInteger(id) || id < 0 || typeof content !== 'string' || content === '') bad(`invalid added token ${JSON.stringify(t)}`);
      const at: AddedToken = { id, content, special: Boolean(t.special), lstrip: Boolean(t.lstrip), rstrip: Boolean(t.rstrip) };
      this.added.push(at);
      this.addedById.set(id, at);
      this.vocab.set(content, id);
      this.idTokens[id] = content;
      if (id > maxId) maxId = id;
    }
    this.addedReAll = this.buildAddedRe(this.added);
    this.addedReNonSpecial = this.buildAddedRe(this.added.filter((t) => !t.special));
    this.vocabSize = maxId + 1;
    const find = (names: string[]): number | undefined => {
      for (const n of names) { const id = this.vocab.get(n); if (id !== undefined && this.addedById.has(id)) return id; }
      return undefined;
    };
    this.eosId = find(['<|endoftext|>', '<|end_of_text|>', '</s>', '<eos>', '<|eot_id|>']);
    this.padId = find(['<|endoftext|>', '<pad>', '<|pad|>', '<|finetune_right_pad_id|>']) ?? this.eosId;
    this.bosId = find(['<|begin_of_text|>', '<s>', '<bos>']);
    const around = singleTemplate(json.post_processor, (t) => this.vocab.get(t));
    this.documentPrefix = around.prefix;
    this.documentSuffix = around.suffix;
  }

  /** A document's ids as transformers' `tokenizer(text)` gives them: encode() inside the post-processor's special tokens. */
  encodeDocument(text: string): number[] {
    const ids = this.encode(text);
    return this.documentPrefix.length || this.documentSuffix.length ? [...this.documentPrefix, ...ids, ...this.documentSuffix] : ids;
  }

  private buildAddedRe(tokens: AddedToken[]): RegExp | null {
    if (tokens.length === 0) return null;
    const sorted = tokens.slice().sort((a, b) => b.content.length - a.content.length);
    const alts = sorted.map((t) => `${t.lstrip ? '\\s*' : ''}(${escapeRegex(t.content)})${t.rstrip ? '\\s*' : ''}`);
    return new RegExp(alts.join('|'), 'gu');
  }

  /** Builds a tokenizer from a parsed tokenizer.json object. */
  static fromJSON(obj: unknown): Tokenizer {
    if (typeof obj !== 'object' || obj === null || Array.isArray(obj)) bad('not a JSON object');
    return new Tokenizer(obj as Json);
  }

  /** Loads a tokenizer.json file (or the tokenizer.json inside a model folder). */
  static fromFile(file: string): Tokenizer {
    let p = file;
    if (fs.existsSync(p) && fs.statSync(p).isDirectory()) p = `${p}/tokenizer.json`;
    if (!fs.existsSync(p)) throw new InputError(`${p}: no such tokenizer file`, 'pass a tokenizer.json file or a model folder containing one');
    let j: unknown;
    try {
      j = JSON.parse(fs.readFileSync(p, 'utf8'));
    } catch (e) {
      throw new DistilleryError(`${p}: not valid JSON (${(e as Error).message})`, 'the file is corrupt; re-download it');
    }
    try {
      return Tokenizer.fromJSON(j);
    } catch (e) {
      if (e instanceof DistilleryError) throw new DistilleryError(`${p}: ${e.message}`, e.hint);
      throw e;
    }
  }

  /** The HF-compatible tokenizer.json object (a copy). */
  toJSON(): Json {
    return structuredClone(this.json);
  }

  /** The parsed tokenizer.json object itself (no copy: do not modify it). For identity checks (identity.ts). */
  sourceJson(): Readonly<Json> {
    return this.json;
  }

  tokenToId(token: string): number | undefined {
    return this.vocab.get(token);
  }

  idToToken(id: number): string | undefined {
    return this.idTokens[id];
  }

  /** True when id is an added token marked special. */
  isSpecial(id: number): boolean {
    return this.addedById.get(id)?.special ?? false;
  }

  /** Added tokens (id, content, special), in file order. */
  addedTokens(): Array<{ id: number; content: string; special: boolean }> {
    return this.added.map((t) => ({ id: t.id, content: t.content, special: t.special }));
  }

  encode(text: string, opts: EncodeOptions = {}): number[] {
    const out: number[] = [];
    const re = opts.allowSpecial === false ? this.addedReNonSpecial : this.addedReAll;
    if (!re) { this.encodeOrdinary(text, out); return out; }
    let last = 0;
    re.lastIndex = 0;
    for (const m of text.matchAll(re)) {
      if (m.index > last) this.encodeOrdinary(text.slice(last, m.index), out);
      let content: string | undefined;
      for (let g = 1; g < m.length; g++) if (m[g] !== undefined) { content = m[g]; break; }
      out.push(this.vocab.get(content!)!);
      last = m.index + m[0].length;
    }
    if (last < text.length) this.encodeOrdinary(text.slice(last), out);
    return out;
  }

  /** Encodes text with no added-token matching (normalize, pre-tokenize, BPE). */
  private encodeOrdinary(text: string, out: number[]): void {
    for (const p of this.pieces(text)) { const ids = this.pieceIds(p); for (let i = 0; i < ids.length; i++) out.push(ids[i]!); }
  }

  /** The pre-tokens of text: normalized, then split by the pre-tokenizer steps (empty pieces dropped). */
  private pieces(text: string): string[] {
    for (const f of this.norms) text = f(text);
    return this.preTokens(text);
  }

  /** The pre-tokens of already normalized text. */
  private preTokens(text: string): string[] {
    let pieces = [text];
    for (const step of this.steps) {
      const next: string[] = [];
      for (const p of pieces) applyStep(step, p, next);
      pieces = next;
    }
    return pieces.filter((p) => p !== '');
  }

  /**
   * The normalized text with, per character of it, the [from, to) of the original characters it comes from. The text
   * is normalized cluster by cluster (a character with the combining marks and Hangul vowel and final jamo after it:
   * what canonical composition can join); where that differs from normalizing the whole text (a context-dependent
   * lowercase), the whole text is one cluster. Characters a cluster keeps as they were map to themselves.
   */
  private normalizeAligned(text: string): { text: string; from: Int32Array; to: Int32Array } {
    const whole = this.norms.reduce((t, f) => f(t), text);
    if (whole === text) { // nothing changed: every character maps to itself
      const self = Int32Array.from({ length: text.length }, (_, i) => i);
      return { text, from: self, to: self.map((i) => i + 1) };
    }
    const out: string[] = [], from: number[] = [], to: number[] = [];
    const cluster = (a: number, b: number): void => {
      const c = text.slice(a, b), n = this.norms.reduce((t, f) => f(t), c);
      out.push(n);
      for (let i = 0; i < n.length; i++) {
        if (n === c) { from.push(a + i); to.push(a + i + 1); } else { from.push(a); to.push(b); }
      }
    };
    let start = 0;
    for (let i = 0; i < text.length;) {
      const cp = text.codePointAt(i)!, w = cp > 0xffff ? 2 : 1;
      const joins = i > 0 && (MARK.test(String.fromCodePoint(cp)) || (cp >= 0x1160 && cp <= 0x11ff) || (cp >= 0xd7b0 && cp <= 0xd7ff));
      if (!joins && i > start) { cluster(start, i); start = i; }
      i += w;
    }
    if (text.length > start) cluster(start, text.length);
    if (out.join('') !== whole) return { text: whole, from: new Int32Array(whole.length), to: new Int32Array(whole.length).fill(text.length) };
    return { text: whole, from: Int32Array.from(from), to: Int32Array.from(to) };
  }

  /** The ids of one pre-token (cached). */
  private pieceIds(p: string): number[] {
    let ids = this.cache.get(p);
    if (!ids) {
      ids = this.bpe(p);
      if (this.cache.size >= 100_000) this.cache.clear();
      this.cache.set(p, ids);
    }
    return ids;
  }

  /**
   * encode() with each token's [start, end) range in `text` (UTF-16 indices): an added token covers its match; a BPE
   * token covers the characters its bytes belong to (a token holding part of a multi-byte character covers that whole
   * character). The ids are encode()'s. Where the normalizer changes a run of text, or the pre-tokens do not spell it
   * back, every token of that run gets the whole run's range.
   */
  encodeWithOffsets(text: string, opts: EncodeOptions = {}): { ids: number[]; offsets: Array<[number, number]> } {
    const ids: number[] = [], offsets: Array<[number, number]> = [];
    const ordinary = (orig: string, base0: number): void => {
      // the normalized text, and where each of its characters comes from (a character the normalizer changed maps to
      // its whole cluster: a base character and the marks composed with it)
      const al = this.normalizeAligned(orig);
      const seg = al.text;
      const pieces = this.preTokens(seg);
      const n0 = ids.length;
      for (const p of pieces) { const pi = this.pieceIds(p); for (let i = 0; i < pi.length; i++) ids.push(pi[i]!); }
      let pos = 0;
      const mapped: Array<[number, number]> = [];
      for (const p of pieces) {
        if (!seg.startsWith(p, pos)) break;
        // byte → character index within the piece
        const bytes = Buffer.byteLength(p, 'utf8');
        const charOf = new Int32Array(bytes + 1);
        let b = 0;
        for (let c = 0; c < p.length;) {
          const cp = p.codePointAt(c)!;
          const len = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
          for (let k = 0; k < len; k++) charOf[b + k] = c;
          b += len;
          c += cp > 0xffff ? 2 : 1;
        }
        charOf[bytes] = p.length;
        const endOf = (byteEnd: number): number => { // the character after the one holding byte byteEnd − 1
          const c = charOf[byteEnd - 1]!;
          return c + (p.codePointAt(c)! > 0xffff ? 2 : 1);
        };
        let at = 0;
        for (const id of this.pieceIds(p)) {
          const n = this.idTokens[id]?.length ?? 0; // byte-level: one vocabulary character per byte
          const a = pos + charOf[at]!, e = pos + endOf(Math.min(bytes, at + Math.max(n, 1)));
          mapped.push([base0 + al.from[a]!, base0 + al.to[e - 1]!]);
          at += n;
        }
        if (at !== bytes) { mapped.length = 0; break; }
        pos += p.length;
      }
      if (mapped.length === ids.length - n0) offsets.push(...mapped);
      else for (let i = n0; i < ids.length; i++) offsets.push([base0, base0 + orig.length]);
    };
    const re = opts.allowSpecial === false ? this.addedReNonSpecial : this.addedReAll;
    let last = 0;
    if (re) {
      re.lastIndex = 0;
      for (const m of text.matchAll(re)) {
        if (m.index > last) ordinary(text.slice(last, m.index), last);
        let content: string | undefined;
        for (let g = 1; g < m.length; g++) if (m[g] !== undefined) { content = m[g]; break; }
        ids.push(this.vocab.get(content!)!);
        offsets.push([m.index, m.index + m[0].length]);
        last = m.index + m[0].length;
      }
    }
    if (last < text.length) ordinary(text.slice(last), last);
    return { ids, offsets };
  }

  /** BPE of one pre-token. */
  private bpe(piece: string): number[] {
    const bytes = Buffer.from(piece, 'utf8');
    if (this.ignoreMerges) {
      let bl = '';
      for (const b of bytes) bl += BYTE_TO_CHAR[b];
      const whole = this.vocab.get(bl);
      if (whole !== undefined && !this.addedById.has(whole)) return [whole];
    }
    if (bytes.length > LONG_PIECE) return this.bpeLong(bytes);
    let syms: number[] = new Array<number>(bytes.length);
    for (let i = 0; i < bytes.length; i++) syms[i] = this.byteIds[bytes[i]!]!;
    while (syms.length > 1) {
      let best = Infinity;
      let bestA = -1, bestB = -1;
      for (let i = 0; i + 1 < syms.length; i++) {
        const r = this.mergeRank.get(pairKey(syms[i]!, syms[i + 1]!));
        if (r !== undefined && r < best) { best = r; bestA = syms[i]!; bestB = syms[i + 1]!; }
      }
      if (best === Infinity) break;
      const merged = this.mergeResult[best]!;
      const next: number[] = [];
      for (let i = 0; i < syms.length; i++) {
        if (i + 1 < syms.length && syms[i] === bestA && syms[i + 1] === bestB) { next.push(merged); i++; }
        else next.push(syms[i]!);
      }
      syms = next;
    }
    return syms;
  }

  /**
   * bpe() of a long pre-token (a run of letters in a DNA file, base64, minified code) in O(n log n): the symbols in a
   * linked list, the candidate merges in a heap by (rank, position). Popping the lowest rank, leftmost first, and
   * skipping candidates whose symbols have since changed merges exactly what bpe()'s passes merge (each pass applies
   * the lowest-ranked merge at every position, left to right; a merge's result only enters merges ranked after it).
   */
  private bpeLong(bytes: Buffer): number[] {
    const n = bytes.length;
    const sym = new Int32Array(n), next = new Int32Array(n), prev = new Int32Array(n);
    for (let i = 0; i < n; i++) { sym[i] = this.byteIds[bytes[i]!]!; next[i] = i + 1; prev[i] = i - 1; }
    next[n - 1] = -1;
    // heap entries: rank, position, and the two symbols they were made from (to tell a stale entry)
    const hr: number[] = [], hp: number[] = [], ha: number[] = [], hb: number[] = [];
    const less = (i: number, j: number): boolean => hr[i]! < hr[j]! || (hr[i] === hr[j] && hp[i]! < hp[j]!);
    const swap = (i: number, j: number): void => {
      [hr[i], hr[j]] = [hr[j]!, hr[i]!]; [hp[i], hp[j]] = [hp[j]!, hp[i]!]; [ha[i], ha[j]] = [ha[j]!, ha[i]!]; [hb[i], hb[j]] = [hb[j]!, hb[i]!];
    };
    const push = (pos: number): void => {
      const q = next[pos]!;
      if (pos < 0 || q < 0) return;
      const r = this.mergeRank.get(pairKey(sym[pos]!, sym[q]!));
      if (r === undefined) return;
      hr.push(r); hp.push(pos); ha.push(sym[pos]!); hb.push(sym[q]!);
      for (let i = hr.length - 1; i > 0;) { const p = (i - 1) >> 1; if (!less(i, p)) break; swap(i, p); i = p; }
    };
    const pop = (): void => {
      const last = hr.length - 1;
      swap(0, last); hr.pop(); hp.pop(); ha.pop(); hb.pop();
      for (let i = 0; ;) {
        const l = 2 * i + 1, r = l + 1;
        let m = i;
        if (l < hr.length && less(l, m)) m = l;
        if (r < hr.length && less(r, m)) m = r;
        if (m === i) break;
        swap(i, m); i = m;
      }
    };
    const alive = new Uint8Array(n).fill(1);
    for (let i = 0; i + 1 < n; i++) push(i);
    while (hr.length > 0) {
      const rank = hr[0]!, pos = hp[0]!, a = ha[0]!, b = hb[0]!;
      pop();
      const q = next[pos]!;
      if (!alive[pos] || q < 0 || sym[pos] !== a || sym[q] !== b) continue; // stale
      sym[pos] = this.mergeResult[rank]!;
      alive[q] = 0;
      next[pos] = next[q]!;
      if (next[q]! >= 0) prev[next[q]!] = pos;
      push(prev[pos]!);
      push(pos);
    }
    const out: number[] = [];
    for (let i = 0; i >= 0; i = next[i]!) out.push(sym[i]!);
    return out;
  }

  decode(ids: ArrayLike<number>, opts: DecodeOptions = {}): string {
    let out = '';
    let bytes: number[] = [];
    const flush = (): void => {
      if (bytes.length) { out += Buffer.from(bytes).toString('utf8'); bytes = []; }
    };
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i]!;
      const at = this.addedById.get(id);
      if (at) {
        if (at.special && opts.skipSpecialTokens) continue;
        flush();
        out += at.content;
        continue;
      }
      const tok = this.idTokens[id];
      if (tok === undefined) continue;
      for (let j = 0; j < tok.length; j++) {
        const c = tok.charCodeAt(j);
        const b = c < 512 ? CHAR_TO_BYTE[c]! : -1;
        if (b >= 0) bytes.push(b);
        else { flush(); out += tok[j]; }
      }
    }
    flush();
    return out;
  }
}
