/**
 * Learning-rate schedule: linear warmup from 0 to `lr` over `warmup` steps, then cosine decay to
 * `lr · minLrRatio` at `total` steps (held there after). Steps are 0-based: lrAt(0) is the first step's rate.
 */
export interface ScheduleOptions {
  lr: number;
  warmup: number;
  total: number;
  minLrRatio: number;
}

export function lrAt(step: number, s: ScheduleOptions): number {
  if (s.warmup > 0 && step < s.warmup) return (s.lr * (step + 1)) / s.warmup;
  const span = Math.max(1, s.total - s.warmup);
  const progress = Math.min(1, Math.max(0, (step - s.warmup) / span));
  const minLr = s.lr * s.minLrRatio;
  return minLr + 0.5 * (s.lr - minLr) * (1 + Math.cos(Math.PI * progress));
}
