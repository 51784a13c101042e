/**
 * GPU-only (skips cleanly without libcuda or a GPU): the WHOLE model on the CUDA backend against the CPU backend
 * (float32), same weights and tokens: logits, the loss stats and every parameter's gradient (by HF tensor name),
 * for a small Qwen2 config (Q/K/V biases, GQA, theta 1e6, eps 1e-6, tied embeddings; plain cross-entropy) and a
 * Llama-like one (no biases, untied, theta 5e5, eps 1e-5; distilled with JSD from a teacher of another shape).
 * Also: two RoPE thetas give different CUDA logits (and each matches the CPU), and the CUDA run is pre-warmed
 * from jobClosures in strict mode, so it also proves the model code compiles nothing after pre-warm.
 *
 * Metric: max |cuda - cpu| / max |cpu| per compared buffer (per tensor for gradients). Tolerances: logits 2e-5,
 * gradients 1e-4 (float32 through several layers with different summation orders: cuBLAS vs the CPU's blocked
 * products, atomics in attention backward; TF32 stays off here).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { appendFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Backend, LossSpec } from '../../src/backend/backend.js';
import { LOSS_STATS } from '../../src/backend/backend.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { createCudaBackend } from '../../src/backend/cuda/index.js';
import type { ModelConfig, RopeSpec } from '../../src/model/config.js';
import { describeRope } from '../../src/backend/rope.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { LORA_TARGETS, loraLayout, type LoraSpec } from '../../src/model/lora.js';
import { jobClosures } from '../../src/train/kernel-plan.js';
import { Rng } from '../../src/util/rng.js';
import { relErr, relFrob } from '../util/compare.js';
import { gpuOrSkip } from './helpers.js';

const { value: cuda, skip } = gpuOrSkip(() => createCudaBackend({ strict: true, cacheDir: process.env.DISTILLERY_CACHE_DIR ?? mkdtempSync(join(tmpdir(), 'dk-model-')) }));
const cpu: Backend | null = cuda ? createCpuBackend({ dtype: 'f32', threads: 2 }) : null;
after(() => { cuda?.dispose(); cpu?.dispose(); });

const QWEN: ModelConfig = {
  architecture: 'qwen2', vocabSize: 300, hiddenSize: 64, intermediateSize: 176, numLayers: 2, numHeads: 4, numKvHeads: 2,
  headDim: 16, rope: { type: 'default', theta: 1e6 }, rmsNormEps: 1e-6, tieWordEmbeddings: true, maxPositionEmbeddings: 256, qkvBias: true, qkNorm: false, noRopeLayers: [],
};
const LLAMA: ModelConfig = {
  architecture: 'llama', vocabSize: 300, hiddenSize: 128, intermediateSize: 344, numLayers: 2, numHeads: 8, numKvHeads: 2,
  headDim: 16, rope: { type: 'default', theta: 5e5 }, rmsNormEps: 1e-5, tieWordEmbeddings: false, maxPositionEmbeddings: 256, qkvBias: false, qkNorm: false, noRopeLayers: [],
};
const LLAMA_TEACHER: ModelConfig = { ...LLAMA, hiddenSize: 192, numHeads: 6, numKvHeads: 3, headDim: 32, numLayers: 3, intermediateSize: 512 };
/** Qwen3: per-head q/k norms, head_dim 32 with hidden 64 (query width 128 ≠ hidden), no biases, untied. */
const QWEN3: ModelConfig = {
  ...QWEN, architecture: 'qwen3', headDim: 32, numHeads: 4, numKvHeads: 2, qkvBias: false, qkNorm: true, tieWordEmbeddings: false,
};
/** SmolLM3: Llama with RoPE off on layer 1 of 3 (and attention biases, q/k/v/o). */
const SMOLLM3: ModelConfig = {
  ...LLAMA, architecture: 'smollm3', numLayers: 3, noRopeLayers: [1], qkvBias: true, tieWordEmbeddings: true, rope: { type: 'default', theta: 2e6 },
};
const B = 2, T = 24;
/** Measured on an H100 (2026-11): logits ≤ 1e-6, gradients ≤ 2e-6; the tolerances leave a 20-50× margin. */
const LOGIT_TOL = 2e-5, GRAD_TOL = 1e-4;

function record(name: string, err: number, tol: number, ok = err <= tol): void {
  const f = process.env.DISTILLERY_PARITY_TABLE;
  if (f) appendFileSync(f, `${name}\t${err.toExponential(2)}\t${tol.toExponential(0)}\t${ok ? 'ok' : 'FAIL'}\n`);
}

