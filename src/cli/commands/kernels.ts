/**
 * `distillery kernels plan|warm|list|audit`: the CUDA kernel cache tools. This file is only the dispatcher and
 * the help text; the work is `kernelsCommand(sub, args)` from src/backend/cuda/cli.ts, imported at run time so
 * that a build without the CUDA tools still runs and says so. `args` holds the flags in camelCase
 * (`--cache-dir` → cacheDir), converted to their types.
 */
import { didYouMean, formatHelp, kebabToCamel, parseArgs, UsageError, type FlagSpec } from '../args.js';
import type { Command, Deps } from '../command.js';
import { importOptional } from '../optional-import.js';
import { resolveModelArg } from '../model-ref.js';

export const SUBCOMMANDS: Readonly<Record<string, string>> = {
  plan: 'list the kernels a run with these settings would launch (no GPU needed)',
  warm: 'compile those kernels into the cache ahead of time (pre-warm)',
  list: 'list the kernels in the cache',
  audit: 'run the real step, evaluation and generation code at other shapes on a tracing backend; fail if it launches a kernel the plan lacks',
};

const FLAGS: FlagSpec[] = [
  { name: 'model', kind: 'string', metavar: '<preset|config.json|dir|hub id>', description: 'student architecture or checkpoint folder the kernels are for' },
  { name: 'teacher', kind: 'string', metavar: '<preset|config.json|dir|hub id>', description: 'teacher architecture or checkpoint (distillation kernels)' },
  { name: 'batch', kind: 'integer', description: 'micro-batch size' },
  { name: 'seq', kind: 'integer', description: 'sequence length' },
  { name: 'loss', kind: 'string', choices: ['none', 'kl', 'reverse-kl', 'jsd'], description: 'loss kind (none = plain training)' },
  { name: 'alpha', kind: 'number', description: 'distillation weight (a kernel argument: the plan is the same for every value)' },
  { name: 'temperature', kind: 'number', description: 'distillation temperature (a kernel argument: the plan is the same for every value)' },
  { name: 'beta', kind: 'number', description: 'JSD mixture weight (a kernel argument: the plan is the same for every value)' },
  { name: 'beta1', kind: 'number', description: 'AdamW beta1 (a kernel argument: the plan is the same for every value)' },
  { name: 'beta2', kind: 'number', description: 'AdamW beta2 (a kernel argument: the plan is the same for every value)' },
  { name: 'adam-eps', kind: 'number', description: 'AdamW epsilon (a kernel argument: the plan is the same for every value)' },
  { name: 'vocab-size', kind: 'integer', description: 'vocabulary size (for presets)' },
  { name: 'arch', kind: 'string', metavar: '<sm_XX>', description: 'GPU architecture for keys and compiles (warm: default the GPU\'s; plan: sm_90)' },
  { name: 'cache-dir', kind: 'string', metavar: '<dir>', description: 'kernel cache folder (default: the CUDA backend\'s)' },
  { name: 'kernel-cache-dir', kind: 'string', metavar: '<dir>', description: 'same as --cache-dir (the name train, distill, eval and generate use)' },
  { name: 'precision', kind: 'string', choices: ['auto', 'bf16', 'tf32', 'fp32'], description: 'plan for a run with this --precision (auto = bf16, as a CUDA run)' },
  { name: 'tf32', kind: 'boolean', description: 'plan for a run with --tf32 (= --precision tf32: its attention forward runs on TF32 tensor cores: attention_fwd_mma)' },
  { name: 'json', kind: 'boolean', description: 'machine-readable output' },
  { name: 'verbose', kind: 'boolean', description: 'one line per kernel' },
];

const CUDA_CLI = '../../backend/cuda/cli.js';

/** Loads kernelsCommand from the CUDA tools, or null when this build has none. */
export async function loadKernelsCommand(): Promise<Deps['kernelsCommand']> {
  const mod = await importOptional(new URL(CUDA_CLI, import.meta.url));
  const fn = mod?.kernelsCommand;
  return typeof fn === 'function' ? (fn as NonNullable<Deps['kernelsCommand']>) : null;
}

const help = (): string => formatHelp({
  usage: 'distillery kernels <plan|warm|list|audit> [options]',
  description: 'Tools for the CUDA kernel cache (generated kernels, compiled with NVRTC and cached on disk).',
  flags: FLAGS,
  notes: ['subcommands:\n' + Object.entries(SUBCOMMANDS).map(([k, v]) => `  ${k.padEnd(7)}${v}`).join('\n')],
  examples: ['distillery kernels plan --model qwen2.5-0.5b --batch 8 --seq 512', 'distillery kernels warm --model tiny --teacher small --loss kl --arch sm_90', 'distillery kernels audit'],
});

export const kernelsCommand: Command = {
  name: 'kernels',
  summary: 'CUDA kernel cache tools: plan, warm, list, audit',
  help,
  async run(argv, io, deps) {
    const parsed = parseArgs(argv, FLAGS, 'kernels');
    if (parsed.help || parsed.positionals.length === 0) {
      if (parsed.help) { io.out(help()); return 0; }
      throw new UsageError('kernels: no subcommand given', `use one of: ${Object.keys(SUBCOMMANDS).join(', ')} (see 'distillery kernels --help')`);
    }
    const [sub, ...rest] = parsed.positionals as [string, ...string[]];
    if (!(sub in SUBCOMMANDS)) {
      throw new UsageError(`kernels: unknown subcommand '${sub}'`, didYouMean(sub, Object.keys(SUBCOMMANDS), `use one of: ${Object.keys(SUBCOMMANDS).join(', ')}`, (s) => `'kernels ${s}'`));
    }
    if (rest.length) throw new UsageError(`kernels ${sub}: unexpected argument '${rest[0]}'`, `run 'distillery kernels --help' to list the options`);
    const fn = deps.kernelsCommand !== undefined ? deps.kernelsCommand : await loadKernelsCommand();
    if (!fn) {
      io.err('error: the CUDA kernel tools are not available in this build (src/backend/cuda/cli.ts is missing)\n');
      io.err('  hint: use a build with the CUDA backend; training and generation on the CPU need no kernels\n');
      return 1;
    }
    const args: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(parsed.values)) args[kebabToCamel(k)] = v;
    // A Hub id (Qwen/Qwen2.5-0.5B) names its snapshot folder in the local Hugging Face cache.
    for (const k of ['model', 'teacher'] as const) if (typeof args[k] === 'string') args[k] = resolveModelArg(args[k], `--${k}`);
    if (args.kernelCacheDir !== undefined) {
      if (args.cacheDir !== undefined && args.cacheDir !== args.kernelCacheDir) {
        throw new UsageError('kernels: --cache-dir and --kernel-cache-dir name different folders', 'pass only one of them');
      }
      args.cacheDir = args.kernelCacheDir;
      delete args.kernelCacheDir;
    }
    return fn(sub, args);
  },
};
