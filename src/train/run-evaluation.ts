/**
 * A run's evaluations: the validation pass over its held-out windows (a signal may cut it short), the --eval-choices
 * scores beside it (src/train/run-choices.ts), what an evaluation's metrics.jsonl row and log line say, and the
 * scores the summary carries (restored from metrics.jsonl on --resume). The training loop (run.ts) says when.
 */
import type { Communicator } from '../parallel/comm.js';
import type { EvalSums, StepRunner, Batch } from './step.js';
import type { StopRequests } from './stop-requests.js';
import { choiceRow, scoresOfRow, type ChoiceScores, type RunChoices } from './run-choices.js';
import { scoresSaid } from '../eval/choices.js';

/**
 * What one evaluation found: the validation pass (null without windows, or when a signal stopped it) and the student's
 * choices scores (null without --eval-choices, or when stopped); `stopped` says where a signal stopped it.
 */
export interface Evaluated { pass: EvalSums | null; choices: ChoiceScores | null; stopped: 'pass' | 'choices' | null }

export class RunEvaluation {
  /** The student's last --eval-choices scores and their step; a live teacher's, scored at the start of a new run. */
  lastChoices: (ChoiceScores & { step: number }) | null = null;
  teacherChoices: ChoiceScores | null = null;

  constructor(private readonly runner: StepRunner, private readonly batches: Batch[], private readonly choices: RunChoices | null,
    private readonly comm: Communicator, private readonly stops: StopRequests, private readonly distilling: boolean) {}

  /** The validation pass through to its end (null without validation windows). */
  pass(): EvalSums | null {
    return this.batches.length ? this.runner.evaluate(this.batches) : null;
  }

  /**
   * An evaluation at `step` a signal can cut short (one rank: its handler runs between batches; several ranks evaluate
   * through to the end, and stop together at a step's end): the validation pass, then the student's choices scores and,
   * with `teacher` (the start of a new run), a live teacher's, kept for the summary unless a signal came meanwhile.
   */
  async run(step: number, teacher = false): Promise<Evaluated> {
    const signalled = (): boolean => this.stops.signal !== null;
    let pass: EvalSums | null = null;
    if (this.batches.length) {
      pass = this.comm.world > 1 ? this.runner.evaluate(this.batches) : await this.runner.evaluateYielding(this.batches, signalled);
      if (pass === null) return { pass, choices: null, stopped: 'pass' };
    }
    if (!this.choices) return { pass, choices: null, stopped: null };
    const c = await this.choices.student(signalled);
    if (c === null) return { pass, choices: null, stopped: 'choices' };
    this.lastChoices = { ...c, step };
    const t = teacher ? await this.choices.teacher(signalled) : null;
    if (t && !(this.comm.world === 1 && signalled())) this.teacherChoices = t;
    return { pass, choices: c, stopped: null };
  }

  /** An evaluation's metrics.jsonl row (null when it found nothing); step 0's carries the teacher's scores. */
  row(step: number, e: Evaluated): Record<string, unknown> | null {
    const p = e.pass, c = e.choices;
    if (!p && !c) return null;
    return {
      step,
      ...(p ? { val_loss: p.meanLoss, val_ce: p.meanCe, val_ppl: p.perplexity, val_token_acc: p.tokenAccuracy, ...(this.distilling ? { val_div: p.meanDiv, agreement: p.agreement } : {}) } : {}),
      ...(c ? choiceRow('val', c) : {}),
      ...(c && step === 0 && this.teacherChoices ? choiceRow('teacher', this.teacherChoices) : {}),
    };
  }

  /** The choices scores as the log line says them ('' without); step 0's with the teacher's. */
  said(step: number, e: Evaluated): string {
    if (!e.choices) return '';
    const t = step === 0 ? this.teacherChoices : null;
    return `${scoresSaid(e.choices)}${t ? ` (the teacher's: ${scoresSaid(t)})` : ''}`;
  }

  /** --resume: the scores before the checkpoint (the teacher's at step 0, the last of the student's), for the summary. */
  restore(metrics: ReadonlyArray<Record<string, unknown>>): void {
    if (!this.choices) return;
    for (const m of metrics) {
      this.teacherChoices = scoresOfRow('teacher', m) ?? this.teacherChoices;
      const v = scoresOfRow('val', m);
      if (v && typeof m.step === 'number') this.lastChoices = { ...v, step: m.step };
    }
  }

  /** summary.json's `choices` (undefined without --eval-choices). */
  summary(): { items: number; step?: number; teacher?: ChoiceScores } & ChoiceScores | undefined {
    if (!this.choices) return undefined;
    return { items: this.choices.items, ...(this.lastChoices ?? {}), ...(this.teacherChoices ? { teacher: this.teacherChoices } : {}) };
  }
}
