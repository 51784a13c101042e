/**
 * The socket side of HostComm (host-comm.ts), in a worker thread so that the training loop's collectives can block
 * (Atomics.wait) while this thread's event loop does the I/O. Star topology through rank 0: rank 0 listens on the
 * group's port, every other rank connects and says its rank; a collective sends each rank's part to rank 0, which
 * combines them in rank order (deterministic) and sends the result back.
 *
 * Frames: u32 payload length, u8 operation, then the payload. Rank 0 checks that every rank's frame is the collective it
 * is running, with the size it expects: ranks that diverged (another collective, another length) stop with an error
 * instead of mixing data. Rank 0 sends results from a private copy, never from the shared buffer the main thread
 * refills as soon as the collective returns. A reduce-scatter (the gradient buckets) comes with its own data and report
 * word, so the main thread can queue several and go on computing: every rank sends its whole range, rank 0 sums in rank
 * order and sends each rank back only the part inside its shard. A peer that disconnects fails the collective in progress (and every later
 * one) with its rank named. Closing ends the sockets gracefully (queued results are delivered first).
 */
import * as net from 'node:net';
import { parentPort, workerData } from 'node:worker_threads';

type OpName = 'allreduce' | 'allreduce64' | 'allgather' | 'bcast' | 'barrier' | 'reducescatter' | 'reducescatter64';
interface Init { rank: number; world: number; addr: string; port: number; connectTimeoutMs: number }
/** `parts` (reduce-scatter): per rank, the [from, to) of the range it gets back; `ctl`: the operation's own report word. */
interface Op { op: OpName; data: SharedArrayBuffer; n: number; parts?: Array<[number, number]>; ctl?: SharedArrayBuffer }

const OP_CODE: Record<OpName, number> = { allreduce: 1, allreduce64: 2, allgather: 3, bcast: 4, barrier: 5, reducescatter: 6, reducescatter64: 7 };
const HELLO = 0;
/** Rank 0's last word when the group fails: the reason, so every rank reports the root cause, not a closed socket. */
const ABORT = 9;

const init = workerData as Init & { ctl: SharedArrayBuffer; err: SharedArrayBuffer };
const ctl = new Int32Array(init.ctl);
const errBytes = new Uint8Array(init.err);

interface Frame { op: number; payload: Buffer }

/** Frames arriving on one socket, handed out in order (chunks kept in a list: no quadratic re-concatenation). */
class FrameReader {
  private chunks: Buffer[] = [];
  private have = 0;
  private readonly frames: Frame[] = [];
  private waiting: { resolve: (f: Frame) => void; reject: (e: Error) => void } | null = null;
  private dead: Error | null = null;
  constructor(readonly sock: net.Socket, public who: string) {
    sock.on('data', (d: Buffer) => {
      this.chunks.push(d); this.have += d.length;
      for (;;) {
        if (this.have < 5) break;
        const head = this.peek(5);
        const len = head.readUInt32LE(0);
        if (this.have < 5 + len) break;
        const op = this.take(5, Buffer.alloc(5))[4]!;
        // the payload in its own ArrayBuffer at offset 0: typed-array views of it are aligned
        this.push({ op, payload: this.take(len, Buffer.from(new ArrayBuffer(len))) });
      }
    });
    const fail = (why: string): void => {
      if (this.dead) return;
      this.dead = new Error(`${this.who} ${why}`);
      if (this.waiting) { this.waiting.reject(this.dead); this.waiting = null; }
    };
    sock.on('close', () => fail('disconnected (its process ended or lost the connection)'));
    sock.on('error', (e) => {
      const code = (e as NodeJS.ErrnoException).code;
      fail(code === 'ECONNRESET' || code === 'EPIPE' || code === 'ERR_SOCKET_CLOSED' || /ended by the other party/.test(e.message)
        ? 'disconnected (its process ended or lost the connection)' : `failed: ${e.message}`);
    });
  }
  /** The first n buffered bytes, without consuming them. */
  private peek(n: number): Buffer {
    if (this.chunks[0]!.length >= n) return this.chunks[0]!.subarray(0, n);
    return Buffer.concat(this.chunks, Math.min(this.have, Math.max(n, 0))).subarray(0, n);
  }
  /** Consumes n bytes into `out`. */
  private take(n: number, out: Buffer): Buffer {
    let off = 0;
    while (off < n) {
      const c = this.chunks[0]!, k = Math.min(c.length, n - off);
      c.copy(out, off, 0, k);
      off += k;
      if (k === c.length) this.chunks.shift(); else this.chunks[0] = c.subarray(k);
    }
    this.have -= n;
    return out;
  }
  private push(f: Frame): void {
    if (this.waiting) { const w = this.waiting; this.waiting = null; w.resolve(f); } else this.frames.push(f);
  }
  next(): Promise<Frame> {
    const f = this.frames.shift();
    if (f) return Promise.resolve(f);
    if (this.dead) return Promise.reject(this.dead);
    return new Promise((resolve, reject) => { this.waiting = { resolve, reject }; });
  }
}

