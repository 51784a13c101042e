/**
 * Captured regions and CUDA graphs without a GPU: a device-mode CudaBackend on a fake driver whose stream keeps what
 * is issued while capturing and runs it on cuGraphLaunch. The real training step (StepRunner + AdamW) runs its pass
 * and its optimizer as regions: eager the first time, captured the second, replayed after; a replay issues the same
 * kernels in the same order as the eager step; what changes per step (lr, the step number, token ids) does not
 * change the graph, while another shape or loss does; host reads inside a region are refused.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CudaBackend, REPEAT_CHECK_EVERY, segmentOps } from '../../src/backend/cuda/cuda-backend.js';
import { KernelCache } from '../../src/backend/cuda/kernel-cache.js';
import { GraphRunner, formatTimeline, graphsFromEnv, type GraphOp } from '../../src/backend/cuda/graphs.js';
import { ADAMW_CHUNK, ADAMW_CHUNK_WORDS, adamwChunkTable } from '../../src/backend/cuda/kernels/elementwise.js';
import { presetConfig } from '../../src/model/config.js';
import { Transformer } from '../../src/model/transformer.js';
import { AdamW } from '../../src/train/optimizer.js';
import { StepRunner, type Batch } from '../../src/train/step.js';
import { FakeCompiler, fakeCublas, fakeDriver } from './helpers.js';
import { BatchGenerator } from '../../src/model/batch-generate.js';
import { TeacherPass } from '../../src/cache/teacher-pass.js';
import { SparseRing, allocSparseHost, type SparseHost } from '../../src/cache/targets.js';
import { ShardedAdamW } from '../../src/parallel/data-parallel.js';
import type { CommWork } from '../../src/parallel/comm.js';
import { OneRankView } from '../parallel/fake-comm.js';
import type { Backend, Buf } from '../../src/backend/backend.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';

function setup(graphs = true) {
  const driver = fakeDriver();
  const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: false, log: () => {} });
  const lines: string[] = [];
  const be = new CudaBackend('device', { driver, cublas: fakeCublas(), cache, graphs, log: (l) => lines.push(l) });
  const cfg = { ...presetConfig('tiny', 96), numLayers: 2 };
  const student = new Transformer(be, cfg, { batch: 2, seq: 8, training: true, precision: 'bf16' });
  const teacher = new Transformer(be, cfg, { batch: 2, seq: 8, training: false, precision: 'bf16' });
  const runner = new StepRunner(student, teacher, { kind: 'kl', temperature: 2, alpha: 0.5, beta: 0.5 });
  const opt = new AdamW(student, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 });
  return { driver, be, runner, opt, lines, cfg };
}

function batch(b: number, t: number, seed: number, vocab: number): Batch {
  const n = b * t;
  const inputs = Int32Array.from({ length: n }, (_, i) => (i * 7 + seed) % vocab);
  const targets = Int32Array.from({ length: n }, (_, i) => (i * 5 + seed + 1) % vocab);
  return { inputs, targets, mask: new Float32Array(n).fill(1), b, t };
}

/** The kernels and stream calls of one training step. */
function step(s: ReturnType<typeof setup>, lr: number, bt: Batch): { launched: string[]; calls: string[]; modes: string[] } {
  const l0 = s.driver.launched.length, c0 = s.driver.calls.length;
  const modes: string[] = [];
  const orig = s.be.captured.bind(s.be);
  s.be.captured = <R>(label: string, body: () => R): R => { const r = orig(label, body); modes.push(`${label}:${s.be.lastRegionMode}`); return r; };
  try {
    s.runner.trainStep([bt], s.opt, lr, 1);
  } finally {
    s.be.captured = orig;
  }
  return { launched: s.driver.launched.slice(l0), calls: s.driver.calls.slice(c0), modes };
}

