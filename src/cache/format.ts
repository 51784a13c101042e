/**
 * The bytes of a teacher cache's windows: one record per packed window, holding the sparse teacher of each counted
 * position (mask > 0) in order, bit-packed:
 *
 *   sample:N   per position: (distinct ids − 1) in b_N bits, the teacher's argmax id in b_V bits, then per distinct id
 *              drawn: the id (b_V bits) and −log q_t quantized (12 bits). The loss weighs a drawn id by
 *              q_t / P(drawn in N draws) (src/cache/targets.ts, sampleWeight), which needs q_t, not the count.
 *   top:K      per position: K × [id (b_V bits), −log q_t quantized (12 bits)], then the tail mass as −log r (12 bits;
 *              absent when K covers the vocabulary); the argmax is the first id
 *
 * b_V = bits of the largest id (18 for Qwen's 151936 rows), b_N = bits of N − 1. A log-probability is stored as
 * round(−log q · 128) in 12 bits: steps of 1/128 nat (q within 0.4% of the teacher's; for the forward KL the gradient
 * does not depend on it at all — a drawn id's weight max(q, 1/N) moves by at most 0.4%) down to q = e^−32;
 * the code 4095 means 0 (a tail the teacher gives no mass). A record is padded to a whole byte.
 *
 * Worst case per position for the default sample:24 over a 151936-token vocabulary: 5 + 18 + 24 × (18 + 12) = 743
 * bits, 93 bytes (every draw a different token); a teacher that is sure of a few tokens repeats draws, so the mean is
 * lower: the cache job, its manifest and `distillery inspect` give it.
 */
import type { SparseEntry, SparseRep } from './sparse.js';
import { sampleWeight, type SparseHost } from './targets.js';

/** Bits of a stored log-probability, its steps per nat, and the code of probability 0. */
export const LOGQ_BITS = 12;
export const LOGQ_SCALE = 128;
export const LOGQ_ZERO = 2 ** LOGQ_BITS - 1;

/** Bits needed to store integers 0..maxValue (at least 1). */
export function bitsFor(maxValue: number): number {
  let b = 1;
  while (2 ** b <= maxValue) b++;
  return b;
}

export function quantizeLogq(l: number): number {
  if (l === -Infinity) return LOGQ_ZERO;
  return Math.min(LOGQ_ZERO - 1, Math.max(0, Math.round(-l * LOGQ_SCALE)));
}
export function dequantizeLogq(q: number): number { return q === LOGQ_ZERO ? -Infinity : -q / LOGQ_SCALE; }

export class BitWriter {
  private buf = new Uint8Array(4096);
  private len = 0;
  /** Bits not yet flushed to buf (the low `held` bits of acc; fewer than 8 between writes). */
  private acc = 0;
  private held = 0;
  /**
   * Appends the low `bits` bits of v (an integer, 0 ≤ v < 2^bits, bits ≤ 25: with at most 7 bits held, 32 hold them),
   * least significant bit first.
   */
  write(v: number, bits: number): void {
    if (!(bits >= 1 && bits <= 25) || (v >>> 0) !== v || v >= 1 << bits) throw new RangeError(`BitWriter: ${v} does not fit in ${bits} bits`);
    if (this.len + 4 > this.buf.length) {
      const nb = new Uint8Array(this.buf.length * 2);
      nb.set(this.buf);
      this.buf = nb;
    }
    let acc = this.acc | (v << this.held), held = this.held + bits;
    const buf = this.buf;
    while (held >= 8) { buf[this.len++] = acc & 255; acc >>>= 8; held -= 8; }
    this.acc = acc; this.held = held;
  }
  /** The bytes written (the last one zero-padded). */
  bytes(): Uint8Array {
    const out = new Uint8Array(this.len + (this.held > 0 ? 1 : 0));
    out.set(this.buf.subarray(0, this.len));
    if (this.held > 0) out[this.len] = this.acc & 255;
    return out;
  }
  /** Starts over (the buffer is kept). */
  reset(): void { this.len = 0; this.acc = 0; this.held = 0; }
}

export class BitReader {
  private bit = 0;
  private readonly end: number;
  private readonly buf: Uint8Array;
  constructor(buf: Uint8Array) {
    // Three zero bytes past the end, so a field near the end reads four bytes without a bounds test per byte.
    this.buf = new Uint8Array(buf.length + 3);
    this.buf.set(buf);
    this.end = buf.length * 8;
  }
  /** The next `bits` bits (≤ 25: a field starts at most 7 bits into its first byte, and four bytes hold 32). */
  read(bits: number): number {
    if (this.bit + bits > this.end) throw new RangeError('BitReader: read past the end of the record');
    const b = this.bit >> 3, off = this.bit & 7, u = this.buf;
    const word = (u[b]! | (u[b + 1]! << 8) | (u[b + 2]! << 16) | (u[b + 3]! << 24)) >>> off;
    this.bit += bits;
    return bits === 32 ? word >>> 0 : word & ((1 << bits) - 1);
  }
  get bitsRead(): number { return this.bit; }
}

/** The per-cache constants of the encoding. */
export interface RecordLayout { rep: SparseRep; vocab: number; idBits: number; countBits: number; hasTail: boolean }

export function recordLayout(rep: SparseRep, vocab: number): RecordLayout {
  if (!(Number.isInteger(vocab) && vocab >= 1 && vocab <= 2 ** 25)) throw new RangeError(`a teacher cache covers vocabularies of 1 to 2^25 tokens, not ${vocab}`);
  return {
    rep, vocab, idBits: bitsFor(vocab - 1), countBits: rep.kind === 'sample' ? bitsFor(rep.n - 1) : 0,
    hasTail: rep.kind === 'top' && rep.k < vocab,
  };
}

