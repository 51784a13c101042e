/**
 * OPT-IN (DISTILLERY_EMULATE_CUDA=1, g++): the GENERATED sparse loss kernel (src/backend/cuda/kernels/sparse-loss.ts)
 * compiled for the host on the emulator of ./emulator.ts and compared with the CPU backend's float64 sparse loss
 * (stats and dlogits) over the same float32 inputs: sample rows (no tail) and top-K rows (a tail bucket, and one row
 * whose slots cover no tail), every divergence, f32 dlogits aliasing the logits and bf16 dlogits, a padding row and a
 * row stride past the loss vocabulary; rows whose stride is a multiple of 4 (the float4 loops, with and without a scalar
 * tail) and rows that are not (the scalar loops).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { sparseLossKernel } from '../../src/backend/cuda/kernels/sparse-loss.js';
import { sparseLossRows } from '../../src/backend/cpu/kernels/sparse-loss.js';
import { LOSS_STATS, STAT_ACC, STAT_AGREE, STAT_DIV } from '../../src/backend/backend.js';
import { sparseRow, type SparseRep } from '../../src/cache/sparse.js';
import { allocSparseHost, setSparseRow } from '../../src/cache/targets.js';
import { packBf16, roundBf16, unpackBf16 } from '../../src/backend/bf16.js';
import { build, cleanUp, skip, workDir } from './emulator.js';
import { rng } from './helpers.js';

const n = 6, BLOCK = 128, S = 12;
/** [loss vocabulary, row stride]: 8-element vector rows with a 4-element tail, with a 5-element tail, scalar rows */
const GEOMETRIES: Array<[number, number]> = [[700, 704], [701, 704], [698, 703]];

function readF32(name: string): Float32Array {
  const b = readFileSync(join(workDir(), name));
  return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
}

