/**
 * Generation's tensor-core cached attention (attention_cached_mma) on CUDA, without a GPU: which calls take it (bf16
 * operands, rows 16-byte aligned, head dims 64 and 128, GQA groups up to 16; a GQA group at any size), its split count
 * (cachedAttentionSplits with CACHED_MMA_MIN_ROWS, then the waves), which compiled variant a grid launches
 * (cachedMmaPickVariant: fewest waves, then no spills, then the most registers) from a sealed pre-warmed cache, and that
 * every other call keeps attention_cached_gqa or attention_cached. The kernel's numbers: cached-mma-emulated.test.ts (host
 * emulator, opt-in) and flash-attention-bf16 / generation-gpu (GPU).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  CACHED_MMA_MIN_BLOCKS, CACHED_MMA_MIN_ROWS, CACHED_MMA_THREADS, cachedMmaPickVariant, cachedMmaShape,
} from '../../src/backend/cuda/kernels/attention-cached-mma.js';
import { cachedAttentionKernel, cachedAttentionSplits } from '../../src/backend/cuda/kernels/attention-cached.js';
import { CudaBackend } from '../../src/backend/cuda/cuda-backend.js';
import { KernelCache } from '../../src/backend/cuda/kernel-cache.js';
import type { Backend, DType } from '../../src/backend/backend.js';
import { FakeCompiler, fakeCublas, fakeDriver } from './helpers.js';

test('cachedMmaPickVariant: the fewest waves, then no local memory, then the most registers, then the first', () => {
  // Qwen3-0.6B's head dim 128 on an H200's 132 SMs: unbounded 152 registers, 3 an SM; bounded to 4, 128 registers and a spill
  const hd128 = [{ blocksPerSm: 3, registers: 152, localBytes: 0 }, { blocksPerSm: 4, registers: 128, localBytes: 72 }];
  assert.equal(cachedMmaPickVariant(384, 132, hd128), 0, 'batch 48 (384 blocks): one wave each, the variant that spills nothing');
  assert.equal(cachedMmaPickVariant(512, 132, hd128), 1, 'batch 64 (512 blocks): two waves at 3 an SM, one at 4');
  assert.equal(cachedMmaPickVariant(512, 200, hd128), 0, 'one wave each on more SMs');
  // head dim 64: unbounded 91 registers (5 an SM), bounded 120 (4 an SM), neither spills
  const hd64 = [{ blocksPerSm: 5, registers: 91, localBytes: 0 }, { blocksPerSm: 4, registers: 120, localBytes: 0 }];
  assert.equal(cachedMmaPickVariant(128, 132, hd64), 1, 'one wave each: the more registers');
  assert.equal(cachedMmaPickVariant(600, 132, hd64), 0, '600 blocks: one wave at 5 an SM, two at 4');
  assert.equal(cachedMmaPickVariant(10, 132, [{ blocksPerSm: 2, registers: 100, localBytes: 0 }, { blocksPerSm: 2, registers: 100, localBytes: 0 }]), 0, 'a tie: the first');
  assert.equal(cachedMmaPickVariant(10, 132, [{ blocksPerSm: 0, registers: 255, localBytes: 0 }, { blocksPerSm: 1, registers: 64, localBytes: 8 }]), 1, 'a variant no SM holds is passed over');
});

test('cachedMmaShape and the kernel rule: head dims 64 and 128, groups 1 to 16; on the tensor cores a GQA group takes the group kernel at any size', () => {
  for (const hd of [32, 48, 64, 80, 96, 128, 192, 256]) for (const g of [1, 2, 7, 16, 17]) assert.equal(cachedMmaShape(hd, g), (hd === 64 || hd === 128) && g <= 16, `hd ${hd} group ${g}`);
  // a call the SIMT rule gives a block per query head: a few sequences over a short cache
  assert.equal(cachedAttentionKernel(1, 1, 2, 7, 128), 'head');
  assert.equal(cachedAttentionKernel(1, 1, 2, 7, 128, true), 'gqa');
  assert.equal(cachedAttentionKernel(1, 1, 4, 1, 128, true), 'head', 'no group (MHA): the SIMT rule');
  assert.equal(cachedAttentionKernel(1, 1, 1, 17, 128, true), 'head', 'past the largest group');
  // splits: one per CACHED_MMA_MIN_ROWS rows of the capacity at most
  assert.equal(cachedAttentionSplits(8, 1, 2, 256, CACHED_MMA_MIN_ROWS), 1, 'Qwen2.5-0.5B at batch 8, 256 rows: unsplit');
  assert.equal(cachedAttentionSplits(8, 1, 2, 1024, CACHED_MMA_MIN_ROWS), 4);
  assert.equal(cachedAttentionSplits(8, 1, 2, 1024), 16, 'the SIMT kernel\'s 64 rows a split');
  assert.equal(cachedAttentionSplits(8, 1, 2, 8192, CACHED_MMA_MIN_ROWS), 16, 'at most 16');
});

interface Launch { fn: string; minBlocks: number; grid: number[]; block: number }

/**
 * Cached-attention calls of `dt` operands (at `offset` elements into their allocations) on a fake device of `sms` SMs
 * whose driver reports, for attention_cached_mma's variant bounded to `minBlocks`, `variants[minBlocks]`, pre-warmed from
 * a trace of the same calls into a sealed cache: the launches.
 */
