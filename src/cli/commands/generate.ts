/**
 * `distillery generate`: loads a checkpoint folder (or a Hub id from the local HF cache), encodes the prompt
 * (optionally rendered as a user turn with the model's own chat template, run as Jinja), and streams the decoded text as tokens arrive,
 * stopping at the tokenizer's end-of-sequence token, the config's and generation_config.json's eos ids (and at
 * `<|im_end|>` or `<|eot_id|>` with --chat) or after --max-new-tokens. Greedy by default (--temperature 0), so the output
 * is deterministic; with a temperature > 0 it is reproducible from --seed.
 */
import { resolvePrecision, PRECISION_CHOICES, type PrecisionFlag } from '../../train/precision.js';
import * as fs from 'node:fs';
import { formatHelp, parseArgs, UsageError, type FlagSpec, type Io } from '../args.js';
import type { Command } from '../command.js';
import { createBackend, cudaOptionsFromFlags, threadsProblem, type CudaOptions } from '../../backend/create.js';
import type { LoadedCheckpoint } from '../../model/checkpoint.js';
import { describeMerge, readModelOrAdapter } from '../../model/adapter.js';
import { BatchGenerator } from '../../model/batch-generate.js';
import { describeBaked, eosIds } from '../../model/config.js';
import { Transformer } from '../../model/transformer.js';
import { Generator } from '../../model/generate.js';
import { jobClosures } from '../../train/kernel-plan.js';
import type { Tokenizer } from '../../tokenizer/bpe.js';
import { DistilleryError, InputError, fileError } from '../../util/errors.js';
import { DEFAULT_RUN_OPTIONS } from '../../train/options.js';
import { chatFormatOf, endOfTurnIds, renderChat, type ChatMessage } from '../../tokenizer/chat.js';
import { parseTemplateKwargs } from '../options.js';
import { resolveModelArg } from '../model-ref.js';
import { parseJsonlLine } from '../../data/index.js';
import { isJsonObject, parsePyJson } from '../../util/py-json.js';

/** --base: the base model of a LoRA adapter folder given as --model (eval, generate). */
export const BASE_FLAG: FlagSpec = { name: 'base', kind: 'string', metavar: '<dir>', description: 'with a LoRA adapter folder as --model: its base model (default: the folder the adapter names)' };

const FLAGS: FlagSpec[] = [
  { name: 'model', kind: 'string', metavar: '<dir|hub id>', description: 'checkpoint folder (config.json, model.safetensors, tokenizer.json) or a Hub id in the local HF cache (required)' },
  BASE_FLAG,
  { name: 'prompt', kind: 'string', metavar: '<text>', description: 'the text to continue (this or --prompts)' },
  { name: 'prompts', kind: 'string', metavar: '<file.jsonl>', description: 'many prompts, one JSON object per line ({"prompt"} or {"text"}: text to continue; {"messages"}: a conversation, rendered with the chat template and an open assistant turn), generated in batches; one JSON line per prompt to stdout' },
  { name: 'batch', kind: 'integer', description: 'with --prompts: sequences generated together (prompts of different lengths share a batch)', defaultText: '8' },
  { name: 'top-k', kind: 'integer', description: 'keep the k most likely tokens (0 = off)', defaultText: '0' },
  { name: 'max-new-tokens', kind: 'integer', description: 'most tokens to generate', defaultText: '64' },
  { name: 'temperature', kind: 'number', description: 'sampling temperature; 0 = greedy (deterministic)', defaultText: '0' },
  { name: 'top-p', kind: 'number', description: 'nucleus sampling: keep the most likely tokens up to this total probability (1 = off)', defaultText: '1' },
  { name: 'min-p', kind: 'number', description: 'keep only tokens at least this fraction as likely as the most likely one, as transformers\' min_p (0 = off)', defaultText: '0' },
  { name: 'repetition-penalty', kind: 'number', description: 'transformers\' repetition_penalty: divide the positive logits (multiply the negative ones) of every id already in the sequence, prompt included, by this, greedy too (1 = off)', defaultText: '1' },
  { name: 'generation-config', kind: 'string', choices: ['none', 'auto'], description: "auto: sample (or not) as the model's generation_config.json says, as transformers' generate() does (do_sample, temperature, top_k, top_p, min_p, repetition_penalty; flags given override them); none: greedy unless sampling flags are given", defaultText: 'none' },
  { name: 'seed', kind: 'integer', description: 'random seed for sampling', defaultText: String(DEFAULT_RUN_OPTIONS.seed) },
  { name: 'chat', kind: 'boolean', description: "render the prompt as a user turn with the model's chat template (Jinja) and open the assistant turn" },
  { name: 'chat-template-kwargs', kind: 'string', metavar: '<json>', description: 'with --chat: template options, a JSON object of extra template variables, e.g. \'{"enable_thinking": false}\'' },
  { name: 'device', kind: 'string', choices: ['cpu', 'cuda'], description: 'where to compute', defaultText: 'cpu' },
  { name: 'threads', kind: 'integer', description: 'CPU threads (0 = all cores)', defaultText: '0' },
];

