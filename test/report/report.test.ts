/**
 * Watching a run: the progress bar fits the terminal at any width (one line redrawn in place, never wrapped; a
 * line every N steps when not a terminal) and shows the elapsed time; loss.svg keeps its legend out of the plot
 * area, is titled with the run's name, and a distillation plot shows validation CE and agreement beside the
 * objective.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Progress, fitLine, formatDuration } from '../../src/report/progress.js';
import { lossPlotSvg, type MetricsRow } from '../../src/report/loss-plot.js';

function fakeStream(tty: boolean, columns?: number): { chunks: string[]; isTTY: boolean; columns?: number; write(s: string): boolean } {
  const chunks: string[] = [];
  return { chunks, isTTY: tty, ...(columns !== undefined ? { columns } : {}), write: (s: string) => { chunks.push(s); return true; } };
}

const fields = (i: number): Record<string, string | number> => ({ loss: 6.3 - i * 0.01, 'tok/s': 12345, lr: (3e-3).toExponential(2) });

test('on a terminal each redraw is one line, \\r … erase-to-end, that fits the width (40 to 200 columns)', () => {
  for (const columns of [40, 60, 80, 100, 120, 200]) {
    const s = fakeStream(true, columns);
    let t = 0;
    const p = new Progress(1000, 'distill', 50, s, 0, () => t);
    for (let i = 1; i <= 1000; i += 37) { t = i * 123; p.update(i, fields(i)); }
    assert.equal(s.chunks.length, 28);
    for (const c of s.chunks) {
      assert.ok(c.startsWith('\r') && c.endsWith('\x1b[K'), JSON.stringify(c));
      const visible = c.slice(1, -3);
      assert.ok(!visible.includes('\n') && !visible.includes('\r'), JSON.stringify(c));
      assert.ok([...visible].length <= columns - 1, `${columns} columns: ${[...visible].length} characters: ${visible}`);
      assert.match(visible, /^distill .*\d+\/1000/);
      assert.match(visible, /\d+(s|m\d\ds) elapsed, eta /, 'elapsed time shown');
    }
    p.done();
    assert.equal(s.chunks.at(-1), '\n', 'done() ends the line once');
  }
  // Wide enough: everything, with the full 24-cell bar; narrow: the bar shrinks, then fields go, last first.
  const all = fitLine('train', 500, 1000, ['loss 3.142', 'tok/s 12345', 'lr 3.00e-03'], '1m02s elapsed, eta 1m02s', 199);
  assert.match(all, /^train [█░]{24} 500\/1000 {2}loss 3\.142 {2}tok\/s 12345 {2}lr 3\.00e-03 {2}1m02s elapsed, eta 1m02s$/);
  const mid = fitLine('train', 500, 1000, ['loss 3.142', 'tok/s 12345', 'lr 3.00e-03'], '1m02s elapsed, eta 1m02s', 79);
  assert.match(mid, /^train [█░]{8} 500\/1000 {2}loss 3\.142 {2}tok\/s 12345 {2}1m02s elapsed, eta 1m02s$/);
  assert.equal([...fitLine('train', 500, 1000, ['loss 3.142'], '1m02s elapsed, eta 1m02s', 19)].length, 19);
});

test('elapsed time: from the clock, formatted', () => {
  const s = fakeStream(true, 200);
  let t = 1_000_000;
  const p = new Progress(100, 'train', 10, s, 0, () => t);
  t += 62_000;
  p.update(50, { loss: 1 });
  assert.match(s.chunks[0]!, /1m02s elapsed, eta 1m02s/);
  assert.deepEqual([0.4, 59.6, 61, 3599.7, 7260].map(formatDuration), ['0s', '1m00s', '1m01s', '1h00m', '2h01m']);
});

test('not a terminal: a full line every N updates (and the first and last), no \\r, no line per redraw', () => {
  const s = fakeStream(false);
  const p = new Progress(100, 'train', 10, s, 0);
  for (let i = 1; i <= 100; i++) p.update(i, fields(i));
  p.done();
  assert.equal(s.chunks.length, 11, s.chunks.join(''));
  for (const c of s.chunks) { assert.ok(c.endsWith('\n') && !c.includes('\r')); assert.match(c, /elapsed, eta/); }
  assert.match(s.chunks[0]!, /^train [█░]{24} 1\/100 {2}loss /);
});

const at = (svg: string, tag: RegExp): Array<Record<string, string>> => [...svg.matchAll(tag)].map((m) => Object.fromEntries([...m[0].matchAll(/([\w-]+)="([^"]*)"/g)].map((a) => [a[1]!, a[2]!])));

/** Plot areas, the legend blocks (in order) and the series paths of a chart. */
function readChart(svg: string) {
  const areas = at(svg, /<rect class="plot-area"[^>]*>/g).map((a) => ({ x: +a.x!, y: +a.y!, w: +a.width!, h: +a.height! }));
  const legends = [...svg.matchAll(/<g class="legend">([\s\S]*?)<\/g>/g)].map((m) => ({
    ys: [...m[1]!.matchAll(/ y="([\d.]+)"/g)].map((y) => Number(y[1])), names: [...m[1]!.matchAll(/<text[^>]*>([^<]*)<\/text>/g)].map((t) => t[1]!),
  }));
  const paths = at(svg, /<path class="series"[^>]*>/g).map((p) => ({
    name: p['data-name']!, pts: [...p.d!.matchAll(/[ML]([\d.]+),([\d.]+)/g)].map((q) => [Number(q[1]), Number(q[2])] as [number, number]),
  }));
  const title = /<text class="title"[^>]*>([^<]*)<\/text>/.exec(svg)?.[1];
  return { areas, legends, paths, title };
}

