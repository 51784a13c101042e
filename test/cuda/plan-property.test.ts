/**
 * Property (no GPU): for many random model/job configurations, every kernel the REAL job code launches is in the
 * pre-warm plan. The runtime set is recorded by a trace-mode CudaBackend passed as `hooks.backend` to the real
 * runTraining (a tiny text file, 2 steps, evaluation on, gradient accumulation sometimes) plus a real
 * Generator.generate with a random prompt length; the plan is built separately with
 * planKernels(jobClosures(...)) from the job's settings. runTraining's own prepare() call cannot pollute the
 * recorded set: a trace backend's prepare() is a no-op, and planKernels traces on backends of its own (checked).
 * Randomized over: hidden size, heads, KV heads, head dim, eps, theta and RoPE scaling (kind and parameters), seq, batch, tied or not, biases or not,
 * architecture, loss kind/alpha/T/beta, train vs distill. Seeded, so a failure reproduces; it names the config.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import type { DistillKind, LossSpec } from '../../src/backend/backend.js';
import { CudaBackend } from '../../src/backend/cuda/cuda-backend.js';
import { planKernels } from '../../src/backend/cuda/plan.js';
import type { KernelSpec } from '../../src/backend/cuda/kernels/spec.js';
import { oProjBias, toHfConfig, type ModelConfig } from '../../src/model/config.js';
import { describeRope, yarnMscale, type RopeSpec } from '../../src/backend/rope.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { writeCheckpoint } from '../../src/model/checkpoint.js';
import { Transformer } from '../../src/model/transformer.js';
import { Generator } from '../../src/model/generate.js';
import { loadDocCorpus } from '../../src/data/index.js';
import { trainBpe } from '../../src/tokenizer/train-bpe.js';
import type { Tokenizer } from '../../src/tokenizer/bpe.js';
import { runTraining } from '../../src/train/run.js';
import { jobClosures } from '../../src/train/kernel-plan.js';
import { DEFAULT_RUN_OPTIONS, type RunOptions } from '../../src/train/options.js';
import { resolveLogits } from '../../src/train/precision.js';
import { Rng } from '../../src/util/rng.js';
import { rng as mulberry } from './helpers.js';
import { buildTeacherCache } from '../../src/cache/build.js';
import { formatSparse, type SparseRep } from '../../src/cache/sparse.js';
import { LORA_TARGETS, loraLayout, type LoraSpec } from '../../src/model/lora.js';

const CASES = Number(process.env.DISTILLERY_PROPERTY_CASES ?? 40);
let dir = '';
let tok: Tokenizer;
let tokPath = '';
let dataPath = '';
let choicesPath = '';
let generationPath = '';

before(() => {
  dir = fs.mkdtempSync(path.join(tmpdir(), 'dk-prop-'));
  const docs = loadDocCorpus({ maxChars: 12_000 }).documents;
  dataPath = path.join(dir, 'corpus.txt');
  fs.writeFileSync(dataPath, docs.join('\n\n'));
  tok = trainBpe(docs, { vocabSize: 300, specialTokens: ['<|endoftext|>', '<|im_start|>', '<|im_end|>'] });
  tokPath = path.join(dir, 'tokenizer.json');
  fs.writeFileSync(tokPath, JSON.stringify(tok.toJSON()));
  choicesPath = path.join(dir, 'choices.jsonl');
  fs.writeFileSync(choicesPath, [
    { context: 'Returns the', choices: ['a', 'an'], answer: 0 }, { context: '', choices: ['The', 'A'], answer: 1 },
    { context: 'The number of elements in the array', choices: ['is', 'of'], answer: 0 },
  ].map((x) => JSON.stringify(x)).join('\n') + '\n');
  generationPath = path.join(dir, 'generation.jsonl');
  fs.writeFileSync(generationPath, [
    { context: 'Returns the number of', target: 'elements' }, { context: 'The', target: ['array', 'list'] }, { context: 'Each element of the', target: 'array' },
  ].map((x) => JSON.stringify(x)).join('\n') + '\n');
});
after(() => { fs.rmSync(dir, { recursive: true, force: true }); });

const hash = (s: KernelSpec): string => createHash('sha256').update(s.source()).digest('hex');

/** Plain RoPE half the time, else linear / llama3 / yarn with random parameters (what real checkpoints set). */
function randomRope(r: () => number, theta: number, maxPos: number): RopeSpec {
  const u = r();
  const factor = Number((1 + 31 * r()).toFixed(2));
  const originalMaxPositionEmbeddings = Math.max(8, Math.round(maxPos * (0.25 + r())));
  if (u < 0.5) return { type: 'default', theta };
  if (u < 0.65) return { type: 'linear', theta, factor };
  if (u < 0.82) {
    const lowFreqFactor = Number((0.5 + r()).toFixed(2));
    return { type: 'llama3', theta, factor, lowFreqFactor, highFreqFactor: lowFreqFactor + Number((0.5 + 4 * r()).toFixed(2)), originalMaxPositionEmbeddings };
  }
  return {
    type: 'yarn', theta, factor, originalMaxPositionEmbeddings, betaFast: Number((8 + 40 * r()).toFixed(1)), betaSlow: Number((0.5 + r()).toFixed(2)),
    attentionFactor: r() < 0.5 ? yarnMscale(factor) : Number((0.8 + r()).toFixed(3)), truncate: r() < 0.7,
  };
}

