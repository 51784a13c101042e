/**
 * `train|distill --dry-run [--json]`: the job's plan from the configs alone. The teacher folder here has a
 * config.json and a tokenizer.json but NO weights, the machine has no GPU, and the output folder must not be
 * created: the report still gives the device memory of the job (what the allocations add up to) and, for
 * --device cuda, exactly the kernels the run's pre-warm would compile.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { main } from '../../src/cli/main.js';
import { planKernels } from '../../src/backend/cuda/plan.js';
import { toHfConfig, type ModelConfig } from '../../src/model/config.js';
import { estimateJobBytes } from '../../src/model/memory.js';
import { jobClosures } from '../../src/train/kernel-plan.js';
import { capture, tempDir, tinyConfig, tinyTokenizer, TEXT } from './fixtures.js';

let dir = '', teacher = '', data = '';
let tcfg: ModelConfig;

before(() => {
  dir = tempDir();
  teacher = path.join(dir, 'teacher');
  fs.mkdirSync(teacher);
  tcfg = tinyConfig(tinyTokenizer().vocabSize, { hiddenSize: 32, intermediateSize: 48, headDim: 8 });
  fs.writeFileSync(path.join(teacher, 'config.json'), JSON.stringify(toHfConfig(tcfg)));
  fs.writeFileSync(path.join(teacher, 'tokenizer.json'), JSON.stringify(tinyTokenizer().toJSON()));
  data = path.join(dir, 'data.txt');
  fs.writeFileSync(data, TEXT.join('\n\n'));
});
after(() => { fs.rmSync(dir, { recursive: true, force: true }); });

async function run(argv: string[]) {
  const io = capture();
  const code = await main(argv, io, {});
  return { code, out: io.stdout(), err: io.stderr() };
}

test('distill --dry-run --json --device cuda: memory and the pre-warm plan from config.json + tokenizer.json, no weights, no GPU, nothing written', async () => {
  const out = path.join(dir, 'run');
  const r = await run(['distill', '--teacher', teacher, '--data', data, '--out', out, '--model', 'tiny', '--batch', '2', '--seq', '16',
    '--loss', 'jsd', '--device', 'cuda', '--dry-run', '--json']);
  assert.equal(r.code, 0, r.err);
  assert.equal(fs.existsSync(out), false, 'a dry run creates no run folder');
  const j = JSON.parse(r.out) as { device_bytes: number; kernels: Array<{ family: string; params: Record<string, unknown> }>; loss_vocab: number; teacher: { parameters: number }; precision: string };
  assert.equal(j.loss_vocab, tcfg.vocabSize);
  assert.equal(j.precision, 'bf16', 'bf16 is the CUDA default');
  // The student is the 'tiny' preset sized to the teacher's vocabulary.
  const { presetConfig } = await import('../../src/model/config.js');
  const student = presetConfig('tiny', tcfg.vocabSize);
  // --logits auto: bf16 logits with bf16 models
  assert.equal((j as unknown as { logits: string }).logits, 'bf16');
  assert.equal(j.device_bytes, estimateJobBytes({ student, teacher: tcfg, batch: 2, seq: 16, training: true, precision: 'bf16', logits: 'bf16' }));
  const plan = planKernels(jobClosures({ student, teacher: tcfg, batch: 2, seq: 16, train: true, evaluate: true,
    loss: { kind: 'jsd', alpha: 0.5, temperature: 1, beta: 0.5 }, precision: 'bf16', logits: 'bf16' }));
  assert.deepEqual(j.kernels.map((k) => `${k.family} ${JSON.stringify(k.params)}`).sort(), plan.map((s) => `${s.family} ${JSON.stringify(s.params)}`).sort());
  assert.ok(j.kernels.some((k) => k.family === 'loss' && k.params.kind === 'jsd'));
});

test('--dry-run on the CPU: no kernels; without --json a readable report; --json alone is a usage error', async () => {
  const out = path.join(dir, 'run2');
  const cpu = await run(['train', '--data', data, '--out', out, '--model', 'tiny', '--vocab-size', '300', '--dry-run', '--json']);
  assert.equal(cpu.code, 0, cpu.err);
  assert.deepEqual((JSON.parse(cpu.out) as { kernels: unknown[] }).kernels, []);
  const text = await run(['train', '--data', data, '--out', out, '--model', 'tiny', '--vocab-size', '300', '--dry-run']);
  assert.equal(text.code, 0, text.err);
  assert.match(text.out, /memory +\d+\.\d\d GiB estimated peak/);
  const bad = await run(['train', '--data', data, '--out', out, '--model', 'tiny', '--json']);
  assert.equal(bad.code, 2);
  assert.match(bad.err, /--json goes with --dry-run/);
  assert.equal(fs.existsSync(out), false);
});

/** A teacher folder whose config.json has `vocab` rows (padding past the tokenizer's tokens) and the tiny tokenizer. */
function paddedTeacher(name: string, vocab: number): { folder: string; cfg: ModelConfig } {
  const folder = path.join(dir, name);
  fs.mkdirSync(folder, { recursive: true });
  const cfg = tinyConfig(vocab, { hiddenSize: 32, intermediateSize: 48, headDim: 8 });
  fs.writeFileSync(path.join(folder, 'config.json'), JSON.stringify(toHfConfig(cfg)));
  fs.writeFileSync(path.join(folder, 'tokenizer.json'), JSON.stringify(tinyTokenizer().toJSON()));
  return { folder, cfg };
}

