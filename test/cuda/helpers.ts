/**
 * Test helpers for the CUDA backend: a toy "step" that calls every Backend op with model-like shapes (so the
 * trace/plan tests and the compile gate exercise every kernel family), fake compiler/driver/cuBLAS objects for
 * running the device-mode code path without a GPU, and a seeded RNG.
 */
import { LORA_TARGETS, loraLayout } from '../../src/model/lora.js';
import { createHash } from 'node:crypto';
import { roundBf16 } from '../../src/backend/bf16.js';
import { LOSS_STATS, type Backend, type LossSpec } from '../../src/backend/backend.js';
import type { KernelCompiler } from '../../src/backend/cuda/ffi/nvrtc.js';
import type { CudaDriver } from '../../src/backend/cuda/ffi/driver.js';
import type { Cublas } from '../../src/backend/cuda/ffi/cublas.js';
import { representativeSpecs } from '../../src/backend/cuda/compile-all.js';
import { planKernels } from '../../src/backend/cuda/plan.js';
import type { KernelSpec } from '../../src/backend/cuda/kernels/spec.js';
import { presetConfig, type ModelConfig } from '../../src/model/config.js';
import { jobClosures } from '../../src/train/kernel-plan.js';
import { plainRope, type RopeSpec } from '../../src/backend/rope.js';

export interface ToyDims {
  B: number; T: number; C: number; hidden: number; vocab: number; nH: number; nKv: number; hd: number;
  eps: number; theta: number; loss: LossSpec; qkvBias: boolean;
}

export const QWEN_LIKE: ToyDims = {
  B: 2, T: 16, C: 896, hidden: 4864, vocab: 1000, nH: 14, nKv: 2, hd: 64, eps: 1e-6, theta: 1e6,
  loss: { kind: 'jsd', alpha: 0.5, temperature: 2, beta: 0.5 }, qkvBias: true,
};
export const LLAMA_LIKE: ToyDims = {
  B: 1, T: 8, C: 2048, hidden: 8192, vocab: 1000, nH: 32, nKv: 8, hd: 64, eps: 1e-5, theta: 5e5,
  loss: { kind: 'kl', alpha: 0.7, temperature: 1, beta: 0 }, qkvBias: false,
};

/** A closure that calls every Backend op once with the given shapes (values are whatever alloc gives). */
/** One RoPE of each scaled kind (linear, llama3, yarn) at this theta, so that a step launches every rope family. */
export function scaledRopes(theta: number): RopeSpec[] {
  return [
    { type: 'linear', theta, factor: 4 },
    { type: 'llama3', theta, factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 64 },
    { type: 'yarn', theta, factor: 4, originalMaxPositionEmbeddings: 64, betaFast: 32, betaSlow: 1, attentionFactor: 1.2, truncate: true },
  ];
}

