/**
 * Hugging Face model folders: `config.json`, `model.safetensors` (or sharded `model-0000x-of-0000y.safetensors` with
 * `model.safetensors.index.json` when loading), `tokenizer.json` and `tokenizer_config.json`.
 *
 * `saveModelDir` writes the whole folder atomically (`replaceDirAtomic`): either the new folder is complete or the
 * previous one is still there byte-for-byte. `loadModelDir` reads it back, with a DistilleryError for a missing
 * folder, a missing or malformed file, or a tensor missing from a shard.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { DistilleryError } from '../util/errors.js';
import { recoverDir, replaceDirAtomic, replaceDirAtomicSync } from './atomic.js';
import { readSafetensors, writeSafetensors, type Tensor } from './safetensors.js';

export interface SaveModelDirOptions {
  /** The config.json object (written with `torch_dtype` set to match `dtype`). */
  config: Record<string, unknown>;
  tensors: Map<string, { shape: readonly number[]; data: Float32Array }>;
  /** Storage dtype of model.safetensors. */
  dtype: 'f32' | 'bf16';
  /** tokenizer.json content (object or already-serialized string). */
  tokenizerJson?: object | string;
  /** tokenizer_config.json; a minimal one is derived from tokenizerJson when omitted. */
  tokenizerConfig?: object;
  /** Extra files by relative path (e.g. 'generation_config.json', 'distillery/state.json'). */
  extraFiles?: Record<string, string | Uint8Array>;
}

export interface LoadedModelDir {
  config: Record<string, unknown>;
  tensors: Map<string, Tensor>;
  /** Parsed tokenizer.json, when present. */
  tokenizerJson?: Record<string, unknown>;
  /** Parsed tokenizer_config.json, when present. */
  tokenizerConfig?: Record<string, unknown>;
  /** `__metadata__` of model.safetensors (of the first shard when sharded). */
  metadata: Record<string, string>;
}

/** Guesses eos/pad token strings from a tokenizer.json's added tokens. */
function guessSpecialTokens(tok: Record<string, unknown>): { eos: string | null; pad: string | null; bos: string | null } {
  const added = Array.isArray(tok.added_tokens) ? (tok.added_tokens as Array<{ content?: unknown }>) : [];
  const names = new Set(added.map((t) => String(t.content)));
  const first = (cands: string[]): string | null => cands.find((c) => names.has(c)) ?? null;
  const eos = first(['<|endoftext|>', '<|end_of_text|>', '</s>', '<eos>', '<|eot_id|>']);
  const pad = first(['<|endoftext|>', '<pad>', '<|pad|>', '<|finetune_right_pad_id|>']) ?? eos;
  const bos = first(['<|begin_of_text|>', '<s>', '<bos>']);
  return { eos, pad, bos };
}

/** A minimal tokenizer_config.json for transformers' PreTrainedTokenizerFast. */
export function minimalTokenizerConfig(tokenizerJson: Record<string, unknown>, maxLength?: number): Record<string, unknown> {
  const { eos, pad, bos } = guessSpecialTokens(tokenizerJson);
  return {
    tokenizer_class: 'PreTrainedTokenizerFast',
    bos_token: bos,
    eos_token: eos,
    pad_token: pad,
    unk_token: null,
    add_bos_token: false,
    add_prefix_space: false,
    clean_up_tokenization_spaces: false,
    model_max_length: maxLength ?? 131072,
  };
}

function safeRelPath(rel: string): string {
  const norm = path.normalize(rel);
  if (path.isAbsolute(rel) || norm.startsWith('..') || norm === '.' || norm === '') {
    throw new DistilleryError(`extra file name ${JSON.stringify(rel)} is not a relative path inside the model folder`,
      'use names like "generation_config.json" or "sub/dir/file.json"');
  }
  return norm;
}

function fill(tmp: string, opts: SaveModelDirOptions): void {
  const config: Record<string, unknown> = { ...opts.config, torch_dtype: opts.dtype === 'bf16' ? 'bfloat16' : 'float32' };
  fs.writeFileSync(path.join(tmp, 'config.json'), JSON.stringify(config, null, 2) + '\n');
  writeSafetensors(path.join(tmp, 'model.safetensors'), opts.tensors, { dtype: opts.dtype, metadata: { format: 'pt' } });
  if (opts.tokenizerJson !== undefined) {
    const text = typeof opts.tokenizerJson === 'string' ? opts.tokenizerJson : JSON.stringify(opts.tokenizerJson);
    fs.writeFileSync(path.join(tmp, 'tokenizer.json'), text);
    let tc = opts.tokenizerConfig;
    if (!tc) {
      const obj = typeof opts.tokenizerJson === 'string' ? (JSON.parse(opts.tokenizerJson) as Record<string, unknown>) : (opts.tokenizerJson as Record<string, unknown>);
      const mpe = typeof opts.config.max_position_embeddings === 'number' ? opts.config.max_position_embeddings : undefined;
      tc = minimalTokenizerConfig(obj, mpe);
    }
    fs.writeFileSync(path.join(tmp, 'tokenizer_config.json'), JSON.stringify(tc, null, 2) + '\n');
  } else if (opts.tokenizerConfig) {
    fs.writeFileSync(path.join(tmp, 'tokenizer_config.json'), JSON.stringify(opts.tokenizerConfig, null, 2) + '\n');
  }
  for (const [rel, content] of Object.entries(opts.extraFiles ?? {})) {
    const p = path.join(tmp, safeRelPath(rel));
    fs.mkdirSync(path.dirname(p), { recursive: true });
    fs.writeFileSync(p, content);
  }
}

