/**
 * The WebAssembly SIMD side of the CPU backend: loading the kernels of wasm/gemm.wat (assembled to
 * wasm/gemm.wasm next to this file's compiled .js by scripts/build-wasm.mjs), the one shared linear memory
 * that every float32 buffer of a backend lives in (WasmArena), and typed wrappers of the kernels.
 *
 * WASM code can only address its own linear memory, so in f32 mode the backend allocates every float buffer
 * from one shared WebAssembly.Memory with a bump allocator (16-byte aligned; the model allocates everything up
 * front, so nothing is freed before dispose()). The buffers stay ordinary Float32Array views, so every JS
 * kernel works on them unchanged, and a buffer's byteOffset is its address for the WASM kernels. The memory is
 * shared, so growing it never detaches the views made before; new views are made over the grown
 * memory.buffer. Worker threads receive the Memory and the compiled Module once (workerData) and instantiate
 * the same kernels over the same memory.
 *
 * Node 20's type definitions carry no WebAssembly namespace, so the few members used here are typed locally.
 */
import { readFileSync } from 'node:fs';

export interface WasmMemory { readonly buffer: SharedArrayBuffer; grow(pages: number): number }
/** An opaque compiled WebAssembly.Module (structured-cloneable to worker threads). */
export type WasmModule = object;
interface WasmExports {
  gemm_nt(out: number, a: number, b: number, bias: number, K: number, ldo: number,
    i0: number, i1: number, j0: number, j1: number, acc: number): void;
  gemm_nn(out: number, a: number, b: number, J: number, sai: number, saj: number, ldb: number, ldo: number,
    i0: number, i1: number, c0: number, c1: number, acc: number): void;
}
interface WasmApi {
  validate(bytes: Uint8Array): boolean;
  Module: new (bytes: Uint8Array) => WasmModule;
  Instance: new (m: WasmModule, imports: object) => { exports: unknown };
  Memory: new (d: { initial: number; maximum: number; shared: boolean }) => WasmMemory;
}

const PAGE = 65536;
const MAX_PAGES = 65536;
/** Bytes of B rows kept hot per column block of gemm_nt (a typical per-core L2 share). */
const BLOCK_BYTES = 128 * 1024;
/** gemm_nn blocking (measured on the 2-core dev machine with bench/matmul.ts shapes; see nn()). */
const NN_J_BLOCK = 256, NN_C_BLOCK = 256;

let loaded: { module: WasmModule } | { error: string } | undefined;

/**
 * The compiled kernel module, or the reason it cannot be used (no WebAssembly, no SIMD or shared memory in
 * this runtime, or a missing gemm.wasm). Compiled once per thread, synchronously (the module is ~3 KB).
 */
export function wasmModule(): { module: WasmModule } | { error: string } {
  if (loaded !== undefined) return loaded;
  try {
    const api = (globalThis as unknown as { WebAssembly?: WasmApi }).WebAssembly;
    if (api === undefined) return (loaded = { error: 'WebAssembly is not available' });
    const bytes = readFileSync(new URL('./wasm/gemm.wasm', import.meta.url));
    if (!api.validate(bytes)) return (loaded = { error: 'this runtime does not support WebAssembly SIMD and threads' });
    loaded = { module: new api.Module(bytes) };
  } catch (e) {
    loaded = { error: e instanceof Error ? e.message : String(e) };
  }
  return loaded;
}

function api(): WasmApi {
  return (globalThis as unknown as { WebAssembly: WasmApi }).WebAssembly;
}

/**
 * The matrix-product kernels over one memory. Arrays are Float32Array views of that memory (the caller
 * checks, see WasmArena.owns); ranges and strides are in elements.
 */
export class GemmKernels {
  private readonly x: WasmExports;

  constructor(module: WasmModule, memory: WasmMemory) {
    this.x = new (api().Instance)(module, { env: { memory } }).exports as WasmExports;
  }