export function allOpsStep(d: ToyDims): (b: Backend) => void {
  return (b) => {
    const n = d.B * d.T;
    const ids = b.allocInt(n, 'ids');
    const table = b.alloc(d.vocab * d.C, 'embed');
    const x = b.alloc(n * d.C, 'x'), y = b.alloc(n * d.C, 'y'), rstd = b.alloc(n, 'rstd'), w = b.alloc(d.C, 'w');
    b.embeddingForward(x, ids, table, n, d.C);
    b.rmsnormForward(y, rstd, x, w, n, d.C, d.eps);
    const q = b.alloc(n * d.nH * d.hd, 'q'), k = b.alloc(n * d.nKv * d.hd, 'k'), v = b.alloc(n * d.nKv * d.hd, 'v');
    const wq = b.alloc(d.nH * d.hd * d.C, 'wq'), bq = b.alloc(d.nH * d.hd, 'bq');
    b.matmulForward(q, y, wq, d.qkvBias ? bq : null, n, d.C, d.nH * d.hd);
    // Qwen3's per-head q norm (rows of head_dim: the warp-per-row norm kernels), forward and backward.
    const qn = b.alloc(q.length, 'q normed'), rq = b.alloc(n * d.nH, 'rstd q'), wqn = b.alloc(d.hd, 'q_norm'), dwqn = b.alloc(d.hd, 'dq_norm');
    b.rmsnormForward(qn, rq, q, wqn, n * d.nH, d.hd, d.eps);
    b.rmsnormBackward(q, dwqn, qn, q, wqn, rq, n * d.nH, d.hd);
    b.ropeForward(q, q, d.B, d.T, d.nH, d.hd, plainRope(d.theta), 0);
    for (const r of scaledRopes(d.theta)) b.ropeForward(k, k, d.B, d.T, d.nKv, d.hd, r, 3);
    const lse = b.alloc(d.B * d.nH * d.T, 'lse'), att = b.alloc(n * d.nH * d.hd, 'att');
    b.attentionForward(att, lse, q, k, v, d.B, d.T, d.nH, d.nKv, d.hd);
    const g = b.alloc(n * d.hidden, 'g'), u = b.alloc(n * d.hidden, 'u'), h = b.alloc(n * d.hidden, 'h');
    b.swigluForward(h, g, u, n * d.hidden);
    b.add(x, x, y, n * d.C);
    const r2 = b.alloc(n * d.C, 'r2');
    b.addRmsnormForward(x, y, rstd, x, r2, w, n, d.C, d.eps);
    const logits = b.alloc(n * d.vocab, 'logits'), teacher = b.alloc(n * d.vocab, 'teacher');
    const stats = b.alloc(n * LOSS_STATS, 'stats'), weights = b.alloc(n, 'weights'), targets = b.allocInt(n, 'targets');
    b.lossForward(stats, logits, logits, d.loss.kind === 'none' ? null : teacher, targets, weights, n, d.vocab, d.loss);
    // the sparse loss of a teacher cache (sample and top-K rows)
    if (d.loss.kind !== 'none') {
      for (const withTail of [false, true]) {
        const sp = { slots: 4, ids: b.allocInt(n * 4, 'ids'), prob: b.alloc(n * 4, 'prob'), logq: b.alloc(n * 4, 'logq'), tail: b.alloc(n, 'tail'), argmax: b.allocInt(n, 'argmax'), withTail };
        b.sparseLossForward(stats, logits, logits, targets, weights, sp, n, d.vocab, d.loss);
      }
      // a teacher-cache job's sparse rows of the logits (sample rows on the device)
      const rowsOut = { slots: 4, ids: b.allocInt(n * 4, 'ids'), logq: b.alloc(n * 4, 'logq'), tail: b.alloc(n, 'tail'), argmax: b.allocInt(n, 'argmax') };
      b.sparseTeacherRows(rowsOut, teacher, b.alloc(n, 'uniforms'), n, d.vocab, 2, 'sample');
      b.sparseTeacherRows(rowsOut, teacher, b.alloc(n, 'uniforms'), n, d.vocab, 2, 'top');
      // batched generation's device sampler
      b.sampleTokens(b.allocInt(n, 'sampled'), teacher, b.alloc(n, 'uniforms'), n, d.vocab, { temperature: 1, topK: 4, topP: 0.9 });
      // and its decode loop's step on the device
      b.decodeAdvance(b.allocInt(d.B, 'ids'), b.allocInt(d.B, 'positions'), b.allocInt(d.B, 'sampled'), b.alloc(d.B, 'uniforms'), b.alloc(3 * d.B, 'table'), b.allocInt(1, 'counter'), d.B, 3);
    }
    // backward
    const dq = b.alloc(q.length, 'dq'), dk = b.alloc(k.length, 'dk'), dv = b.alloc(v.length, 'dv'), datt = b.alloc(att.length, 'datt');
    b.attentionBackward(dq, dk, dv, datt, q, k, v, att, lse, d.B, d.T, d.nH, d.nKv, d.hd);
    b.ropeBackward(dq, dq, d.B, d.T, d.nH, d.hd, plainRope(d.theta), 0);
    for (const r of scaledRopes(d.theta)) b.ropeBackward(dk, dk, d.B, d.T, d.nKv, d.hd, r, 3);
    const dy = b.alloc(y.length, 'dy'), dwq = b.alloc(wq.length, 'dwq'), dbq = b.alloc(bq.length, 'dbq');
    b.matmulBackward(dy, dwq, d.qkvBias ? dbq : null, dq, y, wq, n, d.C, d.nH * d.hd);
    const dg = b.alloc(g.length, 'dg'), du = b.alloc(u.length, 'du');
    b.swigluBackward(dg, du, h, g, u, n * d.hidden);
    b.swigluBackward(dg, du, h, g, u, n * d.hidden, false);
    // the fused gate/up layout: rows of [gate | up]
    const gu = b.alloc(2 * n * d.hidden, 'gate|up'), dgu = b.alloc(2 * n * d.hidden, 'dgate|dup');
    b.swigluForwardRows(h, gu, n, d.hidden);
    b.swigluBackwardRows(dgu, h, gu, n, d.hidden);
    const dx = b.alloc(x.length, 'dx'), dw = b.alloc(d.C, 'dw');
    b.rmsnormBackward(dx, dw, dy, x, w, rstd, n, d.C);
    const dtable = b.alloc(table.length, 'dtable');
    b.embeddingBackward(dtable, dx, ids, n, d.C);
    b.accumulate(dtable, table, table.length);
    b.scale(dtable, 0.5, table.length);
    b.sumSquares(dtable, table.length);
    const m = b.alloc(w.length, 'm'), vv = b.alloc(w.length, 'v');
    b.adamw(w, dw, m, vv, w.length, { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1, step: 1, gradScale: 1 });
    b.adamwSegments(w, dw, m, vv, [{ offset: 0, size: w.length, decay: true }], { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1, step: 1, gradScale: 1 });
    // generation
    const tMax = d.T + 4;
    const kc = b.alloc(d.B * tMax * d.nKv * d.hd, 'kc'), vc = b.alloc(d.B * tMax * d.nKv * d.hd, 'vc');
    b.kvCacheWrite(kc, k, d.B, d.T, 0, tMax, d.nKv, d.hd);
    b.attentionCached(att, q, kc, vc, d.B, d.T, 0, tMax, d.nH, d.nKv, d.hd);
    // a decode step's rotation and cache writes from the fused q/k/v product, every RoPE kind
    const W = (d.nH + 2 * d.nKv) * d.hd, qkv = b.alloc(d.B * W, 'qkv'), bqkv = b.alloc(W, 'bqkv');
    const seqPositions = b.allocInt(d.B, 'positions');
    for (const r of [plainRope(d.theta), ...scaledRopes(d.theta)]) {
      b.ropeKvCacheWrite(q, kc, vc, qkv, d.B, 1, { seqPositions }, tMax, d.nH, d.nKv, d.hd, r, d.qkvBias ? bqkv : null);
    }
  };
}

