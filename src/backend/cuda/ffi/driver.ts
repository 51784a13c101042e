/**
 * CUDA driver API bindings (koffi, libcuda.so.1). Device pointers are bigint (CUdeviceptr, 64-bit).
 * Every call is checked: a non-zero CUresult becomes a CudaError naming the code (cuGetErrorName), the call
 * and what we were doing. Work is ordered on one stream the backend creates (`useStream`): launches, async copies and
 * memsets, events, and the CUDA graphs captured from it (stream capture, instantiate, launch).
 */
import koffi from 'koffi';
import { CUDA_ERROR_FALLBACK, CudaError, formatBytes, hintFor } from './status.js';
import type { FoundLib } from './libfind.js';
import { boundedWait, type WaitGuard } from '../bounded-wait.js';

type Fn = ReturnType<ReturnType<typeof koffi.load>['func']>;

const ATTR_CC_MAJOR = 75;
/** CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (cuda.h). */
const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
/** CUfunction_attribute CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES and CU_FUNC_ATTRIBUTE_NUM_REGS (cuda.h). */
const CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3, CU_FUNC_ATTRIBUTE_NUM_REGS = 4;
const ATTR_CC_MINOR = 76;
/** CUdevice_attribute CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT (cuda.h). */
const ATTR_SM_COUNT = 16;

export class CudaDriver {
  private readonly f: Record<string, Fn>;
  readonly device: number;
  readonly ccMajor: number;
  readonly ccMinor: number;
  /** Streaming multiprocessors (a grid's waves are its blocks over this times the blocks an SM holds: occupancy()). */
  readonly smCount: number;
  readonly deviceName: string;
  private ctx: unknown = null;

