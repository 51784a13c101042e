/**
 * Parameter layout: every trainable tensor of a Qwen2/Llama/Qwen3/SmolLM3 model lives in ONE flat buffer (as in llm.c), so the
 * optimizer, gradient zeroing and global-norm clipping are single calls. Each tensor has its Hugging Face name,
 * its shape, its offset into the flat buffer, and whether weight decay applies (matrices yes; norms, biases no).
 */
import { oProjBias, type ModelConfig } from './config.js';
import { Rng } from '../util/rng.js';
import { DistilleryError } from '../util/errors.js';
import { packBf16 } from '../backend/bf16.js';

export interface TensorInfo {
  /** The Hugging Face state-dict name, e.g. `model.layers.3.self_attn.q_proj.weight`. */
  name: string;
  shape: number[];
  offset: number;
  size: number;
  /** Weight decay applies (2-D weights and embeddings). */
  decay: boolean;
  init: 'normal' | 'normal-residual' | 'zeros' | 'ones';
}

/** Offsets of one layer's tensors inside the flat buffer. */
export interface LayerTensors {
  ln1: TensorInfo; wq: TensorInfo; bq: TensorInfo | null; wk: TensorInfo; bk: TensorInfo | null;
  wv: TensorInfo; bv: TensorInfo | null;
  /** Qwen3's per-head q/k RMSNorm weights ([head_dim] each); null without q/k norms. */
  qNorm: TensorInfo | null; kNorm: TensorInfo | null;
  wo: TensorInfo;
  /** o_proj's bias: Llama with attention_bias true only (oProjBias). */
  bo: TensorInfo | null; ln2: TensorInfo;
  wGate: TensorInfo; wUp: TensorInfo; wDown: TensorInfo;
}

export interface ParamLayout {
  tensors: TensorInfo[];
  total: number;
  embed: TensorInfo;
  layers: LayerTensors[];
  finalNorm: TensorInfo;
  /** Null when embeddings are tied (the LM head is the embedding matrix). */
  lmHead: TensorInfo | null;
}

/**
 * The flat layout of a model's parameters. `tensors` lists them in the Hugging Face order (embedding; per layer ln1,
 * q/k/v weights each with its bias, o, the q/k norms, ln2, gate, up, down; final norm; LM head), which is also the order
 * of their values in the flat buffers of versions before q/k/v were grouped (`order: 'legacy'`). Stored (`order`
 * 'grouped', the default), each layer's q, k and v weights are adjacent ([Q + 2·KV, hidden], one matrix the fused
 * projection reads: qkvSpans) and so are their biases; without biases both orders are the same.
 */
