/**
 * A one-line progress bar for long work (training steps, evaluation): step, loss, tokens/s, elapsed time and ETA.
 *
 * On a terminal it redraws ONE line in place (`\r`, then the line, then "erase to the end of the line"), fitted to
 * the terminal's width (read at every redraw, so a resized window is followed) so it never wraps: the bar shrinks
 * first, then the last fields are dropped, then the line is cut. Otherwise (CI logs, pipes) it prints a full line
 * every `every` updates (and the first and last), never one per redraw, so logs stay readable.
 */
export interface ProgressStream {
  write(s: string): unknown;
  isTTY?: boolean;
  columns?: number;
}

const BAR_MAX = 24, BAR_MIN = 8;
/** Width assumed for a terminal that does not say (the classic 80 columns). */
const DEFAULT_COLUMNS = 80;

export class Progress {
  private readonly start: number;
  private drawn = false;
  private readonly tty: boolean;

  constructor(private readonly total: number, private readonly label: string, private readonly every = 10,
    private readonly stream: ProgressStream = process.stderr, private readonly startAt = 0,
    private readonly now: () => number = Date.now) {
    this.tty = Boolean(stream.isTTY);
    this.start = now();
  }

  update(done: number, fields: Record<string, string | number>): void {
    const elapsed = (this.now() - this.start) / 1000;
    const rate = (done - this.startAt) / Math.max(elapsed, 1e-9);
    const eta = rate > 0 ? (this.total - done) / rate : Infinity;
    const extras = Object.entries(fields).map(([k, v]) => `${k} ${typeof v === 'number' ? fmt(v) : v}`);
    const time = `${formatDuration(elapsed)} elapsed, eta ${formatDuration(eta)}`;
    if (this.tty) {
      const width = Math.max(20, (this.stream.columns ?? DEFAULT_COLUMNS) - 1); // the last column would wrap on some terminals
      this.stream.write(`\r${fitLine(this.label, done, this.total, extras, time, width)}\x1b[K`);
      this.drawn = true;
    } else if (done === this.total || done % this.every === 0 || done === this.startAt + 1) {
      this.stream.write(`${composeLine(this.label, done, this.total, extras, time, BAR_MAX)}\n`);
    }
  }

  done(): void {
    if (this.tty && this.drawn) this.stream.write('\n');
    this.drawn = false;
  }
}

function bar(frac: number, width: number): string {
  const filled = Math.round(frac * width);
  return '█'.repeat(filled) + '░'.repeat(width - filled);
}

function composeLine(label: string, done: number, total: number, extras: string[], time: string, barWidth: number): string {
  const frac = total > 0 ? Math.min(1, done / total) : 1;
  const head = barWidth > 0 ? `${label} ${bar(frac, barWidth)} ${done}/${total}` : `${label} ${done}/${total}`;
  return [head, ...extras, time].join('  ');
}

/** The richest line that fits in `width` characters (see the module comment). */
export function fitLine(label: string, done: number, total: number, extras: string[], time: string, width: number): string {
  const fits = (s: string): boolean => [...s].length <= width;
  for (let b = BAR_MAX; b >= BAR_MIN; b--) {
    const l = composeLine(label, done, total, extras, time, b);
    if (fits(l)) return l;
  }
  for (let n = extras.length - 1; n >= 0; n--) {
    const l = composeLine(label, done, total, extras.slice(0, n), time, BAR_MIN);
    if (fits(l)) return l;
  }
  const bare = composeLine(label, done, total, [], time, 0);
  if (fits(bare)) return bare;
  return [...bare].slice(0, width).join('');
}

function fmt(v: number): string {
  if (!Number.isFinite(v)) return String(v);
  if (Math.abs(v) >= 1000) return Math.round(v).toString();
  return v.toPrecision(4);
}

export function formatDuration(s: number): string {
  if (!Number.isFinite(s)) return '--';
  const r = Math.round(Math.max(0, s));
  if (r < 60) return `${r}s`;
  if (r < 3600) return `${Math.floor(r / 60)}m${String(r % 60).padStart(2, '0')}s`;
  return `${Math.floor(r / 3600)}h${String(Math.floor((r % 3600) / 60)).padStart(2, '0')}m`;
}
