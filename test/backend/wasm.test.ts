/**
 * The WebAssembly SIMD matrix products of the CPU backend (src/backend/cpu/wasm.ts, wasm/gemm.wat):
 * the built module validates; gemm_nt and gemm_nn match a float64 reference at odd sizes (K not a multiple of
 * 4, odd M/N, with and without bias, overwrite and accumulate, sub-ranges); matmul forward/backward through the
 * backend match the reference and are bit-identical for 1, 2 and 3 threads and run to run; growing the memory
 * mid-way keeps earlier buffers intact and usable (by worker threads too); buffers of another backend take the
 * JS path; without WebAssembly the backend warns once and runs the JS kernels.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { CpuBackend, createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { GemmKernels, WasmArena, wasmModule } from '../../src/backend/cpu/wasm.js';
import { Rng } from '../../src/util/rng.js';
import { DistilleryError } from '../../src/util/errors.js';
import { assertClose, bufOf, randn } from './helpers.js';

/** Float32-rounded random data as float64 (so the reference sees exactly what the kernels see). */
function f32randn(rng: Rng, n: number): Float64Array {
  return Float64Array.from(Float32Array.from(randn(rng, n)));
}

function module(): object {
  const m = wasmModule();
  assert.ok('module' in m, `WASM kernels unavailable: ${'error' in m ? m.error : ''}`);
  return m.module;
}

test('the built gemm.wasm validates (SIMD + shared memory) and the backend uses it by default in f32', () => {
  const bytes = readFileSync(new URL('../../src/backend/cpu/wasm/gemm.wasm', import.meta.url));
  const WA = (globalThis as unknown as { WebAssembly: { validate(b: Uint8Array): boolean } }).WebAssembly;
  assert.equal(WA.validate(bytes), true);
  const be = new CpuBackend({ threads: 1 });
  assert.equal(be.kernel, 'wasm');
  assert.equal(new CpuBackend({ dtype: 'f64', threads: 1 }).kernel, 'js');
  assert.equal(new CpuBackend({ threads: 1, kernel: 'js' }).kernel, 'js');
  assert.throws(() => new CpuBackend({ dtype: 'f64', kernel: 'wasm' }), /f32/);
  be.dispose();
});

test('gemm_nt and gemm_nn kernels match a float64 reference at odd sizes, with bias, accumulate and sub-ranges', () => {
  const arena = new WasmArena();
  const kern = new GemmKernels(module(), arena.memory);
  const rng = new Rng(31);
  const put = (d: Float64Array) => { const a = arena.alloc(d.length); a.set(d); return a; };
  for (const [M, N, K] of [[1, 1, 1], [3, 5, 7], [4, 2, 4], [5, 3, 9], [9, 7, 13], [13, 11, 6], [17, 19, 33], [8, 16, 5]] as const) {
    const a = f32randn(rng, M * K), b = f32randn(rng, N * K), bias = f32randn(rng, N), o0 = f32randn(rng, M * N);
    const A = put(a), B = put(b), BIAS = put(bias);
    for (const withBias of [false, true]) for (const acc of [false, true]) {
      // a sub-range [i0, i1) x [j0, j1): elements outside must be left alone
      for (const [i0, i1, j0, j1] of [[0, M, 0, N], [Math.min(1, M - 1), M, Math.min(1, N - 1), N]] as const) {
        const O = put(o0);
        kern.nt(O, A, B, withBias ? BIAS : null, K, N, i0, i1, j0, j1, acc);
        const ref = Float64Array.from(o0);
        for (let i = i0; i < i1; i++) for (let j = j0; j < j1; j++) {
          let s = withBias ? bias[j]! : 0;
          for (let k = 0; k < K; k++) s += a[i * K + k]! * b[j * K + k]!;
          ref[i * N + j] = (acc ? o0[i * N + j]! : 0) + s;
        }
        assertClose(O, ref, 1e-5, 1e-5, `gemm_nt ${M}x${N}x${K} bias=${withBias} acc=${acc} range=${i0}..${i1},${j0}..${j1}`);
      }
    }
    // gemm_nn: out[M, N] (+)= A(i, j) B[j, c] with J = K, A read row-major (sai=K, saj=1) or transposed (sai=1, saj=M)
    const bn = f32randn(rng, K * N), BN = put(bn);
    for (const transA of [false, true]) for (const acc of [false, true]) {
      const sai = transA ? 1 : K, saj = transA ? M : 1;
      const O = put(o0);
      kern.nn(O, A, BN, K, sai, saj, N, N, 0, M, 0, N, acc);
      const ref = Float64Array.from(o0);
      for (let i = 0; i < M; i++) for (let c = 0; c < N; c++) {
        let s = 0;
        for (let j = 0; j < K; j++) s += a[i * sai + j * saj]! * bn[j * N + c]!;
        ref[i * N + c] = (acc ? o0[i * N + c]! : 0) + s;
      }
      assertClose(O, ref, 1e-5, 1e-5, `gemm_nn ${M}x${N}x${K} transA=${transA} acc=${acc}`);
    }
  }
});

