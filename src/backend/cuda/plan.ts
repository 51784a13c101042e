/**
 * Pre-warm planning: the kernel set of a run is DERIVED, never listed by hand.
 *
 * `planKernels(runs)` runs each closure against a trace-mode CudaBackend (no GPU, no libraries) and returns the
 * unique KernelSpecs those closures would launch, deduplicated by source hash (equivalently by cache key, since
 * options, arch and compiler version are the same for every spec of a run). Give it the very closures the run
 * executes (a train step, an eval step, generation with its KV-cache shapes), e.g.
 *
 *   const specs = planKernels([(b) => { const m = new Transformer(cfg, b); m.trainStep(batch); }]);
 *   await cache.prewarm(specs);             // compiles what is missing, then seals
 */
import { createHash } from 'node:crypto';
import type { Backend } from '../backend.js';
import { CudaBackend, type TraceOptions } from './cuda-backend.js';
import { attentionScratchSizes, maxScratch, type AttentionScratch } from './attention-plan.js';
import type { KernelSpec } from './kernels/spec.js';

export interface PlanOptions extends TraceOptions {
  /** Called with the trace backend after each closure (e.g. to report launch counts). */
  onTraced?: (b: CudaBackend, index: number) => void;
}

/**
 * Without scratch sizes in `opts`, the runs are traced twice: once to learn the attention scratch they need, then with
 * the sizes a prepared device gives them (attentionScratchSizes), as CudaBackend.planFor does: a dry run or
 * `kernels plan` lists what the run will launch.
 */
export function planKernels(runs: ReadonlyArray<(b: Backend) => void>, opts: PlanOptions = {}): KernelSpec[] {
  if (opts.attnDsumFloats === undefined && opts.attnDkvFloats === undefined && opts.attnDsElems === undefined) {
    const need: AttentionScratch = { dsum: 0, dkv: 0, ds: 0, cached: 0 };
    traceRuns(runs, {
      ...(opts.attention !== undefined ? { attention: opts.attention } : {}),
      ...(opts.attnBackward !== undefined ? { attnBackward: opts.attnBackward } : {}),
    }, (b) => maxScratch(need, b.scratchNeed));
    const sizes = attentionScratchSizes(need);
    if (sizes) opts = { ...opts, attnDsumFloats: sizes.dsum, attnDkvFloats: sizes.dkv, attnDsElems: sizes.ds };
  }
  return traceRuns(runs, opts, opts.onTraced);
}

function traceRuns(runs: ReadonlyArray<(b: Backend) => void>, opts: PlanOptions, onTraced?: (b: CudaBackend, i: number) => void): KernelSpec[] {
  const out = new Map<string, KernelSpec>();
  const trace: TraceOptions = {
    ...(opts.attention !== undefined ? { attention: opts.attention } : {}),
    ...(opts.attnBackward !== undefined ? { attnBackward: opts.attnBackward } : {}),
    ...(opts.attnDsumFloats !== undefined ? { attnDsumFloats: opts.attnDsumFloats } : {}),
    ...(opts.attnDkvFloats !== undefined ? { attnDkvFloats: opts.attnDkvFloats } : {}),
    ...(opts.attnDsElems !== undefined ? { attnDsElems: opts.attnDsElems } : {}),
  };
  runs.forEach((run, i) => {
    const b = new CudaBackend('trace', trace);
    try {
      run(b);
      for (const spec of b.traced.values()) {
        const h = createHash('sha256').update(spec.source()).digest('hex');
        if (!out.has(h)) out.set(h, spec);
      }
      onTraced?.(b, i);
    } finally {
      b.dispose();
    }
  });
  return [...out.values()];
}
