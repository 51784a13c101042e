/**
 * --eval-choices in a train/distill run: the student scores multiple-choice items (src/eval/choices.ts, as
 * `distillery eval --choices` scores them) at every evaluation, and a live teacher once, so that metrics.jsonl shows
 * how much of the teacher's accuracy the student has. Rows are cut to the run's --seq (the models' window) and run as
 * the evaluation pass runs (StepRunner with plain cross-entropy over the whole vocabulary: the same kernels the
 * pre-warm plan traces, src/train/kernel-plan.ts `choices`). With several ranks each scores every world-th row and one
 * host all-reduce gives every rank every score.
 */
import type { Communicator } from '../parallel/comm.js';
import type { Transformer } from '../model/transformer.js';
import type { Tokenizer } from '../tokenizer/bpe.js';
import { renderChat, type ChatFormat } from '../tokenizer/chat.js';
import { StepRunner } from './step.js';
import {
  ChoiceEncoder, choiceBatches, choiceMetrics, choiceRows, choiceWindow, encodeChoices, readChoiceItems, scoreChoices,
  type ChoiceItem, type ChoiceRow,
} from '../eval/choices.js';

/** What a run scores and reports. */
export interface ChoiceScores { acc: number; accNorm: number }

export interface RunChoices {
  items: number;
  /** The student's acc and acc_norm now. */
  student(): ChoiceScores;
  /** The teacher's (a live teacher: null without one). */
  teacher(): ChoiceScores | null;
}

export interface RunChoicesOptions {
  files: string[];
  chat: boolean;
  /** chat template options (--chat-template-kwargs), parsed */
  kwargs?: Record<string, unknown> | undefined;
  seq: number;
  batch: number;
}

/** The run's multiple-choice scorer; `log` gets what it was given and any left cut. */
export function makeRunChoices(o: RunChoicesOptions, student: Transformer, teacher: Transformer | null, tokenizer: Tokenizer, chat: ChatFormat,
  comm: Communicator, log: (s: string) => void): RunChoices {
  const items: ChoiceItem[] = readChoiceItems(o.files);
  const encoded = encodeChoices(new ChoiceEncoder(tokenizer, chat), items, o.chat ? '' : ' ',
    o.chat ? (it) => renderChat(chat, [{ role: 'user', content: it.context }], { addGenerationPrompt: true, ...(o.kwargs ? { kwargs: o.kwargs } : {}) }) : undefined);
  const rows = choiceRows(encoded, items, o.seq);
  const cut = rows.filter((r) => r.cut).length;
  log(`choices: ${items.length} items, ${rows.length} continuations${o.chat ? ' (contexts as a user turn of the chat template)' : ''} scored at every evaluation`);
  if (cut) log(`warning: --eval-choices: the context of ${cut} of ${rows.length} continuations is cut on the left to fit --seq ${o.seq} (the longest needs ${choiceWindow(encoded)})`);
  const padId = tokenizer.padId ?? tokenizer.eosId ?? 0;
  const mine: ChoiceRow[] = rows.filter((_, i) => i % comm.world === comm.rank);
  const score = (runner: StepRunner): ChoiceScores => {
    const ll = scoreChoices(items, choiceBatches(mine, o.batch, o.seq, padId), (b) => runner.rowLogLikelihoods(b));
    if (comm.world > 1) {
      // every rank's rows in one vector (0 where another rank scored), summed over the ranks
      const flat = new Float64Array(rows.length);
      rows.forEach((r, i) => { if (i % comm.world === comm.rank) flat[i] = ll[r.item]![r.choice]!; });
      const all = comm.allReduceHost(flat);
      rows.forEach((r, i) => { ll[r.item]![r.choice] = all[i]!; });
    }
    const m = choiceMetrics(items, ll);
    return { acc: m.acc, accNorm: m.accNorm };
  };
  const none = { kind: 'none', alpha: 0, temperature: 1, beta: 0.5 } as const;
  const studentRunner = new StepRunner(student, null, none);
  let teacherRunner: StepRunner | null = null;
  return {
    items: items.length,
    student: () => score(studentRunner),
    teacher: () => (teacher ? score(teacherRunner ??= new StepRunner(teacher, null, none)) : null),
  };
}
