/**
 * The record of a cache job's finished shards. The manifest has one writer, rank 0 (one process: the only rank): it
 * lists each shard it writes at once. The other ranks of a job of several processes (`teacher-cache --gpus N`, or
 * torchrun's variables) write beside each shard a note, `shard-NNNNN.json` (the shard's ShardInfo, written atomically
 * after the shard), which rank 0 folds into the manifest after each of its own shards and at the end of the job; a
 * note still in the folder when a job stopped (a rank killed) is verified against its shard (size and SHA-256) and
 * folded in when the job is rerun, so a killed rank loses at most the shard it was computing.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { writeFileAtomic } from '../io/atomic.js';
import { fileError } from '../util/errors.js';
import { sha256, writeManifest, type CacheManifest, type ShardInfo } from './store.js';

/** The note a rank other than 0 writes beside shard i. */
export function shardNoteName(i: number): string { return `shard-${String(i).padStart(5, '0')}.json`; }
const NOTE = /^shard-(\d+)\.json$/;

/** Whether a shard in the folder holds exactly what `s` lists (size and SHA-256). */
export function shardIntact(dir: string, s: ShardInfo): boolean {
  const file = path.join(dir, s.file);
  return fs.existsSync(file) && fs.statSync(file).size === s.bytes && sha256(fs.readFileSync(file)) === s.sha256;
}

export class ShardLedger {
  /** Shard index → what the manifest lists (rank 0's view; the other ranks keep their own shards only). */
  readonly done = new Map<number, ShardInfo>();

  /** Shards of the cache: ceil(windows / shardWindows). */
  readonly nShards: number;

  constructor(private readonly dir: string, private readonly rank: number, windows: number, readonly shardWindows: number,
    private readonly manifestOf: (shards: ShardInfo[], complete: boolean) => CacheManifest) {
    this.nShards = Math.ceil(windows / shardWindows);
  }

  /** The windows listed so far. */
  windowsDone(): number { return [...this.done.values()].reduce((a, s) => a + s.windows, 0); }

  manifest(): CacheManifest {
    const shards = [...this.done.entries()].sort((a, b) => a[0] - b[0]).map(([, s]) => s);
    return this.manifestOf(shards, this.done.size === this.nShards);
  }

  /** Rank 0: writes the manifest as it stands. */
  write(): void { writeManifest(this.dir, this.manifest()); }

  /** A shard this rank has written: listed in the manifest (rank 0), or noted beside it (another rank). */
  record(i: number, info: ShardInfo): void {
    this.done.set(i, info);
    if (this.rank === 0) { this.write(); return; }
    try { writeFileAtomic(path.join(this.dir, shardNoteName(i)), JSON.stringify(info) + '\n'); } catch (e) {
      throw fileError(e, `cannot write ${path.join(this.dir, shardNoteName(i))}`, 'free disk space, then rerun the command: it continues where it stopped');
    }
  }

  /**
   * Rank 0: lists the shards the other ranks have noted, removes their notes, and rewrites the manifest if any was new.
   * `verify` (a rerun adopting what a stopped job left): only shards whose size and SHA-256 match their note; a note
   * of a missing or damaged shard goes with it. Returns the number of shards listed.
   */
  fold(verify: boolean): number {
    const notes: string[] = [];
    let n = 0;
    for (const f of fs.readdirSync(this.dir)) {
      const m = NOTE.exec(f);
      if (!m) continue;
      const i = Number(m[1]), note = path.join(this.dir, f);
      notes.push(note);
      let info: ShardInfo | null = null;
      try { info = JSON.parse(fs.readFileSync(note, 'utf8')) as ShardInfo; } catch { info = null; }
      const ok = info !== null && typeof info.file === 'string' && info.file === `shard-${m[1]}.bin` && i < this.nShards &&
        (!verify || shardIntact(this.dir, info));
      if (ok && !this.done.has(i)) { this.done.set(i, info!); n++; }
      // during a job a note that cannot be read stays (a later fold may read it); a rerun drops what it cannot adopt
      if (!ok && !verify) notes.pop();
    }
    // the manifest lists them before their notes go: a stop in between leaves notes of listed shards, which fold again
    if (n > 0) this.write();
    for (const note of notes) fs.rmSync(note, { force: true });
    return n;
  }
}