/**
 * --precision for eval and generate, as train and distill read it (src/train/precision.ts): auto is bf16 on CUDA (bf16
 * weights and activations, bf16 tensor-core products with fp32 accumulation), fp32 on the CPU.
 */
export const PRECISION_FLAG: FlagSpec = {
  name: 'precision', kind: 'string', choices: [...PRECISION_CHOICES],
  description: 'storage and matrix-product precision: auto (bf16 on cuda, fp32 on cpu), bf16, tf32 (cuda), fp32', defaultText: 'auto',
};

/** CUDA-only flags (train, distill, generate, eval): see CudaOptions in src/backend/create.ts. */
export const CUDA_FLAGS: FlagSpec[] = [
  { name: 'verbose-kernels', kind: 'boolean', description: 'CUDA: print one line per kernel compile' },
  { name: 'strict-kernels', kind: 'boolean', description: 'CUDA: a kernel compile after pre-warm is an error' },
  { name: 'kernel-cache-dir', kind: 'string', metavar: '<dir>', description: 'CUDA: kernel cache folder (default: $DISTILLERY_CACHE_DIR or ~/.cache/distillery/kernels)' },
  { name: 'tf32', kind: 'boolean', description: 'CUDA: TF32 tensor-core matrix products (faster, ~1e-3 relative error)' },
];
FLAGS.push(PRECISION_FLAG, ...CUDA_FLAGS);

export interface GenerateOptions {
  model: string;
  /** The base of a LoRA adapter folder given as `model` (default: the one the adapter names). */
  base?: string | undefined;
  /** One prompt (streamed), or '' with `prompts`. */
  prompt: string;
  /** A JSONL file of prompts, generated in batches of `batch` (src/model/batch-generate.ts). */
  prompts?: string | undefined;
  batch: number;
  topK: number;
  maxNewTokens: number;
  temperature: number;
  topP: number;
  /** transformers' min_p (0 = off). */
  minP: number;
  /** transformers' repetition_penalty (1 = off). */
  repetitionPenalty: number;
  seed: number;
  chat: boolean;
  chatTemplateKwargs?: string | undefined;
  device: 'cpu' | 'cuda';
  threads: number;
  /** --precision (default auto: bf16 on CUDA, fp32 on the CPU). */
  precision?: PrecisionFlag | undefined;
  cuda?: CudaOptions;
  /** Whether a flag that samples was given (--temperature, --top-k, --top-p, --min-p; else generation_config.json's sampling is announced). */
  samplingGiven?: boolean;
  /** The sampling flags given (their names without --), which override generation_config.json's values with --generation-config auto. */
  samplingFlags?: string[];
  /** 'auto': sample as the model's generation_config.json says (sampleAsConfig); 'none' (default): greedy unless told. */
  generationConfig?: 'none' | 'auto';
}

/**
 * The settings of a generation_config.json that transformers' generate() would act on and distillery's generation does
 * not run, off their neutral values, as "key value" (empty: it runs everything the file asks). The ones transformers
 * applies only when sampling count only where the file samples. max_new_tokens and max_length are not among them:
 * --max-new-tokens sets the length.
 */
export function unrunSettings(gen: Record<string, unknown>): string[] {
  const sampling = gen.do_sample === true;
  const set = (v: unknown): boolean => v !== undefined && v !== null && !(Array.isArray(v) && v.length === 0) && !(typeof v === 'object' && !Array.isArray(v) && Object.keys(v as object).length === 0);
  const off: Array<[string, (v: unknown) => boolean]> = [
    ['num_beams', (v) => v !== 1], ['num_beam_groups', (v) => v !== 1], ['diversity_penalty', (v) => v !== 0],
    ['penalty_alpha', (v) => v !== 0], ['no_repeat_ngram_size', (v) => v !== 0], ['encoder_repetition_penalty', (v) => v !== 1],
    ['encoder_no_repeat_ngram_size', (v) => v !== 0], ['min_length', (v) => v !== 0], ['min_new_tokens', (v) => v !== 0],
    ['suppress_tokens', () => true], ['begin_suppress_tokens', () => true], ['bad_words_ids', () => true], ['sequence_bias', () => true],
    ['forced_bos_token_id', () => true], ['forced_eos_token_id', () => true], ['exponential_decay_length_penalty', () => true],
    ['guidance_scale', (v) => v !== 1], ['dola_layers', () => true], ['watermarking_config', () => true],
    ...(sampling ? [['typical_p', (v: unknown) => v !== 1], ['epsilon_cutoff', (v: unknown) => v !== 0], ['eta_cutoff', (v: unknown) => v !== 0], ['top_h', () => true]] as Array<[string, (v: unknown) => boolean]> : []),
  ];
  return off.filter(([k, isOff]) => set(gen[k]) && isOff(gen[k])).map(([k]) => `${k} ${JSON.stringify(gen[k])}`);
}

