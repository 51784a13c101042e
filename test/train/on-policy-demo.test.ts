/**
 * The issue's check of on-policy distillation on the demo's teacher and data (src/demo.ts's full recipe): students
 * distilled on-policy (λ = 1 and λ = 0.5) and off-policy (λ = 0) with the same loss, at about the same number of trained
 * (counted) tokens, then each scored on its own samples of the validation prompts: the on-policy students' samples are
 * likelier under the teacher and closer to it in reverse KL than the off-policy student's. Validation cross-entropy is
 * printed beside.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { demoRecipe } from '../../src/demo.js';
import { runTraining, type RunSummary } from '../../src/train/run.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { loadTransformer } from '../../src/model/checkpoint.js';
import { BatchGenerator } from '../../src/model/batch-generate.js';
import { StepRunner } from '../../src/train/step.js';
import { scoreOwnSamples, promptsOf, type OwnSampleScore } from '../../src/train/on-policy.js';
import { loadDocCorpus, packDocuments, splitTrainVal } from '../../src/data/index.js';
import { Tokenizer } from '../../src/tokenizer/bpe.js';
import { Rng } from '../../src/util/rng.js';

test('demo: on-policy students (λ = 1, 0.5) score better on their own samples than the off-policy one (teacher log-likelihood, reverse KL)', async (t) => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-on-policy-demo-'));
  const r = demoRecipe(out, false, 2);
  const log = (): void => {};
  await runTraining({ ...r.teacher, quiet: true }, { log });
  // One loss for all three: the forward KL alone (α = 1), at T = 1; the on-policy runs get more steps so that every
  // student trains on about the same number of counted tokens (an on-policy step counts only its completions).
  const base = { ...r.distilled, quiet: true, loss: 'kl' as const, alpha: 1, temperature: 1, promptLen: 32, genLen: 32, genTemperature: 1 };
  const students: Array<[string, number, number]> = [['off-policy', 0, base.steps], ['λ = 0.5', 0.5, Math.round(base.steps * 4 / 3)], ['λ = 1', 1, Math.round(base.steps * 2.35)]];
  const runs: Record<string, RunSummary> = {};
  for (const [name, lambda, steps] of students) {
    runs[name] = await runTraining({ ...base, onPolicy: lambda, steps, warmup: Math.round(steps * 0.05), evalEvery: steps, saveEvery: steps,
      out: path.join(out, name.replace(/[^a-z0-9]+/gi, '-')) }, { log });
  }
  // Score each student on its own samples of validation prompts (the first 32 tokens of each validation window).
  const tok = Tokenizer.fromFile(path.join(out, 'teacher', 'tokenizer.json'));
  const docs = loadDocCorpus({ maxChars: base.maxChars }).documents;
  const eos = tok.eosId ?? tok.tokenToId('<|endoftext|>')!;
  const packed = packDocuments(tok, docs, { seqLen: base.seq, eosId: eos });
  const { val } = splitTrainVal(packed.windows, base.valFraction, new Rng(base.seed));
  const wins = val.slice(0, 64);
  const inputs = new Int32Array(wins.length * base.seq), mask = new Float32Array(wins.length * base.seq);
  wins.forEach((w, i) => { inputs.set(w.inputs, i * base.seq); mask.set(w.mask, i * base.seq); });
  const prompts = promptsOf(inputs, mask, wins.length, base.seq, 32);
  const be = createCpuBackend({ threads: 2 });
  const teacher = loadTransformer(be, path.join(out, 'teacher', 'final'), { batch: base.batch, seq: base.seq, training: false }).model;
  const scores: Record<string, OwnSampleScore> = {};
  for (const [name] of students) {
    const student = loadTransformer(be, path.join(runs[name]!.out, 'final'), { batch: base.batch, seq: base.seq, training: false }).model;
    const runner = new StepRunner(student, teacher, { kind: 'reverse-kl', alpha: 1, temperature: 1, beta: 0 });
    scores[name] = scoreOwnSamples(new BatchGenerator(student, base.batch, base.seq), runner, prompts, base.seq, 32, 11, [eos], eos, base.batch);
  }
  be.dispose();
  const lines = students.map(([name]) => `${name.padEnd(10)} tokens ${runs[name]!.tokensTrained}, own samples: teacher log-lik ${scores[name]!.teacherLogLik.toFixed(4)}, ` +
    `reverse KL ${scores[name]!.reverseKl.toFixed(4)}, length ${scores[name]!.genLen.toFixed(1)}; validation CE ${runs[name]!.finalValCe.toFixed(4)}`);
  for (const l of lines) { t.diagnostic(l); process.stderr.write(`[on-policy-demo] ${l}\n`); }
  const off = scores['off-policy']!;
  for (const name of ['λ = 0.5', 'λ = 1']) {
    assert.ok(scores[name]!.teacherLogLik > off.teacherLogLik, `${name}: teacher log-likelihood of own samples\n${lines.join('\n')}`);
    assert.ok(scores[name]!.reverseKl < off.reverseKl, `${name}: reverse KL on own samples\n${lines.join('\n')}`);
  }
  fs.rmSync(out, { recursive: true, force: true });
});