function randomConfig(r: () => number, vocab: number, maxSeq: number): ModelConfig {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
  const nKv = pick([1, 2, 3]);
  const numHeads = nKv * pick([1, 2, 3]);
  const headDim = pick([4, 8, 12, 16, 32]);
  const hiddenSize = pick([numHeads * headDim, 8 * Math.ceil((numHeads * headDim) / 8) + 8, 24, 40]);
  const architecture = pick(['qwen2', 'llama', 'qwen3', 'smollm3'] as const);
  const numLayers = pick([1, 2, 3]);
  // SmolLM3: a random subset of layers without RoPE (possibly none, possibly all).
  const noRopeLayers = architecture === 'smollm3' ? Array.from({ length: numLayers }, (_, l) => l).filter(() => r() < 0.5) : [];
  return {
    architecture, vocabSize: vocab, hiddenSize, intermediateSize: pick([16, 40, 64, 2 * hiddenSize + 8]), numLayers,
    numHeads, numKvHeads: nKv, headDim,
    rope: randomRope(r, pick([1e4, 5e5, 1e6, Math.round(1000 + r() * 1e6)]), Math.max(maxSeq, 64)),
    rmsNormEps: pick([1e-5, 1e-6, Number((10 ** -(4 + 3 * r())).toPrecision(3))]),
    // HF Qwen2 always has Q/K/V biases; the other families' attention_bias also gives o_proj one.
    tieWordEmbeddings: r() < 0.5, maxPositionEmbeddings: Math.max(maxSeq, 64), qkvBias: architecture === 'qwen2' ? true : r() < 0.3,
    qkNorm: architecture === 'qwen3', noRopeLayers,
  };
}

interface Case {
  student: ModelConfig; teacher: ModelConfig | null; batch: number; seq: number; gradAccum: number; kind: DistillKind; alpha: number;
  temperature: number; beta: number; prompt: number;
  /** Distill from a teacher cache of this representation (made by the real cache job on the trace backend first). */
  cache: SparseRep | null;
  /** On-policy distillation (λ = 1: every step generates with the student). */
  onPolicy: boolean;
  /** LoRA adapters on a frozen --init student (rank, alpha, targets), or null for full training. */
  lora: LoraSpec | null;
  /** Frozen weights in NF4: the teacher's (--teacher-dtype nf4), the LoRA base's (--base-dtype nf4). */
  teacherNf4: boolean;
  baseNf4: boolean;
  /** bf16 storage and products (--precision bf16, the CUDA default) instead of fp32. */
  bf16: boolean;
  /** --eval-choices: the student (and a live teacher) score multiple-choice items at every evaluation. */
  choices: boolean;
  /** With choices: generation items beside them (the student, and a live teacher, generate greedily). */
  generate: boolean;
  /** With generate: --eval-gen-batch (0: the run's batch; LoRA: at most it). */
  genBatch: number;
}

