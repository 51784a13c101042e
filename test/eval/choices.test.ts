/**
 * Multiple-choice scoring (src/eval/choices.ts): the items file and its errors, lm-evaluation-harness's split of a
 * context and its continuation into tokens (Qwen's real tokenizer), the left cut, the batches' masks, acc and
 * acc_norm (characters counted as Python counts them), continuation items' is_greedy and perplexity, and the scores
 * themselves: StepRunner.rowScores over padded batches against each row's log-softmax and argmax computed in float64
 * from the full forward of that row alone.
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
import { parseChoiceItems, pyLen, type ChoiceItem } from '../../src/eval/items.js';
import { ChoiceEncoder, encodeChoices, type SpecialTokens } from '../../src/eval/encode.js';
import { CHOICE_LENGTH_STEP, choiceBatches, choiceSlots, choiceMetrics, choiceRows, choiceSamples, choiceWindow, brierTerm, predictions, scoreChoices } from '../../src/eval/choices.js';
import { qwenTokenizerPath } from '../tokenizer/qwen.js';
import { tinyConfig, tinyTokenizer } from '../cli/fixtures.js';
import { trainBpe } from '../../src/tokenizer/train-bpe.js';

/** A BPE with no special token: no BOS, no end-of-text. */
function tinyBareTokenizer(): Tokenizer {
  return trainBpe(['the dog runs', 'the cat sleeps'], { vocabSize: 270, specialTokens: [] });
}

const qwen = Tokenizer.fromJSON(JSON.parse(fs.readFileSync(qwenTokenizerPath(), 'utf8')) as Record<string, unknown>);

test('items: index or text answers, blank lines skipped, extra keys ignored; each bad line refused naming file:line', () => {
  const items = parseChoiceItems([
    '{"context": "2 + 2 =", "choices": ["3", "4"], "answer": 1, "id": "q1"}',
    '',
    '{"context": "", "choices": ["red", "blue", "green"], "answer": "green"}',
    '{"context": "The cat sat on the", "continuation": " mat", "id": 7}',
  ].join('\n'), 'items.jsonl');
  assert.deepEqual(items.map((i) => [i.context, i.choices.length, i.answer, i.where, i.continuation ?? false]),
    [['2 + 2 =', 2, 1, 'items.jsonl:1', false], ['', 3, 2, 'items.jsonl:3', false], ['The cat sat on the', 1, 0, 'items.jsonl:4', true]]);
  assert.deepEqual(items[2]!.choices, [' mat']);
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
    ['{"context": "x", "continuation": ""}', /"continuation" must be a non-empty string/],
    ['{"context": "x", "continuation": 3}', /"continuation" must be a non-empty string/],
    ['{"context": "x", "continuation": "a", "choices": ["a", "b"], "answer": 0}', /"continuation" goes without "choices" and "answer"/],
    ['{"context": "x", "continuation": "a", "answer": 0}', /"continuation" goes without "choices" and "answer"/],
    ['{"continuation": "a"}', /"context" must be a string \(it is missing\)/],
  ];
  for (const [line, re] of bad) {
    assert.throws(() => parseChoiceItems(`{"context": "", "choices": ["a", "b"], "answer": 0}\n${line}`, 'items.jsonl'),
      (e: unknown) => e instanceof InputError && re.test(e.message), line);
  }
});

const QWEN_INSTRUCT: SpecialTokens = { bosToken: '', eosToken: '<|im_end|>' };

