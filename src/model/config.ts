/**
 * Model configuration in the Hugging Face `config.json` vocabulary, for the Qwen2, Llama, Qwen3 and SmolLM3 families.
 * All run from the same code: Qwen2 has Q/K/V biases and no O bias; Llama, Qwen3 and SmolLM3 have Q/K/V AND O biases
 * when `attention_bias` is true and none otherwise (their attention builds all four projections with
 * `bias=attention_bias`). Qwen3 adds a per-head RMSNorm on queries and keys (`q_norm`, `k_norm`, weight [head_dim],
 * the model's eps) after the projections and before RoPE, and its head_dim defaults to 128 (not hidden / heads).
 * SmolLM3 is Llama with RoPE switched off on the layers where `no_rope_layers[l]` is 0 (default: every 4th layer).
 *
 * Reading (parseHfConfig) accepts both layouts transformers writes: 4.x (`rope_theta` and `rope_scaling` at the top
 * level, `torch_dtype`) and 5.x (`rope_parameters: {rope_type, rope_theta, ...}`, `dtype`, `layer_types`,
 * `eos_token_id` lists). Every field that changes the math is read from wherever transformers reads it and
 * type-checked (a string where a number or boolean belongs is an error naming the field); an absent field takes
 * the default of transformers' own config class for the model type (Qwen2Config / LlamaConfig, identical in 4.x
 * and 5.x); a feature distillery does not compute is refused by name. Writing (toHfConfig) gives a config both
 * transformers 4 and 5 read as the same model, with one exception that comes from transformers 4 itself: its later
 * releases (the ones with DeepSeek-V3's rule in `_compute_yarn_parameters`) take a yarn block's factor as
 * max_position_embeddings / original_max_position_embeddings wherever the block names the latter, ignoring `factor`;
 * distillery computes yarn as transformers 5 does (the block's `factor`).
 */
import * as fs from 'node:fs';
import { DistilleryError } from '../util/errors.js';
import { describeRope, yarnMscale, type RopeSpec } from '../backend/rope.js';

export type { RopeSpec } from '../backend/rope.js';

/** The model families distillery runs (transformers' `model_type`). */
export type Architecture = 'qwen2' | 'llama' | 'qwen3' | 'smollm3';
export const ARCHITECTURES: readonly Architecture[] = ['qwen2', 'llama', 'qwen3', 'smollm3'];

export interface ModelConfig {
  architecture: Architecture;
  vocabSize: number;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  /** hiddenSize / numHeads unless config.json sets head_dim. */
  headDim: number;
  /** Rotary embedding: theta and the scaling kind with its (resolved) parameters. */
  rope: RopeSpec;
  rmsNormEps: number;
  tieWordEmbeddings: boolean;
  maxPositionEmbeddings: number;
  /**
   * Q, K and V projections have biases (Qwen2: always; Llama: `attention_bias`). Whether the O projection has one
   * follows from this and the architecture: see oProjBias (Llama's attention_bias covers o_proj too, Qwen2 never).
   */
  qkvBias: boolean;
  /**
   * Per-head RMSNorm on queries and keys after their projections, before RoPE (Qwen3: `self_attn.q_norm.weight` and
   * `self_attn.k_norm.weight`, [head_dim] each, eps rms_norm_eps).
   */
  qkNorm: boolean;
  /** Layers (0-based, ascending) whose attention applies no rotary embedding (SmolLM3's NoPE layers); empty for the others. */
  noRopeLayers: number[];
  /** Token ids, carried through to config.json (transformers 5 may write a list of eos ids). */
  bosTokenId?: number | undefined;
  eosTokenId?: number | number[] | undefined;
}

type Json = Record<string, unknown>;

/**
 * The O projection (`self_attn.o_proj.bias`, [hidden_size]) has a bias: Llama, Qwen3 or SmolLM3 with attention_bias
 * true (their attention builds all four projections with `bias=config.attention_bias`). Qwen2's o_proj
 * never has one, whatever its Q/K/V biases. Derived rather than stored so that a config cannot describe a
 * combination transformers cannot write (a Llama with Q/K/V biases but no O bias, or the reverse).
 */
export function oProjBias(c: ModelConfig): boolean {
  return c.architecture !== 'qwen2' && c.qkvBias;
}

/** Layer l applies RoPE to its queries and keys (every layer but SmolLM3's NoPE layers). */
export function usesRope(c: ModelConfig, l: number): boolean {
  return !c.noRopeLayers.includes(l);
}

/**
 * Layer l rotates q and k on the fused q/k/v product's columns (`fused`: the layer runs that product): the forward reads
 * them from its output, the backward writes their gradients into its joined gradient. A fused layer with RoPE and no
 * q/k norms (with norms, the rotation works on the normed copies).
 */
export function ropeOnFusedColumns(c: ModelConfig, l: number, fused: boolean): boolean {
  return fused && !c.qkNorm && usesRope(c, l);
}

