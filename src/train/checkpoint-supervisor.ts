/**
 * The supervisor thread of BackgroundCheckpoints (src/train/checkpoint-writer.ts): starts the writer thread
 * (src/train/checkpoint-worker.ts) as its own child and passes the run's jobs on to it (buffers transferred again, never
 * copied). When the writer stops (its 'exit' or 'error' event: killed, out of memory in its heap), the supervisor says
 * why on its port, marks the shared flag (flag[1] = 1) and wakes the run. The run cannot watch the writer itself while
 * it waits: join() blocks its thread, so its own event loop, where the writer's 'exit' event would arrive, does not run
 * until the wait ends; this thread's loop does, since it never blocks.
 */
import { Worker, parentPort } from 'node:worker_threads';
import { transferables, type SupervisorMessage } from './checkpoint-writer.js';

let child: Worker | null = null;

parentPort!.on('message', (msg: SupervisorMessage) => {
  if ('writer' in msg) {
    const { flag, deadPort } = msg;
    const w = child = new Worker(new URL('./checkpoint-worker.js', import.meta.url));
    let told = false;
    const dead = (why: string): void => {
      if (told) return;
      told = true;
      deadPort.postMessage(why);
      Atomics.store(flag, 1, 1);
      Atomics.notify(flag, 0);
    };
    w.on('error', (e) => dead(e instanceof Error ? e.message : String(e)));
    w.on('exit', (code) => dead(`it exited (code ${code})`));
    w.postMessage({ writer: msg.writer, port: msg.port, flag, delayMs: msg.delayMs, crashOnJob: msg.crashOnJob }, [msg.port]);
    return;
  }
  child!.postMessage(msg, transferables(msg));
});
