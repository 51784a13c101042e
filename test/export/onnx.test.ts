/**
 * ONNX export, checked end to end through transformers.js (`@huggingface/transformers`, onnxruntime-node CPU):
 * a tiny random checkpoint is written with writeCheckpoint, exported with exportOnnx, loaded with
 * AutoModelForCausalLM.from_pretrained from the local folder, and its logits compared with distillery's CPU
 * forward — Qwen2 (tied, Q/K/V biases, GQA) and Llama (untied, no biases, external weights file), a left-padded
 * batch, and greedy generation through the KV-cache inputs/outputs. The protobuf writer has its own byte-level
 * checks, which need no package.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { readCheckpoint, writeCheckpoint } from '../../src/model/checkpoint.js';
import { Rng } from '../../src/util/rng.js';
import { buildOnnxModel, exportOnnx } from '../../src/export/onnx.js';
import { Message } from '../../src/export/protobuf.js';

// ---- the slice of the transformers.js API used here (it is imported dynamically, so it may be absent) --------
interface TjsTensor { data: ArrayLike<number | bigint>; dims: number[]; tolist(): unknown }
interface TjsModel {
  (inputs: Record<string, TjsTensor>): Promise<Record<string, TjsTensor>>;
  generate(opts: Record<string, unknown>): Promise<TjsTensor>;
  dispose(): Promise<unknown>;
}
interface Tjs {
  env: { allowRemoteModels: boolean; allowLocalModels: boolean; localModelPath: string };
  Tensor: new (type: string, data: BigInt64Array, dims: number[]) => TjsTensor;
  AutoModelForCausalLM: { from_pretrained(id: string, opts: Record<string, unknown>): Promise<TjsModel> };
}

const PKG = '@huggingface/transformers';
let tjs: Tjs | null = null;
let missing = '';
let root = '';

before(async () => {
  try {
    tjs = (await import(PKG)) as unknown as Tjs;
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    if (err.code !== 'ERR_MODULE_NOT_FOUND') throw e;
    missing = `${PKG} is not installed (npm ci installs it as a devDependency): transformers.js checks skipped`;
  }
  root = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-onnx-'));
  if (tjs) {
    tjs.env.allowRemoteModels = false;
    tjs.env.allowLocalModels = true;
    tjs.env.localModelPath = root;
  }
});
after(() => {
  if (root) fs.rmSync(root, { recursive: true, force: true });
});

function config(over: Partial<ModelConfig>): ModelConfig {
  return {
    architecture: 'qwen2', vocabSize: 61, hiddenSize: 32, intermediateSize: 40, numLayers: 2, numHeads: 4,
    numKvHeads: 2, headDim: 8, rope: { type: 'default', theta: 1e6 }, rmsNormEps: 1e-6, tieWordEmbeddings: true,
    maxPositionEmbeddings: 128, qkvBias: true, qkNorm: false, noRopeLayers: [], bosTokenId: 1, eosTokenId: 2, ...over,
  };
}

/** Random weights with non-trivial norms and biases, so every parameter matters. */
function randomWeights(c: ModelConfig, seed: number): Float32Array {
  const layout = parameterLayout(c);
  const rng = new Rng(seed);
  const w = initialWeights(layout, c, rng, 0.3);
  for (const t of layout.tensors) {
    if (t.init === 'ones' || t.init === 'zeros') {
      for (let i = 0; i < t.size; i++) w[t.offset + i] = (t.init === 'ones' ? 1 : 0) + 0.3 * rng.normal();
    }
  }
  return w;
}

/** distillery's CPU forward: logits [b·t, vocab]. */
function cpuLogits(c: ModelConfig, w: Float32Array, ids: Int32Array, b: number, t: number): Float32Array {
  const be = createCpuBackend({ dtype: 'f32', threads: 1 });
  const m = new Transformer(be, c, { batch: b, seq: t, training: false });
  m.setWeights(w);
  return Float32Array.from(be.download(m.forward(ids, b, t)));
}

/** ‖got − ref‖ / ‖ref‖ over the given rows ([rows, vocab] views). */
function relErr(got: ArrayLike<number>, ref: ArrayLike<number>): number {
  assert.equal(got.length, ref.length);
  let num = 0, den = 0;
  for (let i = 0; i < ref.length; i++) {
    const d = Number(got[i]) - Number(ref[i]);
    num += d * d;
    den += Number(ref[i]) ** 2;
  }
  return Math.sqrt(num / den);
}

