/**
 * Validation of a training / distillation run's settings into RunOptions. Pure: the only outside facts it
 * needs (does this path exist, is it a folder) come through the `fs` argument, so it is unit-tested without
 * touching the disk.
 *
 * Precedence: DEFAULT_RUN_OPTIONS < the --config file < command-line flags. Config keys may be camelCase
 * (`gradAccum`), kebab-case (`grad-accum`) or snake_case (`grad_accum`). Every error names the setting the
 * way the user wrote it (`--lr`, or `lr in run.yaml`), says what is wrong and how to fix it.
 */
import * as path from 'node:path';
import * as nodeFs from 'node:fs';
import { DEFAULT_RUN_OPTIONS, type RunOptions } from '../train/options.js';
import { presetConfig, PRESET_NAMES } from '../model/config.js';
import { threadsProblem } from '../backend/create.js';
import { asUsage, camelToKebab, closest, coerceValue, kebabToCamel, UsageError, type FlagSpec } from './args.js';
import { looksLikeHubId, type HubResolution } from '../io/hf-cache.js';
import { parseLoraTargets } from '../model/lora.js';
import { DistilleryError } from '../util/errors.js';
import { GENERATION_PRESETS } from '../eval/generation.js';
import { RUN_GENERATION_FIELDS, runGenerationSettings } from '../train/run-generation.js';
import { isJsonObject, parsePyJson } from '../util/py-json.js';
import { PACKINGS } from '../data/pack.js';
import { examplesPairing, limitProblem, repeatedFile, REPEATED_FILE_HINT } from '../eval/items.js';

type Field = Exclude<keyof RunOptions, 'mode'>;
type Check = (v: number) => string | null;

interface FieldSpec {
  field: Field;
  flag: FlagSpec;
  /** Range check on a number: returns what the value must be, or null when it is fine. */
  check?: Check;
  /** Only meaningful for `distill`. */
  distillOnly?: boolean;
}

const positiveInt: Check = (v) => (Number.isInteger(v) && v > 0 ? null : 'a positive integer');
const nonNegInt: Check = (v) => (Number.isInteger(v) && v >= 0 ? null : 'an integer >= 0');
const positive: Check = (v) => (v > 0 ? null : '> 0');
const nonNeg: Check = (v) => (v >= 0 ? null : '>= 0');
const unitClosed: Check = (v) => (v >= 0 && v <= 1 ? null : 'between 0 and 1 (inclusive)');
const unitHalfOpen: Check = (v) => (v >= 0 && v < 1 ? null : '>= 0 and < 1');
const unitOpen: Check = (v) => (v > 0 && v < 1 ? null : 'strictly between 0 and 1');

const D = DEFAULT_RUN_OPTIONS;
/** The largest vocabulary the BPE trainer makes (token ids below 2^20). */
const MAX_BPE_VOCAB = 1048575;
const def = (f: keyof typeof D): string => String(D[f]);

function spec(field: Field, kind: FlagSpec['kind'], description: string, extra: Partial<FlagSpec> & { check?: Check; distillOnly?: boolean } = {}): FieldSpec {
  const { check, distillOnly, ...flagExtra } = extra;
  const name = camelToKebab(field);
  const defaultText = field in D && kind !== 'boolean' ? def(field as keyof typeof D) : undefined;
  const flag: FlagSpec = { name, kind, description, ...(defaultText !== undefined ? { defaultText } : {}), ...flagExtra };
  return { field, flag, ...(check ? { check } : {}), ...(distillOnly ? { distillOnly } : {}) };
}

