/**
 * The CPU backend's WASM attention row kernels (attn_dots, attn_pv, attn_outer in wasm/gemm.wat) against a
 * float64 reference at odd sizes; attention forward/backward through the backend (WASM path, f32) against the
 * f64 backend; and bit-identical results for 1, 2 and 3 threads and run to run for every op that threads split:
 * attention forward/backward, the fused loss (every kind), SwiGLU forward/backward and AdamW (elementwise
 * splits); views of the WASM memory (float and int) survive the trip to a worker.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Backend, LossSpec } from '../../src/backend/backend.js';
import { LOSS_STATS } from '../../src/backend/backend.js';
import { CpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { packTask, unpackTask, type Task } from '../../src/backend/cpu/tasks.js';
import { GemmKernels, WasmArena, wasmModule } from '../../src/backend/cpu/wasm.js';
import { Rng } from '../../src/util/rng.js';
import { assertClose, bufOf, randn } from './helpers.js';
import { LOSS_SPECS, attentionBackwardRef, attentionRef } from './reference.js';

function f32randn(rng: Rng, n: number, scale = 1): Float64Array {
  return Float64Array.from(Float32Array.from(randn(rng, n, scale)));
}

test('attn_dots, attn_pv and attn_outer match a float64 reference at odd sizes and strides', () => {
  const m = wasmModule();
  assert.ok('module' in m, 'WASM kernels unavailable');
  const arena = new WasmArena();
  const x = new GemmKernels(m.module, arena.memory).exports;
  const rng = new Rng(41);
  const put = (d: Float64Array) => { const a = arena.alloc(d.length); a.set(d); return a; };
  for (const hd of [1, 3, 4, 5, 7, 8, 12, 13, 32]) for (const n of [1, 2, 3, 6, 9]) {
    const ys = hd + 3; // rows of y are strided, as k/v rows of one kv head are
    const xv = f32randn(rng, hd), y = f32randn(rng, n * ys), p = f32randn(rng, n), o0 = f32randn(rng, Math.max(n, hd));
    const X = put(xv), Y = put(y), P = put(p);
    // attn_dots
    const D = put(o0), scale = 0.37;
    x.attn_dots(D.byteOffset, X.byteOffset, Y.byteOffset, ys, n, hd, scale);
    const dref = Float64Array.from(o0);
    for (let s = 0; s < n; s++) { let a = 0; for (let d = 0; d < hd; d++) a += xv[d]! * y[s * ys + d]!; dref[s] = a * scale; }
    assertClose(D, dref, 1e-5, 1e-5, `attn_dots hd=${hd} n=${n}`);
    // attn_pv, overwrite and accumulate (elements past hd untouched)
    for (const acc of [0, 1]) {
      const O = put(o0);
      x.attn_pv(O.byteOffset, P.byteOffset, Y.byteOffset, ys, n, hd, acc);
      const ref = Float64Array.from(o0);
      for (let d = 0; d < hd; d++) { let a = 0; for (let s = 0; s < n; s++) a += p[s]! * y[s * ys + d]!; ref[d] = (acc ? o0[d]! : 0) + a; }
      assertClose(O, ref, 1e-5, 1e-5, `attn_pv hd=${hd} n=${n} acc=${acc}`);
    }
    // attn_outer: only the first hd of each strided row change
    const Y2 = put(y);
    x.attn_outer(Y2.byteOffset, P.byteOffset, X.byteOffset, ys, n, hd);
    const oref = Float64Array.from(y);
    for (let s = 0; s < n; s++) for (let d = 0; d < hd; d++) oref[s * ys + d] = y[s * ys + d]! + p[s]! * xv[d]!;
    assertClose(Y2, oref, 1e-6, 1e-6, `attn_outer hd=${hd} n=${n}`);
  }
});

/** Attention forward + backward on `be` (gradients accumulate into non-zero buffers); [out, lse, dq, dk, dv]. */
function attentionAll(be: Backend, q: Float64Array, k: Float64Array, v: Float64Array, g: Float64Array, dq0: Float64Array,
  dk0: Float64Array, dv0: Float64Array, b: number, t: number, nH: number, nKv: number, hd: number): Array<Float32Array | Float64Array> {
  const Q = bufOf(be, q), K = bufOf(be, k), V = bufOf(be, v), G = bufOf(be, g);
  const out = be.alloc(q.length, 'o'), lse = bufOf(be, randn(new Rng(1), b * nH * t)); // garbage is overwritten
  const dq = bufOf(be, dq0), dk = bufOf(be, dk0), dv = bufOf(be, dv0);
  be.attentionForward(out, lse, Q, K, V, b, t, nH, nKv, hd);
  be.attentionBackward(dq, dk, dv, G, Q, K, V, out, lse, b, t, nH, nKv, hd);
  return [out, lse, dq, dk, dv].map((a) => be.download(a));
}