/** The record of one window: its counted positions' entries, in order. */
export function encodeWindow(lay: RecordLayout, entries: readonly SparseEntry[], w: BitWriter = new BitWriter()): Uint8Array {
  w.reset();
  for (const e of entries) writeRow(w, lay, e.ids, e.logq, 0, e.ids.length, e.tail, e.argmax);
  return w.bytes();
}

/**
 * Appends one position's fields: ids[off .. off + n) with their log q (a row of SparseEntry arrays, or of a teacher
 * pass's flat output), the tail mass (top-K) and the argmax (samples).
 */
export function writeRow(w: BitWriter, lay: RecordLayout, ids: ArrayLike<number>, logq: ArrayLike<number>, off: number, n: number,
  tail: number, argmax: number): void {
  if (lay.rep.kind === 'sample') {
    if (n < 1 || n > lay.rep.n) throw new RangeError(`a sample row has ${n} distinct ids (1 to ${lay.rep.n})`);
    w.write(n - 1, lay.countBits);
    w.write(argmax, lay.idBits);
  } else {
    const K = Math.min(lay.rep.k, lay.vocab);
    if (n !== K) throw new RangeError(`a top-K row has ${n} ids, expected ${K}`);
  }
  for (let k = off; k < off + n; k++) { w.write(ids[k]!, lay.idBits); w.write(quantizeLogq(logq[k]!), LOGQ_BITS); }
  if (lay.rep.kind === 'top' && lay.hasTail) w.write(quantizeLogq(tail > 0 ? Math.log(tail) : -Infinity), LOGQ_BITS);
}

/** The entries of a record of `positions` counted positions (what encodeWindow wrote, with log-probabilities dequantized). */
export function decodeWindow(lay: RecordLayout, rec: Uint8Array, positions: number): SparseEntry[] {
  const r = new BitReader(rec);
  const out: SparseEntry[] = [];
  for (let p = 0; p < positions; p++) {
    if (lay.rep.kind === 'sample') {
      const n = r.read(lay.countBits) + 1;
      const argmax = r.read(lay.idBits);
      const ids: number[] = [], logq: number[] = [];
      for (let k = 0; k < n; k++) { ids.push(r.read(lay.idBits)); logq.push(dequantizeLogq(r.read(LOGQ_BITS))); }
      out.push({ ids, counts: [], logq, tail: -1, argmax });
    } else {
      const K = Math.min(lay.rep.k, lay.vocab);
      const ids: number[] = [], logq: number[] = [];
      for (let k = 0; k < K; k++) { ids.push(r.read(lay.idBits)); logq.push(dequantizeLogq(r.read(LOGQ_BITS))); }
      const tail = lay.hasTail ? Math.exp(dequantizeLogq(r.read(LOGQ_BITS))) : -1;
      out.push({ ids, counts: [], logq, tail, argmax: ids[0]! });
    }
  }
  if ((r.bitsRead + 7) >> 3 !== rec.length) throw new RangeError(`a window record holds ${rec.length} bytes, its ${positions} positions ${(r.bitsRead + 7) >> 3}`);
  for (const e of out) for (const id of e.ids) if (id >= lay.vocab) throw new RangeError(`a record holds token id ${id}, past the vocabulary (${lay.vocab})`);
  return out;
}

/**
 * decodeWindow straight into the rows of a batch's SparseHost (row rows[p] gets counted position p; the weights π of
 * src/cache/targets.ts): what a cached run does every step, without the intermediate objects.
 */
export function decodeWindowInto(lay: RecordLayout, rec: Uint8Array, rows: ArrayLike<number>, h: SparseHost): void {
  const r = new BitReader(rec), S = h.slots, V = lay.vocab;
  const bad = (why: string): RangeError => new RangeError(why);
  for (let p = 0; p < rows.length; p++) {
    const row = rows[p]!, o = row * S;
    let n: number;
    if (lay.rep.kind === 'sample') {
      const N = lay.rep.n;
      n = r.read(lay.countBits) + 1;
      if (n > S) throw bad(`a record holds ${n} ids for ${S} slots`);
      h.argmax[row] = r.read(lay.idBits);
      for (let k = 0; k < n; k++) {
        const id = r.read(lay.idBits), l = dequantizeLogq(r.read(LOGQ_BITS));
        if (id >= V) throw bad(`a record holds token id ${id}, past the vocabulary (${V})`);
        h.ids[o + k] = id; h.logq[o + k] = l; h.prob[o + k] = sampleWeight(l, N);
      }
      h.tail[row] = -1;
    } else {
      n = Math.min(lay.rep.k, V);
      for (let k = 0; k < n; k++) {
        const id = r.read(lay.idBits), l = dequantizeLogq(r.read(LOGQ_BITS));
        if (id >= V) throw bad(`a record holds token id ${id}, past the vocabulary (${V})`);
        h.ids[o + k] = id; h.logq[o + k] = l; h.prob[o + k] = Math.exp(l);
      }
      h.tail[row] = lay.hasTail ? Math.exp(dequantizeLogq(r.read(LOGQ_BITS))) : -1;
      h.argmax[row] = h.ids[o]!;
    }
    for (let k = o + n; k < o + S; k++) { h.ids[k] = -1; h.prob[k] = 0; h.logq[k] = 0; }
  }
  if ((r.bitsRead + 7) >> 3 !== rec.length) throw bad(`a window record holds ${rec.length} bytes, its ${rows.length} positions ${(r.bitsRead + 7) >> 3}`);
}
