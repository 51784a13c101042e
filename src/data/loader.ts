/**
 * BatchLoader: batches of B windows over a training set, in a seeded shuffled order per epoch.
 *
 * Epoch e visits every window once, in the permutation drawn by `new Rng(mix(seed, e))`, so the order of any epoch
 * is recomputable from `{ seed, epoch }` alone. A batch that runs past the end of an epoch continues with the next
 * epoch's order (every batch is full). The position `{ epoch, index, seed }` is plain JSON: store `state()` in a
 * checkpoint and `restore()` it to continue with exactly the batch that would have come next.
 */
import { DistilleryError } from '../util/errors.js';
import { Rng } from '../util/rng.js';
import type { Window } from './pack.js';

export interface LoaderState {
  epoch: number;
  /** Position in the epoch's order of the next window to read. */
  index: number;
  seed: number;
}

export interface Batch {
  /** Row-major [B, T]. */
  inputs: Int32Array;
  targets: Int32Array;
  /** 1 on counted targets. */
  mask: Float32Array;
  /** Number of counted targets in the batch. */
  tokens: number;
  /** The windows' ids (Window.id; −1 where a window has none or for a padding row), one per row. */
  windows: Int32Array;
  /** Row-major [B, T]: each row's position in its document (Window.positions), where the windows carry them. */
  positions?: Int32Array;
}

export interface BatchLoaderOptions {
  batchSize: number;
  seed: number;
}

/** A window's document positions (Window.positions); one that has none is one document (0 .. T − 1). */
export function windowPositions(w: Window): Int32Array {
  return w.positions ?? oneDocument(w.inputs.length);
}

/** The positions of a window of T rows that is one document: 0 .. T − 1. */
function oneDocument(T: number): Int32Array {
  return Int32Array.from({ length: T }, (_, i) => i);
}

/**
 * Stacks windows of T tokens into one batch, one row each (the loader's batches, evaluation batches, `eval`, the
 * teacher-cache job). A null row is padding: input 0, no target (−1, mask 0), one document of its own. Positions come
 * with the batch when its windows carry them.
 */
export function stackWindows(rows: ReadonlyArray<Window | null>, T: number): Batch {
  const B = rows.length;
  const inputs = new Int32Array(B * T), targets = new Int32Array(B * T).fill(-1), mask = new Float32Array(B * T);
  const windows = new Int32Array(B).fill(-1);
  const positions = rows.some((w) => w?.positions !== undefined) ? new Int32Array(B * T) : undefined;
  let tokens = 0;
  rows.forEach((w, b) => {
    if (w === null) { positions?.set(oneDocument(T), b * T); return; }
    if (w.inputs.length !== T) throw new DistilleryError(`a window of ${w.inputs.length} tokens in a batch of ${T}-token windows`, 'pack all data with the same seqLen');
    inputs.set(w.inputs, b * T); targets.set(w.targets, b * T); mask.set(w.mask, b * T);
    windows[b] = w.id ?? -1;
    positions?.set(windowPositions(w), b * T);
    for (let t = 0; t < T; t++) tokens += w.mask[t]!;
  });
  return positions ? { inputs, targets, mask, tokens, windows, positions } : { inputs, targets, mask, tokens, windows };
}

function epochSeed(seed: number, epoch: number): number {
  return (seed ^ Math.imul(epoch + 1, 0x9e3779b9)) >>> 0;
}

export class BatchLoader {
  readonly batchSize: number;
  readonly seqLen: number;
  private readonly windows: readonly Window[];
  private pos: LoaderState;
  private orderEpoch = -1;
  private order: Int32Array = new Int32Array(0);

  constructor(windows: readonly Window[], opts: BatchLoaderOptions) {
    if (windows.length === 0) {
      throw new DistilleryError('the training set is empty (no windows)', 'add data, or lower valFraction so some windows stay in training');
    }
    if (!Number.isInteger(opts.batchSize) || opts.batchSize < 1) {
      throw new DistilleryError(`batchSize must be a positive integer, got ${opts.batchSize}`, 'set batchSize to e.g. 8');
    }
    if (!Number.isInteger(opts.seed)) throw new DistilleryError(`seed must be an integer, got ${opts.seed}`, 'set seed to e.g. 1');
    this.windows = windows;
    this.batchSize = opts.batchSize;
    this.seqLen = windows[0]!.inputs.length;
    for (const w of windows) {
      if (w.inputs.length !== this.seqLen || w.targets.length !== this.seqLen || w.mask.length !== this.seqLen) {
        throw new DistilleryError('BatchLoader: windows have different lengths', 'pack all data with the same seqLen');
      }
    }
    this.pos = { epoch: 0, index: 0, seed: opts.seed >>> 0 };
  }

  get numWindows(): number { return this.windows.length; }

  /** Batches needed to see every window once. */
  get batchesPerEpoch(): number { return Math.ceil(this.windows.length / this.batchSize); }

  /** Epochs done so far, fractional. */
  get epochProgress(): number { return this.pos.epoch + this.pos.index / this.windows.length; }

  /** The window order of an epoch (indices into the training windows). */
  epochOrder(epoch: number): Int32Array {
    if (this.orderEpoch !== epoch) {
      const o = new Int32Array(this.windows.length);
      for (let i = 0; i < o.length; i++) o[i] = i;
      new Rng(epochSeed(this.pos.seed, epoch)).shuffle(o);
      this.order = o;
      this.orderEpoch = epoch;
    }
    return this.order;
  }

  next(): Batch {
    const B = this.batchSize, n = this.windows.length;
    const rows: Window[] = [];
    for (let b = 0; b < B; b++) {
      if (this.pos.index >= n) { this.pos.epoch++; this.pos.index = 0; }
      rows.push(this.windows[this.epochOrder(this.pos.epoch)[this.pos.index]!]!);
      this.pos.index++;
    }
    return stackWindows(rows, this.seqLen);
  }

  /** The serializable position (a copy). */
  state(): LoaderState {
    return { ...this.pos };
  }

  restore(st: LoaderState): void {
    const ok = st && Number.isInteger(st.epoch) && st.epoch >= 0 && Number.isInteger(st.index) && st.index >= 0 &&
      st.index <= this.windows.length && Number.isInteger(st.seed);
    if (!ok) {
      throw new DistilleryError(`cannot resume the data loader from ${JSON.stringify(st)} (training set has ${this.windows.length} windows)`,
        'the data or seqLen changed since the checkpoint; resume with the same data, or start a new run');
    }
    this.pos = { epoch: st.epoch, index: st.index, seed: st.seed >>> 0 };
    this.orderEpoch = -1;
  }
}