/** Writes one frame; `flushed` runs once the socket has handed it to the system. */
function send(sock: net.Socket, op: number, payload: Uint8Array, flushed?: () => void): void {
  const h = Buffer.alloc(5);
  h.writeUInt32LE(payload.length, 0);
  h[4] = op;
  sock.write(h);
  sock.write(payload, flushed);
}

/** Rank 0: a reader per peer, by rank. Others: the reader of the connection to rank 0. */
let peers: Array<FrameReader | null> = [];
let toRoot: FrameReader | null = null;

async function rendezvous(): Promise<void> {
  const { rank, world, addr, port, connectTimeoutMs } = init;
  if (rank === 0) {
    peers = Array.from({ length: world }, () => null);
    const server = net.createServer();
    await new Promise<void>((resolve, reject) => { server.once('error', reject); server.listen(port, () => resolve()); });
    let joined = 0;
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`rank 0: only ${joined} of ${world - 1} ranks joined within ${connectTimeoutMs / 1000}s on port ${port}`)), connectTimeoutMs);
      server.on('connection', (sock) => {
        sock.setNoDelay(true);
        const r = new FrameReader(sock, 'a connecting process');
        // a connection that closes without a hello (a port scan, a health check) is ignored
        r.next().then((hello) => {
          const who = hello.op === HELLO && hello.payload.length === 4 ? hello.payload.readInt32LE(0) : -1;
          if (who < 1 || who >= world || peers[who]) {
            sock.destroy();
            clearTimeout(timer);
            reject(new Error(`rank 0: a process announced itself as rank ${who} (WORLD_SIZE ${world}), which is already taken or out of range`));
            return;
          }
          r.who = `rank ${who}`;
          peers[who] = r;
          joined++;
          if (joined === world - 1) { clearTimeout(timer); server.close(); resolve(); }
        }, () => { /* closed before saying who it is */ });
      });
    });
    // everyone is here: tell each rank so (its connect loop ends)
    for (let r = 1; r < world; r++) send(peers[r]!.sock, HELLO, Buffer.from([1]));
    return;
  }
  const deadline = Date.now() + connectTimeoutMs;
  for (;;) {
    try {
      const sock = await new Promise<net.Socket>((resolve, reject) => {
        const s = net.connect({ host: addr, port }, () => resolve(s));
        s.once('error', reject);
      });
      sock.setNoDelay(true);
      toRoot = new FrameReader(sock, 'rank 0');
      const hello = Buffer.alloc(4); hello.writeInt32LE(rank, 0);
      send(sock, HELLO, hello);
      await toRoot.next(); // the ack once all ranks joined
      return;
    } catch (e) {
      if (toRoot) throw e;
      if (Date.now() > deadline) throw new Error(`rank ${rank}: could not reach rank 0 at ${addr}:${port} within ${connectTimeoutMs / 1000}s (${(e as Error).message})`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

/** The bytes each rank contributes to a collective of n elements (rank 0 checks what arrives against it). */
function contribution(op: OpName, n: number): number {
  return op === 'allreduce64' || op === 'reducescatter64' ? n * 8 : op === 'bcast' ? 0 : n * 4;
}

/** Rank 0: the rank whose part of a collective it is waiting for (named when the group is aborted). */
let awaiting: number | null = null;

async function fromPeer(r: number, o: Op): Promise<Buffer> {
  awaiting = r;
  const f = await peers[r]!.next();
  awaiting = null;
  const want = contribution(o.op, o.n);
  if (f.op !== OP_CODE[o.op] || f.payload.length !== want) {
    const name = Object.entries(OP_CODE).find(([, c]) => c === f.op)?.[0] ?? `operation ${f.op}`;
    throw new Error(`rank ${r} is out of step: it sent ${name} of ${f.payload.length} bytes while rank 0 runs ${o.op} of ${want} bytes`);
  }
  return f.payload;
}

async function collective(o: Op): Promise<void> {
  const { rank, world } = init;
  const code = OP_CODE[o.op];
  const bytes = new Uint8Array(o.data);
  if (rank === 0) {
    if (o.op === 'reducescatter' || o.op === 'reducescatter64') {
      // sum in rank order (float64, rounded once for float32), then each rank gets the part inside its shard
      const wide = o.op === 'reducescatter64';
      const mine = wide ? new Float64Array(o.data, 0, o.n) : new Float32Array(o.data, 0, o.n);
      const acc = Float64Array.from(mine);
      for (let r = 1; r < world; r++) {
        const p = await fromPeer(r, o);
        const x = wide ? new Float64Array(p.buffer, p.byteOffset, o.n) : new Float32Array(p.buffer, p.byteOffset, o.n);
        for (let i = 0; i < o.n; i++) acc[i]! += x[i]!;
      }
      mine.set(acc);
      for (let r = 1; r < world; r++) {
        const [a, b] = o.parts![r]!;
        send(peers[r]!.sock, code, new Uint8Array(mine.slice(a, b).buffer)); // a private copy
      }
    } else if (o.op === 'allreduce' || o.op === 'barrier') {
      const f = new Float32Array(o.data, 0, o.n);
      const acc = Float64Array.from(f);
      for (let r = 1; r < world; r++) {
        const p = await fromPeer(r, o);
        const x = new Float32Array(p.buffer, p.byteOffset, p.length / 4);
        for (let i = 0; i < o.n; i++) acc[i]! += x[i]!;
      }
      const out = Buffer.from(Float32Array.from(acc).buffer); // a private copy: the shared buffer is refilled at once
      for (let r = 1; r < world; r++) send(peers[r]!.sock, code, out);
      f.set(new Float32Array(out.buffer, out.byteOffset, o.n));
    } else if (o.op === 'allreduce64') {
      const d = new Float64Array(o.data, 0, o.n);
      for (let r = 1; r < world; r++) {
        const p = await fromPeer(r, o);
        const x = new Float64Array(p.buffer, p.byteOffset, p.length / 8);
        for (let i = 0; i < o.n; i++) d[i]! += x[i]!;
      }
      const out = Buffer.from(new Uint8Array(o.data, 0, o.n * 8));
      for (let r = 1; r < world; r++) send(peers[r]!.sock, code, out);
    } else if (o.op === 'allgather') {
      for (let r = 1; r < world; r++) bytes.set(await fromPeer(r, o), r * o.n * 4);
      const out = Buffer.from(new Uint8Array(o.data, 0, world * o.n * 4));
      for (let r = 1; r < world; r++) send(peers[r]!.sock, code, out);
    } else {
      for (let r = 1; r < world; r++) await fromPeer(r, o); // every rank is at this broadcast
      const out = Buffer.from(new Uint8Array(o.data, 0, o.n));
      for (let r = 1; r < world; r++) send(peers[r]!.sock, code, out);
    }
    return;
  }
  const root = toRoot!;
  // a non-root rank's part leaves from the shared buffer, which the main thread leaves alone until rank 0 has answered
  if (o.op === 'reducescatter' || o.op === 'reducescatter64') {
    const size = o.op === 'reducescatter64' ? 8 : 4, [a, b] = o.parts![rank]!;
    send(root.sock, code, new Uint8Array(o.data, 0, o.n * size));
    const f = await root.next();
    if (f.op === ABORT) throw new Error(`rank 0 stopped the group: ${f.payload.toString('utf8')}`);
    if (f.op !== code || f.payload.length !== (b - a) * size) throw new Error(`rank ${rank} is out of step with rank 0 (it answered another collective)`);
    bytes.set(f.payload, a * size);
    return;
  }
  if (o.op === 'allreduce' || o.op === 'barrier') send(root.sock, code, new Uint8Array(o.data, 0, o.n * 4));
  else if (o.op === 'allreduce64') send(root.sock, code, new Uint8Array(o.data, 0, o.n * 8));
  else if (o.op === 'allgather') send(root.sock, code, new Uint8Array(o.data, rank * o.n * 4, o.n * 4));
  else send(root.sock, code, new Uint8Array(0));
  const f = await root.next();
  if (f.op === ABORT) throw new Error(`rank 0 stopped the group: ${f.payload.toString('utf8')}`);
  if (f.op !== code) throw new Error(`rank ${rank} is out of step with rank 0 (it answered another collective)`);
  bytes.set(f.payload, 0);
}

/** Reports an operation's end on its report word (the shared one, or the operation's own). */
function done(error: string | null, to: Int32Array = ctl): void {
  if (error !== null) {
    const b = Buffer.from(error, 'utf8').subarray(0, errBytes.length);
    errBytes.set(b); to[1] = b.length;
  }
  Atomics.store(to, 0, error === null ? 1 : 2);
  Atomics.notify(to, 0);
}

/** Ends every socket after its queued writes (the last results reach the other ranks), then reports closed. */
async function closeAll(): Promise<void> {
  const socks = [...peers.filter((p): p is FrameReader => p !== null).map((p) => p.sock), ...(toRoot ? [toRoot.sock] : [])];
  await Promise.all(socks.map((s) => new Promise<void>((resolve) => {
    if (s.destroyed) { resolve(); return; }
    const t = setTimeout(() => { s.destroy(); resolve(); }, 30_000);
    s.end(() => { clearTimeout(t); resolve(); });
  })));
  Atomics.store(ctl, 0, 3);
  Atomics.notify(ctl, 0);
}

let broken: string | null = null;
let queue = Promise.resolve();
/** The report words of the operations queued and not yet reported (a failure of this thread reports on all of them). */
const pending = new Set<Int32Array>();
parentPort!.on('message', (o: Op | { op: 'close' } | { op: 'abort'; reason: string; ctl: SharedArrayBuffer }) => {
  if (o.op === 'close') {
    queue = queue.then(closeAll);
    return;
  }
  if (o.op === 'abort') {
    // at once, not behind the collective that timed out: the reason to every rank still connected, flushed, then the ack
    const why = `${o.reason}${awaiting !== null ? ` (rank ${awaiting} did not answer)` : ''}`;
    broken = why;
    const open = peers.filter((p): p is FrameReader => p !== null && !p.sock.destroyed);
    void Promise.all(open.map((p) => new Promise<void>((resolve) => {
      try { send(p.sock, ABORT, Buffer.from(why, 'utf8'), () => resolve()); } catch { resolve(); }
    }))).then(() => done(why, new Int32Array(o.ctl))); // reported as an error: the main thread reads the reason back
    return;
  }
  const to = o.ctl ? new Int32Array(o.ctl) : ctl;
  pending.add(to);
  queue = queue.then(async () => {
    if (broken !== null) { done(broken, to); return; }
    try { await collective(o); done(null, to); } catch (e) {
      broken = (e as Error).message;
      // rank 0 tells the ranks still connected why the group stops (they would only see a closed socket)
      if (init.rank === 0) for (const p of peers) if (p && !p.sock.destroyed) { try { send(p.sock, ABORT, Buffer.from(broken, 'utf8')); } catch { /* gone too */ } }
      done(broken, to);
    }
  }).finally(() => pending.delete(to));
});

// a failure of this thread itself must wake the main thread, never leave it waiting out its timeout
function failAll(why: string): void {
  broken = `the communication thread failed: ${why}`;
  for (const w of pending) done(broken, w);
  pending.clear();
  done(broken);
}
process.on('uncaughtException', (e) => failAll(e.message));
process.on('unhandledRejection', (e) => failAll((e as Error)?.message ?? String(e)));

rendezvous().then(() => done(null), (e: Error) => { broken = e.message; done(broken); });
