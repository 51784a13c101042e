/**
 * LoRA adapter folders, the way PEFT writes and reads them (`save_pretrained` / `PeftModel.from_pretrained`):
 *
 *   adapter_config.json          peft_type "LORA", r, lora_alpha, target_modules, base_model_name_or_path, ...
 *   adapter_model.safetensors    base_model.model.model.layers.{l}.{self_attn|mlp}.{q_proj|...}.lora_{A|B}.weight
 *   base_model.json              distillery's reference to the base: its folder, the SHA-256 of its weights, its shape
 *   tokenizer.json, tokenizer_config.json, generation_config.json   carried from the base (PEFT ignores them)
 *
 * An adapter means nothing without its base, so reading one resolves the base (--base, else base_model.json's path,
 * else adapter_config.json's base_model_name_or_path: a folder, or a Hub id in the local HF cache) and refuses a base
 * whose shape or weights hash differs from the one the adapter was trained on. PEFT features distillery does not run
 * (DoRA, rsLoRA, per-module ranks, bias training, modules_to_save, regex targets, layer subsets) are refused by name.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { ModelConfig } from './config.js';
import { parameterLayout, type Weights } from './params.js';
import { LORA_TARGETS, loraLayout, mergeLora, type LoraLayout, type LoraSpec, type LoraTarget } from './lora.js';
import { readCheckpoint, type LoadedCheckpoint } from './checkpoint.js';
import { readSafetensors, writeSafetensors, type WriteTensor } from '../io/safetensors.js';
import { replaceDirAtomicSync } from '../io/atomic.js';
import { looksLikeHubId, resolveHubModel } from '../io/hf-cache.js';
import { DistilleryError } from '../util/errors.js';
import { weightsHash } from './weights-hash.js';
import { readModelDirExtras } from '../io/checkpoint-dir.js';
import { Tokenizer } from '../tokenizer/bpe.js';

export const ADAPTER_CONFIG = 'adapter_config.json';
export const ADAPTER_WEIGHTS = 'adapter_model.safetensors';
export const BASE_REF = 'base_model.json';

/** What an adapter folder records of its base. */
export interface BaseRef {
  /** The base model folder the adapter was trained on (absolute). */
  path: string;
  /** SHA-256 of the base's weights as distillery loads them (float32, Hugging Face tensor order): weightsHash. */
  weights_sha256: string;
  /** The base's shape, to name what differs when another base is offered. */
  shape: Record<string, number | string | boolean>;
}

export interface LoadedAdapter {
  dir: string;
  spec: LoraSpec;
  /** The adapter weights in loraLayout(base config, spec) order (float32). */
  weights: Float32Array;
  /** adapter_config.json's base_model_name_or_path. */
  baseName: string | null;
  /** base_model.json, when the adapter was written by distillery. */
  base: BaseRef | null;
  /** The adapter_config.json object as read. */
  config: Record<string, unknown>;
}

/** The shape fields an adapter depends on. */
export function baseShape(c: ModelConfig): BaseRef['shape'] {
  return {
    architecture: c.architecture, hidden_size: c.hiddenSize, intermediate_size: c.intermediateSize, num_hidden_layers: c.numLayers,
    num_attention_heads: c.numHeads, num_key_value_heads: c.numKvHeads, head_dim: c.headDim, vocab_size: c.vocabSize,
  };
}

export function isAdapterDir(dir: string): boolean {
  return fs.existsSync(path.join(dir, ADAPTER_CONFIG));
}

export interface WriteAdapterOptions {
  dtype: 'f32' | 'bf16';
  base: BaseRef;
  /** adapter_config.json's base_model_name_or_path (default base.path): the Hub id when the base came from the Hub cache. */
  baseName?: string | undefined;
  /** Files carried beside the adapter (tokenizer.json, tokenizer_config.json, generation_config.json, best.json). */
  extraFiles?: Record<string, string>;
}

