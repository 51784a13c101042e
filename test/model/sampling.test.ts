/**
 * The sampler's repetition penalty and min-p (src/backend/cpu/kernels/sample.ts) against an independent float64
 * transcription of transformers' processors in its generate() order (RepetitionPenaltyLogitsProcessor over the
 * sequence's ids, then TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper): the same kept set
 * and probabilities; greedy decoding takes the penalty too; the seen-token bitmask counts an id once however often it
 * occurs; generation (unbatched, batched on the host and with the backend's sampler) penalizes the prompt's and the
 * generated ids, each step's pick following the full forward's logits.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { seenWords, type SampleParams } from '../../src/backend/backend.js';
import { isSeen, markSeen, sampleDistribution, sampleRow } from '../../src/backend/cpu/kernels/sample.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { Generator, seenOf } from '../../src/model/generate.js';
import { BatchGenerator } from '../../src/model/batch-generate.js';
import { Rng, hashUniform } from '../../src/util/rng.js';

/** transformers' processors on one row, float64: the probabilities generate() samples from (do_sample), or its greedy pick. */
function transformersRule(z: ArrayLike<number>, inputIds: readonly number[], s: SampleParams): { probs: Float64Array | null; greedy: number } {
  const V = z.length, x = Float64Array.from(z);
  const P = s.repetitionPenalty ?? 1;
  if (P !== 1) {
    // gather the ids' scores, penalize, scatter: a repeated id gets the same penalized value, once
    const ids = [...inputIds], got = ids.map((i) => x[i]!);
    ids.forEach((i, k) => { const v = got[k]!; x[i] = v < 0 ? v * P : v / P; });
  }
  let greedy = 0;
  for (let j = 1; j < V; j++) if (x[j]! > x[greedy]!) greedy = j;
  if (!(s.temperature > 0)) return { probs: null, greedy };
  for (let j = 0; j < V; j++) x[j] = x[j]! / s.temperature;
  const softmax = (a: Float64Array): Float64Array => {
    let m = -Infinity; for (const v of a) m = Math.max(m, v);
    const e = a.map((v) => (v === -Infinity ? 0 : Math.exp(v - m))); const t = e.reduce((p, q) => p + q, 0);
    return e.map((v) => v / t);
  };
  if (s.topK > 0) {
    const kth = [...x].sort((a, b) => b - a)[Math.min(s.topK, V) - 1]!;
    for (let j = 0; j < V; j++) if (x[j]! < kth) x[j] = -Infinity;
  }
  if (s.topP < 1) {
    const asc = Array.from({ length: V }, (_, j) => j).sort((a, b) => x[a]! - x[b]!);
    const p = softmax(x);
    let cum = 0;
    const remove: number[] = [];
    asc.forEach((j, i) => { cum += p[j]!; if (cum <= 1 - s.topP && i < V - 1) remove.push(j); });
    for (const j of remove) x[j] = -Infinity;
  }
  if ((s.minP ?? 0) > 0) {
    const p = softmax(x); let top = 0; for (const v of p) top = Math.max(top, v);
    for (let j = 0; j < V; j++) if (p[j]! < s.minP! * top) x[j] = -Infinity;
  }
  return { probs: softmax(x), greedy };
}

function bitmask(ids: readonly number[], V: number): Int32Array {
  const seen = new Int32Array(seenWords(V));
  for (const i of ids) markSeen(seen, 0, i);
  return seen;
}