  constructor(found: FoundLib, ordinal = 0) {
    const l = found.lib;
    this.f = {
      init: l.func('int cuInit(unsigned int flags)'),
      getErrorName: l.func('int cuGetErrorName(int error, _Out_ const char **str)'),
      deviceGet: l.func('int cuDeviceGet(_Out_ int *dev, int ordinal)'),
      deviceGetCount: l.func('int cuDeviceGetCount(_Out_ int *count)'),
      deviceGetAttribute: l.func('int cuDeviceGetAttribute(_Out_ int *value, int attrib, int dev)'),
      deviceGetName: l.func('int cuDeviceGetName(_Out_ uint8_t *name, int len, int dev)'),
      primaryCtxRetain: l.func('int cuDevicePrimaryCtxRetain(_Out_ void **ctx, int dev)'),
      primaryCtxRelease: l.func('int cuDevicePrimaryCtxRelease_v2(int dev)'),
      ctxSetCurrent: l.func('int cuCtxSetCurrent(void *ctx)'),
      ctxSynchronize: l.func('int cuCtxSynchronize()'),
      memAlloc: l.func('int cuMemAlloc_v2(_Out_ uint64_t *dptr, size_t bytes)'),
      memFree: l.func('int cuMemFree_v2(uint64_t dptr)'),
      memcpyHtoD: l.func('int cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t bytes)'),
      memcpyDtoH: l.func('int cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t bytes)'),
      memcpyDtoD: l.func('int cuMemcpyDtoD_v2(uint64_t dst, uint64_t src, size_t bytes)'),
      memsetD32: l.func('int cuMemsetD32_v2(uint64_t dst, unsigned int value, size_t n)'),
      memsetD8: l.func('int cuMemsetD8_v2(uint64_t dst, unsigned char value, size_t n)'),
      memGetInfo: l.func('int cuMemGetInfo_v2(_Out_ size_t *free, _Out_ size_t *total)'),
      moduleLoadData: l.func('int cuModuleLoadData(_Out_ void **module, const void *image)'),
      moduleUnload: l.func('int cuModuleUnload(void *module)'),
      moduleGetFunction: l.func('int cuModuleGetFunction(_Out_ void **fn, void *module, const char *name)'),
      eventCreate: l.func('int cuEventCreate(_Out_ void **ev, unsigned int flags)'),
      eventRecord: l.func('int cuEventRecord(void *ev, void *stream)'),
      eventElapsedTime: l.func('int cuEventElapsedTime(_Out_ float *ms, void *start, void *end)'),
      eventDestroy: l.func('int cuEventDestroy_v2(void *ev)'),
      funcSetAttribute: l.func('int cuFuncSetAttribute(void *hfunc, int attrib, int value)'),
      funcGetAttribute: l.func('int cuFuncGetAttribute(_Out_ int *value, int attrib, void *hfunc)'),
      occupancy: l.func('int cuOccupancyMaxActiveBlocksPerMultiprocessor(_Out_ int *numBlocks, void *func, int blockSize, size_t dynamicSMemSize)'),
      launchKernel: l.func('int cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, void *stream, void *params, void *extra)'),
      streamCreate: l.func('int cuStreamCreate(_Out_ void **stream, unsigned int flags)'),
      streamDestroy: l.func('int cuStreamDestroy_v2(void *stream)'),
      streamSynchronize: l.func('int cuStreamSynchronize(void *stream)'),
      memcpyHtoDAsync: l.func('int cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t bytes, void *stream)'),
      memcpyDtoHAsync: l.func('int cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t bytes, void *stream)'),
      memcpyDtoDAsync: l.func('int cuMemcpyDtoDAsync_v2(uint64_t dst, uint64_t src, size_t bytes, void *stream)'),
      // the same copy into page-locked host memory given by address (hostAlloc): returns at once
      memcpyDtoHAsyncPinned: l.func('int cuMemcpyDtoHAsync_v2(uint64_t dst, uint64_t src, size_t bytes, void *stream)'),
      // from page-locked host memory given by address (hostAlloc): returns at once, the DMA reads the bytes later
      memcpyHtoDAsyncPinned: l.func('int cuMemcpyHtoDAsync_v2(uint64_t dst, uint64_t src, size_t bytes, void *stream)'),
      memAllocHost: l.func('int cuMemAllocHost_v2(_Out_ void **pp, size_t bytes)'),
      memFreeHost: l.func('int cuMemFreeHost(void *p)'),
      memsetD32Async: l.func('int cuMemsetD32Async(uint64_t dst, unsigned int value, size_t n, void *stream)'),
      memsetD8Async: l.func('int cuMemsetD8Async(uint64_t dst, unsigned char value, size_t n, void *stream)'),
      eventRecordWithFlags: l.func('int cuEventRecordWithFlags(void *ev, void *stream, unsigned int flags)'),
      eventSynchronize: l.func('int cuEventSynchronize(void *ev)'),
      eventQuery: l.func('int cuEventQuery(void *ev)'),
      streamWaitEvent: l.func('int cuStreamWaitEvent(void *stream, void *ev, unsigned int flags)'),
      streamBeginCapture: l.func('int cuStreamBeginCapture_v2(void *stream, int mode)'),
      streamEndCapture: l.func('int cuStreamEndCapture(void *stream, _Out_ void **graph)'),
      graphInstantiate: l.func('int cuGraphInstantiateWithFlags(_Out_ void **exec, void *graph, unsigned long long flags)'),
      graphLaunch: l.func('int cuGraphLaunch(void *exec, void *stream)'),
      graphExecDestroy: l.func('int cuGraphExecDestroy(void *exec)'),
      graphDestroy: l.func('int cuGraphDestroy(void *graph)'),
    };
    this.check(this.f.init!(0), 'cuInit', 'initializing the CUDA driver');
    const count = [0];
    this.check(this.f.deviceGetCount!(count), 'cuDeviceGetCount', 'counting GPUs');
    if ((count[0] ?? 0) <= ordinal) throw new CudaError(100, 'CUDA_ERROR_NO_DEVICE', 'cuDeviceGet', `opening GPU ${ordinal}`, hintFor('CUDA_ERROR_NO_DEVICE'));
    const dev = [0];
    this.check(this.f.deviceGet!(dev, ordinal), 'cuDeviceGet', `opening GPU ${ordinal}`);
    this.device = dev[0]!;
    const a = [0];
    this.check(this.f.deviceGetAttribute!(a, ATTR_CC_MAJOR, this.device), 'cuDeviceGetAttribute', 'reading the compute capability');
    this.ccMajor = a[0]!;
    this.check(this.f.deviceGetAttribute!(a, ATTR_CC_MINOR, this.device), 'cuDeviceGetAttribute', 'reading the compute capability');
    this.ccMinor = a[0]!;
    this.check(this.f.deviceGetAttribute!(a, ATTR_SM_COUNT, this.device), 'cuDeviceGetAttribute', 'counting the GPU\'s multiprocessors');
    this.smCount = a[0]!;
    const nameBuf = Buffer.alloc(256);
    this.check(this.f.deviceGetName!(nameBuf, 256, this.device), 'cuDeviceGetName', 'reading the GPU name');
    this.deviceName = nameBuf.toString('utf8').replace(/\0.*$/s, '');
    const ctx: unknown[] = [null];
    this.check(this.f.primaryCtxRetain!(ctx, this.device), 'cuDevicePrimaryCtxRetain', 'creating the CUDA context');
    this.ctx = ctx[0];
    this.check(this.f.ctxSetCurrent!(this.ctx), 'cuCtxSetCurrent', 'making the CUDA context current');
  }

