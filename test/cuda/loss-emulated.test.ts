/**
 * OPT-IN (DISTILLERY_EMULATE_CUDA=1, g++): the GENERATED fused loss kernel (src/backend/cuda/kernels/loss.ts: the one-pass
 * online statistics of 'none', 'kl' and 'reverse-kl', and the multi-pass 'jsd') compiled for the host on the emulator of
 * ./emulator.ts and compared with the CPU backend's float64 loss (stats and dlogits), for random models and for nearly
 * identical ones (a small divergence: the case where subtracting two log-sum-exps would cancel), with a padding row,
 * a row stride past the loss vocabulary, f32 logits with f32 and bf16 dlogits, and bf16 logits (the reference reads the
 * same rounded values) with the bf16 gradient written over them in place; rows whose stride is a multiple of 4 (the float4 loop,
 * with and without a scalar tail) and rows that are not (the scalar loop).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { lossKernel, LOSS_KINDS } from '../../src/backend/cuda/kernels/loss.js';
import { lossRows } from '../../src/backend/cpu/kernels/loss.js';
import { LOSS_STATS, STAT_ACC, STAT_AGREE } from '../../src/backend/backend.js';
import { packBf16, roundBf16, unpackBf16 } from '../../src/backend/bf16.js';
import { build, cleanUp, skip, workDir } from './emulator.js';
import { rng } from './helpers.js';

const n = 6, BLOCK = 128;
/** [loss vocabulary, row stride]: 8-element vector rows without a tail, with a 1-element tail, scalar rows (a stride of 4 mod 8, then odd) */
const GEOMETRIES: Array<[number, number]> = [[1000, 1008], [1001, 1008], [998, 1004], [997, 1003]];

function readF32(name: string): Float32Array {
  const b = readFileSync(join(workDir(), name));
  return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
}

