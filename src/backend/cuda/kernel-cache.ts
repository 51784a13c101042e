/**
 * THE kernel cache: the one place a generated kernel becomes a CUBIN.
 *
 * - Key (correct by construction, never hand-typed):
 *     sha256(source + "\0" + options.join(" ") + "\0" + arch + "\0" + compiler.version + "\0" + compiler.build)
 *   where compiler.version is e.g. 'nvrtc-11.8' and compiler.build identifies the library file itself (its real
 *   name, size and a hash of its first MiB), so two builds of one NVRTC version never share entries.
 * - Tiers: memory → disk → compile. Disk lives in $DISTILLERY_CACHE_DIR, else $XDG_CACHE_HOME/distillery/kernels,
 *   else ~/.cache/distillery/kernels. One file per key, `<key>.cubin`, written atomically (temp + rename), with
 *   a header [magic 8 | key 64 | payload length u64 | sha256(payload) 32 | payload]. A corrupt, truncated or
 *   foreign file is reported, recompiled and rewritten: never trusted, never a crash. Only regular files are read
 *   (opened with O_NOFOLLOW | O_NONBLOCK, then fstat'ed: a FIFO, a device or a symbolic link — e.g. one to
 *   /dev/zero — is reported and skipped instead of blocking or reading forever), and a read is bounded by the
 *   header's declared payload length (at most MAX_ENTRY_BYTES), which must match the file's size. Disk errors
 *   (read-only cache folder) degrade to memory-only with one warning.
 * - `prewarm(specs)` loads or compiles every missing kernel (compiles run in parallel), then `seal()`s.
 *   After the seal, a `get()` that misses prints `[kernel-cache] miss after pre-warm: <kernel> <params>` and,
 *   in strict mode, throws. Strict is the default when NODE_ENV=test or DISTILLERY_STRICT_KERNELS=1.
 * - Verbose (DISTILLERY_VERBOSE_KERNELS=1 or the option) prints `[kernel-cache] compile <name> <key> <ms>`.
 * - `summary()`: `[kernel-cache] compiled N, loaded from disk N, hits N, misses after seal N`.
 */