/**
 * Whether a training model needs the second buffer of its q/k gradient pairs (dq and dk before RoPE): where q/k norms
 * follow the rotation (their backward writes into it), or where a layer's RoPE backward writes into it rather than
 * into the fused product's columns (ropeOnFusedColumns). `fused[l]`: layer l runs the fused projection. The model
 * allocates by it and the memory estimate counts by it.
 */
export function preRopeScratch(c: ModelConfig, fused: readonly boolean[]): boolean {
  return fused.some((f, l) => c.qkNorm || (usesRope(c, l) && !ropeOnFusedColumns(c, l, f)));
}

/** The eos ids of a config (none, one, or transformers 5's list). */
export function eosIds(c: ModelConfig): number[] {
  return c.eosTokenId === undefined ? [] : Array.isArray(c.eosTokenId) ? [...c.eosTokenId] : [c.eosTokenId];
}

/**
 * The defaults of transformers' config classes for the fields distillery reads (Qwen2Config and LlamaConfig;
 * the same in transformers 4.x and 5.x). `null` num_key_value_heads / head_dim mean "derived" as in transformers:
 * num_attention_heads and hidden_size // num_attention_heads.
 */
const HF_DEFAULTS = {
  qwen2: {
    vocab_size: 151936, hidden_size: 4096, intermediate_size: 22016, num_hidden_layers: 32, num_attention_heads: 32,
    num_key_value_heads: 32, max_position_embeddings: 32768, rms_norm_eps: 1e-6, tie_word_embeddings: false,
    rope_theta: 10000, bos_token_id: null, eos_token_id: null,
  },
  llama: {
    vocab_size: 32000, hidden_size: 4096, intermediate_size: 11008, num_hidden_layers: 32, num_attention_heads: 32,
    num_key_value_heads: null, max_position_embeddings: 2048, rms_norm_eps: 1e-6, tie_word_embeddings: false,
    rope_theta: 10000, bos_token_id: 1, eos_token_id: 2,
  },
  // Qwen3Config: head_dim is a field of its own (128), not hidden_size // num_attention_heads.
  qwen3: {
    vocab_size: 151936, hidden_size: 4096, intermediate_size: 22016, num_hidden_layers: 32, num_attention_heads: 32,
    num_key_value_heads: 32, max_position_embeddings: 32768, rms_norm_eps: 1e-6, tie_word_embeddings: false,
    rope_theta: 10000, bos_token_id: null, eos_token_id: null,
  },
  // SmolLM3Config (default_theta 2e6; tied embeddings; no head_dim field: LlamaAttention derives it).
  smollm3: {
    vocab_size: 128256, hidden_size: 2048, intermediate_size: 11008, num_hidden_layers: 36, num_attention_heads: 16,
    num_key_value_heads: 4, max_position_embeddings: 32768, rms_norm_eps: 1e-6, tie_word_embeddings: true,
    rope_theta: 2000000, bos_token_id: 128000, eos_token_id: 128001,
  },
} as const;

/** head_dim's default where config.json has none (null: hidden_size // num_attention_heads, as transformers derives it). */
const HEAD_DIM_DEFAULT: Record<Architecture, number | null> = { qwen2: null, llama: null, qwen3: 128, smollm3: null };

/**
 * Families transformers has that distillery does not run, by model_type: refused naming the family (and why),
 * never read as the nearest family they resemble.
 */
const REFUSED_FAMILIES: Record<string, string> = {
  qwen2_moe: 'Qwen2-MoE (mixture-of-experts MLP layers)',
  qwen3_moe: 'Qwen3-MoE (mixture-of-experts MLP layers)',
  qwen3_next: 'Qwen3-Next (linear-attention and mixture-of-experts layers)',
  qwen3_5: 'Qwen3.5 (linear-attention layers)',
  qwen3_5_text: 'Qwen3.5 (linear-attention layers)',
  qwen3_5_moe: 'Qwen3.5-MoE (linear-attention and mixture-of-experts layers)',
  qwen2_vl: 'Qwen2-VL (a vision-language model)',
  qwen2_5_vl: 'Qwen2.5-VL (a vision-language model)',
  qwen3_vl: 'Qwen3-VL (a vision-language model)',
  gemma: 'Gemma (GeGLU MLP, scaled embeddings, (1 + w) norms)',
  gemma2: 'Gemma 2 (logit soft-capping, sliding-window layers, extra norms)',
  gemma3: 'Gemma 3 (sliding-window layers, q/k norms with (1 + w), extra norms)',
  gemma3_text: 'Gemma 3 (sliding-window layers, q/k norms with (1 + w), extra norms)',
  phi: 'Phi (LayerNorm, partial rotary, parallel attention and MLP)',
  phi3: 'Phi-3 (fused qkv and gate_up projections, sliding window)',
  mistral: 'Mistral (sliding-window attention)',
  mixtral: 'Mixtral (mixture-of-experts MLP layers)',
  olmo2: 'OLMo 2 (norms after attention and MLP, q/k norms over all heads)',
  llama4: 'Llama 4 (mixture-of-experts, chunked attention)',
};

