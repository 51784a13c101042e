/**
 * A teacher cache on disk: a folder with manifest.json and shards of window records (src/cache/format.ts).
 *
 *   manifest.json     what the cache is of (the teacher's config and a hash of its weights, the tokenizer's hash, the
 *                     data's hash and files, seq, packing, split, temperature, representation, sampling seed) and the
 *                     shards written so far, each with its windows, counted positions, size and SHA-256
 *   shard-NNNNN.bin   "DSTLTC01", u32 windows, u32 first window, u32 record bytes × windows, u32 positions × windows,
 *                     then the records (little-endian)
 *
 * A shard is written to a temporary file and renamed into place, then the manifest is replaced (both atomically), so a
 * job killed at any moment leaves every listed shard whole; rerunning the command verifies them and continues.
 * Readers verify a shard's SHA-256 when they first load it and name a damaged one.
 */
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { writeFileAtomic } from '../io/atomic.js';
import { readModelDirExtras, generationEosIds } from '../io/checkpoint-dir.js';
import type { LoadedCheckpoint } from '../model/checkpoint.js';
import { readHfConfigFile, toHfConfig, type ModelConfig } from '../model/config.js';
import { Tokenizer } from '../tokenizer/bpe.js';
import { withChatTemplate } from '../tokenizer/chat.js';
import { packingOfDescription } from '../data/pack.js';
import { DistilleryError, fileError } from '../util/errors.js';
import { decodeWindow, decodeWindowInto, recordLayout, type RecordLayout } from './format.js';
import { formatSparse, parseSparse, type SparseEntry, type SparseRep } from './sparse.js';
import { setSparseRow, type SparseHost } from './targets.js';

export const CACHE_FORMAT = 'distillery-teacher-cache';
export const CACHE_VERSION = 2; // 2: log-probabilities in 12 bits (1/128 nat), default sample:24
const MAGIC = 'DSTLTC01';

/** What a cache is of: everything that decides its content (the job refuses to continue a cache of other parameters). */
export interface CacheIdentity {
  teacher: { path: string; architecture: string; parameters: number; vocab_size: number; weights_sha256: string; config: Record<string, unknown> };
  tokenizer_sha256: string;
  data: { files: string[]; sha256: string; documents: number; tokens: number; loss_tokens: number; max_chars: number; loss_on: string; chat_template_kwargs: string | null };
  seq: number;
  packing: string;
  windows: number;
  /** The split distill would use with these settings; every window is cached, so any split trains from the cache. */
  split: { val_fraction: number; seed: number };
  temperature: number;
  sparse: string;
  loss_vocab: number;
  sample_seed: number;
  precision: string;
  /** 'nf4' when the teacher's projection matrices ran in NF4 (absent: the compute dtype). */
  teacher_dtype?: 'nf4';
}

export interface ShardInfo { file: string; first_window: number; windows: number; positions: number; bytes: number; sha256: string }

export interface CacheManifest extends CacheIdentity {
  format: string;
  version: number;
  windows_per_shard: number;
  shards: ShardInfo[];
  complete: boolean;
  /** Bytes of the shards per counted position (null until a shard is written). */
  bytes_per_token: number | null;
}


/** The folder of a cache that holds the teacher's config, tokenizer and chat files (no weights). */
export const TEACHER_DIR = 'teacher';

/** Writes the teacher's header (config.json, tokenizer.json, tokenizer_config.json with its chat template, generation_config.json). */
export function writeTeacherHeader(dir: string, ck: LoadedCheckpoint): void {
  const t = path.join(dir, TEACHER_DIR);
  fs.mkdirSync(t, { recursive: true });
  const json = (name: string, v: unknown): void => writeFileAtomic(path.join(t, name), JSON.stringify(v, null, 1) + '\n');
  json('config.json', toHfConfig(ck.config));
  if (ck.tokenizerJson) json('tokenizer.json', ck.tokenizerJson);
  const tc = ck.chatTemplate ? withChatTemplate(ck.tokenizerConfig ?? {}, ck.chatTemplate) : { ...(ck.tokenizerConfig ?? {}) };
  // each optional file written, or removed: a header rewritten for another teacher (--overwrite) keeps nothing of the old
  const optional = (name: string, v: unknown): void => { if (v) json(name, v); else fs.rmSync(path.join(t, name), { force: true }); };
  optional('tokenizer_config.json', ck.tokenizerConfig || ck.chatTemplate ? tc : null);
  optional('generation_config.json', ck.generationConfig);
}

