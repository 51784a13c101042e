/**
 * GPU-only (skips cleanly without libcuda or a GPU): a training step replayed from CUDA graphs equals the same step
 * launched op by op, bit for bit. Two backends, one with graphs and one without, distil a bf16 Qwen3-like student
 * (q/k norms, GQA) from a bf16 teacher for five steps with a changing lr and changing tokens; every parameter, AdamW
 * moment and loss statistic must be identical, and the graph backend must have replayed its regions. Then the op
 * profile inside a graph: each op's time comes from event nodes between the ops of one graph launch, and a GEMM's
 * time there is compared with the same GEMM launched alone (printed; bounded loosely). And batched generation with a
 * repetition penalty, its decode steps replayed from a graph, draws what the CPU backend draws.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createCudaBackend } from '../../src/backend/cuda/index.js';
import type { CudaBackend } from '../../src/backend/cuda/cuda-backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { AdamW } from '../../src/train/optimizer.js';
import { StepRunner, type Batch } from '../../src/train/step.js';
import { Rng } from '../../src/util/rng.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { Backend } from '../../src/backend/backend.js';
import { BatchGenerator } from '../../src/model/batch-generate.js';

const dir = process.env.DISTILLERY_CACHE_DIR ?? mkdtempSync(join(tmpdir(), 'dk-graphs-'));
const made: CudaBackend[] = [];
let reason = '';
function backend(graphs: boolean, profile = false): CudaBackend | null {
  try {
    const b = createCudaBackend({ strict: false, cacheDir: dir, graphs, profile, log: () => {} });
    made.push(b);
    return b;
  } catch (e) { reason = (e as Error).message; return null; }
}
const probe = backend(false);
const skip = probe ? false : `no CUDA GPU here (${reason})`;
after(() => { for (const b of made) b.dispose(); });

const QWEN3: ModelConfig = {
  architecture: 'qwen3', vocabSize: 320, hiddenSize: 64, intermediateSize: 176, numLayers: 2, numHeads: 4, numKvHeads: 2,
  headDim: 32, rope: { type: 'default', theta: 1e6 }, rmsNormEps: 1e-6, tieWordEmbeddings: false, maxPositionEmbeddings: 256,
  qkvBias: false, qkNorm: true, noRopeLayers: [],
};
const TEACHER: ModelConfig = { ...QWEN3, hiddenSize: 128, numLayers: 3, intermediateSize: 256 };
const B = 2, T = 64;

function run(be: CudaBackend): { params: Float32Array; m: Float32Array; v: Float32Array; stats: number[] } {
  const student = new Transformer(be, QWEN3, { batch: B, seq: T, training: true, precision: 'bf16' });
  const teacher = new Transformer(be, TEACHER, { batch: B, seq: T, training: false, precision: 'bf16' });
  student.setWeights(initialWeights(parameterLayout(QWEN3), QWEN3, new Rng(1), 0.1));
  teacher.setWeights(initialWeights(parameterLayout(TEACHER), TEACHER, new Rng(2), 0.1));
  const runner = new StepRunner(student, teacher, { kind: 'kl', temperature: 2, alpha: 0.5, beta: 0.5 });
  const opt = new AdamW(student, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 });
  const r = new Rng(3);
  const stats: number[] = [];
  for (let s = 0; s < 5; s++) {
    // Distinct ids within a batch: the embedding backward adds with atomics, so a repeated id would make even two
    // uncaptured runs differ in the last bit (the order of the additions is the hardware's).
    const perm = Int32Array.from({ length: QWEN3.vocabSize }, (_, i) => i);
    for (let i = perm.length - 1; i > 0; i--) { const j = Math.floor(r.next() * (i + 1)); [perm[i], perm[j]] = [perm[j]!, perm[i]!]; }
    const inputs = perm.slice(0, B * T);
    const targets = Int32Array.from({ length: B * T }, () => Math.floor(r.next() * QWEN3.vocabSize));
    const batch: Batch = { inputs, targets, mask: new Float32Array(B * T).fill(1), b: B, t: T };
    const res = runner.trainStep([batch], opt, 1e-3 / (s + 1), 1);
    stats.push(res.loss, res.ce, res.div, res.gradNorm);
  }
  return { params: Float32Array.from(be.download(student.params)), m: Float32Array.from(be.download(opt.m)), v: Float32Array.from(be.download(opt.v)), stats };
}

test('a training step replayed from CUDA graphs equals the step launched op by op, bit for bit', { skip }, () => {
  const eager = probe!;
  const graphs = backend(true)!;
  const a = run(eager), b = run(graphs);
  assert.deepEqual(b.stats, a.stats, 'losses and gradient norms');
  for (const k of ['params', 'm', 'v'] as const) {
    const x = a[k], y = b[k];
    let diff = 0;
    for (let i = 0; i < x.length; i++) if (!Object.is(x[i], y[i])) diff++;
    assert.equal(diff, 0, `${k}: ${diff} of ${x.length} elements differ`);
  }
  const g = graphs.graphStats;
  assert.equal(g.enabled, true);
  assert.ok(g.captures >= 2, 'the training pass (in segments) and the optimizer, captured once each');
  assert.equal(g.replays, 3 * g.captures, 'steps 3 to 5 replay every segment');
  assert.equal(eager.graphStats.replays, 0);
});

test('the op profile inside a graph times every op the eager profile times', { skip }, () => {
  const withGraphs = backend(true, true)!, without = backend(false, true)!;
  run(withGraphs);
  run(without);
  const calls = (t: string): Map<string, number> => new Map(t.split('\n').map((l) => /^\[cuda-profile\] (\S.*?)\s{2,}(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+$/.exec(l))
    .filter((m): m is RegExpExecArray => m !== null).map((m) => [m[1]!, Number(m[2])]));
  const a = withGraphs.profileTable()!, b = without.profileTable()!;
  process.stdout.write(`# with graphs\n${a}\n# without\n${b}\n`);
  assert.ok(withGraphs.graphStats.replays > 0);
  const ca = calls(a), cb = calls(b);
  assert.ok(ca.size > 10, a);
  assert.deepEqual([...ca].sort(), [...cb].sort(), 'the same ops, the same number of times');
  assert.ok(ca.has('adamw_multi'));
});

test('batched generation with a repetition penalty: the decode step replayed from a graph keeps the seen-token bitmask current (CUDA equals the CPU backend)', { skip }, () => {
  const be = backend(true)!;
  const cpu = createCpuBackend({ threads: 1 });
  try {
    const w = initialWeights(parameterLayout(QWEN3), QWEN3, new Rng(5), 1.0); // peaked logits: greedy decoding repeats itself
    const gen = (b: Backend) => {
      const m = new Transformer(b, QWEN3, { batch: 1, seq: 1, training: false, precision: 'fp32' });
      m.setWeights(w);
      return new BatchGenerator(m, 3, 32);
    };
    const prompts = [[1, 2, 3, 2], [40], [7, 8]];
    const g = gen(be), c = gen(cpu);
    for (const opts of [
      { temperature: 0, topP: 1, topK: 0, repetitionPenalty: 1.8, maxNewTokens: 12 },
      { temperature: 0.8, topP: 0.9, topK: 30, minP: 0.05, repetitionPenalty: 1.3, maxNewTokens: 12, seed: 3 },
    ]) {
      const before = be.graphStats.replays;
      const got = g.generateOnDevice(prompts, opts).tokens, want = c.generateOnDevice(prompts, opts).tokens;
      assert.deepEqual(got, want, JSON.stringify(opts));
      assert.ok(be.graphStats.replays - before >= 8, `decode steps replayed: ${be.graphStats.replays - before}`);
      if (opts.temperature === 0) {
        const plain = c.generateOnDevice(prompts, { ...opts, repetitionPenalty: 1 }).tokens;
        assert.notDeepEqual(want, plain, 'the penalty changes greedy decoding here');
      }
    }
  } finally { cpu.dispose(); }
});
