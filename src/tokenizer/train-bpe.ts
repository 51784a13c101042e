/**
 * Byte-level BPE training (GPT-2 style), producing a Tokenizer whose toJSON() is a valid Hugging Face tokenizer.json.
 *
 * Vocabulary layout: ids 0..255 are the 256 byte tokens (id = byte value), then one id per learned merge in merge
 * order, then the special tokens (as `added_tokens`, special: true). Texts are NFC-normalized, special tokens are cut
 * out of the training text, the rest is pre-tokenized with the GPT-2 pattern, and identical pre-tokens are counted
 * once with their frequency. Each step merges the most frequent adjacent pair (ties: smallest left id, then right id);
 * pair counts are updated incrementally, only for the words that contain the merged pair, with a lazy max-heap,
 * so a few MB of text trains in seconds.
 * Training stops at `vocabSize` (bytes + merges + special tokens) or when no pair occurs `minFrequency` times.
 */
import { DistilleryError } from '../util/errors.js';
import { BYTE_TO_CHAR, GPT2_PATTERN, Tokenizer } from './bpe.js';
import { compileOnigRegex } from './regex.js';

export interface TrainBpeOptions {
  /** Total vocabulary size including the 256 byte tokens and the special tokens. */
  vocabSize: number;
  /** Special tokens, e.g. ['<|endoftext|>', '<|im_start|>', '<|im_end|>'], given the last ids. */
  specialTokens?: string[];
  /** A pair must occur at least this often (weighted by word count) to be merged (default 2). */
  minFrequency?: number;
}

const KEY_MUL = 1048576; // ids < 2^20

/** Max-heap of [count, key], ties broken by the smaller key. */
class PairHeap {
  private counts: number[] = [];
  private keys: number[] = [];
  get size(): number { return this.counts.length; }
  private above(i: number, j: number): boolean {
    return this.counts[i]! > this.counts[j]! || (this.counts[i] === this.counts[j] && this.keys[i]! < this.keys[j]!);
  }
  private swap(i: number, j: number): void {
    const c = this.counts[i]!; this.counts[i] = this.counts[j]!; this.counts[j] = c;
    const k = this.keys[i]!; this.keys[i] = this.keys[j]!; this.keys[j] = k;
  }
  push(count: number, key: number): void {
    this.counts.push(count); this.keys.push(key);
    let i = this.counts.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!this.above(i, p)) break;
      this.swap(i, p); i = p;
    }
  }
  pop(): [number, number] {
    const top: [number, number] = [this.counts[0]!, this.keys[0]!];
    const lc = this.counts.pop()!, lk = this.keys.pop()!;
    if (this.counts.length) {
      this.counts[0] = lc; this.keys[0] = lk;
      let i = 0;
      const n = this.counts.length;
      while (true) {
        const l = 2 * i + 1, r = l + 1;
        let m = i;
        if (l < n && this.above(l, m)) m = l;
        if (r < n && this.above(r, m)) m = r;
        if (m === i) break;
        this.swap(i, m); i = m;
      }
    }
    return top;
  }
}

function escapeRegex(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\/-]/g, '\\$&');
}

