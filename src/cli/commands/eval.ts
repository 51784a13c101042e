/**
 * `distillery eval`: validation loss (next-token cross-entropy) and perplexity of a checkpoint on data files;
 * with --teacher also the student's top-1 agreement with the teacher and the mean KL(p_teacher ‖ p_student) at
 * temperature 1 (StepRunner.evaluate with loss kind 'kl', alpha 1, temperature 1). The data are packed exactly as
 * training packs them (packDocuments: documents + EOS, windows of --seq tokens), and every window is evaluated.
 * With --choices, multiple-choice items scored by log-likelihood as lm-evaluation-harness scores them (acc, acc_norm;
 * src/eval/choices.ts), by the model and, with --teacher, by the teacher: how much of its accuracy the model keeps.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { asUsage, formatHelp, parseArgs, UsageError, type FlagSpec, type Io } from '../args.js';
import type { Command } from '../command.js';
import { createBackend, cudaOptionsFromFlags, threadsProblem, type CudaOptions } from '../../backend/create.js';
import type { LossSpec } from '../../backend/backend.js';
import { readCheckpoint, type LoadedCheckpoint } from '../../model/checkpoint.js';
import { describeMerge, readModelOrAdapter } from '../../model/adapter.js';
import type { FrozenDtype } from '../../model/frozen.js';
import { describeBaked } from '../../model/config.js';
import { Transformer } from '../../model/transformer.js';
import { jobClosures } from '../../train/kernel-plan.js';
import { capDocs, loadDocCorpus, loadDocs, packForJob, PACKINGS, stackWindows, reportNoAssistant, type PackingChoice, type Doc, type Window } from '../../data/index.js';
import { StepRunner, type Batch } from '../../train/step.js';
import { choicesRunner } from '../../train/run-choices.js';
import { DEFAULT_RUN_OPTIONS } from '../../train/options.js';
import { DistilleryError } from '../../util/errors.js';
import { BASE_FLAG, CUDA_FLAGS, PRECISION_FLAG, requireModelDir } from './generate.js';
import { resolvePrecision, type PrecisionFlag } from '../../train/precision.js';
import { realFs } from './train.js';
import { resolveModelArg } from '../model-ref.js';
import { assertSameTokenizer, lossVocabulary } from '../../tokenizer/identity.js';
import { chatFormatOf, chatRenderer, type ChatFormat } from '../../tokenizer/chat.js';
import { parseTemplateKwargs } from '../options.js';
import { examplesPairing, itemsByFile, limitItems, limitProblem, readChoiceItems, repeatedFile, REPEATED_FILE_HINT, type ChoiceItem } from '../../eval/items.js';
import { encodeForModel, type EncodedChoice } from '../../eval/encode.js';
import { chatSaid, rowCounts, choiceBatches, choiceMetrics, choiceRows, choiceSamples, choiceSlots, choiceWindow, rowsSaid, metricsByFile, percent, scoreChoices, scoresSaid, type ChoiceMetrics, type ChoiceRow, type ItemScores } from '../../eval/choices.js';
import { FEWSHOT_DEFAULTS, FEWSHOT_SAMPLERS, fewshotSaid, type FewshotOptions } from '../../eval/fewshot.js';
import type { Tokenizer } from '../../tokenizer/bpe.js';
import { writeFileAtomic } from '../../io/atomic.js';
import { DEFAULT_MAX_GEN_TOKS, GENERATION_PRESETS, generationMetrics, generationSettings, stopStrings,
  type GenerationFlags, type GenerationMetrics, type GenerationOutcome, type GenerationPreset, type GenerationSettings } from '../../eval/generation.js';
import { generationPrompts, runGeneration, type GenerationPrompts } from '../../eval/generate-items.js';
import { eosIds } from '../../model/config.js';

const FLAGS: FlagSpec[] = [
  { name: 'model', kind: 'string', metavar: '<dir|hub id>', description: 'checkpoint folder (or Hub id in the local HF cache) to evaluate (required)' },
  BASE_FLAG,
  { name: 'teacher', kind: 'string', metavar: '<dir|hub id>', description: 'teacher checkpoint (same tokenizer): also report top-1 agreement and KL(teacher ‖ model)' },
  { name: 'data', kind: 'list', metavar: '<file>...', description: "text/.jsonl files or folders, or 'builtin:docs' (repeatable; this or --choices)" },
  { name: 'choices', kind: 'list', metavar: '<file.jsonl>...', description: 'items scored by log-likelihood as lm-evaluation-harness scores them, a JSON line each: {"context", "choices", "answer"} (acc, acc_norm), {"context", "continuation"} (is_greedy acc, perplexity), {"contexts", "continuation", "answer"} (acc, acc_norm) or {"text"} (word and byte perplexity, bits per byte; repeatable)' },
  { name: 'choices-out', kind: 'string', metavar: '<file.jsonl>', description: 'with --choices: write each item\'s log-likelihoods and predictions (the model\'s, the teacher\'s), a JSON line an item' },
  { name: 'choice-delimiter', kind: 'string', metavar: '<text>', allowEmpty: true, description: 'what goes between an item\'s context and each choice (the harness\'s target_delimiter; \'\' allowed; a continuation goes as written)', defaultText: "' ', '' with --choices-chat" },
  { name: 'choices-chat', kind: 'boolean', description: 'with --choices: each context as a user turn of the model\'s chat template with the assistant turn opened (the harness\'s --apply_chat_template; --chat-template-kwargs apply)' },
  { name: 'system-instruction', kind: 'string', metavar: '<text>', description: 'with --choices: a system turn before each item\'s description and examples (the harness\'s --system_instruction; plain text: the prompt\'s start)' },
  { name: 'fewshot', kind: 'integer', metavar: '<n>', description: 'with --choices: n examples (a context and its answer) before each item, as the harness\'s --num_fewshot builds them', defaultText: '0' },
  { name: 'fewshot-from', kind: 'list', metavar: '<file.jsonl>...', description: 'with --fewshot: the examples\' items, one file per --choices file (the harness\'s fewshot_split)', defaultText: 'each --choices file\'s own items, the item itself left out' },
  { name: 'fewshot-sampler', kind: 'string', choices: [...FEWSHOT_SAMPLERS], description: 'with --fewshot: random (the harness\'s default sampler, CPython\'s random.sample) or first_n (the first n, MMLU\'s)', defaultText: FEWSHOT_DEFAULTS.sampler },
  { name: 'fewshot-seed', kind: 'integer', description: 'with --fewshot: the random sampler\'s seed (the harness\'s fewshot_random_seed)', defaultText: String(FEWSHOT_DEFAULTS.seed) },
  { name: 'fewshot-delimiter', kind: 'string', metavar: '<text>', allowEmpty: true, description: 'with --fewshot: what follows each example (the harness\'s fewshot_delimiter)', defaultText: "'\\n\\n'" },
  { name: 'fewshot-single-turn', kind: 'boolean', description: 'with --fewshot and --choices-chat: the examples and the item as one user turn (default: a user and an assistant turn per example, the harness\'s fewshot_as_multiturn)' },
  { name: 'until', kind: 'list', metavar: '<text>...', description: 'with generation items ("target"): stop strings, the text kept is the one before the first (the harness\'s generation_kwargs.until; the tokenizer\'s eos_token is added)', defaultText: 'the few-shot delimiter' },
  { name: 'max-gen-toks', kind: 'integer', description: 'with generation items: new tokens at most per item (the harness\'s max_gen_toks)', defaultText: String(DEFAULT_MAX_GEN_TOKS) },
  { name: 'filter', kind: 'list', metavar: '<json>...', description: 'with generation items: answer filter pipelines, each a harness filter_list entry as JSON, e.g. \'{"name": "strict-match", "filter": [{"function": "regex", "regex_pattern": "#### (\\\\-?[0-9\\\\.\\\\,]+)"}, {"function": "take_first"}]}\'; each is reported as exact_match,<name>', defaultText: 'none: the text as generated' },
  { name: 'exact-match', kind: 'string', metavar: '<json>', description: 'with generation items: exact_match\'s settings as the harness\'s metric_list writes them, e.g. \'{"ignore_case": true, "regexes_to_ignore": [","]}\'', defaultText: '{}' },
  { name: 'preset', kind: 'string', choices: Object.keys(GENERATION_PRESETS), description: 'with generation items: a harness task\'s settings (gsm8k: until, the strict-match and flexible-extract filters, exact_match\'s settings and 5-shot, as lm_eval/tasks/gsm8k/gsm8k.yaml); flags given override them' },
  { name: 'limit', kind: 'number', metavar: '<n>', description: 'with --choices: the first n items of each file (below 1: that fraction of each, rounded up), their examples drawn as without it (the harness\'s --limit)' },
  { name: 'seq', kind: 'integer', description: 'tokens per window (--choices without --seq: the longest item\'s, up to max_position_embeddings)', defaultText: String(DEFAULT_RUN_OPTIONS.seq) },
  { name: 'batch', kind: 'integer', description: 'windows per forward pass', defaultText: String(DEFAULT_RUN_OPTIONS.batch) },
  { name: 'max-chars', kind: 'integer', description: 'cap on characters read from the data (0 = no cap)', defaultText: '0' },
  { name: 'device', kind: 'string', choices: ['cpu', 'cuda'], description: 'where to compute', defaultText: 'cpu' },
  { name: 'threads', kind: 'integer', description: 'CPU threads (0 = all cores)', defaultText: '0' },
  { name: 'json', kind: 'boolean', description: 'print the results as one JSON object' },
  { name: 'loss-on', kind: 'string', choices: ['assistant', 'all'], description: 'chat data: the tokens the loss counts (the assistant replies, as in training, or all)', defaultText: 'assistant' },
  { name: 'chat-template-kwargs', kind: 'string', metavar: '<json>', description: 'chat template options, a JSON object of extra template variables, e.g. \'{"enable_thinking": false}\'' },
  { name: 'packing', kind: 'string', choices: ['auto', ...PACKINGS], description: 'how documents fill the windows, as in training (bfd, wrapped, none; auto: bfd when the data has conversations, else wrapped)', defaultText: 'auto' },
  { name: 'model-dtype', kind: 'string', choices: ['auto', 'nf4'], defaultText: 'auto', description: 'storage of the model\'s projection matrices: auto (the compute dtype) or nf4 (4 bits, QLoRA\'s format): measures what quantization costs' },
  { name: 'teacher-dtype', kind: 'string', choices: ['auto', 'nf4'], defaultText: 'auto', description: 'with --teacher: storage of the teacher\'s projection matrices (auto or nf4)' },
  PRECISION_FLAG,
  ...CUDA_FLAGS,
];

export interface EvalOptions {
  model: string;
  /** The base of a LoRA adapter folder given as `model` (default: the one the adapter names). */
  base?: string | undefined;
  teacher?: string | undefined;
  /** Data files for the loss and perplexity (empty with --choices alone). */
  data: string[];
  /** Items files (src/eval/items.ts: multiple choice, continuations, texts); default none. */
  choices?: string[] | undefined;
  /** Between an item's context and each choice (default ' '). */
  choiceDelimiter?: string | undefined;
  /** With choices: each context as a user turn of the chat template, the assistant turn opened (default false). */
  choicesChat?: boolean | undefined;
  /** With choices: examples before each item (src/eval/fewshot.ts; the examples' files resolved to `fewshotFrom`). */
  fewshot?: (Omit<FewshotOptions, 'pools'> & { from?: string[] | undefined; singleTurn?: boolean | undefined }) | undefined;
  /** The generation items' examples when they differ from `fewshot` (a --preset's num_fewshot without --fewshot: its task's alone). */
  generationFewshot?: EvalOptions['fewshot'];
  /** With choices: before each item's description (the harness's --system_instruction). */
  systemInstruction?: string | undefined;
  /** With choices: how generation items are generated and scored (src/eval/generation.ts). */
  generation?: GenerationSettings | undefined;
  /** The generation flags given (--until, --max-gen-toks, --filter, --exact-match, --preset): warned about without generation items. */
  generationFlags?: string[] | undefined;
  /** With choices: write each item's log-likelihoods and predictions here (JSON lines). */
  choicesOut?: string | undefined;
  /** Score --choices in windows of the longest item (up to max_position_embeddings) instead of `seq`: the CLI without --seq. */
  choiceSeqAuto?: boolean | undefined;
  /** With choices: score the first `limit` items of each file (below 1: that fraction, rounded up; the harness's --limit). */
  limit?: number | undefined;
  /** Storage of the model's / the teacher's projection matrices (src/model/frozen.ts; default auto: the compute dtype). */
  modelDtype?: FrozenDtype | undefined;
  teacherDtype?: FrozenDtype | undefined;
  seq: number;
  batch: number;
  maxChars: number;
  device: 'cpu' | 'cuda';
  threads: number;
  json: boolean;
  lossOn: 'assistant' | 'all';
  /** --packing (default auto: bfd on conversations, else wrapped; src/data/pack.ts). */
  packing?: PackingChoice | undefined;
  chatTemplateKwargs?: Record<string, unknown> | undefined;
  /** --precision (default auto: bf16 on CUDA, fp32 on the CPU). */
  precision?: PrecisionFlag | undefined;
  cuda?: CudaOptions;
}

