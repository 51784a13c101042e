/**
 * Pre-warm completeness by construction, without a GPU: the trace backend records the specs a step launches;
 * a device-mode backend (fake driver/cuBLAS, fake compiler, strict sealed cache pre-warmed from that plan) then
 * runs the same step with zero misses, while a step that diverges (another eps) is caught by name.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CudaBackend, createTraceBackend } from '../../src/backend/cuda/cuda-backend.js';
import { DEFAULT_ATTN_DKV_FLOATS, DEFAULT_ATTN_DSUM, DKV_SPLIT_BELOW_BLOCKS } from '../../src/backend/cuda/attention-plan.js';
import { planKernels } from '../../src/backend/cuda/plan.js';
import { KernelCache } from '../../src/backend/cuda/kernel-cache.js';
import { ALL_FAMILIES, EXPERIMENTAL_FAMILIES } from '../../src/backend/cuda/kernels/index.js';
import { DistilleryError } from '../../src/util/errors.js';
import { LOSS_STATS, type Backend } from '../../src/backend/backend.js';
import { formatBytes } from '../../src/backend/cuda/ffi/status.js';
import { Transformer } from '../../src/model/transformer.js';
import { BatchGenerator } from '../../src/model/batch-generate.js';
import { tinyConfig } from '../cli/fixtures.js';
import { jobClosures } from '../../src/train/kernel-plan.js';
import { FakeCompiler, LLAMA_LIKE, QWEN_LIKE, allOpsStep, allOpsStepBf16, attentionOpsBf16, fakeCublas, fakeDriver } from './helpers.js';

test('the trace backend records every kernel family the steps (fp32 and the bf16 data flow) use, and downloads zeros', () => {
  const b = createTraceBackend();
  allOpsStep(QWEN_LIKE)(b);
  allOpsStepBf16(QWEN_LIKE)(b);
  attentionOpsBf16(QWEN_LIKE)(b);
  // the tensor-core attention backward that recomputes S and dP (attnBackward 'recompute', and long sequences)
  const re = createTraceBackend({ attnBackward: 'recompute' });
  attentionOpsBf16(QWEN_LIKE)(re);
  const families = new Set([...b.traced.values(), ...re.traced.values()].map((s) => s.family));
  for (const f of ALL_FAMILIES) if (!EXPERIMENTAL_FAMILIES.has(f.name)) assert.ok(families.has(f.name), `traced ${f.name}`);
  const x = b.alloc(4, 'x');
  assert.deepEqual([...b.download(x)], [0, 0, 0, 0]);
  assert.equal(b.sumSquares(x, 4), 0);
});

test('planKernels dedupes across closures and separates different baked parameters', () => {
  const one = planKernels([allOpsStep(QWEN_LIKE)]);
  const twice = planKernels([allOpsStep(QWEN_LIKE), allOpsStep(QWEN_LIKE)]);
  assert.equal(twice.length, one.length);
  const both = planKernels([allOpsStep(QWEN_LIKE), allOpsStep(LLAMA_LIKE)]);
  assert.ok(both.length > one.length);
  const eps5 = planKernels([allOpsStep({ ...QWEN_LIKE, eps: 1e-5 })]);
  const ids = new Set(one.map((s) => s.id));
  assert.ok(eps5.some((s) => !ids.has(s.id) && s.family === 'rmsnorm_fwd'));
});

function deviceBackend(cache: KernelCache, log: (l: string) => void = () => {}): CudaBackend {
  return new CudaBackend('device', { driver: fakeDriver(), cublas: fakeCublas(), cache, log });
}

test('a step pre-warmed from its own trace runs with zero misses after seal', async () => {
  const lines: string[] = [];
  const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: true, log: (l) => lines.push(l) });
  const step = allOpsStep(QWEN_LIKE);
  await cache.prewarm(planKernels([step]));
  const b = deviceBackend(cache, (l) => lines.push(l));
  step(b);
  step(b);
  assert.equal(cache.counters.missesAfterSeal, 0, lines.join('\n'));
  assert.ok(cache.counters.hits > 10);
  b.dispose();
  assert.ok(lines.includes(cache.summary()), 'dispose prints the counters');
});

test('a step that diverges from the plan is caught by name (strict)', async () => {
  const lines: string[] = [];
  const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: true, log: (l) => lines.push(l) });
  await cache.prewarm(planKernels([allOpsStep(QWEN_LIKE)]));
  const b = deviceBackend(cache);
  assert.throws(() => allOpsStep({ ...QWEN_LIKE, eps: 1e-5 })(b), DistilleryError);
  assert.ok(lines.some((l) => /^\[kernel-cache\] miss after pre-warm: rmsnorm_fwd eps=0\.00001 /.test(l)), lines.join('\n'));
});

test('loss parameters the kernel ignores do not split the cache', () => {
  const a = planKernels([allOpsStep({ ...QWEN_LIKE, loss: { kind: 'none', alpha: 0.1, temperature: 3, beta: 0.2 } })]);
  const b = planKernels([allOpsStep({ ...QWEN_LIKE, loss: { kind: 'none', alpha: 0.9, temperature: 1, beta: 0.7 } })]);
  assert.deepEqual(a.map((s) => s.id), b.map((s) => s.id));
});

test('a distillation loss without teacher logits is a DistilleryError', () => {
  const b = createTraceBackend();
  const z = b.alloc(8, 'z'), st = b.alloc(2 * LOSS_STATS, 's'), w = b.alloc(2, 'w'), t = b.allocInt(2, 't');
  assert.throws(() => b.lossForward(st, null, z, null, t, w, 2, 4, { kind: 'kl', alpha: 0.5, temperature: 1, beta: 0 }), DistilleryError);
});

test('values a schedule may change (lr, loss alpha, temperature, beta, AdamW betas and eps) are arguments: one plan for all of them', async () => {
  const { jobClosures } = await import('../../src/train/kernel-plan.js');
  const { presetConfig } = await import('../../src/model/config.js');
  const student = presetConfig('tiny', 300), teacher = presetConfig('small', 300);
  const plan = (loss: { alpha: number; temperature: number; beta: number }, adam: { beta1: number; beta2: number; eps: number }): string[] =>
    planKernels(jobClosures({
      student, teacher, batch: 2, seq: 8, train: true, evaluate: true,
      loss: { kind: 'jsd', ...loss }, adam: { ...adam, weightDecay: 0.1 },
    })).map((s) => s.id).sort();
  const a = plan({ alpha: 0.5, temperature: 1, beta: 0.5 }, { beta1: 0.9, beta2: 0.95, eps: 1e-8 });
  const b = plan({ alpha: 0.9, temperature: 4, beta: 0.1 }, { beta1: 0.8, beta2: 0.999, eps: 1e-6 });
  assert.deepEqual(b, a);
  // ...while what shapes the code still splits it: another loss kind is another kernel.
  const kl = planKernels(jobClosures({ student, teacher, batch: 2, seq: 8, train: true, loss: { kind: 'kl', alpha: 0.5, temperature: 1, beta: 0.5 } }));
  assert.ok(kl.some((s) => s.family === 'loss' && !a.includes(s.id)));
});

test('--tf32 attention on tensor cores: prepare() plans what the backend launches (attention_fwd_mma), zero misses in strict mode', async () => {
  for (const attention of ['mma', 'simt'] as const) {
    const lines: string[] = [];
    const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: true, log: (l) => lines.push(l) });
    const b = new CudaBackend('device', { driver: fakeDriver(), cublas: fakeCublas(), cache, attention, log: (l) => lines.push(l) });
    const step = allOpsStep(QWEN_LIKE);
    await b.prepare([step]);
    step(b);
    assert.equal(cache.counters.missesAfterSeal, 0, lines.join('\n'));
    const planned = planKernels([step], { attention }).map((s) => s.family);
    assert.equal(planned.includes('attention_fwd_mma'), attention === 'mma');
    assert.equal(planned.includes('attention_fwd'), attention === 'simt');
    b.dispose();
  }
});

test('prewarm() plans with the backend\'s attention choice: a tensor-core (--tf32) backend launches nothing unplanned', async () => {
  const { prewarm } = await import('../../src/backend/cuda/index.js');
  const { attentionFor } = await import('../../src/backend/cuda/attention-plan.js');
  assert.equal(attentionFor(true), 'mma');
  assert.equal(attentionFor(false), 'simt');
  for (const tf32 of [true, false]) {
    const lines: string[] = [];
    const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: false, log: (l) => lines.push(l) });
    const b = new CudaBackend('device', { driver: fakeDriver(), cublas: fakeCublas(), cache, attention: attentionFor(tf32), log: (l) => lines.push(l) });
    assert.equal(b.attention, attentionFor(tf32));
    const step = allOpsStep(QWEN_LIKE);
    await prewarm(b, [step]);
    step(b);
    assert.equal(cache.counters.missesAfterSeal, 0, lines.join('\n'));
    b.dispose();
  }
});

/** A run of one bf16 attention backward over fresh buffers (B sequences of T, nH query heads on nKv, head dim hd). */
function attentionBackwardRun(B: number, T: number, nH: number, nKv: number, hd: number): (x: Backend) => void {
  return (x) => {
    const q = x.alloc(B * T * nH * hd, 'q', 'bf16'), k = x.alloc(B * T * nKv * hd, 'k', 'bf16'), v = x.alloc(B * T * nKv * hd, 'v', 'bf16');
    const o = x.alloc(B * T * nH * hd, 'o', 'bf16'), lse = x.alloc(B * nH * T, 'lse');
    const dq = x.alloc(B * T * nH * hd, 'dq', 'bf16'), dk = x.alloc(B * T * nKv * hd, 'dk', 'bf16'), dv = x.alloc(B * T * nKv * hd, 'dv', 'bf16');
    x.attentionBackward(dq, dk, dv, o, q, k, v, o, lse, B, T, nH, nKv, hd);
  };
}

