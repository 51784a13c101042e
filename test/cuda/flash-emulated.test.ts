/**
 * OPT-IN (DISTILLERY_EMULATE_CUDA=1, needs g++ with C++20; about a minute): the GENERATED CUDA source of the bf16
 * tensor-core attention kernels (and the SIMT kernels with bf16 operands) compiled for the host and run on a small
 * SIMT emulator, against the float64 definition from the same bf16-rounded inputs, with the GPU test's bounds. No GPU
 * needed: this is how the kernels were checked before they first ran on one. The emulator (EMU below) runs a block as
 * `block` threads with real barriers; warp shuffles and mma.sync.m16n8k16 (bf16 in, fp32 accumulate) exchange values
 * through per-warp slots and rebuild the 16×16 A and 16×8 B tiles from the 32 lanes' registers with the PTX ISA
 * fragment layouts (g = lane >> 2, t = lane & 3: A a0 (g, 2t..2t+1) a1 (g+8, ..) a2 (g, 2t+8..) a3 (g+8, 2t+8..);
 * B b0 (k 2t..2t+1, n g) b1 (k 2t+8.., n g); C c0 c1 (g, 2t..) c2 c3 (g+8, 2t..)), so a wrong fragment index in a kernel
 * gives wrong numbers here; ldmatrix.x2.trans likewise (lane 8m + r addresses row r of matrix m, lane 4r + w receives
 * elements [2w][r], [2w+1][r]). The inline PTX (mma, ldmatrix, cvt.rn.bf16) is replaced by host equivalents.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { packBf16, unpackBf16 } from '../../src/backend/bf16.js';
import { attentionBackward, attentionBackwardKv, attentionForward, attnTile } from '../../src/backend/cuda/kernels/attention.js';
import {
  FA_KEY_TILE, FA_QUERY_TILE, FA_THREADS, attentionBackwardDkvBf16, attentionBackwardDkvDsBf16, attentionBackwardDqBf16, attentionBackwardDqDsBf16,
  attentionForwardBf16, dqDsSmem, dsScratchElems, faSmem,
} from '../../src/backend/cuda/kernels/attention-bf16.js';
import type { KernelSpec } from '../../src/backend/cuda/kernels/spec.js';
import { attentionBackwardRef, attentionDocsRef, attentionRef, docPositionsOf } from '../backend/reference.js';
import { randBf16, rng } from './helpers.js';
import { relErr as maxRel, relFrob as frob } from '../util/compare.js';
import { build, cleanUp, skip, workDir } from './emulator.js';

type Dt = 'f32' | 'bf16';
const ct = (d: Dt): string => (d === 'bf16' ? 'bf16' : 'float');
const wr = (name: string, a: ArrayLike<number>, dt: Dt): void => writeFileSync(join(workDir(), name), dt === 'bf16' ? packBf16(a) : Float32Array.from(a));
function rd(name: string, dt: Dt): Float32Array {
  const b = readFileSync(join(workDir(), name));
  return dt === 'bf16' ? unpackBf16(new Uint16Array(b.buffer, b.byteOffset, b.length / 2)) : new Float32Array(b.buffer, b.byteOffset, b.length / 4).slice();
}

const loadAll = `auto q = readf<bf16>(d, "q.bin", (size_t)B*T*nH*HD); auto k = readf<bf16>(d, "k.bin", (size_t)B*T*nKv*HD);
  auto v = readf<bf16>(d, "v.bin", (size_t)B*T*nKv*HD); auto dout = readf<bf16>(d, "dout.bin", (size_t)B*T*nH*HD);
  auto dsum = readf<float>(d, "dsum.bin", (size_t)B*nH*T); auto lse = readf<float>(d, "lse.bin", (size_t)B*nH*T);
  auto pos = readf<int>(d, "pos.bin", (size_t)B*T); const int* docPos = atoi(a[7]) ? pos.data() : nullptr;`;
const head = 'int main(int, char** a) { const char* d = a[1]; int B = atoi(a[2]), T = atoi(a[3]), nH = atoi(a[4]), nKv = atoi(a[5]), S = atoi(a[6]);';


interface Launch { spec: KernelSpec; x: number; smem: number; threads: number }

/**
 * One forward + backward on the emulator (tensor-core kernels, or the SIMT ones when simt) and its errors. The gradients
 * start from random values: accumulated onto (acc, the SIMT kernels always), or overwritten (the tensor-core kernels
 * with accumulate false: the starting values must not show).
 */
