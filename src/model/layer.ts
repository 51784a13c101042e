/**
 * One decoder layer's forward pass, shared by training/evaluation (Transformer.forward, which saves attention's
 * per-row log-sum-exp for backward) and generation (Generator.step, which attends through a KV cache). The caller
 * passes the attention step and the norm that reads the layer's output (the next layer's input norm or the final
 * norm, fused with the closing residual add); everything around the attention (norms, projections, rotary embedding,
 * residuals, SwiGLU MLP) is this one function, so the two paths cannot drift apart.
 */
import type { Backend, Buf, DocPositions, QkNormWeights, SeqPositions } from '../backend/backend.js';
import { ropeOnFusedColumns, usesRope, type ModelConfig } from './config.js';
import type { LayerTensors, TensorInfo } from './params.js';
import { loraForward, type LoraAdapters, type LoraTarget, type LoraView } from './lora.js';

/** Views of one layer's weights inside the flat parameter buffer. */
export interface LayerWeights {
  ln1: Buf; wq: Buf; bq: Buf | null; wk: Buf; bk: Buf | null; wv: Buf; bv: Buf | null;
  /** Qwen3's per-head q/k norm weights [head_dim]; null without q/k norms. */
  qNorm: Buf | null; kNorm: Buf | null;
  wo: Buf; bo: Buf | null;
  ln2: Buf; wGate: Buf; wUp: Buf; wDown: Buf;
  /**
   * The q, k and v weights as one [Q + 2·KV, hidden] matrix and their biases as one vector (views of the same storage:
   * the layout keeps them adjacent, params.ts qkvSpans), for the fused projection; null where the storage does not, or
   * where the model runs three products (an adapter on q, k or v: the Transformer asks params.ts fusesQkv).
   */
  wqkv: Buf | null; bqkv: Buf | null;
  /**
   * The gate and up weights as one [2·intermediate, hidden] matrix (adjacent in the layout, gate first: params.ts
   * fusesGateUp), for the fused gate/up product; null where the model runs two products.
   */
  wgu: Buf | null;
}

/**
 * A layer's weight views, each from `p` (a view of the flat weights, or of frozen NF4 storage: src/model/frozen.ts);
 * `span` views several tensors as one where the storage keeps them adjacent in the order given (else null), for the
 * fused q/k/v projection (absent: no fused views).
 */
export function layerWeights(p: (t: TensorInfo) => Buf, w: LayerTensors, span?: (ts: TensorInfo[]) => Buf | null,
  fuse: { qkv: boolean; gateUp: boolean } = { qkv: true, gateUp: true }): LayerWeights {
  const o = (t: TensorInfo | null): Buf | null => (t ? p(t) : null);
  const wqkv = fuse.qkv ? span?.([w.wq, w.wk, w.wv]) ?? null : null;
  const bqkv = fuse.qkv && w.bq ? span?.([w.bq, w.bk!, w.bv!]) ?? null : null; // q/k/v biases: all three (qkv_bias) or none
  const fused = wqkv !== null && (!w.bq || bqkv !== null);
  return {
    ln1: p(w.ln1), wq: p(w.wq), bq: o(w.bq), wk: p(w.wk), bk: o(w.bk), wv: p(w.wv), bv: o(w.bv),
    qNorm: o(w.qNorm), kNorm: o(w.kNorm), wo: p(w.wo), bo: o(w.bo),
    ln2: p(w.ln2), wGate: p(w.wGate), wUp: p(w.wUp), wDown: p(w.wDown),
    wqkv: fused ? wqkv : null, bqkv: fused ? bqkv : null,
    wgu: fuse.gateUp ? span?.([w.wGate, w.wUp]) ?? null : null,
  };
}

