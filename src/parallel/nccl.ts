/**
 * The NCCL communicator (koffi bindings to libnccl.so.2, like cuBLAS's): device buffers are summed and gathered by
 * NCCL on the CUDA backend's stream, so the collectives queue behind the step's work with no host round trip; host
 * values (token counts, loss sums, the checkpoint's moments, rank 0's stop) and the exchange of NCCL's unique id go
 * through the host communicator the ranks rendezvoused with. Every process keeps NVLink multicast off
 * (NCCL_NVLS_ENABLE=0). The gather of unequal shards is one broadcast per rank inside a group (ncclGroupStart/End):
 * no padded buffer.
 *
 * The gradient buckets (reduceScatterStart) are issued on the backend's second stream as the backward pass reports
 * them, inside the captured pass (CudaBackend.sideCollective ends the graph segment there), so they overlap the rest
 * of the backward; finish()'s waits join the streams before the norm and the update read the sums.
 * DISTILLERY_GRAD_OVERLAP=0 queues them after the pass instead, on the main stream (for comparison).
 *
 * Hangs: NCCL's collectives wait on the GPU for their peers, so a rank that hangs or dies between two of them would
 * leave the others blocked in cuStreamSynchronize. The communicator installs a WaitGuard on the backend
 * (bounded-wait.ts): each host wait for the GPU polls, asks ncclCommGetAsyncError every 100 ms, and after the
 * collective timeout (DISTILLERY_COMM_TIMEOUT_S, 300 s by default, as the host communicator's) calls ncclCommAbort
 * and stops the rank with one sentence; the launcher then stops the ranks that remain. The setup is bounded too
 * (NcclComm.create): ncclCommInitRank runs under a watchdog thread (watchdog.ts) with the same timeout, and
 * NCCL_RUNTIME_CONNECT=0 (unless set) makes it open every connection there rather than lazily inside the first
 * collectives' ncclGroupEnd, where the host would block with no bound. A setup that does not finish in time ends the
 * rank with one sentence and exit code 1 (the call cannot be cancelled, and it must run on the thread whose CUDA context
 * names the GPU: koffi's async call on a worker thread gave NCCL device 0 on every rank, "invalid usage"). (A
 * non-blocking communicator, ncclConfig blocking = 0, would make every later call return ncclInProgress to be polled,
 * inside captured CUDA graphs too: not taken.)
 *
 * The default of a CUDA run of several ranks (ncclWanted: DISTILLERY_NCCL=0 moves the collectives through the host,
 * HostComm, which is correct and slow; DISTILLERY_NCCL=1 uses NCCL on one rank too).
 *
 * DISTILLERY_NCCL_TIMEOUT_S sets the GPU waits' timeout apart from the host collectives' (default: the same).
 *
 * A test hook, for the hang check of scripts/cuda/data-parallel-check.sh: DISTILLERY_TEST_SKIP_REDUCE_FROM=R:K makes
 * rank R issue no device collective from its K-th gradient bucket on (as a rank whose GPU never reaches its
 * collectives), while it goes on with everything else: its peers' NCCL collectives then wait on the GPU for ever.
 * (Skipping the buckets alone would not hang: NCCL pairs a rank's collectives with its peers' by their order on the
 * communicator, so the next gather would meet the skipped reduce.) DISTILLERY_TEST_NCCL_INIT_DELAY_S=R:S makes rank R
 * block for S seconds just before ncclCommInitRank (a rank that hangs while the communicator is set up).
 */
import koffi from 'koffi';
import type { Backend, Buf, DType } from '../backend/backend.js';
import type { CudaBackend } from '../backend/cuda/cuda-backend.js';
import { requireLibraries } from '../backend/cuda/ffi/libfind.js';
import { DistilleryError } from '../util/errors.js';
import { shardParts, type CommWork, type Communicator } from './comm.js';
import { commTimeoutMs } from './host-comm.js';
import { envSecondsMs } from './env.js';
import { runWithWatchdog, watchdogText } from './watchdog.js';