function emulate(simt: boolean, B: number, T: number, nH: number, nKv: number, hd: number, odt: Dt, S: number, acc = true,
  storedDs = false, docs: number[][] | null = null): Record<string, number> {
  const r = rng(B * 7919 + T * 101 + nH * 13 + hd);
  const qn = B * T * nH * hd, kn = B * T * nKv * hd;
  const q = randBf16(r, qn, 3), k = randBf16(r, kn, 1), v = randBf16(r, kn, 1), dout = randBf16(r, qn, 1);
  const g0q = randBf16(r, qn, 0.1), g0k = randBf16(r, kn, 0.1), g0v = randBf16(r, kn, 0.1);
  wr('q.bin', q, 'bf16'); wr('k.bin', k, 'bf16'); wr('v.bin', v, 'bf16'); wr('dout.bin', dout, 'bf16');
  wr('dsum.bin', new Float32Array(B * nH * T), 'f32'); wr('lse.bin', new Float32Array(B * nH * T), 'f32');
  const pos = docs ? docPositionsOf(B, T, docs) : null;
  writeFileSync(join(workDir(), 'pos.bin'), pos ?? new Int32Array(B * T));
  const args = [workDir(), B, T, nH, nKv, S, pos ? 1 : 0].map(String);
  const b16 = { q: 'bf16', k: 'bf16', v: 'bf16' } as const;
  const tile = (kind: 'fwd' | 'dq' | 'dkv') => attnTile(kind, hd, 128)!;
  const fwd: Launch = simt ? { spec: attentionForward.make({ headDim: hd, block: 128, out: odt, ...b16 }), x: tile('fwd').tq, smem: tile('fwd').smem, threads: 128 }
    : { spec: attentionForwardBf16.make({ headDim: hd, out: odt }), x: FA_QUERY_TILE, smem: faSmem('fwd', hd), threads: FA_THREADS };
  execFileSync(build(fwd.spec, `${head} ${loadAll}
  std::vector<${ct(odt)}> out((size_t)B*T*nH*HD);
  launch({(unsigned)((T + ${fwd.x} - 1) / ${fwd.x}), (unsigned)nH, (unsigned)B}, ${fwd.threads}, ${fwd.smem},
    [&] { ${fwd.spec.entry}(out.data(), lse.data(), q.data(), k.data(), v.data(), T, nH, nKv, docPos); });
  writef(d, "out.bin", out); writef(d, "lse.bin", lse); (void)S; }`), args);
  const out = rd('out.bin', odt), lse = rd('lse.bin', 'f32');
  const dsum = new Float32Array(B * nH * T); // D from the stored out (attention_bwd_pre's; the tensor-core dQ kernel writes its own)
  for (let b = 0; b < B; b++) {
    for (let t = 0; t < T; t++) {
      for (let h = 0; h < nH; h++) {
        let s = 0;
        const o = ((b * T + t) * nH + h) * hd;
        for (let d = 0; d < hd; d++) s += dout[o + d]! * out[o + d]!;
        dsum[(b * nH + h) * T + t] = s;
      }
    }
  }
  // the SIMT kernels read D from the pre-pass (here: float64 rounded once); the tensor-core dQ kernel computes and writes
  // it itself, from a scratch left full of garbage here, and the dK/dV kernel then reads what it wrote
  // (the stored-dS pair (storedDs) reads D from the pre-pass too: its dQ kernel runs after dK/dV)
  const stored = storedDs && !simt;
  wr('dsum.bin', simt || stored ? dsum : new Float32Array(B * nH * T).fill(12345), 'f32'); wr('dq.bin', g0q, odt); wr('dk.bin', g0k, odt); wr('dv.bin', g0v, odt);
  wr('out.bin', out, odt);
  let dsumErr = 0;
  if (!stored) {
    const dqk: Launch = simt
      ? { spec: attentionBackward.make({ headDim: hd, block: 128, dq: odt, dout: 'bf16', ...b16 }), x: tile('dq').tq, smem: tile('dq').smem, threads: 128 }
      : { spec: attentionBackwardDqBf16.make({ headDim: hd, dq: odt, out: odt, accumulate: acc }), x: FA_QUERY_TILE, smem: faSmem('dq', hd), threads: FA_THREADS };
    execFileSync(build(dqk.spec, `${head} ${loadAll}
  auto dq = readf<${ct(odt)}>(d, "dq.bin", (size_t)B*T*nH*HD); auto out = readf<${ct(odt)}>(d, "out.bin", (size_t)B*T*nH*HD);
  launch({(unsigned)((T + ${dqk.x} - 1) / ${dqk.x}), (unsigned)nH, (unsigned)B}, ${dqk.threads}, ${dqk.smem},
    [&] { ${dqk.spec.entry}(dq.data(), dsum.data(), lse.data(), dout.data(), ${simt ? '' : 'out.data(), '}q.data(), k.data(), v.data(), T, nH, nKv, docPos); });
  writef(d, "dq.out", dq); writef(d, "dsum.bin", dsum); (void)S; }`), args);
    // D as the dK/dV kernel will read it (the tensor-core dQ kernel's), against the float64 sum of the same bf16 products
    const dsumGot = rd('dsum.bin', 'f32');
    for (let i = 0; i < dsum.length; i++) dsumErr = Math.max(dsumErr, Math.abs(dsumGot[i]! - dsum[i]!) / Math.max(1, Math.abs(dsum[i]!)));
  }
  const dkv: Launch = simt
    ? { spec: attentionBackwardKv.make({ headDim: hd, block: 128, dk: odt, dv: odt, dout: 'bf16', ...b16 }), x: 32, smem: tile('dkv').smem, threads: 128 }
    : { spec: (stored ? attentionBackwardDkvDsBf16 : attentionBackwardDkvBf16).make({ headDim: hd, dk: odt, dv: odt, accumulate: acc }), x: FA_KEY_TILE, smem: faSmem('dkv', hd), threads: FA_THREADS };
  // the dS scratch starts as bf16 NaNs: a tile the dK/dV kernel leaves unwritten must not reach a valid dq row
  const dsN = dsScratchElems(B, nH, T);
  execFileSync(build(dkv.spec, `${head} ${loadAll}
  auto dk = readf<${ct(odt)}>(d, "dk.bin", (size_t)B*T*nKv*HD); auto dv = readf<${ct(odt)}>(d, "dv.bin", (size_t)B*T*nKv*HD);
  std::vector<float> part(S > 1 ? (size_t)2*B*nKv*S*T*HD : 1, 12345.0f);
  ${stored ? `std::vector<bf16> ds((size_t)${dsN}, (bf16)0x7fc0);` : ''}
  launch({(unsigned)((T + ${dkv.x} - 1) / ${dkv.x}), (unsigned)(nKv * S), (unsigned)B}, ${dkv.threads}, ${dkv.smem},
    [&] { ${dkv.spec.entry}(dk.data(), dv.data(), S > 1 ? part.data() : nullptr, ${stored ? 'ds.data(), ' : ''}dsum.data(), lse.data(), dout.data(), q.data(), k.data(),
                            v.data(), T, nH, nKv, docPos); });
  writef(d, "dk.out", dk); writef(d, "dv.out", dv); writef(d, "part.out", part); ${stored ? 'writef(d, "ds.bin", ds);' : ''} }`), args);
  if (stored) {
    const dqs = attentionBackwardDqDsBf16.make({ headDim: hd, dq: odt, accumulate: acc });
    execFileSync(build(dqs, `${head} ${loadAll}
  auto dq = readf<${ct(odt)}>(d, "dq.bin", (size_t)B*T*nH*HD); auto ds = readf<bf16>(d, "ds.bin", (size_t)${dsN});
  launch({(unsigned)((T + ${FA_QUERY_TILE} - 1) / ${FA_QUERY_TILE}), (unsigned)nH, (unsigned)B}, ${FA_THREADS}, ${dqDsSmem(hd)},
    [&] { ${dqs.entry}(dq.data(), ds.data(), k.data(), T, nH, nKv, docPos); });
  writef(d, "dq.out", dq); (void)S; (void)dsum; (void)lse; (void)q; (void)v; (void)dout; }`), args);
  }
  const dq = Float64Array.from(rd('dq.out', odt)), dk = Float64Array.from(rd('dk.out', odt)), dv = Float64Array.from(rd('dv.out', odt));
  if (S > 1) { // attention_dkv_reduce: dk += Σ_s part_dk[b][kvh][s][j][d] in split order (into float64 here); overwriting, dk = Σ
    const part = rd('part.out', 'f32'), half = kn * S;
    if (!acc) { dk.fill(0); dv.fill(0); }
    for (let i = 0; i < kn; i++) {
      const d = i % hd, r0 = Math.floor(i / hd), kvh = r0 % nKv, r1 = Math.floor(r0 / nKv), j = r1 % T, b = Math.floor(r1 / T);
      const base = (((b * nKv + kvh) * S) * T + j) * hd + d;
      for (let s = 0; s < S; s++) { dk[i] += part[base + s * T * hd]!; dv[i] += part[half + base + s * T * hd]!; }
    }
  }
  // the float64 definition: causal within the window, or each document alone
  const [oR, lR, dqR, dkR, dvR] = pos ? attentionDocsRef(dout, q, k, v, pos, B, T, nH, nKv, hd)
    : [...attentionRef(q, k, v, B, T, nH, nKv, hd), ...attentionBackwardRef(dout, q, k, v, B, T, nH, nKv, hd)];
  const minus = (a: Float64Array, b: Float64Array): Float64Array => a.map((y, i) => y - b[i]!);
  let lseErr = 0;
  for (let i = 0; i < lR.length; i++) lseErr = Math.max(lseErr, Math.abs(lse[i]! - lR[i]!));
  const own = (a: Float64Array, g0: ArrayLike<number>): Float64Array => (acc ? minus(a, Float64Array.from(g0)) : a);
  return { out: maxRel(out, oR), lse: lseErr, dsum: dsumErr, dq: frob(own(dq, g0q), dqR), dk: frob(own(dk, g0k), dkR), dv: frob(own(dv, g0v), dvR) };
}