export function parameterLayout(c: ModelConfig, order: 'grouped' | 'legacy' = 'grouped'): ParamLayout {
  const tensors: TensorInfo[] = [];
  let offset = 0;
  const add = (name: string, shape: number[], init: TensorInfo['init']): TensorInfo => {
    const size = shape.reduce((a, b) => a * b, 1);
    const t: TensorInfo = { name, shape, offset, size, decay: shape.length === 2, init };
    offset += size;
    return t;
  };
  const keep = (...ts: Array<TensorInfo | null>): void => { for (const t of ts) if (t) tensors.push(t); };
  const C = c.hiddenSize, Q = c.numHeads * c.headDim, KV = c.numKvHeads * c.headDim, I = c.intermediateSize;
  const embed = add('model.embed_tokens.weight', [c.vocabSize, C], 'normal');
  keep(embed);
  const layers: LayerTensors[] = [];
  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}.`;
    const ln1 = add(`${p}input_layernorm.weight`, [C], 'ones');
    const proj = (n: 'q' | 'k' | 'v', rows: number): TensorInfo => add(`${p}self_attn.${n}_proj.weight`, [rows, C], 'normal');
    const bias = (n: 'q' | 'k' | 'v', rows: number): TensorInfo | null => c.qkvBias ? add(`${p}self_attn.${n}_proj.bias`, [rows], 'zeros') : null;
    let wq: TensorInfo, bq: TensorInfo | null, wk: TensorInfo, bk: TensorInfo | null, wv: TensorInfo, bv: TensorInfo | null;
    if (order === 'legacy') {
      wq = proj('q', Q); bq = bias('q', Q); wk = proj('k', KV); bk = bias('k', KV); wv = proj('v', KV); bv = bias('v', KV);
    } else {
      wq = proj('q', Q); wk = proj('k', KV); wv = proj('v', KV); bq = bias('q', Q); bk = bias('k', KV); bv = bias('v', KV);
    }
    const wo = add(`${p}self_attn.o_proj.weight`, [C, Q], 'normal-residual');
    const bo = oProjBias(c) ? add(`${p}self_attn.o_proj.bias`, [C], 'zeros') : null;
    const qNorm = c.qkNorm ? add(`${p}self_attn.q_norm.weight`, [c.headDim], 'ones') : null;
    const kNorm = c.qkNorm ? add(`${p}self_attn.k_norm.weight`, [c.headDim], 'ones') : null;
    const ln2 = add(`${p}post_attention_layernorm.weight`, [C], 'ones');
    const wGate = add(`${p}mlp.gate_proj.weight`, [I, C], 'normal');
    const wUp = add(`${p}mlp.up_proj.weight`, [I, C], 'normal');
    const wDown = add(`${p}mlp.down_proj.weight`, [C, I], 'normal-residual');
    keep(ln1, wq, bq, wk, bk, wv, bv, wo, bo, qNorm, kNorm, ln2, wGate, wUp, wDown);
    layers.push({ ln1, wq, bq, wk, bk, wv, bv, qNorm, kNorm, wo, bo, ln2, wGate, wUp, wDown });
  }
  const finalNorm = add('model.norm.weight', [C], 'ones');
  const lmHead = c.tieWordEmbeddings ? null : add('lm_head.weight', [c.vocabSize, C], 'normal');
  keep(finalNorm, lmHead);
  return { tensors, total: offset, embed, layers, finalNorm, lmHead };
}

/**
 * Where a layer's fused q/k/v projection reads: the q, k and v weights as one [Q + 2·KV, hidden] matrix and their
 * biases as one vector (null without biases), as [offset, size] of the flat layout — or null where they are not
 * adjacent in that order (a layout of the legacy order with biases).
 */
export function qkvSpans(w: LayerTensors): { weight: [number, number]; bias: [number, number] | null } | null {
  const weight = adjacentSpan([w.wq, w.wk, w.wv]);
  if (!weight) return null;
  if (!w.bq) return { weight, bias: null }; // q/k/v biases: all three (qkv_bias) or none
  const bias = adjacentSpan([w.bq, w.bk!, w.bv!]);
  return bias ? { weight, bias } : null;
}

/** [offset, size] of a layer's gate_proj and up_proj weights as one [2·intermediate, hidden] matrix (gate first), else null. */
export function gateUpSpan(w: LayerTensors): [number, number] | null {
  return adjacentSpan([w.wGate, w.wUp]);
}

/**
 * Whether a model of this layout runs the fused gate/up product (src/model/layer.ts: one [N, 2·intermediate] product,
 * then swigluForwardRows): every layer's gate and up weights adjacent, gate first, and no LoRA adapter on either (each
 * adds into its own projection's output).
 */
export function fusesGateUp(layout: ParamLayout, lora?: { spec: { targets: readonly string[] } } | null): boolean {
  if (lora && lora.spec.targets.some((t) => t === 'gate_proj' || t === 'up_proj')) return false;
  return layout.layers.length > 0 && layout.layers.every((w) => gateUpSpan(w) !== null);
}

/** The tensors in the order of their values in the flat buffer (layout.tensors lists them in the Hugging Face order). */
export function storageOrder(layout: { readonly tensors: readonly TensorInfo[] }): TensorInfo[] {
  return [...layout.tensors].sort((a, b) => a.offset - b.offset);
}

/** [first offset, total size] of tensors each starting where the one before ends (in the order given), else null. */
export function adjacentSpan(ts: ReadonlyArray<Pick<TensorInfo, 'offset' | 'size'>>): [number, number] | null {
  for (let i = 1; i < ts.length; i++) if (ts[i]!.offset !== ts[i - 1]!.offset + ts[i - 1]!.size) return null;
  return [ts[0]!.offset, ts.reduce((s, t) => s + t.size, 0)];
}

/**
 * Whether a model of this layout runs the fused q/k/v projection (src/model/layer.ts): every layer's q/k/v weights (and
 * biases) adjacent, and no LoRA adapter on q, k or v (each adds into its own projection's output). Frozen NF4 storage
 * keeps them adjacent as well (its one-layer scratch and its dense part, FrozenNf4.span). Memory estimates and the
 * Transformer ask the same question here.
 */
export function fusesQkv(layout: ParamLayout, lora?: { spec: { targets: readonly string[] } } | null): boolean {
  if (lora && lora.spec.targets.some((t) => t === 'q_proj' || t === 'k_proj' || t === 'v_proj')) return false;
  return layout.layers.length > 0 && layout.layers.every((w) => qkvSpans(w) !== null);
}

/**
 * Values of a flat buffer in layout `from` moved to where layout `to` keeps them (the same tensors by name): a
 * checkpoint's optimizer moments written in the legacy order, read by a model stored grouped.
 */
export function reorderFlat(src: Float32Array, from: ParamLayout, to: ParamLayout): Float32Array {
  if (src.length !== from.total || from.total !== to.total) throw new Error(`reorderFlat: ${src.length} values for layouts of ${from.total} and ${to.total}`);
  const out = new Float32Array(to.total);
  const dst = new Map(to.tensors.map((t) => [t.name, t]));
  for (const t of from.tensors) {
    const d = dst.get(t.name);
    if (!d || d.size !== t.size) throw new Error(`reorderFlat: tensor ${t.name} is not in both layouts`);
    out.set(src.subarray(t.offset, t.offset + t.size), d.offset);
  }
  return out;
}

/**
 * Host-side initial weights: N(0, std) for matrices, std/sqrt(2·layers) for the projections that write into
 * the residual stream (GPT-2's scheme), ones for norms, zeros for biases.
 */
export function initialWeights(layout: ParamLayout, c: ModelConfig, rng: Rng, std = 0.02): Float32Array {
  const w = new Float32Array(layout.total);
  const residualStd = std / Math.sqrt(2 * c.numLayers);
  for (const t of layout.tensors) {
    const dst = w.subarray(t.offset, t.offset + t.size);
    if (t.init === 'ones') dst.fill(1);
    else if (t.init === 'zeros') dst.fill(0);
    else {
      const s = t.init === 'normal-residual' ? residualStd : std;
      for (let i = 0; i < dst.length; i++) dst[i] = rng.normal() * s;
    }
  }
  return w;
}

/** A flat float32 buffer of n parameters, or a DistilleryError naming the size when it cannot be had. */
export function allocateWeights(n: number, what: string): Float32Array {
  try {
    return new Float32Array(n);
  } catch {
    throw new DistilleryError(`${what}: cannot allocate ${(n * 4 / 2 ** 30).toFixed(2)} GiB for ${n} float32 parameters`,
      'check vocab_size and the other sizes in config.json; a model this large needs --device cuda and a GPU that holds it');
  }
}

/** The most elements one typed array holds (V8 in Node 20): a model with more parameters keeps them tensor by tensor. */
export const MAX_FLAT_WEIGHTS = 2 ** 32 - 1;

/**
 * A model's weights kept tensor by tensor, in layout order, where one flat float32 array cannot hold them (above
 * MAX_FLAT_WEIGHTS: Qwen2.5-7B, Llama-3-8B, Qwen3-8B). Whatever reads a model as a teacher, a frozen base, for eval,
 * generate or export takes either form (setWeights, weightsHash, unpackWeights); what needs one array (training every
 * weight of such a model) asks flatWeights, which refuses it by name.
 */
export class TensorWeights {
  /**
   * `read` gives a tensor's values; it may read them from disk at each call (readCheckpoint: a 7B model never whole
   * in memory), so a caller reads each tensor once where it can.
   */
  constructor(readonly layout: ParamLayout, private readonly read: (t: TensorInfo) => Float32Array,
    private readonly readBits: ((t: TensorInfo) => Uint16Array) | null = null) {}
  /** Tensors given in memory by name. */
  static of(layout: ParamLayout, data: ReadonlyMap<string, Float32Array>): TensorWeights {
    for (const t of layout.tensors) if (!data.has(t.name)) throw new Error(`TensorWeights: no tensor ${t.name}`);
    return new TensorWeights(layout, (t) => data.get(t.name)!);
  }
  /** Parameters in all (the layout's total). */
  get length(): number { return this.layout.total; }
  /** One tensor's values. */
  tensor(t: TensorInfo): Float32Array {
    const d = this.read(t);
    if (d.length !== t.size) throw new Error(`TensorWeights: tensor ${t.name} has ${d.length} values, the layout ${t.size}`);
    return d;
  }
  /** Whether bf16(t) reads bit patterns without float32 values in between (a checkpoint's tensors do). */
  get hasBf16(): boolean { return this.readBits !== null; }
  /**
   * One tensor's values as bfloat16 bit patterns, the values of tensor(t) rounded to nearest even (for a bf16 file,
   * its own bits: what a bf16 upload of tensor(t) stores, without the float32 array in between).
   */
  bf16(t: TensorInfo): Uint16Array {
    const d = this.readBits ? this.readBits(t) : packBf16(this.tensor(t));
    if (d.length !== t.size) throw new Error(`TensorWeights: tensor ${t.name} has ${d.length} values, the layout ${t.size}`);
    return d;
  }
}

/** A model's weights: one flat float32 array in layout order, or tensor by tensor (TensorWeights). */
export type Weights = Float32Array | TensorWeights;

/** One tensor's values of a model's weights (a view of a flat array). */
export function tensorOf(w: Float32Array | Float64Array | TensorWeights, t: TensorInfo): Float32Array | Float64Array {
  return w instanceof TensorWeights ? w.tensor(t) : w.subarray(t.offset, t.offset + t.size);
}

/** The flat array of a model's weights, or a DistilleryError naming `what` when the model keeps them tensor by tensor. */
export function flatWeights(w: Weights, what: string): Float32Array {
  if (!(w instanceof TensorWeights)) return w;
  throw new DistilleryError(`${what} needs the model's ${w.length} parameters in one float32 array, which holds at most ${MAX_FLAT_WEIGHTS}`,
    'a model this large runs as a teacher, a frozen LoRA base, or in eval, generate and export; train a smaller model');
}

