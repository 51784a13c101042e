/**
 * Return-code checks and diagnostics of the FFI layer without a GPU: the bindings' koffi functions are replaced
 * by fakes returning chosen codes (cuModuleUnload, cuDevicePrimaryCtxRelease, cublasDestroy, nvrtcDestroyProgram
 * are reported by name; dispose logs instead of throwing), NVRTC compile errors name the kernel's baked
 * parameters and quote the log (with fakes, and with the real NVRTC where installed), the NVRTC build identity,
 * and CudaBackend.deviceMemory().
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { CudaDriver } from '../../src/backend/cuda/ffi/driver.js';
import { Cublas } from '../../src/backend/cuda/ffi/cublas.js';
import { Nvrtc, logExcerpt, tryNvrtc } from '../../src/backend/cuda/ffi/nvrtc.js';
import { fileBuildId, libraryFile, type FileProbe } from '../../src/backend/cuda/ffi/libfind.js';
import { CudaError } from '../../src/backend/cuda/ffi/status.js';
import { CudaBackend, createTraceBackend } from '../../src/backend/cuda/cuda-backend.js';
import { KernelCache, compileOptions } from '../../src/backend/cuda/kernel-cache.js';
import { rmsnormForward } from '../../src/backend/cuda/kernels/index.js';
import { FakeCompiler, fakeCublas, fakeDriver } from './helpers.js';

type FakeFn = (...a: unknown[]) => unknown;
/** An instance of cls whose koffi function table is `f` (the constructor, which needs the library, is skipped). */
function withFns<T extends object>(cls: { prototype: T }, f: Record<string, FakeFn>, extra: Record<string, unknown> = {}): T {
  return Object.assign(Object.create(cls.prototype) as T, { f, ...extra });
}

function throwsCuda(fn: () => unknown, codeName: string, call: string): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof CudaError, String(e));
    assert.equal(e.codeName, codeName);
    assert.equal(e.call, call);
    assert.match(e.message, new RegExp(`^${codeName} in ${call}`));
    return true;
  });
}

const driverNames: Record<number, string> = { 201: 'CUDA_ERROR_INVALID_CONTEXT', 400: 'CUDA_ERROR_INVALID_HANDLE' };
const getErrorName: FakeFn = (rc, out) => { (out as unknown[])[0] = driverNames[rc as number]; return 0; };

test('cuModuleUnload and cuDevicePrimaryCtxRelease return codes are checked and named', () => {
  let releases = 0;
  const d = withFns(CudaDriver, {
    getErrorName,
    moduleUnload: () => 400,
    primaryCtxRelease: () => { releases++; return 201; },
  }, { ctx: {}, device: 0 });
  throwsCuda(() => d.unloadModule({}), 'CUDA_ERROR_INVALID_HANDLE', 'cuModuleUnload');
  throwsCuda(() => d.release(), 'CUDA_ERROR_INVALID_CONTEXT', 'cuDevicePrimaryCtxRelease');
  d.release();
  assert.equal(releases, 1, 'the context is released once, even after a failure');
  const ok = withFns(CudaDriver, { getErrorName, moduleUnload: () => 0, primaryCtxRelease: () => 0 }, { ctx: {}, device: 0 });
  ok.unloadModule({});
  ok.release();
});

test('cublasDestroy return code is checked and named; the handle is dropped once', () => {
  let calls = 0;
  const c = withFns(Cublas, { destroy: () => { calls++; return 1; } }, { handle: {} });
  throwsCuda(() => c.destroy(), 'CUBLAS_STATUS_NOT_INITIALIZED', 'cublasDestroy');
  c.destroy();
  assert.equal(calls, 1);
});

/** A fake NVRTC: compile returns compileRc with `log`; destroy returns destroyRc. */
function fakeNvrtc(compileRc: number, destroyRc: number, log = ''): Nvrtc & { destroyed: number } {
  const names: Record<number, string> = { 3: 'NVRTC_ERROR_INVALID_INPUT', 5: 'NVRTC_ERROR_INVALID_PROGRAM', 6: 'NVRTC_ERROR_COMPILATION' };
  const n = withFns(Nvrtc, {
    create: (prog) => { (prog as unknown[])[0] = { prog: true }; return 0; },
    compile: () => compileRc,
    logSize: (_p, size) => { (size as number[])[0] = Buffer.byteLength(log) + 1; return 0; },
    log: (_p, buf) => { (buf as Buffer).write(log); return 0; },
    cubinSize: (_p, size) => { (size as number[])[0] = 4; return 0; },
    cubin: (_p, buf) => { (buf as Buffer).set([1, 2, 3, 4]); return 0; },
    destroy: () => { n.destroyed++; return destroyRc; },
    errorString: (rc) => names[rc as number] ?? null,
  }, { destroyed: 0, version: 'nvrtc-fake', build: 'fake' }) as Nvrtc & { destroyed: number };
  return n;
}