  /** 'sm_90' for an H100. */
  get arch(): string { return `sm_${this.ccMajor}${this.ccMinor}`; }

  errorName(rc: number): string {
    const out: unknown[] = [null];
    try {
      if (this.f.getErrorName!(rc, out) === 0 && typeof out[0] === 'string') return out[0];
    } catch { /* fall through */ }
    return CUDA_ERROR_FALLBACK[rc] ?? `CUDA_ERROR_${rc}`;
  }

  check(rc: number, call: string, context: string, hint?: string): void {
    if (rc === 0) return;
    const name = this.errorName(rc);
    throw new CudaError(rc, name, call, context, hint ?? hintFor(name));
  }

  memAlloc(bytes: number, context: string): bigint {
    const p = [0n];
    this.check(this.f.memAlloc!(p, Math.max(4, bytes)), `cuMemAlloc(${formatBytes(bytes)})`, context);
    return BigInt(p[0]!);
  }
  memFree(ptr: bigint): void { this.check(this.f.memFree!(ptr), 'cuMemFree', 'freeing device memory'); }
  /** The stream every op below is ordered on (null: the legacy default stream, before useStream). */
  private stream: unknown = null;

  /** Creates the backend's stream (non-blocking: nothing on the legacy stream orders against it) and uses it from now on. */
  useStream(): void {
    const st: unknown[] = [null];
    this.check(this.f.streamCreate!(st, 1 /* CU_STREAM_NON_BLOCKING */), 'cuStreamCreate', 'creating the CUDA stream');
    this.stream = st[0];
  }
  /** The stream (for cuBLAS's cublasSetStream). */
  get currentStream(): unknown { return this.stream; }
  destroyStream(): void {
    if (this.side !== null) {
      const side = this.side;
      this.side = null;
      this.check(this.f.streamDestroy!(side), 'cuStreamDestroy', 'destroying the side stream');
      for (const ev of [this.forkEvent, this.joinEvent]) this.check(this.f.eventDestroy!(ev), 'cuEventDestroy', 'destroying a side-stream event');
    }
    if (this.syncEvent !== null) { const ev = this.syncEvent; this.syncEvent = null; this.check(this.f.eventDestroy!(ev), 'cuEventDestroy', 'destroying the wait event'); }
    if (this.stream === null) return;
    const st = this.stream;
    this.stream = null;
    this.check(this.f.streamDestroy!(st), 'cuStreamDestroy', 'destroying the CUDA stream');
  }