test('the training step: eager, then captured, then replayed; a replay runs the eager step\'s kernels in order', () => {
  const s = setup();
  const v = s.cfg.vocabSize;
  const first = step(s, 1e-3, batch(2, 8, 1, v));
  assert.deepEqual(first.modes, ['training pass:eager', 'optimizer:eager']);
  assert.ok(first.launched.includes('adamw_multi'), 'the optimizer is one adamw_multi launch');
  assert.equal(first.launched.filter((k) => k.startsWith('adamw')).length, 1);
  // Another lr and other tokens: the same regions (what changes per step travels in device buffers).
  const second = step(s, 5e-4, batch(2, 8, 2, v));
  assert.deepEqual(second.modes, ['training pass:capture', 'optimizer:capture']);
  assert.ok(second.calls.some((c) => c.startsWith('capture launch')), 'the pass was captured');
  const third = step(s, 2e-4, batch(2, 8, 3, v));
  assert.deepEqual(third.modes, ['training pass:replay', 'optimizer:replay']);
  assert.equal(third.calls.filter((c) => c === 'launch').length, 1, 'only sumSquares is launched outside a graph');
  assert.ok(third.calls.filter((c) => c === 'graphLaunch').length >= 2, 'the pass (in segments) and the optimizer');
  for (const r of [second, third]) assert.deepEqual(r.launched, first.launched, 'a graph runs the eager step\'s kernels, in order');
  // Uploads come before the graph launch (token ids, targets, weights, AdamW's step values); reads after.
  const firstGraph = third.calls.indexOf('graphLaunch');
  assert.ok(third.calls.slice(0, firstGraph).filter((c) => c === 'htod').length >= 3);
  const segs = first.launched.length; // an upper bound on the pass's segments
  const g = s.be.graphStats;
  assert.ok(g.captures >= 2 && g.captures <= segs + 1 && g.replays === g.captures, JSON.stringify(g));
  assert.ok(s.driver.liveGraphs === g.captures);
  s.be.dispose();
  assert.equal(s.driver.liveGraphs, 0, 'dispose destroys every graph');
  assert.match(s.lines.join('\n'), new RegExp(`\\[cuda-graphs\\] ${g.captures} graphs captured, ${g.replays} replays`));
});

test('another shape is another graph (eager once, then captured); the first shape still replays', () => {
  const s = setup();
  const v = s.cfg.vocabSize;
  step(s, 1e-3, batch(2, 8, 1, v));
  step(s, 1e-3, batch(2, 8, 1, v));
  assert.deepEqual(step(s, 1e-3, batch(1, 8, 1, v)).modes, ['training pass:eager', 'optimizer:replay']);
  assert.deepEqual(step(s, 1e-3, batch(1, 8, 1, v)).modes, ['training pass:capture', 'optimizer:replay']);
  assert.deepEqual(step(s, 1e-3, batch(2, 8, 1, v)).modes, ['training pass:replay', 'optimizer:replay']);
  s.be.dispose();
});

test('graphs off: every region runs as launched, with the same kernels', () => {
  const on = setup(true), off = setup(false);
  const v = on.cfg.vocabSize;
  for (let i = 0; i < 3; i++) {
    const a = step(on, 1e-3, batch(2, 8, i, v)), b = step(off, 1e-3, batch(2, 8, i, v));
    assert.deepEqual(a.launched, b.launched);
    assert.deepEqual(b.modes, ['training pass:eager', 'optimizer:eager']);
  }
  assert.equal(off.driver.calls.filter((c) => c.includes('graphLaunch')).length, 0);
  on.be.dispose(); off.be.dispose();
});

test('inside a region: uploads only before the first op, no download or sumSquares, no nesting; a throwing body issues what it recorded', () => {
  const s = setup();
  const a = s.be.alloc(64, 'a'), ids = s.be.allocInt(4, 'ids');
  s.be.captured('ok', () => { s.be.uploadInt(ids, new Int32Array(4)); s.be.add(a, a, a, 64); });
  assert.throws(() => s.be.captured('late upload', () => { s.be.add(a, a, a, 64); s.be.upload(a, [1]); }),
    /uploading a inside the captured region "late upload" after its first GPU op/);
  assert.throws(() => s.be.captured('read', () => { s.be.add(a, a, a, 64); s.be.download(a); }), /downloading a inside the captured region "read"/);
  assert.throws(() => s.be.captured('norm', () => s.be.sumSquares(a, 64)), /sumSquares inside the captured region "norm"/);
  assert.throws(() => s.be.captured('outer', () => s.be.captured('inner', () => {})), /"inner" opened inside "outer"/);
  // A body that throws has issued every op recorded before the throw (here 100: segments of 32 and 64, then 4 pending).
  const l0 = s.driver.launched.length;
  assert.throws(() => s.be.captured('boom', () => { for (let i = 0; i < 100; i++) s.be.add(a, a, a, 64); throw new Error('boom'); }), /boom/);
  assert.equal(s.driver.launched.length - l0, 100, 'every op before the throw ran, as without a region');
  // After the errors the backend records again.
  s.be.captured('ok', () => { s.be.uploadInt(ids, new Int32Array(4)); s.be.add(a, a, a, 64); });
  assert.equal(s.be.lastRegionMode, 'capture');
  s.be.dispose();
});