/** adapter_config.json as PEFT writes it for a causal LM (the fields its LoraConfig reads; defaults spelled out). */
export function peftAdapterConfig(spec: LoraSpec, baseName: string): Record<string, unknown> {
  return {
    peft_type: 'LORA', task_type: 'CAUSAL_LM', base_model_name_or_path: baseName, revision: null, inference_mode: true,
    r: spec.rank, lora_alpha: spec.alpha, lora_dropout: 0.0, target_modules: LORA_TARGETS.filter((t) => spec.targets.includes(t)),
    bias: 'none', fan_in_fan_out: false, init_lora_weights: true, use_rslora: false, use_dora: false, modules_to_save: null,
    layers_to_transform: null, layers_pattern: null, rank_pattern: {}, alpha_pattern: {},
  };
}

/** Writes an adapter folder (atomically: a crash leaves the previous one or none). */
export function writeAdapter(dir: string, lay: LoraLayout, weights: ArrayLike<number>, o: WriteAdapterOptions): void {
  if (weights.length !== lay.total) throw new DistilleryError(`adapter weights have ${weights.length} elements, the layout needs ${lay.total}`);
  const tensors = new Map<string, WriteTensor>();
  for (const t of lay.tensors) tensors.set(t.name, { shape: t.shape, data: Float32Array.from({ length: t.size }, (_, i) => weights[t.offset + i]!) });
  replaceDirAtomicSync(dir, (tmp) => {
    fs.writeFileSync(path.join(tmp, ADAPTER_CONFIG), JSON.stringify(peftAdapterConfig(lay.spec, o.baseName ?? o.base.path), null, 2) + '\n');
    writeSafetensors(path.join(tmp, ADAPTER_WEIGHTS), tensors, { dtype: o.dtype, metadata: { format: 'pt' } });
    fs.writeFileSync(path.join(tmp, BASE_REF), JSON.stringify(o.base, null, 2) + '\n');
    for (const [name, text] of Object.entries(o.extraFiles ?? {})) fs.writeFileSync(path.join(tmp, name), text);
  });
}

function readJsonObject(file: string, what: string): Record<string, unknown> {
  let j: unknown;
  try { j = JSON.parse(fs.readFileSync(file, 'utf8')); } catch (e) {
    throw new DistilleryError(`${file}: cannot read ${what} (${(e as Error).message})`, 'the adapter folder is damaged: restore it or re-save it');
  }
  if (typeof j !== 'object' || j === null || Array.isArray(j)) throw new DistilleryError(`${file}: ${what} is not a JSON object`, 'the adapter folder is damaged');
  return j as Record<string, unknown>;
}

