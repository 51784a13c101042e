/**
 * `distillery teacher-cache ... --dry-run`: what a cache job would need and make, from the same code the job runs:
 * the teacher's config and tokenizer (no weights), the data tokenized and packed as the job packs it (for the number of
 * windows and counted positions), the device memory of the teacher's forward and head (estimateJobBytes), the kernel
 * plan (planKernels over the job's own closure, `cacheTeacher`), and the cache's size on disk: the exact worst case of
 * the encoding (src/cache/format.ts) per counted position.
 */
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { readHfConfigFile, parameterCount } from '../model/config.js';
import { estimateJobBytes, formatGiB } from '../model/memory.js';
import { Tokenizer } from '../tokenizer/bpe.js';
import { lossVocabulary } from '../tokenizer/identity.js';
import { chatFormatOf, DEFAULT_CHAT_FORMAT } from '../tokenizer/chat.js';
import { readModelDirExtras } from '../io/checkpoint-dir.js';
import { packForJob } from '../data/index.js';
import { DistilleryError } from '../util/errors.js';
import { jobClosures } from '../train/kernel-plan.js';
import { resolvePrecision } from '../train/precision.js';
import { readData } from '../train/run-data.js';
import type { DryRunKernel } from '../train/dry-run.js';
import { LOGQ_BITS, recordLayout, type RecordLayout } from './format.js';
import { formatSparse } from './sparse.js';
import type { CacheJobOptions } from './build.js';

export interface CacheDryRun {
  job: 'teacher-cache';
  device: 'cpu' | 'cuda';
  precision: string;
  teacher: { architecture: string; parameters: number; vocab_size: number };
  sparse: string;
  temperature: number;
  seq: number;
  batch: number;
  windows: number;
  /** Positions the loss counts: the only ones cached. */
  counted_positions: number;
  /** The encoding's largest record per position, and the cache's largest size on disk (shard headers included). */
  max_bytes_per_token: number;
  max_disk_bytes: number;
  /** Per process (each rank holds its own teacher). */
  device_bytes: number;
  device_gib: string;
  kernels: DryRunKernel[];
  /** Processes of the job (--gpus N, or WORLD_SIZE), the shard files, and the most shards one rank computes. */
  ranks: number;
  shards: number;
  shards_per_rank: number;
}

/** The largest record of one position, in bits (see src/cache/format.ts). */
export function maxBitsPerPosition(l: RecordLayout): number {
  if (l.rep.kind === 'sample') return l.countBits + l.idBits + l.rep.n * (l.idBits + LOGQ_BITS);
  return Math.min(l.rep.k, l.vocab) * (l.idBits + LOGQ_BITS) + (l.hasTail ? LOGQ_BITS : 0);
}

export async function cacheDryRun(o: CacheJobOptions, opts: { tf32?: boolean; world?: number } = {}): Promise<CacheDryRun> {
  const config = readHfConfigFile(path.join(o.teacher, 'config.json'), 'point --teacher at a model folder with a config.json');
  const tokFile = path.join(o.teacher, 'tokenizer.json');
  if (!fs.existsSync(tokFile)) throw new DistilleryError(`the teacher folder ${o.teacher} has no tokenizer.json`, 'copy the teacher\'s tokenizer.json into it');
  const tokenizer = Tokenizer.fromFile(tokFile);
  const x = readModelDirExtras(o.teacher, { tokenizerJson: false });
  const chat = x.chatTemplate || x.tokenizerConfig ? chatFormatOf(x.chatTemplate ?? null, `the teacher ${o.teacher}`, x.tokenizerConfig ?? null) : DEFAULT_CHAT_FORMAT;
  const docs = readData(o, () => undefined, chat);
  const { packed } = packForJob(tokenizer, docs, chat, { ...o, tokenizerOf: `the teacher ${o.teacher}` }, () => undefined);
  const { lossVocab } = lossVocabulary(tokenizer.vocabSize, [{ name: 'teacher', vocabSize: config.vocabSize }]);
  const prec = resolvePrecision(o.precision, opts.tf32, o.device);
  const lay = recordLayout(o.sparse, lossVocab);
  const perPos = maxBitsPerPosition(lay) / 8;
  const windows = packed.windows.length, shards = Math.ceil(windows / o.shardWindows), world = Math.max(1, opts.world ?? 1);
  const maxDisk = Math.ceil(packed.targetTokens * perPos) + windows * 9 + shards * 16;
  const bytes = estimateJobBytes({ student: config, batch: o.batch, seq: o.seq, training: false, lossVocab, precision: prec.model, studentFrozen: o.teacherDtype,
    documents: packed.windows[0]?.positions !== undefined });
  let kernels: DryRunKernel[] = [];
  if (o.device === 'cuda') {
    const { planKernels } = await import('../backend/cuda/plan.js');
    const { attentionFor } = await import('../backend/cuda/attention-plan.js');
    kernels = planKernels(jobClosures({ student: config, teacher: config, batch: o.batch, seq: o.seq, lossVocab, precision: prec.model, cacheTeacher: o.sparse, teacherFrozen: o.teacherDtype }),
      { attention: attentionFor(prec.tf32) }).map((s) => ({
      family: s.family, params: { ...s.params }, source_sha256: createHash('sha256').update(s.source()).digest('hex'),
    }));
  }
  return {
    job: 'teacher-cache', device: o.device, precision: prec.name,
    teacher: { architecture: config.architecture, parameters: parameterCount(config), vocab_size: config.vocabSize },
    sparse: formatSparse(o.sparse), temperature: o.temperature, seq: o.seq, batch: o.batch, windows, counted_positions: packed.targetTokens,
    max_bytes_per_token: +perPos.toFixed(2), max_disk_bytes: maxDisk, device_bytes: bytes, device_gib: formatGiB(bytes), kernels,
    ranks: world, shards, shards_per_rank: Math.ceil(shards / world),
  };
}

export function formatCacheDryRun(r: CacheDryRun): string {
  return [
    `dry run: teacher-cache on ${r.device} (${r.precision}), batch ${r.batch} × seq ${r.seq}, ${r.sparse} at temperature ${r.temperature}`,
    `teacher   ${r.teacher.architecture} ${(r.teacher.parameters / 1e6).toFixed(1)}M parameters, vocab ${r.teacher.vocab_size}`,
    `data      ${r.windows} windows, ${r.counted_positions} counted positions (the ones cached), ${r.shards} shards` +
      (r.ranks > 1 ? `: ${r.ranks} ranks, at most ${r.shards_per_rank} each` : ''),
    `disk      at most ${(r.max_disk_bytes / 2 ** 20).toFixed(2)} MiB (${r.max_bytes_per_token} bytes per position at most; real text repeats draws, so less)`,
    `memory    ${r.device_gib} estimated peak (${r.device_bytes} bytes)${r.device === 'cuda' ? ' on the GPU' : ''}${r.ranks > 1 ? ' per process' : ''}`,
    r.device === 'cuda' ? `kernels   ${r.kernels.length} to pre-warm: ${[...new Set(r.kernels.map((k) => k.family))].join(', ')}` : 'kernels   none (the CPU backend compiles nothing)',
  ].join('\n');
}