/** A named tensor of a checkpoint: its values read, or read when asked. */
type NamedTensor = { shape: number[]; data: Float32Array }
  | { shape: number[]; read(): Float32Array; readInto?(out: Float32Array): void; readBf16?(): Uint16Array };

/**
 * Places named tensors (from a safetensors file; read now, or lazily: `read()`) into a flat weight array, checking names
 * and shapes; a model with more than `maxFlat` parameters (default MAX_FLAT_WEIGHTS) keeps them tensor by tensor
 * (TensorWeights: in-memory tensors as they are, lazy ones read when asked).
 * An untied model requires a `lm_head.weight`. A tied one (tie_word_embeddings) reads it as transformers 5 does: alone,
 * it is the embedding matrix too; beside an equal `model.embed_tokens.weight` it changes nothing; beside a different one
 * it is refused by name (transformers 5 would then run the two untied, transformers 4 tied: the config and the file
 * disagree).
 */
export function packWeights(
  layout: ParamLayout,
  namedIn: ReadonlyMap<string, NamedTensor>,
  source: string,
  maxFlat = MAX_FLAT_WEIGHTS,
): Weights {
  const named = tiedHead(layout, namedIn, source);
  // Names and shapes first: a config.json that does not match its weights (e.g. vocab_size 1e9) is reported
  // before the flat buffer it implies is allocated.
  for (const t of layout.tensors) {
    const src = named.get(t.name);
    if (!src) {
      throw new DistilleryError(`${source}: missing tensor "${t.name}" (shape [${t.shape.join(', ')}])`,
        'the checkpoint does not match config.json: check num_hidden_layers, tie_word_embeddings and attention biases');
    }
    if (src.shape.length !== t.shape.length || src.shape.some((d, i) => d !== t.shape[i])) {
      throw new DistilleryError(
        `${source}: tensor "${t.name}" has shape [${src.shape.join(', ')}] but config.json implies [${t.shape.join(', ')}]`,
        'the checkpoint and config.json disagree: use the config.json saved with these weights');
    }
  }
  const known = new Set(layout.tensors.map((t) => t.name));
  for (const name of named.keys()) {
    if (!known.has(name) && name !== 'lm_head.weight' && !name.endsWith('rotary_emb.inv_freq')) {
      throw new DistilleryError(`${source}: unexpected tensor "${name}" not described by config.json`,
        'check that config.json belongs to these weights (model_type, attention_bias, num_hidden_layers)');
    }
  }
  const get = (t: TensorInfo): Float32Array => { const x = named.get(t.name)!; return 'data' in x ? x.data : x.read(); };
  if (layout.total > maxFlat) {
    // bf16 bits tensor by tensor: a file's own (readBf16), else the values rounded (a tied head's embedding held in memory)
    const bits = (t: TensorInfo): Uint16Array => { const x = named.get(t.name)!; return 'readBf16' in x && x.readBf16 ? x.readBf16() : packBf16(get(t)); };
    return new TensorWeights(layout, get, bits);
  }
  const w = allocateWeights(layout.total, source);
  for (const t of layout.tensors) {
    // read straight into place where the tensor can (no array of its own to copy from)
    const x = named.get(t.name)!;
    if ('readInto' in x && x.readInto) x.readInto(w.subarray(t.offset, t.offset + t.size));
    else w.set(get(t), t.offset);
  }
  return w;
}

