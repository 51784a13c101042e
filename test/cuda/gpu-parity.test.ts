/**
 * GPU-only tests (skip cleanly without libcuda or a GPU): every op on the CUDA backend against the CPU backend
 * (float32) on the same random inputs, plus the real pre-warm/seal path and named CUDA errors.
 *
 * Metric: max |cuda - cpu| / max |cpu| over each compared buffer ≤ tol. tol is 1e-5 except where summation
 * order legitimately differs more: attention backward (dK/dV summed over query rows and GQA heads in tiles) 1e-4,
 * and the loss (CPU reduces in float64, CUDA in float32 block reductions over the vocabulary) 2e-5.
 * Reduced precision (--tf32: cuBLAS rounds GEMM operands to TF32, a 10-bit mantissa): documented bound 4e-3 on
 * matrix products with k in the hundreds (operand rounding ~2^-11 relative, accumulated over k in float32).
 * With DISTILLERY_PARITY_TABLE=<file>, each case appends "op<TAB>error<TAB>tol<TAB>ok" for scripts/cuda/device-check.sh.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { appendFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { LOSS_STATS, type Backend, type Buf, type IntBuf, type LossSpec } from '../../src/backend/backend.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { createCudaBackend, prewarm } from '../../src/backend/cuda/index.js';
import { QWEN_LIKE, allOpsStep, gpuOrSkip, rand, rng, scaledRopes } from './helpers.js';
import { relErr } from '../util/compare.js';
import { plainRope } from '../../src/backend/rope.js';
import { formatSparse, sparseRow, sparseSlots, type SparseRep } from '../../src/cache/sparse.js';
import { allocSparseHost, setSparseRow } from '../../src/cache/targets.js';
import { nf4Words, quantizeNf4 } from '../../src/quant/nf4.js';

const { value: cuda, skip } = gpuOrSkip(() => createCudaBackend({
  strict: false, verbose: process.env.DISTILLERY_VERBOSE_KERNELS === '1', cacheDir: mkdtempSync(join(tmpdir(), 'dk-')),
}));
const cpu: Backend | null = cuda ? createCpuBackend({ dtype: 'f32', threads: 2 }) : null;
after(() => { cuda?.dispose(); cpu?.dispose(); });

type Arrays = Record<string, Float32Array | Int32Array>;
type Bufs = Record<string, Buf & IntBuf>;

function load(b: Backend, arrays: Arrays): Bufs {
  const out: Bufs = {};
  for (const [k, a] of Object.entries(arrays)) {
    if (a instanceof Int32Array) { const x = b.allocInt(a.length, k); b.uploadInt(x, a); out[k] = x as Buf & IntBuf; }
    else { const x = b.alloc(a.length, k); b.upload(x, a); out[k] = x as Buf & IntBuf; }
  }
  return out;
}


function record(name: string, err: number, tol: number): void {
  const f = process.env.DISTILLERY_PARITY_TABLE;
  if (f) appendFileSync(f, `${name}\t${err.toExponential(2)}\t${tol.toExponential(0)}\t${err <= tol ? 'ok' : 'FAIL'}\n`);
}

function parity(name: string, tol: number, make: (r: () => number) => { arrays: Arrays; compare: string[]; op: (b: Backend, x: Bufs) => void }): void {
  test(`cuda vs cpu: ${name}`, { skip }, () => {
    const { arrays, compare, op } = make(rng(name.length * 7919 + 17));
    const xc = load(cpu!, arrays), xg = load(cuda!, arrays);
    op(cpu!, xc);
    op(cuda!, xg);
    let worst = 0;
    for (const k of compare) {
      const e = relErr(cuda!.download(xg[k]!), cpu!.download(xc[k]!));
      worst = Math.max(worst, e);
      assert.ok(e <= tol, `${name}: ${k} relative error ${e} > ${tol}`);
    }
    record(name, worst, tol);
  });
}

const N = 3000;
parity('add', 1e-5, (r) => ({ arrays: { o: rand(r, N), a: rand(r, N), b: rand(r, N) }, compare: ['o'], op: (b, x) => b.add(x.o!, x.a!, x.b!, N) }));
parity('accumulate', 1e-5, (r) => ({ arrays: { d: rand(r, N), s: rand(r, N) }, compare: ['d'], op: (b, x) => b.accumulate(x.d!, x.s!, N) }));
parity('scale', 1e-5, (r) => ({ arrays: { d: rand(r, N) }, compare: ['d'], op: (b, x) => b.scale(x.d!, 0.37, N - 5) }));
parity('swiglu fwd', 1e-5, (r) => ({ arrays: { o: rand(r, N), g: rand(r, N, 4), u: rand(r, N) }, compare: ['o'], op: (b, x) => b.swigluForward(x.o!, x.g!, x.u!, N) }));
parity('swiglu bwd', 1e-5, (r) => ({
  arrays: { dg: rand(r, N), du: rand(r, N), d: rand(r, N), g: rand(r, N, 4), u: rand(r, N) }, compare: ['dg', 'du'],
  op: (b, x) => b.swigluBackward(x.dg!, x.du!, x.d!, x.g!, x.u!, N),
}));
// overwrite mode: dgate/dup start with values the op must ignore (the CPU zeroes then accumulates; CUDA stores)
parity('swiglu bwd, overwriting', 1e-5, (r) => ({
  arrays: { dg: rand(r, N, 50), du: rand(r, N, 50), d: rand(r, N), g: rand(r, N, 4), u: rand(r, N) }, compare: ['dg', 'du'],
  op: (b, x) => b.swigluBackward(x.dg!, x.du!, x.d!, x.g!, x.u!, N, false),
}));
// no rows, overwriting: the weight and bias gradients are the empty sums (zero), whatever they held
parity('matmul backward over no rows, overwriting the weight and bias gradients', 1e-6, (r) => ({
  arrays: { dw: rand(r, 6 * 5, 9), db: rand(r, 6, 9), d: rand(r, 6), i: rand(r, 5), w: rand(r, 6 * 5), dw2: rand(r, 5, 9) },
  compare: ['dw', 'db', 'dw2'],
  op: (b, x) => {
    b.matmulBackward(null, x.dw!, x.db!, x.d!, x.i!, x.w!, 0, 5, 6, true, false);
    b.rmsnormBackward(b.view(x.i!, 0, 0), x.dw2!, b.view(x.d!, 0, 0), b.view(x.i!, 0, 0), b.view(x.w!, 0, 5), b.view(x.d!, 0, 0), 0, 5, null, false);
  },
}));
// the fused gate/up layout: rows of [gate | up]; 40 columns take the 128-bit path, 13 the scalar one
for (const cols of [40, 13]) {
  const R = 37;
  parity(`swiglu fwd rows (fused gate/up, ${cols} columns)`, 1e-5, (r) => ({
    arrays: { o: rand(r, R * cols), gu: rand(r, 2 * R * cols, 4) }, compare: ['o'], op: (b, x) => b.swigluForwardRows(x.o!, x.gu!, R, cols),
  }));
  parity(`swiglu bwd rows (fused gate/up, overwriting, ${cols} columns)`, 1e-5, (r) => ({
    arrays: { dgu: rand(r, 2 * R * cols, 50), d: rand(r, R * cols), gu: rand(r, 2 * R * cols, 4) }, compare: ['dgu'],
    op: (b, x) => b.swigluBackwardRows(x.dgu!, x.d!, x.gu!, R, cols),
  }));
}
const ids = (r: () => number, n: number, v: number) => Int32Array.from({ length: n }, () => Math.floor(r() * v));
parity('embedding fwd', 1e-5, (r) => ({ arrays: { o: rand(r, 9 * 40), ids: ids(r, 9, 11), t: rand(r, 11 * 40) }, compare: ['o'], op: (b, x) => b.embeddingForward(x.o!, x.ids!, x.t!, 9, 40) }));
parity('embedding bwd', 1e-5, (r) => ({ arrays: { dt: rand(r, 5 * 40), d: rand(r, 30 * 40), ids: ids(r, 30, 5) }, compare: ['dt'], op: (b, x) => b.embeddingBackward(x.dt!, x.d!, x.ids!, 30, 40) }));
parity('rmsnorm fwd', 1e-5, (r) => ({
  arrays: { o: rand(r, 7 * 300), rs: rand(r, 7), i: rand(r, 7 * 300, 3), w: rand(r, 300) }, compare: ['o', 'rs'],
  op: (b, x) => b.rmsnormForward(x.o!, x.rs!, x.i!, x.w!, 7, 300, 1e-6),
}));
// the fused residual add + norm: sum aliasing a (the model's h += x), a row slice per thread in registers with a ragged
// last slice (C 300), an exact one (C 512), the register limit (C 8192 = 32 × 256) and the re-reading path past it (C 9000)
for (const [rows, C] of [[7, 300], [5, 512], [3, 8192], [3, 9000]] as const) {
  parity(`add + rmsnorm fwd fused, sum aliasing a, C ${C}`, 1e-5, (r) => ({
    arrays: { h: rand(r, rows * C, 3), x: rand(r, rows * C), o: rand(r, rows * C), rs: rand(r, rows), w: rand(r, C) }, compare: ['h', 'o', 'rs'],
    op: (b, x) => b.addRmsnormForward(x.h!, x.o!, x.rs!, x.h!, x.x!, x.w!, rows, C, 1e-6),
  }));
}
test('cuda: addRmsnormForward stores bit-for-bit what add then rmsnormForward store (same block, same float ops), sum aliasing b', { skip }, () => {
  const r = rng(4242);
  for (const [rows, C] of [[7, 300], [3, 9000]] as const) {
    const a = rand(r, rows * C, 3), h = rand(r, rows * C), w = rand(r, C);
    const g = cuda!;
    const up = (data: Float32Array, label: string): Buf => { const x = g.alloc(data.length, label); g.upload(x, data); return x; };
    const A0 = up(a, 'a0'), S0 = up(h, 's0'), W = up(w, 'w'), O0 = g.alloc(rows * C, 'o0'), R0 = g.alloc(rows, 'r0');
    g.add(S0, A0, S0, rows * C);
    g.rmsnormForward(O0, R0, S0, W, rows, C, 1e-5);
    const A = up(a, 'a'), S = up(h, 's'), O = g.alloc(rows * C, 'o'), R = g.alloc(rows, 'r');
    g.addRmsnormForward(S, O, R, A, S, W, rows, C, 1e-5);
    assert.deepEqual(g.download(S), g.download(S0), `sum C ${C}`);
    assert.deepEqual(g.download(O), g.download(O0), `out C ${C}`);
    assert.deepEqual(g.download(R), g.download(R0), `rstd C ${C}`);
  }
});
parity('rmsnorm bwd', 1e-5, (r) => {
  const i = rand(r, 7 * 300, 3);
  const rs = new Float32Array(7);
  for (let row = 0; row < 7; row++) { let s = 0; for (let j = 0; j < 300; j++) s += i[row * 300 + j]! ** 2; rs[row] = 1 / Math.sqrt(s / 300 + 1e-6); }
  return {
    arrays: { di: rand(r, 7 * 300), dw: rand(r, 300), d: rand(r, 7 * 300), i, w: rand(r, 300), rs }, compare: ['di', 'dw'],
    op: (b, x) => b.rmsnormBackward(x.di!, x.dw!, x.d!, x.i!, x.w!, x.rs!, 7, 300),
  };
});
// Qwen3's per-head q/k norms: many short rows (warp-per-row kernels, C ≤ 256), a ragged width and head_dim 128, with
// more rows than the backward's 1024 blocks × 8 warps take in one sweep (the grid-stride loop and the partials).
for (const [rows, C] of [[37, 40], [9001, 128]] as const) {
  parity(`rmsnorm fwd + bwd, warp per row (${rows} rows of ${C})`, 1e-5, (r) => ({
    arrays: { o: rand(r, rows * C), rs: rand(r, rows), i: rand(r, rows * C, 3), w: rand(r, C), di: rand(r, rows * C), dw: rand(r, C), d: rand(r, rows * C) },
    compare: ['o', 'rs', 'di', 'dw'],
    op: (b, x) => { b.rmsnormForward(x.o!, x.rs!, x.i!, x.w!, rows, C, 1e-6); b.rmsnormBackward(x.di!, x.dw!, x.d!, x.i!, x.w!, x.rs!, rows, C); },
  }));
}
parity('matmul fwd + bias', 1e-5, (r) => ({
  arrays: { o: rand(r, 33 * 45), i: rand(r, 33 * 70), w: rand(r, 45 * 70), bias: rand(r, 45) }, compare: ['o'],
  op: (b, x) => b.matmulForward(x.o!, x.i!, x.w!, x.bias!, 33, 70, 45),
}));
test('cuda (--tf32) vs cpu: matrix products within the documented reduced-precision bound, and not bit-equal to fp32', { skip }, () => {
  const tf = createCudaBackend({ strict: false, tf32: true, cacheDir: mkdtempSync(join(tmpdir(), 'dk-tf32-')) });
  try {
    const r = rng(4242);
    const n = 64, k = 512, m = 96, tol = 4e-3;
    const arrays: Arrays = { o: rand(r, n * m), i: rand(r, n * k), w: rand(r, m * k), di: rand(r, n * k), dw: rand(r, m * k), d: rand(r, n * m) };
    const xc = load(cpu!, arrays), xt = load(tf, arrays), xg = load(cuda!, arrays);
    for (const [b, x] of [[cpu!, xc], [tf, xt], [cuda!, xg]] as Array<[Backend, Bufs]>) {
      b.matmulForward(x.o!, x.i!, x.w!, null, n, k, m);
      b.matmulBackward(x.di!, x.dw!, null, x.d!, x.i!, x.w!, n, k, m);
    }
    let worst = 0, differs = 0;
    for (const key of ['o', 'di', 'dw']) {
      const e = relErr(tf.download(xt[key]!), cpu!.download(xc[key]!));
      worst = Math.max(worst, e);
      assert.ok(e <= tol, `tf32 ${key}: relative error ${e} > ${tol}`);
      differs = Math.max(differs, relErr(tf.download(xt[key]!), cuda!.download(xg[key]!)));
    }
    record('matmul fwd+bwd, tf32', worst, tol);
    assert.ok(differs > 1e-6, `--tf32 gave the fp32 result (difference ${differs}): TF32 math mode not in effect`);
  } finally { tf.dispose(); }
});
parity('matmul fwd, accumulating into out (LoRA\'s B product)', 1e-5, (r) => ({
  arrays: { o: rand(r, 33 * 45, 5), i: rand(r, 33 * 16), w: rand(r, 45 * 16) }, compare: ['o'],
  op: (b, x) => b.matmulForward(x.o!, x.i!, x.w!, null, 33, 16, 45, true),
}));
parity('matmul bwd', 1e-5, (r) => ({
  arrays: { di: rand(r, 33 * 70), dw: rand(r, 45 * 70), db: rand(r, 45), d: rand(r, 33 * 45), i: rand(r, 33 * 70), w: rand(r, 45 * 70) },
  compare: ['di', 'dw', 'db'], op: (b, x) => b.matmulBackward(x.di!, x.dw!, x.db!, x.d!, x.i!, x.w!, 33, 70, 45),
}));
parity('matmul bwd, dinp overwritten (dweight, dbias accumulate)', 1e-5, (r) => ({
  arrays: { di: rand(r, 33 * 70, 50), dw: rand(r, 45 * 70), db: rand(r, 45), d: rand(r, 33 * 45), i: rand(r, 33 * 70), w: rand(r, 45 * 70) },
  compare: ['di', 'dw', 'db'], op: (b, x) => b.matmulBackward(x.di!, x.dw!, x.db!, x.d!, x.i!, x.w!, 33, 70, 45, false),
}));
const RB = 2, RT = 5, RH = 3, RD = 8;
parity('rope fwd', 1e-5, (r) => ({ arrays: { o: rand(r, RB * RT * RH * RD), i: rand(r, RB * RT * RH * RD) }, compare: ['o'], op: (b, x) => b.ropeForward(x.o!, x.i!, RB, RT, RH, RD, plainRope(10000), 3) }));
parity('rope fwd in place, far positions', 1e-5, (r) => ({ arrays: { i: rand(r, RB * RT * RH * RD) }, compare: ['i'], op: (b, x) => b.ropeForward(x.i!, x.i!, RB, RT, RH, RD, plainRope(1e6), 30000) }));
parity('rope fwd with a bias', 1e-5, (r) => ({ arrays: { o: rand(r, RB * RT * RH * RD), i: rand(r, RB * RT * RH * RD), bq: rand(r, RH * RD) }, compare: ['o'], op: (b, x) => b.ropeForward(x.o!, x.i!, RB, RT, RH, RD, plainRope(10000), 3, x.bq!) }));
parity('rope bwd', 1e-5, (r) => ({ arrays: { di: rand(r, RB * RT * RH * RD), d: rand(r, RB * RT * RH * RD) }, compare: ['di'], op: (b, x) => b.ropeBackward(x.di!, x.d!, RB, RT, RH, RD, plainRope(10000), 3) }));
// row strides: q-like columns [5, 5 + RH·RD) of a wider buffer read (forward, with a bias) and written (backward)
const RW = RH * RD + 13;
parity('rope fwd, strided input', 1e-5, (r) => ({ arrays: { o: rand(r, RB * RT * RH * RD), i: rand(r, RB * RT * RW), bq: rand(r, RH * RD) }, compare: ['o'], op: (b, x) => b.ropeForward(x.o!, b.view(x.i!, 5, RB * RT * RW - 5), RB, RT, RH, RD, plainRope(10000), 3, x.bq!, { inp: RW }) }));
parity('rope bwd, strided output, overwriting', 1e-5, (r) => ({ arrays: { di: rand(r, RB * RT * RW), d: rand(r, RB * RT * RH * RD) }, compare: ['di'], op: (b, x) => b.ropeBackward(b.view(x.di!, 5, RB * RT * RW - 5), x.d!, RB, RT, RH, RD, plainRope(10000), 3, false, { out: RW }) }));
// overwriting (accumulate false): the old dinp is never read (the CPU backend's own test checks it equals Rᵀ dout alone)
parity('rope bwd, overwriting', 1e-5, (r) => ({ arrays: { di: rand(r, RB * RT * RH * RD), d: rand(r, RB * RT * RH * RD) }, compare: ['di'], op: (b, x) => b.ropeBackward(x.di!, x.d!, RB, RT, RH, RD, plainRope(10000), 3, false) }));
for (const rope of scaledRopes(5e5)) {
  parity(`rope ${rope.type} bwd, overwriting`, 1e-5, (r) => ({ arrays: { di: rand(r, RB * RT * RH * RD), d: rand(r, RB * RT * RH * RD) }, compare: ['di'], op: (b, x) => b.ropeBackward(x.di!, x.d!, RB, RT, RH, RD, rope, 3, false) }));
  parity(`rope ${rope.type} fwd, far positions`, 1e-5, (r) => ({ arrays: { o: rand(r, RB * RT * RH * RD), i: rand(r, RB * RT * RH * RD) }, compare: ['o'], op: (b, x) => b.ropeForward(x.o!, x.i!, RB, RT, RH, RD, rope, 9000) }));
  parity(`rope ${rope.type} bwd`, 1e-5, (r) => ({ arrays: { di: rand(r, RB * RT * RH * RD), d: rand(r, RB * RT * RH * RD) }, compare: ['di'], op: (b, x) => b.ropeBackward(x.di!, x.d!, RB, RT, RH, RD, rope, 3) }));
}
const AB = 2, AT = 7, AH = 4, AKV = 2, AD = 16;
const attnArrays = (r: () => number): Arrays => ({
  o: rand(r, AB * AT * AH * AD), p: rand(r, AB * AH * AT), q: rand(r, AB * AT * AH * AD), k: rand(r, AB * AT * AKV * AD), v: rand(r, AB * AT * AKV * AD),
});
// p: the saved log-sum-exp [B, heads, T] (test/cuda/flash-attention.test.ts sweeps shapes, head dims and float64)
parity('attention fwd', 1e-5, (r) => ({ arrays: attnArrays(r), compare: ['o', 'p'], op: (b, x) => b.attentionForward(x.o!, x.p!, x.q!, x.k!, x.v!, AB, AT, AH, AKV, AD) }));
parity('attention bwd', 1e-4, (r) => ({
  arrays: { ...attnArrays(r), dq: rand(r, AB * AT * AH * AD), dk: rand(r, AB * AT * AKV * AD), dv: rand(r, AB * AT * AKV * AD), d: rand(r, AB * AT * AH * AD) },
  compare: ['dq', 'dk', 'dv'],
  op: (b, x) => { b.attentionForward(x.o!, x.p!, x.q!, x.k!, x.v!, AB, AT, AH, AKV, AD); b.attentionBackward(x.dq!, x.dk!, x.dv!, x.d!, x.q!, x.k!, x.v!, x.o!, x.p!, AB, AT, AH, AKV, AD); },
}));
// attention_bwd_dkv: several key tiles with the GQA group split over blocks (G = 3 → attention_dkv_reduce), and MHA (unsplit);
// accumulating, and overwriting (the SIMT path zeroes, then adds: dq, dk, dv start random on both backends and must not show).
for (const [hN, kvN, tN, dN] of [[6, 2, 70, 24], [3, 3, 40, 16]] as const) {
  for (const accumulate of [true, false]) {
    parity(`attention bwd B=2 T=${tN} heads ${hN}/${kvN} hd ${dN}${accumulate ? '' : ', overwriting'}`, 1e-4, (r) => ({
      arrays: {
        o: rand(r, 2 * tN * hN * dN), p: rand(r, 2 * hN * tN), q: rand(r, 2 * tN * hN * dN), k: rand(r, 2 * tN * kvN * dN), v: rand(r, 2 * tN * kvN * dN),
        dq: rand(r, 2 * tN * hN * dN), dk: rand(r, 2 * tN * kvN * dN), dv: rand(r, 2 * tN * kvN * dN), d: rand(r, 2 * tN * hN * dN),
      },
      compare: ['dq', 'dk', 'dv'],
      op: (b, x) => {
        b.attentionForward(x.o!, x.p!, x.q!, x.k!, x.v!, 2, tN, hN, kvN, dN);
        b.attentionBackward(x.dq!, x.dk!, x.dv!, x.d!, x.q!, x.k!, x.v!, x.o!, x.p!, 2, tN, hN, kvN, dN, accumulate);
      },
    }));
  }
}
parity('kv cache write + cached attention', 1e-5, (r) => {
  const tMax = 12, t = 3, pos0 = 4;
  return {
    arrays: { kc: rand(r, AB * tMax * AKV * AD), vc: rand(r, AB * tMax * AKV * AD), k: rand(r, AB * t * AKV * AD), v: rand(r, AB * t * AKV * AD), q: rand(r, AB * t * AH * AD), o: rand(r, AB * t * AH * AD) },
    compare: ['kc', 'vc', 'o'],
    op: (b, x) => {
      b.kvCacheWrite(x.kc!, x.k!, AB, t, pos0, tMax, AKV, AD); b.kvCacheWrite(x.vc!, x.v!, AB, t, pos0, tMax, AKV, AD);
      b.attentionCached(x.o!, x.q!, x.kc!, x.vc!, AB, t, pos0, tMax, AH, AKV, AD);
    },
  };
});
/** The first index of the largest of row i's first V values (rows of LD): a target the loss's accuracy column counts. */
function argmaxRow(z: ArrayLike<number>, i: number, V: number, LD: number): number {
  let b = 0;
  for (let j = 1; j < V; j++) if (z[i * LD + j]! > z[i * LD + b]!) b = j;
  return b;
}
for (const spec of [
  { kind: 'none', alpha: 0, temperature: 1, beta: 0 }, { kind: 'kl', alpha: 0.6, temperature: 2, beta: 0 },
  { kind: 'reverse-kl', alpha: 0.5, temperature: 1.5, beta: 0 }, { kind: 'jsd', alpha: 0.7, temperature: 2, beta: 0.4 },
  { kind: 'jsd', alpha: 1, temperature: 1, beta: 0 },
] as LossSpec[]) {
  parity(`loss ${spec.kind} a=${spec.alpha} T=${spec.temperature} b=${spec.beta}`, 2e-5, (r) => {
    const n = 6, V = 3001;
    const targets = ids(r, n, V); targets[2] = -1;
    const weights = Float32Array.from({ length: n }, (_, i) => (i === 2 ? 0 : 1 / 5));
    const st = rand(r, n * LOSS_STATS), dl = rand(r, n * V), z = rand(r, n * V, 6);
    targets[0] = argmaxRow(z, 0, V, V); targets[3] = argmaxRow(z, 3, V, V); // the accuracy column: two hits
    return {
      arrays: { st, dl, z, zt: rand(r, n * V, 6), y: targets, w: weights },
      compare: ['st', 'dl'],
      op: (b, x) => b.lossForward(x.st!, x.dl!, x.z!, spec.kind === 'none' ? null : x.zt!, x.y!, x.w!, n, V, spec),
    };
  });
}
parity('loss in place (dlogits aliases logits)', 2e-5, (r) => ({
  arrays: { st: rand(r, 4 * LOSS_STATS), z: rand(r, 4 * 500, 5), zt: rand(r, 4 * 500, 5), y: ids(r, 4, 500), w: new Float32Array([1, 1, 1, 1]) },
  compare: ['st', 'z'], op: (b, x) => b.lossForward(x.st!, x.z!, x.z!, x.zt!, x.y!, x.w!, 4, 500, { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0 }),
}));
parity('loss over the first 2990 of 3008-float rows, in place (padded head width: ld > vocab)', 2e-5, (r) => {
  const n = 5, V = 2990, LD = 3008;
  const targets = ids(r, n, V); targets[1] = -1;
  const weights = Float32Array.from({ length: n }, (_, i) => (i === 1 ? 0 : 1 / 4));
  return {
    arrays: { st: rand(r, n * LOSS_STATS), z: rand(r, n * LD, 6), zt: rand(r, n * LD, 6), y: targets, w: weights },
    compare: ['st', 'z'],
    op: (b, x) => b.lossForward(x.st!, x.z!, x.z!, x.zt!, x.y!, x.w!, n, V, { kind: 'jsd', alpha: 0.7, temperature: 2, beta: 0.4 }, LD),
  };
});
// The sparse loss of a teacher cache: sample rows (no tail) and top-K rows (a tail bucket, one row without), in place.
for (const [rep, spec] of [
  [{ kind: 'sample', n: 32 }, { kind: 'kl', alpha: 0.6, temperature: 2, beta: 0 }], [{ kind: 'sample', n: 7 }, { kind: 'reverse-kl', alpha: 0.5, temperature: 1.5, beta: 0 }],
  [{ kind: 'top', k: 20 }, { kind: 'jsd', alpha: 0.7, temperature: 2, beta: 0.4 }], [{ kind: 'top', k: 64 }, { kind: 'kl', alpha: 1, temperature: 1, beta: 0 }],
] as Array<[SparseRep, LossSpec]>) {
  parity(`sparse loss ${formatSparse(rep)} ${spec.kind} a=${spec.alpha} T=${spec.temperature} b=${spec.beta}, in place over padded rows`, 2e-5, (r) => {
    const n = 6, V = 2990, LD = 3008, S = sparseSlots(rep);
    const targets = ids(r, n, V); targets[2] = -1;
    const weights = Float32Array.from({ length: n }, (_, i) => (i === 2 ? 0 : 1 / 5));
    const zt = Float64Array.from(rand(r, n * V, 6));
    const h = allocSparseHost(n, S);
    for (let i = 0; i < n; i++) {
      const e = sparseRow(zt, i * V, V, spec.temperature, rep, () => r());
      if (i === 4 && rep.kind === 'top') e.tail = -1;
      setSparseRow(h, i, e, rep);
    }
    const st = rand(r, n * LOSS_STATS), z = rand(r, n * LD, 6);
    targets[0] = argmaxRow(z, 0, V, LD); // the accuracy column: a hit
    return {
      arrays: {
        st, z, y: targets, w: weights, ids: h.ids, prob: Float32Array.from(h.prob), logq: Float32Array.from(h.logq),
        tail: Float32Array.from(h.tail), am: h.argmax,
      },
      compare: ['st', 'z'],
      op: (b, x) => b.sparseLossForward(x.st!, x.z!, x.z!, x.y!, x.w!, {
        slots: S, ids: x.ids!, prob: x.prob!, logq: x.logq!, tail: x.tail!, argmax: x.am!, withTail: rep.kind === 'top',
      }, n, V, spec, LD),
    };
  });
}
// Batched generation: the generation ops at per-sequence start positions (decode: one token per sequence).
parity('rope, KV cache write and cached attention at per-sequence positions (batched decode)', 1e-5, (r) => {
  const B = 4, t = 1, H = 14, KV = 2, hd = 64, tMax = 40;
  const pos = Int32Array.from([0, 9, 38, 21]);
  const rope = { type: 'llama3', theta: 500000, factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 16 } as const;
  return {
    arrays: { q: rand(r, B * t * H * hd), k: rand(r, B * t * KV * hd), kc: rand(r, B * tMax * KV * hd), vc: rand(r, B * tMax * KV * hd), o: rand(r, B * t * H * hd), pos },
    compare: ['q', 'kc', 'o'],
    op: (b, x) => {
      const seq = { seqPositions: x.pos! };
      b.ropeForward(x.q!, x.q!, B, t, H, hd, rope, seq);
      b.ropeForward(x.k!, x.k!, B, t, KV, hd, rope, seq);
      b.kvCacheWrite(x.kc!, x.k!, B, t, seq, tMax, KV, hd);
      b.attentionCached(x.o!, x.q!, x.kc!, x.vc!, B, t, seq, tMax, H, KV, hd);
    },
  };
});
// The device sampler: the same ids as the CPU's float64 sampler (compared as floats: equal or not).
parity('sampleTokens (greedy, temperature, top-k, top-p) over 3001 logits', 0, (r) => {
  const n = 12, V = 3001;
  const z = rand(r, n * V, 6), u = Float32Array.from({ length: n }, () => r());
  return {
    arrays: { z, u, a: new Int32Array(n), b: new Int32Array(n), c: new Int32Array(n), o: new Float32Array(3 * n) },
    compare: ['o'],
    op: (be, x) => {
      be.sampleTokens(x.a!, x.z!, x.u!, n, V, { temperature: 0, topK: 0, topP: 1 });
      be.sampleTokens(x.b!, x.z!, x.u!, n, V, { temperature: 1.2, topK: 0, topP: 0.9 });
      be.sampleTokens(x.c!, x.z!, x.u!, n, V, { temperature: 0.8, topK: 40, topP: 1 });
      const ids = [...be.downloadInt(x.a!), ...be.downloadInt(x.b!), ...be.downloadInt(x.c!)];
      be.upload(x.o!, ids);
    },
  };
});
// With a repetition penalty over each row's seen-token bitmask (greedy and sampled) and min-p: the same ids, and the
// same bitmask after (each draw marked in it).
parity('sampleTokens with a repetition penalty and min-p over 3001 logits (the bitmask marked, the logits penalized in place)', 1e-6, (r) => {
  const n = 12, V = 3001, W = Math.ceil(V / 32);
  const z = rand(r, n * V, 6), u = Float32Array.from({ length: n }, () => r());
  const seen = new Int32Array(n * W);
  for (let i = 0; i < n; i++) for (let k = 0; k < 200; k++) { const j = Math.floor(r() * V); seen[i * W + (j >>> 5)] |= 1 << (j & 31); }
  return {
    // each call on its own copy of the logits: the penalty rewrites them in place; the penalized rows compared too
    arrays: { z1: z, z2: z.slice(), z3: z.slice(), u, seen, a: new Int32Array(n), b: new Int32Array(n), c: new Int32Array(n), o: new Float32Array(3 * n + 2 * n * W) },
    compare: ['o', 'z1', 'z2', 'z3'],
    op: (be, x) => {
      be.sampleTokens(x.a!, x.z1!, x.u!, n, V, { temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1.6 }, V, x.seen!);
      be.sampleTokens(x.b!, x.z2!, x.u!, n, V, { temperature: 1.2, topK: 0, topP: 0.9, repetitionPenalty: 1.2, minP: 0.05 }, V, x.seen!);
      be.sampleTokens(x.c!, x.z3!, x.u!, n, V, { temperature: 0.8, topK: 40, topP: 1, repetitionPenalty: 0.8, minP: 0.2 }, V, x.seen!);
      // the bitmask's words as 16-bit halves (exact in float32)
      const marks = [...be.downloadInt(x.seen!)].flatMap((w) => [w & 0xffff, w >>> 16]);
      const ids = [...be.downloadInt(x.a!), ...be.downloadInt(x.b!), ...be.downloadInt(x.c!), ...marks];
      be.upload(x.o!, ids);
    },
  };
});
// A top-K teacher cache's rows on the device (top_rows): the same ids in the same order (compared as floats: equal or
// not), log q and the tail as the CPU's float64 rows, with ties at the K-th logit (quantized logits) and a padded stride.
parity('sparseTeacherRows top-K (K = 1, 20, 256) over 3001 logits with ties, stride 3008', 2e-6, (r) => {
  const n = 10, V = 3001, LD = 3008, Ks = [1, 20, 256];
  const z = rand(r, n * LD, 6).map((x, i) => (Math.floor(i / LD) % 3 === 1 ? Math.round(x * 4) / 4 : x));
  const len = n * Ks.reduce((a, k) => a + k, 0);
  return {
    arrays: { z, u: new Float32Array(n), ids: new Float32Array(len), lq: new Float32Array(len), tl: new Float32Array(n * Ks.length), am: new Float32Array(n * Ks.length) },
    compare: ['ids', 'lq', 'tl', 'am'],
    op: (be, x) => {
      let o = 0;
      Ks.forEach((K, q) => {
        const out = { slots: K, ids: be.allocInt(n * K, 'ids'), logq: be.alloc(n * K, 'logq'), tail: be.alloc(n, 'tail'), argmax: be.allocInt(n, 'argmax') };
        be.sparseTeacherRows(out, x.z!, x.u!, n, V, 1.5, 'top', LD);
        be.upload(x.ids!, Array.from(be.downloadInt(out.ids)), o);
        be.upload(x.lq!, be.download(out.logq), o);
        be.upload(x.tl!, be.download(out.tail), q * n);
        be.upload(x.am!, Array.from(be.downloadInt(out.argmax)), q * n);
        o += n * K;
      });
    },
  };
});
// A sample teacher cache's rows on the device (sample_rows): the same distinct ids in the same order as the CPU's
// float64 draws (compared as floats: equal or not) and log q, at Qwen's vocabulary (297 tiles of 512 tokens) with
// near-uniform, peaked and ordinary rows, and over 3001 logits with a padded stride (unaligned tiles).
parity('sparseTeacherRows sample (S = 1, 24, 256) over 151936 logits and over 3001 with stride 3008', 2e-6, (r) => {
  const shapes = [{ n: 6, V: 151936, LD: 151936 }, { n: 5, V: 3001, LD: 3008 }], Ss = [1, 24, 256];
  const zs = shapes.map(({ n, LD }) => rand(r, n * LD, 6).map((x, i) => {
    const row = Math.floor(i / LD), j = i % LD;
    return row === 1 ? x * 0.05 : row === 2 && j === 777 ? 40 : row === 3 ? x * 3 : x;
  }));
  const len = shapes.reduce((a, { n }) => a + n * Ss.reduce((b, S) => b + S, 0), 0);
  const rows = shapes.reduce((a, { n }) => a + n * Ss.length, 0);
  return {
    arrays: { z0: zs[0]!, z1: zs[1]!, u: Float32Array.from({ length: 6 }, (_, i) => (i === 4 ? 0 : r())), ids: new Float32Array(len), lq: new Float32Array(len), am: new Float32Array(rows) },
    compare: ['ids', 'lq', 'am'],
    op: (be, x) => {
      let o = 0, q = 0;
      shapes.forEach(({ n, V, LD }, si) => {
        for (const S of Ss) {
          const out = { slots: S, ids: be.allocInt(n * S, 'ids'), logq: be.alloc(n * S, 'logq'), tail: be.alloc(n, 'tail'), argmax: be.allocInt(n, 'argmax') };
          be.sparseTeacherRows(out, si === 0 ? x.z0! : x.z1!, x.u!, n, V, 2, 'sample', LD);
          be.upload(x.ids!, Array.from(be.downloadInt(out.ids)), o);
          be.upload(x.lq!, be.download(out.logq), o);
          be.upload(x.am!, Array.from(be.downloadInt(out.argmax)), q);
          o += n * S; q += n;
        }
      });
    },
  };
});
parity('adamw', 1e-5, (r) => ({
  arrays: { p: rand(r, N), g: rand(r, N), m: rand(r, N, 0.1), v: rand(r, N, 0.1).map(Math.abs) },
  compare: ['p', 'm', 'v'],
  op: (b, x) => b.adamw(x.p!, x.g!, x.m!, x.v!, N, { lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1, step: 3, gradScale: 0.5 }),
}));

