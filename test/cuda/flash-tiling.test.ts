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
import { ATTN_BLOCK, CudaBackend } from '../../src/backend/cuda/cuda-backend.js';
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
  for (const hd of [32, 64, 80, 96, 128, 256]) {
    for (const f of [attentionForward, attentionBackwardPre, attentionBackward, attentionBackwardKv]) {
      const src = f.make({ headDim: hd, block: f === attentionBackwardPre ? 256 : ATTN_BLOCK }).source();
      assert.doesNotMatch(src, /atomic/i, `${f.name} hd ${hd}`);
      assert.doesNotMatch(src, /\bprobs\b|T \* T/, `${f.name} hd ${hd}`);
    }
  }
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
