/**
 * No GPU needed: a lane-by-lane JavaScript simulation of the CUDA training attention's tiling (attention_fwd,
 * attention_bwd_pre, attention_bwd, attention_bwd_dkv + attention_dkv_reduce as generated in
 * src/backend/cuda/kernels/attention.ts), with the tile sizes the kernels are generated with (attnTile), against the
 * float64 references. It checks the index math the GPU cannot be asked about here: the causal tile bounds (key tiles
 * [0, last row of the query tile], query tiles from the key tile's first key down), rows and keys past T, the online
 * softmax rescaling across tiles, the GQA head mapping, the split-partial layout and its in-order reduction. Each
 * simulated phase is what the threads of a block do between two barriers; warp shuffles read the other lanes' values.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  ATTN_KEY_TILE, SMEM_DEFAULT, attentionBackward, attentionBackwardKv, attentionBackwardPre, attentionForward, attnTile,
} from '../../src/backend/cuda/kernels/attention.js';
import { attentionBackwardDkvBf16, attentionBackwardDqBf16, attentionForwardBf16, bf16MmaHeadDim } from '../../src/backend/cuda/kernels/attention-bf16.js';
import { MMA_KEY_TILE, MMA_QUERY_TILE, mmaForwardSmem } from '../../src/backend/cuda/kernels/attention-tf32.js';
import type { KernelFamily, ParamRecord } from '../../src/backend/cuda/kernels/spec.js';
import { CudaBackend } from '../../src/backend/cuda/cuda-backend.js';
import { ATTN_BLOCK } from '../../src/backend/cuda/block-sizes.js';
import { KernelCache } from '../../src/backend/cuda/kernel-cache.js';
import { FakeCompiler, fakeCublas, fakeDriver } from './helpers.js';
import { Rng } from '../../src/util/rng.js';
import { assertClose, randn } from '../backend/helpers.js';
import { attentionBackwardRef, attentionRef } from '../backend/reference.js';

const KT = ATTN_KEY_TILE, NW = ATTN_BLOCK / 32;

/** A [rows][HD] tile loaded like loadRows: zero past T. */
function loadRows(base: Float64Array, off: number, stride: number, r0: number, n: number, T: number, HD: number): Float64Array[] {
  return Array.from({ length: n }, (_, r) => Float64Array.from({ length: HD }, (_, d) => (r0 + r < T ? base[off + (r0 + r) * stride + d]! : 0)));
}

function simForward(q: Float64Array, k: Float64Array, v: Float64Array, B: number, T: number, nH: number, nKv: number, HD: number) {
  const { rpw: RPW, tq: TQ } = attnTile('fwd', HD, ATTN_BLOCK)!;
  const SCALE = 1 / Math.sqrt(HD), qs = nH * HD, ks = nKv * HD;
  const out = new Float64Array(B * T * nH * HD).fill(NaN), lse = new Float64Array(B * nH * T).fill(NaN);
  for (let b = 0; b < B; b++) for (let h = 0; h < nH; h++) for (let bx = 0; bx < Math.ceil(T / TQ); bx++) {
    const kvh = Math.floor(h / (nH / nKv)), i0 = bx * TQ, iEnd = Math.min(T, i0 + TQ);
    const Qs = loadRows(q, (b * T * nH + h) * HD, qs, i0, TQ, T, HD);
    const m = new Float64Array(TQ).fill(-Infinity), l = new Float64Array(TQ), acc = Array.from({ length: TQ }, () => new Float64Array(HD));
    for (let j0 = 0; j0 < iEnd; j0 += KT) {
      const Kt = loadRows(k, (b * T * nKv + kvh) * HD, ks, j0, KT, T, HD);
      const pr = Array.from({ length: TQ }, () => new Float64Array(32));
      for (let warp = 0; warp < NW; warp++) for (let rr = 0; rr < RPW; rr++) {
        const r = warp * RPW + rr, i = i0 + r;
        const sc = new Float64Array(32);
        for (let lane = 0; lane < 32; lane++) {
          let s = 0;
          for (let d = 0; d < HD; d++) s += Qs[r]![d]! * Kt[lane]![d]!;
          const j = j0 + lane;
          sc[lane] = j <= i && j < T ? s * SCALE : -Infinity;
        }
        const mn = Math.max(m[r]!, ...sc); // fmaxf(m, warpMax(sc))
        const alpha = Math.exp(m[r]! - mn);
        for (let lane = 0; lane < 32; lane++) pr[r]![lane] = sc[lane] === -Infinity ? 0 : Math.exp(sc[lane]! - mn);
        l[r] = l[r]! * alpha + pr[r]!.reduce((a, c) => a + c, 0);
        m[r] = mn;
        for (let d = 0; d < HD; d++) acc[r]![d]! *= alpha;
      }
      const Vt = loadRows(v, (b * T * nKv + kvh) * HD, ks, j0, KT, T, HD);
      for (let r = 0; r < TQ; r++) for (let c = 0; c < KT; c++) for (let d = 0; d < HD; d++) acc[r]![d]! += pr[r]![c]! * Vt[c]![d]!;
    }
    for (let r = 0; r < TQ; r++) {
      const i = i0 + r;
      if (i >= T) continue;
      for (let d = 0; d < HD; d++) out[((b * T + i) * nH + h) * HD + d] = acc[r]![d]! / l[r]!;
      lse[(b * nH + h) * T + i] = m[r]! + Math.log(l[r]!);
    }
  }
  return { out, lse };
}