// adamw on views at an odd offset (the float4 path needs 16-byte alignment; the kernel falls back to scalar)
parity('adamw on misaligned views', 1e-5, (r) => ({
  arrays: { p: rand(r, N), g: rand(r, N), m: rand(r, N, 0.1), v: rand(r, N, 0.1).map(Math.abs) },
  compare: ['p', 'm', 'v'],
  op: (b, x) => b.adamw(b.view(x.p!, 1, N - 3), b.view(x.g!, 1, N - 3), b.view(x.m!, 1, N - 3), b.view(x.v!, 1, N - 3), N - 3,
    { lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1, step: 3, gradScale: 0.5 }),
}));
// two-stage column reductions over many row chunks (rmsnorm_rows_bwd / bias_grad → col_reduce)
parity('rmsnorm bwd and matmul bwd bias over 1000 rows', 1e-5, (r) => ({
  arrays: {
    di: rand(r, 1000 * 40), dw: rand(r, 40), d: rand(r, 1000 * 40), i: rand(r, 1000 * 40), w: rand(r, 40), rs: rand(r, 1000).map(Math.abs),
    db: rand(r, 300), dm: rand(r, 1000 * 300), mi: rand(r, 1000 * 8), mw: rand(r, 300 * 8),
  },
  compare: ['di', 'dw', 'db'],
  op: (b, x) => {
    b.rmsnormBackward(x.di!, x.dw!, x.d!, x.i!, x.w!, x.rs!, 1000, 40);
    b.matmulBackward(null, null, x.db!, x.dm!, x.mi!, x.mw!, 1000, 8, 300);
  },
}));

