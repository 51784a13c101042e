/**
 * Model folders ↔ Transformers: reads an HF folder (config.json + model.safetensors or its shards + tokenizer.json,
 * tokenizer_config.json, generation_config.json) into a Transformer on any backend, and writes a Transformer back
 * out in the same layout, readable by HF transformers' Qwen2ForCausalLM / LlamaForCausalLM and by transformers.js
 * (a tokenizer_config.json with a chat_template, a generation_config.json with the eos ids).
 */
import type { Backend } from '../backend/backend.js';
import { parseHfConfig, toHfConfig, type ModelConfig } from './config.js';
import { MAX_FLAT_WEIGHTS, TensorWeights, flatWeights, packWeights, unpackWeights, parameterLayout, tensorOf, type ParamLayout, type Weights } from './params.js';
import { DistilleryError } from '../util/errors.js';
import { Transformer, type TransformerOptions } from './transformer.js';
import { loadModelDirLazy, minimalTokenizerConfig, saveModelDirSync, generationEosIds } from '../io/checkpoint-dir.js';
import { Tokenizer } from '../tokenizer/bpe.js';
import { withChatTemplate } from '../tokenizer/chat.js';

export interface LoadedCheckpoint {
  config: ModelConfig;
  /** One flat array, or tensor by tensor for a model above MAX_FLAT_WEIGHTS parameters (TensorWeights). */
  weights: Weights;
  tokenizer: Tokenizer | null;
  tokenizerJson: Record<string, unknown> | null;
  /** tokenizer_config.json, when the folder has one. */
  tokenizerConfig: Record<string, unknown> | null;
  /** The chat template (tokenizer_config.json's chat_template, else chat_template.jinja), when there is one. */
  chatTemplate: string | null;
  /** generation_config.json, when the folder has one. */
  generationConfig: Record<string, unknown> | null;
  /** End-of-sequence ids of generation_config.json (empty without one). */
  generationEosIds: number[];
}

/**
 * Parameters above which a checkpoint is kept tensor by tensor: MAX_FLAT_WEIGHTS, or DISTILLERY_MAX_FLAT_WEIGHTS (a
 * smaller positive integer: how the tests run a small model through the path of a 7B one).
 */
function maxFlatFromEnv(): number {
  const v = Number(process.env.DISTILLERY_MAX_FLAT_WEIGHTS);
  return Number.isInteger(v) && v > 0 ? Math.min(v, MAX_FLAT_WEIGHTS) : MAX_FLAT_WEIGHTS;
}

/** readCheckpoint of a model that must fit one flat array (training it, or a test that reads its values by index). */
export function readFlatCheckpoint(dir: string): LoadedCheckpoint & { weights: Float32Array } {
  const ck = readCheckpoint(dir);
  return { ...ck, weights: flatWeights(ck.weights, `reading ${dir} whole`) };
}

export interface ReadCheckpointOptions {
  /** Parameters above which the weights are kept tensor by tensor (default MAX_FLAT_WEIGHTS, or the environment's). */
  maxFlat?: number;
  /**
   * Keep the weights tensor by tensor at any size: for a model whose weights are only uploaded (a teacher, a model that
   * eval or generate runs), so that no float32 array of the whole model is made, and a bf16 checkpoint loaded into bf16
   * weights is uploaded as its own bits (TensorWeights.bf16), with no float32 values in between.
   */
  tensorByTensor?: boolean;
}

/**
 * Reads and validates a checkpoint folder: config, every tensor by name and shape, the tokenizer if present.
 * Weights that are NaN or infinite are refused, naming the tensor (such a model computes nothing meaningful).
 */