function simBackward(dout: Float64Array, q: Float64Array, k: Float64Array, v: Float64Array, out: Float64Array, lse: Float64Array,
  B: number, T: number, nH: number, nKv: number, HD: number, split: boolean) {
  const SCALE = 1 / Math.sqrt(HD), qs = nH * HD, ks = nKv * HD;
  // attention_bwd_pre: one warp per row r = (b·T + i)·nH + h
  const dsum = new Float64Array(B * nH * T).fill(NaN);
  for (let r = 0; r < B * T * nH; r++) {
    let s = 0;
    for (let d = 0; d < HD; d++) s += dout[r * HD + d]! * out[r * HD + d]!;
    const h = r % nH, bt = Math.floor(r / nH), i = bt % T, b = Math.floor(bt / T);
    dsum[(b * nH + h) * T + i] = s;
  }
  // attention_bwd (dq)
  const dq = new Float64Array(B * T * nH * HD);
  const tq = attnTile('dq', HD, ATTN_BLOCK)!;
  for (let b = 0; b < B; b++) for (let h = 0; h < nH; h++) for (let bx = 0; bx < Math.ceil(T / tq.tq); bx++) {
    const kvh = Math.floor(h / (nH / nKv)), i0 = bx * tq.tq, iEnd = Math.min(T, i0 + tq.tq);
    const Qs = loadRows(q, (b * T * nH + h) * HD, qs, i0, tq.tq, T, HD), Ds = loadRows(dout, (b * T * nH + h) * HD, qs, i0, tq.tq, T, HD);
    const acc = Array.from({ length: tq.tq }, () => new Float64Array(HD));
    for (let j0 = 0; j0 < iEnd; j0 += KT) {
      const Vt = loadRows(v, (b * T * nKv + kvh) * HD, ks, j0, KT, T, HD), Kt = loadRows(k, (b * T * nKv + kvh) * HD, ks, j0, KT, T, HD);
      for (let r = 0; r < tq.tq; r++) {
        const i = i0 + r;
        const lr = i < T ? lse[(b * nH + h) * T + i]! : 0, dr = i < T ? dsum[(b * nH + h) * T + i]! : 0;
        for (let lane = 0; lane < 32; lane++) {
          let dp = 0, s = 0;
          for (let d = 0; d < HD; d++) { dp += Ds[r]![d]! * Vt[lane]![d]!; s += Qs[r]![d]! * Kt[lane]![d]!; }
          const j = j0 + lane;
          const p = i < T && j <= i ? Math.exp(s * SCALE - lr) : 0;
          const ds = p * (dp - dr) * SCALE;
          for (let d = 0; d < HD; d++) acc[r]![d]! += ds * Kt[lane]![d]!; // the shuffle broadcast of lane's dS
        }
      }
    }
    for (let r = 0; r < tq.tq; r++) {
      const i = i0 + r;
      if (i < T) for (let d = 0; d < HD; d++) dq[((b * T + i) * nH + h) * HD + d] += acc[r]![d]!;
    }
  }
  // attention_bwd_dkv (+ attention_dkv_reduce when split)
  const dk = new Float64Array(B * T * nKv * HD), dv = new Float64Array(B * T * nKv * HD);
  const tkv = attnTile('dkv', HD, ATTN_BLOCK)!, TQ = tkv.tq, KPW = KT / NW;
  const G = nH / nKv, S = split && G > 1 ? G : 1;
  const half = B * nKv * S * T * HD, part = new Float64Array(2 * half).fill(NaN);
  for (let b = 0; b < B; b++) for (let by = 0; by < nKv * S; by++) for (let bx = 0; bx < Math.ceil(T / KT); bx++) {
    const kvh = Math.floor(by / S), s = by - kvh * S, g0 = Math.floor(s * G / S), g1 = Math.floor((s + 1) * G / S), j0 = bx * KT;
    const Ks = loadRows(k, (b * T * nKv + kvh) * HD, ks, j0, KT, T, HD), Vs = loadRows(v, (b * T * nKv + kvh) * HD, ks, j0, KT, T, HD);
    const adk = Array.from({ length: KT }, () => new Float64Array(HD)), adv = Array.from({ length: KT }, () => new Float64Array(HD));
    for (let g = g0; g < g1; g++) {
      const h = kvh * G + g;
      for (let i0 = j0; i0 < T; i0 += TQ) {
        const Qs = loadRows(q, (b * T * nH + h) * HD, qs, i0, TQ, T, HD), Ds = loadRows(dout, (b * T * nH + h) * HD, qs, i0, TQ, T, HD);
        const Ps = Array.from({ length: TQ }, () => new Float64Array(KT)), Ss = Array.from({ length: TQ }, () => new Float64Array(KT));
        for (let r = 0; r < TQ; r++) for (let lane = 0; lane < 32; lane++) {
          const i = i0 + r, j = j0 + lane, ok = i < T && j <= i;
          let dp = 0, sc = 0;
          for (let d = 0; d < HD; d++) { dp += Ds[r]![d]! * Vs[lane]![d]!; sc += Qs[r]![d]! * Ks[lane]![d]!; }
          const pv = ok ? Math.exp(sc * SCALE - lse[(b * nH + h) * T + i]!) : 0;
          Ps[r]![lane] = pv;
          Ss[r]![lane] = ok ? pv * (dp - dsum[(b * nH + h) * T + i]!) * SCALE : 0;
        }
        for (let r = 0; r < TQ; r++) for (let warp = 0; warp < NW; warp++) for (let kk = 0; kk < KPW; kk++) {
          const key = warp * KPW + kk;
          for (let d = 0; d < HD; d++) { adv[key]![d]! += Ps[r]![key]! * Ds[r]![d]!; adk[key]![d]! += Ss[r]![key]! * Qs[r]![d]!; }
        }
      }
    }
    for (let key = 0; key < KT; key++) {
      const jj = j0 + key;
      if (jj >= T) continue;
      for (let d = 0; d < HD; d++) {
        if (S === 1) { dk[((b * T + jj) * nKv + kvh) * HD + d] += adk[key]![d]!; dv[((b * T + jj) * nKv + kvh) * HD + d] += adv[key]![d]!; }
        else {
          const po = (((b * nKv + kvh) * S + s) * T + jj) * HD;
          part[po + d] = adk[key]![d]!; part[half + po + d] = adv[key]![d]!;
        }
      }
    }
  }
  if (S > 1) {
    const n = B * T * nKv * HD;
    for (let i = 0; i < n; i++) {
      const d = i % HD; let r = Math.floor(i / HD);
      const kvh = r % nKv; r = Math.floor(r / nKv);
      const j = r % T, b = Math.floor(r / T);
      const base = (((b * nKv + kvh) * S) * T + j) * HD + d, st = T * HD;
      let sk = 0, sv = 0;
      for (let s = 0; s < S; s++) { sk += part[base + s * st]!; sv += part[half + base + s * st]!; }
      dk[i] += sk; dv[i] += sv;
    }
  }
  return { dq, dk, dv };
}

