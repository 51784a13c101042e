/**
 * The models and the tokenizer of a run, chosen and checked before anything is computed: which tokenizer the run
 * uses (the checkpoint's on --resume, --tokenizer, the teacher's, --init's, else one trained on the data) and that
 * every model shares it; the student's config; the vocabulary rows the loss runs over; whether --seq fits the models
 * and the job fits the device. runTraining (run.ts) and --dry-run (dry-run.ts) both call these, so they cannot disagree.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Backend } from '../backend/backend.js';
import { readHfConfigFile, presetConfig, parameterCount, PRESET_NAMES, type ModelConfig } from '../model/config.js';
import type { LoadedCheckpoint } from '../model/checkpoint.js';
import { Tokenizer } from '../tokenizer/bpe.js';
import { trainBpe } from '../tokenizer/train-bpe.js';
import { assertSameTokenizer, lossVocabulary, tokenizerHash, type NamedTokenizer } from '../tokenizer/identity.js';
import { DistilleryError, InputError } from '../util/errors.js';
import { estimateJobBytes, largestSeqThatFits, formatGiB, describeJob, type JobMemory } from '../model/memory.js';
import type { RunOptions } from './options.js';

export const SPECIAL_TOKENS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];

/**
 * The tokenizer to resume with: the checkpoint's own copy, in its weights folder (`model/`, or `adapter/` for a LoRA
 * run); out/tokenizer.json only for checkpoints without one.
 */
export function resumeTokenizerPath(out: string, latest: string, log: (s: string) => void): string {
  for (const sub of ['model', 'adapter']) {
    const own = path.join(latest, sub, 'tokenizer.json');
    if (fs.existsSync(own)) return own;
  }
  log(`warning: --resume: the checkpoint has no tokenizer.json of its own; using ${path.join(out, 'tokenizer.json')}`);
  return path.join(out, 'tokenizer.json');
}

export function teacherFrom(o: RunOptions): string {
  return o.teacherCache ? `--teacher-cache ${o.teacherCache}` : `--teacher ${o.teacher}`;
}


export function describe(c: ModelConfig): string {
  return `${c.architecture} ${c.numLayers}L × ${c.hiddenSize} (${c.numHeads} heads, ${c.numKvHeads} kv), vocab ${c.vocabSize}, ${(parameterCount(c) / 1e6).toFixed(2)}M parameters`;
}

/** The run's tokenizer and where it came from (the name it has in identity errors). */
export function chooseTokenizer(o: RunOptions, docs: () => string[], resumePath: string | null, teacher: LoadedCheckpoint | null,
  init: LoadedCheckpoint | null, log: (s: string) => void): NamedTokenizer & { role: 'resume' | 'tokenizer' | 'teacher' | 'init' | 'trained' } {
  if (resumePath) return { name: 'run', tokenizer: Tokenizer.fromFile(resumePath), from: resumePath, role: 'resume' };
  if (o.tokenizer) return { name: 'data', tokenizer: Tokenizer.fromFile(o.tokenizer), from: `--tokenizer ${o.tokenizer}`, role: 'tokenizer' };
  if (teacher) {
    if (!teacher.tokenizer) throw new DistilleryError(`the teacher folder ${o.teacher} has no tokenizer.json`, 'copy the teacher\'s tokenizer.json into it or pass --tokenizer');
    return { name: 'teacher', tokenizer: teacher.tokenizer, from: teacherFrom(o), role: 'teacher' };
  }
  if (init?.tokenizer) return { name: 'student', tokenizer: init.tokenizer, from: `--init ${o.init}`, role: 'init' };
  const d = docs();
  const t0 = Date.now();
  const tok = trainBpe(d, { vocabSize: o.vocabSize, specialTokens: SPECIAL_TOKENS });
  log(`tokenizer: trained a byte-level BPE of ${tok.vocabSize} tokens on the data in ${((Date.now() - t0) / 1000).toFixed(1)}s`);
  return { name: 'data', tokenizer: tok, from: 'trained on the data', role: 'trained' };
}

/**
 * Refuses a teacher or an --init checkpoint whose tokenizer is not the run's (see identity.ts): same size is not
 * enough. A checkpoint without a tokenizer.json cannot be checked: the log says so.
 */
