/**
 * The units of work the CPU backend hands to its worker threads, and the dispatcher that runs one.
 * A task is a plain object whose typed arrays are backed by SharedArrayBuffers (in f32 mode: views of the
 * backend's shared WebAssembly.Memory), so posting it to a worker shares the memory instead of copying it.
 * A ChunkedTask is one task cut into ranges that the main thread and the workers claim from a shared counter,
 * all through the same runChunks. Products marked `wasm` run the WebAssembly SIMD kernels of the thread's
 * GemmKernels instance (over the same memory); the others run the JS kernels.
 */
import type { AdamWStep, LossSpec, RopeSpec } from '../backend.js';
import { rotateRows } from './kernels/rope.js';
import { adamw, swigluBackward, swigluBackwardRows, swigluForward, swigluForwardRows } from './kernels/elementwise.js';
import { attentionBackward, attentionForward } from './kernels/attention.js';
import { gemmNT } from './kernels/gemm.js';
import { lossRows } from './kernels/loss.js';
import { quantizeNf4Blocks } from '../../quant/nf4.js';
import type { FArr } from './kernels/types.js';
import type { GemmKernels } from './wasm.js';

export interface GemmTask {
  op: 'gemm';
  out: FArr; a: FArr; b: FArr; bias: FArr | null;
  k: number; ldo: number; i0: number; i1: number; j0: number; j1: number; accumulate: boolean;
  /** Run the WASM kernel (every array is a Float32Array view of the backend's WASM memory). */
  wasm: boolean;
}
/** out[i, c] (+)= Σ_j A[i*sai + j*saj] · B[j*ldb + c] (WASM only; i in [i0, i1), c in [j0, j1)). */
export interface GemmNNTask {
  op: 'gemmNN';
  out: Float32Array; a: Float32Array; b: Float32Array;
  J: number; sai: number; saj: number; ldb: number; ldo: number; i0: number; i1: number; j0: number; j1: number; accumulate: boolean;
}
export interface AttnForwardTask {
  op: 'attnF';
  out: FArr; lse: FArr; q: FArr; k: FArr; v: FArr;
  t: number; nHeads: number; nKv: number; hd: number; u0: number; u1: number;
  /** WASM only: per-unit scratch rows (b·nHeads·t floats of the WASM memory); null on the JS path. */
  scratch: Float32Array | null;
  /** Document positions [b·t] (Backend DocPositions), or null. */
  pos: Int32Array | null;
}
export interface AttnBackwardTask {
  op: 'attnB';
  dq: FArr; dk: FArr; dv: FArr; dout: FArr; q: FArr; k: FArr; v: FArr; out: FArr; lse: FArr;
  t: number; nHeads: number; nKv: number; hd: number; g0: number; g1: number;
  /** WASM only: per-group scratch rows (2·b·nKv·t floats of the WASM memory); null on the JS path. */
  scratch: Float32Array | null;
  /** Document positions [b·t] (Backend DocPositions), or null. */
  pos: Int32Array | null;
}
export interface LossTask {
  op: 'loss';
  stats: FArr; dlogits: FArr | null; logits: FArr; teacher: FArr | null; targets: Int32Array; weights: FArr;
  vocab: number; ld: number; spec: LossSpec; r0: number; r1: number;
}
/**
 * An elementwise op over elements [i0, i1) (each element depends on its own inputs only, so any split gives
 * the same bits): swigluF out=x0 gate=x1 up=x2; swigluB dgate=x0 dup=x1 dout=x2 gate=x3 up=x4;
 * adamw param=x0 grad=x1 m=x2 v=x3 with `adam`. The row forms, over rows [i0, i1) of `cols` columns, each row of
 * the joined gate/up [rows, 2·cols] its gate half then its up half: swigluFR out=x0 gu=x1; swigluBR dgu=x0
 * (overwritten) dout=x1 gu=x2.
 */
export interface ElementwiseTask {
  op: 'ew';
  fn: 'swigluF' | 'swigluB' | 'adamw' | 'swigluFR' | 'swigluBR';
  x0: FArr; x1: FArr; x2: FArr | null; x3: FArr | null; x4: FArr | null;
  adam: AdamWStep | null; i0: number; i1: number;
  /** Columns of a row form (0 for the others). */
  cols: number;
}
/**
 * Token rows [r0, r1) of a rotary embedding (kernels/rope.ts rotateRows: sign 1 the forward rotation of inp + bias,
 * −1 the backward); out may alias inp with equal strides (each row is read before it is written, by one thread).
 */
