/**
 * Text generation with a KV cache: a prefill pass over the prompt writes every layer's keys and values into the
 * cache, then each decode step runs one token through the layers attending to the cache. Uses the weights of a
 * Transformer (no copy) and its own buffers, allocated once for [1, maxLen]. Sampling (repetition penalty, greedy,
 * temperature, top-k, top-p, min-p: the rule of the device sampler, src/backend/cpu/kernels/sample.ts) happens on the
 * host from the last position's logits, one uniform of the seeded stream a sampled token.
 */
import { seenWords, type Backend, type Buf, type SampleParams } from '../backend/backend.js';
import type { Transformer } from './transformer.js';
import { Rng } from '../util/rng.js';
import { markSeen, sampleRow } from '../backend/cpu/kernels/sample.js';
import { DistilleryError } from '../util/errors.js';
import { CachedLayers } from './cached-layers.js';

export interface SamplingOptions {
  /** 0 means greedy. */
  temperature: number;
  /** Nucleus sampling: keep the smallest set of tokens whose probability sums to topP (1 = off). */
  topP: number;
  /** Keep the k most likely tokens (ties at the cut kept; 0 or absent = off). */
  topK?: number;
  /**
   * transformers' repetition_penalty (absent or 1 = off): the logit of every id already in the sequence (prompt and
   * generated) is multiplied by it where negative and divided by it otherwise, before anything else (greedy too).
   */
  repetitionPenalty?: number;
  /** transformers' min_p (absent or 0 = off): keep only tokens at least this fraction as likely as the most likely one. */
  minP?: number;
  maxNewTokens: number;
  /** Stop when one of these ids is produced (it is not included in the output). */
  stopIds?: number[];
  seed?: number;
  /**
   * Only ids below this are drawn (default: the model's vocab_size): the tokenizer's tokens. A checkpoint's embedding
   * rows past its tokenizer are padding — no text decodes them and the loss never scores them — yet their logits are
   * not −∞ (a randomly initialised model draws them often).
   */
  vocab?: number;
}

/** The sampling vocabulary of opts over a model of vocab_size V (checked: 1 ≤ vocab ≤ V). */
export function samplingVocab(opts: { vocab?: number }, V: number): number {
  const v = opts.vocab ?? V;
  if (!(Number.isInteger(v) && v >= 1 && v <= V)) throw new DistilleryError(`the sampling vocabulary (${v}) must be between 1 and the model's vocab_size (${V})`);
  return v;
}

export class Generator {
  readonly maxLen: number;
  private readonly m: Transformer;
  private readonly be: Backend;
  private readonly cl: CachedLayers;
  private readonly logits: Buf;
  private pos = 0;

  /** maxLen: the longest prompt + generated sequence this generator will hold (the KV cache size). */
  constructor(model: Transformer, maxLen: number) {
    const c = model.config, be = model.backend;
    this.cl = new CachedLayers(model, 1, maxLen, 'generation');
    this.m = model; this.be = be; this.maxLen = maxLen;
    this.logits = be.alloc(c.vocabSize, 'generation logits');
  }

  reset(): void {
    this.pos = 0;
  }

  /**
   * Runs tokens through the model at positions pos..pos+t-1 (prefill when t > 1, decode when t = 1) and
   * returns the logits of the last one.
   */
  step(tokens: Int32Array): Float32Array | Float64Array {
    const c = this.m.config, be = this.be, t = tokens.length, pos0 = this.pos;
    if (t < 1) throw new DistilleryError('generation needs at least one prompt token');
    if (pos0 + t > this.maxLen) {
      throw new DistilleryError(`sequence of ${pos0 + t} tokens exceeds the generator's ${this.maxLen}`, 'lower --max-new-tokens or shorten the prompt');
    }
    const C = c.hiddenSize;
    be.uploadInt(this.cl.ids, tokens);
    this.cl.run(1, t, pos0);
    // The final norm covers every position (fused with the last layer's add); only the last position's logits are needed.
    const lnLast = be.view(this.cl.ln, (t - 1) * C, C);
    be.matmulForward(this.logits, lnLast, this.m.headWeight(), null, 1, C, c.vocabSize);
    this.pos += t;
    return be.download(this.logits);
  }

  /** Generates up to maxNewTokens after the prompt; returns only the new ids. */
  generate(prompt: Int32Array | number[], opts: SamplingOptions, onToken?: (id: number) => void): number[] {
    this.reset();
    const rng = new Rng(opts.seed ?? 0);
    const out: number[] = [];
    const sv = samplingVocab(opts, this.m.config.vocabSize), s = sampleParams(opts);
    const seen = seenOf([prompt], sv, s);
    let logits = this.step(Int32Array.from(prompt));
    for (let i = 0; i < opts.maxNewTokens; i++) {
      const id = sample(logits.subarray(0, sv), s, rng, seen);
      if (opts.stopIds?.includes(id)) break;
      out.push(id);
      onToken?.(id);
      if (i + 1 === opts.maxNewTokens || this.pos >= this.maxLen) break;
      logits = this.step(Int32Array.of(id));
    }
    return out;
  }
}

/** The sampler's settings of generation options. */
export function sampleParams(opts: SamplingOptions): SampleParams {
  return {
    temperature: opts.temperature, topK: opts.topK ?? 0, topP: opts.topP,
    ...(opts.repetitionPenalty !== undefined ? { repetitionPenalty: opts.repetitionPenalty } : {}),
    ...(opts.minP !== undefined ? { minP: opts.minP } : {}),
  };
}

/**
 * The seen-token bitmask of sequences starting with these prompts (seenWords(vocab) words a sequence; ids at or past
 * the sampling vocabulary are never drawn, so never penalized), or null when the settings have no repetition penalty.
 */
export function seenOf(prompts: ReadonlyArray<ArrayLike<number>>, vocab: number, s: SampleParams): Int32Array | null {
  if ((s.repetitionPenalty ?? 1) === 1) return null;
  const W = seenWords(vocab), seen = new Int32Array(prompts.length * W);
  prompts.forEach((p, b) => { for (let i = 0; i < p.length; i++) if (p[i]! >= 0 && p[i]! < vocab) markSeen(seen, b * W, p[i]!); });
  return seen;
}

/**
 * Picks a token id from logits as the device sampler does (sampleRow: the repetition penalty over `seen`, then argmax at
 * temperature 0, else softmax(logits / T) cut to the top-k, the top-p nucleus and min-p, ties at a cut kept), with the
 * next uniform of `rng` (none drawn when greedy). seen: the sequence's seen-token bitmask at word offset seenOff (row b
 * of seenOf's), marked with the drawn id here.
 */
export function sample(logits: ArrayLike<number>, s: SampleParams, rng: Rng, seen: Int32Array | null = null, seenOff = 0): number {
  const id = sampleRow(logits, 0, logits.length, s, s.temperature > 0 ? rng.next() : 0, seen, seenOff);
  if (seen) markSeen(seen, seenOff, id);
  return id;
}
