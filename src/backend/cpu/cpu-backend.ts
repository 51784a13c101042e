/**
 * The CPU backend: the Backend interface over typed arrays.
 *
 * Float buffers are Float32Array (or Float64Array in the 'f64' reference mode that finite-difference tests
 * use) over SharedArrayBuffers, so worker threads can read and write them in place; a view is a subarray.
 * Int buffers are Int32Array. The math lives in ./kernels/*.ts as plain functions; this class checks
 * arguments, owns scratch memory and decides what runs on the worker pool (./pool.ts):
 * matrix products (split by output rows, or by columns when there are few rows), attention forward
 * (split over (batch, head)) and backward (over (batch, kv-head), which own disjoint dk/dv rows), the
 * fused loss (over rows) and, when large, SwiGLU forward/backward and AdamW (over element ranges). Each such op
 * is cut into a few chunks per thread that threads claim dynamically, so a core taken by another process slows
 * the op down instead of stalling it. Everything else is a single loop on the calling thread. Every split op
 * computes each output element with the same operations whatever range it falls in, so results are
 * bit-identical for every thread count (test/backend/kernels-wasm.test.ts, wasm.test.ts).
 *
 * Mixed precision: a bf16 buffer is a float array like any other, tagged `dtype: 'bf16'`, that only ever holds
 * bf16-representable values: every op that stores into one rounds what it wrote to nearest even (fin()), once, after
 * computing in float32 (float64 in the reference mode), which is what the CUDA kernels do. So the CPU backend is the
 * bf16 reference the CUDA backend's bf16 path is tested against.
 *
 * Attention saves only each query row's log-sum-exp ([B, heads, T]); backward recomputes the probabilities row by
 * row (P = exp(S − lse)) and uses D = dout·out for rowsum(P ⊙ dP). In f32 mode it runs the WASM row kernels of
 * gemm.wat (q·k dots, P·V, and in backward the scores again, dO·Vᵀ, the dV/dK outer-product updates and dS·K)
 * through AttentionKernels in ./wasm.ts; softmax, exp and lse stay in JS float64. The per-row scratch is one region
 * of the WASM memory per backend (b·heads·t floats forward, 2·b·nKv·t backward; grown, never allocated per call),
 * rows per (batch, head) unit / (batch, kv-head) group so threads never share one.
 *
 * Matrix products: WebAssembly SIMD in f32 mode (./wasm.ts, ./wasm/gemm.wat). Every f32 buffer is a
 * Float32Array view of ONE shared WebAssembly.Memory per backend (a bump allocator; nothing is freed before
 * dispose()), so the JS kernels keep working on the buffers unchanged and the WASM kernels address them by
 * byteOffset. gemm_nt (4×2 tiles of f32x4 accumulators along k) does the forward product; gemm_nn, which reads
 * its first operand through strides, does both backward products without transposing anything:
 *   dinp    += dout · W        (A = dout row-major, B = W [m, k])
 *   dweight += doutᵀ · inp     (A = dout read column-wise, B = inp [n, k])
 * Each output element is computed by one thread with one fixed sequence of float32 operations whatever tile or
 * thread range it falls in, so results are bit-identical run to run and for every thread count. Where the
 * runtime lacks WebAssembly SIMD (or gemm.wasm is missing) the backend warns once and runs the JS kernels of
 * ./kernels/gemm.ts over SharedArrayBuffers, as the f64 reference mode always does; `kernel: 'js'` (or
 * DISTILLERY_CPU_KERNEL=js) forces that path. Buffers that are f32 but not views of this backend's memory
 * (another backend's) also take the JS path. Posting a task costs ~55 µs, so products below 2^20
 * multiply-adds stay inline.
 * Measured with bench/matmul.ts on the 2-core dev machine (load 1.8-3.2 from other jobs), GFLOP/s, JS → WASM:
 *                   threads=1 forward / backward          threads=2 forward / backward
 *   256×256×256     3.1 → 18.8  /  3.0 → 17.3             5.7 → 33.9  /  5.5 → 20.4
 *   1024×512×512    3.0 → 18.7  /  2.9 → 16.0             5.2 → 28.1  /  4.4 → 31.0
 *   4096×128×512    3.1 → 14.0  /  2.7 → 15.9             5.5 → 21.9  /  5.4 → 17.9
 *   512×896×4864    2.9 → 25.2  /  3.0 → 18.0             6.5 → 44.3  /  5.8 → 36.2
 *   1×896×4864      1.5 →  6.8  /  1.1 →  2.2             2.2 → 12.9  /  1.1 →  3.8
 */
import * as os from 'node:os';
import type { AdamWSegment, AdamWStep, Backend, Buf, DocPositions, DType, HostStaging, IntBuf, LossSpec, QkNormWeights, Readback, RopeSpec, RopeStrides, SampleParams, SeqPositions, SparseRowsOut, SparseTargets } from '../backend.js';
import { LOSS_STATS, MAX_DECODE_SEQUENCES, MAX_SPARSE_SLOTS, checkDocPositions, checkMatmulDtypes, copyColumnsExtent, penaltyAndMinP, plainHostStaging, ropeExtent, seenWords } from '../backend.js';
import { fromBf16Bits, roundBf16InPlace, unpackBf16 } from '../bf16.js';
import { DistilleryError, check } from '../../util/errors.js';
import * as ew from './kernels/elementwise.js';
import { attentionCached, kvCacheWrite } from './kernels/attention.js';
import { biasBackward, gemmNNAcc, gemmNT, transpose } from './kernels/gemm.js';
import { lossRows } from './kernels/loss.js';
import { sparseLossRows } from './kernels/sparse-loss.js';
import { sparseRow } from './kernels/sparse-rows.js';
import { markSeen, penalizeInPlace, sampleRow } from './kernels/sample.js';
import { ropeForward } from './kernels/rope.js';
import type { FArr } from './kernels/types.js';
import { WorkerPool } from './pool.js';
import { runTask, splitRange, type Task } from './tasks.js';
import { GemmKernels, WasmArena, wasmModule, type WasmModule } from './wasm.js';
import { NF4_LEVELS } from '../../quant/nf4.js';

export interface CpuBackendOptions {
  /** Element type of float buffers (default 'f32'). */
  dtype?: 'f32' | 'f64';
  /** Threads for matrix products, attention and loss, the calling thread included (default: cores, at most 8). */
  threads?: number;
  /**
   * Work (multiply-adds) below which a product runs inline on the calling thread (default 2^20 ≈ a
   * 128×128×64 product: below that, posting to workers costs more than it saves). Tests set 0 to force the
   * thread path on small, odd shapes.
   */
  parallelThreshold?: number;
  /**
   * Matrix-product kernels in f32 mode: 'wasm' (WebAssembly SIMD; an error where unavailable), 'js', or 'auto'
   * (default: wasm where available, else js with one warning). The DISTILLERY_CPU_KERNEL environment variable
   * (js | wasm | auto) sets the default. f64 mode always runs the JS kernels.
   */
  kernel?: 'auto' | 'wasm' | 'js';
}

let warnedNoWasm = false;

/** Default thread count: the available parallelism, capped at 8. */
export function defaultThreads(): number {
  const n = typeof os.availableParallelism === 'function' ? os.availableParallelism() : os.cpus().length;
  return Math.max(1, Math.min(8, n));
}

const DEFAULT_PARALLEL_THRESHOLD = 1 << 20;
/** Smallest chunk (multiply-adds) that threads claim: ~0.1 ms of work, well above the cost of claiming it. */
const MIN_CHUNK_WORK = 1 << 18;
/**
 * Below this many rows, matmulBackward multiplies in axpy form (gemmNNAcc) instead of transposing the
 * weight: the transpose of an [m, k] weight costs about as much as ~8-16 rows of the product.
 */
const SMALL_ROWS = 8;
/**
 * Per-element cost of the threaded elementwise ops in multiply-add units (the unit of parallelThreshold):
 * SwiGLU's exp costs ~10 ns, AdamW's sqrt and divide ~4 ns, a WASM multiply-add ~0.1 ns. So SwiGLU goes to the
 * threads from ~16K elements and AdamW from ~32K (one 128×256 weight), where the hand-off costs less than it saves.
 */
const EW_COST_SWIGLU = 64, EW_COST_ADAMW = 32, EW_COST_ROPE = 8;

