/**
 * GPU-only (skips cleanly without libcuda or a GPU): bf16 attention on the CUDA backend.
 * - The tensor-core kernels (attention_fwd_bf16; the backward both ways: attention_bwd_pre, attention_bwd_dkv_ds_bf16
 *   and attention_bwd_dq_ds_bf16 (stored dS, the default), and attention_bwd_dq_bf16 with attention_bwd_dkv_bf16
 *   (recomputing, attnBackward 'recompute', and the fallback for long sequences); bf16 q, k, v, dout,
 *   the output and gradients bf16 as the model stores them, or f32) against the float64 definition
 *   (test/backend/reference.ts) computed from the SAME bf16-rounded inputs, and against the CPU backend's bf16
 *   emulation: out max |error| ≤ 1e-2 · max |out|, lse ≤ 1e-3 absolute, dq/dk/dv (the gradient added to non-zero start
 *   values, start values subtracted) relative Frobenius ≤ 2e-2. Head dims 64 and 128, GQA groups 1, 2, 7,
 *   T = 1, 15, 64, 65, 130, 1024 (none of the 64-row tiles' edge cases left out), B = 2.
 * - The backward accumulates (a second run adds the same f32 gradient again), is bit-for-bit deterministic (two runs
 *   from the same start give identical bits), and the tensor-core kernels really ran (launch counts).
 * - The SIMT fallback with bf16 operands for head dims the tensor-core kernels do not take (40, 72), and bf16
 *   generation (kvCacheWrite into bf16 caches, attentionCached) against the CPU backend.
 * Every case prints its errors on stderr.
 *
 * Run on a GPU machine: npm run build && node --test dist/test/cuda/flash-attention-bf16.test.js
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Backend, Buf, DType } from '../../src/backend/backend.js';
import { CpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { createCudaBackend } from '../../src/backend/cuda/index.js';
import type { CudaBackend } from '../../src/backend/cuda/cuda-backend.js';
import { bf16MmaHeadDim, dsScratchElems } from '../../src/backend/cuda/kernels/attention-bf16.js';
import { DEFAULT_ATTN_DS_ELEMS } from '../../src/backend/cuda/attention-plan.js';
import { gpuOrSkip, randBf16, rng } from './helpers.js';
import { relErr as maxRel, relFrob as frob } from '../util/compare.js';
import { attentionBackwardRef, attentionRef } from '../backend/reference.js';

const { value: pair, skip } = gpuOrSkip(() => {
  const cacheDir = mkdtempSync(join(tmpdir(), 'dk-flash-bf16-'));
  return [createCudaBackend({ strict: false, cacheDir }), createCudaBackend({ strict: false, cacheDir, attnBackward: 'recompute' })] as const;
});
const [cuda, cudaRe] = pair ?? [null, null];
const cpu = cuda ? new CpuBackend({ dtype: 'f32', threads: 8 }) : null;
after(() => { cuda?.dispose(); cudaRe?.dispose(); cpu?.dispose(); });
/** The two tensor-core backwards: the default (stored dS) and the recomputing one, each on its own backend. */
const IMPLS = ['stored-ds', 'recompute'] as const;
type Impl = typeof IMPLS[number];
const backendFor = (impl: Impl): CudaBackend => (impl === 'stored-ds' ? cuda! : cudaRe!);

/** Bounds (see the header): forward out relative to max |out|, lse absolute, gradients relative Frobenius. */
const TOL_OUT = 1e-2, TOL_LSE = 1e-3, TOL_GRAD = 2e-2;


interface Inputs { q: Float64Array; k: Float64Array; v: Float64Array; dout: Float64Array; g0q: Float64Array; g0k: Float64Array; g0v: Float64Array }
interface Result { out: Float64Array; lse: Float64Array; dq: Float64Array; dk: Float64Array; dv: Float64Array }