/** Activation buffers of one layer call, each already a view of exactly b·t rows. */
export interface LayerActivations {
  /** The layer's input (residual stream) and its input norm: ln1 = rmsnorm(x)·w.ln1 with rstd1, formed BEFORE the call. */
  x: Buf; ln1: Buf; rstd1: Buf;
  q: Buf; k: Buf; v: Buf; att: Buf; h: Buf; ln2: Buf; rstd2: Buf;
  gate: Buf | null; up: Buf | null; act: Buf;
  /**
   * [b·t, 2·intermediate] (compute dtype) for the fused gate/up product, row r = gate_r then up_r: where given and the
   * weights have wgu, the layer runs one product and swigluForwardRows, and gate and up are not used (may be null).
   */
  gu?: Buf | null;
  /** The layer's output (the next layer's x). It may alias x (x is last read when h is formed), never h. */
  out: Buf;
  /** With q/k norms (Qwen3): what the norms read and save for backward; null otherwise. */
  qkNorm: QkNormActivations | null;
  /** The layer's LoRA adapters (src/model/lora.ts), each applied right after its projection; absent without. */
  lora?: LayerLora | null;
  /**
   * Scratch [b·t, Q + 2·KV] (compute dtype) for the fused q/k/v projection's output: the rotation reads q and k from
   * its columns where it adds their biases (RoPE layers without q/k norms), else Backend.copyColumns splits them out;
   * v is always copied out (its bias added there). Absent or null: three projections. Used where the weights have wqkv.
   */
  qkv?: Buf | null;
}

/** A layer's adapters: the model's LoraAdapters and this layer's views, by target. */
export interface LayerLora { ad: LoraAdapters; views: Map<LoraTarget, LoraView> }

/**
 * Qwen3's per-head q/k RMSNorm state: the projections' outputs before the norm ([b·t, nHeads·hd] and [b·t, nKv·hd],
 * the norms' inputs) and one rstd per (token, head) row ([b·t·nHeads], [b·t·nKv], f32). q and k hold the normed
 * (then rotated) values.
 */
export interface QkNormActivations { qRaw: Buf; kRaw: Buf; rstdQ: Buf; rstdK: Buf }

/**
 * The norm that reads a layer's output: the next layer's ln1, or the final norm after the last layer. The layer's
 * closing residual add is fused with it (one launch, the residual read once): out = rmsnorm(layer out)·weight, rstd.
 * out may be the layer's own ln1 or ln2 buffer (both are dead by then), never its x, h or out.
 */
export interface NextNorm { weight: Buf; out: Buf; rstd: Buf }

/** Computes att [b·t, nHeads·hd] from q (rotated), k (rotated) and v. */
export interface AttentionStep {
  (q: Buf, k: Buf, v: Buf, att: Buf): void;
  /**
   * Present where the step attends from a KV cache it writes (generation past the prefill): given the fused q/k/v
   * product's output [b·t, Q + 2·KV], the joined bias (or null) and the q/k norms (Qwen3; or null), it norms and
   * rotates q into `q`, writes the normed, rotated keys and the values into the cache in the same pass
   * (Backend.ropeKvCacheWrite) and attends. A layer with RoPE that runs the fused product hands it those instead of
   * splitting, norming and rotating them itself (a NoPE layer does not).
   */
  fromFusedQkv?: (q: Buf, qkv: Buf, bias: Buf | null, qkNorm: QkNormWeights | null, att: Buf) => void;
}

/**
 * The attention step of generation against a KV cache of [b, tMax] rows: the new keys and values are written at
 * pos0.. of each sequence, then the queries attend causally to the cache. A prefill from position 0 (pos0 the number 0)
 * attends only to the rows it has just written, which is the causal attention of training over q, k and v themselves:
 * it runs the training forward (the flash kernel on CUDA; `lse` [b, nHeads, t] is its scratch), and every other step
 * the cache-reading kernel. Rows of a right-padded prefill past a sequence's prompt compute what nothing reads.
 */
export function cachedAttentionStep(be: Backend, c: ModelConfig, kCache: Buf, vCache: Buf, lse: Buf, b: number, t: number,
  pos0: number | SeqPositions, tMax: number): AttentionStep {
  const fromCache = (q: Buf, att: Buf): void => be.attentionCached(att, q, kCache, vCache, b, t, pos0, tMax, c.numHeads, c.numKvHeads, c.headDim);
  const step: AttentionStep = (q, k, v, att) => {
    be.kvCacheWrite(kCache, k, b, t, pos0, tMax, c.numKvHeads, c.headDim);
    be.kvCacheWrite(vCache, v, b, t, pos0, tMax, c.numKvHeads, c.headDim);
    if (pos0 === 0) be.attentionForward(att, be.view(lse, 0, b * c.numHeads * t), q, k, v, b, t, c.numHeads, c.numKvHeads, c.headDim);
    else fromCache(q, att);
  };
  if (pos0 !== 0) {
    step.fromFusedQkv = (q, qkv, bias, qkNorm, att) => {
      be.ropeKvCacheWrite(q, kCache, vCache, qkv, b, t, pos0, tMax, c.numHeads, c.numKvHeads, c.headDim, c.rope, bias, qkNorm);
      fromCache(q, att);
    };
  }
  return step;
}