// rows wider than the warp-per-row norms (a block per row, 512 blocks looping over 1100 rows, each leaving one row of
// weight-gradient partials for col_reduce; a frozen weight: dinp alone) and a narrow projection's bias (m = 128) over
// 5000 rows (bias_grad's 32-column blocks)
parity('rmsnorm bwd over 1100 rows of 896 (with and without the weight gradient) and the bias of a 128-wide projection over 5000 rows', 1e-5, (r) => {
  const n = 1100, C = 896, i = rand(r, n * C, 3);
  const rs = new Float32Array(n);
  for (let row = 0; row < n; row++) { let s = 0; for (let j = 0; j < C; j++) s += i[row * C + j]! ** 2; rs[row] = 1 / Math.sqrt(s / C + 1e-6); }
  return {
    arrays: {
      di: rand(r, n * C), di2: rand(r, n * C), dw: rand(r, C), d: rand(r, n * C), i, w: rand(r, C), rs,
      db: rand(r, 128), dm: rand(r, 5000 * 128), mi: rand(r, 5000 * 8), mw: rand(r, 128 * 8),
    },
    compare: ['di', 'di2', 'dw', 'db'],
    op: (b, x) => {
      b.rmsnormBackward(x.di!, x.dw!, x.d!, x.i!, x.w!, x.rs!, n, C);
      b.rmsnormBackward(x.di2!, null, x.d!, x.i!, x.w!, x.rs!, n, C);
      b.matmulBackward(null, null, x.db!, x.dm!, x.mi!, x.mw!, 5000, 8, 128);
    },
  };
});

