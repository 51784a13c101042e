/**
 * Tokenizer identity in runs (src/train/run.ts) and StepRunner's lossVocab (src/train/step.ts):
 * - distill with a teacher whose tokenizer has the SAME SIZE but two ids swapped is refused before any step, naming
 *   both sizes and the first differing token (the old size-only check let it train);
 * - `train --init` with a --tokenizer other than the checkpoint's is refused (it used to re-tokenize silently);
 * - a teacher whose tokenizer.json is the same tokenizer with its keys in another order is accepted;
 * - a teacher with padded embedding rows (vocab_size above the tokenizer's size) passes the checks, the log says the
 *   loss runs over the real tokens, and StepRunner gets lossVocab = the tokenizer's size;
 * - the teacher's chat template, tokenizer_config.json and generation_config.json are carried into final/; a
 *   non-ChatML template refuses chat data, naming the file and line.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { runTraining } from '../../src/train/run.js';
import { DEFAULT_RUN_OPTIONS, type RunOptions } from '../../src/train/options.js';
import { writeCheckpoint } from '../../src/model/checkpoint.js';
import { presetConfig, toHfConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { StepRunner } from '../../src/train/step.js';
import { DistilleryError } from '../../src/util/errors.js';
import { Rng } from '../../src/util/rng.js';
import { tinyTokenizer, TEXT } from '../cli/fixtures.js';
import { tokenizerHash } from '../../src/tokenizer/identity.js';

type Json = Record<string, unknown>;
const tmp = (): string => fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-tokid-'));

/** The fixture tokenizer with two merged tokens' ids swapped: same size, different tokenizer. */
function swappedTokenizer(): { json: Json; id: number; mine: string; theirs: string } {
  const json = tinyTokenizer().toJSON();
  const vocab = (json.model as Json).vocab as Record<string, number>;
  const [[s1, i1], [s2, i2]] = Object.entries(vocab).filter(([, id]) => id >= 256).sort((a, b) => a[1] - b[1]);
  vocab[s1!] = i2!; vocab[s2!] = i1!;
  return { json, id: i1!, mine: s1!, theirs: s2! };
}

function writeModel(dir: string, vocab: number, tokenizerJson: object | null, seed = 2, extra: { tokenizerConfig?: Json; generationConfig?: Json } = {}): string {
  const cfg = presetConfig('tiny', vocab);
  writeCheckpoint(dir, cfg, initialWeights(parameterLayout(cfg), cfg, new Rng(seed)), { dtype: 'f32', tokenizerJson, ...extra });
  return dir;
}

function opts(dir: string, over: Partial<RunOptions>): RunOptions {
  const data = path.join(dir, 'data.txt');
  fs.writeFileSync(data, TEXT.join('\n\n').repeat(4));
  return {
    ...DEFAULT_RUN_OPTIONS, mode: 'distill', out: path.join(dir, 'run'), data: [data], model: 'tiny',
    batch: 2, seq: 16, steps: 2, evalEvery: 2, saveEvery: 2, warmup: 0, quiet: true, threads: 1, valFraction: 0.2, ...over,
  };
}

test('distill: a teacher tokenizer of the same size with two ids swapped is refused with both sizes and the first difference', async () => {
  const dir = tmp();
  const tok = tinyTokenizer();
  const sw = swappedTokenizer();
  const teacher = writeModel(path.join(dir, 'teacher'), tok.vocabSize, sw.json);
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tok.toJSON()));
  const lines: string[] = [];
  await assert.rejects(runTraining(opts(dir, { teacher, tokenizer: path.join(dir, 'tokenizer.json') }), { log: (l) => lines.push(l) }), (e: unknown) => {
    assert.ok(e instanceof DistilleryError);
    assert.equal(e.message, `the teacher and the data use different tokenizers (teacher: ${tok.vocabSize} tokens, data: ${tok.vocabSize} tokens); `
      + `first difference: token ${sw.id}: teacher ${JSON.stringify(sw.theirs)} vs data ${JSON.stringify(sw.mine)}`);
    assert.match(e.hint ?? '', /token by token/);
    return true;
  });
  assert.ok(!fs.existsSync(path.join(dir, 'run', 'metrics.jsonl')) || fs.readFileSync(path.join(dir, 'run', 'metrics.jsonl'), 'utf8') === '', 'no step may run');
  // The student's --init checkpoint is checked against the teacher too.
  const init = writeModel(path.join(dir, 'init'), tok.vocabSize, tok.toJSON(), 3);
  await assert.rejects(runTraining(opts(dir, { teacher, init, out: path.join(dir, 'run2') }), { log: () => {} }),
    (e: unknown) => e instanceof DistilleryError && e.message.startsWith('the teacher and the student use different tokenizers'));
});

