/**
 * OPT-IN (DISTILLERY_EMULATE_CUDA=1, g++): the GENERATED sample_tokens kernel (src/backend/cuda/kernels/sample.ts)
 * compiled for the host on the emulator of ./emulator.ts against the CPU backend's float64 sampler on the same logits and
 * uniforms: greedy (first argmax, also on a flat row), temperature alone, top-k (ties at the cut), top-p, both, and
 * uniforms at the ends of [0, 1), over a vocabulary that is not a multiple of the block.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { sampleTokensKernel } from '../../src/backend/cuda/kernels/sample.js';
import { sampleRow } from '../../src/backend/cpu/kernels/sample.js';
import { build, cleanUp, skip, workDir } from './emulator.js';
import { rng } from './helpers.js';

const n = 16, V = 700, LD = 704;

test('emulated CUDA: sample_tokens draws what the float64 sampler draws (greedy, temperature, top-k, top-p)', { skip, timeout: 300_000 }, () => {
  const r = rng(33);
  const z = new Float32Array(n * LD);
  for (let i = 0; i < n; i++) for (let j = 0; j < LD; j++) z[i * LD + j] = Math.round((r() - 0.5) * (i % 3 === 0 ? 40 : 8) * 8) / 8; // coarse: ties
  z.fill(0.5, 2 * LD, 3 * LD); // a flat row
  const u = Float32Array.from({ length: n }, (_, i) => (i === 4 ? 0 : i === 5 ? 0.99999994 : r()));
  writeFileSync(join(workDir(), 'z'), z); writeFileSync(join(workDir(), 'u'), u);
  const exe = build(sampleTokensKernel.make({ block: 128 }), `int main(int argc, char** argv) { const char* d = "${workDir()}";
  const float T = atof(argv[1]); const int K = atoi(argv[2]); const float P = atof(argv[3]);
  auto z = readf<float>(d, "z", ${n * LD}); auto u = readf<float>(d, "u", ${n});
  std::vector<int> out(${n}, -7);
  launch({${n}, 1, 1}, 128, 0, [&] { sample_tokens(out.data(), z.data(), u.data(), ${n}, ${V}, ${LD}, T, K, P); });
  writef(d, "out", out); }`);
  let agree = 0, total = 0;
  for (const s of [
    { temperature: 0, topK: 0, topP: 1 }, { temperature: 1, topK: 0, topP: 1 }, { temperature: 0.7, topK: 5, topP: 1 },
    { temperature: 1.3, topK: 0, topP: 0.8 }, { temperature: 1, topK: 50, topP: 0.9 }, { temperature: 2, topK: 1, topP: 1 },
  ]) {
    execFileSync(exe, [String(s.temperature), String(s.topK), String(s.topP)]);
    const b = readFileSync(join(workDir(), 'out')), out = new Int32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
    for (let i = 0; i < n; i++) {
      const want = sampleRow(z, i * LD, V, s, u[i]!);
      total++;
      if (out[i] === want) agree++;
      else process.stderr.write(`[sample-emulated] ${JSON.stringify(s)} row ${i}: kernel ${out[i]}, reference ${want}\n`);
      assert.ok(out[i]! >= 0 && out[i]! < V, `a token id: ${out[i]}`);
    }
  }
  process.stderr.write(`[sample-emulated] ${agree} of ${total} draws equal the float64 sampler\n`);
  assert.equal(agree, total);
});

test('emulated CUDA: sample_tokens clean up', { skip }, () => { cleanUp(); });