export function readCheckpoint(dir: string, opts: ReadCheckpointOptions = {}): LoadedCheckpoint {
  // The tensors are read as they are placed (lazily): a flat model holds its array and one tensor at a time; a model
  // kept tensor by tensor reads each when it is asked for (and checks it then), so a 7B teacher is never whole in memory.
  const loaded = loadModelDirLazy(dir);
  const config = parseHfConfig(loaded.config);
  const layout = parameterLayout(config);
  const packed = packWeights(layout, loaded.tensors, dir, opts.tensorByTensor ? 0 : opts.maxFlat ?? maxFlatFromEnv());
  const nonFinite = (bad: { name: string; index: number; value: number }): DistilleryError => new DistilleryError(
    `${dir}: tensor "${bad.name}" holds a non-finite value (${bad.value} at element ${bad.index})`,
    'the checkpoint is damaged or was saved after training diverged; use an earlier checkpoint');
  let weights: Weights;
  if (packed instanceof TensorWeights) {
    weights = new TensorWeights(layout, (t) => {
      const d = packed.tensor(t), i = firstNonFiniteIndex(d);
      if (i >= 0) throw nonFinite({ name: t.name, index: i, value: d[i]! });
      return d;
    }, packed.hasBf16 ? (t) => {
      const d = packed.bf16(t), i = firstNonFiniteBf16(d);
      if (i >= 0) {
        // a float32 file's value may be finite and still past bf16's largest: say which
        const v = packed.tensor(t)[i]!;
        if (Number.isFinite(v)) {
          throw new DistilleryError(`${dir}: tensor "${t.name}" holds ${v} at element ${i}, beyond bfloat16's range (±3.39e38), so bf16 weights cannot hold it`,
            'run the model in float32 (--precision fp32), or fix the checkpoint');
        }
        throw nonFinite({ name: t.name, index: i, value: v });
      }
      return d;
    } : null);
  } else {
    const bad = firstNonFinite(layout, packed);
    if (bad) throw nonFinite(bad);
    weights = packed;
  }
  const tokenizerJson = loaded.tokenizerJson ?? null;
  let tokenizer: Tokenizer | null = null;
  if (tokenizerJson) {
    try {
      tokenizer = Tokenizer.fromJSON(tokenizerJson);
    } catch (e) {
      if (e instanceof DistilleryError) throw new DistilleryError(`${dir}/${e.message}`, e.hint);
      throw e;
    }
  }
  if (tokenizer && tokenizer.vocabSize > config.vocabSize) {
    // Its ids at or above vocab_size have no embedding row: encoding text could index past the model.
    throw new DistilleryError(`${dir}: tokenizer.json has ${tokenizer.vocabSize} tokens but config.json's vocab_size is ${config.vocabSize}`,
      'the tokenizer does not belong to this model: put back the tokenizer.json it was trained with');
  }
  const generationConfig = loaded.generationConfig ?? null;
  return {
    config, weights, tokenizerJson, tokenizer, tokenizerConfig: loaded.tokenizerConfig ?? null,
    chatTemplate: loaded.chatTemplate ?? null, generationConfig,
    generationEosIds: generationEosIds(generationConfig, `${dir}/generation_config.json`),
  };
}

/** Loads a checkpoint folder into a new Transformer on the backend. */
export function loadTransformer(backend: Backend, dir: string, opts: TransformerOptions): { model: Transformer } & LoadedCheckpoint {
  const ck = readCheckpoint(dir);
  const model = new Transformer(backend, ck.config, opts);
  model.setWeights(ck.weights);
  return { model, ...ck };
}

/** The first NaN or infinite weight, by tensor name and element index, or null when all are finite. */
export function firstNonFinite(layout: ParamLayout, weights: Weights): { name: string; index: number; value: number } | null {
  for (const t of layout.tensors) {
    const d = tensorOf(weights, t), i = firstNonFiniteIndex(d);
    if (i >= 0) return { name: t.name, index: i, value: d[i]! };
  }
  return null;
}

/** The index of a tensor's first NaN or infinite value, or -1 (float32: by the exponent bits, all set). */
function firstNonFiniteIndex(d: ArrayLike<number>): number {
  if (d instanceof Float32Array) {
    const u = new Uint32Array(d.buffer, d.byteOffset, d.length);
    for (let i = 0; i < u.length; i++) if ((u[i]! & 0x7f800000) === 0x7f800000) return i;
    return -1;
  }
  for (let i = 0; i < d.length; i++) if (!Number.isFinite(d[i]!)) return i;
  return -1;
}

/**
 * The index of the first NaN or infinite bf16 bit pattern (all exponent bits set), or -1. Two patterns a 32-bit word
 * where the array is aligned: adding 0x80 to a pattern's exponent bits carries into its sign bit exactly when they are
 * all set, and the low pattern's carry stops below the high one.
 */