test('train --init with another --tokenizer is refused (it used to re-tokenize the data silently)', async () => {
  const dir = tmp();
  const tok = tinyTokenizer();
  const init = writeModel(path.join(dir, 'init'), tok.vocabSize, tok.toJSON());
  fs.writeFileSync(path.join(dir, 'other.json'), JSON.stringify(swappedTokenizer().json));
  await assert.rejects(runTraining(opts(dir, { mode: 'train', init, tokenizer: path.join(dir, 'other.json') }), { log: () => {} }), (e: unknown) => {
    assert.ok(e instanceof DistilleryError);
    assert.match(e.message, /^the student and the data use different tokenizers \(student: \d+ tokens, data: \d+ tokens\); first difference: token \d+: /);
    assert.match(e.hint ?? '', /--init continues a model trained with its own tokenizer/);
    return true;
  });
});

test('distill: the same tokenizer with reordered JSON keys is accepted; chat template and generation_config are carried to final/', async () => {
  const dir = tmp();
  const tok = tinyTokenizer();
  const reordered: Json = {};
  const src = tok.toJSON();
  for (const k of Object.keys(src).reverse()) reordered[k] = src[k];
  const model = reordered.model as Json;
  model.vocab = Object.fromEntries(Object.entries(model.vocab as Json).reverse());
  const template = "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}";
  const teacher = writeModel(path.join(dir, 'teacher'), tok.vocabSize, reordered, 2, {
    tokenizerConfig: { tokenizer_class: 'PreTrainedTokenizerFast', eos_token: '<|im_end|>', chat_template: template },
    generationConfig: { eos_token_id: [tok.tokenToId('<|im_end|>'), tok.tokenToId('<|endoftext|>')], temperature: 0.7 },
  });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(src));
  const lines: string[] = [];
  const s = await runTraining(opts(dir, { teacher, tokenizer: path.join(dir, 'tokenizer.json'), alpha: 0.5 }), { log: (l) => lines.push(l) });
  assert.equal(s.status, 'completed');
  assert.ok(lines.includes(`tokenizer: ${tok.vocabSize} tokens, identity ${tokenizerHash(reordered).slice(0, 16)}: the same for teacher, data`), lines.join('\n'));
  const tc = JSON.parse(fs.readFileSync(path.join(s.finalDir!, 'tokenizer_config.json'), 'utf8')) as Json;
  assert.equal(tc.chat_template, template);
  assert.equal(tc.eos_token, '<|im_end|>');
  const gc = JSON.parse(fs.readFileSync(path.join(s.finalDir!, 'generation_config.json'), 'utf8')) as Json;
  assert.deepEqual(gc, { eos_token_id: [tok.tokenToId('<|im_end|>'), tok.tokenToId('<|endoftext|>')], temperature: 0.7 });
  // The resumable checkpoint's model folder carries them too.
  const ltc = JSON.parse(fs.readFileSync(path.join(s.out, 'checkpoints', 'latest', 'model', 'tokenizer_config.json'), 'utf8')) as Json;
  assert.equal(ltc.chat_template, template);
  // So does best/ (the lowest validation loss): the same tokenizer_config.json and generation_config.json as final/.
  const bestDir = path.join(s.out, 'checkpoints', 'best');
  assert.ok(fs.existsSync(path.join(bestDir, 'best.json')), 'an evaluation ran and wrote best/');
  for (const f of ['tokenizer_config.json', 'generation_config.json']) {
    assert.ok(fs.existsSync(path.join(bestDir, f)), `best/${f} is written`);
    assert.deepEqual(JSON.parse(fs.readFileSync(path.join(bestDir, f), 'utf8')), JSON.parse(fs.readFileSync(path.join(s.finalDir!, f), 'utf8')), f);
  }
});