function inputs(seed: number, B: number, T: number, nH: number, nKv: number, hd: number): Inputs {
  const r = rng(seed);
  const qn = B * T * nH * hd, kn = B * T * nKv * hd;
  // q scaled by 3: softmax rows far from uniform and from one-hot; non-zero gradient start values (accumulation)
  return {
    q: randBf16(r, qn, 3), k: randBf16(r, kn, 1), v: randBf16(r, kn, 1), dout: randBf16(r, qn, 1),
    g0q: randBf16(r, qn, 0.1), g0k: randBf16(r, kn, 0.1), g0v: randBf16(r, kn, 0.1),
  };
}

function up(b: Backend, a: ArrayLike<number>, label: string, dtype: DType): Buf { const x = b.alloc(a.length, label, dtype); b.upload(x, a); return x; }
const f64 = (a: Float32Array | Float64Array): Float64Array => Float64Array.from(a);

interface Opts { out: DType; grad: DType; backwardRuns?: number; accumulate?: boolean }

/** Forward, then `backwardRuns` backward calls accumulating into gradients that start at g0 (or overwriting them). */
function run(b: Backend, x: Inputs, B: number, T: number, nH: number, nKv: number, hd: number, o: Opts): Result {
  const q = up(b, x.q, 'q', 'bf16'), k = up(b, x.k, 'k', 'bf16'), v = up(b, x.v, 'v', 'bf16'), dout = up(b, x.dout, 'dout', 'bf16');
  const out = up(b, randBf16(rng(7), x.q.length, 5), 'out', o.out), lse = up(b, randBf16(rng(8), B * nH * T, 5), 'lse', 'f32'); // overwritten
  const dq = up(b, x.g0q, 'dq', o.grad), dk = up(b, x.g0k, 'dk', o.grad), dv = up(b, x.g0v, 'dv', o.grad);
  b.attentionForward(out, lse, q, k, v, B, T, nH, nKv, hd);
  for (let i = 0; i < (o.backwardRuns ?? 1); i++) b.attentionBackward(dq, dk, dv, dout, q, k, v, out, lse, B, T, nH, nKv, hd, o.accumulate ?? true);
  return { out: f64(b.download(out)), lse: f64(b.download(lse)), dq: f64(b.download(dq)), dk: f64(b.download(dk)), dv: f64(b.download(dv)) };
}

function maxAbs(got: ArrayLike<number>, ref: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < ref.length; i++) m = Math.max(m, Math.abs(got[i]! - ref[i]!));
  return m;
}
const minus = (a: Float64Array, b: Float64Array): Float64Array => a.map((y, i) => y - b[i]!);

/** Checks a result (gradients with their start values subtracted) against reference out, lse and gradients. */
function check(name: string, what: string, got: Result, x: Inputs, ref: { out: ArrayLike<number>; lse: ArrayLike<number>; dq: ArrayLike<number>; dk: ArrayLike<number>; dv: ArrayLike<number> }): void {
  const e = {
    out: maxRel(got.out, ref.out), lse: maxAbs(got.lse, ref.lse),
    dq: frob(minus(got.dq, x.g0q), ref.dq), dk: frob(minus(got.dk, x.g0k), ref.dk), dv: frob(minus(got.dv, x.g0v), ref.dv),
  };
  process.stderr.write(`[flash-attention-bf16] ${name} vs ${what}: out ${e.out.toExponential(2)} lse ${e.lse.toExponential(2)} `
    + `dq ${e.dq.toExponential(2)} dk ${e.dk.toExponential(2)} dv ${e.dv.toExponential(2)}\n`);
  assert.ok(e.out <= TOL_OUT, `${name}: out vs ${what}: ${e.out} > ${TOL_OUT}`);
  assert.ok(e.lse <= TOL_LSE, `${name}: lse vs ${what}: ${e.lse} > ${TOL_LSE}`);
  for (const k of ['dq', 'dk', 'dv'] as const) assert.ok(e[k] <= TOL_GRAD, `${name}: ${k} vs ${what}: ${e[k]} > ${TOL_GRAD}`);
}

function bitIdentical(name: string, a: Result, b: Result): void {
  for (const k of ['out', 'lse', 'dq', 'dk', 'dv'] as const) {
    let diff = 0;
    for (let i = 0; i < a[k].length; i++) if (!Object.is(a[k][i], b[k][i])) diff++;
    assert.equal(diff, 0, `${name}: ${k} differs between two identical runs in ${diff} elements (must be deterministic)`);
  }
}

