/**
 * The cross-architecture compile gate: every kernel of the real plans (and the representative set) compiles with
 * nvcc for Ampere (sm_80), Ada (sm_89: RTX 4090), Hopper (sm_90), Blackwell (sm_100), consumer Blackwell (sm_120)
 * and GB10 (sm_121) — the GPUs distillery's users run, beyond the sm_80/sm_90 that Debian's NVRTC 11.8 reaches.
 * No GPU needed. Without nvcc it skips with a message; an nvcc too old for some of these architectures compiles the
 * ones it has and says which it skipped. DISTILLERY_REQUIRE_NVCC=1 turns both into failures.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { GATE_ARCHS, compileWithNvcc, findNvcc } from '../../src/backend/cuda/nvcc.js';
import { gateSpecs } from './helpers.js';

const nvcc = findNvcc();
const required = process.env.DISTILLERY_REQUIRE_NVCC === '1';
const skip = nvcc || required ? false : 'nvcc not found (looked at $DISTILLERY_NVCC, PATH, /usr/local/bin, /usr/local/cuda/bin): the sm_89/sm_100/sm_120/sm_121 compile gate is skipped';

// 374 specs × 6 architectures took 1954 s on a 2-core machine beside the rest of a CI run (2026-11-28): an hour's bound,
// inside CI's 90 minutes, where 30 minutes had become too tight.
test(`every planned kernel compiles with nvcc for ${GATE_ARCHS.join(', ')}`, { skip, timeout: 3_600_000 }, async () => {
  assert.ok(nvcc, 'DISTILLERY_REQUIRE_NVCC=1 but nvcc was not found');
  const archs = GATE_ARCHS.filter((a) => nvcc.archs.includes(a));
  const missing = GATE_ARCHS.filter((a) => !nvcc.archs.includes(a));
  if (missing.length) {
    const msg = `nvcc ${nvcc.version} cannot target ${missing.join(', ')}: those architectures are not gated`;
    if (required) assert.fail(msg);
    process.stderr.write(`compile gate (nvcc): ${msg}\n`);
  }
  const { plans, specs } = gateSpecs();
  const t0 = Date.now();
  const results = await compileWithNvcc(nvcc, specs, archs);
  const failed = results.filter((r) => !r.ok);
  assert.equal(failed.length, 0, failed.map((r) => `${r.spec.describe()}:\n${r.error}`).join('\n\n'));
  assert.ok(results.every((r) => r.bytes > 0));
  const planned = new Set(plans.map((s) => s.id));
  assert.equal(results.filter((r) => planned.has(r.spec.id)).length, planned.size, 'every planned kernel was compiled');
  process.stderr.write(`compile gate (nvcc ${nvcc.version}, ${nvcc.path}): ${specs.length} unique specs × ${archs.join(', ')} in ${Date.now() - t0} ms\n`);
});

test('findNvcc: a $DISTILLERY_NVCC that does not run is passed over, not thrown', () => {
  const found = findNvcc({ DISTILLERY_NVCC: '/nonexistent/nvcc' } as NodeJS.ProcessEnv);
  assert.notEqual(found?.path, '/nonexistent/nvcc');
});