const ATTN_SHAPES: Array<[number, number, number, number, number]> = [
  [2, 6, 4, 2, 8], [1, 5, 3, 3, 5], [2, 7, 6, 1, 13], [3, 9, 4, 2, 32], [1, 1, 2, 1, 3], [2, 33, 8, 2, 12],
];

test('WASM attention forward/backward (f32) matches the float64 backend and reference, bit-identical across threads', () => {
  const ref64 = new CpuBackend({ dtype: 'f64', threads: 1 });
  const one = new CpuBackend({ threads: 1 });
  assert.equal(one.kernel, 'wasm');
  const many = [new CpuBackend({ threads: 2, parallelThreshold: 0 }), new CpuBackend({ threads: 3, parallelThreshold: 0 })];
  const rng = new Rng(42);
  for (const [b, t, nH, nKv, hd] of ATTN_SHAPES) {
    const ql = b * t * nH * hd, kl = b * t * nKv * hd;
    const q = f32randn(rng, ql), k = f32randn(rng, kl), v = f32randn(rng, kl), g = f32randn(rng, ql);
    const dq0 = f32randn(rng, ql), dk0 = f32randn(rng, kl), dv0 = f32randn(rng, kl);
    const args = [q, k, v, g, dq0, dk0, dv0, b, t, nH, nKv, hd] as const;
    const got = attentionAll(one, ...args), want = attentionAll(ref64, ...args);
    const [outR, lseR] = attentionRef(q, k, v, b, t, nH, nKv, hd);
    const [dqR, dkR, dvR] = attentionBackwardRef(g, q, k, v, b, t, nH, nKv, hd);
    const shape = `${b},${t},${nH},${nKv},${hd}`;
    assertClose(got[0]!, outR, 2e-5, 2e-6, `out vs reference ${shape}`);
    assertClose(got[1]!, lseR, 2e-5, 2e-6, `lse vs reference ${shape}`);
    ['dq', 'dk', 'dv'].forEach((name, i) => assertClose(got[i + 2]!, want[i + 2]!, 1e-5, 1e-5, `${name} vs f64 backend ${shape}`));
    // the backward against the float64 definition (P = softmax(S), rowsum(P ⊙ dP)), independent of the lse/D shortcut
    [[dq0, dqR], [dk0, dkR], [dv0, dvR]].forEach(([g0, r], i) => assertClose(got[i + 2]!, r!.map((x, j) => x + g0![j]!), 2e-5, 2e-5,
      `${['dq', 'dk', 'dv'][i]} vs float64 reference ${shape}`));
    assert.deepEqual(attentionAll(one, ...args), got, `run to run ${shape}`);
    for (const be of many) assert.deepEqual(attentionAll(be, ...args), got, `threads=${be.threads} bit-identical ${shape}`);
  }
  ref64.dispose(); one.dispose();
  for (const be of many) be.dispose();
});

