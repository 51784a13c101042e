/**
 * OPT-IN (DISTILLERY_EMULATE_CUDA=1, g++): the GENERATED dequant_nf4 kernel (src/backend/cuda/kernels/quant.ts) compiled
 * for the host on the emulator of ./emulator.ts against the host reference of the format (src/quant/nf4.ts
 * dequantizeNf4): bit-identical float32 values, and the bf16 store rounds them once; for a length that ends inside a
 * code word and a block, several grid-stride rounds, and blocks of 64 and 32.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { dequantNf4 } from '../../src/backend/cuda/kernels/quant.js';
import { dequantizeNf4, nf4Words, quantizeNf4 } from '../../src/quant/nf4.js';
import { roundBf16, unpackBf16 } from '../../src/backend/bf16.js';
import { build, cleanUp, skip, workDir } from './emulator.js';
import { rng } from './helpers.js';

after(cleanUp);

test('emulated CUDA: dequant_nf4 equals the format\'s host reference (f32 exactly, bf16 rounded once)', { skip, timeout: 300_000 }, () => {
  const r = rng(5);
  for (const [n, nb, out] of [[1003, 64, 'f32'], [1003, 64, 'bf16'], [4096 + 40, 32, 'bf16']] as const) {
    const x = Float32Array.from({ length: n }, (_, i) => (r() - 0.5) * (i % 97 === 0 ? 3 : 0.05));
    const q = quantizeNf4(x, nb);
    const words = nf4Words(q);
    writeFileSync(join(workDir(), 'codes'), words); writeFileSync(join(workDir(), 'absmax'), q.absmax);
    const block = 64, grid = 3; // grid-stride: 3 blocks of 64 threads cover 192 words per round
    const T = out === 'f32' ? 'float' : 'bf16';
    const exe = build(dequantNf4.make({ out, block, nf4Block: nb }), `int main() { const char* d = "${workDir()}";
  auto codes = readf<unsigned>(d, "codes", ${words.length}); auto absmax = readf<float>(d, "absmax", ${q.absmax.length});
  std::vector<${T}> o(${n});
  launch({${grid}, 1, 1}, ${block}, 0, [&] { dequant_nf4(o.data(), codes.data(), absmax.data(), ${n}LL); });
  writef(d, "out", o); }`);
    execFileSync(exe);
    const b = readFileSync(join(workDir(), 'out'));
    const got = out === 'f32' ? new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length))
      : unpackBf16(new Uint16Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length)));
    const want = dequantizeNf4(q);
    for (let i = 0; i < n; i++) {
      const w = out === 'f32' ? want[i]! : roundBf16(want[i]!);
      assert.equal(got[i], w, `n=${n} block ${nb} ${out}: element ${i}`);
    }
    process.stderr.write(`[dequant-emulated] n=${n} nf4 block ${nb} ${out}: ${n} elements identical to the host reference\n`);
  }
});