/**
 * The mixed-precision (--precision bf16) data flow of notes/s3-seam: f32 residual stream, master weights, weight
 * gradients and AdamW moments; bf16 weights copy, activations, activation gradients and dlogits. One layer forward
 * and backward, the LM head and loss, the optimizer with its bf16 compute copy, and bf16 generation (KV cache), so the
 * plan, the compile gates and the mutation tests see every operand-dtype combination the model launches.
 */
export function allOpsStepBf16(d: ToyDims): (b: Backend) => void {
  return (b) => {
    const n = d.B * d.T, C = d.C, H = d.hidden, V = d.vocab, qd = d.nH * d.hd, kd = d.nKv * d.hd;
    const h16 = (len: number, label: string) => b.alloc(len, label, 'bf16');
    const f = (len: number, label: string) => b.alloc(len, label);
    const ids = b.allocInt(n, 'ids');
    const table = h16(V * C, 'embed (bf16 copy)');
    const x = f(n * C, 'x');
    b.embeddingForward(x, ids, table, n, C);
    const ln1 = h16(n * C, 'ln1'), rstd1 = f(n, 'rstd1'), w1 = h16(C, 'ln1 w');
    b.rmsnormForward(ln1, rstd1, x, w1, n, C, d.eps);
    const q = h16(n * qd, 'q'), k = h16(n * kd, 'k'), v = h16(n * kd, 'v');
    const wq = h16(qd * C, 'wq'), bq = h16(qd, 'bq'), wk = h16(kd * C, 'wk'), bk = h16(kd, 'bk'), wv = h16(kd * C, 'wv');
    b.matmulForward(q, ln1, wq, d.qkvBias ? bq : null, n, C, qd);
    b.matmulForward(k, ln1, wk, d.qkvBias ? bk : null, n, C, kd);
    b.matmulForward(v, ln1, wv, null, n, C, kd);
    // the fused q/k/v projection's split (a bias added) and its gradients' join
    const qkv = h16(n * (qd + 2 * kd), 'qkv');
    b.copyColumns(v, kd, 0, qkv, qd + 2 * kd, qd + kd, n, kd, bk);
    b.copyColumns(qkv, qd + 2 * kd, 0, q, qd, 0, n, qd);
    b.ropeForward(q, q, d.B, d.T, d.nH, d.hd, plainRope(d.theta), 0);
    for (const r of scaledRopes(d.theta)) b.ropeForward(k, k, d.B, d.T, d.nKv, d.hd, r, 3);
    const att = h16(n * qd, 'att'), lse = f(d.B * d.nH * d.T, 'lse');
    b.attentionForward(att, lse, q, k, v, d.B, d.T, d.nH, d.nKv, d.hd);
    const h = f(n * C, 'h'), wo = h16(C * qd, 'wo'), bo = h16(C, 'bo');
    b.matmulForward(h, att, wo, bo, n, qd, C);
    const ln2 = h16(n * C, 'ln2'), rstd2 = f(n, 'rstd2'), w2 = h16(C, 'ln2 w');
    b.addRmsnormForward(h, ln2, rstd2, h, x, w2, n, C, d.eps);
    const gate = h16(n * H, 'gate'), up = h16(n * H, 'up'), act = h16(n * H, 'act');
    const wg = h16(H * C, 'wg'), wu = h16(H * C, 'wu'), wd = h16(C * H, 'wd');
    b.matmulForward(gate, ln2, wg, null, n, C, H);
    b.matmulForward(up, ln2, wu, null, n, C, H);
    b.swigluForward(act, gate, up, n * H);
    const out = f(n * C, 'out');
    b.matmulForward(out, act, wd, null, n, H, C);
    const lnf = h16(n * C, 'lnf'), rstdf = f(n, 'rstdf'), wf = h16(C, 'lnf w'), headW = h16(V * C, 'head');
    b.addRmsnormForward(out, lnf, rstdf, out, h, wf, n, C, d.eps);
    const logits = f(n * V, 'logits'), teacher = f(n * V, 'teacher'), dlogits = h16(n * V, 'dlogits');
    b.matmulForward(logits, lnf, headW, null, n, C, V);
    b.matmulForward(teacher, lnf, headW, null, n, C, V); // the bf16 teacher's head
    const stats = f(n * LOSS_STATS, 'stats'), weights = f(n, 'weights'), targets = b.allocInt(n, 'targets');
    b.lossForward(stats, dlogits, logits, d.loss.kind === 'none' ? null : teacher, targets, weights, n, V, d.loss);
    const dHidden = f(n * C, 'dHidden'), dHeadW = f(V * C, 'dHeadW');
    b.matmulBackward(dHidden, dHeadW, null, dlogits, lnf, headW, n, C, V);
    const dx = f(n * C, 'dx'), dwf = f(C, 'dwf');
    b.rmsnormBackward(dx, dwf, dHidden, out, wf, rstdf, n, C);
    // layer backward
    const dxB = h16(n * C, 'dxB'), dact = f(n * H, 'dact'), dWd = f(C * H, 'dWd');
    b.copy(dxB, dx);
    b.matmulBackward(dact, dWd, null, dxB, act, wd, n, H, C);
    const dgate = h16(n * H, 'dgate'), dup = h16(n * H, 'dup');
    b.zero(dgate); b.zero(dup);
    b.swigluBackward(dgate, dup, dact, gate, up, n * H);
    const dln2 = f(n * C, 'dln2'), dWg = f(H * C, 'dWg'), dWu = f(H * C, 'dWu');
    b.matmulBackward(dln2, dWg, null, dgate, ln2, wg, n, C, H);
    b.matmulBackward(dln2, dWu, null, dup, ln2, wu, n, C, H);
    const dh = f(n * C, 'dh'), dw2 = f(C, 'dw2');
    b.rmsnormBackward(dh, dw2, dln2, h, w2, rstd2, n, C);
    const dhB = h16(n * C, 'dhB'), datt = h16(n * qd, 'datt'), dWo = f(C * qd, 'dWo'), dbo = f(C, 'dbo');
    b.copy(dhB, dh);
    b.matmulBackward(datt, dWo, dbo, dhB, att, wo, n, qd, C);
    const dq = h16(n * qd, 'dq'), dk = h16(n * kd, 'dk'), dv = h16(n * kd, 'dv');
    b.attentionBackward(dq, dk, dv, datt, q, k, v, att, lse, d.B, d.T, d.nH, d.nKv, d.hd);
    const dqPre = h16(n * qd, 'dqPre'), dkPre = h16(n * kd, 'dkPre');
    b.ropeBackward(dqPre, dq, d.B, d.T, d.nH, d.hd, plainRope(d.theta), 0);
    for (const r of scaledRopes(d.theta)) b.ropeBackward(dkPre, dk, d.B, d.T, d.nKv, d.hd, r, 3);
    const dln1 = f(n * C, 'dln1'), dWq = f(qd * C, 'dWq'), dbq = f(qd, 'dbq'), dWk = f(kd * C, 'dWk'), dbk = f(kd, 'dbk'), dWv = f(kd * C, 'dWv');
    b.matmulBackward(dln1, dWq, d.qkvBias ? dbq : null, dqPre, ln1, wq, n, C, qd);
    b.matmulBackward(dln1, dWk, d.qkvBias ? dbk : null, dkPre, ln1, wk, n, C, kd);
    b.matmulBackward(dln1, dWv, null, dv, ln1, wv, n, C, kd);
    const dw1 = f(C, 'dw1');
    b.rmsnormBackward(dx, dw1, dln1, x, w1, rstd1, n, C);
    const dtable = f(V * C, 'dtable');
    b.embeddingBackward(dtable, dx, ids, n, C);
    b.sumSquares(dWq, dWq.length);
    // optimizer: f32 master params, grads and moments over the flat buffer; the bf16 compute copy in the same launch
    const np = wq.length + 3, master = f(np, 'master'), grad = f(np, 'grad'), m = f(np, 'm'), vv = f(np, 'v'), copy = h16(np, 'params bf16');
    b.adamw(master, grad, m, vv, np, { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1, step: 1, gradScale: 1 }, copy);
    // frozen NF4 weights expanded into a bf16 scratch (src/model/frozen.ts)
    const nq = wq.length, codes = b.allocInt(Math.ceil(nq / 8), 'nf4 codes'), absmax = f(Math.ceil(nq / 64), 'nf4 absmax');
    b.dequantNf4(h16(nq, 'dequantized'), codes, absmax, nq, 64);
    // generation in bf16: KV cache, cached attention
    const tMax = d.T + 4;
    const kc = h16(d.B * tMax * kd, 'kc'), vc = h16(d.B * tMax * kd, 'vc');
    b.kvCacheWrite(kc, k, d.B, d.T, 0, tMax, d.nKv, d.hd);
    b.kvCacheWrite(vc, v, d.B, d.T, 0, tMax, d.nKv, d.hd);
    b.attentionCached(att, q, kc, vc, d.B, d.T, 0, tMax, d.nH, d.nKv, d.hd);
  };
}

