/**
 * The NCCL communicator (koffi bindings to libnccl.so.2, like cuBLAS's): device buffers are summed and gathered by
 * NCCL on the CUDA backend's stream, so the collectives queue behind the step's work with no host round trip; host
 * values (token counts, loss sums, the checkpoint's moments, rank 0's stop) and the exchange of NCCL's unique id go
 * through the host communicator the ranks rendezvoused with. Every process keeps NVLink multicast off
 * (NCCL_NVLS_ENABLE=0). The gather of unequal shards is one broadcast per rank inside a group (ncclGroupStart/End):
 * no padded buffer.
 *
 * The default of a CUDA run of several ranks (ncclWanted: DISTILLERY_NCCL=0 moves the collectives through the host,
 * HostComm, which is correct and slow; DISTILLERY_NCCL=1 uses NCCL on one rank too). Not yet: a timeout on NCCL's own collectives (a peer that dies
 * between two of them leaves the others waiting in NCCL; ncclCommGetAsyncError polling is to come).
 */
import koffi from 'koffi';
import type { Backend, Buf, DType } from '../backend/backend.js';
import type { CudaBackend } from '../backend/cuda/cuda-backend.js';
import { requireLibraries } from '../backend/cuda/ffi/libfind.js';
import { DistilleryError } from '../util/errors.js';
import { shardParts, type CommWork, type Communicator } from './comm.js';

type Fn = ReturnType<ReturnType<typeof koffi.load>['func']>;

/** ncclDataType_t and ncclRedOp_t values (nccl.h). */
const NCCL_FLOAT32 = 7, NCCL_BFLOAT16 = 9, NCCL_SUM = 0;
const ID_BYTES = 128;

let uniqueIdType: ReturnType<typeof koffi.struct> | null = null;

function ncclDtype(d: DType): number { return d === 'bf16' ? NCCL_BFLOAT16 : NCCL_FLOAT32; }

export class NcclComm implements Communicator {
  readonly rank: number;
  readonly world: number;
  private readonly f: Record<string, Fn>;
  private comm: unknown = null;

  /** Creates the NCCL communicator of the group `host` joined (a collective: every rank calls it). */
  constructor(private readonly host: Communicator, private readonly be: CudaBackend) {
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
      allReduce: l.func('int ncclAllReduce(uint64_t sendbuff, uint64_t recvbuff, size_t count, int datatype, int op, void *comm, void *stream)'),
      broadcast: l.func('int ncclBroadcast(uint64_t sendbuff, uint64_t recvbuff, size_t count, int datatype, int root, void *comm, void *stream)'),
      reduce: l.func('int ncclReduce(uint64_t sendbuff, uint64_t recvbuff, size_t count, int datatype, int op, int root, void *comm, void *stream)'),
      groupStart: l.func('int ncclGroupStart()'),
      groupEnd: l.func('int ncclGroupEnd()'),
      errorString: l.func('const char *ncclGetErrorString(int result)'),
    };
    let id: Uint8Array = new Uint8Array(ID_BYTES);
    if (this.rank === 0) {
      const out: { internal?: number[] | Uint8Array } = {};
      this.check(this.f.getUniqueId!(out), 'ncclGetUniqueId');
      id = Uint8Array.from(out.internal ?? []);
    }
    id = this.host.broadcast(id);
    if (id.length !== ID_BYTES) throw new DistilleryError(`rank ${this.rank}: NCCL's unique id arrived with ${id.length} bytes, not ${ID_BYTES}`);
    const c: unknown[] = [null];
    this.check(this.f.commInitRank!(c, this.world, { internal: Array.from(id) }, this.rank), 'ncclCommInitRank');
    this.comm = c[0];
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
    const o = this.be.collectiveOperand(buf);
    this.check(this.f.allReduce!(o.ptr, o.ptr, n, ncclDtype(o.dtype), NCCL_SUM, this.comm, o.stream), 'ncclAllReduce');
  }

  allGather(_be: Backend, buf: Buf, shard: number): void {
    // rank r's shard [r·shard, min(len, (r+1)·shard)) broadcast from r, all in one group (unequal last shard, in place)
    this.perRank(shardParts(0, buf.length, shard, this.world), 'ncclBroadcast', (r, begin, count) => {
      const o = this.be.collectiveOperand(buf, begin);
      return this.f.broadcast!(o.ptr, o.ptr, count, ncclDtype(o.dtype), r, this.comm, o.stream) as number;
    });
  }

  reduceScatterStart(_be: Backend, buf: Buf, begin: number, end: number, shard: number): CommWork {
    // the part of the range inside rank r's shard summed into rank r (in place), one reduce per rank in one group; on
    // the backend's stream, so the work queued after it (the norm, the update) sees the sums: nothing to wait for here
    this.perRank(shardParts(begin, end, shard, this.world), 'ncclReduce', (r, from, count) => {
      const o = this.be.collectiveOperand(buf, from);
      return this.f.reduce!(o.ptr, o.ptr, count, ncclDtype(o.dtype), NCCL_SUM, r, this.comm, o.stream) as number;
    });
    return { wait(): void {} };
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

  close(): void {
    if (this.comm !== null) {
      (this.failed ? this.f.commAbort! : this.f.commDestroy!)(this.comm);
      this.comm = null;
    }
  }
}
