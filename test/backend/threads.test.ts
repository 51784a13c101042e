/**
 * The CPU backend's worker-thread path: multi-threaded matrix products (forward and all three backward
 * products), attention and loss equal the single-threaded results within float32 rounding, SwiGLU (both forms) bit
 * for bit, on odd shapes and on shapes above the default threshold; worker errors surface as exceptions; a backend that is never disposed
 * does not keep the process alive.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { Backend, RopeSpec } from '../../src/backend/backend.js';
import { LOSS_STATS } from '../../src/backend/backend.js';
import { CpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { packBf16, unpackBf16 } from '../../src/backend/bf16.js';
import { Rng } from '../../src/util/rng.js';
import { assertClose, bufOf, randn } from './helpers.js';
import { LOSS_SPECS } from './reference.js';

/** Runs the same matmul forward+backward on `be` and returns [out, dinp, dweight, dbias]. */
function matmulAll(be: Backend, x: Float64Array, w: Float64Array, b: Float64Array, dout: Float64Array, n: number, k: number, m: number): Float64Array[] {
  const X = bufOf(be, x), W = bufOf(be, w), B = bufOf(be, b), G = bufOf(be, dout);
  const out = be.alloc(n * m, 'o'), dx = bufOf(be, x), dw = bufOf(be, w), db = bufOf(be, b); // non-zero: tests accumulation
  be.matmulForward(out, X, W, B, n, k, m);
  be.matmulBackward(dx, dw, db, G, X, W, n, k, m);
  return [out, dx, dw, db].map((a) => Float64Array.from(be.download(a)));
}

test('threaded matmul forward/backward equals single-threaded (odd shapes, row and column splits)', () => {
  const one = new CpuBackend({ threads: 1 });
  const many = [new CpuBackend({ threads: 2, parallelThreshold: 0 }), new CpuBackend({ threads: 3, parallelThreshold: 0 })];
  const rng = new Rng(21);
  const shapes: Array<[number, number, number]> = [[1, 33, 17], [3, 7, 5], [7, 13, 5], [37, 29, 23], [64, 31, 1], [9, 1, 11], [131, 130, 67]];
  for (const [n, k, m] of shapes) {
    const x = randn(rng, n * k), w = randn(rng, m * k), b = randn(rng, m), g = randn(rng, n * m);
    const ref = matmulAll(one, x, w, b, g, n, k, m);
    for (const be of many) {
      const got = matmulAll(be, x, w, b, g, n, k, m);
      ['out', 'dinp', 'dweight', 'dbias'].forEach((name, i) =>
        assertClose(got[i]!, ref[i]!, 1e-5, 1e-5, `${name} ${n}x${k}x${m} threads=${(be as CpuBackend).threads}`));
    }
  }
  one.dispose();
  for (const be of many) be.dispose();
});

test('threaded matmul in f64 mode (used by whole-model finite-difference tests) equals single-threaded', () => {
  const one = new CpuBackend({ dtype: 'f64', threads: 1 }), two = new CpuBackend({ dtype: 'f64', threads: 2, parallelThreshold: 0 });
  const rng = new Rng(24);
  for (const [n, k, m] of [[5, 9, 7], [33, 17, 12]] as const) {
    const x = randn(rng, n * k), w = randn(rng, m * k), b = randn(rng, m), g = randn(rng, n * m);
    const ref = matmulAll(one, x, w, b, g, n, k, m), got = matmulAll(two, x, w, b, g, n, k, m);
    ['out', 'dinp', 'dweight', 'dbias'].forEach((name, i) => assertClose(got[i]!, ref[i]!, 1e-13, 1e-13, `f64 ${name} ${n}x${k}x${m}`));
  }
  one.dispose(); two.dispose();
});

test('threaded matmul at the default threshold (2 threads) matches a float64 reference', () => {
  const be = new CpuBackend({ threads: 2 });
  const rng = new Rng(22);
  const n = 133, k = 129, m = 67; // 1.15M multiply-adds > default threshold of 2^20
  const x = Float64Array.from(Float32Array.from(randn(rng, n * k))), w = Float64Array.from(Float32Array.from(randn(rng, m * k)));
  const out = be.alloc(n * m, 'o');
  be.matmulForward(out, bufOf(be, x), bufOf(be, w), null, n, k, m);
  const ref = new Float64Array(n * m);
  for (let i = 0; i < n; i++) for (let j = 0; j < m; j++) {
    let s = 0;
    for (let l = 0; l < k; l++) s += x[i * k + l]! * w[j * k + l]!;
    ref[i * m + j] = s;
  }
  assertClose(be.download(out), ref, 1e-5, 1e-5, 'threaded matmul vs float64 reference');
  be.dispose();
});