const cases: Array<[boolean, number, number, number, number, number, Dt, number, boolean?, boolean?, number[][]?]> = [
  // simt, B, T, nH, nKv, hd, output/gradient dtype, GQA split S, accumulate (default true; false: overwritten)
  [false, 1, 130, 7, 1, 64, 'bf16', 7], [false, 2, 65, 2, 1, 128, 'f32', 1], [false, 1, 15, 4, 2, 128, 'bf16', 2], [false, 1, 1, 2, 2, 64, 'bf16', 1],
  [false, 1, 70, 2, 1, 16, 'bf16', 1], [false, 1, 100, 2, 1, 96, 'f32', 1], [true, 1, 40, 2, 1, 40, 'bf16', 1], [true, 2, 33, 7, 1, 40, 'bf16', 7],
  [false, 1, 130, 7, 1, 64, 'bf16', 7, false], [false, 2, 65, 2, 1, 128, 'f32', 1, false],
  // the stored-dS pair (the default backward: attention_bwd_dkv_ds_bf16 then attention_bwd_dq_ds_bf16): T past a multiple of 64,
  // hd 128's 32-row query tiles (a dS tile written in halves), GQA split, overwriting and accumulating
  [false, 1, 130, 7, 1, 64, 'bf16', 7, true, true], [false, 2, 100, 2, 1, 128, 'f32', 1, false, true], [false, 1, 65, 4, 2, 32, 'bf16', 2, true, true],
  // packed documents (DocPositions): starts inside and at tile edges, a document spanning tiles, one-row documents, a key
  // tile (64 .. 127) whose every query row past the document's end is masked, the padding a document of its own
  [false, 2, 200, 4, 2, 64, 'bf16', 2, true, true, [[30, 34, 70, 1, 1, 40], [129, 60]]],
  [false, 1, 200, 2, 1, 128, 'bf16', 1, false, true, [[64, 1, 100, 20]]],
  [false, 2, 150, 4, 2, 64, 'f32', 2, true, false, [[5, 59, 64, 10], [150]]],
  [false, 1, 150, 2, 1, 128, 'bf16', 1, false, false, [[31, 33, 1, 70]]],
  [true, 2, 90, 4, 2, 40, 'bf16', 2, true, false, [[10, 23, 40], [1, 89]]],
];
for (const c of cases) {
  const name = `${c[0] ? 'SIMT' : 'tensor-core'} bf16 attention B=${c[1]} T=${c[2]} heads ${c[3]}/${c[4]} hd ${c[5]} grads ${c[6]} S=${c[7]}${c[8] === false ? ' overwriting' : ''}${c[9] ? ', stored dS' : ''}${c[10] ? `, documents ${JSON.stringify(c[10])}` : ''}`;
  test(`emulated CUDA: ${name}`, { skip, timeout: 600_000 }, () => {
    const e = emulate(...c);
    process.stderr.write(`[flash-emulated] ${name}: ${Object.entries(e).map(([k, v]) => `${k} ${v.toExponential(2)}`).join(' ')}\n`);
    assert.ok(e.out! <= 1e-2 && e.lse! <= 1e-3, `forward: out ${e.out}, lse ${e.lse}`);
    assert.ok(e.dsum! <= 1e-5, `D = rowsum(dout ∘ out) as the dK/dV kernel reads it: ${e.dsum}`);
    for (const k of ['dq', 'dk', 'dv']) assert.ok(e[k]! <= 2e-2, `${k}: ${e[k]}`);
  });
}
test('emulated CUDA: clean up', { skip }, () => { cleanUp(); });
