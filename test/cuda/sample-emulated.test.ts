/**
 * OPT-IN (DISTILLERY_EMULATE_CUDA=1, g++): the GENERATED sample_tokens kernel (src/backend/cuda/kernels/sample.ts)
 * compiled for the host on the emulator of ./emulator.ts against the CPU backend's float64 sampler on the same logits and
 * uniforms: greedy (first argmax, also on a flat row), temperature alone, top-k (ties at the cut), top-p, both, and
 * uniforms at the ends of [0, 1), over a vocabulary that is not a multiple of the block; and with a repetition penalty
 * over each row's seen-token bitmask (greedy and sampled) and min-p, the drawn id marked in the bitmask.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { sampleTokensKernel } from '../../src/backend/cuda/kernels/sample.js';
import { isSeen, markSeen, sampleRow } from '../../src/backend/cpu/kernels/sample.js';
import { seenWords } from '../../src/backend/backend.js';
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
  launch({${n}, 1, 1}, 128, 0, [&] { sample_tokens(out.data(), z.data(), u.data(), ${n}, ${V}, ${LD}, T, K, P, nullptr, 0, 1.0f, 0.0f); });
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

test('emulated CUDA: sample_tokens with a repetition penalty and min-p draws what the float64 sampler draws and marks the draw', { skip, timeout: 300_000 }, () => {
  const r = rng(34), W = seenWords(V);
  // continuous logits (a penalized value exactly tying another differs between float32 and float64 division)
  const z = Float32Array.from({ length: n * LD }, (_, i) => (r() - 0.5) * ((i / LD | 0) % 2 ? 16 : 5));
  const seen = new Int32Array(n * W);
  for (let i = 0; i < n; i++) for (let k = 0; k < 40; k++) markSeen(seen, i * W, k % 4 === 0 ? Math.floor(r() * 12) : Math.floor(r() * V));
  markSeen(seen, 3 * W, V - 1); markSeen(seen, 3 * W, 0); // the ends of the row
  const u = Float32Array.from({ length: n }, () => r());
  writeFileSync(join(workDir(), 'zp'), z); writeFileSync(join(workDir(), 'up'), u); writeFileSync(join(workDir(), 'seen'), seen);
  const exe = build(sampleTokensKernel.make({ block: 128 }), `int main(int argc, char** argv) { const char* d = "${workDir()}";
  const float T = atof(argv[1]); const int K = atoi(argv[2]); const float P = atof(argv[3]); const float R = atof(argv[4]); const float MP = atof(argv[5]);
  auto z = readf<float>(d, "zp", ${n * LD}); auto u = readf<float>(d, "up", ${n}); auto seen = readf<unsigned>(d, "seen", ${n * W});
  std::vector<int> out(${n}, -7);
  launch({${n}, 1, 1}, 128, 0, [&] { sample_tokens(out.data(), z.data(), u.data(), ${n}, ${V}, ${LD}, T, K, P, seen.data(), ${W}, R, MP); });
  writef(d, "out", out); writef(d, "seenout", seen); }`);
  let agree = 0, total = 0;
  for (const s of [
    { temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1.7, minP: 0 }, { temperature: 1, topK: 0, topP: 1, repetitionPenalty: 1.3, minP: 0 },
    { temperature: 0.7, topK: 40, topP: 0.9, repetitionPenalty: 1.1, minP: 0.05 }, { temperature: 1.5, topK: 0, topP: 1, repetitionPenalty: 0.7, minP: 0.3 },
    { temperature: 1, topK: 0, topP: 0.6, repetitionPenalty: 1, minP: 0.02 },
  ]) {
    execFileSync(exe, [s.temperature, s.topK, s.topP, s.repetitionPenalty, s.minP].map(String));
    const b = readFileSync(join(workDir(), 'out')), out = new Int32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
    const sb = readFileSync(join(workDir(), 'seenout')), after = new Int32Array(sb.buffer.slice(sb.byteOffset, sb.byteOffset + sb.length));
    for (let i = 0; i < n; i++) {
      const want = sampleRow(z, i * LD, V, s, u[i]!, seen, i * W);
      total++;
      if (out[i] === want) agree++;
      else process.stderr.write(`[sample-emulated] ${JSON.stringify(s)} row ${i}: kernel ${out[i]}, reference ${want}\n`);
      for (let j = 0; j < V; j++) assert.equal(isSeen(after, i * W, j), isSeen(seen, i * W, j) || j === out[i], `row ${i} id ${j} marked`);
    }
  }
  process.stderr.write(`[sample-emulated] penalty/min-p: ${agree} of ${total} draws equal the float64 sampler\n`);
  assert.equal(agree, total);
});

test('emulated CUDA: sample_tokens clean up', { skip }, () => { cleanUp(); });
