/**
 * `distillery export --onnx <model dir>`: adds an ONNX graph to a checkpoint folder (onnx/model.onnx, plus
 * onnx/model.onnx_data for external weights), the layout transformers.js loads with
 * AutoModelForCausalLM.from_pretrained. The checkpoint itself is not changed, apart from
 * `transformers.js_config` in config.json and a generation_config.json when there is none. See src/export/onnx.ts.
 */
import { formatHelp, parseArgs, UsageError, type FlagSpec } from '../args.js';
import type { Command } from '../command.js';
import { readCheckpoint } from '../../model/checkpoint.js';
import { exportOnnx } from '../../export/onnx.js';
import { humanBytes } from './inspect.js';

const FLAGS: FlagSpec[] = [
  { name: 'onnx', kind: 'boolean', description: 'write onnx/model.onnx for transformers.js / onnxruntime (the only format so far)' },
  {
    name: 'external-data', kind: 'string', choices: ['auto', 'yes', 'no'], defaultText: 'auto',
    description: 'weights in onnx/model.onnx_data instead of inside model.onnx (auto: above 1.75 GiB; the protobuf limit is 2 GiB)',
  },
];

const USAGE = 'distillery export --onnx <model dir>';

const help = (): string => formatHelp({
  usage: USAGE,
  description: 'Exports a checkpoint folder (config.json + model.safetensors) to ONNX inside the same folder: onnx/model.onnx, '
    + 'float32, opset 17, with the inputs transformers.js feeds a causal LM (input_ids, attention_mask, position_ids, '
    + 'past_key_values.*) and outputs logits and present.*. Load it with AutoModelForCausalLM.from_pretrained(dir, { dtype: \'fp32\' }).',
  flags: FLAGS,
  examples: ['distillery export --onnx runs/demo/student/final'],
});

export const exportCommand: Command = {
  name: 'export',
  summary: 'export a checkpoint to ONNX (for transformers.js)',
  help,
  async run(argv, io) {
    const parsed = parseArgs(argv, FLAGS, 'export');
    if (parsed.help) { io.out(help()); return 0; }
    if (parsed.values.onnx !== true) throw new UsageError('export: choose a format', `usage: ${USAGE}`);
    if (parsed.positionals.length !== 1) {
      throw new UsageError(parsed.positionals.length === 0 ? 'export: no model folder given' : `export: expected one folder, got ${parsed.positionals.length}`,
        `usage: ${USAGE}`);
    }
    const dir = parsed.positionals[0]!;
    const ext = (parsed.values['external-data'] as string | undefined) ?? 'auto';
    const { config, weights } = readCheckpoint(dir);
    const r = exportOnnx(dir, config, weights, { externalData: ext === 'auto' ? 'auto' : ext === 'yes' });
    io.out(`wrote ${r.modelFile}${r.dataFile ? ` and ${r.dataFile}` : ''} (${humanBytes(r.bytes)})\n`);
    return 0;
  },
};
