/**
 * `distillery train|distill ... --dry-run`: what a job would need, without running it — from the checkpoints'
 * config.json and tokenizer.json alone (no weights are read, no data is tokenized, no GPU is touched). A user learns
 * whether a job fits before loading gigabytes of weights.
 *
 * The report comes from the same code the run uses: the student config from studentConfig(), the job from
 * runJobShape(), the device memory from estimateJobBytes() (what Transformer, AdamW and StepRunner allocate), and,
 * for --device cuda, the kernel plan from planKernels(jobClosures(job)) on the tracing backend with the attention the
 * run's backend would pick (attentionFor(--tf32)): the pre-warm set.
 */
import { checkGenerationRoom } from './run-generation.js';
import { resolvePrecision } from './precision.js';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { oProjBias, readHfConfigFile, parameterCount, type ModelConfig } from '../model/config.js';
import { estimateJobBytes, formatGiB } from '../model/memory.js';
import { Tokenizer } from '../tokenizer/bpe.js';
import { DistilleryError } from '../util/errors.js';
import { defaultChunkFloats, headRows, headWidth } from './head.js';
import { jobClosures, runJobShape } from './kernel-plan.js';
import type { RunOptions } from './options.js';
import { runLossVocab, studentConfig } from './run-models.js';
import { readManifest, TEACHER_DIR } from '../cache/store.js';
import { parseSparse, sparseSlots } from '../cache/sparse.js';

export interface DryRunKernel { family: string; params: Record<string, string | number | boolean>; source_sha256: string }

export interface DryRunReport {
  mode: 'train' | 'distill';
  device: 'cpu' | 'cuda';
  /** What the run would store and multiply in (--precision; auto = bf16 on cuda, fp32 on cpu). */
  precision: 'bf16' | 'tf32' | 'fp32';
  batch: number;
  seq: number;
  student: Record<string, unknown>;
  teacher: Record<string, unknown> | null;
  loss: string;
  /** Rows of logits computed at a time by the chunked LM head, and the vocabulary rows the loss runs over. */
  head_chunk_rows: number;
  /** The LM heads' logits dtype (--logits). */
  logits: 'f32' | 'bf16';
  loss_vocab: number;
  /** Data-parallel processes (--gpus): the estimate is per process. */
  world: number;
  /** Estimated peak memory of the job's allocations on the device (host memory for --device cpu), in bytes (per process). */
  device_bytes: number;
  device_gib: string;
  /**
   * Host memory the first process keeps for checkpoint snapshots from the start of the run: the float32 weights and
   * both AdamW moments of what trains (12 bytes per trainable parameter; src/train/checkpoint-writer.ts).
   */
  checkpoint_host_bytes: number;
  /** The pre-warm plan: every kernel the job launches (empty on the CPU, which compiles nothing). */
  kernels: DryRunKernel[];
  /** Distilling from a teacher cache: what it holds and its size on disk (no teacher in memory). */
  teacher_cache: { path: string; sparse: string; temperature: number; windows: number; bytes: number; bytes_per_token: number | null } | null;
  /** LoRA (--lora-rank): the adapters trained on the frozen --init model, null when every weight trains. */
  lora: { rank: number; alpha: number; targets: string[]; trainable_parameters: number } | null;
  /** Storage of the frozen weights' projection matrices: the teacher's and the LoRA base's ('auto': the compute dtype). */
  teacher_dtype: 'auto' | 'nf4';
  base_dtype: 'auto' | 'nf4';
}

/** Host bytes per trainable parameter a run keeps for its checkpoints: float32 weights, first and second moments. */
export const CHECKPOINT_HOST_BYTES_PER_PARAMETER = 12;

/** A model folder's config and tokenizer, without its weights. */
function readFolderHeader(dir: string, what: string): { config: ModelConfig; tokenizer: Tokenizer | null } {
  const config = readHfConfigFile(path.join(dir, 'config.json'), `point ${what} at a model folder with a config.json`);
  const tokFile = path.join(dir, 'tokenizer.json');
  return { config, tokenizer: fs.existsSync(tokFile) ? Tokenizer.fromFile(tokFile) : null };
}

