/**
 * Generation's cached attention on CUDA, without a GPU: which kernel a call launches (cachedAttentionKernel: a block per
 * query head below CACHED_GQA_MIN_BLOCKS (query row, KV head) pairs into a cache shorter than CACHED_GQA_LONG_ROWS, or than
 * CACHED_GQA_SMALL_GROUP_ROWS at a group up to CACHED_GQA_SMALL_GROUP, else one per KV head for its group), the layout
 * cachedAttentionPlan picks for the group kernel (8-element loads only where rows are 16-byte aligned, the merge's shared
 * memory and the registers within bounds) and, for a large grid, the layout of fewest waves by the driver's occupancy
 * (cachedAttentionLargeLayouts, cachedAttentionPickLayout), how many blocks a short grid's cache rows split over
 * (cachedAttentionSplits, then cachedAttentionPickSplits), and that a backend launches that many (grid t·splits × nKv × B)
 * once prepare() has sized the split scratch for the run, and as many as fit before. The kernels' numbers: seqpos-emulated.test.ts (host emulator, opt-in) and generation-gpu /
 * flash-attention-bf16 (GPU).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SMEM_DEFAULT } from '../../src/backend/cuda/kernels/attention.js';
import {
  CACHED_COUNTERS, CACHED_GQA_LONG_ROWS, CACHED_GQA_MAX_GROUP, CACHED_GQA_MIN_BLOCKS, CACHED_GQA_SMALL_GROUP, CACHED_GQA_SMALL_GROUP_ROWS, CACHED_SMALL_GRID, cachedAttentionGqaSmem, attentionCachedGqa, cachedAttentionBlock, cachedAttentionKernel, cachedAttentionLargeLayouts, cachedAttentionPickLayout, cachedAttentionPickSplits, cachedAttentionPlan, cachedAttentionSplits, type CachedAttnPlan,
} from '../../src/backend/cuda/kernels/attention-cached.js';
import { CudaBackend } from '../../src/backend/cuda/cuda-backend.js';
import { KernelCache } from '../../src/backend/cuda/kernel-cache.js';
import { DEFAULT_ATTN_CACHED_FLOATS, attentionScratchSizes } from '../../src/backend/cuda/attention-plan.js';
import { planKernels } from '../../src/backend/cuda/plan.js';
import { findNvcc } from '../../src/backend/cuda/nvcc.js';
import type { KernelSpec } from '../../src/backend/cuda/kernels/spec.js';
import type { Backend } from '../../src/backend/backend.js';
import { FakeCompiler, fakeCublas, fakeDriver } from './helpers.js';

test('cachedAttentionPlan: 8-element loads only for aligned rows of a head dim that is a multiple of 8; the merge fits 32 KiB and a block a register file', () => {
  for (let hd = 8; hd <= 256; hd += 4) {
    for (let g = 1; g <= CACHED_GQA_MAX_GROUP; g++) {
      for (const aligned of [true, false]) {
        const p = cachedAttentionPlan(hd, g, aligned);
        assert.equal(p.vec, aligned && hd % 8 === 0 ? 8 : 1, `hd ${hd} group ${g} aligned ${aligned}`);
        assert.ok(p.block >= 32 && p.block <= 512 && (p.block & (p.block - 1)) === 0, `block ${p.block}`);
        assert.ok((p.block / 32) * g * (hd + 2) * 4 <= 32 * 1024 || p.block === 32, `hd ${hd} group ${g}: the merge's shared memory`);
        assert.ok([1, 2, 4].includes(p.un));
        // the generated source compiles to the layout asked for (the spec's own check of its parameters)
        assert.match(attentionCachedGqa.make({ headDim: hd, group: g, ...p, out: 'f32', q: 'f32', kc: 'f32', vc: 'f32', seqPos: false }).source(),
          new RegExp(`#define VEC ${p.vec}\\n`));
      }
    }
  }
  // the shapes generation runs: Qwen2.5-0.5B (14/2 heads, hd 64) and Qwen3-0.6B (16/8, hd 128)
  assert.deepEqual(cachedAttentionPlan(64, 7, true), { block: 256, vec: 8, un: 1 });
  assert.deepEqual(cachedAttentionPlan(128, 2, true), { block: 256, vec: 8, un: 4 });
  assert.deepEqual(cachedAttentionPlan(128, 4, true), { block: 256, vec: 8, un: 2 }, 'Llama-3-8B');
  // a small grid keeps 4 rows in flight a slot where the registers allow (Qwen2.5-1.5B's 12/2 heads, hd 128, too)
  for (const [hd, g] of [[64, 7], [128, 2], [128, 4], [128, 6]] as const) {
    assert.deepEqual(cachedAttentionPlan(hd, g, true, CACHED_SMALL_GRID), { block: 256, vec: 8, un: 4 }, `hd ${hd} group ${g}, small grid`);
    assert.deepEqual(cachedAttentionPlan(hd, g, true, CACHED_SMALL_GRID + 1), cachedAttentionPlan(hd, g, true), `hd ${hd} group ${g}, large grid`);
  }
  // a small grid's layout never has a larger block than a large one's (the backend checks the shared memory of the latter)
  for (let hd = 8; hd <= 512; hd += 4) for (let g = 1; g <= CACHED_GQA_MAX_GROUP; g++) for (const aligned of [true, false]) {
    const small = cachedAttentionPlan(hd, g, aligned, 1), large = cachedAttentionPlan(hd, g, aligned);
    assert.ok(small.block <= large.block && small.un >= large.un && small.vec === large.vec, `hd ${hd} group ${g} aligned ${aligned}`);
  }
});

test('cachedAttentionSplits: a grid of CACHED_COUNTERS blocks or more is not split; a shorter one splits toward it, at most one split per 64 rows of the cache and 16', () => {
  assert.equal(cachedAttentionSplits(64, 1, 8, 4096), 1, 'Qwen3-0.6B at batch 64: 512 blocks');
  assert.equal(cachedAttentionSplits(128, 1, 2, 4096), 1, '256 blocks');
  assert.equal(cachedAttentionSplits(64, 1, 2, 4096), 2, '128 blocks');
  assert.equal(cachedAttentionSplits(8, 1, 2, 384), 6, 'Qwen2.5-0.5B at batch 8, a cache of 384: 6 runs of 64 rows');
  assert.equal(cachedAttentionSplits(8, 1, 2, 4096), 16, 'at most 16');
  assert.equal(cachedAttentionSplits(1, 1, 1, 40), 1, 'a cache of fewer than 65 rows');
  assert.equal(cachedAttentionSplits(1, 3, 8, 1000), 11, 'a prefill chunk of 3 rows: 24 blocks');
  for (const [b, t, kv, tm] of [[1, 1, 1, 1], [3, 5, 7, 11], [200, 1, 1, 100000], [1, 255, 1, 70000]]) {
    const s = cachedAttentionSplits(b!, t!, kv!, tm!);
    assert.ok(s >= 1 && s <= 16 && (s === 1 || b! * t! * kv! < CACHED_COUNTERS), `${b} ${t} ${kv} ${tm}: ${s}`);
  }
});

/** One decode call of cached attention at a shape whose splits outgrow the default scratch (64 sequences, 1 KV head). */
const B = 64, NH = 16, NKV = 1, HD = 256, TMAX = 4096;
const decode = (be: Backend): void => {
  const q = be.alloc(B * NH * HD, 'q', 'bf16'), out = be.alloc(B * NH * HD, 'out', 'bf16');
  const kc = be.alloc(B * TMAX * NKV * HD, 'kc', 'bf16'), vc = be.alloc(B * TMAX * NKV * HD, 'vc', 'bf16');
  be.attentionCached(out, q, kc, vc, B, 1, TMAX - 1, TMAX, NH, NKV, HD);
};

