/**
 * Backend.addRmsnormForward (the residual add fused with the norm that reads it) on the CPU backend: bit-for-bit what
 * add followed by rmsnormForward stores (sum, out, rstd), for every operand dtype combination the bf16 emulation has
 * and with sum aliasing a or b; and against a float64 definition written here (the sum rounded to its storage first,
 * the norm over the stored sum, the output rounded to its storage).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Backend, Buf, DType } from '../../src/backend/backend.js';
import { roundBf16 } from '../../src/backend/bf16.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { Rng } from '../../src/util/rng.js';
import { assertClose, randn } from './helpers.js';

const N = 5, C = 37, EPS = 1e-5;

function put(be: Backend, data: Float64Array, d: DType, label: string): Buf {
  const b = be.alloc(data.length, label, d);
  be.upload(b, data);
  return b;
}

type Combo = { sum: DType; out: DType; a: DType; b: DType; w: DType };
const COMBOS: Combo[] = [];
for (const sum of ['f32', 'bf16'] as const) {
  for (const out of ['f32', 'bf16'] as const) {
    for (const w of ['f32', 'bf16'] as const) COMBOS.push({ sum, out, a: sum, b: 'f32', w });
  }
}
COMBOS.push({ sum: 'f32', out: 'bf16', a: 'bf16', b: 'bf16', w: 'bf16' }, { sum: 'bf16', out: 'f32', a: 'f32', b: 'bf16', w: 'f32' });

for (const mode of ['f32', 'f64'] as const) {
  test(`addRmsnormForward stores exactly what add + rmsnormForward store, every dtype combination, sum aliasing a or b [${mode}]`, () => {
    const be = createCpuBackend({ dtype: mode, threads: 1 });
    try {
      const rng = new Rng(11);
      for (const k of COMBOS) {
        // Residual-like magnitudes (a few units) and a small update, so a bf16 sum really rounds.
        const a = randn(rng, N * C, 3), b = randn(rng, N * C, 0.3), w = randn(rng, C, 0.5).map((x) => 1 + x);
        for (const alias of ['none', 'a', 'b'] as const) {
          if (alias === 'b' && k.b !== k.sum) continue; // aliasing means the same buffer, so the same dtype
          if (alias === 'a' && k.a !== k.sum) continue;
          const what = `sum=${k.sum} out=${k.out} a=${k.a} b=${k.b} w=${k.w} alias=${alias}`;
          // unfused reference on its own buffers
          const A0 = put(be, a, k.a, 'a0'), B0 = put(be, b, k.b, 'b0'), W = put(be, w, k.w, 'w');
          const S0 = be.alloc(N * C, 's0', k.sum), O0 = be.alloc(N * C, 'o0', k.out), R0 = be.alloc(N, 'r0');
          be.add(S0, A0, B0, N * C);
          be.rmsnormForward(O0, R0, S0, W, N, C, EPS);
          // fused
          const A = put(be, a, k.a, 'a'), B = put(be, b, k.b, 'b');
          const S = alias === 'a' ? A : alias === 'b' ? B : be.alloc(N * C, 's', k.sum);
          const O = be.alloc(N * C, 'o', k.out), R = be.alloc(N, 'r');
          be.addRmsnormForward(S, O, R, A, B, W, N, C, EPS);
          assert.deepEqual(be.download(S), be.download(S0), `sum ${what}`);
          assert.deepEqual(be.download(O), be.download(O0), `out ${what}`);
          assert.deepEqual(be.download(R), be.download(R0), `rstd ${what}`);
          if (alias !== 'a') assert.deepEqual(be.download(A), be.download(A0), `a untouched ${what}`);
          if (alias !== 'b') assert.deepEqual(be.download(B), be.download(B0), `b untouched ${what}`);
        }
      }
    } finally { be.dispose(); }
  });
}

test('addRmsnormForward against a float64 definition: the norm reads the sum as stored (bf16: rounded), the output is rounded once', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  try {
    const rng = new Rng(12);
    const a = randn(rng, N * C, 3), b = randn(rng, N * C, 0.3), w = randn(rng, C, 0.5).map((x) => 1 + x);
    for (const sumD of ['f32', 'bf16'] as const) {
      for (const outD of ['f32', 'bf16'] as const) {
        const S = be.alloc(N * C, 's', sumD), O = be.alloc(N * C, 'o', outD), R = be.alloc(N, 'r');
        be.addRmsnormForward(S, O, R, put(be, a, 'f32', 'a'), put(be, b, 'f32', 'b'), put(be, w, 'f32', 'w'), N, C, EPS);
        const rs = (x: number, d: DType) => (d === 'bf16' ? roundBf16(x) : x);
        const s = a.map((x, i) => rs(x + b[i]!, sumD));
        const r = Array.from({ length: N }, (_, row) => {
          let ss = 0;
          for (let j = 0; j < C; j++) ss += s[row * C + j]! ** 2;
          return 1 / Math.sqrt(ss / C + EPS);
        });
        const o = s.map((x, i) => x * r[Math.floor(i / C)]! * w[i % C]!);
        const what = `sum=${sumD} out=${outD}`;
        assert.deepEqual(Array.from(be.download(S)), Array.from(s), `sum ${what}`);
        assertClose(be.download(R), r, 1e-12, 0, `rstd ${what}`);
        if (outD === 'f32') assertClose(be.download(O), o, 1e-12, 1e-14, `out ${what}`);
        else {
          // one rounding of a float64 value: within half a bf16 ulp (2^-9 relative), and the same as rounding the reference
          // wherever the reference is not within 1e-9 of a rounding boundary
          const got = be.download(O);
          for (let i = 0; i < o.length; i++) {
            assert.ok(Math.abs(got[i]! - o[i]!) <= Math.abs(o[i]!) * 2 ** -8, `out ${what} [${i}]: ${got[i]} vs ${o[i]}`);
            if (Math.abs(roundBf16(o[i]! * (1 + 1e-9)) - roundBf16(o[i]! * (1 - 1e-9))) === 0) assert.equal(got[i], roundBf16(o[i]!), `out ${what} [${i}]`);
          }
        }
      }
    }
  } finally { be.dispose(); }
});

test('addRmsnormForward refuses an out that overlaps sum, a or b', () => {
  const be = createCpuBackend({ threads: 1 });
  try {
    const a = be.alloc(N * C, 'a'), b = be.alloc(N * C, 'b'), w = be.alloc(C, 'w'), r = be.alloc(N, 'r'), s = be.alloc(N * C, 's');
    assert.throws(() => be.addRmsnormForward(s, s, r, a, b, w, N, C, EPS), /out may not overlap/);
    assert.throws(() => be.addRmsnormForward(s, a, r, a, b, w, N, C, EPS), /out may not overlap/);
    const big = be.alloc(2 * N * C, 'big');
    assert.throws(() => be.addRmsnormForward(be.view(big, 0, N * C), be.view(big, C, N * C), r, a, b, w, N, C, EPS), /out may not overlap/);
  } finally { be.dispose(); }
});