export class CpuBackend implements Backend {
  readonly name = 'cpu';
  readonly recordsRegions = false;
  readonly dtype: 'f32' | 'f64';
  readonly threads: number;
  private readonly Ctor: Float32ArrayConstructor | Float64ArrayConstructor;
  private readonly threshold: number;
  private pool: WorkerPool | null = null;
  private scratch: FArr;
  private attnRows: Float32Array | null = null;
  /** ropeKvCacheWrite's rows for the q/k norms (the split heads, the normed heads, their rstd). */
  private qkScratch: FArr | null = null;
  private disposed = false;
  private allocated = 0;
  /** f32 mode with WASM kernels: the memory every float buffer lives in, and the kernels over it. */
  private arena: WasmArena | null = null;
  private kernels: GemmKernels | null = null;
  private module: WasmModule | null = null;
  /** Which matrix-product kernels this backend runs. */
  readonly kernel: 'wasm' | 'js';

  constructor(opts: CpuBackendOptions = {}) {
    this.dtype = opts.dtype ?? 'f32';
    check(this.dtype === 'f32' || this.dtype === 'f64', `cpu backend: dtype must be 'f32' or 'f64', got ${String(this.dtype)}`);
    this.threads = Math.max(1, Math.floor(opts.threads ?? defaultThreads()));
    this.threshold = opts.parallelThreshold ?? DEFAULT_PARALLEL_THRESHOLD;
    this.Ctor = this.dtype === 'f64' ? Float64Array : Float32Array;
    const envKernel = process.env['DISTILLERY_CPU_KERNEL'];
    const want = opts.kernel ?? (envKernel === 'js' || envKernel === 'wasm' ? envKernel : 'auto');
    check(want === 'auto' || want === 'wasm' || want === 'js', `cpu backend: kernel must be 'auto', 'wasm' or 'js', got ${String(want)}`);
    check(!(want === 'wasm' && this.dtype === 'f64'), "cpu backend: kernel 'wasm' needs dtype 'f32'");
    if (this.dtype === 'f32' && want !== 'js') {
      const m = wasmModule();
      if ('module' in m) {
        this.module = m.module;
        this.arena = new WasmArena();
        this.kernels = new GemmKernels(m.module, this.arena.memory);
      } else if (want === 'wasm') {
        throw new DistilleryError(`cpu backend: WebAssembly SIMD kernels unavailable: ${m.error}`);
      } else if (!warnedNoWasm) {
        warnedNoWasm = true;
        console.warn(`distillery: cpu backend: WebAssembly SIMD kernels unavailable (${m.error}); using the slower JS kernels`);
      }
    }
    this.kernel = this.kernels === null ? 'js' : 'wasm';
    this.scratch = this.shared(0);
  }

  /** Bytes currently held by buffers this backend allocated (views not counted). */
  get allocatedBytes(): number { return this.allocated; }

  // ---- helpers ----------------------------------------------------------------------------------------

  private shared(n: number): FArr {
    if (this.arena !== null) return this.arena.alloc(n);
    const sab = new SharedArrayBuffer(Math.max(1, n) * this.Ctor.BYTES_PER_ELEMENT);
    return this.dtype === 'f64' ? new Float64Array(sab, 0, n) : new Float32Array(sab, 0, n);
  }

  /** Tags a typed array with its storage dtype (every float Buf this backend hands out carries one). */
  private tag(a: FArr, d: DType): Buf {
    Object.defineProperty(a, 'dtype', { value: d, enumerable: false });
    return a as unknown as Buf;
  }

  /** After an op stored into out[i0, i1): rounds that range to bf16 when out is a bf16 buffer. */
  private fin(out: Buf | null, i0: number, i1: number): void {
    if (out !== null && out.dtype === 'bf16') roundBf16InPlace(out as unknown as FArr, i0, i1);
  }

  /** The typed array behind a Buf, checked to be one of ours. */
  private f(buf: Buf, what: string): FArr {
    if (!(buf instanceof this.Ctor)) {
      throw new DistilleryError(`cpu backend: ${what} is not a ${this.dtype} buffer of this backend`);
    }
    return buf;
  }

  private i(buf: IntBuf, what: string): Int32Array {
    if (!(buf instanceof Int32Array)) throw new DistilleryError(`cpu backend: ${what} is not an int buffer of this backend`);
    return buf;
  }

  private need(buf: FArr | Int32Array, n: number, op: string, what: string): void {
    if (buf.length < n) {
      throw new DistilleryError(`cpu backend: ${op}: ${what} holds ${buf.length} elements, needs ${n}`);
    }
  }

  /**
   * WASM attention's scratch rows: at least n floats of the WASM memory, kept for the backend's life (grown, never
   * per call). Each forward unit / backward (batch, kv-head) group owns its own rows, so threads never share one.
   */
  private attnScratch(n: number): Float32Array {
    if (this.attnRows === null || this.attnRows.length < n) this.attnRows = this.arena!.alloc(Math.max(n, Math.ceil((this.attnRows?.length ?? 0) * 1.5)));
    return this.attnRows;
  }

  /** A scratch array of at least n elements (shared, reused between calls). */
  private getScratch(n: number): FArr {
    if (this.scratch.length < n) this.scratch = this.shared(Math.max(n, Math.ceil(this.scratch.length * 1.5)));
    return this.scratch;
  }

  private getPool(): WorkerPool {
    if (this.disposed) throw new DistilleryError('cpu backend: used after dispose()');
    if (this.pool === null) {
      this.pool = new WorkerPool(this.threads - 1, this.kernels === null || this.arena === null || this.module === null
        ? null : { kernels: this.kernels, module: this.module, memory: this.arena.memory, owns: this.arena.owns.bind(this.arena) });
    }
    return this.pool;
  }

  private parallel(work: number): boolean {
    return this.threads > 1 && work >= this.threshold;
  }

  /** out[i, j] (+)= bias[j] + Σ_k a[i, k] b[j, k] for out [rows, cols], split among threads when large. */
  private gemm(out: FArr, a: FArr, b: FArr, bias: FArr | null, rows: number, cols: number, k: number, acc: boolean): void {
    const wasm = this.inArena(out, a, b, bias);
    if (!this.parallel(rows * cols * k)) {
      if (wasm) this.kernels!.nt(out as Float32Array, a as Float32Array, b as Float32Array, bias as Float32Array | null, k, cols, 0, rows, 0, cols, acc);
      else gemmNT(out, a, b, bias, k, cols, 0, rows, 0, cols, acc);
      return;
    }
    const chunks = this.chunkCount(rows * cols * k);
    const base: Task = { op: 'gemm', out, a, b, bias, k, ldo: cols, i0: 0, i1: rows, j0: 0, j1: cols, accumulate: acc, wasm };
    if (rows >= 4 * this.threads) this.getPool().run(base, 'rows', splitRange(rows, chunks, 4));
    else this.getPool().run(base, 'cols', splitRange(cols, chunks, 2));
  }

  /** Whether the WASM kernels can run on these arrays: all are views of this backend's WASM memory. */
  private inArena(...xs: Array<FArr | null>): boolean {
    const arena = this.arena;
    if (arena === null) return false;
    for (const x of xs) if (x !== null && !arena.owns(x)) return false;
    return true;
  }

  /**
   * WASM only: out[i, c] (+)= Σ_{j<J} A[i*sai + j*saj] · B[j*ldb + c] for out [rows, cols] (ldo = cols),
   * split among threads by rows (or by columns when there are few rows) when large.
   */
  private gemmNN(out: Float32Array, a: Float32Array, b: Float32Array, rows: number, cols: number, J: number,
    sai: number, saj: number, ldb: number, acc: boolean): void {
    const work = rows * cols * J;
    if (!this.parallel(work)) {
      this.kernels!.nn(out, a, b, J, sai, saj, ldb, cols, 0, rows, 0, cols, acc);
      return;
    }
    const base: Task = { op: 'gemmNN', out, a, b, J, sai, saj, ldb, ldo: cols, i0: 0, i1: rows, j0: 0, j1: cols, accumulate: acc };
    const chunks = this.chunkCount(work);
    if (rows >= 4 * this.threads) this.getPool().run(base, 'rows', splitRange(rows, chunks, 4));
    else this.getPool().run(base, 'cols', splitRange(cols, chunks, 8));
  }

  /** Runs an elementwise task over [0, i1), split into aligned element ranges among threads when `work` is large. */
  private elementwise(task: Task & { op: 'ew' }, work: number): void {
    if (!this.parallel(work)) { runTask(task, this.kernels); return; }
    this.getPool().run(task, 'rows', splitRange(task.i1, this.chunkCount(work), 16));
  }

  /** How many chunks to cut `work` multiply-adds into: a few per thread (for balance), none tiny. */
  private chunkCount(work: number): number {
    return Math.max(this.threads, Math.min(4 * this.threads, Math.floor(work / MIN_CHUNK_WORK)));
  }