function weightsFor(cfg: ModelConfig, seed: number): Float32Array {
  const rng = new Rng(seed);
  const layout = parameterLayout(cfg);
  const w = initialWeights(layout, cfg, rng, 0.1);
  // Norm weights and biases start at 1 / 0: perturb them so their gradients and effects are exercised.
  for (const t of layout.tensors) if (t.init === 'zeros' || t.init === 'ones') for (let i = 0; i < t.size; i++) w[t.offset + i]! += 0.1 * rng.normal();
  return w;
}

interface Outcome { logits: Float32Array | Float64Array; stats: Float32Array | Float64Array; grads: Float32Array | Float64Array }

/** Forward (teacher too), fused loss, backward on one backend. */
function run(be: Backend, cfg: ModelConfig, w: Float32Array, teacher: { cfg: ModelConfig; w: Float32Array } | null, spec: LossSpec,
  precision: 'fp32' | 'bf16' = 'fp32', grads: 'zero' | 'overwrite' = 'zero'): Outcome {
  const m = new Transformer(be, cfg, { batch: B, seq: T, training: true, precision });
  m.setWeights(w);
  const n = B * T, V = cfg.vocabSize;
  const ids = Int32Array.from({ length: n }, (_, i) => (i * 37 + 11) % V);
  const targets = Int32Array.from({ length: n }, (_, i) => (i % T === T - 1 && i > T ? -1 : (i * 53 + 7) % V));
  const weights = Float32Array.from({ length: n }, (_, i) => (targets[i]! < 0 ? 0 : 1 / n));
  let tLogits = null;
  if (teacher) {
    const tm = new Transformer(be, teacher.cfg, { batch: B, seq: T, training: false, precision });
    tm.setWeights(teacher.w);
    tLogits = tm.forward(ids, B, T);
  }
  if (grads === 'zero') m.zeroGrad();
  else { be.upload(m.grads!, new Float32Array(m.grads!.length).fill(Number.NaN)); m.overwriteGrads(); }
  const logitsBuf = m.forward(ids, B, T);
  const logits = be.download(logitsBuf);
  const tg = be.allocInt(n, 'targets'); be.uploadInt(tg, targets);
  const wb = be.alloc(n, 'weights'); be.upload(wb, weights);
  const stats = be.alloc(n * LOSS_STATS, 'stats');
  be.lossForward(stats, logitsBuf, logitsBuf, tLogits, tg, wb, n, V, spec);
  m.backward(logitsBuf);
  return { logits, stats: be.download(stats), grads: be.download(m.grads!) };
}

async function compare(name: string, cfg: ModelConfig, teacher: { cfg: ModelConfig; w: Float32Array } | null, spec: LossSpec): Promise<void> {
  // Strict pre-warm from the job's own closures: a kernel the model needs beyond them throws.
  await cuda!.prepare(jobClosures({ student: cfg, teacher: teacher?.cfg ?? null, batch: B, seq: T, loss: spec, train: true, evaluate: true }));
  const w = weightsFor(cfg, 7);
  const g = run(cuda!, cfg, w, teacher, spec);
  const r = run(cpu!, cfg, w, teacher, spec);
  const problems: string[] = [];
  const check = (what: string, got: ArrayLike<number>, ref: ArrayLike<number>, tol: number): void => {
    const e = relErr(got, ref);
    record(`${name} ${what}`, e, tol);
    if (!(e <= tol)) problems.push(`${what}: relative error ${e.toExponential(2)} > ${tol}`);
  };
  check('logits', g.logits, r.logits, LOGIT_TOL);
  check('loss stats', g.stats, r.stats, LOGIT_TOL);
  let worst = 0, worstName = '';
  const maxAbs = (a: ArrayLike<number>): number => { let m = 0; for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]!)); return m; };
  const scale = maxAbs(r.grads);
  for (const t of parameterLayout(cfg).tensors) {
    const gt = g.grads.subarray(t.offset, t.offset + t.size), rt = r.grads.subarray(t.offset, t.offset + t.size);
    // A key bias on a NoPE layer adds q·b to every score of a query row, which softmax ignores: its gradient is 0 in
    // exact arithmetic and rounding noise on both backends, so it is checked to be that (vs the gradients' scale).
    if (cfg.noRopeLayers.some((l) => t.name === `model.layers.${l}.self_attn.k_proj.bias`)) {
      const noise = Math.max(maxAbs(gt), maxAbs(rt)) / scale;
      record(`${name} ${t.name} (NoPE: zero gradient) / gradient scale`, noise, 1e-5);
      if (!(noise <= 1e-5)) problems.push(`grad ${t.name}: ${noise.toExponential(2)} of the gradient scale, should be 0`);
      continue;
    }
    const e = relErr(gt, rt);
    if (e > worst) { worst = e; worstName = t.name; }
    if (!(e <= GRAD_TOL)) problems.push(`grad ${t.name}: relative error ${e.toExponential(2)} > ${GRAD_TOL}`);
  }
  record(`${name} gradients (worst: ${worstName})`, worst, GRAD_TOL);
  assert.ok(g.grads.some((x) => x !== 0), 'the CUDA gradients are not all zero');
  assert.deepEqual(problems, []);
}