test('a device backend splits as many times as its scratch holds, and prepare() sizes the scratch so that the run splits as planned', async () => {
  const want = cachedAttentionSplits(B, 1, NKV, TMAX), per = B * NH * (HD + 2);
  assert.equal(want, 4);
  assert.equal(cachedAttentionKernel(B, 1, NKV, NH / NKV, TMAX), 'gqa');
  const need = CACHED_COUNTERS + want * per;
  assert.ok(need > DEFAULT_ATTN_CACHED_FLOATS, 'the shape needs more than the default');
  // `sealedWith`: a strict cache pre-warmed with these kernels (a miss throws)
  const grids = async (prepare: boolean, cachedFloats?: number, sealedWith?: KernelSpec[]): Promise<number[][]> => {
    const launches: number[][] = [];
    const driver = Object.assign(fakeDriver(), {
      launch: (fn: unknown, grid: readonly [number, number, number]) => { if (String(fn) === 'attention_cached_gqa') launches.push([...grid]); },
    });
    const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: prepare || sealedWith !== undefined, log: () => {} });
    const be = new CudaBackend('device', { driver, cublas: fakeCublas(), cache, log: () => {}, ...(cachedFloats ? { attnCachedFloats: cachedFloats } : {}) });
    try {
      if (sealedWith) await cache.prewarm(sealedWith);
      if (prepare) await be.prepare([decode]);
      decode(be);
      assert.equal(be.scratchNeed.cached, need, 'the call records what its splits need');
    } finally { be.dispose(); }
    return launches;
  };
  const fit = Math.floor((DEFAULT_ATTN_CACHED_FLOATS - CACHED_COUNTERS) / per);
  assert.deepEqual(await grids(false), [[fit >= 2 ? fit : 1, NKV, B]], `unprepared: the ${fit} splits the default scratch holds`);
  assert.deepEqual(await grids(true), [[want, NKV, B]], 'prepared: every split');
  {
    // one backend: the call before prepare() takes the splits the default scratch holds, the same call after it every
    // split (how a shape launches is decided once per scratch size, not once)
    const launches: number[][] = [];
    const driver = Object.assign(fakeDriver(), {
      launch: (fn: unknown, grid: readonly [number, number, number]) => { if (String(fn) === 'attention_cached_gqa') launches.push([...grid]); },
    });
    const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: false, log: () => {} });
    const be = new CudaBackend('device', { driver, cublas: fakeCublas(), cache, log: () => {} });
    try {
      decode(be);
      await be.prepare([decode]);
      decode(be);
    } finally { be.dispose(); }
    const fitDefault = Math.floor((DEFAULT_ATTN_CACHED_FLOATS - CACHED_COUNTERS) / per);
    assert.deepEqual(launches, [[fitDefault >= 2 ? fitDefault : 1, NKV, B], [want, NKV, B]]);
  }
  assert.deepEqual(await grids(false, CACHED_COUNTERS + per + 1), [[1, NKV, B]], 'room for one split: none');
  assert.deepEqual(await grids(false, CACHED_COUNTERS + 2 * per), [[2, NKV, B]], 'room for two');
  // the sizes prepare() and a dry run's plan derive from the need
  assert.equal(attentionScratchSizes({ dsum: 0, dkv: 0, ds: 0, cached: need })?.cached, need);
  assert.equal(attentionScratchSizes({ dsum: 0, dkv: 0, ds: 0, cached: 5 })?.cached, DEFAULT_ATTN_CACHED_FLOATS, 'never below the default');
  assert.equal(attentionScratchSizes({ dsum: 0, dkv: 0, ds: 0, cached: 0 }), null, 'nothing to size');
  // the split and unsplit calls launch the same kernel, so the plan (traced without any scratch) serves both
  const plan = planKernels([decode]);
  assert.deepEqual(await grids(false, CACHED_COUNTERS + per + 1, plan), [[1, NKV, B]], 'unsplit, from the plan');
  assert.deepEqual(await grids(false, need, plan), [[want, NKV, B]], 'split, from the plan');
});