/** A teacher's side of the --choices metrics. */
type TeacherScores = Pick<ChoiceMetrics, 'acc' | 'accNorm' | 'accBytes' | 'brierScore' | 'greedy' | 'rolling'>;

export interface EvalResult {
  /** Tokens the loss counted (on chat data under --loss-on assistant: the assistant replies'). Absent with --choices alone. */
  tokens?: number;
  windows?: number;
  loss?: number;
  perplexity?: number;
  /** Fraction of the counted tokens whose target is the model's most likely token (TRL's mean_token_accuracy). */
  tokenAccuracy?: number;
  /** With a teacher: fraction of positions where argmax(student) = argmax(teacher). */
  agreement?: number;
  /** With a teacher: mean KL(p_teacher ‖ p_student) at temperature 1, nats per token. */
  kl?: number;
  /** The precision the models ran in: bf16, tf32 or fp32. */
  precision: string;
  /** Storage of the model's projection matrices: 'auto' (the compute dtype) or 'nf4'. */
  modelDtype: FrozenDtype;
  /**
   * With --choices: the model's metrics over every item, the window the items were scored in, with a teacher the
   * teacher's, and with several files each file's.
   */
  choices?: ChoiceMetrics & { seq: number; cut: number; teacher?: TeacherScores; files?: Array<{ file: string; teacher?: TeacherScores } & ChoiceMetrics> };
  /**
   * With generation items: exact_match per filter pipeline over them (the teacher's beside), the settings they ran
   * with, the tokens generated, and with several files each file's.
   */
  generation?: GenerationMetrics & {
    maxGenToks: number; until: string[]; tokens: number; cut: number; teacher?: GenerationMetrics;
    files?: Array<{ file: string; teacher?: GenerationMetrics } & GenerationMetrics>;
  };
}

