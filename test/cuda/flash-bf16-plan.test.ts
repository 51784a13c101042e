/**
 * No GPU: the bf16 tensor-core attention is picked from operand dtypes and planned exactly as it is launched.
 * - A bf16 step (test/cuda/helpers.ts attentionOpsBf16) plans attention_fwd_bf16, attention_bwd_dq_bf16 and
 *   attention_bwd_dkv_bf16 (head dims 64 and 128), the SIMT kernels with bf16 operands for a head dim the tensor-core
 *   kernels do not take (40), and a device-mode backend pre-warmed from that plan runs it with zero misses (strict),
 *   with either `attention` setting (the bf16 path does not depend on it).
 * - The launches: grid, block and dynamic shared memory of each tensor-core kernel, the opt-in above 48 KiB (once),
 *   the GQA split (S = group size with room for partials, then attention_dkv_reduce; S = 1 without), and the errors
 *   for an lse that is not f32 and for a misaligned bf16 view.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CudaBackend } from '../../src/backend/cuda/cuda-backend.js';
import { DEFAULT_ATTN_BACKWARD, DEFAULT_ATTN_DS_ELEMS, MAX_ATTN_DS_ELEMS, type AttentionBackwardImpl } from '../../src/backend/cuda/attention-plan.js';
import { planKernels } from '../../src/backend/cuda/plan.js';
import { KernelCache } from '../../src/backend/cuda/kernel-cache.js';
import { SMEM_DEFAULT, SMEM_OPT_IN } from '../../src/backend/cuda/kernels/attention.js';
import { FA_KEY_TILE, FA_QUERY_TILE, FA_THREADS, bf16MmaHeadDim, dqDsSmem, dsScratchElems, faSmem } from '../../src/backend/cuda/kernels/attention-bf16.js';
import { FakeCompiler, QWEN_LIKE, attentionOpsBf16, fakeCublas, fakeDriver } from './helpers.js';

/** The tensor-core kernels of a bf16 step, by attention backward (AttentionBackwardImpl). */
const MMA_FAMILIES: Record<AttentionBackwardImpl, string[]> = {
  'stored-ds': ['attention_fwd_bf16', 'attention_bwd_dkv_ds_bf16', 'attention_bwd_dq_ds_bf16'],
  recompute: ['attention_fwd_bf16', 'attention_bwd_dq_bf16', 'attention_bwd_dkv_bf16'],
};

test('bf16 steps plan the tensor-core kernels (hd 64, 128) or the bf16 SIMT kernels (hd 40), and run with zero misses after seal', async () => {
  for (const [hd, nH] of [[64, 14], [128, 12], [40, 14]] as const) {
    const dims = { ...QWEN_LIKE, hd, nH };
    const mma = bf16MmaHeadDim(hd);
    for (const [attention, attnBackward] of [['simt', 'stored-ds'], ['mma', 'stored-ds'], ['simt', 'recompute']] as const) {
      const plan = planKernels([attentionOpsBf16(dims)], { attention, attnBackward });
      const fams = new Set(plan.map((s) => s.family));
      for (const f of MMA_FAMILIES[attnBackward]) assert.equal(fams.has(f), mma, `hd ${hd} ${attnBackward}: ${f} planned`);
      const other = MMA_FAMILIES[attnBackward === 'recompute' ? 'stored-ds' : 'recompute'].filter((f) => !MMA_FAMILIES[attnBackward].includes(f));
      for (const f of other) assert.ok(!fams.has(f), `hd ${hd} ${attnBackward}: ${f} not planned`);
      for (const f of ['attention_fwd', 'attention_bwd', 'attention_bwd_dkv']) assert.equal(fams.has(f), !mma, `hd ${hd}: ${f} planned`);
      assert.ok(!fams.has('attention_fwd_mma'), 'the TF32 forward is for f32 operands only');
      // every float operand of the bf16 step is bf16 (the gradients, the output, the caches): so are the kernels' params
      for (const s of plan) {
        for (const [k, v] of Object.entries(s.params)) if (!['headDim', 'block', 'seqPos', 'accumulate', 'group', 'vec', 'un', 'minBlocks'].includes(k)) assert.equal(v, 'bf16', `${s.describe()}: ${k}`);
      }
      const lines: string[] = [];
      const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: true, log: (l) => lines.push(l) });
      const b = new CudaBackend('device', { driver: fakeDriver(), cublas: fakeCublas(), cache, attention, attnBackward, log: (l) => lines.push(l) });
      await b.prepare([attentionOpsBf16(dims)]);
      attentionOpsBf16(dims)(b);
      assert.equal(cache.counters.missesAfterSeal, 0, lines.join('\n'));
      for (const f of MMA_FAMILIES[attnBackward]) assert.equal((b.launches.get(f) ?? 0) > 0, mma, `hd ${hd} ${attnBackward}: ${f} launched`);
      b.dispose();
    }
  }
});