/** The first layer's input norm (every later layer's comes out of the previous layer's closing add): a.ln1, a.rstd1 from a.x. */
export function inputNorm(be: Backend, c: ModelConfig, w: LayerWeights, a: Pick<LayerActivations, 'x' | 'ln1' | 'rstd1'>, n: number): void {
  be.rmsnormForward(a.ln1, a.rstd1, a.x, w.ln1, n, c.hiddenSize, c.rmsNormEps);
}

/**
 * out = h + mlp(ln2(h)) with h = x + o_proj(attend(rope(qn(q(ln1))), rope(kn(k(ln1))), v(ln1))); positions start at
 * pos0 (per sequence with SeqPositions: batched generation; per row with DocPositions: packed documents). qn and kn are Qwen3's per-head q/k norms (identity elsewhere); rope is skipped on SmolLM3's NoPE layers.
 * Expects a.ln1/a.rstd1 to hold x's norm already (inputNorm, or the previous layer's `next`); forms `next` from out.
 * Both residual adds are fused with the norm that reads their sum (Backend.addRmsnormForward), which stores exactly
 * what add followed by rmsnormForward would: x, h, ln1, ln2, rstd1, rstd2 and out are what backward reads.
 */
export function layerForward(be: Backend, c: ModelConfig, layer: number, w: LayerWeights, a: LayerActivations,
  b: number, t: number, pos0: number | SeqPositions | DocPositions, attend: AttentionStep, next: NextNorm): void {
  if (c.qkNorm && !a.qkNorm) throw new Error('layerForward: a model with q/k norms needs their activations');
  const lo = a.lora ?? null, N = b * t;
  const adapt = (target: LoraTarget, out: Buf, inp: Buf): void => {
    const v = lo?.views.get(target);
    if (v) loraForward(be, lo!.ad, v, out, inp, N);
  };
  const fused = Boolean(w.wqkv && a.qkv);
  if (fused && usesRope(c, layer) && attend.fromFusedQkv) {
    // generation past the prefill: the q/k norms, the rotation and the cache writes read the product's columns in one
    // pass (a fused layer has its joined bias where it has biases, and no adapter on q, k or v: layerWeights, fusesQkv)
    const Q = c.numHeads * c.headDim, W = Q + 2 * c.numKvHeads * c.headDim;
    be.matmulForward(a.qkv!, a.ln1, w.wqkv!, null, N, c.hiddenSize, W);
    attend.fromFusedQkv(a.q, a.qkv!, w.bqkv, c.qkNorm ? { q: w.qNorm!, k: w.kNorm!, eps: c.rmsNormEps } : null, a.att);
  } else {
    attentionInputs(be, c, layer, w, a, b, t, pos0, fused, adapt);
    attend(a.q, a.k, a.v, a.att);
  }
  outputAndMlp(be, c, layer, w, a, N, next, adapt);
}

/** Applies a layer's adapter on `target` (if it has one) to the product out = inp · Wᵀ just formed. */
type Adapt = (target: LoraTarget, out: Buf, inp: Buf) => void;

