/**
 * What a run reads before it builds models: the teacher checkpoint, the teacher's (or --init's) tokenizer_config.json,
 * chat template and generation_config.json, and the training documents (text, .jsonl, chat rendered by the model's
 * template, or builtin:docs). Shared by train/distill (run.ts) and the teacher-cache job (src/cache/build.ts), so both
 * tokenize and pack the same documents.
 *
 * prepareRunData is the data-and-tokenizer part of train/distill: it reads and checks all of that (the tokenizer
 * against the models, the data against a --resume checkpoint and a teacher cache), then packs and splits the data.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { readCheckpoint, type LoadedCheckpoint } from '../model/checkpoint.js';
import type { Tokenizer } from '../tokenizer/bpe.js';
import { chatFormatOf, chatRenderer, DEFAULT_CHAT_FORMAT, type ChatFormat } from '../tokenizer/chat.js';
import { tokenizerHash } from '../tokenizer/identity.js';
import { parseTemplateKwargs } from '../cli/options.js';
import { UsageError } from '../cli/args.js';
import { readModelDirExtras } from '../io/checkpoint-dir.js';
import { capDocs, describePacking, loadDocs, reportNoAssistant, loadDocCorpus, packForJob, packingFor, splitTrainVal, type Doc, type Packing, type PackedData, type Window } from '../data/index.js';
import { TeacherCache } from '../cache/store.js';
import { Rng } from '../util/rng.js';
import { DistilleryError } from '../util/errors.js';
import type { RunOptions } from './options.js';
import { hashDocs } from './run-folder.js';
import { checkSameTokenizer, checkSeqFits, chooseTokenizer, resumeTokenizerPath } from './run-models.js';
import type { SavedState } from './run-state.js';

/** The data options readData uses. */
export type DataOptions = Pick<RunOptions, 'data' | 'maxChars' | 'lossOn' | 'chatTemplateKwargs'>;

export function loadTeacher(o: Pick<RunOptions, 'teacher'>): LoadedCheckpoint {
  if (!o.teacher) throw new DistilleryError('distill needs a teacher', 'pass --teacher <checkpoint folder>');
  return readCheckpoint(o.teacher, { tensorByTensor: true }); // only uploaded: no float32 copy of the whole teacher
}

export function readData(o: DataOptions, log: (s: string) => void, chat: ChatFormat): Doc[] {
  if (o.data.length === 1 && o.data[0] === 'builtin:docs') {
    const corpus = loadDocCorpus(o.maxChars > 0 ? { maxChars: o.maxChars } : {});
    log(`data: builtin:docs — ${corpus.documents.length} documentation comments (${corpus.totalChars} characters) from TypeScript ${corpus.typescriptVersion}'s ${corpus.files.length} lib .d.ts files`);
    return corpus.documents.map((text) => ({ text, lossSpans: null }));
  }
  if (o.data.length === 0) throw new DistilleryError('no training data given', 'pass --data <file> (text or .jsonl), or --data builtin:docs');
  const kwargs = o.chatTemplateKwargs !== undefined ? parseTemplateKwargs(o.chatTemplateKwargs) : undefined;
  const loaded = loadDocs(o.data, { renderChat: chatRenderer(chat, { lossOn: o.lossOn ?? 'assistant', kwargs }) });
  reportNoAssistant(loaded, log);
  return capDocs(loaded.docs, o.maxChars);
}

/**
 * The packing of a run: --packing, 'auto' resolved on the data (packingFor). A resumed run keeps the packing it was
 * started with (a run from before --packing existed packed 'wrapped'); another explicit choice is refused.
 */
