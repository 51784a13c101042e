/**
 * On-policy distillation (src/train/on-policy.ts): prompts from text and chat windows, the batch over prompt +
 * completion with the loss on the completion only (stop token kept); `distill --on-policy` runs end to end on the CPU
 * with the metrics the issue names (on-policy share, generated length, the teacher's log-likelihood of the samples),
 * a λ of 0.5 mixes on- and off-policy steps deterministically, and --resume continues bit-exactly.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { isOnPolicyStep, onPolicyBatch, onPolicyMicroBatch, promptsOf, type OnPolicyOptions } from '../../src/train/on-policy.js';
import type { BatchGenerator } from '../../src/model/batch-generate.js';
import { runTraining } from '../../src/train/run.js';
import { DEFAULT_RUN_OPTIONS, type RunOptions } from '../../src/train/options.js';
import { TEXT, tempDir, writeTinyCheckpoint } from '../cli/fixtures.js';

test('on-policy batches: prompts from text and chat windows; the loss counts the completion (and its stop token) only', () => {
  const t = 8;
  const inputs = Int32Array.from([10, 11, 12, 13, 14, 15, 16, 17, /* chat: */ 20, 21, 22, 23, 24, 25, 26, 27]);
  const mask = Float32Array.from([1, 1, 1, 1, 1, 1, 1, 1, /* the first 3 targets are the user's */ 0, 0, 0, 1, 1, 1, 0, 0]);
  assert.deepEqual(promptsOf(inputs, mask, 2, t, 4), [[10, 11, 12, 13], [20, 21, 22, 23]]);
  assert.deepEqual(promptsOf(inputs, mask, 2, t, 3), [[10, 11, 12], [20, 21, 22]]);
  const b = onPolicyBatch([[1, 2, 3], [4]], [[7, 8], [9, 9, 9]], [5, null], t, 0);
  assert.deepEqual([...b.inputs], [1, 2, 3, 7, 8, 5, 0, 0, 4, 9, 9, 9, 0, 0, 0, 0]);
  assert.deepEqual([...b.targets], [-1, -1, 7, 8, 5, -1, -1, -1, 9, 9, 9, -1, -1, -1, -1, -1]);
  assert.deepEqual([...b.mask], [0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0]);
  assert.equal(b.teacherCe, true);
  // λ: a deterministic share of the steps
  const on = Array.from({ length: 400 }, (_, s) => isOnPolicyStep(3, s, 0.5)).filter(Boolean).length;
  assert.ok(on > 160 && on < 240, `${on} of 400 steps on-policy at λ = 0.5`);
  assert.ok(Array.from({ length: 50 }, (_, s) => isOnPolicyStep(3, s, 1)).every(Boolean));
  assert.ok(!Array.from({ length: 50 }, (_, s) => isOnPolicyStep(3, s, 0)).some(Boolean));
});

test('on-policy generation: a reply to a conversation also stops at the end of its turn, a text continuation does not; sequence numbers never repeat across steps', () => {
  const t = 8;
  const inputs = Int32Array.from([10, 11, 12, 13, 14, 15, 16, 17, 20, 21, 22, 23, 24, 25, 26, 27]);
  const mask = Float32Array.from([1, 1, 1, 1, 1, 1, 1, 1, /* chat */ 0, 0, 0, 1, 1, 1, 0, 0]);
  const seen: Array<{ sequence0: number; rowStopIds: number[][] }> = [];
  const gen = {
    generateOnDevice: (prompts: number[][], opts: { sequence0: number; rowStopIds: number[][] }) => {
      seen.push({ sequence0: opts.sequence0, rowStopIds: opts.rowStopIds });
      return { tokens: prompts.map(() => [1]), finish: prompts.map(() => 'length'), stops: prompts.map(() => null) };
    },
  } as unknown as BatchGenerator;
  const o: OnPolicyOptions = { fraction: 1, genLen: 3, promptLen: 4, temperature: 1, topP: 1, topK: 0, vocab: 50 };
  const stops = { stopIds: [2], turnEndIds: [7, 8] };
  onPolicyMicroBatch(gen, o, { inputs, mask, b: 2, t }, 1, 0, { index: 0, perStep: 1 }, stops, 0);
  assert.deepEqual(seen[0]!.rowStopIds, [[2], [2, 7, 8]]);
  // 100 micro-batches a step (grad-accum × ranks): the last of step 0 and the first of step 1 draw with other numbers
  onPolicyMicroBatch(gen, o, { inputs, mask, b: 2, t }, 1, 0, { index: 99, perStep: 100 }, stops, 0);
  onPolicyMicroBatch(gen, o, { inputs, mask, b: 2, t }, 1, 1, { index: 0, perStep: 100 }, stops, 0);
  assert.ok(seen[2]!.sequence0 >= seen[1]!.sequence0 + 2, `step 1 starts at ${seen[2]!.sequence0}, step 0 ended at ${seen[1]!.sequence0 + 1}`);
  // up to 64 micro-batches a step: the numbers of earlier versions (a resumed run draws what it drew)
  onPolicyMicroBatch(gen, o, { inputs, mask, b: 2, t }, 1, 3, { index: 5, perStep: 8 }, stops, 0);
  assert.equal(seen[3]!.sequence0, (3 * 64 + 5) * 2);
});