import { createHash, randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import { availableParallelism, homedir } from 'node:os';
import { dirname, join } from 'node:path';
import { DistilleryError } from '../../util/errors.js';
import type { KernelSpec } from './kernels/spec.js';
import type { KernelCompiler } from './ffi/nvrtc.js';

export const CACHE_MAGIC = Buffer.from('DSTLKRN1', 'ascii');
const HEADER_BYTES = 8 + 64 + 8 + 32;

export function defaultCacheDir(env: Record<string, string | undefined> = process.env): string {
  if (env.DISTILLERY_CACHE_DIR) return env.DISTILLERY_CACHE_DIR;
  if (env.XDG_CACHE_HOME) return join(env.XDG_CACHE_HOME, 'distillery', 'kernels');
  return join(homedir(), '.cache', 'distillery', 'kernels');
}

export function defaultStrict(env: Record<string, string | undefined> = process.env): boolean {
  return env.NODE_ENV === 'test' || env.DISTILLERY_STRICT_KERNELS === '1';
}

/** The compile options every kernel gets (part of the key). */
export function compileOptions(arch: string, extra: readonly string[] = []): string[] {
  return [`--gpu-architecture=${arch}`, '--std=c++17', ...extra];
}

/** What a key takes from the compiler: its version and the identity of its build (see KernelCompiler). */
export type CompilerIdentity = Pick<KernelCompiler, 'version' | 'build'>;

/** THE cache key (the only place one is derived). */
export function cacheKey(source: string, options: readonly string[], arch: string, compiler: CompilerIdentity): string {
  return createHash('sha256')
    .update(`${source}\0${options.join(' ')}\0${arch}\0${compiler.version}\0${compiler.build}`).digest('hex');
}

/** File operations the atomic writer uses (injectable so tests can simulate a crash mid-write). */
export interface WriteOps {
  writeFileSync(path: string, data: Uint8Array): void;
  renameSync(from: string, to: string): void;
  unlinkSync(path: string): void;
}
const realOps: WriteOps = {
  writeFileSync: (p, d) => fs.writeFileSync(p, d, { flag: 'wx' }),
  renameSync: fs.renameSync,
  unlinkSync: fs.unlinkSync,
};

/** Writes to a unique temp file next to `path`, then renames over it: readers see the old file or the new one. */
export function writeFileAtomic(path: string, data: Uint8Array, ops: WriteOps = realOps): void {
  const tmp = `${path}.tmp-${process.pid}-${randomBytes(6).toString('hex')}`;
  try {
    ops.writeFileSync(tmp, data);
    ops.renameSync(tmp, path);
  } catch (e) {
    try { ops.unlinkSync(tmp); } catch { /* never created */ }
    throw e;
  }
}

export function encodeEntry(key: string, payload: Uint8Array): Buffer {
  const out = Buffer.alloc(HEADER_BYTES + payload.length);
  CACHE_MAGIC.copy(out, 0);
  out.write(key, 8, 64, 'ascii');
  out.writeBigUInt64LE(BigInt(payload.length), 72);
  createHash('sha256').update(payload).digest().copy(out, 80);
  out.set(payload, HEADER_BYTES);
  return out;
}

/** The payload, or the reason the file cannot be trusted. */
export function decodeEntry(key: string, file: Buffer): { payload: Uint8Array } | { bad: string } {
  if (file.length < HEADER_BYTES) return { bad: `truncated header (${file.length} bytes)` };
  const h = checkHeader(key, file.subarray(0, HEADER_BYTES), file.length);
  if ('bad' in h) return h;
  const payload = file.subarray(HEADER_BYTES);
  if (!createHash('sha256').update(payload).digest().equals(file.subarray(80, 112))) return { bad: 'checksum mismatch' };
  return { payload: new Uint8Array(payload) };
}

/** The largest payload a cache entry may declare (a CUBIN is kilobytes to a few megabytes). */
export const MAX_ENTRY_BYTES = 256 * 1024 * 1024;

/** What kind of file system object `st` is, for messages. */
export function fileKind(st: fs.Stats): string {
  if (st.isFile()) return 'regular file';
  if (st.isDirectory()) return 'directory';
  if (st.isSymbolicLink()) return 'symbolic link';
  if (st.isFIFO()) return 'FIFO (named pipe)';
  if (st.isSocket()) return 'socket';
  if (st.isCharacterDevice()) return 'character device';
  if (st.isBlockDevice()) return 'block device';
  return 'special file';
}

/** Result of reading one cache file: its payload, why it cannot be used, or that there is none. */
export type EntryRead = { payload: Uint8Array } | { bad: string; skipped?: true } | { missing: true };

/**
 * Reads the cache entry at `p` for `key` safely: a symbolic link or anything but a regular file is refused without
 * reading it (`skipped`), and no more bytes are read than the header declares (and the file holds).
 */
export function readEntryFile(p: string, key: string): EntryRead {
  let fd: number;
  try {
    fd = fs.openSync(p, fs.constants.O_RDONLY | (fs.constants.O_NOFOLLOW ?? 0) | (fs.constants.O_NONBLOCK ?? 0));
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return { missing: true };
    if (code === 'ELOOP') return { bad: 'a symbolic link (the cache reads only regular files, never through links)', skipped: true };
    return { bad: `cannot be opened (${code ?? (e as Error).message})`, skipped: true };
  }
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) return { bad: `a ${fileKind(st)}, not a regular file`, skipped: true };
    const header = Buffer.alloc(HEADER_BYTES);
    const got = fs.readSync(fd, header, 0, HEADER_BYTES, 0);
    if (got < HEADER_BYTES) return { bad: `truncated header (${got} bytes)` };
    const h = checkHeader(key, header, st.size);
    if ('bad' in h) return h;
    const payload = Buffer.alloc(h.length);
    let off = 0;
    while (off < h.length) {
      const n = fs.readSync(fd, payload, off, h.length - off, HEADER_BYTES + off);
      if (n === 0) break;
      off += n;
    }
    if (off !== h.length) return { bad: `payload length ${h.length} but only ${off} bytes could be read` };
    if (!createHash('sha256').update(payload).digest().equals(header.subarray(80, 112))) return { bad: 'checksum mismatch' };
    return { payload: new Uint8Array(payload) };
  } catch (e) {
    return { bad: `cannot be read (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})` };
  } finally {
    fs.closeSync(fd);
  }
}

