/**
 * A Communicator over TCP through the host (see host-comm-worker.ts for the wire): the collectives block the calling
 * thread (Atomics.wait) while a worker thread does the socket I/O, so a synchronous training step can call them like
 * NCCL's. A rank that dies or hangs fails the others' next collective within `timeoutMs`, naming what happened.
 * The gradient reduction (reduceScatterStart) is the exception: it hands the worker a copy of the range and returns, so
 * the sockets carry one bucket while the backward pass computes the next; its wait() blocks as the others do.
 */
import { Worker } from 'node:worker_threads';
import type { Backend, Buf } from '../backend/backend.js';
import { DistilleryError } from '../util/errors.js';
import { shardParts, type CommWork, type Communicator } from './comm.js';
import { envSecondsMs, type DistEnv } from './env.js';

export interface HostCommOptions {
  /** How long a rank waits for the others to join (ms). */
  connectTimeoutMs?: number;
  /** How long a collective may wait for the other ranks before the run stops (ms; default DISTILLERY_COMM_TIMEOUT_S, else 300 s). */
  timeoutMs?: number;
}

/** Elements per frame of a large collective (frames carry a 32-bit length; 256 MB of float32 per piece). */
const CHUNK = 1 << 26;

/** Elements of each rank's shard per piece of a gather: rank 0's answer (every rank's piece) stays within one frame. */
export function gatherPieceElements(world: number): number {
  return Math.max(1, Math.floor(CHUNK / world));
}

/** The collective timeout: DISTILLERY_COMM_TIMEOUT_S seconds, else 300. */
export function commTimeoutMs(env: NodeJS.ProcessEnv = process.env): number {
  return envSecondsMs('DISTILLERY_COMM_TIMEOUT_S', env) ?? 300_000;
}

export class HostComm implements Communicator {
  readonly rank: number;
  readonly world: number;
  private data = new SharedArrayBuffer(1 << 16);
  private readonly ctl: Int32Array;
  private closed = false;
  /** A collective waited out its timeout: the worker is stuck behind it, so close() ends it at once. */
  private timedOut = false;

  private constructor(private readonly worker: Worker, env: DistEnv, ctl: SharedArrayBuffer, private readonly err: SharedArrayBuffer,
    private readonly timeoutMs: number) {
    this.rank = env.rank; this.world = env.world; this.ctl = new Int32Array(ctl);
  }

  /** Joins the process group (rank 0 listens on the group's port; the others connect to MASTER_ADDR). */
  static async connect(env: DistEnv, o: HostCommOptions = {}): Promise<HostComm> {
    const connectTimeoutMs = o.connectTimeoutMs ?? 120_000;
    const ctl = new SharedArrayBuffer(8), err = new SharedArrayBuffer(4096);
    const worker = new Worker(new URL('./host-comm-worker.js', import.meta.url), {
      workerData: { rank: env.rank, world: env.world, addr: env.masterAddr, port: env.commPort, connectTimeoutMs, ctl, err },
    });
    worker.unref();
    const c = new HostComm(worker, env, ctl, err, o.timeoutMs ?? commTimeoutMs());
    const ctlView = new Int32Array(ctl);
    const deadline = Date.now() + connectTimeoutMs + 5_000;
    while (Atomics.load(ctlView, 0) === 0) {
      if (Date.now() > deadline) throw new DistilleryError(`rank ${env.rank}: the process group did not form`, 'check MASTER_ADDR/MASTER_PORT and that every rank was started');
      await new Promise((r) => setTimeout(r, 20));
    }
    c.finish('joining the process group');
    return c;
  }

  private finish(what: string, ctl: Int32Array = this.ctl): void {
    const state = Atomics.load(ctl, 0);
    Atomics.store(ctl, 0, 0);
    if (state === 2) {
      const msg = Buffer.from(new Uint8Array(this.err, 0, ctl[1]!)).toString('utf8');
      throw new DistilleryError(`rank ${this.rank}: ${what} failed: ${msg}`, 'a rank stopped, lost its connection or ran other steps: every rank stops; continue with --resume from the last checkpoint');
    }
  }