test('distill --on-policy: runs with a live teacher, logs the share, generated length and teacher log-likelihood, and resumes bit-exactly', async () => {
  const dir = tempDir();
  const teacher = path.join(dir, 'teacher');
  writeTinyCheckpoint(teacher, 21);
  fs.writeFileSync(path.join(dir, 'student.json'), fs.readFileSync(path.join(teacher, 'config.json')));
  const data = path.join(dir, 'data.txt');
  fs.writeFileSync(data, Array.from({ length: 24 }, (_, i) => TEXT[i % TEXT.length]).join(' '));
  const opts = (over: Partial<RunOptions>): RunOptions => ({
    ...DEFAULT_RUN_OPTIONS, mode: 'distill', data: [data], teacher, model: path.join(dir, 'student.json'), out: path.join(dir, 'run'),
    batch: 3, seq: 12, steps: 6, warmup: 1, evalEvery: 3, saveEvery: 3, seed: 5, threads: 1, quiet: true, loss: 'reverse-kl', alpha: 1,
    temperature: 1, onPolicy: 1, promptLen: 4, genLen: 6, genTemperature: 1, genTopP: 0.95, genTopK: 0, ...over,
  });
  const logs: string[] = [];
  const full = await runTraining(opts({ out: path.join(dir, 'full') }), { log: (l) => logs.push(l) });
  assert.equal(full.status, 'completed');
  assert.ok(logs.some((l) => /^on-policy: 100% of the steps/.test(l)), logs.join('\n'));
  const rows = fs.readFileSync(path.join(dir, 'full', 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>)
    .filter((r) => r.loss !== undefined);
  assert.equal(rows.length, 6);
  for (const r of rows) {
    assert.equal(r.on_policy, 1);
    assert.ok(r.gen_len! > 0 && r.gen_len! <= 7, `gen_len ${r.gen_len}`);
    assert.ok(Number.isFinite(r.teacher_loglik) && r.teacher_loglik! < 0, `teacher_loglik ${r.teacher_loglik}`);
    assert.ok(Number.isFinite(r.loss));
  }
  // resume: stop after 3 steps, continue, the same final weights
  const part = path.join(dir, 'part');
  await runTraining(opts({ out: part, stopAfter: 3 }), { log: () => {} });
  await runTraining(opts({ out: part, resume: true }), { log: () => {} });
  assert.deepEqual(fs.readFileSync(path.join(part, 'final', 'model.safetensors')), fs.readFileSync(path.join(dir, 'full', 'final', 'model.safetensors')));
  // λ = 0.5: both kinds of steps, the off-policy ones without generation metrics
  await runTraining(opts({ out: path.join(dir, 'half'), onPolicy: 0.5, steps: 12, evalEvery: 12, saveEvery: 12 }), { log: () => {} });
  const half = fs.readFileSync(path.join(dir, 'half', 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>)
    .filter((r) => r.loss !== undefined);
  const onSteps = half.filter((r) => r.on_policy === 1);
  assert.ok(onSteps.length > 0 && onSteps.length < half.length, `${onSteps.length} of ${half.length} on-policy`);
  assert.ok(half.filter((r) => r.on_policy === 0).every((r) => r.gen_len === undefined));
});

test('distill --on-policy with padded vocabularies (vocab_size past the tokenizer, as Qwen\'s): the student never writes a padding id', async () => {
  // Found on the H100 (1.5B→0.5B, vocab 151936 over 151669 tokens): the random-init student drew a padding row and
  // the step failed ("loss target ... outside the loss vocabulary"). 40 padding rows here make a draw near-certain.
  const dir = tempDir();
  const teacher = path.join(dir, 'teacher');
  const real = writeTinyCheckpoint(path.join(dir, 'probe'), 1).vocabSize;
  const cfg = writeTinyCheckpoint(teacher, 21, { vocabSize: real + 40 });
  fs.writeFileSync(path.join(dir, 'student.json'), fs.readFileSync(path.join(teacher, 'config.json')));
  const data = path.join(dir, 'data.txt');
  fs.writeFileSync(data, Array.from({ length: 24 }, (_, i) => TEXT[i % TEXT.length]).join(' '));
  const logs: string[] = [];
  const r = await runTraining({
    ...DEFAULT_RUN_OPTIONS, mode: 'distill', data: [data], teacher, model: path.join(dir, 'student.json'), out: path.join(dir, 'run'),
    batch: 3, seq: 16, steps: 4, warmup: 1, evalEvery: 4, saveEvery: 4, seed: 5, threads: 1, quiet: true, loss: 'reverse-kl', alpha: 1,
    temperature: 1, onPolicy: 1, promptLen: 4, genLen: 10, genTemperature: 1.5, genTopP: 1, genTopK: 0,
  }, { log: (l) => logs.push(l) });
  assert.equal(r.status, 'completed', logs.join('\n'));
  assert.equal(cfg.vocabSize, real + 40);
  const rows = fs.readFileSync(path.join(dir, 'run', 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>)
    .filter((x) => x.loss !== undefined);
  assert.equal(rows.length, 4);
  assert.ok(rows.every((x) => x.on_policy === 1 && x.gen_len! > 0 && Number.isFinite(x.loss)));
});

test('promptsOf keeps a prompt inside its window\'s first document where the windows carry document positions (bfd)', () => {
  const t = 10, inputs = Int32Array.from({ length: 2 * t }, (_, i) => 100 + i), mask = new Float32Array(2 * t).fill(1);
  // window 0: documents of 3 and 7 rows; window 1: one document
  const positions = Int32Array.from([0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
  assert.deepEqual(promptsOf(inputs, mask, 2, t, 6, positions), [[100, 101, 102], [110, 111, 112, 113, 114, 115]]);
  assert.deepEqual(promptsOf(inputs, mask, 2, t, 6), [[100, 101, 102, 103, 104, 105], [110, 111, 112, 113, 114, 115]]);
});
