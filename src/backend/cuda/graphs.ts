/**
 * Captured regions as CUDA graphs, and the step timeline.
 *
 * The backend records a region's device work (Backend.captured) as a list of ops, each with a fingerprint: the kernel
 * and every launch argument (pointers and scalars), or a GEMM's, memset's or copy's full parameters. The fingerprint
 * of the region is the list of its ops' fingerprints, derived from what is issued and never typed by hand: a region
 * whose ops or arguments differ in any way is another graph. Per label, the runner keeps the last few fingerprints:
 * - first time a fingerprint is seen: the ops run as launched (eager; this warms cuBLAS and loads the modules);
 * - second time: the ops are captured from the stream into a graph, instantiated, and the graph is launched;
 * - after that: the graph is launched (one host call for the whole region).
 * What changes per step travels in device buffers the ops read (token ids, loss weights, AdamW's lr and bias
 * corrections), uploaded before the region. A capture that fails is logged once and the runner goes on eagerly.
 *
 * Profiling (DISTILLERY_CUDA_PROFILE=1): a replayed region runs a second graph with an event node between every two
 * ops, so each op's time is the GPU's alone (no host gap inside a graph); eager regions are profiled op by op as before.
 * A region reaches the runner in segments as the backend records it (cuda-backend.ts segmentOps), each segment its own
 * graph, so the GPU runs a segment while the host records the next.
 * Timeline (always on in device mode): two events around every segment; the table sums, per region, host time
 * recording, host time issuing, and GPU time from each segment's first op to its last. Eager GPU time minus replayed
 * GPU time of the same region is the time the GPU waited for the host inside it.
 */
export interface GraphOp {
  /** Every parameter of the op (equal fingerprints: the same work). */
  readonly fp: string;
  /** The op's row in the profile table. */
  readonly key: string;
  /** Issues the op on the stream (eagerly, or into a capture). */
  issue(): void;
}

/** What the runner needs from the driver (CudaDriver implements it). */
export interface GraphDriver {
  beginCapture(context: string): void;
  endCapture(context: string): unknown;
  graphLaunch(exec: unknown, context: string): void;
  graphDestroy(exec: unknown): void;
  eventCreate(): unknown;
  eventRecord(ev: unknown): void;
  eventRecordNode(ev: unknown): void;
  eventQuery(ev: unknown): boolean;
  eventElapsedMs(start: unknown, end: unknown): number;
  eventDestroy(ev: unknown): void;
  streamSynchronize(context: string): void;
}

/** The profile the runner feeds (OpProfiler): bracket an eager op, or add a time measured in a graph. */
export interface GraphProfile {
  begin(): void;
  end(key: string): void;
  add(key: string, ms: number): void;
}

export type RegionMode = 'eager' | 'capture' | 'replay';

/** A segment's fingerprint: its ops' fingerprints, one a line (equal fingerprints: the same work, one graph). */
export function segmentFingerprint(ops: readonly GraphOp[]): string {
  return ops.map((o) => o.fp).join('\n');
}

export interface TimelineRow {
  label: string;
  mode: RegionMode;
  calls: number;
  ops: number;
  recordMs: number;
  issueMs: number;
  gpuMs: number;
}

interface Entry {
  fp: string;
  seen: number;
  exec: unknown;
  ops: number;
  prof: { exec: unknown; events: unknown[]; keys: string[] } | null;
}

/**
 * Fingerprints kept per label (a training pass, an evaluation pass and its last, shorter batch, ...): 8, so that a step
 * of several micro-batches (the first overwrites the gradients, the middle ones accumulate, the last hands ranges to the
 * data-parallel reduction), with and without on-policy generation, keeps all its graphs.
 */
export const GRAPHS_PER_LABEL = 8;

export class GraphRunner {
  private readonly byLabel = new Map<string, Entry[]>();
  private readonly pending: Array<{ label: string; seg: number; mode: RegionMode; ops: number; recordMs: number; issueMs: number; a: unknown; b: unknown }> = [];
  private readonly freeEvents: unknown[] = [];
  private readonly allEvents: unknown[] = [];
  private readonly rows = new Map<string, TimelineRow>();
  private failed = false;
  captures = 0;
  replays = 0;

  constructor(private readonly d: GraphDriver, private readonly opts: {
    enabled: boolean; log: (line: string) => void; profile: GraphProfile | null;
  }) {}