type Fn = ReturnType<ReturnType<typeof koffi.load>['func']>;

/** ncclDataType_t and ncclRedOp_t values (nccl.h). */
const NCCL_FLOAT32 = 7, NCCL_BFLOAT16 = 9, NCCL_SUM = 0;
/** ncclResult_t ncclInProgress (a non-blocking communicator's work still running). */
const NCCL_IN_PROGRESS = 7;
const ID_BYTES = 128;

let uniqueIdType: ReturnType<typeof koffi.struct> | null = null;

function ncclDtype(d: DType): number { return d === 'bf16' ? NCCL_BFLOAT16 : NCCL_FLOAT32; }

export class NcclComm implements Communicator {
  readonly rank: number;
  readonly world: number;
  private readonly f: Record<string, Fn>;
  private comm: unknown = null;

  /** The bindings only; NcclComm.create sets the communicator up. */
  private constructor(private readonly host: Communicator, private readonly be: CudaBackend) {
    process.env.NCCL_NVLS_ENABLE = '0'; // before NCCL reads its environment (ncclGetUniqueId / ncclCommInitRank)
    this.rank = host.rank; this.world = host.world;
    let l: ReturnType<typeof requireLibraries<'nccl'>>['nccl']['lib'];
    try { l = requireLibraries(['nccl']).nccl.lib; } catch (e) {
      if (!(e instanceof DistilleryError)) throw e;
      throw new DistilleryError(`rank ${this.rank}: data parallel on GPUs uses NCCL (libnccl.so.2), which was not found on this machine`,
        'install NCCL (e.g. the libnccl2 package), set DISTILLERY_CUDA_LIB_DIR to its folder, or set DISTILLERY_NCCL=0 to move the collectives through the host (slower)');
    }
    uniqueIdType ??= koffi.struct('ncclUniqueId', { internal: koffi.array('uint8', ID_BYTES) });
    this.f = {
      getVersion: l.func('int ncclGetVersion(_Out_ int *version)'),
      getUniqueId: l.func('int ncclGetUniqueId(_Out_ ncclUniqueId *id)'),
      commInitRank: l.func('int ncclCommInitRank(_Out_ void **comm, int nranks, ncclUniqueId commId, int rank)'),
      commDestroy: l.func('int ncclCommDestroy(void *comm)'),
      commAbort: l.func('int ncclCommAbort(void *comm)'),
      commGetAsyncError: l.func('int ncclCommGetAsyncError(void *comm, _Out_ int *asyncError)'),
      allReduce: l.func('int ncclAllReduce(uint64_t sendbuff, uint64_t recvbuff, size_t count, int datatype, int op, void *comm, void *stream)'),
      broadcast: l.func('int ncclBroadcast(uint64_t sendbuff, uint64_t recvbuff, size_t count, int datatype, int root, void *comm, void *stream)'),
      reduce: l.func('int ncclReduce(uint64_t sendbuff, uint64_t recvbuff, size_t count, int datatype, int op, int root, void *comm, void *stream)'),
      groupStart: l.func('int ncclGroupStart()'),
      groupEnd: l.func('int ncclGroupEnd()'),
      errorString: l.func('const char *ncclGetErrorString(int result)'),
    };
    this.overlapsRegions = process.env.DISTILLERY_GRAD_OVERLAP !== '0';
    const skip = /^(\d+):(\d+)$/.exec(process.env.DISTILLERY_TEST_SKIP_REDUCE_FROM ?? '');
    if (skip && Number(skip[1]) === this.rank) this.skipFrom = Number(skip[2]);
  }

  /**
   * The NCCL communicator of the group `host` joined (a collective: every rank calls it), set up within the GPU waits'
   * timeout (DISTILLERY_NCCL_TIMEOUT_S, else DISTILLERY_COMM_TIMEOUT_S, 300 s by default).
   */
  static async create(host: Communicator, be: CudaBackend): Promise<NcclComm> {
    const c = new NcclComm(host, be);
    process.env.NCCL_RUNTIME_CONNECT ??= '0'; // every connection inside ncclCommInitRank, where the wait is bounded
    c.init();
    return c;
  }