/** matmul forward (with bias) and backward (accumulating into non-zero gradients) on `be`. */
function matmulAll(be: CpuBackend, x: Float64Array, w: Float64Array, b: Float64Array, g: Float64Array, n: number, k: number, m: number): Float32Array[] {
  const X = bufOf(be, x), W = bufOf(be, w), B = bufOf(be, b), G = bufOf(be, g);
  const out = be.alloc(n * m, 'o'), dx = bufOf(be, x), dw = bufOf(be, w), db = bufOf(be, b);
  be.matmulForward(out, X, W, B, n, k, m);
  be.matmulBackward(dx, dw, db, G, X, W, n, k, m);
  return [out, dx, dw, db].map((a) => be.download(a) as Float32Array);
}

test('WASM matmul forward/backward: float64 reference, and bit-identical for 1, 2, 3 threads and run to run', () => {
  const one = new CpuBackend({ threads: 1 });
  const many = [new CpuBackend({ threads: 2, parallelThreshold: 0 }), new CpuBackend({ threads: 3, parallelThreshold: 0 }), new CpuBackend({ threads: 2 })];
  const rng = new Rng(32);
  for (const [n, k, m] of [[1, 33, 17], [3, 7, 5], [7, 13, 5], [37, 29, 23], [64, 31, 1], [9, 1, 11], [131, 130, 67], [133, 257, 69]] as const) {
    const x = f32randn(rng, n * k), w = f32randn(rng, m * k), b = f32randn(rng, m), g = f32randn(rng, n * m);
    const ref = matmulAll(one, x, w, b, g, n, k, m);
    // float64 reference
    const out = new Float64Array(n * m), dx = Float64Array.from(x), dw = Float64Array.from(w);
    for (let i = 0; i < n; i++) for (let j = 0; j < m; j++) {
      let s = b[j]!;
      for (let l = 0; l < k; l++) s += x[i * k + l]! * w[j * k + l]!;
      out[i * m + j] = s;
    }
    for (let i = 0; i < n; i++) for (let l = 0; l < k; l++) {
      let s = 0;
      for (let j = 0; j < m; j++) s += g[i * m + j]! * w[j * k + l]!;
      dx[i * k + l] += s;
    }
    for (let j = 0; j < m; j++) for (let l = 0; l < k; l++) {
      let s = 0;
      for (let i = 0; i < n; i++) s += g[i * m + j]! * x[i * k + l]!;
      dw[j * k + l] += s;
    }
    const tol = 2e-5 * Math.sqrt(Math.max(k, n, m));
    assertClose(ref[0]!, out, tol, tol, `out ${n}x${k}x${m}`);
    assertClose(ref[1]!, dx, tol, tol, `dinp ${n}x${k}x${m}`);
    assertClose(ref[2]!, dw, tol, tol, `dweight ${n}x${k}x${m}`);
    assert.deepEqual(matmulAll(one, x, w, b, g, n, k, m), ref, `run to run ${n}x${k}x${m}`);
    for (const be of many) {
      assert.deepEqual(matmulAll(be, x, w, b, g, n, k, m), ref, `threads=${be.threads} bit-identical to threads=1, ${n}x${k}x${m}`);
    }
  }
  one.dispose();
  for (const be of many) be.dispose();
});

