/**
 * A dependency-free SVG line chart for loss curves (train and validation series on shared axes), written
 * into the run folder as loss.svg so a run can be judged at a glance in any browser.
 */
export interface Series {
  name: string;
  color: string;
  points: Array<[number, number]>;
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

const esc = (s: string): string => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

export function lineChartSvg(series: Series[], opts: { title: string; xLabel: string; yLabel: string; width?: number; height?: number }): string {
  const W = opts.width ?? 720, H = opts.height ?? 420, ml = 64, mr = 20, mt = 40, mb = 48;
  const all = series.flatMap((s) => s.points).filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  const x0 = all.length ? Math.min(...xs) : 0, x1 = all.length ? Math.max(...xs) : 1;
  let y0 = all.length ? Math.min(...ys) : 0, y1 = all.length ? Math.max(...ys) : 1;
  if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const sx = (x: number): number => ml + ((x - x0) / Math.max(x1 - x0, 1e-12)) * (W - ml - mr);
  const sy = (y: number): number => H - mb - ((y - y0) / (y1 - y0)) * (H - mt - mb);
  const parts: string[] = [];
  parts.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`);
  parts.push(`<rect width="${W}" height="${H}" fill="white"/>`);
  parts.push(`<text x="${W / 2}" y="22" text-anchor="middle" font-size="15">${esc(opts.title)}</text>`);
  for (const t of niceTicks(y0, y1, 6)) {
    parts.push(`<line x1="${ml}" x2="${W - mr}" y1="${sy(t).toFixed(1)}" y2="${sy(t).toFixed(1)}" stroke="#e5e5e5"/>`);
    parts.push(`<text x="${ml - 6}" y="${(sy(t) + 4).toFixed(1)}" text-anchor="end">${t}</text>`);
  }
  for (const t of niceTicks(x0, x1, 8)) {
    parts.push(`<text x="${sx(t).toFixed(1)}" y="${H - mb + 16}" text-anchor="middle">${t}</text>`);
  }
  parts.push(`<rect x="${ml}" y="${mt}" width="${W - ml - mr}" height="${H - mt - mb}" fill="none" stroke="#888"/>`);
  parts.push(`<text x="${W / 2}" y="${H - 10}" text-anchor="middle">${esc(opts.xLabel)}</text>`);
  parts.push(`<text x="16" y="${H / 2}" text-anchor="middle" transform="rotate(-90 16 ${H / 2})">${esc(opts.yLabel)}</text>`);
  series.forEach((s, i) => {
    const pts = s.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
    if (pts.length) {
      const d = pts.map(([x, y], j) => `${j ? 'L' : 'M'}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(' ');
      parts.push(`<path d="${d}" fill="none" stroke="${s.color}" stroke-width="1.8"/>`);
      if (pts.length < 40) for (const [x, y] of pts) parts.push(`<circle cx="${sx(x).toFixed(1)}" cy="${sy(y).toFixed(1)}" r="2.5" fill="${s.color}"/>`);
    }
    parts.push(`<rect x="${ml + 12}" y="${mt + 10 + i * 18}" width="12" height="3" fill="${s.color}"/>`);
    parts.push(`<text x="${ml + 30}" y="${mt + 15 + i * 18}">${esc(s.name)}</text>`);
  });
  parts.push('</svg>');
  return parts.join('\n') + '\n';
}
