/**
 * OPT-IN (DISTILLERY_EMULATE_CUDA=1, g++): the generation kernels with per-sequence start positions (batched generation
 * of prompts of different lengths: rope_fwd, kv_cache_write, attention_cached and attention_cached_gqa with `seqPos`) compiled for the host on
 * the emulator of ./emulator.ts and compared with the CPU backend in float64 on the same inputs (the CPU's per-sequence
 * ops equal its scalar ops sequence by sequence: test/model/batch-generate.test.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ropeKernel } from '../../src/backend/cuda/kernels/rope.js';
import { attentionCached, attentionCachedGqa, cachedAttentionBlock, cachedAttentionPlan, kvCacheWrite } from '../../src/backend/cuda/kernels/attention-cached.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { build, cleanUp, skip, workDir } from './emulator.js';
import { rng } from './helpers.js';

const B = 3, t = 1, H = 6, KV = 2, HD = 64, tMax = 20, POS = [0, 7, 19];
/** The per-sequence test's attention_cached_gqa splits its rows over 3 blocks (a sequence at position 0 leaves two empty). */
const SPLITS = 3;

function readF32(name: string): Float32Array {
  const b = readFileSync(join(workDir(), name));
  return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
}

/** The largest difference of `got` from the CPU backend's cached attention (float64) over the same inputs, B sequences at pos0. */
function cpuError(got: Float32Array, q: Float32Array, kc: Float32Array, vc: Float32Array, t: number, pos0: number, tm: number,
  h: number, kv: number, hd: number): number {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const up = (a: Float32Array): ReturnType<typeof be.alloc> => { const x = be.alloc(a.length, 'x'); be.upload(x, a); return x; };
  const OUT = be.alloc(q.length, 'out');
  be.attentionCached(OUT, up(q), up(kc), up(vc), B, t, pos0, tm, h, kv, hd);
  const want = be.download(OUT);
  be.dispose();
  let e = 0;
  for (let k = 0; k < got.length; k++) e = Math.max(e, Math.abs(got[k]! - want[k]!));
  return e;
}