  get enabled(): boolean { return this.opts.enabled && !this.failed; }

  private event(): unknown {
    const ev = this.freeEvents.pop();
    if (ev !== undefined) return ev;
    const n = this.d.eventCreate();
    this.allEvents.push(n);
    return n;
  }

  /** Reads the timeline events of regions the GPU has finished (never waits unless `wait`). */
  collect(wait = false): void {
    if (wait && this.pending.length > 0) this.d.streamSynchronize('reading the step timeline');
    let i = 0;
    for (; i < this.pending.length; i++) {
      const p = this.pending[i]!;
      if (!wait && !this.d.eventQuery(p.b)) break;
      const gpu = this.d.eventElapsedMs(p.a, p.b);
      const k = `${p.label}\u0000${p.mode}`;
      const r = this.rows.get(k) ?? { label: p.label, mode: p.mode, calls: 0, ops: 0, recordMs: 0, issueMs: 0, gpuMs: 0 };
      if (p.seg === 0) r.calls++;
      r.ops += p.ops; r.recordMs += p.recordMs; r.issueMs += p.issueMs; r.gpuMs += gpu;
      this.rows.set(k, r);
      this.freeEvents.push(p.a, p.b);
    }
    this.pending.splice(0, i);
  }

  /**
   * Runs segment `seg` of a recorded region: eagerly, by capturing it, or by launching its graph (see the file
   * comment). Each segment is its own graph; the timeline sums a region's segments under its label. `fp`: the ops'
   * fingerprint (segmentFingerprint) when the caller has it already, else computed here.
   */
  run(label: string, seg: number, ops: readonly GraphOp[], recordMs: number, fp: string = segmentFingerprint(ops)): RegionMode {
    this.collect();
    const slot = `${label}#${seg}`;
    let entries = this.byLabel.get(slot);
    if (!entries) this.byLabel.set(slot, entries = []);
    let e = entries.find((x) => x.fp === fp);
    if (!e) {
      e = { fp, seen: 0, exec: null, ops: ops.length, prof: null };
      entries.push(e);
      if (entries.length > GRAPHS_PER_LABEL) this.destroyEntry(entries.shift()!);
    }
    e.seen++;
    const a = this.event(), b = this.event();
    const t0 = performance.now();
    this.d.eventRecord(a);
    let mode: RegionMode = 'eager';
    if (this.enabled && e.seen >= 2 && ops.length > 0) {
      if (e.exec === null) {
        e.exec = this.capture(label, ops, null);
        if (e.exec !== null) { mode = 'capture'; this.captures++; }
      } else mode = 'replay';
    }
    if (mode === 'eager') {
      const prof = this.opts.profile;
      for (const op of ops) {
        prof?.begin();
        op.issue();
        prof?.end(op.key);
      }
    } else if (this.opts.profile) {
      this.launchProfiled(label, e, ops);
      if (mode === 'replay') this.replays++;
    } else {
      this.d.graphLaunch(e.exec, `launching the CUDA graph of ${label}`);
      if (mode === 'replay') this.replays++;
    }
    this.d.eventRecord(b);
    this.pending.push({ label, seg, mode, ops: ops.length, recordMs, issueMs: performance.now() - t0, a, b });
    return mode;
  }

  /** Captures ops (with an event node before each op and after the last when `events`); null (logged) when it fails. */
  private capture(label: string, ops: readonly GraphOp[], events: unknown[] | null): unknown {
    const what = `capturing ${label} (${ops.length} ops) as a CUDA graph`;
    try {
      this.d.beginCapture(what);
    } catch (err) {
      this.fail(label, err);
      return null;
    }
    let exec: unknown = null;
    try {
      ops.forEach((op, i) => {
        if (events) this.d.eventRecordNode(events[i]);
        op.issue();
      });
      if (events) this.d.eventRecordNode(events[ops.length]);
    } catch (err) {
      try { this.d.endCapture(what); } catch { /* the capture is invalid already */ }
      this.fail(label, err);
      return null;
    }
    try {
      exec = this.d.endCapture(what);
    } catch (err) {
      this.fail(label, err);
      return null;
    }
    return exec;
  }

  private fail(label: string, err: unknown): void {
    this.failed = true;
    this.opts.log(`[cuda-graphs] capturing ${label} failed (${err instanceof Error ? err.message : String(err)}); running every region as launched from now on`);
  }