function i64(tj: Tjs, vals: ArrayLike<number>, dims: number[]): TjsTensor {
  return new tj.Tensor('int64', BigInt64Array.from(Array.from(vals, (v) => BigInt(v))), dims);
}

function argmax(a: ArrayLike<number>, from: number, n: number): number {
  let best = 0;
  for (let i = 1; i < n; i++) if (a[from + i]! > a[from + best]!) best = i;
  return best;
}

/** Writes a checkpoint folder `<root>/<name>` and exports it. */
function makeModel(name: string, c: ModelConfig, seed: number, externalData: boolean): { dir: string; w: Float32Array } {
  const w = randomWeights(c, seed);
  const dir = path.join(root, name);
  writeCheckpoint(dir, c, w, { dtype: 'f32' });
  exportOnnx(dir, c, w, { externalData });
  return { dir, w };
}

const cases: Array<{ name: string; c: ModelConfig; external: boolean }> = [
  { name: 'qwen2-tied-gqa', c: config({}), external: false },
  {
    name: 'llama-untied-external',
    c: config({ architecture: 'llama', qkvBias: false, tieWordEmbeddings: false, numHeads: 4, numKvHeads: 1,
      headDim: 6, hiddenSize: 24, rope: { type: 'default', theta: 5e5 }, rmsNormEps: 1e-5 }),
    external: true,
  },
  // Scaled RoPE: the exported tables carry the scaled frequencies (and yarn's attention factor on cos and sin).
  {
    name: 'qwen2-yarn', external: false,
    c: config({ rope: { type: 'yarn', theta: 1e4, factor: 4, originalMaxPositionEmbeddings: 16, betaFast: 32, betaSlow: 1, attentionFactor: 1.3, truncate: true } }),
  },
  {
    name: 'llama-llama3', external: false,
    c: config({ architecture: 'llama', qkvBias: false, rope: { type: 'llama3', theta: 1e4, factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 32 } }),
  },
  // Llama attention_bias: q/k/v AND o_proj biases (the o_proj Gemm carries its bias).
  { name: 'llama-attention-bias', external: false, c: config({ architecture: 'llama', qkvBias: true, tieWordEmbeddings: false }) },
  // Qwen3: q_norm / k_norm over each head before RoPE; head_dim 16 × 4 heads = a query width of 64 against hidden 32.
  { name: 'qwen3-qk-norm', external: false, c: config({ architecture: 'qwen3', qkvBias: false, qkNorm: true, headDim: 16, tieWordEmbeddings: false }) },
  // SmolLM3: no RoPE on layer 1 (the graph must leave that layer's q and k unrotated).
  { name: 'smollm3-nope', external: false, c: config({ architecture: 'smollm3', qkvBias: false, noRopeLayers: [1], rope: { type: 'default', theta: 2e6 } }) },
];