test('bf16 tensor-core launches: grids, 128 threads, dynamic shared memory (opt-in above 48 KiB, once), GQA split and reduce, both backwards', () => {
  for (const [hd, dkvFloats, split, impl] of [[64, undefined, true, 'recompute'], [128, undefined, true, 'recompute'], [64, 1, false, 'recompute'],
    [64, undefined, true, 'stored-ds'], [128, undefined, true, 'stored-ds'], [64, 1, false, 'stored-ds']] as const) {
    const launches: Array<{ fn: string; grid: readonly number[]; block: number; shmem: number }> = [];
    const allowed: Array<[string, number]> = [];
    const driver = Object.assign(fakeDriver(), {
      launch: (fn: unknown, grid: readonly [number, number, number], block: number, shmem: number) => { launches.push({ fn: String(fn), grid, block, shmem }); },
      setMaxDynamicShared: (fn: unknown, bytes: number) => { allowed.push([String(fn), bytes]); },
    });
    const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: false, log: () => {} });
    const be = new CudaBackend('device', { driver, cublas: fakeCublas(), cache, log: () => {}, attnBackward: impl, ...(dkvFloats ? { attnDkvFloats: dkvFloats } : {}) });
    try {
      const B = 2, T = 130, nH = 14, nKv = 2, G = nH / nKv;
      const bf = (n: number, l: string) => be.alloc(n, l, 'bf16');
      const q = bf(B * T * nH * hd, 'q'), k = bf(B * T * nKv * hd, 'k'), v = bf(B * T * nKv * hd, 'v');
      const out = bf(q.length, 'out'), lse = be.alloc(B * nH * T, 'lse');
      for (let rep = 0; rep < 2; rep++) {
        be.attentionForward(out, lse, q, k, v, B, T, nH, nKv, hd);
        be.attentionBackward(bf(q.length, 'dq'), bf(k.length, 'dk'), bf(v.length, 'dv'), bf(q.length, 'dout'), q, k, v, out, lse, B, T, nH, nKv, hd);
      }
      const S = split ? G : 1;
      const stored = impl === 'stored-ds';
      const want: Record<string, { shmem: number; grid: number[] }> = {
        attention_fwd_bf16: { shmem: faSmem('fwd', hd), grid: [Math.ceil(T / FA_QUERY_TILE), nH, B] },
        [stored ? 'attention_bwd_dq_ds_bf16' : 'attention_bwd_dq_bf16']: { shmem: stored ? dqDsSmem(hd) : faSmem('dq', hd), grid: [Math.ceil(T / FA_QUERY_TILE), nH, B] },
        [stored ? 'attention_bwd_dkv_ds_bf16' : 'attention_bwd_dkv_bf16']: { shmem: faSmem('dkv', hd), grid: [Math.ceil(T / FA_KEY_TILE), nKv * S, B] },
      };
      for (const [fn, w] of Object.entries(want)) {
        const got = launches.filter((l) => l.fn === fn);
        assert.equal(got.length, 2, `${fn} hd ${hd}: once per call`);
        for (const g of got) {
          assert.equal(g.block, FA_THREADS);
          assert.equal(g.shmem, w.shmem, `${fn} hd ${hd} shared memory`);
          assert.ok(w.shmem <= SMEM_OPT_IN, `${fn} hd ${hd}: ${w.shmem} bytes fit every sm_80+ target`);
          assert.deepEqual([...g.grid], w.grid, `${fn} hd ${hd} grid`);
        }
        assert.deepEqual(allowed.filter(([f]) => f === fn), w.shmem > SMEM_DEFAULT ? [[fn, w.shmem]] : [], `${fn} hd ${hd}: opt-in exactly above 48 KiB, once`);
      }
      // the recomputing dQ kernel computes D; the stored-dS backward runs dK/dV first, after a D pass
      assert.equal(launches.filter((l) => l.fn === 'attention_bwd_pre').length, stored ? 2 : 0, 'the D pre-pass');
      // in order: D, dK/dV (and the reduce), then dQ from the dS tiles
      if (stored) {
        const order = launches.filter((l) => l.fn.startsWith('attention_bwd') || l.fn === 'attention_dkv_reduce').slice(0, split ? 4 : 3).map((l) => l.fn);
        assert.deepEqual(order, ['attention_bwd_pre', 'attention_bwd_dkv_ds_bf16', ...(split ? ['attention_dkv_reduce'] : []), 'attention_bwd_dq_ds_bf16']);
      }
      assert.equal(launches.filter((l) => l.fn === 'attention_dkv_reduce').length, split ? 2 : 0, 'the split reduce runs exactly when split');
      for (const f of ['attention_fwd', 'attention_bwd', 'attention_bwd_dkv']) assert.ok(!launches.some((l) => l.fn === f), `no SIMT ${f}`);
    } finally { be.dispose(); }
  }
});

