/**
 * Packing documents into fixed-length training windows, and the train/validation split.
 *
 * A window holds up to seqLen + 1 tokens: `inputs = tokens[0 .. T)`, `targets = tokens[1 .. T]`; what does not fill it is
 * padding: inputs `padId` (default eosId), targets −1 and mask 0. `mask` is 1 on every counted target. Every document
 * is tokenized and followed by EOS (unless it already ends with it: TRL appends it only then); a text document (not a
 * rendered conversation) as transformers' `tokenizer(text)` tokenizes it, inside the post-processor's special tokens. Two ways to fill the windows (`packing`):
 * - 'wrapped' (text corpora; the usual pre-training packing): the documents are joined into one stream, cut into
 *   windows with stride seqLen (consecutive windows share one boundary token, so every token after the first is a
 *   target exactly once); a document may be split between windows. The tail is one padded window.
 * - 'bfd' (chat data: TRL's default packing strategy): no document is split. Longest first, each goes whole into the
 *   window it fills best (the least room left that holds it), else opens a new one (best-fit decreasing). A document
 *   longer than seqLen + 1 tokens fills windows of its own, split as 'wrapped' splits (counted in `splitDocs`); its
 *   last piece is placed as a document of that length. Documents sharing a window do not see each other: each row
 *   attends to its own document's rows only, at RoPE positions from 0 at the document's first token (`positions`),
 *   as TRL's padding-free bfd packing runs them (position_ids reset per document, FlashAttention's varlen kernels):
 *   each computes what it would alone, and a document's first token is no target of the row before it (the previous
 *   document's end). (TRL cuts such a document to its max_length instead, dropping the rest.)
 * - 'none' (TRL's packing=False, as its SFT and GKD trainers run by default): one document a window, in the data's
 *   order, padded; a document longer than seqLen + 1 tokens is split as under 'bfd'. No document sees another, at the
 *   cost of the padding's compute.
 *
 * A document with loss spans (chat data under `--loss-on assistant`) counts a target where that TOKEN's character range
 * meets a span: transformers' assistant-token mask, which runs from the token holding a span's first character
 * (char_to_token(start), which may begin before it) through the one holding its last; the end-of-text token appended
 * after such a document counts nothing (the template's own end-of-turn marker, inside the span, ends the reply).
 */
import { checkChatTokens, type ChatFormat } from '../tokenizer/chat.js';
import { DistilleryError, InputError } from '../util/errors.js';
import type { Rng } from '../util/rng.js';

/** A packing choice as the options hold it: 'auto' is resolved on the data (packingFor). */
export type PackingChoice = Packing | 'auto';

/** Anything that turns text into token ids (Tokenizer satisfies it); documents with loss spans need the offsets. */
export interface TokenEncoder {
  encode(text: string): number[];
  /** A text document's ids with the tokenizer's post-processor tokens around them (Tokenizer.encodeDocument). */
  encodeDocument?(text: string): number[];
  encodeWithOffsets?(text: string): { ids: number[]; offsets: Array<[number, number]> };
}

/**
 * The packing a run uses: `choice` ('auto' picks 'bfd' when the data has a conversation, so that no reply is cut off
 * from its prompt, else 'wrapped').
 */
export function packingFor(choice: PackingChoice | undefined, docs: ReadonlyArray<{ conversation?: boolean }>): Packing {
  if (choice !== undefined && choice !== 'auto') return choice;
  return docs.some((d) => d.conversation === true) ? 'bfd' : 'wrapped';
}

const PACKING_WORDS: Readonly<Record<Packing, string>> = {
  wrapped: 'documents joined by EOS, windows of seq + 1 tokens with stride seq (packDocuments)',
  bfd: 'best-fit decreasing: each document whole (a longer one split) in the window it fills best, EOS after each, attending only to itself at positions from 0 (packDocuments)',
  none: 'no packing: one document a window (a longer one split), padded, EOS after each (packDocuments)',
};

/** The packing a describePacking text names (a teacher cache's manifest), or null for text no packing gives. */
export function packingOfDescription(text: string): Packing | null {
  return PACKINGS.find((p) => text.startsWith(PACKING_WORDS[p])) ?? null;
}

/** What a packing does, in words (logs, a teacher cache's manifest). */
export function describePacking(p: Packing, tokenizer?: { documentPrefix?: readonly number[]; documentSuffix?: readonly number[] }): string {
  const around = [...(tokenizer?.documentPrefix ?? []), ...(tokenizer?.documentSuffix ?? [])].length > 0
    ? '; text documents inside the tokenizer\'s post-processor tokens' : '';
  return PACKING_WORDS[p] + around;
}