  // ---- memory -----------------------------------------------------------------------------------------

  alloc(n: number, label: string, dtype: DType = 'f32'): Buf {
    check(Number.isInteger(n) && n >= 0, `cpu backend: alloc('${label}'): bad size ${n}`);
    check(dtype === 'f32' || dtype === 'bf16', `cpu backend: alloc('${label}'): unknown dtype ${String(dtype)}`);
    this.allocated += n * this.Ctor.BYTES_PER_ELEMENT;
    return this.tag(this.outOfMemoryAsError(label, n * this.Ctor.BYTES_PER_ELEMENT, () => this.shared(n)), dtype);
  }

  allocInt(n: number, label: string): IntBuf {
    check(Number.isInteger(n) && n >= 0, `cpu backend: allocInt('${label}'): bad size ${n}`);
    this.allocated += n * 4;
    return this.outOfMemoryAsError(label, n * 4, () => (this.arena !== null
      ? this.arena.allocInt(n)
      : new Int32Array(new SharedArrayBuffer(Math.max(1, n) * 4), 0, n)));
  }

  /** Turns a failed allocation (the 4 GiB WebAssembly memory, or the host) into a DistilleryError naming the buffer. */
  private outOfMemoryAsError<T>(label: string, bytes: number, make: () => T): T {
    try {
      return make();
    } catch (e) {
      if (!(e instanceof RangeError)) throw e;
      const gib = (x: number): string => `${(x / 2 ** 30).toFixed(2)} GiB`;
      throw new DistilleryError(
        `cpu backend: cannot allocate ${label} (${gib(bytes)}; ${gib(this.allocated)} requested so far): ${e.message}`,
        this.arena !== null
          ? 'the CPU backend keeps float32 buffers in one WebAssembly memory of at most 4 GiB: use a smaller model, --batch or --seq, --device cuda, or DISTILLERY_CPU_KERNEL=js (slower, no 4 GiB limit)'
          : 'use a smaller model, --batch or --seq, or --device cuda');
    }
  }

  view(buf: Buf, offset: number, length: number): Buf {
    const a = this.f(buf, 'view source');
    check(Number.isInteger(offset) && Number.isInteger(length) && offset >= 0 && length >= 0 && offset + length <= a.length,
      `cpu backend: view [${offset}, ${offset + length}) outside a buffer of ${a.length}`);
    return this.tag(a.subarray(offset, offset + length), buf.dtype);
  }

  viewInt(buf: IntBuf, offset: number, length: number): IntBuf {
    const a = this.i(buf, 'viewInt source');
    check(Number.isInteger(offset) && Number.isInteger(length) && offset >= 0 && length >= 0 && offset + length <= a.length,
      `cpu backend: viewInt [${offset}, ${offset + length}) outside a buffer of ${a.length}`);
    return a.subarray(offset, offset + length);
  }

  upload(dst: Buf, src: ArrayLike<number>, dstOffset = 0): void {
    const d = this.f(dst, 'upload destination');
    check(dstOffset >= 0 && dstOffset + src.length <= d.length,
      `cpu backend: upload of ${src.length} at ${dstOffset} overflows a buffer of ${d.length}`);
    d.set(src, dstOffset);
    this.fin(dst, dstOffset, dstOffset + src.length);
  }

  uploadBf16(dst: Buf, bits: Uint16Array): void {
    const d = this.f(dst, 'uploadBf16 destination');
    check(dst.dtype === 'bf16', `cpu backend: uploadBf16 into a ${dst.dtype} buffer (bf16 only)`);
    check(bits.length <= d.length, `cpu backend: uploadBf16 of ${bits.length} overflows a buffer of ${d.length}`);
    if (d instanceof Float32Array) unpackBf16(bits, d);
    else for (let i = 0; i < bits.length; i++) d[i] = fromBf16Bits(bits[i]!);
  }

  uploadInt(dst: IntBuf, src: Int32Array): void {
    const d = this.i(dst, 'uploadInt destination');
    check(src.length <= d.length, `cpu backend: uploadInt of ${src.length} overflows a buffer of ${d.length}`);
    d.set(src);
  }

  downloadInt(src: IntBuf): Int32Array {
    return Int32Array.from(this.i(src, 'downloadInt source'));
  }

  /** An ordinary buffer: uploads copy at once, so there is nothing to settle. */
  hostStaging(bytes: number, _label: string): HostStaging {
    check(Number.isInteger(bytes) && bytes >= 0, `hostStaging(${bytes}): bad size`);
    return plainHostStaging(bytes);
  }

  readback(floats: Buf[], ints: IntBuf[], _label: string): Readback {
    const fs = floats.map((b) => this.f(b, 'readback source')), is = ints.map((b) => this.i(b, 'readback source'));
    const out = { floats: fs.map((a) => new this.Ctor(a.length)), ints: is.map((a) => new Int32Array(a.length)) };
    return {
      queue: () => { fs.forEach((a, k) => out.floats[k]!.set(a)); is.forEach((a, k) => out.ints[k]!.set(a)); },
      wait: () => out,
    };
  }

  download(src: Buf, into?: Float32Array): Float32Array | Float64Array {
    const a = this.f(src, 'download source');
    check(into === undefined || into.length === a.length, `download into ${into?.length} floats of a ${a.length}-float buffer`);
    const out = into ?? new this.Ctor(a.length);
    out.set(a);
    return out;
  }

  zero(buf: Buf): void { this.f(buf, 'zero').fill(0); }

  copy(dst: Buf, src: Buf): void {
    const d = this.f(dst, 'copy destination'), s = this.f(src, 'copy source');
    this.need(d, s.length, 'copy', 'dst');
    d.set(s);
    this.fin(dst, 0, s.length);
  }

  copyColumns(dst: Buf, dstCols: number, dstCol: number, src: Buf, srcCols: number, srcCol: number, rows: number, width: number, bias: Buf | null = null): void {
    const d = this.f(dst, 'copyColumns dst'), s = this.f(src, 'copyColumns src'), b = bias === null ? null : this.f(bias, 'copyColumns bias');
    const ext = copyColumnsExtent(dstCols, dstCol, srcCols, srcCol, rows, width);
    if (!ext) return;
    this.need(d, ext.dst, 'copyColumns', 'dst'); this.need(s, ext.src, 'copyColumns', 'src');
    if (b !== null) this.need(b, width, 'copyColumns', 'bias');
    for (let r = 0; r < rows; r++) {
      const o = r * dstCols + dstCol, i = r * srcCols + srcCol;
      if (b === null) d.set(s.subarray(i, i + width), o);
      else for (let c = 0; c < width; c++) d[o + c] = s[i + c]! + b[c]!;
      this.fin(dst, o, o + width);
    }
  }

  dispose(): void {
    this.pool?.dispose();
    this.pool = null;
    this.disposed = true;
    this.arena = null;
    this.kernels = null;
    this.scratch = this.shared(0);
    this.attnRows = null;
    this.qkScratch = null;
    this.allocated = 0;
  }

  // ---- elementwise ------------------------------------------------------------------------------------

  add(out: Buf, a: Buf, b: Buf, n: number): void {
    const o = this.f(out, 'add out'), x = this.f(a, 'add a'), y = this.f(b, 'add b');
    this.need(o, n, 'add', 'out'); this.need(x, n, 'add', 'a'); this.need(y, n, 'add', 'b');
    ew.add(o, x, y, n);
    this.fin(out, 0, n);
  }

  accumulate(dst: Buf, src: Buf, n: number): void {
    const d = this.f(dst, 'accumulate dst'), s = this.f(src, 'accumulate src');
    this.need(d, n, 'accumulate', 'dst'); this.need(s, n, 'accumulate', 'src');
    ew.accumulate(d, s, n);
    this.fin(dst, 0, n);
  }

  scale(buf: Buf, s: number, n: number): void {
    const b = this.f(buf, 'scale buf');
    this.need(b, n, 'scale', 'buf');
    ew.scale(b, s, n);
    this.fin(buf, 0, n);
  }

  dequantNf4(out: Buf, codes: IntBuf, absmax: Buf, n: number, blockSize: number): void {
    const o = this.f(out, 'dequantNf4 out'), c = this.i(codes, 'dequantNf4 codes'), s = this.f(absmax, 'dequantNf4 absmax');
    this.need(o, n, 'dequantNf4', 'out'); this.need(c, Math.ceil(n / 8), 'dequantNf4', 'codes'); this.need(s, Math.ceil(n / blockSize), 'dequantNf4', 'absmax');
    for (let i = 0; i < n; i++) {
      const byte = (c[i >> 3]! >>> (8 * ((i >> 1) & 3))) & 0xff;
      o[i] = Math.fround(NF4_LEVELS[(i & 1) === 0 ? byte >> 4 : byte & 15]! * s[Math.floor(i / blockSize)]!);
    }
    this.fin(out, 0, n);
  }

