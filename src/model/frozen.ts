/**
 * Frozen weights in 4 bits (QLoRA's storage; src/quant/nf4.ts is the format): a model that never updates its base
 * (a teacher, or the base under LoRA adapters) keeps the seven projection matrices of every layer as NF4 codes and
 * per-block absmax scales, and everything else (embeddings, norms, biases, the LM head) in its compute dtype, as
 * QLoRA does. One layer's matrices at a time are expanded into a scratch buffer of the compute dtype
 * (Backend.dequantNf4) right before that layer's forward (and, under LoRA, before its backward, whose input
 * gradients read them): the products are the ordinary ones, on W's dequantized values.
 *
 * Memory: 0.5 byte per matrix element plus 4 bytes per block of 64 (4.5 bits per weight), one layer's matrices in
 * the compute dtype, the dense tensors in the compute dtype.
 */
import type { Backend, Buf, DType, IntBuf } from '../backend/backend.js';
import { TensorWeights, adjacentSpan, weightSlice, type ParamLayout, type TensorInfo } from './params.js';
import { NF4_DEFAULT_BLOCK, dequantizeNf4, nf4WordCount, nf4Words } from '../quant/nf4.js';
import { Nf4Quantizer } from '../quant/nf4-parallel.js';
import { DistilleryError } from '../util/errors.js';

/** The storage dtypes of frozen weights: the compute dtype (default), or NF4. */
export type FrozenDtype = 'auto' | 'nf4';
export const FROZEN_DTYPES: readonly FrozenDtype[] = ['auto', 'nf4'];

/** The projection matrices of a layer, in the order they are laid out in the layer scratch. */
const MATRICES = ['wq', 'wk', 'wv', 'wo', 'wGate', 'wUp', 'wDown'] as const;

interface QuantSlot { layer: number; scratch: number; word: number; block: number }

/** Where each tensor of a layout lives when its matrices are NF4 (see the module comment). */
export interface Nf4Plan {
  blockSize: number;
  /** Dense tensors: their offset in the compact dense buffer. */
  dense: Map<TensorInfo, number>;
  denseTotal: number;
  /** Matrices: their layer, offset in the one-layer scratch, first code word and first scale. */
  quant: Map<TensorInfo, QuantSlot>;
  scratchTotal: number;
  words: number;
  blocks: number;
}

export function nf4Plan(layout: ParamLayout, blockSize = NF4_DEFAULT_BLOCK): Nf4Plan {
  const quant = new Map<TensorInfo, QuantSlot>();
  let words = 0, blocks = 0, scratchTotal = 0;
  layout.layers.forEach((lt, l) => {
    let s = 0;
    for (const m of MATRICES) {
      const t = lt[m];
      // Each tensor starts on a whole word and a whole block: its blocks are its own (QLoRA quantizes per tensor).
      quant.set(t, { layer: l, scratch: s, word: words, block: blocks });
      s += t.size; words += nf4WordCount(t.size); blocks += Math.ceil(t.size / blockSize);
    }
    scratchTotal = Math.max(scratchTotal, s);
  });
  const dense = new Map<TensorInfo, number>();
  let denseTotal = 0;
  for (const t of layout.tensors) {
    if (quant.has(t)) continue;
    dense.set(t, denseTotal);
    denseTotal += t.size;
  }
  return { blockSize, dense, denseTotal, quant, scratchTotal, words, blocks };
}

/** Bytes a model's frozen NF4 storage takes on a device (dense tensors and scratch at `computeBytes` each). */
export function nf4StorageBytes(plan: Nf4Plan, computeBytes: number): number {
  return plan.denseTotal * computeBytes + plan.scratchTotal * computeBytes + plan.words * 4 + plan.blocks * 4;
}

/** A model's frozen NF4 weights on a backend. */
export class FrozenNf4 {
  /** The dense tensors (compute dtype). */
  readonly dense: Buf;
  /** One layer's matrices, dequantized (compute dtype). */
  readonly scratch: Buf;
  readonly codes: IntBuf;
  readonly absmax: Buf;

  constructor(readonly backend: Backend, readonly layout: ParamLayout, readonly plan: Nf4Plan, compute: DType, label: string) {
    const be = backend;
    this.dense = be.alloc(plan.denseTotal, `${label} parameters (frozen; embeddings, norms, biases, head)`, compute);
    this.scratch = be.alloc(plan.scratchTotal, `${label} one layer's matrices (dequantized from NF4)`, compute);
    this.codes = be.allocInt(plan.words, `${label} NF4 codes (frozen matrices)`);
    this.absmax = be.alloc(plan.blocks, `${label} NF4 block scales`);
  }

