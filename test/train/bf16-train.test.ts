/**
 * Mixed precision on the CPU backend (which emulates bf16 storage exactly, so this is the reference for the CUDA bf16
 * path): a bf16 model keeps fp32 master weights and a bf16 compute copy, stores a teacher once in bf16, tracks the
 * fp32 model's gradients and loss curve within bf16 bounds, allocates exactly what the memory estimate says, and the
 * --precision flag resolves as documented.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { Backend, DType, LossSpec } from '../../src/backend/backend.js';
import { dtypeBytes } from '../../src/backend/backend.js';
import { roundBf16 } from '../../src/backend/bf16.js';
import { presetConfig, type ModelConfig } from '../../src/model/config.js';
import { estimateJobBytes } from '../../src/model/memory.js';
import { choicesRunner } from '../../src/train/run-choices.js';
import { initialWeights } from '../../src/model/params.js';
import { LORA_TARGETS, loraLayout } from '../../src/model/lora.js';
import { Transformer, type Precision } from '../../src/model/transformer.js';
import { AdamW } from '../../src/train/optimizer.js';
import { resolvePrecision } from '../../src/train/precision.js';
import { StepRunner, type Batch } from '../../src/train/step.js';
import { Rng } from '../../src/util/rng.js';

const CFG: ModelConfig = {
  architecture: 'qwen2', vocabSize: 37, hiddenSize: 32, intermediateSize: 48, numLayers: 2, numHeads: 4, numKvHeads: 2,
  headDim: 8, rope: { type: 'default', theta: 1e6 }, rmsNormEps: 1e-6, tieWordEmbeddings: true, maxPositionEmbeddings: 64, qkvBias: true, qkNorm: false, noRopeLayers: [],
};
const TEACHER: ModelConfig = { ...CFG, hiddenSize: 48, intermediateSize: 64, numLayers: 3, numHeads: 6, headDim: 8, tieWordEmbeddings: false };
const KL: LossSpec = { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0 };

/** A fixed, learnable sequence task: each next token is a function of the current one. */
function batches(count: number, b: number, t: number, V: number): Batch[] {
  const rng = new Rng(17), out: Batch[] = [];
  for (let i = 0; i < count; i++) {
    const inputs = new Int32Array(b * t), targets = new Int32Array(b * t);
    for (let r = 0; r < b; r++) {
      let x = rng.int(V);
      for (let j = 0; j < t; j++) { inputs[r * t + j] = x; x = (x * 5 + 3) % V; targets[r * t + j] = x; }
    }
    out.push({ inputs, targets, mask: new Float32Array(b * t).fill(1), b, t });
  }
  return out;
}

function setup(be: Backend, precision: Precision, withTeacher: boolean) {
  const student = new Transformer(be, CFG, { batch: 2, seq: 12, training: true, precision });
  student.setWeights(initialWeights(student.layout, CFG, new Rng(3), 0.1));
  const teacher = withTeacher ? new Transformer(be, TEACHER, { batch: 2, seq: 12, training: false, precision }) : null;
  teacher?.setWeights(initialWeights(teacher.layout, TEACHER, new Rng(9), 0.3));
  const runner = new StepRunner(student, teacher, withTeacher ? KL : { kind: 'none', alpha: 0, temperature: 1, beta: 0 });
  const opt = new AdamW(student, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.01 });
  return { student, teacher, runner, opt };
}

test('bf16 model: fp32 master weights and gradients, a bf16 compute copy refreshed by AdamW, a bf16-only teacher', () => {
  const be = createCpuBackend({ threads: 1 });
  try {
    const { student, teacher, runner, opt } = setup(be, 'bf16', true);
    assert.equal(student.params.dtype, 'f32');
    assert.equal(student.weights.dtype, 'bf16');
    assert.equal(student.grads!.dtype, 'f32');
    assert.equal(teacher!.params.dtype, 'bf16');
    assert.equal(teacher!.weights, teacher!.params, 'the teacher is stored once');
    runner.trainStep(batches(1, 2, 12, CFG.vocabSize), opt, 1e-2, 1);
    const master = be.download(student.params), copy = be.download(student.weights);
    let changed = 0;
    for (let i = 0; i < master.length; i++) {
      assert.equal(copy[i], roundBf16(master[i]!), `weight ${i}: the compute copy is the master rounded`);
      if (master[i] !== roundBf16(master[i]!)) changed++;
    }
    assert.ok(changed > master.length / 2, 'the master weights keep more precision than the copy');
  } finally { be.dispose(); }
});