test('threaded attention forward/backward and loss equal single-threaded', () => {
  const one = new CpuBackend({ threads: 1 }), two = new CpuBackend({ threads: 2, parallelThreshold: 0 });
  const rng = new Rng(23);
  const b = 3, t = 5, nH = 4, nKv = 2, hd = 6;
  const q = randn(rng, b * t * nH * hd), k = randn(rng, b * t * nKv * hd), v = randn(rng, b * t * nKv * hd), g = randn(rng, b * t * nH * hd);
  const run = (be: Backend) => {
    const Q = bufOf(be, q), K = bufOf(be, k), V = bufOf(be, v), G = bufOf(be, g);
    const out = be.alloc(q.length, 'o'), lse = be.alloc(b * nH * t, 'lse');
    const dq = be.alloc(q.length, 'dq'), dk = be.alloc(k.length, 'dk'), dv = be.alloc(v.length, 'dv');
    be.attentionForward(out, lse, Q, K, V, b, t, nH, nKv, hd);
    be.attentionBackward(dq, dk, dv, G, Q, K, V, out, lse, b, t, nH, nKv, hd);
    return [out, lse, dq, dk, dv].map((x) => be.download(x));
  };
  const r1 = run(one), r2 = run(two);
  ['out', 'lse', 'dq', 'dk', 'dv'].forEach((name, i) => assertClose(r2[i]!, r1[i]!, 1e-6, 1e-6, `attention ${name}`));

  const n = 7, vocab = 11;
  const z = randn(rng, n * vocab), zt = randn(rng, n * vocab);
  const y = Int32Array.from({ length: n }, (_, i) => (i === 3 ? -1 : rng.int(vocab)));
  const wts = Float64Array.from({ length: n }, (_, i) => (i === 3 ? 0 : 1 / 6));
  for (const spec of LOSS_SPECS) {
    const runLoss = (be: Backend) => {
      const S = be.alloc(n * LOSS_STATS, 's'), D = be.alloc(n * vocab, 'd'), Y = be.allocInt(n, 'y');
      be.uploadInt(Y, y);
      be.lossForward(S, D, bufOf(be, z), spec.kind === 'none' ? null : bufOf(be, zt), Y, bufOf(be, wts), n, vocab, spec);
      return [be.download(S), be.download(D)];
    };
    const a = runLoss(one), c = runLoss(two);
    assertClose(c[0]!, a[0]!, 1e-6, 1e-6, `loss stats ${spec.kind}`);
    assertClose(c[1]!, a[1]!, 1e-6, 1e-6, `dlogits ${spec.kind}`);
  }
  one.dispose(); two.dispose();
});

/** `run`'s outputs on 2 and 3 threads (every op split, however small) equal one thread's bit for bit. */
function sameBitsAtThreadCounts(run: (be: CpuBackend) => Float64Array[], names: readonly string[], what: string): void {
  const one = new CpuBackend({ threads: 1 });
  const ref = run(one);
  one.dispose();
  for (const threads of [2, 3]) {
    const many = new CpuBackend({ threads, parallelThreshold: 0 });
    const got = run(many);
    many.dispose();
    names.forEach((name, i) => assert.deepEqual(got[i], ref[i], `${name} ${what} threads=${threads}`));
  }
}

test('threaded SwiGLU (the joined gate/up rows and the two-tensor form) equals single-threaded bit for bit, f32 and bf16 stores', () => {
  const rng = new Rng(25);
  for (const dtype of ['f32', 'bf16'] as const) {
    // 37 rows: not a multiple of the split's 16-row alignment, so the last chunk is short
    for (const [rows, cols] of [[37, 24], [5, 3]] as const) {
      const gu = randn(rng, 2 * rows * cols).map((x) => 3 * x), dy = randn(rng, rows * cols);
      const run = (be: CpuBackend): Float64Array[] => {
        const buf = (a: Float64Array, label: string): ReturnType<Backend['alloc']> => { const b = be.alloc(a.length, label, dtype); be.upload(b, a); return b; };
        const GU = buf(gu, 'gu'), DY = buf(dy, 'dy');
        const out = be.alloc(rows * cols, 'out', dtype), dgu = buf(randn(rng, 2 * rows * cols), 'dgu'); // overwritten
        be.swigluForwardRows(out, GU, rows, cols);
        be.swigluBackwardRows(dgu, DY, GU, rows, cols);
        // the two-tensor form over the same halves of row 0.. (gate = the first rows·cols values, up = the rest)
        const g = buf(gu.subarray(0, rows * cols), 'g'), u = buf(gu.subarray(rows * cols), 'u');
        const o2 = be.alloc(rows * cols, 'o2', dtype), dg = be.alloc(rows * cols, 'dg', dtype), du = be.alloc(rows * cols, 'du', dtype);
        be.swigluForward(o2, g, u, rows * cols);
        be.swigluBackward(dg, du, DY, g, u, rows * cols);
        return [out, dgu, o2, dg, du].map((x) => Float64Array.from(be.download(x)));
      };
      sameBitsAtThreadCounts(run, ['out', 'dgu', 'out (two tensors)', 'dgate', 'dup'], `${dtype} ${rows}x${cols}`);
      // and the row form is the plain loop: out = g·σ(g)·u per row's halves (float64 of the stored inputs, one rounding)
      const be = new CpuBackend({ threads: 2, parallelThreshold: 0 });
      const [out] = run(be);
      be.dispose();
      const stored = (x: number): number => (dtype === 'bf16' ? unpackBf16(packBf16([x]))[0]! : Math.fround(x));
      for (let r = 0; r < rows; r++) {
        for (let c = 0; c < cols; c++) {
          const gv = stored(gu[2 * r * cols + c]!), uv = stored(gu[(2 * r + 1) * cols + c]!);
          const want = gv / (1 + Math.exp(-gv)) * uv;
          assert.ok(Math.abs(out![r * cols + c]! - want) <= (dtype === 'bf16' ? 8e-3 : 1e-6) * Math.max(1, Math.abs(want)), `row ${r} col ${c} ${dtype}`);
        }
      }
    }
  }
});

