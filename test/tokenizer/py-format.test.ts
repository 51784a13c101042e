/**
 * Python's printf-style formatting (src/tokenizer/py-format.ts) against Python itself: every case of
 * test/fixtures/py-format/python-format.json (written by scripts/hf-compat/py-format-cases.py: conversions, flags,
 * widths, precisions, mappings, Python's errors, and 400 random floats at every float conversion and precision, where
 * the rounding is half to even on the exact binary value), and Python's division and modulo of numbers.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { PyFormatError, pyArith, pyPercentFormat, type FormatHooks, type FormatValue } from '../../src/tokenizer/py-format.js';
import { pyRepr, pyStr, type JinjaValue } from '../../src/tokenizer/jinja-python.js';

const FIX = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../test/fixtures/py-format');
type Enc = { i: number } | { f: string } | { s: string } | { b: boolean } | { n: null } | { t: Enc[] } | { l: Enc[] } | { d: Record<string, Enc> };
const fixture = JSON.parse(fs.readFileSync(path.join(FIX, 'python-format.json'), 'utf8')) as {
  source: string; cases: Array<{ fmt: string; args: Enc; text?: string; error?: string }>;
  arith: Array<{ op: '/' | '//' | '%'; a: Enc; b: Enc; value?: Enc; error?: string }>;
};

/** A typed fixture value as the template engine holds it (what the hooks below read). */
function dec(e: Enc): JinjaValue {
  if ('i' in e) return { type: 'IntegerValue', value: e.i };
  // Python's repr: inf, -inf and nan by name
  if ('f' in e) return { type: 'FloatValue', value: e.f === 'inf' ? Infinity : e.f === '-inf' ? -Infinity : e.f === 'nan' ? NaN : Number(e.f) };
  if ('s' in e) return { type: 'StringValue', value: e.s };
  if ('b' in e) return { type: 'BooleanValue', value: e.b };
  if ('n' in e) return { type: 'NullValue', value: null };
  if ('t' in e) return { type: 'TupleValue', value: e.t.map(dec) };
  if ('l' in e) return { type: 'ArrayValue', value: e.l.map(dec) };
  return { type: 'ObjectValue', value: new Map(Object.entries(e.d).map(([k, v]) => [k, dec(v)])) };
}
const hooks: FormatHooks = {
  str: (v) => pyStr(v as JinjaValue), repr: (v) => pyRepr(v as JinjaValue),
  tupleItems: (v) => (v.type === 'TupleValue' ? v.value as FormatValue[] : null),
  mapping: (v) => (v.type === 'ObjectValue' ? v.value as Map<string, FormatValue> : null),
  isMapping: (v) => v.type === 'ObjectValue' || v.type === 'ArrayValue',
};

test(`printf-style formatting matches ${fixture.source} on every case of the fixture, its texts and its errors`, () => {
  assert.ok(fixture.cases.length > 800);
  let errors = 0;
  for (const c of fixture.cases) {
    const what = `${JSON.stringify(c.fmt)} % ${JSON.stringify(c.args)}`;
    let got: string;
    try { got = pyPercentFormat(c.fmt, dec(c.args), hooks); } catch (e) {
      assert.ok(e instanceof PyFormatError, `${what}: ${String(e)}`);
      assert.equal(e.message, c.error, what);
      errors++;
      continue;
    }
    assert.equal(got, c.text, what);
  }
  assert.ok(errors >= 20, `the fixture's error cases ran (${errors})`);
});

test(`division and modulo of numbers as ${fixture.source} computes them (${fixture.arith.length} cases: ints, floats, signs, zeros, infinities, NaN), and its ZeroDivisionError`, () => {
  assert.ok(fixture.arith.length > 3000);
  for (const c of fixture.arith) {
    const a = dec(c.a), b = dec(c.b), what = `${JSON.stringify(c.a)} ${c.op} ${JSON.stringify(c.b)}`;
    const int = a.type === 'IntegerValue' && b.type === 'IntegerValue';
    if (c.error !== undefined) {
      assert.throws(() => pyArith(c.op, a.value as number, b.value as number, int), (e: Error) => e.message === c.error, what);
      continue;
    }
    const got = pyArith(c.op, a.value as number, b.value as number, int), want = dec(c.value!);
    assert.equal(got.int ? 'IntegerValue' : 'FloatValue', want.type, what);
    assert.ok(Object.is(got.value, want.value as number), `${what}: ${got.value} against ${String(want.value)}`);
  }
});
