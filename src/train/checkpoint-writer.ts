/**
 * Writing checkpoints/latest: the weights folder (float32), the optimizer's moments and state.json, into a temporary
 * folder that replaces the previous checkpoint at once (replaceDirAtomicSync: a crash mid-write keeps the old one).
 *
 * A save is two parts: the snapshot (the device's weights and moments downloaded into host arrays: fast, and it must
 * happen at the step) and the write (the files: seconds for a 0.5B model, two thirds of a save on the H100 machine).
 * BackgroundCheckpoints runs the write on a worker thread (src/train/checkpoint-worker.ts, started and watched by a
 * supervisor thread, src/train/checkpoint-supervisor.ts, which wakes a run waiting for a writer that died) while
 * training goes on: the host arrays are shared with it (SharedArrayBuffer: the arrays the model and the optimizer keep for their saves) or
 * handed over (transferred), never copied. The run joins the write before anything downloads into those arrays again
 * (the next save, best/, final/) and before it ends; a write that failed throws its error there, as the synchronous
 * write would have.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { MessageChannel, Worker, receiveMessageOnPort, type MessagePort } from 'node:worker_threads';
import { replaceDirAtomicSync } from '../io/atomic.js';
import { writeSafetensors } from '../io/safetensors.js';
import { DistilleryError, InputError } from '../util/errors.js';
import { writeResumeFiles, type ResumeWriter } from './student-files.js';

/** One save of checkpoints/latest: where, the host snapshot, and state.json's text. */
export interface LatestCheckpoint {
  latest: string;
  /** The weights folder's name under latest (model/ or adapter/). */
  resumeDir: string;
  weights: Float32Array;
  m: Float32Array;
  v: Float32Array;
  state: string;
  step: number;
}

/** Writes checkpoints/latest (see the module comment); `during` runs between the weights and the moments (tests). */
export function writeLatest(c: LatestCheckpoint, writer: ResumeWriter, during?: (tmpDir: string, step: number) => void): void {
  replaceDirAtomicSync(c.latest, (tmp) => {
    writeResumeFiles(path.join(tmp, c.resumeDir), writer, c.weights);
    during?.(tmp, c.step);
    writeSafetensors(path.join(tmp, 'optimizer.safetensors'), new Map([
      ['m', { shape: [c.m.length], data: c.m }], ['v', { shape: [c.v.length], data: c.v }],
    ]), { dtype: 'f32' });
    fs.writeFileSync(path.join(tmp, 'state.json'), c.state);
  });
}

/** What the worker posts back for a write: done, or the error it threw (a DistilleryError keeps its hint). */
export type WriteResult = { ok: true; step: number; seconds: number }
  | { ok: false; step: number; message: string; hint?: string | undefined; kind: 'input' | 'distillery' | 'error'; code?: string | undefined };

/** A write's error as the worker posts it. */
export function writeFailure(step: number, e: unknown): WriteResult {
  const code = (e as NodeJS.ErrnoException | null)?.code;
  if (e instanceof DistilleryError) return { ok: false, step, message: e.message, hint: e.hint, kind: e instanceof InputError ? 'input' : 'distillery' };
  return { ok: false, step, message: e instanceof Error ? e.message : String(e), kind: 'error', ...(typeof code === 'string' ? { code } : {}) };
}

/**
 * The error a write threw on the worker, rebuilt on the run's thread with the class, hint and errno code it had, its
 * message naming the step whose checkpoint it was (it surfaces at the next join, steps later).
 */
function rebuild(r: Extract<WriteResult, { ok: false }>): Error {
  const message = r.step === PREFAULT_STEP ? `mapping in the checkpoint arrays: ${r.message}` : `the checkpoint of step ${r.step}: ${r.message}`;
  if (r.kind === 'input') return new InputError(message, r.hint);
  if (r.kind === 'distillery') return new DistilleryError(message, r.hint);
  return Object.assign(new Error(message), r.code ? { code: r.code } : {});
}

/**
 * The messages the worker receives: its writer once (`delayMs`: tests stretch every job by it, to catch a run that
 * does not wait for one; `crashOnJob`: tests, the worker exits on its first job instead of answering it), then
 * checkpoints to write and host arrays to map in.
 */
export type WorkerMessage = { writer: ResumeWriter; port: MessagePort; flag: Int32Array; delayMs: number; crashOnJob: boolean }
  | { checkpoint: LatestCheckpoint } | { prefault: Float32Array[] };
/** The supervisor's messages: the worker's, its first with the port on which it says why the worker stopped. */
export type SupervisorMessage = Exclude<WorkerMessage, { writer: ResumeWriter }> | (Extract<WorkerMessage, { writer: ResumeWriter }> & { deadPort: MessagePort });

/** The buffers a job hands over (those not over a SharedArrayBuffer), passed on as they came. */
export function transferables(msg: WorkerMessage): ArrayBuffer[] {
  const arrays = 'checkpoint' in msg ? [msg.checkpoint.weights, msg.checkpoint.m, msg.checkpoint.v] : 'prefault' in msg ? msg.prefault : [];
  return [...new Set(arrays.filter((a) => !(a.buffer instanceof SharedArrayBuffer)).map((a) => a.buffer as ArrayBuffer))];
}

/** The step a prefault job reports (no checkpoint's). */
export const PREFAULT_STEP = -1;

