/**
 * The sparse teacher of a batch, on the host and on the device: the SparseTargets a backend's sparseLossForward reads
 * ([rows, slots] ids, weights π, log q_t; per row the tail mass and the teacher's argmax).
 */
import type { Backend, HostStaging, SparseTargets } from '../backend/backend.js';
import type { SparseEntry, SparseRep } from './sparse.js';
import { sparseSlots } from './sparse.js';

/**
 * A batch's sparse rows on the host, in the dtype of the backend's float buffers (float32 on the device and in runs:
 * values stored rounded once, as an upload from float64 would round them, so staging uploads the arrays as they are,
 * without a converted copy per array per step; float64 for the CPU backend's f64 reference mode in tests).
 */
export interface SparseHost {
  slots: number;
  ids: Int32Array;
  prob: Float32Array | Float64Array;
  logq: Float32Array | Float64Array;
  tail: Float32Array | Float64Array;
  argmax: Int32Array;
}

/**
 * Where allocSparseHost puts a SparseHost's arrays in one buffer (byte offsets), and the buffer's size: the float
 * arrays first (prob, logq: rows·slots; tail: rows), so each starts at a multiple of its element size, then the ints
 * (ids: rows·slots; argmax: rows).
 */
function sparseHostLayout(rows: number, slots: number, dtype: 'f32' | 'f64') {
  const fb = dtype === 'f64' ? 8 : 4, rs = rows * slots, ids = (2 * rs + rows) * fb, argmax = ids + rs * 4;
  return { fb, rs, prob: 0, logq: rs * fb, tail: 2 * rs * fb, ids, argmax, bytes: argmax + rows * 4 };
}

/** Bytes of one SparseHost of `rows` rows of `slots` in one buffer (allocSparseHost's layout). */
export function sparseHostBytes(rows: number, slots: number, dtype: 'f32' | 'f64' = 'f32'): number {
  return sparseHostLayout(rows, slots, dtype).bytes;
}

/**
 * Empty sparse rows (ids −1, tail −1) for `rows` rows of `slots`; with `buffer` (at least sparseHostBytes), its arrays
 * are views of it (sparseHostLayout).
 */
export function allocSparseHost(rows: number, slots: number, dtype: 'f32' | 'f64' = 'f32', buffer?: ArrayBuffer): SparseHost {
  const L = sparseHostLayout(rows, slots, dtype);
  const buf = buffer ?? new ArrayBuffer(L.bytes);
  if (buf.byteLength < L.bytes) throw new RangeError(`a buffer of ${buf.byteLength} bytes for ${rows} sparse rows of ${slots} slots`);
  const f = (n: number, at: number): Float32Array | Float64Array => (dtype === 'f64' ? new Float64Array(buf, at, n) : new Float32Array(buf, at, n));
  const h: SparseHost = {
    slots, prob: f(L.rs, L.prob), logq: f(L.rs, L.logq), tail: f(rows, L.tail),
    ids: new Int32Array(buf, L.ids, L.rs), argmax: new Int32Array(buf, L.argmax, rows),
  };
  // the buffer may hold anything (page-locked memory is not zeroed)
  h.prob.fill(0); h.logq.fill(0); h.tail.fill(-1); h.ids.fill(-1); h.argmax.fill(0);
  return h;
}

/**
 * Host buffers reused in turn: `size` of them, handed out round-robin, so a buffer comes back only after size − 1 others.
 * A cached run decodes its training batches into a ring of two steps' micro-batches: the step on the device and the one
 * the look-ahead fills. A batch's rows are uploaded when its pass is staged, and after its step a checkpoint may stage
 * micro[0] again as the probe of the new weights, after the look-ahead filled the other half: two steps' worth is what
 * keeps that batch intact. A new ~5.7 MB of typed arrays per 8×1024 batch (float64 rows and their float32 copies) made
 * V8 run a ~90 ms mark-compact about every 12 steps on the GPU machine.
 * With `staging` (Backend.hostStaging), each buffer lives in memory that uploads read in place (page-locked on CUDA: the
 * next step's rows are queued behind the optimizer without waiting for it), and take() first settles the uploads made
 * from the buffer it hands out, so rows are never written while a copy of the old ones is pending.
 */