/** The tensor-core kernels each backward runs (with the forward). */
const MMA_FAMILIES: Record<Impl, string[]> = {
  'stored-ds': ['attention_fwd_bf16', 'attention_bwd_pre', 'attention_bwd_dkv_ds_bf16', 'attention_bwd_dq_ds_bf16'],
  recompute: ['attention_fwd_bf16', 'attention_bwd_dq_bf16', 'attention_bwd_dkv_bf16'],
};
const launchedOn = (b: CudaBackend, f: string): number => b.launches.get(f) ?? 0;

function sweep(B: number, T: number, nH: number, nKv: number, hd: number, o: Opts & { ref64: boolean }): void {
  const name = `B=${B} T=${T} heads ${nH}/${nKv} hd ${hd} out ${o.out} grads ${o.grad}`;
  test(`bf16 attention ${name}`, { skip, timeout: 600_000 }, () => {
    const x = inputs(B * 1000003 + T * 7919 + nH * 101 + nKv * 13 + hd, B, T, nH, nKv, hd);
    const mma = bf16MmaHeadDim(hd);
    // the CPU backend's bf16 emulation (same bf16 inputs and output dtypes), and the float64 definition
    const c = run(cpu!, x, B, T, nH, nKv, hd, o);
    const ref = o.ref64 ? (() => {
      const [out, lse] = attentionRef(x.q, x.k, x.v, B, T, nH, nKv, hd);
      const [dq, dk, dv] = attentionBackwardRef(x.dout, x.q, x.k, x.v, B, T, nH, nKv, hd);
      return { out, lse, dq, dk, dv };
    })() : null;
    for (const impl of IMPLS) {
      const be = backendFor(impl), what = `${name} (${impl})`;
      const before = MMA_FAMILIES[impl].map((f) => launchedOn(be, f)), simtBefore = launchedOn(be, 'attention_fwd');
      const got = run(be, x, B, T, nH, nKv, hd, o);
      MMA_FAMILIES[impl].forEach((f, i) => {
        // (attention_bwd_pre also runs on the SIMT path)
        if (f !== 'attention_bwd_pre') assert.equal(launchedOn(be, f) > before[i]!, mma, `${what}: ${f} launched`);
        else assert.ok(launchedOn(be, f) > before[i]!, `${what}: ${f} launched`);
      });
      assert.equal(launchedOn(be, 'attention_fwd') > simtBefore, !mma, `${what}: SIMT forward launched`);
      check(what, 'cpu bf16', got, x, { out: c.out, lse: c.lse, dq: minus(c.dq, x.g0q), dk: minus(c.dk, x.g0k), dv: minus(c.dv, x.g0v) });
      if (ref) check(what, 'float64 definition', got, x, ref);
      bitIdentical(what, got, run(be, x, B, T, nH, nKv, hd, o));
    }
  });
}

for (const hd of [64, 128]) {
  for (const T of [1, 15, 64, 65, 130, 1024]) {
    for (const [nH, nKv] of [[2, 2], [4, 2], [14, 2]] as const) {
      if (T === 1024 && nH === 4) continue; // long sequences: groups 1 and 7
      sweep(2, T, nH, nKv, hd, { out: 'bf16', grad: 'bf16', ref64: T <= 130 });
    }
  }
  // f32 output and gradients (the kernels' other store path)
  sweep(2, 130, 14, 2, hd, { out: 'f32', grad: 'f32', ref64: true });
}
// the SIMT fallback with bf16 operands: head dims that are not a multiple of 16
for (const hd of [40, 72]) {
  sweep(2, 97, 14, 2, hd, { out: 'bf16', grad: 'bf16', ref64: true });
  sweep(2, 65, 4, 2, hd, { out: 'f32', grad: 'f32', ref64: true });
}