const shown = (v: unknown): string => (typeof v === 'string' ? `${JSON.stringify(v)} (a string)` : JSON.stringify(v) ?? String(v));

function typeError(key: string, want: string, v: unknown): never {
  throw new DistilleryError(`config.json: "${key}" must be ${want}, got ${shown(v)}`,
    `fix "${key}" in config.json (transformers would not read this value as ${want} either)`);
}

/** A finite number (or the default when absent; null too where nullOk). */
function num(j: Json, key: string, fallback: number | undefined, label = key): number {
  const v = j[key];
  if (v === undefined && fallback !== undefined) return fallback;
  if (typeof v !== 'number' || !Number.isFinite(v)) {
    if (v === undefined) {
      throw new DistilleryError(`config.json: "${label}" is missing`, `set "${label}" in config.json`);
    }
    typeError(label, 'a number', v);
  }
  return v;
}

function int(j: Json, key: string, fallback: number | undefined, label = key): number {
  const v = num(j, key, fallback, label);
  if (!Number.isInteger(v)) typeError(label, 'an integer', v);
  return v;
}

function bool(j: Json, key: string, fallback: boolean, label = key): boolean {
  const v = j[key];
  if (v === undefined) return fallback;
  if (typeof v !== 'boolean') typeError(label, 'true or false', v);
  return v;
}

function obj(j: Json, key: string): Json | null {
  const v = j[key];
  if (v === undefined || v === null) return null;
  if (typeof v !== 'object' || Array.isArray(v)) typeError(key, 'an object (or null)', v);
  return v as Json;
}

/** A token id or (transformers 5) a list of them; null means none. */
function tokenIds(j: Json, key: string, fallback: number | null): number | number[] | undefined {
  const v = j[key] === undefined ? fallback : j[key];
  if (v === null) return undefined;
  const ok = (x: unknown): x is number => typeof x === 'number' && Number.isInteger(x) && x >= 0;
  if (ok(v)) return v;
  if (Array.isArray(v) && v.length > 0 && v.every(ok)) return v.length === 1 ? v[0] : [...v];
  return typeError(key, 'a token id or a list of token ids', v);
}

/**
 * The RoPE of a config, as transformers 5 resolves it (transformers 4 reads the same from the 4.x layout):
 * the scaling dict is `rope_scaling` when set (it takes priority), else `rope_parameters`; its kind is `rope_type`
 * (or the older `type`, default "default"); theta is the dict's `rope_theta`, else the top-level `rope_theta`, else
 * 10000. llama3 and yarn take original_max_position_embeddings from the dict, else max_position_embeddings.
 * Values that disagree between the places transformers 4 and 5 read are refused rather than picked.
 */