  sumSquares(buf: Buf, n: number): number {
    const b = this.f(buf, 'sumSquares buf');
    this.need(b, n, 'sumSquares', 'buf');
    return ew.sumSquares(b, n);
  }

  // ---- layers -----------------------------------------------------------------------------------------

  embeddingForward(out: Buf, ids: IntBuf, table: Buf, n: number, c: number): void {
    const o = this.f(out, 'embedding out'), t = this.f(table, 'embedding table'), d = this.i(ids, 'embedding ids');
    this.need(o, n * c, 'embeddingForward', 'out'); this.need(d, n, 'embeddingForward', 'ids');
    ew.embeddingForward(o, d, t, n, c);
    this.fin(out, 0, n * c);
  }

  embeddingBackward(dtable: Buf, dout: Buf, ids: IntBuf, n: number, c: number): void {
    const t = this.f(dtable, 'embedding dtable'), g = this.f(dout, 'embedding dout'), d = this.i(ids, 'embedding ids');
    this.need(g, n * c, 'embeddingBackward', 'dout'); this.need(d, n, 'embeddingBackward', 'ids');
    ew.embeddingBackward(t, g, d, n, c);
    this.fin(dtable, 0, t.length);
  }

  rmsnormForward(out: Buf, rstd: Buf, inp: Buf, weight: Buf, n: number, c: number, eps: number): void {
    const o = this.f(out, 'rmsnorm out'), r = this.f(rstd, 'rmsnorm rstd'), x = this.f(inp, 'rmsnorm inp'), w = this.f(weight, 'rmsnorm weight');
    this.need(o, n * c, 'rmsnormForward', 'out'); this.need(x, n * c, 'rmsnormForward', 'inp');
    this.need(r, n, 'rmsnormForward', 'rstd'); this.need(w, c, 'rmsnormForward', 'weight');
    ew.rmsnormForward(o, r, x, w, n, c, eps);
    this.fin(out, 0, n * c);
    this.fin(rstd, 0, n);
  }

  addRmsnormForward(sum: Buf, out: Buf, rstd: Buf, a: Buf, b: Buf, weight: Buf, n: number, c: number, eps: number): void {
    const o = this.f(out, 'addRmsnorm out'), s = this.f(sum, 'addRmsnorm sum');
    for (const x of [sum, a, b]) {
      const y = this.f(x, 'addRmsnorm input');
      if (y.buffer === o.buffer && y.byteOffset < o.byteOffset + o.byteLength && o.byteOffset < y.byteOffset + y.byteLength) {
        throw new DistilleryError('cpu backend: addRmsnormForward: out may not overlap sum, a or b');
      }
    }
    this.need(s, n * c, 'addRmsnormForward', 'sum');
    // The two ops in sequence: the norm reads the stored (for a bf16 sum: rounded) residual, exactly as unfused.
    this.add(sum, a, b, n * c);
    this.rmsnormForward(out, rstd, sum, weight, n, c, eps);
  }

  rmsnormBackward(dinp: Buf, dweight: Buf | null, dout: Buf, inp: Buf, weight: Buf, rstd: Buf, n: number, c: number, dinpCopy: Buf | null = null,
    dweightAccumulate = true): void {
    // A frozen weight (dweight null): its gradient goes to scratch and is dropped.
    const dx = this.f(dinp, 'rmsnorm dinp'), dw = dweight ? this.f(dweight, 'rmsnorm dweight') : new Float64Array(c), dy = this.f(dout, 'rmsnorm dout');
    const x = this.f(inp, 'rmsnorm inp'), w = this.f(weight, 'rmsnorm weight'), r = this.f(rstd, 'rmsnorm rstd');
    for (const [a, what] of [[dx, 'dinp'], [dy, 'dout'], [x, 'inp']] as const) this.need(a, n * c, 'rmsnormBackward', what);
    this.need(dw, c, 'rmsnormBackward', 'dweight'); this.need(w, c, 'rmsnormBackward', 'weight'); this.need(r, n, 'rmsnormBackward', 'rstd');
    if (!dweightAccumulate) dw.subarray(0, c).fill(0); // overwrite = accumulate into zeros (0 + x is exact)
    ew.rmsnormBackward(dx, dw, dy, x, w, r, n, c);
    if (dinpCopy) this.copy(this.view(dinpCopy, 0, n * c), this.view(dinp, 0, n * c));
    this.fin(dinp, 0, n * c);
    if (dweight) this.fin(dweight, 0, c);
  }

  matmulForward(out: Buf, inp: Buf, weight: Buf, bias: Buf | null, n: number, k: number, m: number, accumulate = false): void {
    const o = this.f(out, 'matmul out'), x = this.f(inp, 'matmul inp'), w = this.f(weight, 'matmul weight');
    const b = bias === null ? null : this.f(bias, 'matmul bias');
    this.need(o, n * m, 'matmulForward', 'out'); this.need(x, n * k, 'matmulForward', 'inp'); this.need(w, m * k, 'matmulForward', 'weight');
    if (b !== null) this.need(b, m, 'matmulForward', 'bias');
    checkMatmulDtypes('matmulForward', [['inp', inp, 'weight', weight]]);
    check(!(accumulate && b !== null), 'cpu backend: matmulForward accumulates without a bias');
    if (accumulate) {
      this.gemm(o, x, w, null, n, m, k, true);
    } else if (b !== null && (out.dtype === 'bf16' || this.dtype === 'f32')) {
      // As the CUDA backend (and the WASM kernel's own bias path): the product is stored (rounded), then the bias added
      // and the sum rounded, with the JS kernel too, so one product split by copyColumns (which adds a bias the same way)
      // equals separate products bit for bit. (float64: the store is exact, either way is the same.)
      this.gemm(o, x, w, null, n, m, k, false);
      this.fin(out, 0, n * m);
      for (let r = 0; r < n; r++) for (let c = 0; c < m; c++) o[r * m + c] = o[r * m + c]! + b[c]!;
    } else {
      this.gemm(o, x, w, b, n, m, k, false);
    }
    this.fin(out, 0, n * m);
  }

  matmulBackward(
    dinp: Buf | null, dweight: Buf | null, dbias: Buf | null,
    dout: Buf, inp: Buf, weight: Buf, n: number, k: number, m: number, dinpAccumulate = true, dweightAccumulate = true,
  ): void {
    checkMatmulDtypes('matmulBackward', [['dout', dout, 'weight', weight], ['dout', dout, 'inp', inp]]);
    // Overwrite = accumulate into zeros: the same sums (0 + x is exact), one rounding into a bf16 dinp.
    if (!dinpAccumulate && dinp !== null) this.f(dinp, 'matmul dinp').subarray(0, n * k).fill(0);
    if (!dweightAccumulate && dweight !== null) this.f(dweight, 'matmul dweight').subarray(0, m * k).fill(0);
    if (!dweightAccumulate && dbias !== null) this.f(dbias, 'matmul dbias').subarray(0, m).fill(0);
    this.matmulBackwardF32(dinp, dweight, dbias, dout, inp, weight, n, k, m);
    this.fin(dinp, 0, n * k);
    this.fin(dweight, 0, m * k);
    this.fin(dbias, 0, m);
  }

