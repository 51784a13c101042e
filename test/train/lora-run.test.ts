/**
 * LoRA runs end to end on the CPU (issue 16): `train`/`distill --lora-rank` on a frozen --init base, the PEFT adapter
 * folders they write (checkpoints, best/, final/), exact resume, the base check, the merged export and the commands
 * that take an adapter folder.
 */
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { runTraining, type RunSummary } from '../../src/train/run.js';
import { DEFAULT_RUN_OPTIONS, type RunOptions } from '../../src/train/options.js';
import { readFlatCheckpoint, writeCheckpoint } from '../../src/model/checkpoint.js';
import { readSafetensors } from '../../src/io/safetensors.js';
import { readAdapterOnBase, readModelOrAdapter } from '../../src/model/adapter.js';
import { weightsHash } from '../../src/model/weights-hash.js';
import { loraLayout } from '../../src/model/lora.js';
import { parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { CpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { exportCommand } from '../../src/cli/commands/export.js';
import { evaluate } from '../../src/cli/commands/eval.js';
import { dryRun } from '../../src/train/dry-run.js';
import { DistilleryError } from '../../src/util/errors.js';
import { corpusFile } from './corpus.js';

const quiet = { log: (): void => {} };
let dir = '';
let corpus = '';
let base = '';
let baseRun: RunSummary;

function opts(over: Partial<RunOptions>): RunOptions {
  return {
    ...DEFAULT_RUN_OPTIONS, mode: 'train', out: path.join(dir, 'run'), data: [corpus], model: 'tiny',
    vocabSize: 300, batch: 4, seq: 16, steps: 8, evalEvery: 4, saveEvery: 4, warmup: 2, quiet: true, threads: 1, ...over,
  };
}
const lora = (over: Partial<RunOptions>): RunOptions => opts({ init: base, loraRank: 4, lr: 1e-2, ...over });

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-lora-'));
  corpus = corpusFile(dir);
  baseRun = await runTraining(opts({ out: path.join(dir, 'base'), steps: 12 }), quiet);
  base = baseRun.finalDir!;
});

test('a LoRA run starts exactly at the base model\'s loss (B = 0), trains only the adapters and writes PEFT adapter folders', async () => {
  const full = await runTraining(opts({ out: path.join(dir, 'full-from-base'), init: base, steps: 4, stopAfter: 1 }), quiet);
  const baseBytes = fs.readFileSync(path.join(base, 'model.safetensors'));
  const logs: string[] = [];
  const s = await runTraining(lora({ out: path.join(dir, 'lora') }), { log: (l: string) => { logs.push(l); } });
  // the same base, the same validation windows: the adapter's zero B leaves the loss exactly unchanged
  assert.equal(s.initialValLoss, full.initialValLoss);
  assert.ok(s.finalValLoss < s.initialValLoss, `validation ${s.initialValLoss} → ${s.finalValLoss}`);
  const cfg = readFlatCheckpoint(base).config;
  const lay = loraLayout(cfg, { rank: 4, alpha: 8, targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] });
  assert.equal(s.trainableParameters, lay.total);
  assert.ok(logs.some((l) => l.startsWith(`LoRA: rank 4, alpha 8 (scale 2) on q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj: ${lay.total.toLocaleString('en-US')} trainable`)), logs.join('\n'));
  assert.ok(fs.readFileSync(path.join(base, 'model.safetensors')).equals(baseBytes), 'the base folder changed');
  for (const f of ['final', 'checkpoints/best', 'checkpoints/latest/adapter']) {
    const d = path.join(s.out, f);
    for (const x of ['adapter_config.json', 'adapter_model.safetensors', 'base_model.json', 'tokenizer.json', 'tokenizer_config.json']) assert.ok(fs.existsSync(path.join(d, x)), `${f}/${x} missing`);
    assert.ok(!fs.existsSync(path.join(d, 'model.safetensors')), `${f} holds a full model`);
  }
  const ac = JSON.parse(fs.readFileSync(path.join(s.out, 'final', 'adapter_config.json'), 'utf8')) as Record<string, unknown>;
  assert.equal(ac.peft_type, 'LORA'); assert.equal(ac.task_type, 'CAUSAL_LM'); assert.equal(ac.r, 4); assert.equal(ac.lora_alpha, 8);
  assert.equal(ac.base_model_name_or_path, path.resolve(base));
  assert.deepEqual(ac.target_modules, ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj']);
  const ref = JSON.parse(fs.readFileSync(path.join(s.out, 'final', 'base_model.json'), 'utf8')) as { weights_sha256: string };
  assert.equal(ref.weights_sha256, weightsHash(readFlatCheckpoint(base).weights, parameterLayout(readFlatCheckpoint(base).config)));
  // PEFT's tensor names and shapes, nothing else
  const st = readSafetensors(path.join(s.out, 'final', 'adapter_model.safetensors'));
  assert.deepEqual([...st.tensors.keys()].sort(), lay.tensors.map((t) => t.name).sort());
  assert.deepEqual(st.tensors.get('base_model.model.model.layers.1.mlp.down_proj.lora_A.weight')!.shape, [4, cfg.intermediateSize]);
  assert.deepEqual(st.tensors.get('base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight')!.shape, [cfg.numKvHeads * cfg.headDim, 4]);
  // trained: some B moved off zero
  assert.ok([...st.tensors.values()].some((t) => t.data.some((x) => x !== 0) && t.shape[1] === 4));
  // the moments cover the adapters only
  const opt = readSafetensors(path.join(s.out, 'checkpoints', 'latest', 'optimizer.safetensors'));
  assert.equal(opt.tensors.get('m')!.data.length, lay.total);
});

