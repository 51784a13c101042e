/**
 * A one-line progress bar for long work (training steps, evaluation): step, loss, tokens/s and ETA.
 * On a terminal it redraws in place; otherwise (CI logs, pipes) it prints a line every `every` updates
 * so logs stay readable.
 */
export class Progress {
  private readonly start = Date.now();
  private lastLen = 0;
  private readonly tty: boolean;

  constructor(private readonly total: number, private readonly label: string, private readonly every = 10,
    private readonly stream: NodeJS.WriteStream = process.stderr, private readonly startAt = 0) {
    this.tty = Boolean(stream.isTTY);
  }

  update(done: number, fields: Record<string, string | number>): void {
    const frac = this.total > 0 ? Math.min(1, done / this.total) : 1;
    const elapsed = (Date.now() - this.start) / 1000;
    const rate = (done - this.startAt) / Math.max(elapsed, 1e-9);
    const eta = rate > 0 ? (this.total - done) / rate : Infinity;
    const width = 24, filled = Math.round(frac * width);
    const bar = '█'.repeat(filled) + '░'.repeat(width - filled);
    const extra = Object.entries(fields).map(([k, v]) => `${k} ${typeof v === 'number' ? fmt(v) : v}`).join('  ');
    const line = `${this.label} ${bar} ${done}/${this.total}  ${extra}  eta ${formatDuration(eta)}`;
    if (this.tty) {
      this.stream.write('\r' + line + ' '.repeat(Math.max(0, this.lastLen - line.length)));
      this.lastLen = line.length;
    } else if (done === this.total || done % this.every === 0 || done === this.startAt + 1) {
      this.stream.write(line + '\n');
    }
  }

  done(): void {
    if (this.tty && this.lastLen) this.stream.write('\n');
    this.lastLen = 0;
  }
}

function fmt(v: number): string {
  if (!Number.isFinite(v)) return String(v);
  if (Math.abs(v) >= 1000) return Math.round(v).toString();
  return v.toPrecision(4);
}

export function formatDuration(s: number): string {
  if (!Number.isFinite(s)) return '--';
  if (s < 60) return `${Math.round(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(Math.round(s % 60)).padStart(2, '0')}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
}
