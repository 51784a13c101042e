/**
 * The bucketed gradient reduction of data parallelism (src/parallel/grad-reducer.ts) and the ranges the backward pass
 * reports to it (Transformer.backwardHidden's `ready`): every element of the trainable buffer is reduced exactly once,
 * in buckets of at least the bucket size where the ranges allow, the first of them started while the backward pass
 * still runs (before the embedding's backward), for the full model (tied and untied) and for LoRA adapters; ranges
 * never reported are reduced at the end; a range reported twice or outside the buffer is refused.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { Backend, Buf } from '../../src/backend/backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { loraLayout, LORA_TARGETS } from '../../src/model/lora.js';
import { NonFiniteLossError, StepRunner } from '../../src/train/step.js';
import { shardParts, type CommWork } from '../../src/parallel/comm.js';
import { OneRankView } from './fake-comm.js';
import { GradReducer, gradBucketElements, DEFAULT_BUCKET, MAX_IN_FLIGHT } from '../../src/parallel/grad-reducer.js';
import { ShardedAdamW } from '../../src/parallel/data-parallel.js';
import { InputError } from '../../src/util/errors.js';
import { Rng } from '../../src/util/rng.js';

const base: ModelConfig = {
  architecture: 'qwen2', vocabSize: 37, hiddenSize: 16, intermediateSize: 24, numLayers: 3, numHeads: 4, numKvHeads: 2, headDim: 4,
  rope: { type: 'default', theta: 10000 }, rmsNormEps: 1e-6, tieWordEmbeddings: false, maxPositionEmbeddings: 64, qkvBias: true, qkNorm: false, noRopeLayers: [],
};
const adam = { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 };

/** A communicator of `world` ranks seen from rank 0 that records the reductions it is asked for (and the events log). */
class RecordingComm extends OneRankView {
  readonly ranges: Array<[number, number]> = [];
  readonly waited: Array<[number, number]> = [];
  constructor(world: number, private readonly log: string[] = []) { super(world); }
  /** Elements started and not yet waited for, and the most there ever were. */
  outstanding = 0;
  maxOutstanding = 0;
  override reduceScatterStart(_be: Backend, _buf: Buf, begin: number, end: number): CommWork {
    this.ranges.push([begin, end]);
    this.log.push(`reduce ${begin}..${end}`);
    this.outstanding += end - begin; this.maxOutstanding = Math.max(this.maxOutstanding, this.outstanding);
    return { wait: () => { this.waited.push([begin, end]); this.outstanding -= end - begin; } };
  }
}

/** Every element of [0, total) in exactly one range. */
function assertTiles(ranges: Array<[number, number]>, total: number, what: string): void {
  const seen = new Uint8Array(total);
  for (const [a, b] of ranges) { assert.ok(a < b && a >= 0 && b <= total, `${what}: range [${a}, ${b})`); for (let i = a; i < b; i++) seen[i]!++; }
  const bad = seen.findIndex((x) => x !== 1);
  assert.equal(bad, -1, `${what}: element ${bad} reduced ${seen[bad]} times`);
}

for (const [name, cfg, lora] of [
  ['untied', base, false], ['tied', { ...base, tieWordEmbeddings: true, qkvBias: false }, false], ['LoRA r=2 on q/v/down', base, true],
] as const) {
  test(`the backward pass reports each range of the trainable buffer once, downward and contiguous, the embedding last (${name})`, () => {
    const be = createCpuBackend({ threads: 1 });
    const lay = lora ? loraLayout(cfg, { rank: 2, alpha: 4, targets: ['q_proj', 'v_proj', 'down_proj'] }) : undefined;
    const m = new Transformer(be, cfg, { batch: 2, seq: 5, training: true, lora: lay });
    m.setWeights(initialWeights(parameterLayout(cfg), cfg, new Rng(3)));
    const log: string[] = [];
    const embed = be.embeddingBackward.bind(be);
    be.embeddingBackward = (...a: Parameters<Backend['embeddingBackward']>): void => { log.push('embedding backward'); embed(...a); };
    m.forwardHidden(Int32Array.from({ length: 10 }, (_, i) => (i * 5) % 37), 2, 5);
    const got: Array<[number, number]> = [];
    m.backwardHidden((b, e) => { got.push([b, e]); log.push('ready'); });
    const total = m.trainable().layout.total;
    assertTiles(got, total, name);
    for (let i = 1; i < got.length; i++) assert.equal(got[i]![1], got[i - 1]![0], `${name}: range ${i} ends where range ${i - 1} starts`);
    assert.equal(got[0]![1], total);
    assert.equal(got[got.length - 1]![0], 0);
    if (lora) assert.equal(got.length, cfg.numLayers, 'one range per layer of adapters');
    else {
      assert.equal(got.length, cfg.numLayers + 2, 'the final norm (+ untied head), each layer, the embedding');
      assert.deepEqual(log.slice(-2), ['embedding backward', 'ready'], 'the embedding is final after its own backward only');
    }
    be.dispose();
  });
}

