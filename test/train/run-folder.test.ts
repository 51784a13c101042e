/**
 * Run folders you can trust (issue 8): only good checkpoints replace checkpoints/latest, a lock against two runs,
 * no silent reuse of a folder, resume from what the checkpoint recorded (tokenizer, data hash), validated optimizer
 * moments, no writes through symbolic links, non-finite weights refused by name, clean stops on SIGINT / SIGTERM,
 * checkpoints/best and the rising-validation warning.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { spawn, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { runTraining, type RunSummary } from '../../src/train/run.js';
import { DEFAULT_RUN_OPTIONS, type RunOptions } from '../../src/train/options.js';
import { lockRunFolder, LOCK_FILE } from '../../src/train/run-folder.js';
import { ValidationWatch } from '../../src/train/validation-watch.js';
import { readFlatCheckpoint, writeCheckpoint } from '../../src/model/checkpoint.js';
import { parameterLayout, initialWeights } from '../../src/model/params.js';
import { readSafetensors, writeSafetensors } from '../../src/io/safetensors.js';
import { replaceDirAtomicSync } from '../../src/io/atomic.js';
import { main } from '../../src/cli/main.js';
import { DistilleryError, InputError } from '../../src/util/errors.js';
import { Rng } from '../../src/util/rng.js';
import { corpusFile } from './corpus.js';
import { capture, tinyConfig, tinyTokenizer } from '../cli/fixtures.js';

const tmp = (): string => fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-runfolder-'));
const quiet = { log: (): void => {} };


function opts(dir: string, over: Partial<RunOptions>): RunOptions {
  const data = path.join(dir, 'corpus.txt');
  if (!fs.existsSync(data)) corpusFile(dir);
  return {
    ...DEFAULT_RUN_OPTIONS, mode: 'train', out: path.join(dir, 'run'), data: [data], model: 'tiny',
    vocabSize: 300, batch: 4, seq: 16, steps: 4, evalEvery: 2, saveEvery: 2, warmup: 1, quiet: true, threads: 1, ...over,
  };
}

const isError = (re: RegExp, hint?: RegExp) => (e: unknown): boolean => {
  assert.ok(e instanceof DistilleryError, `expected a DistilleryError, got ${String(e)}`);
  assert.match(e.message, re);
  if (hint) assert.match(e.hint ?? '', hint);
  return true;
};

const stateOf = (out: string): { step: number } => JSON.parse(fs.readFileSync(path.join(out, 'checkpoints', 'latest', 'state.json'), 'utf8')) as { step: number };
const summaryOf = (out: string): RunSummary => JSON.parse(fs.readFileSync(path.join(out, 'summary.json'), 'utf8')) as RunSummary;
const lossLines = (out: string): number => fs.readFileSync(path.join(out, 'metrics.jsonl'), 'utf8').split('\n').filter((l) => l.includes('"loss"')).length;

async function cli(argv: string[]): Promise<{ code: number; out: string; err: string }> {
  const io = capture();
  const code = await main(argv, io);
  return { code, out: io.stdout(), err: io.stderr() };
}

// ---- 1: only good checkpoints ----------------------------------------------------------------------------

test('an update that makes the weights non-finite is never saved: --lr 1e39 --save-every 1 leaves no checkpoint and says so', async () => {
  const dir = tmp();
  const o = opts(dir, { steps: 10, saveEvery: 1, evalEvery: 100, lr: 1e39, warmup: 0, clip: 0 });
  await assert.rejects(runTraining(o, quiet), isError(/stopped at step 1: .*non-finite/, /no good checkpoint/));
  assert.equal(fs.existsSync(path.join(o.out, 'checkpoints', 'latest')), false, 'a checkpoint of non-finite weights was written');
  assert.equal(summaryOf(o.out).lastGoodStep, null);
});

test('after a blow-up the last good checkpoint is named by its step, and its weights give a finite loss', async () => {
  const dir = tmp();
  const o = opts(dir, { steps: 20, saveEvery: 1, evalEvery: 100, lr: 1e3, warmup: 5, clip: 0 });
  let err: DistilleryError | null = null;
  try { await runTraining(o, quiet); } catch (e) { err = e as DistilleryError; }
  assert.ok(err instanceof DistilleryError, 'the run should stop');
  const good = stateOf(o.out).step;
  assert.ok(good >= 1);
  assert.match(err.message, new RegExp(`stopped at step ${good + 1}\\b`));
  assert.match(err.hint ?? '', new RegExp(`\\(step ${good};`));
  assert.equal(summaryOf(o.out).lastGoodStep, good);
  const model = path.join(o.out, 'checkpoints', 'latest', 'model');
  assert.ok(readFlatCheckpoint(model).weights.every(Number.isFinite));
  // An independent check that the kept weights are usable: the eval command on the training text.
  const r = await cli(['eval', '--model', model, '--data', o.data[0]!, '--seq', '16', '--threads', '1', '--json']);
  assert.equal(r.code, 0, r.err);
  const loss = (JSON.parse(r.out) as { loss: number }).loss;
  assert.ok(Number.isFinite(loss), `the last good checkpoint gives loss ${loss}`);
});

test('finite divergence (--lr 10) completes but the summary warns, in summary.json and in the printed summary', async () => {
  const dir = tmp();
  const lines: string[] = [];
  const s = await runTraining(opts(dir, { steps: 12, lr: 10, warmup: 0, evalEvery: 6, saveEvery: 12 }), { log: (l) => lines.push(l) });
  assert.equal(s.status, 'completed');
  assert.ok(s.finalTrainLoss > 1.5 * s.initialTrainLoss, `the run did not diverge: ${s.initialTrainLoss} → ${s.finalTrainLoss}`);
  assert.ok(s.warnings.some((w) => /diverged/.test(w)), JSON.stringify(s.warnings));
  assert.deepEqual(summaryOf(s.out).warnings, s.warnings);
  assert.ok(lines.some((l) => /^warning: training diverged/.test(l)), lines.join('\n'));
  // A healthy run has no such warning.
  const ok = await runTraining(opts(dir, { out: path.join(dir, 'ok'), steps: 12, evalEvery: 6, saveEvery: 12 }), quiet);
  assert.ok(!ok.warnings.some((w) => /diverged/.test(w)), JSON.stringify(ok.warnings));
});

// ---- 2: the lock -----------------------------------------------------------------------------------------

test('a run folder is locked: a second run names the holder\'s pid (exit 1); a stale lock of a dead pid is taken over', async () => {
  const dir = tmp();
  const o = opts(dir, { steps: 2 });
  fs.mkdirSync(o.out);
  const held = lockRunFolder(o.out);
  await assert.rejects(runTraining(o, quiet), isError(new RegExp(`in use by another run \\(pid ${process.pid}`)));
  const r = await cli(['train', '--data', o.data[0]!, '--out', o.out, '--steps', '2', '--warmup', '0', '--quiet']);
  assert.equal(r.code, 1);
  assert.match(r.err, new RegExp(`error: .*pid ${process.pid}`));
  assert.doesNotMatch(r.err, /\n\s+at /, 'no stack trace');
  held.release();
  assert.equal(fs.existsSync(path.join(o.out, LOCK_FILE)), false);
  // A lock left by a process that is gone (on this host) is stale.
  const dead = spawnSync(process.execPath, ['-e', '0']).pid!;
  fs.writeFileSync(path.join(o.out, LOCK_FILE), JSON.stringify({ pid: dead, hostname: os.hostname(), started: 'x' }));
  const s = await runTraining(o, quiet);
  assert.equal(s.status, 'completed');
  assert.equal(fs.existsSync(path.join(o.out, LOCK_FILE)), false, 'the lock is removed when the run ends');
  // A lock from another host cannot be checked: refused, naming host and pid.
  fs.writeFileSync(path.join(o.out, LOCK_FILE), JSON.stringify({ pid: 4242, hostname: 'elsewhere.example', started: 'x' }));
  await assert.rejects(runTraining({ ...o, resume: true }, quiet), isError(/locked by pid 4242 on host elsewhere\.example/));
});

// ---- 3: no silent overwrite ------------------------------------------------------------------------------

test('a run folder that holds a run is refused without --resume or --overwrite; --overwrite starts afresh', async () => {
  const dir = tmp();
  const o = opts(dir, { steps: 4 });
  await runTraining(o, quiet);
  const metrics = fs.readFileSync(path.join(o.out, 'metrics.jsonl'));
  await assert.rejects(runTraining({ ...o, steps: 2, warmup: 0 }, quiet), isError(/already holds a run/, /--resume.*--overwrite/));
  assert.ok(fs.readFileSync(path.join(o.out, 'metrics.jsonl')).equals(metrics), 'metrics.jsonl was touched');
  assert.equal(stateOf(o.out).step, 4);
  // --overwrite with bad input (unreadable data, a broken model config) fails before it removes anything
  const bad = path.join(dir, 'bad.jsonl');
  fs.writeFileSync(bad, '{"text": "fine"}\n{"oops\n');
  const badCfg = path.join(dir, 'bad-config.json');
  fs.writeFileSync(badCfg, JSON.stringify({ model_type: 'qwen2', hidden_size: 'big' }));
  await assert.rejects(runTraining({ ...o, data: [bad], steps: 2, warmup: 0, overwrite: true }, quiet), /invalid JSON/);
  await assert.rejects(runTraining({ ...o, model: badCfg, steps: 2, warmup: 0, overwrite: true }, quiet), /hidden_size/);
  assert.ok(fs.readFileSync(path.join(o.out, 'metrics.jsonl')).equals(metrics), 'a failed --overwrite removed the previous run');
  assert.equal(stateOf(o.out).step, 4);
  assert.ok(fs.existsSync(path.join(o.out, 'final', 'model.safetensors')));
  // a model folder as --out (its tokenizer.json would be replaced by the run's), --overwrite or not
  const modelDir = path.join(o.out, 'final');
  const tokBefore = fs.readFileSync(path.join(modelDir, 'tokenizer.json'));
  for (const overwrite of [false, true]) {
    await assert.rejects(runTraining({ ...o, out: modelDir, steps: 2, warmup: 0, overwrite }, quiet), isError(/holds a model \(config\.json\), not a run/, /--init/));
  }
  assert.ok(fs.readFileSync(path.join(modelDir, 'tokenizer.json')).equals(tokBefore));
  // a folder that holds only a tokenizer.json (a user's, not a run's) is refused unless --overwrite says to replace it
  const tokDir = path.join(dir, 'just-a-tokenizer');
  fs.mkdirSync(tokDir);
  fs.writeFileSync(path.join(tokDir, 'tokenizer.json'), tokBefore);
  await assert.rejects(runTraining({ ...o, out: tokDir, steps: 2, warmup: 0 }, quiet),
    (e: unknown) => e instanceof InputError && /holds a tokenizer\.json but no run/.test(e.message) && /--tokenizer/.test(e.hint ?? ''));
  assert.ok(fs.readFileSync(path.join(tokDir, 'tokenizer.json')).equals(tokBefore));
  assert.deepEqual(fs.readdirSync(tokDir), ['tokenizer.json']);
  const s = await runTraining({ ...o, steps: 2, warmup: 0, overwrite: true }, quiet);
  assert.equal(s.steps, 2);
  assert.equal(stateOf(o.out).step, 2);
  assert.equal(lossLines(o.out), 2);
  // The CLI: --overwrite is a flag; with --resume it is a usage error (exit 2).
  const r = await cli(['train', '--data', o.data[0]!, '--out', o.out, '--resume', '--overwrite']);
  assert.equal(r.code, 2);
  assert.match(r.err, /--resume and --overwrite/);
});

// ---- 4: resume from what the checkpoint recorded ---------------------------------------------------------

test('--resume uses the checkpoint\'s own tokenizer (out/tokenizer.json rewritten since) and stays exact', async () => {
  const dir = tmp();
  const full = await runTraining(opts(dir, { out: path.join(dir, 'full') }), quiet);
  const o = opts(dir, { out: path.join(dir, 'split'), stopAfter: 2 });
  await runTraining(o, quiet);
  fs.writeFileSync(path.join(o.out, 'tokenizer.json'), JSON.stringify(tinyTokenizer().toJSON()));
  const b = await runTraining({ ...o, stopAfter: 0, resume: true }, quiet);
  assert.equal(b.steps, 4);
  const w1 = readFlatCheckpoint(path.join(full.out, 'final')).weights, w2 = readFlatCheckpoint(path.join(b.out, 'final')).weights;
  assert.ok(Buffer.from(w1.buffer).equals(Buffer.from(w2.buffer)), 'the resumed run differs from the uninterrupted one');
});

test('--resume refuses data that changed since the checkpoint', async () => {
  const dir = tmp();
  const o = opts(dir, { stopAfter: 2 });
  await runTraining(o, quiet);
  fs.appendFileSync(o.data[0]!, '\n\nthe student learns a new sentence.');
  await assert.rejects(runTraining({ ...o, stopAfter: 0, resume: true }, quiet), isError(/data changed/, /--overwrite/));
  assert.equal(stateOf(o.out).step, 2);
});

// ---- 5: optimizer state validated --------------------------------------------------------------------------

test('a damaged optimizer.safetensors (wrong length, missing moment, NaN, missing file) is a clear error on --resume', async () => {
  const dir = tmp();
  const o = opts(dir, { stopAfter: 2 });
  await runTraining(o, quiet);
  const file = path.join(o.out, 'checkpoints', 'latest', 'optimizer.safetensors');
  const good = fs.readFileSync(file);
  const { tensors } = readSafetensors(file);
  const m = tensors.get('m')!.data, v = tensors.get('v')!.data;
  const resume = (): Promise<RunSummary> => runTraining({ ...o, stopAfter: 0, resume: true }, quiet);
  writeSafetensors(file, new Map([['m', { shape: [m.length - 1], data: m.subarray(1) }], ['v', { shape: [v.length], data: v }]]));
  await assert.rejects(resume(), isError(/"m" has \d+ values but the model has \d+ parameters/));
  writeSafetensors(file, new Map([['m', { shape: [m.length], data: m }]]));
  await assert.rejects(resume(), isError(/expected the tensors "m" and "v", found "m"/));
  const vNaN = Float32Array.from(v); vNaN[7] = NaN;
  writeSafetensors(file, new Map([['m', { shape: [m.length], data: m }], ['v', { shape: [v.length], data: vNaN }]]));
  await assert.rejects(resume(), isError(/"v" holds an invalid value \(NaN at element 7\)/));
  fs.rmSync(file);
  await assert.rejects(resume(), isError(/optimizer\.safetensors is missing/));
  fs.writeFileSync(file, good);
  assert.equal((await resume()).status, 'completed');
});

// ---- 6: no writes through symbolic links -----------------------------------------------------------------

test('a symlinked metrics.jsonl (or checkpoints folder) pointing outside --out is refused and the outside file stays untouched', async () => {
  const dir = tmp();
  const outside = path.join(dir, 'outside.txt');
  fs.writeFileSync(outside, 'precious\n');
  // A fresh run into a folder whose metrics.jsonl is a link.
  const o = opts(dir, { steps: 2, warmup: 0 });
  fs.mkdirSync(o.out);
  fs.symlinkSync(outside, path.join(o.out, 'metrics.jsonl'));
  await assert.rejects(runTraining(o, quiet), isError(/metrics\.jsonl is a symbolic link/));
  await assert.rejects(runTraining({ ...o, overwrite: true }, quiet), isError(/symbolic link/));
  assert.equal(fs.readFileSync(outside, 'utf8'), 'precious\n');
  // Resuming a real run whose metrics.jsonl was replaced by a link.
  const r = opts(dir, { out: path.join(dir, 'r'), stopAfter: 2 });
  await runTraining(r, quiet);
  fs.rmSync(path.join(r.out, 'metrics.jsonl'));
  fs.symlinkSync(outside, path.join(r.out, 'metrics.jsonl'));
  await assert.rejects(runTraining({ ...r, stopAfter: 0, resume: true }, quiet), isError(/symbolic link/));
  assert.equal(fs.readFileSync(outside, 'utf8'), 'precious\n');
  // A link planted during the run (after the start-up check) is not followed either.
  const p = opts(dir, { out: path.join(dir, 'p'), steps: 4, saveEvery: 2 });
  const plant = { ...quiet, duringCheckpointWrite: (): void => {
    const f = path.join(p.out, 'metrics.jsonl');
    if (!fs.lstatSync(f).isSymbolicLink()) { fs.rmSync(f); fs.symlinkSync(outside, f); }
  } };
  await assert.rejects(runTraining(p, plant), isError(/symbolic link/));
  assert.equal(fs.readFileSync(outside, 'utf8'), 'precious\n');
  // A symlinked checkpoints folder, and replaceDirAtomic onto a link.
  const c = opts(dir, { out: path.join(dir, 'c'), steps: 2, warmup: 0 });
  fs.mkdirSync(c.out);
  const elsewhere = path.join(dir, 'elsewhere');
  fs.mkdirSync(elsewhere);
  fs.symlinkSync(elsewhere, path.join(c.out, 'checkpoints'));
  await assert.rejects(runTraining(c, quiet), isError(/checkpoints is a symbolic link/));
  assert.deepEqual(fs.readdirSync(elsewhere), []);
  fs.symlinkSync(elsewhere, path.join(dir, 'linkdir'));
  assert.throws(() => replaceDirAtomicSync(path.join(dir, 'linkdir'), (t) => fs.writeFileSync(path.join(t, 'x'), 'x')), isError(/symbolic link/));
  assert.deepEqual(fs.readdirSync(elsewhere), []);
});

// ---- 7: non-finite weights refused by name ---------------------------------------------------------------

test('a checkpoint with a NaN or Inf weight is refused by eval, generate and --init, naming the tensor', async () => {
  const dir = tmp();
  const tok = tinyTokenizer();
  const cfg = tinyConfig(tok.vocabSize);
  const layout = parameterLayout(cfg);
  const w = initialWeights(layout, cfg, new Rng(1));
  const t = layout.tensors.find((x) => x.name === 'model.layers.1.mlp.up_proj.weight')!;
  w[t.offset + 5] = NaN;
  const ck = path.join(dir, 'nan');
  writeCheckpoint(ck, cfg, w, { dtype: 'f32', tokenizerJson: tok.toJSON() });
  const data = corpusFile(dir);
  const e = await cli(['eval', '--model', ck, '--data', data, '--threads', '1']);
  assert.equal(e.code, 1);
  assert.match(e.err, /tensor "model\.layers\.1\.mlp\.up_proj\.weight" holds a non-finite value \(NaN at element 5\)/);
  const g = await cli(['generate', '--model', ck, '--prompt', 'the', '--threads', '1']);
  assert.equal(g.code, 1);
  assert.match(g.err, /model\.layers\.1\.mlp\.up_proj\.weight/);
  assert.equal(g.out, '', 'generate printed text from a broken model');
  w[t.offset + 5] = 1; w[layout.embed.offset] = Infinity;
  writeCheckpoint(ck, cfg, w, { dtype: 'f32', tokenizerJson: tok.toJSON() });
  await assert.rejects(runTraining(opts(dir, { init: ck, steps: 2, warmup: 0 }), quiet), isError(/"model\.embed_tokens\.weight" holds a non-finite value \(Infinity/));
});

// ---- 9: SIGINT / SIGTERM ---------------------------------------------------------------------------------

const BIN = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'bin', 'distillery.js');

/**
 * Starts a long CLI run, sends `signal` once the first step is in metrics.jsonl, and returns the exit code. Before
 * the signal, a second run into the same folder must be refused, naming the running child's pid.
 */
