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
import type { KernelSpec } from './kernels/spec.js';

export interface PlanOptions extends TraceOptions {
  /** Called with the trace backend after each closure (e.g. to report launch counts). */
  onTraced?: (b: CudaBackend, index: number) => void;
}

export function planKernels(runs: ReadonlyArray<(b: Backend) => void>, opts: PlanOptions = {}): KernelSpec[] {
  const out = new Map<string, KernelSpec>();
  runs.forEach((run, i) => {
    const b = new CudaBackend('trace', opts.attention !== undefined ? { attention: opts.attention } : {});
    try {
      run(b);
      for (const spec of b.traced.values()) {
        const h = createHash('sha256').update(spec.source()).digest('hex');
        if (!out.has(h)) out.set(h, spec);
      }
      opts.onTraced?.(b, i);
    } finally {
      b.dispose();
    }
  });
  return [...out.values()];
}