function parseRope(j: Json, maxPos: number, defaultTheta: number): RopeSpec {
  const scaling = obj(j, 'rope_scaling'), params = obj(j, 'rope_parameters');
  // transformers 5 keys rope_parameters by layer type for families with several (Gemma 3: full and sliding); these
  // families' rotary embedding reads rope_type and rope_theta at the top of the block, so a block of blocks would
  // silently become the default RoPE at the default theta: refused instead.
  for (const [w, o] of [['rope_scaling', scaling], ['rope_parameters', params]] as const) {
    const nested = o === null ? [] : Object.keys(o).filter((k) => o[k] !== null && typeof o[k] === 'object' && !Array.isArray(o[k]));
    if (nested.length) {
      throw new DistilleryError(`config.json: "${w}" holds per-layer-type blocks (${nested.map((k) => JSON.stringify(k)).join(', ')}), which this family does not read`,
        `distillery runs one RoPE in every layer: put rope_type, rope_theta and the scaling fields directly in "${w}"`);
    }
  }
  const hasKeys = (o: Json | null): o is Json => o !== null && Object.keys(o).length > 0;
  const useScaling = hasKeys(scaling);
  const src: Json = useScaling ? scaling : params ?? {};
  const where = useScaling ? 'rope_scaling' : 'rope_parameters';
  const kindOf = (o: Json, w: string): string => {
    const t = o.rope_type, old = o.type;
    if (t !== undefined && typeof t !== 'string') typeError(`${w}.rope_type`, 'a string', t);
    if (old !== undefined && typeof old !== 'string') typeError(`${w}.type`, 'a string', old);
    if (t !== undefined && old !== undefined && t !== old) {
      throw new DistilleryError(`config.json: "${w}" has rope_type ${JSON.stringify(t)} and type ${JSON.stringify(old)}`,
        'transformers 4 and 5 read different ones of these; keep one');
    }
    return (t ?? old ?? 'default') as string;
  };
  const type = kindOf(src, where);
  // theta: every place that sets it must agree.
  const thetas: Array<[string, number]> = [];
  for (const [w, o] of [['rope_scaling', scaling], ['rope_parameters', params]] as const) {
    if (o && o.rope_theta !== undefined && o.rope_theta !== null) thetas.push([`${w}.rope_theta`, num(o, 'rope_theta', undefined, `${w}.rope_theta`)]);
  }
  if (j.rope_theta !== undefined && j.rope_theta !== null) thetas.push(['rope_theta', num(j, 'rope_theta', undefined)]);
  const [first] = thetas;
  const clash = thetas.find(([, v]) => v !== first![1]);
  if (clash) {
    throw new DistilleryError(`config.json: "${first![0]}" is ${first![1]} but "${clash[0]}" is ${clash[1]}`,
      'transformers 4 reads the top-level rope_theta and transformers 5 the one inside the rope block; make them equal');
  }
  if (useScaling && thetas.length > 0 && thetas.every(([w]) => w === 'rope_parameters.rope_theta')) {
    // transformers 5 replaces rope_parameters by rope_scaling, and 4 never reads rope_parameters: both would run
    // the default theta, not this one.
    throw new DistilleryError(`config.json: rope theta is only in "rope_parameters" but "rope_scaling" is set (transformers then uses ${defaultTheta})`,
      'set the top-level "rope_theta" too (or remove rope_scaling and keep the scaling in rope_parameters)');
  }
  const theta = first ? first[1] : defaultTheta;
  if (!(theta > 0)) throw new DistilleryError(`config.json: rope theta must be positive, got ${theta}`, 'set "rope_theta"');
  const spec = resolve(src, where, type);
  // Both blocks set (we write both): they must describe the same rotation. transformers 4 reads only rope_scaling
  // and 5 prefers it, so a rope_parameters that computes something else means the file is not what it seems.
  if (useScaling && hasKeys(params)) {
    const other = resolve(params, 'rope_parameters', kindOf(params, 'rope_parameters'));
    if (JSON.stringify(other) !== JSON.stringify(spec)) {
      throw new DistilleryError(`config.json: "rope_scaling" (${describeRope(spec)}) and "rope_parameters" (${describeRope(other)}) disagree`,
        'transformers 4 reads rope_scaling and transformers 5 prefers it too; remove the block that is wrong');
    }
  }
  return spec;

  /** The RoPE one block describes (kind `type`, the resolved theta). */
  function resolve(src: Json, where: string, type: string): RopeSpec {
    const field = (k: string): string => `${where}.${k}`;
    const prf = src.partial_rotary_factor ?? j.partial_rotary_factor;
    if (prf !== undefined && prf !== null && prf !== 1) {
      throw new DistilleryError(`config.json: "partial_rotary_factor" ${shown(prf)} is not supported`, 'distillery rotates the whole head (partial_rotary_factor 1)');
    }
    const positive = (k: string, v: number): number => {
      if (!(v > 0)) throw new DistilleryError(`config.json: "${field(k)}" must be positive, got ${v}`, `fix ${field(k)} in config.json`);
      return v;
    };
    const factor = (): number => positive('factor', num(src, 'factor', undefined, field('factor')));
    // transformers 5 standardizes a top-level original_max_position_embeddings into the rope block (it wins there).
    const originalMax = (): number => (j.original_max_position_embeddings !== undefined && j.original_max_position_embeddings !== null
      ? positive('original_max_position_embeddings', int(j, 'original_max_position_embeddings', undefined))
      : positive('original_max_position_embeddings', int(src, 'original_max_position_embeddings', maxPos, field('original_max_position_embeddings'))));
    switch (type) {
      case 'default':
        return { type: 'default', theta };
      case 'linear':
        return { type: 'linear', theta, factor: factor() };
      case 'llama3': {
        const r = {
          type: 'llama3' as const, theta, factor: factor(),
          lowFreqFactor: positive('low_freq_factor', num(src, 'low_freq_factor', undefined, field('low_freq_factor'))),
          highFreqFactor: positive('high_freq_factor', num(src, 'high_freq_factor', undefined, field('high_freq_factor'))),
          originalMaxPositionEmbeddings: originalMax(),
        };
        if (!(r.highFreqFactor > r.lowFreqFactor)) {
          throw new DistilleryError(`config.json: "${field('high_freq_factor')}" (${r.highFreqFactor}) must be greater than low_freq_factor (${r.lowFreqFactor})`,
            'Llama 3.1 / 3.2 use low_freq_factor 1 and high_freq_factor 4');
        }
        return r;
      }
      case 'yarn': {
        const f = factor();
        // Python's `x or default`: absent, null and 0 take the default.
        const orDefault = (k: string, d: number): number => (src[k] === undefined || src[k] === null || src[k] === 0 ? d : positive(k, num(src, k, undefined, field(k))));
        let attentionFactor: number;
        if (src.attention_factor !== undefined && src.attention_factor !== null) {
          attentionFactor = positive('attention_factor', num(src, 'attention_factor', undefined, field('attention_factor')));
        } else {
          const ms = src.mscale === undefined || src.mscale === null ? 0 : num(src, 'mscale', undefined, field('mscale'));
          const msAll = src.mscale_all_dim === undefined || src.mscale_all_dim === null ? 0 : num(src, 'mscale_all_dim', undefined, field('mscale_all_dim'));
          attentionFactor = ms && msAll ? yarnMscale(f, ms) / yarnMscale(f, msAll) : yarnMscale(f);
        }
        return {
          type: 'yarn', theta, factor: f, originalMaxPositionEmbeddings: originalMax(),
          betaFast: orDefault('beta_fast', 32), betaSlow: orDefault('beta_slow', 1), attentionFactor,
          truncate: bool(src, 'truncate', true, field('truncate')),
        };
      }
      default:
        throw new DistilleryError(`config.json: rope type ${JSON.stringify(type)} (${where}) is not supported`,
          'distillery computes the rope types default, linear, llama3 and yarn (dynamic and longrope depend on the sequence length)');
    }
  }
}