/** transformers' sampling defaults where a generation_config.json is silent (min_p: none). */
const HF_SAMPLING_DEFAULTS = { temperature: 1, top_k: 50, top_p: 1, min_p: 0, repetition_penalty: 1 } as const;

/**
 * A generation_config.json's sampling values, transformers' defaults where it is silent. `num` reads one (the notice
 * reads leniently; --generation-config auto refuses a value that is not a number).
 */
function fileSampling(gen: Record<string, unknown>, num: (k: keyof typeof HF_SAMPLING_DEFAULTS, d: number) => number) {
  const d = HF_SAMPLING_DEFAULTS;
  return {
    sampling: gen.do_sample === true, temperature: num('temperature', d.temperature), topK: num('top_k', d.top_k),
    topP: num('top_p', d.top_p), minP: num('min_p', d.min_p), repetitionPenalty: num('repetition_penalty', d.repetition_penalty),
  };
}

/** The cut flags (top-k, top-p, min-p) given with a value that cuts: with greedy decoding they would do nothing. */
function cutsGiven(o: { topK: number; topP: number; minP: number }, given: (flag: string) => boolean): string[] {
  return ([['top-k', o.topK !== 0], ['top-p', o.topP !== 1], ['min-p', o.minP !== 0]] as Array<[string, boolean]>)
    .filter(([f, on]) => on && given(f)).map(([f]) => `--${f}`);
}

/**
 * The sampling settings out of their range, as [flag, "must be …", hint], in the order the flags are checked (the flags'
 * values and those --generation-config auto resolves).
 */
function samplingRangeProblems(o: { temperature: number; topP: number; minP: number; repetitionPenalty: number; topK: number }): Array<[string, number, string, string]> {
  const all: Array<[string, number, boolean, string, string]> = [
    ['temperature', o.temperature, o.temperature >= 0, 'must be >= 0', 'use 0 for greedy decoding, or e.g. 0.8 to sample'],
    ['top-p', o.topP, o.topP > 0 && o.topP <= 1, 'must be in (0, 1]', 'use 1 to turn nucleus sampling off, or e.g. 0.9'],
    ['min-p', o.minP, o.minP >= 0 && o.minP <= 1, 'must be in [0, 1]', 'use 0 to turn it off, or e.g. 0.05'],
    ['repetition-penalty', o.repetitionPenalty, o.repetitionPenalty > 0 && Number.isFinite(o.repetitionPenalty), 'must be a positive number', 'use 1 to turn it off, or e.g. 1.1 (above 1 discourages repeats)'],
    ['top-k', o.topK, Number.isInteger(o.topK) && o.topK >= 0, 'must be an integer >= 0', 'use 0 to turn it off, or e.g. 50'],
  ];
  return all.filter(([, , ok]) => !ok).map(([f, v, , must, hint]) => [f, v, must, hint]);
}

/**
 * What transformers' generate() would do by default with a generation_config.json that samples or penalizes repetition,
 * and distillery does not (it decodes greedily, without a penalty, unless told): one line saying so, with the flags that
 * do as the file says and the settings distillery does not apply, by name; null when the file asks for neither.
 * transformers' defaults where the file is silent: temperature 1, top_p 1, top_k 50, min_p none, repetition_penalty 1.
 */
export function samplingNotice(gen: Record<string, unknown> | null, file: string): string | null {
  if (!gen) return null;
  const f = fileSampling(gen, (k, d) => (typeof gen[k] === 'number' ? gen[k] as number : d));
  const { sampling, temperature: t, topP: p, topK: k, minP } = f, penalty = f.repetitionPenalty;
  if (!sampling && penalty === 1) return null;
  const said = [
    ...(sampling ? [`do_sample: true, temperature ${t}`, `top_p ${p}`, `top_k ${k}${typeof gen.top_k === 'number' ? '' : ' (transformers\' default)'}`] : ['do_sample: false']),
    ...(sampling && minP > 0 ? [`min_p ${minP}`] : []), ...(penalty !== 1 ? [`repetition_penalty ${penalty}`] : []),
  ];
  const flags = [
    ...(sampling ? [`--temperature ${t}`, ...(p < 1 ? [`--top-p ${p}`] : []), ...(k > 0 ? [`--top-k ${k}`] : []), ...(minP > 0 ? [`--min-p ${minP}`] : [])] : []),
    ...(penalty !== 1 ? [`--repetition-penalty ${penalty}`] : []),
  ];
  // what distillery's generation does not run, where the file sets it off its neutral value (as --generation-config auto refuses)
  const unapplied = unrunSettings(gen);
  const what = sampling ? 'samples' : 'penalizes repetition';
  return `note: ${file} ${what} (${said.join(', ')}), as transformers' generate() would; distillery decodes greedily${sampling ? '' : ' without a penalty'} unless told: `
    + `${flags.join(' ')} ${sampling ? 'samples' : 'decodes'} as it says${unapplied.length ? `, without ${unapplied.join(', ')}, which distillery does not apply` : ' (so does --generation-config auto)'}`;
}