/** Validates parsed flags into EvalOptions (pure apart from the existence of the data files). */
export function evalOptions(v: Record<string, unknown>): EvalOptions {
  if (typeof v.model !== 'string') throw new UsageError('eval: no model given (--model)', 'pass --model <checkpoint folder>');
  const data = (v.data as string[] | undefined) ?? [];
  const choices = (v.choices as string[] | undefined) ?? [];
  if (!data.length && !choices.length) throw new UsageError('eval: no data given (--data or --choices)', 'pass --data <file> (repeatable; .txt, .md, .jsonl, a folder) or --data builtin:docs, or --choices <items.jsonl>');
  for (const f of ['choice-delimiter', 'choices-out', 'choices-chat', 'fewshot', 'system-instruction', 'limit', ...GENERATION_FLAGS]) {
    if (v[f] !== undefined && !choices.length) throw new UsageError(`eval: --${f} goes with --choices`, `pass --choices <items.jsonl>, or drop --${f}`);
  }
  const preset = typeof v.preset === 'string' ? GENERATION_PRESETS[v.preset as GenerationPreset] : undefined;
  // a preset's num_fewshot is its task's: the generation items' default, not the other files'
  const presetShots = preset && v.fewshot === undefined ? fewshotOptions({ ...v, fewshot: preset.fewshot }, choices) : undefined;
  const fewshot = presetShots ? undefined : fewshotOptions(v, choices);
  const generation = generationOptions(v, preset, (presetShots ?? fewshot)?.delimiter ?? FEWSHOT_DEFAULTS.delimiter);
  if (typeof v['teacher-dtype'] === 'string' && typeof v.teacher !== 'string') throw new UsageError('eval: --teacher-dtype goes with --teacher', 'pass --teacher <folder>, or drop --teacher-dtype');
  const o: EvalOptions = {
    model: v.model, teacher: v.teacher as string | undefined, data, choices,
    ...(typeof v['choice-delimiter'] === 'string' ? { choiceDelimiter: v['choice-delimiter'] } : {}), choiceSeqAuto: v.seq === undefined,
    ...(typeof v['choices-out'] === 'string' ? { choicesOut: v['choices-out'] } : {}), choicesChat: v['choices-chat'] === true,
    ...(fewshot ? { fewshot } : {}), ...(presetShots ? { generationFewshot: presetShots } : {}),
    ...(typeof v['system-instruction'] === 'string' ? { systemInstruction: v['system-instruction'] } : {}),
    generation, generationFlags: GENERATION_FLAGS.filter((f) => v[f] !== undefined), ...(v.limit !== undefined ? { limit: v.limit as number } : {}),
    ...(typeof v.base === 'string' ? { base: v.base } : {}),
    ...(typeof v['model-dtype'] === 'string' ? { modelDtype: v['model-dtype'] as FrozenDtype } : {}),
    ...(typeof v['teacher-dtype'] === 'string' ? { teacherDtype: v['teacher-dtype'] as FrozenDtype } : {}),
    seq: (v.seq as number | undefined) ?? DEFAULT_RUN_OPTIONS.seq, batch: (v.batch as number | undefined) ?? DEFAULT_RUN_OPTIONS.batch,
    maxChars: (v['max-chars'] as number | undefined) ?? 0, device: (v.device as 'cpu' | 'cuda' | undefined) ?? 'cpu',
    threads: (v.threads as number | undefined) ?? 0, json: v.json === true, cuda: cudaOptionsFromFlags(v),
    lossOn: (v['loss-on'] as 'assistant' | 'all' | undefined) ?? 'assistant',
    ...(typeof v.packing === 'string' ? { packing: v.packing as PackingChoice } : {}),
    ...(typeof v['chat-template-kwargs'] === 'string' ? { chatTemplateKwargs: parseTemplateKwargs(v['chat-template-kwargs']) } : {}),
    ...(typeof v.precision === 'string' ? { precision: v.precision as PrecisionFlag } : {}),
  };
  for (const [k, x] of [['--seq', o.seq], ['--batch', o.batch]] as const) {
    if (!(Number.isInteger(x) && x > 0)) throw new UsageError(`${k} must be a positive integer, got ${x}`, `e.g. ${k} ${k === '--seq' ? 64 : 8}`);
  }
  if (o.maxChars < 0) throw new UsageError(`--max-chars must be >= 0, got ${o.maxChars}`, 'use 0 for no cap');
  if (o.limit !== undefined && limitProblem(o.limit) !== null) {
    throw new UsageError(`--limit must be ${limitProblem(o.limit)!}, got ${o.limit}`, 'e.g. --limit 100 (the first 100 items of each file) or --limit 0.1');
  }
  const threadsBad = threadsProblem(o.threads);
  if (threadsBad !== null) throw new UsageError(`--threads must be ${threadsBad}, got ${o.threads}`, 'use 0 for all cores');
  if (data.includes('builtin:docs') && data.length > 1) throw new UsageError("--data: 'builtin:docs' cannot be combined with other data files", 'use either builtin:docs or your own files');
  for (const d of data) {
    if (d !== 'builtin:docs' && !realFs.exists(d)) throw new UsageError(`--data: data file ${d} does not exist`, 'check the path');
  }
  for (const c of choices) {
    if (!realFs.exists(c)) throw new UsageError(`--choices: file ${c} does not exist`, 'check the path');
  }
  const twice = repeatedFile(choices);
  if (twice !== undefined) throw new UsageError(`--choices: ${twice} is given twice`, REPEATED_FILE_HINT);
  if (o.choicesOut !== undefined) {
    const folder = path.dirname(path.resolve(o.choicesOut));
    if (!realFs.exists(folder)) throw new UsageError(`--choices-out: the folder ${folder} does not exist`, 'create it first, or write the file elsewhere');
    if (realFs.exists(o.choicesOut) && fs.statSync(o.choicesOut).isDirectory()) throw new UsageError(`--choices-out: ${o.choicesOut} is a folder`, 'name a file, e.g. --choices-out scores.jsonl');
  }
  return o;
}

