/**
 * Batched generation (src/model/batch-generate.ts) against the unbatched Generator and the full forward, on the CPU
 * backend in float64: prompts of different lengths in one batch give, token for token, what each prompt gives alone
 * (greedy; sampled with the per-sequence seeds; stop tokens per sequence), and every step's logits are the full
 * forward's logits of the sequence so far at its last position — for plain, llama3 and yarn RoPE, GQA, Qwen3's q/k norms
 * and SmolLM3's NoPE layers. Also the per-sequence positions of the generation ops themselves, against the scalar ones.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { MAX_DECODE_SEQUENCES, type Backend, type Readback } from '../../src/backend/backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { Generator } from '../../src/model/generate.js';
import { BatchGenerator, seedOf } from '../../src/model/batch-generate.js';
import { Rng, hashUniform } from '../../src/util/rng.js';
import { sampleRow } from '../../src/backend/cpu/kernels/sample.js';
import { assertClose, randn } from '../backend/helpers.js';

const V = 97;
function cfg(over: Partial<ModelConfig> = {}): ModelConfig {
  return {
    architecture: 'qwen2', vocabSize: V, hiddenSize: 24, intermediateSize: 40, numLayers: 2, numHeads: 6, numKvHeads: 2, headDim: 4,
    rope: { type: 'default', theta: 10000 }, rmsNormEps: 1e-6, tieWordEmbeddings: false, maxPositionEmbeddings: 64, qkvBias: true, qkNorm: false,
    noRopeLayers: [], ...over,
  };
}
const CONFIGS: Array<[string, ModelConfig]> = [
  ['qwen2', cfg()],
  ['llama3 rope, tied', cfg({ architecture: 'llama', qkvBias: false, tieWordEmbeddings: true,
    rope: { type: 'llama3', theta: 500000, factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 16 } })],
  ['qwen3 q/k norms, yarn', cfg({ architecture: 'qwen3', qkvBias: false, qkNorm: true,
    rope: { type: 'yarn', theta: 1e6, factor: 4, originalMaxPositionEmbeddings: 16, betaFast: 32, betaSlow: 1, attentionFactor: 1.2, truncate: true } })],
  ['smollm3 NoPE layer', cfg({ architecture: 'smollm3', qkvBias: false, noRopeLayers: [1] })],
];

function model(be: Backend, c: ModelConfig, seed: number): Transformer {
  const m = new Transformer(be, c, { batch: 1, seq: 32, training: false });
  m.setWeights(initialWeights(parameterLayout(c), c, new Rng(seed), 0.5));
  return m;
}

const PROMPTS = [[5], [1, 2, 3, 4, 5, 6, 7, 8, 9], [40, 41, 42], [7, 7, 7, 7, 7]];

for (const [name, c] of CONFIGS) {
  test(`batched generation (${name}): each sequence equals its unbatched generation and the full forward's logits`, () => {
    const be = createCpuBackend({ dtype: 'f64', threads: 1 });
    const m = model(be, c, 3);
    const full = new Transformer(be, c, { batch: 1, seq: 32, training: false });
    full.setWeights(m.getWeights());
    const g = new BatchGenerator(m, PROMPTS.length, 24);
    // Greedy, with a stop id that ends sequence 0 early.
    const solo = new Generator(m, 24);
    const first = solo.generate(PROMPTS[0]!, { temperature: 0, topP: 1, maxNewTokens: 10 });
    const stopIds = [first[3]!];
    const batched = g.generate(PROMPTS, { temperature: 0, topP: 1, maxNewTokens: 10, stopIds });
    PROMPTS.forEach((p, b) => {
      const alone = solo.generate(p, { temperature: 0, topP: 1, maxNewTokens: 10, stopIds });
      assert.deepEqual(batched.tokens[b], alone, `sequence ${b}`);
      assert.equal(batched.finish[b], alone.length < 10 ? 'stop' : 'length');
    });
    assert.equal(batched.finish[0], 'stop');
    // Sampled: sequence b draws with seedOf(seed, b).
    const sampled = g.generate(PROMPTS, { temperature: 1.3, topP: 0.9, maxNewTokens: 8, seed: 11 });
    PROMPTS.forEach((p, b) => assert.deepEqual(sampled.tokens[b], solo.generate(p, { temperature: 1.3, topP: 0.9, maxNewTokens: 8, seed: seedOf(11, b) }), `sampled ${b}`));
    // Logits: prefill and two decode steps against the full forward of each sequence so far.
    const seqs = PROMPTS.map((p) => [...p]);
    let logits = g.prefill(PROMPTS);
    for (let step = 0; step < 3; step++) {
      seqs.forEach((s, b) => {
        const z = be.download(full.forward(Int32Array.from(s), 1, s.length));
        assertClose(logits.subarray(b * V, (b + 1) * V), z.subarray((s.length - 1) * V, s.length * V), 1e-9, 1e-10, `${name} step ${step} sequence ${b}`);
      });
      const next = Int32Array.from(seqs, (s, b) => (s.length * 13 + b) % V);
      seqs.forEach((s, b) => s.push(next[b]!));
      logits = g.decode(next);
    }
    be.dispose();
  });
}

test('generation ops with per-sequence positions equal the scalar ops run sequence by sequence (rope, KV cache write, cached attention)', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const rng = new Rng(9);
  const B = 3, t = 2, H = 4, KV = 2, hd = 8, tMax = 12, pos = [0, 5, 9];
  const rope = { type: 'default', theta: 10000 } as const;
  const seqPositions = be.allocInt(B, 'positions'); be.uploadInt(seqPositions, Int32Array.from(pos));
  const x = randn(rng, B * t * H * hd), kv = randn(rng, B * t * KV * hd), cache0 = randn(rng, B * tMax * KV * hd), vcache0 = randn(rng, B * tMax * KV * hd);
  const buf = (a: ArrayLike<number>): ReturnType<Backend['alloc']> => { const b = be.alloc(a.length, 'x'); be.upload(b, a); return b; };
  // per-sequence
  const xr = buf(x), kc = buf(cache0), vc = buf(vcache0), out = be.alloc(B * t * H * hd, 'out');
  be.ropeForward(xr, xr, B, t, H, hd, rope, { seqPositions });
  be.kvCacheWrite(kc, buf(kv), B, t, { seqPositions }, tMax, KV, hd);
  be.kvCacheWrite(vc, buf(kv.map((v) => -v)), B, t, { seqPositions }, tMax, KV, hd);
  be.attentionCached(out, xr, kc, vc, B, t, { seqPositions }, tMax, H, KV, hd);
  // scalar, one sequence at a time
  for (let b = 0; b < B; b++) {
    const xs = buf(x.subarray(b * t * H * hd, (b + 1) * t * H * hd));
    const kcs = buf(cache0.subarray(b * tMax * KV * hd, (b + 1) * tMax * KV * hd)), vcs = buf(vcache0.subarray(b * tMax * KV * hd, (b + 1) * tMax * KV * hd));
    const os = be.alloc(t * H * hd, 'o');
    be.ropeForward(xs, xs, 1, t, H, hd, rope, pos[b]!);
    be.kvCacheWrite(kcs, buf(kv.subarray(b * t * KV * hd, (b + 1) * t * KV * hd)), 1, t, pos[b]!, tMax, KV, hd);
    be.kvCacheWrite(vcs, buf(kv.subarray(b * t * KV * hd, (b + 1) * t * KV * hd).map((v) => -v)), 1, t, pos[b]!, tMax, KV, hd);
    be.attentionCached(os, xs, kcs, vcs, 1, t, pos[b]!, tMax, H, KV, hd);
    assert.deepEqual([...be.download(be.view(xr, b * t * H * hd, t * H * hd))], [...be.download(xs)], `rope ${b}`);
    assert.deepEqual([...be.download(be.view(kc, b * tMax * KV * hd, tMax * KV * hd))], [...be.download(kcs)], `k cache ${b}`);
    assert.deepEqual([...be.download(be.view(out, b * t * H * hd, t * H * hd))], [...be.download(os)], `attention ${b}`);
  }
  be.dispose();
});

test('batched generation with device sampling: greedy equals host greedy; sampled draws follow the full forward and do not depend on the batch', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const c = CONFIGS[0]![1];
  const m = model(be, c, 5);
  const full = new Transformer(be, c, { batch: 1, seq: 32, training: false });
  full.setWeights(m.getWeights());
  const g = new BatchGenerator(m, PROMPTS.length, 24);
  const greedyHost = g.generate(PROMPTS, { temperature: 0, topP: 1, maxNewTokens: 6 });
  assert.deepEqual(g.generateOnDevice(PROMPTS, { temperature: 0, topP: 1, maxNewTokens: 6 }).tokens, greedyHost.tokens);
  const opts = { temperature: 1.1, topP: 0.9, topK: 20, maxNewTokens: 7, seed: 99 };
  const batched = g.generateOnDevice(PROMPTS, opts);
  const one = new BatchGenerator(m, 1, 24);
  PROMPTS.forEach((p, b) => {
    assert.deepEqual(one.generateOnDevice([p], { ...opts, sequence0: b }).tokens[0], batched.tokens[b], `sequence ${b} alone`);
    // each draw is the sampler's pick from the full forward's logits with the sequence's uniform for that step
    const seq = [...p];
    batched.tokens[b]!.forEach((id, step) => {
      const z = be.download(full.forward(Int32Array.from(seq), 1, seq.length));
      assert.equal(id, sampleRow(z, (seq.length - 1) * V, V, opts, hashUniform(99, b, step, 0)), `sequence ${b} step ${step}`);
      seq.push(id);
    });
  });
  // the draws vary with the seed
  assert.notDeepEqual(g.generateOnDevice(PROMPTS, { ...opts, seed: 100 }).tokens, batched.tokens);
  // each sequence's own stop ids (generate --prompts: a text prompt beside a conversation): sequence 0 stops at its
  // third token, the others run on as they would alone
  const stopAt = batched.tokens[0]![2]!;
  const rows = PROMPTS.map((_, b) => (b === 0 ? [stopAt] : []));
  const own = g.generateOnDevice(PROMPTS, { ...opts, rowStopIds: rows });
  assert.deepEqual(own.tokens[0], batched.tokens[0]!.slice(0, batched.tokens[0]!.indexOf(stopAt)));
  assert.equal(own.finish[0], 'stop'); assert.equal(own.stops[0], stopAt);
  PROMPTS.forEach((_, b) => { if (b > 0) assert.deepEqual(own.tokens[b], batched.tokens[b], `sequence ${b} ignores sequence 0's stop ids`); });
  be.dispose();
});

test('generation draws only the tokenizer\'s ids (SamplingOptions.vocab): embedding rows past it are padding, never sampled', () => {
  // A checkpoint's vocab_size often exceeds its tokenizer (Qwen: 151936 rows, 151669 tokens). Those rows' logits are not
  // −∞; on a 1.5B→0.5B on-policy run on the H100 the random-init student drew one and the step failed. Here the padding
  // rows' LM-head weights are scaled up so an unrestricted sampler prefers them.
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const c = CONFIGS[0]![1], real = 90, C = c.hiddenSize;
  const lay = parameterLayout(c);
  const w = initialWeights(lay, c, new Rng(8), 0.5);
  for (let i = real * C; i < V * C; i++) w[lay.lmHead!.offset + i]! *= 1000;
  const m = new Transformer(be, c, { batch: 1, seq: 32, training: false });
  m.setWeights(w);
  const g = new BatchGenerator(m, PROMPTS.length, 24), solo = new Generator(m, 24);
  const pad = (ids: number[][]): boolean => ids.some((s) => s.some((id) => id >= real));
  const opts = { temperature: 1, topP: 1, topK: 0, maxNewTokens: 6, seed: 3 };
  // unrestricted (the old behaviour), every path draws padding ids
  assert.ok(pad(g.generateOnDevice(PROMPTS, opts).tokens) && pad(g.generate(PROMPTS, opts).tokens) && pad([solo.generate(PROMPTS[1]!, opts)]));
  // restricted: device and host sampling, batched and alone, stay below it — and greedy is the argmax of the real rows
  for (const o of [opts, { ...opts, temperature: 0 }, { ...opts, topK: 5, topP: 0.8 }]) {
    const r = { ...o, vocab: real };
    assert.ok(!pad(g.generateOnDevice(PROMPTS, r).tokens) && !pad(g.generate(PROMPTS, r).tokens), JSON.stringify(o));
    assert.ok(!pad(PROMPTS.map((p) => solo.generate(p, r))), JSON.stringify(o));
  }
  const z = g.prefill(PROMPTS);
  const greedy = g.generateOnDevice(PROMPTS, { ...opts, temperature: 0, maxNewTokens: 1, vocab: real }).tokens;
  PROMPTS.forEach((_, b) => {
    let best = 0;
    for (let i = 1; i < real; i++) if (z[b * V + i]! > z[b * V + best]!) best = i;
    assert.equal(greedy[b]![0], best, `sequence ${b}`);
  });
  assert.throws(() => g.generate(PROMPTS, { ...opts, vocab: V + 1 }), /sampling vocabulary/);
  be.dispose();
});

test('generateOnDevice keeps the decode loop on the device: no upload between steps, one recorded step repeated, step i + 1 queued before step i\'s ids are read, the same tokens as one step at a time', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const c = CONFIGS[0]![1];
  const m = model(be, c, 5);
  const g = new BatchGenerator(m, PROMPTS.length, 24);
  const opts = { temperature: 1.1, topP: 0.9, topK: 20, maxNewTokens: 7, seed: 99 };
  const reference = g.generateOnDevice(PROMPTS, opts);
  // the same generation, the backend's calls logged
  const log: string[] = [];
  type Fn = (...a: unknown[]) => unknown;
  const rec = be as unknown as Record<string, Fn>;
  const spy = (k: string, wrap: (orig: Fn) => Fn): void => { const orig = rec[k]!.bind(be); rec[k] = wrap(orig); };
  for (const k of ['upload', 'uploadInt', 'downloadInt', 'download']) spy(k, (orig) => (...a) => { log.push(k); return orig(...a); });
  let steps = 0;
  spy('capturedRepeat', (orig) => (label, body) => {
    log.push(`${String(label)} ${++steps}`);
    const again = orig(label, body) as () => void;
    return () => { log.push(`${String(label)} ${++steps}`); again(); };
  });
  spy('readback', (orig) => (...a) => {
    const rb = orig(...a) as Readback;
    return { queue: () => { rb.queue(); }, wait: () => { log.push('read'); return rb.wait(); } };
  });
  const g2 = new BatchGenerator(m, PROMPTS.length, 24);
  const got = g2.generateOnDevice(PROMPTS, opts);
  assert.deepEqual(got, reference);
  const first = log.indexOf('decode step 1');
  assert.ok(first > 0);
  assert.deepEqual(log.slice(first).filter((e) => !e.startsWith('decode step') && !e.startsWith('read')), [], 'nothing but decode steps and their readbacks after the first step');
  assert.equal(steps, opts.maxNewTokens - 1, 'one decode step a new token after the prefill\'s');
  // readbacks alternate (two objects): read k of object j is step 2(k − 1) + j + 1; step s + 1 is queued before step s is read
  const decodeAt = (s: number): number => log.indexOf(`decode step ${s}`);
  const reads = log.map((e, i) => [e, i] as const).filter(([e]) => e.startsWith('read')).map(([, i]) => i);
  assert.equal(reads.length, steps);
  reads.forEach((at, r) => {
    const s = r + 1;
    if (s < steps) assert.ok(decodeAt(s + 1) < at, `step ${s + 1} queued before step ${s}'s ids are read`);
    assert.ok(decodeAt(s) < at);
  });
  be.dispose();
});

test('generateOnDevice past MAX_DECODE_SEQUENCES sequences goes in parts, each sequence as it is alone (its stop ids and stopWhen by its own index); 0 or 1 new tokens; a bad count refused', () => {
  const be = createCpuBackend({ threads: 1 });
  const c = cfg({ numLayers: 1 });
  const m = model(be, c, 3);
  const B = MAX_DECODE_SEQUENCES + 5;
  const prompts = Array.from({ length: B }, (_, b) => [1 + (b % 7), 2 + (b % 11), 3 + (b % 5)].slice(0, 1 + (b % 3)));
  const opts = { temperature: 1, topP: 0.95, topK: 0, maxNewTokens: 3, seed: 5 };
  const g = new BatchGenerator(m, B, 8);
  const one = new BatchGenerator(m, 1, 8);
  const rowStopIds = prompts.map(() => [] as number[]);
  const alone = (b: number): number[] => one.generateOnDevice([prompts[b]!], { ...opts, sequence0: b }).tokens[0]!;
  const last = B - 1;
  rowStopIds[last] = [alone(last)[1]!];
  const asked: number[] = [];
  const r = g.generateOnDevice(prompts, { ...opts, rowStopIds, stopWhen: (b) => { if (b === MAX_DECODE_SEQUENCES) asked.push(b); return b === 2; } });
  assert.equal(r.tokens.length, B);
  for (const b of [0, 1, MAX_DECODE_SEQUENCES - 1, MAX_DECODE_SEQUENCES, MAX_DECODE_SEQUENCES + 3]) assert.deepEqual(r.tokens[b], alone(b), `sequence ${b}`);
  assert.deepEqual(r.tokens[2], alone(2).slice(0, 1), 'stopWhen ends sequence 2 after its first token');
  assert.equal(r.finish[2], 'stop');
  assert.deepEqual(r.tokens[last], alone(last).slice(0, 1), 'the last sequence\'s own stop id, in the second part');
  assert.equal(r.stops[last], rowStopIds[last]![0]);
  assert.ok(asked.length > 0, 'stopWhen is asked with the sequence\'s index in the whole batch');
  // 1 new token: the prefill's draw alone; 0: nothing
  const few = new BatchGenerator(m, 3, 8);
  const three = prompts.slice(0, 3);
  assert.deepEqual(few.generateOnDevice(three, { ...opts, maxNewTokens: 1 }).tokens, [0, 1, 2].map((b) => alone(b).slice(0, 1)));
  assert.deepEqual(few.generateOnDevice(three, { ...opts, maxNewTokens: 0 }).tokens, [[], [], []]);
  assert.throws(() => few.generateOnDevice(three, { ...opts, maxNewTokens: 2.5 }), /2\.5 new tokens/);
  // the whole batch is checked before any part runs: its size, and every prompt against the length limit
  assert.throws(() => new BatchGenerator(m, B - 2, 8).generateOnDevice(prompts, opts), new RegExp(`${B} prompts for a generation batch of ${B - 2}`));
  let asks = 0;
  const tooLong = prompts.map((p, b) => (b === B - 1 ? [1, 2, 3, 4, 5, 6] : p));
  assert.throws(() => g.generateOnDevice(tooLong, { ...opts, stopWhen: () => { asks++; return false; } }), /a prompt of 6 tokens and 3 new ones exceed the generator's 8/);
  assert.equal(asks, 0, 'nothing generated before the refusal');
  be.dispose();
});