test('bf16 attention: an lse that is not f32 and a misaligned bf16 view are refused', () => {
  const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: false, log: () => {} });
  const be = new CudaBackend('device', { driver: fakeDriver(), cublas: fakeCublas(), cache, log: () => {} });
  try {
    const B = 1, T = 8, nH = 2, nKv = 1, hd = 64;
    const q = be.alloc(B * T * nH * hd, 'q', 'bf16'), k = be.alloc(B * T * nKv * hd, 'k', 'bf16'), v = be.alloc(B * T * nKv * hd, 'v', 'bf16');
    const out = be.alloc(q.length, 'out', 'bf16');
    assert.throws(() => be.attentionForward(out, be.alloc(B * nH * T, 'lse', 'bf16'), q, k, v, B, T, nH, nKv, hd), /keeps lse in f32/);
    const big = be.alloc(q.length + 8, 'qq', 'bf16');
    const odd = be.view(big, 4, q.length); // 8 bytes past a 256-byte aligned base
    assert.throws(() => be.attentionForward(out, be.alloc(B * nH * T, 'lse'), odd, k, v, B, T, nH, nKv, hd), /16-byte aligned/);
    be.attentionForward(out, be.alloc(B * nH * T, 'lse'), be.view(big, 8, q.length), k, v, B, T, nH, nKv, hd); // 16 bytes: fine
  } finally { be.dispose(); }
});

test('the stored-dS backward: default, its scratch sized by prepare() to the run (chunks beyond it), recomputing where one sequence does not fit', async () => {
  assert.equal(DEFAULT_ATTN_BACKWARD, 'stored-ds');
  const dims = { ...QWEN_LIKE, hd: 64, nH: 14, nKv: 2 };
  // [B, T, stored on the prepared device, stored by a trace at the default scratch]
  for (const [B, T, stored, atDefault] of [[2, 130, true, true], [1, 4096, true, false], [1, 8192, false, false]] as const) {
    const perSeq = dsScratchElems(1, dims.nH, T);
    assert.equal(perSeq <= DEFAULT_ATTN_DS_ELEMS, atDefault, `T=${T}: fits the default scratch`);
    assert.equal(perSeq <= MAX_ATTN_DS_ELEMS, stored, `T=${T}: fits the largest scratch`);
    const step = attentionOpsBf16({ ...dims, B, T });
    const defaults = planKernels([step], { attnDsumFloats: 1 << 22, attnDkvFloats: 1 << 22, attnDsElems: DEFAULT_ATTN_DS_ELEMS }).map((s) => s.family);
    assert.equal(defaults.includes('attention_bwd_dq_ds_bf16'), atDefault, `T=${T}: a trace at the default scratch`);
    const lines: string[] = [];
    const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: true, log: (l) => lines.push(l) });
    const b = new CudaBackend('device', { driver: fakeDriver(), cublas: fakeCublas(), cache, log: (l) => lines.push(l) });
    await b.prepare([step]);
    step(b);
    assert.equal(cache.counters.missesAfterSeal, 0, lines.join('\n'));
    assert.equal((b.launches.get('attention_bwd_dq_ds_bf16') ?? 0) > 0, stored, `T=${T}: stored dS on the prepared device`);
    assert.equal((b.launches.get('attention_bwd_dq_bf16') ?? 0) > 0, !stored, `T=${T}: recomputed on the prepared device`);
    // what a dry run or `kernels plan` lists is what the prepared device launched
    assert.deepEqual(planKernels([step]).map((s) => s.id).sort(), b.planFor([step]).map((s) => s.id).sort());
    b.dispose();
  }
});
