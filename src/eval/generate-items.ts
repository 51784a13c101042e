/**
 * Generation items run on a model (the harness's HFLM.generate_until; what is done with the text: src/eval/generation.ts):
 * each item's prompt encoded as the harness encodes it (ChoiceEncoder: the tokenizer's own special tokens), cut on the
 * left to the model's positions less max_gen_toks, then generated greedily in batches, longest prompts first, on the
 * device's sampler (src/model/batch-generate.ts). A sequence ends at an end-of-sequence id of the model's generation
 * config, at the token budget, or as soon as its text holds a stop string that nothing later can move (the text kept is
 * the one before the first stop string; tokens after it would be cut anyway).
 */
import type { Tokenizer } from '../tokenizer/bpe.js';
import type { ChatFormat } from '../tokenizer/chat.js';
import type { Transformer } from '../model/transformer.js';
import { BatchGenerator } from '../model/batch-generate.js';
import { DistilleryError, InputError } from '../util/errors.js';
import { ChoiceEncoder, itemPrompts, type ChoicePrompt } from './encode.js';
import type { ChoiceItem } from './items.js';
import { cutAtStops, scoreGeneration, type GenerationOutcome, type GenerationSettings } from './generation.js';

/** Each generation item's prompt tokens for a model, and how many were cut on the left to fit. */
export interface GenerationPrompts { ids: number[][]; cut: number; longest: number }

/**
 * The items' prompts for a model: as text or chat turns (itemPrompts), encoded, each cut on the left to
 * `maxPositions − maxGenToks` tokens (the harness's left_truncate_len).
 */
export function generationPrompts(tok: Tokenizer, format: ChatFormat, items: readonly ChoiceItem[], prompt: ChoicePrompt, maxPositions: number, maxGenToks: number,
  who = 'model'): GenerationPrompts {
  const room = maxPositions - maxGenToks;
  if (room < 1) {
    throw new InputError(`--max-gen-toks ${maxGenToks} leaves no room for a prompt in the ${who}'s ${maxPositions} positions`, `use --max-gen-toks ${Math.max(1, Math.floor(maxPositions / 2))} or less`);
  }
  return cutPrompts(encodePrompts(tok, format, items, prompt), room);
}

/** The items' prompts encoded (itemPrompts, then ChoiceEncoder), uncut. */
export function encodePrompts(tok: Tokenizer, format: ChatFormat, items: readonly ChoiceItem[], prompt: ChoicePrompt): number[][] {
  const text = itemPrompts(format, items, prompt), enc = new ChoiceEncoder(tok, format);
  return items.map((it, i) => {
    const p = enc.encode(text(it, i, 0));
    if (p.length > 0) return p;
    // an empty prompt starts from the prefix token, as an empty context does
    const pre = enc.prefixToken();
    if (!pre) throw new InputError(`${it.where}: the prompt is empty, and the tokenizer has no BOS or end-of-text token to start from`, 'give the item a context');
    return [pre.id];
  });
}

/** Encoded prompts cut on the left to `room` tokens each (room ≥ 1). */
export function cutPrompts(encoded: readonly number[][], room: number): GenerationPrompts {
  let cut = 0, longest = 0;
  const ids = encoded.map((p) => {
    const q = p.length > room ? (cut++, p.slice(p.length - room)) : p;
    longest = Math.max(longest, q.length);
    return q;
  });
  return { ids, cut, longest };
}

/**
 * Whether generation can end: whether the text kept (cutAtStops: the stop strings split off one after another) is the
 * same for every text that goes on from this one. The split is followed with what is known: while the text may still
 * go on, a stop string found whole (and that cannot also start earlier, across the end) cuts it for good; one not found
 * leaves known only the text before where it could still begin. A trailing U+FFFD (a character whose bytes are not all
 * out yet) is not known text.
 */
export function stopsSettled(text: string, until: readonly string[]): boolean {
  let t = text.replace(/\uFFFD+$/, ''), open = true;
  for (const u of until) {
    if (!u) continue;
    if (!open) { t = t.split(u)[0]!; continue; }
    // the first place u could start where the text's end is a beginning of it (t.length at worst: after everything)
    let across = t.length;
    for (let q = Math.max(0, t.length - u.length + 1); q < t.length; q++) if (u.startsWith(t.slice(q))) { across = q; break; }
    const at = t.indexOf(u);
    if (at >= 0 && at < across) { t = t.slice(0, at); open = false; } else if (at < 0) t = t.slice(0, across);
    else return false;
  }
  return !open;
}

export interface GenerationRun {
  /** End-of-sequence ids (the model's generation config's, as transformers' generate stops at them). */
  stopIds: number[];
  /** Stop strings, the eos_token text among them (stopStrings). */
  until: string[];
  /** Sequences generated together. */
  batch: number;
  /** Called now and then with the items done. */
  progress?: (done: number) => void;
  /** The generator to use (its batch and length covering the prompts'); default: one made for them. */
  generator?: BatchGenerator;
  /** Awaited between batches: true stops the generation (runGeneration then gives null). */
  between?: () => Promise<boolean>;
}

/** Generates every prompt greedily and scores its text; outcomes in the items' order (null: `between` stopped it). */
export async function runGeneration(model: Transformer, tok: Tokenizer, items: readonly ChoiceItem[], prompts: GenerationPrompts, s: GenerationSettings,
  r: GenerationRun): Promise<GenerationOutcome[] | null> {
  const n = items.length, B = Math.max(1, Math.min(r.generator?.batch ?? r.batch, n));
  const gen = r.generator ?? new BatchGenerator(model, B, prompts.longest + s.maxGenToks);
  if (gen.maxLen < prompts.longest + s.maxGenToks) throw new DistilleryError(`a generator of ${gen.maxLen} positions for prompts of up to ${prompts.longest} tokens and ${s.maxGenToks} new ones`);
  const order = prompts.ids.map((_, i) => i).sort((a, b) => prompts.ids[b]!.length - prompts.ids[a]!.length || a - b);
  const out = new Array<GenerationOutcome>(n);
  const text = (ids: readonly number[]): string => tok.decode(ids, { skipSpecialTokens: true });
  // The whole text is decoded only once a stop string has shown: until then each step decodes the last tokens, enough
  // for the longest stop string (4 bytes a character at most, a token a byte at least). A string the tail misses (split
  // by special tokens) lets generation run on to the budget: later, never a different text.
  const tail = 4 * Math.max(0, ...r.until.map((u) => u.length)) + 8;
  for (let s0 = 0; s0 < n; s0 += B) {
    const part = order.slice(s0, s0 + B);
    const shown = new Uint8Array(part.length);
    const res = gen.generateOnDevice(part.map((i) => prompts.ids[i]!), {
      temperature: 0, topP: 1, maxNewTokens: s.maxGenToks, stopIds: r.stopIds,
      stopWhen: (b, ids) => {
        if (!shown[b]) {
          const t = text(ids.slice(-tail));
          if (!r.until.some((u) => u !== '' && t.includes(u))) return false;
          shown[b] = 1;
        }
        return stopsSettled(text(ids), r.until);
      },
    });
    part.forEach((i, k) => {
      const ids = res.tokens[k]!;
      out[i] = scoreGeneration(cutAtStops(text(ids), r.until), ids.length, items[i]!.generate!.targets, s, items[i]!.where);
    });
    r.progress?.(Math.min(n, s0 + B));
    if (s0 + B < n && r.between && await r.between()) return null;
  }
  return out;
}