/** The teacher of a cache as a checkpoint without weights (config, tokenizer, chat template): what a cached run reads. */
export function readTeacherHeader(dir: string): LoadedCheckpoint {
  const t = path.join(dir, TEACHER_DIR);
  const config: ModelConfig = readHfConfigFile(path.join(t, 'config.json'), 'the teacher cache is damaged: make it again');
  const x = readModelDirExtras(t);
  const tokenizerJson = (x.tokenizerJson ?? null) as Record<string, unknown> | null;
  if (!tokenizerJson) throw new DistilleryError(`the teacher cache ${dir} has no ${TEACHER_DIR}/tokenizer.json`, 'the teacher cache is damaged: make it again');
  const generationConfig = x.generationConfig ?? null;
  return {
    config, weights: new Float32Array(0), tokenizerJson, tokenizer: Tokenizer.fromJSON(tokenizerJson), tokenizerConfig: x.tokenizerConfig ?? null,
    chatTemplate: x.chatTemplate ?? null, generationConfig, generationEosIds: generationEosIds(generationConfig, `${t}/generation_config.json`),
  };
}

export function shardName(i: number): string { return `shard-${String(i).padStart(5, '0')}.bin`; }

/** The bytes of a shard holding `records` (windows first .. first + records.length − 1). */
export function shardBytes(first: number, records: readonly Uint8Array[], positions: readonly number[]): Uint8Array {
  const n = records.length, head = 8 + 8 + 8 * n;
  const total = head + records.reduce((a, r) => a + r.length, 0);
  const out = new Uint8Array(total);
  const dv = new DataView(out.buffer);
  out.set(new TextEncoder().encode(MAGIC), 0);
  dv.setUint32(8, n, true); dv.setUint32(12, first, true);
  let o = head;
  records.forEach((r, i) => {
    dv.setUint32(16 + 4 * i, r.length, true);
    dv.setUint32(16 + 4 * n + 4 * i, positions[i]!, true);
    out.set(r, o); o += r.length;
  });
  return out;
}

export function sha256(b: Uint8Array): string { return createHash('sha256').update(b).digest('hex'); }

export function manifestPath(dir: string): string { return path.join(dir, 'manifest.json'); }

export function writeManifest(dir: string, m: CacheManifest): void {
  writeFileAtomic(manifestPath(dir), JSON.stringify(m, null, 1) + '\n');
}

/** Reads manifest.json of a cache folder (null when there is none); a file that is not a cache manifest is an error. */
export function readManifest(dir: string): CacheManifest | null {
  const file = manifestPath(dir);
  if (!fs.existsSync(file)) return null;
  const bad = (why: string): DistilleryError => new DistilleryError(`${file} is not a distillery teacher-cache manifest (${why})`,
    'point at the folder `distillery teacher-cache --out` wrote, or rerun teacher-cache into a new folder');
  let j: unknown;
  try { j = JSON.parse(fs.readFileSync(file, 'utf8')); } catch (e) {
    const f = fileError(e, `cannot read ${file}`, 'check the file and its permissions');
    throw f instanceof DistilleryError ? f : bad((e as Error).message);
  }
  if (typeof j !== 'object' || j === null) throw bad('not a JSON object');
  const m = j as Partial<CacheManifest>;
  if (m.format !== CACHE_FORMAT) throw bad(`format ${JSON.stringify(m.format)}`);
  if (m.version !== CACHE_VERSION) {
    throw new DistilleryError(`${file}: a teacher cache of format version ${JSON.stringify(m.version)}; this distillery reads version ${CACHE_VERSION}`,
      'rebuild it: rerun `distillery teacher-cache` into a new --out folder');
  }
  for (const k of ['seq', 'windows', 'loss_vocab', 'temperature', 'windows_per_shard'] as const) {
    if (typeof m[k] !== 'number' || !(m[k] > 0)) throw bad(`"${k}" must be a positive number`);
  }
  if (!Array.isArray(m.shards)) throw bad('"shards" must be a list');
  if (typeof m.packing !== 'string') throw bad('"packing" must be a string');
  try { parseSparse(String(m.sparse)); } catch { throw bad(`"sparse" is ${JSON.stringify(m.sparse)}`); }
  return m as CacheManifest;
}