// NF4 frozen weights (src/model/frozen.ts): the GPU's dequantized values are the CPU's bit for bit (one float32 product,
// f32; then one bf16 rounding), for a length that ends inside a code word and a block
test('cuda vs cpu: dequantNf4 into f32 and bf16 is bit-identical', { skip }, () => {
  const n = 100_003, x = rand(rng(41), n, 0.05);
  const q = quantizeNf4(x, 64), words = nf4Words(q);
  let worst = 0;
  for (const d of ['f32', 'bf16'] as const) {
    const outs = [cpu!, cuda!].map((be) => {
      const codes = be.allocInt(words.length, 'codes'); be.uploadInt(codes, words);
      const absmax = be.alloc(q.absmax.length, 'absmax'); be.upload(absmax, q.absmax);
      const out = be.alloc(n, 'out', d);
      be.dequantNf4(out, codes, absmax, n, 64);
      return be.download(out);
    });
    for (let i = 0; i < n; i++) if (outs[0]![i] !== outs[1]![i]) { worst = Math.max(worst, Math.abs(outs[0]![i]! - outs[1]![i]!)); }
  }
  record('dequantNf4 (f32, bf16)', worst, 0);
  assert.equal(worst, 0);
});

test('cuda vs cpu: embedding backward over 4096 rows of 896 with ids that repeat ~64 times equals the sequential loop bit for bit, run after run', { skip }, () => {
  const r = rng(23), n = 4096, c = 896, vocab = 64;
  const ids = Int32Array.from({ length: n }, () => Math.floor(r() * vocab));
  const table = rand(r, vocab * c), d = rand(r, n * c);
  const want = Float32Array.from(table);
  const xc = load(cpu!, { dt: want, d, ids });
  cpu!.embeddingBackward(xc.dt!, xc.d!, xc.ids!, n, c);
  const ref = cpu!.download(xc.dt!);
  for (let run = 0; run < 2; run++) {
    const xg = load(cuda!, { dt: table, d, ids });
    cuda!.embeddingBackward(xg.dt!, xg.d!, xg.ids!, n, c);
    const got = cuda!.download(xg.dt!);
    let diff = 0, worst = 0;
    for (let i = 0; i < ref.length; i++) if (got[i] !== ref[i]) { diff++; worst = Math.max(worst, Math.abs(got[i]! - ref[i]!)); }
    if (run === 0) record('embedding bwd (bit for bit, repeated ids)', worst, 0);
    assert.equal(diff, 0, `run ${run}: ${diff} of ${ref.length} values differ (worst ${worst})`);
  }
});