  /** Host to device, ordered on the stream; the host bytes are consumed before the call returns (pageable memory is staged). */
  htod(dst: bigint, src: ArrayBufferView, bytes: number, context: string): void {
    this.check(this.f.memcpyHtoDAsync!(dst, src, bytes, this.stream), `cuMemcpyHtoDAsync(${formatBytes(bytes)})`, context);
  }
  /** Page-locked host memory of `bytes` (at least 4): the pointer (for hostFree), its address and an ArrayBuffer over it. */
  hostAlloc(bytes: number, context: string): { ptr: unknown; addr: bigint; buffer: ArrayBuffer } {
    const p: unknown[] = [null];
    const n = Math.max(4, bytes);
    this.check(this.f.memAllocHost!(p, n), `cuMemAllocHost(${formatBytes(n)})`, context);
    return { ptr: p[0], addr: BigInt(koffi.address(p[0])), buffer: koffi.view(p[0], n) };
  }
  /** Frees hostAlloc's memory: every view of its buffer is dangling after this. */
  hostFree(ptr: unknown): void { this.check(this.f.memFreeHost!(ptr), 'cuMemFreeHost', 'freeing page-locked host memory'); }
  /**
   * Page-locked host memory at address src (hostAlloc) to the device, ordered on the stream; returns at once, and the
   * bytes are read when the stream gets there (record an event after it and wait for it before writing them again).
   */
  htodAsync(dst: bigint, src: bigint, bytes: number, context: string): void {
    this.check(this.f.memcpyHtoDAsyncPinned!(dst, src, bytes, this.stream), `cuMemcpyHtoDAsync(${formatBytes(bytes)})`, context);
  }
  /** Device to page-locked host memory at address dst (hostAlloc), ordered on the stream; returns at once (waitEvent). */
  dtohAsync(dst: bigint, src: bigint, bytes: number, context: string): void {
    this.check(this.f.memcpyDtoHAsyncPinned!(dst, src, bytes, this.stream), `cuMemcpyDtoHAsync(${formatBytes(bytes)})`, context);
  }
  /** Records ev on the stream (after everything queued so far). */
  recordOn(ev: unknown, context: string): void { this.check(this.f.eventRecord!(ev, this.stream), 'cuEventRecord', context); }
  /** Waits for an event recorded on the stream: bounded by the guard where one is set, as waitStream is. */
  waitEvent(ev: unknown, context: string): void {
    if (this.aborted) throw new CudaError(0, 'ABORTED', 'cuEventSynchronize', context, 'the GPU collectives were aborted: every rank stops');
    const g = this.waitGuard;
    if (g === null) { this.check(this.f.eventSynchronize!(ev), 'cuEventSynchronize', context); return; }
    boundedWait(() => this.eventQuery(ev), {
      who: g.who, timeoutMs: g.timeoutMs, ...(g.setting ? { setting: g.setting } : {}), poll: () => g.poll(), abort: (why) => { this.aborted = true; g.abort(why); },
    }, context);
  }

  /** Device to host after everything queued before it on the stream; returns when the bytes are on the host. */
  dtoh(dst: ArrayBufferView, src: bigint, bytes: number, context: string): void {
    // A copy into pageable memory returns only once it is done (it waits for the stream inside the call): with a
    // guard, the bounded wait comes first, so the copy then finds the stream idle.
    if (this.waitGuard !== null) this.waitStream(context);
    this.check(this.f.memcpyDtoHAsync!(dst, src, bytes, this.stream), `cuMemcpyDtoHAsync(${formatBytes(bytes)})`, context);
    this.waitStream(context);
  }

  /**
   * Bounds every host wait for the stream (bounded-wait.ts): set by a communicator whose collectives run on the GPU, so
   * that a hung peer fails the wait within the guard's timeout instead of blocking in cuStreamSynchronize for ever.
   */
  waitGuard: WaitGuard | null = null;
  /** Set once the guard aborted: nothing waits for the GPU after that (dispose skips its synchronize). */
  aborted = false;
  private syncEvent: unknown = null;

  private waitStream(context: string): void {
    if (this.aborted) throw new CudaError(0, 'ABORTED', 'cuStreamSynchronize', context, 'the GPU collectives were aborted: every rank stops');
    const g = this.waitGuard;
    if (g === null) { this.check(this.f.streamSynchronize!(this.stream), 'cuStreamSynchronize', context); return; }
    if (this.syncEvent === null) {
      const ev: unknown[] = [null];
      this.check(this.f.eventCreate!(ev, 2 /* CU_EVENT_DISABLE_TIMING */), 'cuEventCreate', 'creating the wait event');
      this.syncEvent = ev[0];
    }
    this.recordOn(this.syncEvent, context);
    this.waitEvent(this.syncEvent, context);
  }

