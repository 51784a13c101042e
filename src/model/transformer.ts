/**
 * The decoder-only transformer (Qwen2 / Llama family), written once against the Backend interface.
 *
 * Explicit forward and backward per layer, llm.c style: every activation the backward pass needs is kept in a
 * buffer allocated up front (sized from config, batch and sequence length), so a training step allocates
 * nothing. Layer l:  h = x + o_proj(attn(rope(qn(q(ln1 x))), rope(kn(k(ln1 x))), v(ln1 x)));  x' = h + down(silu(gate(ln2 h)) * up(ln2 h)),
 * with qn/kn Qwen3's per-head q/k RMSNorms (identity in the other families) and no rope on SmolLM3's NoPE layers.
 * The model owns parameters (one flat buffer, see params.ts), gradients (same layout) and activations; the
 * optimizer state belongs to the trainer, the KV cache to the generator.
 *
 * Precision ('fp32' | 'bf16'): in bf16 the matrix products run on bf16 operands with fp32 accumulation. A training
 * model keeps fp32 master weights (`params`, what the optimizer updates and checkpoints hold) and a bf16 compute copy
 * (`weights`, what forward and backward read; AdamW refreshes it in the same launch); an inference model (teacher,
 * evaluation, generation) holds its weights once, in bf16. Activations that feed a matrix product or attention
 * (norm outputs, q/k/v, attention output, gate/up/SwiGLU, and their gradients) are bf16; the residual stream, its
 * gradient, norm statistics, attention's lse, logits and all weight gradients stay fp32. Before a product that reads
 * the fp32 residual gradient, it is converted into a bf16 scratch (dxB). In fp32 every buffer is fp32 and
 * `weights` is `params`.
 */
import type { Backend, Buf, DocPositions, DType, IntBuf } from '../backend/backend.js';
import { checkDocPositions } from '../backend/backend.js';
import type { Trainable } from '../train/optimizer.js';
import { preRopeScratch, ropeOnFusedColumns, usesRope, type ModelConfig } from './config.js';
import { TensorWeights, adjacentSpan, float32Of, fusesGateUp, fusesQkv, gateUpSpan, parameterLayout, qkvSpans, sharedFloat32, weightSlice, type ParamLayout, type TensorInfo } from './params.js';
import { DistilleryError } from '../util/errors.js';
import { inputNorm, layerForward, layerWeights, type LayerLora, type LayerWeights, type NextNorm, type QkNormActivations } from './layer.js';
import { LoraAdapters, loraBackward, type LoraLayout, type LoraTarget } from './lora.js';
import { FrozenNf4, nf4Plan, type FrozenDtype } from './frozen.js';

export interface TransformerOptions {
  /** Largest batch a forward call will get. */
  batch: number;
  /** Largest sequence length a forward call will get. */
  seq: number;
  /** Keep per-layer activations and allocate gradients (training); false for a teacher or evaluation. */
  training: boolean;
  /** Label prefix for allocations (error messages and memory reports). */
  label?: string;
  /** 'fp32' (default) or 'bf16' (see the module comment). */
  precision?: Precision;
  /**
   * LoRA adapters on the projections (src/model/lora.ts). A training model with adapters trains only them: its base
   * weights are frozen — held once, in the compute dtype, with no gradients (nor optimizer state: `trainable()` is the
   * adapters).
   */
  lora?: LoraLayout | undefined;
  /**
   * 'nf4': the frozen weights' projection matrices in 4 bits (src/model/frozen.ts), dequantized one layer at a time for
   * the products. Only for a model whose weights never train: an inference model, or a LoRA base. Default 'auto': the
   * compute dtype.
   */
  frozenDtype?: FrozenDtype | undefined;
  /**
   * Data parallel with sharded masters (ZeRO-1, src/parallel/data-parallel.ts): a bf16 training model keeps the fp32
   * master weights of [begin, end) of the flat layout only (the optimizer's shard of this rank); the bf16 compute copy
   * stays whole. getWeights() is then refused: the whole masters are gathered over the ranks (ShardedAdamW.gatherMasters).
   */
  masterRange?: { begin: number; end: number } | undefined;
  /**
   * Run each layer's q/k/v projection as one product where the layout allows (src/model/layer.ts; default true). False
   * runs three, as versions before did: for the tests that hold the two equal.
   */
  fuseQkv?: boolean | undefined;
  /**
   * Run each layer's gate and up projections as one product where the layout allows (params.ts fusesGateUp). Default:
   * in a model that trains (the backward's one input-gradient product pays: on an H100 at 8192 rows, forward + backward
   * per layer 865 → 818 µs at the 0.5B's shape, 2117 → 2108 at the 1.5B's), not in one that only runs forward (the
   * 1.5B's forward measured 711 → 723 µs fused: docs/measurements/gradients/gpu-2026-11-27-s21-overwrite-grads.txt).
   * False runs two products: for the tests that hold the two equal.
   */
  fuseGateUp?: boolean | undefined;
  /**
   * Windows hold several documents, each attending only to itself with RoPE positions from 0 (padding-free packing,
   * Backend DocPositions): stageInputs then takes each row's position in its document. Default false: a window is one
   * sequence (positions 0 .. t − 1, every row attends to all rows before it).
   */
  documents?: boolean | undefined;
}

/** Storage precision of a model's weights and activations. */
export type Precision = 'fp32' | 'bf16';
export const PRECISIONS: readonly Precision[] = ['fp32', 'bf16'];

/** The dtype of the buffers a model of this precision multiplies. */
export function computeDtype(p: Precision): DType { return p === 'bf16' ? 'bf16' : 'f32'; }