/**
 * SmolLM3's NoPE layers as transformers derives them: `no_rope_layers` is a list (at least num_hidden_layers long) with
 * 1 where a layer uses RoPE and 0 where it does not; absent or null, every `no_rope_layer_interval`-th layer (default
 * 4: layers 3, 7, 11, ...) has none. Returns the indices of the layers WITHOUT RoPE.
 */
function parseNoRopeLayers(j: Json, numLayers: number): number[] {
  const v = j.no_rope_layers;
  if (v === undefined || v === null) {
    const every = int(j, 'no_rope_layer_interval', 4);
    if (every < 1) throw new DistilleryError(`config.json: "no_rope_layer_interval" must be at least 1, got ${every}`, 'SmolLM3 uses 4');
    const out: number[] = [];
    for (let l = 0; l < numLayers; l++) if ((l + 1) % every === 0) out.push(l);
    return out;
  }
  if (!Array.isArray(v) || !v.every((x) => x === 0 || x === 1 || typeof x === 'boolean')) {
    typeError('no_rope_layers', 'a list of 0 (no RoPE) and 1 (RoPE), one per layer', v);
  }
  const flags = v as Array<number | boolean>;
  if (flags.length < numLayers) {
    throw new DistilleryError(`config.json: "no_rope_layers" lists ${flags.length} layers but num_hidden_layers is ${numLayers}`,
      'give one 0/1 entry per layer (1: the layer uses RoPE)');
  }
  const out: number[] = [];
  for (let l = 0; l < numLayers; l++) if (!flags[l]) out.push(l);
  return out;
}