/** A document: plain text (every token counts), or text with the character ranges whose tokens carry loss. */
export type PackDoc = string | { text: string; lossSpans: ReadonlyArray<readonly [number, number]> | null; conversation?: boolean };

export interface Window {
  inputs: Int32Array;
  targets: Int32Array;
  /** 1 where the target counts, 0 on padding. */
  mask: Float32Array;
  /** The window's index in the packed data (packDocuments sets it): a teacher cache's key for it. */
  id?: number;
  /**
   * 'bfd' windows: each input row's position in its document (0 at a document's first token; the padding is a document
   * of its own): the model attends within documents only and rotates by these positions (Backend DocPositions).
   * Absent: the window is one sequence.
   */
  positions?: Int32Array;
}

/** How documents fill windows (see the module comment). */
export type Packing = 'wrapped' | 'bfd' | 'none';
export const PACKINGS: readonly Packing[] = ['wrapped', 'bfd', 'none'];

export interface PackOptions {
  seqLen: number;
  eosId: number;
  /** Input id used on padding positions (default eosId; never a target). */
  padId?: number;
  /** Default 'wrapped'. */
  packing?: Packing;
}

export interface PackedData {
  windows: Window[];
  /** Tokens in the stream (documents + one EOS each). */
  totalTokens: number;
  /** Counted targets over all windows. */
  targetTokens: number;
  /** Windows left out because no target in them counts (documents with loss spans only). */
  emptyWindows: number;
  numDocs: number;
  packing: Packing;
  /** 'bfd' and 'none': documents longer than a window (seqLen + 1 tokens), split across windows of their own (0 under 'wrapped'). */
  splitDocs: number;
}

/**
 * Whether the token covering characters [start, end) is in the span [a, b) by transformers' rule (the tokens from
 * char_to_token(a) through char_to_token(b - 1)): it overlaps the span, or it is empty and lies inside it.
 */
export function tokenMeetsSpan(start: number, end: number, a: number, b: number): boolean {
  return start < b && (end > a || (end <= start && start >= a));
}

