/**
 * GPU-only (skip cleanly without libcuda or a GPU): every non-attention op of the bf16 data flow (notes/s3-seam) on the
 * CUDA backend against the CPU backend's exact bf16 emulation, on identical inputs (bf16 buffers are uploaded from the
 * same float32 values, both sides rounding to nearest even).
 *
 * Bounds:
 * - a bf16 output: every element within 1 bf16 ulp of the CPU value (both compute in float — CPU float32/float64, GPU
 *   float32 — and round once; the two may round a value near a tie apart), plus an absolute floor of 2^-20 · max|ref|
 *   for outputs that cancel (float32 compute differences on operands of that size); the loss gradient, whose row
 *   reductions run in float64 on the CPU and in float32 blocks on the GPU, gets a floor of 2e-5 · max|ref|.
 * - an f32 output: max|Δ| / max|ref| ≤ 1e-5 (2e-5 for the loss statistics), as test/cuda/gpu-parity.test.ts.
 * - bf16 matrix products (tensor cores, float32 accumulation in another order than the CPU's): relative Frobenius
 *   error ≤ 1e-2 against the CPU; and the bf16 product is NOT bit-equal to an f32 product on the unrounded inputs,
 *   while being far closer to the CPU's bf16 emulation than to that f32 product (a silent f32 fallback fails both).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { LOSS_STATS, type Backend, type Buf, type DType, type IntBuf, type LossSpec } from '../../src/backend/backend.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { createCudaBackend } from '../../src/backend/cuda/index.js';
import { plainRope } from '../../src/backend/rope.js';
import { relErr, relFrob as frob } from '../util/compare.js';
import { gpuOrSkip, rand, rng, scaledRopes } from './helpers.js';

const { value: cuda, skip } = gpuOrSkip(() => createCudaBackend({ strict: false, cacheDir: mkdtempSync(join(tmpdir(), 'dk-bf16-')) }));
const cpu: Backend | null = cuda ? createCpuBackend({ dtype: 'f32', threads: 2 }) : null;
after(() => { cuda?.dispose(); cpu?.dispose(); });

type Arrays = Record<string, Float32Array | Int32Array>;
type Bufs = Record<string, Buf & IntBuf>;

function load(b: Backend, arrays: Arrays, bf16: readonly string[]): Bufs {
  const out: Bufs = {};
  for (const [k, a] of Object.entries(arrays)) {
    if (a instanceof Int32Array) { const x = b.allocInt(a.length, k); b.uploadInt(x, a); out[k] = x as Buf & IntBuf; continue; }
    const x = b.alloc(a.length, k, bf16.includes(k) ? 'bf16' as DType : 'f32');
    b.upload(x, a);
    out[k] = x as Buf & IntBuf;
  }
  return out;
}


/** One bf16 ulp at |x| (the spacing of bf16 values there: 8 significant bits). */
function bf16Ulp(x: number): number {
  const a = Math.abs(x);
  if (a < 2 ** -126) return 2 ** -133;
  return 2 ** (Math.floor(Math.log2(a)) - 7);
}

/** Worst |got − ref| in units of the allowed error (≤ 1 passes): 1 bf16 ulp of the larger value plus `floor`·max|ref|. */
function ulpErr(got: ArrayLike<number>, ref: ArrayLike<number>, floor: number): number {
  assert.equal(got.length, ref.length);
  let m = 0;
  for (let i = 0; i < ref.length; i++) m = Math.max(m, Math.abs(ref[i]!));
  let worst = 0;
  for (let i = 0; i < ref.length; i++) {
    if (!Number.isFinite(got[i]!)) return Infinity;
    const allowed = bf16Ulp(Math.max(Math.abs(got[i]!), Math.abs(ref[i]!))) + floor * m;
    worst = Math.max(worst, Math.abs(got[i]! - ref[i]!) / allowed);
  }
  return worst;
}


interface Case {
  arrays: Arrays;
  /** Names of the arrays held in bf16 buffers. */
  bf16: string[];
  /** Outputs to compare; bf16 ones by ulpErr, f32 ones by relErr ≤ f32Tol. */
  compare: string[];
  op: (b: Backend, x: Bufs) => void;
}

