/**
 * ONNX export of a Qwen2/Llama model, in the layout transformers.js (`@huggingface/transformers`) loads for a
 * causal LM: `<model dir>/onnx/model.onnx` beside config.json, with the inputs and outputs of Optimum's
 * "text-generation-with-past" export:
 *
 *   inputs   input_ids [batch, seq] int64, attention_mask [batch, past+seq] int64, position_ids [batch, seq] int64,
 *            past_key_values.{l}.key / .value [batch, kv_heads, past, head_dim] float32 (past may be 0)
 *   outputs  logits [batch, seq, vocab] float32,
 *            present.{l}.key / .value [batch, kv_heads, past+seq, head_dim] float32 (keys after RoPE)
 *
 * The protobuf is written by hand (src/export/protobuf.ts): no ONNX or protobuf package is needed. Opset 17,
 * IR version 8. Weights are float32 initializers under their Hugging Face names, in their HF layout ([out, in]);
 * projections are `Gemm(x, W, b, transB=1)` over the flattened [batch·seq, hidden] activations, and a tied LM head
 * reuses the embedding matrix the same way, so nothing is stored twice.
 *
 * The graph, per layer, as HF transformers computes it in float32:
 *   RMSNorm      x · 1/sqrt(mean(x²) + eps) · w                 (Mul, ReduceMean, Add, Sqrt, Reciprocal, Mul)
 *   RoPE         rotate-half; cos/sin computed in the graph from position_ids: angle = pos · inv_freq, with
 *                inv_freq[i] = theta^(-2i/head_dim) precomputed in float64 and stored as float32 — no position
 *                table, so any position the caller passes works (max_position_embeddings is not a limit here).
 *   attention    grouped-query: queries are grouped [batch, kv_heads, q_per_kv, seq, head_dim] and broadcast
 *                against the kv heads in MatMul (no repeated K/V copies); scores · 1/sqrt(head_dim); a key is
 *                visible when its index ≤ the query's absolute index (past + i) and attention_mask is 1 there;
 *                hidden scores become the float32 minimum (a fully padded row gives uniform weights, not NaN).
 *   MLP          down(silu(gate(x)) · up(x)), silu(g) = g · Sigmoid(g)
 *
 * Models whose float32 weights pass 2 GiB (the protobuf limit) must use external data: `externalData: true`
 * (or 'auto', the default, which switches at 1.75 GiB) writes the weights to `onnx/model.onnx_data` and sets
 * `"transformers.js_config": {"use_external_data_format": true}` in config.json so transformers.js loads it.
 * Byte order: initializers are written from the Float32Array as is, which is little-endian on every platform
 * Node runs on (ONNX raw_data is little-endian).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { ModelConfig } from '../model/config.js';
import { usesRope, validateConfig } from '../model/config.js';
import { parameterLayout, type TensorInfo } from '../model/params.js';
import { DistilleryError } from '../util/errors.js';
import { writeAll } from '../io/atomic.js';
import { ropeAttentionFactor, ropeInvFreq } from '../backend/rope.js';
import { Message } from './protobuf.js';

export const ONNX_OPSET = 17;
export const ONNX_IR_VERSION = 8;
/** Above this many bytes of weights, 'auto' writes external data. */
const EXTERNAL_DATA_THRESHOLD = 1.75 * 2 ** 30;

/** TensorProto.DataType values used here. */
const FLOAT = 1, INT64 = 7, BOOL = 9;
/** AttributeProto.AttributeType values used here. */
const ATTR_FLOAT = 1, ATTR_INT = 2, ATTR_INTS = 7;

type Attr = { f: number } | { i: number } | { ints: number[] };
type Dim = number | string;

function attribute(name: string, a: Attr): Message {
  const m = new Message().string(1, name);
  if ('f' in a) m.float(2, a.f).int(20, ATTR_FLOAT);
  else if ('i' in a) m.int(3, a.i).int(20, ATTR_INT);
  else m.packedInts(8, a.ints).int(20, ATTR_INTS);
  return m;
}

function valueInfo(name: string, elemType: number, dims: Dim[]): Message {
  const shape = new Message();
  for (const d of dims) {
    shape.message(1, typeof d === 'number' ? new Message().int(1, d) : new Message().string(2, d));
  }
  const tensorType = new Message().int(1, elemType).message(2, shape);
  return new Message().string(1, name).message(2, new Message().message(1, tensorType));
}

function bytesOf(a: Float32Array | BigInt64Array | Uint8Array): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

interface ExternalSink {
  location: string;
  chunks: Uint8Array[];
  offset: number;
}