/**
 * Turns a stream of token ids into text pieces. A token can end in the middle of a multi-byte UTF-8 character,
 * so text is held back while the decoded tail is an incomplete character (U+FFFD).
 */
export class StreamDecoder {
  private ids: number[] = [];
  private emitted = 0;
  constructor(private readonly tok: Tokenizer) {}
  /** Adds one id; returns the newly completed text (possibly ''). */
  push(id: number): string {
    this.ids.push(id);
    const text = this.tok.decode(this.ids, { skipSpecialTokens: true });
    if (text.endsWith('\uFFFD')) return '';
    const piece = text.slice(this.emitted);
    this.emitted = text.length;
    // Restart the window at a character boundary so decoding stays linear in the output length.
    if (this.ids.length > 64) { this.ids = []; this.emitted = 0; }
    return piece;
  }
  /** Whatever is still held back (an incomplete character at the very end). */
  flush(): string {
    const text = this.tok.decode(this.ids, { skipSpecialTokens: true });
    const piece = text.slice(this.emitted);
    this.ids = []; this.emitted = 0;
    return piece;
  }
}

function num(v: unknown, d: number): number { return typeof v === 'number' ? v : d; }

/** The flags that shape sampling. */
const SAMPLING_FLAGS = ['temperature', 'top-p', 'top-k', 'min-p', 'repetition-penalty'];

/**
 * The sampling settings of generation_config.json as transformers' generate() reads them (--generation-config auto),
 * with the flags given overriding: do_sample false is greedy (temperature 0; the cuts then do nothing), true samples at
 * the file's temperature, top_k, top_p and min_p, with transformers' defaults where it is silent (temperature 1, top_k 50,
 * top_p 1, no min_p); repetition_penalty applies either way (default 1). A setting distillery does not run (beam search,
 * typical_p, no_repeat_ngram_size, epsilon or eta cutoffs, ...) is refused by name: following the file halfway would not
 * be what transformers does. No file: transformers' defaults (greedy). `file` names the file in messages.
 */
export function sampleAsConfig(o: GenerateOptions, gen: Record<string, unknown> | null, file: string): { options: GenerateOptions; said: string } {
  const g = gen ?? {};
  const num2 = (k: string, d: number): number => {
    const v = g[k];
    if (v === undefined || v === null) return d;
    if (typeof v !== 'number' || !Number.isFinite(v)) throw new InputError(`${file}: ${k} is ${JSON.stringify(v)}, not a number`, 'fix the file, or pass --generation-config none and the sampling flags');
    return v;
  };
  const refused = unrunSettings(g);
  if (refused.length) {
    throw new InputError(`${file} asks for ${refused.join(', ')}, which distillery's generation does not run`,
      'pass --generation-config none and the sampling flags (--temperature, --top-k, --top-p, --min-p, --repetition-penalty) you want');
  }
  // the cuts are the file's (transformers' defaults where it is silent) whenever the run samples: a --temperature above 0
  // over a file that decodes greedily samples with them too
  const sampling = g.do_sample === true;
  const { sampling: _, ...file0 } = fileSampling(g, (k, d) => (k === 'temperature' && !sampling ? d : num2(k, d))); // a greedy file's temperature is not read
  if (sampling && file0.temperature <= 0) {
    throw new InputError(`${file} samples (do_sample true) at temperature ${file0.temperature}, which transformers refuses`, 'fix the file (do_sample false decodes greedily), or pass --generation-config none');
  }
  const fromFile = { ...file0, temperature: sampling ? file0.temperature : 0 };
  const given = new Set(o.samplingFlags ?? []);
  const pick = <K extends keyof typeof fromFile>(k: K, flag: string): number => (given.has(flag) ? o[k] : fromFile[k]);
  const temperature = pick('temperature', 'temperature');
  // greedy: the file's cuts do nothing (the flags' are checked below)
  const cut = <K extends 'topK' | 'topP' | 'minP'>(k: K, flag: string, neutral: number): number => (temperature > 0 || given.has(flag) ? pick(k, flag) : neutral);
  const options: GenerateOptions = {
    ...o, temperature, topK: cut('topK', 'top-k', 0), topP: cut('topP', 'top-p', 1), minP: cut('minP', 'min-p', 0),
    repetitionPenalty: pick('repetitionPenalty', 'repetition-penalty'),
  };
  // the values the run now has, checked as the flags are
  if (samplingRangeProblems(options).length) {
    throw new InputError(`${file}: sampling settings out of range (temperature ${options.temperature}, top_k ${options.topK}, top_p ${options.topP}, min_p ${options.minP}, repetition_penalty ${options.repetitionPenalty})`,
      'fix the file, or pass --generation-config none and the sampling flags');
  }
  const cuts = cutsGiven(options, (f) => given.has(f));
  if (options.temperature === 0 && cuts.length) {
    throw new UsageError(`${cuts.join(', ')} ${cuts.length > 1 ? 'shape' : 'shapes'} sampling, and ${file} decodes greedily (do_sample ${JSON.stringify(g.do_sample ?? false)})${given.has('temperature') ? ' or --temperature is 0' : ''}`,
      'add e.g. --temperature 0.7 to sample, or drop the flag');
  }
  const parts = options.temperature > 0
    ? [`temperature ${options.temperature}`, ...(options.topK > 0 ? [`top_k ${options.topK}`] : []), ...(options.topP < 1 ? [`top_p ${options.topP}`] : []), ...(options.minP > 0 ? [`min_p ${options.minP}`] : [])]
    : ['greedy'];
  if (options.repetitionPenalty !== 1) parts.push(`repetition_penalty ${options.repetitionPenalty}`);
  const source = gen ? file : `transformers' defaults (no ${file})`;
  return { options, said: `sampling: ${parts.join(', ')} (${source}${given.size ? `, overridden by ${[...given].map((f) => `--${f}`).join(' ')}` : ''})` };
}

