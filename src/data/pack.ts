/**
 * Packing documents into fixed-length training windows, and the train/validation split.
 *
 * `packDocuments` tokenizes every document, appends EOS after each, concatenates them into one stream and cuts it
 * into windows of seqLen + 1 tokens with stride seqLen (consecutive windows share one boundary token, so every
 * token after the first is a target exactly once): `inputs = stream[s .. s+T)`, `targets = stream[s+1 .. s+T]`.
 * The tail that does not fill a window is kept as one padded window: inputs padded with `padId` (default eosId),
 * targets −1 and mask 0 on the padding. `mask` is 1 on every counted target.
 */
import { DistilleryError } from '../util/errors.js';
import type { Rng } from '../util/rng.js';

/** Anything that turns text into token ids (Tokenizer satisfies it). */
export interface TokenEncoder {
  encode(text: string): number[];
}

export interface Window {
  inputs: Int32Array;
  targets: Int32Array;
  /** 1 where the target counts, 0 on padding. */
  mask: Float32Array;
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
  numDocs: number;
}

/** Tokenizes, concatenates with EOS and cuts into windows (see the module comment). */
export function packDocuments(tokenizer: TokenEncoder, docs: readonly string[], opts: PackOptions): PackedData {
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
  let n = 0;
  for (const d of docs) {
    const ids = tokenizer.encode(d);
    ids.push(opts.eosId);
    chunks.push(ids);
    n += ids.length;
  }
  if (n - docs.length === 0) {
    throw new DistilleryError('the dataset has no tokens (every document encodes to nothing)', 'check that the data files contain text');
  }
  const stream = new Int32Array(n);
  let o = 0;
  for (const c of chunks) { stream.set(c, o); o += c.length; }
  const windows: Window[] = [];
  let targetTokens = 0;
  for (let s = 0; s + 1 < n; s += T) {
    const len = Math.min(T, n - 1 - s); // targets available in this window
    const inputs = new Int32Array(T).fill(padId);
    const targets = new Int32Array(T).fill(-1);
    const mask = new Float32Array(T);
    inputs.set(stream.subarray(s, s + len));
    targets.set(stream.subarray(s + 1, s + 1 + len));
    mask.fill(1, 0, len);
    targetTokens += len;
    windows.push({ inputs, targets, mask });
  }
  return { windows, totalTokens: n, targetTokens, numDocs: docs.length };
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
