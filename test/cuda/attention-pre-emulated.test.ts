/**
 * attention_bwd_pre, D = rowsum(dout ∘ out) per (b, t, h) row into the [b][h][t] scratch: the row-split form (bf16
 * operands, head dims 8·2^k: HD/8 lanes a row, 16-byte loads) and the warp-a-row form, against float64.
 * - attnPreRowsPerWarp, the rule the launch sizes its grid by (always on);
 * - OPT-IN (DISTILLERY_EMULATE_CUDA=1, g++): the GENERATED source on the host emulator of ./emulator.ts at head dims
 *   64 and 128 (row-split, 4 and 2 rows a warp) and 80 (warp a row), bf16 and f32, a row count that is no multiple of
 *   the rows a warp takes, a grid smaller than the rows (the grid-stride loop), and operands one element off 16-byte
 *   alignment (the run-time fallback to a warp a row). Every D slot is written once; the others keep their sentinel.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { attentionBackwardPre, attnPreRowsPerWarp } from '../../src/backend/cuda/kernels/attention.js';
import { packBf16, roundBf16InPlace } from '../../src/backend/bf16.js';
import { build, cleanUp, skip, workDir } from './emulator.js';
import { rng } from './helpers.js';

test('attention_bwd_pre: rows a warp takes (bf16 operands at head dims 8·2^k below 256 split a row over HD/8 lanes)', () => {
  const r = (hd: number, dout: 'f32' | 'bf16' = 'bf16', out: 'f32' | 'bf16' = 'bf16'): number => attnPreRowsPerWarp({ headDim: hd, dout, out });
  assert.deepEqual([8, 16, 32, 64, 128, 256].map((hd) => r(hd)), [32, 16, 8, 4, 2, 1]);
  assert.deepEqual([80, 96, 40, 12].map((hd) => r(hd)), [1, 1, 1, 1], 'HD/8 not a power of two: a warp a row');
  assert.equal(r(64, 'f32', 'f32'), 1);
  assert.equal(r(64, 'bf16', 'f32'), 1);
  assert.doesNotMatch(attentionBackwardPre.make({ headDim: 80, block: 256, dout: 'bf16', out: 'bf16' }).source(), /uint4/);
  assert.match(attentionBackwardPre.make({ headDim: 64, block: 256, dout: 'bf16', out: 'bf16' }).source(), /uint4/);
});

test('emulated CUDA: attention_bwd_pre against float64 (row-split and warp-a-row forms, bf16 and f32, the grid-stride loop, misaligned operands)', { skip, timeout: 300_000 }, () => {
  const r = rng(11), B = 2, T = 7, nH = 3, rows = B * T * nH, BLOCK = 64;
  try {
    for (const [hd, dt, off] of [[64, 'bf16', 0], [128, 'bf16', 0], [80, 'bf16', 0], [64, 'f32', 0], [64, 'bf16', 1]] as const) {
      const n = rows * hd;
      // operands at element offset `off` of their arrays (off 1: 2 bytes past 16-byte alignment for bf16)
      const dout = Float32Array.from({ length: n + off }, () => (r() - 0.5) * 2), out = Float32Array.from({ length: n + off }, () => (r() - 0.5) * 2);
      if (dt === 'bf16') { roundBf16InPlace(dout); roundBf16InPlace(out); }
      const d = workDir();
      writeFileSync(join(d, 'dout'), dt === 'bf16' ? packBf16(dout) : dout); writeFileSync(join(d, 'out'), dt === 'bf16' ? packBf16(out) : out);
      const C = dt === 'bf16' ? 'bf16' : 'float';
      const spec = attentionBackwardPre.make({ headDim: hd, block: BLOCK, dout: dt, out: dt });
      const rpw = attnPreRowsPerWarp(spec.params);
      // a grid of 2 blocks (4 warps): fewer warps than the rows' groups, so the loop strides
      const exe = build(spec, `int main() { const char* d = "${d}";
  auto g = readf<${C}>(d, "dout", ${n + off}); auto o = readf<${C}>(d, "out", ${n + off});
  std::vector<float> D(${rows + 5}, -7.0f);
  launch({2, 1, 1}, ${BLOCK}, 0, [&] { attention_bwd_pre(D.data(), g.data() + ${off}, o.data() + ${off}, ${rows}, ${T}, ${nH}); });
  writef(d, "D", D); }`);
      execFileSync(exe);
      const b = readFileSync(join(d, 'D'));
      const got = new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
      let worst = 0;
      for (let row = 0; row < rows; row++) {
        let want = 0;
        for (let e = 0; e < hd; e++) want += dout[off + row * hd + e]! * out[off + row * hd + e]!;
        const h = row % nH, bt = Math.floor(row / nH), t = bt % T, bb = Math.floor(bt / T);
        worst = Math.max(worst, Math.abs(got[(bb * nH + h) * T + t]! - want) / Math.max(1, Math.abs(want)));
      }
      assert.ok(worst < 1e-5, `hd ${hd} ${dt} off ${off} (${rpw} rows a warp): worst relative error ${worst}`);
      for (let i = rows; i < rows + 5; i++) assert.equal(got[i], -7, `hd ${hd} ${dt}: D[${i}] past the rows written`);
    }
  } finally { cleanUp(); }
});
