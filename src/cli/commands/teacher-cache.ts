/**
 * `distillery teacher-cache`: runs the teacher once over the data and stores a sparse representation of its
 * next-token distribution (src/cache/build.ts), for `distill --teacher-cache` to train students without the teacher.
 * With --dry-run: the job's device memory, its kernel plan and the cache's size on disk (the data is tokenized for
 * the size; no weights are read).
 */
import * as fs from 'node:fs';
import { formatHelp, parseArgs, UsageError, type FlagSpec } from '../args.js';
import type { Command } from '../command.js';
import { cudaOptionsFromFlags, threadsProblem } from '../../backend/create.js';
import { DEFAULT_RUN_OPTIONS as D } from '../../train/options.js';
import { DEFAULT_SPARSE, formatSparse, parseSparse } from '../../cache/sparse.js';
import { DEFAULT_SHARD_WINDOWS, type CacheJobOptions } from '../../cache/build.js';
import { CUDA_FLAGS, PRECISION_FLAG } from './generate.js';
import { checkOutDir, parseTemplateKwargs } from '../options.js';
import { realFs } from './train.js';
import { resolveModelArg } from '../model-ref.js';
import { gpusOf, launchGpus } from '../gpus.js';
import type { PrecisionFlag } from '../../train/precision.js';
import { PACKINGS, type PackingChoice } from '../../data/index.js';

const FLAGS: FlagSpec[] = [
  { name: 'teacher', kind: 'string', metavar: '<dir|hub id>', description: 'teacher checkpoint folder (or Hub id in the local HF cache) (required)' },
  { name: 'data', kind: 'list', metavar: '<file>...', description: "the data distill will train on: text/.jsonl files or folders, or 'builtin:docs' (required; repeatable)" },
  { name: 'out', kind: 'string', metavar: '<dir>', description: 'the cache folder: manifest.json, shards, the teacher\'s config and tokenizer (required)' },
  { name: 'sparse', kind: 'string', metavar: 'sample:N|top:K', description: 'what is kept per position: N draws from the teacher (unbiased) or its K most likely tokens and the rest\'s mass', defaultText: formatSparse(DEFAULT_SPARSE) },
  { name: 'temperature', kind: 'number', description: 'the distribution\'s temperature (distill --temperature must match)', defaultText: String(D.temperature) },
  { name: 'seq', kind: 'integer', description: 'tokens per window (distill --seq must match)', defaultText: String(D.seq) },
  { name: 'batch', kind: 'integer', description: 'windows per teacher forward', defaultText: String(D.batch) },
  { name: 'seed', kind: 'integer', description: 'seed of the sample draws (and of the split distill uses by default)', defaultText: String(D.seed) },
  { name: 'val-fraction', kind: 'number', description: 'the validation share distill will use (recorded; every window is cached)', defaultText: String(D.valFraction) },
  { name: 'max-chars', kind: 'integer', description: 'cap on characters read from the data (0 = no cap)', defaultText: '0' },
  { name: 'loss-on', kind: 'string', choices: ['assistant', 'all'], description: 'chat data: the positions the loss counts (only those are cached)', defaultText: 'assistant' },
  { name: 'packing', kind: 'string', choices: ['auto', ...PACKINGS], description: 'how documents fill the windows, as distill\'s --packing (bfd: each whole; wrapped: joined and cut; none: one document a window; auto: bfd when the data has conversations)', defaultText: 'auto' },
  { name: 'chat-template-kwargs', kind: 'string', metavar: '<json>', description: 'chat template options, a JSON object, e.g. \'{"enable_thinking": false}\'' },
  { name: 'shard-windows', kind: 'integer', description: 'windows per shard file (a killed job loses at most one shard)', defaultText: String(DEFAULT_SHARD_WINDOWS) },
  { name: 'device', kind: 'string', choices: ['cpu', 'cuda'], description: 'where the teacher runs', defaultText: 'cpu' },
  { name: 'threads', kind: 'integer', description: 'CPU threads (0 = all cores)', defaultText: '0' },
  { name: 'overwrite', kind: 'boolean', description: 'replace a cache of other settings in --out' },
  { name: 'quiet', kind: 'boolean', description: 'no progress output' },
  { name: 'dry-run', kind: 'boolean', description: 'plan the job: device memory, kernel plan, the cache\'s size on disk (tokenizes the data; reads no weights)' },
  { name: 'json', kind: 'boolean', description: 'print the summary (or the dry run) as one JSON object' },
  { name: 'gpus', kind: 'integer', description: 'N processes, one per GPU (--device cuda; with --device cpu, N CPU processes), sharing the shards; across hosts, start one process per GPU with torchrun\'s variables instead', defaultText: '1' },
  { name: 'teacher-dtype', kind: 'string', choices: ['auto', 'nf4'], description: 'storage of the teacher\'s projection matrices: the compute dtype, or nf4 (4 bits, QLoRA\'s format; recorded in the manifest)', defaultText: 'auto' },
  PRECISION_FLAG,
  ...CUDA_FLAGS,
];