  // The side stream: collectives that overlap the main stream's work (fork: it waits for an event of the main stream;
  // join: the main stream waits for an event of it). Created on first use.
  private side: unknown = null;
  private forkEvent: unknown = null;
  private joinEvent: unknown = null;
  get sideStream(): unknown {
    if (this.side === null) {
      const st: unknown[] = [null];
      this.check(this.f.streamCreate!(st, 1 /* CU_STREAM_NON_BLOCKING */), 'cuStreamCreate', 'creating the side stream');
      this.side = st[0];
      const ev: unknown[] = [null];
      this.check(this.f.eventCreate!(ev, 2 /* CU_EVENT_DISABLE_TIMING */), 'cuEventCreate', 'creating the fork event');
      this.forkEvent = ev[0];
      this.check(this.f.eventCreate!(ev, 2), 'cuEventCreate', 'creating the join event');
      this.joinEvent = ev[0];
    }
    return this.side;
  }
  /** The side stream waits for everything queued on the main stream so far. */
  forkSide(context: string): void {
    const side = this.sideStream;
    this.check(this.f.eventRecord!(this.forkEvent, this.stream), 'cuEventRecord', context);
    this.check(this.f.streamWaitEvent!(side, this.forkEvent, 0), 'cuStreamWaitEvent', context);
  }
  /** The main stream waits for everything queued on the side stream so far. */
  joinSide(context: string): void {
    if (this.side === null) return;
    this.check(this.f.eventRecord!(this.joinEvent, this.side), 'cuEventRecord', context);
    this.check(this.f.streamWaitEvent!(this.stream, this.joinEvent, 0), 'cuStreamWaitEvent', context);
  }
  dtod(dst: bigint, src: bigint, bytes: number, context: string): void {
    this.check(this.f.memcpyDtoDAsync!(dst, src, bytes, this.stream), `cuMemcpyDtoDAsync(${formatBytes(bytes)})`, context);
  }
  /** Sets n bytes at dst to value (bf16 buffers are zeroed bytewise: their length in 32-bit words may be odd). */
  memsetD8(dst: bigint, value: number, n: number, context: string): void {
    this.check(this.f.memsetD8Async!(dst, value & 0xff, n, this.stream), 'cuMemsetD8Async', context);
  }

  memsetD32(dst: bigint, value: number, n: number, context: string): void {
    this.check(this.f.memsetD32Async!(dst, value >>> 0, n, this.stream), 'cuMemsetD32Async', context);
  }
  memInfo(): { free: number; total: number } {
    const f = [0], t = [0];
    this.check(this.f.memGetInfo!(f, t), 'cuMemGetInfo', 'reading GPU memory');
    return { free: Number(f[0]), total: Number(t[0]) };
  }
  /** Waits for all the context's work (bounded through both streams where a guard is set; nothing after an abort). */
  synchronize(context: string): void {
    if (this.aborted) return;
    if (this.waitGuard === null) { this.check(this.f.ctxSynchronize!(), 'cuCtxSynchronize', context); return; }
    this.joinSide(context);
    this.waitStream(context);
  }
  streamSynchronize(context: string): void { this.waitStream(context); }

  // CUDA graphs: capture what is issued on the stream, instantiate it once, launch it on the stream.
  /** Starts capturing the stream (thread-local mode: other threads' unsafe calls do not invalidate it). */
  beginCapture(context: string): void {
    this.check(this.f.streamBeginCapture!(this.stream, 1 /* CU_STREAM_CAPTURE_MODE_THREAD_LOCAL */), 'cuStreamBeginCapture', context);
  }
  /** Ends the capture and instantiates the graph; returns the executable graph (the graph itself is destroyed). */
  endCapture(context: string): unknown {
    const g: unknown[] = [null];
    this.check(this.f.streamEndCapture!(this.stream, g), 'cuStreamEndCapture', context);
    const exec: unknown[] = [null];
    try {
      this.check(this.f.graphInstantiate!(exec, g[0], 0), 'cuGraphInstantiateWithFlags', context);
    } finally {
      this.check(this.f.graphDestroy!(g[0]), 'cuGraphDestroy', context);
    }
    return exec[0];
  }
  graphLaunch(exec: unknown, context: string): void { this.check(this.f.graphLaunch!(exec, this.stream), 'cuGraphLaunch', context); }
  graphDestroy(exec: unknown): void { this.check(this.f.graphExecDestroy!(exec), 'cuGraphExecDestroy', 'destroying a CUDA graph'); }

