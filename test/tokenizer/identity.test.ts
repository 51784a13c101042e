/**
 * Tokenizer identity (src/tokenizer/identity.ts): the same tokenizer written with its JSON keys in another order
 * (and merges in the other form) has the same hash and no difference; tokenizers of EQUAL SIZE that differ in one
 * token, one merge, an added token's flag, the normalizer or the pre-tokenizer are told apart, and the first
 * difference is named with both sides' values (computed here from the edit the test made). lossVocabulary accepts
 * padded vocabularies and refuses one that does not cover the tokenizer.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import { Tokenizer } from '../../src/tokenizer/bpe.js';
import { assertSameTokenizer, canonicalTokenizer, lossVocabulary, tokenizerDifference, tokenizerHash } from '../../src/tokenizer/identity.js';
import { DistilleryError } from '../../src/util/errors.js';
import { tinyTokenizer } from '../cli/fixtures.js';
import { qwenTokenizerPath } from './qwen.js';

type Json = Record<string, unknown>;

function base(): Json {
  return tinyTokenizer().toJSON();
}

/** The same object with every object's keys in reverse order (arrays untouched). */
function reverseKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(reverseKeys);
  if (typeof v === 'object' && v !== null) {
    const out: Json = {};
    for (const k of Object.keys(v).reverse()) out[k] = reverseKeys((v as Json)[k]);
    return out;
  }
  return v;
}

/** Two BPE tokens (not bytes, not added) and their ids. */
function twoMergedTokens(j: Json): Array<[string, number]> {
  const vocab = (j.model as Json).vocab as Record<string, number>;
  const merged = Object.entries(vocab).filter(([, id]) => id >= 256).sort((a, b) => a[1] - b[1]);
  return [merged[0]!, merged[1]!];
}

test('the same tokenizer with reordered JSON keys and merges as pairs instead of strings: same hash, no difference', () => {
  const a = base();
  const b = reverseKeys(a) as Json;
  const model = b.model as Json;
  model.merges = (model.merges as unknown[]).map((m) => (typeof m === 'string' ? [m.slice(0, m.indexOf(' ', 1)), m.slice(m.indexOf(' ', 1) + 1)] : m));
  // Defaults written out explicitly are the same as absent ones; ByteLevel's trim_offsets (offsets only) and the
  // ByteLevel decoder's options do not matter.
  model.ignore_merges = model.ignore_merges ?? false;
  model.dropout = null;
  const pre = b.pre_tokenizer as Json;
  assert.equal(pre.type, 'ByteLevel');
  pre.trim_offsets = !pre.trim_offsets;
  delete pre.use_regex;
  b.decoder = { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: false };
  assert.notEqual(JSON.stringify(a), JSON.stringify(b), 'the test must actually change the file text');
  assert.equal(tokenizerHash(a), tokenizerHash(b));
  assert.equal(tokenizerDifference(a, b), null);
  const ta = Tokenizer.fromJSON(a), tb = Tokenizer.fromJSON(b);
  assert.doesNotThrow(() => assertSameTokenizer({ name: 'teacher', tokenizer: ta }, { name: 'student', tokenizer: tb }, 'x'));
});

test('Qwen\'s real tokenizer.json: key order does not change the hash; its size is max id + 1 over vocab and added tokens', () => {
  const raw = JSON.parse(fs.readFileSync(qwenTokenizerPath(), 'utf8')) as Json;
  const sorted = reverseKeys(raw) as Json;
  assert.equal(tokenizerHash(raw), tokenizerHash(sorted));
  const c = canonicalTokenizer(raw);
  const addedMax = Math.max(...(raw.added_tokens as Array<{ id: number }>).map((t) => t.id));
  assert.equal(c.size, addedMax + 1);
});