function describeModel(c: ModelConfig): Record<string, unknown> {
  return {
    architecture: c.architecture, parameters: parameterCount(c), vocab_size: c.vocabSize, hidden_size: c.hiddenSize,
    intermediate_size: c.intermediateSize, layers: c.numLayers, heads: c.numHeads, kv_heads: c.numKvHeads, head_dim: c.headDim,
    rms_norm_eps: c.rmsNormEps, qkv_bias: c.qkvBias, o_bias: oProjBias(c), tied_embeddings: c.tieWordEmbeddings,
  };
}

/** Plans the job of `o` as described in the module comment. */
export async function dryRun(o: RunOptions, opts: { tf32?: boolean; world?: number } = {}): Promise<DryRunReport> {
  const manifest = o.mode === 'distill' && o.teacherCache ? readManifest(o.teacherCache) : null;
  if (o.mode === 'distill' && o.teacherCache && !manifest) {
    throw new DistilleryError(`--teacher-cache ${o.teacherCache}: no manifest.json there`, 'pass the --out folder of `distillery teacher-cache`');
  }
  const teacher = o.mode === 'distill' && o.teacher ? readFolderHeader(o.teacher, 'teacher')
    : manifest ? readFolderHeader(path.join(o.teacherCache!, TEACHER_DIR), 'the teacher cache\'s teacher') : null;
  if (o.mode === 'distill' && !teacher) throw new DistilleryError('distill needs a teacher', 'pass --teacher <checkpoint folder> or --teacher-cache <folder>');
  const cacheRep = manifest ? parseSparse(manifest.sparse) : undefined;
  // With a cache, the teacher decides the tokenizer and vocabulary but is not in memory.
  const inMemory = manifest ? null : teacher?.config ?? null;
  const init = o.init ? readFolderHeader(o.init, '--init') : null;
  // The tokenizer the run would use: --tokenizer, the teacher's, --init's; else one trained to --vocab-size.
  const tok = o.tokenizer ? Tokenizer.fromFile(o.tokenizer) : teacher?.tokenizer ?? init?.tokenizer ?? null;
  const cfg = studentConfig(o, tok ?? { vocabSize: o.vocabSize, eosId: undefined }, teacher, init);
  const { lossVocab: jobLossVocab } = runLossVocab(tok?.vocabSize ?? o.vocabSize, cfg, teacher?.config ?? null);
  const prec = resolvePrecision(o.precision, opts.tf32, o.device);
  // generation items in --eval-choices add a generator per model (the plan reads the items' kinds, not their prompts)
  // (refused where --seq leaves no room for them, as the run refuses it)
  const generateItems = checkGenerationRoom(o);
  const job = runJobShape(o, cfg, inMemory, jobLossVocab, prec.model, cacheRep, { generateItems });
  const n = o.batch * o.seq, lossVocab = job.lossVocab ?? cfg.vocabSize;
  const bytes = estimateJobBytes({ student: cfg, teacher: inMemory, batch: o.batch, seq: o.seq, training: true, lossVocab,
    precision: prec.model, teacherCacheSlots: cacheRep ? sparseSlots(cacheRep) : undefined, onPolicy: o.mode === 'distill' && (o.onPolicy ?? 0) > 0, lora: job.lora,
    teacherFrozen: job.teacherFrozen, studentFrozen: job.studentFrozen, world: opts.world, logits: job.logits,
    // (the plan reads no data, so --packing auto counts no document positions: 4 bytes a token and model at most)
    documents: o.packing === 'bfd', choices: job.choices, generateItems: job.generateItems, itemsBatch: job.itemsBatch });
  let kernels: DryRunKernel[] = [];
  if (o.device === 'cuda') {
    const { planKernels } = await import('../backend/cuda/plan.js');
    const { attentionFor } = await import('../backend/cuda/attention-plan.js');
    // The attention forward the run's backend would launch (createCudaBackend's rule), so the plan is its pre-warm.
    kernels = planKernels(jobClosures(job), { attention: attentionFor(prec.tf32) }).map((s) => ({
      family: s.family, params: { ...s.params }, source_sha256: createHash('sha256').update(s.source()).digest('hex'),
    }));
  }
  return {
    mode: o.mode, device: o.device, precision: prec.name, batch: o.batch, seq: o.seq, student: describeModel(cfg),
    teacher: teacher ? describeModel(teacher.config) : null, loss: job.loss?.kind ?? 'none',
    head_chunk_rows: headRows(n, headWidth(lossVocab, cfg.vocabSize, ...(inMemory ? [inMemory.vocabSize] : [])), inMemory !== null,
      defaultChunkFloats(Boolean(manifest), prec.model === 'bf16'), prec.model === 'bf16', job.logits), loss_vocab: lossVocab, logits: job.logits ?? 'f32',
    world: opts.world ?? 1, device_bytes: bytes, device_gib: formatGiB(bytes), kernels,
    checkpoint_host_bytes: CHECKPOINT_HOST_BYTES_PER_PARAMETER * (job.lora ? job.lora.total : parameterCount(cfg)),
    teacher_cache: manifest ? {
      path: path.resolve(o.teacherCache!), sparse: manifest.sparse, temperature: manifest.temperature, windows: manifest.windows,
      bytes: manifest.shards.reduce((a, x) => a + x.bytes, 0), bytes_per_token: manifest.bytes_per_token,
    } : null,
    teacher_dtype: job.teacherFrozen ?? 'auto', base_dtype: job.studentFrozen ?? 'auto',
    lora: job.lora ? { rank: job.lora.spec.rank, alpha: job.lora.spec.alpha, targets: [...job.lora.spec.targets], trainable_parameters: job.lora.total } : null,
  };
}