/** The LoRA spec of an adapter_config.json, refusing by name what distillery does not run. */
export function parseAdapterConfig(c: Record<string, unknown>, file: string): LoraSpec {
  const refuse = (what: string, hint = 'distillery runs plain LoRA adapters (PEFT LoraConfig with its defaults for these fields)'): never => {
    throw new DistilleryError(`${file}: ${what}`, hint);
  };
  if (c.peft_type !== 'LORA') refuse(`peft_type ${JSON.stringify(c.peft_type)} is not supported`, 'distillery reads LoRA adapters (peft_type "LORA") only');
  if (c.task_type !== undefined && c.task_type !== null && c.task_type !== 'CAUSAL_LM') refuse(`task_type ${JSON.stringify(c.task_type)}: distillery runs causal language models (CAUSAL_LM)`);
  if (c.use_dora === true) refuse('DoRA adapters (use_dora) are not supported');
  if (c.use_rslora === true) refuse('rsLoRA scaling (use_rslora) is not supported');
  for (const k of ['rank_pattern', 'alpha_pattern'] as const) {
    const v = c[k];
    if (v !== undefined && v !== null && (typeof v !== 'object' || Object.keys(v).length > 0)) refuse(`per-module ranks or alphas (${k}) are not supported`);
  }
  if (c.bias !== undefined && c.bias !== 'none') refuse(`bias ${JSON.stringify(c.bias)}: adapters that train biases are not supported`);
  if (c.fan_in_fan_out === true) refuse('fan_in_fan_out (Conv1D weights, GPT-2 style) is not supported');
  if (Array.isArray(c.modules_to_save) ? c.modules_to_save.length > 0 : c.modules_to_save !== undefined && c.modules_to_save !== null) refuse('modules_to_save (fully trained extra modules) is not supported');
  if (c.layers_to_transform !== undefined && c.layers_to_transform !== null) refuse('layers_to_transform (adapters on some layers only) is not supported');
  if (c.lora_bias === true) refuse('lora_bias is not supported');
  // PiSSA, OLoRA, CorDA, LoftQ... saved without PEFT's conversion to plain LoRA belong to a modified base
  // (gaussian and EVA only choose the adapters' starting values: the base stays as it was)
  if (typeof c.init_lora_weights === 'string' && c.init_lora_weights !== 'gaussian' && c.init_lora_weights !== 'eva') {
    refuse(`init_lora_weights ${JSON.stringify(c.init_lora_weights)}: an adapter saved without conversion to plain LoRA belongs to the modified base it was initialised from`,
      'save it with PEFT\'s path_initial_model_for_weight_conversion (plain LoRA), or merge it in Python first');
  }
  const present = (v: unknown): boolean => v !== undefined && v !== null && v !== false && !(Array.isArray(v) && v.length === 0) &&
    !(typeof v === 'object' && !Array.isArray(v) && Object.keys(v as object).length === 0);
  // activated LoRA (alora_invocation_tokens) applies the adapter only after its invocation tokens: another computation
  for (const k of ['exclude_modules', 'layer_replication', 'trainable_token_indices', 'target_parameters', 'use_qalora', 'megatron_config', 'alora_invocation_tokens'] as const) {
    if (present(c[k])) refuse(`${k} is not supported`);
  }
  const r = c.r, alpha = c.lora_alpha;
  if (!(Number.isInteger(r) && (r as number) >= 1)) refuse(`r must be a positive integer, got ${JSON.stringify(r)}`, 'the adapter config is damaged');
  if (!(typeof alpha === 'number' && alpha > 0)) refuse(`lora_alpha must be a positive number, got ${JSON.stringify(alpha)}`, 'the adapter config is damaged');
  let targets: LoraTarget[];
  const tm = c.target_modules;
  if (tm === 'all-linear') targets = [...LORA_TARGETS];
  else if (Array.isArray(tm) && tm.every((x) => typeof x === 'string')) {
    const unknown = (tm as string[]).filter((x) => !(LORA_TARGETS as readonly string[]).includes(x));
    if (unknown.length) refuse(`target_modules names ${unknown.map((x) => JSON.stringify(x)).join(', ')}`, `distillery adapts ${LORA_TARGETS.join(', ')}`);
    targets = LORA_TARGETS.filter((t) => (tm as string[]).includes(t));
  } else {
    refuse(`target_modules ${JSON.stringify(tm)}: a regular expression or another form is not supported`, `list the projections (some of ${LORA_TARGETS.join(', ')}) or "all-linear"`);
  }
  if (targets!.length === 0) refuse('target_modules is empty', 'the adapter config is damaged');
  return { rank: r as number, alpha: alpha as number, targets: targets! };
}

function parseBaseRef(j: Record<string, unknown>, file: string): BaseRef {
  if (typeof j.path !== 'string' || typeof j.weights_sha256 !== 'string' || typeof j.shape !== 'object' || j.shape === null) {
    throw new DistilleryError(`${file}: expected {"path", "weights_sha256", "shape"}`, 'the adapter folder is damaged: restore it or re-save it');
  }
  return j as unknown as BaseRef;
}

/** Reads an adapter folder's config and base reference (not its weights: they need the base's shape). */
export function readAdapterHeader(dir: string): Omit<LoadedAdapter, 'weights'> {
  const cfgFile = path.join(dir, ADAPTER_CONFIG);
  if (!fs.existsSync(cfgFile)) throw new DistilleryError(`${dir} has no ${ADAPTER_CONFIG}`, 'pass a LoRA adapter folder (PEFT save_pretrained, or a distillery run with --lora-rank)');
  const config = readJsonObject(cfgFile, ADAPTER_CONFIG);
  const spec = parseAdapterConfig(config, cfgFile);
  const refFile = path.join(dir, BASE_REF);
  const base = fs.existsSync(refFile) ? parseBaseRef(readJsonObject(refFile, BASE_REF), refFile) : null;
  const baseName = typeof config.base_model_name_or_path === 'string' && config.base_model_name_or_path !== '' ? config.base_model_name_or_path : null;
  return { dir, spec, baseName, base, config };
}