/** Tokenizes, concatenates with EOS and cuts into windows (see the module comment). */
export function packDocuments(tokenizer: TokenEncoder, docs: readonly PackDoc[], opts: PackOptions): PackedData {
  const T = opts.seqLen;
  if (!Number.isInteger(T) || T < 1) throw new DistilleryError(`seqLen must be a positive integer, got ${T}`, 'set seqLen to e.g. 256');
  if (!Number.isInteger(opts.eosId) || opts.eosId < 0) {
    throw new DistilleryError(`eosId must be a token id, got ${opts.eosId}`, 'use the tokenizer\'s end-of-text token id (tokenizer.eosId)');
  }
  if (docs.length === 0) {
    throw new InputError('the dataset has no documents', 'check the data paths: the files are missing, empty, or whitespace only');
  }
  const padId = opts.padId ?? opts.eosId;
  const chunks: number[][] = [];
  const counts: Uint8Array[] = [];
  let n = 0;
  for (const d of docs) {
    let ids: number[], c: Uint8Array;
    if (typeof d === 'string' || d.lossSpans === null) {
      // a text document as transformers' tokenizer(text) gives it (Llama 3's <|begin_of_text|> first); a rendered
      // conversation holds its template's own special tokens (apply_chat_template tokenizes without adding any)
      const text = typeof d === 'string' ? d : d.text, conversation = typeof d !== 'string' && d.conversation === true;
      ids = !conversation && tokenizer.encodeDocument ? tokenizer.encodeDocument(text) : tokenizer.encode(text);
      if (ids[ids.length - 1] !== opts.eosId) ids.push(opts.eosId);
      c = new Uint8Array(ids.length).fill(1);
    } else {
      if (!tokenizer.encodeWithOffsets) throw new DistilleryError('this tokenizer cannot give token offsets, which loss spans need', 'use --loss-on all');
      const e = tokenizer.encodeWithOffsets(d.text);
      ids = e.ids;
      if (ids[ids.length - 1] !== opts.eosId) ids.push(opts.eosId); // (the appended EOS counts nothing)
      c = new Uint8Array(ids.length);
      const spans = d.lossSpans;
      e.offsets.forEach(([start, end], i) => { if (spans.some(([a, b]) => tokenMeetsSpan(start, end, a, b))) c[i] = 1; });
    }
    chunks.push(ids);
    counts.push(c);
    n += ids.length;
  }
  if (n - docs.length === 0) {
    throw new InputError('the dataset has no tokens (every document encodes to nothing)', 'check that the data files contain text');
  }
  const spanned = docs.some((d) => typeof d !== 'string' && d.lossSpans !== null);
  const packing = opts.packing ?? 'wrapped';
  const windows: Window[] = [];
  let targetTokens = 0, emptyWindows = 0;
  /** Adds the window of tokens [0, len] of `ids` (len targets) unless, with loss spans, none of them counts. */
  const emit = (ids: Int32Array, counted: Uint8Array, len: number, starts?: readonly number[]): void => {
    const inputs = new Int32Array(T).fill(padId);
    const targets = new Int32Array(T).fill(-1);
    const mask = new Float32Array(T);
    inputs.set(ids.subarray(0, len));
    targets.set(ids.subarray(1, 1 + len));
    let k = 0;
    for (let i = 0; i < len; i++) if (counted[1 + i]) { mask[i] = 1; k++; }
    // With loss spans, a window may hold no counted target (a long user turn): it would only cost a step.
    if (k === 0 && spanned) { emptyWindows++; return; }
    targetTokens += k;
    const w: Window = { inputs, targets, mask, id: windows.length };
    if (starts) w.positions = documentPositions(T, starts, len);
    windows.push(w);
  };
  let splitDocs = 0;
  if (packing === 'wrapped') {
    const stream = new Int32Array(n), counted = new Uint8Array(n);
    let o = 0;
    chunks.forEach((c, i) => { stream.set(c, o); counted.set(counts[i]!, o); o += c.length; });
    for (let s = 0; s + 1 < n; s += T) emit(stream.subarray(s), counted.subarray(s), Math.min(T, n - 1 - s));
  } else {
    const cap = T + 1;
    // a document longer than a window fills windows of its own, split as 'wrapped' splits the stream; its last
    // piece is placed like a document of that length (documents after it in its window see it)
    type Piece = { doc: number; from: number; to: number };
    // 'bfd' places the pieces below; 'none' gives each its own window here, in the data's order
    const pieces: Piece[] = [];
    const place = (p: Piece): void => { if (packing === 'none') windowOf([p]); else pieces.push(p); };
    chunks.forEach((c, i) => {
      if (c.length <= cap) { place({ doc: i, from: 0, to: c.length }); return; }
      splitDocs++;
      let s = 0;
      for (; s + cap < c.length; s += T) {
        const w: Piece[] = [{ doc: i, from: s, to: s + cap }];
        windowOf(w);
      }
      if (s + 1 < c.length) place({ doc: i, from: s, to: c.length });
    });
    const order = pieces.map((p, k) => [p.to - p.from, k] as const).sort((x, y) => y[0] - x[0] || x[1] - y[1]);
    // best fit: the open windows by the room they have left (room -> window indices), searched upward from a length
    const byRoom: number[][] = Array.from({ length: cap + 1 }, () => []);
    const bins: Piece[][] = [];
    const room: number[] = [];
    for (const [len, k] of order) {
      let r = len;
      while (r <= cap && byRoom[r]!.length === 0) r++;
      let w: number;
      if (r <= cap) { w = byRoom[r]!.pop()!; } else { w = bins.length; bins.push([]); room.push(cap); }
      bins[w]!.push(pieces[k]!);
      room[w] = room[w]! - len;
      byRoom[room[w]!]!.push(w);
    }
    for (const b of bins) windowOf(b);
  }
  function windowOf(members: readonly { doc: number; from: number; to: number }[]): void {
    const ids = new Int32Array(T + 1), counted = new Uint8Array(T + 1);
    let o = 0;
    for (const m of members) {
      ids.set(chunks[m.doc]!.slice(m.from, m.to), o);
      counted.set(counts[m.doc]!.subarray(m.from, m.to), o);
      // a continuation's first token was its previous piece's last target: not a target again, from other context; and
      // under 'bfd' a document's first token is no target of the document before it, which it does not see (TRL's
      // padding-free collator drops that label too)
      if (m.from > 0 || (packing === 'bfd' && o > 0)) counted[o] = 0;
      o += m.to - m.from;
    }
    // 'bfd': each member a document of its own (a continuation piece too: it cannot see its beginning either way)
    const starts: number[] = [];
    let at = 0;
    for (const m of members) { starts.push(at); at += m.to - m.from; }
    if (o >= 2) emit(ids, counted, o - 1, packing === 'bfd' ? starts : undefined);
  }
  if (windows.length === 0 && spanned) {
    throw new DistilleryError('no token of the data carries loss (no assistant reply in any window)', 'check the chat data, or pass --loss-on all to train on every token');
  }
  return { windows, totalTokens: n, targetTokens, numDocs: docs.length, emptyWindows, packing, splitDocs };
}