interface LayerActs {
  x: Buf; // layer input (residual stream) [N, C]
  ln1: Buf; rstd1: Buf; q: Buf; k: Buf; v: Buf; att: Buf;
  /** Attention's saved state: the log-sum-exp of each query row, [B, nHeads, T] (linear in T). */
  lse: Buf;
  h: Buf; // residual after attention [N, C]
  ln2: Buf; rstd2: Buf;
  /** The gate and up products' outputs [N, I] each, or (fused gate/up) one [N, 2·I] with both in each row (the other null). */
  gate: Buf | null; up: Buf | null; gu: Buf | null;
  act: Buf;
  /** Qwen3's q/k norm inputs and rstds (null without q/k norms). */
  qkn: QkNormActivations | null;
}

interface GradScratch {
  /** dL/d(final norm output) [N, C]: the LM head (in the step, chunk by chunk) accumulates into it. */
  dHidden: Buf;
  dx: Buf; dln: Buf; dq: Buf; dk: Buf; dv: Buf; datt: Buf; dact: Buf;
  /** dgate and dup [N, I] each, or (fused gate/up) joined [N, 2·I] as the product's output gradient (the other null). */
  dgate: Buf | null; dup: Buf | null; dgu: Buf | null;
  /** dq and dk before RoPE (and q/k norms): the other buffer of each pair, null where no layer needs it (preRopeScratch). */
  dqPre: Buf | null; dkPre: Buf | null;
  /** dx converted to the compute dtype, as a matrix-product operand (dx itself in fp32). */
  dxB: Buf;
  /** The q, k and v gradients joined [N, Q + 2·KV] for the fused projection's backward (null where it does not run). */
  dqkv: Buf | null;
}

export class Transformer {
  readonly config: ModelConfig;
  readonly backend: Backend;
  readonly layout: ParamLayout;
  readonly batch: number;
  readonly seq: number;
  readonly training: boolean;
  readonly precision: Precision;
  /** The dtype of activations that feed matrix products, and of `weights`. */
  readonly compute: DType;
  /** The parameters: fp32 master weights when training (what the optimizer updates), else the only copy. */
  readonly params: Buf;
  /** The weights forward and backward read: `params`, or its bf16 compute copy when training in bf16. */
  readonly weights: Buf;
  /** Gradients of the base weights: null for an inference model, and for a training model with LoRA (frozen base). */
  readonly grads: Buf | null;
  /** The LoRA adapters (null without). */
  readonly lora: LoraAdapters | null;
  /** Where `params` starts in the flat layout, and how many elements it holds: 0 and all of them unless masters are sharded. */
  readonly masterOffset: number;
  readonly masterLength: number;
  /** The NF4 storage of frozen weights (null unless frozenDtype 'nf4'); `params` and `weights` are then its dense part. */
  readonly nf4: FrozenNf4 | null;
  /**
   * Full logits [batch·seq, vocab] for `forward()`, allocated on its first call. Training and evaluation never
   * allocate them: the step runs the LM head and the loss a chunk of rows at a time (src/train/head.ts).
   */
  private logitsBuf: Buf | null = null;
  private dlogitsBuf: Buf | null = null;

  private readonly ids: IntBuf;
  /** Each row's position in its document (TransformerOptions.documents), or null. */
  private readonly docs: DocPositions | null;
  private readonly acts: LayerActs[];
  private readonly xFinal: Buf;
  private readonly lnf: Buf;
  private readonly rstdf: Buf;
  private readonly g: GradScratch | null;
  private lastShape: { b: number; t: number } | null = null;
  /** The shape of the ids stageInputs uploaded last. */
  private staged: { b: number; t: number } | null = null;
  private readonly label: string;
  /** Whether each layer keeps its SwiGLU output for backward (every weight trains), else one buffer the backward refills. */
  private readonly actKept: boolean;
  /** Views of each layer's weights. */
  readonly layerW: LayerWeights[];
  /**
   * The layers' weights as generation runs them (src/model/cached-layers.ts): layerW, with the gate and up projections
   * joined wherever the storage keeps them adjacent and no adapter sits on them, in a model that only runs forward too.
   * A decode step's few rows pay a launch per product (one joined product of 2·intermediate columns instead of two);
   * training's forward over thousands of rows keeps its own choice (fuseGateUp).
   */
  readonly decodeLayerW: LayerWeights[];
  /** The fused q/k/v projection's output [N, Q + 2·KV] (one for all layers: split at once), null where it does not run. */
  private readonly qkvBuf: Buf | null;