for (const [close, [V, LD]] of [false, true].flatMap((c) => GEOMETRIES.map((g) => [c, g] as const))) {
  test(`emulated CUDA: fused loss, every kind, ${close ? 'nearly identical' : 'random'} models, vocabulary ${V} in rows of ${LD}, vs the CPU backend in float64`, { skip, timeout: 300_000 }, () => {
    const r = rng(close ? 5 : 3);
    const z = Float32Array.from({ length: n * LD }, () => (r() - 0.5) * 12);
    const zt = Float32Array.from({ length: n * LD }, (_, i) => (close ? z[i]! + (r() - 0.5) * 0.02 : (r() - 0.5) * 12));
    const y = Int32Array.from({ length: n }, (_, i) => (i === 3 ? -1 : Math.floor(r() * V)));
    // Accuracy (argmax z == y, the first index on ties): row 0 ties its maximum at 10 and 20 with y = 10 (a hit), row 5
    // the same tie with y = 20 (a miss), row 1's target is its maximum (a hit).
    for (const i of [0, 5]) { z[i * LD + 10] = 7; z[i * LD + 20] = 7; }
    y[0] = 10; y[5] = 20;
    y[1] = z.subarray(LD, LD + V).reduce((b, x, j, a) => (x > a[b]! ? j : b), 0);
    const w = Float32Array.from({ length: n }, (_, i) => (i === 3 ? 0 : 0.25));
    for (const [f, a] of [['z', z], ['zt', zt], ['y', y], ['w', w], ['zb', packBf16(z)], ['ztb', packBf16(zt)]] as const) writeFileSync(join(workDir(), f), a);
    // bf16 logits: the kernel reads the rounded values (the reference gets the same), and writes a bf16 gradient over them.
    const zr = Float64Array.from(z, roundBf16), ztr = Float64Array.from(zt, roundBf16);
    for (const kind of LOSS_KINDS) {
      for (const [lt, dt] of [['f32', 'f32'], ['f32', 'bf16'], ['bf16', 'bf16']] as const) {
        const spec = lossKernel.make({ kind, withGrad: true, dlogits: dt, logits: lt, teacher: lt, block: BLOCK });
        const T = dt === 'bf16' ? 'bf16' : 'float';
        const exe = build(spec, lt === 'f32' ? `int main() { const char* d = "${workDir()}";
  auto z = readf<float>(d, "z", ${n * LD}); auto zt = readf<float>(d, "zt", ${n * LD});
  auto y = readf<int>(d, "y", ${n}); auto w = readf<float>(d, "w", ${n});
  std::vector<float> st(${n * LOSS_STATS}); std::vector<${T}> g(${n * LD});
  launch({${n}, 1, 1}, ${BLOCK}, 0, [&] { loss(st.data(), g.data(), z.data(), zt.data(), y.data(), w.data(), ${n}, ${V}, ${LD}, 2.0f, 0.6f, 0.3f); });
  writef(d, "st", st); writef(d, "g", g); }` : `int main() { const char* d = "${workDir()}";
  auto z = readf<bf16>(d, "zb", ${n * LD}); auto zt = readf<bf16>(d, "ztb", ${n * LD});
  auto y = readf<int>(d, "y", ${n}); auto w = readf<float>(d, "w", ${n});
  std::vector<float> st(${n * LOSS_STATS});
  launch({${n}, 1, 1}, ${BLOCK}, 0, [&] { loss(st.data(), z.data(), z.data(), zt.data(), y.data(), w.data(), ${n}, ${V}, ${LD}, 2.0f, 0.6f, 0.3f); });
  writef(d, "st", st); writef(d, "g", z); }`);
        execFileSync(exe);
        const st = readF32('st');
        const gb = readFileSync(join(workDir(), 'g'));
        const g = dt === 'bf16' ? unpackBf16(new Uint16Array(gb.buffer.slice(gb.byteOffset, gb.byteOffset + gb.length))) : readF32('g');
        const rst = new Float64Array(n * LOSS_STATS), rg = new Float64Array(n * LD);
        const spec64 = { kind, alpha: 0.6, temperature: 2, beta: 0.3 };
        lossRows(rst, rg, lt === 'bf16' ? zr : Float64Array.from(z), lt === 'bf16' ? ztr : Float64Array.from(zt), y, Float64Array.from(w), V, spec64, 0, n, LD);
        let es = 0, eg = 0, mg = 0;
        assert.deepEqual([0, 1, 5].map((i) => rst[LOSS_STATS * i + STAT_ACC]), [1, 1, 0], 'the reference scores the planted hits and the tie');
        for (let i = 0; i < n; i++) {
          // Relative, with an absolute floor of 1e-6: a divergence near 1e-5 (nearly identical models) is the difference of
          // float32 sums whose rounding alone is ~1e-7 absolute.
          const o = LOSS_STATS * i;
          for (let c = 0; c < 3; c++) es = Math.max(es, Math.abs(st[o + c]! - rst[o + c]!) / Math.max(5e-4, Math.abs(rst[o + c]!)));
          // kind 'none' reads no teacher on CUDA (agreement 0); the CPU reports it whenever teacher logits are given
          if (kind !== 'none') assert.equal(st[o + STAT_AGREE], rst[o + STAT_AGREE], `${kind} row ${i}: agreement`);
          assert.equal(st[o + STAT_ACC], rst[o + STAT_ACC], `${kind} row ${i}: accuracy`);
        }
        for (let i = 0; i < n * LD; i++) {
          const want = dt === 'bf16' ? roundBf16(rg[i]!) : rg[i]!;
          eg = Math.max(eg, Math.abs(g[i]! - want)); mg = Math.max(mg, Math.abs(rg[i]!));
        }
        process.stderr.write(`[loss-emulated] ${close ? 'close' : 'random'} V ${V} LD ${LD} ${kind} logits ${lt} dlogits ${dt}: stats ${es.toExponential(2)} grad ${(eg / mg).toExponential(2)}\n`);
        // jsd over bf16 logits of nearly identical models: its float32 log m of inputs one bf16 step apart cancels
        // more (measured 2.7e-3 of the 5e-4 floor, about 1.3e-6 absolute).
        assert.ok(es <= (lt === 'bf16' && kind === 'jsd' ? 4e-3 : 2e-3), `${kind} ${lt}/${dt}: stats relative error ${es}`);
        assert.ok(eg / mg <= (dt === 'bf16' ? 8e-3 : 1e-5), `${kind} ${lt}/${dt}: dlogits error ${eg / mg}`);
        for (let i = 3 * LD; i < 4 * LD; i++) assert.equal(g[i], 0, 'the padding row has no gradient');
        for (let c = V; c < LD; c++) assert.equal(g[c], 0, 'columns past the loss vocabulary have no gradient');
      }
    }
  });
}

test('emulated CUDA: loss clean up', { skip }, () => { cleanUp(); });