/** Writes a Hugging Face model folder atomically (see the module comment). */
export async function saveModelDir(dir: string, opts: SaveModelDirOptions): Promise<void> {
  await replaceDirAtomic(dir, (tmp) => fill(tmp, opts));
}

/** Synchronous saveModelDir. */
export function saveModelDirSync(dir: string, opts: SaveModelDirOptions): void {
  replaceDirAtomicSync(dir, (tmp) => fill(tmp, opts));
}

function readJson(file: string, what: string): Record<string, unknown> {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch {
    throw new DistilleryError(`${file}: cannot read ${what}`, 'check that the model folder is complete');
  }
  let j: unknown;
  try {
    j = JSON.parse(text);
  } catch (e) {
    throw new DistilleryError(`${file}: ${what} is not valid JSON (${(e as Error).message})`, 'the file is corrupt; re-download or re-save the model');
  }
  if (typeof j !== 'object' || j === null || Array.isArray(j)) {
    throw new DistilleryError(`${file}: ${what} is not a JSON object`, 'the file is corrupt; re-download or re-save the model');
  }
  return j as Record<string, unknown>;
}

/** Loads a Hugging Face model folder (single-file or sharded safetensors). */
export function loadModelDir(dir: string): LoadedModelDir {
  if (!fs.existsSync(dir) && fs.existsSync(`${path.resolve(dir)}.old`)) recoverDir(dir);
  if (!fs.existsSync(dir)) {
    throw new DistilleryError(`model folder ${dir} does not exist`, 'pass the folder that holds config.json and model.safetensors');
  }
  if (!fs.statSync(dir).isDirectory()) {
    throw new DistilleryError(`${dir} is a file, not a model folder`, 'pass the folder that holds config.json and model.safetensors');
  }
  const configPath = path.join(dir, 'config.json');
  if (!fs.existsSync(configPath)) {
    throw new DistilleryError(`model folder ${dir} has no config.json`, 'a Hugging Face model folder needs config.json next to model.safetensors');
  }
  const config = readJson(configPath, 'config.json');
  const single = path.join(dir, 'model.safetensors');
  const index = path.join(dir, 'model.safetensors.index.json');
  let tensors: Map<string, Tensor>;
  let metadata: Record<string, string> = {};
  if (fs.existsSync(single)) {
    const f = readSafetensors(single);
    tensors = f.tensors;
    metadata = f.metadata;
  } else if (fs.existsSync(index)) {
    const idx = readJson(index, 'model.safetensors.index.json');
    const wm = idx.weight_map;
    if (typeof wm !== 'object' || wm === null) {
      throw new DistilleryError(`${index}: no "weight_map" object`, 'the index is corrupt; re-download the model');
    }
    const byShard = new Map<string, Set<string>>();
    for (const [name, shard] of Object.entries(wm as Record<string, unknown>)) {
      if (typeof shard !== 'string') throw new DistilleryError(`${index}: weight_map["${name}"] is not a file name`, 'the index is corrupt; re-download the model');
      if (!byShard.has(shard)) byShard.set(shard, new Set());
      byShard.get(shard)!.add(name);
    }
    tensors = new Map();
    let firstShard = true;
    for (const [shard, names] of [...byShard.entries()].sort((a, b) => a[0].localeCompare(b[0]))) {
      const p = path.join(dir, safeRelPath(shard));
      if (!fs.existsSync(p)) throw new DistilleryError(`model folder ${dir} is missing shard ${shard}`, 'the download is incomplete; fetch the missing file');
      const f = readSafetensors(p, { filter: (n) => names.has(n) });
      if (firstShard) { metadata = f.metadata; firstShard = false; }
      for (const n of names) {
        const t = f.tensors.get(n);
        if (!t) throw new DistilleryError(`${p}: tensor "${n}" listed in the index is not in the shard`, 'the download is corrupt; re-download the model');
        tensors.set(n, t);
      }
    }
  } else {
    throw new DistilleryError(`model folder ${dir} has no model.safetensors`,
      'distillery reads safetensors weights; convert pytorch_model.bin with save_pretrained(safe_serialization=True)');
  }
  const out: LoadedModelDir = { config, tensors, metadata };
  const tokPath = path.join(dir, 'tokenizer.json');
  if (fs.existsSync(tokPath)) out.tokenizerJson = readJson(tokPath, 'tokenizer.json');
  const tcPath = path.join(dir, 'tokenizer_config.json');
  if (fs.existsSync(tcPath)) out.tokenizerConfig = readJson(tcPath, 'tokenizer_config.json');
  return out;
}