  constructor(backend: Backend, config: ModelConfig, opts: TransformerOptions) {
    const { batch, seq, training } = opts;
    if (!(Number.isInteger(batch) && batch > 0 && Number.isInteger(seq) && seq > 0)) {
      throw new DistilleryError(`batch (${batch}) and sequence length (${seq}) must be positive integers`);
    }
    if (seq > config.maxPositionEmbeddings) {
      throw new DistilleryError(`sequence length ${seq} exceeds max_position_embeddings ${config.maxPositionEmbeddings}`,
        'lower --seq');
    }
    this.config = config;
    this.backend = backend;
    this.batch = batch;
    this.seq = seq;
    this.training = training;
    this.layout = parameterLayout(config);
    const lab = opts.label ?? 'model';
    const c = config, N = batch * seq, C = c.hiddenSize;
    const Q = c.numHeads * c.headDim, KV = c.numKvHeads * c.headDim, I = c.intermediateSize;
    const precision = opts.precision ?? 'fp32';
    if (!PRECISIONS.includes(precision)) throw new DistilleryError(`unknown precision ${String(precision)}`, `use one of ${PRECISIONS.join(', ')}`);
    this.precision = precision;
    const A = this.compute = computeDtype(precision);
    const trainBase = training && !opts.lora;
    if (opts.frozenDtype === 'nf4' && trainBase) {
      throw new DistilleryError('4-bit (nf4) weights are frozen: a model that trains every weight cannot store them in nf4', 'train LoRA adapters on an nf4 base (--lora-rank with --base-dtype nf4), or keep the weights in the compute dtype');
    }
    this.nf4 = opts.frozenDtype === 'nf4' ? new FrozenNf4(backend, this.layout, nf4Plan(this.layout), A, lab) : null;
    const mr = trainBase && A !== 'f32' && opts.masterRange && opts.masterRange.end - opts.masterRange.begin < this.layout.total ? opts.masterRange : null;
    this.masterOffset = mr ? mr.begin : 0;
    this.params = this.nf4 ? this.nf4.dense : mr ? backend.alloc(Math.max(1, mr.end - mr.begin), `${lab} master weights (shard ${mr.begin}..${mr.end})`)
      : backend.alloc(this.layout.total, `${lab} parameters${opts.lora ? ' (frozen)' : ''}`, trainBase ? 'f32' : A);
    this.masterLength = mr ? mr.end - mr.begin : this.layout.total;
    this.weights = this.params.dtype === A && !mr ? this.params : backend.alloc(this.layout.total, `${lab} ${A} weights`, A);
    this.grads = trainBase ? backend.alloc(this.layout.total, `${lab} gradients`) : null;
    this.lora = opts.lora ? new LoraAdapters(backend, opts.lora, A, N, training, lab) : null;
    this.ids = backend.allocInt(N, `${lab} token ids`);
    this.docs = opts.documents === true ? { docPositions: backend.allocInt(N, `${lab} document positions`) } : null;
    // The fused q/k/v projection (layer.ts) over views of the weights' storage, unless adapters sit on q, k or v.
    const fuse = opts.fuseQkv !== false && fusesQkv(this.layout, opts.lora);
    const span = (ts: TensorInfo[]): Buf | null => {
      if (this.nf4) return this.nf4.span(ts);
      const sp = adjacentSpan(ts);
      return sp && backend.view(this.weights, sp[0], sp[1]);
    };
    // The fused gate/up product likewise, where every layer's storage keeps the two adjacent (else none runs it).
    const fuseGU = (opts.fuseGateUp ?? training) && fusesGateUp(this.layout, opts.lora);
    const weightsOf = (gateUp: boolean): LayerWeights[] => this.layout.layers.map((w) =>
      layerWeights((t) => this.p(t), w, fuse || gateUp ? span : undefined, { qkv: fuse, gateUp }));
    let layerW = weightsOf(fuseGU);
    if (fuseGU && !layerW.every((w) => w.wgu)) layerW = weightsOf(false);
    this.layerW = layerW;
    const gu = layerW.every((w) => w.wgu !== null);
    const joined = !gu && opts.fuseGateUp !== false && fusesGateUp(this.layout, opts.lora) ? weightsOf(true) : null;
    this.decodeLayerW = joined?.every((w) => w.wgu !== null) ? joined : layerW;
    const W = Q + 2 * KV;
    this.qkvBuf = this.layerW.some((w) => w.wqkv) ? backend.alloc(N * W, `${lab} activations (fused q/k/v output)`, A) : null;
    // SwiGLU's output: kept per layer when every weight trains (the down projection's weight gradient reads it; keeping it
    // costs numLayers · N · intermediate elements, 1.9 GB for Qwen2.5-0.5B at 8×1024, and saves a pass over gate, up and
    // act per layer, 24 passes of about 81 µs there on an H100); with adapters on a frozen base (LoRA, QLoRA: the memory-bound
    // jobs) the backward recomputes it from gate and up into one buffer shared by the layers.
    this.actKept = trainBase;
    const actShared = this.actKept ? null : backend.alloc(N * I, `${lab} activations (swiglu, recomputed in backward)`, A);
    const makeActs = (i: number): LayerActs => {
      const a = (n: number, what: string, d: DType = 'f32'): Buf => backend.alloc(n, `${lab} activations (layer ${i} ${what})`, d);
      return {
        x: a(N * C, 'x'), ln1: a(N * C, 'ln1', A), rstd1: a(N, 'rstd1'), q: a(N * Q, 'q', A), k: a(N * KV, 'k', A),
        v: a(N * KV, 'v', A), lse: a(batch * c.numHeads * seq, 'attention lse'), att: a(N * Q, 'attention out', A),
        h: a(N * C, 'h'), ln2: a(N * C, 'ln2', A), rstd2: a(N, 'rstd2'),
        gate: gu ? null : a(N * I, 'gate', A), up: gu ? null : a(N * I, 'up', A), gu: gu ? a(2 * N * I, 'gate|up', A) : null,
        act: actShared ?? a(N * I, 'swiglu', A),
        qkn: c.qkNorm ? {
          qRaw: a(N * Q, 'q before q_norm', A), kRaw: a(N * KV, 'k before k_norm', A),
          rstdQ: a(N * c.numHeads, 'q_norm rstd'), rstdK: a(N * c.numKvHeads, 'k_norm rstd'),
        } : null,
      };
    };
    // Inference keeps one set of activations for all layers; x alternates between two buffers.
    this.acts = [];
    if (training) for (let l = 0; l < c.numLayers; l++) this.acts.push(makeActs(l));
    else {
      const shared = makeActs(0);
      const other = backend.alloc(N * C, `${lab} activations (x alt)`);
      for (let l = 0; l < c.numLayers; l++) this.acts.push({ ...shared, x: l % 2 === 0 ? shared.x : other });
    }
    this.xFinal = backend.alloc(N * C, `${lab} activations (final x)`);
    this.lnf = backend.alloc(N * C, `${lab} activations (final norm)`, A);
    this.rstdf = backend.alloc(N, `${lab} activations (final rstd)`);
    this.label = lab;
    const gs = (n: number, what: string, d: DType = 'f32'): Buf => backend.alloc(n, `${lab} grad scratch ${what}`, d);
    if (training) {
      const dx = gs(N * C, 'dx');
      // The second buffer of the q/k gradients' pairs: needed where a layer's RoPE backward cannot write straight into
      // the fused product's joined gradient (three projections) or where q/k norms follow it (preRopeScratch).
      const pre = preRopeScratch(c, this.layerW.map((w) => w.wqkv !== null && this.qkvBuf !== null));
      this.g = {
        dHidden: backend.alloc(N * C, `${lab} grad of the final norm output`),
        dx, dln: gs(N * C, 'dln'), dq: gs(N * Q, 'dq', A), dk: gs(N * KV, 'dk', A), dv: gs(N * KV, 'dv', A),
        dqPre: pre ? gs(N * Q, 'dq pre-rope', A) : null, dkPre: pre ? gs(N * KV, 'dk pre-rope', A) : null, datt: gs(N * Q, 'datt', A),
        dact: gs(N * I, 'dact', A), dgate: gu ? null : gs(N * I, 'dgate', A), dup: gu ? null : gs(N * I, 'dup', A),
        dgu: gu ? gs(2 * N * I, 'dgate|dup', A) : null,
        dxB: A === 'f32' ? dx : gs(N * C, `dx (${A})`, A),
        dqkv: this.qkvBuf ? gs(N * W, 'dq/dk/dv joined', A) : null,
      };
    } else {
      this.g = null;
    }
  }