  private matmulBackwardF32(
    dinp: Buf | null, dweight: Buf | null, dbias: Buf | null,
    dout: Buf, inp: Buf, weight: Buf, n: number, k: number, m: number,
  ): void {
    const g = this.f(dout, 'matmul dout'), x = this.f(inp, 'matmul inp'), w = this.f(weight, 'matmul weight');
    this.need(g, n * m, 'matmulBackward', 'dout'); this.need(x, n * k, 'matmulBackward', 'inp'); this.need(w, m * k, 'matmulBackward', 'weight');
    if (dbias !== null) {
      const db = this.f(dbias, 'matmul dbias');
      this.need(db, m, 'matmulBackward', 'dbias');
      biasBackward(db, g, n, m);
    }
    const dxw = dinp === null ? null : this.f(dinp, 'matmul dinp'), dww = dweight === null ? null : this.f(dweight, 'matmul dweight');
    if (this.inArena(g, x, w, dxw, dww)) {
      // WASM: both products straight from the operands, no transposes (see the file comment).
      if (dxw !== null) {
        this.need(dxw, n * k, 'matmulBackward', 'dinp');
        this.gemmNN(dxw as Float32Array, g as Float32Array, w as Float32Array, n, k, m, m, 1, k, true);
      }
      if (dww !== null) {
        this.need(dww, m * k, 'matmulBackward', 'dweight');
        this.gemmNN(dww as Float32Array, g as Float32Array, x as Float32Array, m, k, n, 1, m, k, true);
      }
      return;
    }
    if (dinp !== null) {
      // dinp[n, k] += dout[n, m] · W[m, k] = gemmNT(dout, Wᵀ) with Wᵀ [k, m].
      const dx = this.f(dinp, 'matmul dinp');
      this.need(dx, n * k, 'matmulBackward', 'dinp');
      if (n < SMALL_ROWS) {
        gemmNNAcc(dx, g, w, m, k, 0, n);
      } else {
        const wt = this.getScratch(k * m).subarray(0, k * m);
        transpose(wt, w, m, k);
        this.gemm(dx, g, wt, null, n, k, m, true);
      }
    }
    if (dweight !== null) {
      // dweight[m, k] += doutᵀ[m, n] · inp[n, k] = gemmNT(doutᵀ, inpᵀ) with doutᵀ [m, n] and inpᵀ [k, n].
      const dw = this.f(dweight, 'matmul dweight');
      this.need(dw, m * k, 'matmulBackward', 'dweight');
      const s = this.getScratch(n * m + n * k);
      const gt = s.subarray(0, n * m);
      transpose(gt, g, n, m);
      if (n < SMALL_ROWS) {
        // dweight[m, k] += doutᵀ[m, n] · inp[n, k] in axpy form: inp is tiny, no need to transpose it.
        gemmNNAcc(dw, gt, x, n, k, 0, m);
      } else {
        const xt = s.subarray(n * m, n * m + n * k);
        transpose(xt, x, n, k);
        this.gemm(dw, gt, xt, null, m, k, n, true);
      }
    }
  }

  ropeForward(out: Buf, inp: Buf, b: number, t: number, heads: number, headDim: number, rope: RopeSpec, pos0: number | SeqPositions | DocPositions,
    bias?: Buf | null, strides?: RopeStrides): void {
    const o = this.f(out, 'rope out'), x = this.f(inp, 'rope inp');
    const { out: no, inp: ni, so, si } = ropeExtent('ropeForward', b * t, heads * headDim, strides, sameMemory(o, x));
    this.need(o, no, 'ropeForward', 'out'); this.need(x, ni, 'ropeForward', 'inp');
    const bs = bias ? this.f(bias, 'rope bias') : null;
    if (bs) this.need(bs, heads * headDim, 'ropeForward', 'bias');
    if (typeof pos0 === 'object' && 'docPositions' in pos0) {
      const rowPos = this.docs(pos0, b, t, 'ropeForward');
      this.rope({ op: 'rope', out: o, inp: x, bias: bs, t, heads, hd: headDim, rope, pos0: 0, sign: 1, accumulate: false, so, si, r0: 0, r1: b * t, rowPos });
    } else {
      this.perSequence(pos0, b, 'ropeForward', (bi, p) => ropeForward(o.subarray(bi * t * so), x.subarray(bi * t * si), 1, t, heads, headDim, rope, p, bs, so, si),
        (p) => this.rope({ op: 'rope', out: o, inp: x, bias: bs, t, heads, hd: headDim, rope, pos0: p, sign: 1, accumulate: false, so, si, r0: 0, r1: b * t, rowPos: null }));
    }
    this.fin(out, 0, no);
  }

  /** The host array of document positions for b windows of t rows, checked (checkDocPositions). */
  private docs(d: DocPositions, b: number, t: number, op: string): Int32Array {
    const pos = this.i(d.docPositions, `${op} document positions`);
    this.need(pos, b * t, op, 'document positions');
    try { checkDocPositions(pos, b, t); } catch (e) { throw new DistilleryError(`cpu backend: ${op}: ${(e as Error).message}`); }
    return pos;
  }

  /** A rotary embedding over all its token rows, split among threads by rows when large (any split: the same bits). */
  private rope(task: Task & { op: 'rope' }): void {
    const work = task.r1 * task.heads * task.hd * EW_COST_ROPE;
    if (task.hd % 2 !== 0 || !this.parallel(work)) { runTask(task, this.kernels); return; } // an odd head dim throws here
    this.getPool().run(task, 'rows', splitRange(task.r1, this.chunkCount(work), 1));
  }

  /**
   * Runs `one` per sequence with its start position (per-sequence positions: sequence b at pos[b], on the subarrays of
   * that sequence), or `all` once with the scalar start position.
   */
  private perSequence(pos0: number | SeqPositions, b: number, op: string, one: (bi: number, p: number) => void, all: (p: number) => void): void {
    if (typeof pos0 === 'number') { all(pos0); return; }
    const pos = this.i(pos0.seqPositions, `${op} positions`);
    this.need(pos, b, op, 'positions');
    for (let bi = 0; bi < b; bi++) one(bi, pos[bi]!);
  }

  ropeBackward(dinp: Buf, dout: Buf, b: number, t: number, heads: number, headDim: number, rope: RopeSpec, pos0: number | DocPositions,
    accumulate = true, strides?: RopeStrides): void {
    const dx = this.f(dinp, 'rope dinp'), dy = this.f(dout, 'rope dout');
    const { out: no, inp: ni, so, si } = ropeExtent('ropeBackward', b * t, heads * headDim, strides, sameMemory(dx, dy));
    this.need(dx, no, 'ropeBackward', 'dinp'); this.need(dy, ni, 'ropeBackward', 'dout');
    const rowPos = typeof pos0 === 'number' ? null : this.docs(pos0, b, t, 'ropeBackward');
    this.rope({ op: 'rope', out: dx, inp: dy, bias: null, t, heads, hd: headDim, rope, pos0: typeof pos0 === 'number' ? pos0 : 0, sign: -1,
      accumulate, so, si, r0: 0, r1: b * t, rowPos });
    this.fin(dinp, 0, no);
  }

  private checkHeads(op: string, nHeads: number, nKv: number): void {
    check(nKv > 0 && nHeads % nKv === 0, `cpu backend: ${op}: nHeads ${nHeads} is not a multiple of nKv ${nKv}`);
  }

  attentionForward(out: Buf, lse: Buf, q: Buf, k: Buf, v: Buf, b: number, t: number, nHeads: number, nKv: number, hd: number,
    docs?: DocPositions | null): void {
    this.attentionForwardF32(out, lse, q, k, v, b, t, nHeads, nKv, hd, docs ? this.docs(docs, b, t, 'attentionForward') : null);
    this.fin(out, 0, b * t * nHeads * hd);
    this.fin(lse, 0, b * nHeads * t);
  }

  private attentionForwardF32(out: Buf, lse: Buf, q: Buf, k: Buf, v: Buf, b: number, t: number, nHeads: number, nKv: number, hd: number,
    pos: Int32Array | null): void {
    this.checkHeads('attentionForward', nHeads, nKv);
    const o = this.f(out, 'attention out'), l = this.f(lse, 'attention lse');
    const qq = this.f(q, 'attention q'), kk = this.f(k, 'attention k'), vv = this.f(v, 'attention v');
    this.need(o, b * t * nHeads * hd, 'attentionForward', 'out'); this.need(qq, b * t * nHeads * hd, 'attentionForward', 'q');
    this.need(kk, b * t * nKv * hd, 'attentionForward', 'k'); this.need(vv, b * t * nKv * hd, 'attentionForward', 'v');
    this.need(l, b * nHeads * t, 'attentionForward', 'lse');
    const units = b * nHeads;
    const scratch = this.inArena(o, l, qq, kk, vv) ? this.attnScratch(units * t) : null;
    const task: Task = { op: 'attnF', out: o, lse: l, q: qq, k: kk, v: vv, t, nHeads, nKv, hd, u0: 0, u1: units, scratch, pos };
    if (!this.parallel(units * t * t * hd) || units < 2) {
      runTask(task, this.kernels);
      return;
    }
    this.getPool().run(task, 'rows', splitRange(units, this.chunkCount(units * t * t * hd)));
  }

