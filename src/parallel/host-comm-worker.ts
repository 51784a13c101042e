/**
 * The socket side of HostComm (host-comm.ts), in a worker thread so that the training loop's collectives can block
 * (Atomics.wait) while this thread's event loop does the I/O. Star topology through rank 0: rank 0 listens on
 * MASTER_PORT, every other rank connects and says its rank; a collective sends each rank's part to rank 0, which
 * combines them in rank order (deterministic) and sends the result back. Frames: u32 length, then the payload.
 * A peer that disconnects fails the collective in progress (and every later one) with its rank named.
 */
import * as net from 'node:net';
import { parentPort, workerData } from 'node:worker_threads';

interface Init { rank: number; world: number; addr: string; port: number; connectTimeoutMs: number }
interface Op { op: 'allreduce' | 'allreduce64' | 'allgather' | 'bcast' | 'barrier'; data: SharedArrayBuffer; n: number }

const init = workerData as Init & { ctl: SharedArrayBuffer; err: SharedArrayBuffer };
const ctl = new Int32Array(init.ctl);
const errBytes = new Uint8Array(init.err);

/** Frames arriving on one socket, handed out in order. */
class FrameReader {
  private buf: Buffer = Buffer.alloc(0);
  private readonly frames: Buffer[] = [];
  private waiting: { resolve: (b: Buffer) => void; reject: (e: Error) => void } | null = null;
  private dead: Error | null = null;
  constructor(readonly sock: net.Socket, public who: string) {
    sock.on('data', (d: Buffer) => {
      this.buf = this.buf.length ? Buffer.concat([this.buf, d]) : d;
      while (this.buf.length >= 4) {
        const len = this.buf.readUInt32LE(0);
        if (this.buf.length < 4 + len) break;
        this.push(this.buf.subarray(4, 4 + len));
        this.buf = this.buf.subarray(4 + len);
      }
    });
    const fail = (why: string): void => {
      if (this.dead) return;
      this.dead = new Error(`${this.who} ${why}`);
      if (this.waiting) { this.waiting.reject(this.dead); this.waiting = null; }
    };
    sock.on('close', () => fail('disconnected (its process ended or lost the connection)'));
    sock.on('error', (e) => fail(`failed: ${e.message}`));
  }
  private push(f: Buffer): void {
    const copy = Buffer.from(f);
    if (this.waiting) { const w = this.waiting; this.waiting = null; w.resolve(copy); } else this.frames.push(copy);
  }
  next(): Promise<Buffer> {
    const f = this.frames.shift();
    if (f) return Promise.resolve(f);
    if (this.dead) return Promise.reject(this.dead);
    return new Promise((resolve, reject) => { this.waiting = { resolve, reject }; });
  }
}

function send(sock: net.Socket, payload: Uint8Array): void {
  const h = Buffer.alloc(4);
  h.writeUInt32LE(payload.length, 0);
  sock.write(h);
  sock.write(payload);
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
        const r = new FrameReader(sock, 'a rank');
        void r.next().then((hello) => {
          const who = hello.readInt32LE(0);
          if (who < 1 || who >= world || peers[who]) { sock.destroy(); reject(new Error(`rank 0: a process announced itself as rank ${who} (WORLD_SIZE ${world}), which is already taken or out of range`)); return; }
          r.who = `rank ${who}`;
          peers[who] = r;
          joined++;
          if (joined === world - 1) { clearTimeout(timer); server.close(); resolve(); }
        }, reject);
      });
    });
    // everyone is here: tell each rank so (its connect loop ends)
    for (let r = 1; r < world; r++) send(peers[r]!.sock, Buffer.from([1]));
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
      send(sock, hello);
      await toRoot.next(); // the ack once all ranks joined
      return;
    } catch (e) {
      if (toRoot) throw e;
      if (Date.now() > deadline) throw new Error(`rank ${rank}: could not reach rank 0 at ${addr}:${port} within ${connectTimeoutMs / 1000}s (${(e as Error).message})`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

async function collective(o: Op): Promise<void> {
  const { rank, world } = init;
  const f = new Float32Array(o.data);
  const bytes = new Uint8Array(o.data);
  if (rank === 0) {
    if (o.op === 'allreduce' || o.op === 'barrier') {
      const acc = Float64Array.from(f.subarray(0, o.n));
      for (let r = 1; r < world; r++) {
        const p = await peers[r]!.next();
        const x = new Float32Array(p.buffer, p.byteOffset, p.length / 4);
        for (let i = 0; i < o.n; i++) acc[i]! += x[i]!;
      }
      for (let i = 0; i < o.n; i++) f[i] = acc[i]!;
      const out = new Uint8Array(f.buffer, 0, o.n * 4);
      for (let r = 1; r < world; r++) send(peers[r]!.sock, out);
    } else if (o.op === 'allreduce64') {
      const d = new Float64Array(o.data, 0, o.n);
      for (let r = 1; r < world; r++) {
        const p = await peers[r]!.next();
        const x = new Float64Array(p.buffer, p.byteOffset, p.length / 8);
        for (let i = 0; i < o.n; i++) d[i]! += x[i]!;
      }
      const out = new Uint8Array(o.data, 0, o.n * 8);
      for (let r = 1; r < world; r++) send(peers[r]!.sock, out);
    } else if (o.op === 'allgather') {
      for (let r = 1; r < world; r++) {
        const p = await peers[r]!.next();
        bytes.set(p, r * o.n * 4);
      }
      const out = new Uint8Array(o.data, 0, world * o.n * 4);
      for (let r = 1; r < world; r++) send(peers[r]!.sock, out);
    } else {
      const out = new Uint8Array(o.data, 0, o.n);
      for (let r = 1; r < world; r++) send(peers[r]!.sock, out);
    }
    return;
  }
  const root = toRoot!;
  if (o.op === 'allreduce' || o.op === 'barrier') {
    send(root.sock, new Uint8Array(o.data, 0, o.n * 4));
    const p = await root.next();
    bytes.set(p, 0);
  } else if (o.op === 'allreduce64') {
    send(root.sock, new Uint8Array(o.data, 0, o.n * 8));
    const p = await root.next();
    bytes.set(p, 0);
  } else if (o.op === 'allgather') {
    send(root.sock, new Uint8Array(o.data, rank * o.n * 4, o.n * 4));
    const p = await root.next();
    bytes.set(p, 0);
  } else {
    const p = await root.next();
    bytes.set(p, 0);
  }
}

function done(error: string | null): void {
  if (error !== null) {
    const b = Buffer.from(error.slice(0, errBytes.length / 2), 'utf8');
    errBytes.set(b.subarray(0, errBytes.length)); ctl[1] = Math.min(b.length, errBytes.length);
  }
  Atomics.store(ctl, 0, error === null ? 1 : 2);
  Atomics.notify(ctl, 0);
}

let broken: string | null = null;
let queue = Promise.resolve();
parentPort!.on('message', (o: Op | { op: 'close' }) => {
  if (o.op === 'close') {
    for (const p of peers) p?.sock.destroy();
    toRoot?.sock.destroy();
    parentPort!.close();
    return;
  }
  queue = queue.then(async () => {
    if (broken !== null) { done(broken); return; }
    try { await collective(o); done(null); } catch (e) { broken = (e as Error).message; done(broken); }
  });
});

rendezvous().then(() => done(null), (e: Error) => { broken = e.message; done(broken); });