const spec = rmsnormForward.make({ eps: 1e-6, C: 896, out: 'f32', inp: 'f32', weight: 'f32', block: 256 });

test('nvrtcDestroyProgram return code is checked and named after a successful compile', async () => {
  const n = fakeNvrtc(0, 5);
  throwsCuda(() => n.compileSync(spec.source(), spec.entry, compileOptions('sm_90'), spec.describe()),
    'NVRTC_ERROR_INVALID_PROGRAM', 'nvrtcDestroyProgram');
  assert.equal(n.destroyed, 1);
  const ok = fakeNvrtc(0, 0);
  assert.deepEqual([...ok.compileSync(spec.source(), spec.entry, compileOptions('sm_90'))], [1, 2, 3, 4]);
  assert.equal(ok.destroyed, 1);
});

test('a compile error names the baked parameters and quotes the first log lines (and wins over a destroy failure)', () => {
  const log = Array.from({ length: 30 }, (_, i) => `rmsnorm_fwd.cu(${i + 1}): error: problem number ${i + 1}`).join('\n');
  const n = fakeNvrtc(6, 5, log);
  assert.throws(() => n.compileSync(spec.source(), spec.entry, compileOptions('sm_90'), spec.describe()), (e: unknown) => {
    assert.ok(e instanceof CudaError);
    assert.equal(e.codeName, 'NVRTC_ERROR_COMPILATION');
    assert.equal(e.call, 'nvrtcCompileProgram');
    assert.ok(e.message.includes(spec.describe()), e.message);
    assert.match(e.message, /eps=0\.000001 C=896 out=f32 inp=f32 weight=f32 block=256/);
    assert.match(e.message, /--gpu-architecture=sm_90/);
    assert.match(e.message, /problem number 1$/m);
    assert.match(e.message, /problem number 12$/m);
    assert.doesNotMatch(e.message, /problem number 13$/m);
    assert.match(e.message, /18 more log lines/);
    return true;
  });
  assert.equal(n.destroyed, 1);
});

test('logExcerpt keeps the first non-empty lines', () => {
  assert.equal(logExcerpt('a\n\n b\n', 5), '  a\n   b');
  assert.equal(logExcerpt('', 5), '  (empty NVRTC log)');
  assert.equal(logExcerpt('1\n2\n3', 2), '  1\n  2\n  ... (1 more log lines)');
});

test('libraryFile: a path is resolved; a soname through the mapped files, then ldconfig', () => {
  const probe = (maps: string, ld: string, files: Record<string, string>): FileProbe => ({
    exists: (p) => p in files, realpath: (p) => files[p]!, maps: () => maps, ldconfig: () => ld,
  });
  const files = { '/opt/cuda/libnvrtc.so.12': '/opt/cuda/libnvrtc.so.12.4.99', '/opt/cuda/libnvrtc.so.12.4.99': '/opt/cuda/libnvrtc.so.12.4.99',
    '/usr/lib/libnvrtc.so.11.2': '/usr/lib/libnvrtc.so.11.8.89' };
  assert.equal(libraryFile('/opt/cuda/libnvrtc.so.12', probe('', '', files)), '/opt/cuda/libnvrtc.so.12.4.99');
  const maps = [
    '7f00-7f01 r-xp 00000000 08:01 1 /opt/cuda/libnvrtc-builtins.so.12.4.99',
    '7f02-7f03 r-xp 00000000 08:01 2 /opt/cuda/libnvrtc.so.12.4.99',
  ].join('\n');
  assert.equal(libraryFile('libnvrtc.so.12', probe(maps, '', files)), '/opt/cuda/libnvrtc.so.12.4.99');
  const ld = '\tlibnvrtc.so.11.2 (libc6,x86-64) => /usr/lib/libnvrtc.so.11.2\n';
  assert.equal(libraryFile('libnvrtc.so.11.2', probe('', ld, files)), '/usr/lib/libnvrtc.so.11.8.89');
  assert.equal(libraryFile('libnvrtc.so.13', probe('', ld, files)), null);
});