/** Checks an entry's header against the key and the file's size; the declared payload length, or the reason. */
function checkHeader(key: string, header: Buffer, fileBytes: number): { length: number } | { bad: string } {
  if (!header.subarray(0, 8).equals(CACHE_MAGIC)) return { bad: 'not a distillery kernel file (bad magic)' };
  const k = header.toString('ascii', 8, 72);
  if (k !== key) return { bad: `holds key ${k.slice(0, 16)}…, expected ${key.slice(0, 16)}…` };
  const len = header.readBigUInt64LE(72);
  if (len > BigInt(MAX_ENTRY_BYTES)) return { bad: `declares a payload of ${len} bytes (more than the ${MAX_ENTRY_BYTES}-byte limit)` };
  if (len !== BigInt(fileBytes - HEADER_BYTES)) return { bad: `payload length ${len} but ${fileBytes - HEADER_BYTES} bytes present` };
  return { length: Number(len) };
}

export interface KernelCacheOptions {
  compiler: KernelCompiler;
  /** Target architecture, e.g. 'sm_90'. */
  arch: string;
  /** Cache folder; null disables the disk tier; undefined → defaultCacheDir(). */
  dir?: string | null;
  strict?: boolean;
  verbose?: boolean;
  /** Where diagnostic lines go (default: stderr). */
  log?: (line: string) => void;
  /** Extra NVRTC options (part of the key). */
  extraOptions?: readonly string[];
}

export interface CacheCounters { compiled: number; loadedFromDisk: number; hits: number; missesAfterSeal: number; diskRejected: number }

export class KernelCache {
  readonly compiler: KernelCompiler;
  readonly arch: string;
  readonly dir: string | null;
  readonly strict: boolean;
  readonly verbose: boolean;
  readonly options: readonly string[];
  readonly counters: CacheCounters = { compiled: 0, loadedFromDisk: 0, hits: 0, missesAfterSeal: 0, diskRejected: 0 };
  private readonly log: (line: string) => void;
  private readonly mem = new Map<string, Uint8Array>();
  private readonly keys = new WeakMap<KernelSpec, string>();
  private isSealed = false;
  private diskBroken = false;

  constructor(o: KernelCacheOptions) {
    this.compiler = o.compiler;
    this.arch = o.arch;
    this.dir = o.dir === undefined ? defaultCacheDir() : o.dir;
    this.strict = o.strict ?? defaultStrict();
    this.verbose = o.verbose ?? process.env.DISTILLERY_VERBOSE_KERNELS === '1';
    this.log = o.log ?? ((l) => process.stderr.write(`${l}\n`));
    this.options = Object.freeze(compileOptions(o.arch, o.extraOptions));
  }

  get sealed(): boolean { return this.isSealed; }

  keyOf(spec: KernelSpec): string {
    let k = this.keys.get(spec);
    if (k === undefined) {
      k = cacheKey(spec.source(), this.options, this.arch, this.compiler);
      this.keys.set(spec, k);
    }
    return k;
  }

  has(spec: KernelSpec): boolean { return this.mem.has(this.keyOf(spec)); }

