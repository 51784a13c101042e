/**
 * A bound on a blocking native call that cannot be cancelled or moved off the calling thread (ncclCommInitRank: NCCL
 * takes the GPU from the calling thread's CUDA context, so it must run on the main thread, which it then blocks while it
 * waits for its peers). A watchdog thread waits beside it; if the call has not returned by the deadline, the watchdog
 * writes the error as the CLI prints one (`error: ...` and `  hint: ...`, straight to file descriptor 2: the blocked
 * main thread cannot relay it) and ends the process with exit code 1 (`_exit`, bound through koffi before the wait,
 * from the watchdog's own thread; SIGKILL where koffi could not be loaded). Nothing is lost by that: it guards set-up,
 * before any training state exists.
 *
 * The handover is one compare-and-swap on a shared flag (0 armed, 1 returned, 2 fired): whichever side swaps first
 * wins. A call that returns after the watchdog fired never goes on (its thread waits until the process ends), so nothing
 * runs after the error was printed.
 */
import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';

const WATCHDOG = `
const { workerData } = require('node:worker_threads');
const fs = require('node:fs');
let exit = null;
try { exit = require(workerData.koffi).load('libc.so.6').func('void _exit(int)'); } catch {}
const flag = new Int32Array(workerData.flag);
if (Atomics.wait(flag, 0, 0, workerData.ms) === 'timed-out' && Atomics.compareExchange(flag, 0, 0, 2) === 0) {
  const text = Buffer.from(workerData.text);
  for (let off = 0, tries = 0; off < text.length && tries < 1000; tries++) {
    try { off += fs.writeSync(2, text, off); } catch { Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1); }
  }
  if (exit) exit(1); else process.kill(process.pid, 'SIGKILL');
}
`;

/** What the watchdog prints at the deadline (the CLI's two lines). */
export function watchdogText(message: string, hint: string): string {
  return `error: ${message}\n  hint: ${hint}\n`;
}

/**
 * Runs `fn` (synchronous, on this thread) under a watchdog: returns its result (or rethrows its error), or, if it has
 * not returned within `timeoutMs`, the process ends with exit code 1 after `text` is written to standard error. A
 * watchdog that cannot start leaves the call unbounded, as it was without one.
 */
export function runWithWatchdog<T>(fn: () => T, timeoutMs: number, text: string): T {
  const flag = new Int32Array(new SharedArrayBuffer(4));
  try {
    const koffi = createRequire(import.meta.url).resolve('koffi');
    // CommonJS whatever the process was started with (execArgv: [] drops an inherited --input-type=module)
    const worker = new Worker(WATCHDOG, { eval: true, execArgv: [], workerData: { flag: flag.buffer, ms: timeoutMs, text, koffi } });
    worker.on('error', () => {}); // a watchdog that failed leaves the call unbounded; it never fails the run
    worker.unref();
  } catch { /* no watchdog: the call is unbounded, as it was without one */ }
  const disarm = (): void => {
    if (Atomics.compareExchange(flag, 0, 0, 1) !== 0) {
      for (;;) Atomics.wait(flag, 0, 2); // the watchdog fired: it is ending the process
    }
    Atomics.notify(flag, 0); // the watchdog wakes and ends by itself (not terminate(): it may be loading koffi)
  };
  try {
    return fn();
  } finally {
    disarm();
  }
}
