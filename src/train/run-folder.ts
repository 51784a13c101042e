/**
 * Guards around a run folder (`--out`): one run at a time (a lock file), no silent reuse of a folder that already
 * holds a run, no writes through symbolic links, and a hash of the training data for `--resume`.
 *
 * The lock is `<out>/run.lock`, a JSON object {pid, hostname, started}, created with O_CREAT | O_EXCL (so two runs
 * cannot both create it) and removed when the run ends. A lock left by a crashed run is stale when its host is
 * this host and its pid is no longer alive: it is then taken over. A lock held by a live process, or by a process on
 * another host (its pid cannot be checked from here), is a DistilleryError naming the holder.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { createHash } from 'node:crypto';
import { DistilleryError } from '../util/errors.js';

export const LOCK_FILE = 'run.lock';

/** The files and folders a run writes in its run folder (relative names). */
export const RUN_ENTRIES = ['metrics.jsonl', 'summary.json', 'loss.svg', 'tokenizer.json', 'checkpoints', 'final', LOCK_FILE] as const;
/** Entries whose presence means the folder already holds a run. */
const RUN_MARKERS = ['metrics.jsonl', 'summary.json', 'checkpoints', 'final'] as const;

export interface LockInfo {
  pid: number;
  hostname: string;
  started: string;
}

function pidAlive(pid: number): boolean {
  if (pid === process.pid) return true;
  try { process.kill(pid, 0); return true; } catch (e) { return (e as NodeJS.ErrnoException).code === 'EPERM'; }
}

function readLock(file: string): LockInfo | null {
  try {
    const j = JSON.parse(fs.readFileSync(file, 'utf8')) as Partial<LockInfo>;
    if (typeof j.pid === 'number' && typeof j.hostname === 'string') return { pid: j.pid, hostname: j.hostname, started: String(j.started ?? '?') };
  } catch { /* unreadable or half-written */ }
  return null;
}

/** A held run-folder lock; `release()` removes the lock file (only if it is still this process's). */
export class RunLock {
  private released = false;
  constructor(readonly file: string) {}

  release(): void {
    if (this.released) return;
    this.released = true;
    const info = readLock(this.file);
    if (info && info.pid === process.pid && info.hostname === os.hostname()) {
      try { fs.unlinkSync(this.file); } catch { /* already gone */ }
    }
  }
}

/** Takes `<out>/run.lock` (see the module comment); throws a DistilleryError when another run holds it. */
export function lockRunFolder(out: string): RunLock {
  const file = path.join(out, LOCK_FILE);
  const info: LockInfo = { pid: process.pid, hostname: os.hostname(), started: new Date().toISOString() };
  for (let attempt = 0; attempt < 3; attempt++) {
    let fd: number;
    try {
      fd = fs.openSync(file, fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_WRONLY | fs.constants.O_NOFOLLOW, 0o644);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code !== 'EEXIST') {
        throw new DistilleryError(`cannot create the lock file ${file}: ${(e as Error).message}`, 'check that the run folder is writable');
      }
      if (fs.lstatSync(file, { throwIfNoEntry: false })?.isSymbolicLink()) {
        throw new DistilleryError(`${file} is a symbolic link`, 'distillery does not write through links in the run folder: remove the link');
      }
      const holder = readLock(file);
      if (holder === null) {
        // Half-written (a crash between create and write) or damaged: stale once it is old enough.
        const age = Date.now() - (fs.statSync(file, { throwIfNoEntry: false })?.mtimeMs ?? 0);
        if (age < 10_000) {
          throw new DistilleryError(`the run folder ${out} is being locked by another run (${file} was just created)`, 'wait for the other run, or use another --out');
        }
      } else if (holder.hostname !== os.hostname()) {
        throw new DistilleryError(`the run folder ${out} is locked by pid ${holder.pid} on host ${holder.hostname} (since ${holder.started})`,
          `another run may be writing it: use another --out; if that run is over, delete ${file}`);
      } else if (pidAlive(holder.pid)) {
        throw new DistilleryError(`the run folder ${out} is in use by another run (pid ${holder.pid}, since ${holder.started})`,
          'wait for it to finish or stop it, or use another --out');
      }
      // Stale: move it aside under a unique name (so two runs taking over cannot remove each other's new lock).
      const aside = `${file}.stale-${process.pid}-${Date.now()}`;
      try { fs.renameSync(file, aside); fs.rmSync(aside, { force: true }); } catch { /* another run took it over first */ }
      continue;
    }
    try {
      fs.writeSync(fd, JSON.stringify(info) + '\n');
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    return new RunLock(file);
  }
  throw new DistilleryError(`cannot take the lock ${file}: other runs keep taking it`, 'use another --out');
}

/** Refuses symbolic links among the run folder's entries (and inside checkpoints/): nothing is written through them. */
export function checkNoSymlinks(out: string): void {
  const names: string[] = [...RUN_ENTRIES, 'checkpoints/latest', 'checkpoints/best', 'checkpoints/latest.old', 'checkpoints/best.old'];
  for (const rel of names) {
    const p = path.join(out, rel);
    const st = fs.lstatSync(p, { throwIfNoEntry: false });
    if (st?.isSymbolicLink()) {
      throw new DistilleryError(`${p} is a symbolic link; distillery never writes through links in a run folder`,
        `remove the link (the file it points to is left untouched), or use another --out`);
    }
  }
}

/** True when the folder already holds a run's files (metrics, summary, checkpoints or a final model). */
export function holdsRun(out: string): boolean {
  return RUN_MARKERS.some((n) => fs.lstatSync(path.join(out, n), { throwIfNoEntry: false }) !== undefined);
}

/** Removes a previous run's files (for --overwrite); other files in the folder are left alone. */
export function clearRun(out: string): void {
  for (const n of RUN_ENTRIES) {
    if (n === LOCK_FILE) continue;
    fs.rmSync(path.join(out, n), { recursive: true, force: true });
  }
}

/** SHA-256 over the training documents (length-prefixed, so document boundaries count), as hex. */
/**
 * The data hash of documents with loss spans: hashDocuments of the texts when no document has spans (what earlier
 * versions recorded), else the texts and their spans.
 */
export function hashDocs(docs: ReadonlyArray<{ text: string; lossSpans: ReadonlyArray<readonly [number, number]> | null }>): string {
  const texts = docs.map((d) => d.text);
  if (docs.every((d) => d.lossSpans === null)) return hashDocuments(texts);
  return createHash('sha256').update(hashDocuments(texts)).update(JSON.stringify(docs.map((d) => d.lossSpans))).digest('hex');
}

export function hashDocuments(docs: readonly string[]): string {
  const h = createHash('sha256');
  const len = Buffer.alloc(8);
  for (const d of docs) {
    const b = Buffer.from(d, 'utf8');
    len.writeBigUInt64LE(BigInt(b.length));
    h.update(len);
    h.update(b);
  }
  return h.digest('hex');
}
