/**
 * The worker thread of BackgroundCheckpoints (src/train/checkpoint-writer.ts; started by the supervisor thread,
 * src/train/checkpoint-supervisor.ts, which passes the run's jobs on): writes each checkpoint it is sent with
 * writeLatest (or maps in the pages of host arrays), posts the result on its port, then counts it in the shared flag and
 * wakes the run waiting in join(). Whatever fails, the job is answered (an error escaping the handler too), so a join
 * never waits for a job the worker dropped.
 */
import { parentPort, type MessagePort } from 'node:worker_threads';
import { PREFAULT_STEP, prefault, writeFailure, writeLatest, type WorkerMessage, type WriteResult } from './checkpoint-writer.js';
import type { ResumeWriter } from './student-files.js';

let writer: ResumeWriter | null = null, port: MessagePort | null = null, flag: Int32Array | null = null, delayMs = 0, crashOnJob = false;
/** The step of the job being handled (answered by the uncaught-exception handler if the handler itself throws). */
let current: number | null = null;

function answer(result: WriteResult): void {
  current = null;
  port!.postMessage(result);
  Atomics.add(flag!, 0, 1);
  Atomics.notify(flag!, 0);
}

process.on('uncaughtException', (e) => { if (current !== null && port && flag) answer(writeFailure(current, e)); });

parentPort!.on('message', (msg: WorkerMessage) => {
  if ('writer' in msg) { writer = msg.writer; port = msg.port; flag = msg.flag; delayMs = msg.delayMs; crashOnJob = msg.crashOnJob; return; }
  if (crashOnJob) process.exit(7); // tests: a writer that dies with a job in flight (the thread ends, not the process)
  const step = current = 'checkpoint' in msg ? msg.checkpoint.step : PREFAULT_STEP;
  if (delayMs > 0) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, delayMs);
  let result: WriteResult;
  const t0 = process.hrtime.bigint();
  try {
    if ('checkpoint' in msg) writeLatest(msg.checkpoint, writer!);
    else prefault(msg.prefault);
    result = { ok: true, step, seconds: Number(process.hrtime.bigint() - t0) / 1e9 };
  } catch (e) {
    result = writeFailure(step, e);
  }
  answer(result);
});