  attentionBackward(
    dq: Buf, dk: Buf, dv: Buf, dout: Buf, q: Buf, k: Buf, v: Buf, out: Buf, lse: Buf,
    b: number, t: number, nHeads: number, nKv: number, hd: number, accumulate = true, docs?: DocPositions | null,
  ): void {
    this.attentionBackwardF32(dq, dk, dv, dout, q, k, v, out, lse, b, t, nHeads, nKv, hd, accumulate, docs ? this.docs(docs, b, t, 'attentionBackward') : null);
    this.fin(dq, 0, b * t * nHeads * hd);
    this.fin(dk, 0, b * t * nKv * hd);
    this.fin(dv, 0, b * t * nKv * hd);
  }

  private attentionBackwardF32(
    dq: Buf, dk: Buf, dv: Buf, dout: Buf, q: Buf, k: Buf, v: Buf, out: Buf, lse: Buf,
    b: number, t: number, nHeads: number, nKv: number, hd: number, accumulate: boolean, pos: Int32Array | null,
  ): void {
    this.checkHeads('attentionBackward', nHeads, nKv);
    const dqq = this.f(dq, 'attention dq'), dkk = this.f(dk, 'attention dk'), dvv = this.f(dv, 'attention dv');
    const g = this.f(dout, 'attention dout'), o = this.f(out, 'attention out'), l = this.f(lse, 'attention lse');
    const qq = this.f(q, 'attention q'), kk = this.f(k, 'attention k'), vv = this.f(v, 'attention v');
    const qLen = b * t * nHeads * hd, kLen = b * t * nKv * hd;
    for (const [a, what] of [[dqq, 'dq'], [g, 'dout'], [qq, 'q'], [o, 'out']] as const) this.need(a, qLen, 'attentionBackward', what);
    for (const [a, what] of [[dkk, 'dk'], [dvv, 'dv'], [kk, 'k'], [vv, 'v']] as const) this.need(a, kLen, 'attentionBackward', what);
    this.need(l, b * nHeads * t, 'attentionBackward', 'lse');
    // overwriting: the gradients start from zero here, once the call is checked (the kernels accumulate)
    if (!accumulate) { dqq.fill(0, 0, qLen); dkk.fill(0, 0, kLen); dvv.fill(0, 0, kLen); }
    const groups = b * nKv;
    const scratch = this.inArena(dqq, dkk, dvv, g, qq, kk, vv, o, l) ? this.attnScratch(2 * groups * t) : null;
    const task: Task = { op: 'attnB', dq: dqq, dk: dkk, dv: dvv, dout: g, q: qq, k: kk, v: vv, out: o, lse: l, t, nHeads, nKv, hd, g0: 0, g1: groups, scratch, pos };
    if (!this.parallel(b * nHeads * t * t * hd) || groups < 2) {
      runTask(task, this.kernels);
      return;
    }
    this.getPool().run(task, 'rows', splitRange(groups, this.chunkCount(3 * b * nHeads * t * t * hd)));
  }

  kvCacheWrite(cache: Buf, src: Buf, b: number, t: number, pos0: number | SeqPositions, tMax: number, nKv: number, hd: number): void {
    const c = this.f(cache, 'kv cache'), s = this.f(src, 'kv source');
    this.need(c, b * tMax * nKv * hd, 'kvCacheWrite', 'cache'); this.need(s, b * t * nKv * hd, 'kvCacheWrite', 'src');
    const cs = tMax * nKv * hd, ss = t * nKv * hd;
    this.perSequence(pos0, b, 'kvCacheWrite', (bi, p) => kvCacheWrite(c.subarray(bi * cs, bi * cs + cs), s.subarray(bi * ss, bi * ss + ss), 1, t, p, tMax, nKv, hd),
      (p) => kvCacheWrite(c, s, b, t, p, tMax, nKv, hd));
    this.fin(cache, 0, b * tMax * nKv * hd);
  }

  ropeKvCacheWrite(q: Buf, kCache: Buf, vCache: Buf, qkv: Buf, b: number, t: number, pos0: number | SeqPositions, tMax: number,
    nHeads: number, nKv: number, hd: number, rope: RopeSpec, bias: Buf | null, qkNorm: QkNormWeights | null = null): void {
    const op = 'ropeKvCacheWrite', Q = nHeads * hd, KV = nKv * hd, W = Q + 2 * KV, n = b * t;
    const kc = this.f(kCache, 'k cache'), vc = this.f(vCache, 'v cache'), x = this.f(qkv, 'q/k/v product');
    if (q.dtype !== kCache.dtype || vCache.dtype !== kCache.dtype) throw new DistilleryError(`cpu backend: ${op}: q (${q.dtype}) and the caches (${kCache.dtype}, ${vCache.dtype}) need one dtype`);
    this.need(kc, b * tMax * KV, op, 'kCache'); this.need(vc, b * tMax * KV, op, 'vCache'); this.need(x, n * W, op, 'qkv');
    if (bias !== null) this.need(this.f(bias, 'q/k/v bias'), W, op, 'bias');
    const part = (o: number, len: number): Buf | null => (bias === null ? null : this.view(bias, o, len));
    // The rows the rotation reads: the product's q and k columns with their biases, or (q/k norms) the normed heads,
    // formed as the split copy and rmsnormForward form them, in q's dtype. The op is the backend's own ops in a row.
    let qSrc = qkv, kSrc = this.view(qkv, Q, n * W - Q), kStride = W, qBias = part(0, Q), kBias = part(Q, KV);
    if (qkNorm) {
      // scratch the backend keeps (grown, never per call: a repeated decode step runs this again)
      const QK = n * (Q + KV), need = 2 * QK + n * (nHeads + nKv);
      if (this.qkScratch === null || this.qkScratch.length < need) this.qkScratch = this.shared(Math.max(need, Math.ceil((this.qkScratch?.length ?? 0) * 1.5)));
      const sc = this.qkScratch, dt = q.dtype, at = (o: number, len: number, d: DType): Buf => this.tag(sc.subarray(o, o + len), d);
      const qRaw = at(0, n * Q, dt), kRaw = at(n * Q, n * KV, dt), qn = at(QK, n * Q, dt), kn = at(QK + n * Q, n * KV, dt);
      const rstd = at(2 * QK, n * (nHeads + nKv), 'f32');
      this.copyColumns(qRaw, Q, 0, qkv, W, 0, n, Q, part(0, Q));
      this.copyColumns(kRaw, KV, 0, qkv, W, Q, n, KV, part(Q, KV));
      this.rmsnormForward(qn, this.view(rstd, 0, n * nHeads), qRaw, qkNorm.q, n * nHeads, hd, qkNorm.eps);
      this.rmsnormForward(kn, this.view(rstd, n * nHeads, n * nKv), kRaw, qkNorm.k, n * nKv, hd, qkNorm.eps);
      qSrc = qn; kSrc = kn; kStride = KV; qBias = null; kBias = null;
    }
    // q: the rotation, as ropeForward (which checks q and the head dim)
    this.ropeForward(q, qSrc, b, t, nHeads, hd, rope, pos0, qBias, { out: Q, inp: qkNorm ? Q : W });
    const write = (bi: number, p: number): void => {
      if (p < 0 || p + t > tMax) throw new DistilleryError(`cpu backend: ${op}: rows [${p}, ${p + t}) outside the cache of ${tMax}`, 'raise the generation length limit');
      const c0 = (bi * tMax + p) * KV;
      // sequence bi's t rows: k rotated straight into its cache rows, v's columns (with its bias) copied into them
      this.ropeForward(this.view(kCache, c0, t * KV), this.view(kSrc, bi * t * kStride, (t - 1) * kStride + KV), 1, t, nKv, hd, rope, p, kBias,
        { out: KV, inp: kStride });
      this.copyColumns(this.view(vCache, c0, t * KV), KV, 0, this.view(qkv, bi * t * W, t * W), W, Q + KV, t, KV, part(Q + KV, KV));
    };
    this.perSequence(pos0, b, op, write, (p) => { for (let bi = 0; bi < b; bi++) write(bi, p); });
  }

  attentionCached(out: Buf, q: Buf, kCache: Buf, vCache: Buf, b: number, t: number, pos0: number | SeqPositions, tMax: number, nHeads: number, nKv: number, hd: number): void {
    this.checkHeads('attentionCached', nHeads, nKv);
    const o = this.f(out, 'attention out'), qq = this.f(q, 'attention q');
    const kc = this.f(kCache, 'k cache'), vc = this.f(vCache, 'v cache');
    this.need(o, b * t * nHeads * hd, 'attentionCached', 'out'); this.need(qq, b * t * nHeads * hd, 'attentionCached', 'q');
    this.need(kc, b * tMax * nKv * hd, 'attentionCached', 'kCache'); this.need(vc, b * tMax * nKv * hd, 'attentionCached', 'vCache');
    const qs = t * nHeads * hd, cs = tMax * nKv * hd;
    this.perSequence(pos0, b, 'attentionCached',
      (bi, p) => attentionCached(o.subarray(bi * qs, bi * qs + qs), qq.subarray(bi * qs, bi * qs + qs), kc.subarray(bi * cs, bi * cs + cs), vc.subarray(bi * cs, bi * cs + cs), 1, t, p, tMax, nHeads, nKv, hd),
      (p) => attentionCached(o, qq, kc, vc, b, t, p, tMax, nHeads, nKv, hd));
    this.fin(out, 0, b * t * nHeads * hd);
  }

