/**
 * A bound on a blocking native call that cannot be cancelled or moved off the calling thread (ncclCommInitRank: NCCL
 * takes the GPU from the calling thread's CUDA context, so it must run on the main thread, which it then blocks while it
 * waits for its peers). A watchdog thread waits beside it; if the call has not returned by the deadline, the watchdog
 * writes the error as the CLI prints one (`error: ...` and `  hint: ...`, straight to file descriptor 2: the blocked
 * main thread cannot relay it) and ends the process with exit code 1 (`_exit`, through koffi, from the watchdog's own
 * thread). Nothing is lost by that: it guards set-up, before any training state exists.
 */
import { Worker } from 'node:worker_threads';

const WATCHDOG = `
const { workerData } = require('node:worker_threads');
const fs = require('node:fs');
const flag = new Int32Array(workerData.flag);
if (Atomics.wait(flag, 0, 0, workerData.ms) === 'timed-out' && Atomics.load(flag, 0) === 0) {
  fs.writeSync(2, workerData.text);
  let exited = false;
  try { require(workerData.koffi).load('libc.so.6').func('void _exit(int)')(1); exited = true; } catch {}
  if (!exited) process.kill(process.pid, 'SIGKILL');
}
`;

/** What the watchdog prints at the deadline (the CLI's two lines). */
export function watchdogText(message: string, hint: string): string {
  return `error: ${message}\n  hint: ${hint}\n`;
}

/**
 * Runs `fn` (synchronous, on this thread) under a watchdog: returns its result, or, if it has not returned within
 * `timeoutMs`, the process ends with exit code 1 after `text` is written to standard error.
 */
export function runWithWatchdog<T>(fn: () => T, timeoutMs: number, text: string): T {
  const flag = new SharedArrayBuffer(4);
  const koffi = import.meta.resolve('koffi');
  // CommonJS whatever the process was started with (execArgv: [] drops an inherited --input-type=module)
  const worker = new Worker(WATCHDOG, { eval: true, execArgv: [], workerData: { flag, ms: timeoutMs, text, koffi: new URL(koffi).pathname } });
  worker.on('error', () => {}); // a watchdog that could not start leaves the call unbounded, as before; it never fails the run
  worker.unref();
  try {
    return fn();
  } finally {
    const f = new Int32Array(flag);
    Atomics.store(f, 0, 1);
    Atomics.notify(f, 0);
    void worker.terminate();
  }
}
