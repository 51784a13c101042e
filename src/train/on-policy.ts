/**
 * On-policy distillation (GKD, Agarwal et al. 2024): for a fraction λ of the steps the student writes the text it is
 * trained on. Each window of the step's batch gives a prompt — on chat data the tokens before the window's first counted
 * (assistant) token, on text data its first `promptLen` tokens (at most promptLen either way, at least one) — the student
 * continues every prompt (src/model/batch-generate.ts, sampled on the device with the generation settings), and the
 * batch the step trains on is prompt + completion with the loss on the completion only: the teacher scores the same
 * tokens (a live teacher) and the divergence runs over the generated positions. A completion that ended at a stop token
 * keeps it (the student chose to stop; the teacher grades that too).
 *
 * Which steps are on-policy and what the student draws are pure functions of (seed, step): a resumed run draws what the
 * uninterrupted one did, with nothing more in the checkpoint than the step.
 */
import type { BatchGenerator } from '../model/batch-generate.js';
import { hashUniform } from '../util/rng.js';
import type { Batch } from './step.js';

export interface OnPolicyOptions {
  /** λ: the fraction of steps that train on the student's own completions (0 = off). */
  fraction: number;
  /** Tokens the student writes per prompt (at most; fewer where the window has no room). */
  genLen: number;
  /** The longest prompt taken from a window. */
  promptLen: number;
  temperature: number;
  topP: number;
  topK: number;
  /** The ids the student may write: the tokenizer's (the loss vocabulary), never the embedding's padding rows. */
  vocab: number;
}

/** Whether step `step` (0-based) trains on-policy: a hash of (seed, step) below λ. */
export function isOnPolicyStep(seed: number, step: number, fraction: number): boolean {
  return fraction > 0 && hashUniform(seed, step, 0x6b64, 1) < fraction;
}

/** Row r's first counted target (t when none): on chat data the start of the first assistant reply (0: text). */
function firstCounted(mask: Float32Array, r: number, t: number): number {
  for (let p = 0; p < t; p++) if (mask[r * t + p]! > 0) return p;
  return t;
}

/**
 * The prompts of a batch's b windows of t tokens (see the module comment). With the windows' document positions ('bfd'
 * windows: Batch.positions), a prompt stays inside its window's first document.
 */
export function promptsOf(inputs: Int32Array, mask: Float32Array, b: number, t: number, promptLen: number, positions?: Int32Array): number[][] {
  const out: number[][] = [];
  for (let r = 0; r < b; r++) {
    const first = firstCounted(mask, r, t);
    let docEnd = t;
    if (positions) for (let p = 1; p < t; p++) if (positions[r * t + p] === 0) { docEnd = p; break; }
    // mask[p] counts target p (the token at p + 1): the prompt ends with the token whose successor is the first counted one.
    const chat = first > 0;
    const len = Math.max(1, Math.min(promptLen, chat ? first + 1 : promptLen, t - 1, docEnd));
    out.push(Array.from(inputs.subarray(r * t, r * t + len)));
  }
  return out;
}

/** The micro-batches per step whose sequence numbers never meet the next step's (at least 64, as before). */
export function sequenceStride(microsPerStep: number): number {
  return Math.max(64, microsPerStep);
}

/**
 * The training batch of prompt + completion (stop token kept where one ended it), padded with `padId` to t: targets are
 * the next tokens, counted (mask 1) where they are completion tokens.
 */
export function onPolicyBatch(prompts: number[][], completions: number[][], stops: Array<number | null>, t: number, padId: number): Batch {
  const b = prompts.length, n = b * t;
  const inputs = new Int32Array(n).fill(padId), targets = new Int32Array(n).fill(-1), mask = new Float32Array(n);
  for (let r = 0; r < b; r++) {
    const stop = stops[r];
    const seq = [...prompts[r]!, ...completions[r]!, ...(stop !== null && stop !== undefined ? [stop] : [])].slice(0, t + 1);
    const L = prompts[r]!.length;
    for (let p = 0; p < Math.min(seq.length, t); p++) inputs[r * t + p] = seq[p]!;
    for (let p = L - 1; p + 1 < seq.length && p < t; p++) { targets[r * t + p] = seq[p + 1]!; mask[r * t + p] = 1; }
  }
  return { inputs, targets, mask, b, t, teacherCe: true };
}