/**
 * The attention ops of a bf16 (mixed-precision) step, as the model runs them: q, k, v, the attention output and its
 * gradients bf16 (lse f32), then bf16 generation (bf16 KV caches). With a head dim the tensor-core kernels take
 * (multiple of 16, at most 128) the plan holds attention_fwd_bf16 / attention_bwd_dq_bf16 / attention_bwd_dkv_bf16;
 * with another (e.g. 40) the SIMT kernels with bf16 operands. Kept apart from allOpsStep (non-attention bf16 ops
 * have their own step) so the trace, plan and compile-gate tests see every attention kernel a bf16 run launches.
 */
export function attentionOpsBf16(d: ToyDims): (b: Backend) => void {
  return (b) => {
    const n = d.B * d.T;
    const q = b.alloc(n * d.nH * d.hd, 'q', 'bf16'), k = b.alloc(n * d.nKv * d.hd, 'k', 'bf16'), v = b.alloc(n * d.nKv * d.hd, 'v', 'bf16');
    const lse = b.alloc(d.B * d.nH * d.T, 'lse'), att = b.alloc(n * d.nH * d.hd, 'att', 'bf16');
    b.attentionForward(att, lse, q, k, v, d.B, d.T, d.nH, d.nKv, d.hd);
    const dq = b.alloc(q.length, 'dq', 'bf16'), dk = b.alloc(k.length, 'dk', 'bf16'), dv = b.alloc(v.length, 'dv', 'bf16');
    const datt = b.alloc(att.length, 'datt', 'bf16');
    b.attentionBackward(dq, dk, dv, datt, q, k, v, att, lse, d.B, d.T, d.nH, d.nKv, d.hd);
    const tMax = d.T + 4;
    const kc = b.alloc(d.B * tMax * d.nKv * d.hd, 'kc', 'bf16'), vc = b.alloc(d.B * tMax * d.nKv * d.hd, 'vc', 'bf16');
    b.kvCacheWrite(kc, k, d.B, d.T, 0, tMax, d.nKv, d.hd);
    b.kvCacheWrite(vc, v, d.B, d.T, 0, tMax, d.nKv, d.hd);
    b.attentionCached(att, q, kc, vc, d.B, d.T, 0, tMax, d.nH, d.nKv, d.hd);
  };
}

