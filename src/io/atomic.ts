/**
 * Crash-safe file and directory writes.
 *
 * - `writeFileAtomic(path, data)`: writes a temp file in the same directory, fsyncs it, renames it over the target
 *   (rename within one directory is atomic on POSIX), then fsyncs the directory. A reader sees the old file or the
 *   new one, never half of either; a failed write leaves no temp behind.
 * - `replaceDirAtomic(finalDir, fill)`: `fill` builds a complete new directory next to the target
 *   (`<final>.tmp-<pid>-<rand>`); only when it has finished is it swapped in: `final -> final.old`,
 *   `tmp -> final`, then `final.old` is removed. If `fill` throws, the temp directory is removed and the previous
 *   directory is untouched. If the process dies between the two renames, `recoverDir(final)` (called by
 *   `replaceDirAtomic` itself and by `loadModelDir`) restores `final.old` when `final` is missing.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { randomBytes } from 'node:crypto';
import { DistilleryError, fileError } from '../util/errors.js';

function tmpSuffix(): string {
  return `${process.pid}-${randomBytes(4).toString('hex')}`;
}

function fsyncDir(dir: string): void {
  // Best effort: some platforms/filesystems do not allow opening a directory for fsync.
  let fd: number | undefined;
  try {
    fd = fs.openSync(dir, 'r');
    fs.fsyncSync(fd);
  } catch {
    /* ignore */
  } finally {
    if (fd !== undefined) try { fs.closeSync(fd); } catch { /* ignore */ }
  }
}

function describeFsError(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

/**
 * Writes a file through a temp file + fsync + rename. `write` receives an open file descriptor and writes the
 * content (use it to stream large files without building one big buffer).
 */
export function writeFileAtomicWith(file: string, write: (fd: number) => void): void {
  const dir = path.dirname(path.resolve(file));
  if (!fs.existsSync(dir)) {
    throw new DistilleryError(`cannot write ${file}: folder ${dir} does not exist`, 'create the folder first or choose another path');
  }
  const tmp = path.join(dir, `.${path.basename(file)}.tmp-${tmpSuffix()}`);
  let fd: number | undefined;
  try {
    fd = fs.openSync(tmp, 'wx');
    write(fd);
    fs.fsyncSync(fd);
    fs.closeSync(fd);
    fd = undefined;
    fs.renameSync(tmp, file);
  } catch (e) {
    if (fd !== undefined) try { fs.closeSync(fd); } catch { /* ignore */ }
    try { fs.rmSync(tmp, { force: true }); } catch { /* ignore */ }
    throw fileError(e, `cannot write ${file}`, 'the previous file is unchanged; free disk space (or choose a folder you can write to) and retry');
  }
  fsyncDir(dir);
}

/**
 * The most bytes one read or write system call is asked for. Node refuses a length above 2^31 − 1 (ERR_OUT_OF_RANGE),
 * and a float32 tensor or checkpoint passes that from 537M parameters (Qwen3-0.6B's); Linux itself moves at most
 * 0x7ffff000 bytes per call. 1 GiB keeps every call well inside both.
 */
export const MAX_IO_BYTES = 1 << 30;

/** Writes all of `data` to an open file descriptor (loops over short writes, at most `maxChunk` bytes per call). */
export function writeAll(fd: number, data: Uint8Array, maxChunk = MAX_IO_BYTES): void {
  let off = 0;
  while (off < data.byteLength) off += fs.writeSync(fd, data, off, Math.min(maxChunk, data.byteLength - off));
}

/** Atomically replaces `file` with `data` (string is written as UTF-8). */
export function writeFileAtomic(file: string, data: string | Uint8Array): void {
  const bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : data;
  writeFileAtomicWith(file, (fd) => writeAll(fd, bytes));
}

function oldPath(finalDir: string): string {
  return `${finalDir}.old`;
}

function pidAlive(pid: number): boolean {
  if (pid === process.pid) return true;
  try { process.kill(pid, 0); return true; } catch (e) { return (e as NodeJS.ErrnoException).code === 'EPERM'; }
}

/**
 * Repairs the state a crash during `replaceDirAtomic` can leave: restores `<final>.old` when `<final>` is missing,
 * removes `<final>.old` when `<final>` exists, and removes temp directories left by processes that are gone.
 * Returns true when it restored the old directory.
 */
export function recoverDir(finalDir: string): boolean {
  const abs = path.resolve(finalDir);
  const old = oldPath(abs);
  let restored = false;
  if (fs.existsSync(old)) {
    if (!fs.existsSync(abs)) {
      fs.renameSync(old, abs);
      restored = true;
    } else {
      fs.rmSync(old, { recursive: true, force: true });
    }
  }
  const parent = path.dirname(abs);
  const prefix = `${path.basename(abs)}.tmp-`;
  if (fs.existsSync(parent)) {
    for (const name of fs.readdirSync(parent)) {
      if (!name.startsWith(prefix)) continue;
      const pid = Number(name.slice(prefix.length).split('-')[0]);
      if (Number.isInteger(pid) && !pidAlive(pid)) fs.rmSync(path.join(parent, name), { recursive: true, force: true });
    }
  }
  return restored;
}

function fsyncTree(dir: string): void {
  for (const ent of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, ent.name);
    if (ent.isDirectory()) fsyncTree(p);
    else if (ent.isFile()) {
      const fd = fs.openSync(p, 'r');
      try { fs.fsyncSync(fd); } finally { fs.closeSync(fd); }
    }
  }
  fsyncDir(dir);
}