function randomCase(seed: number, vocab: number): Case {
  const c = randomCaseBase(seed, vocab);
  // a third of the live-teacher distillations are on-policy (seq ≥ 3: a prompt and a completion)
  if (c.teacher && !c.cache && c.seq >= 3 && seed % 3 === 0) c.onPolicy = true;
  // a third of the others, and half the on-policy runs, train LoRA adapters (random rank, alpha and targets) on a frozen
  // base (on-policy: the student generates with its adapters unmerged)
  if ((!c.onPolicy && seed % 3 === 1) || (c.onPolicy && seed % 2 === 0)) {
    const r = mulberry(seed * 31 + 7);
    const targets = LORA_TARGETS.filter(() => r() < 0.6);
    c.lora = { rank: 1 + Math.floor(r() * 8), alpha: Number((1 + 16 * r()).toFixed(2)), targets: targets.length ? targets : ['o_proj'] };
    c.baseNf4 = r() < 0.5;
  }
  // some live teachers store their matrices in NF4
  if (c.teacher && !c.cache && seed % 4 === 2) c.teacherNf4 = true;
  // half the runs in bf16 (--precision bf16, the CUDA default: fp32 masters with a bf16 compute copy, bf16 logits)
  c.bf16 = seed % 2 === 1;
  // some runs score multiple-choice items at every evaluation
  c.choices = seed % 5 === 3;
  // half of those generate too (generation items in --eval-choices), in fp32 and in bf16
  c.generate = c.choices && seed % 4 < 2;
  // their generators hold the run's batch, or more or fewer sequences (LoRA: at most the batch)
  c.genBatch = c.generate ? [0, 1, c.batch + 2][seed % 3]! : 0;
  if (c.lora && c.genBatch > c.batch) c.genBatch = c.batch;
  return c;
}

function randomCaseBase(seed: number, vocab: number): Case {
  const r = mulberry(seed);
  const seq = 4 + Math.floor(r() * 21), batch = 1 + Math.floor(r() * 3);
  const kind = (['none', 'kl', 'reverse-kl', 'jsd'] as const)[Math.floor(r() * 4)]!;
  const student = randomConfig(r, vocab, seq);
  return {
    student, teacher: kind === 'none' ? null : randomConfig(r, vocab, seq), batch, seq, gradAccum: r() < 0.3 ? 2 : 1,
    kind, alpha: Number(r().toFixed(3)), temperature: Number((0.5 + 3 * r()).toFixed(2)), beta: Number(r().toFixed(2)),
    prompt: 1 + Math.floor(r() * 30),
    cache: kind === 'none' || r() < 0.5 ? null : r() < 0.5 ? { kind: 'sample', n: 1 + Math.floor(r() * 40) } : { kind: 'top', k: 1 + Math.floor(r() * 40) },
    onPolicy: false,
    lora: null,
    teacherNf4: false,
    baseNf4: false,
    bf16: false,
    choices: false,
    generate: false,
    genBatch: 0,
  };
}

function describeCase(c: Case): string {
  const m = (x: ModelConfig): string => `${x.architecture} C${x.hiddenSize} I${x.intermediateSize} L${x.numLayers} h${x.numHeads}/${x.numKvHeads}x${x.headDim} eps${x.rmsNormEps} ${describeRope(x.rope)} ${x.tieWordEmbeddings ? 'tied' : 'untied'} ${x.qkvBias ? (oProjBias(x) ? 'bias+o' : 'bias') : 'nobias'}${x.qkNorm ? ' qknorm' : ''}${x.noRopeLayers.length ? ` nope[${x.noRopeLayers.join(',')}]` : ''}`;
  return `${m(c.student)}${c.teacher ? ` <- ${m(c.teacher)}` : ''}${c.cache ? ` via cache ${formatSparse(c.cache)}` : ''}${c.onPolicy ? ' on-policy' : ''}${c.lora ? ` lora r${c.lora.rank} a${c.lora.alpha} ${c.lora.targets.join(',')}${c.baseNf4 ? ' base nf4' : ''}` : ''}${c.teacherNf4 ? ' teacher nf4' : ''}${c.bf16 ? ' bf16' : ''}${c.choices ? ' eval-choices' : ''}${c.generate ? ` +generation(batch ${c.genBatch || c.batch})` : ''}; B${c.batch} T${c.seq} accum${c.gradAccum} ${c.kind} a${c.alpha} T${c.temperature} b${c.beta} prompt${c.prompt}`;
}

