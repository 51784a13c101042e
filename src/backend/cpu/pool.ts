/**
 * A small pool of worker threads that lets the synchronous Backend API use several cores.
 *
 * run(task, axis, ranges) posts the task, cut into ranges, to the workers and works on it on the calling (main)
 * thread too; every thread claims ranges from a shared counter until none is left, so a thread slowed by
 * other load on the machine does less of the work. The main thread then blocks in Atomics.wait on a shared
 * done counter until every worker has finished: the caller sees an ordinary synchronous call. Buffers travel as SharedArrayBuffer-backed typed arrays, so nothing is copied.
 * Views of the backend's WebAssembly memory travel as (byteOffset, length) references instead (packTask in
 * tasks.ts): structured-cloning a view of a WebAssembly.Memory costs ~20-500 µs per message (measured in the
 * training benchmark), a reference a few µs; the worker rebuilds the view over its own handle on the memory.
 * Workers are unref()'d, so a pool that is never disposed does not keep the process alive; dispose()
 * terminates them. The worker script is resolved next to this file, so it works from the compiled dist/.
 */
import { MessageChannel, Worker, receiveMessageOnPort, type MessagePort } from 'node:worker_threads';
import { DistilleryError } from '../../util/errors.js';
import { packTask, runChunks, type ChunkAxis, type ChunkedTask, type Task } from './tasks.js';
import type { GemmKernels, WasmMemory, WasmModule } from './wasm.js';

const CTRL_DONE = 0, CTRL_ERRORS = 1, CTRL_READY = 2;
/**
 * How long to wait for workers to start, and for an answer to a task, before giving up. Starting a worker (an isolate,
 * the WASM module) takes well under a second on an idle machine but tens of seconds on a saturated one (a CI box of 2
 * cores running several test processes, or ranks of a data-parallel run): the start limit only has to catch a worker
 * that never comes up.
 */
const START_TIMEOUT_MS = 120_000;
const TASK_TIMEOUT_MS = 300_000;

export class WorkerPool {
  /** Number of worker threads (the main thread is one more). */
  readonly size: number;
  private workers: Worker[] = [];
  private ports: MessagePort[] = [];
  private readonly ctrl: Int32Array;
  /** The chunk counter of the run in progress (shared with the workers). */
  private readonly counter = new Int32Array(new SharedArrayBuffer(4));
  private ready = false;
  private crashed: string | null = null;

  /**
   * `wasm`: the backend's WASM kernels (run here on the calling thread) and the module and shared memory the
   * workers instantiate their own from; null where the backend runs JS kernels only.
   */
  constructor(nWorkers: number, private readonly wasm: {
    kernels: GemmKernels; module: WasmModule; memory: WasmMemory; owns: (a: ArrayBufferView) => boolean;
  } | null = null) {
    this.size = nWorkers;
    this.ctrl = new Int32Array(new SharedArrayBuffer(4 * (CTRL_READY + nWorkers)));
    const url = new URL('./matmul-worker.js', import.meta.url);
    // Workers inherit the parent's execArgv; `--input-type` (node --input-type=module -e ...) makes a worker
    // that runs a file exit at once, so it is dropped.
    const execArgv: string[] = [];
    for (let i = 0; i < process.execArgv.length; i++) {
      const a = process.execArgv[i]!;
      if (a === '--input-type') { i++; continue; }
      if (!a.startsWith('--input-type=')) execArgv.push(a);
    }
    for (let i = 0; i < nWorkers; i++) {
      const ch = new MessageChannel();
      const w = new Worker(url, {
        workerData: { ctrl: this.ctrl, index: i, errPort: ch.port2, wasm: wasm === null ? null : { module: wasm.module, memory: wasm.memory } },
        execArgv,
        transferList: [ch.port2],
      });
      w.on('error', (e) => { this.crashed = e.stack ?? e.message; });
      w.unref();
      this.workers.push(w);
      this.ports.push(ch.port1);
    }
  }

  private get kernels(): GemmKernels | null { return this.wasm === null ? null : this.wasm.kernels; }

  private waitReady(): void {
    if (this.ready) return;
    const deadline = Date.now() + START_TIMEOUT_MS;
    for (let i = 0; i < this.size; i++) {
      while (Atomics.load(this.ctrl, CTRL_READY + i) === 0) {
        const left = deadline - Date.now();
        if (left <= 0) {
          throw new DistilleryError(`cpu backend: worker thread ${i} did not start within ${START_TIMEOUT_MS / 1000} s`,
            'run with threads: 1, or check that dist/src/backend/cpu/matmul-worker.js exists (npm run build)');
        }
        Atomics.wait(this.ctrl, CTRL_READY + i, 0, left);
      }
    }
    this.ready = true;
  }

  /**
   * Runs `base` cut into the given ranges (pairs [start, end) along `axis`) on this thread and on up to
   * size workers, which claim ranges dynamically; returns when all are done.
   */
  run(base: Task, axis: ChunkAxis, ranges: Array<[number, number]>): void {
    if (ranges.length === 0) return;
    if (this.workers.length === 0 && this.size > 0) throw new Error('WorkerPool.run after dispose()');
    const chunked: ChunkedTask = { op: 'chunked', counter: this.counter, base, axis, ranges: Int32Array.from(ranges.flat()) };
    Atomics.store(this.counter, 0, 0);
    const helpers = Math.min(this.size, ranges.length - 1);
    if (helpers === 0) { runChunks(chunked, this.kernels); return; }
    this.waitReady();
    const ctrl = this.ctrl;
    Atomics.store(ctrl, CTRL_DONE, 0);
    Atomics.store(ctrl, CTRL_ERRORS, 0);
    const msg = this.wasm === null ? chunked : { ...chunked, base: packTask(chunked.base, this.wasm.owns) };
    for (let i = 0; i < helpers; i++) this.workers[i]!.postMessage(msg);
    let mainError: unknown = null;
    try { runChunks(chunked, this.kernels); } catch (e) { mainError = e; }
    const expected = helpers;
    for (;;) {
      const done = Atomics.load(ctrl, CTRL_DONE);
      if (done >= expected) break;
      if (Atomics.wait(ctrl, CTRL_DONE, done, TASK_TIMEOUT_MS) === 'timed-out' && Atomics.load(ctrl, CTRL_DONE) === done) {
        throw new DistilleryError(`cpu backend: a worker thread did not answer within ${TASK_TIMEOUT_MS / 1000} s`
          + (this.crashed ? `: ${this.crashed}` : ''));
      }
    }
    if (mainError !== null) throw mainError;
    if (Atomics.load(ctrl, CTRL_ERRORS) > 0) {
      const msgs: string[] = [];
      for (const p of this.ports) {
        for (let m = receiveMessageOnPort(p); m !== undefined; m = receiveMessageOnPort(p)) msgs.push(String(m.message));
      }
      throw new Error(`cpu backend: worker task failed: ${msgs.join('\n') || 'unknown error'}`);
    }
  }

  /** Terminates the workers. The pool cannot be used afterwards. */
  dispose(): void {
    for (const w of this.workers) void w.terminate();
    for (const p of this.ports) p.close();
    this.workers = [];
    this.ports = [];
  }
}
