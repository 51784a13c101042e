/**
 * The teacher's side of a teacher-cache job: the forward over a batch of windows (one captured region: a CUDA graph
 * once the shape repeats), then the LM head chunk by chunk over the loss vocabulary; each chunk of logits is handed
 * to the caller on the host, which keeps the sparse representation of its rows. The full [tokens, vocab] logits never
 * exist: one chunk of rows at a time (src/train/head.ts sizes them).
 *
 * The kernel plan of the job (src/train/kernel-plan.ts, `cacheTeacher`) runs this same class on the tracing backend.
 */
import type { Buf } from '../backend/backend.js';
import type { Transformer } from '../model/transformer.js';
import { DistilleryError } from '../util/errors.js';
import { headChunkRows, headWidth } from '../train/head.js';

export class TeacherPass {
  readonly width: number;
  readonly chunkRows: number;
  private readonly z: Buf;

  constructor(readonly teacher: Transformer, readonly lossVocab: number, chunkFloats?: number) {
    const v = teacher.config.vocabSize;
    if (!(Number.isInteger(lossVocab) && lossVocab >= 1 && lossVocab <= v)) {
      throw new DistilleryError(`the loss vocabulary (${lossVocab}) must be between 1 and the teacher's vocab_size (${v})`);
    }
    this.width = headWidth(lossVocab, v);
    this.chunkRows = headChunkRows(teacher.batch * teacher.seq, this.width, chunkFloats);
    this.z = teacher.backend.alloc(this.chunkRows * this.width, 'teacher logits (one chunk of rows)');
  }

  /**
   * Runs the teacher over ids [b, t] and calls onChunk(logits, r0, rows) for each chunk of rows; `logits` is the host
   * copy of rows [r0, r0 + rows), row stride `width`, of which the first lossVocab columns are the distribution's.
   * `wanted(r0, rows)` false skips a chunk's product (no counted position in it).
   */
  run(ids: Int32Array, b: number, t: number, onChunk: (logits: Float32Array | Float64Array, r0: number, rows: number) => void,
    wanted: (r0: number, rows: number) => boolean = () => true): void {
    const m = this.teacher, be = m.backend, C = m.config.hiddenSize, V = this.width, n = b * t;
    m.stageInputs(ids, b, t);
    const hidden = be.captured('teacher cache pass', () => m.forwardStaged(b, t));
    const w = be.view(m.headWeight(), 0, V * C);
    for (let r0 = 0; r0 < n; r0 += this.chunkRows) {
      const rows = Math.min(this.chunkRows, n - r0);
      if (!wanted(r0, rows)) continue;
      const z = be.view(this.z, 0, rows * V);
      be.matmulForward(z, be.view(hidden, r0 * C, rows * C), w, null, rows, C, V);
      onChunk(be.download(z), r0, rows);
    }
  }
}