/** One attentionCached call on a fake device: its launches, and the kernels it compiled (their specs' describe()). */
function callOf(b: number, t: number, nH: number, nKv: number, hd: number, tMax: number, cachedFloats?: number, dt: 'f32' | 'bf16' = 'f32'): { launches: Array<{ fn: string; grid: number[]; block: number }>; compiled: string[] } {
  const launches: Array<{ fn: string; grid: number[]; block: number }> = [];
  const driver = Object.assign(fakeDriver(), {
    launch: (fn: unknown, grid: readonly [number, number, number], block: number) => { launches.push({ fn: String(fn), grid: [...grid], block }); },
  });
  const compiler = new FakeCompiler();
  const cache = new KernelCache({ compiler, arch: 'sm_90', dir: null, strict: false, log: () => {} });
  const be = new CudaBackend('device', { driver, cublas: fakeCublas(), cache, log: () => {}, ...(cachedFloats ? { attnCachedFloats: cachedFloats } : {}) });
  try {
    const q = be.alloc(b * t * nH * hd, 'q', dt), out = be.alloc(b * t * nH * hd, 'out', dt);
    const kc = be.alloc(b * tMax * nKv * hd, 'kc', dt), vc = be.alloc(b * tMax * nKv * hd, 'vc', dt);
    be.attentionCached(out, q, kc, vc, b, t, tMax - t, tMax, nH, nKv, hd);
  } finally { be.dispose(); }
  return { launches, compiled: compiler.labels };
}
const specOf = (hd: number, group: number, plan: CachedAttnPlan, seqPos = false): KernelSpec =>
  attentionCachedGqa.make({ headDim: hd, group, ...plan, out: 'f32', q: 'f32', kc: 'f32', vc: 'f32', seqPos });