  private run(op: string, n: number, what: string, timeoutMs = this.timeoutMs): void {
    this.post({ op, data: this.data, n }, this.ctl, what);
    this.await(this.ctl, what, timeoutMs);
  }

  /** Queues an operation on the worker; it reports on `ctl` (state: 0 queued, 1 done, 2 failed; [1] the error's length). */
  private post(msg: Record<string, unknown>, ctl: Int32Array, what: string): void {
    if (this.closed) throw new DistilleryError(`rank ${this.rank}: ${what} after the communicator was closed`);
    Atomics.store(ctl, 0, 0);
    this.worker.postMessage(ctl === this.ctl ? msg : { ...msg, ctl: ctl.buffer });
  }

  private await(ctl: Int32Array, what: string, timeoutMs = this.timeoutMs): void {
    const r = Atomics.wait(ctl, 0, 0, timeoutMs);
    if (r === 'timed-out') {
      this.timedOut = true;
      const msg = this.abortGroup(`rank ${this.rank}: ${what} waited ${timeoutMs / 1000}s for the other ranks`);
      throw new DistilleryError(msg, 'a rank died or hangs: every rank stops; continue with --resume from the last checkpoint (DISTILLERY_COMM_TIMEOUT_S sets the wait)');
    }
    this.finish(what, ctl);
  }

  /**
   * After a timeout on rank 0: its worker, stuck behind the collective, first tells the ranks still connected why the
   * group stops (and which rank did not answer), so they report that rather than rank 0's disconnection.
   */
  private abortGroup(reason: string): string {
    if (this.rank !== 0) return reason;
    const ack = new Int32Array(new SharedArrayBuffer(8));
    this.worker.postMessage({ op: 'abort', reason, ctl: ack.buffer });
    // the worker answers with the reason as sent (naming the rank it waited for) in the error bytes
    if (Atomics.wait(ack, 0, 0, 5_000) === 'timed-out' || Atomics.load(ack, 0) !== 2) return reason;
    return Buffer.from(new Uint8Array(this.err, 0, ack[1]!)).toString('utf8');
  }

  private room(bytes: number): void {
    if (this.data.byteLength < bytes) this.data = new SharedArrayBuffer(Math.max(bytes, Math.min(this.data.byteLength * 2, CHUNK * 8)));
  }

  allReduceSum(be: Backend, buf: Buf, n: number): void {
    // the CPU backend's float64 reference mode sums in float64
    const wide = be.dtype === 'f64';
    for (let off = 0; off < n; off += CHUNK) {
      const k = Math.min(CHUNK, n - off);
      this.room(k * (wide ? 8 : 4));
      const f = wide ? new Float64Array(this.data, 0, k) : new Float32Array(this.data, 0, k);
      f.set(be.download(be.view(buf, off, k)));
      this.run(wide ? 'allreduce64' : 'allreduce', k, `summing ${n} values over ${this.world} ranks`);
      be.upload(buf, f, off);
    }
  }

  reduceScatterStart(be: Backend, buf: Buf, begin: number, end: number, shard: number): CommWork {
    // f64 (the CPU backend's reference mode) sums in float64; f32 sums in float64 and rounds once, as allReduceSum does
    // A range over CHUNK values goes piece by piece, each completed before the next is copied (one piece of host
    // memory at a time), but the last, which is left in flight.
    const wide = be.dtype === 'f64';
    let pending: (() => void) | null = null;
    for (let off = begin; off < end; off += CHUNK) {
      pending?.();
      const k = Math.min(CHUNK, end - off);
      const data = new SharedArrayBuffer(k * (wide ? 8 : 4));
      (wide ? new Float64Array(data) : new Float32Array(data)).set(be.download(be.view(buf, off, k)));
      const parts = shardParts(off, off + k, shard, this.world).map(([a, b]) => [a - off, b - off]);
      const ctl = new Int32Array(new SharedArrayBuffer(8)), what = `reducing ${end - begin} gradient values over ${this.world} ranks`;
      this.post({ op: wide ? 'reducescatter64' : 'reducescatter', data, n: k, parts }, ctl, what);
      pending = (): void => {
        this.await(ctl, what);
        const [a, b] = parts[this.rank]!;
        if (b > a) be.upload(buf, (wide ? new Float64Array(data) : new Float32Array(data)).subarray(a, b), off + a);
      };
    }
    const last = pending;
    let waited = false;
    return { wait: (): void => { if (!waited) { waited = true; last?.(); } } };
  }

