/**
 * BPE training: the incremental trainer's merges equal a naive recount-everything reference; the trained
 * tokenizer.json loads in @huggingface/tokenizers and encodes identically; text round-trips; layout and errors.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';
import { BYTE_TO_CHAR, Tokenizer } from '../../src/tokenizer/bpe.js';
import { trainBpe } from '../../src/tokenizer/train-bpe.js';
import { loadDocCorpus } from '../../src/data/doc-corpus.js';
import { DistilleryError } from '../../src/util/errors.js';

const GPT2_JS = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

/** Naive BPE trainer: recounts every pair after every merge (slow, obviously correct). */
function naiveMerges(texts: string[], numMerges: number, minFrequency: number): Array<[string, string]> {
  const counts = new Map<string, number>();
  for (const t of texts) for (const m of t.normalize('NFC').matchAll(GPT2_JS)) counts.set(m[0], (counts.get(m[0]) ?? 0) + 1);
  const words = [...counts].map(([w, c]) => ({ syms: [...Buffer.from(w, 'utf8')].map((b) => BYTE_TO_CHAR[b]!), c }));
  const ids = new Map<string, number>(BYTE_TO_CHAR.map((ch, i) => [ch, i]));
  const merges: Array<[string, string]> = [];
  while (merges.length < numMerges) {
    const pc = new Map<string, { a: string; b: string; n: number }>();
    for (const w of words) {
      for (let i = 0; i + 1 < w.syms.length; i++) {
        const k = w.syms[i] + '\u0000' + w.syms[i + 1];
        const e = pc.get(k) ?? { a: w.syms[i]!, b: w.syms[i + 1]!, n: 0 };
        e.n += w.c;
        pc.set(k, e);
      }
    }
    let best: { a: string; b: string; n: number } | undefined;
    for (const e of pc.values()) {
      if (!best || e.n > best.n || (e.n === best.n && (ids.get(e.a)! < ids.get(best.a)! || (ids.get(e.a) === ids.get(best.a) && ids.get(e.b)! < ids.get(best.b)!)))) best = e;
    }
    if (!best || best.n < minFrequency) break;
    merges.push([best.a, best.b]);
    const merged = best.a + best.b;
    if (!ids.has(merged)) ids.set(merged, ids.size);
    for (const w of words) {
      const out: string[] = [];
      for (let i = 0; i < w.syms.length; i++) {
        if (i + 1 < w.syms.length && w.syms[i] === best.a && w.syms[i + 1] === best.b) { out.push(merged); i++; } else out.push(w.syms[i]!);
      }
      w.syms = out;
    }
  }
  return merges;
}

const corpus = loadDocCorpus({ maxChars: 300_000 }).documents;
const SPECIALS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];

test('incremental training equals the naive reference trainer', () => {
  const texts = corpus.slice(0, 40).concat(['aaaa aaaa aaab abab ababab', "DON'T don't 1234 1234 ünï ünï"]);
  const tok = trainBpe(texts, { vocabSize: 256 + 150, minFrequency: 2 });
  const model = tok.toJSON().model as { merges: Array<[string, string]> };
  assert.deepEqual(model.merges, naiveMerges(texts, 150, 2));
});

test('trained tokenizer.json loads in @huggingface/tokenizers and encodes identically', () => {
  const tok = trainBpe(corpus, { vocabSize: 2000, specialTokens: SPECIALS });
  assert.equal(tok.vocabSize, 2000);
  assert.equal(tok.bpeVocabSize, 2000 - SPECIALS.length);
  for (let b = 0; b < 256; b++) assert.equal(tok.idToToken(b), BYTE_TO_CHAR[b], 'ids 0..255 are the bytes');
  assert.deepEqual(SPECIALS.map((s) => tok.tokenToId(s)), [1997, 1998, 1999]);
  assert.equal(tok.eosId, 1997);
  const json = tok.toJSON();
  const ref = new HfTokenizer(JSON.parse(JSON.stringify(json)), {});
  const held = [
    'Returns the value of the first element in the array where predicate is true.',
    "<|im_start|>user\nDON'T panic, it's 42!<|im_end|>\n<|endoftext|>",
    'café 日本語 😀 👨‍👩‍👧 \t\tcode(x)\n\n  trailing  ',
    corpus.slice(200, 260).join('\n'),
  ];
  for (const t of held) {
    const ids = tok.encode(t);
    assert.deepEqual(ids, ref.encode(t, { add_special_tokens: false }).ids, JSON.stringify(t.slice(0, 60)));
    assert.equal(tok.decode(ids), t);
  }
  // Compression: a trained vocabulary needs fewer tokens than bytes on in-domain text.
  const t = corpus.slice(0, 100).join('\n');
  assert.ok(tok.encode(t).length < Buffer.byteLength(t) / 2.5);
  // "a b" string-form merges are equivalent to the array form.
  const m = json.model as { merges: Array<[string, string]> };
  const strForm = Tokenizer.fromJSON({ ...json, model: { ...m, merges: m.merges.map(([a, b]) => `${a} ${b}`) } });
  assert.deepEqual(strForm.encode(held[3]!), tok.encode(held[3]!));
});