/** The runtime kernel set of a real run + a real generation, on one trace backend. */
async function runtimeSet(c: Case, i: number): Promise<{ traced: KernelSpec[]; run: KernelSpec[]; options: RunOptions }> {
  const caseDir = path.join(dir, `case-${i}`);
  fs.mkdirSync(caseDir, { recursive: true });
  const cfgPath = path.join(caseDir, 'student.json');
  fs.writeFileSync(cfgPath, JSON.stringify(toHfConfig(c.student)));
  let teacherDir: string | undefined;
  if (c.teacher) {
    teacherDir = path.join(caseDir, 'teacher');
    writeCheckpoint(teacherDir, c.teacher, initialWeights(parameterLayout(c.teacher), c.teacher, new Rng(i)), { dtype: 'f32', tokenizerJson: tok.toJSON() });
  }
  let initDir: string | undefined;
  if (c.lora) {
    initDir = path.join(caseDir, 'base');
    writeCheckpoint(initDir, c.student, initialWeights(parameterLayout(c.student), c.student, new Rng(i + 1)), { dtype: 'f32', tokenizerJson: tok.toJSON() });
  }
  const trace = new CudaBackend('trace');
  let prepared = 0;
  const realPrepare = trace.prepare.bind(trace);
  trace.prepare = async (runs) => { prepared++; const before = trace.traced.size; await realPrepare(runs); assert.equal(trace.traced.size, before, 'prepare() recorded kernels into the runtime set'); };
  let cacheDir: string | undefined;
  if (c.cache && teacherDir) {
    // The real cache job, on the same trace backend: its kernels are part of the runtime set.
    cacheDir = path.join(caseDir, 'cache');
    await buildTeacherCache({
      teacher: teacherDir, data: [dataPath], out: cacheDir, seq: c.seq, batch: c.batch, sparse: c.cache, temperature: c.temperature, seed: i,
      valFraction: 0.2, lossOn: 'assistant', maxChars: 0, device: 'cuda', precision: c.bf16 ? 'bf16' : 'fp32', threads: 1, shardWindows: 64, overwrite: false, quiet: true,
    }, { backend: trace, log: () => {} });
    assert.equal(prepared, 1, 'the cache job calls prepare() once');
    prepared = 0;
  }
  const options: RunOptions = {
    ...DEFAULT_RUN_OPTIONS, mode: c.teacher ? 'distill' : 'train', out: path.join(caseDir, 'run'), data: [dataPath], tokenizer: tokPath,
    model: cfgPath, teacher: cacheDir ? undefined : teacherDir, teacherCache: cacheDir, batch: c.batch, seq: c.seq, steps: 2, warmup: 0, gradAccum: c.gradAccum, evalEvery: 1, evalBatches: 2,
    saveEvery: 1000, quiet: true, loss: c.kind === 'none' ? 'kl' : c.kind, alpha: c.alpha, temperature: c.temperature, beta: c.beta,
    valFraction: 0.2, seed: i, ...(c.onPolicy ? { onPolicy: 1, genTemperature: 1, genTopP: 0.9, genTopK: 5 } : {}),
    ...(c.lora ? { init: initDir, loraRank: c.lora.rank, loraAlpha: c.lora.alpha, loraTargets: c.lora.targets.join(','), baseDtype: c.baseNf4 ? 'nf4' : 'auto' } : {}),
    ...(c.teacherNf4 ? { teacherDtype: 'nf4' } : {}),
    ...(c.choices ? { evalChoices: [choicesPath, ...(c.generate ? [generationPath] : [])] } : {}),
    ...(c.generate ? { evalMaxGenToks: Math.max(1, Math.floor(c.seq / 2)), evalGenBatch: c.genBatch } : {}),
    precision: c.bf16 ? 'bf16' : 'fp32',
  };
  const summary = await runTraining(options, { backend: trace, log: () => {} });
  assert.equal(summary.status, 'completed');
  assert.equal(prepared, 1, 'runTraining calls prepare() once');
  const run = [...trace.traced.values()];
  // generation with a random prompt length (greedy on the trace backend's zero logits)
  const m = new Transformer(trace, c.student, { batch: 1, seq: 1, training: false, precision: c.bf16 ? 'bf16' : 'fp32' });
  const g = new Generator(m, c.prompt + 3);
  g.generate(Array.from({ length: c.prompt }, (_, k) => (k * 7 + 3) % c.student.vocabSize), { temperature: 0, topP: 1, maxNewTokens: 3 });
  const traced = [...trace.traced.values()];
  trace.dispose();
  return { traced, run, options };
}

