/**
 * OPT-IN (DISTILLERY_EMULATE_CUDA=1, g++): the GENERATED tensor-core cached attention (attention_cached_mma,
 * src/backend/cuda/kernels/attention-cached-mma.ts) compiled for the host on the emulator of ./emulator.ts (mma.m16n8k16
 * from the PTX fragment layouts, warp shuffles, barriers) and compared with the CPU backend's cached attention in float64
 * on the same bf16 inputs: GQA groups of 1, 2, 7, 8, 9, 12, 15 and 16 heads (past 8 the tiles' second 8 rows are heads
 * too) at head dims 64 and 128, one query row and several (a prefill chunk), split and unsplit grids (splits past the
 * rows, so empty), per-sequence positions, tiles that end past the rows, peaked weights (q times 8), a bf16 output, and
 * cache rows past each sequence's length holding NaN (they must never be read into a result).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { attentionCachedMma } from '../../src/backend/cuda/kernels/attention-cached-mma.js';
import { CACHED_COUNTERS } from '../../src/backend/cuda/kernels/attention-cached.js';
import { packBf16, unpackBf16 } from '../../src/backend/bf16.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { build, cleanUp, skip, workDir } from './emulator.js';
import { rng } from './helpers.js';

/** `qScale`: q's values times this (peaked weights, where the scores' errors show); `out`: the output dtype (f32 by default). */
interface Case { name: string; hd: number; h: number; kv: number; b: number; t: number; tMax: number; pos: number | number[]; splits: number; qScale?: number; out?: 'f32' | 'bf16' }
const CASES: Case[] = [
  { name: 'Qwen2.5-0.5B heads (14/2, hd 64), per-sequence positions, 3 splits', hd: 64, h: 14, kv: 2, b: 2, t: 1, tMax: 100, pos: [37, 99], splits: 3 },
  { name: 'Qwen3 heads (16/8, hd 128), unsplit, several tiles a warp', hd: 128, h: 16, kv: 8, b: 1, t: 1, tMax: 150, pos: 140, splits: 1 },
  { name: 'a group of 16 (16/1, hd 128), a 3-row prefill of 6..8 keys (one partial tile), 2 splits', hd: 128, h: 16, kv: 1, b: 1, t: 3, tMax: 24, pos: 5, splits: 2 },
  { name: 'no group (4/4, hd 64), per-sequence positions 0 and 150, 5 splits (some empty)', hd: 64, h: 4, kv: 4, b: 2, t: 1, tMax: 160, pos: [0, 150], splits: 5 },
  // groups past 8 (rows g + 8 of the tiles are heads: their own maxima, rescaling and sums) over many tiles a warp, peaked
  { name: 'a group of 12 (12/1, hd 64), 290 rows unsplit, q x8', hd: 64, h: 12, kv: 1, b: 1, t: 1, tMax: 290, pos: 289, splits: 1, qScale: 8 },
  { name: 'a group of 12 (24/2, hd 128), 2 rows at per-sequence positions 0, 390 and 131, 3 splits', hd: 128, h: 24, kv: 2, b: 3, t: 2, tMax: 400, pos: [0, 390, 131], splits: 3 },
  { name: 'a group of 16 (16/1, hd 64), 519 rows, 2 splits, q x8', hd: 64, h: 16, kv: 1, b: 1, t: 1, tMax: 519, pos: 518, splits: 2, qScale: 8 },
  { name: 'a group of 8 (8/1, hd 128), 151 rows', hd: 128, h: 8, kv: 1, b: 1, t: 1, tMax: 200, pos: 150, splits: 1, qScale: 8 },
  { name: 'a group of 9 (9/1, hd 128), 3 rows at per-sequence positions 10 and 77, 2 splits, q x8', hd: 128, h: 9, kv: 1, b: 2, t: 3, tMax: 90, pos: [10, 77], splits: 2, qScale: 8 },
  { name: 'no group (2/2, hd 128), 4 rows at per-sequence positions 3 and 60', hd: 128, h: 2, kv: 2, b: 2, t: 4, tMax: 70, pos: [3, 60], splits: 1 },
  { name: 'a group of 15 (15/1, hd 64), 18 rows over 16 splits (most empty), a bf16 output', hd: 64, h: 15, kv: 1, b: 1, t: 1, tMax: 300, pos: 17, splits: 16, out: 'bf16' },
];

function readBytes(name: string): Buffer { return readFileSync(join(workDir(), name)); }