test('growing the WASM memory mid-way keeps earlier buffers intact and usable, by worker threads too', () => {
  const be = new CpuBackend({ threads: 2, parallelThreshold: 0 });
  const rng = new Rng(33);
  const n = 19, k = 23, m = 13;
  const x = f32randn(rng, n * k), w = f32randn(rng, m * k);
  const X = bufOf(be, x), W = bufOf(be, w), before = be.alloc(n * m, 'before');
  be.matmulForward(before, X, W, null, n, k, m); // starts the workers on the small memory
  const r0 = be.download(before);
  const big = be.alloc(24 << 20, 'big'); // 96 MB: grows the memory
  assert.equal(big.length, 24 << 20);
  assert.deepEqual(be.download(X), Float32Array.from(x), 'old buffer intact after growth');
  const X2 = bufOf(be, x), W2 = be.view(big, (24 << 20) - m * k, m * k);
  be.upload(W2, w);
  const after = be.alloc(n * m, 'after');
  be.matmulForward(after, X2, W2, null, n, k, m); // new buffers beyond the old end, on both threads
  assert.deepEqual(be.download(after), r0);
  be.matmulForward(before, X, W, null, n, k, m); // old views still work
  assert.deepEqual(be.download(before), r0);
  be.dispose();
});

test('buffers of another backend take the JS path and give the same result', () => {
  const a = new CpuBackend({ threads: 1 }), b = new CpuBackend({ threads: 1 });
  const rng = new Rng(34);
  const n = 6, k = 10, m = 7;
  const x = f32randn(rng, n * k), w = f32randn(rng, m * k);
  const oa = a.alloc(n * m, 'o'), ob = a.alloc(n * m, 'o');
  a.matmulForward(oa, bufOf(a, x), bufOf(a, w), null, n, k, m);
  a.matmulForward(ob, bufOf(a, x), bufOf(b, w), null, n, k, m); // w lives in b's memory
  assertClose(a.download(ob), a.download(oa), 1e-6, 1e-6, 'mixed-backend product');
  a.dispose(); b.dispose();
});

test('fallback: kernel js, and a runtime without WebAssembly (one warning, JS kernels, same results)', () => {
  const rng = new Rng(35);
  const n = 21, k = 17, m = 9;
  const x = f32randn(rng, n * k), w = f32randn(rng, m * k), b = f32randn(rng, m), g = f32randn(rng, n * m);
  const js = new CpuBackend({ threads: 2, parallelThreshold: 0, kernel: 'js' }), wa = new CpuBackend({ threads: 1 });
  const r1 = matmulAll(js, x, w, b, g, n, k, m), r2 = matmulAll(wa, x, w, b, g, n, k, m);
  r1.forEach((r, i) => assertClose(r, r2[i]!, 1e-5, 1e-5, `js vs wasm ${i}`));
  js.dispose(); wa.dispose();

  const mod = fileURLToPath(new URL('../../src/backend/cpu/cpu-backend.js', import.meta.url));
  const script = `
    globalThis.WebAssembly = undefined;
    const { CpuBackend } = await import(${JSON.stringify(mod)});
    const be = new CpuBackend({ threads: 2, parallelThreshold: 0 });
    const be2 = new CpuBackend({ threads: 1 });
    const a = be.alloc(64, 'a'); be.upload(a, Array.from({ length: 64 }, (_, i) => i));
    const o = be.alloc(64, 'o');
    be.matmulForward(o, a, a, null, 8, 8, 8);
    console.log(be.kernel, be2.kernel, be.download(o)[0]);`;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { timeout: 15_000, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout.trim(), `js js ${[0, 1, 2, 3, 4, 5, 6, 7].reduce((s, i) => s + i * i, 0)}`);
  const warnings = r.stderr.split('\n').filter((l) => l.includes('WebAssembly'));
  assert.equal(warnings.length, 1, `expected one warning line, got: ${r.stderr}`);
});

test('an allocation past the 4 GiB WebAssembly memory is a DistilleryError naming the buffer and the way out', () => {
  const be = createCpuBackend({ threads: 1 });
  try {
    assert.throws(() => be.alloc(1.25 * 2 ** 30, 'student gradients'),
      (e: unknown) => e instanceof DistilleryError && /student gradients/.test(e.message) && /--device cuda/.test(e.hint ?? ''));
    assert.equal(be.download(be.alloc(4, 'still usable')).length, 4);
  } finally { be.dispose(); }
});