for (const [rep, [V, LD]] of ([{ kind: 'sample', n: S }, { kind: 'top', k: S }] as SparseRep[]).flatMap((rp) => GEOMETRIES.map((g) => [rp, g] as const))) {
  test(`emulated CUDA: sparse loss over ${rep.kind} rows, every kind, vocabulary ${V} in rows of ${LD}, vs the CPU backend in float64`, { skip, timeout: 300_000 }, () => {
    const r = rng(rep.kind === 'top' ? 9 : 8);
    const z = Float32Array.from({ length: n * LD }, () => (r() - 0.5) * 10);
    const zt = Float64Array.from({ length: n * V }, () => (r() - 0.5) * 10);
    const y = Int32Array.from({ length: n }, (_, i) => (i === 3 ? -1 : Math.floor(r() * V)));
    // Accuracy: row 0 ties its maximum at 10 and 20 with y = 10 (a hit), row 5 the same tie with y = 20 (a miss).
    for (const i of [0, 5]) { z[i * LD + 10] = 6; z[i * LD + 20] = 6; }
    y[0] = 10; y[5] = 20;
    const w = Float32Array.from({ length: n }, (_, i) => (i === 3 ? 0 : 0.25));
    const h = allocSparseHost(n, S);
    for (let i = 0; i < n; i++) {
      const e = sparseRow(zt, i * V, V, 2, rep, () => r());
      if (i === 5 && rep.kind === 'top') e.tail = -1; // a row with no tail bucket
      setSparseRow(h, i, e, rep);
    }
    // The kernel reads float32: the reference gets the same rounded values.
    const prob = Float32Array.from(h.prob), logq = Float32Array.from(h.logq), tail = Float32Array.from(h.tail);
    for (const [f, a] of [['z', z], ['zb', packBf16(z)], ['y', y], ['w', w], ['ids', h.ids], ['prob', prob], ['logq', logq], ['tail', tail], ['am', h.argmax]] as const) {
      writeFileSync(join(workDir(), f), a);
    }
    for (const kind of ['kl', 'reverse-kl', 'jsd'] as const) {
      for (const [lt, dt] of [['f32', 'f32'], ['f32', 'bf16'], ['bf16', 'bf16']] as const) {
        const spec = sparseLossKernel.make({ kind, withGrad: true, dlogits: dt, logits: lt, withTail: rep.kind === 'top', block: BLOCK });
        const T = dt === 'bf16' ? 'bf16' : 'float';
        // dlogits of the logits' dtype aliases them (the head's in-place case); bf16 logits: the rounded values
        const exe = build(spec, `int main() { const char* d = "${workDir()}";
  auto z = ${lt === 'bf16' ? `readf<bf16>(d, "zb", ${n * LD})` : `readf<float>(d, "z", ${n * LD})`}; auto y = readf<int>(d, "y", ${n}); auto w = readf<float>(d, "w", ${n});
  auto ids = readf<int>(d, "ids", ${n * S}); auto prob = readf<float>(d, "prob", ${n * S}); auto logq = readf<float>(d, "logq", ${n * S});
  auto tail = readf<float>(d, "tail", ${n}); auto am = readf<int>(d, "am", ${n});
  std::vector<float> st(${n * LOSS_STATS}); std::vector<${T}> g(${n * LD});
  ${dt === lt ? `${T}* gp = z.data();` : `${T}* gp = g.data();`}
  launch({${n}, 1, 1}, ${BLOCK}, 0, [&] { sparse_loss(st.data(), gp, z.data(), y.data(), w.data(), ids.data(), prob.data(), logq.data(), tail.data(), am.data(), ${n}, ${V}, ${LD}, ${S}, 2.0f, 0.6f, 0.3f); });
  writef(d, "st", st); ${dt === lt ? 'writef(d, "g", z);' : 'writef(d, "g", g);'} }`);
        execFileSync(exe);
        const st = readF32('st');
        const gb = readFileSync(join(workDir(), 'g'));
        const g = dt === 'bf16' ? unpackBf16(new Uint16Array(gb.buffer.slice(gb.byteOffset, gb.byteOffset + gb.length))) : readF32('g');
        const rst = new Float64Array(n * LOSS_STATS), rg = new Float64Array(n * LD);
        const sp = { slots: S, ids: h.ids, prob: Float64Array.from(prob), logq: Float64Array.from(logq), tail: Float64Array.from(tail), argmax: h.argmax };
        sparseLossRows(rst, rg, Float64Array.from(z, lt === 'bf16' ? roundBf16 : (x) => x), y, Float64Array.from(w), sp, V, { kind, alpha: 0.6, temperature: 2, beta: 0.3 }, 0, n, LD);
        assert.deepEqual([0, 5].map((i) => rst[LOSS_STATS * i + STAT_ACC]), [1, 0], 'the reference scores the planted hit and the tie');
        let es = 0, eg = 0, mg = 0;
        for (let i = 0; i < n; i++) {
          const o = LOSS_STATS * i;
          for (let c = 0; c < 3; c++) es = Math.max(es, Math.abs(st[o + c]! - rst[o + c]!) / Math.max(5e-4, Math.abs(rst[o + c]!)));
          assert.equal(st[o + STAT_AGREE], rst[o + STAT_AGREE], `${kind} row ${i}: agreement`);
          assert.equal(st[o + STAT_ACC], rst[o + STAT_ACC], `${kind} row ${i}: accuracy`);
        }
        for (let i = 0; i < n * LD; i++) {
          const want = dt === 'bf16' ? roundBf16(rg[i]!) : rg[i]!;
          eg = Math.max(eg, Math.abs(g[i]! - want)); mg = Math.max(mg, Math.abs(rg[i]!));
        }
        process.stderr.write(`[sparse-loss-emulated] ${rep.kind} ${kind} logits ${lt} dlogits ${dt}: stats ${es.toExponential(2)} grad ${(eg / mg).toExponential(2)}\n`);
        assert.ok(es <= 2e-3, `${kind} ${dt}: stats relative error ${es}`);
        assert.ok(eg / mg <= (dt === 'bf16' ? 8e-3 : 2e-5), `${kind} ${dt}: dlogits error ${eg / mg}`);
        for (let i = 3 * LD; i < 4 * LD; i++) assert.equal(g[i], 0, 'the padding row has no gradient');
        for (let c = V; c < LD; c++) assert.equal(g[c], 0, 'columns past the loss vocabulary have no gradient');
      }
    }
  });
}