test('emulated CUDA: attention_cached_mma equals the CPU backend\'s cached attention (float64) on bf16 inputs, and never reads the rows past a sequence', { skip, timeout: 600_000 }, () => {
  try {
    const r = rng(11);
    for (const c of CASES) {
      const { hd, h, kv, b, t, tMax, splits } = c, group = h / kv, seq = Array.isArray(c.pos);
      const posOf = (s: number): number => (Array.isArray(c.pos) ? c.pos[s]! : c.pos);
      const rnd = (n: number, scale = 1): Uint16Array => packBf16(Float32Array.from({ length: n }, () => (r() - 0.5) * scale));
      const q = rnd(b * t * h * hd, c.qScale), kc = rnd(b * tMax * kv * hd), vc = rnd(b * tMax * kv * hd), outDt = c.out ?? 'f32';
      // rows past each sequence's last (pos + t - 1) are NaN: a kernel that lets them into a sum returns NaN
      for (let s = 0; s < b; s++) for (let j = posOf(s) + t; j < tMax; j++) for (let x = 0; x < kv * hd; x++) {
        kc[((s * tMax + j) * kv) * hd + x] = 0x7fc0; vc[((s * tMax + j) * kv) * hd + x] = 0x7fc0;
      }
      for (const [f, a] of [['q', q], ['kc', kc], ['vc', vc]] as const) writeFileSync(join(workDir(), f), a);
      writeFileSync(join(workDir(), 'pos'), Int32Array.from({ length: b }, (_, s) => posOf(s)));
      const spec = attentionCachedMma.make({ headDim: hd, group, out: outDt, seqPos: seq, minBlocks: 0 });
      const exe = build(spec, `int main() { const char* d = "${workDir()}";
  auto q = readf<bf16>(d, "q", ${q.length}); auto kc = readf<bf16>(d, "kc", ${kc.length}); auto vc = readf<bf16>(d, "vc", ${vc.length});
  auto pos = readf<int>(d, "pos", ${b}); std::vector<${outDt === 'bf16' ? 'bf16' : 'float'}> out(${q.length}, ${outDt === 'bf16' ? '0x7fc0' : '-7.0f'});
  std::vector<float> part(CACHED_COUNTERS + ${b * t * h * splits * (hd + 2)}, 0.0f);
  launch({${t * splits}, ${kv}, ${b}}, 128, 0, [&] { attention_cached_mma(out.data(), q.data(), kc.data(), vc.data(), ${t}, ${seq ? 0 : c.pos}, ${tMax}, ${h}, ${kv}, ${splits > 1 ? 'part.data()' : 'nullptr'}, ${splits}${seq ? ', pos.data()' : ''}); });
  writef(d, "out", out); writef(d, "part", part); }`);
      execFileSync(exe);
      const o = readBytes('out');
      const got = outDt === 'bf16' ? unpackBf16(new Uint16Array(o.buffer.slice(o.byteOffset, o.byteOffset + o.length))) : new Float32Array(o.buffer.slice(o.byteOffset, o.byteOffset + o.length));
      const pb = readBytes('part'), counters = new Int32Array(pb.buffer.slice(pb.byteOffset, pb.byteOffset + 4 * CACHED_COUNTERS));
      // the CPU backend, float64, on the same bf16 values (its rows past a sequence are never read either: zero them)
      const be = createCpuBackend({ dtype: 'f64', threads: 1 });
      const up = (a: Float32Array): ReturnType<typeof be.alloc> => { const x = be.alloc(a.length, 'x'); be.upload(x, a); return x; };
      const clean = (a: Uint16Array): Float32Array => unpackBf16(a).map((v) => (Number.isNaN(v) ? 0 : v));
      const OUT = be.alloc(q.length, 'out');
      let pos0: number | { seqPositions: ReturnType<typeof be.allocInt> } = posOf(0);
      if (seq) { const sp = be.allocInt(b, 'pos'); be.uploadInt(sp, Int32Array.from({ length: b }, (_, s) => posOf(s))); pos0 = { seqPositions: sp }; }
      be.attentionCached(OUT, up(unpackBf16(q)), up(clean(kc)), up(clean(vc)), b, t, pos0, tMax, h, kv, hd);
      const want = be.download(OUT);
      be.dispose();
      let err = 0, scale = 0;
      for (let k = 0; k < got.length; k++) { err = Math.max(err, Math.abs(got[k]! - want[k]!)); scale = Math.max(scale, Math.abs(want[k]!)); }
      process.stderr.write(`[cached-mma-emulated] ${c.name}: ${err.toExponential(2)} of ${scale.toExponential(2)}\n`);
      assert.ok(got.every((x) => Number.isFinite(x)), `${c.name}: every output finite (no NaN row read, every head written)`);
      // P is rounded to bf16 for its product with V (as attention_fwd_bf16): a relative 2^-9 of each weight, of values
      // within ±0.5; a bf16 output adds its own rounding (2^-9 of values within ±0.5)
      assert.ok(err <= (outDt === 'bf16' ? 3e-3 : 2e-3), `${c.name}: ${err}`);
      assert.ok(counters.every((x) => x === 0), `${c.name}: the split counters are reset for the next call`);
    }
  } finally { cleanUp(); }
});