export function runPacking(o: Pick<RunOptions, 'packing'>, saved: SavedState | null, docs: ReadonlyArray<{ conversation?: boolean }>, log: (s: string) => void): Packing {
  const chosen = packingFor(o.packing, docs);
  if (!saved) return chosen;
  const was = (saved.options as Partial<RunOptions> | undefined)?.packing;
  const started = was === undefined ? 'wrapped' : packingFor(was, docs);
  if (o.packing !== 'auto' && o.packing !== undefined && o.packing !== started) {
    throw new UsageError(`--resume: the run was started with --packing ${started}, not ${o.packing}`,
      `resume with --packing ${started} (or leave it out), or start a new run (--overwrite, or another --out)`);
  }
  if (started !== chosen) log(`data: --resume keeps the run's packing, ${started}`);
  return started;
}

export interface ModelExtras {
  tokenizerConfig: Record<string, unknown> | null;
  chatTemplate: string | null;
  generationConfig: Record<string, unknown> | null;
  /** For messages: 'the teacher runs/t'. */
  from: string;
}

/** tokenizer_config.json, chat template and generation_config.json of the teacher, else --init, else next to --tokenizer. */
export function modelExtras(o: Pick<RunOptions, 'teacher' | 'teacherCache' | 'init' | 'tokenizer'>, teacher: LoadedCheckpoint | null, init: LoadedCheckpoint | null): ModelExtras | null {
  const of = (ck: LoadedCheckpoint, from: string): ModelExtras => ({ tokenizerConfig: ck.tokenizerConfig, chatTemplate: ck.chatTemplate, generationConfig: ck.generationConfig, from });
  // Only from a checkpoint whose tokenizer.json is there (and so checked to be the run's).
  if (teacher?.tokenizerJson) return of(teacher, o.teacherCache ? `the teacher of the cache ${o.teacherCache}` : `the teacher ${o.teacher}`);
  if (init?.tokenizerJson) return of(init, `the --init checkpoint ${o.init}`);
  if (o.tokenizer) {
    const dir = fs.existsSync(o.tokenizer) && fs.statSync(o.tokenizer).isDirectory() ? o.tokenizer : path.dirname(o.tokenizer);
    const x = readModelDirExtras(dir, { tokenizerJson: false });
    if (x.tokenizerConfig || x.chatTemplate) {
      return { tokenizerConfig: x.tokenizerConfig ?? null, chatTemplate: x.chatTemplate ?? null, generationConfig: x.generationConfig ?? null, from: `${dir} (--tokenizer)` };
    }
  }
  return null;
}


/** The data and tokenizer of a train/distill run, read and checked (prepareRunData). */
export interface RunData {
  /** A teacher cache standing in for the teacher (--teacher-cache), else null. */
  cache: TeacherCache | null;
  /** The teacher checkpoint (with a cache, its header: config, tokenizer, chat files; no weights), null when training. */
  teacherCk: LoadedCheckpoint | null;
  /** The --init checkpoint, null without one. */
  initCk: LoadedCheckpoint | null;
  /** The chat and tokenizer files the run carries into the folders it writes (modelExtras). */
  extras: ModelExtras | null;
  /** The chat format (template, special tokens) the run renders conversations with. */
  chat: ChatFormat;
  tokenizer: Tokenizer;
  eosId: number;
  /** SHA-256 of the training documents (recorded in checkpoints, checked on --resume and against a teacher cache). */
  dataHash: string;
  packed: PackedData;
  train: Window[];
  val: Window[];
}

/**
 * Reads the run's checkpoints (or teacher cache), tokenizer and data, checks that they agree (one tokenizer, the
 * --resume checkpoint's --loss-on and data, the cache's run), and packs the data into training and validation windows.
 * `saved` is the --resume checkpoint's state (`latest` its folder in the run folder `out`), null for a new run.
 * Writes nothing to the run folder.
 */