/** The plan of the case's run (and, with `generator`, of the test's own Generator.generate beside it). */
function planFor(c: Case, o: RunOptions, generator = true): KernelSpec[] {
  const loss: LossSpec = o.mode === 'train'
    ? { kind: 'none', alpha: 0, temperature: 1, beta: o.beta }
    : { kind: o.loss, alpha: o.alpha, temperature: o.temperature, beta: o.beta };
  // The cache job's plan (the teacher's forward and head) and the cached run's (no teacher, the sparse loss).
  const precision = c.bf16 ? 'bf16' as const : 'fp32' as const;
  const cacheJob = c.cache && c.teacher ? jobClosures({ student: c.teacher, teacher: c.teacher, batch: o.batch, seq: o.seq, cacheTeacher: c.cache, precision }) : [];
  return planKernels([...cacheJob, ...jobClosures({
    student: c.student, teacher: c.cache ? null : c.teacher, batch: o.batch, seq: o.seq, loss, train: true, evaluate: true, ...(generator ? { generateLen: 2 } : {}),
    adam: { beta1: o.beta1, beta2: o.beta2, eps: o.adamEps, weightDecay: o.weightDecay }, teacherCache: c.cache ?? undefined,
    ...(c.onPolicy ? { onPolicy: true } : {}),
    ...(c.generate ? { generateItems: true, itemsBatch: c.genBatch || o.batch } : {}),
    ...(c.lora ? { lora: loraLayout(c.student, c.lora), ...(c.baseNf4 ? { studentFrozen: 'nf4' as const } : {}) } : {}),
    ...(c.teacherNf4 ? { teacherFrozen: 'nf4' as const } : {}),
    ...(c.choices ? { choices: true } : {}),
    precision, logits: resolveLogits(o.logits, precision),
  })]);
}

test(`property: runtime kernels ⊆ plan over ${CASES} random configs (real runTraining + Generator.generate on a trace backend)`, { timeout: 120_000 }, async () => {
  const t0 = Date.now();
  const families = new Set<string>();
  let loraCases = 0, choiceCases = 0, generateCases = 0;
  for (let i = 0; i < CASES; i++) {
    const c = randomCase(1000 + i, tok.vocabSize);
    if (c.lora) loraCases++;
    if (c.choices) choiceCases++;
    if (c.generate) generateCases++;
    const { traced, run, options } = await runtimeSet(c, i);
    const plan = new Set(planFor(c, options).map(hash));
    const missing = traced.filter((s) => !plan.has(hash(s)));
    assert.deepEqual(missing.map((s) => s.describe()), [], `case ${i}: ${describeCase(c)}`);
    // the run alone within the run's own plan (no Generator closure to cover its generation)
    const runPlan = new Set(planFor(c, options, false).map(hash));
    assert.deepEqual(run.filter((s) => !runPlan.has(hash(s))).map((s) => s.describe()), [], `case ${i} (the run alone): ${describeCase(c)}`);
    assert.ok(traced.length >= 15, `case ${i}: only ${traced.length} kernels traced`);
    for (const s of traced) families.add(s.family);
  }
  for (const f of ['dequant_nf4', 'loss', 'sparse_loss', 'sample_tokens', 'adamw_multi', 'attention_bwd', 'attention_cached', 'kv_cache_write', 'rmsnorm_rows_bwd', 'embedding_bwd']) {
    assert.ok(families.has(f), `no case exercised ${f}`);
  }
  if (CASES >= 10) assert.ok(loraCases > 0 && choiceCases > 0 && generateCases > 0, 'no case trained LoRA adapters, or none scored choices, or none generated items');
  process.stderr.write(`plan property: ${CASES} cases (${loraCases} LoRA, ${choiceCases} with --eval-choices, ${generateCases} with generation items), ${families.size} kernel families, ${Date.now() - t0} ms\n`);
});

test('on-policy LoRA at --batch 1: the plan generates as the run does (a batch of 1 over the student\'s own rows) and covers the run', async () => {
  let seed = 1;
  while (!(randomCase(seed, tok.vocabSize).onPolicy && randomCase(seed, tok.vocabSize).lora)) seed++;
  const c: Case = { ...randomCase(seed, tok.vocabSize), batch: 1 };
  const { traced, options } = await runtimeSet(c, 995);
  const plan = new Set(planFor(c, options).map(hash));
  assert.deepEqual(traced.filter((s) => !plan.has(hash(s))).map((s) => s.describe()), [], `case ${seed}: ${describeCase(c)}`);
  assert.ok(traced.some((s) => s.family === 'attention_cached'), 'the run generated');
});