test('distill: a teacher with padded vocabulary rows passes the identity and size checks; the log names the real tokens; lossVocab reaches StepRunner', async () => {
  const dir = tmp();
  const tok = tinyTokenizer();
  const teacher = writeModel(path.join(dir, 'teacher'), tok.vocabSize + 16, tok.toJSON());
  // The student has exactly the tokenizer's rows: the two vocab_sizes differ (refused before this change).
  const student = path.join(dir, 'student.json');
  fs.writeFileSync(student, JSON.stringify(toHfConfig(presetConfig('tiny', tok.vocabSize))));
  const lines: string[] = [];
  // The chunked head runs the loss over the tokenizer's rows only (test/train/head.test.ts checks the math): the run completes.
  const s = await runTraining(opts(dir, { teacher, model: student }), { log: (l) => lines.push(l) });
  assert.equal(s.status, 'completed');
  assert.ok(Number.isFinite(s.finalTrainLoss));
  assert.ok(lines.some((l) => l === `loss over the ${tok.vocabSize} real tokens of the tokenizer; padding rows excluded (teacher vocab_size ${tok.vocabSize + 16}: 16 rows)`),
    lines.join('\n'));
  // A teacher whose vocab_size does not cover the tokenizer is refused.
  const small = writeModel(path.join(dir, 'small'), tok.vocabSize - 1, null);
  await assert.rejects(runTraining(opts(dir, { teacher: small, model: student, tokenizer: path.join(dir, 'teacher', 'tokenizer.json'), out: path.join(dir, 'r2') }), { log: () => {} }),
    (e: unknown) => e instanceof DistilleryError && e.message === `the teacher's vocabulary (vocab_size ${tok.vocabSize - 1}) is smaller than the tokenizer (${tok.vocabSize} tokens)`);
});

test('a Llama 3-style chat template renders chat data (Jinja); a template that refuses a conversation names the file and line', async () => {
  const dir = tmp();
  const tok = tinyTokenizer();
  const llama = "{% for m in messages %}{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}{% endfor %}";
  const init = writeModel(path.join(dir, 'init'), tok.vocabSize, tok.toJSON(), 2, { tokenizerConfig: { chat_template: llama } });
  const data = path.join(dir, 'chat.jsonl');
  const conv = { messages: [{ role: 'user', content: 'hi there' }, { role: 'assistant', content: 'hello, how are you?' }] };
  fs.writeFileSync(data, `${JSON.stringify({ text: 'plain text' })}\n${Array(30).fill(JSON.stringify(conv)).join('\n')}\n`);
  const lines: string[] = [];
  const s = await runTraining({ ...opts(dir, { mode: 'train', init }), data: [data] }, { log: (l) => lines.push(l) });
  assert.equal(s.status, 'completed');
  assert.ok(s.dataLossTokens < s.dataTokens, 'only the assistant replies (and the plain text line) carry loss');
  const refusing = writeModel(path.join(dir, 'refusing'), tok.vocabSize, tok.toJSON(), 2,
    { tokenizerConfig: { chat_template: "{% if messages[-1].role == 'user' %}{{ raise_exception('the last turn must be the assistant') }}{% endif %}" } });
  fs.writeFileSync(data, `${JSON.stringify({ text: 'plain text' })}\n${JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] })}\n`);
  await assert.rejects(runTraining({ ...opts(dir, { mode: 'train', init: refusing, out: path.join(dir, 'r2') }), data: [data] }, { log: () => {} }),
    (e: unknown) => e instanceof DistilleryError && e.message.startsWith(`${data}:2: the chat template of the --init checkpoint ${refusing} refused the conversation: the last turn must be the assistant`));
});

test('StepRunner: different vocab sizes need lossVocab; lossVocab above a model\'s vocab is refused; below runs over the first rows', () => {
  const be = createCpuBackend({ threads: 1 });
  try {
    const mk = (v: number, training: boolean): Transformer => new Transformer(be, presetConfig('tiny', v), { batch: 1, seq: 4, training });
    const s300 = mk(300, true), t310 = mk(310, false), t300 = mk(300, false);
    const kl = { kind: 'kl' as const, alpha: 0.5, temperature: 1, beta: 0.5 };
    assert.throws(() => new StepRunner(s300, t310, kl), (e: unknown) => e instanceof DistilleryError && /vocabularies differ: teacher vocab_size 310, student 300/.test(e.message));
    assert.throws(() => new StepRunner(s300, t300, kl, { lossVocab: 301 }), (e: unknown) => e instanceof DistilleryError && /student's vocab_size \(300\) is smaller than the tokenizer \(301 tokens\)/.test(e.message));
    assert.equal(new StepRunner(s300, t310, kl, { lossVocab: 300 }).lossVocab, 300);
    const r = new StepRunner(s300, t300, kl, { lossVocab: 300 });
    assert.equal(r.lossVocab, 300);
    assert.equal(new StepRunner(s300, null, { kind: 'none', alpha: 0, temperature: 1, beta: 0.5 }).lossVocab, 300);
  } finally { be.dispose(); }
});
