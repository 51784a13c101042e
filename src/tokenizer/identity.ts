/**
 * Tokenizer identity: are two tokenizer.json files the same tokenizer?
 *
 * Distillation compares a teacher and a student position by position and token id by token id, so both (and the
 * data, which is tokenized once) must use one tokenizer; a vocabulary of the same SIZE is not enough. Two files
 * are the same tokenizer when their canonical forms are equal:
 *   - the id → token map over the BPE vocabulary and the added tokens (a JSON object, so key order is irrelevant);
 *   - the merges, in rank order (the "a b" string form and the ["a", "b"] pair form are the same merge);
 *   - the added tokens, by id, with their flags (special, lstrip, rstrip, normalized, single_word);
 *   - the BPE model's options (type, ignore_merges, byte_fallback, unk_token, prefixes/suffixes, dropout, fuse_unk),
 *     absent and default values being equal;
 *   - the normalizer, the pre-tokenizer and the decoder (JSON, objects compared key-order-independently; options
 *     that change neither ids nor text, like ByteLevel's trim_offsets, are left out, and later-added options
 *     take their defaults when absent).
 * The post-processor, truncation, padding and version fields are not compared: distillery does not apply them.
 *
 * `tokenizerHash` is a SHA-256 of that canonical form; `tokenizerDifference` names the FIRST difference
 * (`token 17: teacher "ab" vs student "ba"`, `merges differ at 3: ...`, `pre_tokenizer.pretokenizers[0]...`).
 */
import { createHash } from 'node:crypto';
import { DistilleryError } from '../util/errors.js';
import type { Tokenizer } from './bpe.js';

type Json = Record<string, unknown>;

interface AddedCanon {
  id: number;
  content: string;
  special: boolean;
  lstrip: boolean;
  rstrip: boolean;
  normalized: boolean;
  single_word: boolean;
}

/** The parts of a tokenizer.json that decide how text becomes ids and back, in a canonical form. */
export interface CanonicalTokenizer {
  /** id → token (BPE vocabulary, then added tokens); holes are ids with no token. */
  tokens: Array<string | undefined>;
  /** Max id + 1 over the vocabulary and the added tokens (what Tokenizer.vocabSize reports). */
  size: number;
  /** Merges in rank order, each as [left, right]. */
  merges: Array<[string, string]>;
  /** Added tokens sorted by id. */
  added: AddedCanon[];
  /** BPE model options with defaults filled in. */
  model: Json;
  normalizer: unknown;
  preTokenizer: unknown;
  decoder: unknown;
  /** SHA-256 (hex) of the canonical JSON of all of the above. */
  hash: string;
}

/** JSON with object keys sorted (arrays keep their order); undefined becomes null. */
export function canonicalJson(v: unknown): string {
  if (v === undefined || v === null) return 'null';
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(',')}]`;
  if (typeof v === 'object') {
    const o = v as Json;
    return `{${Object.keys(o).filter((k) => o[k] !== undefined).sort().map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`).join(',')}}`;
  }
  return JSON.stringify(v);
}

function splitMerge(m: unknown): [string, string] {
  if (typeof m === 'string') {
    const sp = m.indexOf(' ', 1);
    return sp < 0 ? [m, ''] : [m.slice(0, sp), m.slice(sp + 1)];
  }
  if (Array.isArray(m) && m.length === 2) return [String(m[0]), String(m[1])];
  return [JSON.stringify(m), ''];
}

const MODEL_DEFAULTS: Json = {
  type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
  fuse_unk: false, byte_fallback: false, ignore_merges: false,
};

/**
 * Pre-tokenizer / decoder steps with fields that do not change ids or text dropped and defaults filled in, so that
 * files written by different `tokenizers` versions compare equal: ByteLevel's `trim_offsets` only moves offsets,
 * its `use_regex` (added in later versions) defaults to true, and the ByteLevel decoder ignores its options.
 */
function canonStep(v: unknown, decoder: boolean): unknown {
  if (Array.isArray(v)) return v.map((x) => canonStep(x, decoder));
  if (typeof v !== 'object' || v === null) return v;
  const o: Json = {};
  for (const [k, x] of Object.entries(v as Json)) o[k] = canonStep(x, decoder);
  if (o.type === 'ByteLevel') {
    if (decoder) return { type: 'ByteLevel' };
    delete o.trim_offsets;
    if (o.use_regex === undefined || o.use_regex === null) o.use_regex = true;
  }
  if (o.type === 'Split' && (o.invert === undefined || o.invert === null)) o.invert = false;
  return o;
}

const cache = new WeakMap<object, CanonicalTokenizer>();

