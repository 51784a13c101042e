/**
 * Options of a training or distillation run: what the CLI (flags or a YAML/JSON config file) resolves to,
 * with the defaults in one place. The CLI validates user input into this shape (src/cli/options.ts);
 * runTraining (run.ts) consumes it.
 */
import type { DistillKind } from '../backend/backend.js';
import type { LogitsFlag, PrecisionFlag } from './precision.js';
import type { FrozenDtype } from '../model/frozen.js';
import type { PackingChoice } from '../data/index.js';

export interface RunOptions {
  /** 'train': next-token cross-entropy only. 'distill': online teacher + the distillation loss. */
  mode: 'train' | 'distill';
  /** Run folder: metrics.jsonl, loss.svg, summary.json, checkpoints/, final/. */
  out: string;
  /** Training data: text or .jsonl files, or the single entry 'builtin:docs' (documentation comments of a dependency). */
  data: string[];
  /** Cap on characters read from the data (0 = no cap). */
  maxChars: number;
  /** tokenizer.json to use; when absent, the teacher's (distill) or the init checkpoint's, else a BPE trained on the data. */
  tokenizer?: string | undefined;
  /** Vocabulary size of a BPE trained on the data (when no tokenizer is given). */
  vocabSize: number;
  /** Student architecture: a preset name (tiny, small, base, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b, qwen2.5-7b, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b) or a config.json path. */
  model: string;
  /** Start from this checkpoint folder instead of random weights. */
  init?: string | undefined;
  /** Teacher checkpoint folder (distill). */
  teacher?: string | undefined;
  /** A teacher cache folder (distillery teacher-cache) to distill from instead of a teacher model (distill). */
  teacherCache?: string | undefined;
  device: 'cpu' | 'cuda';
  /** Storage and product precision (src/train/precision.ts): auto = bf16 on CUDA, fp32 on the CPU. */
  precision: PrecisionFlag;
  /** CPU threads for matrix products (0 = all cores). */
  threads: number;
  batch: number;
  seq: number;
  steps: number;
  gradAccum: number;
  lr: number;
  minLrRatio: number;
  warmup: number;
  weightDecay: number;
  beta1: number;
  beta2: number;
  adamEps: number;
  /** Global gradient-norm clip (0 = off). */
  clip: number;
  evalEvery: number;
  /** Validation batches per evaluation (0 = the whole validation split). */
  evalBatches: number;
  /** Items files (src/eval/items.ts) scored by the student at every evaluation (multiple choice: acc, acc_norm; continuations: greedy, perplexity; texts: word and byte perplexity, bits per byte); none: []. */
  evalChoices: string[];
  /** With evalChoices: each context as a user turn of the chat template, the assistant turn opened. */
  evalChoicesChat: boolean;
  /**
   * With evalChoices: examples before each item, as `eval --fewshot` (src/eval/fewshot.ts; 0: none). Unset: none, but
   * for generation items under evalPreset, the preset's own (as `eval --preset` without --fewshot).
   */
  evalFewshot?: number | undefined;
  /** With evalFewshot: the examples' files, one per evalChoices file (none: each file's own items). */
  evalFewshotFrom: string[];
  /** With evalFewshot: 'random' (the harness's default sampler) or 'first_n'. */
  evalFewshotSampler: 'random' | 'first_n';
  /** With evalFewshot: the random sampler's seed (the harness's fewshot_random_seed). */
  evalFewshotSeed: number;
  /** With evalChoices: a system turn before each item's description and examples (the harness's --system_instruction; '': none). */
  evalSystemInstruction: string;
  /** With evalChoices: the first n items of each file (below 1: that fraction of each, rounded up; 0: all), the harness's --limit. */
  evalLimit: number;
  /** Generation items of evalChoices: new tokens at most per item (the harness's max_gen_toks). */
  evalMaxGenToks: number;
  /** Generation items: sequences generated together (0: --batch; more is faster, in more memory; LoRA: at most --batch). */
  evalGenBatch: number;
  /** Generation items: stop strings ([]: the preset's, else the few-shot delimiter; the tokenizer's eos_token is added). */
  evalUntil: string[];
  /** Generation items: filter pipelines as JSON, a harness task's filter_list entries ([]: the preset's, else none). */
  evalFilter: string[];
  /** Generation items: exact_match's settings as JSON ('': the preset's, else none). */
  evalExactMatch: string;
  /** Generation items: a harness task's settings ('': none; 'gsm8k'). */
  evalPreset: string;
  saveEvery: number;
  seed: number;
  valFraction: number;
  loss: DistillKind;
  alpha: number;
  temperature: number;
  beta: number;
  /** Storage dtype of the final model's weights (checkpoints for resume are always f32). */
  saveDtype: 'f32' | 'bf16';
  /** On-policy distillation (GKD): the fraction λ of steps trained on the student's own completions (0 = off). */
  onPolicy: number;
  /** On-policy: the longest prompt taken from a window (0 = half the window). */
  promptLen: number;
  /** On-policy: the most tokens the student writes per prompt (0 = the rest of the window). */
  genLen: number;
  /** On-policy sampling: temperature (0 = greedy), top-p (1 = off), top-k (0 = off). */
  genTemperature: number;
  genTopP: number;
  genTopK: number;
  /** Chat data: the loss counts the assistant replies only ('assistant'), or every token ('all'). */
  lossOn: 'assistant' | 'all';
  /** How documents fill the windows (src/data/pack.ts): 'auto' is 'bfd' when the data has a conversation, else 'wrapped'. */
  packing: PackingChoice;
  /** Chat template options as JSON (e.g. '{"enable_thinking": false}'): extra variables of the model's template. */
  chatTemplateKwargs?: string;
  /** LoRA (src/model/lora.ts): train adapters of this rank on the frozen --init model (0 = train every weight). */
  loraRank: number;
  /** LoRA: the adapters' scale is alpha / rank (0 = 2 × rank). */
  loraAlpha: number;
  /** LoRA: the projections adapted, Hugging Face module names comma-separated (q_proj,v_proj), or 'all'. */
  loraTargets: string;
  /** Storage of the teacher's projection matrices (distill): 'auto' (the compute dtype) or 'nf4' (4 bits, QLoRA's format). */
  teacherDtype: FrozenDtype;
  /** The LM heads' logits (src/train/head.ts LogitsDtype): 'auto' (bf16 with bf16 models, else f32), 'bf16' or 'f32'. */
  logits: LogitsFlag;
  /** Storage of a LoRA run's frozen base matrices: 'auto' (the compute dtype) or 'nf4' (QLoRA). */
  baseDtype: FrozenDtype;
  /** Continue from <out>/checkpoints/latest. */
  resume: boolean;
  /** Start afresh in a run folder that already holds a run, deleting its checkpoints, metrics and final model. */
  overwrite: boolean;
  /** Print progress. */
  quiet: boolean;
  /** Stop after this many steps even if `steps` is larger (used to test resume; 0 = off). */
  stopAfter: number;
}