for (const [B, T, nH, nKv, HD] of [[1, 1, 2, 1, 64], [2, 31, 4, 2, 64], [1, 70, 6, 2, 80], [1, 97, 2, 2, 128], [1, 45, 3, 1, 256], [1, 40, 2, 1, 96]] as const) {
  test(`simulated CUDA attention tiling B=${B} T=${T} heads ${nH}/${nKv} hd ${HD} (tiles fwd/dq/dkv ${['fwd', 'dq', 'dkv'].map((k) => attnTile(k as 'fwd', HD, ATTN_BLOCK)!.tq).join('/')}) equals float64`, () => {
    const rng = new Rng(B * 1000 + T * 10 + HD);
    const q = randn(rng, B * T * nH * HD, 2), k = randn(rng, B * T * nKv * HD), v = randn(rng, B * T * nKv * HD), g = randn(rng, B * T * nH * HD);
    const f = simForward(q, k, v, B, T, nH, nKv, HD);
    const [outR, lseR] = attentionRef(q, k, v, B, T, nH, nKv, HD);
    assertClose(f.out, outR, 1e-12, 1e-12, 'out');
    assertClose(f.lse, lseR, 1e-12, 1e-12, 'lse');
    const [dqR, dkR, dvR] = attentionBackwardRef(g, q, k, v, B, T, nH, nKv, HD);
    for (const split of [false, true]) {
      const r = simBackward(g, q, k, v, f.out, f.lse, B, T, nH, nKv, HD, split);
      assertClose(r.dq, dqR, 1e-10, 1e-10, `dq split=${split}`);
      assertClose(r.dk, dkR, 1e-10, 1e-10, `dk split=${split}`);
      assertClose(r.dv, dvR, 1e-10, 1e-10, `dv split=${split}`);
    }
  });
}