/** A deterministic fake compiler: CUBIN = "CUBIN" + sha256(source + options). Counts calls and concurrency. */
export class FakeCompiler implements KernelCompiler {
  version = 'fake-1.0';
  build = 'fake-build-a';
  calls = 0;
  /** The labels the cache passed (spec.describe()), in call order. */
  readonly labels: string[] = [];
  inFlight = 0;
  maxInFlight = 0;
  /** Each cubin made, by its hex, to the label it was compiled under (labelOf). */
  private readonly labelByCubin = new Map<string, string>();
  constructor(private readonly delayMs = 0) {}
  private make(source: string, options: readonly string[], label?: string): Uint8Array {
    this.calls++;
    const cubin = Buffer.concat([Buffer.from('CUBIN'), createHash('sha256').update(`${source}|${options.join(' ')}`).digest()]);
    this.labelByCubin.set(cubin.toString('hex'), label ?? '');
    return cubin;
  }
  /** The label (spec.describe()) a cubin this compiler made was compiled under ('' if none): a fake driver's loadFunction can tell the kernels apart by it. */
  labelOf(cubin: Uint8Array): string { return this.labelByCubin.get(Buffer.from(cubin).toString('hex')) ?? ''; }
  compileSync(source: string, _name: string, options: readonly string[], label?: string): Uint8Array {
    if (label !== undefined) this.labels.push(label);
    return this.make(source, options, label);
  }
  async compile(source: string, _name: string, options: readonly string[], label?: string): Promise<Uint8Array> {
    if (label !== undefined) this.labels.push(label);
    this.inFlight++;
    this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
    await new Promise((r) => setTimeout(r, this.delayMs));
    this.inFlight--;
    return this.make(source, options, label);
  }
}