/** Parses and validates an HF-style config.json object. Throws DistilleryError naming the bad field. */
export function parseHfConfig(j: Json): ModelConfig {
  const archs = Array.isArray(j.architectures) ? (j.architectures as unknown[]).map(String) : [];
  const modelType = typeof j.model_type === 'string' ? j.model_type : '';
  // transformers picks the config class by model_type; without one, the causal-LM class name decides (exact names only:
  // Qwen2MoeForCausalLM is not Qwen2).
  const BY_CLASS: Record<string, Architecture> = {
    Qwen2ForCausalLM: 'qwen2', LlamaForCausalLM: 'llama', Qwen3ForCausalLM: 'qwen3', SmolLM3ForCausalLM: 'smollm3',
  };
  const supported = 'distillery runs the Qwen2 (Qwen2.5), Llama (Llama 3.x), Qwen3 (dense) and SmolLM3 families: model_type "qwen2", "llama", "qwen3" or "smollm3"';
  if (REFUSED_FAMILIES[modelType]) {
    throw new DistilleryError(`config.json: model_type ${JSON.stringify(modelType)} is ${REFUSED_FAMILIES[modelType]}, which distillery does not run`, supported);
  }
  let architecture: Architecture;
  if ((ARCHITECTURES as readonly string[]).includes(modelType)) architecture = modelType as Architecture;
  else if (modelType === '' && archs.some((a) => BY_CLASS[a])) architecture = BY_CLASS[archs.find((a) => BY_CLASS[a])!]!;
  else {
    throw new DistilleryError(`config.json: unsupported model_type ${JSON.stringify(modelType)}${archs.length ? ` (architectures ${archs.join(', ')})` : ''}`, supported);
  }
  const D = HF_DEFAULTS[architecture];
  // Features of the HF families that this implementation does not compute: refuse them rather than run a
  // different function than transformers would (e.g. sliding-window attention).
  // transformers' ACT2FN maps "swish" to SiLU too
  if (j.hidden_act !== undefined && j.hidden_act !== 'silu' && j.hidden_act !== 'swish') {
    throw new DistilleryError(`config.json: "hidden_act" ${shown(j.hidden_act)} is not supported`, 'distillery implements SwiGLU with silu (or its other name, swish)');
  }
  if (num(j, 'attention_dropout', 0) !== 0) {
    throw new DistilleryError(`config.json: "attention_dropout" ${shown(j.attention_dropout)} is not supported`,
      'transformers drops attention probabilities in training with it; distillery computes attention without dropout: set it to 0.0');
  }
  if (bool(j, 'use_sliding_window', false)) {
    throw new DistilleryError('config.json: "use_sliding_window": true is not supported', 'distillery implements full causal attention; set it to false');
  }
  if (architecture !== 'qwen2' && bool(j, 'mlp_bias', false)) {
    throw new DistilleryError('config.json: "mlp_bias": true is not supported', 'distillery\'s MLP projections have no biases');
  }
  const attentionBias = j.attention_bias === undefined || j.attention_bias === null ? undefined : bool(j, 'attention_bias', false);
  if (architecture === 'qwen2' && attentionBias === false) {
    throw new DistilleryError('config.json: "attention_bias": false for model_type qwen2', 'Qwen2 always has Q/K/V biases; use model_type "llama" for a model without them');
  }
  for (const k of ['dtype', 'torch_dtype']) {
    if (j[k] !== undefined && j[k] !== null && typeof j[k] !== 'string') typeError(k, 'a dtype name such as "bfloat16"', j[k]);
  }
  const hiddenSize = int(j, 'hidden_size', D.hidden_size);
  const numHeads = int(j, 'num_attention_heads', D.num_attention_heads);
  const numLayers = int(j, 'num_hidden_layers', D.num_hidden_layers);
  const nullable = (k: string, derived: number, def: number | null): number =>
    (j[k] === null || (j[k] === undefined && def === null) ? derived : int(j, k, def ?? derived));
  const maxPositionEmbeddings = int(j, 'max_position_embeddings', D.max_position_embeddings);
  if (j.layer_types !== undefined && j.layer_types !== null) {
    const lt = j.layer_types;
    if (!Array.isArray(lt) || !lt.every((x) => typeof x === 'string')) typeError('layer_types', 'a list of layer type names', lt);
    const other = (lt as string[]).findIndex((x) => x !== 'full_attention');
    if (other >= 0) {
      throw new DistilleryError(`config.json: "layer_types" has ${JSON.stringify((lt as string[])[other])} at layer ${other}; only "full_attention" is supported`,
        'distillery implements full causal attention in every layer (no sliding window)');
    }
    if ((lt as string[]).length !== numLayers) {
      throw new DistilleryError(`config.json: "layer_types" lists ${(lt as string[]).length} layers but num_hidden_layers is ${numLayers}`, 'fix config.json');
    }
  }
  const cfg: ModelConfig = {
    architecture,
    vocabSize: int(j, 'vocab_size', D.vocab_size),
    hiddenSize,
    intermediateSize: int(j, 'intermediate_size', D.intermediate_size),
    numLayers,
    numHeads,
    numKvHeads: nullable('num_key_value_heads', numHeads, D.num_key_value_heads),
    headDim: nullable('head_dim', Math.floor(hiddenSize / numHeads), HEAD_DIM_DEFAULT[architecture]),
    rope: parseRope(j, maxPositionEmbeddings, D.rope_theta),
    rmsNormEps: num(j, 'rms_norm_eps', D.rms_norm_eps),
    tieWordEmbeddings: bool(j, 'tie_word_embeddings', D.tie_word_embeddings),
    maxPositionEmbeddings,
    qkvBias: attentionBias ?? architecture === 'qwen2',
    qkNorm: architecture === 'qwen3',
    noRopeLayers: architecture === 'smollm3' ? parseNoRopeLayers(j, numLayers) : [],
  };
  if (architecture !== 'smollm3') {
    for (const k of ['no_rope_layers', 'no_rope_layer_interval']) {
      if (j[k] !== undefined && j[k] !== null) {
        throw new DistilleryError(`config.json: "${k}" is set but model_type ${JSON.stringify(architecture)} has no NoPE layers`,
          'transformers ignores it for this family; remove it, or use model_type "smollm3"');
      }
    }
  }
  const bos = tokenIds(j, 'bos_token_id', D.bos_token_id);
  if (Array.isArray(bos)) typeError('bos_token_id', 'a token id', j.bos_token_id);
  if (bos !== undefined) cfg.bosTokenId = bos;
  const eos = tokenIds(j, 'eos_token_id', D.eos_token_id);
  if (eos !== undefined) cfg.eosTokenId = eos;
  validateConfig(cfg);
  return cfg;
}

/**
 * One line with every baked number of a model, e.g.
 * `qwen2 theta 1000000 rope default eps 1e-6 head_dim 64 qkv_bias yes tied yes`; an attention_bias model other than
 * Qwen2 adds `o_bias yes` (its O projection has a bias too), Qwen3 `qk_norm yes`, SmolLM3 `no_rope_layers 3,7,...`.
 */