function parity(name: string, make: (r: () => number) => Case, opts: { floor?: number; f32Tol?: number; gemm?: boolean } = {}): void {
  test(`cuda vs cpu (bf16): ${name}`, { skip }, () => {
    const c = make(rng(name.length * 104729 + 3));
    const xc = load(cpu!, c.arrays, c.bf16), xg = load(cuda!, c.arrays, c.bf16);
    c.op(cpu!, xc);
    c.op(cuda!, xg);
    for (const k of c.compare) {
      const got = cuda!.download(xg[k]!), ref = cpu!.download(xc[k]!);
      assert.equal(xg[k]!.dtype, xc[k]!.dtype);
      if (opts.gemm) {
        const e = frob(got, ref);
        assert.ok(e <= 1e-2, `${name}: ${k} relative Frobenius error ${e} > 1e-2`);
      } else if (c.bf16.includes(k)) {
        const e = ulpErr(got, ref, opts.floor ?? 2 ** -20);
        assert.ok(e <= 1, `${name}: ${k} (bf16) off by ${e} × (1 ulp + floor)`);
      } else {
        const e = relErr(got, ref), tol = opts.f32Tol ?? 1e-5;
        assert.ok(e <= tol, `${name}: ${k} (f32) relative error ${e} > ${tol}`);
      }
    }
  });
}