test('bf16 attention backward accumulates: a second call adds the same (f32) gradient again', { skip, timeout: 300_000 }, () => {
  for (const impl of IMPLS) {
    for (const hd of [64, 128, 40]) {
      const B = 2, T = 130, nH = 14, nKv = 2, x = inputs(hd, B, T, nH, nKv, hd), be = backendFor(impl);
      const one = run(be, x, B, T, nH, nKv, hd, { out: 'bf16', grad: 'f32' });
      const two = run(be, x, B, T, nH, nKv, hd, { out: 'bf16', grad: 'f32', backwardRuns: 2 });
      for (const k of ['dq', 'dk', 'dv'] as const) {
        const g0 = k === 'dq' ? x.g0q : k === 'dk' ? x.g0k : x.g0v;
        const once = minus(one[k], g0), twice = minus(two[k], g0);
        const e = maxRel(twice, once.map((y) => 2 * y));
        process.stderr.write(`[flash-attention-bf16] accumulate ${impl} hd ${hd} ${k}: ${e.toExponential(2)}\n`);
        assert.ok(e <= 1e-5, `${impl} hd ${hd} ${k}: two backward calls are not twice one (${e})`);
        assert.ok(maxAbs(once, new Float64Array(once.length)) > 0, `${impl} hd ${hd} ${k}: a non-zero gradient`);
      }
    }
  }
});

test('attention backward overwriting (accumulate false) stores bit for bit what it adds to zeros; the old gradients (NaN) are never read', { skip, timeout: 300_000 }, () => {
  // the tensor-core kernels (hd 64, 128: the split GQA group with its reduction, and MHA unsplit) and the SIMT ones (hd 40)
  for (const impl of IMPLS) {
    const be = backendFor(impl), dqKernel = impl === 'stored-ds' ? 'attention_bwd_dq_ds_bf16' : 'attention_bwd_dq_bf16';
    for (const hd of [64, 128, 40]) {
      for (const [nH, nKv] of [[14, 2], [4, 4]] as const) {
        for (const grad of ['bf16', 'f32'] as const) {
          const B = 2, T = 130, x = inputs(hd * 31 + nH + (grad === 'f32' ? 1 : 0), B, T, nH, nKv, hd);
          const zeros = { ...x, g0q: new Float64Array(x.g0q.length), g0k: new Float64Array(x.g0k.length), g0v: new Float64Array(x.g0v.length) };
          const nan = { ...x, g0q: x.g0q.map(() => NaN), g0k: x.g0k.map(() => NaN), g0v: x.g0v.map(() => NaN) };
          const before = launchedOn(be, dqKernel);
          const added = run(be, zeros, B, T, nH, nKv, hd, { out: 'bf16', grad });
          const stored = run(be, nan, B, T, nH, nKv, hd, { out: 'bf16', grad, accumulate: false });
          assert.equal(launchedOn(be, dqKernel) > before, bf16MmaHeadDim(hd), `${impl} hd ${hd}: the tensor-core kernels ran`);
          bitIdentical(`overwriting ${impl} hd ${hd} heads ${nH}/${nKv} grads ${grad}`, stored, added);
          assert.ok(maxAbs(stored.dk, new Float64Array(stored.dk.length)) > 0, 'a non-zero gradient');
        }
      }
    }
  }
});

test('stored-dS backward at the scratch\'s edges: batches in chunks of whole sequences, and a sequence whose dS triangle does not fit recomputes', { skip, timeout: 600_000 }, () => {
  // The default scratch (DEFAULT_ATTN_DS_ELEMS, not prepared here) holds two 14-head sequences of 1024 (7.8 Mi elements
  // each): B = 4 runs in two chunks; one sequence of 2048 (30 Mi) does not fit, so that backward recomputes.
  const hd = 64, nH = 14, nKv = 2;
  assert.ok(dsScratchElems(2, nH, 1024) <= DEFAULT_ATTN_DS_ELEMS && dsScratchElems(3, nH, 1024) > DEFAULT_ATTN_DS_ELEMS);
  assert.ok(dsScratchElems(1, nH, 2048) > DEFAULT_ATTN_DS_ELEMS);
  for (const [B, T, fallback] of [[4, 1024, false], [1, 2048, true]] as const) {
    const x = inputs(B * 7 + T, B, T, nH, nKv, hd), o: Opts = { out: 'bf16', grad: 'bf16' };
    const kernels = ['attention_bwd_dq_ds_bf16', 'attention_bwd_dq_bf16'], before = kernels.map((f) => launchedOn(cuda!, f));
    const got = run(cuda!, x, B, T, nH, nKv, hd, o);
    const ran = kernels.map((f, i) => launchedOn(cuda!, f) - before[i]!);
    assert.deepEqual(ran, fallback ? [0, 1] : [2, 0], `B=${B} T=${T}: dQ launches (stored dS, recomputed)`);
    const c = run(cpu!, x, B, T, nH, nKv, hd, o);
    check(`B=${B} T=${T} heads ${nH}/${nKv} (default backend${fallback ? ', recomputing' : ', two chunks'})`, 'cpu bf16', got, x,
      { out: c.out, lse: c.lse, dq: minus(c.dq, x.g0q), dk: minus(c.dk, x.g0k), dv: minus(c.dv, x.g0v) });
  }
});

