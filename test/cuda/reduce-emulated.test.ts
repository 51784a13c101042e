/**
 * OPT-IN (DISTILLERY_EMULATE_CUDA=1, g++): the GENERATED column reductions of the backward pass compiled for the host on
 * the emulator of ./emulator.ts, against float64 references:
 * - rmsnorm_bwd, a block per row looping over its rows (R blocks, fewer than the rows: the grid-stride loop), a width
 *   that is no multiple of the block (a thread's last column is past C), f32 and bf16 dout: dinp accumulated onto what it
 *   held, and the weight-gradient partials summed by col_reduce into a dweight that held a value; and with a null
 *   partials pointer (a frozen weight), dinp alone and no partial written; with a bf16 copy of dinp (a bf16 model's
 *   residual gradient), the copy is dinp's new values rounded to bf16, bit for bit;
 * - bias_grad over row chunks and a ragged last 32-column block, then col_reduce, for f32 and bf16 dout.
 * Bounds: float32 sums of order-1 terms (1e-5 relative to the largest magnitude).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { rmsnormBackward } from '../../src/backend/cuda/kernels/norm.js';
import { biasGrad, colReduce } from '../../src/backend/cuda/kernels/elementwise.js';
import type { KernelSpec } from '../../src/backend/cuda/kernels/spec.js';
import { packBf16, roundBf16InPlace } from '../../src/backend/bf16.js';
import { build, cleanUp, skip, workDir } from './emulator.js';
import { rng } from './helpers.js';

const BLOCK = 64;

function readF32(name: string): Float32Array {
  const b = readFileSync(join(workDir(), name));
  return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
}

/** Worst |got − want| over the largest |want| (at least 1). */
function relErr(got: Float32Array, want: Float64Array): number {
  let worst = 0, scale = 1;
  for (let i = 0; i < want.length; i++) { worst = Math.max(worst, Math.abs(got[i]! - want[i]!)); scale = Math.max(scale, Math.abs(want[i]!)); }
  return worst / scale;
}

/** The column-reduction source appended to a stage-1 kernel's (both families' helpers are the same header). */
function withColReduce(spec: KernelSpec): KernelSpec {
  const cr = colReduce.make({ dst: 'f32', block: BLOCK }).source();
  const body = cr.slice(cr.indexOf('extern "C"'));
  return { ...spec, source: () => `${spec.source()}\n#undef WARPS\n#define WARPS (BLOCK / 32)\n${body}` } as KernelSpec;
}

test('emulated CUDA: rmsnorm backward over rows wider than a block, R blocks looping over the rows, and its weight gradient through col_reduce, against float64 (f32 and bf16 dout; a null partials pointer writes dinp only)', { skip, timeout: 300_000 }, () => {
  const r = rng(5), n = 23, C = 150, R = 7; // 150 = 2 full passes of 64 and 22 columns: the third column of a thread is past C for 42 threads
  for (const [dt, copy] of [['f32', 'none'], ['bf16', 'none'], ['bf16', 'bf16']] as const) {
    const inp = Float32Array.from({ length: n * C }, () => (r() - 0.5) * 3);
    const dout = Float32Array.from({ length: n * C }, () => r() - 0.5);
    if (dt === 'bf16') roundBf16InPlace(dout);
    const w = Float32Array.from({ length: C }, () => 0.5 + r());
    const dinp0 = Float32Array.from({ length: n * C }, () => r() - 0.5), dw0 = Float32Array.from({ length: C }, () => r() - 0.5);
    const rstd = new Float32Array(n);
    for (let i = 0; i < n; i++) { let s = 0; for (let j = 0; j < C; j++) s += inp[i * C + j]! ** 2; rstd[i] = 1 / Math.sqrt(s / C + 1e-6); }
    const d = workDir();
    writeFileSync(join(d, 'inp'), inp); writeFileSync(join(d, 'dout'), dt === 'bf16' ? packBf16(dout) : dout);
    writeFileSync(join(d, 'w'), w); writeFileSync(join(d, 'dinp'), dinp0); writeFileSync(join(d, 'dw'), dw0); writeFileSync(join(d, 'rstd'), rstd);
    const T = dt === 'bf16' ? 'bf16' : 'float';
    const spec = withColReduce(rmsnormBackward.make({ C, dinp: 'f32', dout: dt, inp: 'f32', weight: 'f32', block: BLOCK, copy }));
    const cp = copy === 'none' ? '' : ', dc.data()';
    const exe = build(spec, `int main() { const char* d = "${d}";
  auto inp = readf<float>(d, "inp", ${n * C}); auto g = readf<${T}>(d, "dout", ${n * C}); auto w = readf<float>(d, "w", ${C});
  auto di = readf<float>(d, "dinp", ${n * C}); auto dw = readf<float>(d, "dw", ${C}); auto rs = readf<float>(d, "rstd", ${n});
  std::vector<float> part(${R * C}, -7.0f), di2 = di, part2(${R * C}, -7.0f);
  std::vector<bf16> dc(${n * C}, (bf16)0x7fc1);
  launch({${R}, 1, 1}, ${BLOCK}, 0, [&] { rmsnorm_bwd(di.data(), part.data(), g.data(), inp.data(), w.data(), rs.data(), ${n}${cp}); });
  launch({${Math.ceil(C / 32)}, 1, 1}, ${BLOCK}, 0, [&] { col_reduce(dw.data(), part.data(), ${R}, ${C}, 1); });
  launch({${R}, 1, 1}, ${BLOCK}, 0, [&] { rmsnorm_bwd(di2.data(), nullptr, g.data(), inp.data(), w.data(), rs.data(), ${n}${cp}); });
  writef(d, "di", di); writef(d, "dwo", dw); writef(d, "di2", di2); writef(d, "part2", part2); writef(d, "dc", dc); }`);
    execFileSync(exe);
    const wantDi = new Float64Array(n * C), wantDw = new Float64Array(C);
    for (let i = 0; i < n; i++) {
      const rs = rstd[i]!;
      let dot = 0;
      for (let j = 0; j < C; j++) dot += dout[i * C + j]! * w[j]! * inp[i * C + j]!;
      const k = dot * rs ** 3 / C;
      for (let j = 0; j < C; j++) {
        wantDi[i * C + j] = dinp0[i * C + j]! + rs * w[j]! * dout[i * C + j]! - inp[i * C + j]! * k;
        wantDw[j] = wantDw[j]! + dout[i * C + j]! * inp[i * C + j]! * rs;
      }
    }
    for (let j = 0; j < C; j++) wantDw[j] = wantDw[j]! + dw0[j]!;
    const di = readF32('di'), dw = readF32('dwo'), di2 = readF32('di2'), part2 = readF32('part2');
    assert.ok(relErr(di, wantDi) < 1e-5, `${dt}: dinp ${relErr(di, wantDi)}`);
    assert.ok(relErr(dw, wantDw) < 1e-5, `${dt}: dweight ${relErr(dw, wantDw)}`);
    assert.deepEqual(di2, di, `${dt}: dinp without the partials is the same`);
    assert.ok(part2.every((x) => x === -7), `${dt}: a null partials pointer writes none`);
    if (copy === 'bf16') {
      const b = readFileSync(join(workDir(), 'dc'));
      const dc = new Uint16Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
      assert.deepEqual(dc, packBf16(di2), 'the bf16 copy is dinp rounded to bf16, bit for bit');
    }
  }
  cleanUp();
});