const N = 3001;
parity('add (bf16 out, bf16 + f32)', (r) => ({
  arrays: { o: rand(r, N), a: rand(r, N), b: rand(r, N) }, bf16: ['o', 'a'], compare: ['o'], op: (b, x) => b.add(x.o!, x.a!, x.b!, N),
}));
parity('add (f32 residual += f32)', (r) => ({
  arrays: { h: rand(r, N), x: rand(r, N) }, bf16: [], compare: ['h'], op: (b, x) => b.add(x.h!, x.h!, x.x!, N),
}));
parity('accumulate and scale in bf16', (r) => ({
  arrays: { d: rand(r, N), s: rand(r, N) }, bf16: ['d', 's'], compare: ['d'],
  op: (b, x) => { b.accumulate(x.d!, x.s!, N); b.scale(x.d!, 0.37, N - 5); },
}));
parity('copy f32 → bf16 and bf16 → f32 (convert)', (r) => ({
  arrays: { a: rand(r, N, 40), h: rand(r, N), f: rand(r, N) }, bf16: ['h'], compare: ['h', 'f'],
  op: (b, x) => { b.copy(x.h!, x.a!); b.copy(x.f!, x.h!); },
}));
parity('swiglu fwd (all bf16)', (r) => ({
  arrays: { o: rand(r, N), g: rand(r, N, 4), u: rand(r, N) }, bf16: ['o', 'g', 'u'], compare: ['o'],
  op: (b, x) => b.swigluForward(x.o!, x.g!, x.u!, N),
}));
parity('swiglu fwd and add on misaligned bf16 views (the scalar path of the 128-bit kernels)', (r) => ({
  arrays: { o: rand(r, N), g: rand(r, N, 4), u: rand(r, N), s: rand(r, N) }, bf16: ['o', 'g', 'u', 's'], compare: ['o', 's'],
  op: (b, x) => {
    b.swigluForward(b.view(x.o!, 1, N - 9), b.view(x.g!, 3, N - 9), b.view(x.u!, 5, N - 9), N - 9);
    b.add(b.view(x.s!, 2, N - 9), b.view(x.s!, 2, N - 9), b.view(x.o!, 7, N - 9), N - 9);
  },
}));
parity('swiglu bwd (dgate/dup bf16 accumulate, dout f32)', (r) => ({
  arrays: { dg: rand(r, N), du: rand(r, N), d: rand(r, N), g: rand(r, N, 4), u: rand(r, N) }, bf16: ['dg', 'du', 'g', 'u'],
  compare: ['dg', 'du'], op: (b, x) => b.swigluBackward(x.dg!, x.du!, x.d!, x.g!, x.u!, N),
}));
for (const cols of [40, 13]) {
  const R = 37;
  parity(`swiglu fwd and bwd rows (fused gate/up, all bf16, ${cols} columns)`, (r) => ({
    arrays: { o: rand(r, R * cols), gu: rand(r, 2 * R * cols, 4), dgu: rand(r, 2 * R * cols, 50), d: rand(r, R * cols) }, bf16: ['o', 'gu', 'dgu', 'd'],
    compare: ['o', 'dgu'], op: (b, x) => { b.swigluForwardRows(x.o!, x.gu!, R, cols); b.swigluBackwardRows(x.dgu!, x.d!, x.gu!, R, cols); },
  }));
}
const ids = (r: () => number, n: number, v: number) => Int32Array.from({ length: n }, () => Math.floor(r() * v));
parity('embedding fwd (f32 out, bf16 table)', (r) => ({
  arrays: { o: rand(r, 9 * 40), ids: ids(r, 9, 11), t: rand(r, 11 * 40) }, bf16: ['t'], compare: ['o'],
  op: (b, x) => b.embeddingForward(x.o!, x.ids!, x.t!, 9, 40),
}));
parity('embedding bwd (f32 dtable, bf16 dout)', (r) => ({
  arrays: { dt: rand(r, 5 * 40), d: rand(r, 30 * 40), ids: ids(r, 30, 5) }, bf16: ['d'], compare: ['dt'],
  op: (b, x) => b.embeddingBackward(x.dt!, x.d!, x.ids!, 30, 40),
}));
parity('rmsnorm fwd (bf16 out, f32 inp and rstd, bf16 weight)', (r) => ({
  arrays: { o: rand(r, 7 * 300), rs: rand(r, 7), i: rand(r, 7 * 300, 3), w: rand(r, 300) }, bf16: ['o', 'w'], compare: ['o', 'rs'],
  op: (b, x) => b.rmsnormForward(x.o!, x.rs!, x.i!, x.w!, 7, 300, 1e-6),
}));
parity('rmsnorm bwd (f32 dinp/dweight/dout/inp, bf16 weight)', (r) => ({
  arrays: { o: rand(r, 7 * 300), di: rand(r, 7 * 300), dw: rand(r, 300), d: rand(r, 7 * 300), i: rand(r, 7 * 300, 3), w: rand(r, 300), rs: rand(r, 7) },
  bf16: ['o', 'w'], compare: ['di', 'dw'],
  op: (b, x) => { b.rmsnormForward(x.o!, x.rs!, x.i!, x.w!, 7, 300, 1e-6); b.rmsnormBackward(x.di!, x.dw!, x.d!, x.i!, x.w!, x.rs!, 7, 300); },
}));
parity('rmsnorm bwd over 600 rows of 896 (bf16 dout) writing dinp\'s bf16 copy beside it (the residual gradient as the next products\' operand)', (r) => ({
  arrays: { di: rand(r, 600 * 896), dc: rand(r, 600 * 896), dw: rand(r, 896), d: rand(r, 600 * 896), i: rand(r, 600 * 896, 3), w: rand(r, 896), rs: rand(r, 600).map(Math.abs) },
  bf16: ['dc', 'd', 'w'], compare: ['di', 'dc', 'dw'],
  op: (b, x) => b.rmsnormBackward(x.di!, x.dw!, x.d!, x.i!, x.w!, x.rs!, 600, 896, x.dc!),
}));
parity('per-head q norm fwd + bwd, all bf16 but rstd (Qwen3: 2050 rows of head_dim 128, warp per row)', (r) => ({
  arrays: { o: rand(r, 2050 * 128), di: rand(r, 2050 * 128), dw: rand(r, 128), d: rand(r, 2050 * 128), i: rand(r, 2050 * 128, 3), w: rand(r, 128), rs: rand(r, 2050) },
  bf16: ['o', 'di', 'd', 'i', 'w'], compare: ['o', 'rs', 'di', 'dw'],
  op: (b, x) => { b.rmsnormForward(x.o!, x.rs!, x.i!, x.w!, 2050, 128, 1e-6); b.rmsnormBackward(x.di!, x.dw!, x.d!, x.i!, x.w!, x.rs!, 2050, 128); },
}));
parity('add + rmsnorm fwd fused (f32 residual h += x in place, bf16 out and weight: the model\'s ln2)', (r) => ({
  arrays: { h: rand(r, 7 * 300), x: rand(r, 7 * 300, 3), o: rand(r, 7 * 300), rs: rand(r, 7), w: rand(r, 300) }, bf16: ['o', 'w'],
  compare: ['h', 'o', 'rs'], op: (b, x) => b.addRmsnormForward(x.h!, x.o!, x.rs!, x.h!, x.x!, x.w!, 7, 300, 1e-6),
}));
parity('add + rmsnorm fwd fused (bf16 sum rounded before the norm reads it, bf16 + f32 inputs, f32 out and weight), C past the registers', (r) => ({
  arrays: { s: rand(r, 3 * 9000), a: rand(r, 3 * 9000, 3), c: rand(r, 3 * 9000), o: rand(r, 3 * 9000), rs: rand(r, 3), w: rand(r, 9000) },
  bf16: ['s', 'a'], compare: ['s', 'o', 'rs'], op: (b, x) => b.addRmsnormForward(x.s!, x.o!, x.rs!, x.a!, x.c!, x.w!, 3, 9000, 1e-5),
}));
parity('add + rmsnorm fwd fused (bf16 sum aliasing bf16 a, bf16 out), registers', (r) => ({
  arrays: { a: rand(r, 7 * 300, 3), c: rand(r, 7 * 300), o: rand(r, 7 * 300), rs: rand(r, 7), w: rand(r, 300) },
  bf16: ['a', 'o', 'w'], compare: ['a', 'o', 'rs'], op: (b, x) => b.addRmsnormForward(x.a!, x.o!, x.rs!, x.a!, x.c!, x.w!, 7, 300, 1e-5),
}));
const RB = 2, RT = 5, RH = 3, RD = 8, RN = RB * RT * RH * RD;
parity('rope fwd in place (bf16), far positions', (r) => ({
  arrays: { q: rand(r, RN) }, bf16: ['q'], compare: ['q'], op: (b, x) => b.ropeForward(x.q!, x.q!, RB, RT, RH, RD, plainRope(1e6), 3000),
}));
parity('rope fwd in place (bf16) with a bf16 bias (a q/k projection\'s)', (r) => ({
  arrays: { q: rand(r, RN), bq: rand(r, RH * RD) }, bf16: ['q', 'bq'], compare: ['q'], op: (b, x) => b.ropeForward(x.q!, x.q!, RB, RT, RH, RD, plainRope(1e6), 300, x.bq!),
}));
for (const rope of scaledRopes(5e5)) {
  parity(`rope ${rope.type} fwd (bf16) with a bf16 bias`, (r) => ({
    arrays: { o: rand(r, RN), i: rand(r, RN), bq: rand(r, RH * RD) }, bf16: ['o', 'i', 'bq'], compare: ['o'],
    op: (b, x) => b.ropeForward(x.o!, x.i!, RB, RT, RH, RD, rope, 900, x.bq!),
  }));
}
parity('rope bwd (bf16 dinp += Rᵀ bf16 dout)', (r) => ({
  arrays: { di: rand(r, RN), d: rand(r, RN) }, bf16: ['di', 'd'], compare: ['di'],
  op: (b, x) => b.ropeBackward(x.di!, x.d!, RB, RT, RH, RD, plainRope(10000), 3),
}));
for (const rope of scaledRopes(5e5)) {
  parity(`rope ${rope.type} fwd and bwd (bf16)`, (r) => ({
    arrays: { o: rand(r, RN), i: rand(r, RN), di: rand(r, RN) }, bf16: ['o', 'i', 'di'], compare: ['o', 'di'],
    op: (b, x) => { b.ropeForward(x.o!, x.i!, RB, RT, RH, RD, rope, 900); b.ropeBackward(x.di!, x.o!, RB, RT, RH, RD, rope, 900); },
  }));
}
const MN = 33, MK = 70, MM = 45;
parity('matmul fwd (bf16 out, bf16 bias: filled, then the GEMM accumulates)', (r) => ({
  arrays: { o: rand(r, MN * MM), i: rand(r, MN * MK), w: rand(r, MM * MK), bias: rand(r, MM) }, bf16: ['o', 'i', 'w', 'bias'], compare: ['o'],
  op: (b, x) => b.matmulForward(x.o!, x.i!, x.w!, x.bias!, MN, MK, MM),
}), { gemm: true });
parity('matmul fwd (f32 out, bf16 operands and bias)', (r) => ({
  arrays: { o: rand(r, MN * MM), i: rand(r, MN * MK), w: rand(r, MM * MK), bias: rand(r, MM) }, bf16: ['i', 'w', 'bias'], compare: ['o'],
  op: (b, x) => b.matmulForward(x.o!, x.i!, x.w!, x.bias!, MN, MK, MM),
}), { gemm: true });
parity('matmul bwd (bf16 dout/inp/weight; bf16 dinp accumulated, f32 dweight and dbias)', (r) => ({
  arrays: { di: rand(r, MN * MK), dw: rand(r, MM * MK), db: rand(r, MM), d: rand(r, MN * MM), i: rand(r, MN * MK), w: rand(r, MM * MK) },
  bf16: ['di', 'd', 'i', 'w'], compare: ['di', 'dw', 'db'],
  op: (b, x) => b.matmulBackward(x.di!, x.dw!, x.db!, x.d!, x.i!, x.w!, MN, MK, MM),
}), { gemm: true });
parity('matmul bwd (f32 dinp and dweight from bf16 operands)', (r) => ({
  arrays: { di: rand(r, MN * MK), dw: rand(r, MM * MK), d: rand(r, MN * MM), i: rand(r, MN * MK), w: rand(r, MM * MK) },
  bf16: ['d', 'i', 'w'], compare: ['di', 'dw'],
  op: (b, x) => b.matmulBackward(x.di!, x.dw!, null, x.d!, x.i!, x.w!, MN, MK, MM),
}), { gemm: true });
for (const spec of [
  { kind: 'none', alpha: 0, temperature: 1, beta: 0 }, { kind: 'kl', alpha: 0.6, temperature: 2, beta: 0 },
  { kind: 'reverse-kl', alpha: 0.5, temperature: 1.5, beta: 0 }, { kind: 'jsd', alpha: 0.7, temperature: 2, beta: 0.4 },
] as LossSpec[]) {
  parity(`loss ${spec.kind} with a bf16 dlogits (padded rows: ld > vocab)`, (r) => {
    const n = 6, V = 2990, LD = 3008;
    const targets = ids(r, n, V); targets[2] = -1;
    const weights = Float32Array.from({ length: n }, (_, i) => (i === 2 ? 0 : 1 / 5));
    return {
      arrays: { st: rand(r, n * LOSS_STATS), dl: rand(r, n * LD), z: rand(r, n * LD, 6), zt: rand(r, n * LD, 6), y: targets, w: weights },
      bf16: ['dl'], compare: ['st', 'dl'],
      op: (b, x) => b.lossForward(x.st!, x.dl!, x.z!, spec.kind === 'none' ? null : x.zt!, x.y!, x.w!, n, V, spec, LD),
    };
  }, { floor: 2e-5, f32Tol: 2e-5 });
  // bf16 logits (--logits bf16): both backends read the same rounded values; the bf16 gradient is written over the
  // student's logits in place (the head's layout). Odd rows (V = 2990 in 2993) take the scalar path, LD = 3008 the vector one.
  for (const LD of [3008, 2993]) {
    parity(`loss ${spec.kind} over bf16 logits, dlogits in place (rows of ${LD})`, (r) => {
      const n = 6, V = 2990;
      const targets = ids(r, n, V); targets[2] = -1;
      const weights = Float32Array.from({ length: n }, (_, i) => (i === 2 ? 0 : 1 / 5));
      return {
        arrays: { st: rand(r, n * LOSS_STATS), z: rand(r, n * LD, 6), zt: rand(r, n * LD, 6), y: targets, w: weights },
        bf16: ['z', 'zt'], compare: ['st', 'z'],
        op: (b, x) => b.lossForward(x.st!, x.z!, x.z!, spec.kind === 'none' ? null : x.zt!, x.y!, x.w!, n, V, spec, LD),
      };
    }, { floor: 2e-5, f32Tol: 2e-5 });
  }
}
const ADAM = { lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1, step: 3, gradScale: 0.5 };
parity('adamw with a bf16 compute copy (same launch)', (r) => ({
  arrays: { p: rand(r, N), g: rand(r, N), m: rand(r, N, 0.1), v: rand(r, N, 0.1).map(Math.abs), c: rand(r, N) }, bf16: ['c'],
  compare: ['p', 'm', 'v', 'c'], op: (b, x) => b.adamw(x.p!, x.g!, x.m!, x.v!, N, ADAM, x.c!),
}));
parity('adamw with a bf16 copy on misaligned views (scalar path)', (r) => ({
  arrays: { p: rand(r, N), g: rand(r, N), m: rand(r, N, 0.1), v: rand(r, N, 0.1).map(Math.abs), c: rand(r, N) }, bf16: ['c'],
  compare: ['p', 'm', 'v', 'c'],
  op: (b, x) => b.adamw(b.view(x.p!, 1, N - 3), b.view(x.g!, 1, N - 3), b.view(x.m!, 1, N - 3), b.view(x.v!, 1, N - 3), N - 3, ADAM,
    b.view(x.c!, 3, N - 3)),
}));
// the float4 update of aligned parameters with a copy view 2 bytes off their alignment
parity('adamw with a bf16 copy view not aligned like the parameters (vector update)', (r) => ({
  arrays: { p: rand(r, N), g: rand(r, N), m: rand(r, N, 0.1), v: rand(r, N, 0.1).map(Math.abs), c: rand(r, N) }, bf16: ['c'],
  compare: ['p', 'm', 'v', 'c'],
  op: (b, x) => b.adamw(b.view(x.p!, 0, N - 1), b.view(x.g!, 0, N - 1), b.view(x.m!, 0, N - 1), b.view(x.v!, 0, N - 1), N - 1, ADAM,
    b.view(x.c!, 1, N - 1)),
}));
// the training step's one-launch update (adamw_multi): chunks that start 16-byte aligned (float4 path) and one that does not
parity('adamwSegments with a bf16 compute copy (segments aligned and not, with and without decay)', (r) => ({
  arrays: { p: rand(r, N), g: rand(r, N), m: rand(r, N, 0.1), v: rand(r, N, 0.1).map(Math.abs), c: rand(r, N) }, bf16: ['c'],
  compare: ['p', 'm', 'v', 'c'],
  op: (b, x) => b.adamwSegments(x.p!, x.g!, x.m!, x.v!, [{ offset: 0, size: 1000, decay: true }, { offset: 1000, size: 37, decay: false },
    { offset: 1037, size: N - 1037, decay: true }], ADAM, x.c!),
}));
parity('adamwSegments with an f32 compute copy', (r) => ({
  arrays: { p: rand(r, N), g: rand(r, N), m: rand(r, N, 0.1), v: rand(r, N, 0.1).map(Math.abs), c: rand(r, N) }, bf16: [],
  compare: ['p', 'c'],
  op: (b, x) => b.adamwSegments(x.p!, x.g!, x.m!, x.v!, [{ offset: 0, size: 1000, decay: true }, { offset: 1000, size: N - 1000, decay: false }], ADAM, x.c!),
}));
parity('adamw with an f32 copy', (r) => ({
  arrays: { p: rand(r, N), g: rand(r, N), m: rand(r, N, 0.1), v: rand(r, N, 0.1).map(Math.abs), c: rand(r, N) }, bf16: [],
  compare: ['p', 'c'], op: (b, x) => b.adamw(x.p!, x.g!, x.m!, x.v!, N, ADAM, x.c!),
}));