/** Every RunOptions field as a setting, in help order. */
export const RUN_FIELDS: readonly FieldSpec[] = [
  spec('out', 'string', 'run folder: metrics, plots, checkpoints, final model (required)', { metavar: '<dir>' }),
  spec('data', 'list', "training text: .txt/.md (one document per file), .jsonl ({\"text\"} or {\"messages\"}), folders, or 'builtin:docs'; repeatable", { metavar: '<file>...' }),
  spec('maxChars', 'integer', 'cap on characters read from the data (0 = no cap)', { check: nonNegInt }),
  spec('tokenizer', 'string', "tokenizer.json (or a folder with one, or a Hub id in the local HF cache) to use (default: the teacher's, the init checkpoint's, else a BPE trained on the data)", { metavar: '<file>' }),
  spec('vocabSize', 'integer', 'vocabulary size of a BPE trained on the data', { check: (v) => (Number.isInteger(v) && v >= 256 && v <= MAX_BPE_VOCAB ? null : `an integer from 256 (the 256 byte tokens) to ${MAX_BPE_VOCAB}`) }),
  spec('model', 'string', 'student architecture: tiny, small, base, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b, qwen2.5-7b, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, a config.json, or a Hub id in the local HF cache (its config.json)', { metavar: '<preset|config.json|hub id>' }),
  spec('init', 'string', 'start from this checkpoint folder (or Hub id in the local HF cache) instead of random weights', { metavar: '<dir|hub id>' }),
  spec('teacher', 'string', 'teacher checkpoint folder or Hub id in the local HF cache (distill: this or --teacher-cache)', { metavar: '<dir|hub id>', distillOnly: true }),
  spec('teacherCache', 'string', 'distill from a teacher cache (distillery teacher-cache) instead of running a teacher', { metavar: '<dir>', distillOnly: true }),
  spec('device', 'string', 'where to compute', { choices: ['cpu', 'cuda'] }),
  spec('precision', 'string', 'storage and matrix-product precision: auto (bf16 on cuda, fp32 on cpu), bf16 (fp32 master weights), tf32, fp32', { choices: ['auto', 'bf16', 'tf32', 'fp32'] }),
  spec('threads', 'integer', 'CPU threads for matrix products (0 = all cores)', { check: threadsProblem }),
  spec('batch', 'integer', 'sequences per micro-batch', { check: positiveInt }),
  spec('seq', 'integer', 'tokens per sequence (context length)', { check: positiveInt }),
  spec('steps', 'integer', 'optimizer steps', { check: positiveInt }),
  spec('gradAccum', 'integer', 'micro-batches per optimizer step (gradient accumulation)', { check: positiveInt }),
  spec('lr', 'number', 'peak learning rate', { check: positive }),
  spec('minLrRatio', 'number', 'final learning rate as a fraction of --lr (cosine decay)', { check: unitClosed }),
  spec('warmup', 'integer', 'linear warm-up steps (must be < --steps; unset, a tenth of --steps when the default is not below it)', { check: nonNegInt }),
  spec('weightDecay', 'number', 'AdamW weight decay', { check: nonNeg }),
  spec('beta1', 'number', 'AdamW beta1', { check: unitHalfOpen }),
  spec('beta2', 'number', 'AdamW beta2', { check: unitHalfOpen }),
  spec('adamEps', 'number', 'AdamW epsilon', { check: positive }),
  spec('clip', 'number', 'global gradient-norm clip (0 = off)', { check: nonNeg }),
  spec('evalEvery', 'integer', 'evaluate on the validation split every N steps (0 = only at the end)', { check: nonNegInt }),
  spec('evalBatches', 'integer', 'validation batches per evaluation (0 = the whole split)', { check: nonNegInt }),
  spec('evalChoices', 'list', 'items the student scores at every evaluation, as `eval --choices` does: {"context", "choices", "answer"} a line (acc, acc_norm in metrics.jsonl), {"context", "continuation"} (val_greedy, val_cont_ppl), {"contexts", "continuation", "answer"} (acc, acc_norm) or {"text"} (val_word_ppl, val_byte_ppl, val_bits_per_byte, in windows of --seq); a teacher\'s too, once; repeatable', { metavar: '<file.jsonl>...', defaultText: 'none' }),
  spec('evalChoicesChat', 'boolean', 'with --eval-choices: each context as a user turn of the chat template, the assistant turn opened (as eval --choices-chat)'),
  spec('evalFewshot', 'integer', 'with --eval-choices: n examples before each item, as eval --fewshot (the harness\'s --num_fewshot; "\\n\\n" after each example)', { check: nonNegInt, metavar: '<n>', defaultText: '0 (generation items under --eval-preset: the preset\'s)' }),
  spec('evalFewshotFrom', 'list', 'with --eval-fewshot: the examples\' items, one file per --eval-choices file (as eval --fewshot-from)', { metavar: '<file.jsonl>...', defaultText: 'each file\'s own items, the item itself left out' }),
  spec('evalFewshotSampler', 'string', 'with --eval-fewshot: random (the harness\'s default) or first_n', { choices: ['random', 'first_n'] }),
  spec('evalFewshotSeed', 'integer', 'with --eval-fewshot: the random sampler\'s seed (the harness\'s fewshot_random_seed)', { check: nonNegInt }),
  spec('evalSystemInstruction', 'string', 'with --eval-choices: a system turn before each item\'s description and examples, as eval --system-instruction (the harness\'s --system_instruction; plain text: the prompt\'s start)', { metavar: '<text>', defaultText: 'none' }),
  spec('evalLimit', 'number', 'with --eval-choices: the first n items of each file (below 1: that fraction of each, rounded up), their examples drawn from the whole file, as eval --limit (the harness\'s --limit; 0 = all)', { check: (v) => (v === 0 ? null : limitProblem(v)), metavar: '<n>' }),
  spec('evalMaxGenToks', 'integer', 'with generation items ({"context", "target"}) in --eval-choices: new tokens at most per item, greedy (as eval --max-gen-toks; the prompt is cut on the left to --seq less this)', { check: positiveInt, metavar: '<n>' }),
  spec('evalGenBatch', 'integer', 'with generation items: sequences generated together (more is faster and takes more memory: a KV cache and activations of this many × --seq; with LoRA adapters at most --batch)', { check: nonNegInt, metavar: '<n>', defaultText: '--batch' }),
  spec('evalUntil', 'list', 'with generation items: stop strings, the text kept is the one before the first (as eval --until; the tokenizer\'s eos_token is added)', { metavar: '<text>...', defaultText: 'the preset\'s, else the few-shot delimiter' }),
  spec('evalFilter', 'list', 'with generation items: filter pipelines, each a harness task\'s filter_list entry as JSON (as eval --filter); each is reported as val_exact_match_<name>', { metavar: '<json>...', defaultText: 'the preset\'s, else "none" (the text)' }),
  spec('evalExactMatch', 'string', 'with generation items: exact_match\'s settings as JSON (as eval --exact-match)', { metavar: '<json>', defaultText: 'the preset\'s, else {}' }),
  spec('evalPreset', 'string', 'with generation items: a harness task\'s settings (gsm8k: until, the strict-match and flexible-extract filters, exact_match\'s settings, and 5 examples unless --eval-fewshot is given, 0 too), as eval --preset; the flags above override them', { choices: Object.keys(GENERATION_PRESETS), defaultText: 'none' }),
  spec('saveEvery', 'integer', 'write a resumable checkpoint every N steps (0 = only at the end)', { check: nonNegInt }),
  spec('seed', 'integer', 'random seed (weights, data order)'),
  spec('valFraction', 'number', 'fraction of the packed windows held out for validation', { check: unitHalfOpen }),
  spec('loss', 'string', 'distillation divergence', { choices: ['kl', 'reverse-kl', 'jsd'], distillOnly: true }),
  spec('alpha', 'number', 'weight of the divergence; (1 - alpha) weighs the cross-entropy', { check: unitClosed, distillOnly: true }),
  spec('temperature', 'number', 'softmax temperature of the divergence (T^2 factor applied)', { check: positive, distillOnly: true }),
  spec('beta', 'number', 'teacher weight of the JSD mixture m = beta p_t + (1 - beta) p_s', { check: unitOpen, distillOnly: true }),
  spec('onPolicy', 'number', 'on-policy distillation (GKD): the fraction of steps trained on the student\'s own completions of the data\'s prompts, scored by the teacher (0 = off; needs --teacher)', { check: unitClosed, distillOnly: true }),
  spec('promptLen', 'integer', 'on-policy: the longest prompt taken from a window (chat: the tokens before its first assistant token; 0 = half the window)', { check: nonNegInt, distillOnly: true }),
  spec('genLen', 'integer', 'on-policy: the most tokens the student writes per prompt (0 = the rest of the window)', { check: nonNegInt, distillOnly: true }),
  spec('genTemperature', 'number', 'on-policy sampling temperature (0 = greedy)', { check: nonNeg, distillOnly: true }),
  spec('genTopP', 'number', 'on-policy nucleus sampling: keep the most likely tokens up to this probability (1 = off)', { check: (v) => (v > 0 && v <= 1 ? null : 'in (0, 1]'), distillOnly: true }),
  spec('genTopK', 'integer', 'on-policy top-k sampling (0 = off)', { check: nonNegInt, distillOnly: true }),
  spec('saveDtype', 'string', 'storage dtype of the final weights', { choices: ['f32', 'bf16'] }),
  spec('lossOn', 'string', 'chat data: the tokens the loss counts: the assistant replies (and their end-of-turn marker), or all', { choices: ['assistant', 'all'] }),
  spec('packing', 'string', 'how documents fill the --seq windows: bfd (each whole, best-fit decreasing, attending only to itself; a document longer than a window is cut), wrapped (joined and cut into windows: a document may be split), none (one document a window, padded: no document sees another, as TRL without packing), auto (bfd when the data has conversations, else wrapped)', { choices: ['auto', ...PACKINGS] }),
  spec('chatTemplateKwargs', 'string', 'chat template options, a JSON object of extra template variables, e.g. \'{"enable_thinking": false}\'', { metavar: '<json>' }),
  spec('loraRank', 'integer', 'LoRA: train adapters of this rank on the frozen --init model instead of every weight (0 = off); checkpoints and final/ hold a PEFT adapter folder', { check: nonNegInt }),
  spec('loraAlpha', 'number', 'LoRA: the adapters are scaled by alpha / rank (0 = 2 × --lora-rank)', { check: nonNeg }),
  spec('loraTargets', 'string', 'LoRA: the projections to adapt, Hugging Face names comma-separated (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj) or all', { metavar: '<names|all>' }),
  spec('teacherDtype', 'string', 'storage of the teacher\'s projection matrices: auto (the compute dtype) or nf4 (4-bit NormalFloat, QLoRA\'s format: about a quarter of bf16\'s memory)', { choices: ['auto', 'nf4'], distillOnly: true }),
  spec('logits', 'string', 'the LM heads\' logits for the loss: auto (bf16 with --precision bf16, as transformers and autocast compute them; else f32), bf16 or f32 (each logit exact to float32, at twice the loss\'s memory traffic)', { choices: ['auto', 'bf16', 'f32'] }),
  spec('baseDtype', 'string', 'LoRA: storage of the frozen base\'s projection matrices: auto (the compute dtype) or nf4 (QLoRA)', { choices: ['auto', 'nf4'] }),
  spec('resume', 'boolean', 'continue from <out>/checkpoints/latest'),
  spec('overwrite', 'boolean', 'start afresh in an --out that already holds a run (deletes its checkpoints, metrics and final model)'),
  spec('quiet', 'boolean', 'no progress output'),
  spec('stopAfter', 'integer', 'stop after N steps even if --steps is larger (0 = off)', { check: nonNegInt }),
];