  /** Launches the region's profiled graph (built once) and files each op's GPU time under its key. */
  private launchProfiled(label: string, e: Entry, ops: readonly GraphOp[]): void {
    const prof = this.opts.profile!;
    if (e.prof === null) {
      const events = Array.from({ length: ops.length + 1 }, () => this.d.eventCreate());
      const exec = this.capture(`${label} (profiled)`, ops, events);
      if (exec === null) {
        for (const ev of events) this.d.eventDestroy(ev);
        for (const op of ops) { prof.begin(); op.issue(); prof.end(op.key); }
        return;
      }
      e.prof = { exec, events, keys: ops.map((o) => o.key) };
    }
    this.d.graphLaunch(e.prof.exec, `launching the profiled CUDA graph of ${label}`);
    this.d.streamSynchronize('reading the profiled graph');
    const ev = e.prof.events;
    for (let i = 0; i < e.prof.keys.length; i++) prof.add(e.prof.keys[i]!, this.d.eventElapsedMs(ev[i], ev[i + 1]));
  }

  private destroyEntry(e: Entry): void {
    if (e.exec !== null) this.d.graphDestroy(e.exec);
    if (e.prof) {
      this.d.graphDestroy(e.prof.exec);
      for (const ev of e.prof.events) this.d.eventDestroy(ev);
    }
    e.exec = null;
    e.prof = null;
  }

  /** The timeline so far (waits for the GPU), by label and mode. */
  timeline(): TimelineRow[] {
    this.collect(true);
    return [...this.rows.values()].map((r) => ({ ...r }));
  }

  /** Destroys every graph and event (errors to onError, never thrown). */
  dispose(onError: (e: unknown) => void): void {
    for (const entries of this.byLabel.values()) {
      for (const e of entries) {
        try { this.destroyEntry(e); } catch (err) { onError(err); }
      }
    }
    this.byLabel.clear();
    for (const ev of this.allEvents) {
      try { this.d.eventDestroy(ev); } catch (err) { onError(err); }
    }
    this.allEvents.length = 0;
    this.freeEvents.length = 0;
    this.pending.length = 0;
  }
}

/** The timeline table: `[cuda-timeline]` lines, one per region label and mode, means per call. */
export function formatTimeline(rows: readonly TimelineRow[]): string {
  const head = ['region', 'mode', 'calls', 'ops', 'record ms', 'issue ms', 'GPU ms', 'host us/op'];
  const body = rows.map((r) => {
    const c = Math.max(r.calls, 1);
    return [r.label, r.mode, String(r.calls), String(Math.round(r.ops / c)), (r.recordMs / c).toFixed(2), (r.issueMs / c).toFixed(2),
      (r.gpuMs / c).toFixed(2), r.ops > 0 ? (1000 * (r.recordMs + r.issueMs) / r.ops).toFixed(2) : '-'];
  });
  const width = head.map((h, i) => Math.max(h.length, ...body.map((r) => r[i]!.length)));
  const fmt = (r: readonly string[]): string =>
    `[cuda-timeline] ${r.map((c, i) => (i < 2 ? c.padEnd(width[i]!) : c.padStart(width[i]!))).join('  ')}`.trimEnd();
  return [
    '[cuda-timeline] per captured region, means per call: host ms recording the ops, host ms issuing them (eager: one call per op; ' +
      'replay: one graph launch), GPU ms from the region\'s first op to its last (eager GPU − replay GPU = GPU idle waiting for the host)',
    fmt(head), ...body.map(fmt),
  ].join('\n');
}

/** Whether CUDA graphs are on: default on; DISTILLERY_CUDA_GRAPHS=0 (or false/off) turns them off. */
export function graphsFromEnv(env: NodeJS.ProcessEnv = process.env): boolean {
  const v = env.DISTILLERY_CUDA_GRAPHS;
  return !(v !== undefined && ['0', 'false', 'off', 'no'].includes(v.toLowerCase()));
}

/** Whether the environment asks for the timeline table on dispose (DISTILLERY_CUDA_TIMELINE=1). */
export function timelineFromEnv(env: NodeJS.ProcessEnv = process.env): boolean {
  const v = env.DISTILLERY_CUDA_TIMELINE;
  return v !== undefined && v !== '' && v !== '0' && v.toLowerCase() !== 'false';
}