/**
 * The document positions of a window of T input rows whose documents start at rows `starts` (ascending, the first 0)
 * and whose first `len` rows hold tokens: each row's distance from the last start at or before it; the padding rows
 * from `len` on are one document of their own.
 */
export function documentPositions(T: number, starts: readonly number[], len: number): Int32Array {
  const pos = new Int32Array(T);
  let k = 0, s = 0;
  for (let i = 0; i < T; i++) {
    if (i === len) s = i;
    else if (i < len) { while (k < starts.length && starts[k]! <= i) s = starts[k++]!; }
    pos[i] = i - s;
  }
  return pos;
}

/** The warning for documents split across windows ('bfd', 'none'). */
export function logSplitDocs(p: PackedData, seq: number, log: (s: string) => void): void {
  if (p.splitDocs === 0) return;
  log(`warning: ${p.splitDocs} of ${p.numDocs} documents are longer than --seq ${seq} + 1 tokens and are split across windows of their own (a later window does not see the document's beginning); raise --seq to keep each whole`);
}

/** The tokenizer a job packs with: an encoder that also names its end-of-text token. */
export interface JobTokenizer extends TokenEncoder {
  readonly eosId?: number | undefined;
  tokenToId(t: string): number | undefined;
}

/**
 * How every job turns its documents into windows (train, distill, teacher-cache, eval and their dry runs), so that a
 * cache and the run that reads it cannot pack differently: the end-of-text id (`eosId`, else <|endoftext|>), the
 * chat-token check (checkChatTokens), the packing (`packing`: 'auto' resolved on the data), the windows
 * (packDocuments) and the warning for documents split across windows. `tokenizerOf` names where the tokenizer came from
 * in the error for one without an end-of-text token.
 */
export function packForJob(tokenizer: JobTokenizer, docs: readonly PackDoc[], chat: ChatFormat,
  o: { seq: number; packing?: PackingChoice | undefined; tokenizerOf?: string | undefined }, log: (s: string) => void): { packed: PackedData; packing: Packing; eosId: number } {
  const eosId = tokenizer.eosId ?? tokenizer.tokenToId('<|endoftext|>');
  if (eosId === undefined) {
    throw new DistilleryError(`the tokenizer${o.tokenizerOf ? ` of ${o.tokenizerOf}` : ''} has no end-of-text token`, 'use a tokenizer.json with <|endoftext|> or </s>');
  }
  const kinds = docs.map((d) => ({ conversation: typeof d !== 'string' && d.conversation === true }));
  checkChatTokens(chat, kinds, tokenizer);
  const packing = packingFor(o.packing, kinds);
  const packed = packDocuments(tokenizer, docs, { seqLen: o.seq, eosId, packing });
  logSplitDocs(packed, o.seq, log);
  return { packed, packing, eosId };
}

/**
 * Splits windows into train and validation with a seeded shuffle. When valFraction > 0 and there are at least two
 * windows, validation gets round(n × valFraction) windows, at least 1 and at most n − 1. Both keep the original order.
 */
export function splitTrainVal<W>(windows: readonly W[], valFraction: number, rng: Rng): { train: W[]; val: W[] } {
  if (!(valFraction >= 0 && valFraction < 1)) {
    throw new DistilleryError(`valFraction must be in [0, 1), got ${valFraction}`, 'use e.g. 0.05 for 5% validation');
  }
  const n = windows.length;
  let nVal = 0;
  if (valFraction > 0 && n >= 2) nVal = Math.min(n - 1, Math.max(1, Math.round(n * valFraction)));
  const idx = new Int32Array(n);
  for (let i = 0; i < n; i++) idx[i] = i;
  rng.shuffle(idx);
  const valIdx = Array.from(idx.subarray(0, nVal)).sort((a, b) => a - b);
  const trainIdx = Array.from(idx.subarray(nVal)).sort((a, b) => a - b);
  return { train: trainIdx.map((i) => windows[i]!), val: valIdx.map((i) => windows[i]!) };
}
