/**
 * Hugging Face model folders: `config.json`, `model.safetensors` (or shards `model-00001-of-00003.safetensors` ...
 * with `model.safetensors.index.json`), `tokenizer.json`, `tokenizer_config.json` (with its `chat_template`, or a
 * `chat_template.jinja` file) and `generation_config.json`.
 *
 * `saveModelDir` writes the whole folder atomically (`replaceDirAtomic`): either the new folder is complete or the
 * previous one is still there byte-for-byte. Weights above `maxShardBytes` (default 50 GB, transformers 5's
 * `save_pretrained` default; transformers 4 used 5 GB) are split as transformers splits them: tensors in order, a
 * new shard when the next tensor would overflow the current one, a tensor larger than the limit alone in its shard;
 * the index holds `metadata.total_size` (bytes of tensor data) and `weight_map` (tensor → shard file).
 * `loadModelDir` reads either layout back, with a DistilleryError for a missing folder, a missing or malformed
 * file, a missing shard, or a tensor the index lists that its shard lacks.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { DistilleryError, InputError } from '../util/errors.js';
import { recoverDir, replaceDirAtomic, replaceDirAtomicSync } from './atomic.js';
import { lazySafetensors, readTensors, writeSafetensors, type LazyTensor, type Tensor } from './safetensors.js';
import { CHATML_TEMPLATE, chatTemplateFromConfig } from '../tokenizer/chat.js';

/** transformers 5's default `max_shard_size` ("50GB", decimal units). */
export const DEFAULT_MAX_SHARD_BYTES = 50e9;

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
  /** generation_config.json (bos/eos ids, sampling defaults); not written when omitted. */
  generationConfig?: object;
  /** Extra files by relative path (e.g. 'distillery/state.json'). */
  extraFiles?: Record<string, string | Uint8Array>;
  /** Split the weights into shards of at most this many bytes (default DEFAULT_MAX_SHARD_BYTES). */
  maxShardBytes?: number;
}