test('the region fingerprint is every argument: a changed scalar or pointer is another graph, never a stale replay', () => {
  const s = setup();
  const a = s.be.alloc(64, 'a'), b = s.be.alloc(64, 'b');
  const run = (scale: number, x = a): string | null => { s.be.captured('r', () => s.be.scale(x, scale, 64)); return s.be.lastRegionMode; };
  assert.equal(run(2), 'eager');
  assert.equal(run(2), 'capture');
  assert.equal(run(2), 'replay');
  assert.equal(run(3), 'eager', 'another scale: another region');
  assert.equal(run(2, b), 'eager', 'another buffer: another region');
  assert.equal(run(2), 'replay');
  s.be.dispose();
});

test('GraphRunner: a capture that fails is logged once, the region runs eagerly, and so does every later one', () => {
  const d = fakeDriver();
  const lines: string[] = [];
  const r = new GraphRunner(Object.assign(d, { beginCapture: () => { throw new Error('CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED'); } }),
    { enabled: true, log: (l) => lines.push(l), profile: null });
  const ops: GraphOp[] = [{ fp: 'k1', key: 'k', issue: () => d.launch('k1', [1, 1, 1], 1, 0, Buffer.alloc(0), '') }];
  assert.equal(r.run('x', 0, ops, 0), 'eager');
  assert.equal(r.run('x', 0, ops, 0), 'eager');
  assert.equal(r.run('x', 0, ops, 0), 'eager');
  assert.deepEqual(d.launched, ['k1', 'k1', 'k1']);
  assert.equal(lines.filter((l) => l.includes('[cuda-graphs] capturing x failed (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)')).length, 1);
  assert.equal(r.enabled, false);
  const rows = r.timeline();
  assert.equal(rows.length, 1);
  assert.equal(rows[0]!.calls, 3);
  assert.match(formatTimeline(rows), /\[cuda-timeline\] x +eager +3 +1 /);
});

test('a region is cut into segments by op count alone: the same region, the same segments and graphs', () => {
  assert.deepEqual([0, 1, 2, 3, 4, 5, 9].map(segmentOps), [32, 64, 128, 256, 512, 512, 512]);
  const s = setup();
  const a = s.be.alloc(64, 'a');
  const body = (): void => { for (let i = 0; i < 100; i++) s.be.scale(a, 1 + i, 64); };
  s.be.captured('long', body);
  const c0 = s.driver.calls.length;
  s.be.captured('long', body);
  assert.deepEqual(s.driver.calls.slice(c0).filter((c) => c === 'graphLaunch').length, 3, '100 ops: segments of 32, 64 and 4');
  const l0 = s.driver.launched.length;
  s.be.captured('long', body);
  assert.equal(s.driver.launched.length - l0, 100);
  assert.equal(s.be.graphStats.replays, 3);
  s.be.dispose();
});

test('graphsFromEnv: on unless DISTILLERY_CUDA_GRAPHS is 0/false/off/no', () => {
  assert.equal(graphsFromEnv({}), true);
  assert.equal(graphsFromEnv({ DISTILLERY_CUDA_GRAPHS: '1' }), true);
  for (const v of ['0', 'false', 'OFF', 'no']) assert.equal(graphsFromEnv({ DISTILLERY_CUDA_GRAPHS: v }), false, v);
});

test('adamw chunk table: every element of every segment once, chunks within one tensor, starts past 2^32 split in two words', () => {
  const segs = [{ offset: 0, size: 5, decay: true }, { offset: 5, size: 2 * ADAMW_CHUNK + 3, decay: false }, { offset: 2 ** 32 + 7, size: 10, decay: true },
    { offset: 9, size: 0, decay: true }];
  const t = adamwChunkTable(segs);
  const chunks: Array<[number, number, number]> = [];
  for (let i = 0; i < t.length; i += ADAMW_CHUNK_WORDS) chunks.push([(t[i]! >>> 0) + t[i + 1]! * 2 ** 32, t[i + 2]!, t[i + 3]!]);
  assert.deepEqual(chunks, [
    [0, 5, 1], [5, ADAMW_CHUNK, 0], [5 + ADAMW_CHUNK, ADAMW_CHUNK, 0], [5 + 2 * ADAMW_CHUNK, 3, 0], [2 ** 32 + 7, 10, 1],
  ]);
});

