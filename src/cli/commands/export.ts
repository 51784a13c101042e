/**
 * `distillery export`:
 *   --onnx <model dir>              adds an ONNX graph to a checkpoint folder (onnx/model.onnx, plus onnx/model.onnx_data
 *                                   for external weights), the layout transformers.js loads with
 *                                   AutoModelForCausalLM.from_pretrained. The checkpoint itself is not changed, apart
 *                                   from `transformers.js_config` in config.json and a generation_config.json when there
 *                                   is none. See src/export/onnx.ts.
 *   --merge <adapter dir> --out D   writes a full Hugging Face model folder of a LoRA adapter merged into its base,
 *                                   W + (alpha / r)·B·A (what PEFT's merge_and_unload computes), with the tokenizer and
 *                                   chat files: a model transformers and transformers.js load without PEFT.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { formatHelp, parseArgs, UsageError, type FlagSpec } from '../args.js';
import type { Command } from '../command.js';
import { readCheckpoint, writeCheckpoint } from '../../model/checkpoint.js';
import { flatWeights } from '../../model/params.js';
import { describeMerge, isAdapterDir, readModelOrAdapter } from '../../model/adapter.js';
import { exportOnnx } from '../../export/onnx.js';
import { humanBytes } from './inspect.js';
import { checkOutDir } from '../options.js';
import { realFs } from './train.js';
import { DistilleryError, InputError, fileError } from '../../util/errors.js';

const FLAGS: FlagSpec[] = [
  { name: 'onnx', kind: 'boolean', description: 'write onnx/model.onnx for transformers.js / onnxruntime into the model folder' },
  { name: 'merge', kind: 'boolean', description: 'merge a LoRA adapter folder into its base and write a full model folder to --out' },
  { name: 'out', kind: 'string', metavar: '<dir>', description: 'with --merge: the model folder to write (must not exist, or be empty)' },
  { name: 'base', kind: 'string', metavar: '<dir>', description: 'with --merge: the adapter\'s base model (default: the folder the adapter names)' },
  { name: 'dtype', kind: 'string', choices: ['f32', 'bf16'], defaultText: 'f32', description: 'with --merge: storage dtype of the merged weights' },
  {
    name: 'external-data', kind: 'string', choices: ['auto', 'yes', 'no'], defaultText: 'auto',
    description: 'with --onnx: weights in onnx/model.onnx_data instead of inside model.onnx (auto: above 1.75 GiB; the protobuf limit is 2 GiB)',
  },
];

const USAGE = 'distillery export --onnx <model dir>\n       distillery export --merge <adapter dir> --out <dir> [--base <dir>] [--dtype f32|bf16]';

const help = (): string => formatHelp({
  usage: USAGE,
  description: '--onnx exports a checkpoint folder (config.json + model.safetensors) to ONNX inside the same folder: onnx/model.onnx, '
    + 'float32, opset 17, with the inputs transformers.js feeds a causal LM (input_ids, attention_mask, position_ids, '
    + 'past_key_values.*) and outputs logits and present.*. Load it with AutoModelForCausalLM.from_pretrained(dir, { dtype: \'fp32\' }). '
    + '--merge writes a LoRA adapter folder (a --lora-rank run\'s final/, or PEFT\'s save_pretrained) merged into its base as a full model folder: '
    + 'W + (alpha / r)·B·A for every adapted projection, computed in float32; the base must be the one the adapter was trained on (its SHA-256 is checked).',
  flags: FLAGS,
  examples: ['distillery export --onnx runs/demo/student/final', 'distillery export --merge runs/lora/final --out runs/lora/merged'],
});

export const exportCommand: Command = {
  name: 'export',
  summary: 'export a checkpoint to ONNX (for transformers.js), or merge a LoRA adapter into a full model',
  help,
  async run(argv, io) {
    const parsed = parseArgs(argv, FLAGS, 'export');
    if (parsed.help) { io.out(help()); return 0; }
    const v = parsed.values;
    if (v.onnx === true && v.merge === true) throw new UsageError('export: choose one of --onnx and --merge', 'merge first (--merge ... --out D), then export D with --onnx');
    if (v.onnx !== true && v.merge !== true) throw new UsageError('export: choose a format (--onnx or --merge)', `usage: ${USAGE}`);
    if (parsed.positionals.length !== 1) {
      const what = v.merge === true ? 'adapter folder' : 'model folder';
      throw new UsageError(parsed.positionals.length === 0 ? `export: no ${what} given` : `export: expected one ${what}, got ${parsed.positionals.length}`,
        `usage: ${USAGE}`);
    }
    const dir = parsed.positionals[0]!;
    if (v.merge === true) {
      const out = v.out as string | undefined;
      if (!out) throw new UsageError('export --merge: no output folder given (--out)', 'pass --out <dir> for the merged model folder');
      if (v['external-data'] !== undefined) throw new UsageError('export --merge: --external-data belongs to --onnx', 'export the merged folder with --onnx afterwards');
      if (!fs.existsSync(dir) || !fs.statSync(dir).isDirectory()) throw new UsageError(`export --merge: ${dir} is not a folder`, 'pass a LoRA adapter folder');
      if (!isAdapterDir(dir)) throw new UsageError(`export --merge: ${dir} is not a LoRA adapter folder (no adapter_config.json)`, 'pass the final/ or checkpoints/best/ folder of a --lora-rank run, or a PEFT adapter folder');
      if (fs.existsSync(out) && (!fs.statSync(out).isDirectory() || fs.readdirSync(out).length > 0)) {
        throw new UsageError(`export --merge: --out ${out} already exists and is not an empty folder`, 'pass a new folder (nothing is overwritten)');
      }
      if (path.resolve(out) === path.resolve(dir)) throw new UsageError('export --merge: --out is the adapter folder', 'pass a new folder');
      checkOutDir(realFs, out, 'export --merge: --out'); // a path under a file, or in a folder this user may not write
      const ck = readModelOrAdapter(dir, { base: v.base as string | undefined });
      io.err(`${describeMerge(ck.adapter!)}\n`);
      writeCheckpoint(out, ck.config, ck.weights, {
        dtype: (v.dtype as 'f32' | 'bf16' | undefined) ?? 'f32', tokenizerJson: ck.tokenizerJson, tokenizerConfig: ck.tokenizerConfig,
        chatTemplate: ck.chatTemplate, generationConfig: ck.generationConfig,
      });
      io.out(`wrote ${out} (a full model: config.json, model.safetensors, tokenizer files)\n`);
      return 0;
    }
    if (v.out !== undefined || v.base !== undefined || v.dtype !== undefined) throw new UsageError('export --onnx: --out, --base and --dtype belong to --merge', 'export --onnx writes into the model folder');
    if (isAdapterDir(dir) && !fs.existsSync(path.join(dir, 'config.json'))) {
      throw new UsageError(`export --onnx: ${dir} is a LoRA adapter folder`, `merge it first: distillery export --merge ${dir} --out <dir>, then export that folder`);
    }
    const ext = (v['external-data'] as string | undefined) ?? 'auto';
    const { config, weights: all } = readCheckpoint(dir);
    const weights = flatWeights(all, 'export --onnx');
    let r: ReturnType<typeof exportOnnx>;
    try { r = exportOnnx(dir, config, weights, { externalData: ext === 'auto' ? 'auto' : ext === 'yes' }); } catch (e) {
      // the model folder may be read-only: the export writes into it (onnx/)
      const code = (e as NodeJS.ErrnoException).code;
      const f = fileError(e, `export --onnx: cannot write ${path.join(dir, 'onnx')}`, 'export from a copy of the model folder that you can write to');
      throw f instanceof DistilleryError && (code === 'EACCES' || code === 'EPERM' || code === 'EROFS') ? new InputError(f.message, f.hint) : f;
    }
    io.out(`wrote ${r.modelFile}${r.dataFile ? ` and ${r.dataFile}` : ''} (${humanBytes(r.bytes)})\n`);
    return 0;
  },
};
