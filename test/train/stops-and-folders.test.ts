/**
 * What a run leaves when it stops early or fails: a signal during the first validation pass stops before the first
 * step (no checkpoint; the folder's next run is told to --overwrite, not to --resume); a folder the run created is
 * removed when it fails empty; --resume past --steps is refused; --out inside the data is seen through links; an atomic
 * write's folder that cannot be made is a DistilleryError.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { runTraining } from '../../src/train/run.js';
import { DEFAULT_RUN_OPTIONS, type RunOptions } from '../../src/train/options.js';
import { DistilleryError, InputError } from '../../src/util/errors.js';
import { corpusFile } from './corpus.js';
import { isInside, realPathish } from '../../src/cli/options.js';
import { replaceDirAtomicSync } from '../../src/io/atomic.js';

const tmp = (): string => fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-stops-'));

function opts(dir: string, over: Partial<RunOptions>): RunOptions {
  return {
    ...DEFAULT_RUN_OPTIONS, mode: 'train', out: path.join(dir, 'run'), data: [corpusFile(dir)], model: 'tiny',
    vocabSize: 300, batch: 4, seq: 16, steps: 6, evalEvery: 3, saveEvery: 3, warmup: 1, quiet: true, threads: 1, valFraction: 0.3, ...over,
  };
}

test('SIGINT during the first validation pass stops the run before its first step: no checkpoint, and the folder asks for --overwrite, not --resume', async () => {
  const dir = tmp();
  const logs: string[] = [];
  let sent = false;
  // the signal arrives while the data is packed, before the step-0 validation pass (the handler is installed by then)
  const s = await runTraining(opts(dir, {}), { log: (l: string) => { logs.push(l); if (!sent && l.startsWith('data:')) { sent = true; process.emit('SIGINT', 'SIGINT'); } } });
  assert.equal(s.signal, 'SIGINT');
  assert.equal(s.steps, 0);
  assert.equal(s.status, 'interrupted by SIGINT');
  assert.ok(logs.some((l) => /stopped before the first step \(nothing trained, no checkpoint\)/.test(l)), logs.join('\n'));
  assert.ok(!fs.existsSync(path.join(s.out, 'checkpoints', 'latest')));
  assert.ok(Number.isNaN(s.finalValLoss), 'no final validation pass after a signal');
  await assert.rejects(runTraining(opts(dir, {}), { log: () => {} }),
    (e: unknown) => e instanceof DistilleryError && /stopped before its first checkpoint/.test(e.message) && /--overwrite/.test(e.hint ?? '') && !/--resume/.test(e.hint ?? ''));
  await assert.rejects(runTraining(opts(dir, { resume: true }), { log: () => {} }),
    (e: unknown) => e instanceof DistilleryError && /no checkpoint/.test(e.message) && /--overwrite instead of --resume/.test(e.hint ?? ''));
  const again = await runTraining(opts(dir, { overwrite: true }), { log: () => {} });
  assert.equal(again.status, 'completed');
});

test('--resume with --steps below the checkpoint\'s step is refused, naming the step', async () => {
  const dir = tmp();
  await runTraining(opts(dir, { stopAfter: 3 }), { log: () => {} });
  await assert.rejects(runTraining(opts(dir, { resume: true, steps: 2 }), { log: () => {} }),
    (e: unknown) => e instanceof DistilleryError && /checkpoint is at step 3, past --steps 2/.test(e.message) && /--steps 3 or more/.test(e.hint ?? ''));
});

test('a run that fails on its data removes the --out folder it created (empty), and keeps one that was there', async () => {
  const dir = tmp();
  const empty = path.join(dir, 'empty.txt');
  fs.writeFileSync(empty, '   \n');
  const out = path.join(dir, 'new', 'run');
  await assert.rejects(runTraining(opts(dir, { out, data: [empty] }), { log: () => {} }), (e: unknown) => e instanceof InputError && /no documents/.test(e.message));
  assert.ok(!fs.existsSync(out), 'the empty folder it made is gone');
  const mine = path.join(dir, 'mine');
  fs.mkdirSync(mine);
  await assert.rejects(runTraining(opts(dir, { out: mine, data: [empty] }), { log: () => {} }));
  assert.ok(fs.existsSync(mine), 'a folder the user made stays');
});

test('--out inside the data folder is seen through symbolic links (realPathish)', () => {
  const dir = tmp();
  const data = path.join(dir, 'data');
  fs.mkdirSync(data);
  fs.symlinkSync(data, path.join(dir, 'link'));
  assert.ok(isInside(path.join(data, 'run'), path.join(dir, 'link')), 'the data named through a link');
  assert.ok(isInside(path.join(dir, 'link', 'run', 'deeper'), data), 'the run named through a link, not yet there');
  assert.ok(!isInside(path.join(dir, 'elsewhere'), path.join(dir, 'link')));
  assert.equal(realPathish(path.join(dir, 'link', 'x', 'y')), path.join(fs.realpathSync(data), 'x', 'y'));
});

test('a folder that cannot be prepared for an atomic write is a DistilleryError naming it (not a stack trace)', () => {
  const dir = tmp();
  fs.writeFileSync(path.join(dir, 'file'), 'x');
  assert.throws(() => replaceDirAtomicSync(path.join(dir, 'file', 'sub', 'best'), () => {}),
    (e: unknown) => e instanceof DistilleryError && /cannot write .*file\/sub\/best/.test(e.message) && (e.hint ?? '') !== '');
});