/** Validates parsed flags into GenerateOptions (pure). */
export function generateOptions(values: Record<string, unknown>): GenerateOptions {
  if (typeof values.model !== 'string') throw new UsageError('generate: no model given (--model)', 'pass --model <checkpoint folder>, e.g. --model runs/demo/final');
  if (typeof values.prompt === 'string' && typeof values.prompts === 'string') {
    throw new UsageError('generate: --prompt and --prompts: pass one of them', '--prompt continues one text; --prompts reads a JSONL file of them');
  }
  if (typeof values.prompt !== 'string' && typeof values.prompts !== 'string') {
    throw new UsageError('generate: no prompt given (--prompt or --prompts)', "pass --prompt 'Once upon a time', or --prompts prompts.jsonl");
  }
  if (typeof values.prompt === 'string') {
    // --batch belongs to --prompts (the single prompt streams): refused, not ignored
    if (values.batch !== undefined) throw new UsageError('generate: --batch goes with --prompts', 'put the prompt in a .jsonl file and pass --prompts, or drop the flag');
  }
  if (typeof values.prompts === 'string' && !fs.existsSync(values.prompts)) {
    throw new UsageError(`--prompts: ${values.prompts} does not exist`, 'pass a .jsonl file with one {"prompt": ...} or {"messages": [...]} per line');
  }
  if (typeof values['chat-template-kwargs'] === 'string') {
    // template options apply to a chat rendering only: refused without one, not ignored
    if (typeof values.prompt === 'string' && values.chat !== true) {
      throw new UsageError('generate: --chat-template-kwargs goes with --chat', 'add --chat to render the prompt with the model\'s chat template, or drop the flag');
    }
    parseTemplateKwargs(values['chat-template-kwargs']); // fails early, exit 2
  }
  const o: GenerateOptions = {
    model: values.model, ...(typeof values.base === 'string' ? { base: values.base } : {}), prompt: typeof values.prompt === 'string' ? values.prompt : '',
    prompts: typeof values.prompts === 'string' ? values.prompts : undefined, batch: num(values.batch, 8), topK: num(values['top-k'], 0),
    maxNewTokens: num(values['max-new-tokens'], 64), temperature: num(values.temperature, 0), topP: num(values['top-p'], 1),
    minP: num(values['min-p'], 0), repetitionPenalty: num(values['repetition-penalty'], 1),
    seed: num(values.seed, DEFAULT_RUN_OPTIONS.seed), chat: values.chat === true,
    ...(typeof values['chat-template-kwargs'] === 'string' ? { chatTemplateKwargs: values['chat-template-kwargs'] } : {}),
    device: (values.device as 'cpu' | 'cuda' | undefined) ?? 'cpu', threads: num(values.threads, 0),
    cuda: cudaOptionsFromFlags(values),
    ...(typeof values.precision === 'string' ? { precision: values.precision as PrecisionFlag } : {}),
    samplingGiven: SAMPLING_FLAGS.some((f) => f !== 'repetition-penalty' && values[f] !== undefined),
    samplingFlags: SAMPLING_FLAGS.filter((f) => values[f] !== undefined),
    ...(values['generation-config'] === 'auto' ? { generationConfig: 'auto' as const } : {}),
  };
  if (!(Number.isInteger(o.maxNewTokens) && o.maxNewTokens > 0)) throw new UsageError(`--max-new-tokens must be a positive integer, got ${o.maxNewTokens}`, 'e.g. --max-new-tokens 64');
  if (!(Number.isInteger(o.batch) && o.batch > 0)) throw new UsageError(`--batch must be a positive integer, got ${o.batch}`, 'e.g. --batch 8');
  const bad = samplingRangeProblems(o)[0];
  if (bad) throw new UsageError(`--${bad[0]} ${bad[2]}, got ${bad[1]}`, bad[3]);
  // the cuts shape a sampled distribution: with greedy decoding they would do nothing, so they are refused, not ignored
  const cuts = cutsGiven(o, (f) => values[f] !== undefined);
  if (o.temperature === 0 && cuts.length && o.generationConfig !== 'auto') { // with auto, the file may sample: sampleAsConfig checks
    throw new UsageError(`${cuts.join(', ')} ${cuts.length > 1 ? 'shape' : 'shapes'} sampling, and --temperature is 0 (greedy decoding)`, 'add e.g. --temperature 0.7 to sample, or drop the flag (--repetition-penalty applies to greedy decoding too)');
  }
  const threadsBad = threadsProblem(o.threads);
  if (threadsBad !== null) throw new UsageError(`--threads must be ${threadsBad}, got ${o.threads}`, 'use 0 for all cores');
  return o;
}