const GENERATION_FLAGS = ['until', 'max-gen-toks', 'filter', 'exact-match', 'preset'];

/** The generation items' settings (generationSettings), its errors as usage errors. */
function generationOptions(v: Record<string, unknown>, preset: (typeof GENERATION_PRESETS)[GenerationPreset] | undefined, fewshotDelimiter: string): GenerationSettings {
  const names: Record<keyof GenerationFlags, string> = { maxGenToks: '--max-gen-toks', until: '--until', filter: '--filter', exactMatch: '--exact-match', preset: '--preset' };
  return asUsage(() => generationSettings({
    maxGenToks: v['max-gen-toks'] as number | undefined, until: v.until as string[] | undefined, filter: v.filter as string[] | undefined,
    exactMatch: v['exact-match'] as string | undefined, preset: preset ? String(v.preset) : undefined,
  }, fewshotDelimiter, (k) => names[k]));
}

/** --fewshot and its settings, checked (undefined without --fewshot). */
function fewshotOptions(v: Record<string, unknown>, choices: readonly string[]): EvalOptions['fewshot'] {
  const rest = ['fewshot-from', 'fewshot-sampler', 'fewshot-seed', 'fewshot-delimiter', 'fewshot-single-turn'];
  if (v.fewshot === undefined) {
    const given = rest.find((f) => v[f] !== undefined);
    if (given) throw new UsageError(`eval: --${given} goes with --fewshot`, `pass --fewshot <n>, or drop --${given}`);
    return undefined;
  }
  const n = v.fewshot as number;
  if (!(Number.isInteger(n) && n >= 0)) throw new UsageError(`--fewshot must be an integer >= 0, got ${n}`, 'e.g. --fewshot 5 (0: no examples)');
  const seed = (v['fewshot-seed'] as number | undefined) ?? FEWSHOT_DEFAULTS.seed;
  if (!(Number.isSafeInteger(seed) && seed >= 0)) throw new UsageError(`--fewshot-seed must be an integer >= 0, got ${seed}`, `e.g. --fewshot-seed ${FEWSHOT_DEFAULTS.seed} (the harness's default)`);
  if (v['fewshot-single-turn'] !== undefined && v['choices-chat'] !== true) throw new UsageError('eval: --fewshot-single-turn goes with --choices-chat', 'pass --choices-chat, or drop --fewshot-single-turn');
  const from = v['fewshot-from'] as string[] | undefined;
  if (from) {
    const pairing = examplesPairing(from.length, choices.length, '--fewshot-from', '--choices');
    if (pairing) throw new UsageError(`eval: ${pairing.message}`, pairing.hint);
    for (const f of from) {
      if (!realFs.exists(f)) throw new UsageError(`--fewshot-from: file ${f} does not exist`, 'check the path');
    }
  }
  return {
    n, seed, sampler: (v['fewshot-sampler'] as FewshotOptions['sampler'] | undefined) ?? FEWSHOT_DEFAULTS.sampler,
    delimiter: (v['fewshot-delimiter'] as string | undefined) ?? FEWSHOT_DEFAULTS.delimiter,
    ...(from ? { from } : {}), ...(v['fewshot-single-turn'] === true ? { singleTurn: true } : {}),
  };
}

/** Flags given that change nothing in this evaluation (the data's settings without --data), as warnings. */
export function evalWarnings(v: Record<string, unknown>): string[] {
  if ((v.data as string[] | undefined)?.length) return [];
  const idle = ['loss-on', 'packing', 'max-chars'].filter((f) => v[f] !== undefined);
  if (v['chat-template-kwargs'] !== undefined && v['choices-chat'] !== true) idle.push('chat-template-kwargs');
  return idle.map((f) => `--${f} has no effect without --data${f === 'chat-template-kwargs' ? ' or --choices-chat' : ''}`);
}

function readDocs(o: EvalOptions, chat: ChatFormat, log: (line: string) => void): Doc[] {
  if (o.data[0] === 'builtin:docs') return loadDocCorpus(o.maxChars > 0 ? { maxChars: o.maxChars } : {}).documents.map((text) => ({ text, lossSpans: null }));
  // Chat lines are rendered as in training: with the model's chat template, the loss on the tokens --loss-on names.
  const loaded = loadDocs(o.data, { renderChat: chatRenderer(chat, { lossOn: o.lossOn, kwargs: o.chatTemplateKwargs }) });
  reportNoAssistant(loaded, log);
  return capDocs(loaded.docs, o.maxChars);
}

/** Groups windows into batches of up to b rows (the last one may be smaller). */
export function batchWindows(windows: readonly Window[], b: number, t: number): Batch[] {
  const out: Batch[] = [];
  for (let s = 0; s < windows.length; s += b) {
    const rows = windows.slice(s, s + b);
    const { inputs, targets, mask, positions } = stackWindows(rows, t);
    out.push({ inputs, targets, mask, b: rows.length, t, ...(positions ? { positions } : {}) });
  }
  return out;
}