test('distill --dry-run: a teacher padded past the tokenizer plans the loss over the tokenizer\'s real tokens (as the run does)', async () => {
  const size = tinyTokenizer().vocabSize;
  const { folder, cfg } = paddedTeacher('teacher-padded', size + 20);
  const r = await run(['distill', '--teacher', folder, '--data', data, '--out', path.join(dir, 'run3'), '--model', 'tiny', '--batch', '2', '--seq', '16',
    '--dry-run', '--json']);
  assert.equal(r.code, 0, r.err);
  const j = JSON.parse(r.out) as { loss_vocab: number; device_bytes: number };
  assert.equal(j.loss_vocab, size);
  const { presetConfig } = await import('../../src/model/config.js');
  const student = presetConfig('tiny', cfg.vocabSize);
  assert.equal(j.device_bytes, estimateJobBytes({ student, teacher: cfg, batch: 2, seq: 16, training: true, lossVocab: size }));
});

test('distill --dry-run --device cuda: a student and a teacher of different vocab_size plan (loss over the tokenizer\'s tokens)', async () => {
  const size = tinyTokenizer().vocabSize;
  const { folder, cfg } = paddedTeacher('teacher-padded2', size + 20);
  const studentCfg = tinyConfig(size + 8, { hiddenSize: 32, intermediateSize: 48, headDim: 8 });
  const studentJson = path.join(dir, 'student-padded.json');
  fs.writeFileSync(studentJson, JSON.stringify(toHfConfig(studentCfg)));
  const r = await run(['distill', '--teacher', folder, '--data', data, '--out', path.join(dir, 'run4'), '--model', studentJson, '--batch', '2', '--seq', '16',
    '--loss', 'kl', '--device', 'cuda', '--dry-run', '--json']);
  assert.equal(r.code, 0, r.err);
  const j = JSON.parse(r.out) as { loss_vocab: number; kernels: Array<{ family: string; params: Record<string, unknown> }> };
  assert.equal(j.loss_vocab, size);
  const plan = planKernels(jobClosures({ student: studentCfg, teacher: cfg, batch: 2, seq: 16, train: true, evaluate: true, lossVocab: size,
    loss: { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0.5 }, precision: 'bf16', logits: 'bf16' }));
  assert.deepEqual(j.kernels.map((k) => `${k.family} ${JSON.stringify(k.params)}`).sort(), plan.map((s) => `${s.family} ${JSON.stringify(s.params)}`).sort());
});

test('distill --dry-run --device cuda --tf32 plans the tensor-core attention forward the run pre-warms; --precision fp32 the fp32 one', async () => {
  const base = ['distill', '--teacher', teacher, '--data', data, '--out', path.join(dir, 'run5'), '--model', 'tiny', '--batch', '2', '--seq', '16',
    '--device', 'cuda', '--dry-run', '--json'];
  const families = async (argv: string[]): Promise<string[]> => {
    const r = await run(argv);
    assert.equal(r.code, 0, r.err);
    return (JSON.parse(r.out) as { kernels: Array<{ family: string }> }).kernels.map((k) => k.family);
  };
  const tf32 = await families([...base, '--tf32']);
  assert.ok(tf32.includes('attention_fwd_mma'), tf32.join(' '));
  assert.ok(!tf32.includes('attention_fwd'), tf32.join(' '));
  const fp32 = await families([...base, '--precision', 'fp32']);
  const contra = await run([...base, '--precision', 'bf16', '--tf32']);
  assert.equal(contra.code, 2);
  assert.match(contra.err, /--tf32 contradicts --precision bf16/);
  assert.ok(fp32.includes('attention_fwd'), fp32.join(' '));
  assert.ok(!fp32.includes('attention_fwd_mma'), fp32.join(' '));
});

