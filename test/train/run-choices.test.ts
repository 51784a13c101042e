/**
 * --eval-choices in training (src/train/run-choices.ts): the student's multiple-choice acc and acc_norm in metrics.jsonl
 * at every evaluation (also without validation windows), a live teacher's once at step 0, the summary's last scores;
 * each equal to what `distillery eval --choices` gives for the same weights in the same window (an independent run of
 * the eval command on the saved final/ model and on the teacher).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { runTraining } from '../../src/train/run.js';
import type { RunOptions } from '../../src/train/options.js';
import { evaluate } from '../../src/cli/commands/eval.js';
import { readMetrics } from '../../src/train/run-state.js';
import { corpusFile, tinyRunOptions } from './corpus.js';
import { runJobShape } from '../../src/train/kernel-plan.js';
import { choiceRow, fileTags, scoresOfRow, shareRowScores } from '../../src/train/run-choices.js';
import { scoresSaid } from '../../src/eval/choices.js';
import { generationSettings } from '../../src/eval/generation.js';
import { presetConfig } from '../../src/model/config.js';
import { runCli, tinyTokenizer } from '../cli/fixtures.js';
import { DEFAULT_RUN_OPTIONS } from '../../src/train/options.js';
import { prepareRunChoices } from '../../src/train/run-choices.js';
import { RunGeneration } from '../../src/train/run-generation.js';
import { runStopIds } from '../../src/train/run-models.js';
import { runGeneration } from '../../src/eval/generate-items.js';
import { DEFAULT_CHAT_FORMAT } from '../../src/tokenizer/chat.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { Transformer } from '../../src/model/transformer.js';
import { BatchGenerator } from '../../src/model/batch-generate.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Rng } from '../../src/util/rng.js';

const tmp = (): string => fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-run-choices-'));
const quiet = { log: (): void => {} };

/** 6 steps, evaluating every 3 (steps 0, 3 and 6 score the items). */
const opts = (dir: string, over: Partial<RunOptions>): RunOptions => tinyRunOptions(dir, { steps: 6, evalEvery: 3, saveEvery: 6, warmup: 1, ...over });

function itemsFile(dir: string): string {
  const f = path.join(dir, 'items.jsonl');
  const items = [
    { context: 'the model learns to', choices: ['predict next token', 'teacher'], answer: 0 },
    { context: 'a teacher helps', choices: ['student', 'the text and a model'], answer: 0 },
    { context: 'the student learns from', choices: ['text', 'token to predict'], answer: 1 },
    { context: 'next token from text and a teacher helps the student learns to predict the', choices: ['model', 'next'], answer: 0 },
    { context: '', choices: ['the model', 'learns'], answer: 0 },
    { context: 'the teacher helps the', continuation: ' student' },
    { context: 'a model learns to predict the next', continuation: ' token' },
  ];
  fs.writeFileSync(f, items.map((x) => JSON.stringify(x)).join('\n') + '\n');
  return f;
}

