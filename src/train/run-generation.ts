/**
 * Generation items ({"context", "target"}: GSM8K's kind) in a train/distill run's --eval-choices: at every evaluation
 * the student continues each item's prompt greedily and exact_match scores the text (src/eval/generation.ts, as
 * `distillery eval --choices` scores generation items), a live teacher once; metrics.jsonl gets one
 * `val_exact_match_<filter>` per filter pipeline (`teacher_exact_match_<filter>` at step 0).
 *
 * - The prompts are encoded as eval encodes them and cut on the left to the run's --seq less --eval-max-gen-toks (the
 *   run's window is the harness's max_length here, as for the other items of a run; eval uses the model's positions, so
 *   the two agree when the prompts fit). The items are read, encoded and cut before anything is loaded or written.
 * - Generation runs on a BatchGenerator of --eval-gen-batch (default --batch) sequences of --seq positions over the run's own models (the
 *   student as it trains: its fused products, its LoRA adapters unmerged over its own batch × seq rows), the one the
 *   pre-warm plans (src/train/kernel-plan.ts `generateItems`) and the memory check counts; on-policy runs share theirs.
 * - Several ranks each generate every world-th item, and one host all-reduce of the matches gives every rank every
 *   item's; with one rank, a signal stops the generation between batches.
 */
import type { Communicator } from '../parallel/comm.js';
import type { Transformer } from '../model/transformer.js';
import type { BatchGenerator } from '../model/batch-generate.js';
import type { Tokenizer } from '../tokenizer/bpe.js';
import type { ChatFormat } from '../tokenizer/chat.js';
import type { RunOptions } from './options.js';
import { camelToKebab } from '../cli/args.js';
import { itemsByFile, readChoiceItems, type ChoiceItem } from '../eval/items.js';
import { InputError } from '../util/errors.js';
import { FEWSHOT_DEFAULTS, fewshotSaid, type FewshotOptions } from '../eval/fewshot.js';
import { GENERATION_PRESETS, generationSettings, stopStrings, type GenerationFlags, type GenerationPreset, type GenerationSettings } from '../eval/generation.js';
import { cutPrompts, encodePrompts, runGeneration, type GenerationPrompts } from '../eval/generate-items.js';

/** The run's options that only generation items use (refused without --eval-choices, said to do nothing without the items). */
export const RUN_GENERATION_FIELDS = ['evalMaxGenToks', 'evalGenBatch', 'evalUntil', 'evalFilter', 'evalExactMatch', 'evalPreset'] as const;
type GenerationField = Exclude<(typeof RUN_GENERATION_FIELDS)[number], 'evalGenBatch'>;
const FIELDS: Record<keyof GenerationFlags, GenerationField> = {
  maxGenToks: 'evalMaxGenToks', until: 'evalUntil', filter: 'evalFilter', exactMatch: 'evalExactMatch', preset: 'evalPreset',
};

/** The run's generation settings from its options (InputErrors naming the setting through `flag`, e.g. '--eval-filter'). */
export function runGenerationSettings(o: Pick<RunOptions, GenerationField>,
  flag: (f: GenerationField) => string = (f) => `--${camelToKebab(f)}`): GenerationSettings {
  return generationSettings({
    maxGenToks: o.evalMaxGenToks, until: o.evalUntil.length ? o.evalUntil : undefined, filter: o.evalFilter.length ? o.evalFilter : undefined,
    exactMatch: o.evalExactMatch !== '' ? o.evalExactMatch : undefined, preset: o.evalPreset !== '' ? o.evalPreset : undefined,
  }, FEWSHOT_DEFAULTS.delimiter, (k) => flag(FIELDS[k]));
}

/**
 * Whether the run's --eval-choices hold generation items, refusing them where --seq leaves no room (the new tokens and
 * at least one prompt token), before any data work: reads the items' kinds only.
 */
export function checkGenerationRoom(o: Pick<RunOptions, GenerationField | 'seq' | 'evalChoices'>): boolean {
  if (!o.evalChoices.length || !readChoiceItems(o.evalChoices).some((it) => it.generate)) return false;
  roomFor(o.seq, runGenerationSettings(o).maxGenToks);
  return true;
}

/** The prompt tokens a window of `seq` leaves beside `maxGenToks` new ones (at least 1, else refused). */
function roomFor(seq: number, maxGenToks: number): number {
  const room = seq - maxGenToks;
  if (room < 1) {
    throw new InputError(`--eval-max-gen-toks ${maxGenToks} leaves no room for a generation item's prompt in the run's window (--seq ${seq})`,
      `use --eval-max-gen-toks ${Math.max(1, Math.floor(seq / 2))} or less, or a longer --seq`);
  }
  return room;
}

/** The generation items of a run, read, encoded and cut (prepareRunGeneration). */
export interface PreparedGeneration {
  items: ChoiceItem[];
  settings: GenerationSettings;
  /** Each item's prompt, cut to --seq less max_gen_toks. */
  prompts: GenerationPrompts;
  /** The stop strings (the settings' and the tokenizer's eos_token). */
  until: string[];
}

/**
 * The generation items' prompts and settings (host work only). `fewshot`: the examples of the other items, or
 * undefined; a --eval-preset's own number of examples applies when it is undefined.
 */