test('train --dry-run --json: checkpoint_host_bytes is what the run\'s model and AdamW keep on the host for checkpoint snapshots', async () => {
  const r = await run(['train', '--data', data, '--out', path.join(dir, 'h'), '--model', 'tiny', '--batch', '2', '--seq', '16', '--dry-run', '--json']);
  assert.equal(r.code, 0, r.err);
  const j = JSON.parse(r.out) as { checkpoint_host_bytes: number; student: { vocab_size: number } };
  const { presetConfig } = await import('../../src/model/config.js');
  const { createCpuBackend } = await import('../../src/backend/cpu/cpu-backend.js');
  const { Transformer } = await import('../../src/model/transformer.js');
  const { AdamW } = await import('../../src/train/optimizer.js');
  const be = createCpuBackend({ threads: 1 });
  try {
    const m = new Transformer(be, presetConfig('tiny', j.student.vocab_size), { batch: 2, seq: 16, training: true });
    const kept = new AdamW(m, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0 }).keptMoments();
    assert.equal(j.checkpoint_host_bytes, m.keptWeights()!.byteLength + kept.m.byteLength + kept.v.byteLength);
  } finally { be.dispose(); }
  const text = await run(['train', '--data', data, '--out', path.join(dir, 'h'), '--model', 'tiny', '--batch', '2', '--seq', '16', '--dry-run']);
  assert.match(text.out, /host .* kept for checkpoint snapshots/);
});

test('distill --dry-run --device cuda with generation items in --eval-choices: a generator of batch × seq per model in the memory, their kernels in the plan', async () => {
  const items = path.join(dir, 'gen-items.jsonl'), mc = path.join(dir, 'mc-items.jsonl');
  fs.writeFileSync(items, '{"context": "the model", "target": "learns"}\n');
  fs.writeFileSync(mc, '{"context": "the model", "choices": ["learns", "teaches"], "answer": 0}\n');
  const base = ['distill', '--teacher', teacher, '--data', data, '--out', path.join(dir, 'run-gen'), '--model', 'tiny', '--batch', '2', '--seq', '16',
    '--device', 'cuda', '--dry-run', '--json', '--eval-max-gen-toks', '4'];
  const withGen = await run([...base, '--eval-choices', mc, items]), without = await run([...base, '--eval-choices', mc]);
  assert.equal(withGen.code, 0, withGen.err);
  assert.equal(without.code, 0, without.err);
  const { presetConfig } = await import('../../src/model/config.js');
  const { batchGeneratorBytes } = await import('../../src/model/memory.js');
  const student = presetConfig('tiny', tcfg.vocabSize);
  const a = JSON.parse(withGen.out) as { device_bytes: number; kernels: unknown[] }, b = JSON.parse(without.out) as { device_bytes: number; kernels: unknown[] };
  // bf16 (the CUDA default): the student's generator and the teacher's
  const { fusesQkv, parameterLayout } = await import('../../src/model/params.js');
  const fused = (c: ModelConfig): boolean => fusesQkv(parameterLayout(c));
  assert.equal(a.device_bytes - b.device_bytes, batchGeneratorBytes(student, 2, 16, 2, fused(student)) + batchGeneratorBytes(tcfg, 2, 16, 2, fused(tcfg)));
  assert.ok(a.kernels.length > b.kernels.length, 'the generation kernels are planned');
  // --eval-gen-batch 5: generators of 5 sequences
  const five = await run([...base, '--eval-choices', mc, items, '--eval-gen-batch', '5']);
  assert.equal(five.code, 0, five.err);
  assert.equal((JSON.parse(five.out) as { device_bytes: number }).device_bytes - b.device_bytes,
    batchGeneratorBytes(student, 5, 16, 2, fused(student)) + batchGeneratorBytes(tcfg, 5, 16, 2, fused(tcfg)));
});
