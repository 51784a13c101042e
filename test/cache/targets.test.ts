/**
 * Host-side sparse rows: the ring a cached run decodes its training batches into hands each buffer back only after all
 * the others (two steps' micro-batches may be live at once: the step on the device and the look-ahead's), and reuses
 * them instead of allocating a batch's typed arrays every step; float32 rows hold what an upload would have rounded to.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SparseRing, allocSparseHost, setSparseRow } from '../../src/cache/targets.js';

test('SparseRing: each of its buffers comes back only after the others, and the same buffers are reused', () => {
  for (const size of [1, 2, 4, 6]) {
    const ring = new SparseRing(size, 8, 3);
    const got = Array.from({ length: 5 * size }, () => ring.take());
    // any `size` consecutive takes are distinct buffers (a live window of size batches is never overwritten)
    for (let i = 0; i + size <= got.length; i++) assert.equal(new Set(got.slice(i, i + size)).size, size, `size ${size} at ${i}`);
    // and only `size` buffers exist: take i + size is take i
    assert.equal(new Set(got).size, size);
    for (let i = size; i < got.length; i++) assert.equal(got[i], got[i - size]);
    assert.equal(got[0]!.ids.length, 8 * 3);
    assert.ok(got[0]!.prob instanceof Float32Array, 'a run\'s rows are float32: staged without a converted copy');
  }
  assert.throws(() => new SparseRing(0, 8, 3), /sparse ring of 0/);
});

test('allocSparseHost: float32 rows round as an upload of the float64 values would; f64 rows keep them', () => {
  const rep = { kind: 'sample', n: 4 } as const;
  const e = { ids: [3, 1], counts: [3, 1], logq: [Math.log(0.7), Math.log(0.1)], tail: -1, argmax: 3 };
  const h32 = allocSparseHost(2, 4), h64 = allocSparseHost(2, 4, 'f64');
  setSparseRow(h32, 1, e, rep); setSparseRow(h64, 1, e, rep);
  for (let k = 0; k < 4; k++) {
    assert.equal(h32.prob[4 + k], Math.fround(h64.prob[4 + k]!));
    assert.equal(h32.logq[4 + k], Math.fround(h64.logq[4 + k]!));
  }
  assert.equal(h64.logq[4], Math.log(0.7));
  assert.deepEqual([...h32.ids.subarray(4, 8)], [3, 1, -1, -1]);
});
