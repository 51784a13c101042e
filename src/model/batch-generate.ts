/**
 * Batched generation with a KV cache of [batch, maxLen]: prompts of different lengths in one batch.
 *
 * Prefill: the prompts, right-padded to the longest, run as one [B, P] forward from position 0 (a padded row's keys and
 * values land in the cache past its prompt, where nothing attends to them: a query attends causally to rows up to its
 * own position, and the sequence's first decode step overwrites the first padded row). Its attention is training's
 * causal forward over the rows it writes (the flash kernel on CUDA), not the cache-reading kernel of the decode steps. The logits of each sequence's
 * last prompt token are gathered (one row per sequence) and go through the LM head as one product.
 * Decode: one token per sequence per step, each at its own position — the generation ops read per-sequence start
 * positions from a device buffer (Backend SeqPositions) — so sequences of different lengths advance together. Stop
 * tokens end a sequence (it keeps a slot in the batch until every sequence ends or the budget is spent).
 * generateOnDevice keeps the whole loop on the device: a step's sampled ids become the next step's input there, its
 * positions and uniforms advance there (Backend.decodeAdvance), so the host queues step i + 1 before it reads step i's
 * ids (a readback that overlaps the GPU's work) and the GPU never waits for the host between steps.
 *
 * Sampling happens on the host from the gathered last-position logits [B, vocab] (src/model/generate.ts's sample, with
 * one Rng per sequence: sequence b draws what an unbatched generation of it with seed seedOf(seed, b) would).
 */
import { MAX_DECODE_SEQUENCES, seenWords, type Backend, type Buf, type DType, type IntBuf, type Readback, type SampleParams, type SeqPositions } from '../backend/backend.js';
import type { Transformer } from './transformer.js';
import { Rng, hashUniform } from '../util/rng.js';
import { DistilleryError } from '../util/errors.js';
import { CachedLayers } from './cached-layers.js';
import { sample, sampleParams, samplingVocab, seenOf, type SamplingOptions } from './generate.js';

/** The seed sequence b of a batch draws from (so an unbatched generation with this seed reproduces it). */
export function seedOf(seed: number, b: number): number {
  return (Math.imul(seed ^ 0x5bd1e995, 0x9e3779b1) + Math.imul(b + 1, 0x85ebca6b)) >>> 0;
}

export interface BatchResult {
  /** The generated ids of each sequence (stop token excluded). */
  tokens: number[][];
  /** Why each sequence ended: a stop token, the caller's stopWhen (a stop string), or the length budget. */
  finish: Array<'stop' | 'length'>;
  /** The stop id that ended each sequence (null: the length budget). */
  stops: Array<number | null>;
}

export class BatchGenerator {
  private readonly m: Transformer;
  private readonly be: Backend;
  private readonly cl: CachedLayers;
  private readonly positions: SeqPositions;
  private readonly last: Buf;
  private readonly logits: Buf;
  private readonly uniforms: Buf;
  private readonly sampled: IntBuf;
  /** generateOnDevice's draws, [steps + 1, n] uniforms uploaded once a generation (room for maxLen + 1 rows), and its step counter (decodeAdvance). */
  private readonly table: Buf;
  private readonly counter: IntBuf;
  /** Two readbacks of the sampled ids, alternating: a step's ids are read while the next step runs (made when first used). */
  private readbacks: [Readback, Readback] | null = null;
  /** The sequences' seen-token bitmask for a repetition penalty (allocated at the first generation that has one). */
  private seen: IntBuf | null = null;
  /** Tokens held by each sequence (its next position). */
  private lens: Int32Array;

  /** batch sequences of at most maxLen tokens each (prompt + generated): the KV cache is [batch, maxLen]. */
  constructor(model: Transformer, readonly batch: number, readonly maxLen: number) {
    const c = model.config, be = model.backend;
    if (!(Number.isInteger(batch) && batch >= 1)) throw new DistilleryError(`the generation batch must be a positive integer, got ${batch}`);
    this.m = model; this.be = be;
    const C = c.hiddenSize, A = model.compute;
    this.cl = new CachedLayers(model, batch, maxLen, 'batched generation');
    const a = (n: number, what: string, d: DType = 'f32'): Buf => be.alloc(n, `batched generation ${what}`, d);
    this.positions = { seqPositions: be.allocInt(batch, 'batched generation positions') };
    this.last = a(batch * C, 'last positions', A);
    this.logits = a(batch * c.vocabSize, 'logits');
    this.uniforms = a(batch, 'sampling uniforms');
    this.sampled = be.allocInt(batch, 'batched generation sampled ids');
    this.table = a((maxLen + 1) * batch, 'sampling uniforms of every step');
    this.counter = be.allocInt(1, 'batched generation step counter');
    this.lens = new Int32Array(batch);
  }