/** Reads an adapter's weights for a base of config `c`: every tensor PEFT's names say, of the shape the base implies. */
export function readAdapterWeights(dir: string, spec: LoraSpec, c: ModelConfig): { layout: LoraLayout; weights: Float32Array } {
  const file = path.join(dir, ADAPTER_WEIGHTS);
  if (!fs.existsSync(file)) {
    const bin = fs.existsSync(path.join(dir, 'adapter_model.bin'));
    throw new DistilleryError(`${dir} has no ${ADAPTER_WEIGHTS}`, bin ? 'distillery reads safetensors: re-save the adapter with save_pretrained(safe_serialization=True)' : 'the adapter folder is incomplete');
  }
  const layout = loraLayout(c, spec);
  const f = readSafetensors(file);
  // PEFT names tensors without the adapter name ("default") when saving; accept the form with it as well.
  const byName = new Map<string, Float32Array>();
  const shapes = new Map<string, number[]>();
  for (const [name, t] of f.tensors) {
    const n = name.replace(/\.lora_([AB])\.default\.weight$/, '.lora_$1.weight');
    byName.set(n, t.data); shapes.set(n, t.shape);
  }
  const w = new Float32Array(layout.total);
  const hint = 'the adapter was trained for a model of another shape: pass the base it was trained on (--base)';
  for (const t of layout.tensors) {
    const d = byName.get(t.name);
    if (!d) throw new DistilleryError(`${file}: tensor "${t.name}" is missing`, f.tensors.size ? hint : 'the adapter file is empty or damaged');
    const s = shapes.get(t.name)!;
    if (s.length !== 2 || s[0] !== t.shape[0] || s[1] !== t.shape[1]) {
      throw new DistilleryError(`${file}: tensor "${t.name}" has shape [${s.join(', ')}], the base needs [${t.shape.join(', ')}]`, hint);
    }
    for (let i = 0; i < t.size; i++) {
      const x = d[i]!;
      if (!Number.isFinite(x)) throw new DistilleryError(`${file}: tensor "${t.name}" holds a non-finite value (${x} at element ${i})`, 'the adapter is damaged or was saved after training diverged');
      w[t.offset + i] = x;
    }
    byName.delete(t.name);
  }
  if (byName.size) {
    const extra = [...byName.keys()];
    throw new DistilleryError(`${file}: tensor${extra.length > 1 ? 's' : ''} ${extra.slice(0, 3).map((x) => `"${x}"`).join(', ')}${extra.length > 3 ? ', …' : ''} not expected`,
      'the adapter holds modules distillery does not adapt (embeddings, lm_head, DoRA magnitudes) or targets another architecture');
  }
  return { layout, weights: w };
}

/** The base folder an adapter names: --base, else base_model.json's path, else base_model_name_or_path (a folder or a cached Hub id). */
export function resolveBaseDir(h: Omit<LoadedAdapter, 'weights'>, baseOverride?: string): string {
  if (baseOverride !== undefined) {
    if (!fs.existsSync(baseOverride) && looksLikeHubId(baseOverride)) {
      const r = resolveHubModel(baseOverride);
      if (!r.ok) throw new DistilleryError(`--base: ${r.message}`, r.hint);
      return r.dir;
    }
    return baseOverride;
  }
  const tried: string[] = [];
  for (const cand of [h.base?.path, h.baseName]) {
    if (!cand) continue;
    const local = path.isAbsolute(cand) ? cand : path.resolve(cand);
    if (fs.existsSync(path.join(local, 'config.json'))) return local;
    if (looksLikeHubId(cand)) {
      const r = resolveHubModel(cand);
      if (r.ok) return r.dir;
    }
    tried.push(cand);
  }
  throw new DistilleryError(`the adapter ${h.dir} names its base as ${tried.length ? tried.map((t) => JSON.stringify(t)).join(' or ') : 'nothing'}, which is not a model folder here`,
    'pass the base model folder with --base <dir>');
}

/**
 * Refuses a base that is not the one the adapter was trained on: another shape (named field by field), or, when the
 * adapter records it, other weights (SHA-256). `baseHash` is computed only when needed.
 */
