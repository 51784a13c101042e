/**
 * One distillation configuration's training step on the GPU, timed, through the library (StepRunner, AdamW, the
 * strict pre-warm of the job's own closures) rather than the CLI: a teacher and a student of the given presets
 * (random weights, vocab 151936, bf16), KL at T = 2 with alpha 0.5, batch × seq random tokens, the student trained
 * fully, through LoRA adapters (frozen base) or QLoRA (adapters on an NF4 base); the teacher in bf16 or, with
 * TEACHER_DTYPE=nf4, NF4 (src/model/frozen.ts). Prints one JSON line: ms/step and tokens/s over the timed steps, the
 * seconds the weights took to load (NF4: quantized on the host), and the job's memory estimate. Peak device memory is
 * measured from outside (scripts/cuda/lora-bench.sh, nf4-bench.sh: nvidia-smi).
 * Usage: node dist/scripts/cuda/lora-step.js <teacher preset> <student preset> <full|lora:R|qlora:R> [batch] [seq] [steps]
 */
import { createCudaBackend } from '../../src/backend/cuda/index.js';
import { presetConfig } from '../../src/model/config.js';
import { fastWeights } from './fast-weights.js';
import { Transformer } from '../../src/model/transformer.js';
import { LORA_TARGETS, loraInitialWeights, loraLayout } from '../../src/model/lora.js';
import { estimateJobBytes, formatGiB } from '../../src/model/memory.js';
import { AdamW } from '../../src/train/optimizer.js';
import { StepRunner } from '../../src/train/step.js';
import { jobClosures } from '../../src/train/kernel-plan.js';
import { Rng } from '../../src/util/rng.js';

const [tName, sName, mode, bArg, sArg, nArg] = process.argv.slice(2);
if (!tName || !sName || !mode || !/^(full|q?lora:\d+)$/.test(mode)) {
  process.stderr.write('usage: lora-step.js <teacher preset> <student preset> <full|lora:R|qlora:R> [batch] [seq] [steps]  (env TEACHER_DTYPE=nf4)\n');
  process.exit(2);
}
const B = Number(bArg ?? 8), T = Number(sArg ?? 1024), steps = Number(nArg ?? 10), V = 151936, lossVocab = 151669;
const teacherCfg = presetConfig(tName, V), studentCfg = presetConfig(sName, V);
const rank = mode === 'full' ? 0 : Number(mode.split(':')[1]);
const studentFrozen = mode.startsWith('qlora') ? 'nf4' as const : undefined;
const teacherFrozen = process.env.TEACHER_DTYPE === 'nf4' ? 'nf4' as const : undefined;
const lora = rank > 0 ? loraLayout(studentCfg, { rank, alpha: 2 * rank, targets: [...LORA_TARGETS] }) : undefined;
const loss = { kind: 'kl' as const, alpha: 0.5, temperature: 2, beta: 0 };

const be = createCudaBackend({ strict: true, cacheDir: process.env.DISTILLERY_CACHE_DIR ?? '/tmp/distillery-bench/kc' });
const job = { student: studentCfg, teacher: teacherCfg, batch: B, seq: T, loss, train: true, lossVocab, precision: 'bf16' as const, lora, studentFrozen, teacherFrozen };
await be.prepare(jobClosures(job));
const student = new Transformer(be, studentCfg, { batch: B, seq: T, training: true, precision: 'bf16', lora, label: 'student', frozenDtype: studentFrozen });
const l0 = process.hrtime.bigint();
student.setWeights(fastWeights(studentCfg));
if (student.lora) {
  // B ≠ 0 (a trained adapter's cost is the same as a fresh one's; the values only need to be finite)
  const w = loraInitialWeights(lora!, new Rng(1));
  for (let i = 0; i < w.length; i++) if (w[i] === 0) w[i] = 1e-3;
  student.lora.setWeights(w);
}
const teacher = new Transformer(be, teacherCfg, { batch: B, seq: T, training: false, precision: 'bf16', label: 'teacher', frozenDtype: teacherFrozen });
teacher.setWeights(fastWeights(teacherCfg));
const loadSeconds = Number(process.hrtime.bigint() - l0) / 1e9;
const runner = new StepRunner(student, teacher, loss, { lossVocab });
const opt = new AdamW(student.trainable(), { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.01 });
const n = B * T;
const batchAt = (s: number): { inputs: Int32Array; targets: Int32Array; mask: Float32Array; b: number; t: number } => ({
  inputs: Int32Array.from({ length: n }, (_, i) => (i * 7919 + s * 104729) % lossVocab),
  targets: Int32Array.from({ length: n }, (_, i) => (i * 15485863 + s * 31) % lossVocab),
  mask: new Float32Array(n).fill(1), b: B, t: T,
});
const losses: number[] = [];
for (let s = 0; s < 2; s++) losses.push(runner.trainStep([batchAt(s)], opt, 1e-4, 1).loss); // eager, then captured
const t0 = process.hrtime.bigint();
for (let s = 2; s < 2 + steps; s++) losses.push(runner.trainStep([batchAt(s)], opt, 1e-4, 1).loss);
const sec = Number(process.hrtime.bigint() - t0) / 1e9;
const est = estimateJobBytes({ student: studentCfg, teacher: teacherCfg, batch: B, seq: T, training: true, lossVocab, precision: 'bf16', lora, studentFrozen, teacherFrozen });
console.log(JSON.stringify({
  teacher: tName, teacher_dtype: teacherFrozen ?? 'bf16', student: sName, mode, batch: B, seq: T, load_s: +loadSeconds.toFixed(1), ms_per_step: +(1000 * sec / steps).toFixed(1), tokens_per_s: Math.round(n * steps / sec),
  trainable_parameters: student.trainable().layout.total, estimate: formatGiB(est), loss_first: losses[0], loss_last: losses.at(-1),
}));
be.dispose();