test('fileBuildId tells apart builds of one size and name', () => {
  const dir = fs.mkdtempSync(path.join(tmpdir(), 'dk-build-'));
  const a = path.join(dir, 'a', 'libnvrtc.so.11.8.89'), b = path.join(dir, 'b', 'libnvrtc.so.11.8.89');
  fs.mkdirSync(path.dirname(a)); fs.mkdirSync(path.dirname(b));
  const bytes = Buffer.alloc(3 << 20, 7);
  fs.writeFileSync(a, bytes);
  bytes[100] = 8;
  fs.writeFileSync(b, bytes);
  const ia = fileBuildId(a), ib = fileBuildId(b);
  assert.match(ia, /^libnvrtc\.so\.11\.8\.89 3145728 sha256:[0-9a-f]{16}$/);
  assert.notEqual(ia, ib);
  assert.equal(fileBuildId(a), ia, 'deterministic');
  fs.rmSync(dir, { recursive: true, force: true });
});

const nvrtc = tryNvrtc();
test('the real NVRTC: its build identity, and a compile error naming the kernel and quoting the log', { skip: nvrtc ? false : 'NVRTC not found' }, () => {
  const n = nvrtc!;
  assert.match(n.version, /^nvrtc-\d+\.\d+$/);
  assert.ok(n.file !== null, `resolved ${n.path}`);
  assert.match(n.build, /^libnvrtc\.so\S* \d+ sha256:[0-9a-f]{16}$/);
  assert.equal(n.build, fileBuildId(n.file));
  const label = 'broken_kernel eps=0.5 C=7';
  assert.throws(() => n.compileSync('extern "C" __global__ void broken_kernel() { undefined_thing_xyz(); }', 'broken_kernel',
    compileOptions('sm_80'), label), (e: unknown) => {
    assert.ok(e instanceof CudaError);
    assert.equal(e.codeName, 'NVRTC_ERROR_COMPILATION');
    assert.ok(e.message.includes(label), e.message);
    assert.match(e.message, /undefined_thing_xyz/);
    return true;
  });
});

test('dispose logs named failures of cuModuleUnload, cublasDestroy and the context release instead of throwing', async () => {
  const lines: string[] = [];
  const unloadErr = new CudaError(400, 'CUDA_ERROR_INVALID_HANDLE', 'cuModuleUnload', 'unloading a kernel module');
  const driver = Object.assign(fakeDriver(), {
    unloadModule: () => { throw unloadErr; },
    release: () => { throw new CudaError(201, 'CUDA_ERROR_INVALID_CONTEXT', 'cuDevicePrimaryCtxRelease', 'releasing the CUDA context'); },
  });
  const cublas = Object.assign(fakeCublas(), {
    destroy: () => { throw new CudaError(1, 'CUBLAS_STATUS_NOT_INITIALIZED', 'cublasDestroy', 'destroying the cuBLAS handle'); },
  });
  const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: false, log: () => {} });
  const be = new CudaBackend('device', { driver, cublas, cache, log: (l) => lines.push(l) });
  const x = be.alloc(896, 'x'), w = be.alloc(896, 'w'), y = be.alloc(896, 'y');
  be.add(y, x, w, 896);
  assert.doesNotThrow(() => be.dispose());
  const text = lines.join('\n');
  assert.match(text, /CUDA_ERROR_INVALID_HANDLE in cuModuleUnload/);
  assert.match(text, /CUBLAS_STATUS_NOT_INITIALIZED in cublasDestroy/);
  assert.match(text, /CUDA_ERROR_INVALID_CONTEXT in cuDevicePrimaryCtxRelease/);
  be.dispose();
});

test('deviceMemory: the driver\'s free/total in device mode, null in trace mode', () => {
  assert.equal(createTraceBackend().deviceMemory(), null);
  const driver = Object.assign(fakeDriver(), { memInfo: () => ({ free: 70 * 2 ** 30, total: 80 * 2 ** 30 }) });
  const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: false, log: () => {} });
  const be = new CudaBackend('device', { driver, cublas: fakeCublas(), cache, log: () => {} });
  assert.deepEqual(be.deviceMemory(), { free: 70 * 2 ** 30, total: 80 * 2 ** 30 });
  be.dispose();
});
