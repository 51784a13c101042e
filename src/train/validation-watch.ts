/**
 * Watches a run's validation losses: which evaluation is the best so far (lowest loss after at least one training
 * step: that model goes to checkpoints/best) and when the loss has risen for `riseWarn` evaluations in a row (a
 * sign of overfitting or divergence). Pure, so it is unit-tested on made-up sequences; run.ts feeds it every
 * evaluation, and on resume the evaluations recorded in metrics.jsonl first.
 */
export interface ValidationVerdict {
  /** This evaluation is the lowest validation loss so far (after a training step): save it as best. */
  best: boolean;
  /** Set once per streak, at the evaluation that makes it `riseWarn` rises long: the losses of the streak. */
  risingStreak: number[] | null;
}

export class ValidationWatch {
  bestLoss: number | null = null;
  bestStep: number | null = null;
  private streak: number[] = [];

  constructor(readonly riseWarn = 3) {}

  observe(step: number, loss: number): ValidationVerdict {
    const prev = this.streak.length ? this.streak[this.streak.length - 1]! : null;
    this.streak = prev !== null && loss > prev ? [...this.streak, loss] : [loss];
    const rises = this.streak.length - 1;
    const best = step >= 1 && Number.isFinite(loss) && (this.bestLoss === null || loss < this.bestLoss);
    if (best) { this.bestLoss = loss; this.bestStep = step; }
    return { best, risingStreak: rises === this.riseWarn ? this.streak.slice() : null };
  }
}