  swigluForward(out: Buf, gate: Buf, up: Buf, n: number): void {
    const o = this.f(out, 'swiglu out'), g = this.f(gate, 'swiglu gate'), u = this.f(up, 'swiglu up');
    this.need(o, n, 'swigluForward', 'out'); this.need(g, n, 'swigluForward', 'gate'); this.need(u, n, 'swigluForward', 'up');
    this.elementwise({ op: 'ew', fn: 'swigluF', x0: o, x1: g, x2: u, x3: null, x4: null, adam: null, i0: 0, i1: n, cols: 0 }, n * EW_COST_SWIGLU);
    this.fin(out, 0, n);
  }

  swigluBackward(dgate: Buf, dup: Buf, dout: Buf, gate: Buf, up: Buf, n: number, accumulate = true): void {
    const dg = this.f(dgate, 'swiglu dgate'), du = this.f(dup, 'swiglu dup'), dy = this.f(dout, 'swiglu dout');
    const g = this.f(gate, 'swiglu gate'), u = this.f(up, 'swiglu up');
    for (const [a, what] of [[dg, 'dgate'], [du, 'dup'], [dy, 'dout'], [g, 'gate'], [u, 'up']] as const) this.need(a, n, 'swigluBackward', what);
    if (!accumulate) { dg.subarray(0, n).fill(0); du.subarray(0, n).fill(0); }
    this.elementwise({ op: 'ew', fn: 'swigluB', x0: dg, x1: du, x2: dy, x3: g, x4: u, adam: null, i0: 0, i1: n, cols: 0 }, n * EW_COST_SWIGLU);
    this.fin(dgate, 0, n);
    this.fin(dup, 0, n);
  }

  swigluForwardRows(out: Buf, gu: Buf, rows: number, cols: number): void {
    const o = this.f(out, 'swiglu out'), x = this.f(gu, 'swiglu gate/up');
    this.need(o, rows * cols, 'swigluForwardRows', 'out'); this.need(x, 2 * rows * cols, 'swigluForwardRows', 'gu');
    // rows on the pool (each row depends on its own inputs only: any split gives the same bits)
    this.elementwise({ op: 'ew', fn: 'swigluFR', x0: o, x1: x, x2: null, x3: null, x4: null, adam: null, i0: 0, i1: rows, cols }, rows * cols * EW_COST_SWIGLU);
    this.fin(out, 0, rows * cols);
  }

  swigluBackwardRows(dgu: Buf, dout: Buf, gu: Buf, rows: number, cols: number): void {
    const d = this.f(dgu, 'swiglu dgate/dup'), dy = this.f(dout, 'swiglu dout'), x = this.f(gu, 'swiglu gate/up');
    this.need(d, 2 * rows * cols, 'swigluBackwardRows', 'dgu'); this.need(dy, rows * cols, 'swigluBackwardRows', 'dout');
    this.need(x, 2 * rows * cols, 'swigluBackwardRows', 'gu');
    this.elementwise({ op: 'ew', fn: 'swigluBR', x0: d, x1: dy, x2: x, x3: null, x4: null, adam: null, i0: 0, i1: rows, cols }, rows * cols * EW_COST_SWIGLU);
    this.fin(dgu, 0, 2 * rows * cols);
  }

  // ---- loss -------------------------------------------------------------------------------------------

  lossForward(
    stats: Buf, dlogits: Buf | null, logits: Buf, teacher: Buf | null, targets: IntBuf, weights: Buf,
    n: number, vocab: number, spec: LossSpec, ld: number = vocab,
  ): void {
    check(dlogits === null || dlogits.dtype === logits.dtype || (dlogits as unknown) !== (logits as unknown),
      'cpu backend: lossForward: a dlogits must not alias logits of another dtype');
    this.lossForwardF32(stats, dlogits, logits, teacher, targets, weights, n, vocab, spec, ld);
    this.fin(dlogits, 0, n * ld);
  }

  private lossForwardF32(
    stats: Buf, dlogits: Buf | null, logits: Buf, teacher: Buf | null, targets: IntBuf, weights: Buf,
    n: number, vocab: number, spec: LossSpec, ld: number,
  ): void {
    const st = this.f(stats, 'loss stats'), z = this.f(logits, 'loss logits'), w = this.f(weights, 'loss weights');
    const dz = dlogits === null ? null : this.f(dlogits, 'loss dlogits');
    const zt = teacher === null ? null : this.f(teacher, 'loss teacher');
    const y = this.i(targets, 'loss targets');
    check(spec.kind === 'none' || zt !== null, `cpu backend: lossForward: kind '${spec.kind}' needs teacher logits`);
    check(spec.kind === 'none' || spec.temperature > 0, `cpu backend: lossForward: temperature must be > 0, got ${spec.temperature}`);
    check(Number.isInteger(ld) && ld >= vocab, `cpu backend: lossForward: row stride ${ld} below the vocabulary ${vocab}`);
    const rows = n > 0 ? (n - 1) * ld + vocab : 0;
    this.need(st, n * LOSS_STATS, 'lossForward', 'stats'); this.need(z, rows, 'lossForward', 'logits');
    this.need(w, n, 'lossForward', 'weights'); this.need(y, n, 'lossForward', 'targets');
    if (dz !== null) this.need(dz, n * ld, 'lossForward', 'dlogits');
    if (zt !== null) this.need(zt, rows, 'lossForward', 'teacher');
    const s: LossSpec = { kind: spec.kind, alpha: spec.alpha, temperature: spec.temperature, beta: spec.beta };
    if (!this.parallel(n * vocab * 16) || n < 2) {
      lossRows(st, dz, z, zt, y, w, vocab, s, 0, n, ld);
      return;
    }
    this.getPool().run({ op: 'loss', stats: st, dlogits: dz, logits: z, teacher: zt, targets: y, weights: w, vocab, ld, spec: s, r0: 0, r1: n },
      'rows', splitRange(n, this.chunkCount(n * vocab * 16)));
  }

  sparseLossForward(
    stats: Buf, dlogits: Buf | null, logits: Buf, targets: IntBuf, weights: Buf, sparse: SparseTargets,
    n: number, vocab: number, spec: LossSpec, ld: number = vocab,
  ): void {
    check(dlogits === null || dlogits.dtype === logits.dtype || (dlogits as unknown) !== (logits as unknown),
      'cpu backend: sparseLossForward: a dlogits must not alias logits of another dtype');
    check(spec.kind !== 'none', 'cpu backend: sparseLossForward: the sparse loss needs a distillation kind (kl, reverse-kl or jsd)');
    check(spec.temperature > 0, `cpu backend: sparseLossForward: temperature must be > 0, got ${spec.temperature}`);
    check(Number.isInteger(ld) && ld >= vocab, `cpu backend: sparseLossForward: row stride ${ld} below the vocabulary ${vocab}`);
    const S = sparse.slots;
    check(Number.isInteger(S) && S >= 1 && S <= MAX_SPARSE_SLOTS, `cpu backend: sparseLossForward: ${S} slots per row (1 to ${MAX_SPARSE_SLOTS})`);
    const st = this.f(stats, 'loss stats'), z = this.f(logits, 'loss logits'), w = this.f(weights, 'loss weights');
    const dz = dlogits === null ? null : this.f(dlogits, 'loss dlogits');
    const y = this.i(targets, 'loss targets');
    const sp = {
      slots: S, ids: this.i(sparse.ids, 'sparse ids'), prob: this.f(sparse.prob, 'sparse prob'), logq: this.f(sparse.logq, 'sparse logq'),
      tail: this.f(sparse.tail, 'sparse tail'), argmax: this.i(sparse.argmax, 'sparse argmax'),
    };
    const rows = n > 0 ? (n - 1) * ld + vocab : 0;
    this.need(st, n * LOSS_STATS, 'sparseLossForward', 'stats'); this.need(z, rows, 'sparseLossForward', 'logits');
    this.need(w, n, 'sparseLossForward', 'weights'); this.need(y, n, 'sparseLossForward', 'targets');
    if (dz !== null) this.need(dz, n * ld, 'sparseLossForward', 'dlogits');
    for (const [a, what] of [[sp.ids, 'ids'], [sp.prob, 'prob'], [sp.logq, 'logq']] as const) this.need(a, n * S, 'sparseLossForward', what);
    this.need(sp.tail, n, 'sparseLossForward', 'tail'); this.need(sp.argmax, n, 'sparseLossForward', 'argmax');
    sparseLossRows(st, dz, z, y, w, sp, vocab, { kind: spec.kind, alpha: spec.alpha, temperature: spec.temperature, beta: spec.beta }, 0, n, ld);
    this.fin(dlogits, 0, n * ld);
  }