test('the training attention kernels use no atomics (a deterministic backward by construction) and no [T, T] state', () => {
  const families: Array<KernelFamily<ParamRecord>> = [attentionForward, attentionBackwardPre, attentionBackward, attentionBackwardKv,
    attentionForwardBf16, attentionBackwardDqBf16, attentionBackwardDkvBf16] as unknown as Array<KernelFamily<ParamRecord>>;
  let checked = 0;
  for (const hd of [32, 64, 80, 96, 128, 256]) {
    for (const f of families) {
      if (f.name.endsWith('_bf16') && !bf16MmaHeadDim(hd)) continue;
      for (const dt of ['f32', 'bf16']) {
        const p: ParamRecord = { headDim: hd };
        if ('block' in f.schema) p.block = f === (attentionBackwardPre as unknown) ? 256 : ATTN_BLOCK;
        for (const [k, d] of Object.entries(f.schema)) if (k !== 'headDim' && k !== 'block') p[k] = (d as { kind: string }).kind === 'bool' ? true : dt;
        const src = f.make(p).source();
        assert.doesNotMatch(src, /atomic/i, `${f.name} hd ${hd}`);
        assert.doesNotMatch(src, /\bprobs\b|T \* T/, `${f.name} hd ${hd}`);
        checked++;
      }
    }
  }
  assert.ok(checked >= 50);
});

test('device launches on a fake driver: each tiled kernel gets its dynamic shared memory, opted in once above 48 KiB', () => {
  const launches: Array<{ fn: string; grid: readonly number[]; shmem: number }> = [];
  const allowed: Array<[string, number]> = [];
  const driver = Object.assign(fakeDriver(), {
    launch: (fn: unknown, grid: readonly [number, number, number], _block: number, shmem: number) => { launches.push({ fn: String(fn), grid, shmem }); },
    setMaxDynamicShared: (fn: unknown, bytes: number) => { allowed.push([String(fn), bytes]); },
  });
  const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: false, log: () => {} });
  const be = new CudaBackend('device', { driver, cublas: fakeCublas(), cache, log: () => {} });
  try {
    for (const hd of [64, 256]) {
      const B = 2, T = 100, nH = 6, nKv = 2;
      const q = be.alloc(B * T * nH * hd, 'q'), k = be.alloc(B * T * nKv * hd, 'k'), v = be.alloc(B * T * nKv * hd, 'v');
      const out = be.alloc(q.length, 'out'), lse = be.alloc(B * nH * T, 'lse');
      launches.length = 0;
      for (let rep = 0; rep < 2; rep++) {
        be.attentionForward(out, lse, q, k, v, B, T, nH, nKv, hd);
        be.attentionBackward(be.alloc(q.length, 'dq'), be.alloc(k.length, 'dk'), be.alloc(v.length, 'dv'), be.alloc(q.length, 'dout'),
          q, k, v, out, lse, B, T, nH, nKv, hd);
      }
      const want: Record<string, { shmem: number; grid: number[] }> = {
        attention_fwd: { shmem: attnTile('fwd', hd, ATTN_BLOCK)!.smem, grid: [Math.ceil(T / attnTile('fwd', hd, ATTN_BLOCK)!.tq), nH, B] },
        attention_bwd: { shmem: attnTile('dq', hd, ATTN_BLOCK)!.smem, grid: [Math.ceil(T / attnTile('dq', hd, ATTN_BLOCK)!.tq), nH, B] },
        attention_bwd_dkv: { shmem: attnTile('dkv', hd, ATTN_BLOCK)!.smem, grid: [Math.ceil(T / ATTN_KEY_TILE), nKv * (nH / nKv), B] },
      };
      for (const [fn, w] of Object.entries(want)) {
        const got = launches.filter((l) => l.fn === fn);
        assert.equal(got.length, 2, `${fn} hd ${hd} launched once per call`);
        for (const g of got) { assert.equal(g.shmem, w.shmem, `${fn} hd ${hd} shared memory`); assert.deepEqual([...g.grid], w.grid, `${fn} hd ${hd} grid`); }
        const opt = allowed.filter(([f]) => f === fn);
        assert.deepEqual(opt, w.shmem > SMEM_DEFAULT ? [[fn, w.shmem]] : [], `${fn} hd ${hd}: opt-in exactly when above 48 KiB, once`);
      }
      assert.ok(launches.some((l) => l.fn === 'attention_bwd_pre'), 'the D pre-pass runs');
    }
    assert.ok(allowed.some(([f]) => f === 'attention_bwd_dkv'), 'head dim 256 exercises the opt-in');
  } finally { be.dispose(); }
});