/** Device-mode plumbing without a GPU: records loads and launches, allocates nothing. */
export interface FakeDriverLog {
  /** Kernels run, in order (a graph launch appends its captured kernels). */
  launched: string[];
  /** Every stream call by kind: 'launch', 'capture', 'graphLaunch', 'htod', 'dtoh', 'memset', ... */
  calls: string[];
  /** Graphs alive (instantiated and not destroyed). */
  liveGraphs: number;
}

/**
 * A fake driver with a stream: work issued while capturing is kept in the graph instead of run; launching the graph
 * runs what it holds (its kernels appended to `launched`), as cuGraphLaunch would.
 */
export function fakeDriver(): CudaDriver & FakeDriverLog {
  let next = 0x1000n;
  let capture: Array<() => void> | null = null;
  const graphs = new Map<number, Array<() => void>>();
  let nextGraph = 1;
  const log: FakeDriverLog = { launched: [], calls: [], liveGraphs: 0 };
  const onStream = (kind: string, run: () => void = () => {}): void => {
    log.calls.push(capture ? `capture ${kind}` : kind);
    if (capture) capture.push(run); else run();
  };
  const f = Object.assign(log, {
    deviceName: 'fake GPU', arch: 'sm_90', ccMajor: 9, ccMinor: 0, device: 0, smCount: 132,
    // as many blocks an SM as fill any grid a test launches in one wave: a choice by occupancy keeps its first option
    // (tests override this)
    occupancy: () => 64,
    resources: () => ({ registers: 64, localBytes: 0 }),
    memAlloc: (bytes: number) => { const p = next; next += BigInt(Math.max(256, bytes)); return p; },
    memFree: () => {}, memsetD32: () => onStream('memset'), memsetD8: () => onStream('memset'),
    htod: () => { if (capture) throw new Error('fake driver: htod while capturing'); onStream('htod'); },
    dtoh: () => { if (capture) throw new Error('fake driver: dtoh while capturing'); onStream('dtoh'); },
    dtod: () => onStream('dtod'),
    hostAlloc: (bytes: number) => { const p = next; next += BigInt(Math.max(256, bytes)); return { ptr: p, addr: p, buffer: new ArrayBuffer(Math.max(4, bytes)) }; },
    hostFree: () => {},
    dtohAsync: () => { if (capture) throw new Error('fake driver: dtohAsync while capturing'); onStream('dtohAsync'); },
    htodAsync: () => { if (capture) throw new Error('fake driver: htodAsync while capturing'); onStream('htodAsync'); },
    recordOn: () => onStream('record'), waitEvent: () => {},
    synchronize: () => {}, streamSynchronize: () => {}, release: () => {}, unloadModule: () => {},
    useStream: () => {}, currentStream: 'fake stream', destroyStream: () => {},
    loadFunction: (_c: Uint8Array, entry: string) => ({ module: {}, fn: entry }),
    launch: (fn: unknown) => onStream('launch', () => { log.launched.push(String(fn)); }),
    setMaxDynamicShared: () => {},
    beginCapture: () => { if (capture) throw new Error('fake driver: nested capture'); capture = []; },
    endCapture: () => {
      if (!capture) throw new Error('fake driver: endCapture without beginCapture');
      const id = nextGraph++;
      graphs.set(id, capture);
      capture = null;
      log.liveGraphs++;
      return id;
    },
    graphLaunch: (exec: unknown) => {
      const g = graphs.get(exec as number);
      if (!g) throw new Error(`fake driver: no graph ${String(exec)}`);
      onStream('graphLaunch', () => { for (const run of g) run(); });
    },
    graphDestroy: (exec: unknown) => { if (graphs.delete(exec as number)) log.liveGraphs--; },
    eventCreate: () => ({}), eventRecord: () => {}, eventRecordNode: () => {}, eventQuery: () => true,
    eventElapsedMs: () => 0, eventDestroy: () => {}, eventSynchronize: () => {},
    // the side stream of overlapped collectives: its fork and join are stream calls of their own
    sideStream: 'fake side stream', forkSide: () => onStream('fork'), joinSide: () => onStream('join'), waitGuard: null, aborted: false,
  });
  return f as unknown as CudaDriver & FakeDriverLog;
}