const launchesOf = (b: number, t: number, nH: number, nKv: number, hd: number, tMax: number): Array<{ fn: string; grid: number[]; block: number }> =>
  callOf(b, t, nH, nKv, hd, tMax).launches;

test('a grid of at most CACHED_SMALL_GRID blocks launches the group kernel with the small grid\'s layout (more rows in flight), a larger one with the register budget\'s', () => {
  for (const [b, nH, nKv, hd, tMax, small] of [[1, 14, 2, 64, 4096, true], [8, 14, 2, 64, 4096, false], [1, 12, 2, 128, 1024, true], [1, 32, 8, 128, 4096, true],
    [64, 16, 8, 128, 1024, false], [2, 32, 8, 128, 4096, false]] as const) {
    const blocks = cachedAttentionSplits(b, 1, nKv, tMax) * nKv * b;
    assert.equal(blocks <= CACHED_SMALL_GRID, small, `${b} x ${nH}/${nKv} heads at ${tMax} rows: ${blocks} blocks`);
    const plan = cachedAttentionPlan(hd, nH / nKv, true, blocks);
    const want = attentionCachedGqa.make({ headDim: hd, group: nH / nKv, ...plan, out: 'f32', q: 'f32', kc: 'f32', vc: 'f32', seqPos: false }).describe();
    const { launches, compiled } = callOf(b, 1, nH, nKv, hd, tMax);
    // the call loads each layout it may take, to read their occupancy (the fake driver's fills any grid in one wave: the
    // most splits and the plan's layout): the large grid's, and the small grid's of fewer splits
    assert.ok(compiled.includes(want), `${want} among ${compiled.join('; ')}`);
    const may = new Set([cachedAttentionPlan(hd, nH / nKv, true, 1), ...cachedAttentionLargeLayouts(hd, nH / nKv, true)].map((p) => specOf(hd, nH / nKv, p).describe()));
    for (const c of compiled) assert.ok(may.has(c), c);
    if (cachedAttentionSplits(b, 1, nKv, tMax) === 1) assert.deepEqual(compiled, small ? [want] : cachedAttentionLargeLayouts(hd, nH / nKv, true).map((p) => specOf(hd, nH / nKv, p).describe()));
    assert.deepEqual(launches.map((l) => l.block), [plan.block]);
    if (small) assert.notDeepEqual(plan, cachedAttentionPlan(hd, nH / nKv, true), 'the small grid\'s layout differs here');
  }
  // the grid the call launches decides, not the one it planned: 16 splits of 8 x 2 pairs (256 blocks) cut to the 4 a
  // smaller scratch holds (64 blocks) take the small grid's layout
  const [b, nH, nKv, hd, tMax] = [8, 14, 2, 64, 4096], per = b * nH * (hd + 2);
  assert.equal(cachedAttentionSplits(b, 1, nKv, tMax) * nKv * b > CACHED_SMALL_GRID, true);
  const { launches, compiled } = callOf(b, 1, nH, nKv, hd, tMax, CACHED_COUNTERS + 4 * per);
  const small = cachedAttentionPlan(hd, nH / nKv, true, 4 * nKv * b);
  assert.equal(small.un, 4);
  assert.deepEqual(launches, [{ fn: 'attention_cached_gqa', grid: [4, nKv, b], block: small.block }]);
  assert.deepEqual(compiled, [attentionCachedGqa.make({ headDim: hd, group: nH / nKv, ...small, out: 'f32', q: 'f32', kc: 'f32', vc: 'f32', seqPos: false }).describe()]);
});

