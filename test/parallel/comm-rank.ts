/**
 * One rank of the multi-process tests (test/parallel/*.test.ts spawn it with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):
 * joins the group over HostComm and runs the collectives COMM_CASE names, printing one JSON line. Run without
 * WORLD_SIZE (as `node --test dist/test/` does with every file) it does nothing.
 */
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { distEnv } from '../../src/parallel/env.js';
import { HostComm } from '../../src/parallel/host-comm.js';

const env = distEnv();
if (env) {
  const comm = await HostComm.connect(env, { connectTimeoutMs: 20_000, timeoutMs: Number(process.env.COMM_TIMEOUT_MS ?? 20_000) });
  const be = createCpuBackend({ threads: 1 });
  const r = env.rank;
  try {
    if (process.env.COMM_CASE === 'die' && r === 1) process.exit(3); // a rank that dies after joining
    const host = Array.from(comm.allReduceHost([r, 0.1 * (r + 1), 1e15 + r]));
    const n = 1003, buf = be.alloc(n, 'x');
    be.upload(buf, Float32Array.from({ length: n }, (_, i) => (i % 7) * 0.25 + r));
    comm.allReduceSum(be, buf, n);
    const summed = Array.from(be.download(buf)).slice(0, 9);
    const shard = 5, g = be.alloc(shard * env.world - 2, 'g');
    be.upload(g, Float32Array.from({ length: g.length }, (_, i) => (Math.floor(i / shard) === r ? 100 * r + i : -1)));
    comm.allGather(be, g, shard);
    const gathered = Array.from(be.download(g));
    const b = comm.broadcast(r === 0 ? new TextEncoder().encode('from rank 0: ' + 'x'.repeat(70_000)) : new Uint8Array(0));
    comm.barrier();
    process.stdout.write(JSON.stringify({ rank: r, host, summed, gathered, bcast: new TextDecoder().decode(b).slice(0, 20), bcastLength: b.length }) + '\n');
  } catch (e) {
    process.stdout.write(JSON.stringify({ rank: r, error: (e as Error).message }) + '\n');
    process.exitCode = 1;
  } finally {
    comm.close();
    be.dispose();
  }
}
