/**
 * Training throughput on the CPU backend for a named model config: tokens/s of a full training step
 * (forward, loss, backward, AdamW) and of a distillation step with a teacher, after warm-up steps.
 * Usage: node dist/bench/train.js [--model small] [--teacher base] [--batch 8] [--seq 64] [--vocab 1024] [--steps 5] [--threads 0]
 */
import { createCpuBackend } from '../src/backend/cpu/cpu-backend.js';
import { presetConfig, parameterCount } from '../src/model/config.js';
import { initialWeights } from '../src/model/params.js';
import { Transformer } from '../src/model/transformer.js';
import { AdamW } from '../src/train/optimizer.js';
import { StepRunner, type Batch } from '../src/train/step.js';
import { Rng } from '../src/util/rng.js';

function arg(name: string, def: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] ? process.argv[i + 1]! : def;
}
const model = arg('model', 'small'), teacherName = arg('teacher', 'base');
const B = Number(arg('batch', '8')), T = Number(arg('seq', '64')), V = Number(arg('vocab', '1024'));
const steps = Number(arg('steps', '5')), threads = Number(arg('threads', '0'));

const be = createCpuBackend(threads > 0 ? { threads } : {});
const rng = new Rng(1);
const batch = (): Batch => {
  const inputs = Int32Array.from({ length: B * T }, () => rng.int(V));
  const targets = Int32Array.from({ length: B * T }, () => rng.int(V));
  return { inputs, targets, mask: new Float32Array(B * T).fill(1), b: B, t: T };
};
function bench(label: string, runner: StepRunner, opt: AdamW): void {
  runner.trainStep([batch()], opt, 1e-3, 1); // warm-up
  const t0 = process.hrtime.bigint();
  for (let s = 0; s < steps; s++) runner.trainStep([batch()], opt, 1e-3, 1);
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(`${label.padEnd(34)} ${(secs / steps * 1000).toFixed(1).padStart(8)} ms/step  ${Math.round(B * T * steps / secs).toString().padStart(7)} tokens/s`);
}
const cfg = presetConfig(model, V);
const student = new Transformer(be, cfg, { batch: B, seq: T, training: true });
student.setWeights(initialWeights(student.layout, cfg, rng));
console.log(`CPU backend, ${threads || 'all'} threads; batch ${B} x seq ${T}, vocab ${V}; student ${model} (${(parameterCount(cfg) / 1e6).toFixed(2)}M params)`);
bench(`train ${model}`, new StepRunner(student, null, { kind: 'none', alpha: 0, temperature: 1, beta: 0.5 }),
  new AdamW(student, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 }));
const tcfg = presetConfig(teacherName, V);
const teacher = new Transformer(be, tcfg, { batch: B, seq: T, training: false });
teacher.setWeights(initialWeights(teacher.layout, tcfg, rng));
bench(`distill ${model} <- ${teacherName} (${(parameterCount(tcfg) / 1e6).toFixed(2)}M)`, new StepRunner(student, teacher, { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0.5 }),
  new AdamW(student, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 }));
be.dispose();
