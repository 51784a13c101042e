/**
 * LoRA adapters (Hu et al., 2021; PEFT's conventions): for each targeted projection W [out, in] of each layer, two
 * trainable matrices A [r, in] and B [out, r], and the projection becomes
 *
 *     y = x·Wᵀ (+ bias) + s · (x·Aᵀ)·Bᵀ,   s = alpha / r   (PEFT's default scaling; rsLoRA is not offered)
 *
 * with W frozen. PEFT's initialisation: A ~ U(−1/√in, 1/√in) (kaiming_uniform with a = √5), B = 0, so a fresh
 * adapter leaves the model unchanged. Tensor names are PEFT's (`base_model.model.model.layers.{l}.self_attn.q_proj.
 * lora_A.weight`), so the adapter file is the one PEFT writes and reads.
 *
 * The adapters live in one flat buffer (the same layout as the base model's, llm.c style): fp32 masters and their
 * gradients, a compute copy in bf16 training. The forward keeps, per layer and target, t = s·(x·Aᵀ) [tokens, r] (the
 * only activation the backward needs besides the projection's input, which the base model keeps); the backward is
 *
 *     dB += dyᵀ·t,   dt = s·(dy·B),   dA += dtᵀ·x,   dx += dt·A
 *
 * — matrix products and a scale only (no LoRA-specific kernel).
 */
import type { Backend, Buf, DType } from '../backend/backend.js';
import type { ModelConfig } from './config.js';
import { TensorWeights, type LayerTensors, type TensorInfo, type Weights } from './params.js';
import { DistilleryError } from '../util/errors.js';
import { Rng } from '../util/rng.js';

/** The projections LoRA can target, by their Hugging Face module names. */
export const LORA_TARGETS = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] as const;
export type LoraTarget = (typeof LORA_TARGETS)[number];
const MLP_TARGETS: readonly LoraTarget[] = ['gate_proj', 'up_proj', 'down_proj'];

export interface LoraSpec {
  rank: number;
  alpha: number;
  targets: readonly LoraTarget[];
}

/** The base layer weight each target adapts. */
export const TARGET_WEIGHT: Record<LoraTarget, keyof LayerTensors> = {
  q_proj: 'wq', k_proj: 'wk', v_proj: 'wv', o_proj: 'wo', gate_proj: 'wGate', up_proj: 'wUp', down_proj: 'wDown',
};

/** [out, in] of a target's projection. */
export function targetShape(c: ModelConfig, t: LoraTarget): [number, number] {
  const C = c.hiddenSize, Q = c.numHeads * c.headDim, KV = c.numKvHeads * c.headDim, I = c.intermediateSize;
  switch (t) {
    case 'q_proj': return [Q, C];
    case 'k_proj': case 'v_proj': return [KV, C];
    case 'o_proj': return [C, Q];
    case 'gate_proj': case 'up_proj': return [I, C];
    case 'down_proj': return [C, I];
  }
}

export function checkLoraSpec(s: LoraSpec): void {
  if (!(Number.isInteger(s.rank) && s.rank >= 1)) throw new DistilleryError(`--lora-rank must be a positive integer, got ${s.rank}`, 'try --lora-rank 16');
  if (!(Number.isFinite(s.alpha) && s.alpha > 0)) throw new DistilleryError(`--lora-alpha must be a positive number, got ${s.alpha}`, 'PEFT\'s usual choice is twice the rank');
  if (s.targets.length === 0) throw new DistilleryError('--lora-targets names no projection', `name some of ${LORA_TARGETS.join(', ')}`);
  for (const t of s.targets) {
    if (!LORA_TARGETS.includes(t)) throw new DistilleryError(`--lora-targets: unknown projection "${t}"`, `use ${LORA_TARGETS.join(', ')} (Hugging Face module names)`);
  }
}

/** Parses --lora-targets: comma-separated HF names, or "all" (every projection); the result is in LORA_TARGETS order. */
export function parseLoraTargets(s: string): LoraTarget[] {
  if (s.trim() === 'all') return [...LORA_TARGETS];
  const out = [...new Set(s.split(',').map((x) => x.trim()).filter((x) => x.length > 0))] as LoraTarget[];
  checkLoraSpec({ rank: 1, alpha: 1, targets: out });
  return LORA_TARGETS.filter((t) => out.includes(t)); // a set, in the layers' order
}

/** One adapted projection of one layer. */
export interface LoraTensors { target: LoraTarget; a: TensorInfo; b: TensorInfo; in: number; out: number }

export interface LoraLayout {
  spec: LoraSpec;
  scale: number;
  tensors: TensorInfo[];
  /** Per layer, the adapted projections in LORA_TARGETS order. */
  layers: LoraTensors[][];
  total: number;
}