/** Evaluates; `log` gets the baked-parameter line of each model (the CLI sends it to stderr). */
export async function evaluate(o: EvalOptions, log: (line: string) => void = () => {}): Promise<EvalResult> {
  const modelDir = resolveModelArg(o.model, '--model');
  requireModelDir(modelDir, '--model');
  const teacherDir = o.teacher !== undefined ? resolveModelArg(o.teacher, '--teacher') : undefined;
  if (teacherDir !== undefined) requireModelDir(teacherDir, '--teacher');
  const studentCk = readModelOrAdapter(modelDir, { base: o.base, tensorByTensor: true });
  if (studentCk.adapter) log(describeMerge(studentCk.adapter));
  if (!studentCk.tokenizer) throw new DistilleryError(`${o.model} has no tokenizer.json`, 'evaluation needs the tokenizer the model was trained with; copy its tokenizer.json into the folder');
  const maxPos = studentCk.config.maxPositionEmbeddings;
  const choiceFiles = o.choices ?? [];
  if ((o.data.length || !o.choiceSeqAuto) && o.seq > maxPos) {
    throw new UsageError(`--seq ${o.seq} exceeds the model's max_position_embeddings (${maxPos})`, `use --seq ${maxPos} or less`);
  }
  const teacherCk = teacherDir !== undefined ? readCheckpoint(teacherDir, { tensorByTensor: true }) : null;
  log(`model: ${describeBaked(studentCk.config)}`);
  if (teacherCk) log(`teacher: ${describeBaked(teacherCk.config)}`);
  let lossVocab: number | undefined;
  if (teacherCk) {
    // Agreement and KL compare the two models id by id: they must share one tokenizer, not just a vocabulary size.
    if (teacherCk.tokenizer) {
      assertSameTokenizer({ name: 'teacher', tokenizer: teacherCk.tokenizer, from: teacherDir }, { name: 'model', tokenizer: studentCk.tokenizer, from: modelDir },
        'agreement, KL and the scores of --choices compare the two models token by token: evaluate against a teacher with the model\'s tokenizer');
    } else {
      log(`warning: the teacher ${o.teacher} has no tokenizer.json: cannot check that it uses the model's tokenizer`);
    }
    const lv = lossVocabulary(studentCk.tokenizer.vocabSize, [{ name: 'teacher', vocabSize: teacherCk.config.vocabSize }, { name: 'model', vocabSize: studentCk.config.vocabSize }]);
    if (lv.note) log(lv.note);
    lossVocab = lv.lossVocab;
  }
  const tok = studentCk.tokenizer;
  const chat = chatFormatOf(studentCk.chatTemplate, `${o.model}'s tokenizer_config.json`, studentCk.tokenizerConfig);
  // The items before the backend and the weights' upload: a bad file is refused first.
  const read = choiceFiles.length ? readChoiceItems(choiceFiles) : [];
  // --limit: the first items of each file (the harness's); their examples are drawn from the whole file, as without it
  const allItems = o.limit !== undefined ? limitItems(read, o.limit) : read;
  if (o.limit !== undefined) log(`choices: --limit ${o.limit}: ${allItems.length} of ${read.length} items (the first of each file)`);
  const from = (o.generationFewshot ?? o.fewshot)?.from;
  const pools = from ? from.map((f) => readChoiceItems([f])) : o.limit !== undefined ? choiceFiles.map((f) => read.filter((it) => it.file === f)) : undefined;
  // scored items and generation items each go their own way; a file holds one kind (a task), its examples its own
  const scored = allItems.filter((it) => !it.generate), generated = allItems.filter((it) => it.generate);
  const poolsOf = (part: readonly ChoiceItem[]): Pick<FewshotOptions, 'pools' | 'ownPools'> =>
    (pools ? { pools: choiceFiles.flatMap((f, k) => (part.some((it) => it.file === f) ? [pools[k]!] : [])), ...(from ? {} : { ownPools: true }) } : {});
  const sides = {
    model: { tok, chat },
    ...(teacherCk ? { teacher: { tok: teacherCk.tokenizer ?? tok, chat: chatFormatOf(teacherCk.chatTemplate, `${o.teacher}'s tokenizer_config.json`, teacherCk.tokenizerConfig) } } : {}),
  };
  const choice = scored.length ? choiceJob(scored, poolsOf(scored), o, sides, Math.min(maxPos, teacherCk?.config.maxPositionEmbeddings ?? Infinity), log) : null;
  if (!generated.length && o.generationFlags?.length) log(`warning: ${o.generationFlags.map((f) => `--${f}`).join(', ')} ha${o.generationFlags.length === 1 ? 's' : 've'} no effect: no --choices file holds generation items ("target")`);
  const gen = generated.length ? generationJob(generated, poolsOf(generated), o, sides, { model: studentCk, ...(teacherCk ? { teacher: teacherCk } : {}) }, log) : null;
  if (gen && studentCk.adapter && o.modelDtype === 'nf4') {
    throw new UsageError('eval: generation items with an adapter on an nf4 base are not supported', 'drop --model-dtype nf4 (the adapter is merged into the weights), or evaluate the generation items apart');
  }
  const spec: LossSpec = teacherCk ? { kind: 'kl', alpha: 1, temperature: 1, beta: 0.5 } : { kind: 'none', alpha: 0, temperature: 1, beta: 0.5 };
  const prec = resolvePrecision(o.precision, o.cuda?.tf32, o.device);
  log(`precision: ${prec.name}`);
  // One model of each: its buffers hold the longest window either part uses.
  const seq = Math.max(1, o.data.length ? o.seq : 0, choice?.seq ?? 0);
  const backend = await createBackend({ device: o.device, threads: o.threads, ...o.cuda, tf32: prec.tf32 });
  try {
    // Pre-warm (CUDA): compile every kernel the evaluation launches, then seal, before any weights.
    // An adapter on a 4-bit base is evaluated as it trained (QLoRA): NF4(W) + s·B·A, unmerged; merging first and then
    // quantizing W + s·B·A would round much of the adapter away.
    const unmerged = studentCk.adapter && o.modelDtype === 'nf4' ? studentCk.adapter : null;
    if (backend.prepare) {
      const common = { batch: o.batch, evaluate: true, precision: prec.model, lora: unmerged?.layout } as const;
      await backend.prepare([
        ...(o.data.length ? jobClosures({ ...common, student: studentCk.config, teacher: teacherCk?.config ?? null, seq: o.seq,
          loss: spec, ...(lossVocab !== undefined ? { lossVocab } : {}), studentFrozen: o.modelDtype, teacherFrozen: teacherCk ? o.teacherDtype : undefined }) : []),
        // --choices: each model scored alone (plain cross-entropy over its whole vocabulary, as transformers' log_softmax),
        // on the scoring head a run's --eval-choices uses (choicesRunner)
        ...(choice ? jobClosures({ ...common, evaluate: false, choices: true, student: studentCk.config, seq: choice.seq, studentFrozen: o.modelDtype }) : []),
        ...(choice && teacherCk ? jobClosures({ ...common, evaluate: false, choices: true, student: teacherCk.config, seq: choice.seq, lora: undefined, studentFrozen: o.teacherDtype }) : []),
        // generation items: batched greedy generation with a KV cache as long as the longest prompt and its new tokens
        ...(gen ? gen.sides.flatMap((g) => jobClosures({ student: g.ck.config, batch: 1, seq: 1, precision: prec.model, generateLen: Math.max(3, g.prompts.longest + gen.settings.maxGenToks),
          generateBatch: Math.max(2, Math.min(o.batch, generated.length)), studentFrozen: g.who === 'teacher' ? o.teacherDtype : o.modelDtype })) : []),
      ]);
    }
    const load = (ck: LoadedCheckpoint, label: string, documents: boolean): Transformer => {
      const frozenDtype = label === 'teacher' ? o.teacherDtype : o.modelDtype;
      const lora = label === 'model' && unmerged ? unmerged.layout : undefined;
      const m = new Transformer(backend, ck.config, { batch: o.batch, seq, training: false, label, precision: prec.model, frozenDtype, lora, documents });
      if (lora) { m.setWeights(unmerged!.base.weights); m.lora!.setWeights(unmerged!.adapter.weights); } else m.setWeights(ck.weights);
      return m;
    };
    const docs = o.data.length ? readDocs(o, chat, log) : [];
    // packed as training packs: by default conversations whole (bfd, each document attending to itself), text joined and cut (wrapped)
    const packed = o.data.length ? packForJob(tok, docs, chat, { ...o, tokenizerOf: o.model }, log).packed : null;
    const documents = packed?.windows[0]?.positions !== undefined;
    const student = load(studentCk, 'model', documents);
    const teacher = teacherCk ? load(teacherCk, 'teacher', documents) : null;
    const res: EvalResult = { precision: prec.name, modelDtype: o.modelDtype ?? 'auto' };
    let scoredLines: { items: ChoiceItem[]; text: string } | null = null, genLines: string[] = [];
    if (packed) {
      const runner = new StepRunner(student, teacher, spec, { lossVocab });
      const r = runner.evaluate(batchWindows(packed.windows, o.batch, o.seq));
      Object.assign(res, { tokens: r.tokens, windows: packed.windows.length, loss: r.meanCe, perplexity: r.perplexity, tokenAccuracy: r.tokenAccuracy });
      if (teacher) { res.agreement = r.agreement; res.kl = r.meanDiv; }
    }
    if (choice) {
      const padId = tok.padId ?? tok.eosId ?? 0;
      const score = async (m: Transformer, rows: ChoiceRow[], who: string): Promise<ItemScores> => {
        // a no-gradient head of small logits chunks (SCORING_CHUNK_FLOATS): the batches are short
        const runner = choicesRunner(m);
        const t0 = Date.now(), progress = throttled(log, 5000);
        const ll = (await scoreChoices(choiceSlots(choice.items, rows), choiceBatches(rows, o.batch, choice.seq, padId), (b) => runner.rowScores(b), (done) => {
          if (done < rows.length) progress(`choices: ${who} ${done}/${rows.length} scored`);
        }))!;
        const sec = (Date.now() - t0) / 1000;
        log(`choices: ${who} scored ${rowsSaid(choice.items, rows)} in ${sec.toFixed(2)} s (${Math.round(rows.length / Math.max(sec, 1e-3))}/s)`);
        return ll;
      };
      const ll = await score(student, choice.rows, 'model'), tll = teacher ? await score(teacher, choice.teacherRows!, 'teacher') : null;
      const teacherPart = ({ acc, accNorm, accBytes, brierScore, greedy, rolling }: ChoiceMetrics): TeacherScores =>
        ({ ...(acc !== undefined ? { acc, accNorm, accBytes, brierScore } : {}), ...(greedy ? { greedy } : {}), ...(rolling ? { rolling } : {}) });
      res.choices = { ...choiceMetrics(choice.items, ll), seq: choice.seq, cut: choice.cut };
      if (tll) res.choices.teacher = teacherPart(choiceMetrics(choice.items, tll));
      // several files: each one's own metrics too (a task's, as the harness reports them), the teacher's beside
      if (itemsByFile(choice.items).length > 1) {
        const t = tll ? metricsByFile(choice.items, tll) : null;
        res.choices.files = metricsByFile(choice.items, ll).map((m, i) => ({ ...m, ...(t ? { teacher: teacherPart(t[i]!) } : {}) }));
      }
      if (o.choicesOut !== undefined) scoredLines = { items: choice.items, text: choiceSamples(choice.items, ll, tll) };
    }
    if (gen) {
      const outcomes: Array<{ who: string; got: GenerationOutcome[]; tokens: number }> = [];
      for (const g of gen.sides) {
        const t0 = Date.now(), progress = throttled(log, 5000);
        const m = g.who === 'teacher' ? teacher! : student;
        const got = (await runGeneration(m, g.tok, generated, g.prompts, gen.settings, {
          stopIds: g.stopIds, until: g.until, batch: o.batch,
          progress: (done) => { if (done < generated.length) progress(`generation: ${g.who} ${done}/${generated.length} items`); },
        }))!;
        const sec = (Date.now() - t0) / 1000, tokens = got.reduce((a, x) => a + x.tokens, 0);
        log(`generation: ${g.who} generated ${tokens} tokens for ${generated.length} items in ${sec.toFixed(2)} s (${Math.round(tokens / Math.max(sec, 1e-3))} tokens/s)`);
        outcomes.push({ who: g.who, got, tokens });
      }
      const mine = outcomes[0]!, theirs = outcomes[1];
      res.generation = {
        ...generationMetrics(mine.got, gen.settings), maxGenToks: gen.settings.maxGenToks, until: gen.sides[0]!.until, tokens: mine.tokens, cut: gen.sides[0]!.prompts.cut,
        ...(theirs ? { teacher: generationMetrics(theirs.got, gen.settings) } : {}),
      };
      const genFiles = itemsByFile(generated);
      if (genFiles.length > 1) {
        res.generation.files = genFiles.map(({ file, idx }) => ({
          file, ...generationMetrics(idx.map((i) => mine.got[i]!), gen.settings),
          ...(theirs ? { teacher: generationMetrics(idx.map((i) => theirs.got[i]!), gen.settings) } : {}),
        }));
      }
      if (o.choicesOut !== undefined) genLines = generationSamples(generated, gen.settings, mine.got, theirs?.got ?? null);
    }
    if (o.choicesOut !== undefined) writeFileAtomic(o.choicesOut, samplesInOrder(allItems, scoredLines, generated, genLines));
    return res;
  } finally {
    backend.dispose();
  }
}