  /** out[i*ldo + j] (+)= bias[j] + Σ_{k<K} A[i*K + k] · B[j*K + k] for i in [i0, i1), j in [j0, j1). */
  nt(out: Float32Array, a: Float32Array, b: Float32Array, bias: Float32Array | null, K: number, ldo: number,
    i0: number, i1: number, j0: number, j1: number, accumulate: boolean): void {
    const jBlock = Math.max(8, Math.floor(BLOCK_BYTES / Math.max(1, 4 * K)) & ~1);
    const acc = accumulate ? 1 : 0, pb = bias === null ? 0 : bias.byteOffset;
    for (let jb = j0; jb < j1; jb += jBlock) {
      this.x.gemm_nt(out.byteOffset, a.byteOffset, b.byteOffset, pb, K, ldo, i0, i1, jb, Math.min(j1, jb + jBlock), acc);
    }
  }

  /**
   * out[i*ldo + c] (+)= Σ_{j<J} A[i*sai + j*saj] · B[j*ldb + c] for i in [i0, i1), c in [c0, c1).
   * The sum runs over j in fixed blocks of NN_J_BLOCK (each block's sum is added to out in order; the first one
   * overwrites unless accumulating) and columns in blocks of NN_C_BLOCK, so the strips of A and B a tile streams
   * stay in cache (2-3× faster than one pass when J is in the thousands). The j blocks do not depend on [i0, i1)
   * or [c0, c1), so a thread split does not change any element's arithmetic.
   */
  nn(out: Float32Array, a: Float32Array, b: Float32Array, J: number, sai: number, saj: number, ldb: number, ldo: number,
    i0: number, i1: number, c0: number, c1: number, accumulate: boolean): void {
    for (let j0 = 0; j0 < J; j0 += NN_J_BLOCK) {
      const jn = Math.min(J, j0 + NN_J_BLOCK) - j0;
      const pa = a.byteOffset + 4 * j0 * saj, pb = b.byteOffset + 4 * j0 * ldb;
      const acc = accumulate || j0 > 0 ? 1 : 0;
      for (let cb = c0; cb < c1; cb += NN_C_BLOCK) {
        this.x.gemm_nn(out.byteOffset, pa, pb, jn, sai, saj, ldb, ldo, i0, i1, cb, Math.min(c1, cb + NN_C_BLOCK), acc);
      }
    }
  }
}

/**
 * A bump allocator of float32 buffers over one shared WebAssembly.Memory (16-byte aligned, zero-filled:
 * memory is never reused). The first 16 bytes are never handed out, so address 0 can mean "none".
 */
export class WasmArena {
  readonly memory: WasmMemory;
  private top = 16;
  /** Every SharedArrayBuffer object memory.buffer has returned (one per size): the arrays over them are ours. */
  private readonly buffers = new WeakSet<ArrayBufferLike>();
  private current: SharedArrayBuffer;

  constructor(initialBytes = 1 << 20) {
    const initial = Math.max(1, Math.ceil(initialBytes / PAGE));
    this.memory = new (api().Memory)({ initial, maximum: MAX_PAGES, shared: true });
    this.current = this.memory.buffer;
    this.buffers.add(this.current);
  }

  /** Bytes of the memory (grows, never shrinks). */
  get byteLength(): number { return this.memory.buffer.byteLength; }

  /** A fresh zero-filled Float32Array of n elements in the memory; grows the memory when needed. */
  alloc(n: number): Float32Array {
    const off = this.top;
    const end = off + Math.ceil((n * 4) / 16) * 16;
    if (end > this.current.byteLength) {
      const have = this.current.byteLength / PAGE;
      const need = Math.ceil(end / PAGE);
      if (need > MAX_PAGES) throw new RangeError(`cpu backend: out of WebAssembly memory (${end} bytes > 4 GiB)`);
      // Grow by at least 1/4 of the current size, so a model allocating many buffers grows it a few times only.
      this.memory.grow(Math.min(MAX_PAGES, Math.max(need, Math.ceil(have * 1.25))) - have);
      this.current = this.memory.buffer;
      this.buffers.add(this.current);
    }
    this.top = end;
    return new Float32Array(this.current, off, n);
  }

  /** Whether `a` is a view of this arena's memory (so its byteOffset is an address the kernels can use). */
  owns(a: ArrayBufferView): boolean {
    return this.buffers.has(a.buffer);
  }
}
