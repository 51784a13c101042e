/**
 * The op profile (DISTILLERY_CUDA_PROFILE=1) without a GPU: a fake event clock drives the aggregation (pool
 * flushes, recycling, per-key totals, ordering), the table's format, the env switch, and a device-mode backend on
 * the fake driver (kernel families and cuBLAS GEMMs by op name land in the table printed on dispose; off by default).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CudaBackend } from '../../src/backend/cuda/cuda-backend.js';
import { KernelCache } from '../../src/backend/cuda/kernel-cache.js';
import { OpProfiler, formatProfile, profileFromEnv, type ProfileClock } from '../../src/backend/cuda/profile.js';
import { FakeCompiler, fakeCublas, fakeDriver } from './helpers.js';

/** Events are numbered; each record stamps the event with the fake GPU clock, which `advance` moves forward. */
function fakeClock(): ProfileClock & { now: number; created: number; destroyed: number; syncs: number; advance(ms: number): void } {
  const stamps = new Map<number, number>();
  let next = 0;
  const c = {
    now: 0, created: 0, destroyed: 0, syncs: 0,
    advance(ms: number) { c.now += ms; },
    eventCreate: () => { c.created++; return next++; },
    eventRecord: (ev: unknown) => { stamps.set(ev as number, c.now); },
    eventElapsedMs: (a: unknown, b: unknown) => stamps.get(b as number)! - stamps.get(a as number)!,
    eventDestroy: () => { c.destroyed++; },
    synchronize: () => { c.syncs++; },
  };
  return c;
}

test('profiler: totals per key, sorted by time, pool flushes and recycles events', () => {
  const clock = fakeClock();
  const p = new OpProfiler(clock, 6); // 3 ops in flight before a flush
  const op = (key: string, ms: number) => { p.begin(); clock.advance(ms); p.end(key); clock.advance(0.5); };
  for (let i = 0; i < 10; i++) { op('rmsnorm_dweight', 2); op('cublas matmulForward n=4 k=8 m=16', 1); }
  op('loss', 25);
  assert.equal(clock.created, 6, 'never more events than the pool');
  assert.ok(clock.syncs >= 6, `flushed when the pool ran dry (${clock.syncs} syncs)`);
  const rows = p.rows();
  assert.deepEqual(rows, [
    { key: 'loss', calls: 1, ms: 25 },
    { key: 'rmsnorm_dweight', calls: 10, ms: 20 },
    { key: 'cublas matmulForward n=4 k=8 m=16', calls: 10, ms: 10 },
  ]);
  assert.throws(() => p.end('x'), /without begin/);
  p.begin();
  assert.throws(() => p.begin(), /inside an open op/);
  p.dispose();
  assert.equal(clock.destroyed, 6);
});

test('profile table: aligned columns, percentages of the total, a total row, grep-able prefix', () => {
  const text = formatProfile([
    { key: 'attention_bwd', calls: 48, ms: 30 },
    { key: 'cublas matmulBackward dweight n=1024 k=896 m=151936', calls: 20, ms: 15 },
    { key: 'add', calls: 1000, ms: 5 },
  ], 1234.4);
  const lines = text.split('\n');
  assert.ok(lines.every((l) => l.startsWith('[cuda-profile] ')), text);
  assert.match(lines[0]!, /host wall time covered: 1234 ms/);
  assert.match(lines[1]!, /^\[cuda-profile\] op +calls +total ms +% +us\/call$/);
  assert.match(lines[2]!, /^\[cuda-profile\] attention_bwd +48 +30\.00 +60\.0 +625\.0$/);
  assert.match(lines[3]!, /^\[cuda-profile\] cublas matmulBackward dweight n=1024 k=896 m=151936 +20 +15\.00 +30\.0 +750\.0$/);
  assert.match(lines[4]!, /^\[cuda-profile\] add +1000 +5\.00 +10\.0 +5\.0$/);
  assert.match(lines[5]!, /^\[cuda-profile\] -+$/);
  assert.match(lines[6]!, /^\[cuda-profile\] total +1068 +50\.00 +100\.0 +46\.8$/);
  // right-aligned numeric columns: every data row ends at the same column
  const ends = [1, 2, 3, 4, 6].map((i) => lines[i]!.length);
  assert.equal(new Set(ends).size, 1, text);
  assert.match(formatProfile([]), /total +0 +0\.00 +0\.0 +0\.0/);
});

