/**
 * What a run reads before it builds models: the teacher checkpoint, the teacher's (or --init's) tokenizer_config.json,
 * chat template and generation_config.json, and the training documents (text, .jsonl, chat rendered by the model's
 * template, or builtin:docs). Shared by train/distill (run.ts) and the teacher-cache job (src/cache/build.ts), so both
 * tokenize and pack the same documents.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { readCheckpoint, type LoadedCheckpoint } from '../model/checkpoint.js';
import { chatRenderer, type ChatFormat } from '../tokenizer/chat.js';
import { parseTemplateKwargs } from '../cli/options.js';
import { readModelDirExtras } from '../io/checkpoint-dir.js';
import { capDocs, loadDocs, reportNoAssistant, loadDocCorpus, type Doc } from '../data/index.js';
import { DistilleryError } from '../util/errors.js';
import type { RunOptions } from './options.js';

/** The data options readData uses. */
export type DataOptions = Pick<RunOptions, 'data' | 'maxChars' | 'lossOn' | 'chatTemplateKwargs'>;

export function loadTeacher(o: Pick<RunOptions, 'teacher'>): LoadedCheckpoint {
  if (!o.teacher) throw new DistilleryError('distill needs a teacher', 'pass --teacher <checkpoint folder>');
  return readCheckpoint(o.teacher);
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

