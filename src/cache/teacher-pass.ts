/**
 * The teacher's side of a teacher-cache job: the forward over a batch of windows (one captured region: a CUDA graph
 * once the shape repeats), then, chunk by chunk of rows, the LM head over the loss vocabulary and the sparse rows of
 * those logits on the device (Backend.sparseTeacherRows: the systematic draws, or the top K), of which only the small
 * result comes to the host. The full [tokens, vocab] logits never exist: one chunk of rows at a time
 * (src/train/head.ts sizes them), and on the GPU no logits cross the bus for a sample cache.
 *
 * The kernel plan of the job (src/train/kernel-plan.ts, `cacheTeacher`) runs this same class on the tracing backend.
 */
import type { Buf, Readback, SparseRowsOut } from '../backend/backend.js';
import type { Transformer } from '../model/transformer.js';
import { DistilleryError } from '../util/errors.js';
import { headChunkRows, headWidth } from '../train/head.js';
import type { SparseEntry, SparseRowRep } from '../backend/cpu/kernels/sparse-rows.js';

/** A pass's sparse rows on the host: the chunks [r0, rows] computed, `slots` entries per row (id −1: unused). */
export interface PassRows {
  chunks: Array<[number, number]>;
  slots: number;
  ids: Int32Array;
  logq: Float32Array | Float64Array;
  tail: Float32Array | Float64Array;
  argmax: Int32Array;
}

/** A queued pass: its chunks, its row count and the readback its rows come back through (none without chunks). */
interface Pending { chunks: Array<[number, number]>; n: number; rb: Readback | null }

/** How many ids row r of a pass holds (its slots up to the first −1). */
export function rowIds(h: PassRows, r: number): number {
  const S = h.slots, o = r * S;
  let n = 0;
  while (n < S && h.ids[o + n]! >= 0) n++;
  return n;
}

export class TeacherPass {
  readonly width: number;
  readonly chunkRows: number;
  readonly slots: number;
  private readonly z: Buf;
  private readonly u: Buf;
  private readonly out: SparseRowsOut;
  /** Two readbacks, used in turn: one pass's rows are read on the host while the next pass's copies are queued. */
  private readonly rbs: [Readback, Readback];
  private nextRb = 0;
  private readonly pending: Pending[] = [];

  constructor(readonly teacher: Transformer, readonly lossVocab: number, readonly temperature: number, readonly rep: SparseRowRep,
    chunkFloats?: number) {
    const v = teacher.config.vocabSize, be = teacher.backend;
    if (!(Number.isInteger(lossVocab) && lossVocab >= 1 && lossVocab <= v)) {
      throw new DistilleryError(`the loss vocabulary (${lossVocab}) must be between 1 and the teacher's vocab_size (${v})`);
    }
    this.width = headWidth(lossVocab, v);
    this.chunkRows = headChunkRows(teacher.batch * teacher.seq, this.width, chunkFloats);
    this.slots = rep.kind === 'sample' ? rep.n : Math.min(rep.k, lossVocab);
    // Logits for one chunk of rows; the small sparse results for every row of the batch, so the chunks run back to back
    // on the device and the results cross the bus once per batch.
    const R = this.chunkRows, N = teacher.batch * teacher.seq, S = this.slots;
    this.z = be.alloc(R * this.width, 'teacher logits (one chunk of rows)');
    this.u = be.alloc(N, 'teacher cache uniforms');
    const o: SparseRowsOut = this.out = {
      slots: S, ids: be.allocInt(N * S, 'teacher cache ids'), logq: be.alloc(N * S, 'teacher cache log-probabilities'),
      tail: be.alloc(N, 'teacher cache tail mass'), argmax: be.allocInt(N, 'teacher cache argmax'),
    };
    const rb = (k: number): Readback => be.readback([o.logq, o.tail], [o.ids, o.argmax], `the teacher cache's rows (${k})`);
    this.rbs = [rb(0), rb(1)];
  }

  /**
   * Runs the teacher over ids [b, t]; for each chunk of rows that `wanted(r0, rows)` asks for, computes their sparse rows
   * (row r's draws from uniform(r)) and calls onRows(entries, r0) with one SparseEntry per row of the chunk.
   * start + collect + TeacherPass.entries; a job that overlaps the host's share with the device's calls them itself.
   */
  run(ids: Int32Array, b: number, t: number, uniform: (row: number) => number,
    onRows: (entries: SparseEntry[], r0: number) => void, wanted: (r0: number, rows: number) => boolean = () => true,
    positions: Int32Array | null = null): void {
    this.start(ids, b, t, uniform, wanted, positions);
    const h = this.collect();
    if (h) TeacherPass.entries(h, onRows);
  }

