/**
 * A Communicator over TCP through the host (see host-comm-worker.ts for the wire): the collectives block the calling
 * thread (Atomics.wait) while a worker thread does the socket I/O, so a synchronous training step can call them like
 * NCCL's. A rank that dies or hangs fails the others' next collective within `timeoutMs`, naming what happened.
 */
import { Worker } from 'node:worker_threads';
import type { Backend, Buf } from '../backend/backend.js';
import { DistilleryError } from '../util/errors.js';
import type { Communicator } from './comm.js';
import type { DistEnv } from './env.js';

export interface HostCommOptions {
  /** How long a rank waits for the others to join (ms). */
  connectTimeoutMs?: number;
  /** How long a collective may wait for the other ranks before the run stops (ms). */
  timeoutMs?: number;
}

export class HostComm implements Communicator {
  readonly rank: number;
  readonly world: number;
  private data = new SharedArrayBuffer(1 << 16);
  private readonly ctl: Int32Array;
  private closed = false;

  private constructor(private readonly worker: Worker, env: DistEnv, ctl: SharedArrayBuffer, private readonly err: SharedArrayBuffer,
    private readonly timeoutMs: number) {
    this.rank = env.rank; this.world = env.world; this.ctl = new Int32Array(ctl);
  }

  /** Joins the process group (rank 0 listens on MASTER_PORT; the others connect to MASTER_ADDR). */
  static async connect(env: DistEnv, o: HostCommOptions = {}): Promise<HostComm> {
    const connectTimeoutMs = o.connectTimeoutMs ?? 120_000;
    const ctl = new SharedArrayBuffer(8), err = new SharedArrayBuffer(4096);
    const worker = new Worker(new URL('./host-comm-worker.js', import.meta.url), {
      workerData: { rank: env.rank, world: env.world, addr: env.masterAddr, port: env.masterPort, connectTimeoutMs, ctl, err },
    });
    worker.unref();
    const c = new HostComm(worker, env, ctl, err, o.timeoutMs ?? 300_000);
    const ctlView = new Int32Array(ctl);
    const deadline = Date.now() + connectTimeoutMs + 5_000;
    while (Atomics.load(ctlView, 0) === 0) {
      if (Date.now() > deadline) throw new DistilleryError(`rank ${env.rank}: the process group did not form`, 'check MASTER_ADDR/MASTER_PORT and that every rank was started');
      await new Promise((r) => setTimeout(r, 20));
    }
    c.finish('joining the process group');
    return c;
  }

  private finish(what: string): void {
    const state = Atomics.load(this.ctl, 0);
    Atomics.store(this.ctl, 0, 0);
    if (state === 2) {
      const msg = Buffer.from(new Uint8Array(this.err, 0, this.ctl[1]!)).toString('utf8');
      throw new DistilleryError(`rank ${this.rank}: ${what} failed: ${msg}`, 'a rank stopped or lost its connection: every rank stops; continue with --resume from the last checkpoint');
    }
  }

  private run(op: string, n: number, what: string): void {
    if (this.closed) throw new DistilleryError(`rank ${this.rank}: ${what} after the communicator was closed`);
    Atomics.store(this.ctl, 0, 0);
    this.worker.postMessage({ op, data: this.data, n });
    const r = Atomics.wait(this.ctl, 0, 0, this.timeoutMs);
    if (r === 'timed-out') {
      throw new DistilleryError(`rank ${this.rank}: ${what} waited ${this.timeoutMs / 1000}s for the other ranks`,
        'a rank died or hangs: every rank stops; continue with --resume from the last checkpoint');
    }
    this.finish(what);
  }

  private room(bytes: number): void {
    if (this.data.byteLength < bytes) this.data = new SharedArrayBuffer(Math.max(bytes, this.data.byteLength * 2));
  }

  allReduceSum(be: Backend, buf: Buf, n: number): void {
    this.room(n * 4);
    const f = new Float32Array(this.data, 0, n);
    f.set(be.download(be.view(buf, 0, n)));
    this.run('allreduce', n, `summing ${n} values over ${this.world} ranks`);
    be.upload(buf, f);
  }

  allReduceHost(x: Float64Array | number[]): Float64Array {
    this.room(x.length * 8);
    const d = new Float64Array(this.data, 0, x.length);
    d.set(x);
    this.run('allreduce64', x.length, 'summing host values');
    return Float64Array.from(d);
  }

  allGather(be: Backend, buf: Buf, shard: number): void {
    const total = this.world * shard;
    this.room(total * 4);
    const f = new Float32Array(this.data, 0, total);
    const mine = Math.max(0, Math.min(shard, buf.length - this.rank * shard));
    if (mine > 0) f.set(be.download(be.view(buf, this.rank * shard, mine)), this.rank * shard);
    this.run('allgather', shard, `gathering ${this.world} shards of ${shard} values`);
    be.upload(buf, f.subarray(0, Math.min(total, buf.length)));
  }

  allGatherHost(x: Float32Array, shard: number): Float32Array {
    const total = this.world * shard;
    this.room(total * 4);
    const f = new Float32Array(this.data, 0, total);
    f.set(x.subarray(0, Math.min(shard, x.length)), this.rank * shard);
    this.run('allgather', shard, `gathering ${this.world} host shards of ${shard} values`);
    return f.slice();
  }

  broadcast(bytes: Uint8Array): Uint8Array {
    this.room(Math.max(4, bytes.length));
    // the length first (a float), then the bytes
    const len = new Float32Array(this.data, 0, 1);
    len[0] = bytes.length;
    this.run('bcast', 4, 'broadcasting from rank 0');
    const n = new Float32Array(this.data, 0, 1)[0]!;
    this.room(n);
    if (this.rank === 0) new Uint8Array(this.data).set(bytes);
    this.run('bcast', n, 'broadcasting from rank 0');
    return new Uint8Array(this.data, 0, n).slice();
  }

  barrier(): void {
    this.room(4);
    new Float32Array(this.data, 0, 1)[0] = 1;
    this.run('barrier', 1, 'waiting at a barrier');
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.worker.postMessage({ op: 'close' });
    void this.worker.terminate();
  }
}