  /** A view of one tensor of the weights forward and backward read (`weights`: the compute copy in bf16 training). */
  p(t: TensorInfo): Buf {
    if (this.nf4) return this.nf4.view(t);
    return this.backend.view(this.weights, t.offset, t.size);
  }
  /**
   * Makes layer l's weights readable through p() / layerW[l] before the layer's products: with NF4 storage, dequantizes
   * its matrices into the one-layer scratch (every layer's views point there); otherwise nothing.
   */
  materialize(l: number): void {
    this.nf4?.materialize(l);
  }
  /** A tensor's gradient; null for a frozen base (LoRA). */
  private gr(t: TensorInfo): Buf | null {
    return this.grads ? this.backend.view(this.grads, t.offset, t.size) : null;
  }
  private grOpt(t: TensorInfo | null): Buf | null {
    return t ? this.gr(t) : null;
  }
  /** What the optimizer trains: the adapters with LoRA, else the parameters. */
  trainable(): Trainable {
    return this.lora ?? this;
  }
  /** Layer l's adapters for layerForward (null without LoRA): the training step and the generators. */
  layerLora(l: number): LayerLora | null {
    if (!this.lora) return null;
    return { ad: this.lora, views: new Map(this.lora.layerViews(l).map((v) => [v.target, v])) };
  }
  private v(buf: Buf, n: number): Buf {
    return this.backend.view(buf, 0, n);
  }
  /** Views of a layer's q/k norm state for N tokens. */
  private qknViews(q: QkNormActivations | null, N: number): QkNormActivations | null {
    const c = this.config;
    return q && {
      qRaw: this.v(q.qRaw, N * c.numHeads * c.headDim), kRaw: this.v(q.kRaw, N * c.numKvHeads * c.headDim),
      rstdQ: this.v(q.rstdQ, N * c.numHeads), rstdK: this.v(q.rstdK, N * c.numKvHeads),
    };
  }

  /** Uploads a full flat weight array (layout order). */
  setWeights(w: ArrayLike<number> | TensorWeights): void {
    if (w.length !== this.layout.total) {
      throw new DistilleryError(`weight array has ${w.length} elements, the model needs ${this.layout.total}`);
    }
    // NF4 quantization on the host: the CPU backend's thread count, else every core (Nf4Quantizer's default)
    if (this.nf4) { this.nf4.setWeights(w, 'threads' in this.backend && typeof this.backend.threads === 'number' ? this.backend.threads : undefined); return; }
    if (w instanceof TensorWeights) {
      // tensor by tensor (a model above one typed array): the compute copy and, sharded, the masters' part of each
      const be = this.backend, mo = this.masterOffset, ml = this.masterLength, sharded = ml < this.layout.total;
      for (const t of this.layout.tensors) {
        const dst = be.view(sharded ? this.weights : this.params, t.offset, t.size);
        // bf16 weights alone (no float32 masters to fill): a checkpoint's tensors go up as bf16 bits, no float32 between
        if (!sharded && dst.dtype === 'bf16' && w.hasBf16) { be.uploadBf16(dst, w.bf16(t)); continue; }
        const d = w.tensor(t);
        be.upload(dst, d);
        if (!sharded) continue;
        const b = Math.max(t.offset, mo), e = Math.min(t.offset + t.size, mo + ml);
        if (e > b) be.upload(be.view(this.params, b - mo, e - b), d.subarray(b - t.offset, e - t.offset));
      }
      this.syncWeights();
      return;
    }
    if (this.masterLength < this.layout.total) {
      // sharded masters: the compute copy whole (rounded), the masters of this rank's shard
      this.backend.upload(this.weights, w);
      const o = this.masterOffset, n = this.masterLength;
      this.backend.upload(this.params, weightSlice(w, o, o + n));
      this.syncWeights();
      return;
    }
    this.backend.upload(this.params, w);
    this.syncWeights();
  }

  /** Refreshes the compute copy from the master weights (after anything but AdamW wrote `params`). */
  syncWeights(): void {
    if (this.masterLength < this.layout.total) this.backend.copy(this.backend.view(this.weights, this.masterOffset, this.masterLength), this.backend.view(this.params, 0, this.masterLength));
    else if (this.weights !== this.params) this.backend.copy(this.weights, this.params);
  }