/** Qwen's tokenizer with a post-processor that puts <|endoftext|> first, as Llama 3's puts <|begin_of_text|>. */
function bosTokenizer(): Tokenizer {
  const j = JSON.parse(fs.readFileSync(qwenTokenizerPath(), 'utf8')) as Record<string, unknown>;
  j.post_processor = { type: 'Sequence', processors: [j.post_processor, {
    type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<|endoftext|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
    pair: [{ SpecialToken: { id: '<|endoftext|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '<|endoftext|>': { id: '<|endoftext|>', ids: [151643], tokens: ['<|endoftext|>'] } },
  }] };
  return Tokenizer.fromJSON(j);
}

test("the harness's split: trailing whitespace moves to the continuation, the continuation is the whole's tokens past the context's", () => {
  const enc = new ChoiceEncoder(qwen, QWEN_INSTRUCT);
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
    const { ctx, cont: c } = enc.pair(context, cont, 'f:1');
    assert.deepEqual(ctx, qwen.encode(trimmed), context);
    assert.deepEqual([...ctx, ...c], qwen.encode(trimmed + context.slice(trimmed.length) + cont), context);
  }
  // The moved space is scored: " Paris" is one token, "Paris" after "is " would be another.
  assert.equal(qwen.decode(enc.pair('The capital of France is ', 'Paris', 'f:1').cont), ' Paris');
  // Python's str.rstrip(): U+0085 is whitespace to Python (moved), U+FEFF is not (kept in the context).
  assert.equal(qwen.decode(enc.pair('Hi\u0085', 'x', 'f:1').cont), '\u0085x');
  assert.equal(qwen.decode(enc.pair('Hi\ufeff', 'x', 'f:1').cont), 'x');
  // Special tokens in the text are one token each, as transformers' tokenizer reads them.
  assert.ok(enc.pair('<|im_start|>user\n', 'x', 'f:1').ctx.includes(qwen.tokenToId('<|im_start|>')!));
});

test("the prefix token of an empty context is tokenizer_config.json's bos_token, else its eos_token; a tokenizer that adds a BOS adds it as transformers does", () => {
  const imEnd = qwen.tokenToId('<|im_end|>')!, eot = qwen.tokenToId('<|endoftext|>')!;
  // Qwen Instruct: no BOS, eos_token <|im_end|>; Qwen base: eos_token <|endoftext|>; no tokenizer_config: by name.
  assert.deepEqual(new ChoiceEncoder(qwen, QWEN_INSTRUCT).pair('', ' yes', 'f:1'), { ctx: [imEnd], cont: qwen.encode(' yes') });
  assert.deepEqual(new ChoiceEncoder(qwen, { bosToken: '', eosToken: '<|endoftext|>' }).pair('', ' yes', 'f:1').ctx, [eot]);
  assert.deepEqual(new ChoiceEncoder(qwen, { bosToken: '', eosToken: '' }).pair('', ' yes', 'f:1').ctx, [eot]);
  // A continuation that starts with the prefix token: that token is the context.
  assert.deepEqual(new ChoiceEncoder(qwen, QWEN_INSTRUCT).pair('', '<|im_end|>Hi', 'f:1'), { ctx: [imEnd], cont: qwen.encode('Hi') });
  // Whitespace alone is scored as an empty context (the harness cannot score it).
  assert.deepEqual(new ChoiceEncoder(qwen, QWEN_INSTRUCT).pair(' \n', 'yes', 'f:1'), { ctx: [imEnd], cont: qwen.encode(' \nyes') });
  // A BOS-adding tokenizer (Llama 3's kind): the context and the whole start with it, the continuation does not; text
  // that starts with the prefix token's text gets no second one; an empty context is the BOS, the continuation bare.
  const bos = bosTokenizer(), enc = new ChoiceEncoder(bos, { bosToken: '<|endoftext|>', eosToken: '<|endoftext|>' });
  assert.deepEqual(bos.documentPrefix, [eot]);
  const p = enc.pair('The capital of France is', ' Paris', 'f:1');
  assert.deepEqual(p.ctx, [eot, ...qwen.encode('The capital of France is')]);
  assert.deepEqual(p.cont, qwen.encode(' Paris'));
  assert.deepEqual(enc.pair('<|endoftext|>Once', ' upon', 'f:1').ctx, qwen.encode('<|endoftext|>Once'));
  assert.deepEqual(enc.pair('', ' Paris', 'f:1'), { ctx: [eot], cont: qwen.encode(' Paris') });
  // No prefix token at all: contexts score; an empty one is refused, naming the item.
  const bare = new ChoiceEncoder(tinyBareTokenizer(), { bosToken: '', eosToken: '' });
  assert.equal(bare.prefixToken(), null);
  assert.ok(bare.pair('the dog', ' runs', 'f:1').cont.length > 0);
  assert.throws(() => bare.pair('', ' runs', 'f:7'), (e: unknown) => e instanceof InputError && /f:7: an empty context needs a token/.test(e.message));
});

test('rows: the window, the left cut of a long context, a continuation too long refused; batches longest first, counting the continuation only', () => {
  const tok = tinyTokenizer(), enc = new ChoiceEncoder(tok, { bosToken: '', eosToken: '' });
  const long = 'The quick brown fox jumps over the lazy dog, and the dog does not mind. '.repeat(3);
  const items: ChoiceItem[] = [
    { context: 'The teacher model', choices: ['predicts', 'learns the next token'], answer: 0, where: 'f:1' },
    { context: long, choices: ['fox', 'dog'], answer: 1, where: 'f:2' },
  ];
  const encoded = encodeChoices(enc, items, ' ');
  const need = choiceWindow(encoded);
  const whole = choiceRows(encoded, items, need);
  assert.equal(whole.length, 4);
  assert.ok(whole.every((r) => !r.cut));
  assert.equal(Math.max(...whole.map((r) => r.ids.length - 1)), need);
  // A smaller window keeps each long row's last seq + 1 tokens, and its whole continuation.
  const seq = 12;
  const cut = choiceRows(encoded, items, seq);
  for (const [i, r] of cut.entries()) {
    const w = whole[i]!;
    assert.equal(r.cut, w.ids.length > seq + 1);
    assert.deepEqual(r.ids, w.ids.slice(Math.max(0, w.ids.length - (seq + 1))));
    assert.deepEqual(r.ids.slice(r.contStart), w.ids.slice(w.contStart));
  }
  assert.ok(cut.some((r) => r.cut));
  // The hint's window is enough.
  const n = encoded[1]!.cont.length;
  assert.throws(() => choiceRows(encoded, items, n - 1), (e: unknown) => e instanceof InputError && /f:1: choice 1 is \d+ tokens, more than the window \(--seq \d+\) holds/.test(e.message) && e.hint === `use --seq ${n} or more`);
  assert.doesNotThrow(() => choiceRows(encoded, items, n));
  // Batches: longest rows first, each batch as long as its longest row rounded up to CHOICE_LENGTH_STEP (at most the
  // window); inputs are the row but its last token, the mask is 1 exactly where the target is a continuation token.
  const big = need + 40;
  const batches = Array.from(choiceBatches(whole, 3, big, 99));
  assert.deepEqual(batches.map((b) => b.batch.b), [3, 1]);
  const order = batches.flatMap((b) => b.rows);
  assert.deepEqual([...order].sort((x, y) => x.item - y.item || x.choice - y.choice), whole);
  for (let i = 1; i < order.length; i++) assert.ok(order[i - 1]!.ids.length >= order[i]!.ids.length);
  for (const { batch, rows } of batches) {
    const longest = rows[0]!.ids.length - 1;
    assert.equal(batch.t, Math.min(big, Math.ceil(longest / CHOICE_LENGTH_STEP) * CHOICE_LENGTH_STEP));
    rows.forEach((r, row) => {
      const L = r.ids.length - 1, t = batch.t;
      for (let p = 0; p < t; p++) {
        const i = row * t + p;
        assert.equal(batch.inputs[i], p < L ? r.ids[p] : 99);
        assert.equal(batch.targets[i], p < L ? r.ids[p + 1] : -1);
        assert.equal(batch.mask[i], p < L && p + 1 >= r.contStart ? 1 : 0);
      }
    });
  }
  assert.equal(Array.from(choiceBatches(whole, 4, need, 99))[0]!.batch.t, need, 'a batch is never longer than the window');
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
  // per UTF-8 byte ('𝔘' is 4): -4/2 = -2 < -3/4, so acc_bytes picks 1 where acc_norm picks 0
  assert.deepEqual(predictions(items, ll), [{ pred: 1, predNorm: 0, predBytes: 1 }, { pred: 0, predNorm: 0, predBytes: 0 }]);
  const greedy = ll.map((r) => r.map(() => false));
  const m = choiceMetrics(items, { ll, greedy });
  assert.deepEqual({ ...m, brierScore: undefined }, { items: 2, rows: 5, acc: 0.5, accNorm: 1, accBytes: 0.5, brierScore: undefined });
  // brier_score by hand: softmax([-4, -3]) = [1, e] / (1 + e) against answer 0; softmax([-1, -1, -2]) = [1, 1, 1/e] / (2 + 1/e) against 0
  const p1 = Math.E / (1 + Math.E), z2 = 2 + 1 / Math.E;
  const want = ((1 - p1 - 1) ** 2 + p1 ** 2 + (1 / z2 - 1) ** 2 + (1 / z2) ** 2 + (1 / Math.E / z2) ** 2) / 2;
  assert.ok(Math.abs(m.brierScore! - want) < 1e-12, `${m.brierScore} vs ${want}`);
  // a certain, right prediction scores 0; a certain, wrong one 2
  assert.ok(brierTerm([0, -800], 0) < 1e-300);
  assert.equal(brierTerm([-800, 0], 0), 2);
  // numpy's argmax takes the first NaN
  assert.equal(predictions([items[1]!], [[-1, NaN, -0.5]])[0]!.pred, 1);
});

test("continuation items: the harness's loglikelihood metrics, acc = mean is_greedy and perplexity = exp(-mean log-likelihood), beside a multiple-choice item's", () => {
  const items: ChoiceItem[] = [
    { context: 'c', choices: [' a'], answer: 0, continuation: true, where: 'f:1' },
    { context: 'c', choices: ['x', 'y'], answer: 1, where: 'f:2' },
    { context: 'd', choices: [' b c'], answer: 0, continuation: true, where: 'f:3' },
    { context: 'e', choices: [' d'], answer: 0, continuation: true, where: 'f:4' },
  ];
  const ll = [[-0.5], [-2, -1], [-3], [-1]], greedy = [[true], [false, false], [false], [true]];
  const m = choiceMetrics(items, { ll, greedy });
  assert.deepEqual({ ...m, greedy: undefined, brierScore: undefined }, { items: 4, rows: 5, acc: 1, accNorm: 1, accBytes: 1, greedy: undefined, brierScore: undefined });
  assert.ok(Math.abs(m.brierScore! - 2 / (1 + Math.E) ** 2) < 1e-12, 'one multiple-choice item: softmax([-2, -1]) against answer 1');
  assert.equal(m.greedy!.items, 3);
  assert.equal(m.greedy!.acc, 2 / 3);
  assert.ok(Math.abs(m.greedy!.perplexity - Math.exp(4.5 / 3)) < 1e-12);
  // continuation items alone: no acc / acc_norm
  const only = choiceMetrics([items[0]!], { ll: [[-0.5]], greedy: [[false]] });
  assert.deepEqual(only, { items: 1, rows: 1, greedy: { items: 1, acc: 0, perplexity: Math.exp(0.5) } });
  const lines = choiceSamples(items, { ll, greedy }, null).trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
  assert.deepEqual(lines[0], { where: 'f:1', loglik: -0.5, greedy: true });
  assert.deepEqual(lines[1], { where: 'f:2', answer: 1, logliks: [-2, -1], pred: 1, pred_norm: 1 });
});

test("scores: each row's summed log-probability of its continuation, over padded batches, equals the float64 log-softmax of the row's own forward", async () => {
  const tok = tinyTokenizer();
  const c: ModelConfig = tinyConfig(tok.vocabSize, { maxPositionEmbeddings: 128 });
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const w = initialWeights(parameterLayout(c), c, new Rng(5), 0.5);
  const items: ChoiceItem[] = [
    { context: 'The teacher model', choices: ['predicts the next token', 'learns', 'splits text'], answer: 0, where: 'f:1' },
    { context: 'A tokenizer splits text into', choices: ['pieces', 'dogs'], answer: 0, where: 'f:2' },
    { context: '', choices: ['The quick brown fox', 'jumps'], answer: 1, where: 'f:3' },
    { context: 'Distillation trains a small model on the soft targets of a larger one. The quick brown fox', choices: ['jumps over the lazy dog', 'sleeps'], answer: 0, where: 'f:4' },
  ];
  const enc = new ChoiceEncoder(tok, { bosToken: '', eosToken: '<|endoftext|>' });
  const alone = new Transformer(be, c, { batch: 1, seq: 128, training: false });
  alone.setWeights(w);
  /** The first index of the largest of row p of logits z (numpy's and torch's argmax). */
  const argmaxAt = (z: ArrayLike<number>, p: number): number => {
    let b = 0;
    for (let v = 1; v < c.vocabSize; v++) if (z[p * c.vocabSize + v]! > z[p * c.vocabSize + b]!) b = v;
    return b;
  };
  // Continuation items (no delimiter before them): the model's own greedy text after a context (is_greedy where the
  // text encodes back to the same tokens: after 'Distillation'; after 'The teacher' a partial UTF-8 byte decodes to U+FFFD),
  // and arbitrary text
  for (const context of ['Distillation', 'The teacher']) {
    const ids = enc.encode(context), start = ids.length;
    for (let k = 0; k < 3; k++) ids.push(argmaxAt(be.download(alone.forward(Int32Array.from(ids), 1, ids.length)), ids.length - 1));
    items.push({ context, choices: [tok.decode(ids.slice(start))], answer: 0, continuation: true, where: `g:${context}` });
  }
  items.push({ context: 'The quick brown', choices: [' fox jumps'], answer: 0, continuation: true, where: 'g:other' });
  const encoded = encodeChoices(enc, items, ' ');
  // a continuation is scored as written: no delimiter before it
  assert.deepEqual(encoded.filter((e) => e.item >= 4).map((e) => e.cont), items.slice(4).map((it) => enc.pair(it.context, it.choices[0]!, '').cont));
  const seq = choiceWindow(encoded);
  const rows = choiceRows(encoded, items, seq);
  const m = new Transformer(be, c, { batch: 3, seq, training: false });
  m.setWeights(w);
  const runner = new StepRunner(m, null, { kind: 'none', alpha: 0, temperature: 1, beta: 0.5 });
  // batches of two lengths: the long item's rows in a window, the others in CHOICE_LENGTH_STEP
  assert.ok(seq > CHOICE_LENGTH_STEP);
  assert.deepEqual(Array.from(choiceBatches(rows, 3, seq, 0)).map((b) => b.batch.t), [seq, CHOICE_LENGTH_STEP, CHOICE_LENGTH_STEP, CHOICE_LENGTH_STEP]);
  const got = (await scoreChoices(choiceSlots(items, rows), choiceBatches(rows, 3, seq, tok.eosId!), (b) => runner.rowScores(b)))!;
  let greedyRows = 0;
  for (const r of rows) {
    const L = r.ids.length - 1, V = c.vocabSize;
    const z = be.download(alone.forward(Int32Array.from(r.ids.slice(0, L)), 1, L));
    let ll = 0, greedy = true;
    for (let p = r.contStart - 1; p < L; p++) {
      let mx = -Infinity, sum = 0;
      for (let v = 0; v < V; v++) mx = Math.max(mx, z[p * V + v]!);
      for (let v = 0; v < V; v++) sum += Math.exp(z[p * V + v]! - mx);
      ll += z[p * V + r.ids[p + 1]!]! - mx - Math.log(sum);
      if (argmaxAt(z, p) !== r.ids[p + 1]) greedy = false;
    }
    const g = got.ll[r.item]![r.choice]!;
    assert.ok(Math.abs(g - ll) < 1e-9 * Math.max(1, Math.abs(ll)), `item ${r.item} choice ${r.choice}: ${g} vs ${ll}`);
    assert.ok(ll < 0);
    assert.equal(got.greedy[r.item]![r.choice], greedy, `item ${r.item} choice ${r.choice}: is_greedy`);
    if (greedy) greedyRows++;
  }
  assert.ok(greedyRows >= 1 && greedyRows < rows.length, `both values of is_greedy occur (${greedyRows} of ${rows.length})`);
  // token accuracy over the same batches: the fraction of counted targets that are the row's argmax
  let hits = 0, counted = 0;
  for (const r of rows) {
    const L = r.ids.length - 1, z = be.download(alone.forward(Int32Array.from(r.ids.slice(0, L)), 1, L));
    for (let p = r.contStart - 1; p < L; p++) { counted++; if (argmaxAt(z, p) === r.ids[p + 1]) hits++; }
  }
  const e = runner.evaluate(Array.from(choiceBatches(rows, 3, seq, tok.eosId!), (b) => b.batch));
  assert.equal(e.tokens, counted);
  assert.ok(Math.abs(e.tokenAccuracy - hits / counted) < 1e-12, `token accuracy ${e.tokenAccuracy} vs ${hits}/${counted}`);
});