test('sampling rule: repetition penalty, temperature, top-k, top-p and min-p keep what transformers keeps, with its probabilities', () => {
  const r = new Rng(11), V = 211;
  const settings: SampleParams[] = [
    { temperature: 1, topK: 0, topP: 1, repetitionPenalty: 1.3 },
    { temperature: 0.7, topK: 20, topP: 0.8, repetitionPenalty: 1.05 },
    { temperature: 1, topK: 0, topP: 1, minP: 0.05 },
    { temperature: 0.6, topK: 0, topP: 0.95, minP: 0.2, repetitionPenalty: 1.5 },
    { temperature: 1.3, topK: 50, topP: 1, minP: 0.01, repetitionPenalty: 0.8 }, // a penalty below 1 favours repeats
    { temperature: 2, topK: 0, topP: 0.5, minP: 1 }, // min-p 1: only the most likely token
  ];
  let kept = 0, total = 0;
  for (let row = 0; row < 12; row++) {
    const z = Float64Array.from({ length: V }, () => (r.next() - 0.5) * (row % 2 ? 12 : 4));
    // the sequence so far: ids among the likely and the unlikely, positive and negative logits, some repeated
    const ids = Array.from({ length: 30 }, (_, i) => (i % 3 === 0 ? Math.floor(r.next() * 8) : Math.floor(r.next() * V)));
    const seen = bitmask(ids, V);
    for (const s of settings) {
      const want = transformersRule(z, ids, s).probs!, got = sampleDistribution(z, 0, V, s, seen, 0);
      for (let j = 0; j < V; j++) {
        assert.equal(got[j]! > 0, want[j]! > 0, `row ${row} ${JSON.stringify(s)} token ${j}: kept ${got[j]! > 0}, transformers ${want[j]! > 0}`);
        assert.ok(Math.abs(got[j]! - want[j]!) <= 1e-12, `row ${row} token ${j}: ${got[j]} vs ${want[j]}`);
        if (want[j]! > 0) kept++;
        total++;
      }
      // a draw is the inverse CDF of that distribution in index order
      for (const u of [0, 0.3, 0.77, 0.999999]) {
        let acc = 0, pick = -1;
        for (let j = 0; j < V && pick < 0; j++) { acc += want[j]!; if (want[j]! > 0 && acc > u) pick = j; }
        assert.equal(sampleRow(z, 0, V, s, u, seen, 0), pick, `row ${row} u ${u}`);
      }
      // greedy decoding takes the penalty too (transformers applies processors before argmax)
      const g = { ...s, temperature: 0 };
      assert.equal(sampleRow(z, 0, V, g, 0, seen, 0), transformersRule(z, ids, g).greedy);
    }
  }
  assert.ok(kept > 0.05 * total && kept < 0.9 * total, `the cuts cut: ${kept} of ${total} kept`);
});

test('sampling rule: the penalty counts an id once (a bitmask), needs the bitmask, and refuses bad settings by name', () => {
  const V = 40, z = Float64Array.from({ length: V }, (_, j) => Math.cos(j) * 3);
  const s: SampleParams = { temperature: 1, topK: 0, topP: 1, repetitionPenalty: 2 };
  const once = sampleDistribution(z, 0, V, s, bitmask([3, 9], V), 0);
  const thrice = sampleDistribution(z, 0, V, s, bitmask([3, 3, 3, 9, 9], V), 0);
  assert.deepEqual(thrice, once);
  const seen = bitmask([31, 32, 39], V);
  assert.ok(isSeen(seen, 0, 31) && isSeen(seen, 0, 32) && isSeen(seen, 0, 39) && !isSeen(seen, 0, 30) && !isSeen(seen, 0, 0));
  // only the marked ids move: by 1/2 where positive, ×2 where negative
  const plain = sampleDistribution(z, 0, V, { temperature: 1, topK: 0, topP: 1 });
  const pen = sampleDistribution(z, 0, V, s, seen, 0);
  const ratio = (j: number): number => pen[j]! / plain[j]!;
  for (const j of [0, 5, 17]) assert.ok(Math.abs(ratio(j) - ratio(1)) < 1e-12, 'unmarked ids keep their relative odds');
  assert.ok(Math.abs(Math.log(pen[31]! / pen[1]!) - (z[31]! * (z[31]! < 0 ? 2 : 0.5) - z[1]!)) < 1e-12);
  assert.throws(() => sampleRow(z, 0, V, s, 0.5), /needs the seen-token bitmask/);
  assert.throws(() => sampleRow(z, 0, V, { ...s, repetitionPenalty: 0 }, 0.5, seen), /repetition penalty must be a positive number, got 0/);
  assert.throws(() => sampleRow(z, 0, V, { temperature: 1, topK: 0, topP: 1, minP: 1.5 }, 0.5), /min-p must be in \[0, 1\], got 1\.5/);
  // the backend's sampler marks what it draws (a decode step replayed as a graph keeps the bitmask current)
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const W = seenWords(V);
  const logits = be.alloc(2 * V, 'logits'), u = be.alloc(2, 'uniforms'), out = be.allocInt(2, 'ids'), bits = be.allocInt(2 * W, 'seen');
  const rows = Float64Array.from({ length: 2 * V }, (_, i) => z[i % V]! + (i >= V ? 0.1 * (i - V) : 0));
  const before = new Int32Array(2 * W);
  for (const j of [2, 31, 33]) markSeen(before, 0, j);
  markSeen(before, W, 7);
  be.upload(logits, rows); be.upload(u, [0.25, 0.75]); be.uploadInt(bits, before);
  be.sampleTokens(out, logits, u, 2, V, s, V, bits);
  const drawn = be.downloadInt(out), marks = be.downloadInt(bits), after = be.download(logits);
  for (let b = 0; b < 2; b++) {
    // what the rule draws with the row's seen ids penalized, that id marked besides the ones before
    assert.equal(drawn[b], sampleRow(rows, b * V, V, s, b === 0 ? 0.25 : 0.75, before, b * W));
    for (let j = 0; j < V; j++) {
      assert.equal(isSeen(marks, b * W, j), isSeen(before, b * W, j) || j === drawn[b], `row ${b} id ${j}`);
      // the logits are the step's scratch: the marked ones rewritten in place, the others untouched
      const x = rows[b * V + j]!, want = isSeen(before, b * W, j) ? (x < 0 ? x * 2 : x / 2) : x;
      assert.equal(after[b * V + j], want);
    }
  }
  assert.throws(() => be.sampleTokens(out, logits, u, 2, V, s, V, null), /needs the seen-token bitmask/);
  assert.throws(() => be.sampleTokens(out, logits, u, 2, V, { ...s, repetitionPenalty: -2 }, V, bits), /repetition penalty must be a positive number, got -2/);
  assert.throws(() => be.sampleTokens(out, logits, u, 2, V, { temperature: 1, topK: 0, topP: 1, minP: Number.NaN }, V), /min-p must be in \[0, 1\]/);
  be.dispose();
});