/**
 * The experimental tensor-core forward (attention_fwd_mma) simulated lane by lane with the PTX fragment layouts of
 * mma.m16n8k8 (.tf32: g = lane / 4, t = lane % 4; A a0 (g, t) a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4); B b0 (k t, n g)
 * b1 (k t+4, n g); C c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t) c3 (g+8, 2t+1)), in float64 (no TF32 rounding: this checks
 * the index math, quad reductions and the accumulator → A-fragment shuffles, not the precision).
 */
function mmaSim(c: number[][], a: number[][], b: number[][]): void {
  // gather the warp's A (16×8), B (8×8) from fragments, multiply, scatter into the C fragments
  const A = Array.from({ length: 16 }, () => new Float64Array(8)), Bm = Array.from({ length: 8 }, () => new Float64Array(8));
  for (let lane = 0; lane < 32; lane++) {
    const g = lane >> 2, t = lane & 3;
    A[g]![t] = a[lane]![0]!; A[g + 8]![t] = a[lane]![1]!; A[g]![t + 4] = a[lane]![2]!; A[g + 8]![t + 4] = a[lane]![3]!;
    Bm[t]![g] = b[lane]![0]!; Bm[t + 4]![g] = b[lane]![1]!;
  }
  for (let lane = 0; lane < 32; lane++) {
    const g = lane >> 2, t = lane & 3;
    const dot = (r: number, n: number) => { let s = 0; for (let kk = 0; kk < 8; kk++) s += A[r]![kk]! * Bm[kk]![n]!; return s; };
    c[lane]![0]! += dot(g, 2 * t); c[lane]![1]! += dot(g, 2 * t + 1); c[lane]![2]! += dot(g + 8, 2 * t); c[lane]![3]! += dot(g + 8, 2 * t + 1);
  }
}

