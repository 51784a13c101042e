/**
 * Run-level behaviour on the CPU: loss falls on real text, exact resume, checkpoints reload bit-exactly,
 * and bad input (empty data, a non-finite loss, mismatched teacher vocabulary, corrupt or mismatched
 * checkpoints) gives a clear error without losing the last good checkpoint.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { runTraining } from '../../src/train/run.js';
import type { RunOptions } from '../../src/train/options.js';
import { readFlatCheckpoint, writeCheckpoint } from '../../src/model/checkpoint.js';
import { presetConfig, toHfConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout, reorderFlat } from '../../src/model/params.js';
import { readSafetensors, writeSafetensors } from '../../src/io/safetensors.js';
import { DistilleryError } from '../../src/util/errors.js';
import { Rng } from '../../src/util/rng.js';
import { tinyRunOptions } from './corpus.js';
import { treeBytes } from '../cli/fixtures.js';

const tmp = (): string => fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-run-'));
const quiet = { log: (): void => {} };


const opts = tinyRunOptions;

test('training on text: loss falls; the run folder has metrics, the SVG curve, the summary and the final model', async () => {
  const dir = tmp();
  const logged: string[] = [];
  const s = await runTraining(opts(dir, { steps: 30, evalEvery: 10, saveEvery: 10 }), { log: (l: string) => { logged.push(l); } });
  // The run states the numbers it baked in, one line for the student.
  assert.ok(logged.some((l) => /^student: qwen2 theta \d+ rope default eps \S+ head_dim \d+ qkv_bias yes tied (yes|no)$/.test(l)), logged.join('\n'));
  assert.ok(s.finalTrainLoss < s.initialTrainLoss - 0.5, `train loss ${s.initialTrainLoss} → ${s.finalTrainLoss}`);
  assert.ok(s.finalValLoss < s.initialValLoss, `validation loss ${s.initialValLoss} → ${s.finalValLoss}`);
  for (const f of ['metrics.jsonl', 'loss.svg', 'summary.json', 'tokenizer.json', 'final/config.json', 'final/model.safetensors', 'final/tokenizer.json']) {
    assert.ok(fs.existsSync(path.join(s.out, f)), `${f} missing`);
  }
  const rows = fs.readFileSync(path.join(s.out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>);
  assert.equal(rows.filter((r) => r.loss !== undefined).length, 30);
  assert.ok(fs.readFileSync(path.join(s.out, 'loss.svg'), 'utf8').includes('<path'));
});

test('resume: stopping at step 4 (or 3, off the evaluation schedule) and resuming gives bit-identical weights, evaluations and best/ to an uninterrupted run', async () => {
  const dir = tmp();
  const full = await runTraining(opts(dir, { out: path.join(dir, 'full'), steps: 8, gradAccum: 2 }), quiet);
  const a = await runTraining(opts(dir, { out: path.join(dir, 'split'), steps: 8, gradAccum: 2, stopAfter: 4 }), quiet);
  assert.equal(a.status, 'stopped');
  assert.equal(a.finalDir, null);
  const b = await runTraining(opts(dir, { out: path.join(dir, 'split'), steps: 8, gradAccum: 2, resume: true }), quiet);
  assert.equal(b.steps, 8);
  const w1 = readFlatCheckpoint(path.join(full.out, 'checkpoints', 'latest', 'model')).weights;
  const w2 = readFlatCheckpoint(path.join(b.out, 'checkpoints', 'latest', 'model')).weights;
  assert.equal(w1.length, w2.length);
  assert.ok(Buffer.from(w1.buffer).equals(Buffer.from(w2.buffer)), 'resumed weights differ from the uninterrupted run');
  assert.equal(b.finalValLoss, full.finalValLoss);
  // the evaluations, best/ and the summary's best are the uninterrupted run's too (a --stop-after stop made an extra
  // evaluation: a metrics row, a best/ candidate of its own)
  const vals = (d: string): string => JSON.stringify(fs.readFileSync(path.join(d, 'metrics.jsonl'), 'utf8').trim().split('\n')
    .map((l) => JSON.parse(l) as Record<string, number>).filter((r) => r.val_loss !== undefined).map((r) => [r.step, r.val_loss]));
  assert.equal(vals(b.out), vals(full.out));
  assert.equal(b.bestStep, full.bestStep);
  assert.equal(fs.readFileSync(path.join(b.out, 'checkpoints', 'best', 'best.json'), 'utf8'), fs.readFileSync(path.join(full.out, 'checkpoints', 'best', 'best.json'), 'utf8'));
  // a stop off the evaluation schedule (step 3 of evaluations every 4)
  await runTraining(opts(dir, { out: path.join(dir, 'split3'), steps: 8, gradAccum: 2, stopAfter: 3 }), quiet);
  const c = await runTraining(opts(dir, { out: path.join(dir, 'split3'), steps: 8, gradAccum: 2, resume: true }), quiet);
  assert.equal(vals(c.out), vals(full.out));
  assert.equal(c.bestStep, full.bestStep);
  assert.ok(readFlatCheckpoint(path.join(c.out, 'final')).weights.every((x, i) => x === readFlatCheckpoint(path.join(full.out, 'final')).weights[i]));
});

test('resume: a checkpoint of a version before q/k/v were grouped (its moments in the legacy order, no paramOrder) resumes bit-identically', async () => {
  const dir = tmp();
  const full = await runTraining(opts(dir, { out: path.join(dir, 'full'), steps: 6 }), quiet);
  const a = await runTraining(opts(dir, { out: path.join(dir, 'split'), steps: 6, stopAfter: 4 }), quiet);
  assert.equal(a.status, 'stopped');
  // rewrite the checkpoint as an older version wrote it: the moments in the Hugging Face order, state.json without paramOrder
  const latest = path.join(a.out, 'checkpoints', 'latest');
  const cfg = readFlatCheckpoint(path.join(latest, 'model')).config;
  const grouped = parameterLayout(cfg), legacy = parameterLayout(cfg, 'legacy');
  assert.ok(cfg.qkvBias && grouped.layers[0]!.bq!.offset !== legacy.layers[0]!.bq!.offset, 'the orders differ for this model');
  const mv = readSafetensors(path.join(latest, 'optimizer.safetensors')).tensors;
  const old = (name: string): Float32Array => reorderFlat(mv.get(name)!.data, grouped, legacy);
  writeSafetensors(path.join(latest, 'optimizer.safetensors'), new Map([['m', { shape: [grouped.total], data: old('m') }], ['v', { shape: [grouped.total], data: old('v') }]]), { dtype: 'f32' });
  const state = JSON.parse(fs.readFileSync(path.join(latest, 'state.json'), 'utf8')) as Record<string, unknown>;
  // version 2: a version before the grouped order refuses the checkpoint ("unknown version") instead of misplacing the moments
  assert.equal(state.paramOrder, 'grouped');
  assert.equal(state.version, 2);
  delete state.paramOrder;
  state.version = 1;
  fs.writeFileSync(path.join(latest, 'state.json'), JSON.stringify(state));
  const b = await runTraining(opts(dir, { out: path.join(dir, 'split'), steps: 6, resume: true }), quiet);
  assert.equal(b.steps, 6);
  const w1 = readFlatCheckpoint(path.join(full.out, 'final')).weights, w2 = readFlatCheckpoint(path.join(b.out, 'final')).weights;
  assert.ok(Buffer.from(w1.buffer).equals(Buffer.from(w2.buffer)), 'resumed weights differ from the uninterrupted run');
});

test('a saved checkpoint reloads bit-exactly (f32), and bf16 within bf16 rounding', () => {
  const dir = tmp();
  const cfg = presetConfig('tiny', 50);
  const w = initialWeights(parameterLayout(cfg), cfg, new Rng(1));
  writeCheckpoint(path.join(dir, 'f32'), cfg, w, { dtype: 'f32' });
  const back = readFlatCheckpoint(path.join(dir, 'f32'));
  assert.deepEqual(back.config, cfg);
  assert.ok(Buffer.from(back.weights.buffer).equals(Buffer.from(w.buffer)));
  writeCheckpoint(path.join(dir, 'bf16'), cfg, w, { dtype: 'bf16' });
  const b16 = readFlatCheckpoint(path.join(dir, 'bf16')).weights;
  for (let i = 0; i < w.length; i++) assert.ok(Math.abs(b16[i]! - w[i]!) <= Math.abs(w[i]!) * 2 ** -8 + 1e-30, `element ${i}`);
});

test('an empty dataset is a clear error', async () => {
  const dir = tmp();
  const empty = path.join(dir, 'empty.txt');
  fs.writeFileSync(empty, '   \n');
  await assert.rejects(runTraining(opts(dir, { data: [empty] }), quiet), (e: unknown) => e instanceof DistilleryError && /empty|no documents|no tokens/i.test(e.message));
});

test('a non-finite loss stops the run, names the step, and keeps the last good checkpoint', async () => {
  const dir = tmp();
  const o = opts(dir, { steps: 40, saveEvery: 1, evalEvery: 100, lr: 1e3, warmup: 5, clip: 0 });
  await assert.rejects(runTraining(o, quiet), (e: unknown) => e instanceof DistilleryError && /stopped at step \d+/.test(e.message) && /not finite|non-finite/.test(e.message));
  const latest = path.join(o.out, 'checkpoints', 'latest');
  const ck = readFlatCheckpoint(path.join(latest, 'model'));
  assert.ok(ck.weights.every((x) => Number.isFinite(x)), 'the kept checkpoint holds non-finite weights');
  const state = JSON.parse(fs.readFileSync(path.join(latest, 'state.json'), 'utf8')) as { step: number };
  assert.ok(state.step >= 1);
  const summary = JSON.parse(fs.readFileSync(path.join(o.out, 'summary.json'), 'utf8')) as { status: string; steps: number; lastGoodStep: number };
  assert.match(summary.status, /^failed at step \d+/);
  assert.equal(summary.lastGoodStep, state.step);
  assert.ok(summary.steps >= state.step);
});

test('a checkpoint write that fails midway keeps the previous checkpoint, and resuming from it is exact', async () => {
  const dir = tmp();
  const full = await runTraining(opts(dir, { out: path.join(dir, 'full'), steps: 8, saveEvery: 4 }), quiet);
  const o = opts(dir, { out: path.join(dir, 'crash'), steps: 8, saveEvery: 4 });
  const failing = { ...quiet, duringCheckpointWrite: (_tmp: string, step: number): void => { if (step === 8) throw new Error('disk full (simulated)'); } };
  await assert.rejects(runTraining(o, failing), /disk full/);
  const latest = path.join(o.out, 'checkpoints', 'latest');
  const state = JSON.parse(fs.readFileSync(path.join(latest, 'state.json'), 'utf8')) as { step: number };
  assert.equal(state.step, 4, 'the step-4 checkpoint must survive the failed step-8 write');
  assert.deepEqual(fs.readdirSync(path.dirname(latest)).filter((n) => n !== 'best'), ['latest'], 'no temporary folder may be left behind');
  const resumed = await runTraining({ ...o, resume: true }, quiet);
  const w1 = readFlatCheckpoint(path.join(full.out, 'checkpoints', 'latest', 'model')).weights;
  const w2 = readFlatCheckpoint(path.join(resumed.out, 'checkpoints', 'latest', 'model')).weights;
  assert.ok(Buffer.from(w1.buffer).equals(Buffer.from(w2.buffer)));
  assert.equal(resumed.finalTrainLoss, full.finalTrainLoss);
});

test('distillation refuses a teacher whose vocabulary differs from the student\'s', async () => {
  const dir = tmp();
  const tcfg = presetConfig('tiny', 77);
  writeCheckpoint(path.join(dir, 'teacher'), tcfg, initialWeights(parameterLayout(tcfg), tcfg, new Rng(2)), { dtype: 'f32' });
  const o = opts(dir, { mode: 'distill', teacher: path.join(dir, 'teacher'), model: path.join(dir, 'student.json') });
  const scfg = presetConfig('tiny', 300);
  fs.writeFileSync(path.join(dir, 'student.json'), JSON.stringify(toHfConfig(scfg)));
  // The teacher has no tokenizer.json; give one explicitly so the vocabulary check is what fails.
  const first = await runTraining(opts(dir, { steps: 1, out: path.join(dir, 'tok') }), quiet);
  o.tokenizer = path.join(first.out, 'tokenizer.json');
  await assert.rejects(runTraining(o, quiet), (e: unknown) => e instanceof DistilleryError && /vocabular/.test(e.message) && /77/.test(e.message));
});

test('checkpoint errors: missing tensor, shape mismatch with config.json, truncated safetensors', () => {
  const dir = tmp();
  const cfg = presetConfig('tiny', 40);
  const layout = parameterLayout(cfg);
  const w = initialWeights(layout, cfg, new Rng(1));
  const ck = path.join(dir, 'ck');
  writeCheckpoint(ck, cfg, w, { dtype: 'f32' });
  const file = path.join(ck, 'model.safetensors');
  const bytes = fs.readFileSync(file);
  // Truncated file.
  fs.writeFileSync(file, bytes.subarray(0, bytes.length - 100));
  assert.throws(() => readFlatCheckpoint(ck), (e: unknown) => e instanceof DistilleryError && /model\.safetensors/.test(e.message));
  // Missing tensor.
  const tensors = new Map(layout.tensors.filter((t) => t.name !== 'model.norm.weight').map((t) => [t.name, { shape: t.shape, data: w.subarray(t.offset, t.offset + t.size) }]));
  writeSafetensors(file, tensors);
  assert.throws(() => readFlatCheckpoint(ck), (e: unknown) => e instanceof DistilleryError && /missing tensor "model\.norm\.weight"/.test(e.message));
  // Shape mismatch: config says hidden 64 but weights were saved for another width.
  const other = presetConfig('small', 40);
  writeCheckpoint(path.join(dir, 'other'), other, initialWeights(parameterLayout(other), other, new Rng(1)), { dtype: 'f32' });
  fs.copyFileSync(path.join(dir, 'other', 'model.safetensors'), file);
  assert.throws(() => readFlatCheckpoint(ck), (e: unknown) => e instanceof DistilleryError && /has shape \[/.test(e.message));
});

/** Equal files; state.json records the run's options, whose --out differs between the two runs compared. */
function sameFile(name: string, a: Buffer, b: Buffer): boolean {
  if (path.basename(name) !== 'state.json') return a.equals(b);
  const strip = (x: Buffer): unknown => { const j = JSON.parse(x.toString()) as { options: { out?: string } }; delete j.options.out; return j; };
  try { assert.deepEqual(strip(a), strip(b)); return true; } catch { return false; }
}