  getWeights(): Float32Array | Float64Array {
    if (this.nf4) return this.nf4.getWeights();
    if (this.masterLength < this.layout.total) throw new DistilleryError('this model keeps the master weights of its shard only: gather them over the ranks (ShardedAdamW.gatherMasters)');
    return this.backend.download(this.params);
  }

  /**
   * The weights as float32, downloaded into one host array the model keeps for its checkpoints and returns again at
   * each call (valid until the next): a save then writes into pages already mapped, where a new 2 GB array per save of
   * a 0.5B model cost seconds of first-touch page faults (measured on the H100 machine: 2.0 s against 0.18 s into a
   * touched array). Steady host memory: the weights' float32 size, from the first call of this or keptWeights (a run
   * makes it at its start). The array is over a SharedArrayBuffer (the checkpoint writer's thread reads it in place). (An nf4 model, never trained whole, returns a
   * new array.)
   */
  checkpointWeights(): Float32Array {
    if (this.nf4) return float32Of(this.nf4.getWeights());
    if (this.masterLength < this.layout.total) throw new DistilleryError('this model keeps the master weights of its shard only: gather them over the ranks (ShardedAdamW.gatherMasters)');
    const host = this.keptWeights()!;
    this.backend.download(this.params, host);
    return host;
  }

  /** The host array checkpointWeights fills (allocated now if needed), or null where it returns new arrays (nf4, a shard). */
  keptWeights(): Float32Array | null {
    if (this.nf4 || this.masterLength < this.layout.total) return null;
    this.hostWeights ??= sharedFloat32(this.layout.total);
    return this.hostWeights;
  }
  private hostWeights: Float32Array | null = null;

  zeroGrad(): void {
    if (this.grads) this.backend.zero(this.grads);
    this.lora?.zeroGrad();
    this.gradWrites = { overwrite: false, head: false };
  }

  /**
   * What zeroGrad() then a backward pass computes, without the pass that zeroes the gradients: the next backward pass
   * overwrites each parameter's gradient at its first write (matmulBackward / rmsnormBackward with dweightAccumulate
   * false; the embedding's where nothing wrote it yet is zeroed, as are LM-head rows past the loss head's width) and
   * accumulates its later writes and those of later passes (gradient accumulation). Until that pass ends the gradients
   * hold stale values: only a backward pass may follow (a pass that throws midway leaves them so: call this or zeroGrad
   * again before the next). LoRA adapters' gradients are zeroed (small).
   */
  overwriteGrads(): void {
    this.lora?.zeroGrad();
    this.gradWrites = { overwrite: this.grads !== null, head: false };
  }
  /** Where the current gradients stand (overwriteGrads): first writes still to overwrite, and whether the LM head's was made. */
  private gradWrites = { overwrite: false, head: false };

  /**
   * Whether the caller's next write of headGrad() accumulates (false: it is the pass's first and overwrites; the caller
   * then also zeroes what it does not write, see ChunkedHead). Marks the head's gradient written.
   */
  headGradAccumulates(): boolean {
    const acc = !this.gradWrites.overwrite || this.gradWrites.head;
    this.gradWrites.head = true;
    return acc;
  }

  /** The LM head's weight [vocab, hidden] (the embedding table when tied). */
  headWeight(): Buf {
    return this.p(this.layout.lmHead ?? this.layout.embed);
  }
  /** The LM head's gradient (the embedding gradient when tied); null without gradients. */
  headGrad(): Buf | null {
    return this.grads ? this.gr(this.layout.lmHead ?? this.layout.embed) : null;
  }
  /** dL/d(final hidden) [batch·seq, hidden] that backwardHidden() reads: the LM head's backward accumulates into it. */
  hiddenGrad(): Buf {
    if (!this.g) throw new DistilleryError('hiddenGrad() needs a model created with training: true');
    return this.g.dHidden;
  }

  /**
   * Forward pass over ids [b, t] with full logits: a view of [b·t, vocab], in a buffer allocated on the first
   * call. For tools and tests; training and evaluation use forwardHidden() and the step's chunked LM head.
   */
  forward(ids: Int32Array, b: number, t: number, positions: Int32Array | null = null): Buf {
    const c = this.config, N = b * t, C = c.hiddenSize;
    const hidden = this.forwardHidden(ids, b, t, positions);
    if (!this.logitsBuf) this.logitsBuf = this.backend.alloc(this.batch * this.seq * c.vocabSize, `${this.label} logits`);
    const logits = this.v(this.logitsBuf, N * c.vocabSize);
    this.backend.matmulForward(logits, hidden, this.headWeight(), null, N, C, c.vocabSize);
    return logits;
  }

  /**
   * Forward pass over ids [b, t] (row-major, b ≤ batch, t ≤ seq) up to the final norm (`positions`: stageInputs'). Returns
   * a view of the final hidden states [b·t, hidden], the LM head's input.
   */
  forwardHidden(ids: Int32Array, b: number, t: number, positions: Int32Array | null = null): Buf {
    this.stageInputs(ids, b, t, positions);
    return this.forwardStaged(b, t);
  }

  /** Whether windows hold several documents, each attending to itself (TransformerOptions.documents). */
  get documents(): boolean { return this.docs !== null; }

  /**
   * Uploads token ids [b, t] for forwardStaged (a captured region uploads its inputs before its work), and with
   * `documents` each row's position in its document ([b, t], checkDocPositions; null: each window one document).
   */
  stageInputs(ids: Int32Array, b: number, t: number, positions: Int32Array | null = null): void {
    if (b > this.batch || t > this.seq || b < 1 || t < 1) {
      throw new DistilleryError(`forward shape [${b}, ${t}] exceeds the allocated [${this.batch}, ${this.seq}]`);
    }
    if (ids.length < b * t) throw new DistilleryError(`forward got ${ids.length} token ids for shape [${b}, ${t}]`);
    const N = b * t;
    if (positions && !this.docs) {
      throw new DistilleryError(`${this.label}: document positions given to a model made without documents (TransformerOptions.documents)`);
    }
    if (this.docs) {
      // without positions, each window is one document
      const pos = positions ?? Int32Array.from({ length: N }, (_, i) => i % t);
      try { checkDocPositions(pos, b, t); } catch (e) { throw new DistilleryError(`${this.label}: ${(e as Error).message}`); }
      this.backend.uploadInt(this.docs.docPositions, pos.length === N ? pos : pos.subarray(0, N));
    }
    this.backend.uploadInt(this.ids, ids.length === N ? ids : ids.subarray(0, N));
    this.staged = { b, t };
  }

