/**
 * Device-memory estimate of a job, from the config, batch and sequence length alone: what Transformer, AdamW,
 * StepRunner and Generator allocate (they allocate everything up front, so this is the whole footprint apart from
 * a backend's fixed workspace). Used for a pre-flight check on GPUs, which turns an out-of-memory failure midway
 * through allocation into one message with the largest sequence length that fits.
 */
import type { ModelConfig } from './config.js';
import type { Precision } from './transformer.js';
import { parameterCount, preRopeScratch } from './config.js';
import { fusesQkv, parameterLayout } from './params.js';
import type { LoraLayout } from './lora.js';
import { nf4Plan, nf4StorageBytes, type FrozenDtype } from './frozen.js';
import { defaultChunkFloats, headFloats, headWidth, SCORING_CHUNK_FLOATS, type LogitsDtype } from '../train/head.js';

export interface JobMemory {
  student: ModelConfig;
  teacher?: ModelConfig | null;
  batch: number;
  seq: number;
  /** Gradients, optimizer moments and per-layer activations for backward. */
  training: boolean;
  /** Vocabulary rows the loss runs over (default: the student's vocab_size). */
  lossVocab?: number | undefined;
  /** Both models' precision (default fp32). */
  precision?: Precision;
  /** Distilling from a teacher cache with this many slots per position (its sparse rows on the device), no teacher. */
  teacherCacheSlots?: number | undefined;
  /** On-policy distillation: the student's batched generator for `batch` sequences of `seq` tokens (its KV cache and buffers). */
  onPolicy?: boolean | undefined;
  /** The student trains LoRA adapters of this layout: its base is frozen (compute dtype only, no gradients or moments). */
  lora?: LoraLayout | undefined;
  /** Frozen weights in NF4 (src/model/frozen.ts): the teacher's, and the student's base under LoRA. */
  teacherFrozen?: FrozenDtype | undefined;
  studentFrozen?: FrozenDtype | undefined;
  /** Data-parallel processes (default 1): each keeps the AdamW moments of its shard only (src/parallel/data-parallel.ts). */
  world?: number | undefined;
  /** The LM heads' logits dtype (default f32; src/train/head.ts). */
  logits?: LogitsDtype | undefined;
  /** Windows of packed documents ('bfd'): each model keeps its rows' document positions (TransformerOptions.documents). */
  documents?: boolean | undefined;
  /** --eval-choices: a scoring head (f32 logits, SCORING_CHUNK_FLOATS) for the student and one for a teacher (src/train/run-choices.ts). */
  choices?: boolean | undefined;
  /**
   * Generation items in --eval-choices (src/train/run-generation.ts): a generator of `batch` × `seq` for the student
   * (the on-policy one where the run has it) and one for a teacher.
   */
  generateItems?: boolean | undefined;
  /** With generateItems: the sequences its generators hold (default: batch). */
  itemsBatch?: number | undefined;
}

const F = 4; // bytes per float32

/** Bytes of a frozen (never trained) model's weights: the compute dtype, or NF4 storage with its one-layer scratch. */
function frozenWeightBytes(c: ModelConfig, a: number, frozen: FrozenDtype | undefined): number {
  const layout = parameterLayout(c);
  return frozen === 'nf4' ? nf4StorageBytes(nf4Plan(layout), a) : layout.total * a;
}

/**
 * Bytes one Transformer allocates for activations (and gradient scratch when training), with `a` bytes per element
 * of the buffers that feed matrix products (4 in fp32, 2 in bf16; see Transformer's module comment).
 */