test('loss (every kind), SwiGLU and AdamW are bit-identical for 1, 2, 3 threads and run to run', () => {
  const bes = [new CpuBackend({ threads: 1 }), new CpuBackend({ threads: 2, parallelThreshold: 0 }), new CpuBackend({ threads: 3, parallelThreshold: 0 })];
  const rng = new Rng(43);
  const n = 37, vocab = 53;
  const z = f32randn(rng, n * vocab, 3), zt = f32randn(rng, n * vocab, 3);
  const y = Int32Array.from({ length: n }, (_, i) => (i % 11 === 5 ? -1 : rng.int(vocab)));
  const w = Float64Array.from({ length: n }, (_, i) => (i % 11 === 5 ? 0 : 1 / 33));
  const loss = (be: Backend, spec: LossSpec, withTeacher: boolean) => {
    const S = be.alloc(n * LOSS_STATS, 's'), Y = be.allocInt(n, 'y'), Z = bufOf(be, z);
    be.uploadInt(Y, y);
    be.lossForward(S, Z, Z, withTeacher ? bufOf(be, zt) : null, Y, bufOf(be, w), n, vocab, spec); // dlogits aliases logits
    return [be.download(S), be.download(Z)];
  };
  for (const spec of LOSS_SPECS) for (const withTeacher of spec.kind === 'none' ? [false, true] : [true]) {
    const ref = loss(bes[0]!, spec, withTeacher);
    assert.deepEqual(loss(bes[0]!, spec, withTeacher), ref, `loss ${spec.kind} run to run`);
    for (const be of bes.slice(1)) assert.deepEqual(loss(be, spec, withTeacher), ref, `loss ${spec.kind} teacher=${withTeacher} threads=${(be as CpuBackend).threads}`);
  }
  const len = 1037;
  const ga = f32randn(rng, len, 4), up = f32randn(rng, len), dout = f32randn(rng, len), d0 = f32randn(rng, len);
  const m0 = f32randn(rng, len, 0.1), v0 = Float64Array.from(f32randn(rng, len, 0.1), (x) => x * x);
  const ew = (be: Backend) => {
    const G = bufOf(be, ga), U = bufOf(be, up), O = be.alloc(len, 'o'), DG = bufOf(be, d0), DU = bufOf(be, d0);
    be.swigluForward(O, G, U, len);
    be.swigluBackward(DG, DU, bufOf(be, dout), G, U, len);
    const P = bufOf(be, up), M = bufOf(be, m0), V = bufOf(be, v0);
    for (let step = 1; step <= 3; step++) {
      be.adamw(P, bufOf(be, dout), M, V, len - 3, { lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1, step, gradScale: 0.7 });
    }
    return [O, DG, DU, P, M, V].map((a) => be.download(a));
  };
  const ref = ew(bes[0]!);
  assertClose(ref[0]!, ga.map((g, i) => g / (1 + Math.exp(-g)) * up[i]!), 2e-5, 2e-6, 'swiglu vs reference');
  assert.equal(ref[3]![len - 1], Math.fround(up[len - 1]!), 'adamw leaves elements past n alone');
  assert.deepEqual(ew(bes[0]!), ref, 'elementwise run to run');
  for (const be of bes.slice(1)) assert.deepEqual(ew(be), ref, `elementwise threads=${(be as CpuBackend).threads}`);
  for (const be of bes) be.dispose();
});

test('packTask/unpackTask: views of the WASM memory (f32 and i32) travel as references and come back as the same views', () => {
  const m = wasmModule();
  assert.ok('module' in m);
  const arena = new WasmArena();
  const a = arena.alloc(10), ids = arena.allocInt(5), other = new Float32Array(new SharedArrayBuffer(16));
  a.set([1, 2, 3]); ids.set([7, 8]);
  const view = a.subarray(2, 7);
  const task = { op: 'ew', fn: 'swigluF', x0: view, x1: other, x2: a, x3: null, x4: null, adam: null, i0: 0, i1: 5, ids } as unknown as Task;
  const packed = packTask(task, (v) => arena.owns(v)) as unknown as Record<string, unknown>;
  assert.deepEqual(packed['x0'], { $arena: 'f32', o: view.byteOffset, n: 5 });
  assert.equal(packed['x1'], other, 'arrays outside the memory are posted as they are');
  assert.deepEqual(packed['ids'], { $arena: 'i32', o: ids.byteOffset, n: 5 });
  const back = unpackTask(packed as unknown as Task, arena.memory) as unknown as Record<string, unknown>;
  assert.ok(back['x0'] instanceof Float32Array && back['ids'] instanceof Int32Array);
  assert.deepEqual(back['x0'], view);
  assert.deepEqual(back['ids'], ids);
  (back['x2'] as Float32Array)[0] = 42;
  assert.equal(a[0], 42, 'unpacked views share the memory');
  assert.equal(back['x3'], null);
  assert.equal(back['i1'], 5);
});