export function prepareRunGeneration(items: ChoiceItem[], o: Pick<RunOptions, GenerationField | 'seq'> & { chat: boolean; kwargs?: Record<string, unknown> | undefined;
  systemInstruction?: string | undefined; fewshot?: Omit<FewshotOptions, 'n'> & { n?: number } | undefined; fewshotFrom?: string[] | undefined;
  /** Whether the number of examples was given (0 too); if not, a preset's own apply. */
  fewshotGiven?: boolean | undefined },
  tokenizer: Tokenizer, chat: ChatFormat, log: (s: string) => void): PreparedGeneration {
  const settings = runGenerationSettings(o);
  const room = roomFor(o.seq, settings.maxGenToks);
  // a preset's examples (gsm8k: 5) where --eval-fewshot is not given (as eval --preset without --fewshot)
  const given = o.fewshotGiven ?? (o.fewshot?.n ?? 0) > 0;
  const n = given ? o.fewshot?.n ?? 0 : o.evalPreset !== '' ? presetFewshot(o.evalPreset) : 0;
  const fewshot: FewshotOptions | undefined = n > 0 ? { sampler: FEWSHOT_DEFAULTS.sampler, seed: FEWSHOT_DEFAULTS.seed, delimiter: FEWSHOT_DEFAULTS.delimiter, ...o.fewshot, n } : undefined;
  const encoded = encodePrompts(tokenizer, chat, items, { chat: o.chat, kwargs: o.kwargs, fewshot, systemInstruction: o.systemInstruction || undefined, warn: log });
  const prompts = cutPrompts(encoded, room);
  const eosId = tokenizer.eosId;
  const eosText = chat.eosToken !== '' ? chat.eosToken : eosId !== undefined ? tokenizer.idToToken(eosId) ?? null : null;
  const until = stopStrings(settings.until, eosText);
  log(`generation: ${items.length} items${fewshotSaid(fewshot, o.fewshotFrom)}${o.chat ? ' (prompts through the chat template)' : ''}, greedy, up to ${settings.maxGenToks} new tokens, ` +
    `until ${JSON.stringify(until)}; filters ${settings.filters.map((f) => f.name).join(', ')}; generated at every evaluation`);
  if (prompts.cut) log(`warning: --eval-choices: ${prompts.cut} of ${items.length} generation prompts are cut on the left to ${room} tokens (--seq ${o.seq} less --eval-max-gen-toks ${settings.maxGenToks})`);
  return { items, settings, prompts, until };
}

function presetFewshot(name: string): number {
  return GENERATION_PRESETS[name as GenerationPreset]?.fewshot ?? 0;
}

/** How often a long generation says how far it is. */
const PROGRESS_MS = 10_000;

/** exact_match per filter pipeline, by the pipeline's name. */
export type ExactMatchScores = Record<string, number>;

/** Scores a model's generation of the prepared items (see the module comment). */
export class RunGeneration {
  /** `log` gets a line per generation: the tokens, items and time (this rank's). */
  constructor(private readonly p: PreparedGeneration, private readonly tokenizer: Tokenizer, private readonly stopIds: readonly number[],
    private readonly comm: Pick<Communicator, 'world' | 'rank' | 'allReduceHost'>, private readonly log: (s: string) => void = () => {}) {}

  get items(): number { return this.p.items.length; }

  /**
   * The model's exact_match per filter over every item, and over each file's items; null when `stop()` said so between
   * batches (one rank only).
   */
  async score(model: Transformer, generator: BatchGenerator, stop: () => boolean, who = 'the model'):
    Promise<{ all: ExactMatchScores; files: Array<{ file: string; exactMatch: ExactMatchScores }> } | null> {
    const { items, prompts, settings } = this.p, world = this.comm.world, rank = this.comm.rank, t0 = Date.now();
    let said = t0;
    const mine = items.map((_, i) => i).filter((i) => i % world === rank);
    const ids = mine.map((i) => prompts.ids[i]!);
    const got = await runGeneration(model, this.tokenizer, mine.map((i) => items[i]!), { ids, cut: 0, longest: Math.max(0, ...ids.map((x) => x.length)) }, settings, {
      stopIds: [...this.stopIds], until: this.p.until, batch: generator.batch, generator,
      // a line every PROGRESS_MS on long work (GSM8K's 1319 items take a while)
      progress: (done) => { if (done < mine.length && Date.now() - said > PROGRESS_MS) { said = Date.now(); this.log(`generation: ${who} ${done}/${mine.length} items`); } },
      ...(world === 1 ? { between: async () => { await new Promise<void>((resolve) => setImmediate(resolve)); return stop(); } } : {}),
    });
    if (got === null) return null;
    const sec = (Date.now() - t0) / 1000, tokens = got.reduce((a, x) => a + x.tokens, 0);
    this.log(`generation: ${who} generated ${tokens} tokens for ${mine.length} items${world > 1 ? ` (rank ${rank}'s share)` : ''} in ${sec.toFixed(2)} s (${Math.round(tokens / Math.max(sec, 1e-3))} tokens/s, ${Math.min(generator.batch, mine.length)} at a time)`);
    // every item's matches, [item][filter], from each rank's share (0 where another rank generated)
    const F = settings.filters.length;
    let flat: Float64Array = new Float64Array(items.length * F);
    mine.forEach((i, k) => { for (let f = 0; f < F; f++) flat[i * F + f] = got[k]!.matches[f]!; });
    if (world > 1) flat = this.comm.allReduceHost(flat);
    const mean = (idx: readonly number[]): ExactMatchScores => {
      const out: ExactMatchScores = {};
      settings.filters.forEach((f, k) => {
        let sum = 0;
        for (const i of idx) sum += flat[i * F + k]!;
        out[f.name] = sum / Math.max(1, idx.length);
      });
      return out;
    };
    return { all: mean(items.map((_, i) => i)), files: itemsByFile(items).map(({ file, idx }) => ({ file, exactMatch: mean(idx) })) };
  }
}