async function launchesOn(calls: Array<{ b: number; t: number; nH: number; nKv: number; hd: number; tMax: number }>, opts: { dt?: DType; offset?: number; sms?: number;
  variants?: Record<number, { blocksPerSm: number; registers: number; localBytes: number }> } = {}): Promise<Launch[]> {
  const { dt = 'bf16', offset = 0, sms = 132, variants = { 0: { blocksPerSm: 64, registers: 64, localBytes: 0 }, 4: { blocksPerSm: 64, registers: 64, localBytes: 0 } } } = opts;
  const run = (x: Backend): void => {
    for (const { b, t, nH, nKv, hd, tMax } of calls) {
      const view = (n: number, name: string): ReturnType<Backend['alloc']> => x.view(x.alloc(n + offset, name, dt), offset, n);
      x.attentionCached(view(b * t * nH * hd, 'out'), view(b * t * nH * hd, 'q'), view(b * tMax * nKv * hd, 'kc'), view(b * tMax * nKv * hd, 'vc'), b, t, tMax - t, tMax, nH, nKv, hd);
    }
  };
  const compiler = new FakeCompiler();
  type Fn = { entry: string; minBlocks: number };
  const launches: Launch[] = [];
  const driver = Object.assign(fakeDriver(), {
    smCount: sms,
    loadFunction: (cubin: Uint8Array, entry: string) => ({ module: {}, fn: { entry, minBlocks: Number(/ minBlocks=(\d)/.exec(compiler.labelOf(cubin))?.[1] ?? -1) } }),
    occupancy: (fn: unknown, block: number) => {
      const f = fn as Fn;
      if (f.entry !== 'attention_cached_mma') return 64;
      assert.equal(block, CACHED_MMA_THREADS);
      return variants[f.minBlocks]!.blocksPerSm;
    },
    resources: (fn: unknown) => { const v = variants[(fn as Fn).minBlocks]; assert.ok(v, 'only the mma variants are asked for their registers'); return { registers: v.registers, localBytes: v.localBytes }; },
    launch: (fn: unknown, grid: readonly [number, number, number], block: number) => { launches.push({ fn: (fn as Fn).entry, minBlocks: (fn as Fn).minBlocks, grid: [...grid], block }); },
  });
  const cache = new KernelCache({ compiler, arch: 'sm_90', dir: null, strict: true, log: () => {} });
  const be = new CudaBackend('device', { driver, cublas: fakeCublas(), cache, log: () => {} });
  try {
    await be.prepare([run]);
    run(be);
    assert.equal(cache.counters.missesAfterSeal, 0, 'every kernel the calls launch was pre-warmed');
  } finally { be.dispose(); }
  return launches;
}

