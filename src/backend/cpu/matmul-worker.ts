/**
 * Worker-thread entry of the CPU backend's pool (see pool.ts). Despite its name it runs every task kind of
 * tasks.ts (matrix products, attention, loss rows), claiming chunks of a ChunkedTask until none is left, over SharedArrayBuffer-backed arrays posted by the main
 * thread. In f32 mode it gets the backend's shared WebAssembly.Memory and compiled kernel module once, in
 * workerData, and instantiates the WASM kernels over that memory. After each task it bumps the shared done counter and notifies the main thread, which is blocked in
 * Atomics.wait; a failure is reported through a MessagePort the main thread reads synchronously.
 */
import { parentPort, workerData, type MessagePort } from 'node:worker_threads';
import { runChunks, unpackTask, type ChunkedTask } from './tasks.js';
import { GemmKernels, type WasmMemory, type WasmModule } from './wasm.js';

interface WorkerInit { ctrl: Int32Array; index: number; errPort: MessagePort; wasm: { module: WasmModule; memory: WasmMemory } | null }

const { ctrl, index, errPort, wasm } = workerData as WorkerInit;
/** The WASM kernels over the backend's shared memory (f32 mode), instantiated once from the posted module. */
const kernels = wasm === null ? null : new GemmKernels(wasm.module, wasm.memory);
const CTRL_DONE = 0, CTRL_ERRORS = 1, CTRL_READY = 2;

if (parentPort === null) throw new Error('matmul-worker.js must run in a worker thread');
parentPort.on('message', (task: ChunkedTask) => {
  try {
    runChunks(wasm === null ? task : { ...task, base: unpackTask(task.base, wasm.memory) }, kernels);
  } catch (e) {
    errPort.postMessage(e instanceof Error ? (e.stack ?? e.message) : String(e));
    Atomics.add(ctrl, CTRL_ERRORS, 1);
  }
  Atomics.add(ctrl, CTRL_DONE, 1);
  Atomics.notify(ctrl, CTRL_DONE);
});
Atomics.store(ctrl, CTRL_READY + index, 1);
Atomics.notify(ctrl, CTRL_READY + index);