/** The few-shot settings with the examples' pools (undefined without --fewshot). */
function fewshotWith(shot: EvalOptions['fewshot'], pools: Pick<FewshotOptions, 'pools' | 'ownPools'>): FewshotOptions | undefined {
  return shot ? { n: shot.n, sampler: shot.sampler, seed: shot.seed, delimiter: shot.delimiter, ...pools } : undefined;
}

/** A log that says a line at most once every `ms` (progress on long work): the first call waits `ms` too. */
function throttled(log: (line: string) => void, ms: number): (line: string) => void {
  let last = Date.now();
  return (line) => { if (Date.now() - last > ms) { last = Date.now(); log(line); } };
}

/** One model's side of the generation items: its prompts, its end-of-sequence ids and stop strings. */
interface GenerationSide { who: 'model' | 'teacher'; ck: LoadedCheckpoint; tok: Tokenizer; prompts: GenerationPrompts; stopIds: number[]; until: string[] }

/**
 * The generation items: each model's prompts (its tokenizer, chat format and positions), its end-of-sequence ids (its
 * generation config's, else its config's, as transformers' generate stops) and its stop strings (with its eos_token).
 */
function generationJob(items: ChoiceItem[], pools: Pick<FewshotOptions, 'pools' | 'ownPools'>, o: EvalOptions, sides: { model: ChoiceSide; teacher?: ChoiceSide },
  cks: { model: LoadedCheckpoint; teacher?: LoadedCheckpoint }, log: (line: string) => void): { settings: GenerationSettings; sides: GenerationSide[] } {
  const settings = o.generation!;
  const shot = o.generationFewshot ?? o.fewshot;
  const fewshot = fewshotWith(shot, pools);
  const out = (['model', 'teacher'] as const).flatMap((who): GenerationSide[] => {
    const side = sides[who], ck = cks[who];
    if (!side || !ck) return [];
    const prompts = generationPrompts(side.tok, side.chat, items, { chat: o.choicesChat === true, kwargs: o.chatTemplateKwargs, delimiter: o.choiceDelimiter, fewshot, singleTurn: shot?.singleTurn, systemInstruction: o.systemInstruction, warn: log },
      ck.config.maxPositionEmbeddings, settings.maxGenToks, who);
    const eosId = side.tok.eosId;
    const eosText = side.chat.eosToken !== '' ? side.chat.eosToken : eosId !== undefined ? side.tok.idToToken(eosId) ?? null : null;
    const stopIds = ck.generationEosIds.length ? [...ck.generationEosIds] : eosIds(ck.config);
    if (prompts.cut) log(`warning: --choices: ${prompts.cut} of ${items.length} ${who === 'teacher' ? 'teacher ' : ''}prompts were cut on the left to ${ck.config.maxPositionEmbeddings - settings.maxGenToks} tokens (max_position_embeddings less --max-gen-toks), as the harness cuts them`);
    return [{ who, ck, tok: side.tok, prompts, stopIds, until: stopStrings(settings.until, eosText) }];
  });
  log(`generation: ${items.length} items${fewshotSaid(fewshot, shot?.from)}${o.choicesChat ? ' (prompts through the chat template)' : ''}, greedy, up to ${settings.maxGenToks} new tokens, until ${JSON.stringify(out[0]!.until)}; filters ${settings.filters.map((f) => f.name).join(', ')}`);
  return { settings, sides: out };
}

