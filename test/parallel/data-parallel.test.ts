/**
 * Data parallelism with a sharded optimizer (src/parallel/data-parallel.ts) on the CPU, with real processes over the
 * host communicator: 2 ranks at batch 4 train what 1 process trains with gradient accumulation over the same 8
 * sequences (the same losses, the same weights within float32 summation order); only rank 0 writes the run folder;
 * --resume at the same world size continues bit-exactly, and at another is refused.
 */
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { runTraining, type RunSummary } from '../../src/train/run.js';
import { DEFAULT_RUN_OPTIONS, type RunOptions } from '../../src/train/options.js';
import { readFlatCheckpoint } from '../../src/model/checkpoint.js';
import { readMetrics } from '../../src/train/run-state.js';
import { corpusFile } from '../train/corpus.js';
import { launch } from './launch.js';
import { evaluate } from '../../src/cli/commands/eval.js';
import { generationSettings } from '../../src/eval/generation.js';
import { buildTeacherCache, DEFAULT_SHARD_WINDOWS } from '../../src/cache/build.js';
import { DEFAULT_SPARSE } from '../../src/cache/sparse.js';

const here = path.dirname(fileURLToPath(import.meta.url));
let dir = '';
let corpus = '';
before(() => { dir = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-dp-')); corpus = corpusFile(dir); });

function opts(over: Partial<RunOptions>): RunOptions {
  return {
    ...DEFAULT_RUN_OPTIONS, mode: 'train', out: path.join(dir, 'run'), data: [corpus], model: 'tiny',
    vocabSize: 300, batch: 4, seq: 16, steps: 6, evalEvery: 3, saveEvery: 3, warmup: 1, quiet: true, threads: 1, ...over,
  };
}

async function ranks(o: RunOptions, world: number, env: NodeJS.ProcessEnv = {}): Promise<Array<RunSummary & { error?: string }>> {
  const res = await launch(path.join(here, 'train-rank.js'), world, { DP_OPTS: JSON.stringify(o), ...env });
  return res.map((r) => {
    const line = r.out.trim().split('\n').pop() ?? '';
    try { return JSON.parse(line) as RunSummary & { error?: string }; } catch { return { error: `no summary (exit ${r.code}): ${r.err.slice(-400)}` } as RunSummary & { error?: string }; }
  });
}

test('2 ranks at batch 4 train what 1 process trains with 2 accumulated micro-batches; only rank 0 writes', { timeout: 120_000 }, async () => {
  const single = await runTraining(opts({ out: path.join(dir, 'single'), gradAccum: 2 }), { log: () => {} });
  const [r0, r1] = await ranks(opts({ out: path.join(dir, 'dp2') }), 2);
  assert.equal(r0!.error, undefined, r0!.error); assert.equal(r1!.error, undefined, r1!.error);
  assert.equal(r0!.status, 'completed');
  // the same tokens and losses, step by step (float32 summation order apart)
  assert.equal(r0!.tokensTrained, single.tokensTrained);
  const a = readMetrics(path.join(dir, 'single', 'metrics.jsonl')).filter((m) => m.loss !== undefined);
  const b = readMetrics(path.join(dir, 'dp2', 'metrics.jsonl')).filter((m) => m.loss !== undefined);
  assert.equal(b.length, 6);
  a.forEach((m, i) => assert.ok(Math.abs(m.loss! - b[i]!.loss!) <= 1e-5 * Math.abs(m.loss!), `step ${i + 1}: loss ${m.loss} vs ${b[i]!.loss}`));
  a.forEach((m, i) => assert.ok(Math.abs(m.grad_norm! - b[i]!.grad_norm!) <= 1e-4 * m.grad_norm!, `step ${i + 1}: grad norm ${m.grad_norm} vs ${b[i]!.grad_norm}`));
  // the step's token accuracy over both ranks' tokens (a float32 near-tie may flip one token of the 128)
  a.forEach((m, i) => assert.ok(Math.abs(m.token_acc! - b[i]!.token_acc!) <= 1 / 128 + 1e-12, `step ${i + 1}: token accuracy ${m.token_acc} vs ${b[i]!.token_acc}`));
  const w1 = readFlatCheckpoint(path.join(dir, 'single', 'final')).weights, w2 = readFlatCheckpoint(path.join(dir, 'dp2', 'final')).weights;
  let worst = 0, scale = 0;
  for (let i = 0; i < w1.length; i++) { worst = Math.max(worst, Math.abs(w1[i]! - w2[i]!)); scale = Math.max(scale, Math.abs(w1[i]!)); }
  assert.ok(worst <= 1e-4 * scale, `weights differ by ${worst} (largest weight ${scale})`);
  process.stderr.write(`data parallel vs accumulation: final weights differ by at most ${worst.toExponential(2)} (largest weight ${scale.toFixed(3)}); losses ${b.map((m) => m.loss!.toFixed(6)).join(' ')}\n`);
  assert.equal(r1!.finalValLoss, r0!.finalValLoss);
  // rank 0 wrote the folder once; rank 1 wrote nothing of its own
  assert.deepEqual(fs.readdirSync(path.join(dir, 'dp2')).sort(), ['checkpoints', 'final', 'loss.svg', 'metrics.jsonl', 'summary.json', 'tokenizer.json']);
  const state = JSON.parse(fs.readFileSync(path.join(dir, 'dp2', 'checkpoints', 'latest', 'state.json'), 'utf8')) as { world: number };
  assert.equal(state.world, 2);
});

test('--eval-choices on 2 ranks: each scores a share of the rows, every rank reports the same scores, equal to eval --choices on the final model', { timeout: 120_000 }, async () => {
  const items = path.join(dir, 'dp-items.jsonl');
  fs.writeFileSync(items, [
    { context: 'the model learns to', choices: ['predict next token', 'teacher'], answer: 0 },
    { context: 'a teacher helps', choices: ['student', 'the text and a model', 'learns'], answer: 0 },
    { context: '', choices: ['the model', 'learns'], answer: 0 },
    { context: 'the teacher helps the', continuation: ' student' },
    { context: 'a model learns to predict the', continuation: ' next token' },
  ].map((x) => JSON.stringify(x)).join('\n') + '\n');
  // generation items too (each rank generates every other item): the answer is the text's first non-space character,
  // right when it is one of a few letters
  const gen = path.join(dir, 'dp-generation.jsonl'), letters = ['t', 'e', 'a', 's', 'o', 'n'];
  fs.writeFileSync(gen, ['the model', 'a teacher', 'the student learns', 'next token', 'predict', 'a'].map((context) => JSON.stringify({ context, target: letters })).join('\n') + '\n');
  const firstChar = JSON.stringify({ name: 'first', filter: [{ function: 'regex', regex_pattern: '(\\S)' }, { function: 'take_first' }] });
  const o = opts({ out: path.join(dir, 'dp-choices'), evalChoices: [items, gen], evalMaxGenToks: 4, evalFilter: [firstChar] });
  const [r0, r1] = await ranks(o, 2);
  assert.equal(r0!.error, undefined, r0!.error); assert.equal(r1!.error, undefined, r1!.error);
  assert.deepEqual(r1!.choices, r0!.choices);
  const ev = await evaluate({ model: r0!.finalDir!, data: [], choices: [items, gen], seq: o.seq, batch: 2, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all',
    generation: generationSettings({ maxGenToks: 4, filter: [firstChar] }, '\n\n', (k) => k) });
  const mine = ev.choices!;
  const { files, ...whole } = r0!.choices!;
  assert.deepEqual(whole, { items: 11, step: 6, acc: mine.acc, accNorm: mine.accNorm, accBytes: mine.accBytes, brierScore: mine.brierScore, greedy: { acc: mine.greedy!.acc, perplexity: mine.greedy!.perplexity }, exactMatch: ev.generation!.exactMatch });
  assert.deepEqual(files!.map((f) => f.file), ['dp-items', 'dp-generation'], 'each file apart');
  assert.deepEqual(files![1]!.scores, { exactMatch: ev.generation!.exactMatch });
  process.stderr.write(`data parallel generation items: exact_match ${JSON.stringify(ev.generation!.exactMatch)} on both ranks and in eval\n`);
  const rows = readMetrics(path.join(o.out, 'metrics.jsonl')).filter((m) => (m as Record<string, unknown>).val_acc !== undefined);
  assert.deepEqual(rows.map((m) => m.step), [0, 3, 6]);
});

test('data-parallel resume: stopped at step 3 and resumed on 2 ranks equals the uninterrupted 2-rank run; 1 process is refused', { timeout: 120_000 }, async () => {
  const full = await ranks(opts({ out: path.join(dir, 'dp-full') }), 2);
  assert.equal(full[0]!.error, undefined, full[0]!.error);
  const stopped = await ranks(opts({ out: path.join(dir, 'dp-split'), stopAfter: 3 }), 2);
  assert.equal(stopped[0]!.status, 'stopped');
  await assert.rejects(runTraining(opts({ out: path.join(dir, 'dp-split'), resume: true }), { log: () => {} }),
    /the checkpoint was written by a run of 2 processes, this one has 1/);
  const resumed = await ranks(opts({ out: path.join(dir, 'dp-split'), resume: true }), 2);
  assert.equal(resumed[0]!.error, undefined, resumed[0]!.error);
  const read = (run: string): Buffer => fs.readFileSync(path.join(dir, run, 'checkpoints', 'latest', 'model', 'model.safetensors'));
  assert.ok(read('dp-full').equals(read('dp-split')), 'the resumed 2-rank run differs from the uninterrupted one');
  const opt = (run: string): Buffer => fs.readFileSync(path.join(dir, run, 'checkpoints', 'latest', 'optimizer.safetensors'));
  assert.ok(opt('dp-full').equals(opt('dp-split')), 'the gathered optimizer moments differ');
});

test('distillery train --gpus 2 (--device cpu: 2 processes) runs the ranks and equals 1 process with 2 accumulated micro-batches; --dry-run estimates per process', { timeout: 120_000 }, async () => {
  const { spawnSync } = await import('node:child_process');
  const cli = path.resolve(here, '../../../bin/distillery.js');
  const common = ['--data', corpus, '--model', 'tiny', '--vocab-size', '300', '--batch', '4', '--seq', '16', '--steps', '4', '--warmup', '1', '--eval-every', '2', '--save-every', '2', '--threads', '1', '--quiet'];
  const r = spawnSync(process.execPath, [cli, 'train', ...common, '--gpus', '2', '--out', path.join(dir, 'cli-dp')], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stderr, /data parallel: 2 processes, each a batch of 4 × 1 per step \(a global batch of 8\)/);
  const s = spawnSync(process.execPath, [cli, 'train', ...common, '--grad-accum', '2', '--out', path.join(dir, 'cli-single')], { encoding: 'utf8' });
  assert.equal(s.status, 0, s.stderr);
  const a = readMetrics(path.join(dir, 'cli-single', 'metrics.jsonl')).filter((m) => m.loss !== undefined);
  const b = readMetrics(path.join(dir, 'cli-dp', 'metrics.jsonl')).filter((m) => m.loss !== undefined);
  assert.equal(b.length, 4);
  a.forEach((m, i) => assert.ok(Math.abs(m.loss! - b[i]!.loss!) <= 1e-5 * m.loss!, `step ${i + 1}: ${m.loss} vs ${b[i]!.loss}`));
  const one = JSON.parse(spawnSync(process.execPath, [cli, 'train', ...common, '--out', path.join(dir, 'x'), '--dry-run', '--json'], { encoding: 'utf8' }).stdout) as { device_bytes: number; world: number };
  const two = JSON.parse(spawnSync(process.execPath, [cli, 'train', ...common, '--out', path.join(dir, 'x'), '--dry-run', '--json', '--gpus', '2'], { encoding: 'utf8' }).stdout) as { device_bytes: number; world: number };
  assert.equal(two.world, 2);
  assert.ok(two.device_bytes < one.device_bytes);
  const bad = spawnSync(process.execPath, [cli, 'train', ...common, '--out', path.join(dir, 'y'), '--gpus', '2'], { encoding: 'utf8', env: { ...process.env, WORLD_SIZE: '2', RANK: '0' } });
  assert.equal(bad.status, 2);
  assert.match(bad.stderr, /--gpus 2 starts its own processes, but this one is already rank 0 of WORLD_SIZE 2/);
});

test('SIGINT to a --gpus 2 run stops both ranks at the same step with a checkpoint (exit 130); a rank killed mid-run stops the other with an error, the checkpoint intact', { timeout: 180_000 }, async () => {
  const { spawn } = await import('node:child_process');
  const cli = path.resolve(here, '../../../bin/distillery.js');
  const common = ['--data', corpus, '--model', 'tiny', '--vocab-size', '300', '--batch', '4', '--seq', '16', '--steps', '100000', '--warmup', '1', '--eval-every', '0', '--save-every', '5', '--threads', '1', '--quiet'];
  const waitSteps = async (metrics: string, n: number): Promise<void> => {
    for (let i = 0; i < 600; i++) { if (readMetrics(metrics).filter((m) => m.loss !== undefined).length >= n) return; await new Promise((r) => setTimeout(r, 100)); }
    throw new Error(`no ${n} steps in ${metrics}`);
  };
  // SIGINT to the launcher, and a terminal's Ctrl-C (SIGINT to the launcher's whole process group)
  for (const [name, group] of [['sig-dp', false], ['sig-dp-group', true]] as const) {
    const out = path.join(dir, name);
    const p = spawn(process.execPath, [cli, 'train', ...common, '--gpus', '2', '--out', out], { stdio: ['ignore', 'ignore', 'pipe'], detached: group });
    let err = ''; p.stderr.on('data', (d) => { err += d; });
    await waitSteps(path.join(out, 'metrics.jsonl'), 7);
    if (group) process.kill(-p.pid!, 'SIGINT'); else p.kill('SIGINT');
    const code = await new Promise<number | null>((r) => p.on('close', (c) => r(c)));
    assert.equal(code, 130, `${name}: ${err}`);
    const summary = JSON.parse(fs.readFileSync(path.join(out, 'summary.json'), 'utf8')) as { status: string; steps: number; lastGoodStep: number };
    assert.equal(summary.status, 'interrupted by SIGINT', name);
    assert.equal(summary.lastGoodStep, summary.steps);
    const state = JSON.parse(fs.readFileSync(path.join(out, 'checkpoints', 'latest', 'state.json'), 'utf8')) as { step: number; world: number };
    assert.equal(state.step, summary.steps); assert.equal(state.world, 2);
  }
  // a rank killed mid-run (kill -9 of rank 1): rank 0 stops with an error naming it; the last checkpoint stays
  const out2 = path.join(dir, 'kill-dp');
  const env = (rank: number, port: number): NodeJS.ProcessEnv => ({ ...process.env, RANK: String(rank), LOCAL_RANK: String(rank), WORLD_SIZE: '2', MASTER_ADDR: '127.0.0.1', MASTER_PORT: String(port), DISTILLERY_MASTER_PORT: String(port) });
  const { freePort } = await import('./launch.js');
  const port = await freePort();
  const r0 = spawn(process.execPath, [cli, 'train', ...common, '--out', out2], { env: env(0, port), stdio: ['ignore', 'ignore', 'pipe'] });
  const r1 = spawn(process.execPath, [cli, 'train', ...common, '--out', out2], { env: env(1, port), stdio: ['ignore', 'ignore', 'ignore'] });
  let err0 = ''; r0.stderr.on('data', (d) => { err0 += d; });
  await waitSteps(path.join(out2, 'metrics.jsonl'), 7);
  r1.kill('SIGKILL');
  const t0 = Date.now();
  const c0 = await new Promise<number | null>((r) => r0.on('close', (c) => r(c)));
  assert.equal(c0, 1, err0);
  assert.match(err0, /rank 1 disconnected/);
  assert.ok(Date.now() - t0 < 30_000, 'rank 0 stopped within a bounded time');
  const st = JSON.parse(fs.readFileSync(path.join(out2, 'checkpoints', 'latest', 'state.json'), 'utf8')) as { step: number };
  assert.ok(st.step >= 5 && st.step % 5 === 0, `checkpoint at step ${st.step}`);
  assert.ok(!fs.existsSync(path.join(out2, 'run.lock')), 'the lock is released');
});

test('data parallel in bf16 keeps the fp32 masters sharded (ZeRO-1): 2 ranks equal 1 process with accumulation; resume is bit-exact', { timeout: 180_000 }, async () => {
  const o = (over: Partial<RunOptions>): RunOptions => opts({ precision: 'bf16', ...over });
  const single = await runTraining(o({ out: path.join(dir, 'bf-single'), gradAccum: 2 }), { log: () => {} });
  const [r0] = await ranks(o({ out: path.join(dir, 'bf-dp2') }), 2);
  assert.equal(r0!.error, undefined, r0!.error);
  const a = readMetrics(path.join(dir, 'bf-single', 'metrics.jsonl')).filter((m) => m.loss !== undefined);
  const b = readMetrics(path.join(dir, 'bf-dp2', 'metrics.jsonl')).filter((m) => m.loss !== undefined);
  a.forEach((m, i) => assert.ok(Math.abs(m.loss! - b[i]!.loss!) <= 2e-3 * m.loss!, `step ${i + 1}: ${m.loss} vs ${b[i]!.loss}`));
  // the checkpoint holds the whole masters, gathered from both ranks: close to the single process's
  const w1 = readFlatCheckpoint(path.join(dir, 'bf-single', 'checkpoints', 'latest', 'model')).weights;
  const w2 = readFlatCheckpoint(path.join(dir, 'bf-dp2', 'checkpoints', 'latest', 'model')).weights;
  let worst = 0;
  for (let i = 0; i < w1.length; i++) worst = Math.max(worst, Math.abs(w1[i]! - w2[i]!));
  assert.ok(worst < 2e-2, `gathered masters differ by ${worst}`);
  assert.ok(w2.some((x, i) => x !== w1[i]) || worst === 0);
  void single;
  const stopped = await ranks(o({ out: path.join(dir, 'bf-split'), stopAfter: 3 }), 2);
  assert.equal(stopped[0]!.status, 'stopped');
  const resumed = await ranks(o({ out: path.join(dir, 'bf-split'), resume: true }), 2);
  assert.equal(resumed[0]!.error, undefined, resumed[0]!.error);
  const read = (run: string): Buffer => fs.readFileSync(path.join(dir, run, 'checkpoints', 'latest', 'model', 'model.safetensors'));
  assert.ok(read('bf-dp2').equals(read('bf-split')), 'the resumed bf16 2-rank run differs from the uninterrupted one');
});

test('data-parallel distillation, full, LoRA, on-policy and from a teacher cache, gradients reduced in small buckets during the backward pass: 2 ranks equal 1 process with accumulation (teacher per rank, adapters sharded)', { timeout: 240_000 }, async () => {
  const teacher = await runTraining(opts({ out: path.join(dir, 'dp-teacher'), steps: 6 }), { log: () => {} });
  const cache = path.join(dir, 'dp-cache');
  await buildTeacherCache({ teacher: teacher.finalDir!, data: [corpus], out: cache, seq: 16, batch: 4, sparse: DEFAULT_SPARSE, temperature: DEFAULT_RUN_OPTIONS.temperature,
    seed: DEFAULT_RUN_OPTIONS.seed, valFraction: DEFAULT_RUN_OPTIONS.valFraction, lossOn: 'assistant', maxChars: 0, device: 'cpu', precision: 'auto', threads: 1,
    shardWindows: DEFAULT_SHARD_WINDOWS, overwrite: false, quiet: true }, { log: () => {} });
  for (const [name, extra] of [['full', {}], ['lora', { init: teacher.finalDir!, loraRank: 4 }], ['on-policy', { onPolicy: 1, genTemperature: 1 }],
    ['cached', { teacher: undefined, teacherCache: cache }]] as const) {
    const o = (over: Partial<RunOptions>): RunOptions => opts({ mode: 'distill', teacher: teacher.finalDir!, steps: 4, ...extra, ...over });
    await runTraining(o({ out: path.join(dir, `dpd-${name}-single`), gradAccum: 2 }), { log: () => {} });
    // 0.004 MiB: buckets of 1049 gradients, several per layer's worth of parameters
    const [r0] = await ranks(o({ out: path.join(dir, `dpd-${name}-2`) }), 2, { DISTILLERY_GRAD_BUCKET_MB: '0.004' });
    assert.equal(r0!.error, undefined, `${name}: ${r0!.error}`);
    const a = readMetrics(path.join(dir, `dpd-${name}-single`, 'metrics.jsonl')).filter((m) => m.loss !== undefined);
    const b = readMetrics(path.join(dir, `dpd-${name}-2`, 'metrics.jsonl')).filter((m) => m.loss !== undefined);
    assert.equal(b.length, 4);
    a.forEach((m, i) => {
      assert.ok(Math.abs(m.loss! - b[i]!.loss!) <= 1e-5 * m.loss!, `${name} step ${i + 1}: loss ${m.loss} vs ${b[i]!.loss}`);
      assert.ok(Math.abs(m.div! - b[i]!.div!) <= 1e-4 * Math.max(1e-3, m.div!), `${name} step ${i + 1}: divergence ${m.div} vs ${b[i]!.div}`);
      // on-policy: the mean completion length of the global batch, not its sum over ranks
      assert.equal(b[i]!.gen_len, m.gen_len, `${name} step ${i + 1}: gen_len`);
    });
  }
});

test('data-parallel resume after a crash between checkpoints (metrics.jsonl holds evaluations past the checkpoint) completes and equals the uninterrupted run', { timeout: 180_000 }, async () => {
  // every rank must take rank 0's history after its cut: rank 1 reading the uncut file disagreed on a new best/ (a
  // collective) and the group stopped out of step
  const o = (over: Partial<RunOptions>): RunOptions => opts({ evalEvery: 1, saveEvery: 4, steps: 6, ...over });
  const full = await ranks(o({ out: path.join(dir, 'crash-full') }), 2);
  assert.equal(full[0]!.error, undefined, full[0]!.error);
  const stopped = await ranks(o({ out: path.join(dir, 'crash-split'), stopAfter: 4 }), 2);
  assert.equal(stopped[0]!.status, 'stopped');
  const fullRows = fs.readFileSync(path.join(dir, 'crash-full', 'metrics.jsonl'), 'utf8').trim().split('\n');
  const later = fullRows.filter((l) => (JSON.parse(l) as { step: number }).step > 4);
  assert.ok(later.some((l) => l.includes('val_loss')));
  fs.appendFileSync(path.join(dir, 'crash-split', 'metrics.jsonl'), later.join('\n') + '\n');
  const resumed = await ranks(o({ out: path.join(dir, 'crash-split'), resume: true }), 2);
  for (const r of resumed) assert.equal(r.error, undefined, r.error);
  const read = (run: string, f: string): Buffer => fs.readFileSync(path.join(dir, run, f));
  assert.ok(read('crash-full', 'final/model.safetensors').equals(read('crash-split', 'final/model.safetensors')), 'the resumed run differs');
  assert.deepEqual(JSON.parse(read('crash-split', 'checkpoints/best/best.json').toString()), JSON.parse(read('crash-full', 'checkpoints/best/best.json').toString()));
  const vals = (run: string): string => JSON.stringify(readMetrics(path.join(dir, run, 'metrics.jsonl')).filter((m) => m.val_loss !== undefined).map((m) => [m.step, m.val_loss]));
  assert.equal(vals('crash-split'), vals('crash-full'), 'each evaluation once, as in the uninterrupted run');
});

test('a --gpus 2 launcher killed with SIGKILL: its ranks stop as on SIGTERM (checkpoint, summary, lock released) instead of training on alone', { timeout: 120_000 }, async () => {
  const { spawn } = await import('node:child_process');
  const cli = path.resolve(here, '../../../bin/distillery.js');
  const out = path.join(dir, 'orphans');
  const args = ['train', '--data', corpus, '--model', 'tiny', '--vocab-size', '300', '--batch', '4', '--seq', '16', '--steps', '100000', '--warmup', '1',
    '--eval-every', '0', '--save-every', '1000', '--threads', '1', '--quiet', '--gpus', '2', '--out', out];
  const p = spawn(process.execPath, [cli, ...args], { stdio: ['ignore', 'ignore', 'ignore'] });
  const metrics = path.join(out, 'metrics.jsonl');
  for (let i = 0; i < 600 && !(fs.existsSync(metrics) && readMetrics(metrics).filter((m) => m.loss !== undefined).length >= 3); i++) await new Promise((r) => setTimeout(r, 100));
  p.kill('SIGKILL');
  let summary: { status?: string; steps?: number } = {};
  for (let i = 0; i < 300; i++) {
    const f = path.join(out, 'summary.json');
    if (fs.existsSync(f) && !fs.existsSync(path.join(out, 'run.lock'))) { summary = JSON.parse(fs.readFileSync(f, 'utf8')) as typeof summary; break; }
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(summary.status, 'interrupted by SIGTERM');
  const state = JSON.parse(fs.readFileSync(path.join(out, 'checkpoints', 'latest', 'state.json'), 'utf8')) as { step: number };
  assert.equal(state.step, summary.steps);
});