test('a data-parallel step starts its buckets during the backward pass and reduces every element once (full model and LoRA)', () => {
  for (const lora of [false, true]) {
    const be = createCpuBackend({ threads: 1 });
    const lay = lora ? loraLayout(base, { rank: 2, alpha: 4, targets: [...LORA_TARGETS] }) : undefined;
    const m = new Transformer(be, base, { batch: 2, seq: 8, training: true, lora: lay });
    m.setWeights(initialWeights(parameterLayout(base), base, new Rng(1)));
    const log: string[] = [];
    const embed = be.embeddingBackward.bind(be);
    be.embeddingBackward = (...a: Parameters<Backend['embeddingBackward']>): void => { log.push('embedding backward'); embed(...a); };
    const comm = new RecordingComm(2, log);
    const opt = new ShardedAdamW(m.trainable(), adam, comm);
    const total = m.trainable().layout.total;
    opt.bucket = Math.ceil(total / 5);
    const runner = new StepRunner(m, null, { kind: 'none', alpha: 0, temperature: 1, beta: 0 });
    const n = 16, batch = { inputs: Int32Array.from({ length: n }, (_, i) => (i * 7) % 37), targets: Int32Array.from({ length: n }, (_, i) => (i * 5 + 1) % 37), mask: new Float32Array(n).fill(1), b: 2, t: 8 };
    // two accumulated micro-batches: only the last one's backward reports
    runner.trainStep([batch, batch], opt, 1e-2, 1);
    assertTiles(comm.ranges, total, lora ? 'LoRA' : 'full');
    assert.deepEqual(comm.waited, comm.ranges, 'every bucket waited for, once');
    assert.ok(comm.ranges.length >= base.numLayers, `${comm.ranges.length} buckets`);
    for (const [a, b] of comm.ranges.slice(0, -1)) assert.ok(b - a >= opt.bucket || a === 0, `bucket [${a}, ${b}) below ${opt.bucket}`);
    if (!lora) {
      const firstReduce = log.findIndex((x) => x.startsWith('reduce')), lastEmbed = log.lastIndexOf('embedding backward');
      assert.ok(firstReduce >= 0 && firstReduce < lastEmbed, `the first bucket starts before the last micro-batch's embedding backward: ${log.join(', ')}`);
      assert.ok(firstReduce > log.indexOf('embedding backward'), 'the first micro-batch reports nothing');
    }
    be.dispose();
  }
});

test('GradReducer: ranges never reported are reduced at finish (in buckets, from the top); overlapping or outside ranges are refused', () => {
  const be = createCpuBackend({ threads: 1 });
  const g = be.alloc(100, 'g');
  const comm = new RecordingComm(3);
  const r = new GradReducer(comm, be, g, 100, 34, 30);
  r.ready(80, 100); r.ready(60, 80); // joined: one pending range of 40 ≥ 30 → started
  assert.deepEqual(comm.ranges, [[60, 100]]);
  r.ready(10, 20); // not contiguous with anything pending: starts alone at finish
  assert.throws(() => r.ready(15, 25), /reported twice/);
  assert.throws(() => r.ready(90, 101), /not inside/);
  r.finish();
  assertTiles(comm.ranges, 100, 'gaps');
  assert.deepEqual(comm.ranges, [[60, 100], [10, 20], [30, 60], [20, 30], [0, 10]]);
  assert.throws(() => r.ready(0, 1), /after the reduction finished/);
  // at most MAX_IN_FLIGHT buckets' worth started and not yet waited for (the host transport copies each)
  const c3 = new RecordingComm(2), r3 = new GradReducer(c3, be, g, 100, 50, 5);
  for (let e = 100; e > 0; e -= 5) r3.ready(e - 5, e);
  r3.finish();
  assertTiles(c3.ranges, 100, 'bounded');
  assert.equal(c3.maxOutstanding, MAX_IN_FLIGHT * 5);
  assert.equal(c3.outstanding, 0);
  // nothing reported (a CUDA pass): the whole buffer, in buckets from the top
  const c2 = new RecordingComm(2);
  new GradReducer(c2, be, g, 100, 50, 40).finish();
  assert.deepEqual(c2.ranges, [[60, 100], [20, 60], [0, 20]]);
  // a transport that queues on the GPU inside a captured pass (NCCL): nothing waited for until finish (no wait may
  // happen inside the region), then every bucket once, in order
  const c4 = Object.assign(new RecordingComm(2), { overlapsRegions: true }), r4 = new GradReducer(c4, be, g, 100, 50, 5);
  for (let e = 100; e > 0; e -= 5) r4.ready(e - 5, e);
  assert.equal(c4.waited.length, 0, 'no wait before finish');
  assert.equal(c4.maxOutstanding, 100);
  r4.finish();
  assert.deepEqual(c4.waited, c4.ranges);
  be.dispose();
});