export class SparseRing {
  private readonly hosts: Array<{ h: SparseHost; staging: HostStaging | null }> = [];
  private next = 0;
  constructor(readonly size: number, private readonly rows: number, private readonly slots: number, private readonly dtype: 'f32' | 'f64' = 'f32',
    private readonly staging?: (bytes: number, label: string) => HostStaging) {
    if (!(Number.isInteger(size) && size >= 1)) throw new RangeError(`a sparse ring of ${size} buffers`);
  }
  take(): SparseHost {
    const i = this.next++ % this.size;
    let e = this.hosts[i];
    if (e === undefined) {
      const st = this.staging?.(sparseHostBytes(this.rows, this.slots, this.dtype), `the teacher cache's rows (${i})`) ?? null;
      e = this.hosts[i] = { h: allocSparseHost(this.rows, this.slots, this.dtype, st?.buffer), staging: st };
    }
    e.staging?.settle();
    return e.h;
  }
}

/**
 * The weight π of a token drawn by a sample:N cache: q_t / P(drawn) with P(drawn) = min(1, N·q_t) under systematic
 * sampling (src/cache/sparse.ts), i.e. max(q_t, 1/N). Its importance weight π / q_t = 1 / P(drawn) makes
 * Σ_k a_k h_k an unbiased estimate of Σ_j h_j (Horvitz–Thompson); a token of q_t ≥ 1/N is always drawn and weighs
 * exactly its probability.
 */
export function sampleWeight(logq: number, n: number): number {
  return Math.max(Math.exp(logq), 1 / n);
}

/** Row `row` of h from a SparseEntry of representation `rep` (empty slots: id −1, π 0), or a row with no slots when null. */
export function setSparseRow(h: SparseHost, row: number, e: SparseEntry | null, rep: SparseRep): void {
  const S = h.slots, o = row * S;
  h.ids.fill(-1, o, o + S); h.prob.fill(0, o, o + S); h.logq.fill(0, o, o + S);
  if (e === null) { h.tail[row] = -1; h.argmax[row] = -1; return; }
  if (e.ids.length > S) throw new RangeError(`a sparse row has ${e.ids.length} ids for ${S} slots`);
  const n = rep.kind === 'sample' ? rep.n : 0;
  for (let k = 0; k < e.ids.length; k++) {
    h.ids[o + k] = e.ids[k]!;
    h.logq[o + k] = e.logq[k]!;
    h.prob[o + k] = rep.kind === 'sample' ? sampleWeight(e.logq[k]!, n) : Math.exp(e.logq[k]!);
  }
  h.tail[row] = e.tail;
  h.argmax[row] = e.argmax;
}

/** Device buffers for up to `rows` rows of a representation's slots. */
export class SparseDevice {
  readonly targets: SparseTargets;
  constructor(private readonly be: Backend, readonly rows: number, readonly rep: SparseRep) {
    const S = sparseSlots(rep);
    this.targets = {
      slots: S, ids: be.allocInt(rows * S, 'teacher cache ids'), prob: be.alloc(rows * S, 'teacher cache weights'),
      logq: be.alloc(rows * S, 'teacher cache log-probabilities'), tail: be.alloc(rows, 'teacher cache tail mass'),
      argmax: be.allocInt(rows, 'teacher cache argmax'), withTail: rep.kind === 'top',
    };
  }

  /** Uploads the first n rows of h (before a captured region's work). */
  stage(h: SparseHost, n: number): void {
    const S = this.targets.slots, be = this.be, t = this.targets;
    if (h.slots !== S) throw new RangeError(`sparse rows of ${h.slots} slots for buffers of ${S}`);
    if (n > this.rows) throw new RangeError(`${n} sparse rows for buffers of ${this.rows}`);
    be.uploadInt(t.ids, h.ids.subarray(0, n * S));
    be.upload(t.prob, h.prob.subarray(0, n * S));
    be.upload(t.logq, h.logq.subarray(0, n * S));
    be.upload(t.tail, h.tail.subarray(0, n));
    be.uploadInt(t.argmax, h.argmax.subarray(0, n));
  }

  /** A view of rows [r0, r0 + rows). */
  view(r0: number, rows: number): SparseTargets {
    const S = this.targets.slots, be = this.be, t = this.targets;
    return {
      slots: S, ids: be.viewInt(t.ids, r0 * S, rows * S), prob: be.view(t.prob, r0 * S, rows * S), logq: be.view(t.logq, r0 * S, rows * S),
      tail: be.view(t.tail, r0, rows), argmax: be.viewInt(t.argmax, r0, rows), withTail: t.withTail === true,
    };
  }
}