test('bf16 operands 16-byte aligned at head dims 64 and 128 launch attention_cached_mma (128 threads, t·splits × nKv × B); f32 operands, rows off 16 bytes and other head dims keep the SIMT kernels', async () => {
  const shapes = [
    { name: 'Qwen2.5-0.5B, batch 8, 1024 rows', b: 8, t: 1, nH: 14, nKv: 2, hd: 64, tMax: 1024 },
    { name: 'Qwen3-0.6B, batch 1, 256 rows (a block per query head on the SIMT rule)', b: 1, t: 1, nH: 16, nKv: 8, hd: 128, tMax: 256 },
    { name: 'Llama-3-8B, batch 64, 4096 rows (unsplit)', b: 64, t: 1, nH: 32, nKv: 8, hd: 128, tMax: 4096 },
    { name: 'a prefill chunk of 5 rows, group 16', b: 1, t: 5, nH: 16, nKv: 1, hd: 128, tMax: 300 },
  ];
  for (const s of shapes) {
    const [l] = await launchesOn([s]);
    const splits = cachedAttentionSplits(s.b, s.t, s.nKv, s.tMax, CACHED_MMA_MIN_ROWS);
    assert.deepEqual(l, { fn: 'attention_cached_mma', minBlocks: 0, grid: [s.t * splits, s.nKv, s.b], block: CACHED_MMA_THREADS }, s.name);
  }
  const s = shapes[0]!;
  assert.equal((await launchesOn([s], { dt: 'f32' }))[0]!.fn, 'attention_cached_gqa', 'f32 operands');
  assert.equal((await launchesOn([s], { offset: 4 }))[0]!.fn, 'attention_cached_gqa', 'rows 8 bytes off 16-byte alignment');
  assert.equal((await launchesOn([{ ...s, hd: 80 }]))[0]!.fn, 'attention_cached_gqa', 'head dim 80');
  assert.equal((await launchesOn([{ ...s, nH: 2, nKv: 2, tMax: 128 }]))[0]!.fn, 'attention_cached', 'no group, few pairs, a short cache: a block per query head');
});

test('a grid launches the attention_cached_mma variant the driver\'s occupancy and registers pick, from a sealed cache that holds both', async () => {
  assert.deepEqual([...CACHED_MMA_MIN_BLOCKS], [0, 4]);
  // head dim 128 as compiled for an H200: 3 an SM unbounded, 4 bounded with a spill
  const variants = { 0: { blocksPerSm: 3, registers: 152, localBytes: 0 }, 4: { blocksPerSm: 4, registers: 128, localBytes: 72 } };
  const qwen3 = (b: number): { b: number; t: number; nH: number; nKv: number; hd: number; tMax: number } => ({ b, t: 1, nH: 16, nKv: 8, hd: 128, tMax: 4096 });
  const got = await launchesOn([qwen3(48), qwen3(64)], { variants });
  assert.deepEqual(got.map((l) => [l.minBlocks, l.grid]), [[0, [1, 8, 48]], [4, [1, 8, 64]]], 'batch 48 (384 blocks) unbounded; batch 64 (512) bounded');
  // the split count by the waves of the variant each count's grid launches: Qwen2.5-0.5B at batch 48 wants 3 splits of
  // a 4096-row cache (288 blocks); at 1 block an SM on 132 SMs that is three waves, 2 splits two, 1 split one
  const one = { 0: { blocksPerSm: 1, registers: 91, localBytes: 0 }, 4: { blocksPerSm: 1, registers: 120, localBytes: 0 } };
  assert.equal(cachedAttentionSplits(48, 1, 2, 4096, CACHED_MMA_MIN_ROWS), 3);
  const [l] = await launchesOn([{ b: 48, t: 1, nH: 14, nKv: 2, hd: 64, tMax: 4096 }], { variants: one });
  assert.deepEqual([l!.minBlocks, l!.grid], [4, [1, 2, 48]], 'unsplit, the variant with more registers');
});