/** Checks that a model folder exists before anything is loaded (a usage error, exit 2). */
export function requireModelDir(dir: string, flag: string): void {
  if (!fs.existsSync(dir)) throw new UsageError(`${flag}: checkpoint folder ${dir} does not exist`, 'pass a folder with config.json and model.safetensors');
  if (!fs.statSync(dir).isDirectory()) throw new UsageError(`${flag}: ${dir} is a file, not a checkpoint folder`, 'pass the folder that holds config.json and model.safetensors');
}

/** Runs generation, writing text to io.out as it is produced; returns the generated ids. */
export async function generate(o: GenerateOptions, io: Io): Promise<number[]> {
  const dir = resolveModelArg(o.model, '--model');
  requireModelDir(dir, '--model');
  const ck = readModelOrAdapter(dir, { base: o.base, tensorByTensor: true });
  if (ck.adapter) io.err(`${describeMerge(ck.adapter)}\n`);
  const { tokenizer, config } = ck;
  io.err(`model: ${describeBaked(config)}\n`);
  if (o.generationConfig === 'auto') {
    const r = sampleAsConfig(o, ck.generationConfig, `${o.model}'s generation_config.json`);
    o = r.options;
    io.err(`${r.said}\n`);
  } else {
    const notice = o.samplingGiven ? null : samplingNotice(ck.generationConfig, `${o.model}'s generation_config.json`);
    if (notice) io.err(`${notice}\n`);
  }
  if (!tokenizer) throw new DistilleryError(`${o.model} has no tokenizer.json`, 'generation needs the tokenizer the model was trained with; copy its tokenizer.json into the folder');
  if (o.prompts !== undefined) return generateBatched(o, io, ck, tokenizer);
  let text = o.prompt;
  if (o.chat) {
    const format = chatFormatOf(ck.chatTemplate, `${o.model}'s tokenizer_config.json`, ck.tokenizerConfig);
    const kwargs = o.chatTemplateKwargs !== undefined ? parseTemplateKwargs(o.chatTemplateKwargs) : undefined;
    text = renderChat(format, [{ role: 'user', content: o.prompt }], { addGenerationPrompt: true, ...(kwargs ? { kwargs } : {}) });
  }
  // a text prompt as transformers' tokenizer(prompt) starts it (Llama 3's <|begin_of_text|>), as training saw text;
  // a chat rendering holds its template's own special tokens
  const body = tokenizer.encode(text);
  if (body.length === 0) throw new UsageError('--prompt is empty after tokenization', 'pass a non-empty prompt');
  const prompt = o.chat ? body : [...tokenizer.documentPrefix, ...body];
  const limit = config.maxPositionEmbeddings;
  if (prompt.length >= limit) {
    throw new UsageError(`the prompt is ${prompt.length} tokens; the model holds at most ${limit} positions`, 'shorten --prompt');
  }
  const maxLen = Math.min(limit, prompt.length + o.maxNewTokens);
  const prec = resolvePrecision(o.precision, o.cuda?.tf32, o.device);
  io.err(`precision: ${prec.name}\n`);
  if (maxLen < prompt.length + o.maxNewTokens) {
    io.err(`note: the model holds ${limit} positions: at most ${maxLen - prompt.length} of the ${o.maxNewTokens} new tokens fit after the ${prompt.length}-token prompt\n`);
  }
  const backend = await createBackend({ device: o.device, threads: o.threads, ...o.cuda, tf32: prec.tf32 });
  try {
    // Pre-warm (CUDA): compile every kernel generation launches (prefill + decode), then seal, before any weights.
    if (backend.prepare) {
      await backend.prepare(jobClosures({ student: config, batch: 1, seq: 1, generateLen: Math.max(2, maxLen), precision: prec.model }));
    }
    const model = new Transformer(backend, config, { batch: 1, seq: 1, training: false, label: 'generate', precision: prec.model });
    model.setWeights(ck.weights);
    // With --chat, the end-of-turn markers of the ChatML and Llama 3 templates end the reply too.
    const stopIds = stopIdsOf(ck, tokenizer, o.chat);
    const gen = new Generator(model, maxLen);
    const dec = new StreamDecoder(tokenizer);
    const ids = gen.generate(prompt, {
      temperature: o.temperature, topP: o.topP, topK: o.topK, minP: o.minP, repetitionPenalty: o.repetitionPenalty, maxNewTokens: o.maxNewTokens, stopIds, seed: o.seed,
      vocab: Math.min(tokenizer.vocabSize, config.vocabSize), // never the embedding's padding rows
    }, (id) => { const s = dec.push(id); if (s) io.out(s); });
    const rest = dec.flush();
    if (rest) io.out(rest);
    io.out('\n');
    return ids;
  } finally {
    backend.dispose();
  }
}

