/**
 * Model folders ↔ Transformers: reads an HF folder (config.json + model.safetensors + tokenizer.json) into a
 * Transformer on any backend, and writes a Transformer back out in the same layout, readable by HF
 * transformers' Qwen2ForCausalLM / LlamaForCausalLM.
 */
import type { Backend } from '../backend/backend.js';
import { parseHfConfig, toHfConfig, type ModelConfig } from './config.js';
import { packWeights, unpackWeights, parameterLayout, type ParamLayout } from './params.js';
import { DistilleryError } from '../util/errors.js';
import { Transformer, type TransformerOptions } from './transformer.js';
import { loadModelDir, saveModelDirSync } from '../io/checkpoint-dir.js';
import { Tokenizer } from '../tokenizer/bpe.js';

export interface LoadedCheckpoint {
  config: ModelConfig;
  weights: Float32Array;
  tokenizer: Tokenizer | null;
  tokenizerJson: Record<string, unknown> | null;
}

/**
 * Reads and validates a checkpoint folder: config, every tensor by name and shape, the tokenizer if present.
 * Weights that are NaN or infinite are refused, naming the tensor (such a model computes nothing meaningful).
 */
export function readCheckpoint(dir: string): LoadedCheckpoint {
  const loaded = loadModelDir(dir);
  const config = parseHfConfig(loaded.config);
  const layout = parameterLayout(config);
  const weights = packWeights(layout, loaded.tensors, dir);
  const bad = firstNonFinite(layout, weights);
  if (bad) {
    throw new DistilleryError(`${dir}: tensor "${bad.name}" holds a non-finite value (${bad.value} at element ${bad.index})`,
      'the checkpoint is damaged or was saved after training diverged; use an earlier checkpoint');
  }
  const tokenizerJson = loaded.tokenizerJson ?? null;
  const tokenizer = tokenizerJson ? Tokenizer.fromJSON(tokenizerJson) : null;
  if (tokenizer && tokenizer.vocabSize > config.vocabSize) {
    // Its ids at or above vocab_size have no embedding row: encoding text could index past the model.
    throw new DistilleryError(`${dir}: tokenizer.json has ${tokenizer.vocabSize} tokens but config.json's vocab_size is ${config.vocabSize}`,
      'the tokenizer does not belong to this model: put back the tokenizer.json it was trained with');
  }
  return { config, weights, tokenizerJson, tokenizer };
}

/** Loads a checkpoint folder into a new Transformer on the backend. */
export function loadTransformer(backend: Backend, dir: string, opts: TransformerOptions): { model: Transformer } & LoadedCheckpoint {
  const ck = readCheckpoint(dir);
  const model = new Transformer(backend, ck.config, opts);
  model.setWeights(ck.weights);
  return { model, ...ck };
}

/** The first NaN or infinite weight, by tensor name and element index, or null when all are finite. */
export function firstNonFinite(layout: ParamLayout, weights: Float32Array): { name: string; index: number; value: number } | null {
  for (const t of layout.tensors) {
    for (let i = 0; i < t.size; i++) {
      const x = weights[t.offset + i]!;
      if (!Number.isFinite(x)) return { name: t.name, index: i, value: x };
    }
  }
  return null;
}

export interface SaveCheckpointOptions {
  dtype: 'f32' | 'bf16';
  tokenizerJson?: object | null | undefined;
  extraFiles?: Record<string, string | Uint8Array>;
}

/** Writes weights (flat, layout order) and config as an HF model folder, atomically. */
export function writeCheckpoint(dir: string, config: ModelConfig, weights: Float32Array | Float64Array, opts: SaveCheckpointOptions): void {
  const tensors = unpackWeights(parameterLayout(config), weights);
  const hf = toHfConfig(config);
  hf.torch_dtype = opts.dtype === 'bf16' ? 'bfloat16' : 'float32';
  saveModelDirSync(dir, {
    config: hf, tensors, dtype: opts.dtype,
    ...(opts.tokenizerJson ? { tokenizerJson: opts.tokenizerJson } : {}),
    ...(opts.extraFiles ? { extraFiles: opts.extraFiles } : {}),
  });
}