function simForwardMma(q: Float64Array, k: Float64Array, v: Float64Array, B: number, T: number, nH: number, nKv: number, HD: number) {
  const BQ = MMA_QUERY_TILE, BK = MMA_KEY_TILE, KS = HD / 8, SCALE = 1 / Math.sqrt(HD), qs = nH * HD, ks = nKv * HD;
  const out = new Float64Array(B * T * nH * HD).fill(NaN), lse = new Float64Array(B * nH * T).fill(NaN);
  const lanes = [...Array(32).keys()];
  const shfl = (vals: number[], src: (lane: number) => number) => lanes.map((l) => vals[src(l)]!);
  const xor = (vals: number[], m: number) => lanes.map((l) => vals[l ^ m]!);
  for (let b = 0; b < B; b++) for (let h = 0; h < nH; h++) for (let bx = 0; bx < Math.ceil(T / BQ); bx++) {
    const kvh = Math.floor(h / (nH / nKv)), i0 = bx * BQ, iEnd = Math.min(T, i0 + BQ);
    const Qst = loadRows(q, (b * T * nH + h) * HD, qs, i0, BQ, T, HD);
    for (let warp = 0; warp < 4; warp++) {
      const rw = warp * 16;
      const qa = Array.from({ length: KS }, (_, s) => lanes.map((l) => {
        const g = l >> 2, t = l & 3;
        return [Qst[rw + g]![8 * s + t]!, Qst[rw + g + 8]![8 * s + t]!, Qst[rw + g]![8 * s + t + 4]!, Qst[rw + g + 8]![8 * s + t + 4]!];
      }));
      const o = Array.from({ length: KS }, () => lanes.map(() => [0, 0, 0, 0]));
      let mA = lanes.map(() => -Infinity), mB = lanes.map(() => -Infinity), lA = lanes.map(() => 0), lB = lanes.map(() => 0);
      for (let j0 = 0; j0 < iEnd; j0 += BK) {
        const Ks = loadRows(k, (b * T * nKv + kvh) * HD, ks, j0, BK, T, HD), Vs = loadRows(v, (b * T * nKv + kvh) * HD, ks, j0, BK, T, HD);
        const sc = Array.from({ length: 4 }, () => lanes.map(() => [0, 0, 0, 0]));
        for (let n = 0; n < 4; n++) for (let s = 0; s < KS; s++) {
          mmaSim(sc[n]!, qa[s]!, lanes.map((l) => [Ks[8 * n + (l >> 2)]![8 * s + (l & 3)]!, Ks[8 * n + (l >> 2)]![8 * s + (l & 3) + 4]!]));
        }
        let mxA = lanes.map(() => -Infinity), mxB = lanes.map(() => -Infinity);
        for (let n = 0; n < 4; n++) for (const l of lanes) for (let e = 0; e < 4; e++) {
          const g = l >> 2, t = l & 3, iA = i0 + rw + g, i = e < 2 ? iA : iA + 8, j = j0 + 8 * n + 2 * t + (e & 1);
          const x = j <= i && j < T ? sc[n]![l]![e]! * SCALE : -Infinity;
          sc[n]![l]![e] = x;
          if (e < 2) mxA[l] = Math.max(mxA[l]!, x); else mxB[l] = Math.max(mxB[l]!, x);
        }
        for (const m of [1, 2]) { const xa = xor(mxA, m), xb = xor(mxB, m); mxA = mxA.map((x, l) => Math.max(x, xa[l]!)); mxB = mxB.map((x, l) => Math.max(x, xb[l]!)); }
        const nA = mA.map((x, l) => Math.max(x, mxA[l]!)), nB = mB.map((x, l) => Math.max(x, mxB[l]!));
        const aA = mA.map((x, l) => Math.exp(x - nA[l]!)), aB = mB.map((x, l) => Math.exp(x - nB[l]!));
        let sA = lanes.map(() => 0), sB = lanes.map(() => 0);
        for (let n = 0; n < 4; n++) for (const l of lanes) for (let e = 0; e < 4; e++) {
          const pe = Math.exp(sc[n]![l]![e]! - (e < 2 ? nA[l]! : nB[l]!));
          sc[n]![l]![e] = pe;
          if (e < 2) sA[l] += pe; else sB[l] += pe;
        }
        for (const m of [1, 2]) { const xa = xor(sA, m), xb = xor(sB, m); sA = sA.map((x, l) => x + xa[l]!); sB = sB.map((x, l) => x + xb[l]!); }
        lA = lA.map((x, l) => x * aA[l]! + sA[l]!); lB = lB.map((x, l) => x * aB[l]! + sB[l]!); mA = nA; mB = nB;
        for (let n = 0; n < KS; n++) for (const l of lanes) { o[n]![l]![0]! *= aA[l]!; o[n]![l]![1]! *= aA[l]!; o[n]![l]![2]! *= aB[l]!; o[n]![l]![3]! *= aB[l]!; }
        const srcLo = (l: number) => (l & ~3) | ((l & 3) >> 1), srcHi = (l: number) => srcLo(l) + 2;
        for (let kk = 0; kk < 4; kk++) {
          const col = (e: number) => sc[kk]!.map((f) => f[e]!);
          const x0 = shfl(col(0), srcLo), x1 = shfl(col(1), srcLo), y0 = shfl(col(0), srcHi), y1 = shfl(col(1), srcHi);
          const z0 = shfl(col(2), srcLo), z1 = shfl(col(3), srcLo), w0 = shfl(col(2), srcHi), w1 = shfl(col(3), srcHi);
          const pa = lanes.map((l) => (l & 1) ? [x1[l]!, z1[l]!, y1[l]!, w1[l]!] : [x0[l]!, z0[l]!, y0[l]!, w0[l]!]);
          for (let n = 0; n < KS; n++) {
            mmaSim(o[n]!, pa, lanes.map((l) => [Vs[8 * kk + (l & 3)]![8 * n + (l >> 2)]!, Vs[8 * kk + (l & 3) + 4]![8 * n + (l >> 2)]!]));
          }
        }
      }
      for (const l of lanes) {
        const g = l >> 2, t = l & 3, iA = i0 + rw + g, iB = iA + 8;
        for (const [i, e0, m, ll] of [[iA, 0, mA[l]!, lA[l]!], [iB, 2, mB[l]!, lB[l]!]] as const) {
          if (i >= T) continue;
          for (let n = 0; n < KS; n++) {
            out[((b * T + i) * nH + h) * HD + 8 * n + 2 * t] = o[n]![l]![e0]! / ll;
            out[((b * T + i) * nH + h) * HD + 8 * n + 2 * t + 1] = o[n]![l]![e0 + 1]! / ll;
          }
          if (t === 0) lse[(b * nH + h) * T + i] = m + Math.log(ll);
        }
      }
    }
  }
  return { out, lse };
}