  /** The CUBIN for spec. After seal(), a miss is logged (and thrown in strict mode). */
  get(spec: KernelSpec): Uint8Array {
    const key = this.keyOf(spec);
    const hit = this.mem.get(key);
    if (hit) { this.counters.hits++; return hit; }
    if (this.isSealed) {
      this.counters.missesAfterSeal++;
      this.log(`[kernel-cache] miss after pre-warm: ${spec.describe()}`);
      if (this.strict) {
        throw new DistilleryError(
          `kernel ${spec.describe()} was not pre-warmed (the kernel cache is sealed)`,
          'the pre-warm plan and the step took different code paths; plan with the same closures the run executes',
        );
      }
    }
    const fromDisk = this.readDisk(key);
    if (fromDisk) { this.mem.set(key, fromDisk); return fromDisk; }
    const t0 = performance.now();
    const cubin = this.compiler.compileSync(spec.source(), spec.entry, this.options, spec.describe());
    this.stored(spec, key, cubin, performance.now() - t0);
    return cubin;
  }

  /** Loads or compiles every spec not yet in memory (compiles in parallel), then seals. */
  async prewarm(specs: Iterable<KernelSpec>, opts: { concurrency?: number; seal?: boolean } = {}): Promise<void> {
    const todo = new Map<string, KernelSpec>();
    for (const s of specs) {
      const key = this.keyOf(s);
      if (this.mem.has(key) || todo.has(key)) continue;
      const fromDisk = this.readDisk(key);
      if (fromDisk) this.mem.set(key, fromDisk); else todo.set(key, s);
    }
    const queue = [...todo.entries()];
    const workers = Math.max(1, Math.min(opts.concurrency ?? Math.min(8, availableParallelism()), queue.length));
    const errors: unknown[] = [];
    const worker = async (): Promise<void> => {
      for (let item = queue.shift(); item; item = queue.shift()) {
        const [key, spec] = item;
        const t0 = performance.now();
        try {
          const cubin = await this.compiler.compile(spec.source(), spec.entry, this.options, spec.describe());
          this.stored(spec, key, cubin, performance.now() - t0);
        } catch (e) { errors.push(e); }
      }
    };
    await Promise.all(Array.from({ length: workers }, worker));
    if (errors.length) throw errors[0];
    if (opts.seal ?? true) this.seal();
  }

  seal(): void { this.isSealed = true; }

  summary(): string {
    const c = this.counters;
    return `[kernel-cache] compiled ${c.compiled}, loaded from disk ${c.loadedFromDisk}, hits ${c.hits}, misses after seal ${c.missesAfterSeal}`;
  }

  private stored(spec: KernelSpec, key: string, cubin: Uint8Array, ms: number): void {
    this.counters.compiled++;
    this.mem.set(key, cubin);
    if (this.verbose) this.log(`[kernel-cache] compile ${spec.describe()} ${key} ${ms.toFixed(0)}ms`);
    this.writeDisk(key, cubin);
  }

  private path(key: string): string { return join(this.dir!, `${key}.cubin`); }

  private readDisk(key: string): Uint8Array | null {
    if (this.dir === null) return null;
    const p = this.path(key);
    const r = readEntryFile(p, key);
    if ('missing' in r) return null;
    if ('bad' in r) {
      this.counters.diskRejected++;
      this.log(`[kernel-cache] ignoring ${p}: ${r.bad}; recompiling`);
      return null;
    }
    this.counters.loadedFromDisk++;
    return r.payload;
  }

  private writeDisk(key: string, cubin: Uint8Array): void {
    if (this.dir === null || this.diskBroken) return;
    const p = this.path(key);
    try {
      fs.mkdirSync(dirname(p), { recursive: true });
      writeFileAtomic(p, encodeEntry(key, cubin));
    } catch (e) {
      this.diskBroken = true;
      this.log(`[kernel-cache] cannot write ${this.dir} (${(e as Error).message}); caching in memory only`);
    }
  }
}