/** The chat template options of `--chat-template-kwargs` (a JSON object), or a UsageError naming `label`. */
export function parseTemplateKwargs(json: string, label = '--chat-template-kwargs'): Record<string, unknown> {
  let v: unknown;
  try { v = parsePyJson(json); } catch (e) {
    throw new UsageError(`${label}: not valid JSON (${(e as Error).message})`, 'pass a JSON object, e.g. --chat-template-kwargs \'{"enable_thinking": false}\'');
  }
  if (!isJsonObject(v)) {
    throw new UsageError(`${label}: must be a JSON object of template variables, got ${JSON.stringify(v)}`, 'pass e.g. --chat-template-kwargs \'{"enable_thinking": false}\'');
  }
  return v as Record<string, unknown>;
}

const BY_FIELD = new Map(RUN_FIELDS.map((s) => [s.field, s]));
const BY_FLAG = new Map(RUN_FIELDS.map((s) => [s.flag.name, s]));

/** The flags of `train` / `distill`: every RunOptions field plus --config. */
export function runFlags(mode: 'train' | 'distill'): FlagSpec[] {
  const fields = RUN_FIELDS.filter((s) => mode === 'distill' || !s.distillOnly).map((s) => s.flag);
  const distillOnly = RUN_FIELDS.filter((s) => mode === 'train' && s.distillOnly).map((s) => ({ ...s.flag, description: `${s.flag.description} [distill only: ignored by train]` }));
  return [{ name: 'config', kind: 'string', metavar: '<file.yaml|file.json>', description: 'read settings from a YAML or JSON file (flags override it)' }, ...fields, ...distillOnly];
}