test('emulated CUDA: rope, KV cache write and cached attention at per-sequence positions equal the CPU backend', { skip, timeout: 300_000 }, () => {
  const r = rng(4);
  const q = Float32Array.from({ length: B * t * H * HD }, () => r() - 0.5);
  const kv = Float32Array.from({ length: B * t * KV * HD }, () => r() - 0.5);
  const kc = Float32Array.from({ length: B * tMax * KV * HD }, () => r() - 0.5);
  const vc = Float32Array.from({ length: B * tMax * KV * HD }, () => r() - 0.5);
  const pos = Int32Array.from(POS);
  for (const [f, a] of [['q', q], ['kv', kv], ['kc', kc], ['vc', vc], ['pos', pos]] as const) writeFileSync(join(workDir(), f), a);
  const rope = { type: 'llama3', theta: 500000, factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 16 } as const;
  const rk = ropeKernel(false, rope, HD, 128, { out: 'f32', inp: 'f32', seqPos: true });
  const exeRope = build(rk, `int main() { const char* d = "${workDir()}";
  auto q = readf<float>(d, "q", ${q.length}); auto pos = readf<int>(d, "pos", ${B});
  launch({4, 1, 1}, 128, 0, [&] { ${rk.family}(q.data(), q.data(), ${B * t}LL, ${t}, ${H}, 0, ${H * HD}LL, ${H * HD}LL, nullptr, pos.data()); });
  writef(d, "q_rot", q); }`);
  execFileSync(exeRope);
  const kw = kvCacheWrite.make({ block: 128, cache: 'f32', src: 'f32', seqPos: true });
  const exeKv = build(kw, `int main() { const char* d = "${workDir()}";
  auto kv = readf<float>(d, "kv", ${kv.length}); auto kc = readf<float>(d, "kc", ${kc.length}); auto pos = readf<int>(d, "pos", ${B});
  launch({2, 1, 1}, 128, 0, [&] { kv_cache_write(kc.data(), kv.data(), ${B}, ${t}, 0, ${tMax}, ${KV * HD}, pos.data()); });
  writef(d, "kc_out", kc); }`);
  execFileSync(exeKv);
  // both cached attentions: a block per query head (attention_cached), and per KV head for the group, split (attention_cached_gqa)
  const acBlock = cachedAttentionBlock(HD);
  const ac = attentionCached.make({ headDim: HD, block: acBlock, out: 'f32', q: 'f32', kc: 'f32', vc: 'f32', seqPos: true });
  const exeAtt = build(ac, `int main() { const char* d = "${workDir()}";
  auto q = readf<float>(d, "q_rot", ${q.length}); auto kc = readf<float>(d, "kc_out", ${kc.length}); auto vc = readf<float>(d, "vc", ${vc.length});
  auto pos = readf<int>(d, "pos", ${B}); std::vector<float> out(${q.length});
  launch({${t}, ${H}, ${B}}, ${acBlock}, 0, [&] { attention_cached(out.data(), q.data(), kc.data(), vc.data(), ${t}, 0, ${tMax}, ${H}, ${KV}, pos.data()); });
  writef(d, "att", out); }`);
  execFileSync(exeAtt);
  const gPlan = cachedAttentionPlan(HD, H / KV, true);
  const gq = attentionCachedGqa.make({ headDim: HD, group: H / KV, ...gPlan, out: 'f32', q: 'f32', kc: 'f32', vc: 'f32', seqPos: true });
  const exeGqa = build(gq, `int main() { const char* d = "${workDir()}";
  auto q = readf<float>(d, "q_rot", ${q.length}); auto kc = readf<float>(d, "kc_out", ${kc.length}); auto vc = readf<float>(d, "vc", ${vc.length});
  auto pos = readf<int>(d, "pos", ${B}); std::vector<float> out(${q.length});
  std::vector<float> part(CACHED_COUNTERS + ${B * t * H * SPLITS * (HD + 2)}, 0.0f);
  launch({${t * SPLITS}, ${KV}, ${B}}, ${gPlan.block}, 0, [&] { attention_cached_gqa(out.data(), q.data(), kc.data(), vc.data(), ${t}, 0, ${tMax}, ${H}, ${KV}, part.data(), ${SPLITS}, pos.data()); });
  writef(d, "att_gqa", out); }`);
  execFileSync(exeGqa);
  // The CPU backend, float64, the same inputs.
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const up = (a: Float32Array): ReturnType<typeof be.alloc> => { const x = be.alloc(a.length, 'x'); be.upload(x, a); return x; };
  const seqPositions = be.allocInt(B, 'pos'); be.uploadInt(seqPositions, pos);
  const Q = up(q), KC = up(kc), VC = up(vc), OUT = be.alloc(q.length, 'out');
  be.ropeForward(Q, Q, B, t, H, HD, rope, { seqPositions });
  be.kvCacheWrite(KC, up(kv), B, t, { seqPositions }, tMax, KV, HD);
  be.attentionCached(OUT, Q, KC, VC, B, t, { seqPositions }, tMax, H, KV, HD);
  const err = (a: ArrayLike<number>, b: ArrayLike<number>): number => { let e = 0; for (let i = 0; i < a.length; i++) e = Math.max(e, Math.abs(a[i]! - b[i]!)); return e; };
  const eRope = err(readF32('q_rot'), be.download(Q)), eKv = err(readF32('kc_out'), be.download(KC)), eAtt = err(readF32('att'), be.download(OUT));
  const eGqa = err(readF32('att_gqa'), be.download(OUT));
  process.stderr.write(`[seqpos-emulated] rope ${eRope.toExponential(2)} kv ${eKv.toExponential(2)} attention ${eAtt.toExponential(2)} gqa ${eGqa.toExponential(2)}\n`);
  assert.ok(eRope <= 1e-6, `rope ${eRope}`);
  assert.equal(eKv, 0, 'the cache write is a copy');
  assert.ok(eAtt <= 1e-5, `attention ${eAtt}`);
  assert.ok(eGqa <= 1e-5, `attention over the group, split ${SPLITS} ways: ${eGqa}`);
  be.dispose();
});

test('emulated CUDA: cached attention a block per query head (attention_cached) of several queries (a prefill at pos0) equals the CPU backend, at head dims that fill the lanes and that do not, with the backend\'s block and with 4 warps', { skip, timeout: 600_000 }, () => {
  // fewer rows than warps, rows ending inside a round of UN rows a warp, several rounds, a long cache
  for (const [hd, t2, pos0, tm, block] of [[80, 5, 3, 12, 0], [128, 3, 0, 40, 0], [64, 2, 37, 40, 0], [64, 2, 150, 160, 0], [64, 3, 70, 80, 128], [96, 2, 9, 16, 128]] as const) {
    const bl = block || cachedAttentionBlock(hd);
    const r = rng(hd);
    const q = Float32Array.from({ length: B * t2 * H * hd }, () => r() - 0.5);
    const kc = Float32Array.from({ length: B * tm * KV * hd }, () => 2 * (r() - 0.5));
    const vc = Float32Array.from({ length: B * tm * KV * hd }, () => r() - 0.5);
    for (const [f, a] of [['q2', q], ['kc2', kc], ['vc2', vc]] as const) writeFileSync(join(workDir(), f), a);
    const ac = attentionCached.make({ headDim: hd, block: bl, out: 'f32', q: 'f32', kc: 'f32', vc: 'f32', seqPos: false });
    const exe = build(ac, `int main() { const char* d = "${workDir()}";
    auto q = readf<float>(d, "q2", ${q.length}); auto kc = readf<float>(d, "kc2", ${kc.length}); auto vc = readf<float>(d, "vc2", ${vc.length});
    std::vector<float> out(${q.length});
    launch({${t2}, ${H}, ${B}}, ${bl}, 0, [&] { attention_cached(out.data(), q.data(), kc.data(), vc.data(), ${t2}, ${pos0}, ${tm}, ${H}, ${KV}); });
    writef(d, "att2", out); }`);
    execFileSync(exe);
    const e = cpuError(readF32('att2'), q, kc, vc, t2, pos0, tm, H, KV, hd);
    process.stderr.write(`[seqpos-emulated] cached attention hd ${hd} t ${t2} pos0 ${pos0} block ${bl}: ${e.toExponential(2)}\n`);
    assert.ok(e <= 1e-5, `hd ${hd}: ${e}`);
  }
});