  /** forwardHidden over the ids stageInputs uploaded last (same b and t): device work only. */
  forwardStaged(b: number, t: number): Buf {
    const c = this.config, be = this.backend;
    if (!this.staged || this.staged.b !== b || this.staged.t !== t) {
      throw new DistilleryError(`forwardStaged([${b}, ${t}]) without stageInputs of that shape`);
    }
    const N = b * t, C = c.hiddenSize, Q = c.numHeads * c.headDim, KV = c.numKvHeads * c.headDim, I = c.intermediateSize;
    const L = this.layout;
    be.embeddingForward(this.v(this.acts[0]!.x, N * C), this.ids, this.p(L.embed), N, C);
    const a0 = this.acts[0]!;
    inputNorm(be, c, this.layerW[0]!, { x: this.v(a0.x, N * C), ln1: this.v(a0.ln1, N * C), rstd1: this.v(a0.rstd1, N) }, N);
    const hidden = this.v(this.lnf, N * C);
    for (let l = 0; l < c.numLayers; l++) {
      const a = this.acts[l]!, an = this.acts[l + 1];
      // The layer's output is the next layer's x (or xFinal); its norm, fused with the closing add, that layer's ln1 (or lnf).
      const xNext = an ? an.x : this.xFinal;
      const next: NextNorm = an
        ? { weight: this.layerW[l + 1]!.ln1, out: this.v(an.ln1, N * C), rstd: this.v(an.rstd1, N) }
        : { weight: this.p(L.finalNorm), out: hidden, rstd: this.v(this.rstdf, N) };
      const lse = this.v(a.lse, b * c.numHeads * t);
      this.materialize(l);
      layerForward(be, c, l, this.layerW[l]!, {
        x: this.v(a.x, N * C), ln1: this.v(a.ln1, N * C), rstd1: this.v(a.rstd1, N), q: this.v(a.q, N * Q),
        k: this.v(a.k, N * KV), v: this.v(a.v, N * KV), att: this.v(a.att, N * Q), h: this.v(a.h, N * C),
        ln2: this.v(a.ln2, N * C), rstd2: this.v(a.rstd2, N), gate: a.gate && this.v(a.gate, N * I), up: a.up && this.v(a.up, N * I), gu: a.gu && this.v(a.gu, 2 * N * I),
        act: this.v(a.act, N * I), out: this.v(xNext, N * C), qkNorm: this.qknViews(a.qkn, N), lora: this.layerLora(l),
        qkv: this.qkvBuf && this.v(this.qkvBuf, N * (Q + 2 * KV)),
      }, b, t, this.docs ?? 0, (q, k, v, att) => be.attentionForward(att, lse, q, k, v, b, t, c.numHeads, c.numKvHeads, c.headDim, this.docs), next);
    }
    this.lastShape = { b, t };
    return hidden;
  }

  /**
   * Backward pass for the last forward() call, from dlogits [b·t, vocab] (may be the logits buffer itself,
   * overwritten by the loss op). ACCUMULATES into the gradients; call zeroGrad() at the start of a step.
   */
  backward(dlogits: Buf): void {
    if (!this.g) throw new DistilleryError('backward() needs a model created with training: true');
    if (!this.lastShape) throw new DistilleryError('backward() called before forward()');
    const { b, t } = this.lastShape;
    const N = b * t, C = this.config.hiddenSize, dh = this.v(this.g.dHidden, N * C), V = this.config.vocabSize;
    let dz = this.v(dlogits, N * V);
    if (dz.dtype !== this.compute) {
      // A bf16 model's head products take bf16 operands (tools and tests only: the step's chunked head does this itself).
      this.dlogitsBuf ??= this.backend.alloc(this.batch * this.seq * V, `${this.label} dlogits (${this.compute})`, this.compute);
      const conv = this.v(this.dlogitsBuf, N * V);
      this.backend.copy(conv, dz);
      dz = conv;
    }
    // dh is overwritten (the head's product is its only gradient); the head's weight gradient per headGradAccumulates
    this.backend.matmulBackward(dh, this.headGrad(), null, dz,
      this.v(this.lnf, N * C), this.headWeight(), N, C, this.config.vocabSize, false, this.grads ? this.headGradAccumulates() : true);
    this.backwardHidden();
  }