test('threaded RoPE (forward with a bias, in place, strided; backward overwriting and accumulating) equals single-threaded bit for bit', () => {
  const rng = new Rng(26);
  const b = 3, t = 7, heads = 2, hd = 6, w = heads * hd, wide = w + 4; // a row stride wider than the row
  // YaRN with an attention factor: the factor scales both rotations
  const rope: RopeSpec = { type: 'yarn', theta: 10000, factor: 4, originalMaxPositionEmbeddings: 64, betaFast: 32, betaSlow: 1, attentionFactor: 1.2, truncate: true };
  const x = randn(rng, b * t * wide), bias = randn(rng, w), dy = randn(rng, b * t * wide), acc0 = randn(rng, b * t * w);
  const run = (be: CpuBackend): Float64Array[] => {
    const X = bufOf(be, x), B = bufOf(be, bias), DY = bufOf(be, dy);
    const out = be.alloc(b * t * w, 'out'), inPlace = bufOf(be, x.subarray(0, b * t * w)), dx = be.alloc(b * t * w, 'dx'), acc = bufOf(be, acc0);
    be.ropeForward(out, X, b, t, heads, hd, rope, 3, B, { inp: wide });
    be.ropeForward(inPlace, inPlace, b, t, heads, hd, rope, 0);
    be.ropeBackward(dx, DY, b, t, heads, hd, rope, 3, false, { inp: wide });
    be.ropeBackward(acc, DY, b, t, heads, hd, rope, 3, true, { inp: wide });
    return [out, inPlace, dx, acc].map((a) => Float64Array.from(be.download(a)));
  };
  sameBitsAtThreadCounts(run, ['forward (bias, strided)', 'forward in place', 'backward', 'backward accumulating'], 'rope');
  // an odd head dim is refused by name on the threaded path too
  const two = new CpuBackend({ threads: 2, parallelThreshold: 0 });
  assert.throws(() => two.ropeForward(two.alloc(b * t * 5, 'o'), two.alloc(b * t * 5, 'i'), b, t, 1, 5, rope, 0), /head dim 5 must be even/);
  two.dispose();
});

test('an error inside a worker task surfaces as an exception, and the pool keeps working', () => {
  const be = new CpuBackend({ threads: 2, parallelThreshold: 0 });
  const n = 4, vocab = 3;
  const S = be.alloc(n * LOSS_STATS, 's'), Y = be.allocInt(n, 'y');
  be.uploadInt(Y, Int32Array.from([0, 1, 2, 7])); // row 3 (the worker's share) is out of range
  assert.throws(() => be.lossForward(S, null, be.alloc(n * vocab, 'z'), null, Y, bufOf(be, [1, 1, 1, 1]), n, vocab, LOSS_SPECS[0]!), /target 7/);
  be.uploadInt(Y, Int32Array.from([0, 1, 2, 0]));
  be.lossForward(S, null, be.alloc(n * vocab, 'z'), null, Y, bufOf(be, [1, 1, 1, 1]), n, vocab, LOSS_SPECS[0]!);
  assertClose([be.download(S)[3 * LOSS_STATS]!], [Math.log(3)], 1e-6, 0, 'uniform logits give CE = log(vocab)');
  be.dispose();
  assert.throws(() => be.matmulForward(be.alloc(4, 'o'), be.alloc(4, 'a'), be.alloc(4, 'w'), null, 2, 2, 2), /dispose/);
});

test('a backend that is never disposed does not keep the process alive', () => {
  const mod = fileURLToPath(new URL('../../src/backend/cpu/cpu-backend.js', import.meta.url));
  const script = `
    import { CpuBackend } from ${JSON.stringify(mod)};
    const be = new CpuBackend({ threads: 2, parallelThreshold: 0 });
    const a = be.alloc(64, 'a'); be.upload(a, Array.from({ length: 64 }, (_, i) => i));
    const o = be.alloc(64, 'o');
    be.matmulForward(o, a, a, null, 8, 8, 8);
    console.log(be.download(o)[0]);`;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { timeout: 15_000, encoding: 'utf8' });
  assert.equal(r.error, undefined, `child did not exit: ${String(r.error)}`);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout.trim(), String([0, 1, 2, 3, 4, 5, 6, 7].reduce((s, i) => s + i * i, 0)));
});