/** What validation may ask about the file system. */
export interface FsProbe {
  exists(p: string): boolean;
  isDirectory(p: string): boolean;
  /** Whether this process may create files in the existing folder p (absent: assumed yes). */
  writable?(p: string): boolean;
  /** Looks a Hub id (Qwen/Qwen2.5-0.5B) up in the local Hugging Face cache; absent: Hub ids are not resolved. */
  hubModel?(id: string): HubResolution;
}

/**
 * Checks that `out` can be the run folder: it and every existing folder above it are folders (not files), and
 * the nearest existing one is writable. Throws a UsageError naming the culprit.
 */
/** Whether path `p` is `dir` or lies under it (paths resolved; links not followed). */
export function isInside(p: string, dir: string): boolean {
  const rel = path.relative(realPathish(dir), realPathish(p));
  return rel === '' || (rel !== '..' && !rel.startsWith('..' + path.sep) && !path.isAbsolute(rel));
}

/**
 * The path with symbolic links resolved: its deepest existing ancestor's real path and the rest appended (so that a
 * link to the data folder, or an --out reached through one, is seen to be inside it).
 */
export function realPathish(p: string): string {
  const abs = path.resolve(p), rest: string[] = [];
  for (let q = abs; ; q = path.dirname(q)) {
    try { return path.join(nodeFs.realpathSync(q), ...rest.reverse()); } catch { /* not there (yet): look higher */ }
    if (path.dirname(q) === q) return abs;
    rest.push(path.basename(q));
  }
}