function prepare(finalDir: string): { abs: string; tmp: string } {
  try {
    return prepareUnwrapped(finalDir);
  } catch (e) {
    throw fileError(e, `cannot write ${finalDir}`, REPLACE_HINT);
  }
}

function prepareUnwrapped(finalDir: string): { abs: string; tmp: string } {
  const abs = path.resolve(finalDir);
  const parent = path.dirname(abs);
  if (!fs.existsSync(parent)) fs.mkdirSync(parent, { recursive: true });
  recoverDir(abs);
  if (fs.lstatSync(abs, { throwIfNoEntry: false })?.isSymbolicLink()) {
    throw new DistilleryError(`cannot write folder ${finalDir}: it is a symbolic link`, 'remove the link (distillery does not write through links), or choose another output path');
  }
  if (fs.existsSync(abs) && !fs.statSync(abs).isDirectory()) {
    throw new DistilleryError(`cannot write folder ${finalDir}: a file with that name exists`, 'choose another output path or remove the file');
  }
  const tmp = `${abs}.tmp-${tmpSuffix()}`;
  fs.mkdirSync(tmp);
  return { abs, tmp };
}

function swapIn(abs: string, tmp: string): void {
  fsyncTree(tmp);
  const old = oldPath(abs);
  const hadOld = fs.existsSync(abs);
  if (hadOld) fs.renameSync(abs, old);
  try {
    fs.renameSync(tmp, abs);
  } catch (e) {
    if (hadOld) fs.renameSync(old, abs);
    throw new DistilleryError(`cannot move the new folder into place at ${abs}: ${describeFsError(e)}`,
      'the previous folder was kept; check permissions and free space');
  }
  fsyncDir(path.dirname(abs));
  if (hadOld) fs.rmSync(old, { recursive: true, force: true });
}

const REPLACE_HINT = 'the previous folder is unchanged; free disk space (or fix permissions) and retry';

/**
 * Builds a new directory with `fill(tmpDir)` and swaps it in place of `finalDir` only once `fill` has succeeded.
 * On any error the temp directory is removed and the previous `finalDir` (if any) is left byte-identical.
 */
export async function replaceDirAtomic(finalDir: string, fill: (tmpDir: string) => void | Promise<void>): Promise<void> {
  const { abs, tmp } = prepare(finalDir);
  try {
    await fill(tmp);
    swapIn(abs, tmp);
  } catch (e) {
    fs.rmSync(tmp, { recursive: true, force: true });
    throw fileError(e, `cannot write ${finalDir}`, REPLACE_HINT);
  }
}

/** Synchronous `replaceDirAtomic` for a synchronous `fill`. */
export function replaceDirAtomicSync(finalDir: string, fill: (tmpDir: string) => void): void {
  const { abs, tmp } = prepare(finalDir);
  try {
    fill(tmp);
    swapIn(abs, tmp);
  } catch (e) {
    fs.rmSync(tmp, { recursive: true, force: true });
    throw fileError(e, `cannot write ${finalDir}`, REPLACE_HINT);
  }
}
