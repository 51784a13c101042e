/**
 * The host communicator (src/parallel/host-comm.ts) with real processes over TCP on this machine: sums (float32 buffers,
 * float64 host values), gathers of shards, a broadcast of 70 kB, a barrier; the process-group variables parsed and
 * refused by name; and a rank that dies after joining makes the others fail within the timeout, naming it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { distEnv, envSecondsMs } from '../../src/parallel/env.js';
import { shardOf } from '../../src/parallel/comm.js';
import { InputError } from '../../src/util/errors.js';
import { commTimeoutMs, gatherPieceElements } from '../../src/parallel/host-comm.js';
import { stopGraceMs } from '../../src/parallel/launcher.js';
import { launch } from './launch.js';

const here = path.dirname(fileURLToPath(import.meta.url));

test('process-group variables: WORLD_SIZE unset or 1 is one process; bad ranks, ports and a missing MASTER_ADDR are refused by name', () => {
  assert.equal(distEnv({}), null);
  assert.equal(distEnv({ WORLD_SIZE: '1' }), null);
  assert.deepEqual(distEnv({ WORLD_SIZE: '4', RANK: '2', LOCAL_RANK: '0', MASTER_ADDR: 'node0', MASTER_PORT: '29500' }), { rank: 2, world: 4, localRank: 0, masterAddr: 'node0', masterPort: 29500, commPort: 29501 });
  assert.equal(distEnv({ WORLD_SIZE: '2', RANK: '0', MASTER_ADDR: 'h', MASTER_PORT: '29500', DISTILLERY_MASTER_PORT: '4000' })!.commPort, 4000);
  assert.equal(distEnv({ WORLD_SIZE: '2', RANK: '1', MASTER_ADDR: 'h', MASTER_PORT: '1' })!.localRank, 1);
  for (const [env, re] of [
    [{ WORLD_SIZE: '2', RANK: '2', MASTER_ADDR: 'h', MASTER_PORT: '1' }, /RANK=2 is not valid for a run of WORLD_SIZE 2/],
    [{ WORLD_SIZE: '2', MASTER_ADDR: 'h', MASTER_PORT: '1' }, /RANK=\(unset\)/],
    [{ WORLD_SIZE: '2', RANK: '0', MASTER_PORT: '1' }, /MASTER_ADDR is not set/],
    [{ WORLD_SIZE: '2', RANK: '0', MASTER_ADDR: 'h', MASTER_PORT: '70000' }, /MASTER_PORT=70000/],
    [{ WORLD_SIZE: 'two', RANK: '0', MASTER_ADDR: 'h', MASTER_PORT: '1' }, /WORLD_SIZE=two/],
  ] as const) assert.throws(() => distEnv(env as NodeJS.ProcessEnv), (e) => e instanceof InputError && re.test(e.message));
  assert.deepEqual([0, 1, 2].map((r) => shardOf(10, 3, r)), [{ size: 4, begin: 0, end: 4 }, { size: 4, begin: 4, end: 8 }, { size: 4, begin: 8, end: 10 }]);
});

test('HostComm across 3 processes: sums, float64 host sums, shard gathers, a 70 kB broadcast and a barrier', { timeout: 60_000 }, async () => {
  const res = await launch(path.join(here, 'comm-rank.js'), 3);
  for (const r of res) assert.equal(r.code, 0, r.err + r.out);
  const rows = res.map((r) => JSON.parse(r.out.trim()) as { rank: number; host: number[]; summed: number[]; gathered: number[]; bcast: string; bcastLength: number });
  for (const x of rows) {
    assert.deepEqual(x.host, [3, 0.1 + 0.2 + 0.30000000000000004, 3e15 + 3]);
    assert.deepEqual(x.summed, Array.from({ length: 9 }, (_, i) => 3 * ((i % 7) * 0.25) + 3));
    assert.deepEqual(x.gathered, Array.from({ length: 13 }, (_, i) => 100 * Math.floor(i / 5) + i));
    assert.equal(x.bcast, 'from rank 0: xxxxxxx'); assert.equal(x.bcastLength, 13 + 70_000);
  }
});

test('a rank that dies after joining stops the others within the timeout, naming it', { timeout: 60_000 }, async () => {
  const t0 = Date.now();
  const res = await launch(path.join(here, 'comm-rank.js'), 3, { COMM_CASE: 'die', COMM_TIMEOUT_MS: '8000' });
  assert.equal(res[1]!.code, 3);
  for (const r of [res[0]!, res[2]!]) {
    assert.equal(r.code, 1, r.err + r.out);
    const row = JSON.parse(r.out.trim()) as { error: string };
    // rank 0 names rank 1; rank 2 hears it from rank 0 (or sees rank 1 go if it was talking to it)
    assert.match(row.error, /rank 1 disconnected|rank 0 stopped the group: .*rank 1 disconnected/);
  }
  assert.ok(Date.now() - t0 < 30_000);
});

test('HostComm with large buffers (16 MB per rank, back to back, on the f32 and the f64 CPU backend) sums exactly; ranks out of step stop with an error', { timeout: 120_000 }, async () => {
  const big = await launch(path.join(here, 'comm-rank.js'), 3, { COMM_CASE: 'big' });
  for (const r of big) assert.equal(r.code, 0, r.err + r.out);
  for (const r of big) {
    const row = JSON.parse(r.out.trim()) as { wrong32: number; wrong64: number; n: number };
    assert.equal(row.wrong32, 0, `float32: ${row.wrong32} of ${row.n} sums wrong`);
    assert.equal(row.wrong64, 0, `float64: ${row.wrong64} sums wrong`);
  }
  const div = await launch(path.join(here, 'comm-rank.js'), 3, { COMM_CASE: 'diverge', COMM_TIMEOUT_MS: '10000' });
  const errors = div.map((r) => r.out.trim()).join('\n');
  assert.match(errors, /rank 1 is out of step: it sent allreduce64 of 16 bytes while rank 0 runs allreduce64 of 24 bytes/);
});

test('HostComm reduce-scatter across 3 processes: ranges in flight together with a blocking collective between them; each shard equals the all-reduce sum (f32) and the float64 sum (f64)', { timeout: 60_000 }, async () => {
  const res = await launch(path.join(here, 'comm-rank.js'), 3, { COMM_CASE: 'reducescatter' });
  for (const r of res) assert.equal(r.code, 0, r.err + r.out);
  for (const r of res) {
    const row = JSON.parse(r.out.trim()) as { rank: number; host: number; wrong32: number; wrong64: number; checked: number };
    assert.equal(row.host, 6);
    assert.ok(row.checked >= 333, `rank ${row.rank} checked ${row.checked}`);
    assert.equal(row.wrong32, 0, `rank ${row.rank}: ${row.wrong32} float32 sums differ from allReduceSum`);
    assert.equal(row.wrong64, 0, `rank ${row.rank}: ${row.wrong64} float64 sums wrong`);
  }
});

test('a gather\'s answer fits one frame (32-bit length) at any world size: 16 ranks of 2^26-element shards went over', () => {
  for (const world of [1, 2, 3, 8, 16, 64, 1000]) {
    const bytes = world * gatherPieceElements(world) * 4;
    assert.ok(bytes < 2 ** 32, `world ${world}: ${bytes} bytes in one frame`);
    assert.ok(gatherPieceElements(world) >= 1);
  }
});

test('a rank that hangs: the others time out naming the wait (rank 0 tells the rest, naming the rank it waited for), and close at once', { timeout: 120_000 }, async () => {
  for (let round = 0; round < 3; round++) {
    const res = await launch(path.join(here, 'comm-rank.js'), 3, { COMM_CASE: 'hang', COMM_TIMEOUT_MS: '2000' });
    for (const r of [res[0]!, res[2]!]) {
      assert.equal(r.code, 1, r.err + r.out);
      const row = JSON.parse(r.out.trim()) as { error: string; closeMs: number };
      // rank 2 either timed out itself or heard rank 0's reason; never "rank 0 disconnected"
      assert.match(row.error, /waited 2s for the other ranks/, `round ${round}`);
      if (/stopped the group/.test(row.error)) assert.match(row.error, /rank 1 did not answer/);
      assert.ok(row.closeMs < 8000, `close took ${row.closeMs} ms`);
    }
    assert.match((JSON.parse(res[0]!.out.trim()) as { error: string }).error, /\(rank 1 did not answer\)/, 'rank 0 names the rank it waited for');
  }
});

test('launchRanks: each rank runs with the launcher\'s Node options and its own process-group variables', { timeout: 60_000 }, async () => {
  const fs = await import('node:fs'), os = await import('node:os');
  const { spawnSync } = await import('node:child_process');
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-launch-'));
  const rankScript = path.join(d, 'rank.mjs'), driver = path.join(d, 'driver.mjs');
  fs.writeFileSync(rankScript, `import * as fs from 'node:fs';\nfs.writeFileSync(${JSON.stringify(d)} + '/rank' + process.env.RANK + '.json', JSON.stringify({ execArgv: process.execArgv, world: process.env.WORLD_SIZE, nvls: process.env.NCCL_NVLS_ENABLE }));\n`);
  const launcherUrl = new URL('../../src/parallel/launcher.js', import.meta.url).href;
  fs.writeFileSync(driver, `import { launchRanks } from ${JSON.stringify(launcherUrl)};\nprocess.exitCode = await launchRanks(${JSON.stringify(rankScript)}, [], 2, { err: (s) => process.stderr.write(s) });\n`);
  const r = spawnSync(process.execPath, ['--max-old-space-size=333', driver], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  for (const rank of [0, 1]) {
    const row = JSON.parse(fs.readFileSync(path.join(d, `rank${rank}.json`), 'utf8')) as { execArgv: string[]; world: string; nvls: string };
    assert.deepEqual(row.execArgv, ['--max-old-space-size=333'], `rank ${rank}`);
    assert.equal(row.world, '2'); assert.equal(row.nvls, '0');
  }
  fs.rmSync(d, { recursive: true, force: true });
});

test('launchRanks: a rank still running after another failed is killed after the grace period; the failing rank\'s code is the run\'s', { timeout: 60_000 }, async () => {
  const fs = await import('node:fs'), os = await import('node:os');
  const { spawnSync } = await import('node:child_process');
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-launch-'));
  const rankScript = path.join(d, 'rank.mjs'), driver = path.join(d, 'driver.mjs');
  // rank 1 fails at once; rank 0 hangs (its main thread blocked: no signal handler, no collective would reach it)
  const launcherUrl = new URL('../../src/parallel/launcher.js', import.meta.url).href;
  fs.writeFileSync(driver, `import { launchRanks } from ${JSON.stringify(launcherUrl)};\nprocess.exitCode = await launchRanks(${JSON.stringify(rankScript)}, [], 2, { err: (s) => process.stderr.write(s) });\n`);
  // exit 3, and exit 1 (the CLI's usual code, which a killed rank 0 also gets: its reason must still be shown)
  for (const code of [3, 1]) {
    fs.writeFileSync(rankScript, `if (process.env.RANK === '1') { process.stderr.write('error: rank 1 lost its data\\n'); process.exit(${code}); }\nAtomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);\n`);
    const t0 = Date.now();
    const r = spawnSync(process.execPath, [driver], { encoding: 'utf8', env: { ...process.env, DISTILLERY_STOP_GRACE_S: '1' }, timeout: 30_000 });
    const ms = Date.now() - t0;
    assert.equal(r.status, code, r.stderr);
    assert.match(r.stderr, /rank 0 was still running 1 s after rank 1 failed: stopping it \(SIGKILL\)/);
    assert.match(r.stderr, /rank 1 exited with \d:\n {2}\[rank 1\] error: rank 1 lost its data/, 'the failing rank\'s own words');
    assert.ok(ms < 15_000, `the launcher took ${ms} ms`);
  }
  fs.rmSync(d, { recursive: true, force: true });
});

test('timeouts in seconds from the environment: a positive number counts (fractions too), anything else keeps the default', () => {
  assert.equal(envSecondsMs('X', { X: '15' }), 15_000);
  assert.equal(envSecondsMs('X', { X: '0.5' }), 500);
  for (const bad of [undefined, '', '0', '-3', 'soon', 'Infinity']) assert.equal(envSecondsMs('X', { X: bad }), undefined, String(bad));
  assert.equal(commTimeoutMs({}), 300_000);
  assert.equal(commTimeoutMs({ DISTILLERY_COMM_TIMEOUT_S: '20' }), 20_000);
  assert.equal(stopGraceMs({}), 60_000);
  assert.equal(stopGraceMs({ DISTILLERY_STOP_GRACE_S: 'x' }), 60_000);
  assert.equal(stopGraceMs({ DISTILLERY_STOP_GRACE_S: '2' }), 2_000);
});
