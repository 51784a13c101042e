/**
 * loss.svg of a run folder, from its metrics.jsonl rows: titled with the run's name (the --out folder's name).
 *
 * - train: one panel, training and validation loss (next-token cross-entropy).
 * - distill: three panels on one step axis: the mixed objective (α·div + (1−α)·CE) for training and validation;
 *   the next-token cross-entropy for training and validation (what the student would score without a teacher);
 *   and the validation top-1 agreement with the teacher, on a 0–1 axis.
 */
import { chartSvg, type Panel, type Series } from './svg-plot.js';

export type MetricsRow = Record<string, number | undefined>;

const BLUE = '#1f77b4', RED = '#d62728', GREEN = '#2ca02c';

function pointsOf(rows: readonly MetricsRow[], key: string): Array<[number, number]> {
  return rows.filter((r) => typeof r[key] === 'number' && typeof r.step === 'number').map((r) => [r.step!, r[key]!]);
}

export function lossPlotSvg(rows: readonly MetricsRow[], o: { mode: 'train' | 'distill' | string; runName: string }): string {
  const s = (name: string, color: string, key: string): Series => ({ name, color, points: pointsOf(rows, key) });
  const panels: Panel[] = o.mode === 'distill'
    ? [
      { title: 'objective α·div + (1−α)·CE', yLabel: 'objective', series: [s('train', BLUE, 'loss'), s('validation', RED, 'val_loss')] },
      { title: 'cross-entropy', yLabel: 'CE (nats/token)', series: [s('train CE', BLUE, 'ce'), s('validation CE', RED, 'val_ce')] },
      { title: 'agreement', yLabel: 'top-1 agreement', series: [s('validation agreement with the teacher', GREEN, 'agreement')], yRange: [0, 1] },
    ]
    : [{ yLabel: 'loss (CE, nats/token)', series: [s('train loss', BLUE, 'loss'), s('validation loss', RED, 'val_loss')] }];
  return chartSvg(panels, { title: `${o.runName}: ${o.mode} loss`, xLabel: 'step', ...(o.mode === 'distill' ? { panelHeight: 200 } : {}) });
}
