/**
 * The teacher's side of a teacher-cache job: the forward over a batch of windows (one captured region: a CUDA graph
 * once the shape repeats), then, chunk by chunk of rows, the LM head over the loss vocabulary and the sparse rows of
 * those logits on the device (Backend.sparseTeacherRows: the systematic draws, or the top K), of which only the small
 * result comes to the host. The full [tokens, vocab] logits never exist: one chunk of rows at a time
 * (src/train/head.ts sizes them), and on the GPU no logits cross the bus for a sample cache.
 *
 * The kernel plan of the job (src/train/kernel-plan.ts, `cacheTeacher`) runs this same class on the tracing backend.
 */
import type { Buf, SparseRowsOut } from '../backend/backend.js';
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

export class TeacherPass {
  readonly width: number;
  readonly chunkRows: number;
  readonly slots: number;
  private readonly z: Buf;
  private readonly u: Buf;
  private readonly out: SparseRowsOut;
  private pending: { chunks: Array<[number, number]>; n: number } | null = null;

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
    this.out = {
      slots: S, ids: be.allocInt(N * S, 'teacher cache ids'), logq: be.alloc(N * S, 'teacher cache log-probabilities'),
      tail: be.alloc(N, 'teacher cache tail mass'), argmax: be.allocInt(N, 'teacher cache argmax'),
    };
  }

  /**
   * Runs the teacher over ids [b, t]; for each chunk of rows that `wanted(r0, rows)` asks for, computes their sparse rows
   * (row r's draws from uniform(r)) and calls onRows(entries, r0) with one SparseEntry per row of the chunk.
   * start + collect + TeacherPass.entries; a job that overlaps the host's share with the device's calls them itself.
   */
  run(ids: Int32Array, b: number, t: number, uniform: (row: number) => number,
    onRows: (entries: SparseEntry[], r0: number) => void, wanted: (r0: number, rows: number) => boolean = () => true): void {
    this.start(ids, b, t, uniform, wanted);
    const h = this.collect();
    if (h) TeacherPass.entries(h, onRows);
  }

  /**
   * Queues the pass over ids [b, t] on the device (asynchronous on CUDA): the uniforms go up first, every chunk's
   * sparse rows stay on the device until collect(). One pass may be pending at a time.
   */
  start(ids: Int32Array, b: number, t: number, uniform: (row: number) => number, wanted: (r0: number, rows: number) => boolean = () => true): void {
    const m = this.teacher, be = m.backend, C = m.config.hiddenSize, V = this.width, n = b * t, S = this.slots;
    if (this.pending) throw new Error('TeacherPass.start: the previous pass was not collected');
    if (n > m.batch * m.seq) throw new DistilleryError(`a teacher-cache pass of ${b} × ${t} exceeds the teacher's ${m.batch} × ${m.seq}`);
    const chunks: Array<[number, number]> = [];
    for (let r0 = 0; r0 < n; r0 += this.chunkRows) {
      const rows = Math.min(this.chunkRows, n - r0);
      if (wanted(r0, rows)) chunks.push([r0, rows]);
    }
    this.pending = { chunks, n };
    m.stageInputs(ids, b, t);
    be.upload(be.view(this.u, 0, n), Float32Array.from({ length: n }, (_, r) => uniform(r)));
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
  }

  /** The pending pass's sparse rows on the host (waits for the device); null when none is pending. */
  collect(): PassRows | null {
    const p = this.pending, be = this.teacher.backend, S = this.slots;
    if (!p) return null;
    this.pending = null;
    if (p.chunks.length === 0) return { chunks: [], slots: S, ids: new Int32Array(0), logq: new Float32Array(0), tail: new Float32Array(0), argmax: new Int32Array(0) };
    const n = p.n;
    return {
      chunks: p.chunks, slots: S, ids: be.downloadInt(be.viewInt(this.out.ids, 0, n * S)), logq: be.download(be.view(this.out.logq, 0, n * S)),
      tail: be.download(be.view(this.out.tail, 0, n)), argmax: be.downloadInt(be.viewInt(this.out.argmax, 0, n)),
    };
  }

  /** Host work: a collected pass's rows as one SparseEntry per row, chunk by chunk (onRows(entries, r0)). */
  static entries(h: PassRows, onRows: (entries: SparseEntry[], r0: number) => void): void {
    const S = h.slots;
    for (const [r0, rows] of h.chunks) {
      const entries: SparseEntry[] = [];
      for (let r = r0; r < r0 + rows; r++) {
        const e: SparseEntry = { ids: [], counts: [], logq: [], tail: h.tail[r]!, argmax: h.argmax[r]! };
        for (let k = 0; k < S; k++) {
          const id = h.ids[r * S + k]!;
          if (id < 0) break;
          e.ids.push(id); e.logq.push(h.logq[r * S + k]!);
        }
        entries.push(e);
      }
      onRows(entries, r0);
    }
  }
}