export function describeBaked(c: ModelConfig): string {
  return `${c.architecture} ${describeRope(c.rope)} eps ${c.rmsNormEps.toExponential()} head_dim ${c.headDim} ` +
    `qkv_bias ${c.qkvBias ? 'yes' : 'no'}${oProjBias(c) ? ' o_bias yes' : ''}${c.qkNorm ? ' qk_norm yes' : ''}` +
    `${c.noRopeLayers.length ? ` no_rope_layers ${c.noRopeLayers.join(',')}` : ''} tied ${c.tieWordEmbeddings ? 'yes' : 'no'}`;
}

/** Reads and parses a config.json file; `hint` says what to pass instead when it cannot be read or parsed. */
export function readHfConfigFile(file: string, hint: string): ModelConfig {
  let j: unknown;
  try { j = JSON.parse(fs.readFileSync(file, 'utf8')); } catch (e) {
    throw new DistilleryError(`cannot read model config ${file}: ${(e as Error).message}`, hint);
  }
  return parseHfConfig(j as Record<string, unknown>);
}

/** Checks the invariants the model code relies on. */
export function validateConfig(c: ModelConfig): void {
  const bad = (msg: string, hint = 'fix the value in config.json (the model\'s config or --model\'s), or start from a preset (--model tiny, small, qwen2.5-0.5b, ...)'): never => {
    throw new DistilleryError(`model config: ${msg}`, hint);
  };
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
  if (!(c.rope.theta > 0)) bad(`rope_theta must be positive, got ${c.rope.theta}`);
  if (!(c.rmsNormEps > 0 && c.rmsNormEps < 1)) bad(`rms_norm_eps must be in (0, 1), got ${c.rmsNormEps}`);
  if (c.qkNorm !== (c.architecture === 'qwen3')) bad(`q/k norms are Qwen3's (architecture ${c.architecture})`);
  if (c.noRopeLayers.length > 0 && c.architecture !== 'smollm3') bad(`NoPE layers are SmolLM3's (architecture ${c.architecture})`);
  c.noRopeLayers.forEach((l, i) => {
    if (!Number.isInteger(l) || l < 0 || l >= c.numLayers || (i > 0 && l <= c.noRopeLayers[i - 1]!)) {
      bad(`no-RoPE layers must be ascending layer indices below ${c.numLayers}, got [${c.noRopeLayers.join(', ')}]`);
    }
  });
}

/** The scaling block of a RoPE as transformers names it (rope_type and the kind's parameters; no theta). */
function ropeBlock(r: RopeSpec): Json {
  switch (r.type) {
    case 'default': return { rope_type: 'default' };
    case 'linear': return { rope_type: 'linear', factor: r.factor };
    case 'llama3':
      return { rope_type: 'llama3', factor: r.factor, low_freq_factor: r.lowFreqFactor, high_freq_factor: r.highFreqFactor,
        original_max_position_embeddings: r.originalMaxPositionEmbeddings };
    case 'yarn': {
      const b: Json = { rope_type: 'yarn', factor: r.factor, original_max_position_embeddings: r.originalMaxPositionEmbeddings,
        beta_fast: r.betaFast, beta_slow: r.betaSlow };
      if (r.attentionFactor !== yarnMscale(r.factor)) b.attention_factor = r.attentionFactor;
      if (!r.truncate) b.truncate = false;
      return b;
    }
  }
}

/**
 * The config.json object HF transformers reads for this config (Qwen2/Llama/Qwen3/SmolLM3ForCausalLM). RoPE is
 * written for both majors: transformers 4 reads the top-level rope_theta and rope_scaling (null without scaling);
 * transformers 5 prefers rope_scaling when set and otherwise reads rope_parameters, taking theta from either.
 */