  /** Runs [b, t] tokens through the layers from pos0 (a number: every sequence; SeqPositions: each its own). */
  private layers(tokens: Int32Array, b: number, t: number, pos0: number | SeqPositions): void {
    this.be.uploadInt(this.cl.ids, tokens);
    this.cl.run(b, t, pos0);
  }

  /** Logits [b, vocab] of the rows `rows` (indices into the last layers() call's b·t rows), on the device. */
  private logitsOf(rows: number[]): Buf {
    const c = this.m.config, be = this.be, C = c.hiddenSize, b = rows.length;
    // A decode step's rows are the first b already (one a sequence): the head reads them in place, no copy a row
    const inPlace = rows.every((r, i) => r === i);
    if (!inPlace) rows.forEach((r, i) => be.copy(be.view(this.last, i * C, C), be.view(this.cl.ln, r * C, C)));
    const w = this.m.headWeight();
    const z = be.view(this.logits, 0, b * c.vocabSize);
    be.matmulForward(z, be.view(inPlace ? this.cl.ln : this.last, 0, b * C), w, null, b, C, c.vocabSize);
    return z;
  }

  /** The same, on the host. */
  private headOf(rows: number[]): Float32Array | Float64Array {
    return this.be.download(this.logitsOf(rows));
  }

  /** The device's seen-token bitmask holding `host` (seenOf's, seenWords(sv) words a sequence). */
  private seenOnDevice(host: Int32Array): IntBuf {
    this.seen ??= this.be.allocInt(this.batch * seenWords(this.m.config.vocabSize), 'batched generation seen tokens');
    const view = this.be.viewInt(this.seen, 0, host.length);
    this.be.uploadInt(view, host);
    return view;
  }

  /** Prefill of the prompts (one per sequence, 1 ≤ length ≤ maxLen): the logits [B, vocab] of each last prompt token. */
  prefill(prompts: ReadonlyArray<ArrayLike<number>>): Float32Array | Float64Array {
    return this.headOf(this.prefillRows(prompts));
  }

  /** prefill's work up to the logits: the rows of each sequence's last prompt token. */
  private prefillRows(prompts: ReadonlyArray<ArrayLike<number>>): number[] {
    const B = prompts.length;
    if (B < 1 || B > this.batch) throw new DistilleryError(`${B} prompts for a generation batch of ${this.batch}`);
    const P = Math.max(...prompts.map((p) => p.length));
    if (prompts.some((p) => p.length < 1)) throw new DistilleryError('generation needs at least one prompt token per sequence');
    if (P > this.maxLen) throw new DistilleryError(`a prompt of ${P} tokens exceeds the generator's ${this.maxLen}`, 'shorten the prompt or raise the length limit');
    const ids = new Int32Array(B * P);
    prompts.forEach((p, b) => { for (let i = 0; i < P; i++) ids[b * P + i] = p[Math.min(i, p.length - 1)]!; }); // pad with the last token
    this.layers(ids, B, P, 0);
    this.lens = Int32Array.from(prompts, (p) => p.length);
    return prompts.map((p, b) => b * P + p.length - 1);
  }

  /** One decode step: token ids[b] of every sequence at its own next position; the logits [B, vocab]. */
  decode(tokens: Int32Array): Float32Array | Float64Array {
    return this.headOf(this.decodeRows(tokens));
  }

  /** decode's work up to the logits. */
  private decodeRows(tokens: Int32Array): number[] {
    const B = tokens.length;
    if (B !== this.lens.length) throw new DistilleryError(`decode got ${B} tokens for ${this.lens.length} sequences`);
    for (let b = 0; b < B; b++) {
      if (this.lens[b]! >= this.maxLen) throw new DistilleryError(`sequence ${b} would pass the generator's ${this.maxLen} tokens`, 'lower the number of new tokens');
    }
    this.be.uploadInt(this.positions.seqPositions, this.lens);
    this.layers(tokens, B, 1, this.positions);
    for (let b = 0; b < B; b++) this.lens[b]!++;
    return Array.from({ length: B }, (_, b) => b);
  }