test('batched generation: the device-sampled decode step is one region, captured on its second step and replayed after (positions, ids and uniforms travel in device buffers)', () => {
  const s = setup();
  const m = new Transformer(s.be, s.cfg, { batch: 1, seq: 1, training: false, precision: 'bf16' });
  const g = new BatchGenerator(m, 3, 16);
  const before = { ...s.be.graphStats };
  g.generateOnDevice([[1, 2, 3], [4], [5, 6]], { temperature: 0.9, topP: 0.9, topK: 5, maxNewTokens: 6, seed: 1 });
  const after = s.be.graphStats;
  // 5 decode steps: eager, capture, then 3 replays (of its segments)
  assert.ok(after.captures > before.captures, JSON.stringify(after));
  // a decode step's head reads the norm's rows in place: the only device-to-device copies are the prefill's 3 gathers
  assert.equal(s.driver.calls.filter((c) => c.endsWith('dtod')).length, 3, JSON.stringify(s.driver.calls.filter((c) => c.includes('dtod'))));
  assert.ok(after.replays - before.replays >= 3 * (after.captures - before.captures), JSON.stringify({ before, after }));
  s.be.dispose();
});

/**
 * A cached distillation (KL against sample:4 rows, no teacher) of a student on setup()'s backend, and its batches: the
 * sparse rows of `cached(seed, into)` are written into `into` (a new SparseHost by default).
 */
function cachedSetup(s: ReturnType<typeof setup>) {
  const v = s.cfg.vocabSize;
  const student = new Transformer(s.be, s.cfg, { batch: 2, seq: 8, training: true, precision: 'bf16' });
  const rep = { kind: 'sample', n: 4 } as const;
  const runner = new StepRunner(student, null, { kind: 'kl', temperature: 2, alpha: 0.5, beta: 0.5 }, { sparse: rep });
  const opt = new AdamW(student, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 });
  const cached = (seed: number, h: SparseHost = allocSparseHost(16, 4)): Batch => {
    for (let r = 0; r < 16; r++) { for (let k = 0; k < 4; k++) { h.ids[r * 4 + k] = (r + k + seed) % v; h.prob[r * 4 + k] = 0.25; h.logq[r * 4 + k] = -1.5; } h.argmax[r] = r % v; }
    return { ...batch(2, 8, seed, v), sparse: h };
  };
  return { rep, runner, opt, cached };
}

test('a cached distillation step (the sparse loss) and a teacher-cache pass run as regions: eager, captured, replayed, nothing illegal inside', () => {
  const s = setup();
  const cfg = s.cfg, v = cfg.vocabSize;
  const { rep, runner, opt, cached } = cachedSetup(s);
  const modes: string[] = [];
  const orig = s.be.captured.bind(s.be);
  s.be.captured = <R>(label: string, body: () => R): R => { const r = orig(label, body); modes.push(`${label}:${s.be.lastRegionMode}`); return r; };
  for (let i = 0; i < 3; i++) runner.trainStep([cached(i)], opt, 1e-3, 1);
  assert.deepEqual(modes.filter((m) => m.startsWith('training pass')), ['training pass:eager', 'training pass:capture', 'training pass:replay']);
  assert.ok(s.driver.launched.includes('sparse_loss'));
  // the teacher-cache job's pass: the forward is a region, the sparse rows come out after it
  const teacher = new Transformer(s.be, cfg, { batch: 2, seq: 8, training: false, precision: 'bf16' });
  const pass = new TeacherPass(teacher, v, 2, rep);
  modes.length = 0;
  for (let i = 0; i < 3; i++) pass.run(batch(2, 8, i, v).inputs, 2, 8, () => 0.5, () => undefined);
  assert.deepEqual(modes, ['teacher cache pass:eager', 'teacher cache pass:capture', 'teacher cache pass:replay']);
  assert.ok(s.driver.launched.includes('sample_rows'));
  s.be.captured = orig;
  // two passes queued back to back: each one's rows come back by copies queued after its kernels and an event, and
  // nothing in start() waits for the device (no synchronous copy): the second pass is queued while the first runs
  const c0 = s.driver.calls.length;
  pass.start(batch(2, 8, 5, v).inputs, 2, 8, () => 0.5);
  pass.start(batch(2, 8, 6, v).inputs, 2, 8, () => 0.5);
  const calls = s.driver.calls.slice(c0);
  assert.ok(!calls.includes('dtoh'), calls.join(' '));
  const passes = calls.join(' ').split(/(?<=record) /);
  assert.equal(passes.length, 2, calls.join(' '));
  for (const p of passes) assert.match(p, /launch (dtohAsync ){4}record$/, 'four copies (logq, tail, ids, argmax) after the kernels, then the event');
  assert.ok(pass.collect() && pass.collect() && pass.collect() === null);
  s.be.dispose();
});

