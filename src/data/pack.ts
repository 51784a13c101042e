/**
 * Packing documents into fixed-length training windows, and the train/validation split.
 *
 * `packDocuments` tokenizes every document, appends EOS after each, concatenates them into one stream and cuts it
 * into windows of seqLen + 1 tokens with stride seqLen (consecutive windows share one boundary token, so every
 * token after the first is a target exactly once): `inputs = stream[s .. s+T)`, `targets = stream[s+1 .. s+T]`.
 * The tail that does not fill a window is kept as one padded window: inputs padded with `padId` (default eosId),
 * targets −1 and mask 0 on the padding. `mask` is 1 on every counted target.
 *
 * A document with loss spans (chat data under `--loss-on assistant`) counts a target only where that TOKEN's character
 * range starts inside a span (transformers' rule for its assistant-token mask); the end-of-text token appended after
 * such a document counts nothing (the template's own end-of-turn marker, inside the span, ends the reply).
 */
import { DistilleryError } from '../util/errors.js';
import type { Rng } from '../util/rng.js';

/** Anything that turns text into token ids (Tokenizer satisfies it); documents with loss spans need the offsets. */
export interface TokenEncoder {
  encode(text: string): number[];
  encodeWithOffsets?(text: string): { ids: number[]; offsets: Array<[number, number]> };
}

/** A document: plain text (every token counts), or text with the character ranges whose tokens carry loss. */
export type PackDoc = string | { text: string; lossSpans: ReadonlyArray<readonly [number, number]> | null };

export interface Window {
  inputs: Int32Array;
  targets: Int32Array;
  /** 1 where the target counts, 0 on padding. */
  mask: Float32Array;
  /** The window's index in the packed data (packDocuments sets it): a teacher cache's key for it. */
  id?: number;
}

export interface PackOptions {
  seqLen: number;
  eosId: number;
  /** Input id used on padding positions (default eosId; never a target). */
  padId?: number;
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
}

/** Tokenizes, concatenates with EOS and cuts into windows (see the module comment). */
export function packDocuments(tokenizer: TokenEncoder, docs: readonly PackDoc[], opts: PackOptions): PackedData {
  const T = opts.seqLen;
  if (!Number.isInteger(T) || T < 1) throw new DistilleryError(`seqLen must be a positive integer, got ${T}`, 'set seqLen to e.g. 256');
  if (!Number.isInteger(opts.eosId) || opts.eosId < 0) {
    throw new DistilleryError(`eosId must be a token id, got ${opts.eosId}`, 'use the tokenizer\'s end-of-text token id (tokenizer.eosId)');
  }
  if (docs.length === 0) {
    throw new DistilleryError('the dataset has no documents', 'check the data paths: the files are missing, empty, or whitespace only');
  }
  const padId = opts.padId ?? opts.eosId;
  const chunks: number[][] = [];
  const counts: Uint8Array[] = [];
  let n = 0;
  for (const d of docs) {
    let ids: number[], c: Uint8Array;
    if (typeof d === 'string' || d.lossSpans === null) {
      ids = tokenizer.encode(typeof d === 'string' ? d : d.text);
      ids.push(opts.eosId);
      c = new Uint8Array(ids.length).fill(1);
    } else {
      if (!tokenizer.encodeWithOffsets) throw new DistilleryError('this tokenizer cannot give token offsets, which loss spans need', 'use --loss-on all');
      const e = tokenizer.encodeWithOffsets(d.text);
      ids = e.ids;
      c = new Uint8Array(ids.length + 1);
      const spans = d.lossSpans;
      e.offsets.forEach(([start], i) => { if (spans.some(([a, b]) => start >= a && start < b)) c[i] = 1; });
      ids.push(opts.eosId);
    }
    chunks.push(ids);
    counts.push(c);
    n += ids.length;
  }
  if (n - docs.length === 0) {
    throw new DistilleryError('the dataset has no tokens (every document encodes to nothing)', 'check that the data files contain text');
  }
  const stream = new Int32Array(n), counted = new Uint8Array(n);
  let o = 0;
  chunks.forEach((c, i) => { stream.set(c, o); counted.set(counts[i]!, o); o += c.length; });
  const windows: Window[] = [];
  let targetTokens = 0, emptyWindows = 0;
  const spanned = docs.some((d) => typeof d !== 'string' && d.lossSpans !== null);
  for (let s = 0; s + 1 < n; s += T) {
    const len = Math.min(T, n - 1 - s); // targets available in this window
    const inputs = new Int32Array(T).fill(padId);
    const targets = new Int32Array(T).fill(-1);
    const mask = new Float32Array(T);
    inputs.set(stream.subarray(s, s + len));
    targets.set(stream.subarray(s + 1, s + 1 + len));
    let k = 0;
    for (let i = 0; i < len; i++) if (counted[s + 1 + i]) { mask[i] = 1; k++; }
    // With loss spans, a window may hold no counted target (a long user turn): it would only cost a step.
    if (k === 0 && spanned) { emptyWindows++; continue; }
    targetTokens += k;
    windows.push({ inputs, targets, mask, id: windows.length });
  }
  if (windows.length === 0 && spanned) {
    throw new DistilleryError('no token of the data carries loss (no assistant reply in any window)', 'check the chat data, or pass --loss-on all to train on every token');
  }
  return { windows, totalTokens: n, targetTokens, numDocs: docs.length, emptyWindows };
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