  /**
   * generate with the sampling on the device: no logits leave it, only one id per sequence per step. Sequence b's draw
   * at step i uses the uniform hashUniform(seed, sequence0 + b, i, 0), so a sequence draws the same tokens in any batch
   * that gives it the same sequence number (sequence0: the batch's first; default 0). topK: 0 = off. rowStopIds: each
   * sequence's own stop ids (a text prompt beside a conversation), else stopIds for all.
   */
  generateOnDevice(prompts: ReadonlyArray<ArrayLike<number>>, opts: SamplingOptions & {
    sequence0?: number; rowStopIds?: ReadonlyArray<readonly number[]>;
    /** Asked after each token a sequence keeps: true ends it there ('stop', no stop id), e.g. when a stop string appears. */
    stopWhen?: (b: number, tokens: readonly number[]) => boolean;
  }): BatchResult {
    const B = prompts.length, s0 = opts.sequence0 ?? 0;
    if (!(Number.isInteger(opts.maxNewTokens) && opts.maxNewTokens >= 0)) throw new DistilleryError(`generation: ${opts.maxNewTokens} new tokens (a whole number ≥ 0)`);
    if (B < 1 || B > this.batch) throw new DistilleryError(`${B} prompts for a generation batch of ${this.batch}`);
    if (prompts.some((p) => p.length < 1)) throw new DistilleryError('generation needs at least one prompt token per sequence');
    const longest = Math.max(...prompts.map((p) => p.length));
    if (longest + opts.maxNewTokens > this.maxLen) {
      throw new DistilleryError(`a prompt of ${longest} tokens and ${opts.maxNewTokens} new ones exceed the generator's ${this.maxLen}`,
        'lower the number of new tokens or shorten the prompts');
    }
    if (B > MAX_DECODE_SEQUENCES) {
      // The device loop advances at most MAX_DECODE_SEQUENCES sequences (Backend.decodeAdvance): a larger batch goes in
      // parts, each sequence drawing what it draws in any batch (its uniforms hash its sequence number).
      const out: BatchResult = { tokens: [], finish: [], stops: [] };
      for (let i = 0; i < B; i += MAX_DECODE_SEQUENCES) {
        const stopWhen = opts.stopWhen;
        const part = this.generateOnDevice(prompts.slice(i, i + MAX_DECODE_SEQUENCES), {
          ...opts, sequence0: s0 + i, ...(opts.rowStopIds ? { rowStopIds: opts.rowStopIds.slice(i, i + MAX_DECODE_SEQUENCES) } : {}),
          ...(stopWhen ? { stopWhen: (b: number, t: readonly number[]) => stopWhen(i + b, t) } : {}),
        });
        out.tokens.push(...part.tokens); out.finish.push(...part.finish); out.stops.push(...part.stops);
      }
      return out;
    }
    const s = sampleParams(opts);
    const seed = opts.seed ?? 0, sv = samplingVocab(opts, this.m.config.vocabSize);
    const seenHost = seenOf(prompts, sv, s), seen = seenHost ? this.seenOnDevice(seenHost) : null;
    const tokens: number[][] = prompts.map(() => []);
    const finish: Array<'stop' | 'length'> = prompts.map(() => 'length');
    const stops: Array<number | null> = prompts.map(() => null);
    const done = new Uint8Array(B);
    // Every step's uniforms up front (row i: step i's draws), so that a decode step needs nothing from the host.
    const steps = opts.maxNewTokens, be = this.be;
    const table = new Float64Array((steps + 1) * B); // the CPU's float64 reference mode keeps them as drawn
    for (let i = 0; i <= steps; i++) for (let b = 0; b < B; b++) table[i * B + b] = hashUniform(seed, s0 + b, i, 0);
    be.upload(this.table, table);
    const rows = this.prefillRows(prompts);
    be.upload(this.uniforms, table.subarray(0, B));
    be.sampleTokens(this.sampled, this.logitsOf(rows), this.uniforms, B, sv, s, this.m.config.vocabSize, seen);
    const first = be.downloadInt(be.viewInt(this.sampled, 0, B));
    /** Keeps step `step`'s ids of the sequences still going; whether the generation is over. */
    const take = (step: number, ids: Int32Array): boolean => {
      for (let b = 0; b < B; b++) {
        if (done[b]) continue;
        const id = ids[b]!;
        if ((opts.rowStopIds?.[b] ?? opts.stopIds)?.includes(id)) { done[b] = 1; finish[b] = 'stop'; stops[b] = id; continue; }
        tokens[b]!.push(id);
        if (opts.stopWhen?.(b, tokens[b]!)) { done[b] = 1; finish[b] = 'stop'; }
      }
      return done.every((d) => d === 1) || step + 1 === steps;
    };
    if (steps < 2) { if (steps === 1) take(0, first); return { tokens, finish, stops }; }
    const readbacks = this.readbacks ??= [0, 1].map(() => be.readback([], [this.sampled], 'batched generation sampled ids')) as [Readback, Readback];
    // The device's loop state for step 1: the prefill's draws as input, each sequence at its next position, draws of row 1.
    be.uploadInt(this.positions.seqPositions, Int32Array.from(this.lens, (l) => l - 1));
    be.uploadInt(this.counter, new Int32Array([0]));
    // rows: the table's capacity, not this call's steps, so that every call of B sequences replays one graph
    const tableRows = this.maxLen + 1;
    be.decodeAdvance(this.cl.ids, this.positions.seqPositions, this.sampled, this.uniforms, this.table, this.counter, B, tableRows);
    const decode = this.decodeSteps(B, s, sv, seen, tableRows);
    // Step i + 1 is queued before step i's ids are read, so the GPU runs it while the host reads them and checks the
    // stops: the ids of step i decide only what is kept (a sequence that ended goes on being computed, its tokens dropped).
    decode();
    readbacks[1]!.queue();
    if (take(0, first)) return { tokens, finish, stops }; // (step 1, queued, is dropped)
    for (let step = 1; step < steps; step++) {
      if (step + 1 < steps) { decode(); readbacks[(step + 1) % 2]!.queue(); }
      if (take(step, readbacks[step % 2]!.wait().ints[0]!)) break;
    }
    return { tokens, finish, stops };
  }

