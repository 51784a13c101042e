/**
 * Op-level GPU profile for the CUDA backend (`DISTILLERY_CUDA_PROFILE=1`).
 *
 * Each kernel launch, cuBLAS GEMM and device memset/copy issued outside a CUDA graph is bracketed by two CUDA events
 * recorded on the backend's stream; nothing synchronizes per op. Such an op's time includes any wait for the host's
 * next launch (a short kernel behind a slow host reads long). Ops of a replayed region run in a profiled graph with an
 * event node between every two ops (graphs.ts): their times are the GPU's alone, which is what a GEMM timed by itself
 * gives. Events come from a fixed pool: when it runs dry the profiler
 * synchronizes once, reads every pending pair's elapsed time into the per-key totals and recycles the events.
 * On dispose the backend prints `formatProfile(...)`: one row per op key (kernel family, or `cublas <op> <shape>`),
 * calls, total ms, % of the profiled total, sorted by time. Off by default: the backend then holds no profiler
 * and each op pays one null check.
 */

/** The event operations the profiler needs (CudaDriver implements them; tests pass a fake clock). */
export interface ProfileClock {
  eventCreate(): unknown;
  eventRecord(ev: unknown): void;
  /** Milliseconds between two recorded events (both complete). */
  eventElapsedMs(start: unknown, end: unknown): number;
  eventDestroy(ev: unknown): void;
  synchronize(context: string): void;
}

export interface ProfileRow { key: string; calls: number; ms: number }

/** Events kept in flight before a flush (two per op). */
export const PROFILE_POOL_EVENTS = 8192;

export class OpProfiler {
  private readonly free: unknown[] = [];
  private readonly all: unknown[] = [];
  private readonly pending: Array<{ key: string; a: unknown; b: unknown }> = [];
  private readonly totals = new Map<string, { calls: number; ms: number }>();
  private open: unknown = null;
  private readonly t0 = process.hrtime.bigint();

  constructor(private readonly clock: ProfileClock, private readonly poolEvents = PROFILE_POOL_EVENTS) {
    if (poolEvents < 2) throw new Error('OpProfiler: the event pool needs at least 2 events');
  }

  private take(): unknown {
    let ev = this.free.pop();
    if (ev === undefined) {
      if (this.all.length + 1 > this.poolEvents) {
        this.flush();
        ev = this.free.pop();
      } else {
        ev = this.clock.eventCreate();
        this.all.push(ev);
      }
    }
    return ev;
  }

  /** Before an op: records its start event. */
  begin(): void {
    if (this.open !== null) throw new Error('OpProfiler: begin() inside an open op');
    // Take both events now, so a flush can never happen between an op's start and end.
    if (this.free.length < 2 && this.all.length + 2 > this.poolEvents) this.flush();
    const a = this.take();
    this.clock.eventRecord(a);
    this.open = a;
  }

  /** After an op: records its end event and files the pair under `key`. */
  end(key: string): void {
    const a = this.open;
    if (a === null) throw new Error('OpProfiler: end() without begin()');
    this.open = null;
    const b = this.take();
    this.clock.eventRecord(b);
    this.pending.push({ key, a, b });
  }

  /** Files a time measured elsewhere (an op inside a profiled CUDA graph, src/backend/cuda/graphs.ts). */
  add(key: string, ms: number): void {
    const t = this.totals.get(key);
    if (t) { t.calls++; t.ms += ms; } else this.totals.set(key, { calls: 1, ms });
  }

  /** Waits for the GPU, reads every pending pair into the totals, recycles their events. */
  flush(): void {
    if (this.pending.length === 0) return;
    this.clock.synchronize('reading profile events');
    for (const p of this.pending) {
      const ms = this.clock.eventElapsedMs(p.a, p.b);
      const t = this.totals.get(p.key);
      if (t) { t.calls++; t.ms += ms; } else this.totals.set(p.key, { calls: 1, ms });
      this.free.push(p.a, p.b);
    }
    this.pending.length = 0;
  }

  /** Flushes and returns the rows, largest total first (ties by key). */
  rows(): ProfileRow[] {
    this.flush();
    return [...this.totals].map(([key, t]) => ({ key, calls: t.calls, ms: t.ms }))
      .sort((x, y) => y.ms - x.ms || (x.key < y.key ? -1 : x.key > y.key ? 1 : 0));
  }

  /** Host wall time since the profiler was created, in ms. */
  wallMs(): number { return Number(process.hrtime.bigint() - this.t0) / 1e6; }

  /** Flushes pending pairs and destroys every event (errors go to `onError`, never thrown). */
  dispose(onError: (e: unknown) => void = () => {}): void {
    try { this.flush(); } catch (e) { onError(e); }
    for (const ev of this.all) {
      try { this.clock.eventDestroy(ev); } catch (e) { onError(e); }
    }
    this.all.length = 0;
    this.free.length = 0;
  }
}

/**
 * The profile table. Lines start with `[cuda-profile]` so a log can be grepped for it.
 * `wallMs` (optional) adds the host wall time the profile covered, for comparison with the GPU total.
 */
export function formatProfile(rows: readonly ProfileRow[], wallMs?: number): string {
  const total = rows.reduce((s, r) => s + r.ms, 0);
  const calls = rows.reduce((s, r) => s + r.calls, 0);
  const head = ['op', 'calls', 'total ms', '%', 'us/call'];
  const body = rows.map((r) => [
    r.key, String(r.calls), r.ms.toFixed(2), total > 0 ? (100 * r.ms / total).toFixed(1) : '0.0',
    r.calls > 0 ? (1000 * r.ms / r.calls).toFixed(1) : '0.0',
  ]);
  body.push(['total', String(calls), total.toFixed(2), total > 0 ? '100.0' : '0.0', calls > 0 ? (1000 * total / calls).toFixed(1) : '0.0']);
  const width = head.map((h, i) => Math.max(h.length, ...body.map((r) => r[i]!.length)));
  const fmt = (r: readonly string[]): string =>
    `[cuda-profile] ${r.map((c, i) => (i === 0 ? c.padEnd(width[i]!) : c.padStart(width[i]!))).join('  ')}`.trimEnd();
  const lines = [
    `[cuda-profile] GPU time per op (CUDA events around each launch, GEMM, memset and copy; inside CUDA graphs for replayed regions)` +
      (wallMs !== undefined ? `; host wall time covered: ${wallMs.toFixed(0)} ms` : ''),
    fmt(head),
    ...body.slice(0, -1).map(fmt),
    `[cuda-profile] ${'-'.repeat(width.reduce((s, w) => s + w, 0) + 2 * (width.length - 1))}`,
    fmt(body[body.length - 1]!),
  ];
  return lines.join('\n');
}

/** Whether the environment asks for the profile. */
export function profileFromEnv(env: NodeJS.ProcessEnv = process.env): boolean {
  const v = env.DISTILLERY_CUDA_PROFILE;
  return v !== undefined && v !== '' && v !== '0' && v.toLowerCase() !== 'false';
}