/** a.q, a.k (rotated, normed with q/k norms) and a.v from a.ln1: the q/k/v products, q/k norms and rotary embedding. */
function attentionInputs(be: Backend, c: ModelConfig, layer: number, w: LayerWeights, a: LayerActivations,
  b: number, t: number, pos0: number | SeqPositions | DocPositions, fused: boolean, adapt: Adapt): void {
  const N = b * t, C = c.hiddenSize, Q = c.numHeads * c.headDim, KV = c.numKvHeads * c.headDim;
  // With q/k norms the projections write the norms' inputs; each (token, head) row of hd is normed into q / k.
  const qn = a.qkNorm;
  // Without q/k norms, a rotated q/k gets its projection's bias inside the rotation (ropeForward's bias), not as a pass of its own.
  const biasInRope = !qn && usesRope(c, layer);
  const qOut = qn ? qn.qRaw : a.q, kOut = qn ? qn.kRaw : a.k;
  // A fused product whose q and k the rotation reads in place (strided rows of [N, Q + 2·KV]): no split copy for them.
  const W = Q + 2 * KV, rotateFused = ropeOnFusedColumns(c, layer, fused);
  if (fused) {
    // One product [N, Q + 2·KV]; v split out with its bias, q and k rotated from its columns below or, where the
    // rotation does not add their biases, split out with them (added as after a product's store): on the CPU the same
    // values as three products, bit for bit; cuBLAS may pick another algorithm for the wider product, so on CUDA they
    // agree to float32 accumulation order.
    be.matmulForward(a.qkv!, a.ln1, w.wqkv!, null, N, C, W);
    if (!rotateFused) {
      be.copyColumns(qOut, Q, 0, a.qkv!, W, 0, N, Q, biasInRope ? null : w.bq);
      be.copyColumns(kOut, KV, 0, a.qkv!, W, Q, N, KV, biasInRope ? null : w.bk);
    }
    be.copyColumns(a.v, KV, 0, a.qkv!, W, Q + KV, N, KV, w.bv);
  } else {
    be.matmulForward(qOut, a.ln1, w.wq, biasInRope ? null : w.bq, N, C, Q);
    adapt('q_proj', qOut, a.ln1);
    be.matmulForward(kOut, a.ln1, w.wk, biasInRope ? null : w.bk, N, C, KV);
    adapt('k_proj', kOut, a.ln1);
    be.matmulForward(a.v, a.ln1, w.wv, w.bv, N, C, KV);
    adapt('v_proj', a.v, a.ln1);
  }
  if (qn) {
    be.rmsnormForward(a.q, qn.rstdQ, qn.qRaw, w.qNorm!, N * c.numHeads, c.headDim, c.rmsNormEps);
    be.rmsnormForward(a.k, qn.rstdK, qn.kRaw, w.kNorm!, N * c.numKvHeads, c.headDim, c.rmsNormEps);
  }
  if (rotateFused) {
    // q and k rotated (with their biases) straight from the product's columns into their own buffers
    be.ropeForward(a.q, be.view(a.qkv!, 0, N * W), b, t, c.numHeads, c.headDim, c.rope, pos0, w.bq, { inp: W });
    be.ropeForward(a.k, be.view(a.qkv!, Q, N * W - Q), b, t, c.numKvHeads, c.headDim, c.rope, pos0, w.bk, { inp: W });
  } else if (usesRope(c, layer)) {
    be.ropeForward(a.q, a.q, b, t, c.numHeads, c.headDim, c.rope, pos0, biasInRope ? w.bq : null);
    be.ropeForward(a.k, a.k, b, t, c.numKvHeads, c.headDim, c.rope, pos0, biasInRope ? w.bk : null);
  }
}

/** The layer's output into a.out and `next` from a.att: the o product, the residual adds and norms, the SwiGLU MLP. */
function outputAndMlp(be: Backend, c: ModelConfig, layer: number, w: LayerWeights, a: LayerActivations, N: number, next: NextNorm, adapt: Adapt): void {
  const C = c.hiddenSize, Q = c.numHeads * c.headDim, I = c.intermediateSize;
  be.matmulForward(a.h, a.att, w.wo, w.bo, N, Q, C);
  adapt('o_proj', a.h, a.att);
  be.addRmsnormForward(a.h, a.ln2, a.rstd2, a.h, a.x, w.ln2, N, C, c.rmsNormEps);
  if (w.wgu && a.gu) {
    // one product over the adjacent gate and up weights (no adapters on them), SwiGLU reading each row's two halves
    be.matmulForward(a.gu, a.ln2, w.wgu, null, N, C, 2 * I);
    be.swigluForwardRows(a.act, a.gu, N, I);
  } else {
    if (!a.gate || !a.up) throw new Error(`layer ${layer}: no gate/up activations for the separate products`);
    be.matmulForward(a.gate, a.ln2, w.wGate, null, N, C, I);
    adapt('gate_proj', a.gate, a.ln2);
    be.matmulForward(a.up, a.ln2, w.wUp, null, N, C, I);
    adapt('up_proj', a.up, a.ln2);
    be.swigluForward(a.act, a.gate, a.up, N * I);
  }
  be.matmulForward(a.out, a.act, w.wDown, null, N, I, C);
  adapt('down_proj', a.out, a.act);
  be.addRmsnormForward(a.out, next.out, next.rstd, a.out, a.h, next.weight, N, C, c.rmsNormEps);
}