export function checkOutDir(fs: FsProbe, out: string, label: string): void {
  const parts: string[] = [];
  const start = path.normalize(out).replace(/(.)[\\/]+$/, '$1');
  for (let p = start; ; ) {
    parts.push(p);
    const up = path.dirname(p);
    if (up === p) break;
    p = up;
  }
  // From the root down: the first component that is a file is the problem; the last existing folder must be writable.
  let lastDir: string | null = null;
  for (const p of parts.reverse()) {
    if (!fs.exists(p)) break;
    if (!fs.isDirectory(p)) {
      throw new UsageError(p === start ? `${label} ${out} is a file, not a folder` : `${label} ${out}: ${p} is a file, so no folder can be made under it`,
        'pass a folder path for the run (it is created if missing), e.g. --out runs/my-run');
    }
    lastDir = p;
  }
  if (lastDir !== null && fs.writable && !fs.writable(lastDir)) {
    throw new UsageError(`${label} ${out}: no permission to write in ${lastDir}`, 'choose a folder you can write to, or fix its permissions');
  }
}


export interface ResolveInput {
  mode: 'train' | 'distill';
  /** Values from parseArgs (kebab-case keys, already converted); a 'config' key is ignored here. */
  flags: Record<string, unknown>;
  /** The parsed --config file, if one was given. */
  config?: { file: string; values: Record<string, unknown> } | undefined;
  fs: FsProbe;
}

export interface Resolved {
  options: RunOptions;
  /** Settings that have no effect (e.g. distillation options given to train); the CLI prints them. */
  warnings: string[];
}

const BUILTIN_DATA = 'builtin:docs';

/** Maps a config file's key (camel, kebab or snake case) to its field, or throws naming the key. */
export function configKeyToField(key: string, file: string): Field {
  const camel = kebabToCamel(key);
  const s = BY_FIELD.get(camel as Field);
  if (s) return s.field;
  const styleKebab = key.includes('-');
  const names = RUN_FIELDS.map((f) => (styleKebab ? f.flag.name : f.field));
  const c = closest(key, names);
  const extra = key === 'mode' ? "the mode comes from the command: 'distillery train' or 'distillery distill'" :
    c !== undefined ? `did you mean '${c}'?` : `known keys: ${RUN_FIELDS.map((f) => f.field).join(', ')}`;
  throw new UsageError(`unknown key '${key}' in ${file}`, extra);
}