test('a large grid\'s layouts: the plan\'s, then half the rows in flight down to 1 at its block; it launches the one that fits the grid in the fewest waves, then the most rows in flight', () => {
  for (let hd = 8; hd <= 256; hd += 8) for (let g = 1; g <= CACHED_GQA_MAX_GROUP; g++) for (const aligned of [true, false]) {
    const plan = cachedAttentionPlan(hd, g, aligned), large = cachedAttentionLargeLayouts(hd, g, aligned);
    assert.deepEqual(large[0], plan);
    assert.deepEqual(large.map((p) => p.un), [4, 2, 1].filter((u) => u <= plan.un), `hd ${hd} group ${g}`);
    for (const p of large) assert.ok(p.block === plan.block && p.vec === plan.vec);
  }
  // the registers nvcc 13 gives each layout for sm_90 and the blocks an SM holds at 256 threads
  // (docs/measurements/generation/nvcc-2026-11-30-attention-cached-gqa-registers.txt), on an H200's 132 SMs
  const qwen3 = [2, 3, 4], llama8b = [2, 2];
  assert.deepEqual(cachedAttentionLargeLayouts(128, 2, true).map((p) => p.un), [4, 2, 1], 'Qwen3-0.6B');
  assert.deepEqual(cachedAttentionLargeLayouts(128, 4, true).map((p) => p.un), [2, 1], 'Llama-3-8B');
  assert.equal(cachedAttentionPickLayout(512, 132, qwen3), 2, 'Qwen3-0.6B at batch 64: 1 row in flight fits one wave (measured 25.4 us against 31.5)');
  assert.equal(cachedAttentionPickLayout(256, 132, qwen3), 0, 'at 256 blocks every layout is one wave: 4 rows (11.3 us against 15.0)');
  assert.equal(cachedAttentionPickLayout(512, 132, llama8b), 0, 'Llama-3-8B at batch 64: two waves either way, 2 rows (44.0 us against 53.1)');
  assert.equal(cachedAttentionPickLayout(512, 108, qwen3), 1, 'on 108 SMs 2 rows and 1 row both take two waves (4 rows three): 2 rows');
  assert.equal(cachedAttentionPickLayout(10, 132, [0, 1]), 1, 'a layout an SM cannot hold is passed over');
  assert.equal(cachedAttentionPickLayout(10, 132, [0, 0]), 0, 'none can be held: the first, whose launch names the error');
});

/**
 * Decode calls (one query row a sequence) of cached attention at batch `b` on a fake device of `sms` SMs, pre-warmed from a
 * trace into a sealed cache: the rows in flight (un) of the layout each call launched and its grid. The driver's occupancy
 * is `occ(un)` for each compiled layout (each function the fake loads knows the kernel compiled for it; attention_cached_mma,
 * which has no rows in flight, is `occ[0]`). Operands f32 (attention_cached_gqa) unless `dt` is bf16.
 */
async function decodeOn(nH: number, nKv: number, hd: number, tMax: number, b: number, sms: number, occ: Record<number, number>, dt: 'f32' | 'bf16' = 'f32'): Promise<{ uns: number[]; grids: number[][] }> {
  const call = (x: Backend): void => {
    const q = x.alloc(b * nH * hd, 'q', dt), out = x.alloc(b * nH * hd, 'out', dt);
    const kc = x.alloc(b * tMax * nKv * hd, 'kc', dt), vc = x.alloc(b * tMax * nKv * hd, 'vc', dt);
    x.attentionCached(out, q, kc, vc, b, 1, tMax - 1, tMax, nH, nKv, hd);
  };
  const uns: number[] = [], grids: number[][] = [];
  const compiler = new FakeCompiler();
  type Fn = { entry: string; un: number; block: number };
  const driver = Object.assign(fakeDriver(), {
    smCount: sms,
    loadFunction: (cubin: Uint8Array, entry: string) => {
      const label = compiler.labelOf(cubin);
      return { module: {}, fn: { entry, un: Number(/ un=(\d)/.exec(label)?.[1] ?? 0), block: Number(/ block=(\d+)/.exec(label)?.[1] ?? 0) } };
    },
    occupancy: (fn: unknown, block: number) => { assert.equal(block, (fn as Fn).block, 'the block the layout launches with'); return occ[(fn as Fn).un]!; },
    launch: (fn: unknown, grid: readonly [number, number, number]) => { if ((fn as Fn).entry.startsWith('attention_cached_')) { uns.push((fn as Fn).un); grids.push([...grid]); } },
  });
  const cache = new KernelCache({ compiler, arch: 'sm_90', dir: null, strict: true, log: () => {} });
  const be = new CudaBackend('device', { driver, cublas: fakeCublas(), cache, log: () => {} });
  try {
    await be.prepare([call]);
    call(be);
    call(be);
    assert.equal(cache.counters.missesAfterSeal, 0);
  } finally { be.dispose(); }
  return { uns, grids };
}