/** Validates parsed flags into CacheJobOptions. */
export function cacheJobOptions(v: Record<string, unknown>): CacheJobOptions {
  if (typeof v.teacher !== 'string') throw new UsageError('teacher-cache: no teacher given (--teacher)', 'pass --teacher <checkpoint folder>');
  const data = v.data as string[] | undefined;
  if (!data?.length) throw new UsageError('teacher-cache: no data given (--data)', 'pass the data distill will train on: --data <file> (repeatable) or --data builtin:docs');
  if (typeof v.out !== 'string' || v.out === '') throw new UsageError('teacher-cache: no cache folder given (--out)', 'pass --out <dir>, e.g. --out caches/teacher-t2');
  checkOutDir(realFs, v.out, '--out');
  if (data.includes('builtin:docs') && data.length > 1) throw new UsageError("--data: 'builtin:docs' cannot be combined with other data files", 'use either --data builtin:docs or your own files');
  for (const d of data) {
    if (d !== 'builtin:docs' && !fs.existsSync(d)) throw new UsageError(`--data: data file ${d} does not exist`, 'check the path (relative paths are relative to the current folder)');
  }
  const int = (name: string, dflt: number, min: number): number => {
    const x = v[name] === undefined ? dflt : v[name] as number;
    if (!(Number.isInteger(x) && x >= min)) throw new UsageError(`--${name} must be an integer >= ${min}, got ${x}`, `e.g. --${name} ${dflt}`);
    return x;
  };
  const temperature = v.temperature === undefined ? D.temperature : v.temperature as number;
  if (!(temperature > 0)) throw new UsageError(`--temperature must be > 0, got ${temperature}`, `e.g. --temperature ${D.temperature}`);
  const valFraction = v['val-fraction'] === undefined ? D.valFraction : v['val-fraction'] as number;
  if (!(valFraction >= 0 && valFraction < 1)) throw new UsageError(`--val-fraction must be >= 0 and < 1, got ${valFraction}`, `e.g. --val-fraction ${D.valFraction}`);
  const threads = v.threads === undefined ? 0 : v.threads as number;
  const bad = threadsProblem(threads);
  if (bad !== null) throw new UsageError(`--threads must be ${bad}, got ${threads}`, 'use 0 for all cores');
  const kwargs = v['chat-template-kwargs'] as string | undefined;
  if (kwargs !== undefined) parseTemplateKwargs(kwargs);
  const seed = v.seed === undefined ? D.seed : v.seed as number;
  if (!Number.isInteger(seed)) throw new UsageError(`--seed must be an integer, got ${seed}`, `e.g. --seed ${D.seed}`);
  return {
    teacher: resolveModelArg(v.teacher, '--teacher'), data, out: v.out, seq: int('seq', D.seq, 1), batch: int('batch', D.batch, 1),
    sparse: v.sparse === undefined ? DEFAULT_SPARSE : parseSparse(v.sparse as string), temperature, seed, valFraction,
    lossOn: (v['loss-on'] as 'assistant' | 'all' | undefined) ?? 'assistant', packing: (v.packing as PackingChoice | undefined) ?? 'auto', chatTemplateKwargs: kwargs, maxChars: int('max-chars', 0, 0),
    device: (v.device as 'cpu' | 'cuda' | undefined) ?? 'cpu', precision: (v.precision as PrecisionFlag | undefined) ?? 'auto', threads,
    ...(v['teacher-dtype'] === 'nf4' ? { teacherDtype: 'nf4' as const } : {}),
    shardWindows: int('shard-windows', DEFAULT_SHARD_WINDOWS, 1), overwrite: v.overwrite === true, quiet: v.quiet === true,
  };
}