/** A fake cuBLAS; `calls` records each GEMM: 'sgemm' or 'gemmEx A/B→C' with the cudaDataType_t numbers. */
export function fakeCublas(): Cublas & { calls: string[] } {
  const calls: string[] = [];
  return {
    calls,
    sgemm: () => { calls.push('sgemm'); },
    gemmEx: (...a: unknown[]) => { calls.push(`gemmEx ${String(a[6])}/${String(a[9])}→${String(a[12])}`); },
    setWorkspace: () => {}, setMathMode: () => {}, setStream: () => {}, destroy: () => {},
  } as unknown as Cublas & { calls: string[] };
}

/** Mulberry32: a small seeded RNG for test inputs. */
/** n uniform values in [-scale, scale) from r. */
export function rand(r: () => number, n: number, scale = 1): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = (r() * 2 - 1) * scale;
  return a;
}

/** n bf16-representable uniform values in [-scale, scale) from r. */
export function randBf16(r: () => number, n: number, scale: number): Float64Array {
  return Float64Array.from({ length: n }, () => roundBf16((r() * 2 - 1) * scale));
}

export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export const LLAMA_1B_LIKE: ModelConfig = {
  architecture: 'llama', vocabSize: 128256, hiddenSize: 2048, intermediateSize: 8192, numLayers: 16, numHeads: 16, numKvHeads: 8,
  headDim: 128, rope: { type: 'llama3', theta: 5e5, factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 },
  rmsNormEps: 1e-5, tieWordEmbeddings: false, maxPositionEmbeddings: 131072, qkvBias: false, qkNorm: false, noRopeLayers: [],
};