test('a device backend launches a large grid\'s layout by the occupancy its driver reports for each compiled layout and its SM count, from a sealed pre-warmed cache', async () => {
  const [nH, nKv, hd, tMax] = [16, 8, 128, 1024];
  const launched = async (b: number, sms: number, occ: Record<number, number>): Promise<number[]> => (await decodeOn(nH, nKv, hd, tMax, b, sms, occ)).uns;
  assert.equal(cachedAttentionSplits(64, 1, nKv, tMax) * nKv * 64, 512);
  // Qwen3-0.6B's compiled layouts hold 2, 3 and 4 blocks an SM (4, 2 and 1 rows in flight)
  const qwen3 = { 4: 2, 2: 3, 1: 4 };
  assert.deepEqual(await launched(64, 132, qwen3), [1, 1], 'batch 64 on 132 SMs: one wave at 1 row in flight');
  assert.deepEqual(await launched(64, 264, qwen3), [4, 4], 'on twice the SMs every layout is one wave: 4 rows');
  assert.deepEqual(await launched(32, 132, qwen3), [4, 4], 'batch 32 (256 blocks): one wave each, 4 rows');
  assert.deepEqual(await launched(64, 132, { 4: 1, 2: 4, 1: 4 }), [2, 2], 'a tie between 2 rows and 1: 2');
});

test('of the splits the scratch holds, a call launches the count that runs its grid in the fewest waves, then the most (cachedAttentionPickSplits)', async () => {
  // Qwen2.5-0.5B's 14/2 heads: the small grid's layout (4 rows in flight) holds 1 block an SM, the large grid's (1 row) 2
  // (nvcc 13, sm_90); on an H200's 132 SMs
  const half = (blocks: number): number => (blocks <= CACHED_SMALL_GRID ? 1 : 2);
  const cases: Array<[number, number, number]> = [[12, 11, 11], [24, 6, 5], [40, 4, 3], [48, 3, 2], [64, 2, 2], [8, 16, 16]];
  for (const [b, most, want] of cases) {
    assert.equal(cachedAttentionSplits(b, 1, 2, 4096), most, `batch ${b}`);
    assert.equal(cachedAttentionPickSplits(most, 2 * b, 132, half), want, `Qwen2.5-0.5B at batch ${b}`);
  }
  // Llama-3-8B's 32/8 heads (both large layouts 2 an SM; the small grid's 1): batch 12's 3 splits (288 blocks) are two
  // waves, 2 one; batch 24's 2 (384) two, unsplit (192) one
  assert.equal(cachedAttentionPickSplits(3, 96, 132, half), 2);
  assert.equal(cachedAttentionPickSplits(2, 192, 132, half), 1);
  assert.equal(cachedAttentionPickSplits(16, 1, 132, () => 1), 16, 'a grid far below the SMs: every count one wave, the most');
  assert.equal(cachedAttentionPickSplits(4, 100, 132, (n) => (n <= 200 ? 0 : 2)), 4, 'a count whose layout no SM holds is passed over');
  // through a device backend, each count's layout from its occupancy: Qwen2.5-0.5B at batch 48 launches 2 splits of its
  // large layout, at 24 five, at 12 eleven
  const small = cachedAttentionPlan(64, 7, true, 1), large = cachedAttentionPlan(64, 7, true);
  assert.ok(small.un === 4 && large.un === 1 && small.block === large.block);
  for (const [b, want] of [[48, 2], [24, 5], [12, 11]] as const) {
    const { uns, grids } = await decodeOn(14, 2, 64, 4096, b, 132, { 4: 1, 1: 2 });
    assert.deepEqual(grids, [[want, 2, b], [want, 2, b]], `batch ${b}`);
    assert.deepEqual(uns, [1, 1]);
  }
  // on a GPU twice the size every count is one wave: the most
  assert.deepEqual((await decodeOn(14, 2, 64, 4096, 48, 264, { 4: 1, 1: 2 })).grids[0], [3, 2, 48]);
});