  /**
   * Backward pass for the last forward call from dL/d(final hidden), which the caller has accumulated into
   * hiddenGrad() (the LM head's backward, e.g. chunk by chunk). ACCUMULATES into the gradients. `ready` hears, as the
   * pass goes, each range [begin, end) of trainable()'s buffer whose gradients are now final (data parallel reduces
   * them while the rest of the pass runs: src/parallel/grad-reducer.ts): the final norm with an untied LM head (whose
   * gradient the caller's head backward completed), each layer from the last, the embedding; with LoRA, each layer's
   * adapters.
   */
  backwardHidden(ready?: (begin: number, end: number) => void): void {
    if (!this.g) throw new DistilleryError('backward() needs a model created with training: true');
    if (!this.lastShape) throw new DistilleryError('backward() called before forward()');
    const { b, t } = this.lastShape;
    const c = this.config, be = this.backend, L = this.layout, g = this.g;
    const N = b * t, C = c.hiddenSize, Q = c.numHeads * c.headDim, KV = c.numKvHeads * c.headDim, I = c.intermediateSize;
    const dx = this.v(g.dx, N * C), dln = this.v(g.dln, N * C);
    // Each parameter gradient's one write in this pass overwrites it after overwriteGrads() (acc false), else accumulates.
    const acc = !this.gradWrites.overwrite;
    // Final norm.
    be.zero(dx);
    // The residual gradient as a matrix-product operand: dx itself in fp32; in bf16 its bf16 copy, which each norm
    // backward into dx writes beside it (but the first layer's input norm: the embedding's backward reads dx).
    const dxB = g.dxB === g.dx ? null : this.v(g.dxB, N * C);
    be.rmsnormBackward(dx, this.gr(L.finalNorm), this.v(g.dHidden, N * C), this.v(this.xFinal, N * C), this.p(L.finalNorm), this.v(this.rstdf, N), N, C, dxB, acc);
    // An untied LM head whose gradient this pass did not write: zeroed before its range is handed on as final.
    if (L.lmHead && !acc && !this.gradWrites.head) be.zero(this.gr(L.lmHead)!);
    const readyRange = ready ? gradReadyRanges(L, this.lora?.layout ?? null) : null;
    if (readyRange?.tail) ready!(...readyRange.tail);
    // The gradient of a fused product's joined weights (or biases): a span of adjacent tensors; null for a frozen base.
    const gv = (s: [number, number] | null): Buf | null => (s && this.grads ? be.view(this.grads, s[0], s[1]) : null);
    for (let l = c.numLayers - 1; l >= 0; l--) {
      const a = this.acts[l]!, w = L.layers[l]!;
      this.materialize(l); // a frozen NF4 base: the input gradients read the layer's matrices
      const lo = this.layerLora(l);
      // Each adapter's backward right after its projection's: it accumulates into the input gradient the base wrote.
      const adapt = (target: LoraTarget, dinp: Buf, dy: Buf, inp: Buf): void => {
        const v = lo?.views.get(target);
        if (v) loraBackward(be, lo!.ad, v, dinp, dy, inp, N);
      };
      const ln1 = this.v(a.ln1, N * C), h = this.v(a.h, N * C), ln2 = this.v(a.ln2, N * C);
      const act = this.v(a.act, N * I), wgu = this.layerW[l]!.wgu;
      // MLP: x' = h + down(swiglu(gate(ln2), up(ln2))). dx holds dL/dx'; it flows to h unchanged.
      const dact = this.v(g.dact, N * I);
      const dxOp = dxB ?? dx;
      // Outputs that start a gradient (dact, dgate, dup, the first product into dln and datt) are overwritten, not
      // zeroed and accumulated into.
      if (wgu && a.gu && g.dgu) {
        // the fused gate/up product: one backward product over the joined gradient [N, 2·I] (its weight gradient is the
        // gate's then the up's, adjacent in the layout)
        const gu = this.v(a.gu, 2 * N * I), dgu = this.v(g.dgu, 2 * N * I), sp = gateUpSpan(w)!;
        if (!this.actKept) be.swigluForwardRows(act, gu, N, I); // recomputed (see actShared)
        be.matmulBackward(dact, this.gr(w.wDown), null, dxOp, act, this.p(w.wDown), N, I, C, false, acc);
        adapt('down_proj', dact, dxOp, act);
        be.swigluBackwardRows(dgu, dact, gu, N, I);
        be.matmulBackward(dln, gv(sp), null, dgu, ln2, wgu, N, C, 2 * I, false, acc);
      } else {
        const gate = this.v(a.gate!, N * I), up = this.v(a.up!, N * I), dgate = this.v(g.dgate!, N * I), dup = this.v(g.dup!, N * I);
        if (!this.actKept) be.swigluForward(act, gate, up, N * I); // recomputed (see actShared)
        be.matmulBackward(dact, this.gr(w.wDown), null, dxOp, act, this.p(w.wDown), N, I, C, false, acc);
        adapt('down_proj', dact, dxOp, act);
        be.swigluBackward(dgate, dup, dact, gate, up, N * I, false);
        be.matmulBackward(dln, this.gr(w.wGate), null, dgate, ln2, this.p(w.wGate), N, C, I, false, acc);
        adapt('gate_proj', dln, dgate, ln2);
        be.matmulBackward(dln, this.gr(w.wUp), null, dup, ln2, this.p(w.wUp), N, C, I, true, acc);
        adapt('up_proj', dln, dup, ln2);
      }
      be.rmsnormBackward(dx, this.gr(w.ln2), dln, h, this.p(w.ln2), this.v(a.rstd2, N), N, C, dxB, acc);
      // Attention: h = x + o_proj(att). dx now holds dL/dh; it flows to x unchanged.
      const datt = this.v(g.datt, N * Q), dq = this.v(g.dq, N * Q), dk = this.v(g.dk, N * KV), dv = this.v(g.dv, N * KV);
      const dqPre = g.dqPre && this.v(g.dqPre, N * Q), dkPre = g.dkPre && this.v(g.dkPre, N * KV);
      be.matmulBackward(datt, this.gr(w.wo), this.grOpt(w.bo), dxOp, this.v(a.att, N * Q), this.p(w.wo), N, Q, C, false, acc);
      adapt('o_proj', datt, dxOp, this.v(a.att, N * Q));
      // dq, dk, dv and the rotation's outputs are overwritten (no zeroing pass, the old values never read)
      be.attentionBackward(dq, dk, dv, datt, this.v(a.q, N * Q), this.v(a.k, N * KV), this.v(a.v, N * KV),
        this.v(a.att, N * Q), this.v(a.lse, b * c.numHeads * t), b, t, c.numHeads, c.numKvHeads, c.headDim, false, this.docs);
      // Back through RoPE (not on NoPE layers) and the q/k norms (Qwen3) to the projections' outputs. gq/gk hold the
      // gradient of the current stage's output; each stage writes into the other buffer of its pair and swaps.
      let gq = dq, gk = dk, fq = dqPre, fk = dkPre;
      const other = (x: Buf | null): Buf => {
        if (!x) throw new Error(`layer ${l}: no pre-RoPE gradient scratch (preRopeScratch disagrees with the backward)`);
        return x;
      };
      const qn = this.qknViews(a.qkn, N);
      const lw = this.layerW[l]!, Wd = Q + 2 * KV, wqkv = g.dqkv ? lw.wqkv : null;
      // the fused projection's joined gradient [N, Q + 2·KV]: without q/k norms the rotation writes its q and k columns
      const d = wqkv ? this.v(g.dqkv!, N * Wd) : null, rotateInto = ropeOnFusedColumns(c, l, d !== null);
      if (rotateInto && d) {
        be.ropeBackward(be.view(d, 0, N * Wd), gq, b, t, c.numHeads, c.headDim, c.rope, this.docs ?? 0, false, { out: Wd });
        be.ropeBackward(be.view(d, Q, N * Wd - Q), gk, b, t, c.numKvHeads, c.headDim, c.rope, this.docs ?? 0, false, { out: Wd });
      } else if (usesRope(c, l)) {
        const oq = other(fq), ok = other(fk);
        be.ropeBackward(oq, gq, b, t, c.numHeads, c.headDim, c.rope, this.docs ?? 0, false);
        be.ropeBackward(ok, gk, b, t, c.numKvHeads, c.headDim, c.rope, this.docs ?? 0, false);
        [gq, fq, gk, fk] = [oq, gq, ok, gk];
      }
      if (qn) {
        const oq = other(fq), ok = other(fk);
        be.zero(oq); be.zero(ok);
        be.rmsnormBackward(oq, this.gr(w.qNorm!), gq, qn.qRaw, this.p(w.qNorm!), qn.rstdQ, N * c.numHeads, c.headDim, null, acc);
        be.rmsnormBackward(ok, this.gr(w.kNorm!), gk, qn.kRaw, this.p(w.kNorm!), qn.rstdK, N * c.numKvHeads, c.headDim, null, acc);
        [gq, fq, gk, fk] = [oq, gq, ok, gk];
      }
      if (d && wqkv) {
        // the fused projection's backward: the three gradients joined (q's and k's already, where the rotation wrote
        // them), one product (its weight and bias gradients are the q, k, v ones, adjacent in the layout)
        const sp = qkvSpans(w)!;
        if (!rotateInto) {
          be.copyColumns(d, Wd, 0, gq, Q, 0, N, Q);
          be.copyColumns(d, Wd, Q, gk, KV, 0, N, KV);
        }
        be.copyColumns(d, Wd, Q + KV, dv, KV, 0, N, KV);
        be.matmulBackward(dln, gv(sp.weight), gv(sp.bias), d, ln1, wqkv, N, C, Wd, false, acc);
      } else {
        be.matmulBackward(dln, this.gr(w.wq), this.grOpt(w.bq), gq, ln1, this.p(w.wq), N, C, Q, false, acc);
        adapt('q_proj', dln, gq, ln1);
        be.matmulBackward(dln, this.gr(w.wk), this.grOpt(w.bk), gk, ln1, this.p(w.wk), N, C, KV, true, acc);
        adapt('k_proj', dln, gk, ln1);
        be.matmulBackward(dln, this.gr(w.wv), this.grOpt(w.bv), dv, ln1, this.p(w.wv), N, C, KV, true, acc);
        adapt('v_proj', dln, dv, ln1);
      }
      be.rmsnormBackward(dx, this.gr(w.ln1), dln, this.v(a.x, N * C), this.p(w.ln1), this.v(a.rstd1, N), N, C, l > 0 ? dxB : null, acc);
      const r = readyRange?.layers[l];
      if (r && r[1] > r[0]) ready!(...r);
    }
    const gEmbed = this.gr(L.embed);
    // The embedding's backward adds each token's row: zeroed first where this pass has not written it yet (an untied
    // LM head, or a tied one whose head gradient the caller did not write).
    if (gEmbed && !acc && (L.lmHead !== null || !this.gradWrites.head)) be.zero(gEmbed);
    if (gEmbed) be.embeddingBackward(gEmbed, dx, this.ids, N, C);
    this.gradWrites = { overwrite: false, head: false };
    if (readyRange?.head) ready!(...readyRange.head);
  }
}

/**
 * The ranges of the trainable buffer whose gradients the backward pass completes, in its order: `tail` after the final
 * norm (it and an untied LM head, the end of the buffer), `layers[l]` after layer l, `head` after the embedding (the
 * start of the buffer; a tied LM head's gradient is the embedding's). With LoRA only the adapters train: per layer.
 */
export function gradReadyRanges(L: ParamLayout, lora: LoraLayout | null): {
  tail: [number, number] | null; layers: Array<[number, number]>; head: [number, number] | null;
} {
  if (lora) {
    return {
      tail: null, head: null,
      layers: lora.layers.map((row): [number, number] => row.length === 0 ? [0, 0] : [row[0]!.a.offset, row[row.length - 1]!.b.offset + row[row.length - 1]!.b.size]),
    };
  }
  const starts = L.layers.map((w) => w.ln1.offset);
  return {
    tail: [L.finalNorm.offset, L.total],
    layers: starts.map((s, l): [number, number] => [s, l + 1 < starts.length ? starts[l + 1]! : L.finalNorm.offset]),
    head: [0, starts[0] ?? L.finalNorm.offset],
  };
}