test('checkpoints written on the writer thread, every job of it slowed down, equal the synchronous writes (latest at each save, best/, final/)', async () => {
  const dir = tmp();
  // saves at steps 2, 4, 6 and evaluations (best/) at 3 and 6: with each background job 400 ms late, a save or best/
  // that did not wait for the write in flight (or the prefault's zero-fill) would download into arrays still being
  // written from: that write would then hold a later step's weights under its own step's state
  const o = (name: string): RunOptions => opts(dir, { out: path.join(dir, name), steps: 6, saveEvery: 2, evalEvery: 3 });
  const seen = (into: Array<[number, Map<string, Buffer>]>) => (step: number, latest: string): void => { into.push([step, treeBytes(latest)]); };
  const syncSeen: Array<[number, Map<string, Buffer>]> = [], bgSeen: Array<[number, Map<string, Buffer>]> = [];
  const sync = await runTraining(o('sync'), { ...quiet, duringCheckpointWrite: () => {}, afterCheckpointWrite: seen(syncSeen) });
  const bg = await runTraining(o('bg'), { ...quiet, checkpointWriteDelayMs: 400, afterCheckpointWrite: seen(bgSeen) });
  assert.deepEqual(bgSeen.map(([st]) => st), [2, 4, 6]);
  assert.deepEqual(syncSeen.map(([st]) => st), [2, 4, 6]);
  bgSeen.forEach(([st, b], i) => {
    const a = syncSeen[i]![1];
    assert.deepEqual([...b.keys()].sort(), [...a.keys()].sort(), `latest at step ${st}`);
    for (const [k, v] of a) assert.ok(sameFile(k, v, b.get(k)!), `latest/${k} at step ${st} differs`);
  });
  for (const sub of ['checkpoints/best', 'final']) {
    const a = treeBytes(path.join(sync.out, sub)), b = treeBytes(path.join(bg.out, sub));
    assert.deepEqual([...b.keys()].sort(), [...a.keys()].sort(), sub);
    for (const [k, v] of a) assert.ok(sameFile(k, v, b.get(k)!), `${sub}/${k} differs`);
  }
  assert.equal(bg.lastGoodStep, 6);
  fs.rmSync(dir, { recursive: true, force: true });
});