/** The flat layout of a model's adapters, with PEFT's tensor names. */
export function loraLayout(c: ModelConfig, spec: LoraSpec): LoraLayout {
  checkLoraSpec(spec);
  const r = spec.rank, tensors: TensorInfo[] = [];
  let offset = 0;
  const add = (name: string, shape: number[], init: TensorInfo['init']): TensorInfo => {
    const size = shape[0]! * shape[1]!;
    const t: TensorInfo = { name, shape, offset, size, decay: true, init };
    tensors.push(t);
    offset += size;
    return t;
  };
  const layers: LoraTensors[][] = [];
  for (let l = 0; l < c.numLayers; l++) {
    const row: LoraTensors[] = [];
    for (const target of LORA_TARGETS) {
      if (!spec.targets.includes(target)) continue;
      const [out, inn] = targetShape(c, target);
      const mod = `base_model.model.model.layers.${l}.${MLP_TARGETS.includes(target) ? 'mlp' : 'self_attn'}.${target}`;
      row.push({ target, in: inn, out, a: add(`${mod}.lora_A.weight`, [r, inn], 'normal'), b: add(`${mod}.lora_B.weight`, [out, r], 'zeros') });
    }
    layers.push(row);
  }
  return { spec, scale: spec.alpha / r, tensors, layers, total: offset };
}

/** PEFT's initial adapter: A ~ U(−1/√in, 1/√in), B = 0. */
export function loraInitialWeights(lay: LoraLayout, rng: Rng): Float32Array {
  const w = new Float32Array(lay.total);
  for (const row of lay.layers) {
    for (const t of row) {
      const bound = 1 / Math.sqrt(t.in);
      for (let i = 0; i < t.a.size; i++) w[t.a.offset + i] = (2 * rng.next() - 1) * bound;
    }
  }
  return w;
}

/** Views of one adapted projection: its A and B (compute copy), their gradients (null without), its saved t. */
export interface LoraView { target: LoraTarget; in: number; out: number; a: Buf; b: Buf; ga: Buf | null; gb: Buf | null; t: Buf }

/**
 * A model's adapters on a backend: masters, compute copy, gradients, and the activations their forward keeps.
 * `layerViews(l)` are what layerForward and the model's backward read.
 */
export class LoraAdapters {
  readonly params: Buf;
  readonly weights: Buf;
  readonly grads: Buf | null;
  /** Per layer and target, t = s·(x·Aᵀ) [tokens, r] (training: one per layer; inference: shared across layers). */
  private readonly saved: Buf[][];
  /** dt = s·(dy·B) [tokens, r]: backward scratch shared by every projection. */
  readonly dt: Buf;
  private readonly views: LoraView[][];

  constructor(readonly backend: Backend, readonly layout: LoraLayout, readonly compute: DType, tokens: number, training: boolean, label: string) {
    const be = backend, r = layout.spec.rank;
    this.params = be.alloc(layout.total, `${label} LoRA adapters`, training ? 'f32' : compute);
    this.weights = this.params.dtype === compute ? this.params : be.alloc(layout.total, `${label} LoRA adapters (${compute})`, compute);
    this.grads = training ? be.alloc(layout.total, `${label} LoRA gradients`) : null;
    this.dt = be.alloc(tokens * r, `${label} LoRA scratch (dt)`, compute);
    const shared = training ? null : layout.layers[0]?.map((t) => be.alloc(tokens * r, `${label} LoRA activations (${t.target} t)`, compute)) ?? [];
    this.saved = layout.layers.map((row, l) => row.map((t, k) => shared ? shared[k]! : be.alloc(tokens * r, `${label} LoRA activations (layer ${l} ${t.target} t)`, compute)));
    const v = (buf: Buf, t: TensorInfo): Buf => be.view(buf, t.offset, t.size);
    this.views = layout.layers.map((row, l) => row.map((t, k) => ({
      target: t.target, in: t.in, out: t.out, a: v(this.weights, t.a), b: v(this.weights, t.b),
      ga: this.grads ? v(this.grads, t.a) : null, gb: this.grads ? v(this.grads, t.b) : null, t: this.saved[l]![k]!,
    })));
  }

  get scale(): number { return this.layout.scale; }
  get rank(): number { return this.layout.spec.rank; }

  layerViews(l: number): LoraView[] { return this.views[l]!; }

  setWeights(w: ArrayLike<number>): void {
    if (w.length !== this.layout.total) throw new DistilleryError(`LoRA weight array has ${w.length} elements, the adapters need ${this.layout.total}`);
    this.backend.upload(this.params, w);
    this.syncWeights();
  }
  syncWeights(): void {
    if (this.weights !== this.params) this.backend.copy(this.weights, this.params);
  }
  getWeights(): Float32Array | Float64Array { return this.backend.download(this.params); }
  zeroGrad(): void { if (this.grads) this.backend.zero(this.grads); }
}

