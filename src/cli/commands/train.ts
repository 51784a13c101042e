/**
 * `distillery train` and `distillery distill`: flags and an optional --config file are validated into
 * RunOptions (options.ts), warnings about settings that have no effect go to stderr, then runTraining runs.
 */
import * as fs from 'node:fs';
import { formatHelp, parseArgs, UsageError, type FlagSpec } from '../args.js';
import type { Command, Deps } from '../command.js';
import { loadConfigFile } from '../config.js';
import { resolveRunOptions, runFlags, type FsProbe } from '../options.js';
import type { RunOptions } from '../../train/options.js';
import { CUDA_FLAG_NAMES, cudaOptionsFromFlags, type CudaOptions } from '../../backend/create.js';
import { CUDA_FLAGS } from './generate.js';
import { resolveHubModel } from '../../io/hf-cache.js';
import { gpusOf, launchGpus } from '../gpus.js';

export const realFs: FsProbe = {
  exists: (p) => fs.existsSync(p),
  isDirectory: (p) => { try { return fs.statSync(p).isDirectory(); } catch { return false; } },
  writable: (p) => { try { fs.accessSync(p, fs.constants.W_OK | fs.constants.X_OK); return true; } catch { return false; } },
  hubModel: (id) => resolveHubModel(id),
};

async function defaultRunTraining(opts: RunOptions, hooks: { log: (line: string) => void; backendOptions?: CudaOptions }): Promise<unknown> {
  const { runTraining } = await import('../../train/run.js');
  return runTraining(opts, hooks);
}

const LAUNCH_FLAGS: FlagSpec[] = [
  { name: 'gpus', kind: 'integer', description: 'data parallel on this host: N processes, one per GPU (--device cuda; with --device cpu, N CPU processes), each a batch of --batch per micro-step (default 1). Across hosts, start one process per GPU with torchrun\'s variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) instead', defaultText: '1' },
];

const DRY_RUN_FLAGS: FlagSpec[] = [
  { name: 'dry-run', kind: 'boolean', description: 'plan the job without running it: estimated peak device memory and the kernel plan, from the configs alone (no weights, no GPU)' },
  { name: 'json', kind: 'boolean', description: 'with --dry-run: print one JSON object' },
];

function makeRunCommand(mode: 'train' | 'distill'): Command {
  const flags = [...runFlags(mode), ...CUDA_FLAGS, ...LAUNCH_FLAGS, ...DRY_RUN_FLAGS];
  const summary = mode === 'train'
    ? 'train a model on text (next-token cross-entropy)'
    : 'distill a teacher checkpoint into a smaller student';
  const help = (): string => formatHelp({
    usage: `distillery ${mode} ${mode === 'distill' ? '--teacher <dir> ' : ''}--data <file>... --out <dir> [options]`,
    description: mode === 'train'
      ? 'Trains a model from random weights (or --init) with next-token cross-entropy.'
      : 'Trains a student against a teacher: loss = alpha * divergence(teacher, student) + (1 - alpha) * cross-entropy.',
    flags,
    notes: [
      'Settings come from the defaults, then --config (YAML or JSON; keys in camelCase or kebab-case), then the flags.',
      'Paths are relative to the current folder. Full reference: docs/cli.md.',
    ],
    examples: mode === 'train'
      ? ['distillery train --data corpus.txt --out runs/tiny --steps 500', 'distillery train --config run.yaml --lr 1e-3']
      : ['distillery distill --teacher runs/big/final --data corpus.txt --out runs/student --model tiny --loss jsd --beta 0.5'],
  });
  return {
    name: mode,
    summary,
    help,
    async run(argv: string[], io, deps: Deps): Promise<number> {
      const parsed = parseArgs(argv, flags, mode);
      if (parsed.help) { io.out(help()); return 0; }
      if (parsed.positionals.length) {
        throw new UsageError(`${mode}: unexpected argument '${parsed.positionals[0]}'`,
          parsed.positionals[0]!.includes('.') ? `data files go after --data: --data ${parsed.positionals.join(' ')}` : `run 'distillery ${mode} --help' to list the options`);
      }
      const configFile = parsed.values.config as string | undefined;
      const config = configFile !== undefined ? { file: configFile, values: loadConfigFile(configFile) } : undefined;
      const runValues = { ...parsed.values };
      for (const k of [...CUDA_FLAG_NAMES, 'dry-run', 'json', 'gpus']) delete runValues[k];
      const gpus = gpusOf(parsed.values);
      const { options, warnings } = resolveRunOptions({ mode, flags: runValues, config, fs: realFs });
      for (const w of warnings) io.err(`warning: ${w}\n`);
      if (parsed.values['dry-run'] === true) {
        const { dryRun, formatDryRun } = await import('../../train/dry-run.js');
        const report = await dryRun(options, { tf32: parsed.values.tf32 === true, world: gpus > 1 ? gpus : Number(process.env.WORLD_SIZE ?? 1) || 1 });
        io.out(parsed.values.json === true ? JSON.stringify(report) + '\n' : formatDryRun(report) + '\n');
        return 0;
      }
      // validated above: every rank would accept the same options; start them and wait
      if (gpus > 1) return launchGpus(mode, argv, gpus, io);
      if (parsed.values.json === true) throw new UsageError('--json goes with --dry-run', `add --dry-run, or drop --json (a run's results are in ${options.out}/summary.json)`);
      const hooks = { log: (line: string) => io.err(`${line}\n`), backendOptions: cudaOptionsFromFlags(parsed.values) };
      const result = await (deps.runTraining ?? defaultRunTraining)(options, hooks);
      // A run stopped by SIGINT / SIGTERM (after writing its checkpoint and summary) exits 128 + the signal number.
      const signal = (result as { signal?: unknown } | null | undefined)?.signal;
      if (signal === 'SIGINT') return 130;
      if (signal === 'SIGTERM') return 143;
      return 0;
    },
  };
}

export const trainCommand = makeRunCommand('train');
export const distillCommand = makeRunCommand('distill');