export const DEFAULT_RUN_OPTIONS: Omit<RunOptions, 'out' | 'data' | 'mode'> = {
  maxChars: 0,
  vocabSize: 512,
  model: 'tiny',
  device: 'cpu',
  precision: 'auto',
  threads: 0,
  batch: 8,
  seq: 64,
  steps: 200,
  gradAccum: 1,
  lr: 3e-3,
  minLrRatio: 0.1,
  warmup: 20,
  weightDecay: 0.1,
  beta1: 0.9,
  beta2: 0.95,
  adamEps: 1e-8,
  clip: 1.0,
  evalEvery: 50,
  evalBatches: 0,
  evalChoices: [],
  evalChoicesChat: false,
  evalFewshotFrom: [],
  evalFewshotSampler: 'random',
  evalFewshotSeed: 1234,
  evalSystemInstruction: '',
  evalLimit: 0,
  evalMaxGenToks: 256,
  evalGenBatch: 0,
  evalUntil: [],
  evalFilter: [],
  evalExactMatch: '',
  evalPreset: '',
  saveEvery: 100,
  seed: 1234,
  valFraction: 0.1,
  loss: 'kl',
  alpha: 0.5,
  temperature: 2.0,
  beta: 0.5,
  onPolicy: 0,
  promptLen: 0,
  genLen: 0,
  genTemperature: 1,
  genTopP: 1,
  genTopK: 0,
  saveDtype: 'f32',
  lossOn: 'assistant',
  packing: 'auto',
  loraRank: 0,
  loraAlpha: 0,
  loraTargets: 'all',
  teacherDtype: 'auto',
  logits: 'auto',
  baseDtype: 'auto',
  resume: false,
  overwrite: false,
  quiet: false,
  stopAfter: 0,
};
