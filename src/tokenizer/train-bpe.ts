/**
 * Byte-level BPE training (GPT-2 style), producing a Tokenizer whose toJSON() is a valid Hugging Face tokenizer.json.
 *
 * Vocabulary layout: ids 0..255 are the 256 byte tokens (id = byte value), then one id per learned merge in merge
 * order, then the special tokens (as `added_tokens`, special: true). Texts are NFC-normalized, special tokens are cut
 * out of the training text, the rest is pre-tokenized with the GPT-2 pattern, and identical pre-tokens are counted
 * once with their frequency. Each step merges the most frequent adjacent pair (ties: smallest left id, then right id).
 * Pair counts are updated incrementally with a lazy max-heap, and each pair keeps the positions where it occurs
 * (symbols live in flat doubly linked lists), so a merge costs time in proportion to its occurrences, not to the
 * length of the words that hold them: training is near-linear even on one long run of text without whitespace
 * (a minified file, a long line of letters), where rescanning whole words per merge was quadratic.
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

/** A growable list of symbol positions. */
class PositionList {
  private a = new Int32Array(4);
  private n = 0;
  push(v: number): void {
    if (this.n === this.a.length) { const b = new Int32Array(this.n * 2); b.set(this.a); this.a = b; }
    this.a[this.n++] = v;
  }
  view(): Int32Array { return this.a.subarray(0, this.n); }
  sorted(): Int32Array { return this.a.slice(0, this.n).sort(); }
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

  // 2. Symbols: every distinct word's bytes, laid out one after another in flat arrays, chained as doubly linked
  //    lists (next/prev; -1 ends a word) so a merge rewrites its occurrence in O(1) whatever the word's length.
  const wordStart: number[] = [];
  const wordCount: number[] = [];
  let total = 0;
  const wordBytes: Buffer[] = [];
  for (const [w, c] of wordCounts) {
    const bytes = Buffer.from(w, 'utf8');
    if (bytes.length < 2) continue; // no pairs; still encodable through the byte tokens
    wordStart.push(total);
    wordCount.push(c);
    wordBytes.push(bytes);
    total += bytes.length;
  }
  wordCounts.clear();
  const sym = new Int32Array(total), next = new Int32Array(total), prev = new Int32Array(total);
  for (let wi = 0, o = 0; wi < wordBytes.length; wi++) {
    const bytes = wordBytes[wi]!;
    for (let i = 0; i < bytes.length; i++, o++) {
      sym[o] = bytes[i]!;
      prev[o] = i === 0 ? -1 : o - 1;
      next[o] = i === bytes.length - 1 ? -1 : o + 1;
    }
  }
  wordBytes.length = 0;
  const starts = Int32Array.from(wordStart);
  /** The count of the word that holds symbol position `pos` (binary search over the words' starts). */
  const weightAt = (pos: number): number => {
    let lo = 0, hi = starts.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (starts[mid]! <= pos) lo = mid; else hi = mid - 1;
    }
    return wordCount[lo]!;
  };
  const tokens: string[] = BYTE_TO_CHAR.slice();
  const tokenIds = new Map<string, number>(tokens.map((t, i) => [t, i]));
  const merges: Array<[string, string]> = [];

  // Pair counts (weighted by word counts) and, per pair, the positions of its left symbol where it may occur
  // (appended when a pair appears; checked when the pair is merged, since later merges may have used them).
  const pairCounts = new Map<number, number>();
  const where = new Map<number, PositionList>();
  let touched = new Set<number>();
  const add = (key: number, weight: number, pos: number): void => {
    pairCounts.set(key, (pairCounts.get(key) ?? 0) + weight);
    let l = where.get(key);
    if (!l) { l = new PositionList(); where.set(key, l); }
    l.push(pos);
    touched.add(key);
  };
  const remove = (key: number, weight: number): void => {
    pairCounts.set(key, (pairCounts.get(key) ?? 0) - weight);
    touched.add(key);
  };
  for (let wi = 0; wi < starts.length; wi++) {
    const end = wi + 1 < starts.length ? starts[wi + 1]! : total;
    for (let i = starts[wi]!; i + 1 < end; i++) add(sym[i]! * KEY_MUL + sym[i + 1]!, wordCount[wi]!, i);
  }
  const heap = new PairHeap();
  for (const [k, c] of pairCounts) heap.push(c, k);

  // 3. Merge loop. Within a word, occurrences are merged left to right (a run "aaa" becomes "aa a"), as a scan
  //    of the word would; only a pair of two equal symbols can overlap itself, so only its positions are sorted.
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
    const list = where.get(key);
    where.delete(key);
    touched = new Set<number>();
    if (list) {
      const positions = a === b ? list.sorted() : list.view();
      for (let n = 0; n < positions.length; n++) {
        const i = positions[n]!;
        if (sym[i] !== a) continue;
        const j = next[i]!;
        if (j < 0 || sym[j] !== b) continue;
        const w = weightAt(i);
        const p = prev[i]!, q = next[j]!;
        if (p >= 0) remove(sym[p]! * KEY_MUL + a, w);
        remove(key, w);
        if (q >= 0) remove(b * KEY_MUL + sym[q]!, w);
        sym[i] = newId; sym[j] = -1;
        next[i] = q;
        if (q >= 0) prev[q] = i;
        if (p >= 0) add(sym[p]! * KEY_MUL + newId, w, p);
        if (q >= 0) add(newId * KEY_MUL + sym[q]!, w, i);
      }
    }
    for (const k of touched) {
      const n = pairCounts.get(k) ?? 0;
      if (n <= 0) { pairCounts.delete(k); where.delete(k); continue; }
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