const help = (): string => formatHelp({
  usage: 'distillery teacher-cache --teacher <dir> --data <file>... --out <dir> [options]',
  description: 'Runs the teacher once over the data (tokenized, packed and split as distill does) and stores a sparse ' +
    'representation of its next-token distribution at every counted position. `distillery distill --teacher-cache <dir>` ' +
    'then trains students without the teacher. Rerunning the same command continues an interrupted cache.',
  flags: FLAGS,
  notes: [
    `sample:N (the default, N = ${DEFAULT_SPARSE.kind === 'sample' ? DEFAULT_SPARSE.n : 0}) keeps N draws from the teacher: the distillation loss computed from them is an unbiased ` +
      'estimate of the full one. top:K keeps the K most likely tokens and the mass of the rest (what other tools store; biased).',
    'The log, the summary and `distillery inspect <dir>` give the cache\'s bytes per token. Full reference: docs/cli.md.',
  ],
  examples: [
    'distillery teacher-cache --teacher runs/teacher/final --data corpus.txt --seq 256 --out caches/t2',
    'distillery distill --teacher-cache caches/t2 --data corpus.txt --seq 256 --out runs/student --model tiny',
  ],
});

export const teacherCacheCommand: Command = {
  name: 'teacher-cache',
  summary: 'run a teacher once and store its sparse next-token distributions for distill --teacher-cache',
  help,
  async run(argv, io): Promise<number> {
    const parsed = parseArgs(argv, FLAGS, 'teacher-cache');
    if (parsed.help) { io.out(help()); return 0; }
    if (parsed.positionals.length) throw new UsageError(`teacher-cache: unexpected argument '${parsed.positionals[0]}'`, "run 'distillery teacher-cache --help' to list the options");
    const o = cacheJobOptions(parsed.values);
    const json = parsed.values.json === true;
    const gpus = gpusOf(parsed.values);
    if (gpus > 1 && parsed.values['dry-run'] !== true) return launchGpus('teacher-cache', argv, gpus, io);
    if (parsed.values['dry-run'] === true) {
      const { cacheDryRun, formatCacheDryRun } = await import('../../cache/dry-run.js');
      const r = await cacheDryRun(o, { tf32: parsed.values.tf32 === true, world: gpus > 1 ? gpus : Number(process.env.WORLD_SIZE ?? 1) || 1 });
      io.out(json ? JSON.stringify(r) + '\n' : formatCacheDryRun(r) + '\n');
      return 0;
    }
    const { buildTeacherCache } = await import('../../cache/build.js');
    const s = await buildTeacherCache(o, { log: (l) => io.err(`${l}\n`), backendOptions: cudaOptionsFromFlags(parsed.values) });
    // under a launcher (torchrun) every rank runs this: rank 0 speaks for the job
    if (json && (process.env.RANK ?? '0') === '0') io.out(JSON.stringify(s) + '\n');
    if (s.signal === 'SIGINT') return 130;
    if (s.signal === 'SIGTERM') return 143;
    return 0;
  },
};