test('LoRA resume: stopping at step 4 and resuming gives bit-identical adapters; another rank or base is refused', async () => {
  const full = await runTraining(lora({ out: path.join(dir, 'lora-full'), loraTargets: 'q_proj,v_proj' }), quiet);
  const a = await runTraining(lora({ out: path.join(dir, 'lora-split'), loraTargets: 'q_proj,v_proj', stopAfter: 4 }), quiet);
  assert.equal(a.status, 'stopped');
  await assert.rejects(runTraining(lora({ out: path.join(dir, 'lora-split'), loraTargets: 'q_proj,v_proj', loraRank: 8, resume: true }), quiet),
    (e) => e instanceof DistilleryError && /--lora-rank was 4 in the checkpoint but is 8 now/.test(e.message));
  // another base with the same shape: the adapter was trained on other weights
  const other = path.join(dir, 'other-base');
  const ck = readFlatCheckpoint(base);
  writeCheckpoint(other, ck.config, ck.weights.map((x, i) => (i === 7 ? x + 1e-3 : x)), { dtype: 'f32', tokenizerJson: ck.tokenizerJson });
  await assert.rejects(runTraining(lora({ out: path.join(dir, 'lora-split'), loraTargets: 'q_proj,v_proj', init: other, resume: true }), quiet),
    (e) => e instanceof DistilleryError && /trained on a base with other weights/.test(e.message));
  const b = await runTraining(lora({ out: path.join(dir, 'lora-split'), loraTargets: 'q_proj,v_proj', resume: true }), quiet);
  assert.equal(b.steps, 8);
  const read = (run: string): Buffer => fs.readFileSync(path.join(run, 'checkpoints', 'latest', 'adapter', 'adapter_model.safetensors'));
  assert.ok(read(full.out).equals(read(b.out)), 'resumed adapters differ from the uninterrupted run');
  assert.equal(b.finalValLoss, full.finalValLoss);
  // only q and v adapted
  const names = [...readSafetensors(path.join(b.out, 'final', 'adapter_model.safetensors')).tensors.keys()];
  assert.ok(names.every((n) => /\.(q_proj|v_proj)\.lora_[AB]\.weight$/.test(n)), names.join(', '));
});

