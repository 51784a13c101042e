/**
 * Text items, lm-evaluation-harness's loglikelihood_rolling tasks (src/eval/choices.ts): the rolling windows and the word
 * and byte counts against the harness's own functions (test/fixtures/rolling/harness-windows.json, written by
 * scripts/hf-compat/rolling-fixture.py from its source), the items file, the metrics' formulas, and the scores: each
 * text's log-likelihood is the sum over its windows of the float64 log-softmax of each window's own forward, and a text
 * in one window scores as a continuation item after an empty context (the prefix token) does.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { StepRunner } from '../../src/train/step.js';
import { InputError } from '../../src/util/errors.js';
import { Rng } from '../../src/util/rng.js';
import { parseChoiceItems, pyWords } from '../../src/eval/items.js';
import { ChoiceEncoder, encodeChoices, rollingWindows } from '../../src/eval/encode.js';
import { choiceBatches, choiceMetrics, choiceRows, choiceSamples, choiceSlots, choiceWindow, scoreChoices, textLoglik } from '../../src/eval/choices.js';
import { fewshotExamples } from '../../src/eval/fewshot.js';
import { tinyConfig, tinyTokenizer } from '../cli/fixtures.js';

const FIX = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../test/fixtures/rolling/harness-windows.json');

interface Fixture {
  prefix_token: number;
  windows: Array<{ n: number; max_len: number; windows: Array<[number[], number[]]> }>;
  counts: Array<{ text: string; words: number; bytes: number }>;
}

test('rolling windows and word counts are the harness\'s own (get_rolling_token_windows + make_disjoint_window, count_words)', () => {
  const fix = JSON.parse(fs.readFileSync(FIX, 'utf8')) as Fixture;
  assert.ok(fix.windows.length >= 80);
  for (const w of fix.windows) {
    const tokens = Array.from({ length: w.n }, (_, i) => i);
    assert.deepEqual(rollingWindows(tokens, fix.prefix_token, w.max_len), w.windows, `${w.n} tokens, windows of ${w.max_len}`);
  }
  for (const c of fix.counts) {
    assert.equal(pyWords(c.text), c.words, `words of ${JSON.stringify(c.text)}`);
    assert.equal(Buffer.byteLength(c.text, 'utf8'), c.bytes);
  }
});

test('text items: parsed with the harness\'s counts or their own, refused when malformed; they take no few-shot examples', () => {
  const items = parseChoiceItems([
    JSON.stringify({ text: 'one two  three\n' }),
    JSON.stringify({ text: 'detokenized page', words: 7, bytes: 40, id: 3 }),
  ].join('\n'), 't.jsonl');
  assert.deepEqual(items.map((i) => [i.choices, i.rolling]), [[['one two  three\n'], { words: 4, bytes: 15 }], [['detokenized page'], { words: 7, bytes: 40 }]]);
  for (const [line, re] of [
    ['{"text": ""}', /t\.jsonl:1: "text" must be a non-empty string/],
    ['{"text": "a", "choices": ["b", "c"]}', /t\.jsonl:1: "text" goes without "choices"/],
    ['{"text": "a", "words": 0}', /t\.jsonl:1: "words" must be a positive integer/],
    ['{"text": "a", "bytes": 1.5}', /t\.jsonl:1: "bytes" must be a positive integer/],
  ] as Array<[string, RegExp]>) {
    assert.throws(() => parseChoiceItems(line, 't.jsonl'), (e: unknown) => e instanceof InputError && re.test(e.message), line);
  }
  // a line with a context is a choice or continuation item whatever else it holds (LAMBADA's rows carry a "text" field)
  assert.equal(parseChoiceItems('{"context": "a b", "continuation": " c", "text": "a b c"}', 't.jsonl')[0]!.continuation, true);
  // text items get no few-shot examples and are none
  const mixed = [...items, ...parseChoiceItems(['{"context": "Q1", "choices": ["a", "b"], "answer": 0}', '{"context": "Q2", "choices": ["a", "b"], "answer": 1}'].join('\n'), 't.jsonl')];
  const shots = fewshotExamples(mixed, { n: 1, sampler: 'first_n', seed: 1, delimiter: '' });
  assert.deepEqual(shots.map((x) => x.map((e) => e.context)), [[], [], ['Q2'], ['Q1']]);
});

test('text metrics: word and byte perplexity and bits per byte over the texts\' summed windows, as the harness aggregates them', () => {
  const items = parseChoiceItems([JSON.stringify({ text: 'a b c' }), JSON.stringify({ text: 'de f', words: 5 }), JSON.stringify({ context: 'q', continuation: ' x' })].join('\n'), 'm.jsonl');
  const ll = [[-3, -1.5], [-2], [-0.25]];
  const m = choiceMetrics(items, { ll, greedy: [[false, false], [false], [true]] });
  const sum = -3 - 1.5 - 2, words = 3 + 5, bytes = 5 + 4;
  assert.equal(m.rows, 4);
  assert.deepEqual(m.rolling, { items: 2, windows: 3, wordPerplexity: Math.exp(-sum / words), bytePerplexity: Math.exp(-sum / bytes), bitsPerByte: -sum / bytes / Math.log(2) });
  assert.deepEqual(m.greedy, { items: 1, acc: 1, perplexity: Math.exp(0.25) });
  assert.equal(m.acc, undefined);
  assert.equal(textLoglik([-3, -1.5]), -4.5);
  const lines = choiceSamples(items, { ll, greedy: [[false, false], [false], [true]] }, null).trim().split('\n').map((l) => JSON.parse(l) as unknown);
  assert.deepEqual(lines[0], { where: 'm.jsonl:1', loglik: -4.5, words: 3, bytes: 5, windows: 2 });
});

test('text scores: the sum over the windows of each window\'s float64 log-softmax; one window scores as a continuation after an empty context', async () => {
  const tok = tinyTokenizer();
  const c: ModelConfig = tinyConfig(tok.vocabSize, { maxPositionEmbeddings: 128 });
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const w = initialWeights(parameterLayout(c), c, new Rng(9), 0.5);
  const long = 'Distillation trains a small model on the soft targets of a larger one. The quick brown fox jumps over the lazy dog.';
  const short = 'The teacher model';
  const items = parseChoiceItems([JSON.stringify({ text: long }), JSON.stringify({ text: short }), JSON.stringify({ context: '', continuation: short })].join('\n'), 'x.jsonl');
  const enc = new ChoiceEncoder(tok, { bosToken: '', eosToken: '<|endoftext|>' });
  const window = 8;
  const encoded = encodeChoices(enc, items, ' ', undefined, window);
  const tokens = enc.encode(long);
  assert.ok(tokens.length > 3 * window, 'the long text spans several windows');
  assert.equal(encoded.filter((e) => e.item === 0).length, Math.ceil(tokens.length / window));
  const seq = choiceWindow(encoded);
  assert.equal(seq, window);
  const rows = choiceRows(encoded, items, seq);
  const m = new Transformer(be, c, { batch: 3, seq, training: false });
  m.setWeights(w);
  const runner = new StepRunner(m, null, { kind: 'none', alpha: 0, temperature: 1, beta: 0.5 });
  const got = (await scoreChoices(choiceSlots(items, rows), choiceBatches(rows, 3, seq, tok.eosId!), (b) => runner.rowScores(b)))!;
  // the reference: each window's inputs forwarded alone, log-softmax in float64 over its scored tokens, summed
  const alone = new Transformer(be, c, { batch: 1, seq: 128, training: false });
  alone.setWeights(w);
  const V = c.vocabSize;
  const reference = (item: number): number => {
    let total = 0;
    for (const r of rows.filter((x) => x.item === item)) {
      const L = r.ids.length - 1;
      const z = be.download(alone.forward(Int32Array.from(r.ids.slice(0, L)), 1, L));
      for (let p = r.contStart - 1; p < L; p++) {
        let mx = -Infinity, sum = 0;
        for (let v = 0; v < V; v++) mx = Math.max(mx, z[p * V + v]!);
        for (let v = 0; v < V; v++) sum += Math.exp(z[p * V + v]! - mx);
        total += z[p * V + r.ids[p + 1]!]! - mx - Math.log(sum);
      }
    }
    return total;
  };
  // every token of the text is scored once, the first after the prefix token
  const scored = rows.filter((r) => r.item === 0).flatMap((r) => r.ids.slice(r.contStart));
  assert.deepEqual(scored, tokens);
  assert.equal(rows.find((r) => r.item === 0 && r.choice === 0)!.ids[0], enc.prefixToken()!.id);
  for (const item of [0, 1]) {
    const ref = reference(item), g = textLoglik(got.ll[item]!);
    assert.ok(Math.abs(g - ref) < 1e-9 * Math.abs(ref), `text ${item}: ${g} vs ${ref}`);
  }
  assert.ok(Math.abs(textLoglik(got.ll[1]!) - got.ll[2]![0]!) < 1e-12, 'a text in one window: the continuation after an empty context');
});
