/**
 * Mutation test: for EVERY kernel family and EVERY declared baked parameter (iterated from the schema, not a hand
 * list), changing that one parameter changes the generated source (its code, not just the header comment) and
 * therefore the cache key. This is the test that would have caught eps 1e-5 being served for 1e-6.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ALL_FAMILIES, type ParamDomain, type ParamValue } from '../../src/backend/cuda/kernels/index.js';
import { cacheKey, compileOptions } from '../../src/backend/cuda/kernel-cache.js';
import { rmsnormForward } from '../../src/backend/cuda/kernels/norm.js';
import { ropeKernel } from '../../src/backend/cuda/kernels/rope.js';
import { ropeAttentionFactor, ropeInvFreq, yarnMscale, type RopeSpec } from '../../src/backend/rope.js';

function mutate(d: ParamDomain, v: ParamValue): ParamValue {
  switch (d.kind) {
    case 'bool': return !v;
    case 'enum': return d.values[(d.values.indexOf(v as string) + 1) % d.values.length]!;
    case 'pow2': return (v as number) * 2 <= d.max ? (v as number) * 2 : (v as number) / 2;
    case 'int': {
      const step = d.step ?? 1;
      const up = (v as number) + step;
      return d.max === undefined || up <= d.max ? up : (v as number) - step;
    }
    case 'float': {
      const x = v as number;
      const ok = (c: number) => (d.min === undefined || c >= d.min) && (d.max === undefined || c <= d.max) && Math.fround(c) !== Math.fround(x);
      const c = [x * 1.37, x * 0.5, x + 0.25, x - 0.25].find(ok);
      if (c === undefined) throw new Error(`cannot mutate ${x}`);
      return c;
    }
  }
}

const stripComments = (s: string) => s.replace(/\/\/[^\n]*/g, '').replace(/\/\*[\s\S]*?\*\//g, '');
const key = (src: string) => cacheKey(src, compileOptions('sm_90'), 'sm_90', { version: 'nvrtc-test', build: 'test-build' });

test('every family declares exactly the parameters its example uses', () => {
  assert.ok(ALL_FAMILIES.length >= 20);
  for (const f of ALL_FAMILIES) {
    assert.deepEqual(Object.keys(f.example).sort(), Object.keys(f.schema).sort(), f.name);
    assert.match(f.make(f.example).source(), new RegExp(`extern "C" __global__ void (__launch_bounds__\\(\\w+(, \\d+)?\\) )?${f.name}\\(`), f.name);
  }
});

for (const fam of ALL_FAMILIES) {
  test(`mutating any baked parameter of ${fam.name} changes its code and key`, () => {
    const base = fam.make(fam.example);
    for (const [p, domain] of Object.entries(fam.schema) as Array<[string, ParamDomain]>) {
      const mutated = { ...fam.example, [p]: mutate(domain, fam.example[p]!) };
      const spec = fam.make(mutated);
      assert.notEqual(spec.source(), base.source(), `${fam.name}.${p}`);
      assert.notEqual(stripComments(spec.source()), stripComments(base.source()), `${fam.name}.${p} is not used by the generated code`);
      assert.notEqual(key(spec.source()), key(base.source()), `${fam.name}.${p}`);
      assert.ok(spec.source().includes(`${p}=`), `${fam.name}: header lists ${p}`);
    }
  });
}

test('the historical bug: RMSNorm eps 1e-5 and 1e-6 are different kernels', () => {
  const a = rmsnormForward.make({ eps: 1e-5, C: 896, out: 'f32', inp: 'f32', weight: 'f32', block: 256 });
  const b = rmsnormForward.make({ eps: 1e-6, C: 896, out: 'f32', inp: 'f32', weight: 'f32', block: 256 });
  assert.notEqual(key(a.source()), key(b.source()));
  assert.match(a.source(), /#define EPS 0\.0000099999997473\d*f|#define EPS 9\.99999974737\d*e-6f/);
});

test('make() rejects undeclared, missing and out-of-domain parameters', () => {
  assert.throws(() => rmsnormForward.make({ eps: 1e-6, C: 896, out: 'f32', inp: 'f32', weight: 'f32', block: 256, extra: 1 } as never), /undeclared/);
  assert.throws(() => rmsnormForward.make({ eps: 1e-6, C: 896, out: 'f32', inp: 'f32', weight: 'f32' } as never), /missing/);
  assert.throws(() => rmsnormForward.make({ eps: 1e-6, C: 896, out: 'f32', inp: 'f32', weight: 'f32', block: 100 }), /power of two/);
  assert.throws(() => rmsnormForward.make({ eps: Number.NaN, C: 896, out: 'f32', inp: 'f32', weight: 'f32', block: 256 }), /finite/);
});

test('identical parameters give the identical (memoized) spec', () => {
  assert.equal(rmsnormForward.make({ eps: 1e-6, C: 64, out: 'f32', inp: 'f32', weight: 'f32', block: 256 }), rmsnormForward.make({ C: 64, block: 256, eps: 1e-6, weight: 'f32', inp: 'f32', out: 'f32' }));
});

test('RoPE kernels: every parameter of a real scaled config reaches the key exactly when it changes the math', () => {
  const real: Array<[RopeSpec, number]> = [
    [{ type: 'llama3', theta: 5e5, factor: 32, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 }, 64],
    [{ type: 'llama3', theta: 5e5, factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 }, 128],
    [{ type: 'yarn', theta: 1e6, factor: 4, originalMaxPositionEmbeddings: 32768, betaFast: 32, betaSlow: 1, attentionFactor: yarnMscale(4), truncate: true }, 128],
    [{ type: 'yarn', theta: 1e6, factor: 4, originalMaxPositionEmbeddings: 32768, betaFast: 32, betaSlow: 1, attentionFactor: yarnMscale(4), truncate: false }, 64],
    [{ type: 'linear', theta: 1e4, factor: 2 }, 128],
    [{ type: 'default', theta: 1e6 }, 64],
  ];
  const math = (r: RopeSpec, hd: number): string => `${Array.from(ropeInvFreq(r, hd)).join(',')}|${ropeAttentionFactor(r)}`;
  let changed = 0;
  for (const [rope, hd] of real) {
    for (const fwd of [true, false]) {
      const base = ropeKernel(!fwd, rope, hd, 256);
      for (const [k, v] of Object.entries(rope)) {
        if (k === 'type') continue;
        const m = { ...rope, [k]: typeof v === 'boolean' ? !v : k === 'originalMaxPositionEmbeddings' ? (v as number) + 1 : (v as number) * 1.37 } as RopeSpec;
        const spec = ropeKernel(!fwd, m, hd, 256);
        const sameMath = math(m, hd) === math(rope, hd);
        assert.equal(stripComments(spec.source()) === stripComments(base.source()), sameMath, `${base.describe()}: ${k}`);
        assert.notEqual(key(spec.source()), key(base.source()), `${base.describe()}: ${k} is listed in the key`);
        if (!sameMath) changed++;
      }
      // Another kind at the same theta is another kernel.
      assert.notEqual(key(ropeKernel(!fwd, { type: 'default', theta: rope.theta }, hd, 256).source()) === key(base.source()), rope.type !== 'default');
    }
  }
  assert.ok(changed >= 30, `most mutations change the math (${changed})`);
});
