/**
 * Host-side sparse rows: the ring a cached run decodes its training batches into hands each buffer back only after all
 * the others (two steps' micro-batches may be live at once: the step on the device and the look-ahead's), and reuses
 * them instead of allocating a batch's typed arrays every step; float32 rows hold what an upload would have rounded to.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SparseRing, allocSparseHost, setSparseRow, sparseHostBytes } from '../../src/cache/targets.js';
import type { HostStaging } from '../../src/backend/backend.js';

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

test('SparseRing over host stagings: one staging per buffer, its arrays views of it, settled before each time it is handed out', () => {
  const events: string[] = [];
  const stagings: HostStaging[] = [];
  const ring = new SparseRing(2, 8, 3, 'f32', (bytes, label) => {
    assert.equal(bytes, sparseHostBytes(8, 3));
    const k = stagings.length;
    events.push(`alloc ${k} (${label})`);
    const st = { buffer: new ArrayBuffer(bytes), settle: () => { events.push(`settle ${k}`); } };
    stagings.push(st);
    return st;
  });
  const got = Array.from({ length: 5 }, () => { const h = ring.take(); events.push('take'); return h; });
  assert.equal(stagings.length, 2);
  assert.deepEqual(events, [
    "alloc 0 (the teacher cache's rows (0))", 'settle 0', 'take', "alloc 1 (the teacher cache's rows (1))", 'settle 1', 'take',
    'settle 0', 'take', 'settle 1', 'take', 'settle 0', 'take',
  ]);
  for (const [i, h] of got.entries()) {
    for (const a of [h.ids, h.prob, h.logq, h.tail, h.argmax]) assert.equal(a.buffer, stagings[i % 2]!.buffer, 'uploads read the staging itself');
  }
});

test('allocSparseHost over a given buffer: empty rows whatever it held, every array inside it, f64 arrays aligned', () => {
  for (const dtype of ['f32', 'f64'] as const) {
    const rows = 5, slots = 3, bytes = sparseHostBytes(rows, slots, dtype);
    const buf = new ArrayBuffer(bytes);
    new Uint8Array(buf).fill(0xab); // page-locked memory comes uninitialized
    const h = allocSparseHost(rows, slots, dtype, buf);
    assert.deepEqual([...h.ids], new Array(rows * slots).fill(-1));
    assert.deepEqual([...h.tail], new Array(rows).fill(-1));
    assert.deepEqual([...h.prob, ...h.logq, ...h.argmax], new Array(2 * rows * slots + rows).fill(0));
    // the arrays tile the buffer without overlapping
    const spans = [h.prob, h.logq, h.tail, h.ids, h.argmax].map((a) => [a.byteOffset, a.byteOffset + a.byteLength] as const).sort((x, y) => x[0] - y[0]);
    assert.equal(spans[0]![0], 0);
    for (let i = 1; i < spans.length; i++) assert.equal(spans[i]![0], spans[i - 1]![1]);
    assert.equal(spans.at(-1)![1], bytes);
    assert.ok(h.prob instanceof (dtype === 'f64' ? Float64Array : Float32Array));
    assert.throws(() => allocSparseHost(rows, slots, dtype, new ArrayBuffer(bytes - 4)), /bytes for 5 sparse rows/);
  }
});