/** The fields of two identities that differ, as "name: a vs b" (the first few), for refusals. */
export function identityDifferences(a: CacheIdentity, b: CacheIdentity): string[] {
  const out: string[] = [];
  const cmp = (name: string, x: unknown, y: unknown): void => {
    if (JSON.stringify(x) !== JSON.stringify(y)) out.push(`${name}: ${short(x)} vs ${short(y)}`);
  };
  cmp('teacher weights (sha256)', a.teacher.weights_sha256, b.teacher.weights_sha256);
  cmp('teacher config', a.teacher.config, b.teacher.config);
  cmp('tokenizer (sha256)', a.tokenizer_sha256, b.tokenizer_sha256);
  cmp('data (sha256)', a.data.sha256, b.data.sha256);
  // (the data's hash is of its documents in order: the same files named by another path are the same data)
  cmp('--loss-on', a.data.loss_on, b.data.loss_on);
  cmp('--chat-template-kwargs', a.data.chat_template_kwargs, b.data.chat_template_kwargs);
  cmp('--max-chars', a.data.max_chars, b.data.max_chars);
  cmp('--seq', a.seq, b.seq);
  cmp('packing', a.packing, b.packing);
  cmp('--temperature', a.temperature, b.temperature);
  cmp('--sparse', a.sparse, b.sparse);
  cmp('--seed (sampling)', a.sample_seed, b.sample_seed);
  cmp('loss vocabulary', a.loss_vocab, b.loss_vocab);
  cmp('precision', a.precision, b.precision);
  cmp('--teacher-dtype', a.teacher_dtype ?? 'auto', b.teacher_dtype ?? 'auto');
  return out;
}

function short(x: unknown): string {
  const s = typeof x === 'string' ? x : JSON.stringify(x);
  return s.length > 24 && /^[0-9a-f]+$/.test(s) ? s.slice(0, 16) + '…' : s.length > 80 ? s.slice(0, 77) + '…' : s;
}

/** What a distill run expects of its cache (compared by TeacherCache.checkRun). */
export interface CacheExpectation {
  tokenizerSha256: string;
  dataSha256: string;
  seq: number;
  temperature: number;
  lossOn: string;
  /** describePacking of the run's packing. */
  packing: string;
  windows: number;
  lossVocab: number;
}

/** A complete teacher cache, opened for reading by a distill run or `inspect`. */
export class TeacherCache {
  readonly rep: SparseRep;
  readonly layout: RecordLayout;
  private readonly loaded = new Map<number, { records: Uint8Array[]; positions: number[] }>();

  private constructor(readonly dir: string, readonly manifest: CacheManifest) {
    this.rep = parseSparse(manifest.sparse);
    this.layout = recordLayout(this.rep, manifest.loss_vocab);
  }

  static open(dir: string): TeacherCache {
    const m = readManifest(dir);
    if (!m) {
      throw new DistilleryError(`--teacher-cache ${dir}: no manifest.json there`,
        'create the cache with `distillery teacher-cache --teacher T --data D --seq S --out DIR` and pass that DIR');
    }
    if (!m.complete) {
      throw new DistilleryError(`the teacher cache ${dir} is incomplete (${m.shards.reduce((a, s) => a + s.windows, 0)} of ${m.windows} windows written)`,
        'rerun the teacher-cache command that made it: it continues where it stopped');
    }
    return new TeacherCache(dir, m);
  }

