/**
 * The layers of generation over a KV cache of [batch, maxLen] rows, shared by Generator (one sequence) and
 * BatchGenerator (several): the cache, one layer's activations for every row, and the forward over t new tokens of b
 * sequences from pos0 (a number: every sequence; SeqPositions: each its own). The layers are Transformer's own
 * (layerForward), with the model's weights as generation runs them (Transformer.decodeLayerW): its fused q/k/v product
 * where its weights have one, and a fused gate/up product wherever the storage keeps gate and up adjacent without
 * adapters on them (a forward-only model's too: a decode step pays a launch per product). The attention is
 * cachedAttentionStep's: training's causal forward for a prefill from position 0, the cache-reading kernel otherwise.
 */
import type { TensorInfo } from './params.js';
import type { Backend, Buf, DType, IntBuf, SeqPositions } from '../backend/backend.js';
import type { Transformer } from './transformer.js';
import { DistilleryError } from '../util/errors.js';
import { cachedAttentionStep, inputNorm, layerForward, type LayerActivations, type NextNorm, type QkNormActivations } from './layer.js';

export class CachedLayers {
  /** The token ids of the rows a run() reads (upload them first). */
  readonly ids: IntBuf;
  /** After run(): the final norm's output, one row per token (the LM head's input). */
  readonly ln: Buf;
  private readonly be: Backend;
  private readonly kCache: Buf[];
  private readonly vCache: Buf[];
  private readonly x: Buf; private readonly h: Buf; private readonly rstd: Buf;
  private readonly q: Buf; private readonly k: Buf; private readonly v: Buf; private readonly att: Buf;
  private readonly gate: Buf | null; private readonly up: Buf | null; private readonly gu: Buf | null;
  private readonly act: Buf;
  private readonly qkv: Buf | null;
  /** The prefill attention's log-sum-exp rows [b, nHeads, t] (the training forward's output, unread here). */
  private readonly lse: Buf;
  private readonly qkn: QkNormActivations | null;

  /** `label`: how the allocations are named (e.g. 'batched generation'). */
  constructor(private readonly m: Transformer, batch: number, readonly maxLen: number, label: string) {
    const c = m.config, be = m.backend, A = m.compute;
    if (maxLen > c.maxPositionEmbeddings) {
      throw new DistilleryError(`generation length ${maxLen} exceeds max_position_embeddings ${c.maxPositionEmbeddings}`);
    }
    // LoRA adapters run unmerged: their saved t = s·(x·Aᵀ) rows come from the model's own buffers (batch × seq rows).
    if (m.lora && m.batch * m.seq < batch * maxLen) {
      throw new DistilleryError(`generation with LoRA adapters needs a model allocated for ${batch * maxLen} rows, this one has ${m.batch * m.seq}`,
        'create the model with batch × seq covering the generation, or merge the adapter into the weights');
    }
    const C = c.hiddenSize, Q = c.numHeads * c.headDim, KV = c.numKvHeads * c.headDim, I = c.intermediateSize, R = batch * maxLen;
    this.be = be;
    this.kCache = []; this.vCache = [];
    for (let l = 0; l < c.numLayers; l++) {
      this.kCache.push(be.alloc(R * KV, `KV cache (layer ${l} keys)`, A));
      this.vCache.push(be.alloc(R * KV, `KV cache (layer ${l} values)`, A));
    }
    const a = (n: number, what: string, d: DType = 'f32'): Buf => be.alloc(n, `${label} ${what}`, d);
    this.ids = be.allocInt(R, `${label} token ids`);
    this.x = a(R * C, 'x'); this.h = a(R * C, 'h'); this.ln = a(R * C, 'norm', A); this.rstd = a(R, 'rstd');
    this.q = a(R * Q, 'q', A); this.k = a(R * KV, 'k', A); this.v = a(R * KV, 'v', A); this.att = a(R * Q, 'attention', A);
    const gu = m.decodeLayerW.every((w) => w.wgu !== null);
    this.gu = gu ? a(2 * R * I, 'gate|up', A) : null;
    this.gate = gu ? null : a(R * I, 'gate', A); this.up = gu ? null : a(R * I, 'up', A);
    this.act = a(R * I, 'swiglu', A);
    this.qkv = m.decodeLayerW.some((w) => w.wqkv !== null) ? a(R * (Q + 2 * KV), 'fused q/k/v output', A) : null;
    this.lse = a(R * c.numHeads, 'prefill attention lse');
    this.qkn = c.qkNorm ? {
      qRaw: a(R * Q, 'q before q_norm', A), kRaw: a(R * KV, 'k before k_norm', A),
      rstdQ: a(R * c.numHeads, 'q_norm rstd'), rstdK: a(R * c.numKvHeads, 'k_norm rstd'),
    } : null;
  }

  /**
   * Runs the t tokens of b sequences (ids, uploaded) through the layers from pos0, writing their keys and values into
   * the cache; ln holds the final norm of every row after it. Device work only (it fits in a captured region).
   */
  run(b: number, t: number, pos0: number | SeqPositions): void {
    const c = this.m.config, be = this.be, L = this.m.layout, n = b * t;
    const C = c.hiddenSize, Q = c.numHeads * c.headDim, KV = c.numKvHeads * c.headDim, I = c.intermediateSize;
    const vw = (buf: Buf, k: number): Buf => be.view(buf, 0, k);
    const x = vw(this.x, n * C), ln = vw(this.ln, n * C), rstd = vw(this.rstd, n);
    const p = (ti: TensorInfo | null): Buf | null => (ti ? this.m.p(ti) : null);
    be.embeddingForward(x, this.ids, p(L.embed)!, n, C);
    const qkNorm = this.qkn && {
      qRaw: vw(this.qkn.qRaw, n * Q), kRaw: vw(this.qkn.kRaw, n * KV),
      rstdQ: vw(this.qkn.rstdQ, n * c.numHeads), rstdK: vw(this.qkn.rstdK, n * c.numKvHeads),
    };
    const bufs: Omit<LayerActivations, 'x' | 'out' | 'lora'> = {
      ln1: ln, rstd1: rstd, q: vw(this.q, n * Q), k: vw(this.k, n * KV), v: vw(this.v, n * KV), att: vw(this.att, n * Q), h: vw(this.h, n * C),
      ln2: ln, rstd2: rstd, gate: this.gate && vw(this.gate, n * I), up: this.up && vw(this.up, n * I), gu: this.gu && vw(this.gu, 2 * n * I),
      act: vw(this.act, n * I), qkv: this.qkv && vw(this.qkv, n * (Q + 2 * KV)), qkNorm,
    };
    inputNorm(be, c, this.m.decodeLayerW[0]!, { x, ln1: ln, rstd1: rstd }, n);
    for (let l = 0; l < c.numLayers; l++) {
      // The layer's closing add forms the next layer's input norm (or the final norm) in the one norm buffer; x is both
      // the layer's input and output (h holds the residual in between).
      const next: NextNorm = l + 1 < c.numLayers ? { weight: this.m.decodeLayerW[l + 1]!.ln1, out: ln, rstd } : { weight: p(L.finalNorm)!, out: ln, rstd };
      this.m.materialize(l);
      layerForward(be, c, l, this.m.decodeLayerW[l]!, { ...bufs, x, out: x, lora: this.m.layerLora(l) }, b, t, pos0,
        cachedAttentionStep(be, c, this.kCache[l]!, this.vCache[l]!, this.lse, b, t, pos0, this.maxLen), next);
    }
  }
}
