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
    if (process.env.COMM_CASE === 'hang' && r === 1) { await new Promise((res) => setTimeout(res, 8000)); process.exit(3); } // one that hangs
    if (process.env.COMM_CASE === 'reducescatter') {
      // three reductions of unaligned ranges in flight at once, a blocking collective queued behind them, waited in
      // reverse order; each rank checks its shard against allReduceSum of the same values (f32) and float64 sums (f64)
      const n = 1003, shard = Math.ceil(n / env.world), val = (i: number, k: number): number => ((i * 13 + k * 7) % 101) * 0.37 + k;
      const buf = be.alloc(n, 'g'), ref = be.alloc(n, 'ref');
      const mine = Float32Array.from({ length: n }, (_, i) => val(i, r));
      be.upload(buf, mine); be.upload(ref, mine);
      const works = [comm.reduceScatterStart(be, buf, 900, 1003, shard), comm.reduceScatterStart(be, buf, 400, 900, shard)];
      const host = comm.allReduceHost([r + 1])[0]!;
      works.push(comm.reduceScatterStart(be, buf, 0, 400, shard));
      for (const w of works.reverse()) w.wait();
      comm.allReduceSum(be, ref, n);
      const got = be.download(buf), want = be.download(ref), lo = r * shard, hi = Math.min(n, lo + shard);
      let wrong32 = 0;
      for (let i = lo; i < hi; i++) if (got[i] !== want[i]) wrong32++;
      const be64 = createCpuBackend({ threads: 1, dtype: 'f64' });
      const b64 = be64.alloc(n, 'g64');
      be64.upload(b64, Float64Array.from({ length: n }, (_, i) => val(i, r) / 3));
      comm.reduceScatterStart(be64, b64, 0, n, shard).wait();
      const g64 = be64.download(b64);
      let wrong64 = 0;
      for (let i = lo; i < hi; i++) {
        let s = val(i, 0) / 3;
        for (let k = 1; k < env.world; k++) s += val(i, k) / 3;
        if (g64[i] !== s) wrong64++;
      }
      be64.dispose();
      process.stdout.write(JSON.stringify({ rank: r, host, wrong32, wrong64, checked: hi - lo }) + '\n');
    } else if (process.env.COMM_CASE === 'big') {
      // two large sums back to back (bigger than the socket buffers), then the same on the float64 reference backend
      const n = 4_000_003, buf = be.alloc(n, 'big');
      let wrong32 = 0, wrong64 = 0;
      for (const round of [1, 2]) {
        be.upload(buf, Float32Array.from({ length: n }, (_, i) => ((i * 7 + r * 3 + round) % 1000) * 0.5));
        comm.allReduceSum(be, buf, n);
        const got = be.download(buf);
        for (let i = 0; i < n; i++) {
          let want = 0;
          for (let k = 0; k < env.world; k++) want += ((i * 7 + k * 3 + round) % 1000) * 0.5;
          if (got[i] !== want) wrong32++;
        }
      }
      const be64 = createCpuBackend({ threads: 1, dtype: 'f64' });
      const m = 100_001, b64 = be64.alloc(m, 'x64');
      be64.upload(b64, Float64Array.from({ length: m }, (_, i) => 1 / 3 + i * 1e-12 + r));
      comm.allReduceSum(be64, b64, m);
      const g64 = be64.download(b64);
      for (let i = 0; i < m; i++) {
        let want = 0;
        for (let k = 0; k < env.world; k++) want += 1 / 3 + i * 1e-12 + k;
        if (Math.abs(g64[i]! - want) > 1e-15 * want) wrong64++;
      }
      be64.dispose();
      process.stdout.write(JSON.stringify({ rank: r, n, wrong32, wrong64 }) + '\n');
    } else {
    if (process.env.COMM_CASE === 'diverge') comm.allReduceHost(r === 1 ? [1, 2] : [1, 2, 3]); // rank 1 runs another step
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
    }
  } catch (e) {
    const t0 = Date.now();
    if (process.env.COMM_CASE === 'hang') comm.close(); // after a timeout: at once, not behind the stuck collective
    process.stdout.write(JSON.stringify({ rank: r, error: (e as Error).message, closeMs: Date.now() - t0 }) + '\n');
    process.exitCode = 1;
  } finally {
    comm.close();
    be.dispose();
  }
}