function activationBytes(c: ModelConfig, b: number, t: number, training: boolean, a: number, trainBase: boolean, fusedQkv: boolean,
  documents = false): number {
  const N = b * t, C = c.hiddenSize, Q = c.numHeads * c.headDim, KV = c.numKvHeads * c.headDim, I = c.intermediateSize;
  // f32: x, h (C), rstd1, rstd2, lse; compute dtype: ln1, ln2 (C), q, att (Q), k, v (KV), gate, up (I); and the SwiGLU
  // output (I): per layer when every weight trains, else one shared by all layers (the backward recomputes it).
  const keepAct = training && trainBase;
  // Qwen3's q/k norms add their inputs (Q, KV; compute dtype) and one f32 rstd per (token, head).
  const qkn = c.qkNorm ? N * (c.numHeads + c.numKvHeads) * F + N * (Q + KV) * a : 0;
  const perLayer = N * (2 * C + 2) * F + b * c.numHeads * t * F + N * (2 * C + 2 * Q + 2 * KV + 2 * I) * a + qkn;
  const act = N * I * a;
  const layers = training ? c.numLayers * perLayer + (keepAct ? c.numLayers : 1) * act : perLayer + N * C * F + act;
  const final = N * (C + 1) * F + N * C * a; // final x, rstd (f32), norm (logits live in the step's chunked head)
  // Gradient scratch: dHidden, dx, dln (C) in f32; dq, datt (Q), dk, dv (KV), dact, dgate, dup (I) in the compute
  // dtype, the pre-RoPE dq (Q) and dk (KV) where a layer needs them (preRopeScratch), and in bf16 the converted dx (C).
  const pre = training && preRopeScratch(c, new Array<boolean>(c.numLayers).fill(fusedQkv)) ? 1 : 0;
  const scratch = training ? N * 3 * C * F + N * ((2 + pre) * Q + (2 + pre) * KV + 3 * I + (a === F ? 0 : C)) * a : 0;
  const ids = N * 4 * (documents ? 2 : 1); // the int32 token ids (and document positions)
  // The fused q/k/v projection's output and, training, its joined gradient: [N, Q + 2·KV] each, in the compute dtype.
  const fused = fusedQkv ? N * (Q + 2 * KV) * a * (training ? 2 : 1) : 0;
  return layers + final + scratch + ids + fused;
}

/** Bytes of the job's allocations on the backend. */
export function estimateJobBytes(j: JobMemory): number {
  const a = j.precision === 'bf16' ? 2 : F;
  const p = parameterLayout(j.student).total;
  const trainBase = j.training && !j.lora;
  // Training: gradients whole, the two moments of this rank's shard (ZeRO-1), the compute copy in bf16, and the fp32
  // masters, sharded too in bf16 with several ranks (Transformer masterRange).
  const world = Math.max(1, j.world ?? 1);
  const masters = world > 1 && a !== F ? Math.ceil(p / world) * F : p * F;
  let bytes = (trainBase ? masters + p * (F + (a === F ? 0 : a)) + Math.ceil(p / world) * 2 * F : frozenWeightBytes(j.student, a, j.studentFrozen)) +
    activationBytes(j.student, j.batch, j.seq, j.training, a, trainBase, fusesQkv(parameterLayout(j.student), j.lora), j.documents);
  if (j.lora) bytes += loraBytes(j.lora, j.batch * j.seq, j.training, a, world);
  const lv = j.lossVocab ?? j.student.vocabSize, vocabs = [j.student.vocabSize, ...(j.teacher ? [j.teacher.vocabSize] : [])];
  // Logits chunks, loss rows (and a bf16 student's dlogits chunk).
  bytes += F * headFloats(j.batch * j.seq, headWidth(lv, ...vocabs), Boolean(j.teacher), defaultChunkFloats(Boolean(j.teacherCacheSlots), j.training && a !== F),
    j.training && a !== F, j.logits);
  if (j.teacher) bytes += frozenWeightBytes(j.teacher, a, j.teacherFrozen) + activationBytes(j.teacher, j.batch, j.seq, false, a, false, fusesQkv(parameterLayout(j.teacher)), j.documents);
  // A teacher cache's rows (src/cache/targets.ts): ids, weights and log-probabilities per slot; tail and argmax per row.
  if (j.teacherCacheSlots) bytes += j.batch * j.seq * (3 * j.teacherCacheSlots + 2) * F;
  // the items share the on-policy generator where their batches agree (src/train/run.ts)
  const IB = j.itemsBatch ?? j.batch, studentGen = (b: number): number => batchGeneratorBytes(j.student, b, j.seq, a, fusesQkv(parameterLayout(j.student), j.lora));
  if (j.onPolicy) bytes += studentGen(j.batch);
  if (j.generateItems && !(j.onPolicy && IB === j.batch)) bytes += studentGen(IB);
  if (j.generateItems && j.teacher) bytes += batchGeneratorBytes(j.teacher, IB, j.seq, a, fusesQkv(parameterLayout(j.teacher)));
  if (j.choices) for (const m of [j.student, ...(j.teacher ? [j.teacher] : [])]) bytes += F * headFloats(j.batch * j.seq, m.vocabSize, false, SCORING_CHUNK_FLOATS);
  return bytes;
}