  /**
   * The decode steps of one generation, on the device alone: the layers over each sequence's input id at its position,
   * the LM head, the sampler, and decodeAdvance (the draws become the next input, positions move on, the next row of
   * uniforms). Recorded at the first step (a captured region: a CUDA graph once it has been seen) and repeated after
   * without the model's code running again (Backend.capturedRepeat), since nothing in it changes within a generation.
   */
  private decodeSteps(B: number, s: SampleParams, sv: number, seen: IntBuf | null, rows: number): () => void {
    const be = this.be, V = this.m.config.vocabSize, lastRows = Array.from({ length: B }, (_, b) => b);
    let again: (() => void) | null = null;
    return () => {
      for (let b = 0; b < B; b++) {
        if (this.lens[b]! >= this.maxLen) throw new DistilleryError(`sequence ${b} would pass the generator's ${this.maxLen} tokens`, 'lower the number of new tokens');
      }
      if (again) again();
      else {
        again = be.capturedRepeat('decode step', () => {
          this.cl.run(B, 1, this.positions);
          be.sampleTokens(this.sampled, this.logitsOf(lastRows), this.uniforms, B, sv, s, V, seen);
          be.decodeAdvance(this.cl.ids, this.positions.seqPositions, this.sampled, this.uniforms, this.table, this.counter, B, rows);
        });
      }
      for (let b = 0; b < B; b++) this.lens[b]!++;
    };
  }

  /**
   * Generates up to opts.maxNewTokens after each prompt (every prompt length + maxNewTokens ≤ maxLen). Sequence b
   * samples with Rng(seedOf(opts.seed ?? 0, b)); a stop id ends it (not included).
   */
  generate(prompts: ReadonlyArray<ArrayLike<number>>, opts: SamplingOptions): BatchResult {
    const B = prompts.length, V = this.m.config.vocabSize, sv = samplingVocab(opts, V);
    const longest = Math.max(...prompts.map((p) => p.length));
    if (longest + opts.maxNewTokens > this.maxLen) {
      throw new DistilleryError(`a prompt of ${longest} tokens and ${opts.maxNewTokens} new ones exceed the generator's ${this.maxLen}`,
        'lower the number of new tokens or shorten the prompts');
    }
    const rngs = prompts.map((_, b) => new Rng(seedOf(opts.seed ?? 0, b)));
    const s = sampleParams(opts), seen = seenOf(prompts, sv, s), W = seenWords(sv);
    const tokens: number[][] = prompts.map(() => []);
    const finish: Array<'stop' | 'length'> = prompts.map(() => 'length');
    const stops: Array<number | null> = prompts.map(() => null);
    const done = new Uint8Array(B);
    let logits = this.prefill(prompts);
    for (let step = 0; step < opts.maxNewTokens; step++) {
      const next = new Int32Array(B);
      for (let b = 0; b < B; b++) {
        if (done[b]) { next[b] = tokens[b]!.at(-1) ?? 0; continue; }
        const id = sample(logits.subarray(b * V, b * V + sv), s, rngs[b]!, seen, b * W);
        if (opts.stopIds?.includes(id)) { done[b] = 1; finish[b] = 'stop'; stops[b] = id; next[b] = id; continue; }
        tokens[b]!.push(id);
        next[b] = id;
      }
      if (done.every((d) => d === 1) || step + 1 === opts.maxNewTokens) break;
      logits = this.decode(next);
    }
    return { tokens, finish, stops };
  }
}