test('whole model cuda vs cpu: Qwen2 (biases, GQA, theta 1e6, eps 1e-6, tied), cross-entropy', { skip, timeout: 300_000 }, async () => {
  await compare('qwen2 model', QWEN, null, { kind: 'none', alpha: 0, temperature: 1, beta: 0 });
});

test('whole model cuda vs cpu: Llama-like (no biases, untied, theta 5e5, eps 1e-5), JSD distillation', { skip, timeout: 300_000 }, async () => {
  await compare('llama model (jsd)', LLAMA, { cfg: LLAMA_TEACHER, w: weightsFor(LLAMA_TEACHER, 11) }, { kind: 'jsd', alpha: 0.7, temperature: 2, beta: 0.3 });
});

test('whole model cuda vs cpu: Qwen3 (q/k norms, head_dim 32 ≠ hidden/heads, untied), KL distillation from a Qwen3 teacher', { skip, timeout: 300_000 }, async () => {
  const teacher: ModelConfig = { ...QWEN3, numLayers: 3, tieWordEmbeddings: true, qkvBias: true };
  await compare('qwen3 model (kl)', QWEN3, { cfg: teacher, w: weightsFor(teacher, 13) }, { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0 });
});

test('whole model cuda vs cpu: SmolLM3 (NoPE layer 1 of 3, q/k/v/o biases, tied), cross-entropy', { skip, timeout: 300_000 }, async () => {
  await compare('smollm3 model', SMOLLM3, null, { kind: 'none', alpha: 0, temperature: 1, beta: 0 });
});

test('whole model cuda vs cpu in bf16: Qwen3 (q/k norms on bf16 q and k) and SmolLM3, against the CPU backend\'s exact bf16 emulation', { skip, timeout: 300_000 }, async () => {
  // bf16 products on tensor cores sum in another order than the CPU's: a stored bf16 value may round the other way,
  // so the bound is a few bf16 ulps (2^-8) through two layers, not float32's.
  const TOL = 3e-2;
  for (const [name, cfg] of [['qwen3', QWEN3], ['smollm3', SMOLLM3]] as const) {
    const spec: LossSpec = { kind: 'none', alpha: 0, temperature: 1, beta: 0 };
    const w = weightsFor(cfg, 21);
    // The job's own plan, plus this test's full-logits forward and backward (traced the same way).
    await cuda!.prepare([...jobClosures({ student: cfg, teacher: null, batch: B, seq: T, loss: spec, train: true, evaluate: true, precision: 'bf16' }),
      (b: Backend) => { run(b, cfg, w, null, spec, 'bf16'); }]);
    const g = run(cuda!, cfg, w, null, spec, 'bf16'), r = run(cpu!, cfg, w, null, spec, 'bf16');
    const el = relErr(g.logits, r.logits), eg = relFrob(g.grads, r.grads);
    record(`${name} model bf16 logits`, el, TOL);
    record(`${name} model bf16 gradients (Frobenius)`, eg, TOL);
    assert.ok(el <= TOL, `${name} bf16 logits: relative error ${el}`);
    assert.ok(eg <= TOL, `${name} bf16 gradients: relative error ${eg}`);
  }
});

