/**
 * Library finder tests (no CUDA needed): missing libraries give the one clear DistilleryError suggesting
 * --device cpu; the env override, loader search and `ldconfig -p` are each honoured.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { DistilleryError } from '../../src/util/errors.js';
import { openLibrary, requireLibraries, type FinderEnv, type LibHandle } from '../../src/backend/cuda/ffi/libfind.js';
import { createCudaBackend } from '../../src/backend/cuda/index.js';

function finder(present: string[], extra: Partial<FinderEnv> = {}): FinderEnv & { opened: string[] } {
  const opened: string[] = [];
  return {
    env: {}, dirs: ['/usr/local/cuda/lib64'], ldconfig: () => '', opened,
    exists: (p) => present.includes(p),
    open: (p) => { if (!present.includes(p)) throw new Error(`cannot open ${p}`); opened.push(p); return {} as LibHandle; },
    ...extra,
  };
}

test('no CUDA libraries: one clear sentence suggesting --device cpu', () => {
  const fe = finder([]);
  assert.throws(() => requireLibraries(['cuda', 'nvrtc', 'cublas'], fe), (e: unknown) => {
    assert.ok(e instanceof DistilleryError);
    assert.match(e.message, /--device cpu/);
    assert.match(e.message, /libcuda\.so\.1/);
    assert.equal(e.message.split(/\.\s/).length, 1, `one sentence: ${e.message}`);
    assert.match(e.hint ?? '', /DISTILLERY_CUDA_LIB_DIR/);
    return true;
  });
});

test('createCudaBackend without libraries throws the DistilleryError (no crash, no stack)', () => {
  assert.throws(() => createCudaBackend({ finder: finder([]) }), DistilleryError);
});

test('only cuBLAS missing names only cuBLAS', () => {
  const fe = finder(['libcuda.so.1', 'libnvrtc.so.12']);
  assert.throws(() => requireLibraries(['cuda', 'nvrtc', 'cublas'], fe), /cuBLAS/);
});

test('DISTILLERY_CUDA_LIB_DIR wins over the loader search', () => {
  const fe = finder(['/opt/cuda/libnvrtc.so.12', 'libnvrtc.so.13'], { env: { DISTILLERY_CUDA_LIB_DIR: '/opt/cuda' } });
  assert.equal(openLibrary('nvrtc', fe).found?.path, '/opt/cuda/libnvrtc.so.12');
});

test('versioned names are tried newest first through the loader', () => {
  const fe = finder(['libnvrtc.so.11.2', 'libnvrtc.so.12']);
  assert.equal(openLibrary('nvrtc', fe).found?.path, 'libnvrtc.so.12');
});

test('ldconfig -p and the default folders are searched', () => {
  const ld = '\tlibcublas.so.12 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcublas.so.12\n';
  const fe = finder(['/usr/lib/x86_64-linux-gnu/libcublas.so.12'], { ldconfig: () => ld });
  assert.equal(openLibrary('cublas', fe).found?.path, '/usr/lib/x86_64-linux-gnu/libcublas.so.12');
  const fe2 = finder(['/usr/local/cuda/lib64/libcublas.so.13']);
  assert.equal(openLibrary('cublas', fe2).found?.path, '/usr/local/cuda/lib64/libcublas.so.13');
});