test('bf16 generation: kvCacheWrite into bf16 caches and attentionCached match the CPU backend (a block per query head, and per KV head for the group, split)', { skip, timeout: 300_000 }, () => {
  // 14/2 heads, batch 2: the 37-row prefill has 148 (row, KV head) pairs (attention_cached_gqa, unsplit), the 5-row step
  // 20 (attention_cached); 16/8 heads, batch 8: the prefill unsplit, the decode steps' 64 pairs split 4 ways. Large grids
  // pick a layout by occupancy (cachedAttentionPickLayout), which depends on the GPU: on an H100 SXM or H200 (132 SMs)
  // 16/8 heads at batch 32 (decode: 256 blocks) take 4 rows in flight and at 64 (512 blocks) 1 row, 32/8 at batch 64 2
  // rows, and the prefills the layout of most blocks an SM; another GPU may take others (not asserted here: the plan
  // tests assert the pick, these the numbers of whichever layouts run)
  const cases: Array<[number, number, number, number, number, number, number]> = [[64, 2, 14, 2, 48, 37, 5], [128, 2, 14, 2, 48, 37, 5], [40, 2, 14, 2, 48, 37, 5],
    [128, 8, 16, 8, 200, 150, 1], [128, 32, 16, 8, 64, 40, 1], [128, 64, 16, 8, 64, 40, 1], [128, 64, 32, 8, 64, 40, 1]];
  for (const [hd, B, nH, nKv, tMax, t0, t1] of cases) {
    const run1 = (b: Backend): Float64Array => {
      const kc = b.alloc(B * tMax * nKv * hd, 'kc', 'bf16'), vc = b.alloc(B * tMax * nKv * hd, 'vc', 'bf16');
      const outs: number[] = [];
      let pos = 0;
      for (const [t, seed] of [[t0, 1], [t1, 2], [t1, 3]] as const) { // two steps after the prefill: a split call finds its counters reset
        const rr = rng(seed * 977 + hd);
        const q = up(b, randBf16(rr, B * t * nH * hd, 3), 'q', 'bf16');
        const k = up(b, randBf16(rr, B * t * nKv * hd, 1), 'k', 'f32'), v = up(b, randBf16(rr, B * t * nKv * hd, 1), 'v', 'bf16');
        b.kvCacheWrite(kc, k, B, t, pos, tMax, nKv, hd);
        b.kvCacheWrite(vc, v, B, t, pos, tMax, nKv, hd);
        const out = b.alloc(B * t * nH * hd, 'out', 'bf16');
        b.attentionCached(out, q, kc, vc, B, t, pos, tMax, nH, nKv, hd);
        for (const y of b.download(out)) outs.push(y); // no spread: 10^5 arguments overflow the stack
        pos += t;
      }
      return Float64Array.from(outs);
    };
    const got = run1(cuda!), ref = run1(cpu!);
    const e = maxRel(got, ref);
    process.stderr.write(`[flash-attention-bf16] cached hd ${hd} B=${B} heads ${nH}/${nKv} (${t0}-row prefill, then ${t1}) vs cpu bf16: ${e.toExponential(2)}\n`);
    assert.ok(e <= TOL_OUT, `cached attention hd ${hd}: ${e} > ${TOL_OUT}`);
  }
});