/** The canonical form of a parsed tokenizer.json (or of a Tokenizer's source file); cached per object. */
export function canonicalTokenizer(src: Tokenizer | Readonly<Json>): CanonicalTokenizer {
  const json = (typeof (src as Tokenizer).sourceJson === 'function' ? (src as Tokenizer).sourceJson() : src) as Json;
  const hit = cache.get(json);
  if (hit) return hit;
  const model = (json.model ?? {}) as Json;
  const tokens: Array<string | undefined> = [];
  const vocab = (model.vocab ?? {}) as Record<string, unknown>;
  for (const tok in vocab) {
    const id = vocab[tok];
    if (typeof id !== 'number' || !Number.isInteger(id) || id < 0) continue;
    const prev = tokens[id];
    // Two tokens with one id: keep one independently of the file's key order.
    if (prev === undefined || tok < prev) tokens[id] = tok;
  }
  const added: AddedCanon[] = [];
  for (const t of (Array.isArray(json.added_tokens) ? json.added_tokens : []) as Json[]) {
    const special = Boolean(t.special);
    added.push({
      id: Number(t.id), content: String(t.content), special, lstrip: Boolean(t.lstrip), rstrip: Boolean(t.rstrip),
      normalized: t.normalized === undefined || t.normalized === null ? !special : Boolean(t.normalized), single_word: Boolean(t.single_word),
    });
  }
  added.sort((a, b) => a.id - b.id || (a.content < b.content ? -1 : a.content > b.content ? 1 : 0));
  for (const a of added) if (Number.isInteger(a.id) && a.id >= 0) tokens[a.id] = a.content;
  const size = tokens.length;
  const merges = (Array.isArray(model.merges) ? model.merges : []).map(splitMerge);
  const opts: Json = {};
  for (const [k, d] of Object.entries(MODEL_DEFAULTS)) {
    let v = model[k];
    if (v === undefined || v === null || v === '') v = d;
    opts[k] = v;
  }
  const norm = (x: unknown): unknown => (x === undefined ? null : x);
  const c: Omit<CanonicalTokenizer, 'hash'> = {
    tokens, size, merges, added, model: opts,
    normalizer: norm(json.normalizer), preTokenizer: canonStep(norm(json.pre_tokenizer), false), decoder: canonStep(norm(json.decoder), true),
  };
  const h = createHash('sha256');
  // Native JSON.stringify of the id-indexed array (holes become null) and of the pairs: fast on 150k-token files.
  h.update(`tokens\n${JSON.stringify(tokens)}\nmerges\n${JSON.stringify(merges)}\n`);
  h.update(`added\n${canonicalJson(added)}\nmodel\n${canonicalJson(opts)}\nnormalizer\n${canonicalJson(c.normalizer)}\n`);
  h.update(`pre_tokenizer\n${canonicalJson(c.preTokenizer)}\ndecoder\n${canonicalJson(c.decoder)}\n`);
  const out: CanonicalTokenizer = { ...c, hash: h.digest('hex') };
  cache.set(json, out);
  return out;
}

/** SHA-256 (hex) of the canonical form: equal for the same tokenizer, whatever the key order of its file. */
export function tokenizerHash(src: Tokenizer | Readonly<Json>): string {
  return canonicalTokenizer(src).hash;
}

function show(v: unknown): string {
  if (v === undefined) return '(absent)';
  const s = JSON.stringify(v);
  return s.length > 100 ? `${s.slice(0, 97)}...` : s;
}

/** The first path at which two JSON values differ (object keys compared in sorted order), or null. */
export function firstJsonDifference(a: unknown, b: unknown, path: string): { path: string; a: unknown; b: unknown } | null {
  const isObj = (x: unknown): x is Json => typeof x === 'object' && x !== null && !Array.isArray(x);
  if (Array.isArray(a) && Array.isArray(b)) {
    for (let i = 0; i < Math.max(a.length, b.length); i++) {
      const d = firstJsonDifference(a[i], b[i], `${path}[${i}]`);
      if (d) return d;
    }
    return null;
  }
  if (isObj(a) && isObj(b)) {
    const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])].sort();
    for (const k of keys) {
      const d = firstJsonDifference(a[k], b[k], `${path}.${k}`);
      if (d) return d;
    }
    return null;
  }
  return canonicalJson(a) === canonicalJson(b) ? null : { path, a, b };
}

/**
 * The first difference between two tokenizers, as one phrase naming both sides (`token 17: teacher "ab" vs
 * student "ba"`), or null when they are the same tokenizer.
 */