export interface LoadedModelDir {
  config: Record<string, unknown>;
  tensors: Map<string, Tensor>;
  /** Parsed tokenizer.json, when present. */
  tokenizerJson?: Record<string, unknown>;
  /** Parsed tokenizer_config.json, when present. */
  tokenizerConfig?: Record<string, unknown>;
  /** The chat template: tokenizer_config.json's `chat_template`, else chat_template.jinja, when present. */
  chatTemplate?: string;
  /** Parsed generation_config.json, when present. */
  generationConfig?: Record<string, unknown>;
  /** `__metadata__` of model.safetensors (of the first shard when sharded). */
  metadata: Record<string, string>;
  /** The shard files when the weights are sharded (in index order), else null. */
  shards: string[] | null;
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

/**
 * A minimal tokenizer_config.json for transformers' PreTrainedTokenizerFast, with a ChatML `chat_template` when the
 * tokenizer has the <|im_start|> and <|im_end|> tokens (so transformers.js can apply_chat_template).
 */
export function minimalTokenizerConfig(tokenizerJson: Record<string, unknown>, maxLength?: number): Record<string, unknown> {
  const { eos, pad, bos } = guessSpecialTokens(tokenizerJson);
  const added = Array.isArray(tokenizerJson.added_tokens) ? (tokenizerJson.added_tokens as Array<{ content?: unknown }>) : [];
  const names = new Set(added.map((t) => String(t.content)));
  const chatml = names.has('<|im_start|>') && names.has('<|im_end|>');
  return {
    ...(chatml ? { chat_template: CHATML_TEMPLATE } : {}),
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

/**
 * Groups tensors (in order) into shards of at most maxBytes, as transformers does: a new shard starts when the next
 * tensor would overflow the current one; a tensor larger than maxBytes gets a shard of its own.
 */
export function planShards(sizes: ReadonlyArray<{ name: string; bytes: number }>, maxBytes: number): string[][] {
  if (!(maxBytes > 0)) throw new DistilleryError(`maxShardBytes must be > 0, got ${maxBytes}`);
  const shards: string[][] = [];
  let cur: string[] = [], curBytes = 0;
  for (const { name, bytes } of sizes) {
    if (cur.length > 0 && curBytes + bytes > maxBytes) { shards.push(cur); cur = []; curBytes = 0; }
    cur.push(name);
    curBytes += bytes;
  }
  if (cur.length > 0) shards.push(cur);
  return shards;
}

/** `model-00002-of-00003.safetensors` (1-based i). */
export function shardFileName(i: number, n: number): string {
  return `model-${String(i).padStart(5, '0')}-of-${String(n).padStart(5, '0')}.safetensors`;
}

function writeWeights(tmp: string, opts: SaveModelDirOptions): void {
  const esize = opts.dtype === 'bf16' ? 2 : 4;
  const sizes = [...opts.tensors.entries()].map(([name, t]) => ({ name, bytes: t.shape.reduce((a, d) => a * d, 1) * esize }));
  const shards = planShards(sizes, opts.maxShardBytes ?? DEFAULT_MAX_SHARD_BYTES);
  const meta = { dtype: opts.dtype, metadata: { format: 'pt' } };
  if (shards.length <= 1) {
    writeSafetensors(path.join(tmp, 'model.safetensors'), opts.tensors, meta);
    return;
  }
  const weightMap: Record<string, string> = {};
  shards.forEach((names, i) => {
    const file = shardFileName(i + 1, shards.length);
    writeSafetensors(path.join(tmp, file), new Map(names.map((n) => [n, opts.tensors.get(n)!])), meta);
    for (const n of names) weightMap[n] = file;
  });
  const sorted: Record<string, string> = {};
  for (const k of Object.keys(weightMap).sort()) sorted[k] = weightMap[k]!;
  const index = { metadata: { total_size: sizes.reduce((a, s) => a + s.bytes, 0) }, weight_map: sorted };
  fs.writeFileSync(path.join(tmp, 'model.safetensors.index.json'), JSON.stringify(index, null, 2) + '\n');
}

function fill(tmp: string, opts: SaveModelDirOptions): void {
  const config: Record<string, unknown> = { ...opts.config, torch_dtype: opts.dtype === 'bf16' ? 'bfloat16' : 'float32' };
  fs.writeFileSync(path.join(tmp, 'config.json'), JSON.stringify(config, null, 2) + '\n');
  writeWeights(tmp, opts);
  if (opts.generationConfig) fs.writeFileSync(path.join(tmp, 'generation_config.json'), JSON.stringify(opts.generationConfig, null, 2) + '\n');
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
  const lazy = loadModelDirLazy(dir);
  return { ...lazy, tensors: readTensors(lazy.tensors) };
}

/** loadModelDir with the tensors not yet read (LazyTensor: read() reads one): a model loaded tensor by tensor. */
export function loadModelDirLazy(dir: string): Omit<LoadedModelDir, 'tensors'> & { tensors: Map<string, LazyTensor> } {
  if (!fs.existsSync(dir) && fs.existsSync(`${path.resolve(dir)}.old`)) recoverDir(dir);
  if (!fs.existsSync(dir)) {
    throw new InputError(`model folder ${dir} does not exist`, 'pass the folder that holds config.json and model.safetensors');
  }
  if (!fs.statSync(dir).isDirectory()) {
    throw new InputError(`${dir} is a file, not a model folder`, 'pass the folder that holds config.json and model.safetensors');
  }
  const configPath = path.join(dir, 'config.json');
  if (!fs.existsSync(configPath)) {
    throw new InputError(`model folder ${dir} has no config.json`, 'a Hugging Face model folder needs config.json next to model.safetensors');
  }
  const config = readJson(configPath, 'config.json');
  const single = path.join(dir, 'model.safetensors');
  const index = path.join(dir, 'model.safetensors.index.json');
  let tensors: Map<string, LazyTensor>;
  let metadata: Record<string, string> = {};
  let shards: string[] | null = null;
  if (fs.existsSync(single)) {
    const f = lazySafetensors(single);
    tensors = f.tensors;
    metadata = f.metadata;
  } else if (fs.existsSync(index)) {
    tensors = new Map();
    const listed = indexedShards(dir);
    shards = listed.map((x) => x.shard);
    let firstShard = true;
    for (const { path: p, names } of listed) {
      const f = lazySafetensors(p, { filter: (n) => names.has(n) });
      if (firstShard) { metadata = f.metadata; firstShard = false; }
      for (const n of names) tensors.set(n, shardTensor(f.tensors, n, p));
    }
  } else {
    throw new DistilleryError(`model folder ${dir} has no model.safetensors`,
      'distillery reads safetensors weights; convert pytorch_model.bin with save_pretrained(safe_serialization=True)');
  }
  return { config, tensors, metadata, shards, ...readModelDirExtras(dir) };
}

/**
 * The shards model.safetensors.index.json lists, each with the tensors it must hold, in file order: the index checked
 * (a weight_map object of file names, inside the folder, every shard present). Shared by the loader and `inspect`.
 */
export function indexedShards(dir: string): Array<{ shard: string; path: string; names: Set<string> }> {
  const index = path.join(dir, 'model.safetensors.index.json');
  const idx = readJson(index, 'model.safetensors.index.json');
  const wm = idx.weight_map;
  if (typeof wm !== 'object' || wm === null || Array.isArray(wm)) {
    throw new DistilleryError(`${index}: no "weight_map" object`, 'the index is corrupt; re-download the model');
  }
  const byShard = new Map<string, Set<string>>();
  for (const [name, shard] of Object.entries(wm as Record<string, unknown>)) {
    if (typeof shard !== 'string') throw new DistilleryError(`${index}: weight_map["${name}"] is not a file name`, 'the index is corrupt; re-download the model');
    if (!byShard.has(shard)) byShard.set(shard, new Set());
    byShard.get(shard)!.add(name);
  }
  return [...byShard.entries()].sort((a, b) => a[0].localeCompare(b[0])).map(([shard, names]) => {
    const p = path.join(dir, safeRelPath(shard));
    if (!fs.existsSync(p)) throw new DistilleryError(`model folder ${dir} is missing shard ${shard}`, 'the download is incomplete; fetch the missing file');
    return { shard, path: p, names };
  });
}

/** Tensor `n` of a shard the index says holds it (an error naming both when it does not). */
export function shardTensor<T>(tensors: ReadonlyMap<string, T>, n: string, shardPath: string): T {
  const t = tensors.get(n);
  if (!t) throw new DistilleryError(`${shardPath}: tensor "${n}" listed in the index is not in the shard`, 'the download is corrupt; re-download the model');
  return t;
}

/** The tokenizer and generation files of a model folder (everything but config.json and the weights). */
export function readModelDirExtras(dir: string, opts: { tokenizerJson?: boolean } = {}): Pick<LoadedModelDir, 'tokenizerJson' | 'tokenizerConfig' | 'chatTemplate' | 'generationConfig'> {
  const out: Pick<LoadedModelDir, 'tokenizerJson' | 'tokenizerConfig' | 'chatTemplate' | 'generationConfig'> = {};
  const tokPath = path.join(dir, 'tokenizer.json');
  if (opts.tokenizerJson !== false && fs.existsSync(tokPath)) out.tokenizerJson = readJson(tokPath, 'tokenizer.json');
  const tcPath = path.join(dir, 'tokenizer_config.json');
  if (fs.existsSync(tcPath)) out.tokenizerConfig = readJson(tcPath, 'tokenizer_config.json');
  // as transformers loads them: chat_template.jinja (the default) and additional_chat_templates/<name>.jinja, where
  // any is present, over tokenizer_config.json's chat_template; named ones are kept as transformers' list of them
  const jinjaPath = path.join(dir, 'chat_template.jinja');
  const jinja = fs.existsSync(jinjaPath) ? fs.readFileSync(jinjaPath, 'utf8') : null;
  const namedDir = path.join(dir, 'additional_chat_templates');
  const namedFiles = fs.existsSync(namedDir) && fs.statSync(namedDir).isDirectory()
    ? fs.readdirSync(namedDir).filter((f) => f.endsWith('.jinja')).sort() : [];
  if (namedFiles.length > 0) {
    const list = [
      ...(jinja !== null ? [{ name: 'default', template: jinja }] : []),
      ...namedFiles.map((f) => ({ name: f.slice(0, -'.jinja'.length), template: fs.readFileSync(path.join(namedDir, f), 'utf8') })),
    ];
    out.tokenizerConfig = { ...(out.tokenizerConfig ?? {}), chat_template: list };
  }
  const fromConfig = out.tokenizerConfig ? chatTemplateFromConfig(out.tokenizerConfig.chat_template) : null;
  if (jinja !== null) out.chatTemplate = jinja;
  else if (fromConfig !== null) out.chatTemplate = fromConfig;
  const genPath = path.join(dir, 'generation_config.json');
  if (fs.existsSync(genPath)) out.generationConfig = readJson(genPath, 'generation_config.json');
  return out;
}

/**
 * The end-of-sequence ids of a generation_config.json (`eos_token_id`: an id or a list of ids; absent or null: none).
 * `file` names it in errors.
 */
export function generationEosIds(gen: Record<string, unknown> | undefined | null, file: string): number[] {
  const v = gen?.eos_token_id;
  if (v === undefined || v === null) return [];
  const list = Array.isArray(v) ? v : [v];
  for (const x of list) {
    if (!(Number.isInteger(x) && (x as number) >= 0)) {
      throw new DistilleryError(`${file}: eos_token_id must be a token id or a list of token ids, got ${JSON.stringify(v)}`,
        'fix generation_config.json (e.g. "eos_token_id": [151645, 151643])');
    }
  }
  return list as number[];
}