/**
 * Bytes a model's LoRA adapters take (src/model/lora.ts, LoraAdapters, and their AdamW moments when training): the
 * adapters (fp32 masters, gradients, two moments and a bf16 compute copy when training; the compute dtype alone
 * otherwise), the saved t = s·(x·Aᵀ) [tokens, r] per layer and target (one set shared by the layers without
 * training) and the backward's dt [tokens, r].
 */
export function loraBytes(lay: LoraLayout, tokens: number, training: boolean, a: number, world = 1): number {
  const r = lay.spec.rank, P = lay.total;
  const perLayer = lay.layers[0]?.length ?? 0;
  const saved = (training ? lay.layers.length : 1) * perLayer * tokens * r * a;
  // training: masters and gradients whole, the moments of this rank's shard, the compute copy in bf16
  return (training ? P * (2 * F + (a === F ? 0 : a)) + Math.ceil(P / world) * 2 * F : P * a) + saved + tokens * r * a;
}

/**
 * Bytes a BatchGenerator (src/model/batch-generate.ts) allocates for `batch` sequences of `maxLen` tokens, with `a`
 * bytes per element of its compute-dtype buffers: the KV cache of every layer, one layer's activations for every row
 * (the prefill attention's log-sum-exp included, and the fused q/k/v product's output where the model has one:
 * src/model/cached-layers.ts),
 * the token ids, per-sequence positions, the gathered last rows, the logits, uniforms, sampled ids, every step's uniforms
 * and the step counter (not the seen-token
 * bitmask a repetition penalty allocates, batch · ⌈vocab / 32⌉ words: on-policy generation, what this sizes, has none).
 */
export function batchGeneratorBytes(c: ModelConfig, batch: number, maxLen: number, a: number, fusedQkv: boolean): number {
  const R = batch * maxLen, C = c.hiddenSize, Q = c.numHeads * c.headDim, KV = c.numKvHeads * c.headDim, I = c.intermediateSize;
  const kv = 2 * c.numLayers * R * KV * a;
  const acts = R * (2 * C + 1 + c.numHeads /* prefill lse */) * F + R * (C + 2 * Q + 2 * KV + 3 * I + (fusedQkv ? Q + 2 * KV : 0)) * a;
  const qkn = c.qkNorm ? R * (Q + KV) * a + R * (c.numHeads + c.numKvHeads) * F : 0;
  return kv + acts + qkn + R * F /* ids */ + batch * F /* positions */ + batch * C * a + batch * c.vocabSize * F + 2 * batch * F
    + (maxLen + 1) * batch * F /* every step's uniforms */ + F /* the step counter */;
}

/** The largest sequence length (≤ seq) whose estimate fits in `bytes`, or 0 if none does. */
export function largestSeqThatFits(j: JobMemory, bytes: number): number {
  let lo = 0, hi = j.seq;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (estimateJobBytes({ ...j, seq: mid }) <= bytes) lo = mid; else hi = mid - 1;
  }
  return lo;
}

export function formatGiB(bytes: number): string {
  return `${(bytes / 2 ** 30).toFixed(2)} GiB`;
}

/** A one-line description of a job's size, e.g. for logs. */
export function describeJob(j: JobMemory): string {
  return `${(parameterCount(j.student) / 1e6).toFixed(1)}M-parameter student${j.teacher ? `, ${(parameterCount(j.teacher) / 1e6).toFixed(1)}M teacher` : ''}, batch ${j.batch} × seq ${j.seq}`;
}