/**
 * The adapter's share of a projection's forward: out += s·(inp·Aᵀ)·Bᵀ over n rows, keeping t = s·(inp·Aᵀ) in v.t.
 * Called right after the base projection wrote out; the B product accumulates into out in the GEMM itself (no
 * [tokens, out] scratch, no extra pass over the projection's output).
 */
export function loraForward(be: Backend, ad: LoraAdapters, v: LoraView, out: Buf, inp: Buf, n: number): void {
  const r = ad.rank, t = be.view(v.t, 0, n * r);
  be.matmulForward(t, inp, v.a, null, n, v.in, r);
  be.scale(t, ad.scale, n * r);
  be.matmulForward(out, t, v.b, null, n, r, v.out, true);
}

/**
 * The adapter's share of a projection's backward from dy = dL/d(out): dB += dyᵀ·t, dt = s·(dy·B), dA += dtᵀ·inp,
 * dinp += dt·A. Called after the base projection's backward wrote (or accumulated into) dinp.
 */
export function loraBackward(be: Backend, ad: LoraAdapters, v: LoraView, dinp: Buf, dy: Buf, inp: Buf, n: number): void {
  const r = ad.rank, t = be.view(v.t, 0, n * r), dt = be.view(ad.dt, 0, n * r);
  be.matmulBackward(dt, v.gb, null, dy, t, v.b, n, r, v.out, false);
  be.scale(dt, ad.scale, n * r);
  be.matmulBackward(dinp, v.ga, null, dt, inp, v.a, n, v.in, r, true);
}

/** W + s·B·A for every adapted projection: the merged flat weights of the base model (host, float32; float64 sums). */
export function mergeLora(base: Float32Array | Float64Array | TensorWeights, baseLayers: LayerTensors[], lay: LoraLayout, adapter: ArrayLike<number>): Weights {
  const r = lay.spec.rank, s = lay.scale;
  // W[o, :] += s · (B·A)[o, :] for one adapter, into w (the target matrix's values)
  const mergeOne = (w: Float32Array, t: LoraLayout['layers'][number][number]): void => {
    const acc = new Float64Array(t.in);
    for (let o = 0; o < t.out; o++) {
      acc.fill(0);
      // row o of B·A, k outer so the inner loop runs along contiguous rows of A
      for (let k = 0; k < r; k++) {
        const b = adapter[t.b.offset + o * r + k]!;
        if (b === 0) continue;
        const a0 = t.a.offset + k * t.in;
        for (let i = 0; i < t.in; i++) acc[i] = acc[i]! + b * adapter[a0 + i]!;
      }
      const w0 = o * t.in;
      for (let i = 0; i < t.in; i++) w[w0 + i] = w[w0 + i]! + s * acc[i]!;
    }
  };
  if (!(base instanceof TensorWeights)) {
    const flat = Float32Array.from(base);
    lay.layers.forEach((row, l) => {
      for (const t of row) {
        const W = baseLayers[l]![TARGET_WEIGHT[t.target]] as TensorInfo;
        mergeOne(flat.subarray(W.offset, W.offset + W.size), t);
      }
    });
    return flat;
  }
  // a base kept tensor by tensor: each target matrix merged when it is read (the merged model is never whole in memory)
  const targets = new Map<string, Array<LoraLayout['layers'][number][number]>>();
  lay.layers.forEach((row, l) => {
    for (const t of row) {
      const name = (baseLayers[l]![TARGET_WEIGHT[t.target]] as TensorInfo).name;
      targets.set(name, [...(targets.get(name) ?? []), t]);
    }
  });
  return new TensorWeights(base.layout, (W) => {
    const ts = targets.get(W.name);
    if (!ts) return base.tensor(W);
    const w = Float32Array.from(base.tensor(W));
    for (const t of ts) mergeOne(w, t);
    return w;
  });
}

/** The LoRA spec of a run's options, or null when it trains every weight (--lora-rank 0). alpha 0 means 2 × rank. */
export function loraSpecOf(o: { loraRank?: number | undefined; loraAlpha?: number | undefined; loraTargets?: string | undefined }): LoraSpec | null {
  const rank = o.loraRank ?? 0;
  if (rank === 0) return null;
  const spec: LoraSpec = { rank, alpha: o.loraAlpha || 2 * rank, targets: parseLoraTargets(o.loraTargets ?? 'all') };
  checkLoraSpec(spec);
  return spec;
}
