/**
 * Model configuration in the Hugging Face `config.json` vocabulary, for the Qwen2 and Llama families.
 * Both run from the same code: Qwen2 has Q/K/V biases, Llama does not (`attention_bias`).
 */
import { DistilleryError } from '../util/errors.js';

export interface ModelConfig {
  architecture: 'qwen2' | 'llama';
  vocabSize: number;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  /** hiddenSize / numHeads unless config.json sets head_dim. */
  headDim: number;
  ropeTheta: number;
  rmsNormEps: number;
  tieWordEmbeddings: boolean;
  maxPositionEmbeddings: number;
  /** Q, K and V projections have biases (Qwen2: true; Llama: false). The O projection never has one. */
  qkvBias: boolean;
  /** Token ids, carried through to config.json. */
  bosTokenId?: number | undefined;
  eosTokenId?: number | undefined;
}

type Json = Record<string, unknown>;

function num(j: Json, key: string, fallback?: number): number {
  const v = j[key];
  if (v === undefined && fallback !== undefined) return fallback;
  if (typeof v !== 'number' || !Number.isFinite(v)) {
    throw new DistilleryError(`config.json: "${key}" must be a number, got ${JSON.stringify(v)}`,
      `set "${key}" in config.json`);
  }
  return v;
}

/** Parses and validates an HF-style config.json object. Throws DistilleryError naming the bad field. */
export function parseHfConfig(j: Json): ModelConfig {
  const archs = Array.isArray(j.architectures) ? (j.architectures as unknown[]).map(String) : [];
  const modelType = typeof j.model_type === 'string' ? j.model_type : '';
  let architecture: 'qwen2' | 'llama';
  if (modelType === 'qwen2' || archs.some((a) => a.startsWith('Qwen2'))) architecture = 'qwen2';
  else if (modelType === 'llama' || archs.some((a) => a.startsWith('Llama'))) architecture = 'llama';
  else {
    throw new DistilleryError(`config.json: unsupported model_type ${JSON.stringify(modelType)}`,
      'distillery runs the Qwen2 and Llama families: set "model_type" to "qwen2" or "llama"');
  }
  // Features of the HF families that this implementation does not compute: refuse them rather than run a
  // different function than transformers would (e.g. Llama 3.1 rope scaling, sliding-window attention).
  if (j.rope_scaling !== undefined && j.rope_scaling !== null) {
    throw new DistilleryError(`config.json: "rope_scaling" ${JSON.stringify(j.rope_scaling)} is not supported`,
      'distillery implements plain rotary embeddings; remove rope_scaling only if the model was trained without it');
  }
  if (j.hidden_act !== undefined && j.hidden_act !== 'silu') {
    throw new DistilleryError(`config.json: "hidden_act" ${JSON.stringify(j.hidden_act)} is not supported`, 'distillery implements SwiGLU with silu');
  }
  if (j.use_sliding_window === true) {
    throw new DistilleryError('config.json: "use_sliding_window": true is not supported', 'distillery implements full causal attention; set it to false');
  }
  if (j.mlp_bias === true) {
    throw new DistilleryError('config.json: "mlp_bias": true is not supported', 'distillery\'s MLP projections have no biases');
  }
  if (architecture === 'qwen2' && j.attention_bias === false) {
    throw new DistilleryError('config.json: "attention_bias": false for model_type qwen2', 'Qwen2 always has Q/K/V biases; use model_type "llama" for a model without them');
  }
  const hiddenSize = num(j, 'hidden_size');
  const numHeads = num(j, 'num_attention_heads');
  const cfg: ModelConfig = {
    architecture,
    vocabSize: num(j, 'vocab_size'),
    hiddenSize,
    intermediateSize: num(j, 'intermediate_size'),
    numLayers: num(j, 'num_hidden_layers'),
    numHeads,
    numKvHeads: num(j, 'num_key_value_heads', numHeads),
    headDim: num(j, 'head_dim', hiddenSize / numHeads),
    ropeTheta: num(j, 'rope_theta', 10000),
    rmsNormEps: num(j, 'rms_norm_eps', 1e-6),
    tieWordEmbeddings: j.tie_word_embeddings === undefined ? false : Boolean(j.tie_word_embeddings),
    maxPositionEmbeddings: num(j, 'max_position_embeddings', architecture === 'qwen2' ? 32768 : 2048),
    qkvBias: typeof j.attention_bias === 'boolean' ? j.attention_bias : architecture === 'qwen2',
  };
  if (typeof j.bos_token_id === 'number') cfg.bosTokenId = j.bos_token_id;
  if (typeof j.eos_token_id === 'number') cfg.eosTokenId = j.eos_token_id;
  validateConfig(cfg);
  return cfg;
}