/**
 * The real plans: what `distillery distill/train/generate/eval` pre-warm for these models, in fp32 and in bf16 (the
 * CUDA default precision).
 */
export function realPlans(): KernelSpec[] {
  return planKernels((['fp32', 'bf16'] as const).flatMap((precision) => [
    ...jobClosures({
      student: presetConfig('qwen2.5-0.5b', 151936), teacher: presetConfig('qwen2.5-1.5b', 151936), batch: 4, seq: 256,
      loss: { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0.5 }, train: true, evaluate: true, generateLen: 256, precision,
    }),
    // batched generation (per-sequence positions)
    ...jobClosures({ student: presetConfig('qwen2.5-0.5b', 151936), batch: 1, seq: 1, generateLen: 384, generateBatch: 8, precision }),
    ...jobClosures({ student: LLAMA_1B_LIKE, batch: 2, seq: 512, train: true, evaluate: true, generateLen: 512, precision }),
    // a LoRA distillation (r = 16 on every projection, frozen base)
    ...jobClosures({
      student: presetConfig('qwen2.5-0.5b', 151936), teacher: presetConfig('qwen2.5-1.5b', 151936), batch: 4, seq: 256,
      loss: { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0.5 }, train: true, evaluate: true, precision,
      lora: loraLayout(presetConfig('qwen2.5-0.5b', 151936), { rank: 16, alpha: 32, targets: [...LORA_TARGETS] }),
    }),
    // a teacher-cache job and distillations from sample and top-K caches
    ...jobClosures({ student: presetConfig('qwen2.5-1.5b', 151936), teacher: presetConfig('qwen2.5-1.5b', 151936), batch: 4, seq: 256, cacheTeacher: { kind: 'sample', n: 32 }, precision }),
    ...jobClosures({ student: presetConfig('qwen2.5-1.5b', 151936), teacher: presetConfig('qwen2.5-1.5b', 151936), batch: 4, seq: 256, cacheTeacher: { kind: 'top', k: 64 }, precision }),
    ...(['sample', 'top'] as const).flatMap((kind) => jobClosures({
      student: presetConfig('qwen2.5-0.5b', 151936), batch: 4, seq: 256, loss: { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0.5 }, train: true,
      evaluate: true, precision, teacherCache: kind === 'sample' ? { kind, n: 32 } : { kind, k: 64 },
    })),
  ]));
}

/**
 * What the compile gates compile: the real plans, the representative set and the all-ops toy steps (f32 and the bf16
 * data flow), deduplicated by source.
 */
export function gateSpecs(): { plans: KernelSpec[]; specs: KernelSpec[] } {
  const plans = realPlans();
  const seen = new Set<string>();
  const specs: KernelSpec[] = [];
  const bf16Attention = [QWEN_LIKE, LLAMA_LIKE, { ...QWEN_LIKE, hd: 128, nH: 12 }, { ...QWEN_LIKE, hd: 40 }].map(attentionOpsBf16);
  const toy = planKernels([allOpsStep(QWEN_LIKE), allOpsStep(LLAMA_LIKE), allOpsStepBf16(QWEN_LIKE), allOpsStepBf16(LLAMA_LIKE), ...bf16Attention]);
  for (const s of [...plans, ...representativeSpecs(), ...toy]) {
    const h = createHash('sha256').update(s.source()).digest('hex');
    if (!seen.has(h)) { seen.add(h); specs.push(s); }
  }
  return { plans, specs };
}

/**
 * A GPU test file's backend(s): `open` runs once and may throw where there is no libcuda or no GPU; `skip` is then why
 * the file's tests skip (node:test's skip option), else false.
 */
export function gpuOrSkip<T>(open: () => T): { value: T | null; skip: string | false } {
  try {
    return { value: open(), skip: false };
  } catch (e) {
    return { value: null, skip: `no CUDA GPU here (${(e as Error).message})` };
  }
}