test('property check has teeth: the plan of a config with another eps, theta or RoPE kind misses runtime kernels', async () => {
  const c = randomCase(7, tok.vocabSize);
  const { traced, options } = await runtimeSet(c, 999);
  const theta = c.student.rope.theta;
  const otherKind: RopeSpec = c.student.rope.type === 'default' ? { type: 'linear', theta, factor: 2 } : { type: 'default', theta };
  const others: ModelConfig[] = [
    { ...c.student, rmsNormEps: c.student.rmsNormEps * 2 }, { ...c.student, rope: { ...c.student.rope, theta: theta + 1 } },
    { ...c.student, rope: otherKind },
  ];
  for (const other of others) {
    const plan = new Set(planFor({ ...c, student: other }, options).map(hash));
    assert.ok(traced.some((s) => !plan.has(hash(s))), 'a plan for a different model should not cover this run');
  }
});

test('property check has teeth for --eval-choices: a plan that leaves the choices\' scoring out misses runtime kernels', async () => {
  // a distillation (its loss kernel is not plain cross-entropy), in bf16 (its logits are bf16; the scoring's f32)
  let seed = 1;
  let c = randomCase(seed, tok.vocabSize);
  while (!(c.teacher && !c.cache && !c.onPolicy && c.bf16)) c = randomCase(++seed, tok.vocabSize);
  c = { ...c, choices: true };
  const { traced, options } = await runtimeSet(c, 996);
  const full = new Set(planFor(c, options).map(hash)), without = new Set(planFor({ ...c, choices: false }, options).map(hash));
  assert.deepEqual(traced.filter((s) => !full.has(hash(s))).map((s) => s.describe()), []);
  assert.ok(traced.some((s) => !without.has(hash(s))), `case ${seed}: ${describeCase(c)}`);
});

test('property check has teeth for generation items: a plan that leaves them out misses the kernels the run\'s own models generate with', async () => {
  // a bf16 LoRA distillation from a live teacher, not on-policy: the items are the only generation of the run
  let seed = 1;
  let c = randomCase(seed, tok.vocabSize);
  while (!(c.teacher && !c.cache && !c.onPolicy && c.bf16 && c.lora)) c = randomCase(++seed, tok.vocabSize);
  c = { ...c, choices: true, generate: true };
  const { traced, options } = await runtimeSet(c, 994);
  assert.ok(traced.some((s) => s.family === 'attention_cached'), 'the run generated');
  const full = new Set(planFor(c, options).map(hash)), without = new Set(planFor({ ...c, generate: false }, options).map(hash));
  assert.deepEqual(traced.filter((s) => !full.has(hash(s))).map((s) => s.describe()), []);
  assert.ok(traced.some((s) => !without.has(hash(s))), `case ${seed}: ${describeCase(c)}`);
});

test('property check has teeth for cached runs: a plan that leaves out the teacher cache (or the cache job) misses runtime kernels', async () => {
  let seed = 1;
  while (!(randomCase(seed, tok.vocabSize).cache)) seed++;
  const c = randomCase(seed, tok.vocabSize);
  const { traced, options } = await runtimeSet(c, 998);
  assert.ok(traced.some((s) => s.family === 'sparse_loss'), 'the cached run launched the sparse loss');
  const full = new Set(planFor(c, options).map(hash));
  assert.deepEqual(traced.filter((s) => !full.has(hash(s))).map((s) => s.describe()), []);
  const noCache = new Set(planFor({ ...c, cache: null }, options).map(hash)); // planned as an online distillation
  assert.ok(traced.some((s) => !noCache.has(hash(s))), 'a plan without the cache should not cover a cached run');
});

test('property check has teeth for LoRA runs: a plan that leaves out the adapters (the lora_rank == 0 pre-warm bug) misses their kernels', async () => {
  let seed = 1;
  while (!(randomCase(seed, tok.vocabSize).lora)) seed++;
  const c = randomCase(seed, tok.vocabSize);
  const { traced, options } = await runtimeSet(c, 997);
  assert.ok(options.loraRank > 0 && options.init !== undefined);
  const withLora = new Set(planFor(c, options).map(hash));
  assert.deepEqual(traced.filter((s) => !withLora.has(hash(s))).map((s) => s.describe()), []);
  const without = new Set(planFor({ ...c, lora: null }, options).map(hash));
  const onlyLora = traced.filter((s) => !without.has(hash(s))).map((s) => s.family);
  assert.ok(onlyLora.includes('scale'), `a plan without the adapters covered this LoRA run (${describeCase(c)})`);
});
