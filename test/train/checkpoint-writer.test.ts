/**
 * checkpoints/latest written on a worker thread (src/train/checkpoint-writer.ts): the same files as the synchronous
 * write, shared arrays read in place and others handed over, and a failed write's error (class, hint, errno) thrown at
 * join() on the run's thread, with the previous checkpoint intact.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { spawnSync } from 'node:child_process';
import { BackgroundCheckpoints, PREFAULT_STEP, writeLatest, type LatestCheckpoint } from '../../src/train/checkpoint-writer.js';
import type { ResumeWriter } from '../../src/train/student-files.js';
import { parameterLayout } from '../../src/model/params.js';
import { sharedFloat32 } from '../../src/model/params.js';
import { DistilleryError } from '../../src/util/errors.js';
import { tempDir, tinyConfig, tinyTokenizer, treeBytes as files } from '../cli/fixtures.js';

function snapshot(latest: string, n: number, step: number, shared: boolean): LatestCheckpoint {
  const arr = (k: number): Float32Array => {
    const a = shared ? sharedFloat32(n) : new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = Math.sin(i * 0.37 + k + step);
    return a;
  };
  return { latest, resumeDir: 'model', weights: arr(0), m: arr(1), v: arr(2).map(Math.abs), state: JSON.stringify({ step }), step };
}

test('BackgroundCheckpoints: the worker writes the files the synchronous write does; shared arrays stay usable, others are handed over', () => {
  const dir = tempDir();
  const bg = new BackgroundCheckpoints({ kind: 'model', cfg: tinyConfig(tinyTokenizer().vocabSize), carry: {} });
  try {
    const cfg = tinyConfig(tinyTokenizer().vocabSize), writer: ResumeWriter = { kind: 'model', cfg, carry: {} };
    const n = parameterLayout(cfg).total;
    for (const [step, shared] of [[3, true], [4, false]] as Array<[number, boolean]>) {
      const c = snapshot(path.join(dir, 'bg', 'latest'), n, step, shared);
      const want = snapshot(path.join(dir, 'sync', 'latest'), n, step, shared);
      writeLatest(want, writer);
      bg.submit(c);
      assert.equal(bg.inFlight, step);
      const j = bg.join();
      assert.ok(j && j.step === step && j.seconds > 0 && j.waited >= 0, JSON.stringify(j));
      assert.equal(bg.join(), null, 'nothing in flight after a join');
      assert.deepEqual(files(path.join(dir, 'bg', 'latest')), files(path.join(dir, 'sync', 'latest')), `step ${step}`);
      if (shared) assert.equal(c.weights.length, n, 'a shared array is read in place');
      else assert.equal(c.weights.length, 0, 'an unshared array is transferred to the worker');
    }
    assert.equal(JSON.parse(fs.readFileSync(path.join(dir, 'bg', 'latest', 'state.json'), 'utf8')).step, 4);
  } finally {
    bg.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('BackgroundCheckpoints: a write that fails throws at join the error the synchronous write throws (class, hint, errno code; the message names the step); the previous checkpoint stays', () => {
  const dir = tempDir();
  const cfg = tinyConfig(tinyTokenizer().vocabSize), n = parameterLayout(cfg).total;
  const bg = new BackgroundCheckpoints({ kind: 'model', cfg, carry: {} });
  try {
    const latest = path.join(dir, 'latest');
    bg.submit(snapshot(latest, n, 1, true));
    bg.join();
    const before = files(latest);
    // a weights array of the wrong length: writeCheckpoint refuses it inside the worker
    bg.submit({ ...snapshot(latest, n, 2, true), weights: sharedFloat32(n - 1) });
    assert.throws(() => bg.join(), (e: unknown) => e instanceof DistilleryError && /^the checkpoint of step 2: .*has shape/.test(e.message));
    assert.deepEqual(files(latest), before, 'the failed write left the previous checkpoint');
    // a file system error: the same class, message, hint and errno code as the synchronous write's
    const blocker = path.join(dir, 'a-file');
    fs.writeFileSync(blocker, 'x');
    const bad = snapshot(path.join(blocker, 'latest'), n, 2, true);
    let want: unknown = null;
    try { writeLatest(bad, { kind: 'model', cfg, carry: {} }); } catch (e) { want = e; }
    assert.ok(want instanceof Error, 'the synchronous write fails');
    bg.submit(bad);
    assert.throws(() => bg.join(), (e: unknown) => {
      const w = want as Error & { hint?: string; code?: string }, g = e as Error & { hint?: string; code?: string };
      return g.constructor === w.constructor && g.message === `the checkpoint of step 2: ${w.message}` && g.hint === w.hint && g.code === w.code;
    });
    // the writer goes on after a failure
    bg.submit(snapshot(latest, n, 3, true));
    assert.equal(bg.join()?.step, 3);
    assert.equal(JSON.parse(fs.readFileSync(path.join(latest, 'state.json'), 'utf8')).step, 3);
  } finally {
    bg.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('BackgroundCheckpoints.prefault: shared arrays are mapped in on the worker (a job the next join waits for), plain ones ignored; a write follows', () => {
  const dir = tempDir();
  const cfg = tinyConfig(tinyTokenizer().vocabSize), n = parameterLayout(cfg).total;
  const bg = new BackgroundCheckpoints({ kind: 'model', cfg, carry: {} });
  try {
    bg.prefault([new Float32Array(10)]);
    assert.equal(bg.join(), null, 'nothing shared: no job');
    const a = sharedFloat32(3 * n + 5);
    bg.prefault([a, new Float32Array(4)]);
    assert.equal(bg.inFlight, PREFAULT_STEP);
    assert.equal(bg.join()?.step, PREFAULT_STEP);
    assert.ok(a.every((x) => x === 0));
    const c = snapshot(path.join(dir, 'latest'), n, 7, true);
    bg.submit(c);
    assert.equal(bg.join()?.step, 7);
    assert.equal(JSON.parse(fs.readFileSync(path.join(dir, 'latest', 'state.json'), 'utf8')).step, 7);
  } finally {
    bg.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('BackgroundCheckpoints: a worker that died fails the next join with a clear error instead of waiting for ever', async () => {
  const cfg = tinyConfig(tinyTokenizer().vocabSize);
  const bg = new BackgroundCheckpoints({ kind: 'model', cfg, carry: {} }, 5000);
  bg.prefault([sharedFloat32(1024)]);
  const w = (bg as unknown as { worker: import('node:worker_threads').Worker }).worker;
  const exited = new Promise((resolve) => w.once('exit', resolve));
  await w.terminate();
  await exited;
  assert.throws(() => bg.join(), (e: unknown) => e instanceof DistilleryError && /writer thread stopped/.test(e.message) && /--resume/.test(e.hint ?? ''));
  assert.equal(bg.join(), null, 'the dead job is dropped');
  bg.close();
});

test('BackgroundCheckpoints: a writer thread that dies while the run waits in join() fails the join instead of hanging it', () => {
  // In a child process with a time limit: before the supervisor thread, the blocked join never saw the writer's exit
  // (its thread's event loop does not run while it waits) and the process hung; the limit turns that into a failure.
  const mod = new URL('../../src/train/checkpoint-writer.js', import.meta.url).href;
  const script = `import { BackgroundCheckpoints } from ${JSON.stringify(mod)};
const bg = new BackgroundCheckpoints({ kind: 'model', cfg: {}, carry: {} }, 0, true);
bg.prefault([new Float32Array(new SharedArrayBuffer(4096))]); // the writer exits on this job, with the run about to wait
try { bg.join(); console.log('joined'); } catch (e) { console.log('threw: ' + e.message + ' | ' + e.hint); }
bg.close();`;
  const dir = tempDir(), file = path.join(dir, 'join.mjs');
  fs.writeFileSync(file, script); // from a file: the same script under `node -e` hung before any worker ran (checked)
  const r = spawnSync(process.execPath, [file], { encoding: 'utf8', timeout: 60_000 });
  fs.rmSync(dir, { recursive: true, force: true });
  assert.equal(r.signal, null, `the join hung (killed after 60 s): ${r.stderr}`);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /threw: the checkpoint writer thread stopped \(it exited \(code 7\)\): the checkpoint arrays were not mapped in \| .*--resume/);
});