  /** Passes queued and not yet collected (at most 2). */
  get queued(): number { return this.pending.length; }

  /**
   * Queues the pass over ids [b, t] on the device (asynchronous on CUDA): the uniforms go up first, every chunk's
   * sparse rows stay on the device, then their copies to the host are queued. Two passes may be pending: the device
   * runs the second while the host reads the first's rows (collect). Every op is ordered on the device's stream, so
   * one set of device buffers serves both: the second pass overwrites the rows only after the first's copies.
   * `positions`: each row's position in its document ('bfd' windows; a teacher made with `documents`), or null.
   */
  start(ids: Int32Array, b: number, t: number, uniform: (row: number) => number, wanted: (r0: number, rows: number) => boolean = () => true,
    positions: Int32Array | null = null): void {
    const m = this.teacher, be = m.backend, C = m.config.hiddenSize, V = this.width, n = b * t, S = this.slots;
    if (this.pending.length >= 2) throw new Error('TeacherPass.start: two passes are pending; collect one first');
    if (n > m.batch * m.seq) throw new DistilleryError(`a teacher-cache pass of ${b} × ${t} exceeds the teacher's ${m.batch} × ${m.seq}`);
    const chunks: Array<[number, number]> = [];
    for (let r0 = 0; r0 < n; r0 += this.chunkRows) {
      const rows = Math.min(this.chunkRows, n - r0);
      if (wanted(r0, rows)) chunks.push([r0, rows]);
    }
    if (chunks.length === 0) { this.pending.push({ chunks, n, rb: null }); return; }
    m.stageInputs(ids, b, t, positions);
    const uniforms = new Float32Array(n);
    for (let r = 0; r < n; r++) uniforms[r] = uniform(r);
    be.upload(be.view(this.u, 0, n), uniforms);
    const hidden = be.captured('teacher cache pass', () => m.forwardStaged(b, t));
    const w = be.view(m.headWeight(), 0, V * C);
    for (const [r0, rows] of chunks) {
      const z = be.view(this.z, 0, rows * V);
      be.matmulForward(z, be.view(hidden, r0 * C, rows * C), w, null, rows, C, V);
      const o = this.out;
      const view: SparseRowsOut = {
        slots: S, ids: be.viewInt(o.ids, r0 * S, rows * S), logq: be.view(o.logq, r0 * S, rows * S),
        tail: be.view(o.tail, r0, rows), argmax: be.viewInt(o.argmax, r0, rows),
      };
      be.sparseTeacherRows(view, z, be.view(this.u, r0, rows), rows, this.lossVocab, this.temperature, this.rep.kind, V);
    }
    const rb = this.rbs[this.nextRb]!;
    this.nextRb ^= 1;
    rb.queue();
    this.pending.push({ chunks, n, rb });
  }

  /**
   * The oldest pending pass's sparse rows on the host (waits for them, not for a pass queued after it); null when none
   * is pending. The arrays are the readback's, which the passes use in turn: read them before the next start() (with
   * another pass still pending, that start reuses them at once on the CPU, and once the device gets there on CUDA).
   */
  collect(): PassRows | null {
    const p = this.pending.shift(), S = this.slots;
    if (!p) return null;
    if (!p.rb) return { chunks: [], slots: S, ids: new Int32Array(0), logq: new Float32Array(0), tail: new Float32Array(0), argmax: new Int32Array(0) };
    const n = p.n, { floats, ints } = p.rb.wait();
    return {
      chunks: p.chunks, slots: S, ids: ints[0]!.subarray(0, n * S), logq: floats[0]!.subarray(0, n * S),
      tail: floats[1]!.subarray(0, n), argmax: ints[1]!.subarray(0, n),
    };
  }

  /** Host work: a collected pass's rows as one SparseEntry per row, chunk by chunk (onRows(entries, r0)). */
  static entries(h: PassRows, onRows: (entries: SparseEntry[], r0: number) => void): void {
    const S = h.slots;
    for (const [r0, rows] of h.chunks) {
      const entries: SparseEntry[] = [];
      for (let r = r0; r < r0 + rows; r++) {
        const e: SparseEntry = { ids: [], counts: [], logq: [], tail: h.tail[r]!, argmax: h.argmax[r]! };
        for (let k = r * S, end = k + rowIds(h, r); k < end; k++) { e.ids.push(h.ids[k]!); e.logq.push(h.logq[k]!); }
        entries.push(e);
      }
      onRows(entries, r0);
    }
  }
}