export interface RopeTask {
  op: 'rope';
  out: FArr; inp: FArr; bias: FArr | null;
  t: number; heads: number; hd: number; rope: RopeSpec; pos0: number; sign: 1 | -1; accumulate: boolean; so: number; si: number;
  r0: number; r1: number;
  /** Document positions [b·t] (Backend DocPositions): row r at rowPos[r] instead of pos0 + r mod t; or null. */
  rowPos: Int32Array | null;
}
/** Blocks [b0, b1) of an NF4 quantization (src/quant/nf4.ts); x, codes and absmax SharedArrayBuffer-backed. */
export interface Nf4Task {
  op: 'nf4';
  x: Float32Array; codes: Uint8Array; absmax: Float32Array; n: number; blockSize: number; b0: number; b1: number;
}
export type Task = GemmTask | GemmNNTask | AttnForwardTask | AttnBackwardTask | LossTask | ElementwiseTask | RopeTask | Nf4Task;

/** Which index range of a task a chunk sets: gemm rows (i) or columns (j), or the op's own unit range. */
export type ChunkAxis = 'rows' | 'cols';

/**
 * A task split into chunks that threads claim one at a time from a shared counter (dynamic scheduling):
 * a thread that is descheduled by other load on the machine simply claims fewer chunks.
 * ranges holds [start0, end0, start1, end1, ...] of the task's split axis.
 */
export interface ChunkedTask { op: 'chunked'; counter: Int32Array; base: Task; axis: ChunkAxis; ranges: Int32Array }

/** The base task restricted to [a, b) along its split axis. */
function withRange(x: Task, axis: ChunkAxis, a: number, b: number): Task {
  switch (x.op) {
    case 'gemm': return axis === 'rows' ? { ...x, i0: a, i1: b } : { ...x, j0: a, j1: b };
    case 'gemmNN': return axis === 'rows' ? { ...x, i0: a, i1: b } : { ...x, j0: a, j1: b };
    case 'attnF': return { ...x, u0: a, u1: b };
    case 'attnB': return { ...x, g0: a, g1: b };
    case 'loss': return { ...x, r0: a, r1: b };
    case 'ew': return { ...x, i0: a, i1: b };
    case 'rope': return { ...x, r0: a, r1: b };
    case 'nf4': return { ...x, b0: a, b1: b };
  }
}

/** Claims and runs chunks until none is left; `wasm` runs the products marked wasm (null: none may be). */
export function runChunks(c: ChunkedTask, wasm: GemmKernels | null): void {
  const n = c.ranges.length >> 1;
  for (;;) {
    const i = Atomics.add(c.counter, 0, 1);
    if (i >= n) return;
    runTask(withRange(c.base, c.axis, c.ranges[2 * i]!, c.ranges[2 * i + 1]!), wasm);
  }
}

function needWasm(wasm: GemmKernels | null): GemmKernels {
  if (wasm === null) throw new Error('cpu backend: a WASM product was posted to a thread without the WASM kernels');
  return wasm;
}