test('prepare sizes the attention backward scratch from the traced run: D down to the need, dK/dV partials up to it', async () => {
  const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: true, log: () => {} });
  const b = deviceBackend(cache);
  const B = 2, T = 64, nH = 4, nKv = 2, hd = 16;
  const step = attentionBackwardRun(B, T, nH, nKv, hd);
  const before = b.bytesInUse;
  await b.prepare([step]);
  const sizes = new Map(b.memoryReport().split('\n').slice(1).map((l) => l.split(': ') as [string, string]));
  assert.equal(sizes.get('attention backward scratch'), formatBytes(4 * B * nH * T), 'D: one float per batch · head · position');
  assert.equal(sizes.get('attention backward dK/dV partials'), formatBytes(4 * 2 * B * nH * T * hd), 'dK/dV partials: the whole batch, split');
  assert.ok(b.bytesInUse < before, 'this small run needs less than the defaults');
  step(b);
  assert.equal(cache.counters.missesAfterSeal, 0);
  b.dispose();
});

test('the plan takes the branch the prepared device takes: a dK/dV split that only the sized scratch allows is pre-warmed (strict, zero misses)', async () => {
  // One sequence of 8000 positions, 4 query heads on 2 kv heads, head dim 128: 8.2 Mi floats of dK/dV partials, and
  // an unsplit grid of 125 key tiles × 2 kv heads (250 blocks), small enough to split (DKV_SPLIT_BELOW_BLOCKS). The
  // default scratch (4 Mi) cannot hold the partials, so a trace at default sizes runs dK/dV unsplit (no
  // attention_dkv_reduce); prepare() sizes the partials to the need, the device splits the GQA group and sums the splits
  // with attention_dkv_reduce. Found on the H100 at 8 x 4096 (a miss after seal); the plan must trace with the device's sizes.
  const B = 1, T = 8000, nH = 4, nKv = 2, hd = 128;
  const step = attentionBackwardRun(B, T, nH, nKv, hd);
  assert.ok(2 * nH * T * hd > DEFAULT_ATTN_DKV_FLOATS, 'the case needs more partials than the default');
  const atDefaults = planKernels([step], { attnDsumFloats: DEFAULT_ATTN_DSUM, attnDkvFloats: DEFAULT_ATTN_DKV_FLOATS }).map((s) => s.family);
  assert.ok(!atDefaults.includes('attention_dkv_reduce'), 'at the default sizes the trace does not split');
  const lines: string[] = [];
  const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: true, log: (l) => lines.push(l) });
  const b = deviceBackend(cache, (l) => lines.push(l));
  await b.prepare([step]);
  step(b);
  assert.equal(cache.counters.missesAfterSeal, 0, lines.join('\n'));
  assert.ok((b.launches.get('attention_dkv_reduce') ?? 0) > 0, 'the prepared device splits');
  // What a dry run or `kernels plan` lists (planKernels without sizes) is what the prepared device launched.
  assert.deepEqual(planKernels([step]).map((s) => s.id).sort(), b.planFor([step]).map((s) => s.id).sort());
  b.dispose();
});

