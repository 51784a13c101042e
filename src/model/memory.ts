/**
 * Device-memory estimate of a job, from the config, batch and sequence length alone: what Transformer, AdamW,
 * StepRunner and Generator allocate (they allocate everything up front, so this is the whole footprint apart from
 * a backend's fixed workspace). Used for a pre-flight check on GPUs, which turns an out-of-memory failure midway
 * through allocation into one message with the largest sequence length that fits.
 */
import type { ModelConfig } from './config.js';
import { parameterCount } from './config.js';
import { parameterLayout } from './params.js';
import { headFloats, headWidth } from '../train/head.js';

export interface JobMemory {
  student: ModelConfig;
  teacher?: ModelConfig | null;
  batch: number;
  seq: number;
  /** Gradients, optimizer moments and per-layer activations for backward. */
  training: boolean;
  /** Vocabulary rows the loss runs over (default: the student's vocab_size). */
  lossVocab?: number | undefined;
}

const F = 4; // bytes per float32

/** Floats one Transformer allocates for activations (and gradient scratch when training). */
function activationFloats(c: ModelConfig, b: number, t: number, training: boolean): number {
  const N = b * t, C = c.hiddenSize, Q = c.numHeads * c.headDim, KV = c.numKvHeads * c.headDim, I = c.intermediateSize;
  const perLayer = N * (4 * C + 2 * Q + 2 * KV + 3 * I + 2) + b * c.numHeads * t; // + attention lse (linear in t)
  const layers = training ? c.numLayers * perLayer : perLayer + N * C;
  const final = N * (2 * C + 1); // final x, norm, rstd (logits live in the step's chunked head)
  // Gradient scratch: dHidden, dx, dln (C); dq, dq pre-rope, datt (Q); dk, dv, dk pre-rope (KV); dact, dgate, dup (I).
  const scratch = training ? N * (3 * C + 3 * Q + 3 * KV + 3 * I) : 0;
  const ids = N; // the int32 token ids (4 bytes each, as a float)
  return layers + final + scratch + ids;
}

/** Bytes of the job's allocations on the backend. */
export function estimateJobBytes(j: JobMemory): number {
  const p = parameterLayout(j.student).total;
  let floats = p * (j.training ? 4 : 1) + activationFloats(j.student, j.batch, j.seq, j.training);
  const lv = j.lossVocab ?? j.student.vocabSize, vocabs = [j.student.vocabSize, ...(j.teacher ? [j.teacher.vocabSize] : [])];
  floats += headFloats(j.batch * j.seq, headWidth(lv, ...vocabs), Boolean(j.teacher)); // logits chunks, loss rows
  if (j.teacher) floats += parameterLayout(j.teacher).total + activationFloats(j.teacher, j.batch, j.seq, false);
  return floats * F;
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