/** Each generation item's text and answers as JSON lines: `where`, `generation`, `answers` and `exact_match` per filter (the teacher's prefixed `teacher_`). */
export function generationSamples(items: readonly ChoiceItem[], s: GenerationSettings, mine: readonly GenerationOutcome[], theirs: readonly GenerationOutcome[] | null): string[] {
  const named = (v: readonly (string | number)[]): Record<string, string | number> => Object.fromEntries(s.filters.map((f, k) => [f.name, v[k]!]));
  return items.map((it, i) => JSON.stringify({
    where: it.where, generation: mine[i]!.text, tokens: mine[i]!.tokens, answers: named(mine[i]!.answers), exact_match: named(mine[i]!.matches),
    ...(theirs ? { teacher_generation: theirs[i]!.text, teacher_answers: named(theirs[i]!.answers), teacher_exact_match: named(theirs[i]!.matches) } : {}),
  }) + '\n');
}

/** --choices-out's lines in the items' order: the scored items' (choiceSamples, one a line) and the generation items'. */
function samplesInOrder(all: readonly ChoiceItem[], scored: { items: ChoiceItem[]; text: string } | null, generated: readonly ChoiceItem[], genLines: readonly string[]): string {
  const line = new Map<ChoiceItem, string>();
  if (scored) scored.text.split('\n').slice(0, -1).forEach((l, i) => line.set(scored.items[i]!, l + '\n'));
  generated.forEach((it, i) => line.set(it, genLines[i]!));
  return all.map((it) => line.get(it) ?? '').join('');
}

/** A model's side of --choices: its tokenizer and its chat format (tokenizer_config.json's special tokens and template). */
interface ChoiceSide { tok: Tokenizer; chat: ChatFormat }

/**
 * --choices: the items, each model's rows (the teacher's tokenizer_config.json may name another prefix token or chat
 * template), and the window they are scored in (the longest row's without --seq, at most max_position_embeddings).
 */