test('cuda vs cpu: copyColumns (the fused q/k/v split and join) bit for bit: f32 and bf16, with and without a bias, 16-byte groups and not', { skip }, () => {
  let worst = 0;
  // [rows, srcCols, srcCol, dstCols, dstCol, width]: the 0.5B student's split of k (groups of 8), an odd layout (scalar)
  for (const [rows, srcCols, srcCol, dstCols, dstCol, width] of [[300, 1152, 896, 128, 0, 128], [37, 19, 5, 13, 3, 7]] as const) {
    for (const d of ['f32', 'bf16'] as const) {
      for (const withBias of [false, true]) {
        const r = rng(rows + width + (withBias ? 1 : 0));
        const src = rand(r, rows * srcCols), dst = rand(r, rows * dstCols), bias = rand(r, width);
        const outs = [cpu!, cuda!].map((be) => {
          const s = be.alloc(src.length, 's', d), o = be.alloc(dst.length, 'o', d), b = be.alloc(width, 'b', d);
          be.upload(s, src); be.upload(o, dst); be.upload(b, bias);
          be.copyColumns(o, dstCols, dstCol, s, srcCols, srcCol, rows, width, withBias ? b : null);
          return be.download(o);
        });
        for (let i = 0; i < outs[0]!.length; i++) if (outs[0]![i] !== outs[1]![i]) worst = Math.max(worst, Math.abs(outs[0]![i]! - outs[1]![i]!));
      }
    }
  }
  record('copyColumns (f32, bf16, bias or not)', worst, 0);
  assert.equal(worst, 0);
});