test('profileFromEnv: on for 1/true/yes, off when unset, empty, 0 or false', () => {
  assert.equal(profileFromEnv({}), false);
  assert.equal(profileFromEnv({ DISTILLERY_CUDA_PROFILE: '' }), false);
  assert.equal(profileFromEnv({ DISTILLERY_CUDA_PROFILE: '0' }), false);
  assert.equal(profileFromEnv({ DISTILLERY_CUDA_PROFILE: 'false' }), false);
  assert.equal(profileFromEnv({ DISTILLERY_CUDA_PROFILE: '1' }), true);
});

function deviceBackend(profile: boolean | undefined, lines: string[]) {
  const clock = fakeClock();
  const driver = Object.assign(fakeDriver(), {
    eventCreate: clock.eventCreate, eventRecord: clock.eventRecord, eventElapsedMs: clock.eventElapsedMs,
    eventDestroy: clock.eventDestroy,
    // each launch / GEMM / memset takes 1 ms of fake GPU time
    launch: () => { clock.advance(1); }, memsetD32: () => { clock.advance(1); }, memsetD8: () => { clock.advance(1); },
  });
  const cublas = Object.assign(fakeCublas(), { sgemm: () => { clock.advance(3); } });
  const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: false, log: () => {} });
  const be = new CudaBackend('device', {
    driver, cublas, cache, log: (l) => lines.push(l), ...(profile !== undefined ? { profile } : {}),
  });
  return { be, clock };
}

test('device backend on the fake driver: the table names kernel families and GEMMs by op, printed on dispose', () => {
  const lines: string[] = [];
  const { be, clock } = deviceBackend(true, lines);
  const n = 4, k = 8, m = 16;
  const x = be.alloc(n * k, 'x'), w = be.alloc(m * k, 'w'), bias = be.alloc(m, 'b'), y = be.alloc(n * m, 'y');
  be.matmulForward(y, x, w, bias, n, k, m);
  be.matmulForward(y, x, w, bias, n, k, m);
  be.matmulBackward(x, w, null, y, x, w, n, k, m);
  be.add(y, y, y, n * m);
  be.zero(y);
  const table = be.profileTable()!;
  assert.match(table, /cublas matmulForward n=4 k=8 m=16 +2 +6\.00 /);
  assert.match(table, /cublas matmulBackward dinp n=4 k=8 m=16 +1 +3\.00 /);
  assert.match(table, /cublas matmulBackward dweight n=4 k=8 m=16 +1 +3\.00 /);
  assert.match(table, /bias_add +2 +2\.00 /);
  assert.match(table, /\badd +1 +1\.00 /);
  assert.match(table, /memset \(zero\) +1 +1\.00 /);
  assert.match(table, /total +8 +16\.00 +100\.0/);
  be.dispose();
  assert.match(lines.join('\n'), /^\[cuda-profile\] total +8 +16\.00/m);
  assert.equal(clock.destroyed, clock.created, 'every event destroyed');
});

test('profile off (the default without the env variable): no events, no table', () => {
  const saved = process.env.DISTILLERY_CUDA_PROFILE;
  delete process.env.DISTILLERY_CUDA_PROFILE;
  try {
    const lines: string[] = [];
    const { be, clock } = deviceBackend(undefined, lines);
    const a = be.alloc(64, 'a');
    be.add(a, a, a, 64);
    assert.equal(be.profileTable(), null);
    be.dispose();
    assert.equal(clock.created, 0);
    assert.doesNotMatch(lines.join('\n'), /cuda-profile/);
  } finally {
    if (saved !== undefined) process.env.DISTILLERY_CUDA_PROFILE = saved;
  }
});