/** A tied model's tensors with a lone `lm_head.weight` as the embedding; a different one beside the embedding refused. */
function tiedHead(layout: ParamLayout, named: ReadonlyMap<string, NamedTensor>, source: string): ReadonlyMap<string, NamedTensor> {
  const head = named.get('lm_head.weight');
  if (layout.lmHead !== null || head === undefined) return named;
  const embedName = layout.embed.name, embed = named.get(embedName);
  if (embed === undefined) return new Map([...named, [embedName, head]]);
  const sameShape = head.shape.length === embed.shape.length && head.shape.every((d, i) => d === embed.shape[i]);
  // the embedding's values read once: the comparison's are the ones packed
  const b = sameShape ? ('data' in embed ? embed.data : embed.read()) : null;
  const same = b !== null && (() => {
    const a = 'data' in head ? head.data : head.read();
    for (let i = 0; i < a.length; i++) if (a[i] !== b[i] && !(Number.isNaN(a[i]) && Number.isNaN(b[i]))) return false;
    return a.length === b.length;
  })();
  if (!same) {
    throw new DistilleryError(`${source}: config.json ties the embeddings (tie_word_embeddings) but "lm_head.weight" differs from "${embedName}"`,
      'transformers 5 would run these two untied and transformers 4 tied; set "tie_word_embeddings": false to use both, or remove lm_head.weight to tie them');
  }
  return 'data' in embed ? named : new Map([...named, [embedName, { shape: embed.shape, data: b! }]]);
}