test('the dK/dV split by shape: 2 kv heads at 8 x 1024 (256 unsplit blocks) split the group; 8 kv heads (1024 blocks) do not', async () => {
  for (const [nH, nKv, hd, splits] of [[14, 2, 64, true], [16, 8, 128, false]] as const) {
    const step = attentionBackwardRun(8, 1024, nH, nKv, hd);
    assert.equal(Math.ceil(1024 / 64) * nKv * 8 < DKV_SPLIT_BELOW_BLOCKS, splits);
    assert.equal(planKernels([step]).some((s) => s.family === 'attention_dkv_reduce'), splits, `${nH}/${nKv} heads: planned`);
    const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: true, log: () => {} });
    const b = deviceBackend(cache);
    await b.prepare([step]);
    step(b);
    assert.equal((b.launches.get('attention_dkv_reduce') ?? 0) > 0, splits, `${nH}/${nKv} heads: launched`);
    assert.equal(cache.counters.missesAfterSeal, 0);
    b.dispose();
  }
});

test('a second prepare() for a larger run sizes from the defaults, not from the scratch the first one shrank', async () => {
  const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: false, log: () => {} });
  const b = deviceBackend(cache);
  await b.prepare([attentionBackwardRun(8, 64, 4, 2, 16)]); // D scratch shrunk to 8 · 4 · 64 floats
  const big = attentionBackwardRun(1, 4096, 4, 2, 16); // needs 4 · 4096 floats of D in one sequence
  await b.prepare([big]);
  big(b);
  const sizes = new Map(b.memoryReport().split('\n').slice(1).map((l) => l.split(': ') as [string, string]));
  assert.equal(sizes.get('attention backward scratch'), formatBytes(4 * 4 * 4096));
  b.dispose();
});