  sparseTeacherRows(out: SparseRowsOut, logits: Buf, uniforms: Buf, n: number, vocab: number, temperature: number,
    kind: 'sample' | 'top', ld: number = vocab): void {
    const S = out.slots;
    check(Number.isInteger(S) && S >= 1 && S <= MAX_SPARSE_SLOTS, `cpu backend: sparseTeacherRows: ${S} slots per row (1 to ${MAX_SPARSE_SLOTS})`);
    check(temperature > 0, `cpu backend: sparseTeacherRows: temperature must be > 0, got ${temperature}`);
    check(Number.isInteger(ld) && ld >= vocab, `cpu backend: sparseTeacherRows: row stride ${ld} below the vocabulary ${vocab}`);
    const z = this.f(logits, 'sparse rows logits'), u = this.f(uniforms, 'sparse rows uniforms');
    const ids = this.i(out.ids, 'sparse rows ids'), lq = this.f(out.logq, 'sparse rows logq'), tail = this.f(out.tail, 'sparse rows tail');
    const am = this.i(out.argmax, 'sparse rows argmax');
    this.need(z, n > 0 ? (n - 1) * ld + vocab : 0, 'sparseTeacherRows', 'logits'); this.need(u, n, 'sparseTeacherRows', 'uniforms');
    this.need(ids, n * S, 'sparseTeacherRows', 'ids'); this.need(lq, n * S, 'sparseTeacherRows', 'logq');
    this.need(tail, n, 'sparseTeacherRows', 'tail'); this.need(am, n, 'sparseTeacherRows', 'argmax');
    const scratch = new Float64Array(vocab);
    const rep = kind === 'sample' ? { kind, n: S } as const : { kind, k: S } as const;
    for (let i = 0; i < n; i++) {
      const e = sparseRow(z, i * ld, vocab, temperature, rep, () => u[i]!, scratch);
      ids.fill(-1, i * S, i * S + S); lq.fill(0, i * S, i * S + S);
      for (let k = 0; k < e.ids.length; k++) { ids[i * S + k] = e.ids[k]!; lq[i * S + k] = e.logq[k]!; }
      tail[i] = e.tail; am[i] = e.argmax;
    }
  }

  decodeAdvance(ids: IntBuf, positions: IntBuf, sampled: IntBuf, uniforms: Buf, table: Buf, counter: IntBuf, n: number, rows: number): void {
    const id = this.i(ids, 'decodeAdvance ids'), pos = this.i(positions, 'decodeAdvance positions'), s = this.i(sampled, 'decodeAdvance sampled');
    const u = this.f(uniforms, 'decodeAdvance uniforms'), tab = this.f(table, 'decodeAdvance table'), c = this.i(counter, 'decodeAdvance counter');
    check(Number.isInteger(n) && n >= 0 && n <= MAX_DECODE_SEQUENCES && Number.isInteger(rows) && rows >= 0, `cpu backend: decodeAdvance: ${n} sequences (at most ${MAX_DECODE_SEQUENCES}), ${rows} rows`);
    for (const [a, k, w] of [[id, n, 'ids'], [pos, n, 'positions'], [s, n, 'sampled'], [u, n, 'uniforms'], [tab, rows * n, 'table'], [c, 1, 'counter']] as const) this.need(a, k, 'decodeAdvance', w);
    const next = c[0]! + 1;
    for (let b = 0; b < n; b++) {
      id[b] = s[b]!;
      pos[b]! += 1;
      u[b] = next < rows ? tab[next * n + b]! : 0;
    }
    c[0] = next;
  }

  sampleTokens(out: IntBuf, logits: Buf, uniforms: Buf, n: number, vocab: number, s: SampleParams, ld: number = vocab, seen: IntBuf | null = null): void {
    const o = this.i(out, 'sampled tokens'), z = this.f(logits, 'sampling logits'), u = this.f(uniforms, 'sampling uniforms');
    check(Number.isInteger(ld) && ld >= vocab, `cpu backend: sampleTokens: row stride ${ld} below the vocabulary ${vocab}`);
    this.need(o, n, 'sampleTokens', 'out'); this.need(u, n, 'sampleTokens', 'uniforms');
    this.need(z, n > 0 ? (n - 1) * ld + vocab : 0, 'sampleTokens', 'logits');
    let pm: { penalty: number; minP: number };
    try { pm = penaltyAndMinP(s, seen); } catch (e) { throw new Error(`cpu backend: sampleTokens: ${(e as Error).message}`); }
    const penalized = pm.penalty !== 1, W = seenWords(vocab);
    const sw = seen === null ? null : this.i(seen, 'seen-token bitmask');
    if (sw) this.need(sw, n * W, 'sampleTokens', 'seen');
    // as the device does: the penalty rewrites the marked logits of the (scratch) rows in place, then the rule runs on them
    const plain: SampleParams = { ...s, repetitionPenalty: 1 };
    for (let i = 0; i < n; i++) {
      if (penalized) penalizeInPlace(z, i * ld, vocab, pm.penalty, sw!, i * W);
      o[i] = sampleRow(z, i * ld, vocab, plain, u[i]!);
      if (sw && o[i]! < vocab) markSeen(sw, i * W, o[i]!);
    }
  }

  // ---- optimizer --------------------------------------------------------------------------------------

  adamw(param: Buf, grad: Buf, m: Buf, v: Buf, n: number, s: AdamWStep, copy: Buf | null = null): void {
    this.adamwF32(param, grad, m, v, n, s);
    if (copy !== null) {
      const c = this.f(copy, 'adamw copy');
      this.need(c, n, 'adamw', 'copy');
      c.set(this.f(param, 'adamw param').subarray(0, n));
      this.fin(copy, 0, n);
    }
  }

  adamwSegments(param: Buf, grad: Buf, m: Buf, v: Buf, segments: readonly AdamWSegment[], s: AdamWStep, copy: Buf | null = null): void {
    for (const t of segments) {
      const vw = (b: Buf): Buf => this.view(b, t.offset, t.size);
      this.adamw(vw(param), vw(grad), vw(m), vw(v), t.size, { ...s, weightDecay: t.decay ? s.weightDecay : 0 }, copy === null ? null : vw(copy));
    }
  }

  /** The CPU has no graphs: the region runs as written. */
  captured<R>(_label: string, body: () => R): R { return body(); }
  capturedRepeat(_label: string, body: () => void): () => void { body(); return body; }

  private adamwF32(param: Buf, grad: Buf, m: Buf, v: Buf, n: number, s: AdamWStep): void {
    const p = this.f(param, 'adamw param'), g = this.f(grad, 'adamw grad'), mm = this.f(m, 'adamw m'), vv = this.f(v, 'adamw v');
    for (const [a, what] of [[p, 'param'], [g, 'grad'], [mm, 'm'], [vv, 'v']] as const) this.need(a, n, 'adamw', what);
    check(s.step >= 1, `cpu backend: adamw: step must be >= 1 (1-based), got ${s.step}`);
    const adam: AdamWStep = { lr: s.lr, beta1: s.beta1, beta2: s.beta2, eps: s.eps, weightDecay: s.weightDecay, step: s.step, gradScale: s.gradScale };
    this.elementwise({ op: 'ew', fn: 'adamw', x0: p, x1: g, x2: mm, x3: vv, x4: null, adam, i0: 0, i1: n, cols: 0 }, n * EW_COST_ADAMW);
  }
}

/** A CPU backend; see CpuBackendOptions. */
export function createCpuBackend(opts?: CpuBackendOptions): Backend {
  return new CpuBackend(opts);
}

/** Whether two arrays share memory (views of one buffer whose byte ranges meet). */
function sameMemory(a: FArr, b: FArr): boolean {
  return a.buffer === b.buffer && a.byteOffset < b.byteOffset + b.byteLength && b.byteOffset < a.byteOffset + a.byteLength;
}