test('--eval-choices: acc and acc_norm at every evaluation and a live teacher\'s at step 0, as eval --choices scores the same weights', async () => {
  const dir = tmp(), items = itemsFile(dir);
  const teacherRun = await runTraining(opts(dir, { out: path.join(dir, 'teacher'), steps: 12 }), quiet);
  const logged: string[] = [];
  const s = await runTraining(opts(dir, { mode: 'distill', teacher: teacherRun.finalDir!, out: path.join(dir, 'student'), evalChoices: [items] }),
    { log: (l: string) => { logged.push(l); } });
  assert.equal(s.status, 'completed');
  assert.ok(logged.some((l) => /^choices: 7 items, 12 continuations scored at every evaluation$/.test(l)), logged.join('\n'));
  const rows = readMetrics(path.join(s.out, 'metrics.jsonl')).filter((m) => (m as Record<string, unknown>).val_acc !== undefined) as Array<Record<string, number>>;
  assert.deepEqual(rows.map((r) => r.step), [0, 3, 6]);
  for (const r of rows) {
    for (const k of ['val_acc', 'val_acc_norm']) assert.ok(r[k]! >= 0 && r[k]! <= 1 && Number.isInteger(r[k]! * 5), `${k} ${r[k]}`);
    assert.ok(r.val_greedy! >= 0 && r.val_greedy! <= 1 && Number.isInteger(r.val_greedy! * 2) && r.val_cont_ppl! > 1, `continuations ${r.val_greedy} ${r.val_cont_ppl}`);
    assert.ok(r.val_loss !== undefined, 'the scores ride on the validation row');
    assert.ok(r.val_token_acc! >= 0 && r.val_token_acc! <= 1, 'the validation rows have the token accuracy');
  }
  assert.ok(rows[0]!.teacher_acc !== undefined && rows[1]!.teacher_acc === undefined, 'the teacher is scored once, at the start');
  // The same scores from the eval command, on the weights the run saved (the final step's) and on the teacher.
  const ev = (model: string) => evaluate({ model, data: [], choices: [items], seq: 16, batch: 3, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all' });
  const mine = (await ev(s.finalDir!)).choices!, teacher = (await ev(teacherRun.finalDir!)).choices!;
  assert.equal(rows[2]!.val_acc, mine.acc);
  assert.equal(rows[2]!.val_acc_norm, mine.accNorm);
  assert.equal(rows[0]!.teacher_acc, teacher.acc);
  assert.equal(rows[0]!.teacher_acc_norm, teacher.accNorm);
  assert.equal(rows[2]!.val_greedy, mine.greedy!.acc);
  assert.equal(rows[2]!.val_cont_ppl, mine.greedy!.perplexity);
  assert.equal(rows[0]!.teacher_greedy, teacher.greedy!.acc);
  assert.equal(rows[0]!.teacher_cont_ppl, teacher.greedy!.perplexity);
  const both = (m: typeof mine) => ({ acc: m.acc, accNorm: m.accNorm, accBytes: m.accBytes, brierScore: m.brierScore, greedy: { acc: m.greedy!.acc, perplexity: m.greedy!.perplexity } });
  assert.equal(rows[2]!.val_acc_bytes, mine.accBytes);
  assert.equal(rows[2]!.val_brier_score, mine.brierScore);
  assert.equal(rows[0]!.teacher_brier_score, teacher.brierScore);
  assert.deepEqual(s.choices, { items: 7, step: 6, ...both(mine), teacher: both(teacher) });
  // every training row has the step's token accuracy
  const steps = readMetrics(path.join(s.out, 'metrics.jsonl')).filter((m) => (m as Record<string, unknown>).loss !== undefined) as Array<Record<string, number>>;
  assert.ok(steps.length === 6 && steps.every((r) => r.token_acc! >= 0 && r.token_acc! <= 1));
  const summary = JSON.parse(fs.readFileSync(path.join(s.out, 'summary.json'), 'utf8')) as { choices: unknown };
  assert.deepEqual(summary.choices, s.choices);
});

test('--eval-choices without validation windows still scores at every evaluation; a context longer than --seq is cut, with a warning', async () => {
  const dir = tmp(), items = itemsFile(dir);
  const logged: string[] = [];
  const s = await runTraining(opts(dir, { valFraction: 0, evalChoices: [items], seq: 12 }), { log: (l: string) => { logged.push(l); } });
  const rows = readMetrics(path.join(s.out, 'metrics.jsonl')).filter((m) => (m as Record<string, unknown>).val_acc !== undefined) as Array<Record<string, number>>;
  assert.deepEqual(rows.map((r) => r.step), [0, 3, 6]);
  assert.ok(rows.every((r) => r.val_loss === undefined && r.teacher_acc === undefined));
  assert.ok(logged.some((l) => /^warning: --eval-choices: the context of \d+ of 12 continuations is cut on the left to fit --seq 12 \(the longest needs \d+\)$/.test(l)), logged.join('\n'));
  const mine = (await evaluate({ model: s.finalDir!, data: [], choices: [items], seq: 12, batch: 4, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all' })).choices!;
  assert.equal(rows[2]!.val_acc, mine.acc);
  assert.equal(s.choices?.step, 6);
});

test('--eval-choices and --resume: the teacher\'s step-0 scores and the last of the student\'s carry into the summary; adding the flag on resume warns of nothing', async () => {
  const dir = tmp(), items = itemsFile(dir);
  const teacherRun = await runTraining(opts(dir, { out: path.join(dir, 'teacher'), steps: 6 }), quiet);
  const o = opts(dir, { mode: 'distill', teacher: teacherRun.finalDir!, out: path.join(dir, 'student'), evalChoices: [items], stopAfter: 3 });
  const first = await runTraining(o, quiet);
  assert.equal(first.status, 'stopped');
  const logged: string[] = [];
  const resumed = await runTraining({ ...o, stopAfter: 0, resume: true }, { log: (l: string) => { logged.push(l); } });
  assert.equal(resumed.status, 'completed');
  assert.deepEqual(resumed.choices?.teacher, first.choices?.teacher);
  assert.equal(resumed.choices?.step, 6);
  assert.ok(!logged.some((l) => /--resume with --eval-choices/.test(l)), logged.join('\n'));
  const rows = readMetrics(path.join(o.out, 'metrics.jsonl')).filter((m) => (m as Record<string, unknown>).val_acc !== undefined);
  assert.deepEqual(rows.map((m) => m.step), [0, 3, 6]);
  // a run started without the flag and resumed with it: no warning either
  const plain = opts(dir, { out: path.join(dir, 'plain'), stopAfter: 3 });
  await runTraining(plain, quiet);
  const logged2: string[] = [];
  await runTraining({ ...plain, stopAfter: 0, resume: true, evalChoices: [items] }, { log: (l: string) => { logged2.push(l); } });
  assert.ok(!logged2.some((l) => /warning: --resume/.test(l)), logged2.join('\n'));
});

test('a bad --eval-choices file is refused before anything is written: --overwrite keeps the previous run', async () => {
  const dir = tmp();
  const o = opts(dir, { steps: 2, evalEvery: 1, saveEvery: 1 });
  const before = await runTraining(o, quiet);
  const bad = path.join(dir, 'bad.jsonl');
  fs.writeFileSync(bad, '{"context": "the", "choices": ["model"], "answer": 0}\n');
  await assert.rejects(runTraining({ ...o, overwrite: true, evalChoices: [bad] }, quiet), /bad\.jsonl:1: "choices" must be a list of at least two strings/);
  for (const f of ['final/model.safetensors', 'summary.json', 'checkpoints/latest/state.json']) assert.ok(fs.existsSync(path.join(before.out, f)), `${f} was lost`);
  // the plan and --dry-run know of the scoring exactly when it runs
  assert.equal(runJobShape({ ...o, evalChoices: [bad] }, presetConfig('tiny', 300), null).choices, true);
  assert.equal(runJobShape(o, presetConfig('tiny', 300), null).choices, undefined);
});

test('--eval-fewshot: the run scores the few-shot prompts eval --fewshot scores (first_n and random, examples from another file)', async () => {
  const dir = tmp(), items = itemsFile(dir);
  const shots = path.join(dir, 'shots.jsonl');
  fs.writeFileSync(shots, [
    { context: 'the text', choices: ['model', 'teacher'], answer: 1 },
    { context: 'predict the', continuation: ' next token' },
    { context: 'a student', choices: ['learns', 'text'], answer: 0 },
  ].map((x) => JSON.stringify(x)).join('\n') + '\n');
  for (const [sampler, from] of [['first_n', []], ['random', [shots]]] as Array<['first_n' | 'random', string[]]>) {
    const logged: string[] = [];
    const s = await runTraining(opts(dir, { out: path.join(dir, `run-${sampler}`), evalChoices: [items], evalFewshot: 2, evalFewshotSampler: sampler, evalFewshotSeed: 7, evalFewshotFrom: from, seq: 48, steps: 3, evalEvery: 3, saveEvery: 3 }),
      { log: (l: string) => { logged.push(l); } });
    assert.ok(logged.some((l) => new RegExp(`^choices: 7 items, 12 continuations, 2-shot \\(${sampler === 'random' ? 'random, seed 7' : 'the first'}, from ${from.length ? '.*shots\\.jsonl' : 'each file\'s other items'}\\) scored`).test(l)), logged.join('\n'));
    const last = readMetrics(path.join(s.out, 'metrics.jsonl')).filter((m) => (m as Record<string, unknown>).val_acc !== undefined).pop() as Record<string, number>;
    const fewshot = { n: 2, sampler, seed: 7, delimiter: '\n\n', ...(from.length ? { from } : {}) };
    const ev = await evaluate({ model: s.finalDir!, data: [], choices: [items], fewshot, seq: 48, batch: 3, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all' });
    const zero = await evaluate({ model: s.finalDir!, data: [], choices: [items], seq: 48, batch: 3, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all' });
    assert.equal(last.val_acc, ev.choices!.acc);
    assert.equal(last.val_cont_ppl, ev.choices!.greedy!.perplexity);
    assert.notEqual(last.val_cont_ppl, zero.choices!.greedy!.perplexity, 'the examples change the scores');
  }
});

test('--eval-system-instruction: the run scores the prompts eval --system-instruction scores (the instruction first)', async () => {
  const dir = tmp(), items = itemsFile(dir), instruction = 'Answer with the likeliest word.';
  const logged: string[] = [];
  const s = await runTraining(opts(dir, { out: path.join(dir, 'run-system'), evalChoices: [items], evalSystemInstruction: instruction, seq: 48, steps: 3, evalEvery: 3, saveEvery: 3 }),
    { log: (l: string) => { logged.push(l); } });
  const last = readMetrics(path.join(s.out, 'metrics.jsonl')).filter((m) => (m as Record<string, unknown>).val_acc !== undefined).pop() as Record<string, number>;
  const common = { model: s.finalDir!, data: [], choices: [items], seq: 48, batch: 3, maxChars: 0, device: 'cpu' as const, threads: 1, json: true, lossOn: 'all' as const };
  const ev = await evaluate({ ...common, systemInstruction: instruction }), plain = await evaluate(common);
  assert.equal(last.val_acc, ev.choices!.acc);
  assert.equal(last.val_cont_ppl, ev.choices!.greedy!.perplexity);
  assert.notEqual(last.val_cont_ppl, plain.choices!.greedy!.perplexity, 'the instruction changes the scores');
});

test('--eval-choices with text items: val_word_ppl, val_byte_ppl, val_bits_per_byte in windows of --seq, as eval --choices --seq scores them', async () => {
  const dir = tmp(), items = path.join(dir, 'texts.jsonl');
  fs.writeFileSync(items, [
    { text: 'the teacher helps the student learns to predict the next token from text and a model' },
    { text: 'a model learns', words: 4 },
    { context: 'the teacher helps the', continuation: ' student' },
  ].map((x) => JSON.stringify(x)).join('\n') + '\n');
  const s = await runTraining(opts(dir, { evalChoices: [items], seq: 8, steps: 3, evalEvery: 3, saveEvery: 3 }), quiet);
  const last = readMetrics(path.join(s.out, 'metrics.jsonl')).filter((m) => (m as Record<string, unknown>).val_word_ppl !== undefined).pop() as Record<string, number>;
  const ev = (await evaluate({ model: s.finalDir!, data: [], choices: [items], seq: 8, batch: 3, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all' })).choices!;
  assert.equal(last.step, 3);
  assert.equal(last.val_word_ppl, ev.rolling!.wordPerplexity);
  assert.equal(last.val_byte_ppl, ev.rolling!.bytePerplexity);
  assert.equal(last.val_bits_per_byte, ev.rolling!.bitsPerByte);
  assert.equal(last.val_cont_ppl, ev.greedy!.perplexity);
  assert.deepEqual(s.choices!.rolling, { wordPerplexity: ev.rolling!.wordPerplexity, bytePerplexity: ev.rolling!.bytePerplexity, bitsPerByte: ev.rolling!.bitsPerByte });
});

test('--eval-choices usage errors exit 2: a folder, a missing file, --eval-choices-chat alone', async () => {
  const dir = tmp(), data = corpusFile(dir);
  const base = ['train', '--data', data, '--out', path.join(dir, 'run'), '--steps', '2', '--quiet'];
  const bigSeed = path.join(dir, 'big-seed.yaml');
  fs.writeFileSync(bigSeed, 'eval_fewshot_seed: 9007199254740993\n');
  for (const [extra, re] of [
    [['--eval-choices', dir], /--eval-choices: .* is a folder/],
    [['--eval-choices', path.join(dir, 'nope.jsonl')], /--eval-choices: file .*nope\.jsonl does not exist/],
    [['--eval-choices-chat'], /--eval-choices-chat goes with --eval-choices/],
    [['--eval-fewshot', '2'], /--eval-fewshot goes with --eval-choices/],
    [['--eval-system-instruction', 'Be brief.'], /--eval-system-instruction goes with --eval-choices/],
    [['--eval-choices', itemsFile(dir), '--eval-fewshot-seed', '3'], /--eval-fewshot-seed goes with --eval-fewshot/],
    [['--eval-choices', itemsFile(dir), '--eval-fewshot', '1', '--eval-fewshot-from', itemsFile(dir), itemsFile(dir)], /2 --eval-fewshot-from files for 1 --eval-choices file/],
    [['--eval-choices', itemsFile(dir), '--eval-fewshot', '-1'], /--eval-fewshot must be an integer >= 0/],
    [['--eval-choices', itemsFile(dir), '--eval-fewshot', '1', '--config', bigSeed], /eval_fewshot_seed in .*big-seed\.yaml expects an integer/], // beyond 2^53: not an integer a double holds
    [['--eval-choices', itemsFile(dir), itemsFile(dir)], /--eval-choices: .*items\.jsonl is given twice/],
  ] as Array<[string[], RegExp]>) {
    const r = await runCli([...base, ...extra]);
    assert.equal(r.code, 2, r.err);
    assert.match(r.err, re);
  }
});

test('metrics rows of the scores and back: choiceRow and scoresOfRow, a perplexity too large for a double (JSON null) read as Infinity', () => {
  const c = { acc: 0.5, accNorm: 0.25, greedy: { acc: 0.75, perplexity: 12.5 } };
  const row = choiceRow('val', c);
  assert.deepEqual(row, { val_acc: 0.5, val_acc_norm: 0.25, val_greedy: 0.75, val_cont_ppl: 12.5 });
  assert.deepEqual(scoresOfRow('val', JSON.parse(JSON.stringify({ step: 3, ...row })) as Record<string, unknown>), c);
  assert.equal(scoresOfRow('teacher', row), null, 'another prefix: nothing');
  const huge = JSON.parse(JSON.stringify(choiceRow('teacher', { greedy: { acc: 0, perplexity: Infinity } }))) as Record<string, unknown>;
  assert.equal(huge.teacher_cont_ppl, null);
  assert.deepEqual(scoresOfRow('teacher', huge), { greedy: { acc: 0, perplexity: Infinity } });
  assert.equal(scoresSaid(c), 'choices acc 50.00%, acc_norm 25.00%, continuations greedy 75.00%, ppl 12.500');
  const b = { acc: 0.5, accNorm: 0.25, accBytes: 0.75, brierScore: 0.625 };
  assert.deepEqual(choiceRow('teacher', b), { teacher_acc: 0.5, teacher_acc_norm: 0.25, teacher_acc_bytes: 0.75, teacher_brier_score: 0.625 });
  assert.deepEqual(scoresOfRow('teacher', choiceRow('teacher', b)), b);
  const t = { rolling: { wordPerplexity: 40.5, bytePerplexity: 2.25, bitsPerByte: 1.17 } };
  const trow = choiceRow('val', t);
  assert.deepEqual(trow, { val_word_ppl: 40.5, val_byte_ppl: 2.25, val_bits_per_byte: 1.17 });
  assert.deepEqual(scoresOfRow('val', JSON.parse(JSON.stringify(trow)) as Record<string, unknown>), t);
  assert.equal(scoresSaid(t), 'texts word ppl 40.500, bits/byte 1.1700');
  const inf = { rolling: { wordPerplexity: Infinity, bytePerplexity: Infinity, bitsPerByte: Infinity } };
  assert.deepEqual(scoresOfRow('teacher', JSON.parse(JSON.stringify(choiceRow('teacher', inf))) as Record<string, unknown>), inf, 'infinite text scores (JSON null) read back');
});

test('data parallel: shareRowScores gives every rank every row\'s log-likelihood and greedy flag (both values), from the rows each rank scored', () => {
  const rows = [0, 1, 2, 3, 4].map((k) => ({ item: k < 2 ? 0 : k - 1, choice: k < 2 ? k : 0, ids: [1, 2], contStart: 1, cut: false }));
  const truth = { ll: [[-1.5, -2.5], [-0.25], [-3], [-4.75]], greedy: [[false, true], [true], [false], [true]] };
  // what each of 2 ranks holds after scoring its share (row i on rank i % 2); the rest as scoreChoices leaves it
  const held = [0, 1].map((rank) => {
    const sc = { ll: truth.ll.map((r) => r.map(() => NaN)), greedy: truth.greedy.map((r) => r.map(() => false)) };
    rows.forEach((r, i) => { if (i % 2 === rank) { sc.ll[r.item]![r.choice] = truth.ll[r.item]![r.choice]!; sc.greedy[r.item]![r.choice] = truth.greedy[r.item]![r.choice]!; } });
    return sc;
  });
  // a host all-reduce over the two ranks: each rank's vector as it packs it, then the sum every rank gets back
  const sent: Float64Array[] = [];
  for (const rank of [0, 1]) {
    shareRowScores(rows, structuredClone(held[rank]!), { world: 2, rank, allReduceHost: (x) => (sent[rank] = Float64Array.from(x)) });
  }
  const sum = sent[0]!.map((v, i) => v + sent[1]![i]!);
  for (const rank of [0, 1]) {
    const sc = structuredClone(held[rank]!);
    shareRowScores(rows, sc, { world: 2, rank, allReduceHost: () => Float64Array.from(sum) });
    assert.deepEqual(sc, truth, `rank ${rank} has every row's scores`);
  }
});

/** Generation items (GSM8K's kind) whose targets are given per item. */
function generationItems(dir: string, name: string, targets: string[]): string {
  const f = path.join(dir, name);
  const contexts = ['the model learns to', 'a teacher helps', 'the student learns from', 'next token from text', 'predict the', 'a model', 'the text and', 'learns'];
  fs.writeFileSync(f, targets.map((target, i) => JSON.stringify({ context: contexts[i % contexts.length], target })).join('\n') + '\n');
  return f;
}

test('--eval-choices with generation items: val_exact_match_<filter> at every evaluation and a live teacher\'s at step 0, the texts eval --choices generates', async () => {
  const dir = tmp();
  // a trained model, the run's --init and its teacher: at step 0 the student is the teacher and both are this model
  const base = await runTraining(opts(dir, { out: path.join(dir, 'base'), steps: 12 }), quiet);
  const n = 7, gen = { seq: 32, batch: 3 };
  // what eval --choices generates for each item from that model (greedy, 6 new tokens at most, "\n\n" and eos_token stop)
  const probe = generationItems(dir, 'probe.jsonl', Array.from({ length: n }, () => 'x'));
  const samples = path.join(dir, 'samples.jsonl');
  const generation = generationSettings({ maxGenToks: 6 }, '\n\n', (k) => k);
  await evaluate({ model: base.finalDir!, data: [], choices: [probe], generation, choicesOut: samples, seq: gen.seq, batch: gen.batch, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all' });
  const texts = fs.readFileSync(samples, 'utf8').trim().split('\n').map((l) => (JSON.parse(l) as { generation: string }).generation);
  assert.equal(texts.length, n);
  assert.ok(new Set(texts).size > 1, `the items' texts differ: ${JSON.stringify(texts)}`);
  // the targets: the text eval generated for items 0, 2, 4 and 6, another text for the rest; so exact_match is 4/7
  // exactly when the run generates each item's text as eval does, and a regex filter's first word agrees too
  const items = generationItems(dir, 'items.jsonl', texts.map((t, i) => (i % 2 === 0 ? t : `${t} and more`)));
  const logged: string[] = [];
  const s = await runTraining(opts(dir, {
    mode: 'distill', teacher: base.finalDir!, init: base.finalDir!, out: path.join(dir, 'student'), evalChoices: [items], evalMaxGenToks: 6, ...gen,
    evalFilter: [JSON.stringify({ name: 'first-word', filter: [{ function: 'regex', regex_pattern: '(\\S+)' }, { function: 'take_first' }] }), JSON.stringify({ name: 'none', filter: [{ function: 'take_first' }] })],
  }), { log: (l: string) => { logged.push(l); } });
  assert.equal(s.status, 'completed');
  assert.ok(logged.some((l) => /^generation: 7 items, greedy, up to 6 new tokens, until \["\\n\\n",.*\]; filters first-word, none; generated at every evaluation$/.test(l)), logged.join('\n'));
  const rows = readMetrics(path.join(s.out, 'metrics.jsonl')).filter((m) => (m as Record<string, unknown>).val_exact_match_none !== undefined) as Array<Record<string, number>>;
  assert.deepEqual(rows.map((r) => r.step), [0, 3, 6]);
  assert.equal(rows[0]!.val_exact_match_none, 4 / 7);
  assert.equal(rows[0]!.teacher_exact_match_none, 4 / 7);
  // the first-word filter: the text's first run of non-spaces (else "[invalid]") against the item's target
  const targets = texts.map((t, i) => (i % 2 === 0 ? t : `${t} and more`));
  const firstWord = texts.filter((t, i) => (/\S+/.exec(t)?.[0] ?? '[invalid]') === targets[i]).length / n;
  assert.equal(rows[0]!['val_exact_match_first-word'], firstWord);
  assert.ok(rows[1]!.teacher_exact_match_none === undefined, 'the teacher generates once, at the start');
  assert.ok(rows.every((r) => r.val_acc === undefined), 'no scored items: no acc');
  // the final step's scores are eval's on the weights the run saved, and the summary carries them
  const ev = await evaluate({ model: s.finalDir!, data: [], choices: [items], generation, seq: gen.seq, batch: gen.batch, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all' });
  assert.equal(rows[2]!.val_exact_match_none, ev.generation!.exactMatch.none);
  assert.deepEqual(s.choices?.exactMatch?.none, rows[2]!.val_exact_match_none);
  assert.deepEqual(s.choices?.teacher?.exactMatch, { 'first-word': rows[0]!['teacher_exact_match_first-word'], none: 4 / 7 });
  assert.ok(logged.some((l) => /generation exact_match first-word \d+\.\d\d%, none 57\.14%/.test(l)), 'the log line says the scores');
  assert.equal(logged.filter((l) => /^generation: the student generated \d+ tokens for 7 items in \d+\.\d\d s \(\d+ tokens\/s, 3 at a time\)$/.test(l)).length, 3, 'a line per evaluation');
  assert.equal(logged.filter((l) => /^generation: the teacher generated/.test(l)).length, 1);
  // --eval-gen-batch: 5 sequences at a time (the student's and the teacher's generators), the same texts
  const logged5: string[] = [];
  const s5 = await runTraining(opts(dir, {
    mode: 'distill', teacher: base.finalDir!, init: base.finalDir!, out: path.join(dir, 'student5'), evalChoices: [items], evalMaxGenToks: 6, ...gen, evalGenBatch: 5, steps: 1, evalEvery: 1,
  }), { log: (l: string) => { logged5.push(l); } });
  const first5 = readMetrics(path.join(s5.out, 'metrics.jsonl'))[0] as Record<string, number>;
  assert.equal(first5.val_exact_match_none, 4 / 7);
  assert.equal(first5.teacher_exact_match_none, 4 / 7);
  assert.ok(logged5.some((l) => /^generation: the student generated \d+ tokens for 7 items in .*, 5 at a time\)$/.test(l)), logged5.join('\n'));
});

test('generation items\' metrics rows and back: val_exact_match_<filter> per filter, read back on resume; the log line', () => {
  const c = { exactMatch: { 'strict-match': 0.25, 'flexible-extract': 0.5 } };
  const row = choiceRow('val', c);
  assert.deepEqual(row, { 'val_exact_match_strict-match': 0.25, 'val_exact_match_flexible-extract': 0.5 });
  assert.deepEqual(scoresOfRow('val', { step: 9, ...row }), c);
  assert.equal(scoresOfRow('teacher', row), null);
  assert.equal(scoresSaid({ acc: 0.5, accNorm: 0.5, ...c }), 'choices acc 50.00%, acc_norm 50.00%, generation exact_match strict-match 25.00%, flexible-extract 50.00%');
});

test('data parallel: generation items are split across ranks (item i on rank i % world) and one host all-reduce gives every rank every match', async () => {
  const dir = tmp();
  const items = generationItems(dir, 'g.jsonl', ['a', 'b', 'c', 'd', 'e']);
  const tok = tinyTokenizer();
  const prep = prepareRunChoices({ files: [items], chat: false, seq: 24, generation: { ...DEFAULT_RUN_OPTIONS, evalMaxGenToks: 4 } }, tok, DEFAULT_CHAT_FORMAT, () => {}).generation!;
  const be = createCpuBackend({ threads: 1 });
  const cfg = presetConfig('tiny', tok.vocabSize);
  const m = new Transformer(be, cfg, { batch: 2, seq: 24, training: false });
  m.setWeights(initialWeights(parameterLayout(cfg), cfg, new Rng(3)));
  // every item's matches with one rank; then each of 2 ranks' share, summed as the all-reduce would
  const exact = (targets: string[]): string => generationItems(dir, 'h.jsonl', targets);
  const one = new RunGeneration(prep, tok, [0], { world: 1, rank: 0, allReduceHost: (x) => Float64Array.from(x) });
  const gen = new BatchGenerator(m, 2, 24);
  const whole = await one.score(m, gen, () => false);
  assert.ok(whole && whole.all.none !== undefined);
  // the texts themselves as targets for items 0, 1 and 3: 3/5 when each rank generated its own items and shared them
  const texts: string[] = [];
  for (let i = 0; i < 5; i++) {
    const r = await runGeneration(m, tok, [prep.items[i]!], { ids: [prep.prompts.ids[i]!], cut: 0, longest: prep.prompts.ids[i]!.length }, prep.settings, { stopIds: [0], until: prep.until, batch: 1 });
    texts.push(r![0]!.text);
  }
  const prep2 = prepareRunChoices({ files: [exact(texts.map((t, i) => ([0, 1, 3].includes(i) ? t : `${t}!`)))], chat: false, seq: 24, generation: { ...DEFAULT_RUN_OPTIONS, evalMaxGenToks: 4 } }, tok, DEFAULT_CHAT_FORMAT, () => {}).generation!;
  const sent: Float64Array[] = [];
  for (const rank of [0, 1]) await new RunGeneration(prep2, tok, [0], { world: 2, rank, allReduceHost: (x) => (sent[rank] = Float64Array.from(x)) }).score(m, gen, () => false);
  assert.deepEqual([...sent[0]!], [1, 0, 0, 0, 0], 'rank 0 generated items 0, 2 and 4');
  assert.deepEqual([...sent[1]!], [0, 1, 0, 1, 0], 'rank 1 generated items 1 and 3');
  const got = await new RunGeneration(prep2, tok, [0], { world: 2, rank: 0, allReduceHost: (x) => Float64Array.from(x).map((v, i) => v + sent[1]![i]!) }).score(m, gen, () => false);
  assert.deepEqual(got, { all: { none: 3 / 5 }, files: [{ file: prep2.items[0]!.file!, exactMatch: { none: 3 / 5 } }] });
  // one rank stops between batches when asked
  const stopped = await new RunGeneration(prep2, tok, [0], { world: 1, rank: 0, allReduceHost: (x) => Float64Array.from(x) }).score(m, gen, () => true);
  assert.equal(stopped, null);
  be.dispose?.();
});

test('generation settings of a run: usage errors exit 2 (without --eval-choices, bad JSON, an unknown preset); a --seq too short for the new tokens is refused (exit 2) before anything is written, by --dry-run too', async () => {
  const dir = tmp(), data = corpusFile(dir);
  const base = ['train', '--data', data, '--out', path.join(dir, 'run'), '--steps', '2', '--quiet'];
  const items = generationItems(dir, 'g.jsonl', ['a', 'b']);
  for (const [extra, re] of [
    [['--eval-max-gen-toks', '8'], /--eval-max-gen-toks goes with --eval-choices/],
    [['--eval-preset', 'gsm8k'], /--eval-preset goes with --eval-choices/],
    [['--eval-choices', items, '--eval-preset', 'mmlu'], /--eval-preset/],
    [['--eval-choices', items, '--eval-filter', '{"name": '], /--eval-filter 1: not valid JSON/],
    [['--eval-choices', items, '--eval-exact-match', '{"ignore_cases": true}'], /--eval-exact-match: unknown key "ignore_cases"/],
    [['--eval-choices', items, '--eval-max-gen-toks', '0'], /--eval-max-gen-toks must be/],
    [['--eval-choices', items, '--eval-gen-batch', '9', '--init', dir, '--lora-rank', '4'], /--eval-gen-batch 9 exceeds --batch 8, and LoRA adapters generate over the student's own batch × seq rows/],
  ] as Array<[string[], RegExp]>) {
    const r = await runCli([...base, ...extra]);
    assert.equal(r.code, 2, `${extra.join(' ')}: ${r.err}`);
    assert.match(r.err, re);
    assert.doesNotMatch(r.err, /\n\s+at /, 'no stack trace');
  }
  // the defaults (--seq 64, 256 new tokens) leave no room: refused before the run folder, the data or the models, and by --dry-run
  for (const extra of [[], ['--seq', '16', '--eval-max-gen-toks', '16'], ['--dry-run']]) {
    const r = await runCli([...base, '--eval-choices', items, ...extra]);
    assert.equal(r.code, 2, r.err);
    const [seq, n] = extra.includes('--seq') ? [16, 16] : [64, 256];
    assert.match(r.err, new RegExp(`--eval-max-gen-toks ${n} leaves no room for a generation item's prompt in the run's window \\(--seq ${seq}\\)[^]*use --eval-max-gen-toks ${seq / 2} or less`));
    assert.doesNotMatch(r.err, /\n\s+at /, 'no stack trace');
    assert.ok(!fs.existsSync(path.join(dir, 'run')), 'refused before anything is written');
  }
});

test('--eval-preset\'s examples: 5 before each generation item unless --eval-fewshot is given (0 too), as eval --preset without and with --fewshot', () => {
  const dir = tmp(), tok = tinyTokenizer();
  const items = generationItems(dir, 'g.jsonl', ['a', 'b', 'c', 'd', 'e', 'f', 'g']);
  const prep = (given: boolean, n: number): { said: string; longest: number } => {
    const said: string[] = [];
    const p = prepareRunChoices({ files: [items], chat: false, seq: 512, fewshot: { n, sampler: 'first_n', seed: 1234, delimiter: '\n\n' }, fewshotGiven: given,
      generation: { ...DEFAULT_RUN_OPTIONS, evalPreset: 'gsm8k', evalMaxGenToks: 8 } }, tok, DEFAULT_CHAT_FORMAT, (l) => said.push(l));
    return { said: said.join('\n'), longest: p.generation!.prompts.longest };
  };
  const preset = prep(false, 0), zero = prep(true, 0), two = prep(true, 2);
  assert.match(preset.said, /^generation: 7 items, 5-shot \(the first, from each file's other items\), greedy/m);
  assert.match(zero.said, /^generation: 7 items, greedy/m);
  assert.match(two.said, /^generation: 7 items, 2-shot/m);
  assert.ok(zero.longest < two.longest && two.longest < preset.longest, `${zero.longest} < ${two.longest} < ${preset.longest}`);
});

test('the ids a run\'s generation stops at: the tokenizer\'s end of text, the student config\'s, and --init\'s and the teacher\'s generation configs\'', () => {
  const cfg = { ...presetConfig('tiny', 300), eosTokenId: [3] };
  const ids = runStopIds(1, cfg, { generationEosIds: [7, 8] }, { generationEosIds: [9, 1] });
  for (const id of [1, 3, 7, 8, 9]) assert.ok(ids.includes(id), `${id} in ${ids.join(',')}`);
  assert.equal(new Set(ids).size, ids.length, 'each once');
  assert.deepEqual(runStopIds(1, cfg, null, null).filter((x) => [7, 8, 9].includes(x)), []);
});

test('--eval-limit: the first n items of each file (a fraction: that share), their examples from the whole file, as eval --limit scores them', async () => {
  const dir = tmp(), items = itemsFile(dir);
  const gen = generationItems(dir, 'g.jsonl', ['a', 'b', 'c', 'd', 'e', 'f']);
  const logged: string[] = [];
  const s = await runTraining(opts(dir, { out: path.join(dir, 'run-limit'), evalChoices: [items, gen], evalLimit: 0.5, evalFewshot: 2, evalMaxGenToks: 4, seq: 64, steps: 3, evalEvery: 3, saveEvery: 3 }),
    { log: (l: string) => { logged.push(l); } });
  assert.ok(logged.some((l) => l === 'choices: --eval-limit 0.5: 7 of 13 items (the first of each file)'), logged.join('\n'));
  const last = readMetrics(path.join(s.out, 'metrics.jsonl')).filter((m) => (m as Record<string, unknown>).val_acc !== undefined).pop() as Record<string, number>;
  const common = { model: s.finalDir!, data: [], choices: [items, gen], seq: 64, batch: 4, maxChars: 0, device: 'cpu' as const, threads: 1, json: true, lossOn: 'all' as const,
    fewshot: { n: 2, sampler: 'random' as const, seed: 1234, delimiter: '\n\n' }, generation: generationSettings({ maxGenToks: 4 }, '\n\n', (k) => k) };
  const ev = await evaluate({ ...common, limit: 0.5 }), whole = await evaluate(common);
  assert.equal(s.choices!.items, 7);
  assert.equal(last.val_acc, ev.choices!.acc);
  assert.equal(last.val_acc_norm, ev.choices!.accNorm);
  assert.equal(last.val_brier_score, ev.choices!.brierScore, 'the same prompts (a continuous score)');
  assert.equal(last.val_exact_match_none, ev.generation!.exactMatch.none);
  // the first 4 of the 7 scored items are the multiple-choice ones: the continuation items are left out, as by eval
  assert.ok(last.val_cont_ppl === undefined && ev.choices!.greedy === undefined && whole.choices!.greedy !== undefined);
  // usage: a bad value, and the flag alone
  const base = ['train', '--data', corpusFile(dir), '--out', path.join(dir, 'bad'), '--steps', '2', '--quiet'];
  for (const [extra, re] of [[['--eval-choices', items, '--eval-limit', '1.5'], /--eval-limit must be a whole number of items or a fraction between 0 and 1, got 1\.5/],
    [['--eval-limit', '3'], /--eval-limit goes with --eval-choices/]] as Array<[string[], RegExp]>) {
    const r = await runCli([...base, ...extra]);
    assert.equal(r.code, 2, r.err);
    assert.match(r.err, re);
  }
});

test('several --eval-choices files (tasks): each file\'s scores apart too (val_acc:<file>, val_exact_match_<filter>:<file>), as eval reports them per file; back from a row', async () => {
  const dir = tmp(), items = itemsFile(dir);
  const other = path.join(dir, 'other.jsonl');
  fs.writeFileSync(other, [
    { context: 'a student learns', choices: ['text', 'the model'], answer: 1 }, { context: 'predict the', choices: ['next token', 'teacher'], answer: 0 },
    { context: 'the model', choices: ['learns', 'helps'], answer: 0 },
  ].map((x) => JSON.stringify(x)).join('\n') + '\n');
  const gen = generationItems(dir, 'g.jsonl', ['a', 'b', 'c']);
  const s = await runTraining(opts(dir, { out: path.join(dir, 'run-files'), evalChoices: [items, gen, other], evalMaxGenToks: 4, seq: 32, steps: 3, evalEvery: 3, saveEvery: 3 }), quiet);
  const last = readMetrics(path.join(s.out, 'metrics.jsonl')).filter((m) => (m as Record<string, unknown>).val_acc !== undefined).pop() as Record<string, number>;
  const ev = await evaluate({ model: s.finalDir!, data: [], choices: [items, gen, other], seq: 32, batch: 4, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all',
    generation: generationSettings({ maxGenToks: 4 }, '\n\n', (k) => k) });
  const byFile = (f: string) => ev.choices!.files!.find((x) => x.file === f)!;
  assert.equal(last['val_acc:items'], byFile(items).acc);
  assert.equal(last['val_brier_score:other'], byFile(other).brierScore);
  assert.equal(last['val_cont_ppl:items'], byFile(items).greedy!.perplexity);
  assert.equal(last['val_exact_match_none:g'], ev.generation!.exactMatch.none);
  assert.equal(last.val_acc, ev.choices!.acc, 'and the whole run\'s, as before');
  assert.deepEqual(s.choices!.files!.map((f) => f.file), ['items', 'g', 'other'], 'in the --eval-choices order');
  // back from the row (resume): the same scores, file by file
  assert.deepEqual(scoresOfRow('val', last)!.files, s.choices!.files);
  // two files of one name are told apart by their paths
  assert.deepEqual([...fileTags(['a/x.jsonl', 'b/x.jsonl', 'y.JSONL'])], [['a/x.jsonl', 'a/x.jsonl'], ['b/x.jsonl', 'b/x.jsonl'], ['y.JSONL', 'y']]);
  const row = choiceRow('teacher', { acc: 0.5, accNorm: 0.5, files: [{ file: 'arc', scores: { acc: 0.25, accNorm: 0.75 } }, { file: 'gsm8k', scores: { exactMatch: { 'strict-match': 0.125 } } }] });
  assert.deepEqual(row, { teacher_acc: 0.5, teacher_acc_norm: 0.5, 'teacher_acc:arc': 0.25, 'teacher_acc_norm:arc': 0.75, 'teacher_exact_match_strict-match:gsm8k': 0.125 });
  assert.deepEqual(scoresOfRow('teacher', row), { acc: 0.5, accNorm: 0.5, files: [{ file: 'arc', scores: { acc: 0.25, accNorm: 0.75 } }, { file: 'gsm8k', scores: { exactMatch: { 'strict-match': 0.125 } } }] });
});