/** Merges defaults, the config file and flags into RunOptions, validating everything (see the module comment). */
export function resolveRunOptions(input: ResolveInput): Resolved {
  const { mode, flags, config, fs } = input;
  const warnings: string[] = [];
  const merged: Record<string, unknown> = { ...DEFAULT_RUN_OPTIONS };
  /** How each field was set, to name it in messages. */
  const label = new Map<Field, string>();
  const labelOf = (f: Field): string => label.get(f) ?? `--${camelToKebab(f)}`;

  if (config) {
    for (const [key, raw] of Object.entries(config.values)) {
      const field = configKeyToField(key, config.file);
      const s = BY_FIELD.get(field)!;
      const l = `${key} in ${config.file}`;
      if (raw === null || raw === undefined) continue; // `key:` with no value in YAML: keep the default
      merged[field] = coerceValue(s.flag, raw, l);
      label.set(field, l);
    }
  }
  for (const [name, v] of Object.entries(flags)) {
    if (name === 'config') continue;
    const s = BY_FLAG.get(name);
    if (!s) throw new UsageError(`unknown option --${name}`, `run 'distillery ${mode} --help' to list the options`);
    merged[s.field] = v;
    label.set(s.field, `--${name}`);
  }

  // Range checks, field by field.
  for (const s of RUN_FIELDS) {
    const v = merged[s.field];
    if (s.check && typeof v === 'number') {
      const want = s.check(v);
      if (want !== null) {
        const dflt = s.field in DEFAULT_RUN_OPTIONS ? ` (default ${def(s.field as keyof typeof D)})` : '';
        throw new UsageError(`${labelOf(s.field)} must be ${want}, got ${v}`, `set ${labelOf(s.field)} to a valid value${dflt}`);
      }
    }
  }

  // Required settings.
  if (typeof merged.out !== 'string' || merged.out === '') {
    throw new UsageError(`${mode}: no output folder given (--out)`, 'pass --out <dir>, e.g. --out runs/my-run, or set out: in the config file');
  }
  checkOutDir(fs, merged.out, labelOf('out'));
  const data = merged.data as string[] | undefined;
  if (!data || data.length === 0) {
    throw new UsageError(`${mode}: no training data given (--data)`, `pass --data <file> (repeatable; .txt, .md, .jsonl or a folder) or --data ${BUILTIN_DATA}`);
  }
  if (data.includes(BUILTIN_DATA) && data.length > 1) {
    throw new UsageError(`${labelOf('data')}: '${BUILTIN_DATA}' cannot be combined with other data files`, `use either --data ${BUILTIN_DATA} or your own files`);
  }
  for (const d of data) {
    if (d !== BUILTIN_DATA && !fs.exists(d)) {
      throw new UsageError(`${labelOf('data')}: data file ${d} does not exist`, 'check the path (relative paths are relative to the current folder)');
    }
    // a run inside a data folder would become data: its metrics.jsonl read as documents by the next run (or --resume)
    if (d !== BUILTIN_DATA && fs.isDirectory(d) && isInside(merged.out, d)) {
      throw new UsageError(`${labelOf('out')} ${merged.out} is inside the data folder ${d}`, 'put the run outside the data, e.g. --out runs/my-run');
    }
  }

  for (const c of (merged.evalChoices as string[] | undefined) ?? []) {
    if (!fs.exists(c)) throw new UsageError(`${labelOf('evalChoices')}: file ${c} does not exist`, 'pass a .jsonl file of items (relative paths are relative to the current folder)');
    if (fs.isDirectory(c)) throw new UsageError(`${labelOf('evalChoices')}: ${c} is a folder`, 'pass the .jsonl file of items itself');
  }
  const choiceFiles = (merged.evalChoices as string[] | undefined) ?? [];
  const twice = repeatedFile(choiceFiles);
  if (twice !== undefined) throw new UsageError(`${labelOf('evalChoices')}: ${twice} is given twice`, REPEATED_FILE_HINT);
  for (const f of ['evalChoicesChat', 'evalFewshot', 'evalSystemInstruction', 'evalLimit'] as const) {
    if ((merged[f] === true || (typeof merged[f] === 'number' && merged[f] > 0) || (typeof merged[f] === 'string' && merged[f] !== '')) && !choiceFiles.length) throw new UsageError(`${labelOf(f)} goes with --eval-choices`, 'pass --eval-choices <items.jsonl>, or drop it');
  }
  const genFlags = RUN_GENERATION_FIELDS.filter((f) => label.has(f));
  if ((merged.evalGenBatch as number) > (merged.batch as number) && (merged.loraRank as number) > 0) {
    throw new UsageError(`${labelOf('evalGenBatch')} ${String(merged.evalGenBatch)} exceeds ${labelOf('batch')} ${String(merged.batch)}, and LoRA adapters generate over the student's own batch × seq rows`,
      `use ${labelOf('evalGenBatch')} ${String(merged.batch)} or less (or merge the adapters and evaluate with distillery eval)`);
  }
  if (genFlags.length && !choiceFiles.length) throw new UsageError(`${labelOf(genFlags[0]!)} goes with --eval-choices`, 'pass --eval-choices <items.jsonl> with generation items ({"context", "target"}), or drop it');
  if (genFlags.length) {
    // the settings checked now (a bad filter costs nothing); the run parses them again where it reads the items
    asUsage(() => runGenerationSettings(merged as unknown as RunOptions, labelOf));
  }
  for (const f of ['evalFewshotFrom', 'evalFewshotSampler', 'evalFewshotSeed'] as const) {
    if (label.has(f) && !label.has('evalFewshot')) throw new UsageError(`${labelOf(f)} goes with --eval-fewshot`, 'pass --eval-fewshot <n>, or drop it');
  }
  const shotFiles = (merged.evalFewshotFrom as string[] | undefined) ?? [];
  const pairing = shotFiles.length ? examplesPairing(shotFiles.length, choiceFiles.length, labelOf('evalFewshotFrom'), '--eval-choices') : null;
  if (pairing) throw new UsageError(pairing.message, pairing.hint);
  for (const c of shotFiles) {
    if (!fs.exists(c) || fs.isDirectory(c)) throw new UsageError(`${labelOf('evalFewshotFrom')}: ${c} is not a file`, 'pass the .jsonl file of examples (relative paths are relative to the current folder)');
  }

  // Cross-field checks.
  const steps = merged.steps as number;
  // The default warm-up (20 steps) would be the whole of a short run: left unset, it shrinks to a tenth of --steps
  // (a quick `--steps 10` runs instead of failing). A warm-up the user set is checked as given.
  if (!label.has('warmup') && (merged.warmup as number) >= steps) merged.warmup = Math.floor(steps / 10);
  const warmup = merged.warmup as number;
  if (warmup >= steps) {
    throw new UsageError(`${labelOf('warmup')} (${warmup}) must be less than ${labelOf('steps')} (${steps})`,
      `lower ${labelOf('warmup')} (e.g. ${Math.floor(steps / 10)}) or raise ${labelOf('steps')}`);
  }

  if (merged.resume === true && merged.overwrite === true) {
    throw new UsageError(`${labelOf('resume')} and ${labelOf('overwrite')} contradict each other`,
      'use --resume to continue the run in --out, or --overwrite to replace it with a new one');
  }

  // Paths.
  // Paths. A model argument that is not on disk but looks like a Hub id is looked up in the local HF cache.
  const fromHub = (field: 'model' | 'teacher' | 'init' | 'tokenizer'): void => {
    const v = merged[field];
    if (typeof v !== 'string' || fs.exists(v) || !looksLikeHubId(v) || !fs.hubModel) return;
    if (field === 'model' && isPreset(v)) return;
    const r = fs.hubModel(v);
    if (!r.ok) throw new UsageError(`${labelOf(field)}: ${r.message}`, r.hint);
    // --model takes the architecture only: the snapshot's config.json.
    merged[field] = field === 'model' ? `${r.dir}/config.json` : r.dir;
  };
  fromHub('model'); fromHub('teacher'); fromHub('init'); fromHub('tokenizer');
  const model = merged.model as string;
  if (!isPreset(model)) {
    if (!fs.exists(model)) {
      throw new UsageError(`${labelOf('model')}: '${model}' is neither a preset nor an existing config.json`,
        `use one of ${PRESET_NAMES.join(', ')}, or the path of a config.json`);
    }
    if (fs.isDirectory(model)) {
      throw new UsageError(`${labelOf('model')}: ${model} is a folder`, `to start from a checkpoint folder use --init ${model}; --model takes a preset or a config.json file`);
    }
  }
  if (merged.tokenizer !== undefined && !fs.exists(merged.tokenizer as string)) {
    throw new UsageError(`${labelOf('tokenizer')}: tokenizer file ${String(merged.tokenizer)} does not exist`, 'pass a tokenizer.json file or a model folder that contains one');
  }
  if (merged.init !== undefined) checkModelDir(fs, merged.init as string, labelOf('init'));

  // Mode-specific.
  if (mode === 'distill') {
    if (merged.teacher !== undefined && merged.teacherCache !== undefined) {
      throw new UsageError(`${labelOf('teacher')} and ${labelOf('teacherCache')}: distill from one of them`,
        'drop --teacher to train from the cache alone (the cache holds what the student needs of the teacher)');
    }
    if (merged.teacher === undefined && merged.teacherCache === undefined) {
      throw new UsageError('distill needs a teacher (--teacher) or a teacher cache (--teacher-cache)', 'pass --teacher <checkpoint folder> (a Hugging Face folder with config.json and model.safetensors), or --teacher-cache <folder> made by `distillery teacher-cache`');
    }
    if (merged.teacher !== undefined) checkModelDir(fs, merged.teacher as string, labelOf('teacher'));
    else {
      const c = merged.teacherCache as string;
      if (!fs.exists(c) || !fs.isDirectory(c)) throw new UsageError(`${labelOf('teacherCache')}: ${c} is not a folder`, 'pass the --out folder of `distillery teacher-cache`');
      if (!fs.exists(`${c}/manifest.json`)) throw new UsageError(`${labelOf('teacherCache')}: ${c} has no manifest.json`, 'pass the --out folder of `distillery teacher-cache`');
    }
    if (merged.teacherDtype === 'nf4' && merged.teacherCache !== undefined) {
      throw new UsageError(`${labelOf('teacherDtype')} nf4 has no effect with --teacher-cache: no teacher is in memory`, 'drop --teacher-dtype');
    }
    if ((merged.onPolicy as number) > 0 && merged.teacherCache !== undefined) {
      throw new UsageError(`${labelOf('onPolicy')} needs a live teacher: it scores the student's own completions, which no cache holds`,
        'pass --teacher <checkpoint folder> instead of --teacher-cache, or drop --on-policy');
    }
    if ((merged.onPolicy as number) > 0 && (merged.seq as number) < 3) {
      throw new UsageError(`${labelOf('onPolicy')} needs windows of at least 3 tokens (a prompt and a completion), got --seq ${String(merged.seq)}`, 'raise --seq');
    }
    if (label.has('beta') && merged.loss !== 'jsd') {
      warnings.push(`${labelOf('beta')} has no effect with --loss ${String(merged.loss)}: it only weighs the JSD mixture (--loss jsd)`);
    }
  } else {
    const given = RUN_FIELDS.filter((s) => s.distillOnly && label.has(s.field)).map((s) => labelOf(s.field));
    if (given.length) {
      warnings.push(`${given.join(', ')} ${given.length === 1 ? 'has' : 'have'} no effect with 'train' (plain next-token training); use 'distillery distill' to distill from a teacher`);
    }
    delete merged.teacher;
    delete merged.teacherCache;
  }

  // LoRA adapts a pretrained model: the base is --init, frozen.
  if ((merged.loraRank as number) > 0) {
    if (merged.init === undefined) {
      throw new UsageError(`${labelOf('loraRank')} trains adapters on a pretrained model, but no --init names one`,
        'pass --init <model folder> (the base the adapters adapt), or drop --lora-rank to train every weight');
    }
    try { parseLoraTargets(merged.loraTargets as string); } catch (e) {
      if (e instanceof DistilleryError) throw new UsageError(`${labelOf('loraTargets')}: ${e.message.replace(/^--lora-targets:? ?/, '')}`, e.hint);
      throw e;
    }
  } else {
    if (merged.baseDtype === 'nf4') {
      throw new UsageError(`${labelOf('baseDtype')} nf4 stores a frozen LoRA base in 4 bits, but no --lora-rank trains adapters on it`,
        'add --lora-rank <r> (QLoRA), or drop --base-dtype: weights that train every step stay in full precision');
    }
    const given = (['loraAlpha', 'loraTargets'] as const).filter((f) => label.has(f)).map((f) => labelOf(f));
    if (given.length) warnings.push(`${given.join(', ')} ${given.length === 1 ? 'has' : 'have'} no effect without --lora-rank`);
  }

  if (merged.chatTemplateKwargs !== undefined) parseTemplateKwargs(merged.chatTemplateKwargs as string, labelOf('chatTemplateKwargs'));

  const options = { ...merged, mode, out: merged.out, data: data.slice() } as RunOptions;
  return { options, warnings };
}


function isPreset(name: string): boolean {
  try {
    presetConfig(name, 512);
    return true;
  } catch {
    return false;
  }
}

function checkModelDir(fs: FsProbe, dir: string, what: string): void {
  if (!fs.exists(dir)) throw new UsageError(`${what}: checkpoint folder ${dir} does not exist`, 'pass a folder with config.json and model.safetensors');
  if (!fs.isDirectory(dir)) throw new UsageError(`${what}: ${dir} is a file, not a checkpoint folder`, 'pass the folder that holds config.json and model.safetensors');
  if (!fs.exists(`${dir}/config.json`) && fs.exists(`${dir}/adapter_config.json`)) {
    throw new UsageError(`${what}: ${dir} is a LoRA adapter folder, not a model folder`,
      `pass its base model folder; to continue training the adapter use --resume in its run folder, or make a full model with 'distillery export --merge ${dir} --out <dir>'`);
  }
  if (!fs.exists(`${dir}/config.json`)) throw new UsageError(`${what}: ${dir} has no config.json`, 'a checkpoint folder needs config.json next to model.safetensors');
}
