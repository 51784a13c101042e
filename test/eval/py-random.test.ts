/**
 * PyRandom (src/eval/py-random.ts) against CPython's own random.Random: the fixture test/fixtures/fewshot/py-random.json
 * was written by CPython (scripts/hf-compat/py-random-fixture.py): 32-bit and shorter getrandbits, _randbelow, and
 * sample() through both of its paths, after seeds of one and two 32-bit words.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { PyRandom } from '../../src/eval/py-random.js';

const FIX = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../test/fixtures/fewshot/py-random.json');

interface Case {
  seed: number;
  bits32x8_then_1_5_17_31: number[];
  randbelow_1_2_3_7_100_1000_2p31p7: number[];
  samples: Array<{ n: number; k: number; got: number[] }>;
}

test('PyRandom draws what CPython draws: seeds, getrandbits, _randbelow and sample() on both paths', () => {
  const fix = JSON.parse(fs.readFileSync(FIX, 'utf8')) as { cases: Case[] };
  assert.ok(fix.cases.length >= 9);
  for (const c of fix.cases) {
    const r = new PyRandom(c.seed);
    const bits = [...Array.from({ length: 8 }, () => r.getrandbits(32)), ...[1, 5, 17, 31].map((k) => r.getrandbits(k))];
    assert.deepEqual(bits, c.bits32x8_then_1_5_17_31, `seed ${c.seed}: getrandbits`);
    assert.deepEqual([1, 2, 3, 7, 100, 1000, 2 ** 31 + 7].map((n) => r.randbelow(n)), c.randbelow_1_2_3_7_100_1000_2p31p7, `seed ${c.seed}: _randbelow`);
    for (const s of c.samples) assert.deepEqual(r.sample(s.n, s.k), s.got, `seed ${c.seed}: sample(range(${s.n}), ${s.k})`);
  }
});

test('PyRandom refuses what CPython refuses: a sample larger than its population, a negative seed', () => {
  assert.throws(() => new PyRandom(3).sample(3, 4), RangeError);
  assert.throws(() => new PyRandom(-1), RangeError);
  assert.throws(() => new PyRandom(0.5), RangeError);
});
