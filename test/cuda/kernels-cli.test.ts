/**
 * `distillery kernels plan|list|audit` without a GPU (warm needs NVRTC and is covered where present).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { kernelsCommand, setKernelsOutput } from '../../src/backend/cuda/cli.js';
import { encodeEntry } from '../../src/backend/cuda/kernel-cache.js';
import { tryNvrtc } from '../../src/backend/cuda/ffi/nvrtc.js';

async function capture(fn: () => Promise<number>): Promise<{ code: number; text: string }> {
  const chunks: string[] = [];
  const prev = setKernelsOutput((s) => { chunks.push(s); });
  try { return { code: await fn(), text: chunks.join('') }; } finally { setKernelsOutput(prev); }
}

test('kernels plan prints one line per kernel with family, key prefix and baked params', async () => {
  const { code, text } = await capture(() => kernelsCommand('plan', { model: 'tiny', teacher: 'small', loss: 'jsd', beta: 0.25, batch: 2, seq: 16 }));
  assert.equal(code, 0);
  assert.match(text, /^loss +[0-9a-f]{16} +kind=jsd temperature=2 alpha=0\.5 beta=0\.25 withGrad=true block=512$/m);
  assert.match(text, /^rmsnorm_fwd +[0-9a-f]{16} +eps=0\.000001 C=64 block=256$/m);
  assert.match(text, /^attention_cached /m);
});

test('kernels audit passes for real configs and reports the verdict', async () => {
  for (const args of [{ model: 'tiny' }, { model: 'small', teacher: 'base', loss: 'reverse-kl', batch: 3, seq: 12 }]) {
    const { code, text } = await capture(() => kernelsCommand('audit', args));
    assert.equal(code, 0, text);
    assert.match(text, /^audit: OK: /m);
  }
});

test('kernels list shows entries and flags corrupt files', async () => {
  const dir = fs.mkdtempSync(path.join(tmpdir(), 'dk-list-'));
  const good = 'a'.repeat(64), bad = 'b'.repeat(64);
  fs.writeFileSync(path.join(dir, `${good}.cubin`), encodeEntry(good, new Uint8Array([1, 2, 3])));
  fs.writeFileSync(path.join(dir, `${bad}.cubin`), Buffer.from('garbage'));
  const { code, text } = await capture(() => kernelsCommand('list', { cacheDir: dir }));
  assert.equal(code, 0);
  assert.match(text, new RegExp(`^${good} +\\d+ +\\S+Z$`, 'm'));
  assert.match(text, new RegExp(`^${bad} .*CORRUPT: truncated header`, 'm'));
  fs.rmSync(dir, { recursive: true, force: true });
});

test('kernels warm compiles the plan into the cache for --arch without a GPU', { skip: tryNvrtc() ? false : 'NVRTC not found', timeout: 120_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(tmpdir(), 'dk-warm-'));
  const first = await capture(() => kernelsCommand('warm', { model: 'tiny', arch: 'sm_80', cacheDir: dir }));
  assert.equal(first.code, 0);
  assert.match(first.text, /^\[kernel-cache\] compile \S+ .* [0-9a-f]{64} \d+ms$/m);
  const again = await capture(() => kernelsCommand('warm', { model: 'tiny', arch: 'sm_80', cacheDir: dir }));
  assert.match(again.text, /^warm: \d+ kernels: compiled 0 /m);
  fs.rmSync(dir, { recursive: true, force: true });
});