  private init(): void {
    let id: Uint8Array = new Uint8Array(ID_BYTES);
    if (this.rank === 0) {
      const out: { internal?: number[] | Uint8Array } = {};
      this.check(this.f.getUniqueId!(out), 'ncclGetUniqueId');
      id = Uint8Array.from(out.internal ?? []);
    }
    id = this.host.broadcast(id);
    if (id.length !== ID_BYTES) throw new DistilleryError(`rank ${this.rank}: NCCL's unique id arrived with ${id.length} bytes, not ${ID_BYTES}`);
    const delay = /^(\d+):(\d+(?:\.\d+)?)$/.exec(process.env.DISTILLERY_TEST_NCCL_INIT_DELAY_S ?? '');
    if (delay && Number(delay[1]) === this.rank) {
      process.stderr.write(`rank ${this.rank}: DISTILLERY_TEST_NCCL_INIT_DELAY_S: blocking ${delay[2]} s before ncclCommInitRank\n`);
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, Number(delay[2]) * 1000);
    }
    const gpuMs = envSecondsMs('DISTILLERY_NCCL_TIMEOUT_S');
    const timeoutMs = gpuMs ?? commTimeoutMs();
    const setting = gpuMs !== undefined ? 'DISTILLERY_NCCL_TIMEOUT_S' : 'DISTILLERY_NCCL_TIMEOUT_S or DISTILLERY_COMM_TIMEOUT_S';
    const c: unknown[] = [null];
    const rc = runWithWatchdog(() => this.f.commInitRank!(c, this.world, { internal: Array.from(id) }, this.rank) as number, timeoutMs,
      watchdogText(`rank ${this.rank}: NCCL's setup (ncclCommInitRank) did not finish within ${timeoutMs / 1000} s (a rank hangs or died while the communicator was set up)`,
        `check that every rank started and reached this point (NCCL_DEBUG=WARN tells more); ${setting} sets the timeout`));
    this.check(rc, 'ncclCommInitRank');
    this.comm = c[0];
    this.be.setWaitGuard({
      who: `rank ${this.rank}`,
      timeoutMs,
      setting,
      poll: () => this.asyncError(),
      abort: () => this.abort(),
    });
  }

  /** Gradient buckets start inside the captured pass, on the backend's second stream (DISTILLERY_GRAD_OVERLAP=0: after it). */
  readonly overlapsRegions: boolean;
  /** The test hook's first skipped bucket (DISTILLERY_TEST_SKIP_REDUCE_FROM), 0: none. */
  private skipFrom = 0;
  private buckets = 0;
  private skipping = false;

  /** NCCL's asynchronous error of the communicator, named, or null (none, or still in progress). */
  private asyncError(): string | null {
    if (this.comm === null) return 'the communicator was aborted';
    const st = [0];
    const rc = this.f.commGetAsyncError!(this.comm, st) as number;
    const code = rc !== 0 ? rc : st[0]!;
    if (code === 0 || code === NCCL_IN_PROGRESS) return null;
    return `${String(this.f.errorString?.(code) ?? `error ${code}`)} (ncclResult ${code})`;
  }

  /** ncclCommAbort: the communicator's kernels leave the streams; close() then has nothing left to do. */
  private abort(): void {
    this.failed = true;
    if (this.comm === null) return;
    const c = this.comm;
    this.comm = null;
    this.f.commAbort!(c);
  }

  /** NCCL's version, e.g. 22605 for 2.26.5. */
  version(): number {
    const v = [0];
    this.check(this.f.getVersion!(v), 'ncclGetVersion');
    return v[0]!;
  }

  /** Set once a call failed: close() then aborts (ncclCommAbort) instead of waiting for work that cannot finish. */
  private failed = false;

  private check(rc: number, call: string): void {
    if (rc === 0) return;
    this.failed = true;
    const why = String(this.f.errorString?.(rc) ?? `error ${rc}`);
    throw new DistilleryError(`rank ${this.rank}: ${call} failed: ${why} (ncclResult ${rc})`,
      'set NCCL_DEBUG=WARN for NCCL\'s own account; every rank stops; continue with --resume from the last checkpoint');
  }

  allReduceSum(_be: Backend, buf: Buf, n: number): void {
    if (this.skipping) return;
    const o = this.be.collectiveOperand(buf);
    this.check(this.f.allReduce!(o.ptr, o.ptr, n, ncclDtype(o.dtype), NCCL_SUM, this.comm, o.stream), 'ncclAllReduce');
  }

  allGather(_be: Backend, buf: Buf, shard: number): void {
    if (this.skipping) return;
    // rank r's shard [r·shard, min(len, (r+1)·shard)) broadcast from r, all in one group (unequal last shard, in place)
    this.perRank(shardParts(0, buf.length, shard, this.world), 'ncclBroadcast', (r, begin, count) => {
      const o = this.be.collectiveOperand(buf, begin);
      return this.f.broadcast!(o.ptr, o.ptr, count, ncclDtype(o.dtype), r, this.comm, o.stream) as number;
    });
  }

  reduceScatterStart(_be: Backend, buf: Buf, begin: number, end: number, shard: number): CommWork {
    if (this.skipFrom > 0 && ++this.buckets === this.skipFrom) {
      process.stderr.write(`rank ${this.rank}: DISTILLERY_TEST_SKIP_REDUCE_FROM: no device collective issued from gradient bucket ${this.skipFrom} on\n`);
      this.skipping = true;
    }
    if (this.skipping) return { wait(): void {} };
    // the part of the range inside rank r's shard summed into rank r (in place), one reduce per rank in one group
    const reduce = (stream: unknown): void => this.perRank(shardParts(begin, end, shard, this.world), 'ncclReduce', (r, from, count) => {
      const o = this.be.collectiveOperand(buf, from);
      return this.f.reduce!(o.ptr, o.ptr, count, ncclDtype(o.dtype), NCCL_SUM, r, this.comm, stream) as number;
    });
    if (!this.overlapsRegions) {
      // on the backend's stream, after the pass: the work queued after it (the norm, the update) sees the sums
      reduce(this.be.collectiveOperand(buf).stream);
      return { wait(): void {} };
    }
    // on the second stream, beside the rest of the backward; waiting joins the main stream to it (no host wait)
    this.be.sideCollective('reducing a gradient bucket', reduce);
    return { wait: (): void => this.be.joinSide() };
  }

  /** One call per rank's non-empty part [from, to), inside ncclGroupStart/End (closed whatever happened inside). */
  private perRank(parts: Array<[number, number]>, call: string, one: (r: number, from: number, count: number) => number): void {
    this.check(this.f.groupStart!(), 'ncclGroupStart');
    let rc = 0;
    try {
      for (let r = 0; r < this.world && rc === 0; r++) {
        const [from, to] = parts[r]!;
        if (to > from) rc = one(r, from, to - from);
      }
    } finally {
      const end = this.f.groupEnd!() as number;
      this.check(rc, call);
      this.check(end, 'ncclGroupEnd');
    }
  }

  allReduceHost(x: Float64Array | number[]): Float64Array { return this.host.allReduceHost(x); }
  allGatherHost(x: Float32Array, shard: number): Float32Array { return this.host.allGatherHost(x, shard); }
  broadcast(bytes: Uint8Array): Uint8Array { return this.host.broadcast(bytes); }
  barrier(timeoutMs?: number): void { this.host.barrier(timeoutMs); }

  close(failed = false): void {
    if (failed) this.failed = true;
    this.be.setWaitGuard(null);
    if (this.comm !== null) {
      (this.failed ? this.f.commAbort! : this.f.commDestroy!)(this.comm);
      this.comm = null;
    }
  }
}