test('a data-parallel step that fails after its buckets started (a non-finite loss) waits for every bucket it started before the error leaves the step', () => {
  const be = createCpuBackend({ threads: 1 });
  const m = new Transformer(be, base, { batch: 2, seq: 8, training: true });
  const w = initialWeights(parameterLayout(base), base, new Rng(1));
  w[5] = NaN; // the embedding: the loss is NaN, the backward still reports its ranges
  m.setWeights(w);
  const comm = Object.assign(new RecordingComm(2), { overlapsRegions: true }); // nothing waited during the pass
  const opt = new ShardedAdamW(m.trainable(), adam, comm);
  opt.bucket = Math.ceil(m.trainable().layout.total / 5);
  const runner = new StepRunner(m, null, { kind: 'none', alpha: 0, temperature: 1, beta: 0 });
  const n = 16, batch = { inputs: Int32Array.from({ length: n }, (_, i) => (i * 7) % 37), targets: Int32Array.from({ length: n }, (_, i) => (i * 5 + 1) % 37), mask: new Float32Array(n).fill(1), b: 2, t: 8 };
  assert.throws(() => runner.trainStep([batch], opt, 1e-2, 1), NonFiniteLossError);
  assert.ok(comm.ranges.length >= 2, `${comm.ranges.length} buckets started during the pass`);
  assert.deepEqual(comm.waited, comm.ranges, 'every started bucket waited for');
  assert.equal(comm.outstanding, 0);
  be.dispose();
});

test('ShardedAdamW on a backend that records its passes as captured regions: buckets during the pass only where the communicator works inside one (NCCL), else after it', () => {
  const be = createCpuBackend({ threads: 1 });
  const m = new Transformer(be, base, { batch: 2, seq: 8, training: true });
  m.setWeights(initialWeights(parameterLayout(base), base, new Rng(1)));
  const captured = Object.create(be, { recordsRegions: { value: true } }) as Backend;
  const t = { ...m.trainable(), backend: captured };
  const host = new ShardedAdamW(t, adam, new RecordingComm(2));
  assert.equal(host.beginStep(), undefined, 'the host transport reduces after the pass');
  const nccl = new ShardedAdamW(t, adam, Object.assign(new RecordingComm(2), { overlapsRegions: true }));
  assert.equal(typeof nccl.beginStep(), 'function', 'NCCL reduces during the pass');
  be.dispose();
});

test('shardParts: each rank\'s part of a range; DISTILLERY_GRAD_BUCKET_MB sets the bucket and is refused unless positive', () => {
  assert.deepEqual(shardParts(3, 12, 5, 3), [[3, 5], [5, 10], [10, 12]]);
  assert.deepEqual(shardParts(6, 8, 5, 3), [[6, 6], [6, 8], [8, 8]]);
  assert.deepEqual(shardParts(0, 13, 5, 3), [[0, 5], [5, 10], [10, 13]]);
  assert.equal(gradBucketElements({}), DEFAULT_BUCKET);
  assert.equal(gradBucketElements({ DISTILLERY_GRAD_BUCKET_MB: '1' }), 262144);
  for (const bad of ['0', '-2', 'lots']) assert.throws(() => gradBucketElements({ DISTILLERY_GRAD_BUCKET_MB: bad }), (e) => e instanceof InputError && /DISTILLERY_GRAD_BUCKET_MB/.test(e.message));
});