const V = 61;
const C: ModelConfig = {
  architecture: 'qwen2', vocabSize: V, hiddenSize: 24, intermediateSize: 40, numLayers: 2, numHeads: 6, numKvHeads: 2, headDim: 4,
  rope: { type: 'default', theta: 10000 }, rmsNormEps: 1e-6, tieWordEmbeddings: true, maxPositionEmbeddings: 64, qkvBias: true, qkNorm: false, noRopeLayers: [],
};

test('generation with a repetition penalty and min-p: each pick follows the full forward\'s logits with the sequence\'s ids penalized (unbatched, batched, backend sampler)', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const m = new Transformer(be, C, { batch: 1, seq: 32, training: false });
  m.setWeights(initialWeights(parameterLayout(C), C, new Rng(8), 1.5)); // peaked logits: greedy decoding repeats itself
  const prompts = [[5, 6, 5], [1, 2, 3, 4, 5, 6, 7, 8], [40]];
  const full = new Transformer(be, C, { batch: 1, seq: 32, training: false });
  full.setWeights(m.getWeights());
  const logitsAfter = (seq: number[]): Float64Array => {
    const z = be.download(full.forward(Int32Array.from(seq), 1, seq.length));
    return Float64Array.from(z.subarray((seq.length - 1) * V, seq.length * V));
  };
  const plain = new Generator(m, 24).generate(prompts[0]!, { temperature: 0, topP: 1, maxNewTokens: 12 });
  const greedy = { temperature: 0, topP: 1, topK: 0, maxNewTokens: 12, repetitionPenalty: 1.8 };
  const solo = new Generator(m, 24), batch = new BatchGenerator(m, prompts.length, 24);
  const host = batch.generate(prompts, greedy), device = batch.generateOnDevice(prompts, greedy);
  prompts.forEach((p, b) => {
    const alone = solo.generate(p, greedy);
    assert.deepEqual(host.tokens[b], alone, `sequence ${b}: batched on the host`);
    assert.deepEqual(device.tokens[b], alone, `sequence ${b}: the backend's sampler`);
    const seq = [...p];
    for (const id of alone) {
      assert.equal(id, transformersRule(logitsAfter(seq), seq, greedy).greedy, `sequence ${b} after ${seq.length} tokens`);
      seq.push(id);
    }
  });
  assert.notDeepEqual(solo.generate(prompts[0]!, greedy), plain, 'the penalty changes greedy decoding here');
  assert.ok(new Set(plain).size < plain.length, 'unpenalized greedy decoding repeats an id here');
  // sampled, with min-p: the backend sampler's draws are the rule's on the full forward's logits, the seen ids penalized
  const sampled = { temperature: 0.9, topP: 0.95, topK: 30, minP: 0.1, repetitionPenalty: 1.4, maxNewTokens: 10, seed: 4 };
  const r = batch.generateOnDevice(prompts, sampled);
  prompts.forEach((p, b) => {
    const seq = [...p];
    r.tokens[b]!.forEach((id, step) => {
      const seen = seenOf([seq], V, sampled)!;
      assert.equal(id, sampleRow(logitsAfter(seq), 0, V, sampled, hashUniform(4, b, step, 0), seen, 0), `sequence ${b} step ${step}`);
      const p0 = sampleDistribution(logitsAfter(seq), 0, V, sampled, seen, 0);
      assert.ok(p0[id]! > 0, 'a kept token');
      seq.push(id);
    });
  });
  be.dispose();
});