  // Events (the op profile and the step timeline): recorded on the stream.
  /** A profile event (timed), or with timing false one that only marks completion (CU_EVENT_DISABLE_TIMING: cheaper). */
  eventCreate(timing = true): unknown {
    const ev: unknown[] = [null];
    this.check(this.f.eventCreate!(ev, timing ? 0 : 2), 'cuEventCreate', timing ? 'creating a profile event' : 'creating a completion event');
    return ev[0];
  }
  eventRecord(ev: unknown): void { this.check(this.f.eventRecord!(ev, this.stream), 'cuEventRecord', 'recording an event'); }
  /** Inside a capture: an event-record node of the graph (CU_EVENT_RECORD_EXTERNAL), which its replays record. */
  eventRecordNode(ev: unknown): void {
    this.check(this.f.eventRecordWithFlags!(ev, this.stream, 1 /* CU_EVENT_RECORD_EXTERNAL */), 'cuEventRecordWithFlags', 'recording a graph event');
  }
  /** Whether the event has completed (CUDA_ERROR_NOT_READY: not yet). */
  eventQuery(ev: unknown): boolean {
    const rc = this.f.eventQuery!(ev) as number;
    if (rc === 600) return false;
    this.check(rc, 'cuEventQuery', 'querying an event');
    return true;
  }
  eventSynchronize(ev: unknown): void { this.check(this.f.eventSynchronize!(ev), 'cuEventSynchronize', 'waiting for an event'); }
  eventElapsedMs(start: unknown, end: unknown): number {
    const ms = [0];
    this.check(this.f.eventElapsedTime!(ms, start, end), 'cuEventElapsedTime', 'reading a profile event');
    return ms[0]!;
  }
  eventDestroy(ev: unknown): void { this.check(this.f.eventDestroy!(ev), 'cuEventDestroy', 'destroying a profile event'); }

  /** Loads a CUBIN and returns the named function. */
  loadFunction(cubin: Uint8Array, entry: string, context: string): { module: unknown; fn: unknown } {
    const mod: unknown[] = [null];
    this.check(this.f.moduleLoadData!(mod, cubin), 'cuModuleLoadData', context);
    const fn: unknown[] = [null];
    this.check(this.f.moduleGetFunction!(fn, mod[0], entry), `cuModuleGetFunction(${entry})`, context);
    return { module: mod[0], fn: fn[0] };
  }
  unloadModule(mod: unknown): void { this.check(this.f.moduleUnload!(mod), 'cuModuleUnload', 'unloading a kernel module'); }

  /**
   * Lets fn use up to `bytes` of dynamic shared memory per block (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
   * needed above 48 KiB.
   */
  setMaxDynamicShared(fn: unknown, bytes: number, context: string): void {
    this.check(this.f.funcSetAttribute!(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes), 'cuFuncSetAttribute', context);
  }

  /** fn's registers a thread and local memory a thread (bytes: spilled registers and local arrays), as compiled. */
  resources(fn: unknown, context: string): { registers: number; localBytes: number } {
    const r = [0], l = [0];
    this.check(this.f.funcGetAttribute!(r, CU_FUNC_ATTRIBUTE_NUM_REGS, fn), 'cuFuncGetAttribute', context);
    this.check(this.f.funcGetAttribute!(l, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn), 'cuFuncGetAttribute', context);
    return { registers: r[0]!, localBytes: l[0]! };
  }

  /** The blocks of `block` threads (and `dynamicSmem` bytes of dynamic shared memory) of fn one SM holds at once. */
  occupancy(fn: unknown, block: number, dynamicSmem: number, context: string): number {
    const n = [0];
    this.check(this.f.occupancy!(n, fn, block, dynamicSmem), 'cuOccupancyMaxActiveBlocksPerMultiprocessor', context);
    return n[0]!;
  }

  /** params: a buffer of pointers to each argument's storage (CUDA copies them at launch). */
  launch(fn: unknown, grid: readonly [number, number, number], block: number, shmem: number, params: Buffer, context: string): void {
    this.check(
      this.f.launchKernel!(fn, grid[0], grid[1], grid[2], block, 1, 1, shmem, this.stream, params, null),
      'cuLaunchKernel', context,
    );
  }

  /** Releases the primary context (once); a failure is thrown by name. */
  release(): void {
    if (this.ctx === null) return;
    this.ctx = null;
    this.check(this.f.primaryCtxRelease!(this.device), 'cuDevicePrimaryCtxRelease', 'releasing the CUDA context');
  }
}
