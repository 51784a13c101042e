/** NF4 quantization on several threads (src/quant/nf4-parallel.ts) gives the codes and scales of one thread. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Nf4Quantizer } from '../../src/quant/nf4-parallel.js';
import { quantizeNf4 } from '../../src/quant/nf4.js';
import { Rng } from '../../src/util/rng.js';
import { DistilleryError } from '../../src/util/errors.js';

test('3 threads claiming chunks of 7 blocks quantize a tensor (a partial last block, a zero block) exactly as one thread', () => {
  const r = new Rng(4), n = 64 * 50 + 30;
  const x = Float32Array.from({ length: n }, (_, i) => (i >= 64 * 9 && i < 64 * 10 ? 0 : r.normal() * 0.02));
  const q = new Nf4Quantizer(3, 7);
  try {
    for (const bs of [64, 32]) {
      const want = quantizeNf4(x, bs), got = q.quantize(x, bs);
      assert.equal(got.n, n);
      assert.deepEqual(Array.from(got.absmax), Array.from(want.absmax), `block ${bs}: scales`);
      assert.deepEqual(Array.from(got.codes), Array.from(want.codes), `block ${bs}: codes`);
    }
    assert.throws(() => q.quantize(x, 5), /an NF4 block holds an even number of elements/);
    // float64 values just above a level's midpoint: quantized as they are (a float32 copy would round them down)
    const mid = (0 + 0.07958029955625534) / 2; // exact in float32: mid + 1e-12 rounds to it
    const x64 = Float64Array.from({ length: 64 * 40 }, (_, i) => (i % 64 === 0 ? 1 : mid + 1e-12));
    assert.deepEqual(Array.from(q.quantize(x64).codes), Array.from(quantizeNf4(x64).codes));
    const bad = Float32Array.from(x);
    bad[64 * 30 + 5] = Infinity;
    assert.throws(() => q.quantize(bad), (e: unknown) => e instanceof DistilleryError && /non-finite weight \(Infinity at element 1925\)/.test(e.message));
  } finally { q.dispose(); }
});