test('a cached run\'s sparse rows upload from page-locked host stagings: copies queued by address, an event after them, settled before the rows are rewritten', () => {
  const s = setup();
  const { runner, opt, cached } = cachedSetup(s);
  const ring = new SparseRing(2, 16, 4, 'f32', (bytes, label) => s.be.hostStaging(bytes, label));
  let waits = 0;
  const waitEvent = s.driver.waitEvent.bind(s.driver);
  s.driver.waitEvent = (ev, what) => { waits++; waitEvent(ev, what); };
  for (let i = 0; i < 4; i++) {
    const w0 = waits, bt = cached(i, ring.take());
    // the first two takes are fresh stagings; from the third on, a buffer's earlier uploads are waited for first
    assert.equal(waits - w0, i < 2 ? 0 : 1, `take ${i}`);
    const c0 = s.driver.calls.length;
    runner.trainStep([bt], opt, 1e-3, 1);
    const calls = s.driver.calls.slice(c0);
    const staged = calls.slice(0, calls.findIndex((c) => c === 'launch' || c === 'graphLaunch' || c.startsWith('capture')));
    // five arrays (ids, weights, log q, tail, argmax), each a copy by address then its staging's event; inputs, targets and
    // token weights (small, pageable) are plain copies
    assert.equal(staged.filter((c) => c === 'htodAsync').length, 5, staged.join(' '));
    assert.match(`${staged.join(' ')} `, /^(htod )+(htodAsync record ){5}$/, staged.join(' '));
  }
  s.be.dispose();
});

/**
 * Rank 0 of 2 with a communicator that queues its gradient buckets on the backend's side stream as NcclComm does
 * (overlapsRegions): each bucket a 'reduce' call on that stream, waiting joins the streams.
 */
class SideStreamComm extends OneRankView {
  readonly overlapsRegions = true;
  constructor(private readonly be: CudaBackend, private readonly calls: string[]) { super(2); }
  override reduceScatterStart(_be: Backend, _buf: Buf, begin: number, end: number): CommWork {
    this.be.sideCollective('reducing a gradient bucket', (stream) => this.calls.push(`reduce ${begin}..${end} on ${String(stream)}`));
    return { wait: () => this.be.joinSide() };
  }
}

test('data parallel with NCCL-like collectives: the buckets fork to the side stream between graph segments of the captured pass, eager, captured and replayed alike; the streams join before the norm', () => {
  const s = setup();
  const v = s.cfg.vocabSize;
  const opt = new ShardedAdamW(s.runner.student.trainable(), { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 }, new SideStreamComm(s.be, s.driver.calls));
  opt.bucket = Math.ceil(s.runner.student.trainable().layout.total / 4);
  const steps = [1, 2, 3].map((seed) => {
    const modes: string[] = [];
    const orig = s.be.captured.bind(s.be);
    s.be.captured = <R>(label: string, body: () => R): R => { const r = orig(label, body); modes.push(`${label}:${s.be.lastRegionMode}`); return r; };
    const l0 = s.driver.launched.length, c0 = s.driver.calls.length;
    try { s.runner.trainStep([batch(2, 8, seed, v)], opt, 1e-3, 1); } finally { s.be.captured = orig; }
    return { modes, launched: s.driver.launched.slice(l0), calls: s.driver.calls.slice(c0) };
  });
  assert.deepEqual(steps.map((x) => x.modes[0]), ['training pass:eager', 'training pass:capture', 'training pass:replay']);
  for (const [i, st] of steps.entries()) {
    const reduces = st.calls.filter((c) => c.startsWith('reduce'));
    assert.ok(reduces.length >= 3, `step ${i}: ${reduces.length} buckets`);
    assert.ok(reduces.every((c) => c.endsWith('on fake side stream')));
    assert.ok(!st.calls.some((c) => /^capture (fork|join)/.test(c)), `step ${i}: no fork or join inside a capture`);
    // each reduce right after its fork; the first fork before the pass's last segment: the buckets overlap the backward
    st.calls.forEach((c, k) => { if (c.startsWith('reduce')) assert.equal(st.calls[k - 1], 'fork', `step ${i}: call ${k}`); });
    const passIssue = i === 0 ? 'launch' : i === 1 ? 'graphLaunch' : 'graphLaunch';
    assert.ok(st.calls.indexOf('fork') < st.calls.lastIndexOf(passIssue), `step ${i}: a fork before the pass's last ${passIssue}`);
    // one join, after the last reduce and before the norm's read-back
    assert.equal(st.calls.filter((c) => c === 'join').length, 1, `step ${i}`);
    const join = st.calls.indexOf('join');
    assert.ok(join > st.calls.lastIndexOf(reduces[reduces.length - 1]!) && join < st.calls.lastIndexOf('dtoh'), `step ${i}: join placed`);
    assert.deepEqual(st.launched, steps[0]!.launched, 'the same kernels, in order');
  }
  assert.throws(() => s.be.captured('r', () => { s.be.sideCollective('x', () => {}); s.be.joinSide(); }), /joinSide inside the captured region "r"/);
  s.be.dispose();
});