export function runTask(x: Task, wasm: GemmKernels | null): void {
  switch (x.op) {
    case 'gemm':
      if (x.wasm) {
        needWasm(wasm).nt(x.out as Float32Array, x.a as Float32Array, x.b as Float32Array, x.bias as Float32Array | null,
          x.k, x.ldo, x.i0, x.i1, x.j0, x.j1, x.accumulate);
      } else {
        gemmNT(x.out, x.a, x.b, x.bias, x.k, x.ldo, x.i0, x.i1, x.j0, x.j1, x.accumulate);
      }
      return;
    case 'gemmNN':
      needWasm(wasm).nn(x.out, x.a, x.b, x.J, x.sai, x.saj, x.ldb, x.ldo, x.i0, x.i1, x.j0, x.j1, x.accumulate);
      return;
    case 'attnF':
      if (x.scratch !== null) {
        needWasm(wasm).attention.forward(x.out as Float32Array, x.lse as Float32Array, x.q as Float32Array, x.k as Float32Array,
          x.v as Float32Array, x.scratch, x.t, x.nHeads, x.nKv, x.hd, x.u0, x.u1, x.pos);
      } else {
        attentionForward(x.out, x.lse, x.q, x.k, x.v, x.t, x.nHeads, x.nKv, x.hd, x.u0, x.u1, x.pos);
      }
      return;
    case 'attnB':
      if (x.scratch !== null) {
        needWasm(wasm).attention.backward(x.dq as Float32Array, x.dk as Float32Array, x.dv as Float32Array, x.dout as Float32Array,
          x.q as Float32Array, x.k as Float32Array, x.v as Float32Array, x.out as Float32Array, x.lse as Float32Array, x.scratch,
          x.t, x.nHeads, x.nKv, x.hd, x.g0, x.g1, x.pos);
      } else {
        attentionBackward(x.dq, x.dk, x.dv, x.dout, x.q, x.k, x.v, x.out, x.lse, x.t, x.nHeads, x.nKv, x.hd, x.g0, x.g1, x.pos);
      }
      return;
    case 'loss':
      lossRows(x.stats, x.dlogits, x.logits, x.teacher, x.targets, x.weights, x.vocab, x.spec, x.r0, x.r1, x.ld);
      return;
    case 'rope':
      rotateRows(x.out, x.inp, x.t, x.heads, x.hd, x.rope, x.pos0, x.sign, x.accumulate, x.sign === 1 ? 'ropeForward' : 'ropeBackward',
        x.bias, x.so, x.si, x.r0, x.r1, x.rowPos);
      return;
    case 'nf4':
      quantizeNf4Blocks(x.x, { n: x.n, blockSize: x.blockSize, codes: x.codes, absmax: x.absmax }, x.b0, x.b1);
      return;
    case 'ew': {
      const a = x.i0, b = x.i1, n = b - a;
      if (x.fn === 'swigluF') swigluForward(x.x0.subarray(a, b), x.x1.subarray(a, b), x.x2!.subarray(a, b), n);
      else if (x.fn === 'swigluB') {
        swigluBackward(x.x0.subarray(a, b), x.x1.subarray(a, b), x.x2!.subarray(a, b), x.x3!.subarray(a, b), x.x4!.subarray(a, b), n);
      } else if (x.fn === 'swigluFR') swigluForwardRows(x.x0, x.x1, a, b, x.cols);
      else if (x.fn === 'swigluBR') swigluBackwardRows(x.x0, x.x1, x.x2!, a, b, x.cols);
      else adamw(x.x0.subarray(a, b), x.x1.subarray(a, b), x.x2!.subarray(a, b), x.x3!.subarray(a, b), n, x.adam!);
      return;
    }
  }
}

/** A view of the backend's WebAssembly memory as it travels to a worker: kind (f32 or i32), byte offset, length. */
interface ArenaRef { $arena: 'f32' | 'i32'; o: number; n: number }

/**
 * The task with every Float32Array/Int32Array view of the WASM memory (`owns`) replaced by an ArenaRef, so
 * posting it clones a few numbers instead of a WebAssembly.Memory-backed SharedArrayBuffer (see pool.ts).
 */
export function packTask(x: Task, owns: (a: ArrayBufferView) => boolean): Task {
  const out: Record<string, unknown> = {};
  for (const [key, v] of Object.entries(x)) {
    if ((v instanceof Float32Array || v instanceof Int32Array) && owns(v)) {
      out[key] = { $arena: v instanceof Float32Array ? 'f32' : 'i32', o: v.byteOffset, n: v.length } satisfies ArenaRef;
    } else {
      out[key] = v;
    }
  }
  return out as unknown as Task;
}

/** Undoes packTask in a worker: ArenaRefs become views of `memory` (this thread's handle on the same memory). */
export function unpackTask(x: Task, memory: { readonly buffer: SharedArrayBuffer }): Task {
  const out: Record<string, unknown> = {};
  let buf: SharedArrayBuffer | null = null;
  for (const [key, v] of Object.entries(x)) {
    if (v !== null && typeof v === 'object' && '$arena' in v) {
      const r = v as ArenaRef;
      buf ??= memory.buffer; // a fresh object after the memory grew, covering all of it
      out[key] = r.$arena === 'f32' ? new Float32Array(buf, r.o, r.n) : new Int32Array(buf, r.o, r.n);
    } else {
      out[key] = v;
    }
  }
  return out as unknown as Task;
}

/** Splits [0, total) into at most `parts` contiguous ranges whose starts are multiples of `align`. */
export function splitRange(total: number, parts: number, align = 1): Array<[number, number]> {
  const units = Math.ceil(total / align);
  const p = Math.max(1, Math.min(parts, units));
  const out: Array<[number, number]> = [];
  for (let i = 0; i < p; i++) {
    const a = Math.min(total, Math.floor((units * i) / p) * align);
    const b = Math.min(total, Math.floor((units * (i + 1)) / p) * align);
    if (b > a) out.push([a, b]);
  }
  return out;
}