export function prepareRunData(o: RunOptions, log: (s: string) => void, out: string, latest: string, saved: SavedState | null): RunData {
  // A teacher cache stands in for the teacher: its header (config, tokenizer, chat files) decides what the teacher would.
  const cache = o.mode === 'distill' && o.teacherCache ? TeacherCache.open(o.teacherCache) : null;
  const teacherCk: LoadedCheckpoint | null = o.mode === 'distill' ? (cache ? cache.teacherHeader() : loadTeacher(o)) : null;
  // A LoRA base is frozen (only uploaded, and hashed): tensor by tensor, as a teacher; a model that trains needs one flat array
  const initCk: LoadedCheckpoint | null = o.init ? readCheckpoint(o.init, { tensorByTensor: o.loraRank > 0 }) : null;
  checkSeqFits(o, teacherCk, initCk);
  const extras = modelExtras(o, teacherCk, initCk);
  const chat: ChatFormat = extras ? chatFormatOf(extras.chatTemplate, extras.from, extras.tokenizerConfig) : DEFAULT_CHAT_FORMAT;
  // The tokenizers are checked before the data is read (unless one has to be trained on it).
  let docsRead: Doc[] | null = null;
  const getDocs = (): Doc[] => (docsRead ??= readData(o, log, chat));
  const chosen = chooseTokenizer(o, () => getDocs().map((d) => d.text), saved ? resumeTokenizerPath(out, latest, log) : null, teacherCk, initCk, log);
  const tokenizer = chosen.tokenizer;
  checkSameTokenizer(o, chosen, teacherCk, initCk, log);
  const docs = getDocs();
  const dataHash = hashDocs(docs);
  if (saved && (saved.options as Partial<RunOptions> | undefined)?.lossOn !== undefined && saved.options.lossOn !== o.lossOn) {
    throw new UsageError(`--resume: the run was started with --loss-on ${saved.options.lossOn}, not ${o.lossOn}`,
      `resume with --loss-on ${saved.options.lossOn}, or start a new run (--overwrite, or another --out)`);
  }
  if (saved) {
    if (saved.dataHash === undefined) {
      log('warning: --resume: the checkpoint records no hash of its training data (an older version wrote it): a changed data file cannot be detected');
    } else if (saved.dataHash !== dataHash) {
      throw new DistilleryError('--resume: the training data changed since the checkpoint was written (its hash differs)',
        'restore the data the run was started with, or start a new run on the new data (--overwrite, or another --out)');
    }
  }
  const { packed, packing, eosId } = packForJob(tokenizer, docs, chat, { seq: o.seq, packing: runPacking(o, saved, docs, log), tokenizerOf: chosen.role === 'trained' ? undefined : chosen.from }, log);
  if (saved && packed.windows[0]?.positions && saved.documents !== true) {
    log('warning: --resume: the checkpoint was written by an earlier version, whose bfd windows let documents attend to each other; from here on each attends only to itself (the loss may step)');
  }
  const { train, val } = splitTrainVal(packed.windows, o.valFraction, new Rng(o.seed));
  if (cache) {
    cache.checkRun({
      tokenizerSha256: tokenizerHash(tokenizer), dataSha256: dataHash, seq: o.seq, temperature: o.temperature, lossOn: o.lossOn ?? 'assistant',
      packing: describePacking(packing, tokenizer),
      windows: packed.windows.length, lossVocab: tokenizer.vocabSize,
    });
  }
  if (val.length === 0) log('warning: no validation windows (dataset too small or --val-fraction 0): validation loss is not measured');
  log(`data: ${docs.length} documents, ${packed.totalTokens} tokens, ${train.length} training and ${val.length} validation windows of ${o.seq} (packing ${packed.packing})`);
  if (docs.some((d) => d.lossSpans !== null)) {
    log(`data: the loss counts ${packed.targetTokens} of ${packed.totalTokens} tokens (the assistant replies; --loss-on all counts every token)` +
      (packed.emptyWindows ? `; ${packed.emptyWindows} windows without an assistant token left out` : ''));
  }
  return { cache, teacherCk, initCk, extras, chat, tokenizer, eosId, dataHash, packed, train, val };
}