test('capturedRepeat: the region is recorded once and repeated from its segments (eager, captured, replayed), the body run again only to check it', () => {
  const s = setup();
  const be = s.be, x = be.alloc(64, 'x'), y = be.alloc(64, 'y');
  let bodies = 0, scale = 2;
  const body = (): void => { bodies++; be.scale(y, scale, 64); be.add(x, x, y, 64); };
  const modes: string[] = [];
  const again = be.capturedRepeat('repeated', body);
  modes.push(be.lastRegionMode!);
  const launchesBefore = s.driver.calls.filter((c) => c === 'launch').length;
  for (let i = 0; i < 4; i++) { again(); modes.push(be.lastRegionMode!); }
  assert.deepEqual(modes, ['eager', 'capture', 'replay', 'replay', 'replay']);
  assert.equal(bodies, 2, 'the body ran when recorded and once more, unissued, at the first repeat\'s check');
  // the repeats issued graphs, not ops: one eager region's launches, then none outside a capture
  assert.equal(s.driver.calls.filter((c) => c === 'launch').length, launchesBefore, 'no op launched eagerly by a repeat after the first region');
  assert.ok(s.driver.calls.filter((c) => c === 'graphLaunch').length >= 3);
  // the check every REPEAT_CHECK_EVERY-th repeat: a host value the body reads changed, and the repeat refuses by name
  scale = 3;
  for (let i = 4; i < REPEAT_CHECK_EVERY; i++) again(); // repeats 5 to 64: not checked (scale changed unnoticed until the 65th)
  assert.throws(() => again(), /captured region "repeated" repeated: its body now issues other work than when it was recorded/);
  // and a body that changes before the first repeat is caught at once
  let n = 64;
  const again2 = be.capturedRepeat('repeated 2', () => { be.scale(y, 2, n); });
  n = 32;
  assert.throws(() => again2(), /captured region "repeated 2" repeated/);
  // what a repeat cannot carry is refused when recorded: an upload (it would run at the recording only), a collective on
  // the side stream; and a repeat inside another region
  assert.throws(() => be.capturedRepeat('with upload', () => { be.upload(x, [1]); be.scale(y, 2, 64); }), /uploading x inside the repeated region "with upload"/);
  assert.throws(() => be.capturedRepeat('with side', () => { be.scale(y, 2, 64); be.sideCollective('a collective', () => {}); }), /"with side" forks a collective to the side stream: it cannot be repeated/);
  const again3 = be.capturedRepeat('inner', () => { be.scale(y, 2, 64); });
  assert.throws(() => be.captured('outer', () => { be.scale(x, 2, 64); again3(); }), /captured region "inner" repeated inside "outer"/);
  s.be.dispose();
});

test('capturedRepeat on the CPU backend runs the body at every call; a trace backend traces it once', () => {
  const cpu = createCpuBackend({ threads: 1 });
  const x = cpu.alloc(4, 'x');
  cpu.upload(x, [1, 2, 3, 4]);
  const again = cpu.capturedRepeat('r', () => cpu.add(x, x, x, 4));
  again(); again();
  assert.deepEqual([...cpu.download(x)], [8, 16, 24, 32]);
  cpu.dispose();
});