for (const { name, c, external } of cases) {
  test(`ONNX export of ${name}: transformers.js logits match the CPU backend`, async (t) => {
    const { dir, w } = makeModel(name, c, 7, external);
    const files = fs.readdirSync(path.join(dir, 'onnx')).sort();
    assert.deepEqual(files, external ? ['model.onnx', 'model.onnx_data'] : ['model.onnx']);
    const hf = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
    assert.deepEqual(hf['transformers.js_config'], external ? { use_external_data_format: true } : undefined);
    // The folder still loads as a distillery checkpoint, weights unchanged.
    assert.deepEqual(readCheckpoint(dir).weights, w);
    if (!tjs) { t.skip(missing); return; }

    const model = await tjs.AutoModelForCausalLM.from_pretrained(name, { local_files_only: true, dtype: 'fp32', device: 'cpu' });
    try {
      const B = 2, T = 9, V = c.vocabSize;
      const rng = new Rng(3);
      const ids = Int32Array.from({ length: B * T }, () => 3 + rng.int(V - 3));
      const out = await model({ input_ids: i64(tjs, ids, [B, T]), attention_mask: i64(tjs, new Array(B * T).fill(1), [B, T]) });
      assert.deepEqual(out.logits!.dims, [B, T, V]);
      const got = out.logits!.data as Float32Array;
      const ref = cpuLogits(c, w, ids, B, T);
      const err = relErr(got, ref);
      t.diagnostic(`relative logit error ${err.toExponential(2)}`);
      assert.ok(err < 1e-4, `relative logit error ${err}`);

      // Left padding: row 0 is two pad tokens then the first T-2 tokens of the sequence; its real positions must
      // match the unpadded forward (transformers.js derives position_ids from the attention mask).
      const pad = 2;
      const padded = Int32Array.from(ids);
      padded.copyWithin(pad, 0, T - pad);
      padded.fill(0, 0, pad);
      const mask = Array.from({ length: B * T }, (_, i) => (i < pad ? 0 : 1));
      const outP = await model({ input_ids: i64(tjs, padded, [B, T]), attention_mask: i64(tjs, mask, [B, T]) });
      const gotP = outP.logits!.data as Float32Array;
      const refRow0 = cpuLogits(c, w, ids.subarray(0, T - pad), 1, T - pad);
      const errP = relErr(gotP.subarray(pad * V, T * V), refRow0);
      const errRow1 = relErr(gotP.subarray(T * V, 2 * T * V), ref.subarray(T * V, 2 * T * V));
      t.diagnostic(`left-padded row ${errP.toExponential(2)}, unpadded row ${errRow1.toExponential(2)}`);
      assert.ok(errP < 1e-4 && errRow1 < 1e-4, `padded batch errors ${errP}, ${errRow1}`);
      for (let i = 0; i < pad * V; i++) assert.ok(Number.isFinite(gotP[i]), 'padding rows must stay finite');

      // Greedy generation goes through present.* → past_key_values.* (one token per step after the prompt):
      // it must pick the same tokens as greedy decoding with full CPU forwards.
      const prompt = Array.from(ids.subarray(0, 5));
      const steps = 6;
      const gen = await model.generate({ input_ids: i64(tjs, prompt, [1, prompt.length]), max_new_tokens: steps,
        min_new_tokens: steps, do_sample: false });
      const genIds = (gen.tolist() as bigint[][])[0]!.map(Number);
      const seq = [...prompt];
      for (let s = 0; s < steps; s++) {
        const logits = cpuLogits(c, w, Int32Array.from(seq), 1, seq.length);
        seq.push(argmax(logits, (seq.length - 1) * V, V));
      }
      assert.deepEqual(genIds, seq);
    } finally {
      await model.dispose();
    }
  });
}

test('ONNX export rejects a weight array of the wrong size and a folder without config.json', () => {
  const c = config({});
  const w = randomWeights(c, 1);
  assert.throws(() => buildOnnxModel(c, w.subarray(1)), /weight array has/);
  const empty = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-onnx-empty-'));
  try {
    assert.throws(() => exportOnnx(empty, c, w), /has no config\.json/);
  } finally {
    fs.rmSync(empty, { recursive: true, force: true });
  }
});

test('ONNX export: inline weights are referenced, not copied, and the model names its opset', () => {
  const c = config({ numLayers: 1 });
  const w = randomWeights(c, 2);
  const { model, externalData } = buildOnnxModel(c, w, { externalData: false });
  assert.equal(externalData, null);
  assert.ok(model.chunks.some((ch) => ch.buffer === w.buffer), 'weights should be views of the flat array');
  assert.ok(model.length > w.byteLength && model.length < w.byteLength + 64 * 1024);
  const ext = buildOnnxModel(c, w, { externalData: true });
  assert.equal(ext.externalData!.reduce((a, b) => a + b.length, 0), w.byteLength);
  assert.ok(ext.model.length < 64 * 1024);
});

test('protobuf writer: varints, negative int64, floats, strings and nested messages', () => {
  const hex = (m: Message): string => Buffer.from(m.toBytes()).toString('hex');
  assert.equal(hex(new Message().int(1, 150)), '089601');
  assert.equal(hex(new Message().int(3, -1)), '18ffffffffffffffffff01');
  assert.equal(hex(new Message().int(1, 2n ** 40n)), '08808080808020');
  assert.equal(hex(new Message().string(2, 'testing')), '120774657374696e67');
  assert.equal(hex(new Message().float(2, 1.5)), '150000c03f');
  assert.equal(hex(new Message().packedInts(4, [3, 270, 86942])), '2206038e029ea705');
  assert.equal(hex(new Message().packedInts(4, [])), '');
  assert.equal(hex(new Message().message(3, new Message().int(1, 150))), '1a03089601');
  assert.throws(() => new Message().int(1, 0.5), RangeError);
});