test('cuda vs cpu: sumSquares, copy, view, zero', { skip }, () => {
  const a = rand(rng(5), 100_003);
  const xc = load(cpu!, { a }), xg = load(cuda!, { a });
  const sc = cpu!.sumSquares(xc.a!, 100_003), sg = cuda!.sumSquares(xg.a!, 100_003);
  const e = Math.abs(sg - sc) / sc;
  record('sumSquares', e, 1e-5);
  assert.ok(e <= 1e-5, `sumSquares ${sg} vs ${sc}`);
  const v = cuda!.view(xg.a!, 10, 20);
  const c = cuda!.alloc(20, 'c');
  cuda!.copy(c, v);
  assert.deepEqual([...cuda!.download(c)], [...a.subarray(10, 30)]);
  cuda!.zero(v);
  assert.equal(cuda!.download(xg.a!)[15], 0);
});

test('real device: a step pre-warmed from its trace runs with zero misses after seal', { skip }, async () => {
  const small = { ...QWEN_LIKE, C: 128, hidden: 256, nH: 4, nKv: 2, hd: 32 };
  const b = createCudaBackend({ strict: true, cacheDir: null, log: () => {} });
  try {
    const planned = await prewarm(b, [allOpsStep(small)]);
    allOpsStep(small)(b);
    b.synchronize();
    assert.equal(b.cache!.counters.missesAfterSeal, 0);
    assert.equal(b.cache!.counters.compiled, planned);
    record(`sealed step (${planned} kernels)`, 0, 0);
  } finally { b.dispose(); }
});

test('real device: out of memory is reported by name with a hint', { skip }, () => {
  assert.throws(() => cuda!.alloc(2 ** 40, 'activations'), /^.*CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc\(4\.0 TiB\) while allocating activations; lower --batch or --seq/);
});