export function checkBase(h: Pick<LoadedAdapter, 'dir' | 'base'>, baseDir: string, c: ModelConfig, baseWeights: Weights): void {
  if (!h.base) return;
  const want = h.base.shape, have = baseShape(c);
  const diff = Object.keys(want).filter((k) => want[k] !== have[k]);
  if (diff.length) {
    throw new DistilleryError(`the base ${baseDir} does not match the adapter ${h.dir}: ${diff.map((k) => `${k} ${String(have[k])} (the adapter's base has ${String(want[k])})`).join(', ')}`,
      `pass the base it was trained on (${h.base.path}) with --base`);
  }
  const got = weightsHash(baseWeights, parameterLayout(c));
  if (got !== h.base.weights_sha256) {
    throw new DistilleryError(`the base ${baseDir} has other weights than the one the adapter ${h.dir} was trained on (SHA-256 ${got.slice(0, 12)}…, the adapter's base ${h.base.weights_sha256.slice(0, 12)}…)`,
      `pass the base it was trained on (${h.base.path}) with --base; an adapter applied to other weights computes something else`);
  }
}

export interface AdapterOnBase {
  adapter: LoadedAdapter;
  layout: LoraLayout;
  baseDir: string;
  base: LoadedCheckpoint;
}

/** Reads an adapter folder and its base, checked against each other. */
export function readAdapterOnBase(dir: string, baseOverride?: string): AdapterOnBase {
  const h = readAdapterHeader(dir);
  const baseDir = resolveBaseDir(h, baseOverride);
  const base = readCheckpoint(baseDir);
  checkBase(h, baseDir, base.config, base.weights);
  const { layout, weights } = readAdapterWeights(dir, h.spec, base.config);
  return { adapter: { ...h, weights }, layout, baseDir, base };
}

/**
 * A model folder or an adapter folder as one checkpoint: an adapter is merged into its base (W + (alpha/r)·B·A, in
 * float32), which is what PEFT's merge_and_unload computes. The tokenizer is the adapter folder's when it has one
 * (a run that trained with --tokenizer), else the base's; so are the chat and generation files. `adapter` describes
 * the merge (null for a model folder). `tensorByTensor`: a model folder's weights are kept tensor by tensor
 * (readCheckpoint's option, for a model that is only uploaded).
 */
export function readModelOrAdapter(dir: string, opts: { base?: string | undefined; tensorByTensor?: boolean } = {}): LoadedCheckpoint & { adapter: AdapterOnBase | null } {
  if (!isAdapterDir(dir)) {
    if (opts.base !== undefined) throw new DistilleryError(`--base: ${dir} is a model folder, not a LoRA adapter`, 'drop --base (it names the base of an adapter folder)');
    return { ...readCheckpoint(dir, { tensorByTensor: opts.tensorByTensor ?? false }), adapter: null };
  }
  const a = readAdapterOnBase(dir, opts.base);
  const merged = mergeLora(a.base.weights, parameterLayout(a.base.config).layers, a.layout, a.adapter.weights);
  const own = readModelDirExtras(dir);
  const tokenizerJson = own.tokenizerJson ?? a.base.tokenizerJson;
  const tokenizer = own.tokenizerJson ? Tokenizer.fromJSON(own.tokenizerJson) : a.base.tokenizer;
  return {
    ...a.base, weights: merged, adapter: a, tokenizerJson, tokenizer,
    tokenizerConfig: own.tokenizerConfig ?? a.base.tokenizerConfig, chatTemplate: own.chatTemplate ?? a.base.chatTemplate,
    generationConfig: own.generationConfig ?? a.base.generationConfig,
  };
}

/** One line on a merged adapter, for the log. */
export function describeMerge(a: AdapterOnBase): string {
  const sp = a.adapter.spec;
  return `adapter: LoRA rank ${sp.rank}, alpha ${sp.alpha} on ${sp.targets.join(', ')} (${a.layout.total} parameters) merged into the base ${a.baseDir}` +
    (a.adapter.base ? ' (weights SHA-256 checked)' : ' (the adapter records no hash of its base: not checked)');
}