export function toHfConfig(c: ModelConfig): Json {
  const block = ropeBlock(c.rope);
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
    rope_theta: c.rope.theta,
    rope_scaling: c.rope.type === 'default' ? null : block,
    rope_parameters: { ...block, rope_theta: c.rope.theta },
    tie_word_embeddings: c.tieWordEmbeddings,
    torch_dtype: 'float32',
    initializer_range: 0.02,
    use_cache: true,
    attention_dropout: 0.0,
    // null, not absent: LlamaConfig's defaults are 1 and 2.
    bos_token_id: c.bosTokenId ?? null,
    eos_token_id: c.eosTokenId ?? null,
    // null, not absent: SmolLM3Config's default (128004) lies outside a smaller vocabulary and transformers refuses it.
    pad_token_id: null,
  };
  switch (c.architecture) {
    case 'qwen2':
      return { architectures: ['Qwen2ForCausalLM'], model_type: 'qwen2', ...common, use_sliding_window: false,
        sliding_window: c.maxPositionEmbeddings, max_window_layers: c.numLayers };
    // attention_bias covers q/k/v AND o_proj in these families (oProjBias).
    case 'llama':
      return { architectures: ['LlamaForCausalLM'], model_type: 'llama', ...common, attention_bias: c.qkvBias,
        mlp_bias: false, pretraining_tp: 1 };
    case 'qwen3':
      return { architectures: ['Qwen3ForCausalLM'], model_type: 'qwen3', ...common, attention_bias: c.qkvBias,
        use_sliding_window: false, sliding_window: null, max_window_layers: c.numLayers,
        layer_types: Array.from({ length: c.numLayers }, () => 'full_attention') };
    case 'smollm3':
      return { architectures: ['SmolLM3ForCausalLM'], model_type: 'smollm3', ...common, attention_bias: c.qkvBias,
        mlp_bias: false, use_sliding_window: false, sliding_window: null,
        no_rope_layers: Array.from({ length: c.numLayers }, (_, l) => (usesRope(c, l) ? 1 : 0)),
        layer_types: Array.from({ length: c.numLayers }, () => 'full_attention') };
  }
}

/** Number of trainable parameters (tied embeddings counted once). */
export function parameterCount(c: ModelConfig): number {
  const C = c.hiddenSize, kv = c.numKvHeads * c.headDim, q = c.numHeads * c.headDim;
  const attn = C * q + C * kv * 2 + q * C + (c.qkvBias ? q + 2 * kv : 0) + (oProjBias(c) ? C : 0) + (c.qkNorm ? 2 * c.headDim : 0);
  const mlp = 3 * C * c.intermediateSize;
  const perLayer = attn + mlp + 2 * C;
  return c.vocabSize * C * (c.tieWordEmbeddings ? 1 : 2) + c.numLayers * perLayer + C;
}

/** A named shape: hidden, intermediate, layers, heads, kv heads, and for Qwen3 its family traits. */
interface Preset { shape: [number, number, number, number, number]; qwen3?: { tied: boolean }; untied?: boolean }

/**
 * Named shapes used by the CLI and benchmarks: tiny ones for CPU work, the Qwen2.5 shapes (0.5B to 3B tie their
 * embeddings, 7B does not), and the published Qwen3
 * dense shapes (head_dim 128, q/k norms, no biases, theta 1e6, 40960 positions; 0.6B to 4B tie their embeddings,
 * 8B does not).
 */
const PRESETS: Record<string, Preset> = {
  'tiny': { shape: [64, 176, 2, 4, 2] },
  'small': { shape: [128, 352, 4, 4, 2] },
  'base': { shape: [256, 704, 6, 8, 2] },
  'qwen2.5-0.5b': { shape: [896, 4864, 24, 14, 2] },
  'qwen2.5-1.5b': { shape: [1536, 8960, 28, 12, 2] },
  'qwen2.5-3b': { shape: [2048, 11008, 36, 16, 2] },
  'qwen2.5-7b': { shape: [3584, 18944, 28, 28, 4], untied: true },
  'qwen3-0.6b': { shape: [1024, 3072, 28, 16, 8], qwen3: { tied: true } },
  'qwen3-1.7b': { shape: [2048, 6144, 28, 16, 8], qwen3: { tied: true } },
  'qwen3-4b': { shape: [2560, 9728, 36, 32, 8], qwen3: { tied: true } },
  'qwen3-8b': { shape: [4096, 12288, 36, 32, 8], qwen3: { tied: false } },
};

export const PRESET_NAMES: readonly string[] = Object.keys(PRESETS);

export function presetConfig(name: string, vocabSize: number): ModelConfig {
  const s = PRESETS[name];
  if (!s) {
    throw new DistilleryError(`unknown model preset "${name}"`, `use one of: ${PRESET_NAMES.join(', ')}, or a config.json`);
  }
  const [hiddenSize, intermediateSize, numLayers, numHeads, numKvHeads] = s.shape;
  const cfg: ModelConfig = s.qwen3
    ? {
      architecture: 'qwen3', vocabSize, hiddenSize, intermediateSize, numLayers, numHeads, numKvHeads, headDim: 128,
      rope: { type: 'default', theta: 1e6 }, rmsNormEps: 1e-6, tieWordEmbeddings: s.qwen3.tied, maxPositionEmbeddings: 40960,
      qkvBias: false, qkNorm: true, noRopeLayers: [],
    }
    : {
      architecture: 'qwen2', vocabSize, hiddenSize, intermediateSize, numLayers, numHeads, numKvHeads,
      headDim: hiddenSize / numHeads, rope: { type: 'default', theta: 1e6 }, rmsNormEps: 1e-6, tieWordEmbeddings: !s.untied,
      maxPositionEmbeddings: 32768, qkvBias: true, qkNorm: false, noRopeLayers: [],
    };
  validateConfig(cfg);
  return cfg;
}
