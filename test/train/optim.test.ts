/**
 * Training-loop pieces against independent formulas: the warmup + cosine schedule, global-norm clipping folded
 * into AdamW, the weight-decay mask (matrices and embeddings decay; norms and biases don't), gradient
 * accumulation (two micro-batches of 2 give the gradient of one batch of 4), and the memory estimate against what
 * the model, optimizer and step runner actually allocate.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { LOSS_STATS, type Backend } from '../../src/backend/backend.js';
import { presetConfig, type ModelConfig } from '../../src/model/config.js';
import { initialWeights } from '../../src/model/params.js';
import { LORA_TARGETS, loraLayout } from '../../src/model/lora.js';
import { Transformer } from '../../src/model/transformer.js';
import { BatchGenerator } from '../../src/model/batch-generate.js';
import { estimateJobBytes, largestSeqThatFits } from '../../src/model/memory.js';
import { choicesRunner } from '../../src/train/run-choices.js';
import { AdamW } from '../../src/train/optimizer.js';
import { lrAt } from '../../src/train/schedule.js';
import { StepRunner, type Batch } from '../../src/train/step.js';
import { CACHED_HEAD_MEMORY, ChunkedHead, DEFAULT_HEAD_CHUNK_FLOATS, defaultChunkFloats, headFloats } from '../../src/train/head.js';
import { sparseSlots, type SparseRep } from '../../src/cache/sparse.js';
import { Rng } from '../../src/util/rng.js';

test('schedule: linear warmup to lr, cosine to lr·minLrRatio at the last step, then held', () => {
  const s = { lr: 1e-3, warmup: 10, total: 110, minLrRatio: 0.1 };
  for (let i = 0; i < 10; i++) assert.ok(Math.abs(lrAt(i, s) - 1e-3 * (i + 1) / 10) < 1e-15);
  for (let i = 10; i <= 110; i++) {
    const p = (i - 10) / 100;
    const want = 1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + Math.cos(Math.PI * p));
    assert.ok(Math.abs(lrAt(i, s) - want) < 1e-15, `step ${i}`);
  }
  assert.ok(Math.abs(lrAt(500, s) - 1e-4) < 1e-15);
});

function tinyModel(be: Backend, cfg: ModelConfig, b: number, t: number): Transformer {
  const m = new Transformer(be, cfg, { batch: b, seq: t, training: true });
  m.setWeights(initialWeights(m.layout, cfg, new Rng(3), 0.1));
  return m;
}
function batchOf(rng: Rng, b: number, t: number, V: number): Batch {
  const n = b * t;
  return { inputs: Int32Array.from({ length: n }, () => rng.int(V)), targets: Int32Array.from({ length: n }, () => rng.int(V)), mask: new Float32Array(n).fill(1), b, t };
}
const noneLoss = { kind: 'none' as const, alpha: 0, temperature: 1, beta: 0.5 };

test('AdamW: one step equals the textbook update with clipping as a gradient scale and decay only on matrices', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  try {
    const cfg = presetConfig('tiny', 20);
    const m = tinyModel(be, cfg, 2, 4);
    const w0 = Float64Array.from(be.download(m.params));
    const runner = new StepRunner(m, null, noneLoss);
    const opt = new AdamW(m, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 });
    const batch = batchOf(new Rng(1), 2, 4, 20);
    // The gradient the step will use, computed first with a throwaway step on a copy of the weights.
    m.zeroGrad();
    const logits = m.forward(batch.inputs, 2, 4);
    const st = be.alloc(8 * LOSS_STATS, 's'), wb = be.alloc(8, 'w'), tg = be.allocInt(8, 't');
    be.upload(wb, new Float64Array(8).fill(1 / 8)); be.uploadInt(tg, batch.targets);
    be.lossForward(st, logits, logits, null, tg, wb, 8, 20, noneLoss);
    m.backward(logits);
    const g = Float64Array.from(be.download(m.grads!));
    const norm = Math.sqrt(g.reduce((a, x) => a + x * x, 0));
    const clip = norm / 4; // forces clipping by 4×
    const r = runner.trainStep([batch], opt, 0.01, clip);
    assert.ok(Math.abs(r.gradNorm - norm) < 1e-9 * norm);
    const w1 = be.download(m.params);
    const scale = clip / norm;
    for (const t of m.layout.tensors) {
      for (let i = t.offset; i < t.offset + t.size; i += Math.max(1, Math.floor(t.size / 5))) {
        const gi = g[i]! * scale;
        const mh = (0.1 * gi) / (1 - 0.9), vh = (0.05 * gi * gi) / (1 - 0.95);
        const decayed = w0[i]! * (1 - 0.01 * (t.decay ? 0.1 : 0));
        const want = decayed - 0.01 * mh / (Math.sqrt(vh) + 1e-8);
        assert.ok(Math.abs(w1[i]! - want) < 1e-12, `${t.name}[${i - t.offset}]: ${w1[i]} vs ${want}`);
      }
      assert.equal(t.decay, t.shape.length === 2, `${t.name}: decay applies to matrices only`);
    }
  } finally { be.dispose(); }
});

test('checkpoint host arrays: the weights and moments a save writes are the current ones, in the same arrays every save', () => {
  const be = createCpuBackend({ dtype: 'f32', threads: 1 });
  try {
    const cfg = presetConfig('tiny', 20);
    const m = tinyModel(be, cfg, 2, 4);
    const runner = new StepRunner(m, null, noneLoss);
    const opt = new AdamW(m, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 });
    const w1 = m.checkpointWeights(), mom1 = opt.gatherMoments();
    const w1copy = Float32Array.from(w1);
    assert.deepEqual(w1copy, be.download(m.params));
    runner.trainStep([batchOf(new Rng(3), 2, 4, 20)], opt, 0.01, 1);
    const w2 = m.checkpointWeights(), mom2 = opt.gatherMoments();
    assert.equal(w2, w1, 'the same host array');
    assert.equal(mom2.m, mom1.m); assert.equal(mom2.v, mom1.v);
    assert.deepEqual(w2, be.download(m.params), 'holding the weights after the step');
    assert.notDeepEqual(w2, w1copy);
    assert.deepEqual(mom2.m, be.download(opt.m)); assert.deepEqual(mom2.v, be.download(opt.v));
    assert.ok(mom2.v.some((x) => x > 0));
  } finally { be.dispose(); }
});

test('download into: the given array gets the values and is returned; a wrong length is refused', () => {
  const be = createCpuBackend({ dtype: 'f32', threads: 1 });
  try {
    const b = be.alloc(5, 'b');
    be.upload(b, [1, 2, 3, 4, 5]);
    const into = new Float32Array(5);
    assert.equal(be.download(b, into), into);
    assert.deepEqual([...into], [1, 2, 3, 4, 5]);
    assert.throws(() => be.download(b, new Float32Array(4)), /download into 4 floats of a 5-float buffer/);
  } finally { be.dispose(); }
  const f64 = createCpuBackend({ dtype: 'f64', threads: 1 });
  try {
    const b = f64.alloc(2, 'b');
    f64.upload(b, [0.1, 1 / 3]);
    const into = new Float32Array(2);
    assert.equal(f64.download(b, into), into);
    assert.deepEqual([...into], [Math.fround(0.1), Math.fround(1 / 3)], 'the f64 reference mode rounds into a float32 array');
  } finally { f64.dispose(); }
});

test('gradient accumulation: two micro-batches of 2 rows give the gradient of one batch of 4 rows', () => {
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  try {
    const cfg = presetConfig('tiny', 20);
    const rng = new Rng(7);
    const whole = batchOf(rng, 4, 6, 20);
    whole.mask[5] = 0; whole.targets[5] = -1; // padding counts in neither
    const half = (k: number): Batch => ({
      inputs: whole.inputs.slice(k * 12, k * 12 + 12), targets: whole.targets.slice(k * 12, k * 12 + 12), mask: whole.mask.slice(k * 12, k * 12 + 12), b: 2, t: 6,
    });
    const a = tinyModel(be, cfg, 4, 6), b = tinyModel(be, cfg, 2, 6);
    const optA = new AdamW(a, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0 });
    const optB = new AdamW(b, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0 });
    const ra = new StepRunner(a, null, noneLoss).trainStep([whole], optA, 0, 0);
    const rb = new StepRunner(b, null, noneLoss).trainStep([half(0), half(1)], optB, 0, 0);
    assert.ok(Math.abs(ra.loss - rb.loss) < 1e-12);
    assert.ok(Math.abs(ra.gradNorm - rb.gradNorm) < 1e-12 * ra.gradNorm);
    const ga = be.download(a.grads!), gb = be.download(b.grads!);
    for (let i = 0; i < ga.length; i++) assert.ok(Math.abs(ga[i]! - gb[i]!) < 1e-12, `gradient ${i}`);
  } finally { be.dispose(); }
});

test('memory estimate equals what the job allocates (student, teacher, optimizer, loss buffers)', () => {
  const cpu = createCpuBackend({ threads: 1 });
  let floats = 0;
  const counting = new Proxy(cpu, {
    get(target, prop, recv) {
      if (prop === 'alloc') return (n: number, label: string) => { floats += n; return target.alloc(n, label); };
      if (prop === 'allocInt') return (n: number, label: string) => { floats += n; return target.allocInt(n, label); };
      const v = Reflect.get(target, prop, recv) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  }) as Backend;
  try {
    const student = presetConfig('tiny', 300), teacher = presetConfig('small', 300);
    const m = new Transformer(counting, student, { batch: 3, seq: 10, training: true });
    const t = new Transformer(counting, teacher, { batch: 3, seq: 10, training: false });
    new AdamW(m, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0 });
    new StepRunner(m, t, { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0.5 });
    const est = estimateJobBytes({ student, teacher, batch: 3, seq: 10, training: true });
    // Exact: every float (and int32 token id / target) the job allocates, no more, no fewer.
    assert.equal(est, floats * 4, `estimate ${est} vs allocated ${floats * 4} bytes`);
    // Plain training of a model whose query width differs from its hidden size (GQA, headDim·heads ≠ C), and a
    // distillation over a loss vocabulary smaller than a padded teacher's vocab_size: exact too.
    for (const job of [
      { student: { ...student, numHeads: 4, numKvHeads: 2, headDim: 24 }, teacher: null, lossVocab: undefined },
      { student, teacher: { ...teacher, vocabSize: 317 }, lossVocab: 300 },
    ]) {
      floats = 0;
      const s = new Transformer(counting, job.student, { batch: 2, seq: 7, training: true });
      const tt = job.teacher ? new Transformer(counting, job.teacher, { batch: 2, seq: 7, training: false }) : null;
      new AdamW(s, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0 });
      new StepRunner(s, tt, tt ? { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0.5 } : noneLoss, { lossVocab: job.lossVocab });
      assert.equal(estimateJobBytes({ student: job.student, teacher: job.teacher, batch: 2, seq: 7, training: true, lossVocab: job.lossVocab }), floats * 4);
    }
    // On-policy: the student's batched generator too (fp32 and Qwen3's q/k norms).
    for (const sc of [student, { ...student, architecture: 'qwen3' as const, qkNorm: true }]) {
      floats = 0;
      const s = new Transformer(counting, sc, { batch: 2, seq: 7, training: true });
      const tt = new Transformer(counting, teacher, { batch: 2, seq: 7, training: false });
      new AdamW(s, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0 });
      new StepRunner(s, tt, { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0.5 });
      new BatchGenerator(s, 2, 7);
      assert.equal(estimateJobBytes({ student: sc, teacher, batch: 2, seq: 7, training: true, onPolicy: true }), floats * 4, `on-policy ${sc.architecture}`);
    }
    // LoRA: a frozen base (no gradients, no moments) and the adapters' own buffers, in training and in inference.
    for (const training of [true, false]) {
      floats = 0;
      const lay = loraLayout(student, { rank: 4, alpha: 8, targets: training ? [...LORA_TARGETS] : ['q_proj', 'down_proj'] });
      const s = new Transformer(counting, student, { batch: 2, seq: 7, training, lora: lay });
      const tt = new Transformer(counting, teacher, { batch: 2, seq: 7, training: false });
      if (training) new AdamW(s.trainable(), { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0 });
      new StepRunner(s, tt, { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0.5 });
      assert.equal(estimateJobBytes({ student, teacher, batch: 2, seq: 7, training, lora: lay }), floats * 4, `LoRA, training ${training}`);
    }
    // A teacher cache: no teacher model, the sparse rows of every token (sample and top-K).
    for (const rep of [{ kind: 'sample', n: 6 }, { kind: 'top', k: 5 }] as SparseRep[]) {
      floats = 0;
      const s = new Transformer(counting, student, { batch: 2, seq: 7, training: true });
      new AdamW(s, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0 });
      new StepRunner(s, null, { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0.5 }, { sparse: rep });
      assert.equal(estimateJobBytes({ student, teacher: null, batch: 2, seq: 7, training: true, teacherCacheSlots: sparseSlots(rep) }), floats * 4, `cache ${rep.kind}`);
    }
    // --eval-choices: a scoring head for the student and one for the teacher (f32 logits; bf16: test/train/bf16-train.test.ts).
    for (const precision of ['fp32'] as const) {
      floats = 0;
      const s = new Transformer(counting, student, { batch: 2, seq: 7, training: true, precision });
      const tt = new Transformer(counting, teacher, { batch: 2, seq: 7, training: false, precision });
      new AdamW(s, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0 });
      new StepRunner(s, tt, { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0.5 });
      choicesRunner(s); choicesRunner(tt);
      assert.equal(estimateJobBytes({ student, teacher, batch: 2, seq: 7, training: true, precision, choices: true }), floats * 4, `choices ${precision}`);
    }
    const fit = largestSeqThatFits({ student, teacher, batch: 3, seq: 4096, training: true }, est);
    assert.ok(fit >= 10 && fit < 20, `largest seq for the 10-token budget: ${fit}`);
  } finally { cpu.dispose(); }
});

test('a head distilling from a teacher cache takes larger chunks (no teacher chunk beside the student\'s, no teacher weights): at most CACHED_HEAD_MEMORY times the logits memory of online, counted by the estimate', () => {
  const allocs = new Map<string, number>();
  const be = {
    alloc: (n: number, label: string) => { allocs.set(label, n); return { length: n, dtype: 'f32' }; },
    allocInt: (n: number, label: string) => { allocs.set(label, n); return { length: n }; },
  } as unknown as Backend;
  const V = 151936, n = 8192;
  const model = (training: boolean): Transformer => ({ backend: be, config: { vocabSize: V }, compute: 'f32', training }) as unknown as Transformer;
  const spec = { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0 } as const;
  const online = new ChunkedHead(model(true), model(false), spec, n);
  const onlineLogits = allocs.get('student logits (one chunk of rows)')! + allocs.get('teacher logits (one chunk of rows)')!;
  allocs.clear();
  const cached = new ChunkedHead(model(true), null, spec, n, { sparse: { kind: 'sample', n: 24 } });
  // the rows split evenly over the fewest chunks of at most 883 rows online, 2 · CACHED_HEAD_MEMORY × 883 from a cache
  // (one float a row instead of two, in CACHED_HEAD_MEMORY times the memory)
  const most = Math.floor(DEFAULT_HEAD_CHUNK_FLOATS / V), mostCached = Math.floor(2 * CACHED_HEAD_MEMORY * DEFAULT_HEAD_CHUNK_FLOATS / V);
  assert.equal(online.chunkRows, Math.ceil(n / Math.ceil(n / most)));
  assert.equal(cached.chunkRows, Math.ceil(n / Math.ceil(n / mostCached)));
  assert.ok(cached.chunkRows > 1.8 * online.chunkRows, `${cached.chunkRows} rows vs ${online.chunkRows}`);
  assert.ok(allocs.get('student logits (one chunk of rows)')! <= CACHED_HEAD_MEMORY * onlineLogits);
  assert.equal(allocs.has('teacher logits (one chunk of rows)'), false);
  // the estimate's head floats for a cached job count the larger chunk
  const f = headFloats(n, V, false, defaultChunkFloats(true));
  assert.equal(f - headFloats(n, V, false), (cached.chunkRows - online.chunkRows) * V);
  const s05 = presetConfig('qwen2.5-0.5b', V);
  const plain = estimateJobBytes({ student: s05, teacher: null, batch: 8, seq: 1024, training: true });
  const withCache = estimateJobBytes({ student: s05, teacher: null, batch: 8, seq: 1024, training: true, teacherCacheSlots: 24 });
  assert.equal(withCache - plain, 4 * ((cached.chunkRows - online.chunkRows) * V + n * (3 * 24 + 2)), 'the estimate: the doubled chunk and the cache rows');
  // A bf16 student: its bf16 dlogits chunk grows with the rows too, so 5/3 of the rows keep the logits bytes of online
  // (CACHED_HEAD_MEMORY times them: CACHED_HEAD_MEMORY × 5/3 the rows, before the even split).
  const bytes = (): number => [...allocs].reduce((a, [k, v]) => a + (/logits/.test(k) ? v * (k.startsWith('student dlogits') ? 2 : 4) : 0), 0);
  const bf = (training: boolean): Transformer => ({ backend: be, config: { vocabSize: V }, compute: 'bf16', training }) as unknown as Transformer;
  allocs.clear();
  const onlineBf = new ChunkedHead(bf(true), bf(false), spec, n);
  const onlineBytes = bytes();
  allocs.clear();
  const cachedBf = new ChunkedHead(bf(true), null, spec, n, { sparse: { kind: 'sample', n: 24 } });
  const mostBf = (cacheFactor: number): number => Math.floor(cacheFactor * DEFAULT_HEAD_CHUNK_FLOATS * 10 / 6 / V);
  assert.equal(onlineBf.chunkRows, Math.ceil(n / Math.ceil(n / Math.floor(DEFAULT_HEAD_CHUNK_FLOATS / V))));
  assert.equal(cachedBf.chunkRows, Math.ceil(n / Math.ceil(n / mostBf(CACHED_HEAD_MEMORY))), `${cachedBf.chunkRows} rows vs ${onlineBf.chunkRows} online`);
  assert.ok(bytes() <= CACHED_HEAD_MEMORY * onlineBytes * (1 + 1e-3), `cached ${bytes()} vs online ${onlineBytes} bytes of logits`);
});