test('emulated CUDA: cached attention over the GQA group (attention_cached_gqa) of several queries (a prefill at pos0) equals the CPU backend, over groups, head dims that fill a row slot and that do not, 8-element and 1-element loads, the plan\'s block and 2 warps', { skip, timeout: 600_000 }, () => {
  // [hd, t, pos0, tMax, heads, kv heads, 16-byte aligned, block (0: the plan's)]: fewer rows than row slots, rows ending
  // inside a round, several rounds, a long cache; groups of 7 (Qwen2.5-0.5B), 3, 2 and 1 (MHA); a head dim of 36 (no
  // 8-element loads), 80 (slots of 16 lanes, 10 busy) and 96
  // The split column splits each query row's cache rows over that many blocks (partials merged by the last block; splits
  // past the row's length are empty); block and un 0 take the plan's.
  const cases: Array<[number, number, number, number, number, number, boolean, number, number, number]> = [
    [80, 5, 3, 12, 6, 2, true, 0, 0, 1], [128, 3, 0, 40, 4, 2, true, 0, 0, 1], [64, 2, 37, 40, 14, 2, true, 0, 0, 1], [64, 2, 150, 160, 6, 2, true, 0, 1, 1],
    [64, 3, 70, 80, 2, 2, true, 64, 2, 1], [96, 2, 9, 16, 6, 2, true, 64, 0, 1], [36, 2, 20, 24, 6, 2, false, 0, 0, 1], [64, 1, 50, 51, 6, 2, false, 0, 2, 1],
    [64, 1, 150, 160, 14, 2, true, 0, 0, 6], [128, 3, 2, 40, 4, 2, true, 64, 1, 4], [80, 2, 20, 24, 6, 2, false, 0, 0, 16],
  ];
  for (const [hd, t2, pos0, tm, h2, kv2, aligned, block, un, splits] of cases) {
    const plan = { ...cachedAttentionPlan(hd, h2 / kv2, aligned), ...(block ? { block } : {}), ...(un ? { un } : {}) };
    const r = rng(hd + h2);
    const q = Float32Array.from({ length: B * t2 * h2 * hd }, () => r() - 0.5);
    const kc = Float32Array.from({ length: B * tm * kv2 * hd }, () => 2 * (r() - 0.5));
    const vc = Float32Array.from({ length: B * tm * kv2 * hd }, () => r() - 0.5);
    for (const [f, a] of [['q2', q], ['kc2', kc], ['vc2', vc]] as const) writeFileSync(join(workDir(), f), a);
    const ac = attentionCachedGqa.make({ headDim: hd, group: h2 / kv2, ...plan, out: 'f32', q: 'f32', kc: 'f32', vc: 'f32', seqPos: false });
    const exe = build(ac, `int main() { const char* d = "${workDir()}";
    auto q = readf<float>(d, "q2", ${q.length}); auto kc = readf<float>(d, "kc2", ${kc.length}); auto vc = readf<float>(d, "vc2", ${vc.length});
    std::vector<float> out(${q.length}), part(CACHED_COUNTERS + ${B * t2 * h2 * splits * (hd + 2)}, 0.0f);
    launch({${t2 * splits}, ${kv2}, ${B}}, ${plan.block}, 0, [&] { attention_cached_gqa(out.data(), q.data(), kc.data(), vc.data(), ${t2}, ${pos0}, ${tm}, ${h2}, ${kv2}, part.data(), ${splits}); });
    writef(d, "att2", out); part.resize(CACHED_COUNTERS); writef(d, "cnt2", part); }`);
    execFileSync(exe);
    const cnt = new Int32Array(readF32('cnt2').buffer);
    assert.ok(cnt.every((c) => c === 0), 'the counters are back at zero for the next call');
    const e = cpuError(readF32('att2'), q, kc, vc, t2, pos0, tm, h2, kv2, hd);
    process.stderr.write(`[seqpos-emulated] cached attention hd ${hd} t ${t2} pos0 ${pos0} heads ${h2}/${kv2} vec ${plan.vec} un ${plan.un} block ${plan.block} splits ${splits}: ${e.toExponential(2)}\n`);
    assert.ok(e <= 1e-5, `hd ${hd} heads ${h2}/${kv2}: ${e}`);
  }
});

test('emulated CUDA: seqpos clean up', { skip }, () => { cleanUp(); });