function choiceJob(items: ChoiceItem[], pools: Pick<FewshotOptions, 'pools' | 'ownPools'>, o: EvalOptions, sides: { model: ChoiceSide; teacher?: ChoiceSide }, maxPos: number, log: (line: string) => void):
  { items: ChoiceItem[]; rows: ChoiceRow[]; teacherRows?: ChoiceRow[]; seq: number; cut: number } {
  const shot = o.fewshot;
  const fewshot = fewshotWith(shot, pools);
  // text items' rolling windows: --seq's length, else the model's (the harness's max_length: max_position_embeddings)
  const rollingWindow = o.choiceSeqAuto ? maxPos : o.seq;
  const encode = (side: ChoiceSide): EncodedChoice[] => encodeForModel(side.tok, side.chat, items,
    { chat: o.choicesChat === true, kwargs: o.chatTemplateKwargs, delimiter: o.choiceDelimiter, fewshot, singleTurn: shot?.singleTurn, rollingWindow, warn: log, systemInstruction: o.systemInstruction });
  const model = encode(sides.model), teacher = sides.teacher ? encode(sides.teacher) : undefined;
  const need = Math.max(choiceWindow(model), teacher ? choiceWindow(teacher) : 0);
  const seq = o.choiceSeqAuto ? Math.min(need, maxPos) : o.seq;
  const rows = choiceRows(model, items, seq), teacherRows = teacher ? choiceRows(teacher, items, seq) : undefined;
  const cut = rows.filter((r) => r.cut).length;
  log(`choices: ${items.length} items, ${rowsSaid(items, rows)}${fewshotSaid(fewshot, shot?.from)}${o.choicesChat ? chatSaid(items, shot?.n ?? 0, shot?.singleTurn === true) : ''}, in windows of up to ${seq} tokens`);
  if (cut || teacherRows?.some((r) => r.cut)) {
    log(`warning: --choices: the context of ${cut} of ${rows.length} continuations${teacherRows ? ` (the teacher's: ${teacherRows.filter((r) => r.cut).length})` : ''} was cut on the left to fit --seq ${seq}`
      + `${need <= maxPos ? ` (--seq ${need} holds them all)` : ` (the longest needs ${need} tokens, more than max_position_embeddings ${maxPos})`}`);
  }
  return { items, rows, ...(teacherRows ? { teacherRows } : {}), seq, cut };
}

/** The human-readable report. */
export function formatEval(r: EvalResult): string {
  const lines: string[] = [];
  if (r.loss !== undefined) {
    lines.push(
      `windows     ${r.windows}`,
      `tokens      ${r.tokens}  (tokens the loss counted)`,
      `loss        ${r.loss.toFixed(4)}  (next-token cross-entropy, nats/token)`,
      `perplexity  ${r.perplexity!.toFixed(3)}`,
      `token acc   ${percent(r.tokenAccuracy!)}  (tokens whose target is the model's most likely token)`,
    );
  }
  if (r.agreement !== undefined) lines.push(`agreement   ${(100 * r.agreement).toFixed(2)}%  (top-1, model vs teacher)`);
  if (r.kl !== undefined) lines.push(`kl          ${r.kl.toFixed(4)}  (mean KL(teacher ‖ model) at T = 1, nats/token)`);
  const c = r.choices;
  if (c) {
    const windows = c.rolling?.windows ?? 0;
    lines.push(`choices     ${c.items} items, ${rowCounts(c.rows - windows, windows)} (windows of ${c.seq}${c.cut ? `, ${c.cut} cut on the left` : ''})`);
    const kept = (m: number, t: number): string => (t > 0 ? `, the model keeps ${percent(m / t)}` : '');
    const t = c.teacher;
    if (c.acc !== undefined && c.accNorm !== undefined) {
      const n = c.items - (c.greedy?.items ?? 0) - (c.rolling?.items ?? 0);
      lines.push(`acc         ${percent(c.acc)}  (highest log-likelihood${c.greedy || c.rolling ? `, of ${n} multiple-choice item${n === 1 ? '' : 's'}` : ''})`, `acc_norm    ${percent(c.accNorm)}  (highest log-likelihood per character)`);
      if (c.accBytes !== undefined && c.brierScore !== undefined) {
        lines.push(`acc_bytes   ${percent(c.accBytes)}  (highest log-likelihood per UTF-8 byte)`, `brier       ${c.brierScore.toFixed(4)}  (brier_score: the choices' softmax against the answer, lower is better)`);
      }
      if (t?.acc !== undefined && t.accNorm !== undefined) lines.push(`teacher     acc ${percent(t.acc)}${kept(c.acc, t.acc)}; acc_norm ${percent(t.accNorm)}${kept(c.accNorm, t.accNorm)}`);
    }
    if (c.greedy) {
      lines.push(`greedy      ${percent(c.greedy.acc)}  (continuations whose every token is the model's most likely, of ${c.greedy.items} item${c.greedy.items === 1 ? '' : 's'})`,
        `cont ppl    ${c.greedy.perplexity.toFixed(3)}  (exp of minus the mean log-likelihood of a continuation)`);
      if (t?.greedy) lines.push(`teacher     greedy ${percent(t.greedy.acc)}${kept(c.greedy.acc, t.greedy.acc)}; cont ppl ${t.greedy.perplexity.toFixed(3)}`);
    }
    if (c.rolling) {
      const n = c.rolling.items;
      lines.push(`word ppl    ${c.rolling.wordPerplexity.toFixed(3)}  (exp of minus the log-likelihood per word, of ${n} text${n === 1 ? '' : 's'} in rolling windows)`,
        `byte ppl    ${c.rolling.bytePerplexity.toFixed(4)}  (per UTF-8 byte)`, `bits/byte   ${c.rolling.bitsPerByte.toFixed(4)}`);
      if (t?.rolling) lines.push(`teacher     word ppl ${t.rolling.wordPerplexity.toFixed(3)}; byte ppl ${t.rolling.bytePerplexity.toFixed(4)}; bits/byte ${t.rolling.bitsPerByte.toFixed(4)}`);
    }
    for (const f of c.files ?? []) {
      lines.push(`  ${f.file}: ${f.items} items, ${scoresSaid(f)}${f.teacher ? ` (the teacher's: ${scoresSaid(f.teacher)})` : ''}`);
    }
  }
  const g = r.generation;
  if (g) {
    lines.push(`generation  ${g.items} item${g.items === 1 ? '' : 's'}, greedy, ${g.tokens} tokens generated (up to ${g.maxGenToks} each)${g.cut ? `, ${g.cut} prompts cut on the left` : ''}`);
    for (const [name, v] of Object.entries(g.exactMatch)) {
      const t = g.teacher?.exactMatch[name];
      lines.push(`exact_match ${percent(v)}  (${name})${t !== undefined ? `; teacher ${percent(t)}${t > 0 ? `, the model keeps ${percent(v / t)}` : ''}` : ''}`);
    }
    for (const f of g.files ?? []) {
      const said = (m: GenerationMetrics): string => Object.entries(m.exactMatch).map(([n, v]) => `${n} ${percent(v)}`).join(', ');
      lines.push(`  ${f.file}: ${f.items} items, exact_match ${said(f)}${f.teacher ? ` (the teacher's: ${said(f.teacher)})` : ''}`);
    }
  }
  lines.push(`precision   ${r.precision}${r.modelDtype === 'nf4' ? ' (projection matrices in nf4)' : ''}`);
  return lines.join('\n') + '\n';
}

const help = (): string => formatHelp({
  usage: 'distillery eval --model <dir> (--data <file>... | --choices <file.jsonl>...) [--teacher <dir>] [options]',
  description: 'Validation loss and perplexity of a checkpoint on data files; with --teacher, also top-1 agreement with the teacher and the mean KL(teacher ‖ model). With --choices, multiple-choice accuracy by log-likelihood (acc, acc_norm), the teacher\'s beside it.',
  flags: FLAGS,
  examples: [
    'distillery eval --model runs/student/final --data heldout.txt',
    'distillery eval --model runs/student/final --teacher runs/teacher/final --data heldout.jsonl --seq 128 --json',
    'distillery eval --model runs/student/final --teacher runs/teacher/final --choices arc-easy.jsonl',
    'distillery eval --model runs/student/final --teacher runs/teacher/final --choices gsm8k.jsonl --preset gsm8k --device cuda',
  ],
});

export const evalCommand: Command = {
  name: 'eval',
  summary: 'validation loss and perplexity (and teacher agreement / KL), multiple-choice accuracy',
  help,
  async run(argv, io: Io) {
    const parsed = parseArgs(argv, FLAGS, 'eval');
    if (parsed.help) { io.out(help()); return 0; }
    if (parsed.positionals.length) throw new UsageError(`eval: unexpected argument '${parsed.positionals[0]}'`, `data files go after --data: --data ${parsed.positionals.join(' ')}`);
    const o = evalOptions(parsed.values);
    for (const w of evalWarnings(parsed.values)) io.err(`warning: ${w}\n`);
    const r = await evaluate(o, (l) => io.err(`${l}\n`));
    io.out(o.json ? JSON.stringify(r) + '\n' : formatEval(r));
    return 0;
  },
};