/** Builds a GraphProto: nodes, initializers, inputs, outputs, with generated names for intermediates. */
class GraphBuilder {
  private readonly nodes: Message[] = [];
  private readonly inits: Message[] = [];
  private readonly inputs: Message[] = [];
  private readonly outputs: Message[] = [];
  private n = 0;
  constructor(private readonly external: ExternalSink | null) {}

  input(name: string, elemType: number, dims: Dim[]): string {
    this.inputs.push(valueInfo(name, elemType, dims));
    return name;
  }
  output(name: string, elemType: number, dims: Dim[]): void {
    this.outputs.push(valueInfo(name, elemType, dims));
  }

  /** A node; returns its output names (`outputs` of them, or the names given). */
  op(type: string, inputs: string[], attrs: Record<string, Attr> = {}, outputs: number | string[] = 1): string[] {
    const id = this.n++;
    const outs = typeof outputs === 'number'
      ? Array.from({ length: outputs }, (_, i) => `/${type}_${id}${outputs > 1 ? `_${i}` : ''}`)
      : outputs;
    const m = new Message();
    for (const i of inputs) m.string(1, i);
    for (const o of outs) m.string(2, o);
    m.string(3, `${type}_${id}`).string(4, type);
    for (const [k, v] of Object.entries(attrs)) m.message(5, attribute(k, v));
    this.nodes.push(m);
    return outs;
  }
  /** A single-output node. */
  op1(type: string, inputs: string[], attrs: Record<string, Attr> = {}, output?: string): string {
    return this.op(type, inputs, attrs, output === undefined ? 1 : [output])[0]!;
  }

  private initializer(name: string, dataType: number, dims: number[], raw: Uint8Array, big: boolean): string {
    const t = new Message().packedInts(1, dims).int(2, dataType).string(8, name);
    if (big && this.external) {
      // external_data: location / offset / length (StringStringEntryProto), data_location = EXTERNAL.
      const ext = this.external;
      const entry = (k: string, v: string): Message => new Message().string(1, k).string(2, v);
      t.message(13, entry('location', ext.location))
        .message(13, entry('offset', String(ext.offset)))
        .message(13, entry('length', String(raw.length)))
        .int(14, 1);
      ext.chunks.push(raw);
      ext.offset += raw.length;
    } else {
      t.bytes(9, raw);
    }
    this.inits.push(t);
    return name;
  }
  /** A float32 weight (referenced, not copied). */
  weight(name: string, dims: number[], data: Float32Array): string {
    return this.initializer(name, FLOAT, dims, bytesOf(data), true);
  }
  private consts = new Map<string, string>();
  /** An int64 constant; 1-D unless `scalar`. Deduplicated by value. */
  i64(values: number[], scalar = false): string {
    const key = `i64:${scalar ? 's' : ''}${values.join(',')}`;
    let name = this.consts.get(key);
    if (!name) {
      name = `/const_${this.consts.size}`;
      this.consts.set(key, name);
      this.initializer(name, INT64, scalar ? [] : [values.length], bytesOf(BigInt64Array.from(values.map(BigInt))), false);
    }
    return name;
  }
  /** A float32 constant; 1-D unless `scalar`. */
  f32(values: number[], scalar = false): string {
    const key = `f32:${scalar ? 's' : ''}${values.join(',')}`;
    let name = this.consts.get(key);
    if (!name) {
      name = `/const_${this.consts.size}`;
      this.consts.set(key, name);
      this.initializer(name, FLOAT, scalar ? [] : [values.length], bytesOf(Float32Array.from(values)), false);
    }
    return name;
  }

  graph(name: string): Message {
    const g = new Message();
    for (const n of this.nodes) g.message(1, n);
    g.string(2, name);
    for (const t of this.inits) g.message(5, t);
    for (const i of this.inputs) g.message(11, i);
    for (const o of this.outputs) g.message(12, o);
    return g;
  }
}

export interface OnnxExportOptions {
  /** Write weights to `onnx/model.onnx_data` (true), inline (false), or decide by size ('auto', default). */
  externalData?: boolean | 'auto';
}

export interface OnnxModel {
  /** The ModelProto bytes, as chunks. */
  model: Message;
  /** The external-data file contents (chunks), when weights are external. */
  externalData: Uint8Array[] | null;
}

/**
 * Builds the ONNX model for a config and flat weights (parameterLayout order). The returned chunks reference
 * `weights`; write them before changing it.
 */