test('equal size, two token ids swapped: refused with both sizes and the first differing token', () => {
  const a = base();
  const b = structuredClone(a);
  const [[s1, id1], [s2, id2]] = twoMergedTokens(a);
  const vb = (b.model as Json).vocab as Record<string, number>;
  vb[s1] = id2; vb[s2] = id1;
  const ta = Tokenizer.fromJSON(a), tb = Tokenizer.fromJSON(b);
  assert.equal(ta.vocabSize, tb.vocabSize, 'same size: a size check cannot tell them apart');
  assert.notEqual(tokenizerHash(a), tokenizerHash(b));
  const want = `token ${id1}: teacher ${JSON.stringify(s1)} vs student ${JSON.stringify(s2)}`;
  assert.equal(tokenizerDifference(ta, tb, ['teacher', 'student']), want);
  assert.throws(() => assertSameTokenizer({ name: 'teacher', tokenizer: ta, from: 'runs/t' }, { name: 'student', tokenizer: tb, from: 'runs/s' }, 'use one tokenizer'),
    (e: unknown) => {
      assert.ok(e instanceof DistilleryError);
      assert.equal(e.message, `the teacher and the student use different tokenizers (teacher: ${ta.vocabSize} tokens, student: ${tb.vocabSize} tokens); first difference: ${want}`);
      assert.match(e.hint ?? '', /use one tokenizer \(teacher: runs\/t; student: runs\/s\)/);
      return true;
    });
});

test('merges in another order: "merges differ at i" with both merges', () => {
  const a = base();
  const b = structuredClone(a);
  const mb = (b.model as Json).merges as unknown[];
  const i = 3;
  [mb[i], mb[i + 1]] = [mb[i + 1], mb[i]];
  const text = (m: unknown): string => (typeof m === 'string' ? m : (m as string[]).join(' '));
  const ma = (a.model as Json).merges as unknown[];
  assert.equal(tokenizerDifference(a, b, ['teacher', 'student']),
    `merges differ at ${i}: teacher ${JSON.stringify(text(ma[i]))} vs student ${JSON.stringify(text(ma[i + 1]))} (teacher has ${ma.length} merges, student ${mb.length})`);
});

test('an added token\'s special flag, the normalizer and the pre-tokenizer are part of the identity', () => {
  const a = base();
  const added = structuredClone(a);
  const t0 = (added.added_tokens as Json[])[0]!;
  t0.special = !t0.special;
  assert.equal(tokenizerDifference(a, added, ['teacher', 'student']),
    `added token ${String(t0.id)} ${JSON.stringify(t0.content)}: teacher special ${String(!t0.special)} vs student ${String(t0.special)}`);

  const norm = structuredClone(a);
  norm.normalizer = { type: 'NFKC' };
  assert.deepEqual(a.normalizer, { type: 'NFC' });
  assert.equal(tokenizerDifference(a, norm, ['teacher', 'student']), 'normalizer.type: teacher "NFC" vs student "NFKC"');

  const noRegex = structuredClone(a);
  (noRegex.pre_tokenizer as Json).use_regex = false;
  assert.equal(tokenizerDifference(a, noRegex, ['teacher', 'student']), 'pre_tokenizer.use_regex: teacher true vs student false');

  const pre = structuredClone(a);
  const steps = JSON.stringify(pre.pre_tokenizer);
  pre.pre_tokenizer = { type: 'Sequence', pretokenizers: [{ type: 'Digits', individual_digits: true }, a.pre_tokenizer] };
  assert.notEqual(JSON.stringify(pre.pre_tokenizer), steps);
  assert.match(tokenizerDifference(a, pre, ['teacher', 'student']) ?? '', /^pre_tokenizer\.\w+: teacher .* vs student /);
});

test('lossVocabulary: padded rows accepted with a note; a vocab_size below the tokenizer refused', () => {
  assert.deepEqual(lossVocabulary(300, [{ name: 'teacher', vocabSize: 300 }, { name: 'student', vocabSize: 300 }]), { lossVocab: 300, note: null });
  // Qwen2.5-7B (152064 rows) teaching a 0.5B student (151936 rows), one tokenizer of 151665 tokens.
  const r = lossVocabulary(151665, [{ name: 'teacher', vocabSize: 152064 }, { name: 'student', vocabSize: 151936 }]);
  assert.equal(r.lossVocab, 151665);
  assert.match(r.note ?? '', /loss over the 151665 real tokens/);
  assert.match(r.note ?? '', /teacher vocab_size 152064: 399 rows, student vocab_size 151936: 271 rows/);
  assert.throws(() => lossVocabulary(300, [{ name: 'teacher', vocabSize: 77 }]),
    (e: unknown) => e instanceof DistilleryError && /teacher's vocabulary \(vocab_size 77\) is smaller than the tokenizer \(300 tokens\)/.test(e.message));
});
