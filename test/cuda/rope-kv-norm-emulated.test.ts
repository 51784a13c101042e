/**
 * OPT-IN (DISTILLERY_EMULATE_CUDA=1, g++): the GENERATED rotation-with-cache-write kernel with Qwen3's q/k norms
 * (ropeKvNormSource: a warp per (row, head), warpSum, a shared-memory stage, __syncwarp) compiled for the host on the
 * emulator of ./emulator.ts and launched on fewer blocks than units (the grid-stride loop over warps), against the CPU
 * backend's ropeKvCacheWrite with the same norms: every RoPE kind, f32 and bf16, with and without biases, per-sequence
 * and scalar positions, a head dim of 128 (two elements and two pairs a lane) and one of 48 (HALF 24: lanes without a
 * pair; NV 2 with lanes past HD). q is filled with NaN and the caches with values: an element no warp writes stays
 * NaN, a row written that should not be changes. Bounds: f32 1e-5; bf16 2 bf16 ulps of the value (the normed head is
 * rounded to bf16 before the rotation: a sum of squares in another order may round one element the other way).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { packBf16, unpackBf16 } from '../../src/backend/bf16.js';
import type { Buf, DType } from '../../src/backend/backend.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { ropeKvKernel } from '../../src/backend/cuda/kernels/rope.js';
import { plainRope, type RopeSpec } from '../../src/backend/rope.js';
import { build, cleanUp, skip, workDir } from './emulator.js';
import { rng, scaledRopes } from './helpers.js';

after(cleanUp);
const BLOCK = 64, EPS = 1e-6;

const bf16Ulp = (x: number): number => (Math.abs(x) < 2 ** -126 ? 2 ** -133 : 2 ** (Math.floor(Math.log2(Math.abs(x))) - 7));

test('emulated CUDA: rope_*_kv_fwd with q/k norms equals the CPU backend (every kind, f32/bf16, biases, positions, head dims 128 and 48)', { skip, timeout: 600_000 }, () => {
  const r = rng(1130);
  const rand = (n: number, s = 1): Float32Array => Float32Array.from({ length: n }, () => (r() - 0.5) * 2 * s);
  const cpu = createCpuBackend({ dtype: 'f32', threads: 1 });
  const ropes: RopeSpec[] = [plainRope(1e6), ...scaledRopes(5e5)];
  const cases = [
    { B: 3, T: 1, nH: 4, nKv: 2, hd: 128, tMax: 6, pos: [0, 5, 2] as number | number[] },
    { B: 2, T: 2, nH: 3, nKv: 1, hd: 48, tMax: 5, pos: 3 as number | number[] },
  ];
  let runs = 0;
  try {
    for (const rope of ropes) {
      for (const s of cases) {
        for (const [dt, withBias] of [['bf16', false], ['f32', true], ['bf16', true]] as Array<[DType, boolean]>) {
          const { B, T, nH, nKv, hd, tMax } = s, Q = nH * hd, KV = nKv * hd, W = Q + 2 * KV, N = B * T, C = B * tMax * KV;
          const init = { q: new Float32Array(N * Q).fill(NaN), kc: rand(C), vc: rand(C), qkv: rand(N * W, 3), bias: rand(W, 0.5), qw: rand(hd, 0.5).map((x) => 1 + x), kw: rand(hd, 0.5).map((x) => 1 + x) };
          // the CPU backend's result
          const up = (x: Float32Array, w: string): Buf => { const b = cpu.alloc(x.length, w, dt); cpu.upload(b, x); return b; };
          const q = up(init.q, 'q'), kc = up(init.kc, 'kc'), vc = up(init.vc, 'vc');
          let pos0: number | { seqPositions: ReturnType<typeof cpu.allocInt> } = typeof s.pos === 'number' ? s.pos : 0;
          if (typeof s.pos !== 'number') { const sp = cpu.allocInt(B, 'positions'); cpu.uploadInt(sp, Int32Array.from(s.pos)); pos0 = { seqPositions: sp }; }
          cpu.ropeKvCacheWrite(q, kc, vc, up(init.qkv, 'qkv'), B, T, pos0, tMax, nH, nKv, hd, rope, withBias ? up(init.bias, 'bias') : null,
            { q: up(init.qw, 'q_norm'), k: up(init.kw, 'k_norm'), eps: EPS });
          const want = [q, kc, vc].map((x) => Float32Array.from(cpu.download(x)));
          // the kernel on the emulator, 2 blocks of 2 warps for N·(nH + 2·nKv) units
          const seq = typeof s.pos !== 'number';
          const spec = ropeKvKernel(rope, hd, BLOCK, { out: dt, inp: dt, seqPos: seq, bias: withBias ? dt : 'none', norm: dt, eps: EPS });
          const d = workDir(), T_ = dt === 'bf16' ? 'bf16' : 'float';
          const put = (name: string, x: Float32Array): void => writeFileSync(join(d, name), dt === 'bf16' ? packBf16(x) : x);
          put('q', init.q); put('kc', init.kc); put('vc', init.vc); put('qkv', init.qkv); put('bias', init.bias); put('qw', init.qw); put('kw', init.kw);
          writeFileSync(join(d, 'pos'), Int32Array.from(seq ? (s.pos as number[]) : [0]));
          const entry = spec.family;
          const exe = build(spec, `int main() { const char* d = "${d}";
  auto q = readf<${T_}>(d, "q", ${N * Q}); auto kc = readf<${T_}>(d, "kc", ${C}); auto vc = readf<${T_}>(d, "vc", ${C});
  auto qkv = readf<${T_}>(d, "qkv", ${N * W}); auto bias = readf<${T_}>(d, "bias", ${W}); auto qw = readf<${T_}>(d, "qw", ${hd}); auto kw = readf<${T_}>(d, "kw", ${hd});
  auto pos = readf<int>(d, "pos", ${seq ? B : 1});
  launch({2, 1, 1}, ${BLOCK}, 0, [&] { ${entry}(q.data(), kc.data(), vc.data(), qkv.data(), ${N}, ${T}, ${nH}, ${nKv}, ${seq ? 0 : s.pos}, ${tMax}${seq ? ', pos.data()' : ''}${withBias ? ', bias.data()' : ''}, qw.data(), kw.data()); });
  writef(d, "q", q); writef(d, "kc", kc); writef(d, "vc", vc); }`);
          execFileSync(exe);
          const read = (name: string): Float32Array => {
            const b = readFileSync(join(d, name)), ab = b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
            return dt === 'bf16' ? unpackBf16(new Uint16Array(ab)) : new Float32Array(ab);
          };
          ['q', 'kc', 'vc'].forEach((name, j) => {
            const got = read(name), exp = want[j]!, what = `${rope.type} ${JSON.stringify(s)} ${dt} bias ${withBias}: ${name}`;
            assert.equal(got.length, exp.length, what);
            for (let i = 0; i < got.length; i++) {
              const g = got[i]!, e = exp[i]!;
              const tol = dt === 'bf16' ? 2 * bf16Ulp(Math.max(Math.abs(g), Math.abs(e), 2 ** -8)) : 1e-5 * Math.max(1, Math.abs(e));
              if (!(Math.abs(g - e) <= tol)) assert.fail(`${what}: element ${i} = ${g}, CPU ${e} (tolerance ${tol})`);
            }
          });
          runs++;
        }
      }
    }
  } finally {
    cpu.dispose();
  }
  assert.equal(runs, 4 * 2 * 3);
});