  /** A tensor's view: dense storage, or its place in the layer scratch (valid after materialize of its layer). */
  view(t: TensorInfo): Buf {
    const d = this.plan.dense.get(t);
    if (d !== undefined) return this.backend.view(this.dense, d, t.size);
    const q = this.plan.quant.get(t);
    if (!q) throw new Error(`tensor ${t.name} is not in the NF4 plan`);
    return this.backend.view(this.scratch, q.scratch, t.size);
  }

  /**
   * The tensors as one view where this storage keeps them adjacent in the order given (all dense, or all matrices of one
   * layer's scratch), else null: the fused q/k/v projection's weights and biases.
   */
  span(ts: readonly TensorInfo[]): Buf | null {
    const dense = ts.map((t) => this.plan.dense.get(t)), quant = ts.map((t) => this.plan.quant.get(t));
    const at = dense.every((d) => d !== undefined) ? { buf: this.dense, offs: dense as number[] }
      : quant.every((q) => q !== undefined) && quant.every((q) => q!.layer === quant[0]!.layer) ? { buf: this.scratch, offs: quant.map((q) => q!.scratch) } : null;
    if (!at) return null;
    const sp = adjacentSpan(ts.map((t, i) => ({ offset: at.offs[i]!, size: t.size })));
    return sp ? this.backend.view(at.buf, sp[0], sp[1]) : null;
  }

  /** Quantizes the matrices of a model's weights (flat in layout order, or tensor by tensor) and uploads everything. */
  setWeights(w: ArrayLike<number> | TensorWeights, threads?: number): void {
    if (w.length !== this.layout.total) throw new DistilleryError(`weight array has ${w.length} elements, the model needs ${this.layout.total}`);
    const be = this.backend, p = this.plan;
    const get = (t: TensorInfo): ArrayLike<number> => (w instanceof TensorWeights ? w.tensor(t) : weightSlice(w, t.offset, t.offset + t.size));
    // tensor by tensor: the host holds one tensor's codes at a time, whatever the model's size; the blocks of a large
    // tensor are quantized on every core (Nf4Quantizer: the same codes as one thread)
    for (const [t, off] of p.dense) be.upload(be.view(this.dense, off, t.size), get(t));
    const quantizer = new Nf4Quantizer(threads);
    try {
      for (const [t, q] of p.quant) {
        const nf = quantizer.quantize(get(t), p.blockSize);
        be.uploadInt(be.viewInt(this.codes, q.word, nf4WordCount(t.size)), nf4Words(nf));
        be.upload(be.view(this.absmax, q.block, Math.ceil(t.size / p.blockSize)), nf.absmax);
      }
    } finally { quantizer.dispose(); }
  }

  /**
   * Dequantizes layer l's matrices into the scratch (device work). Always launched, never skipped when the scratch may
   * already hold them: every step then issues the same ops, which a captured region (CUDA graph) needs.
   */
  materialize(l: number): void {
    const be = this.backend, p = this.plan, lt = this.layout.layers[l]!;
    for (const m of MATRICES) {
      const t = lt[m], q = p.quant.get(t)!;
      be.dequantNf4(be.view(this.scratch, q.scratch, t.size), be.viewInt(this.codes, q.word, nf4WordCount(t.size)),
        be.view(this.absmax, q.block, Math.ceil(t.size / p.blockSize)), t.size, p.blockSize);
    }
  }

  /**
   * The weights, layout order: the dense tensors as stored (in the compute dtype), the matrices dequantized on the host in
   * float32 (a bf16 model's scratch rounds them once more when it expands them).
   */
  getWeights(): Float32Array {
    const be = this.backend, p = this.plan, out = new Float32Array(this.layout.total);
    const dense = be.download(this.dense);
    for (const [t, off] of p.dense) for (let i = 0; i < t.size; i++) out[t.offset + i] = dense[off + i]!;
    const words = be.downloadInt(this.codes), scales = be.download(this.absmax);
    const bytes = new Uint8Array(words.buffer, words.byteOffset, words.byteLength);
    for (const [t, q] of p.quant) {
      const nb = Math.ceil(t.size / p.blockSize);
      dequantizeNf4({ n: t.size, blockSize: p.blockSize, codes: bytes.subarray(4 * q.word, 4 * q.word + Math.ceil(t.size / 2)),
        absmax: Float32Array.from(scales.subarray(q.block, q.block + nb)) }, out.subarray(t.offset, t.offset + t.size));
    }
    return out;
  }
}