/** Trains a byte-level BPE tokenizer on `texts`. */
export function trainBpe(texts: Iterable<string>, opts: TrainBpeOptions): Tokenizer {
  const specials = opts.specialTokens ?? [];
  const minFrequency = opts.minFrequency ?? 2;
  if (new Set(specials).size !== specials.length || specials.some((s) => s === '')) {
    throw new DistilleryError('trainBpe: special tokens must be distinct non-empty strings', `got ${JSON.stringify(specials)}`);
  }
  if (!Number.isInteger(opts.vocabSize) || opts.vocabSize < 256 + specials.length || opts.vocabSize >= KEY_MUL) {
    throw new DistilleryError(`trainBpe: vocabSize ${opts.vocabSize} must be an integer from ${256 + specials.length} (256 bytes + ${specials.length} special tokens) to ${KEY_MUL - 1}`,
      'raise (or lower) vocabSize');
  }
  const bpeTarget = opts.vocabSize - specials.length;

  // 1. Count pre-tokens.
  const pre = compileOnigRegex(GPT2_PATTERN);
  const specialRe = specials.length
    ? new RegExp(specials.slice().sort((a, b) => b.length - a.length).map(escapeRegex).join('|'), 'gu') : null;
  const wordCounts = new Map<string, number>();
  for (const raw of texts) {
    const text = raw.normalize('NFC');
    const parts = specialRe ? text.split(specialRe) : [text];
    for (const part of parts) {
      if (!part) continue;
      for (const m of part.matchAll(pre)) wordCounts.set(m[0], (wordCounts.get(m[0]) ?? 0) + 1);
    }
  }

  // 2. Words as byte-id sequences.
  const words: number[][] = [];
  const counts: number[] = [];
  for (const [w, c] of wordCounts) {
    const bytes = Buffer.from(w, 'utf8');
    if (bytes.length < 2) continue; // no pairs; still encodable through the byte tokens
    words.push(Array.from(bytes));
    counts.push(c);
  }
  const tokens: string[] = BYTE_TO_CHAR.slice();
  const tokenIds = new Map<string, number>(tokens.map((t, i) => [t, i]));
  const merges: Array<[string, string]> = [];

  const pairCounts = new Map<number, number>();
  const where = new Map<number, Set<number>>();
  const addPairs = (wi: number, w: number[], sign: number, touched: Set<number> | null): void => {
    const c = counts[wi]! * sign;
    for (let i = 0; i + 1 < w.length; i++) {
      const k = w[i]! * KEY_MUL + w[i + 1]!;
      pairCounts.set(k, (pairCounts.get(k) ?? 0) + c);
      if (sign > 0) {
        let s = where.get(k);
        if (!s) { s = new Set(); where.set(k, s); }
        s.add(wi);
      }
      if (touched) touched.add(k);
    }
  };
  words.forEach((w, wi) => addPairs(wi, w, 1, null));
  const heap = new PairHeap();
  for (const [k, c] of pairCounts) heap.push(c, k);

  // 3. Merge loop.
  while (tokens.length < bpeTarget && heap.size > 0) {
    const [c, key] = heap.pop();
    const actual = pairCounts.get(key) ?? 0;
    if (c !== actual) {
      if (actual > 0) heap.push(actual, key);
      continue;
    }
    if (actual < minFrequency || actual <= 0) break;
    const a = Math.floor(key / KEY_MUL), b = key % KEY_MUL;
    const merged = tokens[a]! + tokens[b]!;
    let newId = tokenIds.get(merged);
    if (newId === undefined) {
      newId = tokens.length;
      tokens.push(merged);
      tokenIds.set(merged, newId);
    }
    merges.push([tokens[a]!, tokens[b]!]);
    const touched = new Set<number>();
    for (const wi of where.get(key) ?? []) {
      const w = words[wi]!;
      let has = false;
      for (let i = 0; i + 1 < w.length; i++) if (w[i] === a && w[i + 1] === b) { has = true; break; }
      if (!has) continue;
      addPairs(wi, w, -1, touched);
      const nw: number[] = [];
      for (let i = 0; i < w.length; i++) {
        if (i + 1 < w.length && w[i] === a && w[i + 1] === b) { nw.push(newId); i++; } else nw.push(w[i]!);
      }
      words[wi] = nw;
      addPairs(wi, nw, 1, touched);
    }
    where.delete(key);
    for (const k of touched) {
      const n = pairCounts.get(k) ?? 0;
      if (n <= 0) { pairCounts.delete(k); continue; }
      heap.push(n, k);
    }
  }

  const vocab: Record<string, number> = {};
  tokens.forEach((t, i) => { vocab[t] = i; });
  const json = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: specials.map((content, i) => ({
      id: tokens.length + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
    })),
    normalizer: { type: 'NFC' },
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges,
    },
  };
  return Tokenizer.fromJSON(json);
}