export function buildOnnxModel(config: ModelConfig, weights: Float32Array, opts: OnnxExportOptions = {}): OnnxModel {
  validateConfig(config);
  const layout = parameterLayout(config);
  if (weights.length !== layout.total) {
    throw new DistilleryError(`ONNX export: weight array has ${weights.length} elements, the model needs ${layout.total}`);
  }
  const wantExternal = opts.externalData ?? 'auto';
  const external = wantExternal === true || (wantExternal === 'auto' && weights.byteLength > EXTERNAL_DATA_THRESHOLD);
  const sink: ExternalSink | null = external ? { location: 'model.onnx_data', chunks: [], offset: 0 } : null;
  const g = new GraphBuilder(sink);
  const c = config;
  const C = c.hiddenSize, H = c.numHeads, KVH = c.numKvHeads, D = c.headDim, V = c.vocabSize;
  const rep = H / KVH;
  const added = new Set<string>();
  const W = (t: TensorInfo): string => {
    if (!added.has(t.name)) {
      added.add(t.name);
      g.weight(t.name, t.shape, weights.subarray(t.offset, t.offset + t.size));
    }
    return t.name;
  };

  // ---- inputs and dynamic sizes -------------------------------------------------------------------------
  const ids = g.input('input_ids', INT64, ['batch_size', 'sequence_length']);
  const mask = g.input('attention_mask', INT64, ['batch_size', 'total_sequence_length']);
  const pos = g.input('position_ids', INT64, ['batch_size', 'sequence_length']);
  const past: { key: string; value: string }[] = [];
  for (let l = 0; l < c.numLayers; l++) {
    past.push({
      key: g.input(`past_key_values.${l}.key`, FLOAT, ['batch_size', KVH, 'past_sequence_length', D]),
      value: g.input(`past_key_values.${l}.value`, FLOAT, ['batch_size', KVH, 'past_sequence_length', D]),
    });
  }
  const idsShape = g.op1('Shape', [ids]);
  const B1 = g.op1('Gather', [idsShape, g.i64([0])], { axis: { i: 0 } });
  const S1 = g.op1('Gather', [idsShape, g.i64([1])], { axis: { i: 0 } });
  const Ss = g.op1('Gather', [idsShape, g.i64([1], true)], { axis: { i: 0 } });
  const Ts = g.op1('Gather', [g.op1('Shape', [mask]), g.i64([1], true)], { axis: { i: 0 } });
  const Ps = g.op1('Sub', [Ts, Ss]);
  const shapeBSHD = g.op1('Concat', [B1, S1, g.i64([H, D])], { axis: { i: 0 } });
  const shapeBSKD = g.op1('Concat', [B1, S1, g.i64([KVH, D])], { axis: { i: 0 } });
  const shapeBSKRD = g.op1('Concat', [B1, S1, g.i64([KVH, rep, D])], { axis: { i: 0 } });
  const shapeBSV = g.op1('Concat', [B1, S1, g.i64([V])], { axis: { i: 0 } });

  // ---- attention mask: allowed[b, 1, 1, i, j] = (j <= past + i) && attention_mask[b, j] ----------------------
  const kpos = g.op1('Unsqueeze', [g.op1('Range', [g.i64([0], true), Ts, g.i64([1], true)]), g.i64([0])]); // [1, T]
  const qpos = g.op1('Unsqueeze', [g.op1('Range', [Ps, Ts, g.i64([1], true)]), g.i64([1])]); // [S, 1]
  const causal = g.op1('LessOrEqual', [kpos, qpos]); // [S, T]
  const pad = g.op1('Unsqueeze', [g.op1('Cast', [mask], { to: { i: BOOL } }), g.i64([1, 2, 3])]); // [B, 1, 1, 1, T]
  const allowed = g.op1('And', [causal, pad]); // [B, 1, 1, S, T]
  const minusInf = g.f32([-3.4028234663852886e38], true);

  // ---- rotary tables from position_ids: cos/sin [B, S, 1, D] --------------------------------------------------
  // Inverse frequencies of the model's RoPE kind (scaled for linear / llama3 / yarn); yarn also scales cos and sin.
  const invFreq = Array.from(ropeInvFreq(c.rope, D));
  const attn = ropeAttentionFactor(c.rope);
  const posF = g.op1('Unsqueeze', [g.op1('Cast', [pos], { to: { i: FLOAT } }), g.i64([-1])]); // [B, S, 1]
  const freqs = g.op1('Mul', [posF, g.f32(invFreq)]); // [B, S, D/2]
  const emb = g.op1('Unsqueeze', [g.op1('Concat', [freqs, freqs], { axis: { i: -1 } }), g.i64([2])]); // [B, S, 1, D]
  const scaled = (x: string): string => (attn === 1 ? x : g.op1('Mul', [x, g.f32([attn], true)]));
  const cos = scaled(g.op1('Cos', [emb]));
  const sin = scaled(g.op1('Sin', [emb]));
  const rope = (x: string): string => {
    const [x1, x2] = g.op('Split', [x], { axis: { i: -1 } }, 2) as [string, string];
    const rotated = g.op1('Concat', [g.op1('Neg', [x2]), x1], { axis: { i: -1 } });
    return g.op1('Add', [g.op1('Mul', [x, cos]), g.op1('Mul', [rotated, sin])]);
  };
  const rmsnorm = (x: string, w: TensorInfo): string => {
    const ms = g.op1('ReduceMean', [g.op1('Mul', [x, x])], { axes: { ints: [-1] }, keepdims: { i: 1 } });
    const r = g.op1('Reciprocal', [g.op1('Sqrt', [g.op1('Add', [ms, g.f32([c.rmsNormEps], true)])])]);
    return g.op1('Mul', [g.op1('Mul', [x, r]), W(w)]);
  };
  const linear = (x: string, w: TensorInfo, b: TensorInfo | null = null): string =>
    g.op1('Gemm', b ? [x, W(w), W(b)] : [x, W(w)], { transB: { i: 1 } });

  // ---- the decoder --------------------------------------------------------------------------------------
  const L = layout;
  let x = g.op1('Reshape', [g.op1('Gather', [W(L.embed), ids], { axis: { i: 0 } }), g.i64([-1, C])]); // [N, C]
  const scale = g.f32([1 / Math.sqrt(D)], true);
  for (let l = 0; l < c.numLayers; l++) {
    const w = L.layers[l]!;
    const h = rmsnorm(x, w.ln1);
    // Qwen3: RMSNorm over each head's last axis (q_norm / k_norm) before RoPE; SmolLM3's NoPE layers: no RoPE.
    const headNorm = (x: string, t: TensorInfo | null): string => (t ? rmsnorm(x, t) : x);
    const maybeRope = usesRope(c, l) ? rope : (x: string): string => x;
    const q = maybeRope(headNorm(g.op1('Reshape', [linear(h, w.wq, w.bq), shapeBSHD]), w.qNorm)); // [B, S, H, D]
    const k = maybeRope(headNorm(g.op1('Reshape', [linear(h, w.wk, w.bk), shapeBSKD]), w.kNorm)); // [B, S, KVH, D]
    const v = g.op1('Reshape', [linear(h, w.wv, w.bv), shapeBSKD]);
    const kT = g.op1('Transpose', [k], { perm: { ints: [0, 2, 1, 3] } }); // [B, KVH, S, D]
    const vT = g.op1('Transpose', [v], { perm: { ints: [0, 2, 1, 3] } });
    const presentK = g.op1('Concat', [past[l]!.key, kT], { axis: { i: 2 } }, `present.${l}.key`); // [B, KVH, T, D]
    const presentV = g.op1('Concat', [past[l]!.value, vT], { axis: { i: 2 } }, `present.${l}.value`);
    // Query head h uses kv head h / rep (HF repeat_kv): group queries as [B, KVH, rep, S, D].
    const qg = g.op1('Transpose', [g.op1('Reshape', [q, shapeBSKRD])], { perm: { ints: [0, 2, 3, 1, 4] } });
    const kg = g.op1('Transpose', [g.op1('Unsqueeze', [presentK, g.i64([2])])], { perm: { ints: [0, 1, 2, 4, 3] } }); // [B, KVH, 1, D, T]
    const vg = g.op1('Unsqueeze', [presentV, g.i64([2])]); // [B, KVH, 1, T, D]
    const scores = g.op1('Mul', [g.op1('MatMul', [qg, kg]), scale]); // [B, KVH, rep, S, T]
    const probs = g.op1('Softmax', [g.op1('Where', [allowed, scores, minusInf])], { axis: { i: -1 } });
    const ctx = g.op1('Transpose', [g.op1('MatMul', [probs, vg])], { perm: { ints: [0, 3, 1, 2, 4] } }); // [B, S, KVH, rep, D]
    const attn = linear(g.op1('Reshape', [ctx, g.i64([-1, H * D])]), w.wo, w.bo);
    x = g.op1('Add', [x, attn]);
    const h2 = rmsnorm(x, w.ln2);
    const gate = linear(h2, w.wGate);
    const act = g.op1('Mul', [g.op1('Mul', [gate, g.op1('Sigmoid', [gate])]), linear(h2, w.wUp)]);
    x = g.op1('Add', [x, linear(act, w.wDown)]);
  }
  const logits2 = linear(rmsnorm(x, L.finalNorm), L.lmHead ?? L.embed); // [N, V]
  g.op1('Reshape', [logits2, shapeBSV], {}, 'logits');

  g.output('logits', FLOAT, ['batch_size', 'sequence_length', V]);
  for (let l = 0; l < c.numLayers; l++) {
    g.output(`present.${l}.key`, FLOAT, ['batch_size', KVH, 'total_sequence_length', D]);
    g.output(`present.${l}.value`, FLOAT, ['batch_size', KVH, 'total_sequence_length', D]);
  }

  const model = new Message()
    .int(1, ONNX_IR_VERSION)
    .string(2, 'distillery')
    .string(3, '0.1.0')
    .message(7, g.graph(({ qwen2: 'Qwen2ForCausalLM', llama: 'LlamaForCausalLM', qwen3: 'Qwen3ForCausalLM', smollm3: 'SmolLM3ForCausalLM' } as const)[c.architecture]))
    .message(8, new Message().string(1, '').int(2, ONNX_OPSET));
  return { model, externalData: sink ? sink.chunks : null };
}

