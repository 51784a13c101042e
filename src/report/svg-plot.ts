/**
 * A dependency-free SVG line chart for loss curves, written into the run folder as loss.svg so a run can be judged
 * at a glance in any browser.
 *
 * A chart is one or more panels stacked vertically on a shared x axis (the step), each with its own y axis, title
 * and legend. The legend sits in a band above its panel's plot area, never inside it, so it cannot hide a curve.
 * Elements carry classes (`plot-area`, `legend`, `series` with `data-name`) so tests and tools can read the chart.
 */
export interface Series {
  name: string;
  color: string;
  points: Array<[number, number]>;
}

export interface Panel {
  /** Shown at the top left of the panel, before the legend. */
  title?: string;
  yLabel: string;
  series: Series[];
  /** Fixed y range (e.g. [0, 1] for a fraction); default: the data's range with a margin. */
  yRange?: [number, number];
}

export interface ChartOptions {
  /** The chart's title (e.g. the run's name and mode). */
  title: string;
  xLabel: string;
  width?: number;
  /** Height of each panel's plot area. */
  panelHeight?: number;
}

function niceTicks(lo: number, hi: number, count: number): number[] {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? raw;
  const ticks: number[] = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-12; v += step) ticks.push(Number(v.toPrecision(12)));
  return ticks;
}

const esc = (s: string): string => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
const finite = (pts: Array<[number, number]>): Array<[number, number]> => pts.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
/** Rough width of a label at font-size 12 (sans-serif averages ~6.5 px per character). */
const textWidth = (s: string): number => Math.ceil(s.length * 6.5);

/** Panels stacked on one x axis (see the module comment). */
export function chartSvg(panels: Panel[], opts: ChartOptions): string {
  const W = opts.width ?? 720, PH = opts.panelHeight ?? 260;
  const ml = 64, mr = 20, titleBand = 34, legendBand = 26, tickBand = 22, gap = 10, xLabelBand = 26;
  const allX = panels.flatMap((p) => p.series.flatMap((s) => finite(s.points).map((q) => q[0])));
  const x0 = allX.length ? Math.min(...allX) : 0, x1 = allX.length ? Math.max(...allX) : 1;
  const sx = (x: number): number => ml + ((x - x0) / Math.max(x1 - x0, 1e-12)) * (W - ml - mr);
  const H = titleBand + panels.length * (legendBand + PH + tickBand) + (panels.length - 1) * gap + xLabelBand;
  const parts: string[] = [];
  parts.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`);
  parts.push(`<rect width="${W}" height="${H}" fill="white"/>`);
  parts.push(`<text class="title" x="${W / 2}" y="22" text-anchor="middle" font-size="15">${esc(opts.title)}</text>`);
  let top = titleBand;
  for (const panel of panels) {
    const pt = top + legendBand, pb = pt + PH;
    const ys = panel.series.flatMap((s) => finite(s.points).map((q) => q[1]));
    let y0: number, y1: number;
    if (panel.yRange) [y0, y1] = panel.yRange;
    else {
      y0 = ys.length ? Math.min(...ys) : 0; y1 = ys.length ? Math.max(...ys) : 1;
      if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
      const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    }
    const sy = (y: number): number => pb - ((y - y0) / (y1 - y0)) * PH;
    for (const t of niceTicks(y0, y1, 5)) {
      parts.push(`<line x1="${ml}" x2="${W - mr}" y1="${sy(t).toFixed(1)}" y2="${sy(t).toFixed(1)}" stroke="#e5e5e5"/>`);
      parts.push(`<text x="${ml - 6}" y="${(sy(t) + 4).toFixed(1)}" text-anchor="end">${t}</text>`);
    }
    for (const t of niceTicks(x0, x1, 8)) parts.push(`<text x="${sx(t).toFixed(1)}" y="${pb + 16}" text-anchor="middle">${t}</text>`);
    parts.push(`<rect class="plot-area" x="${ml}" y="${pt}" width="${W - ml - mr}" height="${PH}" fill="none" stroke="#888"/>`);
    const yMid = (pt + pb) / 2;
    parts.push(`<text x="16" y="${yMid}" text-anchor="middle" transform="rotate(-90 16 ${yMid})">${esc(panel.yLabel)}</text>`);
    // The legend: one row in the band above the plot area, after the panel's title.
    const ly = top + legendBand / 2 + 4;
    let lx = ml;
    parts.push(`<g class="legend">`);
    if (panel.title) {
      parts.push(`<text x="${lx}" y="${ly}" font-weight="bold">${esc(panel.title)}</text>`);
      lx += textWidth(panel.title) + 16;
    }
    for (const s of panel.series) {
      parts.push(`<rect x="${lx}" y="${ly - 5}" width="14" height="3" fill="${s.color}"/>`);
      parts.push(`<text x="${lx + 19}" y="${ly}">${esc(s.name)}</text>`);
      lx += 19 + textWidth(s.name) + 16;
    }
    parts.push('</g>');
    for (const s of panel.series) {
      const pts = finite(s.points);
      if (!pts.length) continue;
      const d = pts.map(([x, y], j) => `${j ? 'L' : 'M'}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(' ');
      parts.push(`<path class="series" data-name="${esc(s.name)}" d="${d}" fill="none" stroke="${s.color}" stroke-width="1.8"/>`);
      if (pts.length < 40) for (const [x, y] of pts) parts.push(`<circle cx="${sx(x).toFixed(1)}" cy="${sy(y).toFixed(1)}" r="2.5" fill="${s.color}"/>`);
    }
    top = pb + tickBand + gap;
  }
  parts.push(`<text x="${(ml + W - mr) / 2}" y="${H - 8}" text-anchor="middle">${esc(opts.xLabel)}</text>`);
  parts.push('</svg>');
  return parts.join('\n') + '\n';
}

/** One panel: the series on shared axes (the chart as it was before panels). */
export function lineChartSvg(series: Series[], opts: { title: string; xLabel: string; yLabel: string; width?: number; height?: number }): string {
  return chartSvg([{ yLabel: opts.yLabel, series }], {
    title: opts.title, xLabel: opts.xLabel, ...(opts.width ? { width: opts.width } : {}),
    ...(opts.height ? { panelHeight: Math.max(120, opts.height - 140) } : {}),
  });
}