test('bf16 gradients track fp32 ones (relative error ≤ 3e-2: the bf16 teacher itself is rounded) and a 40-step bf16 distillation tracks the fp32 loss curve', () => {
  const be = createCpuBackend({ threads: 1 });
  try {
    const data = batches(40, 2, 12, CFG.vocabSize);
    const runs = (['fp32', 'bf16'] as const).map((p) => setup(be, p, true));
    const grads: Float64Array[] = [];
    const curves: number[][] = [[], []];
    for (let s = 0; s < data.length; s++) {
      runs.forEach((r, i) => {
        const res = r.runner.trainStep([data[s]!], r.opt, 3e-3, 1);
        curves[i]!.push(res.loss);
        if (s === 0) grads.push(Float64Array.from(be.download(r.student.grads!)));
      });
    }
    let d = 0, n = 0;
    for (let i = 0; i < grads[0]!.length; i++) { d += (grads[0]![i]! - grads[1]![i]!) ** 2; n += grads[0]![i]! ** 2; }
    const rel = Math.sqrt(d / n);
    assert.ok(rel <= 3e-2 && rel > 0, `first-step gradient relative error ${rel}`);
    const [f, h] = curves as [number[], number[]];
    assert.ok(f[f.length - 1]! < 0.8 * f[0]!, `fp32 learns: ${f[0]} → ${f[f.length - 1]}`);
    for (let s = 0; s < f.length; s++) {
      assert.ok(Math.abs(h[s]! - f[s]!) <= 0.03 * f[s]!, `step ${s}: bf16 loss ${h[s]} vs fp32 ${f[s]}`);
    }
  } finally { be.dispose(); }
});

test('memory estimate equals the bytes a bf16 (and an fp32) job allocates, at device element sizes', () => {
  const cpu = createCpuBackend({ threads: 1 });
  let bytes = 0;
  const counting = new Proxy(cpu, {
    get(target, prop, recv) {
      if (prop === 'alloc') return (n: number, label: string, d: DType = 'f32') => { bytes += n * dtypeBytes(d); return target.alloc(n, label, d); };
      if (prop === 'allocInt') return (n: number, label: string) => { bytes += n * 4; return target.allocInt(n, label); };
      const v = Reflect.get(target, prop, recv) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  }) as Backend;
  try {
    // Qwen2 shapes, and Qwen3 ones (q/k norm inputs and rstds; head_dim 16 with a query width ≠ hidden).
    const qwen3 = (c: ModelConfig): ModelConfig => ({ ...c, architecture: 'qwen3', qkNorm: true, qkvBias: false, headDim: 16 });
    const pairs = [[presetConfig('tiny', 300), presetConfig('small', 300)], [qwen3(presetConfig('tiny', 300)), qwen3(presetConfig('small', 300))]] as const;
    for (const [student, teacher] of pairs) {
      for (const precision of ['bf16', 'fp32'] as const) {
        bytes = 0;
        const m = new Transformer(counting, student, { batch: 3, seq: 10, training: true, precision });
        const t = new Transformer(counting, teacher, { batch: 3, seq: 10, training: false, precision });
        new AdamW(m, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0 });
        new StepRunner(m, t, KL);
        assert.equal(estimateJobBytes({ student, teacher, batch: 3, seq: 10, training: true, precision }), bytes, `${student.architecture} ${precision}`);
        // --eval-choices: a scoring head for each model (f32 logits, no dlogits chunk for the bf16 student)
        choicesRunner(m); choicesRunner(t);
        assert.equal(estimateJobBytes({ student, teacher, batch: 3, seq: 10, training: true, precision, choices: true }), bytes, `${student.architecture} ${precision} with --eval-choices`);
        // the same student training LoRA adapters (frozen base in the compute dtype, adapters' masters, copy, moments)
        bytes = 0;
        const lora = loraLayout(student, { rank: 4, alpha: 8, targets: [...LORA_TARGETS] });
        const ml = new Transformer(counting, student, { batch: 3, seq: 10, training: true, precision, lora });
        const tl = new Transformer(counting, teacher, { batch: 3, seq: 10, training: false, precision });
        new AdamW(ml.trainable(), { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0 });
        new StepRunner(ml, tl, KL);
        assert.equal(estimateJobBytes({ student, teacher, batch: 3, seq: 10, training: true, precision, lora }), bytes, `LoRA ${student.architecture} ${precision}`);
      }
    }
    const e = (precision: Precision) => estimateJobBytes({ student: presetConfig('qwen2.5-0.5b', 151936), teacher: presetConfig('qwen2.5-1.5b', 151936),
      batch: 8, seq: 1024, training: true, precision });
    assert.ok(e('bf16') < 0.75 * e('fp32'), `bf16 ${e('bf16')} vs fp32 ${e('fp32')} bytes`);
  } finally { cpu.dispose(); }
});

test('--precision: auto is bf16 on cuda and fp32 on cpu; --tf32 means tf32 and contradicts another explicit choice', () => {
  assert.deepEqual(resolvePrecision(undefined, undefined, 'cuda'), { name: 'bf16', model: 'bf16', tf32: false });
  assert.deepEqual(resolvePrecision('auto', undefined, 'cpu'), { name: 'fp32', model: 'fp32', tf32: false });
  assert.deepEqual(resolvePrecision('tf32', undefined, 'cuda'), { name: 'tf32', model: 'fp32', tf32: true });
  assert.deepEqual(resolvePrecision(undefined, true, 'cuda'), { name: 'tf32', model: 'fp32', tf32: true });
  assert.deepEqual(resolvePrecision('bf16', undefined, 'cpu'), { name: 'bf16', model: 'bf16', tf32: false });
  assert.throws(() => resolvePrecision('bf16', true, 'cuda'), /--tf32 contradicts --precision bf16/);
  assert.throws(() => resolvePrecision('fp16' as never, undefined, 'cuda'), /--precision must be one of/);
});
