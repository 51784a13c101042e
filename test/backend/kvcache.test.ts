/**
 * Inference attention against a KV cache: kvCacheWrite + attentionCached over a prefill (t > 1, pos0 = 0),
 * a multi-token chunk at pos0 > 0 and several single-token decode steps reproduce attentionForward over the
 * full sequence, for GQA and MHA, on the f32 and f64 backends.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Backend } from '../../src/backend/backend.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { Rng } from '../../src/util/rng.js';
import { assertClose, bufOf, randn } from './helpers.js';
import { attentionRef } from './reference.js';

/** Rows [t0, t1) of x laid out [b, T, heads, hd], as a [b, t1 − t0, heads, hd] array. */
function rows(x: Float64Array, b: number, T: number, heads: number, hd: number, t0: number, t1: number): Float64Array {
  const rl = heads * hd, out = new Float64Array(b * (t1 - t0) * rl);
  for (let bi = 0; bi < b; bi++) out.set(x.subarray((bi * T + t0) * rl, (bi * T + t1) * rl), bi * (t1 - t0) * rl);
  return out;
}

function check(be: Backend, b: number, T: number, nH: number, nKv: number, hd: number, chunks: number[], tol: number): void {
  const rng = new Rng(31 + nH + T);
  const q = randn(rng, b * T * nH * hd), k = randn(rng, b * T * nKv * hd), v = randn(rng, b * T * nKv * hd);
  const full = be.alloc(q.length, 'full'), lse = be.alloc(b * nH * T, 'lse');
  be.attentionForward(full, lse, bufOf(be, q), bufOf(be, k), bufOf(be, v), b, T, nH, nKv, hd);
  const fullOut = be.download(full);
  assertClose(fullOut, attentionRef(q, k, v, b, T, nH, nKv, hd)[0], tol, tol, 'full attention vs reference');
  const tMax = T + 3;
  const kc = bufOf(be, randn(rng, b * tMax * nKv * hd)), vc = bufOf(be, randn(rng, b * tMax * nKv * hd)); // garbage beyond pos
  let pos = 0;
  for (const t of chunks) {
    be.kvCacheWrite(kc, bufOf(be, rows(k, b, T, nKv, hd, pos, pos + t)), b, t, pos, tMax, nKv, hd);
    be.kvCacheWrite(vc, bufOf(be, rows(v, b, T, nKv, hd, pos, pos + t)), b, t, pos, tMax, nKv, hd);
    const out = be.alloc(b * t * nH * hd, 'out');
    be.attentionCached(out, bufOf(be, rows(q, b, T, nH, hd, pos, pos + t)), kc, vc, b, t, pos, tMax, nH, nKv, hd);
    assertClose(be.download(out), rows(Float64Array.from(fullOut), b, T, nH, hd, pos, pos + t), tol, tol,
      `cached attention rows [${pos}, ${pos + t}) nH=${nH} nKv=${nKv}`);
    pos += t;
  }
  assert.equal(pos, T);
  assert.throws(() => be.kvCacheWrite(kc, bufOf(be, rows(k, b, T, nKv, hd, 0, 1)), b, 1, tMax, tMax, nKv, hd), /outside/);
}

for (const dtype of ['f32', 'f64'] as const) {
  test(`attentionCached + kvCacheWrite: prefill then decode equals attentionForward [${dtype}]`, () => {
    const be = createCpuBackend({ dtype, threads: 1 });
    const tol = dtype === 'f32' ? 2e-5 : 1e-12;
    check(be, 2, 9, 4, 2, 8, [4, 1, 1, 2, 1], tol); // GQA: prefill 4, decode, a 2-token chunk, decode
    check(be, 1, 6, 3, 3, 4, [1, 1, 1, 1, 1, 1], tol); // MHA, decode from the start
    check(be, 2, 5, 6, 1, 6, [5], tol); // MQA, prefill only
    be.dispose();
  });
}