/** The human-readable form (without --json). */
export function formatDryRun(r: DryRunReport): string {
  const m = (x: Record<string, unknown>): string => `${x.architecture} ${(Number(x.parameters) / 1e6).toFixed(1)}M parameters, vocab ${String(x.vocab_size)}`;
  const lines = [
    `dry run: ${r.mode} on ${r.device} (${r.precision}), batch ${r.batch} × seq ${r.seq}, loss ${r.loss}`,
    `student   ${m(r.student)}`,
    ...(r.teacher ? [`teacher   ${m(r.teacher)}${r.teacher_dtype === 'nf4' ? ', projection matrices in nf4' : ''}`] : []),
    ...(r.teacher_cache ? [`cache     ${r.teacher_cache.path}: ${r.teacher_cache.sparse} at temperature ${r.teacher_cache.temperature}, ` +
      `${(r.teacher_cache.bytes / 2 ** 20).toFixed(2)} MiB on disk, ${r.teacher_cache.bytes_per_token ?? '?'} bytes per token (no teacher in memory)`] : []),
    ...(r.lora ? [`LoRA      rank ${r.lora.rank}, alpha ${r.lora.alpha} on ${r.lora.targets.join(', ')}: ${r.lora.trainable_parameters} trainable parameters (the base frozen${r.base_dtype === 'nf4' ? ', its matrices in nf4' : ''})`] : []),
    `memory    ${r.device_gib} estimated peak (${r.device_bytes} bytes)${r.device === 'cuda' ? ' on the GPU' : ''}${r.world > 1 ? ` per process of ${r.world} (the optimizer's moments sharded)` : ''}`,
    `host      ${formatGiB(r.checkpoint_host_bytes)} kept for checkpoint snapshots (weights and AdamW moments in float32)`,
    `LM head   ${r.head_chunk_rows} rows of ${r.logits} logits at a time over ${r.loss_vocab} vocabulary rows`,
    r.device === 'cuda' ? `kernels   ${r.kernels.length} to pre-warm: ${[...new Set(r.kernels.map((k) => k.family))].join(', ')}` : 'kernels   none (the CPU backend compiles nothing)',
  ];
  return lines.join('\n');
}
