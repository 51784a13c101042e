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
  private buf = new Uint8Array(1024);
  private bit = 0;
  /** Appends the low `bits` bits of v (v < 2^bits, bits ≤ 32), least significant bit first. */
  write(v: number, bits: number): void {
    if (!(Number.isInteger(v) && v >= 0 && v < 2 ** bits)) throw new RangeError(`BitWriter: ${v} does not fit in ${bits} bits`);
    const need = ((this.bit + bits + 7) >> 3) + 8;
    if (need > this.buf.length) {
      const nb = new Uint8Array(Math.max(need, this.buf.length * 2));
      nb.set(this.buf);
      this.buf = nb;
    }
    for (let left = bits; left > 0;) {
      const byte = this.bit >> 3, off = this.bit & 7, take = Math.min(8 - off, left);
      this.buf[byte]! |= (v % 2 ** take) << off;
      v = Math.floor(v / 2 ** take);
      this.bit += take; left -= take;
    }
  }
  /** The bytes written (the last one zero-padded). */
  bytes(): Uint8Array { return this.buf.slice(0, (this.bit + 7) >> 3); }
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
export function encodeWindow(lay: RecordLayout, entries: readonly SparseEntry[]): Uint8Array {
  const w = new BitWriter();
  for (const e of entries) {
    if (lay.rep.kind === 'sample') {
      const n = e.ids.length;
      if (n < 1 || n > lay.rep.n) throw new RangeError(`a sample row has ${n} distinct ids (1 to ${lay.rep.n})`);
      w.write(n - 1, lay.countBits);
      w.write(e.argmax, lay.idBits);
      for (let k = 0; k < n; k++) {
        w.write(e.ids[k]!, lay.idBits);
        w.write(quantizeLogq(e.logq[k]!), LOGQ_BITS);
      }
    } else {
      const K = Math.min(lay.rep.k, lay.vocab);
      if (e.ids.length !== K) throw new RangeError(`a top-K row has ${e.ids.length} ids, expected ${K}`);
      for (let k = 0; k < K; k++) { w.write(e.ids[k]!, lay.idBits); w.write(quantizeLogq(e.logq[k]!), LOGQ_BITS); }
      if (lay.hasTail) w.write(quantizeLogq(e.tail > 0 ? Math.log(e.tail) : -Infinity), LOGQ_BITS);
    }
  }
  return w.bytes();
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