export function firstNonFiniteBf16(bits: Uint16Array): number {
  let i = 0;
  if (bits.byteOffset % 4 === 0) {
    const w = new Uint32Array(bits.buffer, bits.byteOffset, bits.length >> 1);
    for (let k = 0; k < w.length; k++) {
      if ((((w[k]! & 0x7f807f80) + 0x00800080) & 0x80008000) !== 0) { i = 2 * k; break; }
      i = 2 * k + 2;
    }
  }
  for (; i < bits.length; i++) if ((bits[i]! & 0x7f80) === 0x7f80) return i;
  return -1;
}

export interface SaveCheckpointOptions {
  dtype: 'f32' | 'bf16';
  tokenizerJson?: object | null | undefined;
  /**
   * tokenizer_config.json to write (e.g. the one that came with the teacher); default: a minimal one. Either way it
   * gets `chatTemplate` (or keeps its own chat_template; or ChatML when the tokenizer has the ChatML tokens).
   */
  tokenizerConfig?: Record<string, unknown> | null | undefined;
  /** The chat template to carry (e.g. the teacher's chat_template.jinja); written into tokenizer_config.json. */
  chatTemplate?: string | null | undefined;
  /** generation_config.json to write; default: bos/eos ids of the config (written when the config has an eos id). */
  generationConfig?: Record<string, unknown> | null | undefined;
  extraFiles?: Record<string, string | Uint8Array>;
  /** Shard the weights above this many bytes (default: transformers 5's 50 GB). */
  maxShardBytes?: number;
}

/**
 * The tokenizer_config.json and generation_config.json a model folder gets (see SaveCheckpointOptions): the given
 * ones, a minimal tokenizer config with the chat template carried (or ChatML when the tokenizer has its tokens), and
 * the config's bos/eos ids when no generation config is given. Shared with adapter folders (src/model/adapter.ts).
 */
export function sideConfigs(config: ModelConfig, opts: Pick<SaveCheckpointOptions, 'tokenizerJson' | 'tokenizerConfig' | 'chatTemplate' | 'generationConfig'>):
  { tokenizerConfig?: Record<string, unknown>; generationConfig?: Record<string, unknown> } {
  let tokenizerConfig: Record<string, unknown> | undefined;
  if (opts.tokenizerJson) {
    const tj = opts.tokenizerJson as Record<string, unknown>;
    tokenizerConfig = { ...(opts.tokenizerConfig ?? minimalTokenizerConfig(tj, config.maxPositionEmbeddings)) };
    if (opts.chatTemplate) tokenizerConfig = withChatTemplate(tokenizerConfig, opts.chatTemplate);
    else if (tokenizerConfig.chat_template === undefined || tokenizerConfig.chat_template === null) {
      const chat = minimalTokenizerConfig(tj).chat_template;
      if (chat !== undefined) tokenizerConfig.chat_template = chat;
    }
  }
  let generationConfig = opts.generationConfig ?? undefined;
  if (!generationConfig && config.eosTokenId !== undefined) {
    generationConfig = {
      ...(config.bosTokenId !== undefined ? { bos_token_id: config.bosTokenId } : {}), eos_token_id: config.eosTokenId,
    };
  }
  return { ...(tokenizerConfig ? { tokenizerConfig } : {}), ...(generationConfig ? { generationConfig } : {}) };
}

/** Writes weights (flat, layout order) and config as an HF model folder, atomically. */
export function writeCheckpoint(dir: string, config: ModelConfig, weights: Weights | Float64Array, opts: SaveCheckpointOptions): void {
  const tensors = unpackWeights(parameterLayout(config), weights);
  const hf = toHfConfig(config);
  hf.torch_dtype = opts.dtype === 'bf16' ? 'bfloat16' : 'float32';
  const { tokenizerConfig, generationConfig } = sideConfigs(config, opts);
  saveModelDirSync(dir, {
    config: hf, tensors, dtype: opts.dtype,
    ...(opts.tokenizerJson ? { tokenizerJson: opts.tokenizerJson } : {}),
    ...(tokenizerConfig ? { tokenizerConfig } : {}),
    ...(generationConfig ? { generationConfig } : {}),
    ...(opts.extraFiles ? { extraFiles: opts.extraFiles } : {}),
    ...(opts.maxShardBytes !== undefined ? { maxShardBytes: opts.maxShardBytes } : {}),
  });
}