/** Checks the invariants the model code relies on. */
export function validateConfig(c: ModelConfig): void {
  const bad = (msg: string, hint?: string): never => { throw new DistilleryError(`model config: ${msg}`, hint); };
  for (const [k, v] of Object.entries({
    vocab_size: c.vocabSize, hidden_size: c.hiddenSize, intermediate_size: c.intermediateSize,
    num_hidden_layers: c.numLayers, num_attention_heads: c.numHeads, num_key_value_heads: c.numKvHeads,
    head_dim: c.headDim, max_position_embeddings: c.maxPositionEmbeddings,
  })) {
    if (!Number.isInteger(v) || v <= 0) bad(`${k} must be a positive integer, got ${v}`);
  }
  if (c.numHeads % c.numKvHeads !== 0) {
    bad(`num_attention_heads (${c.numHeads}) must be a multiple of num_key_value_heads (${c.numKvHeads})`);
  }
  if (c.headDim % 2 !== 0) bad(`head_dim (${c.headDim}) must be even for rotary embeddings`);
  if (!(c.ropeTheta > 0)) bad(`rope_theta must be positive, got ${c.ropeTheta}`);
  if (!(c.rmsNormEps > 0 && c.rmsNormEps < 1)) bad(`rms_norm_eps must be in (0, 1), got ${c.rmsNormEps}`);
}

/** The config.json object HF transformers reads for this config (Qwen2ForCausalLM or LlamaForCausalLM). */
export function toHfConfig(c: ModelConfig): Json {
  const common: Json = {
    vocab_size: c.vocabSize,
    hidden_size: c.hiddenSize,
    intermediate_size: c.intermediateSize,
    num_hidden_layers: c.numLayers,
    num_attention_heads: c.numHeads,
    num_key_value_heads: c.numKvHeads,
    head_dim: c.headDim,
    hidden_act: 'silu',
    max_position_embeddings: c.maxPositionEmbeddings,
    rms_norm_eps: c.rmsNormEps,
    rope_theta: c.ropeTheta,
    tie_word_embeddings: c.tieWordEmbeddings,
    torch_dtype: 'float32',
    initializer_range: 0.02,
    use_cache: true,
    attention_dropout: 0.0,
  };
  if (c.bosTokenId !== undefined) common.bos_token_id = c.bosTokenId;
  if (c.eosTokenId !== undefined) common.eos_token_id = c.eosTokenId;
  if (c.architecture === 'qwen2') {
    return { architectures: ['Qwen2ForCausalLM'], model_type: 'qwen2', ...common, use_sliding_window: false,
      sliding_window: c.maxPositionEmbeddings, max_window_layers: c.numLayers };
  }
  return { architectures: ['LlamaForCausalLM'], model_type: 'llama', ...common, attention_bias: c.qkvBias,
    mlp_bias: false, pretraining_tp: 1 };
}

/** Number of trainable parameters (tied embeddings counted once). */
export function parameterCount(c: ModelConfig): number {
  const C = c.hiddenSize, kv = c.numKvHeads * c.headDim, q = c.numHeads * c.headDim;
  const attn = C * q + C * kv * 2 + q * C + (c.qkvBias ? q + 2 * kv : 0);
  const mlp = 3 * C * c.intermediateSize;
  const perLayer = attn + mlp + 2 * C;
  return c.vocabSize * C * (c.tieWordEmbeddings ? 1 : 2) + c.numLayers * perLayer + C;
}

/** Named shapes used by the CLI and benchmarks (Qwen2.5 family shapes; tiny ones for CPU work). */
export function presetConfig(name: string, vocabSize: number): ModelConfig {
  const shapes: Record<string, [number, number, number, number, number]> = {
    // hidden, intermediate, layers, heads, kv heads
    'tiny': [64, 176, 2, 4, 2],
    'small': [128, 352, 4, 4, 2],
    'base': [256, 704, 6, 8, 2],
    'qwen2.5-0.5b': [896, 4864, 24, 14, 2],
    'qwen2.5-1.5b': [1536, 8960, 28, 12, 2],
  };
  const s = shapes[name];
  if (!s) {
    throw new DistilleryError(`unknown model preset "${name}"`, `use one of: ${Object.keys(shapes).join(', ')}, or a config.json`);
  }
  const [hiddenSize, intermediateSize, numLayers, numHeads, numKvHeads] = s;
  const cfg: ModelConfig = {
    architecture: 'qwen2', vocabSize, hiddenSize, intermediateSize, numLayers, numHeads, numKvHeads,
    headDim: hiddenSize / numHeads, ropeTheta: 1e6, rmsNormEps: 1e-6, tieWordEmbeddings: true,
    maxPositionEmbeddings: 32768, qkvBias: true,
  };
  validateConfig(cfg);
  return cfg;
}
