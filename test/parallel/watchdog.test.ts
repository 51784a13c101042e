/**
 * The watchdog that bounds NCCL's set-up (runWithWatchdog, used by NcclComm.create around ncclCommInitRank): a call
 * that blocks the main thread past the deadline ends the process with exit code 1 and the CLI's two lines on standard
 * error; a call that returns in time gives its result and leaves nothing running. The real set-up with a hung rank runs
 * on GPUs (scripts/cuda/data-parallel-check.sh, part "init-hang").
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { runWithWatchdog, watchdogText } from '../../src/parallel/watchdog.js';

const mod = fileURLToPath(new URL('../../src/parallel/watchdog.js', import.meta.url));
const run = (body: string) => spawnSync(process.execPath, ['--input-type=module', '-e', `import(${JSON.stringify(mod)}).then((m) => { ${body} });`],
  { timeout: 30_000, encoding: 'utf8' });

test('a call that blocks the main thread past the deadline: exit code 1 soon after it, with the error and hint on stderr', () => {
  const t0 = Date.now();
  // the main thread blocked for 20 s in a call that cannot be interrupted from JavaScript (as ncclCommInitRank waiting for a peer)
  const r = run(`m.runWithWatchdog(() => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20000), 300,
    m.watchdogText('rank 0: the setup did not finish within 0.3 s', 'start every rank')); console.log('returned');`);
  const ms = Date.now() - t0;
  assert.equal(r.signal, null, `killed by a signal, not ended by the watchdog: ${r.stderr}`);
  assert.equal(r.status, 1, r.stderr);
  assert.equal(r.stderr, 'error: rank 0: the setup did not finish within 0.3 s\n  hint: start every rank\n');
  assert.equal(r.stdout, '', 'nothing after the blocked call ran');
  assert.ok(ms < 15_000, `ended after ${ms} ms, not when the call returned (20 s)`);
});

test('a call that returns in time gives its result; the process then ends by itself with nothing printed', () => {
  const r = run(`const x = m.runWithWatchdog(() => { Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 100); return 42; }, 2000, 'never\\n');
    console.log('result', x); setTimeout(() => console.log('after the deadline'), 2500);`);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stderr, '');
  assert.equal(r.stdout, 'result 42\nafter the deadline\n', 'the disarmed watchdog never fires');
});

test('a call that throws: the error reaches the caller and the watchdog is disarmed (it never fires later)', () => {
  assert.throws(() => runWithWatchdog(() => { throw new Error('ncclCommInitRank failed: invalid usage'); }, 60_000, watchdogText('x', 'y')),
    /invalid usage/);
  const r = run(`try { m.runWithWatchdog(() => { throw new Error('invalid usage'); }, 500, 'fired\\n'); } catch (e) { console.log('caught', e.message); }
    setTimeout(() => console.log('after the deadline'), 1000);`);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stderr, '');
  assert.equal(r.stdout, 'caught invalid usage\nafter the deadline\n');
  assert.equal(watchdogText('rank 1: m', 'h'), 'error: rank 1: m\n  hint: h\n');
});