test('a checkpoint write that fails on the writer thread stops the run at the next join with its error, naming the step', async () => {
  const dir = tmp();
  const o = opts(dir, { out: path.join(dir, 'bgfail'), steps: 2, saveEvery: 1, evalEvery: 100 });
  const latest = path.join(o.out, 'checkpoints', 'latest');
  // once step 1's checkpoint is on disk, checkpoints/latest becomes a symbolic link: the writer refuses to write
  // through it, so step 2's background write fails and the run's last join throws that error
  const sabotage = (step: number): void => {
    if (step !== 1) return;
    fs.renameSync(latest, `${latest}-moved`);
    fs.symlinkSync(`${latest}-moved`, latest);
  };
  await assert.rejects(runTraining(o, { ...quiet, checkpointWriteDelayMs: 200, afterCheckpointWrite: sabotage }),
    (e: unknown) => e instanceof DistilleryError && /^the checkpoint of step 2: cannot write folder .*latest: it is a symbolic link/.test(e.message) && /link/.test(e.hint ?? ''));
  const state = JSON.parse(fs.readFileSync(path.join(`${latest}-moved`, 'state.json'), 'utf8')) as { step: number };
  assert.equal(state.step, 1, 'step 1\'s checkpoint is untouched');
  fs.rmSync(dir, { recursive: true, force: true });
});