const trainRows: MetricsRow[] = [{ step: 0, val_loss: 6.4, val_ce: 6.4 }];
for (let s = 1; s <= 60; s++) trainRows.push({ step: s, loss: 6.3 * Math.exp(-s / 20) + 1, ce: 6.3 * Math.exp(-s / 20) + 1 });
for (const s of [20, 40, 60]) trainRows.push({ step: s, val_loss: 6.3 * Math.exp(-s / 20) + 1.2, val_ce: 6.3 * Math.exp(-s / 20) + 1.2 });

test('loss.svg (train): titled with the run, legend above the plot area (never over a curve), both series drawn', () => {
  const c = readChart(lossPlotSvg(trainRows, { mode: 'train', runName: 'my-run' }));
  assert.equal(c.title, 'my-run: train loss');
  assert.equal(c.areas.length, 1);
  assert.deepEqual(c.paths.map((p) => p.name), ['train loss', 'validation loss']);
  assert.deepEqual(c.legends[0]!.names, ['train loss', 'validation loss']);
  const a = c.areas[0]!;
  for (const y of c.legends[0]!.ys) assert.ok(y < a.y, `legend y ${y} is above the plot area (top ${a.y})`);
  for (const p of c.paths) {
    for (const [x, y] of p.pts) assert.ok(x >= a.x - 0.1 && x <= a.x + a.w + 0.1 && y >= a.y - 0.1 && y <= a.y + a.h + 0.1, `${p.name} (${x}, ${y}) inside the plot`);
  }
  // 60 training points and 4 validation points (step 0 included); lower loss is drawn lower (larger y).
  assert.equal(c.paths[0]!.pts.length, 60);
  assert.equal(c.paths[1]!.pts.length, 4);
  assert.ok(c.paths[0]!.pts[59]![1] > c.paths[0]!.pts[0]![1]);
});

test('loss.svg (distill): objective, cross-entropy and agreement panels, each legend outside its plot area', () => {
  const rows: MetricsRow[] = trainRows.map((r) => ({ ...r, ...(r.loss !== undefined ? { loss: r.loss + 0.5, div: 0.7 } : {}),
    ...(r.val_loss !== undefined ? { val_loss: r.val_loss + 0.5, agreement: 0.2 + r.step! / 100 } : {}) }));
  const svg = lossPlotSvg(rows, { mode: 'distill', runName: 'student' });
  const c = readChart(svg);
  assert.equal(c.title, 'student: distill loss');
  assert.equal(c.areas.length, 3);
  assert.deepEqual(c.paths.map((p) => p.name), ['train', 'validation', 'train CE', 'validation CE', 'validation agreement with the teacher']);
  c.legends.forEach((l, i) => {
    const a = c.areas[i]!;
    for (const y of l.ys) {
      assert.ok(y < a.y, `panel ${i}: legend y ${y} above its plot area (top ${a.y})`);
      for (const other of c.areas) assert.ok(!(y > other.y && y < other.y + other.h), `legend y ${y} inside a plot area`);
    }
  });
  // Agreement is drawn on its own 0–1 axis: 0.2 → 80% of the panel's height down, 0.8 → 20%.
  const ag = c.paths[4]!, a3 = c.areas[2]!;
  assert.equal(ag.pts.length, 4);
  assert.ok(Math.abs(ag.pts[0]![1] - (a3.y + a3.h * 0.8)) < 0.2, `agreement 0.2 at y ${ag.pts[0]![1]}`);
  assert.ok(Math.abs(ag.pts[3]![1] - (a3.y + a3.h * 0.2)) < 0.2);
  // Validation CE lies in the CE panel, not the objective's.
  const a2 = c.areas[1]!;
  for (const [, y] of c.paths[3]!.pts) assert.ok(y >= a2.y - 0.1 && y <= a2.y + a2.h + 0.1);
  assert.ok(svg.includes('objective α·div + (1−α)·CE'));
});

test('loss.svg escapes a run name with markup characters', () => {
  const svg = lossPlotSvg(trainRows, { mode: 'train', runName: 'a<b>&"c"' });
  assert.equal(readChart(svg).title, 'a&lt;b&gt;&amp;&quot;c&quot;: train loss');
});
