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
import { docStart } from './kernels/attention.js';

export interface WasmMemory { readonly buffer: SharedArrayBuffer; grow(pages: number): number }
/** An opaque compiled WebAssembly.Module (structured-cloneable to worker threads). */
export type WasmModule = object;
export interface WasmExports {
  gemm_nt(out: number, a: number, b: number, bias: number, K: number, ldo: number,
    i0: number, i1: number, j0: number, j1: number, acc: number): void;
  gemm_nn(out: number, a: number, b: number, J: number, sai: number, saj: number, ldb: number, ldo: number,
    i0: number, i1: number, c0: number, c1: number, acc: number): void;
  attn_dots(out: number, x: number, y: number, ys: number, n: number, hd: number, scale: number): void;
  attn_pv(out: number, p: number, y: number, ys: number, n: number, hd: number, acc: number): void;
  attn_outer(dst: number, a: number, x: number, ys: number, n: number, hd: number): void;
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
  /** The attention row kernels of the same instance. */
  readonly attention: AttentionKernels;

  constructor(module: WasmModule, memory: WasmMemory) {
    this.x = new (api().Instance)(module, { env: { memory } }).exports as WasmExports;
    this.attention = new AttentionKernels(this);
  }

  /** The raw exports (byte addresses), for AttentionKernels. */
  get exports(): WasmExports { return this.x; }

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
 * Causal GQA attention over the WASM row kernels (same contract as attentionForward/attentionBackward of
 * ../kernels/attention.ts, which the JS path runs): per query row, the q·k dot products, P·V, and in backward
 * the recomputed scores, dO·Vᵀ, dV += p dO, dK += dS q and dQ += dS K run as f32x4 loops; the softmax (max, exp,
 * sum, lse), P = exp(S − lse), D = dout·out and dS = P ⊙ (dP − D) · scale stay in JS float64 (WASM has no exp).
 * Every row is one fixed sequence of operations whatever range or thread it runs on, so results do not depend on
 * the thread split. Scratch rows (WASM memory, owned by the backend) are per unit / group, so ranges never share one.
 */
export class AttentionKernels {
  private readonly x: WasmExports;

  constructor(k: GemmKernels) { this.x = k.exports; }

  /**
   * Units [u0, u1) with u = b·nHeads + h; scratch: at least u1·T floats of this memory (row u·T.. holds the
   * scores, then the probabilities, of the row in progress). Writes out and lse[u·T + t].
   */
  forward(out: Float32Array, lse: Float32Array, q: Float32Array, k: Float32Array, v: Float32Array, scratch: Float32Array,
    T: number, nHeads: number, nKv: number, hd: number, u0: number, u1: number, pos: Int32Array | null = null): void {
    const x = this.x, rep = nHeads / nKv, scale = 1 / Math.sqrt(hd);
    const qs = nHeads * hd, ks = nKv * hd;
    const row = new Float64Array(T);
    for (let u = u0; u < u1; u++) {
      const bi = Math.floor(u / nHeads), h = u % nHeads, g = Math.floor(h / rep);
      const kb = k.byteOffset + 4 * (bi * T * ks + g * hd), vb = v.byteOffset + 4 * (bi * T * ks + g * hd);
      const so = u * T, sb = scratch.byteOffset + 4 * so;
      for (let t = 0; t < T; t++) {
        // keys s0..t (s0 = the document's first row): scratch element s holds key s0 + s
        const qo = (bi * T + t) * qs + h * hd, s0 = docStart(pos, bi, T, t), n = t + 1 - s0, ko = 4 * s0 * ks;
        x.attn_dots(sb, q.byteOffset + 4 * qo, kb + ko, ks, n, hd, scale);
        let mx = -Infinity;
        for (let s = 0; s < n; s++) { const sc = scratch[so + s]; if (sc > mx) mx = sc; }
        let sum = 0;
        for (let s = 0; s < n; s++) { const e = Math.exp(scratch[so + s] - mx); row[s] = e; sum += e; }
        const inv = 1 / sum;
        for (let s = 0; s < n; s++) scratch[so + s] = row[s] * inv;
        x.attn_pv(out.byteOffset + 4 * qo, sb, vb + ko, ks, n, hd, 0);
        lse[so + t] = mx + Math.log(sum);
      }
    }
  }

  /**
   * Groups [g0, g1) with gi = b·nKv + kvHead (a group owns its dk/dv rows). scratch: at least 2·g1·T floats of
   * this memory; rows 2·gi·T.. (scores, then P) and (2·gi + 1)·T.. (dP, then dS) hold the row in progress.
   */
  backward(dq: Float32Array, dk: Float32Array, dv: Float32Array, dout: Float32Array, q: Float32Array, k: Float32Array,
    v: Float32Array, out: Float32Array, lse: Float32Array, scratch: Float32Array,
    T: number, nHeads: number, nKv: number, hd: number, g0: number, g1: number, pos: Int32Array | null = null): void {
    const x = this.x, rep = nHeads / nKv, scale = 1 / Math.sqrt(hd);
    const qs = nHeads * hd, ks = nKv * hd;
    for (let gi = g0; gi < g1; gi++) {
      const bi = Math.floor(gi / nKv), g = gi % nKv;
      const ko = 4 * (bi * T * ks + g * hd);
      const kb = k.byteOffset + ko, vb = v.byteOffset + ko, dkb = dk.byteOffset + ko, dvb = dv.byteOffset + ko;
      const po = 2 * gi * T, pb = scratch.byteOffset + 4 * po, so = po + T, sb = scratch.byteOffset + 4 * so;
      for (let r = 0; r < rep; r++) {
        const h = g * rep + r, u = bi * nHeads + h;
        for (let t = 0; t < T; t++) {
          // keys s0..t (s0 = the document's first row): scratch element s holds key s0 + s
          const qe = (bi * T + t) * qs + h * hd, qo = 4 * qe, s0 = docStart(pos, bi, T, t), n = t + 1 - s0, o0 = 4 * s0 * ks;
          x.attn_dots(pb, q.byteOffset + qo, kb + o0, ks, n, hd, scale); // S (the forward's scores, bit for bit)
          x.attn_dots(sb, dout.byteOffset + qo, vb + o0, ks, n, hd, 1); // dP
          const l = lse[u * T + t];
          let dsum = 0;
          for (let d = 0; d < hd; d++) dsum += dout[qe + d] * out[qe + d];
          for (let s = 0; s < n; s++) {
            const p = Math.exp(scratch[po + s] - l);
            scratch[po + s] = p;
            scratch[so + s] = p * (scratch[so + s] - dsum) * scale; // dS
          }
          x.attn_outer(dvb + o0, pb, dout.byteOffset + qo, ks, n, hd);
          x.attn_outer(dkb + o0, sb, q.byteOffset + qo, ks, n, hd);
          x.attn_pv(dq.byteOffset + qo, sb, kb + o0, ks, n, hd, 1);
        }
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
    const off = this.reserve(n);
    return new Float32Array(this.current, off, n);
  }

  /** A fresh zero-filled Int32Array of n elements in the memory (token ids, targets: cheap to post to workers). */
  allocInt(n: number): Int32Array {
    const off = this.reserve(n);
    return new Int32Array(this.current, off, n);
  }

  /** Reserves n 4-byte elements (16-byte aligned) and returns their byte offset; grows the memory when needed. */
  private reserve(n: number): number {
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
    return off;
  }

  /** Whether `a` is a view of this arena's memory (so its byteOffset is an address the kernels can use). */
  owns(a: ArrayBufferView): boolean {
    return this.buffers.has(a.buffer);
  }
}
