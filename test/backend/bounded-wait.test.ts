/**
 * The bounded wait for the GPU (src/backend/cuda/bounded-wait.ts) on a simulated clock: work that finishes returns;
 * a guard's asynchronous error aborts and throws it by name; a wait past the timeout aborts once and throws naming
 * the rank and what waited; the polls nap briefly at first (a short wait costs little).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { boundedWait, type WaitClock, type WaitGuard } from '../../src/backend/cuda/bounded-wait.js';
import { DistilleryError } from '../../src/util/errors.js';

function fakeClock(): WaitClock & { t: number; naps: number[] } {
  const c = { t: 0, naps: [] as number[], now: () => c.t, sleep: (ms: number) => { c.naps.push(ms); c.t += ms; } };
  return c;
}

function guard(timeoutMs: number, err: () => string | null = () => null): WaitGuard & { aborts: string[]; polls: number } {
  const g = { who: 'rank 1', timeoutMs, aborts: [] as string[], polls: 0, poll: () => { g.polls++; return err(); }, abort: (why: string) => { g.aborts.push(why); } };
  return g;
}

test('boundedWait returns once the work is done, napping 50 µs first, and never aborts', () => {
  const clock = fakeClock(), g = guard(1000);
  let left = 5;
  boundedWait(() => left-- <= 0, g, 'reading the loss', clock);
  assert.equal(g.aborts.length, 0);
  assert.equal(clock.naps[0], 0.05);
  assert.ok(clock.t < 1, `waited ${clock.t} ms of simulated time for 5 polls`);
  assert.ok(clock.naps.every((n) => n <= 1));
});

test('boundedWait aborts and names the rank, the wait and the timeout when the work never finishes', () => {
  const clock = fakeClock(), g = guard(20_000);
  assert.throws(() => boundedWait(() => false, g, 'reading sumSquares partials', clock), (e: unknown) => {
    assert.ok(e instanceof DistilleryError);
    assert.match(e.message, /^rank 1: reading sumSquares partials: the GPU's work did not finish within 20 s/);
    assert.match(e.hint ?? '', /--resume/);
    return true;
  });
  assert.equal(g.aborts.length, 1);
  assert.ok(clock.t >= 20_000 && clock.t < 20_002, `gave up at ${clock.t} ms`);
  assert.ok(g.polls >= 190 && g.polls <= 201, `asked for asynchronous errors ${g.polls} times`);
});

test('boundedWait stops at the guard\'s asynchronous error, long before the timeout', () => {
  const clock = fakeClock();
  const g = guard(300_000, () => (clock.t > 1000 ? 'remote process exited or there was a network error (ncclResult 6)' : null));
  assert.throws(() => boundedWait(() => false, g, 'downloading loss stats', clock), /rank 1: downloading loss stats: the GPU's collectives failed \(remote process exited/);
  assert.equal(g.aborts.length, 1);
  assert.ok(clock.t < 1200, `stopped at ${clock.t} ms`);
});