test('the merged export equals base + adapter: its weights are W + (alpha/r)·B·A, its logits the LoRA model\'s, eval agrees', async () => {
  const s = await runTraining(lora({ out: path.join(dir, 'lora-merge'), loraAlpha: 3, steps: 6 }), quiet);
  const a = readAdapterOnBase(s.finalDir!);
  const out = path.join(dir, 'merged');
  const io = { out: (): void => {}, err: (): void => {} };
  // an --out under a file is a usage error before anything is read or written (it was a stack trace)
  await assert.rejects(exportCommand.run([s.finalDir!, '--merge', '--out', path.join(s.finalDir!, 'adapter_config.json', 'sub')], io, {}),
    (e: unknown) => e instanceof Error && e.name === 'UsageError' && /adapter_config\.json is a file, so no folder can be made under it/.test(e.message));
  assert.equal(await exportCommand.run([s.finalDir!, '--merge', '--out', out], io, {}), 0);
  const merged = readFlatCheckpoint(out);
  assert.ok(merged.tokenizer, 'the merged folder carries the tokenizer');
  // float64 reference of one merged projection
  const cfg = a.base.config, lay = a.layout, r = 4, sc = 3 / r;
  const t = lay.layers[1]!.find((x) => x.target === 'up_proj')!;
  const W = readFlatCheckpoint(base);
  const { parameterLayout } = await import('../../src/model/params.js');
  const Wt = parameterLayout(cfg).layers[1]!.wUp;
  let worst = 0;
  for (let o = 0; o < t.out; o++) {
    for (let i = 0; i < t.in; i++) {
      let acc = 0;
      for (let k = 0; k < r; k++) acc += a.adapter.weights[t.b.offset + o * r + k]! * a.adapter.weights[t.a.offset + k * t.in + i]!;
      const want = W.weights[Wt.offset + o * t.in + i]! + sc * acc;
      worst = Math.max(worst, Math.abs(merged.weights[Wt.offset + o * t.in + i]! - want));
    }
  }
  assert.ok(worst <= 1e-6, `merged up_proj off by ${worst}`);
  // the merged model's logits against the LoRA model's (base + adapters on the same backend)
  const be = new CpuBackend({ threads: 1 });
  const ids = Int32Array.from({ length: 2 * 16 }, (_, i) => (i * 37 + 5) % cfg.vocabSize);
  const withLora = new Transformer(be, cfg, { batch: 2, seq: 16, training: false, lora: lay });
  withLora.setWeights(W.weights); withLora.lora!.setWeights(a.adapter.weights);
  const plain = new Transformer(be, cfg, { batch: 2, seq: 16, training: false });
  plain.setWeights(merged.weights);
  const x = Array.from(be.download(withLora.forward(ids, 2, 16))), y = Array.from(be.download(plain.forward(ids, 2, 16)));
  const diff = Math.max(...x.map((v, i) => Math.abs(v - y[i]!)));
  assert.ok(diff <= 2e-5, `logits differ by ${diff}`);
  // eval of the adapter folder (merged on load) and of the exported folder agree exactly
  const e1 = await evaluate({ model: s.finalDir!, data: [corpus], seq: 16, batch: 4, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all' });
  const e2 = await evaluate({ model: out, data: [corpus], seq: 16, batch: 4, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all' });
  assert.equal(e1.loss, e2.loss);
  // refusals: existing --out, a model folder, a base with other weights or another shape
  await assert.rejects(exportCommand.run([s.finalDir!, '--merge', '--out', out], io, {}), /already exists/);
  await assert.rejects(exportCommand.run([base, '--merge', '--out', path.join(dir, 'm2')], io, {}), /not a LoRA adapter folder/);
  const other = path.join(dir, 'other-base-2');
  writeCheckpoint(other, W.config, W.weights.map((v, i) => (i === 3 ? v * 2 : v)), { dtype: 'f32', tokenizerJson: W.tokenizerJson });
  assert.throws(() => readModelOrAdapter(s.finalDir!, { base: other }), /has other weights than the one the adapter .* was trained on/);
  const wider = path.join(dir, 'wider-base');
  const wcfg = { ...W.config, intermediateSize: W.config.intermediateSize + 8 };
  writeCheckpoint(wider, wcfg, new Float32Array(parameterLayout(wcfg).total).fill(0.01), { dtype: 'f32', tokenizerJson: W.tokenizerJson });
  assert.throws(() => readModelOrAdapter(s.finalDir!, { base: wider }), new RegExp(`intermediate_size ${wcfg.intermediateSize} \\(the adapter's base has ${W.config.intermediateSize}\\)`));
  assert.throws(() => readModelOrAdapter(base, { base: other }), /is a model folder, not a LoRA adapter/);
});

test('bf16 adapter folders (--save-dtype bf16) read back within bf16 rounding', async () => {
  const s = await runTraining(lora({ out: path.join(dir, 'lora-bf16'), saveDtype: 'bf16', steps: 4 }), quiet);
  const f32 = readAdapterOnBase(path.join(s.out, 'checkpoints', 'latest', 'adapter')).adapter.weights;
  const bf = readAdapterOnBase(s.finalDir!).adapter.weights;
  assert.equal(readSafetensors(path.join(s.finalDir!, 'adapter_model.safetensors')).tensors.values().next().value!.dtype, 'BF16');
  for (let i = 0; i < f32.length; i++) assert.ok(Math.abs(bf[i]! - f32[i]!) <= Math.abs(f32[i]!) * 2 ** -8 + 1e-30, `element ${i}: ${bf[i]} vs ${f32[i]}`);
});

test('LoRA distillation runs end to end; --dry-run reports the adapters and less memory than full training', async () => {
  const s = await runTraining(lora({ mode: 'distill', out: path.join(dir, 'lora-distill'), teacher: base, steps: 4 }), quiet);
  assert.equal(s.status, 'completed');
  assert.ok(Number.isFinite(s.finalValLoss));
  const full = await dryRun(opts({ mode: 'distill', teacher: base, init: base, model: 'tiny' }));
  const r = await dryRun(lora({ mode: 'distill', teacher: base }));
  assert.equal(r.lora?.rank, 4);
  assert.equal(r.lora?.trainable_parameters, s.trainableParameters);
  assert.equal(full.lora, null);
  assert.ok(r.device_bytes < full.device_bytes, `${r.device_bytes} vs ${full.device_bytes}`);
});

test('4-bit frozen weights: an nf4 teacher distills end to end; QLoRA (an nf4 base under LoRA) trains; both estimate less memory', async () => {
  const logs: string[] = [];
  const d = await runTraining(opts({ mode: 'distill', out: path.join(dir, 'nf4-teacher'), teacher: base, teacherDtype: 'nf4', steps: 4 }), { log: (l: string) => { logs.push(l); } });
  assert.equal(d.status, 'completed');
  assert.ok(logs.some((l) => l.startsWith('teacher: quantizing its projection matrices to nf4') && logs.some((m) => /^teacher: quantized in [0-9.]+s$/.test(m))), logs.join('\n'));
  const q = await runTraining(lora({ out: path.join(dir, 'qlora'), baseDtype: 'nf4', steps: 6 }), quiet);
  assert.equal(q.status, 'completed');
  assert.ok(q.finalValLoss < q.initialValLoss, `QLoRA validation ${q.initialValLoss} → ${q.finalValLoss}`);
  // the adapter it writes names the base as it is on disk (full precision): eval merges it onto that base
  const e = await evaluate({ model: q.finalDir!, data: [corpus], seq: 16, batch: 4, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all' });
  assert.ok(Number.isFinite(e.loss));
  const plain = await dryRun(lora({ mode: 'distill', teacher: base }));
  const small = await dryRun(lora({ mode: 'distill', teacher: base, teacherDtype: 'nf4', baseDtype: 'nf4' }));
  assert.equal(small.teacher_dtype, 'nf4'); assert.equal(small.base_dtype, 'nf4');
  assert.ok(small.device_bytes < plain.device_bytes);
});

test('on-policy LoRA distillation: the student generates with its adapters unmerged, end to end', async () => {
  const s = await runTraining(lora({ mode: 'distill', out: path.join(dir, 'lora-on-policy'), teacher: base, onPolicy: 1, steps: 3, seq: 16, genTemperature: 1 }), quiet);
  assert.equal(s.status, 'completed');
  const rows = fs.readFileSync(path.join(s.out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>);
  assert.ok(rows.filter((r) => r.on_policy === 1).length === 3, 'every step generated');
  assert.ok(rows.some((r) => (r.gen_len ?? 0) > 0));
});

test('a LoRA run on a base from the Hub cache names the Hub id in adapter_config.json (the folder in base_model.json); resume compares the adapters, not the spelling', async () => {
  const snap = path.join(dir, 'hub', 'models--acme--tiny-base', 'snapshots', '0123abcd');
  fs.mkdirSync(path.dirname(snap), { recursive: true });
  fs.cpSync(base, snap, { recursive: true });
  const s = await runTraining(lora({ out: path.join(dir, 'lora-hub'), init: snap, steps: 4, stopAfter: 2 }), quiet);
  const ac = JSON.parse(fs.readFileSync(path.join(s.out, 'checkpoints', 'latest', 'adapter', 'adapter_config.json'), 'utf8')) as Record<string, unknown>;
  assert.equal(ac.base_model_name_or_path, 'acme/tiny-base');
  const ref = JSON.parse(fs.readFileSync(path.join(s.out, 'checkpoints', 'latest', 'adapter', 'base_model.json'), 'utf8')) as { path: string };
  assert.equal(ref.path, path.resolve(snap));
  // alpha 0 means 2 × rank, and the targets are a set: the same adapters, so the resume goes on
  const r = await runTraining(lora({ out: path.join(dir, 'lora-hub'), init: snap, steps: 4, resume: true, loraAlpha: 8,
    loraTargets: 'down_proj,up_proj,gate_proj,o_proj,v_proj,k_proj,q_proj' }), quiet);
  assert.equal(r.status, 'completed');
});

test('eval of a QLoRA adapter with --model-dtype nf4 runs NF4(W) + s·B·A unmerged, not the merged weights quantized', async () => {
  const q = await runTraining(lora({ out: path.join(dir, 'qlora-eval'), baseDtype: 'nf4', steps: 6, lr: 3e-2 }), quiet);
  const merged = path.join(dir, 'qlora-merged');
  await exportCommand.run([q.finalDir!, '--merge', '--out', merged], { out: () => {}, err: () => {} }, {});
  const ev = (model: string): Promise<{ loss?: number }> => evaluate({ model, data: [corpus], seq: 16, batch: 4, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all', modelDtype: 'nf4' });
  const unmerged = await ev(q.finalDir!), requantized = await ev(merged);
  assert.notEqual(unmerged.loss, requantized.loss);
  // the unmerged evaluation is the model the run trained: its loss is the run's model's (full-precision merge) within NF4's cost
  const full = await evaluate({ model: q.finalDir!, data: [corpus], seq: 16, batch: 4, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all' });
  assert.ok(Number.isFinite(full.loss) && Number.isFinite(unmerged.loss));
});

test('a teacher and a LoRA base kept tensor by tensor (the path of a model above one typed array) train exactly as flat ones; eval merges such a base', async () => {
  const metrics = (out: string): string => fs.readFileSync(path.join(out, 'metrics.jsonl'), 'utf8').replace(/"tokens_per_s":\d+,"seconds":[0-9.]+,"step_ms":[0-9.]+/g, '');
  const jobs: Array<[string, Partial<RunOptions>]> = [
    ['distill', { mode: 'distill', teacher: base, steps: 4 }],
    ['distill-nf4', { mode: 'distill', teacher: base, teacherDtype: 'nf4', steps: 4 }],
    ['lora', { init: base, loraRank: 4, lr: 1e-2, steps: 4 }],
  ];
  for (const [name, over] of jobs) {
    const a = await runTraining(opts({ ...over, out: path.join(dir, `flat-${name}`) }), quiet);
    process.env.DISTILLERY_MAX_FLAT_WEIGHTS = '1000';
    let b: RunSummary;
    try { b = await runTraining(opts({ ...over, out: path.join(dir, `split-${name}`) }), quiet); } finally { delete process.env.DISTILLERY_MAX_FLAT_WEIGHTS; }
    assert.equal(b.status, 'completed');
    assert.equal(metrics(b.out), metrics(a.out), name);
    if (name === 'lora') {
      const flatEval = await evaluate({ model: a.finalDir!, data: [corpus], seq: 16, batch: 4, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all' });
      process.env.DISTILLERY_MAX_FLAT_WEIGHTS = '1000';
      try {
        const e = await evaluate({ model: b.finalDir!, data: [corpus], seq: 16, batch: 4, maxChars: 0, device: 'cpu', threads: 1, json: true, lossOn: 'all' });
        assert.equal(e.loss, flatEval.loss);
      } finally { delete process.env.DISTILLERY_MAX_FLAT_WEIGHTS; }
    }
  }
});