test('Llama 3 style pre-tokenizer (Split regex with \\p{N}{1,3}, ignore_merges) matches the reference', () => {
  const base = trainBpe(corpus.slice(0, 300), { vocabSize: 700, specialTokens: ['<|begin_of_text|>', '<|end_of_text|>'] }).toJSON();
  const llama3 = {
    ...base,
    normalizer: null,
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" }, behavior: 'Isolated', invert: false },
        { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
      ],
    },
    model: { ...(base.model as object), ignore_merges: true },
  };
  const ours = Tokenizer.fromJSON(llama3);
  const ref = new HfTokenizer(JSON.parse(JSON.stringify(llama3)), {});
  for (const t of ["I'M 1234567 it'S\r\n\r\n  x", corpus.slice(0, 30).join('\n'), '<|begin_of_text|>Hi 😀<|end_of_text|>']) {
    assert.deepEqual(ours.encode(t), ref.encode(t, { add_special_tokens: false }).ids);
    assert.equal(ours.decode(ours.encode(t)), t);
  }
  assert.equal(ours.bosId, 698);
  assert.equal(ours.eosId, 699);
});

test('training is fast on ~1 MB and validates its options', () => {
  const big = loadDocCorpus({ maxChars: 1_000_000 }).documents;
  const t0 = performance.now();
  const tok = trainBpe(big, { vocabSize: 4096, specialTokens: SPECIALS });
  const ms = performance.now() - t0;
  assert.equal(tok.vocabSize, 4096);
  assert.ok(ms < 10_000, `training took ${ms.toFixed(0)} ms`);
  assert.throws(() => trainBpe(['x'], { vocabSize: 100 }), DistilleryError);
  assert.throws(() => trainBpe(['x'], { vocabSize: 300, specialTokens: ['a', 'a'] }), DistilleryError);
  // Nothing to merge: the vocabulary stops at the bytes (+ specials).
  assert.equal(trainBpe(['abc'], { vocabSize: 1000, specialTokens: ['<s>'] }).vocabSize, 257);
});

test('long words without whitespace and runs of one letter: merges equal the naive reference', () => {
  // One 6000-byte "word" (letters of real text, whitespace and punctuation removed), runs where a pair overlaps
  // itself ("aaaa…", "abab…"), and ordinary text beside them.
  const letters = corpus.slice(0, 30).join('').replace(/[^\p{L}]/gu, '').slice(0, 6000);
  const texts = [letters, 'a'.repeat(777), 'ab'.repeat(300) + 'a', 'xyxyxy zzzzzzzzz xyz aaa aaaa', corpus[3]!];
  for (const minFrequency of [1, 2]) {
    const tok = trainBpe(texts, { vocabSize: 256 + 300, minFrequency });
    const model = tok.toJSON().model as { merges: Array<[string, string]> };
    assert.deepEqual(model.merges, naiveMerges(texts, 300, minFrequency), `minFrequency ${minFrequency}`);
  }
});

test('2M characters without whitespace train in seconds (near-linear, not quadratic in the word length)', () => {
  const letters = loadDocCorpus({ maxChars: 1_000_000 }).documents.join('').replace(/[^\p{L}]/gu, '');
  // A flat (not concatenated) string of 2M letters: one pre-token of 2M bytes.
  const text = Buffer.from(letters.repeat(Math.ceil(2_000_000 / letters.length)).slice(0, 2_000_000)).toString();
  const t0 = performance.now();
  const tok = trainBpe([text], { vocabSize: 512, specialTokens: SPECIALS });
  const ms = performance.now() - t0;
  assert.equal(tok.vocabSize, 512);
  // Before: every merge rescanned the whole 2M-byte word (91 s measured); now about 1 s on 2 cores.
  assert.ok(ms < 20_000, `training took ${ms.toFixed(0)} ms`);
  // The merges are real: the tokenizer compresses the text it was trained on.
  const sample = text.slice(0, 20_000);
  const n = tok.encode(sample).length;
  assert.ok(n < sample.length / 1.8, `${n} tokens for ${sample.length} letters`);
});