test('a call of fewer than CACHED_GQA_MIN_BLOCKS (query row, KV head) pairs, unless its GQA group reads a cache of CACHED_GQA_LONG_ROWS rows or more (CACHED_GQA_SMALL_GROUP_ROWS up to CACHED_GQA_SMALL_GROUP), or of a group past CACHED_GQA_MAX_GROUP, launches a block per query head, else a block per KV head', () => {
  assert.equal(CACHED_GQA_LONG_ROWS > 300, true, 'the short cache below is short');
  assert.equal(CACHED_GQA_SMALL_GROUP_ROWS > 100 && CACHED_GQA_SMALL_GROUP_ROWS < 300, true, 'the capacities below cross both thresholds');
  for (const tMax of [100, 300, CACHED_GQA_LONG_ROWS - 1, CACHED_GQA_LONG_ROWS]) for (const [b, t, nH, nKv, hd] of [[8, 1, 14, 2, 64], [1, 3, 16, 8, 128], [8, 1, 16, 8, 128], [64, 1, 14, 2, 64], [4, 4, 32, 4, 128], [2, 1, 4, 4, 64],
    [64, 1, 64, 2, 64], [1, 1, 14, 2, 64], [1, 1, 16, 8, 128], [4, 1, 4, 4, 64], [1, 1, 12, 12, 64], [2, 1, 12, 4, 128], [2, 1, 8, 4, 64]] as const) {
    const gqa = (b * t * nKv >= CACHED_GQA_MIN_BLOCKS || (nH > nKv && (tMax >= CACHED_GQA_LONG_ROWS || (nH / nKv <= CACHED_GQA_SMALL_GROUP && tMax >= CACHED_GQA_SMALL_GROUP_ROWS))))
      && nH / nKv <= CACHED_GQA_MAX_GROUP;
    assert.equal(cachedAttentionKernel(b, t, nKv, nH / nKv, tMax), gqa ? 'gqa' : 'head');
    assert.deepEqual(launchesOf(b, t, nH, nKv, hd, tMax), [gqa
      ? { fn: 'attention_cached_gqa', grid: [t * cachedAttentionSplits(b, t, nKv, tMax), nKv, b], block: cachedAttentionPlan(hd, nH / nKv, true, t * cachedAttentionSplits(b, t, nKv, tMax) * nKv * b).block }
      : { fn: 'attention_cached', grid: [t, nH, b], block: cachedAttentionBlock(hd) }]);
  }
});