/**
 * Maps in every page of new arrays by zero-filling them (they hold zeros already; a native fill, which the kernel may
 * back with huge pages, is several times faster than a write per page): the first download into a new array otherwise
 * pays a page fault per page on the run's thread (seconds for the 6 GB of a 0.5B model's checkpoint arrays).
 */
export function prefault(arrays: readonly Float32Array[]): void {
  for (const a of arrays) a.fill(0);
}

export class BackgroundCheckpoints {
  private worker: Worker | null = null;
  private port: MessagePort | null = null;
  /** Where the supervisor says why the writer thread stopped. */
  private deadPort: MessagePort | null = null;
  /**
   * flag[0]: writes finished so far (the worker adds one and notifies after posting each result); flag[1]: 1 once the
   * writer thread stopped (set by the supervisor, which notifies on flag[0]).
   */
  private readonly flag = new Int32Array(new SharedArrayBuffer(8));
  private submitted = 0;
  private pending: number | null = null;
  /** Why the worker stopped (its 'error' or 'exit' event), when it did. */
  private dead: string | null = null;

  /** `delayMs`: tests only, every job on the worker starts that much later; `crashOnJob`: tests only (WorkerMessage). */
  constructor(private readonly writer: ResumeWriter, private readonly delayMs = 0, private readonly crashOnJob = false) {}

  /** The step of the write in flight, or null. */
  get inFlight(): number | null { return this.pending; }

  /**
   * Starts writing c on the worker (after joining the previous write). The arrays over a SharedArrayBuffer are shared:
   * the caller must not change them before join(); any others are transferred (unusable here afterwards).
   */
  submit(c: LatestCheckpoint): void {
    const msg: WorkerMessage = { checkpoint: c };
    this.post(msg, transferables(msg), c.step);
  }

  /**
   * Maps in the pages of new host arrays a later snapshot downloads into (SharedArrayBuffer-backed: the model's and the
   * optimizer's kept arrays, still zero: the prefault writes zeros) on the worker, while training runs; the next join()
   * (every save's first) waits for it.
   */
  prefault(arrays: Float32Array[]): void {
    const shared = arrays.filter((a) => a.buffer instanceof SharedArrayBuffer);
    if (shared.length > 0) this.post({ prefault: shared }, [], PREFAULT_STEP);
  }

  /** Sends a job to the worker (started on the first), after joining the one in flight: one job at a time. */
  private post(msg: WorkerMessage, transfer: ArrayBuffer[], step: number): void {
    this.join();
    this.start().postMessage(msg, transfer);
    this.submitted++;
    this.pending = step;
  }

  private start(): Worker {
    if (!this.worker) {
      const ch = new MessageChannel(), dc = new MessageChannel();
      const w = this.worker = new Worker(new URL('./checkpoint-supervisor.js', import.meta.url));
      w.unref();
      // a supervisor that dies fails the next join instead of leaving it waiting; while training runs its error is kept
      // here (an unhandled 'error' event would end the process). A writer that dies, the supervisor reports (flag[1]).
      w.on('error', (e) => { this.dead ??= e instanceof Error ? e.message : String(e); });
      w.on('exit', (code) => { if (this.worker === w) this.dead ??= `it exited (code ${code})`; });
      this.port = ch.port1;
      this.deadPort = dc.port1;
      const init: SupervisorMessage = { writer: this.writer, port: ch.port2, flag: this.flag, delayMs: this.delayMs, crashOnJob: this.crashOnJob, deadPort: dc.port2 };
      this.worker.postMessage(init, [ch.port2, dc.port2]);
    }
    return this.worker;
  }

  /**
   * Waits for the write in flight (if any) and returns its step (PREFAULT_STEP for a prefault), how long it took on the
   * worker and how long this thread waited for it (seconds), or null when none was in flight; a write that failed throws
   * its error here.
   */
  join(): { step: number; seconds: number; waited: number } | null {
    if (this.pending === null) return null;
    const t0 = process.hrtime.bigint();
    for (;;) {
      const done = Atomics.load(this.flag, 0);
      if (done >= this.submitted) break;
      if (this.dead === null && Atomics.load(this.flag, 1) !== 0) this.dead = String(receiveMessageOnPort(this.deadPort!)?.message ?? 'it stopped');
      if (this.dead !== null) {
        const step = this.pending;
        this.pending = null;
        throw new DistilleryError(`the checkpoint writer thread stopped (${this.dead}): ${step === PREFAULT_STEP ? 'the checkpoint arrays were not mapped in' : `the checkpoint of step ${step} was not written`}`,
          'checkpoints/latest holds the previous checkpoint; resume from it with --resume');
      }
      Atomics.wait(this.flag, 0, done, 1000);
    }
    this.pending = null;
    const got = receiveMessageOnPort(this.port!)?.message as WriteResult | undefined;
    if (!got) throw new Error('the checkpoint writer finished a write without a result');
    if (!got.ok) throw rebuild(got);
    return { step: got.step, seconds: got.seconds, waited: Number(process.hrtime.bigint() - t0) / 1e9 };
  }

  /** Joins the write in flight and stops the worker. */
  close(): void {
    try { this.join(); } finally {
      const w = this.worker;
      this.worker = null;
      void w?.terminate();
      this.port?.close();
      this.port = null;
      this.deadPort?.close();
      this.deadPort = null;
    }
  }
}