for (const [B, T, nH, nKv, HD] of [[1, 1, 2, 1, 64], [2, 45, 4, 2, 32], [1, 97, 2, 1, 80], [1, 70, 2, 2, 128]] as const) {
  test(`simulated tensor-core forward (attention_fwd_mma fragments) B=${B} T=${T} heads ${nH}/${nKv} hd ${HD} equals float64`, () => {
    const rng = new Rng(B * 77 + T * 3 + HD);
    const q = randn(rng, B * T * nH * HD, 2), k = randn(rng, B * T * nKv * HD), v = randn(rng, B * T * nKv * HD);
    const f = simForwardMma(q, k, v, B, T, nH, nKv, HD);
    const [outR, lseR] = attentionRef(q, k, v, B, T, nH, nKv, HD);
    assertClose(f.out, outR, 1e-12, 1e-12, 'out');
    assertClose(f.lse, lseR, 1e-12, 1e-12, 'lse');
  });
}

test("attention: 'mma' launches attention_fwd_mma where the head dim allows, the fp32 kernel otherwise; the default never does", () => {
  const run = (attention: 'simt' | 'mma' | undefined, hd: number): Array<{ fn: string; grid: number[]; shmem: number }> => {
    const launches: Array<{ fn: string; grid: number[]; shmem: number }> = [];
    const driver = Object.assign(fakeDriver(), {
      launch: (fn: unknown, grid: readonly [number, number, number], _b: number, shmem: number) => { launches.push({ fn: String(fn), grid: [...grid], shmem }); },
    });
    const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: false, log: () => {} });
    const be = new CudaBackend('device', { driver, cublas: fakeCublas(), cache, log: () => {}, ...(attention ? { attention } : {}) });
    try {
      const B = 2, T = 130, nH = 4, nKv = 2;
      be.attentionForward(be.alloc(B * T * nH * hd, 'o'), be.alloc(B * nH * T, 'l'), be.alloc(B * T * nH * hd, 'q'),
        be.alloc(B * T * nKv * hd, 'k'), be.alloc(B * T * nKv * hd, 'v'), B, T, nH, nKv, hd);
    } finally { be.dispose(); }
    return launches;
  };
  assert.deepEqual(run('mma', 128), [{ fn: 'attention_fwd_mma', grid: [Math.ceil(130 / MMA_QUERY_TILE), 4, 2], shmem: mmaForwardSmem(128) }]);
  assert.ok(mmaForwardSmem(128) <= SMEM_DEFAULT, 'no opt-in needed up to head dim 128');
  assert.deepEqual(run('mma', 256).map((l) => l.fn), ['attention_fwd']);
  assert.deepEqual(run(undefined, 128).map((l) => l.fn), ['attention_fwd']);
  assert.deepEqual(run('simt', 64).map((l) => l.fn), ['attention_fwd']);
});
