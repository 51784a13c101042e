/**
 * `distillery inspect <dir | file.safetensors>`: what a checkpoint holds, read from config.json and the
 * safetensors headers only (no tensor data is loaded): the config summary and parameter count (parameterCount),
 * the tokenizer, then every tensor's name, dtype and shape, and the total bytes. A bare .safetensors file gets
 * the tensor table and the element count.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { formatHelp, parseArgs, UsageError, type FlagSpec, type Io } from '../args.js';
import type { Command } from '../command.js';
import { describeBaked, oProjBias, parseHfConfig, parameterCount, type ModelConfig } from '../../model/config.js';
import { describeRope } from '../../backend/rope.js';
import { readSafetensorsHeader, type TensorInfo } from '../../io/safetensors.js';
import { Tokenizer } from '../../tokenizer/bpe.js';
import { DistilleryError } from '../../util/errors.js';
import { resolveModelArg } from '../model-ref.js';
import { generationEosIds, indexedShards, readModelDirExtras, shardTensor } from '../../io/checkpoint-dir.js';
import { chatFormatOf, describeChatFormat } from '../../tokenizer/chat.js';
import { tokenizerHash } from '../../tokenizer/identity.js';
import { readManifest } from '../../cache/store.js';
import { packingOfDescription } from '../../data/pack.js';
import { ADAPTER_WEIGHTS, isAdapterDir, readAdapterHeader, resolveBaseDir } from '../../model/adapter.js';

const FLAGS: FlagSpec[] = [];

/** 1234567 → '1.23M'. */
export function humanCount(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)}B`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(2)}M`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)}K`;
  return String(n);
}

/** 1536 → '1.5 KiB'. */
export function humanBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n, u = 0;
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
  return u === 0 ? `${n} B` : `${v.toFixed(1)} ${units[u]}`;
}

interface Shard { file: string; tensors: Map<string, TensorInfo> }

/** The safetensors files of a model folder: model.safetensors, or the shards listed by the index. */
function shardsOf(dir: string): Shard[] {
  const single = path.join(dir, 'model.safetensors');
  if (fs.existsSync(single)) return [{ file: single, tensors: readSafetensorsHeader(single).tensors }];
  const index = path.join(dir, 'model.safetensors.index.json');
  if (fs.existsSync(index)) {
    // the index checked as the loader checks it: each shard holds exactly what the index says it holds
    return indexedShards(dir).map(({ path: p, names }) => {
      const all = readSafetensorsHeader(p).tensors;
      return { file: p, tensors: new Map([...names].map((n) => [n, shardTensor(all, n, p)])) };
    });
  }
  throw new DistilleryError(`${dir} has no model.safetensors (or model.safetensors.index.json)`, 'inspect a Hugging Face model folder or a .safetensors file');
}

function describeConfig(c: ModelConfig): string[] {
  return [
    `architecture   ${c.architecture}`,
    `vocab size     ${c.vocabSize}`,
    `hidden size    ${c.hiddenSize}`,
    `intermediate   ${c.intermediateSize}`,
    `layers         ${c.numLayers}`,
    `heads          ${c.numHeads} (kv heads ${c.numKvHeads}, head dim ${c.headDim})`,
    `max positions  ${c.maxPositionEmbeddings}`,
    `rope           ${describeRope(c.rope).replace(/^theta (\S+) rope (\S+)/, '$2, theta $1')}`,
    `rms norm eps   ${c.rmsNormEps}`,
    `tied embedding ${c.tieWordEmbeddings ? 'yes' : 'no'}`,
    `qkv bias       ${c.qkvBias ? 'yes' : 'no'}`,
    `o bias         ${oProjBias(c) ? 'yes' : 'no'}`,
    `q/k norm       ${c.qkNorm ? 'yes (per head, [head_dim] weights)' : 'no'}`,
    ...(c.architecture === 'smollm3' ? [`no-RoPE layers ${c.noRopeLayers.length ? c.noRopeLayers.join(', ') : 'none'}`] : []),
    `baked          ${describeBaked(c)}`,
  ];
}

function tensorTable(shards: Shard[], io: Io): { bytes: number; numel: number; count: number } {
  const rows: Array<[string, string, string, number]> = [];
  let bytes = 0, numel = 0;
  for (const s of shards) {
    for (const [name, t] of s.tensors) {
      const n = t.shape.reduce((a, d) => a * d, 1);
      rows.push([name, t.dtype, `[${t.shape.join(', ')}]`, t.end - t.begin]);
      bytes += t.end - t.begin; numel += n;
    }
  }
  const w = Math.max(6, ...rows.map((r) => r[0].length));
  const sw = Math.max(5, ...rows.map((r) => r[2].length));
  io.out(`${'tensor'.padEnd(w)}  dtype  ${'shape'.padEnd(sw)}  bytes\n`);
  for (const [name, dtype, shape, b] of rows) io.out(`${name.padEnd(w)}  ${dtype.padEnd(5)}  ${shape.padEnd(sw)}  ${b}\n`);
  return { bytes, numel, count: rows.length };
}

/** Prints the report for a model folder or a .safetensors file. */
export function inspect(arg: string, io: Io): void {
  const target = resolveModelArg(arg, 'inspect');
  if (!fs.existsSync(target)) throw new UsageError(`inspect: ${target} does not exist`, 'pass a checkpoint folder or a .safetensors file');
  if (!fs.statSync(target).isDirectory()) {
    const shard = { file: target, tensors: readSafetensorsHeader(target).tensors };
    io.out(`file           ${target}\n\n`);
    const t = tensorTable([shard], io);
    io.out(`\n${t.count} tensors, ${t.numel} elements (${humanCount(t.numel)}), ${t.bytes} bytes (${humanBytes(t.bytes)})\n`);
    return;
  }
  if (fs.existsSync(path.join(target, 'manifest.json'))) { inspectCache(target, io); return; }
  if (isAdapterDir(target)) { inspectAdapter(target, io); return; }
  const cfgPath = path.join(target, 'config.json');
  if (!fs.existsSync(cfgPath)) throw new UsageError(`inspect: ${target} has no config.json`, 'pass a Hugging Face model folder (config.json + model.safetensors), a LoRA adapter folder, a teacher cache or a .safetensors file');
  let raw: Record<string, unknown>;
  try {
    raw = JSON.parse(fs.readFileSync(cfgPath, 'utf8')) as Record<string, unknown>;
  } catch (e) {
    throw new DistilleryError(`${cfgPath}: not valid JSON (${(e as Error).message})`, 'the file is corrupt; re-save the model');
  }
  const config = parseHfConfig(raw);
  const params = parameterCount(config);
  io.out(`folder         ${target}\n`);
  for (const l of describeConfig(config)) io.out(`${l}\n`);
  io.out(`parameters     ${params} (${humanCount(params)})\n`);
  const tokPath = path.join(target, 'tokenizer.json');
  if (fs.existsSync(tokPath)) {
    const tok = Tokenizer.fromFile(tokPath);
    const eos = tok.eosId !== undefined ? `, eos ${tok.idToToken(tok.eosId) ?? '?'} (id ${tok.eosId})` : '';
    io.out(`tokenizer      ${tok.vocabSize} tokens${eos}, identity ${tokenizerHash(tok).slice(0, 16)} (sha256 of its canonical form)\n`);
  } else {
    io.out('tokenizer      none (no tokenizer.json)\n');
  }
  const extras = readModelDirExtras(target, { tokenizerJson: false });
  const chat = chatFormatOf(extras.chatTemplate, target, extras.tokenizerConfig);
  io.out(`chat template  ${describeChatFormat(chat)}\n`);
  const eos = generationEosIds(extras.generationConfig, path.join(target, 'generation_config.json'));
  if (eos.length) io.out(`eos ids        ${eos.join(', ')} (generation_config.json)\n`);
  const shards = shardsOf(target);
  if (shards.length > 1) io.out(`weights        ${shards.length} shards (model.safetensors.index.json)\n`);
  io.out('\n');
  const t = tensorTable(shards, io);
  io.out(`\n${t.count} tensors, ${t.numel} elements, ${t.bytes} bytes (${humanBytes(t.bytes)}) in total\n`);
  if (t.numel !== params) {
    io.err(`warning: the tensors hold ${t.numel} elements but the config implies ${params} parameters\n`);
  }
}

/** A LoRA adapter folder (PEFT's layout): its settings, its base and whether that is here, its tensors. Reads no weights. */
function inspectAdapter(dir: string, io: Io): void {
  const h = readAdapterHeader(dir);
  const sp = h.spec;
  io.out(`adapter        ${dir} (PEFT LoRA)\n`);
  io.out(`lora           rank ${sp.rank}, alpha ${sp.alpha} (scale ${+(sp.alpha / sp.rank).toFixed(6)}) on ${sp.targets.join(', ')}\n`);
  let baseDir: string | null = null;
  try { baseDir = resolveBaseDir(h); } catch { /* reported below */ }
  const named = h.base?.path ?? h.baseName ?? 'nothing';
  io.out(`base           ${named}${baseDir ? (baseDir !== named ? ` (found at ${baseDir})` : '') : ' (not found here: pass --base <dir> to eval, generate and export --merge)'}\n`);
  if (h.base) {
    const shape = h.base.shape;
    io.out(`base shape     ${String(shape.architecture)} ${String(shape.num_hidden_layers)}L × ${String(shape.hidden_size)}, vocab ${String(shape.vocab_size)}; weights sha256 ${h.base.weights_sha256.slice(0, 16)}\n`);
  } else {
    io.out('base shape     not recorded (an adapter not written by distillery: the base is checked by tensor shapes only)\n');
  }
  const file = path.join(dir, ADAPTER_WEIGHTS);
  if (!fs.existsSync(file)) { io.out(`weights        missing (${ADAPTER_WEIGHTS})\n`); return; }
  io.out('\n');
  const t = tensorTable([{ file, tensors: readSafetensorsHeader(file).tensors }], io);
  io.out(`\n${t.count} tensors, ${t.numel} elements (${humanCount(t.numel)} trainable parameters), ${t.bytes} bytes (${humanBytes(t.bytes)})\n`);
}

/** A teacher cache folder (distillery teacher-cache): what it is of, its representation and its size per token. */
function inspectCache(dir: string, io: Io): void {
  const m = readManifest(dir)!;
  const pos = m.shards.reduce((a, s) => a + s.positions, 0), bytes = m.shards.reduce((a, s) => a + s.bytes, 0);
  const written = m.shards.reduce((a, s) => a + s.windows, 0);
  const packing = packingOfDescription(m.packing);
  const lines = [
    `teacher cache  ${dir} (${m.complete ? 'complete' : `incomplete: ${written} of ${m.windows} windows; rerun its teacher-cache command to finish`})`,
    `sparse         ${m.sparse} at temperature ${m.temperature} (${m.sparse.startsWith('sample') ? 'unbiased: draws from the teacher' : 'top-K and the rest\'s mass: biased'}), sampling seed ${m.sample_seed}`,
    `size           ${bytes} bytes (${humanBytes(bytes)}) in ${m.shards.length} shards; ${pos} positions, ${pos ? (bytes / pos).toFixed(1) : '?'} bytes per token`,
    `teacher        ${m.teacher.architecture} ${humanCount(m.teacher.parameters)} parameters, vocab ${m.teacher.vocab_size}, weights sha256 ${m.teacher.weights_sha256.slice(0, 16)} (${m.teacher.path}), ${m.precision}${m.teacher_dtype === 'nf4' ? ', projection matrices in nf4' : ''}`,
    `tokenizer      identity ${m.tokenizer_sha256.slice(0, 16)}; loss over ${m.loss_vocab} tokens`,
    `data           ${m.data.files.join(', ')}: ${m.data.documents} documents, ${m.data.tokens} tokens (${m.data.loss_tokens} counted, --loss-on ${m.data.loss_on}), sha256 ${m.data.sha256.slice(0, 16)}${m.data.max_chars ? `, --max-chars ${m.data.max_chars}` : ''}`,
    `windows        ${m.windows} of --seq ${m.seq}, --packing ${packing ?? `? (${m.packing})`} (distill with --seq ${m.seq} --temperature ${m.temperature}${packing ? ` --packing ${packing}` : ''}${m.data.chat_template_kwargs ? ` --chat-template-kwargs '${m.data.chat_template_kwargs}'` : ''})`,
  ];
  for (const l of lines) io.out(l + '\n');
}

const help = (): string => formatHelp({
  usage: 'distillery inspect <dir | hub id | file.safetensors | teacher cache dir>',
  description: 'Shows a checkpoint: config summary, parameter count, tokenizer, and each tensor\'s name, dtype and shape (read from the safetensors header, no full load), with the total bytes. ' +
    'A teacher cache folder: what it is of, its representation, its size and bytes per token.',
  flags: FLAGS,
  examples: ['distillery inspect runs/demo/teacher/final', 'distillery inspect model.safetensors'],
});

export const inspectCommand: Command = {
  name: 'inspect',
  summary: 'show a checkpoint\'s config, parameter count and tensors',
  help,
  async run(argv, io) {
    const parsed = parseArgs(argv, FLAGS, 'inspect');
    if (parsed.help) { io.out(help()); return 0; }
    if (parsed.positionals.length !== 1) {
      throw new UsageError(parsed.positionals.length === 0 ? 'inspect: no checkpoint given' : `inspect: expected one path, got ${parsed.positionals.length}`,
        'usage: distillery inspect <dir | file.safetensors>');
    }
    inspect(parsed.positionals[0]!, io);
    return 0;
  },
};