/** The end-of-sequence ids generation stops at: the tokenizer's, the config's, generation_config.json's (and the chat markers). */
function stopIdsOf(ck: LoadedCheckpoint, tokenizer: Tokenizer, chat: boolean): number[] {
  const stopIds = new Set<number>();
  if (tokenizer.eosId !== undefined) stopIds.add(tokenizer.eosId);
  for (const id of eosIds(ck.config)) stopIds.add(id);
  for (const id of ck.generationEosIds) stopIds.add(id);
  for (const id of chat ? endOfTurnIds(tokenizer) : []) stopIds.add(id);
  return [...stopIds];
}

interface PromptLine { index: number; text: string; chat: boolean }

/** Reads --prompts: {"prompt"} / {"text"} lines are text, {"messages"} lines conversations; a bad line is named. */
function readPrompts(file: string): Array<{ index: number; prompt?: string; messages?: ChatMessage[] }> {
  const out: Array<{ index: number; prompt?: string; messages?: ChatMessage[] }> = [];
  let text: string;
  try {
    if (!fs.statSync(file).isFile()) throw new InputError(`--prompts ${file} is not a file`, 'pass a .jsonl file of prompts');
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    const f = fileError(e, `--prompts: cannot read ${file}`, 'check the path and its permissions');
    throw f instanceof DistilleryError && !(f instanceof InputError) ? new InputError(f.message, f.hint) : f;
  }
  text.split('\n').forEach((line, i) => {
    if (!line.trim()) return;
    let j: unknown;
    try { j = parsePyJson(line); } catch (e) {
      throw new InputError(`--prompts ${file}:${i + 1}: not valid JSON (${(e as Error).message})`, 'one JSON object per line: {"prompt": "..."} or {"messages": [...]}');
    }
    if (!isJsonObject(j)) {
      throw new InputError(`--prompts ${file}:${i + 1}: not a JSON object`, 'one JSON object per line: {"prompt": "..."} or {"messages": [...]}');
    }
    const r = j as { prompt?: unknown; text?: unknown; messages?: unknown };
    const where = `--prompts ${file}:${i + 1}`;
    for (const k of ['prompt', 'text'] as const) {
      if (r[k] !== undefined && typeof r[k] !== 'string') throw new InputError(`${where}: "${k}" must be a string, got ${JSON.stringify(r[k])}`, `write {"${k}": "..."}`);
    }
    const text = typeof r.prompt === 'string' ? r.prompt : typeof r.text === 'string' ? r.text : undefined;
    if (text !== undefined) out.push({ index: out.length, prompt: text });
    else if (Array.isArray(r.messages)) {
      // the same rules as training's chat lines (a non-empty list of {role, content})
      out.push({ index: out.length, messages: (parseJsonlLine(line, where) as { messages: ChatMessage[] }).messages });
    } else throw new InputError(`${where}: no "prompt", "text" or "messages"`, 'one JSON object per line: {"prompt": "..."} or {"messages": [...]}');
  });
  if (out.length === 0) throw new InputError(`--prompts ${file} holds no prompts`, 'one JSON object per line: {"prompt": "..."} or {"messages": [...]}');
  return out;
}

/**
 * --prompts: every prompt tokenized (conversations rendered with the chat template and an open assistant turn, --chat
 * renders text prompts as a user turn), generated `batch` at a time with the device sampler (prompt i draws with
 * sequence number i, so the output does not depend on --batch), one JSON line per prompt, in order.
 */