function writeChunks(file: string, chunks: Uint8Array[]): void {
  const tmp = `${file}.tmp-${process.pid}`;
  const fd = fs.openSync(tmp, 'w');
  try {
    for (const ch of chunks) writeAll(fd, ch);
  } finally {
    fs.closeSync(fd);
  }
  fs.renameSync(tmp, file);
}

function readJson(file: string): Record<string, unknown> | null {
  if (!fs.existsSync(file)) return null;
  try {
    return JSON.parse(fs.readFileSync(file, 'utf8')) as Record<string, unknown>;
  } catch (e) {
    throw new DistilleryError(`${file}: not valid JSON (${(e as Error).message})`);
  }
}

export interface OnnxExportResult {
  modelFile: string;
  dataFile: string | null;
  bytes: number;
}

/**
 * Writes `<dir>/onnx/model.onnx` (and `model.onnx_data` for external weights) into an existing HF model folder,
 * sets or clears `transformers.js_config.use_external_data_format` in its config.json, and writes a
 * generation_config.json (bos/eos ids) when the folder has none.
 */
export function exportOnnx(dir: string, config: ModelConfig, weights: Float32Array, opts: OnnxExportOptions = {}): OnnxExportResult {
  const configFile = path.join(dir, 'config.json');
  const hf = readJson(configFile);
  if (!hf) {
    throw new DistilleryError(`${dir} has no config.json`, 'export into a model folder written by distillery (writeCheckpoint)');
  }
  const { model, externalData } = buildOnnxModel(config, weights, opts);
  const onnxDir = path.join(dir, 'onnx');
  fs.mkdirSync(onnxDir, { recursive: true });
  const modelFile = path.join(onnxDir, 'model.onnx');
  const dataFile = path.join(onnxDir, 'model.onnx_data');
  let bytes = model.length;
  if (externalData) {
    writeChunks(dataFile, externalData);
    bytes += externalData.reduce((a, b) => a + b.length, 0);
  } else if (fs.existsSync(dataFile)) {
    fs.rmSync(dataFile);
  }
  writeChunks(modelFile, model.chunks);

  const tjs = (typeof hf['transformers.js_config'] === 'object' && hf['transformers.js_config'] !== null
    ? { ...(hf['transformers.js_config'] as Record<string, unknown>) } : {});
  if (externalData) tjs.use_external_data_format = true;
  else delete tjs.use_external_data_format;
  if (Object.keys(tjs).length > 0) hf['transformers.js_config'] = tjs;
  else delete hf['transformers.js_config'];
  writeChunks(configFile, [new TextEncoder().encode(`${JSON.stringify(hf, null, 2)}\n`)]);

  const genFile = path.join(dir, 'generation_config.json');
  if (!fs.existsSync(genFile)) {
    const gen: Record<string, unknown> = {};
    if (config.bosTokenId !== undefined) gen.bos_token_id = config.bosTokenId;
    if (config.eosTokenId !== undefined) gen.eos_token_id = config.eosTokenId;
    writeChunks(genFile, [new TextEncoder().encode(`${JSON.stringify(gen, null, 2)}\n`)]);
  }
  return { modelFile, dataFile: externalData ? dataFile : null, bytes };
}