  allReduceHost(x: Float64Array | number[]): Float64Array {
    this.room(x.length * 8);
    const d = new Float64Array(this.data, 0, x.length);
    d.set(x);
    this.run('allreduce64', x.length, 'summing host values');
    return Float64Array.from(d);
  }

  /** Gathers every rank's `shard` elements (from `mine`) into `out` (world × shard), a piece of each shard at a time. */
  private gather(mine: (off: number, k: number) => ArrayLike<number>, shard: number, out: (r: number, off: number, piece: Float32Array) => void, what: string): void {
    const piece = gatherPieceElements(this.world);
    for (let off = 0; off < shard; off += piece) {
      const k = Math.min(piece, shard - off);
      this.room(this.world * k * 4);
      const f = new Float32Array(this.data, 0, this.world * k);
      f.set(mine(off, k), this.rank * k);
      this.run('allgather', k, what);
      for (let r = 0; r < this.world; r++) out(r, off, f.subarray(r * k, (r + 1) * k));
    }
  }

  allGather(be: Backend, buf: Buf, shard: number): void {
    const len = buf.length;
    const mineOf = (off: number, k: number): ArrayLike<number> => {
      const begin = this.rank * shard + off, m = Math.max(0, Math.min(k, len - begin));
      const part = new Float32Array(k);
      if (m > 0) part.set(be.download(be.view(buf, begin, m)));
      return part;
    };
    this.gather(mineOf, shard, (r, off, piece) => {
      const begin = r * shard + off, m = Math.max(0, Math.min(piece.length, len - begin));
      if (r !== this.rank && m > 0) be.upload(buf, piece.subarray(0, m), begin);
    }, `gathering ${this.world} shards of ${shard} values`);
  }

  allGatherHost(x: Float32Array, shard: number): Float32Array {
    const out = new Float32Array(this.world * shard);
    this.gather((off, k) => {
      const part = new Float32Array(k);
      part.set(x.subarray(Math.min(off, x.length), Math.min(off + k, x.length)));
      return part;
    }, shard, (r, off, piece) => out.set(piece, r * shard + off), `gathering ${this.world} host shards of ${shard} values`);
    return out;
  }

  broadcast(bytes: Uint8Array): Uint8Array {
    // the length first (a float64: exact), then the bytes
    this.room(8);
    new Float64Array(this.data, 0, 1)[0] = bytes.length;
    this.run('bcast', 8, 'broadcasting from rank 0');
    const n = new Float64Array(this.data, 0, 1)[0]!;
    this.room(Math.max(1, n));
    if (this.rank === 0) new Uint8Array(this.data).set(bytes);
    if (n > 0) this.run('bcast', n, 'broadcasting from rank 0');
    return new Uint8Array(this.data, 0, n).slice();
  }

  barrier(timeoutMs?: number): void {
    this.room(4);
    new Float32Array(this.data, 0, 1)[0] = 1;
    this.run('barrier', 1, 'waiting at a barrier', timeoutMs);
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.timedOut) { void this.worker.terminate(); return; }
    // end the sockets gracefully: results still queued for the other ranks are delivered before this process goes
    Atomics.store(this.ctl, 0, 0);
    this.worker.postMessage({ op: 'close' });
    Atomics.wait(this.ctl, 0, 0, 60_000);
    void this.worker.terminate();
  }
}
