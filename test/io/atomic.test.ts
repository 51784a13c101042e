/**
 * Atomic writes: a write or a directory fill that fails midway leaves the previous content byte-identical and no
 * temp file or folder behind; a crash between the two renames is repaired by recoverDir / loadModelDir.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { recoverDir, replaceDirAtomic, replaceDirAtomicSync, writeFileAtomic, writeFileAtomicWith } from '../../src/io/atomic.js';
import { loadModelDir, saveModelDir } from '../../src/io/checkpoint-dir.js';
import { DistilleryError } from '../../src/util/errors.js';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-atomic-'));
process.on('exit', () => fs.rmSync(root, { recursive: true, force: true }));

/** Every file under dir, relative path → bytes. */
function snapshot(dir: string): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  const walk = (d: string): void => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else out.set(path.relative(dir, p), fs.readFileSync(p));
    }
  };
  walk(dir);
  return out;
}

function leftovers(dir: string): string[] {
  return fs.readdirSync(dir).filter((n) => n.includes('.tmp-') || n.endsWith('.old'));
}

test('writeFileAtomic replaces content; a failing write keeps the old file and leaves no temp', () => {
  const d = fs.mkdtempSync(path.join(root, 'f-'));
  const f = path.join(d, 'x.json');
  writeFileAtomic(f, 'first');
  writeFileAtomic(f, new Uint8Array([1, 2, 3]));
  assert.deepEqual([...fs.readFileSync(f)], [1, 2, 3]);
  assert.throws(() => writeFileAtomicWith(f, (fd) => { fs.writeSync(fd, 'partial'); throw new Error('disk on fire'); }), /disk on fire/);
  assert.deepEqual([...fs.readFileSync(f)], [1, 2, 3]);
  assert.deepEqual(fs.readdirSync(d), ['x.json']);
  assert.throws(() => writeFileAtomic(path.join(d, 'no', 'such', 'dir.txt'), 'x'), DistilleryError);
});

test('replaceDirAtomic: a fill that throws after writing half keeps the previous checkpoint byte-identical', async () => {
  const final = path.join(root, 'ckpt');
  const tensors = new Map([['w', { shape: [64, 64], data: new Float32Array(4096).map((_, i) => Math.cos(i)) }]]);
  await saveModelDir(final, { config: { model_type: 'qwen2', hidden_size: 64 }, tensors, dtype: 'f32', tokenizerJson: { added_tokens: [] } });
  const before = snapshot(final);
  assert.ok(before.has('model.safetensors') && before.has('config.json'));

  await assert.rejects(replaceDirAtomic(final, async (tmp) => {
    fs.writeFileSync(path.join(tmp, 'config.json'), '{"half": true}');
    fs.writeFileSync(path.join(tmp, 'model.safetensors'), Buffer.alloc(100, 7));
    await new Promise((r) => setTimeout(r, 5));
    throw new Error('killed mid-checkpoint');
  }), /killed mid-checkpoint/);
  assert.deepEqual(snapshot(final), before);
  assert.deepEqual(leftovers(root), []);

  // The same through saveModelDir itself: a bad extra file name fails after config and weights were written.
  await assert.rejects(saveModelDir(final, { config: { changed: true }, tensors, dtype: 'bf16', extraFiles: { '../escape.txt': 'x' } }), DistilleryError);
  assert.deepEqual(snapshot(final), before);
  assert.deepEqual(leftovers(root), []);

  assert.throws(() => replaceDirAtomicSync(final, (tmp) => { fs.writeFileSync(path.join(tmp, 'a'), 'a'); throw new Error('sync fail'); }), /sync fail/);
  assert.deepEqual(snapshot(final), before);

  // A successful replace swaps the whole folder (old files that the new one lacks are gone).
  await replaceDirAtomic(final, (tmp) => { fs.writeFileSync(path.join(tmp, 'only.txt'), 'new'); });
  assert.deepEqual([...snapshot(final).keys()], ['only.txt']);
  assert.deepEqual(leftovers(root), []);
});

test('recoverDir restores <dir>.old after a crash between the renames, and removes stale temps', () => {
  const final = path.join(root, 'crashed');
  fs.mkdirSync(`${final}.old`);
  fs.writeFileSync(path.join(`${final}.old`, 'config.json'), '{"model_type":"llama"}');
  fs.writeFileSync(path.join(`${final}.old`, 'model.safetensors'), Buffer.from([8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32]));
  fs.mkdirSync(`${final}.tmp-999999999-dead`);
  // loadModelDir performs the recovery when the folder is missing.
  const m = loadModelDir(final);
  assert.equal(m.config.model_type, 'llama');
  assert.equal(m.tensors.size, 0);
  assert.ok(fs.existsSync(final));
  assert.equal(fs.existsSync(`${final}.old`), false);
  // Both present: the swap had completed, .old is garbage.
  fs.mkdirSync(`${final}.old`);
  assert.equal(recoverDir(final), false);
  assert.equal(fs.existsSync(`${final}.old`), false);
  assert.equal(fs.existsSync(`${final}.tmp-999999999-dead`), false);
});

test('writeAll and readExactly move at most maxChunk bytes per system call (Node refuses a length of 2^31 or more: a 2.4 GB f32 checkpoint)', async () => {
  const { default: fsCjs } = await import('node:fs');
  const { syncBuiltinESMExports } = await import('node:module');
  const { writeAll, MAX_IO_BYTES } = await import('../../src/io/atomic.js');
  const { readExactly } = await import('../../src/io/safetensors.js');
  assert.ok(MAX_IO_BYTES < 2 ** 31 - 1, 'the default chunk is below the limit');
  const data = Uint8Array.from({ length: 100 }, (_, i) => (i * 7 + 3) & 255);
  const file = path.join(root, 'chunked.bin');
  const lengths: number[] = [];
  const origWrite = fsCjs.writeSync, origRead = fsCjs.readSync;
  // Spy on the calls the modules make (their `import * as fs` sees the patched functions after the sync).
  const spy = (orig: (...x: unknown[]) => number) => (...a: unknown[]): number => { lengths.push(a[3] as number); return orig(...a); };
  fsCjs.writeSync = spy(origWrite as (...x: unknown[]) => number) as typeof origWrite;
  fsCjs.readSync = spy(origRead as (...x: unknown[]) => number) as typeof origRead;
  syncBuiltinESMExports();
  let back: Uint8Array;
  try {
    const fd = fs.openSync(file, 'w');
    try { writeAll(fd, data, 7); } finally { fs.closeSync(fd); }
    assert.deepEqual(lengths, [...Array(14).fill(7), 2], 'writes of 7 bytes, then the rest');
    lengths.length = 0;
    back = new Uint8Array(100);
    const rfd = fs.openSync(file, 'r');
    try { readExactly(rfd, back, 0, file, 30); } finally { fs.closeSync(rfd); }
    assert.deepEqual(lengths, [30, 30, 30, 10], 'reads of 30 bytes, then the rest');
  } finally {
    fsCjs.writeSync = origWrite; fsCjs.readSync = origRead;
    syncBuiltinESMExports();
  }
  assert.deepEqual(Buffer.from(back), Buffer.from(data));
});