async function interrupt(dir: string, signal: 'SIGINT' | 'SIGTERM'): Promise<{ code: number | null; out: string; stderr: string }> {
  const out = path.join(dir, `run-${signal}`);
  const child = spawn(process.execPath, [BIN, 'train', '--data', path.join(dir, 'corpus.txt'), '--out', out, '--model', 'tiny',
    '--vocab-size', '300', '--batch', '4', '--seq', '16', '--steps', '100000', '--warmup', '1', '--eval-every', '100000',
    '--save-every', '100000', '--threads', '1', '--quiet'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => { stderr += d.toString(); });
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  const metrics = path.join(out, 'metrics.jsonl');
  const t0 = Date.now();
  while (!(fs.existsSync(metrics) && fs.readFileSync(metrics, 'utf8').includes('"loss"'))) {
    if (Date.now() - t0 > 20_000 || child.exitCode !== null) { child.kill('SIGKILL'); throw new Error(`no training step logged: ${stderr}`); }
    await new Promise((r) => setTimeout(r, 20));
  }
  const second = await cli(['train', '--data', path.join(dir, 'corpus.txt'), '--out', out, '--steps', '2', '--warmup', '0', '--quiet']);
  assert.equal(second.code, 1);
  assert.match(second.err, new RegExp(`in use by another run \\(pid ${child.pid}`));
  child.kill(signal);
  return { code: await exited, out, stderr };
}

test('SIGINT / SIGTERM during training: a second run is refused meanwhile; the step finishes, checkpoint, summary and plot are written, exit 130 / 143', async () => {
  const dir = tmp();
  corpusFile(dir);
  for (const [signal, want] of [['SIGINT', 130], ['SIGTERM', 143]] as const) {
    const r = await interrupt(dir, signal);
    assert.equal(r.code, want, r.stderr);
    const steps = lossLines(r.out);
    assert.ok(steps >= 1);
    assert.equal(stateOf(r.out).step, steps, 'the checkpoint is of the last finished step');
    const s = summaryOf(r.out);
    assert.equal(s.status, `interrupted by ${signal}`);
    assert.equal(s.signal, signal);
    assert.equal(s.steps, steps);
    assert.ok(fs.readFileSync(path.join(r.out, 'loss.svg'), 'utf8').includes('<svg'));
    assert.equal(fs.existsSync(path.join(r.out, LOCK_FILE)), false, 'the lock was left behind');
    assert.doesNotMatch(r.stderr, /\n\s+at /, 'no stack trace');
  }
});

test('a signal during the step-0 evaluation or while final/ is written is taken, not fatal: the run stops at a safe point with its files whole', async () => {
  const dir = tmp();
  // during the initial evaluation (no handler was installed yet: Node's default would kill the process, leaving a
  // folder that neither --resume nor a new run accepts): the run stops after its first step, with a checkpoint
  const o = opts(dir, { steps: 50, evalEvery: 25, saveEvery: 25, warmup: 1 });
  let sent = false;
  const s = await runTraining(o, { log: (l) => { if (!sent && /^step 0: validation loss/.test(l)) { sent = true; process.emit('SIGINT', 'SIGINT'); } } });
  assert.equal(s.status, 'interrupted by SIGINT');
  assert.equal(s.steps, 1);
  assert.equal(stateOf(o.out).step, 1);
  // at the last step (the loop is over; final/ and the summary follow): both are written whole, the signal recorded
  const f = opts(dir, { out: path.join(dir, 'final-sig'), steps: 3, evalEvery: 3, saveEvery: 3, warmup: 1, quiet: false });
  let fired = false;
  const s2 = await runTraining(f, { log: (l) => { if (!fired && /^step 3: validation loss/.test(l)) { fired = true; process.emit('SIGINT', 'SIGINT'); } } });
  assert.ok(fired);
  assert.ok(fs.existsSync(path.join(f.out, 'final', 'model.safetensors')));
  assert.equal(summaryOf(f.out).steps, s2.steps);
  assert.equal(s2.signal, 'SIGINT');
  assert.equal(process.listenerCount('SIGINT'), 0, 'the handlers are removed when the run ends');
});

test('a crash after best/ was saved past the checkpoint, then --resume with another --lr: best/, the summary and metrics.jsonl agree', async () => {
  const dir = tmp();
  const o = opts(dir, { steps: 20, evalEvery: 5, saveEvery: 10, warmup: 1, lr: 0.02 });
  // the state a crash at step 17 leaves: latest at step 10, best/ of step 15 (better than anything), its metrics rows
  await runTraining({ ...o, stopAfter: 10 }, quiet);
  const best = path.join(o.out, 'checkpoints', 'best');
  fs.rmSync(best, { recursive: true, force: true });
  fs.cpSync(path.join(o.out, 'checkpoints', 'latest', 'model'), best, { recursive: true });
  fs.writeFileSync(path.join(best, 'best.json'), JSON.stringify({ step: 15, val_loss: 0.001 }));
  fs.appendFileSync(path.join(o.out, 'metrics.jsonl'), JSON.stringify({ step: 15, val_loss: 0.001 }) + '\n');
  // resumed with a higher --lr (what the divergence hint advises): its steps are new, best/ of step 15 is not of them
  const s = await runTraining({ ...o, resume: true, lr: 0.5 }, quiet);
  const info = JSON.parse(fs.readFileSync(path.join(best, 'best.json'), 'utf8')) as { step: number; val_loss: number };
  assert.notEqual(info.val_loss, 0.001, 'best/ of the crashed steps stayed');
  assert.equal(s.bestStep, info.step, 'the summary names the model best/ holds');
  const row = fs.readFileSync(path.join(o.out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>)
    .find((r) => r.step === info.step && r.val_loss !== undefined);
  assert.equal(row?.val_loss, info.val_loss, `metrics.jsonl has the evaluation of step ${info.step}`);
});

// ---- 12 (part): best/ and the rising-validation warning --------------------------------------------------

test('checkpoints/best holds the model of the lowest validation loss after a step (its weights as saved then)', async () => {
  const dir = tmp();
  const o = opts(dir, { steps: 12, lr: 0.05, warmup: 0, evalEvery: 2, saveEvery: 2 });
  const atStep = new Map<number, Float32Array>();
  const s = await runTraining(o, { ...quiet, duringCheckpointWrite: (t, step) => { atStep.set(step, readFlatCheckpoint(path.join(t, 'model')).weights); } });
  const rows = fs.readFileSync(path.join(o.out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>)
    .filter((r) => r.val_loss !== undefined && r.step! >= 1);
  const best = rows.reduce((a, b) => (b.val_loss! < a.val_loss! ? b : a));
  const bestDir = path.join(o.out, 'checkpoints', 'best');
  const info = JSON.parse(fs.readFileSync(path.join(bestDir, 'best.json'), 'utf8')) as { step: number; val_loss: number };
  assert.deepEqual(info, { step: best.step, val_loss: best.val_loss });
  assert.equal(s.bestStep, best.step);
  assert.equal(s.bestValLoss, best.val_loss);
  const w = readFlatCheckpoint(bestDir).weights;
  assert.ok(Buffer.from(w.buffer).equals(Buffer.from(atStep.get(best.step!)!.buffer)), 'best/ is not the model of its step');
  assert.ok(fs.existsSync(path.join(bestDir, 'tokenizer.json')));
});

test('ValidationWatch: best after a step only, and one warning per streak of 3 rises', () => {
  const w = new ValidationWatch(3);
  const seq: Array<[number, number]> = [[0, 5], [2, 4], [4, 4.5], [6, 4.6], [8, 4.7], [10, 4.8], [12, 3], [14, 3.1], [16, 3.2], [18, 3.3]];
  const verdicts = seq.map(([s, l]) => w.observe(s, l));
  assert.deepEqual(verdicts.map((v) => v.best), [false, true, false, false, false, false, true, false, false, false]);
  assert.deepEqual(verdicts.map((v) => v.risingStreak), [null, null, null, null, [4, 4.5, 4.6, 4.7], null, null, null, null, [3, 3.1, 3.2, 3.3]]);
  assert.equal(w.bestStep, 12);
  assert.equal(w.bestLoss, 3);
});

test('a validation loss that rises for 3 evaluations is a warning in the log and the summary', async () => {
  const dir = tmp();
  const lines: string[] = [];
  // A rate far too high makes the validation loss climb after the first steps.
  const s = await runTraining(opts(dir, { steps: 20, lr: 1, warmup: 0, evalEvery: 2, saveEvery: 20 }), { log: (l) => lines.push(l) });
  const vals = fs.readFileSync(path.join(s.out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>)
    .filter((r) => r.val_loss !== undefined).map((r) => r.val_loss!);
  let rises = 0, longest = 0;
  for (let i = 1; i < vals.length; i++) { rises = vals[i]! > vals[i - 1]! ? rises + 1 : 0; longest = Math.max(longest, rises); }
  const warned = s.warnings.some((w) => /risen for 3 evaluations in a row/.test(w));
  assert.equal(warned, longest >= 3, `validation losses ${vals.join(', ')}; warnings ${JSON.stringify(s.warnings)}`);
  assert.ok(longest >= 3, `this recipe should make the validation loss rise: ${vals.join(', ')}`);
  assert.ok(lines.some((l) => /^warning: the validation loss has risen/.test(l)));
  // the same run stopped after its warning and resumed: the summary keeps the warning made before the checkpoint
  const o2 = opts(dir, { out: path.join(dir, 'rise-split'), steps: 20, lr: 1, warmup: 0, evalEvery: 2, saveEvery: 2 });
  const whole = s.warnings.filter((w) => /risen for/.test(w)).map((w) => w.replace(s.out, o2.out));
  await runTraining({ ...o2, stopAfter: 18 }, quiet);
  const r = await runTraining({ ...o2, resume: true }, quiet);
  assert.deepEqual(r.warnings.filter((w) => /risen for/.test(w)), whole);
  // a --resume of a run that had finished: its final validation figures stay (they were null)
  const again = await runTraining({ ...o2, resume: true }, quiet);
  assert.equal(again.finalValLoss, r.finalValLoss);
  assert.equal(summaryOf(o2.out).finalValCe, r.finalValCe);
});