export interface OnPolicyResult { batch: Batch; generated: number }

/**
 * The on-policy batch of one micro-batch (`micro` of the step's `microsPerStep`, over every rank): prompts from its
 * windows, completions from the student (sequence numbers (step·stride + micro)·b + row, so the draws are a function of
 * the step), the batch over them. A reply to a conversation also stops at the end-of-turn tokens (`turnEndIds`), as
 * `generate --chat` does; a text continuation at `stopIds` only.
 */
export function onPolicyMicroBatch(gen: BatchGenerator, o: OnPolicyOptions, window: { inputs: Int32Array; mask: Float32Array; b: number; t: number; positions?: Int32Array | undefined },
  seed: number, step: number, micro: { index: number; perStep: number }, stops: { stopIds: number[]; turnEndIds: number[] }, padId: number): OnPolicyResult {
  const { b, t } = window;
  const prompts = promptsOf(window.inputs, window.mask, b, t, o.promptLen, window.positions);
  const chatStops = [...new Set([...stops.stopIds, ...stops.turnEndIds])];
  const room = t - Math.max(...prompts.map((p) => p.length));
  const r = gen.generateOnDevice(prompts, {
    temperature: o.temperature, topP: o.topP, topK: o.topK, vocab: o.vocab, maxNewTokens: Math.max(1, Math.min(o.genLen, room)), seed,
    sequence0: (step * sequenceStride(micro.perStep) + micro.index) * b,
    rowStopIds: prompts.map((_, row) => (firstCounted(window.mask, row, t) > 0 ? chatStops : stops.stopIds)),
  });
  const batch = onPolicyBatch(prompts, r.tokens, r.stops, t, padId);
  return { batch, generated: r.tokens.reduce((a, x) => a + x.length, 0) + r.stops.filter((x) => x !== null).length };
}

/** How a student does on its own samples, as the teacher sees them. */
export interface OwnSampleScore {
  /** The teacher's mean log-probability of the student's sampled tokens (higher: text the teacher finds likely). */
  teacherLogLik: number;
  /** The mean reverse KL(student ‖ teacher) at T = 1 over the sampled positions. */
  reverseKl: number;
  /** Mean tokens sampled per prompt. */
  genLen: number;
  tokens: number;
}

/**
 * Samples completions of `prompts` from the student (batched, on the device, temperature 1 unless given) and scores
 * them: the teacher's log-likelihood of the sampled tokens and the reverse KL from the student to the teacher at each
 * sampled position. `runner` is a StepRunner(student, teacher, reverse-kl at T = 1, α = 1); batches of runner's batch.
 */
export function scoreOwnSamples(gen: BatchGenerator, runner: { evaluate(b: Batch[]): { div: number; tokens: number; teacherCe?: number; teacherCeTokens?: number } },
  prompts: number[][], t: number, genLen: number, seed: number, stopIds: number[], padId: number, batch: number,
  sampling: { temperature: number; topP: number; topK: number } = { temperature: 1, topP: 1, topK: 0 }): OwnSampleScore {
  let div = 0, tokens = 0, ce = 0, ceTokens = 0, generated = 0;
  for (let i0 = 0; i0 < prompts.length; i0 += batch) {
    const group = prompts.slice(i0, i0 + batch);
    while (group.length < batch) group.push(group[group.length - 1]!); // a full batch (the extra rows are not counted)
    const real = Math.min(batch, prompts.length - i0);
    const room = t - Math.max(...group.map((p) => p.length));
    const r = gen.generateOnDevice(group, { ...sampling, maxNewTokens: Math.max(1, Math.min(genLen, room)), seed, sequence0: i0, stopIds });
    const b = onPolicyBatch(group, r.tokens, r.stops, t, padId);
    for (let row = real; row < batch; row++) { b.mask.fill(0, row * t, row * t + t); b.targets.fill(-1, row * t, row * t + t); }
    const e = runner.evaluate([b]);
    div += e.div; tokens += e.tokens; ce += e.teacherCe ?? 0; ceTokens += e.teacherCeTokens ?? 0;
    for (let row = 0; row < real; row++) generated += r.tokens[row]!.length + (r.stops[row] !== null ? 1 : 0);
  }
  return { teacherLogLik: -ce / Math.max(ceTokens, 1), reverseKl: div / Math.max(tokens, 1), genLen: generated / prompts.length, tokens };
}
