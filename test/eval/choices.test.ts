/**
 * Multiple-choice scoring (src/eval/choices.ts): the items file and its errors, lm-evaluation-harness's split of a
 * context and its continuation into tokens (Qwen's real tokenizer), the left cut, the batches' masks, acc and
 * acc_norm (characters counted as Python counts them), and the scores themselves: StepRunner.rowLogLikelihoods over
 * padded batches against each row's log-softmax computed in float64 from the full forward of that row alone.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { StepRunner } from '../../src/train/step.js';
import { Tokenizer } from '../../src/tokenizer/bpe.js';
import { InputError } from '../../src/util/errors.js';
import { Rng } from '../../src/util/rng.js';
import {
  choiceBatches, choiceMetrics, choiceRows, choiceWindow, encodePair, parseChoiceItems, predictions, pyLen, scoreChoices, type ChoiceItem,
} from '../../src/eval/choices.js';
import { qwenTokenizerPath } from '../tokenizer/qwen.js';
import { tinyTokenizer } from '../cli/fixtures.js';

const qwen = Tokenizer.fromJSON(JSON.parse(fs.readFileSync(qwenTokenizerPath(), 'utf8')) as Record<string, unknown>);

test('items: index or text answers, blank lines skipped, extra keys ignored; each bad line refused naming file:line', () => {
  const items = parseChoiceItems([
    '{"context": "2 + 2 =", "choices": ["3", "4"], "answer": 1, "id": "q1"}',
    '',
    '{"context": "", "choices": ["red", "blue", "green"], "answer": "green"}',
  ].join('\n'), 'items.jsonl');
  assert.deepEqual(items.map((i) => [i.context, i.choices.length, i.answer, i.where]), [['2 + 2 =', 2, 1, 'items.jsonl:1'], ['', 3, 2, 'items.jsonl:3']]);
  const bad: Array<[string, RegExp]> = [
    ['{"context": "x", "choices": ["a", "b"], "answer": 1', /items\.jsonl:2: invalid JSON/],
    ['["x"]', /items\.jsonl:2: expected a JSON object/],
    ['{"choices": ["a", "b"], "answer": 0}', /"context" must be a string \(it is missing\)/],
    ['{"context": "x", "choices": ["a"], "answer": 0}', /"choices" must be a list of at least two strings/],
    ['{"context": "x", "choices": ["a", 2], "answer": 0}', /"choices" must be a list of at least two strings/],
    ['{"context": "x", "choices": ["a", ""], "answer": 0}', /choice 1 is empty/],
    ['{"context": "x", "choices": ["a", "b"], "answer": 2}', /"answer" 2 is not the index of a choice \(0 to 1\)/],
    ['{"context": "x", "choices": ["a", "b"], "answer": 0.5}', /"answer" 0\.5 is not the index/],
    ['{"context": "x", "choices": ["a", "b"], "answer": "c"}', /"answer" "c" is none of the choices/],
    ['{"context": "x", "choices": ["a", "b"]}', /"answer" must be a choice's index or text \(it is missing\)/],
  ];
  for (const [line, re] of bad) {
    assert.throws(() => parseChoiceItems(`{"context": "", "choices": ["a", "b"], "answer": 0}\n${line}`, 'items.jsonl'),
      (e: unknown) => e instanceof InputError && re.test(e.message), line);
  }
});

test("the harness's split: trailing whitespace moves to the continuation, the continuation is the whole's tokens past the context's", () => {
  const cases: Array<[string, string]> = [
    ['Question: what is 2 + 2?\nAnswer:', ' 4'],
    ['The capital of France is ', 'Paris'], // the context's space moves: scored as " Paris"
    ['He said:  \n', 'yes'],
    ['I like ice', 'cream and snow'], // no delimiter: a merge across the boundary is the whole's
    ['<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n', 'Hello'], // special tokens read as themselves
    ['数学', '很有趣'],
  ];
  for (const [context, cont] of cases) {
    const trimmed = context.replace(/\s+$/, '');
    const { ctx, cont: c } = encodePair(qwen, context, cont, 0);
    assert.deepEqual(ctx, qwen.encode(trimmed), context);
    assert.deepEqual([...ctx, ...c], qwen.encode(trimmed + context.slice(trimmed.length) + cont), context);
  }
  // The moved space is scored: " Paris" is one token, "Paris" after "is " would be another.
  const paris = encodePair(qwen, 'The capital of France is ', 'Paris', 0).cont;
  assert.equal(qwen.decode(paris), ' Paris');
  // An empty context is the prefix token alone.
  assert.deepEqual(encodePair(qwen, '', ' yes', 7), { ctx: [7], cont: qwen.encode(' yes') });
  // Special tokens in the text are one token each, as transformers' tokenizer reads them.
  const im = qwen.tokenToId('<|im_start|>')!;
  assert.ok(encodePair(qwen, '<|im_start|>user\n', 'x', 0).ctx.includes(im));
});

test('rows: the window, the left cut of a long context, a continuation too long refused; batches count the continuation only', () => {
  const tok = tinyTokenizer();
  const long = 'The quick brown fox jumps over the lazy dog, and the dog does not mind. '.repeat(3);
  const items: ChoiceItem[] = [
    { context: 'The teacher model', choices: ['predicts', 'learns the next token'], answer: 0, where: 'f:1' },
    { context: long, choices: ['fox', 'dog'], answer: 1, where: 'f:2' },
  ];
  const need = choiceWindow(tok, items, ' ');
  const whole = choiceRows(tok, items, need, ' ');
  assert.equal(whole.length, 4);
  assert.ok(whole.every((r) => !r.cut));
  assert.equal(Math.max(...whole.map((r) => r.ids.length - 1)), need);
  // A smaller window keeps each long row's last seq + 1 tokens, and its whole continuation.
  const seq = 12;
  const cut = choiceRows(tok, items, seq, ' ');
  for (const [i, r] of cut.entries()) {
    const w = whole[i]!;
    assert.equal(r.cut, w.ids.length > seq + 1);
    assert.deepEqual(r.ids, w.ids.slice(Math.max(0, w.ids.length - (seq + 1))));
    assert.deepEqual(r.ids.slice(r.contStart), w.ids.slice(w.contStart));
  }
  assert.ok(cut.some((r) => r.cut));
  const n = encodePair(tok, items[0]!.context, ' learns the next token', 0).cont.length;
  assert.throws(() => choiceRows(tok, items, n - 1, ' '), (e: unknown) => e instanceof InputError && /f:1: choice 1 is \d+ tokens, more than the window \(--seq \d+\) holds/.test(e.message) && e.hint === `use --seq ${n + 1} or more`);
  // Batches: inputs are the row but its last token, the mask is 1 exactly where the target is a continuation token.
  const batches = choiceBatches(cut, 3, seq, 99);
  assert.deepEqual(batches.map((b) => b.b), [3, 1]);
  cut.forEach((r, k) => {
    const b = batches[Math.floor(k / 3)]!, row = k % 3, L = r.ids.length - 1;
    for (let p = 0; p < seq; p++) {
      const i = row * seq + p;
      assert.equal(b.inputs[i], p < L ? r.ids[p] : 99);
      assert.equal(b.targets[i], p < L ? r.ids[p + 1] : -1);
      assert.equal(b.mask[i], p < L && p + 1 >= r.contStart ? 1 : 0);
    }
  });
});

test('acc and acc_norm: argmax (the first on a tie), acc_norm per character as Python counts them', () => {
  assert.equal(pyLen('𝔘𝔫'), 2); // two astral characters: JS length 4
  const items: ChoiceItem[] = [
    // acc picks choice 1 (-3 > -4); per character, as Python counts: -4/2 = -2 > -3/1, so acc_norm picks 0 (counting
    // UTF-16 units, '𝔘' would be 2 long and -3/2 = -1.5 would pick 1)
    { context: 'c', choices: ['ab', '𝔘'], answer: 0, where: 'f:1' },
    { context: 'c', choices: ['x', 'y', 'z'], answer: 0, where: 'f:2' },
  ];
  const ll = [[-4, -3], [-1, -1, -2]];
  assert.deepEqual(predictions(items, ll), [{ pred: 1, predNorm: 0 }, { pred: 0, predNorm: 0 }]);
  assert.deepEqual(choiceMetrics(items, ll), { items: 2, rows: 5, acc: 0.5, accNorm: 1 });
});

test("scores: each row's summed log-probability of its continuation, over padded batches, equals the float64 log-softmax of the row's own forward", () => {
  const tok = tinyTokenizer();
  const c: ModelConfig = {
    architecture: 'qwen2', vocabSize: tok.vocabSize, hiddenSize: 16, intermediateSize: 32, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 4,
    rope: { type: 'default', theta: 10000 }, rmsNormEps: 1e-6, tieWordEmbeddings: false, maxPositionEmbeddings: 64, qkvBias: true, qkNorm: false, noRopeLayers: [],
  };
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const w = initialWeights(parameterLayout(c), c, new Rng(5), 0.5);
  const items: ChoiceItem[] = [
    { context: 'The teacher model', choices: ['predicts the next token', 'learns', 'splits text'], answer: 0, where: 'f:1' },
    { context: 'A tokenizer splits text into', choices: ['pieces', 'dogs'], answer: 0, where: 'f:2' },
    { context: '', choices: ['The quick brown fox', 'jumps'], answer: 1, where: 'f:3' },
  ];
  const seq = choiceWindow(tok, items, ' ');
  const rows = choiceRows(tok, items, seq, ' ');
  const m = new Transformer(be, c, { batch: 3, seq, training: false });
  m.setWeights(w);
  const runner = new StepRunner(m, null, { kind: 'none', alpha: 0, temperature: 1, beta: 0.5 });
  const got = scoreChoices(items, rows, choiceBatches(rows, 3, seq, tok.eosId!), (b) => runner.rowLogLikelihoods(b));
  const alone = new Transformer(be, c, { batch: 1, seq, training: false });
  alone.setWeights(w);
  for (const r of rows) {
    const L = r.ids.length - 1, V = c.vocabSize;
    const z = be.download(alone.forward(Int32Array.from(r.ids.slice(0, L)), 1, L));
    let ll = 0;
    for (let p = r.contStart - 1; p < L; p++) {
      let mx = -Infinity, sum = 0;
      for (let v = 0; v < V; v++) mx = Math.max(mx, z[p * V + v]!);
      for (let v = 0; v < V; v++) sum += Math.exp(z[p * V + v]! - mx);
      ll += z[p * V + r.ids[p + 1]!]! - mx - Math.log(sum);
    }
    const g = got[r.item]![r.choice]!;
    assert.ok(Math.abs(g - ll) < 1e-9 * Math.max(1, Math.abs(ll)), `item ${r.item} choice ${r.choice}: ${g} vs ${ll}`);
    assert.ok(ll < 0);
  }
});
