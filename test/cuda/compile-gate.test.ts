/**
 * The compile gate: every kernel spec compiles with NVRTC for sm_80 and sm_90 without a compile error, over a
 * representative parameter set and over the plans traced from Qwen2.5-0.5B- and Llama-shaped toy steps.
 * Skips (with a message) where NVRTC is not installed. No GPU needed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { compileAll, representativeSpecs } from '../../src/backend/cuda/compile-all.js';
import { tryNvrtc } from '../../src/backend/cuda/ffi/nvrtc.js';
import { planKernels } from '../../src/backend/cuda/plan.js';
import type { KernelSpec } from '../../src/backend/cuda/kernels/spec.js';
import { LLAMA_LIKE, QWEN_LIKE, allOpsStep } from './helpers.js';

const nvrtc = tryNvrtc();
const skip = nvrtc ? false : 'NVRTC (libnvrtc) not found; install it or set DISTILLERY_CUDA_LIB_DIR to run the compile gate';

test('every kernel compiles for sm_80 and sm_90', { skip, timeout: 600_000 }, async () => {
  const seen = new Set<string>();
  const specs: KernelSpec[] = [];
  for (const s of [...representativeSpecs(), ...planKernels([allOpsStep(QWEN_LIKE), allOpsStep(LLAMA_LIKE)])]) {
    if (!seen.has(s.id)) { seen.add(s.id); specs.push(s); }
  }
  const results = await compileAll(specs, ['sm_80', 'sm_90']);
  const failed = results.filter((r) => !r.ok);
  assert.equal(failed.length, 0, failed.map((r) => `${r.arch} ${r.spec.describe()}:\n${r.error}`).join('\n\n'));
  assert.ok(results.every((r) => r.bytes > 0));
  process.stderr.write(`compile gate: ${specs.length} specs × 2 archs with ${nvrtc!.version} (${nvrtc!.path})\n`);
});