test('pre-warmed from one call, a sealed cache serves the calls of fewer sequences and of more rows that the run makes (a last, shorter group; a chunk), over f32 operands (attention_cached_gqa) and bf16 (attention_cached_mma)', async () => {
  for (const dt of ['f32', 'bf16'] as const) for (const tMax of [128, 256, CACHED_GQA_LONG_ROWS]) for (const [nH, nKv, hd, traced] of [[16, 8, 128, 8], [32, 8, 128, 8], [14, 2, 64, 64], [14, 2, 64, 1]] as const) {
    const group = dt === 'bf16' ? 'attention_cached_mma' : 'attention_cached_gqa', other = dt === 'bf16' ? 'attention_cached_gqa' : 'attention_cached_mma';
    const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: true, log: () => {} });
    const be = new CudaBackend('device', { driver: fakeDriver(), cublas: fakeCublas(), cache, log: () => {} });
    const call = (b: number, t: number, seqPos: boolean) => (x: Backend): void => {
      const q = x.alloc(b * t * nH * hd, 'q', dt), out = x.alloc(b * t * nH * hd, 'out', dt);
      const kc = x.alloc(b * tMax * nKv * hd, 'kc', dt), vc = x.alloc(b * tMax * nKv * hd, 'vc', dt);
      const pos = x.allocInt(b, 'pos');
      x.attentionCached(out, q, kc, vc, b, t, seqPos ? { seqPositions: pos } : Math.min(100, tMax - t), tMax, nH, nKv, hd);
    };
    try {
      await be.prepare([call(traced, 1, true), call(1, 1, false)]);
      // every call a run of this shape can make: fewer sequences than traced, a chunk of rows at a position
      for (const b of [1, 2, 7, 8, 32, 64]) if (b <= traced) call(b, 1, true)(be);
      for (const t of [1, 3, 64, 100]) call(1, t, false)(be);
      assert.equal(cache.counters.missesAfterSeal, 0, `heads ${nH}/${nKv}, traced at ${traced} sequences, ${tMax} rows`);
      // a short cache (shorter at a group up to CACHED_GQA_SMALL_GROUP): fewer sequences than traced take
      // attention_cached; a long one takes the group kernel throughout, and so does a GQA group on the tensor cores
      if (dt === 'f32' && tMax < (nH / nKv <= CACHED_GQA_SMALL_GROUP ? CACHED_GQA_SMALL_GROUP_ROWS : CACHED_GQA_LONG_ROWS)) assert.ok((be.launches.get(group) ?? 0) > 0 && (be.launches.get('attention_cached') ?? 0) > 0, 'both kernels ran');
      else assert.ok((be.launches.get(group) ?? 0) > 0 && (be.launches.get('attention_cached') ?? 0) === 0, 'the group kernel only');
      assert.equal(be.launches.get(other) ?? 0, 0, `${dt} operands never launch ${other}`);
    } finally { be.dispose(); }
  }
});

test('attention_cached_gqa fits the static 48 KiB at every plan of a head dim up to 256; past it (head dim 736, group 16) a call takes attention_cached', () => {
  for (let hd = 8; hd <= 256; hd += 4) for (let g = 1; g <= CACHED_GQA_MAX_GROUP; g++) {
    assert.ok(cachedAttentionGqaSmem(hd, g, cachedAttentionPlan(hd, g, true).block) <= SMEM_DEFAULT, `hd ${hd} group ${g}`);
  }
  const [b, nH, nKv, hd, tMax] = [64, 32, 2, 736, 64];
  assert.ok(cachedAttentionGqaSmem(hd, nH / nKv, cachedAttentionPlan(hd, nH / nKv, true).block) > SMEM_DEFAULT);
  assert.equal(cachedAttentionKernel(b, 1, nKv, nH / nKv, tMax), 'gqa', 'the pairs alone would take the group kernel');
  assert.deepEqual(launchesOf(b, 1, nH, nKv, hd, tMax).map((l) => l.fn), ['attention_cached']);
});

const nvcc = findNvcc();
test('cachedAttentionGqaSmem is the shared memory ptxas reports for the generated source (sm_90)', { skip: nvcc ? false : 'nvcc not found' }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'dk-smem-'));
  try {
    for (const [hd, g] of [[64, 7], [128, 16], [512, 16], [40, 3]] as const) {
      const p = cachedAttentionPlan(hd, g, true);
      const src = join(dir, `k${hd}-${g}.cu`);
      writeFileSync(src, attentionCachedGqa.make({ headDim: hd, group: g, ...p, out: 'f32', q: 'f32', kc: 'f32', vc: 'f32', seqPos: true }).source());
      const r = spawnSync(nvcc!.path, ['-arch=sm_90', '-cubin', '--resource-usage', '-o', join(dir, 'k.cubin'), src], { encoding: 'utf8' });
      const m = /(\d+) bytes smem/.exec(`${r.stdout}${r.stderr}`);
      assert.ok(m, `ptxas reported no shared memory for hd ${hd} group ${g}: ${r.stderr}`);
      assert.equal(Number(m[1]), cachedAttentionGqaSmem(hd, g, p.block), `hd ${hd} group ${g} block ${p.block}`);
    }
  } finally { rmSync(dir, { recursive: true, force: true }); }
});