export function tokenizerDifference(x: Tokenizer | Readonly<Json>, y: Tokenizer | Readonly<Json>, names: [string, string] = ['first', 'second']): string | null {
  const a = canonicalTokenizer(x), b = canonicalTokenizer(y);
  if (a.hash === b.hash) return null;
  const [na, nb] = names;
  const tok = (t: string | undefined): string => (t === undefined ? '(no token)' : JSON.stringify(t));
  for (let id = 0; id < Math.max(a.size, b.size); id++) {
    const ta = a.tokens[id], tb = b.tokens[id];
    if (ta !== tb) return `token ${id}: ${na} ${tok(ta)} vs ${nb} ${tok(tb)}`;
  }
  const addedA = new Map(a.added.map((t) => [t.id, t])), addedB = new Map(b.added.map((t) => [t.id, t]));
  const addedIds = [...new Set([...addedA.keys(), ...addedB.keys()])].sort((p, q) => p - q);
  for (const id of addedIds) {
    const ta = addedA.get(id), tb = addedB.get(id);
    if (!ta || !tb) {
      return `token ${id} ${tok((ta ?? tb)!.content)}: ${na} ${ta ? 'added token' : 'vocabulary entry'} vs ${nb} ${tb ? 'added token' : 'vocabulary entry'}`;
    }
    const d = firstJsonDifference(ta, tb, '');
    if (d) return `added token ${id} ${tok(ta.content)}: ${na} ${d.path.slice(1)} ${show(d.a)} vs ${nb} ${show(d.b)}`;
  }
  for (let i = 0; i < Math.max(a.merges.length, b.merges.length); i++) {
    const ma = a.merges[i], mb = b.merges[i];
    if (ma?.[0] !== mb?.[0] || ma?.[1] !== mb?.[1]) {
      const m = (p: [string, string] | undefined): string => (p ? JSON.stringify(`${p[0]} ${p[1]}`) : '(none)');
      return `merges differ at ${i}: ${na} ${m(ma)} vs ${nb} ${m(mb)} (${na} has ${a.merges.length} merges, ${nb} ${b.merges.length})`;
    }
  }
  const parts: Array<[string, unknown, unknown]> = [
    ['model', a.model, b.model], ['normalizer', a.normalizer, b.normalizer],
    ['pre_tokenizer', a.preTokenizer, b.preTokenizer], ['decoder', a.decoder, b.decoder],
  ];
  for (const [name, pa, pb] of parts) {
    const d = firstJsonDifference(pa, pb, name);
    if (d) return `${d.path}: ${na} ${show(d.a)} vs ${nb} ${show(d.b)}`;
  }
  return `canonical hashes differ (${na} ${a.hash.slice(0, 12)}, ${nb} ${b.hash.slice(0, 12)})`;
}

/** A tokenizer with the role it plays ('teacher', 'student', 'data', 'model') and where it came from. */
export interface NamedTokenizer {
  name: string;
  tokenizer: Tokenizer;
  /** The file or folder it was read from (for the hint). */
  from?: string | undefined;
}

/**
 * Throws a DistilleryError unless the two are the same tokenizer: the message gives both sizes and the first
 * difference; the hint says where each came from and what to do (`advice`).
 */
export function assertSameTokenizer(a: NamedTokenizer, b: NamedTokenizer, advice: string): void {
  const diff = tokenizerDifference(a.tokenizer, b.tokenizer, [a.name, b.name]);
  if (diff === null) return;
  const where = [a, b].filter((t) => t.from).map((t) => `${t.name}: ${t.from}`).join('; ');
  throw new DistilleryError(
    `the ${a.name} and the ${b.name} use different tokenizers (${a.name}: ${a.tokenizer.vocabSize} tokens, ${b.name}: ${b.tokenizer.vocabSize} tokens); first difference: ${diff}`,
    `${advice}${where ? ` (${where})` : ''}`);
}

/**
 * The number of vocabulary rows the loss runs over: the tokenizer's size (its real tokens). Every model's
 * vocab_size must cover it; rows past it are embedding padding (e.g. Qwen2.5-7B's 152064 rows against its
 * tokenizer's 151665 tokens) and are excluded from the loss. `note` says so when some model has padding rows.
 */
export function lossVocabulary(tokenizerSize: number, models: ReadonlyArray<{ name: string; vocabSize: number }>): { lossVocab: number; note: string | null } {
  for (const m of models) {
    if (m.vocabSize < tokenizerSize) {
      throw new DistilleryError(`the ${m.name}'s vocabulary (vocab_size ${m.vocabSize}) is smaller than the tokenizer (${tokenizerSize} tokens)`,
        `the ${m.name} cannot score every token of this tokenizer: use a ${m.name} whose vocab_size covers it`);
    }
  }
  const padded = models.filter((m) => m.vocabSize > tokenizerSize);
  const note = padded.length === 0 ? null
    : `loss over the ${tokenizerSize} real tokens of the tokenizer; padding rows excluded (${padded.map((m) => `${m.name} vocab_size ${m.vocabSize}: ${m.vocabSize - tokenizerSize} rows`).join(', ')})`;
  return { lossVocab: tokenizerSize, note };
}