test('emulated CUDA: sparse loss at the extremes stays finite and equals the float64 loss (a slot of q_t < e^-88, the other tokens 120 nats below the slots)', { skip, timeout: 300_000 }, () => {
  const n2 = 2, V2 = 300, S2 = 4;
  const z = new Float32Array(n2 * V2).fill(-120); // far below the slots
  for (let k = 0; k < S2; k++) { z[k * 7] = 2 - k; z[V2 + k * 5] = 1 + k; }
  const y = Int32Array.from([0, 5]), w = Float32Array.from([0.5, 0.5]);
  const ids = Int32Array.from([0, 7, 14, 21, 0, 5, 10, 15]);
  const logq = Float32Array.from([-0.1, -3, -95, -6, -0.5, -1.5, -2.5, -3.5]); // one slot of log q_t = -95 (expf(95) overflows)
  const prob = Float32Array.from(logq, (l, k) => (k === 2 ? 1e-30 : Math.exp(l)));
  const tail = Float32Array.from([1e-3, 2e-3]), am = Int32Array.from([0, 15]);
  for (const [f, a] of [['z2', z], ['y2', y], ['w2', w], ['ids2', ids], ['prob2', prob], ['logq2', logq], ['tail2', tail], ['am2', am]] as const) writeFileSync(join(workDir(), f), a);
  for (const kind of ['kl', 'reverse-kl', 'jsd'] as const) {
    const spec = sparseLossKernel.make({ kind, withGrad: true, dlogits: 'f32', logits: 'f32', withTail: true, block: BLOCK });
    const exe = build(spec, `int main() { const char* d = "${workDir()}";
  auto z = readf<float>(d, "z2", ${n2 * V2}); auto y = readf<int>(d, "y2", ${n2}); auto w = readf<float>(d, "w2", ${n2});
  auto ids = readf<int>(d, "ids2", ${n2 * S2}); auto prob = readf<float>(d, "prob2", ${n2 * S2}); auto logq = readf<float>(d, "logq2", ${n2 * S2});
  auto tail = readf<float>(d, "tail2", ${n2}); auto am = readf<int>(d, "am2", ${n2});
  std::vector<float> st(${n2 * LOSS_STATS}), g(${n2 * V2});
  launch({${n2}, 1, 1}, ${BLOCK}, 0, [&] { sparse_loss(st.data(), g.data(), z.data(), y.data(), w.data(), ids.data(), prob.data(), logq.data(), tail.data(), am.data(), ${n2}, ${V2}, ${V2}, ${S2}, 1.0f, 1.0f, 0.5f); });
  writef(d, "st2", st); writef(d, "g2", g); }`);
    execFileSync(exe);
    const st = readF32('st2'), g = readF32('g2');
    const rst = new Float64Array(n2 * LOSS_STATS), rg = new Float64Array(n2 * V2);
    sparseLossRows(rst, rg, Float64Array.from(z), y, Float64Array.from(w),
      { slots: S2, ids, prob: Float64Array.from(prob), logq: Float64Array.from(logq), tail: Float64Array.from(tail), argmax: am }, V2,
      { kind, alpha: 1, temperature: 1, beta: 0.5 }, 0, n2, V2);
    assert.ok([...st, ...g].every(Number.isFinite), `${kind}: finite stats and gradient`);
    let es = 0, eg = 0, mg = 0;
    for (let i = 0; i < n2; i++) es = Math.max(es, Math.abs(st[LOSS_STATS * i + STAT_DIV]! - rst[LOSS_STATS * i + STAT_DIV]!) / Math.max(1e-3, Math.abs(rst[LOSS_STATS * i + STAT_DIV]!)));
    for (let i = 0; i < n2 * V2; i++) { eg = Math.max(eg, Math.abs(g[i]! - rg[i]!)); mg = Math.max(mg, Math.abs(rg[i]!)); }
    let wi = 0; for (let i = 0; i < n2 * V2; i++) if (Math.abs(g[i]! - rg[i]!) > Math.abs(g[wi]! - rg[wi]!)) wi = i;
    process.stderr.write(`[sparse-loss-emulated] extremes ${kind}: divergence ${es.toExponential(2)} grad ${(eg / mg).toExponential(2)} (worst element ${wi}: ${g[wi]} vs ${rg[wi]})\n`);
    assert.ok(es <= 2e-3 && eg / mg <= 1e-4, `${kind}: divergence ${es}, gradient ${eg / mg}`);
  }
});

test('emulated CUDA: sparse loss clean up', { skip }, () => { cleanUp(); });