test('overwriteGrads on CUDA (first writes with beta 0 and col_reduce overwriting, the gradients NaN before) = zeroGrad then backward: Qwen2 tied with biases, Qwen3 untied with q/k norms, fp32 and bf16', { skip, timeout: 300_000 }, async () => {
  const ce: LossSpec = { kind: 'none', alpha: 0, temperature: 1, beta: 0 };
  for (const cfg of [QWEN, QWEN3]) {
    const spec = ce;
    for (const precision of ['fp32', 'bf16'] as const) {
      await cuda!.prepare(jobClosures({ student: cfg, teacher: null, batch: B, seq: T, loss: spec, train: true, evaluate: true, ...(precision === 'bf16' ? { precision } : {}) }));
      const w = weightsFor(cfg, 7);
      const z = run(cuda!, cfg, w, null, spec, precision, 'zero');
      const o = run(cuda!, cfg, w, null, spec, precision, 'overwrite');
      assert.ok(o.grads.every(Number.isFinite), `${cfg.architecture} ${precision}: a gradient left unwritten (NaN)`);
      const e = relErr(o.grads, z.grads);
      assert.ok(e <= 1e-6, `${cfg.architecture} ${precision}: gradients differ by ${e}`);
    }
  }
});

test('each RoPE kind (two thetas, linear, llama3, yarn) gives different CUDA logits, each matching the CPU', { skip, timeout: 300_000 }, async () => {
  const spec: LossSpec = { kind: 'none', alpha: 0, temperature: 1, beta: 0 };
  const ropes: RopeSpec[] = [
    { type: 'default', theta: 1e4 }, { type: 'default', theta: 1e6 }, { type: 'linear', theta: 1e4, factor: 4 },
    { type: 'llama3', theta: 5e5, factor: 32, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 64 },
    { type: 'yarn', theta: 1e4, factor: 4, originalMaxPositionEmbeddings: 64, betaFast: 32, betaSlow: 1, attentionFactor: 1.2, truncate: true },
  ];
  const cfgs: ModelConfig[] = ropes.map((rope) => ({ ...QWEN, rope }));
  await cuda!.prepare(cfgs.flatMap((c) => jobClosures({ student: c, batch: B, seq: T, loss: spec, train: true })));
  const w = weightsFor(QWEN, 3);
  const got = cfgs.map((c) => run(cuda!, c, w, null, spec));
  for (let i = 1; i < cfgs.length; i++) {
    const diff = relErr(got[i - 1]!.logits, got[i]!.logits);
    record(`rope ${describeRope(ropes[i - 1]!)} vs ${describeRope(ropes[i]!)} logits (must differ by > 1e-3)`, diff, 1e-3, diff > 1e-3);
    assert.ok(diff > 1e-3, `${describeRope(ropes[i - 1]!)} and ${describeRope(ropes[i]!)} give the same logits (relative difference ${diff})`);
  }
  cfgs.forEach((cfg, i) => {
    const e = relErr(got[i]!.logits, run(cpu!, cfg, w, null, spec).logits);
    record(`rope ${describeRope(cfg.rope)} logits vs cpu`, e, LOGIT_TOL);
    assert.ok(e <= LOGIT_TOL, `${describeRope(cfg.rope)}: relative error ${e}`);
  });
});

/**
 * LoRA (src/model/lora.ts): the adapted model on CUDA against the CPU — logits, loss stats and every adapter gradient
 * (A and B of each targeted projection), the base frozen on both; pre-warmed in strict mode from the job's closures
 * with the adapters, so the adapter path compiles nothing after the seal. fp32 at the model tolerances; bf16 against
 * the CPU's bf16 emulation as relative Frobenius errors (bf16 products in another summation order).
 */