test('generation: a prefill from position 0 runs training\'s causal attention (the flash kernel), the decode steps the cache-reading kernel; both pre-warmed', async () => {
  const cfg = tinyConfig(96, { hiddenSize: 128, numHeads: 2, numKvHeads: 1, headDim: 64, numLayers: 3 });
  // the decode steps' kernel: a GQA group of bf16 operands on the tensor cores at any size (attention_cached_mma); fp32
  // operands at these few (row, KV head) pairs a block per query head (attention_cached)
  for (const [precision, flash, cached] of [['bf16', 'attention_fwd_bf16', 'attention_cached_mma'], ['fp32', 'attention_fwd', 'attention_cached']] as const) {
    const run = (be: Backend): BatchGenerator => {
      const g = new BatchGenerator(new Transformer(be, cfg, { batch: 1, seq: 1, training: false, precision }), 2, 16);
      g.prefill([[1, 2, 3], [4, 5]]);
      return g;
    };
    const b = createTraceBackend();
    const g = run(b);
    assert.equal(b.launches.get(flash), cfg.numLayers, `${precision}: the prefill's attention`);
    for (const k of ['attention_cached', 'attention_cached_gqa', 'attention_cached_mma']) assert.equal(b.launches.get(k) ?? 0, 0, `${precision}: the prefill reads no cache`);
    g.decode(Int32Array.of(6, 7));
    assert.equal(b.launches.get(cached), cfg.numLayers, `${precision}: a decode step reads the cache`);
    assert.equal(b.launches.get(flash), cfg.numLayers);
    // what generation launches is what eval's and generate's pre-warm plans (jobClosures): zero misses after the seal
    const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: true });
    await cache.prewarm(planKernels(jobClosures({ student: cfg, batch: 1, seq: 1, generateLen: 16, generateBatch: 2, precision })));
    const dev = deviceBackend(cache);
    run(dev).decode(Int32Array.of(6, 7));
    assert.equal(cache.counters.missesAfterSeal, 0);
    dev.dispose();
  }
});