/** The inverse of packWeights: named copies of a model's weights (tied models get no lm_head); a TensorWeights' tensors are
 * read when their `data` is used. */
export function unpackWeights(layout: ParamLayout, w: Float32Array | Float64Array | TensorWeights): Map<string, { shape: number[]; data: Float32Array }> {
  const out = new Map<string, { shape: number[]; data: Float32Array }>();
  for (const t of layout.tensors) {
    // tensor by tensor: `data` reads the tensor when it is used (a writer then holds one tensor at a time)
    if (w instanceof TensorWeights) out.set(t.name, { shape: t.shape, get data() { return w.tensor(t); } });
    // a float32 array's tensors are views (writers only read them: no 2 GB copy per save of a 0.5B model); float64 converts
    else out.set(t.name, { shape: t.shape, data: float32Of(tensorOf(w, t)) });
  }
  return out;
}

/**
 * A float32 array over a SharedArrayBuffer: what a model and its optimizer keep for their checkpoints, so that the
 * checkpoint writer's worker thread reads it without a copy (src/train/checkpoint-writer.ts).
 */
export function sharedFloat32(n: number): Float32Array {
  return new Float32Array(new SharedArrayBuffer(n * 4));
}

/** The array itself when it is float32, else a float32 copy (the CPU backend's f64 reference mode downloads float64). */
export function float32Of(a: Float32Array | Float64Array): Float32Array {
  return a instanceof Float32Array ? a : Float32Array.from(a);
}

/** Elements [begin, end) of a flat weight array: a view of a typed array, else a copy. */
export function weightSlice(w: ArrayLike<number>, begin: number, end: number): ArrayLike<number> {
  return w instanceof Float32Array || w instanceof Float64Array ? w.subarray(begin, end) : Array.prototype.slice.call(w, begin, end) as number[];
}