async function compareLora(name: string, cfg: ModelConfig, spec: LoraSpec, precision: 'fp32' | 'bf16', frozenDtype?: 'nf4'): Promise<void> {
  const lay = loraLayout(cfg, spec);
  const loss: LossSpec = { kind: 'none', alpha: 0, temperature: 1, beta: 0 };
  await cuda!.prepare(jobClosures({ student: cfg, batch: B, seq: T, loss, train: true, evaluate: true, lora: lay, precision, studentFrozen: frozenDtype }));
  const w = weightsFor(cfg, 7);
  const rng = new Rng(21);
  const ad = Float32Array.from({ length: lay.total }, () => rng.normal() * 0.05);
  const one = (be: Backend): { logits: Float32Array | Float64Array; stats: Float32Array | Float64Array; grads: Float32Array | Float64Array } => {
    const m = new Transformer(be, cfg, { batch: B, seq: T, training: true, precision, lora: lay, frozenDtype });
    m.setWeights(w);
    m.lora!.setWeights(ad);
    const n = B * T, V = cfg.vocabSize;
    const ids = Int32Array.from({ length: n }, (_, i) => (i * 37 + 11) % V);
    const targets = Int32Array.from({ length: n }, (_, i) => (i * 53 + 7) % V);
    m.zeroGrad();
    const logitsBuf = m.forward(ids, B, T);
    const logits = be.download(logitsBuf);
    const tg = be.allocInt(n, 'targets'); be.uploadInt(tg, targets);
    const wb = be.alloc(n, 'weights'); be.upload(wb, new Float32Array(n).fill(1 / n));
    const stats = be.alloc(n * LOSS_STATS, 'stats');
    be.lossForward(stats, logitsBuf, logitsBuf, null, tg, wb, n, V, loss);
    m.backward(logitsBuf);
    assert.equal(m.grads, null, 'the base is frozen');
    return { logits, stats: be.download(stats), grads: be.download(m.lora!.grads!) };
  };
  const g = one(cuda!), r = one(cpu!);
  const bf16 = precision === 'bf16';
  const err = bf16 ? relFrob : relErr, logitTol = bf16 ? 2e-2 : LOGIT_TOL, gradTol = bf16 ? 5e-2 : GRAD_TOL;
  const problems: string[] = [];
  const check = (what: string, e: number, tol: number): void => { record(`${name} ${what}`, e, tol); if (!(e <= tol)) problems.push(`${what}: ${e.toExponential(2)} > ${tol}`); };
  check('logits', err(g.logits, r.logits), logitTol);
  check('loss stats', err(g.stats, r.stats), logitTol);
  let worst = 0, worstName = '';
  for (const t of lay.tensors) {
    const e = err(g.grads.subarray(t.offset, t.offset + t.size), r.grads.subarray(t.offset, t.offset + t.size));
    if (e > worst) { worst = e; worstName = t.name; }
  }
  check(`adapter gradients (worst: ${worstName})`, worst, gradTol);
  assert.ok(g.grads.some((x) => x !== 0), 'the CUDA adapter gradients are not all zero');
  assert.deepEqual(problems, []);
}

for (const precision of ['fp32', 'bf16'] as const) {
  test(`LoRA cuda vs cpu (${precision}): Qwen2 every projection r = 8, Qwen3 attention r = 4; adapter gradients, frozen base`, { skip, timeout: 300_000 }, async () => {
    await compareLora(`lora qwen2 all r8 ${precision}`, QWEN, { rank: 8, alpha: 16, targets: [...LORA_TARGETS] }, precision);
    await compareLora(`lora qwen3 q/v/o r4 ${precision}`, QWEN3, { rank: 4, alpha: 8, targets: ['q_proj', 'v_proj', 'o_proj'] }, precision);
  });
  test(`QLoRA cuda vs cpu (${precision}): LoRA on an NF4 base (dequant_nf4 per layer, forward and backward), Qwen2 every projection r = 8`, { skip, timeout: 300_000 }, async () => {
    await compareLora(`qlora qwen2 all r8 ${precision}`, QWEN, { rank: 8, alpha: 16, targets: [...LORA_TARGETS] }, precision, 'nf4');
  });
}

test('NF4 teacher on CUDA: logits bit-identical to the CUDA model holding the dequantized weights (fp32 and bf16)', { skip, timeout: 300_000 }, async () => {
  for (const precision of ['fp32', 'bf16'] as const) {
    await cuda!.prepare(jobClosures({ student: QWEN3, batch: B, seq: T, evaluate: true, precision, studentFrozen: 'nf4' }));
    const w = weightsFor(QWEN3, 9);
    const q = new Transformer(cuda!, QWEN3, { batch: B, seq: T, training: false, precision, frozenDtype: 'nf4' });
    q.setWeights(w);
    const dense = new Transformer(cuda!, QWEN3, { batch: B, seq: T, training: false, precision });
    dense.setWeights(q.getWeights());
    const ids = Int32Array.from({ length: B * T }, (_, i) => (i * 29 + 5) % QWEN3.vocabSize);
    const a = cuda!.download(q.forward(ids, B, T)), b = cuda!.download(dense.forward(ids, B, T));
    let diff = 0;
    for (let i = 0; i < a.length; i++) diff = Math.max(diff, Math.abs(a[i]! - b[i]!));
    record(`nf4 model vs dequantized dense ${precision}`, diff, 0);
    assert.equal(diff, 0, `${precision}: logits differ by ${diff}`);
  }
});