export function checkSameTokenizer(o: RunOptions, chosen: ReturnType<typeof chooseTokenizer>, teacher: LoadedCheckpoint | null,
  init: LoadedCheckpoint | null, log: (s: string) => void): void {
  const advice = o.mode === 'distill'
    ? 'distillation compares the two models token by token, so the teacher, the student (--init) and the data must use one tokenizer: use checkpoints trained with the same tokenizer, or drop --tokenizer to use the teacher\'s'
    : '--init continues a model trained with its own tokenizer; tokenizing the data with another would change what every token id means: drop --tokenizer to use the checkpoint\'s';
  const others: NamedTokenizer[] = [];
  if (teacher && chosen.role !== 'teacher') {
    if (teacher.tokenizer) others.push({ name: 'teacher', tokenizer: teacher.tokenizer, from: teacherFrom(o) });
    else log(`warning: the teacher ${o.teacher} has no tokenizer.json: cannot check that it uses the run's tokenizer (${chosen.from})`);
  }
  if (init && chosen.role !== 'init') {
    if (init.tokenizer) others.push({ name: 'student', tokenizer: init.tokenizer, from: `--init ${o.init}` });
    else log(`warning: the --init checkpoint ${o.init} has no tokenizer.json: cannot check that it uses the run's tokenizer (${chosen.from})`);
  }
  // The teacher first: "teacher vs student", "teacher vs data", then "student vs data".
  const all = [...others.filter((t) => t.name === 'teacher'), ...(chosen.role === 'teacher' ? [chosen] : []), ...others.filter((t) => t.name !== 'teacher'),
    ...(chosen.role !== 'teacher' ? [chosen] : [])];
  for (let i = 1; i < all.length; i++) assertSameTokenizer(all[0]!, all[i]!, advice);
  if (all.length > 1) {
    log(`tokenizer: ${chosen.tokenizer.vocabSize} tokens, identity ${tokenizerHash(chosen.tokenizer).slice(0, 16)}: the same for ${all.map((t) => t.name).join(', ')}`);
  }
}

/**
 * The vocabulary rows the loss runs over: with a teacher, the tokenizer's real tokens (lossVocabulary checks that the
 * teacher's and the student's vocab_size both cover them; padding rows past them are left out); without one, undefined
 * (the student's whole vocab_size). The run and --dry-run both call this, so they cannot disagree.
 */
export function runLossVocab(tokenizerSize: number, student: Pick<ModelConfig, 'vocabSize'>, teacher: Pick<ModelConfig, 'vocabSize'> | null):
  { lossVocab: number | undefined; note: string | null } {
  if (!teacher) return { lossVocab: undefined, note: null };
  return lossVocabulary(tokenizerSize, [{ name: 'teacher', vocabSize: teacher.vocabSize }, { name: 'student', vocabSize: student.vocabSize }]);
}

/** --model: a preset by name (sized to `vocab`), else a config.json file (any file name: the options checked it exists). */
function modelOption(model: string, vocab: number): ModelConfig {
  return PRESET_NAMES.includes(model) ? presetConfig(model, vocab) : readHfConfigFile(model, 'pass a valid config.json or a preset name');
}

/** The student's config: --init's, a config.json, or a preset sized to the tokenizer (the teacher's vocab_size when distilling). */
export function studentConfig(o: RunOptions, tok: Pick<Tokenizer, 'vocabSize' | 'eosId'>, teacher: Pick<LoadedCheckpoint, 'config'> | null,
  init: Pick<LoadedCheckpoint, 'config'> | null): ModelConfig {
  let cfg: ModelConfig;
  const vocab = teacher ? teacher.config.vocabSize : tok.vocabSize;
  if (init) cfg = init.config;
  else cfg = modelOption(o.model, vocab);
  if (cfg.eosTokenId === undefined && tok.eosId !== undefined) cfg = { ...cfg, eosTokenId: tok.eosId };
  // The teacher's and the student's vocab_size may differ (padded rows): lossVocabulary checks both cover the tokenizer.
  return cfg;
}

/**
 * Refuses a --seq longer than the student's (or teacher's) max_position_embeddings before the data is packed into
 * windows of that length (an absurd --seq would otherwise fail allocating them).
 */
export function checkSeqFits(o: RunOptions, teacher: LoadedCheckpoint | null, init: LoadedCheckpoint | null): void {
  let student: ModelConfig;
  if (init) student = init.config;
  else student = modelOption(o.model, 256);
  for (const [who, c] of [['the model', student], ['the teacher', teacher?.config]] as const) {
    if (c && o.seq > c.maxPositionEmbeddings) {
      throw new InputError(`--seq ${o.seq} exceeds ${who}'s max_position_embeddings (${c.maxPositionEmbeddings})`,
        `use --seq ${c.maxPositionEmbeddings} or less`);
    }
  }
}

/** On a GPU, refuses a job whose allocations cannot fit, naming the largest --seq that would (before any allocation). */
export function checkDeviceMemory(backend: Backend, j: JobMemory): void {
  const mem = backend.deviceMemory?.();
  if (!mem) return;
  const need = estimateJobBytes(j);
  const budget = mem.free * 0.95;
  if (need <= budget) return;
  const fit = largestSeqThatFits(j, budget);
  throw new DistilleryError(
    `this job needs about ${formatGiB(need)} on the device (${describeJob(j)}) but ${formatGiB(mem.free)} of ${formatGiB(mem.total)} is free`,
    fit > 0 ? `the largest --seq that fits with --batch ${j.batch} is about ${fit}; or lower --batch` : 'even a sequence of 1 token does not fit: use a smaller model or --device cpu');
}