test('cuda vs cpu (bf16): sumSquares of a bf16 buffer, zero of a bf16 view', { skip }, () => {
  const a = rand(rng(11), 100_003);
  const xc = load(cpu!, { a }, ['a']), xg = load(cuda!, { a }, ['a']);
  const sc = cpu!.sumSquares(xc.a!, 100_003), sg = cuda!.sumSquares(xg.a!, 100_003);
  assert.ok(Math.abs(sg - sc) / sc <= 1e-6, `sumSquares ${sg} vs ${sc}`);
  cuda!.zero(cuda!.view(xg.a!, 10, 20));
  const back = cuda!.download(xg.a!);
  assert.equal(back[15], 0);
  assert.notEqual(back[30], 0);
});

test('cuda bf16 GEMM: tensor-core bf16 math (close to the CPU\'s bf16 emulation), not an f32 product in disguise', { skip }, () => {
  const r = rng(777);
  const n = 64, k = 512, m = 96;
  const i = rand(r, n * k), w = rand(r, m * k);
  const g16 = load(cuda!, { i, w, o: new Float32Array(n * m) }, ['i', 'w']);
  const g32 = load(cuda!, { i, w, o: new Float32Array(n * m) }, []);
  const c16 = load(cpu!, { i, w, o: new Float32Array(n * m) }, ['i', 'w']);
  cuda!.matmulForward(g16.o!, g16.i!, g16.w!, null, n, k, m);
  cuda!.matmulForward(g32.o!, g32.i!, g32.w!, null, n, k, m);
  cpu!.matmulForward(c16.o!, c16.i!, c16.w!, null, n, k, m);
  const bf = cuda!.download(g16.o!), f = cuda!.download(g32.o!), ref = cpu!.download(c16.o!);
  const toCpu = frob(bf, ref), toF32 = frob(bf, f);
  assert.ok(toCpu <= 1e-2, `bf16 GEMM vs CPU bf16 emulation: ${toCpu}`);
  assert.ok(toF32 > 0, 'the bf16 GEMM is bit-equal to the f32 one: bf16 operands are not in effect');
  assert.ok(toF32 > 1e-4, `the bf16 GEMM is within ${toF32} of the f32 one on unrounded inputs: operands were not rounded to bf16`);
  assert.ok(toCpu < toF32 / 10, `bf16 GEMM closer to the f32 product (${toF32}) than to the bf16 emulation (${toCpu})`);
});