  /** The teacher's config, tokenizer and chat files (no weights). */
  teacherHeader(): LoadedCheckpoint { return readTeacherHeader(this.dir); }

  /** Refuses a cache that was not made for this run, naming every difference. */
  checkRun(e: CacheExpectation): void {
    const m = this.manifest, diffs: string[] = [];
    if (m.tokenizer_sha256 !== e.tokenizerSha256) diffs.push(`tokenizer (sha256 ${short(m.tokenizer_sha256)} in the cache, ${short(e.tokenizerSha256)} for this run)`);
    if (m.data.loss_on !== e.lossOn) diffs.push(`--loss-on (${m.data.loss_on} in the cache, ${e.lossOn} for this run)`);
    if (m.data.sha256 !== e.dataSha256) diffs.push(`data (sha256 ${short(m.data.sha256)} of ${m.data.files.join(', ')} in the cache, ${short(e.dataSha256)} for this run)`);
    if (m.seq !== e.seq) diffs.push(`--seq (${m.seq} in the cache, ${e.seq} for this run)`);
    if (m.packing !== e.packing) {
      const mode = packingOfDescription(m.packing);
      // (a 'bfd' cache from before documents attended only to themselves names no packing this version makes)
      diffs.push(`packing (${m.packing} in the cache, ${e.packing} for this run${mode ? `; the cache's is --packing ${mode}`
        : '; an earlier version\'s packing: its teacher saw the documents of a window attend to each other'})`);
    }
    if (m.temperature !== e.temperature) diffs.push(`--temperature (${m.temperature} in the cache, ${e.temperature} for this run)`);
    if (m.loss_vocab !== e.lossVocab) diffs.push(`loss vocabulary (${m.loss_vocab} tokens in the cache, ${e.lossVocab} for this run)`);
    if (diffs.length === 0 && m.windows !== e.windows) diffs.push(`windows (${m.windows} in the cache, ${e.windows} for this run)`);
    if (diffs.length) {
      throw new DistilleryError(`the teacher cache ${this.dir} does not match this run: ${diffs.join('; ')}`,
        'run distill with the settings the cache was made with (see `distillery inspect ' + this.dir + '`), or make a new cache for these');
    }
  }

  private shardOf(window: number): number {
    const i = Math.floor(window / this.manifest.windows_per_shard);
    const s = this.manifest.shards[i];
    if (!s || window < s.first_window || window >= s.first_window + s.windows) {
      throw new DistilleryError(`the teacher cache ${this.dir} has no shard for window ${window}`, 'the manifest is damaged: rerun teacher-cache into a new folder');
    }
    return i;
  }

  /** Loads and verifies shard i (once). */
  private shard(i: number): { records: Uint8Array[]; positions: number[] } {
    const have = this.loaded.get(i);
    if (have) return have;
    const s = this.manifest.shards[i]!;
    const file = path.join(this.dir, s.file);
    const damaged = (why: string): DistilleryError => new DistilleryError(`the teacher cache's shard ${file} is damaged (${why})`,
      'rerun the teacher-cache command that made the cache: it verifies every shard and rewrites damaged ones');
    let bytes: Uint8Array;
    try { bytes = fs.readFileSync(file); } catch (e) {
      const f = fileError(e, `cannot read the teacher cache's shard ${file}`, 'rerun the teacher-cache command that made the cache to rewrite missing shards');
      throw f instanceof DistilleryError ? f : damaged((e as Error).message);
    }
    if (bytes.length !== s.bytes) throw damaged(`${bytes.length} bytes, the manifest says ${s.bytes}`);
    if (sha256(bytes) !== s.sha256) throw damaged('its SHA-256 differs from the manifest\'s');
    const parsed = parseShard(bytes);
    if (!parsed || parsed.first !== s.first_window || parsed.records.length !== s.windows) throw damaged('its header does not match the manifest');
    const out = { records: parsed.records, positions: parsed.positions };
    this.loaded.set(i, out);
    return out;
  }

  /** The sparse teacher of window `w`'s counted positions, in order. */
  entries(w: number): SparseEntry[] {
    const i = this.shardOf(w);
    const sh = this.shard(i);
    const k = w - this.manifest.shards[i]!.first_window;
    try { return decodeWindow(this.layout, sh.records[k]!, sh.positions[k]!); } catch (e) {
      throw new DistilleryError(`the teacher cache's shard ${this.manifest.shards[i]!.file} holds an unreadable record for window ${w} (${(e as Error).message})`,
        'rerun teacher-cache into a new folder');
    }
  }

  /**
   * Fills `host` for a batch of windows (ids[b], each `t` positions, mask[b·t + p] > 0 where a position counts): the
   * counted positions get the window's entries in order, the others an empty row. A window whose counted positions
   * differ from the cache's is refused (the data or --loss-on changed under the cache).
   */
  fillBatch(host: SparseHost, ids: ArrayLike<number>, mask: Float32Array, t: number): void {
    const rows: number[] = [];
    for (let b = 0; b < ids.length; b++) {
      const w = ids[b]!;
      rows.length = 0;
      for (let p = 0; p < t; p++) {
        if (w >= 0 && mask[b * t + p]! > 0) rows.push(b * t + p);
        else setSparseRow(host, b * t + p, null, this.rep);
      }
      if (w < 0) continue;
      const i = this.shardOf(w), sh = this.shard(i), k = w - this.manifest.shards[i]!.first_window;
      if (rows.length !== sh.positions[k]) {
        throw new DistilleryError(`window ${w} has ${rows.length} counted positions but the teacher cache holds ${sh.positions[k]}`,
          'the data changed since the cache was made: make a new cache');
      }
      try { decodeWindowInto(this.layout, sh.records[k]!, rows, host); } catch (e) {
        throw new DistilleryError(`the teacher cache's shard ${this.manifest.shards[i]!.file} holds an unreadable record for window ${w} (${(e as Error).message})`,
          'rerun teacher-cache into a new folder');
      }
    }
  }

  /** Counted positions and bytes over all shards. */
  totals(): { positions: number; bytes: number } {
    return this.manifest.shards.reduce((a, s) => ({ positions: a.positions + s.positions, bytes: a.bytes + s.bytes }), { positions: 0, bytes: 0 });
  }

  describe(): string {
    const m = this.manifest, t = this.totals();
    return `teacher cache ${this.dir}: ${formatSparse(this.rep)} at temperature ${m.temperature}, ${m.windows} windows of ${m.seq} ` +
      `(${t.positions} counted positions), ${(t.bytes / 2 ** 20).toFixed(1)} MiB, ${(t.bytes / Math.max(t.positions, 1)).toFixed(1)} bytes per token; ` +
      `teacher ${m.teacher.architecture} ${(m.teacher.parameters / 1e6).toFixed(1)}M (${m.teacher.path})`;
  }
}

/** The header and records of a shard's bytes, or null when they are not a shard. */
export function parseShard(bytes: Uint8Array): { first: number; records: Uint8Array[]; positions: number[] } | null {
  if (bytes.length < 16 || new TextDecoder().decode(bytes.subarray(0, 8)) !== MAGIC) return null;
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = dv.getUint32(8, true), first = dv.getUint32(12, true);
  const head = 16 + 8 * n;
  if (head > bytes.length) return null;
  const records: Uint8Array[] = [], positions: number[] = [];
  let o = head;
  for (let i = 0; i < n; i++) {
    const len = dv.getUint32(16 + 4 * i, true);
    if (o + len > bytes.length) return null;
    records.push(bytes.subarray(o, o + len));
    positions.push(dv.getUint32(16 + 4 * n + 4 * i, true));
    o += len;
  }
  return o === bytes.length ? { first, records, positions } : null;
}