test('emulated CUDA: bias_grad over row chunks and a ragged last column block, then col_reduce accumulating and overwriting, against float64 (f32 and bf16 dout)', { skip, timeout: 300_000 }, () => {
  const r = rng(9), rows = 101, m = 45, rowsPer = 30, R = Math.ceil(rows / rowsPer);
  for (const dt of ['f32', 'bf16'] as const) {
    const dout = Float32Array.from({ length: rows * m }, () => r() - 0.5);
    if (dt === 'bf16') roundBf16InPlace(dout);
    const db0 = Float32Array.from({ length: m }, () => r() - 0.5);
    const d = workDir();
    writeFileSync(join(d, 'dout'), dt === 'bf16' ? packBf16(dout) : dout); writeFileSync(join(d, 'db'), db0);
    const T = dt === 'bf16' ? 'bf16' : 'float';
    const exe = build(withColReduce(biasGrad.make({ dout: dt, block: BLOCK })), `int main() { const char* d = "${d}";
  auto g = readf<${T}>(d, "dout", ${rows * m}); auto db = readf<float>(d, "db", ${m});
  std::vector<float> part(${R * m});
  launch({${Math.ceil(m / 32)}, ${R}, 1}, ${BLOCK}, 0, [&] { bias_grad(part.data(), g.data(), ${rows}, ${m}, ${rowsPer}); });
  std::vector<float> fresh(${m}, NAN);
  launch({${Math.ceil(m / 32)}, 1, 1}, ${BLOCK}, 0, [&] { col_reduce(db.data(), part.data(), ${R}, ${m}, 1); });
  launch({${Math.ceil(m / 32)}, 1, 1}, ${BLOCK}, 0, [&] { col_reduce(fresh.data(), part.data(), ${R}, ${m}, 0); });
  writef(d, "dbo", db); writef(d, "dbf", fresh); }`);
    execFileSync(exe);
    const sum = new Float64Array(m);
    for (let i = 0; i < rows; i++) for (let j = 0; j < m; j++) sum[j] = sum[j]! + dout[i * m + j]!;
    const want = sum.map((x, j) => x + db0[j]!);
    const got = readF32('dbo'), fresh = readF32('dbf');
    assert.ok(relErr(got, want) < 1e-5, `${dt}: dbias ${relErr(got, want)}`);
    // accumulate = 0: the sum overwrites a destination whose old values (NaN here) are never read
    assert.ok(fresh.every(Number.isFinite) && relErr(fresh, sum) < 1e-5, `${dt}: dbias overwritten ${relErr(fresh, sum)}`);
  }
  cleanUp();
});
