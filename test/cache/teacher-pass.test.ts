/**
 * The teacher-cache job's pass (src/cache/teacher-pass.ts) with two passes queued (the device runs batch k + 1 while
 * the host reads batch k's rows): each collected pass holds its own rows, equal to the float64 sparse rows of the
 * teacher's own logits; and the record encoder (src/cache/format.ts BitWriter) against a bit-string reference.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { TeacherPass } from '../../src/cache/teacher-pass.js';
import { BitReader, BitWriter } from '../../src/cache/format.js';
import { sparseRow } from '../../src/cache/sparse.js';
import { presetConfig } from '../../src/model/config.js';
import { Transformer } from '../../src/model/transformer.js';
import { Rng } from '../../src/util/rng.js';

test('BitWriter: fields of 1 to 25 bits, least significant bit first, as a bit-string reference lays them out; out-of-range values refused', () => {
  const rng = new Rng(5);
  const w = new BitWriter();
  let bits = '';
  const fields: Array<[number, number]> = [];
  for (let i = 0; i < 5000; i++) {
    const b = 1 + Math.floor(rng.next() * 25), v = Math.floor(rng.next() * 2 ** b);
    fields.push([v, b]);
    w.write(v, b);
    for (let k = 0; k < b; k++) bits += Math.floor(v / 2 ** k) % 2 ? '1' : '0';
  }
  while (bits.length % 8) bits += '0';
  const want = Uint8Array.from({ length: bits.length / 8 }, (_, i) => {
    let x = 0;
    for (let k = 0; k < 8; k++) if (bits[i * 8 + k] === '1') x += 2 ** k;
    return x;
  });
  const got = w.bytes();
  assert.deepEqual(got, want);
  const r = new BitReader(got);
  for (const [v, b] of fields) assert.equal(r.read(b), v);
  for (const [v, b] of [[4, 2], [-1, 3], [1.5, 4], [NaN, 4], [2 ** 25, 25], [0, 26], [0, 0]] as Array<[number, number]>) {
    assert.throws(() => w.write(v, b), RangeError, `${v} in ${b} bits`);
  }
  w.reset();
  w.write(5, 3);
  assert.deepEqual(w.bytes(), Uint8Array.of(5));
});

test('TeacherPass: two passes queued, each collected pass holds its own rows (the float64 rows of the teacher\'s logits); a third start is refused', () => {
  const be = createCpuBackend({ threads: 1 });
  try {
    const V = 64, cfg = { ...presetConfig('tiny', V), numLayers: 2 }, B = 2, T = 8, N = B * T;
    const m = new Transformer(be, cfg, { batch: B, seq: T, training: false });
    const rng = new Rng(9);
    m.setWeights(Float32Array.from({ length: m.layout.total }, () => rng.normal() * 0.2));
    const pass = new TeacherPass(m, V, 1.5, { kind: 'sample', n: 6 }, 5 * V); // chunks of 5 rows: 4 chunks
    const idsOf = (seed: number): Int32Array => Int32Array.from({ length: N }, (_, i) => (i * 7 + seed * 13) % V);
    const uni = (seed: number) => (r: number): number => ((r * 37 + seed * 11) % 101) / 101;
    const expected = (seed: number): Array<{ ids: number[]; argmax: number }> => {
      const z = be.download(m.forward(idsOf(seed), B, T));
      return Array.from({ length: N }, (_, r) => sparseRow(z, r * V, V, 1.5, { kind: 'sample', n: 6 }, () => uni(seed)(r)));
    };
    const want = [expected(1), expected(2), expected(3)];
    pass.start(idsOf(1), B, T, uni(1));
    pass.start(idsOf(2), B, T, uni(2));
    assert.equal(pass.queued, 2);
    assert.throws(() => pass.start(idsOf(3), B, T, uni(3)), /two passes are pending/);
    const check = (h: ReturnType<TeacherPass['collect']>, k: number): void => {
      assert.ok(h);
      assert.equal(h.chunks.length, 4);
      for (let r = 0; r < N; r++) {
        const got: number[] = [...h.ids.subarray(r * 6, r * 6 + 6)].filter((x) => x >= 0);
        assert.deepEqual(got, want[k]![r]!.ids, `pass ${k} row ${r}`);
        assert.equal(h.argmax[r], want[k]![r]!.argmax);
      }
    };
    check(pass.collect(), 0);
    pass.start(idsOf(3), B, T, uni(3));
    check(pass.collect(), 1);
    check(pass.collect(), 2);
    assert.equal(pass.collect(), null);
  } finally { be.dispose(); }
});