async function generateBatched(o: GenerateOptions, io: Io, ck: LoadedCheckpoint, tokenizer: Tokenizer): Promise<number[]> {
  const config = ck.config;
  const lines = readPrompts(o.prompts!);
  const kwargs = o.chatTemplateKwargs !== undefined ? parseTemplateKwargs(o.chatTemplateKwargs) : undefined;
  const anyChat = o.chat || lines.some((l) => l.messages);
  const format = anyChat ? chatFormatOf(ck.chatTemplate, `${o.model}'s tokenizer_config.json`, ck.tokenizerConfig) : null;
  const encoded = lines.map((l) => {
    const msgs = l.messages ?? (o.chat ? [{ role: 'user', content: l.prompt! }] : null);
    const text = msgs ? renderChat(format!, msgs, { addGenerationPrompt: true, ...(kwargs ? { kwargs } : {}) }) : l.prompt!;
    const body = tokenizer.encode(text);
    const ids = msgs ? body : [...tokenizer.documentPrefix, ...body];
    if (body.length === 0) throw new InputError(`--prompts ${o.prompts}: prompt ${l.index + 1} is empty after tokenization`, 'remove the empty prompt');
    return { ...l, chat: msgs !== null, text, ids } as PromptLine & { ids: number[] };
  });
  const longest = Math.max(...encoded.map((e) => e.ids.length));
  const limit = config.maxPositionEmbeddings;
  if (longest + o.maxNewTokens > limit) {
    throw new UsageError(`the longest prompt (${longest} tokens) and --max-new-tokens ${o.maxNewTokens} pass the model's ${limit} positions`, 'lower --max-new-tokens or shorten the prompts');
  }
  const B = Math.min(o.batch, encoded.length), maxLen = longest + o.maxNewTokens;
  const prec = resolvePrecision(o.precision, o.cuda?.tf32, o.device);
  io.err(`precision: ${prec.name}; ${encoded.length} prompts in batches of ${B}, up to ${o.maxNewTokens} new tokens each\n`);
  const backend = await createBackend({ device: o.device, threads: o.threads, ...o.cuda, tf32: prec.tf32 });
  try {
    if (backend.prepare) {
      await backend.prepare(jobClosures({ student: config, batch: 1, seq: 1, generateLen: Math.max(3, maxLen), generateBatch: Math.max(2, B), precision: prec.model }));
    }
    const model = new Transformer(backend, config, { batch: 1, seq: 1, training: false, label: 'generate', precision: prec.model });
    model.setWeights(ck.weights);
    const gen = new BatchGenerator(model, B, maxLen);
    const chatStops = stopIdsOf(ck, tokenizer, true), textStops = stopIdsOf(ck, tokenizer, false);
    const all: number[] = [];
    const t0 = Date.now();
    let generated = 0;
    for (let i0 = 0; i0 < encoded.length; i0 += B) {
      const group = encoded.slice(i0, i0 + B);
      const r = gen.generateOnDevice(group.map((e) => e.ids), {
        temperature: o.temperature, topP: o.topP, topK: o.topK, minP: o.minP, repetitionPenalty: o.repetitionPenalty, maxNewTokens: o.maxNewTokens, seed: o.seed, sequence0: i0,
        vocab: Math.min(tokenizer.vocabSize, config.vocabSize), // never the embedding's padding rows
        // each prompt's own stop ids (a conversation's end-of-turn markers), whatever is batched beside it
        rowStopIds: group.map((e) => (e.chat ? chatStops : textStops)),
      });
      group.forEach((e, k) => {
        const ids = r.tokens[k]!;
        generated += ids.length;
        all.push(...ids);
        io.out(JSON.stringify({ index: e.index, prompt: e.text, completion: tokenizer.decode(ids, { skipSpecialTokens: true }), tokens: ids.length, finish_reason: r.finish[k] }) + '\n');
      });
    }
    const s = (Date.now() - t0) / 1000;
    io.err(`generated ${generated} tokens for ${encoded.length} prompts in ${s.toFixed(2)}s (${Math.round(generated / Math.max(s, 1e-9))} tokens/s)\n`);
    return all;
  } finally {
    backend.dispose();
  }
}

const help = (): string => formatHelp({
  usage: 'distillery generate --model <dir> --prompt <text> [options]',
  description: "Continues a prompt with a trained model, printing text as it is generated; stops at the tokenizer's end-of-sequence token.",
  flags: FLAGS,
  examples: [
    "distillery generate --model runs/demo/final --prompt 'The tokenizer'",
    "distillery generate --model qwen-0.5b --chat --prompt 'What is distillation?' --temperature 0.7 --top-p 0.9 --seed 7",
    'distillery generate --model runs/demo/final --prompts prompts.jsonl --batch 16 --temperature 0.8 --top-k 50 > completions.jsonl',
  ],
});

export const generateCommand: Command = {
  name: 'generate',
  summary: 'generate text from a checkpoint (streams tokens as they arrive)',
  help,
  async run(argv, io) {
    const parsed = parseArgs(argv, FLAGS, 'generate');
    if (parsed.help) { io.out(help()); return 0; }
    if (parsed.positionals.length) {
      throw new UsageError(`generate: unexpected argument '${parsed.positionals[0]}'`, 'quote the prompt and pass it with --prompt');
    }
    await generate(generateOptions(parsed.values), io);
    return 0;
  },
};
