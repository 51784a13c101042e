/**
 * The commands end to end through main(argv, io, deps): global help and version, unknown commands and options
 * (exit 2 with a suggestion), runtime errors (exit 1, message and hint, no stack), inspect on a checkpoint written
 * with writeCheckpoint and on a bare .safetensors file, deterministic greedy generation with streaming, eval with
 * and without a teacher, train/distill option resolution (config file + flags) with an injected runTraining,
 * demo with an injected runDemo, and the kernels dispatcher with and without the CUDA tools.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { main } from '../../src/cli/main.js';
import { StreamDecoder } from '../../src/cli/commands/generate.js';
import { parameterCount, type ModelConfig } from '../../src/model/config.js';
import type { RunOptions } from '../../src/train/options.js';
import { capture, tempDir, tinyTokenizer, TEXT, writeTinyCheckpoint } from './fixtures.js';

let dir = '';
let model = '', teacher = '', dataFile = '';
let config: ModelConfig;

before(() => {
  dir = tempDir();
  model = path.join(dir, 'model');
  teacher = path.join(dir, 'teacher');
  config = writeTinyCheckpoint(model, 1);
  writeTinyCheckpoint(teacher, 2, { hiddenSize: 32, intermediateSize: 48, headDim: 8 });
  dataFile = path.join(dir, 'data.txt');
  fs.writeFileSync(dataFile, TEXT.join('\n\n'));
});
after(() => { fs.rmSync(dir, { recursive: true, force: true }); });

async function run(argv: string[], deps = {}) {
  const io = capture();
  const code = await main(argv, io, deps);
  return { code, out: io.stdout(), err: io.stderr(), pieces: io.outPieces };
}

test('--help lists every command; --version prints package.json\'s version', async () => {
  const h = await run(['--help']);
  assert.equal(h.code, 0);
  for (const c of ['train', 'distill', 'teacher-cache', 'generate', 'eval', 'inspect', 'demo', 'kernels']) assert.match(h.out, new RegExp(`\\n {2}${c} `));
  const pkg = JSON.parse(fs.readFileSync('package.json', 'utf8')) as { version: string };
  const v = await run(['--version']);
  assert.equal(v.code, 0);
  assert.equal(v.out, `distillery ${pkg.version}\n`);
  const none = await run([]);
  assert.equal(none.code, 2);
  assert.match(none.err, /usage: distillery <command>/);
});

test('each command has --help (exit 0, its usage line)', async () => {
  for (const c of ['train', 'distill', 'teacher-cache', 'generate', 'eval', 'inspect', 'demo', 'kernels']) {
    const r = await run([c, '--help']);
    assert.equal(r.code, 0, c);
    assert.match(r.out, new RegExp(`^usage: distillery ${c}`), c);
  }
  assert.match((await run(['help', 'eval'])).out, /^usage: distillery eval/);
  assert.match((await run(['distill', '-h'])).out, /--teacher <dir>/);
});

test('unknown command: exit 2 with a suggestion', async () => {
  const r = await run(['trian', '--out', 'x']);
  assert.equal(r.code, 2);
  assert.equal(r.err, "error: unknown command 'trian'\n  hint: did you mean 'distillery train'?\n");
  assert.equal(r.out, '');
  const r2 = await run(['inpsect']);
  assert.match(r2.err, /did you mean 'distillery inspect'\?/);
  const r3 = await run(['--lr', '1']);
  assert.equal(r3.code, 2);
  assert.match(r3.err, /unknown option --lr/);
});

test('bad option values exit 2 naming the flag', async () => {
  const r = await run(['train', '--out', 'o', '--data', dataFile, '--lr', 'abc']);
  assert.equal(r.code, 2);
  assert.match(r.err, /^error: --lr expects a number, got 'abc'\n {2}hint: /);
  const r2 = await run(['generate', '--model', model, '--prompt', 'x', '--top-p', '0']);
  assert.equal(r2.code, 2);
  assert.match(r2.err, /--top-p must be in \(0, 1\], got 0/);
});

test('inspect a checkpoint folder: parameter count = parameterCount, every tensor listed', async () => {
  const r = await run(['inspect', model]);
  assert.equal(r.code, 0, r.err);
  const m = /^parameters\s+(\d+)/m.exec(r.out);
  assert.ok(m, r.out);
  assert.equal(Number(m[1]), parameterCount(config));
  for (const name of ['model.embed_tokens.weight', 'model.layers.0.self_attn.q_proj.weight', 'model.layers.1.mlp.down_proj.weight', 'model.norm.weight', 'lm_head.weight']) {
    assert.match(r.out, new RegExp(`^${name.replace(/\./g, '\\.')}\\s+F32\\s+\\[`, 'm'), name);
  }
  assert.match(r.out, new RegExp(`^model\\.embed_tokens\\.weight\\s+F32\\s+\\[${config.vocabSize}, 16\\]\\s+${config.vocabSize * 16 * 4}$`, 'm'));
  const bytes = fs.statSync(path.join(model, 'model.safetensors')).size;
  const total = /(\d+) elements, (\d+) bytes/.exec(r.out);
  assert.ok(total);
  assert.equal(Number(total[1]), parameterCount(config));
  assert.ok(Number(total[2]) < bytes && Number(total[2]) === parameterCount(config) * 4);
  assert.match(r.out, /^tokenizer\s+\d+ tokens, eos <\|endoftext\|>/m);
  assert.equal(r.err, '');
});

test('inspect a bare .safetensors file; missing path exits 2', async () => {
  const r = await run(['inspect', path.join(model, 'model.safetensors')]);
  assert.equal(r.code, 0, r.err);
  assert.match(r.out, /model\.layers\.0\.mlp\.gate_proj\.weight\s+F32\s+\[32, 16\]/);
  assert.match(r.out, new RegExp(`tensors, ${parameterCount(config)} elements`));
  const missing = await run(['inspect', path.join(dir, 'nope')]);
  assert.equal(missing.code, 2);
  assert.match(missing.err, /inspect: .*nope does not exist/);
  const corrupt = path.join(dir, 'corrupt.safetensors');
  fs.writeFileSync(corrupt, 'not a safetensors file at all');
  const c = await run(['inspect', corrupt]);
  assert.equal(c.code, 1);
  assert.match(c.err, /^error: .*corrupt\.safetensors: not a valid safetensors file/);
  assert.doesNotMatch(c.err, /\n\s+at /, 'no stack trace');
});

test('generate: greedy output is deterministic, streamed piece by piece', async () => {
  const argv = ['generate', '--model', model, '--prompt', 'The teacher', '--max-new-tokens', '12', '--threads', '1'];
  const a = await run(argv);
  const b = await run(argv);
  assert.equal(a.code, 0, a.err);
  assert.equal(a.out, b.out);
  assert.ok(a.out.endsWith('\n'));
  assert.ok(a.out.length > 1, 'some text was generated');
  assert.ok(a.pieces.length > 2, 'text arrives in several writes, not at once');
  // Different weights give different text (the output depends on the model, not only on the prompt).
  const t = await run(['generate', '--model', teacher, '--prompt', 'The teacher', '--max-new-tokens', '12', '--threads', '1']);
  assert.notEqual(t.out, a.out);
});

test('generate: sampling is reproducible from --seed; --chat wraps the prompt', async () => {
  const argv = (seed: string) => ['generate', '--model', model, '--prompt', 'A tokenizer', '--max-new-tokens', '16', '--temperature', '1.5', '--seed', seed];
  const a = await run(argv('3')), b = await run(argv('3'));
  assert.equal(a.out, b.out);
  const c = await run(['generate', '--model', model, '--prompt', 'hi', '--chat', '--max-new-tokens', '4']);
  assert.equal(c.code, 0, c.err);
  const missing = await run(['generate', '--prompt', 'x']);
  assert.equal(missing.code, 2);
  assert.match(missing.err, /generate: no model given \(--model\)/);
  const noDir = await run(['generate', '--model', path.join(dir, 'nope'), '--prompt', 'x']);
  assert.equal(noDir.code, 2);
  assert.match(noDir.err, /--model: checkpoint folder .*nope does not exist/);
});

test('generate stops at the end-of-sequence token', async () => {
  // All logits 0: greedy always picks id 0. Without an eos of 0 it generates; with eos_token_id 0 it stops at once.
  const flat = path.join(dir, 'flat'), flatEos = path.join(dir, 'flat-eos');
  writeTinyCheckpoint(flat, 1, {}, true);
  writeTinyCheckpoint(flatEos, 1, { eosTokenId: 0 }, true);
  const tok = tinyTokenizer();
  const a = await run(['generate', '--model', flat, '--prompt', 'The', '--max-new-tokens', '5']);
  assert.equal(a.code, 0, a.err);
  assert.equal(a.out, tok.decode([0, 0, 0, 0, 0], { skipSpecialTokens: true }) + '\n');
  const b = await run(['generate', '--model', flatEos, '--prompt', 'The', '--max-new-tokens', '5']);
  assert.equal(b.code, 0, b.err);
  assert.equal(b.out, '\n');
});

test('StreamDecoder holds back incomplete UTF-8 and emits exactly the decoded text', () => {
  const tok = tinyTokenizer();
  const text = 'Distillation — café ☕ done.';
  const ids = tok.encode(text);
  const dec = new StreamDecoder(tok);
  let got = '';
  for (const id of ids) {
    const piece = dec.push(id);
    assert.ok(!piece.includes('\uFFFD'), 'no replacement characters mid-stream');
    got += piece;
  }
  got += dec.flush();
  assert.equal(got, text);
});

test('eval: loss and perplexity; with a teacher, agreement and KL', async () => {
  const r = await run(['eval', '--model', model, '--data', dataFile, '--seq', '16', '--batch', '3', '--json']);
  assert.equal(r.code, 0, r.err);
  const j = JSON.parse(r.out) as { loss: number; perplexity: number; tokens: number; tokenAccuracy: number; agreement?: number };
  assert.ok(j.tokens > 0);
  assert.ok(j.tokenAccuracy >= 0 && j.tokenAccuracy <= 1 && Math.abs(j.tokenAccuracy * j.tokens - Math.round(j.tokenAccuracy * j.tokens)) < 1e-6, `token accuracy ${j.tokenAccuracy} of ${j.tokens} tokens: a count of them`);
  assert.ok(j.loss > 0 && Number.isFinite(j.loss));
  assert.ok(Math.abs(j.perplexity - Math.exp(j.loss)) < 1e-6 * j.perplexity);
  assert.equal(j.agreement, undefined);
  // The batch size does not change the result (every window counted once).
  const r1 = JSON.parse((await run(['eval', '--model', model, '--data', dataFile, '--seq', '16', '--batch', '1', '--json'])).out) as typeof j;
  assert.equal(r1.tokens, j.tokens);
  assert.ok(Math.abs(r1.loss - j.loss) < 1e-4);

  const t = await run(['eval', '--model', model, '--teacher', teacher, '--data', dataFile, '--seq', '16', '--json']);
  assert.equal(t.code, 0, t.err);
  const k = JSON.parse(t.out) as { loss: number; agreement: number; kl: number };
  assert.ok(Math.abs(k.loss - j.loss) < 1e-4, 'the teacher does not change the model\'s own loss');
  assert.ok(k.agreement >= 0 && k.agreement < 1, 'two different random models disagree somewhere');
  assert.ok(k.kl > 0);
  // A model against itself: full agreement, zero KL.
  const self = JSON.parse((await run(['eval', '--model', model, '--teacher', model, '--data', dataFile, '--seq', '16', '--json'])).out) as typeof k;
  assert.equal(self.agreement, 1);
  assert.ok(Math.abs(self.kl) < 1e-5);

  const text = await run(['eval', '--model', model, '--teacher', teacher, '--data', dataFile, '--seq', '16']);
  assert.match(text.out, /^loss\s+\d+\.\d{4}/m);
  assert.match(text.out, /^perplexity\s+\d/m);
  assert.match(text.out, /^token acc\s+\d+\.\d{2}%/m);
  assert.match(text.out, /^agreement\s+\d+\.\d+%/m);
  assert.match(text.out, /^kl\s+\d/m);
  const noData = await run(['eval', '--model', model, '--data', path.join(dir, 'missing.txt')]);
  assert.equal(noData.code, 2);
  assert.match(noData.err, /--data: data file .*missing\.txt does not exist/);
});

test('eval --choices with continuation items: is_greedy and perplexity from the written scores, beside the multiple-choice items\' acc', async () => {
  const items = path.join(dir, 'cont-items.jsonl');
  const lines = [
    { context: 'The teacher model', continuation: ' predicts the next token' },
    { context: 'A tokenizer splits text into ', choices: ['pieces', 'dogs'], answer: 'pieces' },
    { context: 'The quick brown fox', continuation: ' jumps over the lazy dog' },
    { context: '', continuation: 'Distillation trains a small model' },
  ];
  fs.writeFileSync(items, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
  const out = path.join(dir, 'cont-scores.jsonl');
  // the multiple-choice item's choices get the default delimiter (a space); the continuations go as written
  const r = await run(['eval', '--model', model, '--teacher', teacher, '--choices', items, '--choices-out', out, '--json']);
  assert.equal(r.code, 0, r.err);
  type G = { items: number; acc: number; perplexity: number };
  const j = JSON.parse(r.out) as { choices: { items: number; rows: number; acc: number; greedy: G; teacher: { acc: number; greedy: G } } };
  assert.equal(j.choices.items, 4);
  assert.equal(j.choices.rows, 5);
  const samples = fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
  const cont = samples.filter((x) => x.loglik !== undefined) as Array<{ loglik: number; greedy: boolean; teacher_loglik: number; teacher_greedy: boolean }>;
  assert.equal(cont.length, 3);
  assert.ok(cont.every((x) => x.loglik < 0 && typeof x.greedy === 'boolean' && x.teacher_loglik < 0));
  const ppl = (v: number[]): number => Math.exp(-v.reduce((a, b) => a + b, 0) / v.length);
  assert.deepEqual(j.choices.greedy, { items: 3, acc: cont.filter((x) => x.greedy).length / 3, perplexity: ppl(cont.map((x) => x.loglik)) });
  assert.deepEqual(j.choices.teacher.greedy, { items: 3, acc: cont.filter((x) => x.teacher_greedy).length / 3, perplexity: ppl(cont.map((x) => x.teacher_loglik)) });
  const d = path.join(dir, 'cont-scores-delim.jsonl');
  assert.equal((await run(['eval', '--model', model, '--choices', items, '--choices-out', d, '--choice-delimiter', ' :: '])).code, 0);
  const withDelim = fs.readFileSync(d, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { loglik?: number; logliks?: number[] });
  [0, 2, 3].forEach((i) => assert.ok(Math.abs(withDelim[i]!.loglik! - (samples[i] as { loglik: number }).loglik) < 1e-5, `item ${i}: no delimiter before a continuation`));
  assert.ok(Math.abs(withDelim[1]!.logliks![0]! - (samples[1] as { logliks: number[] }).logliks[0]!) > 1e-3, 'a choice gets the delimiter');
  const mc = samples[1] as { logliks: number[]; pred: number };
  assert.equal(j.choices.acc, mc.pred === 0 ? 1 : 0, 'acc is over the one multiple-choice item');
  const text = await run(['eval', '--model', model, '--teacher', teacher, '--choices', items]);
  assert.equal(text.code, 0, text.err);
  assert.match(text.out, /^acc\s+\d+\.\d{2}% {2}\(highest log-likelihood, of 1 multiple-choice item\)/m);
  assert.match(text.out, /^greedy\s+\d+\.\d{2}% {2}\(continuations whose every token is the model's most likely, of 3 items\)/m);
  assert.match(text.out, /^cont ppl\s+\d+\.\d{3}/m);
  assert.match(text.out, /^teacher\s+greedy \d+\.\d{2}%/m);
  const bad = path.join(dir, 'cont-bad.jsonl');
  fs.writeFileSync(bad, '{"context": "x", "continuation": "y", "choices": ["a", "b"], "answer": 0}\n');
  const e = await run(['eval', '--model', model, '--choices', bad]);
  assert.equal(e.code, 2);
  assert.match(e.err, /cont-bad\.jsonl:1: "continuation" goes without "choices" and "answer"/);
});

test('eval --choices --fewshot scores the harness\'s few-shot prompts: the same log-likelihoods as those prompts written into the file', async () => {
  // test/fixtures/fewshot/harness-prompts.json: what lm-evaluation-harness's own fewshot_context built for these items
  type Case = { name: string; items: Array<Record<string, unknown>>; pool: Array<Record<string, unknown>> | null; n: number; sampler: string; seed: number; text: Array<string | string[]>; system_instruction: string | null };
  const fix = JSON.parse(fs.readFileSync(path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../test/fixtures/fewshot/harness-prompts.json'), 'utf8')) as { cases: Case[] };
  const write = (name: string, docs: Array<Record<string, unknown>>): string => {
    const f = path.join(dir, name);
    fs.writeFileSync(f, docs.map((d) => JSON.stringify(d)).join('\n') + '\n');
    return f;
  };
  const scores = async (args: string[]): Promise<Array<{ logliks?: number[]; loglik?: number }>> => {
    const out = path.join(dir, 'fewshot-scores.jsonl');
    const r = await run(['eval', '--model', model, ...args, '--choices-out', out, '--json']);
    assert.equal(r.code, 0, r.err);
    return fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { logliks?: number[]; loglik?: number });
  };
  for (const name of ['mc-own-random-3', 'mc-pool-first_n-2', 'continuation-own-random-2', 'multiple-input-own-random-2', 'mc-system-instruction-descriptions']) {
    const c = fix.cases.find((x) => x.name === name)!;
    const items = write(`${name}.jsonl`, c.items);
    const args = ['--choices', items, '--fewshot', String(c.n), '--fewshot-sampler', c.sampler, '--fewshot-seed', String(c.seed),
      ...(c.pool ? ['--fewshot-from', write(`${name}-pool.jsonl`, c.pool)] : []), ...(c.system_instruction ? ['--system-instruction', c.system_instruction] : [])];
    // a multiple-input item's prompts (one per context) as its contexts
    // (the description is in the prompt already)
    const prebuilt = write(`${name}-prebuilt.jsonl`, c.items.map(({ description: _d, ...d }, i) => (Array.isArray(c.text[i]) ? { ...d, contexts: c.text[i] } : { ...d, context: c.text[i] })));
    const [got, want] = [await scores(args), await scores(['--choices', prebuilt])];
    assert.equal(got.length, c.items.length);
    got.forEach((g, i) => assert.deepEqual(g.logliks ?? [g.loglik], want[i]!.logliks ?? [want[i]!.loglik], `${name} item ${i}`));
    // and the examples change the scores (the prompts differ from the items' own contexts)
    const zero = await scores(['--choices', items]);
    assert.ok(zero.some((z, i) => JSON.stringify(z.logliks ?? z.loglik) !== JSON.stringify(got[i]!.logliks ?? got[i]!.loglik)), `${name}: --fewshot changed nothing`);
  }
  // with the chat template (this model has none: ChatML): an example is a user turn and an assistant turn, or with
  // --fewshot-single-turn one user turn holding the text; the same scores as those renderings written by hand
  const docs = fix.cases.find((x) => x.name === 'mc-own-first_n-4')!.items.slice(0, 3) as Array<{ context: string; choices: string[]; answer: number }>;
  const chatItems = write('fewshot-chat.jsonl', docs);
  const shot = (i: number): (typeof docs)[number] => docs[i === 0 ? 1 : 0]!; // first_n, the item itself left out
  const turn = (role: string, text: string): string => `<|im_start|>${role}\n${text}<|im_end|>\n`;
  const multi = docs.map((d, i) => ({ ...d, context: turn('user', shot(i).context) + turn('assistant', shot(i).choices[shot(i).answer]!) + turn('user', d.context) + '<|im_start|>assistant\n' }));
  const single = docs.map((d, i) => ({ ...d, context: turn('user', `${shot(i).context} ${shot(i).choices[shot(i).answer]}\n\n${d.context}`) + '<|im_start|>assistant\n' }));
  const chatArgs = ['--choices', chatItems, '--choices-chat', '--fewshot', '1', '--fewshot-sampler', 'first_n'];
  const lls = async (args: string[]): Promise<unknown[]> => (await scores(args)).map((x) => x.logliks);
  assert.deepEqual(await lls(chatArgs), await lls(['--choices', write('fewshot-multi.jsonl', multi), '--choice-delimiter', '']));
  assert.deepEqual(await lls([...chatArgs, '--fewshot-single-turn']), await lls(['--choices', write('fewshot-single.jsonl', single), '--choice-delimiter', '']));
  assert.notDeepEqual(await lls(chatArgs), await lls([...chatArgs, '--fewshot-single-turn']));
  const items = write('fewshot-small.jsonl', fix.cases[0]!.items.slice(0, 3));
  for (const [args, re] of [
    [['--fewshot', '3'], /--fewshot 3 needs 3 examples for .*fewshot-small\.jsonl:1, and .*fewshot-small\.jsonl holds 2 other than the item itself/],
    [['--fewshot-seed', '5'], /--fewshot-seed goes with --fewshot/],
    [['--fewshot', '1', '--fewshot-single-turn'], /--fewshot-single-turn goes with --choices-chat/],
    [['--fewshot', '1', '--fewshot-from', items, items], /2 --fewshot-from files for 1 --choices file/],
    [['--fewshot', '-1'], /--fewshot must be an integer >= 0/],
  ] as Array<[string[], RegExp]>) {
    const e = await run(['eval', '--model', model, '--choices', items, ...args]);
    assert.equal(e.code, 2, `${args.join(' ')}: ${e.err}`);
    assert.match(e.err, re);
  }
});

test('eval --choices with multiple-input items (Winogrande\'s): the continuation scored after each context, as continuation items score it; acc its likeliest context', async () => {
  const mi = [
    { contexts: ['The trophy would not fit in the suitcase because the trophy', 'The trophy would not fit in the suitcase because the suitcase'], continuation: 'was too big.', answer: 0 },
    { contexts: ['The teacher helped the student because the teacher', 'The teacher helped the student because the student'], continuation: 'needed help.', answer: 'The teacher helped the student because the student' },
  ];
  const items = path.join(dir, 'mi.jsonl'), as = path.join(dir, 'mi-as-cont.jsonl');
  fs.writeFileSync(items, mi.map((l) => JSON.stringify(l)).join('\n') + '\n');
  // the same rows as continuation items: each context, then the delimiter and the shared continuation
  fs.writeFileSync(as, mi.flatMap((l) => l.contexts.map((c) => JSON.stringify({ context: c, continuation: ` ${l.continuation}` }))).join('\n') + '\n');
  const out = path.join(dir, 'mi-scores.jsonl'), outAs = path.join(dir, 'mi-as-scores.jsonl');
  const r = await run(['eval', '--model', model, '--choices', items, '--choices-out', out, '--json']);
  assert.equal(r.code, 0, r.err);
  assert.equal((await run(['eval', '--model', model, '--choices', as, '--choices-out', outAs])).code, 0);
  const got = fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { answer: number; logliks: number[]; pred: number; pred_norm: number });
  const want = fs.readFileSync(outAs, 'utf8').trim().split('\n').map((l) => (JSON.parse(l) as { loglik: number }).loglik);
  assert.deepEqual(got.flatMap((g) => g.logliks), want);
  assert.deepEqual(got.map((g) => g.answer), [0, 1]);
  const argmax = (v: number[]): number => v.indexOf(Math.max(...v));
  got.forEach((g, i) => {
    assert.equal(g.pred, argmax(g.logliks));
    assert.equal(g.pred_norm, argmax(g.logliks.map((x, k) => x / [...mi[i]!.contexts[k]!].length)), 'acc_norm divides by the context\'s length, as the harness divides by its options\'');
  });
  const j = JSON.parse(r.out) as { choices: { acc: number; rows: number } };
  assert.equal(j.choices.rows, 4);
  assert.equal(j.choices.acc, got.filter((g) => g.pred === g.answer).length / 2);
  const bad = path.join(dir, 'mi-bad.jsonl');
  fs.writeFileSync(bad, JSON.stringify({ contexts: ['a', 'b'], answer: 0 }) + '\n');
  const e = await run(['eval', '--model', model, '--choices', bad]);
  assert.equal(e.code, 2);
  assert.match(e.err, /mi-bad\.jsonl:1: "continuation" must be a non-empty string \(what each context is scored with\)/);
  fs.writeFileSync(bad, JSON.stringify({ context: 'x', contexts: ['a', 'b'], continuation: 'c', answer: 0 }) + '\n');
  const both = await run(['eval', '--model', model, '--choices', bad]);
  assert.equal(both.code, 2);
  assert.match(both.err, /mi-bad\.jsonl:1: "contexts" goes without "context"/);
  // a stray "text" key does not make a multiple-input line a text item; a continuation too long names the continuation
  const stray = path.join(dir, 'mi-stray.jsonl');
  fs.writeFileSync(stray, JSON.stringify({ ...mi[0], text: 'raw row' }) + '\n');
  const st = await run(['eval', '--model', model, '--choices', stray, '--seq', '2']);
  assert.equal(st.code, 2);
  assert.match(st.err, /mi-stray\.jsonl:1: the continuation is \d+ tokens, more than the window \(--seq 2\) holds/);
});

test('eval --choices with text items: word and byte perplexity and bits per byte from the written log-likelihoods, in windows of --seq or the model\'s', async () => {
  const items = path.join(dir, 'texts.jsonl');
  fs.writeFileSync(items, [
    { text: 'Distillation trains a small model on the soft targets of a larger one. The quick brown fox jumps over the lazy dog.' },
    { text: 'The teacher model predicts the next token.', words: 9 },
    { context: 'A tokenizer splits text into', choices: ['pieces', 'dogs'], answer: 0 },
  ].map((l) => JSON.stringify(l)).join('\n') + '\n');
  type Rm = { items: number; wordPerplexity: number; bytePerplexity: number; bitsPerByte: number };
  const out = path.join(dir, 'texts-scores.jsonl');
  const r = await run(['eval', '--model', model, '--teacher', teacher, '--choices', items, '--seq', '8', '--choices-out', out, '--json']);
  assert.equal(r.code, 0, r.err);
  const j = JSON.parse(r.out) as { choices: { items: number; rows: number; acc: number; rolling: Rm; teacher: { rolling: Rm } } };
  const lines = fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { loglik: number; words: number; bytes: number; windows: number; teacher_loglik: number });
  const texts = lines.slice(0, 2);
  assert.deepEqual(texts.map((t) => t.words), [22, 9]); // Python: len(re.split(r"\s+", text)); the second its own
  assert.deepEqual(texts.map((t) => t.bytes), [115, 42]);
  assert.ok(texts[0]!.windows > 2 && texts[1]!.windows >= 1, `windows of 8 tokens: ${texts.map((t) => t.windows)}`);
  assert.equal(j.choices.rows, texts[0]!.windows + texts[1]!.windows + 2);
  const ll = texts[0]!.loglik + texts[1]!.loglik, tll = texts[0]!.teacher_loglik + texts[1]!.teacher_loglik;
  const close = (a: number, b: number): boolean => Math.abs(a - b) <= 1e-12 * Math.abs(b);
  assert.ok(close(j.choices.rolling.wordPerplexity, Math.exp(-ll / 31)) && close(j.choices.rolling.bytePerplexity, Math.exp(-ll / 157)), JSON.stringify(j.choices.rolling));
  assert.ok(close(j.choices.rolling.bitsPerByte, -ll / 157 / Math.LN2));
  assert.ok(close(j.choices.teacher.rolling.wordPerplexity, Math.exp(-tll / 31)));
  assert.equal(j.choices.rolling.items, 2);
  assert.ok(j.choices.acc === 0 || j.choices.acc === 1, 'acc over the one multiple-choice item');
  // without --seq the windows are the model's max_position_embeddings: one window a text here
  const whole = path.join(dir, 'texts-whole.jsonl');
  assert.equal((await run(['eval', '--model', model, '--choices', items, '--choices-out', whole])).code, 0);
  assert.deepEqual(fs.readFileSync(whole, 'utf8').trim().split('\n').slice(0, 2).map((l) => (JSON.parse(l) as { windows: number }).windows), [1, 1]);
  const text = await run(['eval', '--model', model, '--teacher', teacher, '--choices', items, '--seq', '8']);
  assert.equal(text.code, 0, text.err);
  assert.match(text.out, /^word ppl\s+\d+\.\d{3} {2}\(exp of minus the log-likelihood per word, of 2 texts in rolling windows\)$/m);
  assert.match(text.out, /^bits\/byte\s+\d+\.\d{4}$/m);
  assert.match(text.out, /^teacher\s+word ppl \d+\.\d{3}; byte ppl \d+\.\d{4}; bits\/byte \d+\.\d{4}$/m);
  assert.match(text.out, /^choices\s+3 items, 2 continuations and \d+ text windows \(windows of 8, 2 cut on the left\)$/m);
  assert.match(text.out, /^acc\s+\d+\.\d{2}% {2}\(highest log-likelihood, of 1 multiple-choice item\)$/m);
  const twice = await run(['eval', '--model', model, '--choices', items, items]);
  assert.equal(twice.code, 2);
  assert.match(twice.err, /--choices: .*texts\.jsonl is given twice/);
});

test('eval --choices with several files: each file\'s metrics (a task\'s own) beside the pooled ones, equal to that file scored alone', async () => {
  const a = path.join(dir, 'task-a.jsonl'), b = path.join(dir, 'task-b.jsonl');
  fs.writeFileSync(a, [
    { context: 'The teacher model', choices: ['predicts the next token', 'learns'], answer: 0 },
    { context: 'A tokenizer splits text into', choices: ['pieces', 'dogs', 'models'], answer: 0 },
  ].map((l) => JSON.stringify(l)).join('\n') + '\n');
  fs.writeFileSync(b, [
    { context: 'The quick brown fox', continuation: ' jumps over the lazy dog' },
    { context: 'Distillation trains a small', choices: ['model', 'fox'], answer: 0 },
  ].map((l) => JSON.stringify(l)).join('\n') + '\n');
  type M = { items: number; rows: number; acc?: number; accNorm?: number; greedy?: { items: number; acc: number; perplexity: number } };
  type R = { choices: M & { files?: Array<M & { file: string; teacher?: M }>; teacher?: M } };
  const ev = async (...files: string[]): Promise<R> => {
    const r = await run(['eval', '--model', model, '--teacher', teacher, '--choices', ...files, '--seq', '32', '--json']);
    assert.equal(r.code, 0, r.err);
    return JSON.parse(r.out) as R;
  };
  const both = await ev(a, b), onlyA = await ev(a), onlyB = await ev(b);
  assert.equal(onlyA.choices.files, undefined, 'one file: no per-file list');
  assert.deepEqual(both.choices.files!.map((f) => f.file), [a, b]);
  for (const [f, one] of [[both.choices.files![0]!, onlyA], [both.choices.files![1]!, onlyB]] as const) {
    const { teacher: t, ...rest } = one.choices as M & { teacher?: M; seq?: number; cut?: number };
    delete (rest as { seq?: number }).seq; delete (rest as { cut?: number }).cut;
    const { teacher: ft, file: _f, ...frest } = f;
    for (const k of ['acc', 'accNorm'] as const) assert.ok(Math.abs((frest[k] ?? 0) - (rest[k] ?? 0)) < 1e-12, `${f.file} ${k}`);
    assert.equal(frest.items, rest.items);
    if (rest.greedy) {
      assert.equal(frest.greedy!.acc, rest.greedy.acc);
      assert.ok(Math.abs(frest.greedy!.perplexity - rest.greedy.perplexity) < 1e-6 * rest.greedy.perplexity, `${f.file} perplexity`);
    }
    assert.equal(ft?.acc, t?.acc);
  }
  assert.equal(both.choices.items, 4);
  assert.equal(both.choices.greedy!.items, 1);
  const text = await run(['eval', '--model', model, '--choices', a, b, '--seq', '32']);
  assert.match(text.out, new RegExp(`^  ${a.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: 2 items, choices acc \\d+\\.\\d{2}%, acc_norm \\d+\\.\\d{2}%$`, 'm'));
  assert.match(text.out, /: 2 items, choices acc \d+\.\d{2}%, acc_norm \d+\.\d{2}%, continuations greedy \d+\.\d{2}%, ppl \d/m);
});

test('eval --choices: acc and acc_norm from the written log-likelihoods, the teacher beside, with --data in one run; errors exit 2', async () => {
  const items = path.join(dir, 'items.jsonl');
  const lines = [
    { context: 'The teacher model', choices: ['predicts the next token', 'learns', 'splits text into pieces'], answer: 0 },
    { context: 'A tokenizer splits text into ', choices: ['pieces', 'dogs'], answer: 'pieces' },
    { context: 'The quick brown fox', choices: ['jumps over the lazy dog', 'does not mind', 'learns'], answer: 0 },
    { context: 'Distillation trains a small model on the', choices: ['soft targets', 'quick brown fox'], answer: 0 },
    // longer than --seq's default 64 tokens: with --data in the same run the models hold the longer window
    { context: `${TEXT.join(' ')} The teacher model`, choices: ['predicts', 'sleeps'], answer: 0 },
  ];
  fs.writeFileSync(items, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
  const out = path.join(dir, 'scores.jsonl');
  const r = await run(['eval', '--model', model, '--teacher', teacher, '--choices', items, '--choices-out', out, '--batch', '4', '--json']);
  assert.equal(r.code, 0, r.err);
  const j = JSON.parse(r.out) as { loss?: number; choices: { items: number; rows: number; acc: number; accNorm: number; seq: number; cut: number; teacher: { acc: number; accNorm: number } } };
  assert.equal(j.loss, undefined, 'no --data: no loss');
  assert.equal(j.choices.items, 5);
  assert.equal(j.choices.rows, 12);
  assert.ok(j.choices.seq > 64, `the longest row: ${j.choices.seq}`);
  assert.equal(j.choices.cut, 0);
  assert.match(r.err, /choices: 5 items, 12 continuations, in windows of up to \d+ tokens/);
  const samples = fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { where: string; answer: number; logliks: number[]; pred: number; pred_norm: number; teacher_logliks: number[]; teacher_pred: number; teacher_pred_norm: number });
  assert.deepEqual(samples.map((x) => [x.where, x.answer]), lines.map((_, i) => [`${items}:${i + 1}`, 0]));
  // acc and acc_norm are what the written log-likelihoods give (argmax; per character of the choice)
  const arg = (v: number[]): number => v.indexOf(Math.max(...v));
  const mean = (f: (x: typeof samples[number], i: number) => boolean): number => samples.filter(f).length / samples.length;
  samples.forEach((x, i) => {
    assert.equal(x.logliks.length, lines[i]!.choices.length);
    assert.ok(x.logliks.every((v) => v < 0));
    assert.equal(x.pred, arg(x.logliks));
    assert.equal(x.pred_norm, arg(x.logliks.map((v, k) => v / lines[i]!.choices[k]!.length)));
    assert.equal(x.teacher_pred, arg(x.teacher_logliks));
  });
  assert.equal(j.choices.acc, mean((x) => x.pred === x.answer));
  assert.equal(j.choices.accNorm, mean((x) => x.pred_norm === x.answer));
  assert.equal(j.choices.teacher.acc, mean((x) => x.teacher_pred === x.answer));
  assert.equal(j.choices.teacher.accNorm, mean((x) => x.teacher_pred_norm === x.answer));
  // The model's scores do not depend on the teacher, the batch, or the window they are padded to.
  const alone = path.join(dir, 'scores-alone.jsonl');
  assert.equal((await run(['eval', '--model', model, '--choices', items, '--choices-out', alone, '--batch', '3', '--seq', String(j.choices.seq + 20)])).code, 0);
  fs.readFileSync(alone, 'utf8').trim().split('\n').forEach((l, i) => {
    const a = JSON.parse(l) as { logliks: number[]; teacher_logliks?: number[] };
    assert.equal(a.teacher_logliks, undefined);
    a.logliks.forEach((v, k) => assert.ok(Math.abs(v - samples[i]!.logliks[k]!) < 1e-4, `item ${i} choice ${k}: ${v} vs ${samples[i]!.logliks[k]}`));
  });
  // With --data in the same run (windows of 64, the choices' longer): the loss, agreement and KL are --data's alone,
  // the choices' scores --choices' alone.
  const bothOut = path.join(dir, 'scores-both.jsonl');
  const both = await run(['eval', '--model', model, '--teacher', teacher, '--data', dataFile, '--choices', items, '--choices-out', bothOut, '--json']);
  assert.equal(both.code, 0, both.err);
  const b = JSON.parse(both.out) as { loss: number; agreement: number; kl: number; choices: typeof j.choices };
  const dataAlone = JSON.parse((await run(['eval', '--model', model, '--teacher', teacher, '--data', dataFile, '--json'])).out) as typeof b;
  for (const k of ['loss', 'agreement', 'kl'] as const) assert.ok(Math.abs(b[k] - dataAlone[k]) < 1e-6, k);
  assert.deepEqual(b.choices, j.choices);
  fs.readFileSync(bothOut, 'utf8').trim().split('\n').forEach((l, i) => {
    const a = JSON.parse(l) as { logliks: number[]; teacher_logliks: number[] };
    a.logliks.forEach((v, k) => assert.ok(Math.abs(v - samples[i]!.logliks[k]!) < 1e-5));
    a.teacher_logliks.forEach((v, k) => assert.ok(Math.abs(v - samples[i]!.teacher_logliks[k]!) < 1e-5));
  });
  // A window too small for a context cuts it on the left, with a warning naming the --seq that holds them all.
  const small = await run(['eval', '--model', model, '--choices', items, '--seq', '16']);
  assert.equal(small.code, 0, small.err);
  assert.match(small.err, /warning: --choices: the context of \d+ of 12 continuations was cut on the left to fit --seq 16 \(--seq \d+ holds them all\)/);
  assert.match(small.out, /^choices\s+5 items, 12 continuations \(windows of 16, \d+ cut on the left\)/m);
  assert.match(small.out, /^acc\s+\d+\.\d{2}%/m);
  assert.match(small.out, /^acc_norm\s+\d+\.\d{2}%/m);
  const text = await run(['eval', '--model', model, '--teacher', teacher, '--choices', items]);
  assert.match(text.out, /^teacher\s+acc \d+\.\d{2}%.*; acc_norm \d+\.\d{2}%/m);
  // --choices-chat: each context a user turn of the chat template (this model has none: ChatML, as training), the
  // delimiter '' as the harness makes it; the same scores as the rendered text written into the items by hand.
  const chatOut = path.join(dir, 'scores-chat.jsonl'), byHand = path.join(dir, 'items-chatml.jsonl'), byHandOut = path.join(dir, 'scores-chatml.jsonl');
  const chat = await run(['eval', '--model', model, '--choices', items, '--choices-chat', '--choices-out', chatOut]);
  assert.equal(chat.code, 0, chat.err);
  assert.match(chat.err, /\(contexts as a user turn of the chat template\)/);
  fs.writeFileSync(byHand, lines.map((l) => JSON.stringify({ ...l, context: `<|im_start|>user\n${l.context}<|im_end|>\n<|im_start|>assistant\n` })).join('\n') + '\n');
  const hand = await run(['eval', '--model', model, '--choices', byHand, '--choice-delimiter', '', '--choices-out', byHandOut]);
  assert.equal(hand.code, 0, hand.err);
  const readLl = (f: string): number[][] => fs.readFileSync(f, 'utf8').trim().split('\n').map((l) => (JSON.parse(l) as { logliks: number[] }).logliks);
  assert.deepEqual(readLl(chatOut), readLl(byHandOut));
  assert.notDeepEqual(readLl(chatOut), samples.map((x) => x.logliks));
  // The data's settings without --data change nothing: a warning each.
  const idle = await run(['eval', '--model', model, '--choices', items, '--packing', 'bfd', '--chat-template-kwargs', '{"x": 1}']);
  assert.equal(idle.code, 0, idle.err);
  assert.match(idle.err, /warning: --packing has no effect without --data\n/);
  assert.match(idle.err, /warning: --chat-template-kwargs has no effect without --data or --choices-chat\n/);
  assert.doesNotMatch(chat.err, /warning/);
  // Errors, exit 2: neither --data nor --choices; the choice flags without --choices; a bad line, named.
  const none = await run(['eval', '--model', model]);
  assert.equal(none.code, 2);
  assert.match(none.err, /no data given \(--data or --choices\)/);
  for (const f of [['--choice-delimiter', ' '], ['--choices-out', out], ['--choices-chat'], ['--system-instruction', 'Be brief.']]) {
    const x = await run(['eval', '--model', model, '--data', dataFile, ...f]);
    assert.equal(x.code, 2);
    assert.match(x.err, new RegExp(`${f[0]} goes with --choices`));
  }
  const badFile = path.join(dir, 'bad-items.jsonl');
  fs.writeFileSync(badFile, JSON.stringify(lines[0]) + '\n' + '{"context": "x", "choices": ["a", "b"], "answer": 5}\n');
  const bad = await run(['eval', '--model', model, '--choices', badFile]);
  assert.equal(bad.code, 2);
  assert.match(bad.err, /bad-items\.jsonl:2: "answer" 5 is not the index of a choice \(0 to 1\)/);
  const noFolder = await run(['eval', '--model', model, '--choices', items, '--choices-out', path.join(dir, 'nope', 'x.jsonl')]);
  assert.equal(noFolder.code, 2);
  assert.match(noFolder.err, /--choices-out: the folder .*nope does not exist/);
});

test('train/distill: config file + flags resolve to RunOptions and reach runTraining', async () => {
  const cfg = path.join(dir, 'run.yaml');
  fs.writeFileSync(cfg, `out: ${path.join(dir, 'out')}\ndata:\n  - ${dataFile}\nsteps: 30\ngrad-accum: 2\nminLrRatio: 0.05\nloss: jsd\n`);
  let got: RunOptions | null = null;
  const runTraining = async (o: RunOptions, hooks: { log: (s: string) => void }) => { got = o; hooks.log('trained'); return {}; };
  const r = await run(['distill', '--config', cfg, '--teacher', teacher, '--steps', '40', '--beta', '0.25'], { runTraining });
  assert.equal(r.code, 0, r.err);
  const o = got as unknown as RunOptions;
  assert.equal(o.mode, 'distill');
  assert.equal(o.steps, 40, 'flags override the file');
  assert.equal(o.gradAccum, 2);
  assert.equal(o.minLrRatio, 0.05);
  assert.equal(o.loss, 'jsd');
  assert.equal(o.beta, 0.25);
  assert.equal(o.teacher, teacher);
  assert.deepEqual(o.data, [dataFile]);
  assert.match(r.err, /trained\n/, 'runTraining\'s log goes to stderr');

  got = null;
  const w = await run(['train', '--config', cfg, '--temperature', '3'], { runTraining });
  assert.equal(w.code, 0, w.err);
  assert.equal((got as unknown as RunOptions).mode, 'train');
  assert.match(w.err, /^warning: loss in .*run\.yaml, --temperature have no effect with 'train'/m);

  got = null;
  const bad = await run(['distill', '--config', cfg], { runTraining });
  assert.equal(bad.code, 2);
  assert.match(bad.err, /^error: distill needs a teacher \(--teacher\)/);
  assert.equal(got, null, 'nothing runs after a usage error');
  const stray = await run(['train', '--config', cfg, 'extra.txt'], { runTraining });
  assert.equal(stray.code, 2);
  assert.match(stray.err, /unexpected argument 'extra\.txt'[\s\S]*--data extra\.txt/);
});

test('a runtime DistilleryError from a command exits 1 with its hint; other errors print a stack', async () => {
  const { DistilleryError } = await import('../../src/util/errors.js');
  const fail = async () => { throw new DistilleryError('the loss is NaN', 'lower --lr'); };
  const r = await run(['train', '--out', 'o', '--data', dataFile], { runTraining: fail });
  assert.equal(r.code, 1);
  assert.equal(r.err, 'error: the loss is NaN\n  hint: lower --lr\n');
  const bug = async () => { throw new TypeError('x is undefined'); };
  const b = await run(['train', '--out', 'o', '--data', dataFile], { runTraining: bug });
  assert.equal(b.code, 1);
  assert.match(b.err, /^TypeError: x is undefined\n\s+at /);
});

test('demo passes --out, --quick and --threads to runDemo', async () => {
  let got: unknown = null;
  const runDemo = async (o: unknown) => { got = o; };
  assert.equal((await run(['demo', '--quick', '--out', 'x', '--threads', '2'], { runDemo })).code, 0);
  assert.deepEqual({ ...(got as object), log: undefined }, { out: 'x', quick: true, threads: 2, log: undefined });
  await run(['demo'], { runDemo });
  assert.deepEqual({ ...(got as object), log: undefined }, { out: 'runs/demo', quick: false, threads: 0, log: undefined });
});

test('demo: a run interrupted by SIGINT / SIGTERM stops the demo with 130 / 143, saying so', async () => {
  const { DemoInterrupted } = await import('../../src/demo.js');
  for (const [sig, code] of [['SIGINT', 130], ['SIGTERM', 143]] as const) {
    const r = await run(['demo', '--out', 'x'], { runDemo: async () => { throw new DemoInterrupted(sig, 'teacher'); } });
    assert.equal(r.code, code);
    assert.match(r.err, new RegExp(`the demo stopped during its teacher \\(${sig}\\)`));
  }
});

test('kernels: dispatches to kernelsCommand with camelCase args; clear message when not in the build', async () => {
  let call: [string, Record<string, unknown>] | null = null;
  const kernelsCommand = async (sub: string, args: Record<string, unknown>) => { call = [sub, args]; return 0; };
  const r = await run(['kernels', 'plan', '--model', 'tiny', '--batch', '4', '--cache-dir', '/tmp/k'], { kernelsCommand });
  assert.equal(r.code, 0);
  assert.deepEqual(call, ['plan', { model: 'tiny', batch: 4, cacheDir: '/tmp/k' }]);
  const typo = await run(['kernels', 'wram'], { kernelsCommand });
  assert.equal(typo.code, 2);
  assert.match(typo.err, /unknown subcommand 'wram'[\s\S]*did you mean 'kernels warm'\?/);
  const none = await run(['kernels'], { kernelsCommand });
  assert.equal(none.code, 2);
  const missing = await run(['kernels', 'list'], { kernelsCommand: null });
  assert.equal(missing.code, 1);
  assert.match(missing.err, /not available in this build/);
});

test('inspect, eval and generate a Qwen3 and a SmolLM3 checkpoint: q/k norm tensors, NoPE layers, the baked line', async () => {
  const q3 = path.join(dir, 'qwen3'), smol = path.join(dir, 'smollm3');
  const c3 = writeTinyCheckpoint(q3, 5, { architecture: 'qwen3', qkvBias: false, qkNorm: true, headDim: 8 });
  const cs = writeTinyCheckpoint(smol, 6, { architecture: 'smollm3', qkvBias: true, noRopeLayers: [1] });
  const r3 = await run(['inspect', q3]);
  assert.equal(r3.code, 0, r3.err);
  assert.equal(Number(/^parameters\s+(\d+)/m.exec(r3.out)![1]), parameterCount(c3));
  assert.match(r3.out, /^architecture\s+qwen3$/m);
  assert.match(r3.out, /^q\/k norm\s+yes/m);
  assert.match(r3.out, /^model\.layers\.1\.self_attn\.q_norm\.weight\s+F32\s+\[8\]/m);
  assert.match(r3.out, /^model\.layers\.0\.self_attn\.k_norm\.weight\s+F32\s+\[8\]/m);
  assert.match(r3.out, /^baked\s+qwen3 .*head_dim 8 qkv_bias no qk_norm yes/m);
  const rs = await run(['inspect', smol]);
  assert.equal(rs.code, 0, rs.err);
  assert.equal(Number(/^parameters\s+(\d+)/m.exec(rs.out)![1]), parameterCount(cs));
  assert.match(rs.out, /^no-RoPE layers 1$/m);
  assert.match(rs.out, /^o bias\s+yes$/m);
  assert.match(rs.out, /^baked\s+smollm3 .* o_bias yes no_rope_layers 1 /m);
  for (const m of [q3, smol]) {
    const e = await run(['eval', '--model', m, '--data', dataFile, '--seq', '16']);
    assert.equal(e.code, 0, e.err);
    assert.match(e.out, /loss/);
    const g = await run(['generate', '--model', m, '--prompt', 'The model', '--max-new-tokens', '4', '--temperature', '0']);
    assert.equal(g.code, 0, g.err);
  }
});

test('eval and generate --precision: bf16 (CPU-emulated, as CUDA computes it) within the documented bound of fp32; bad values exit 2', async () => {
  const args = ['eval', '--model', model, '--teacher', teacher, '--data', dataFile, '--seq', '16', '--threads', '1', '--json'];
  const f = await run(args);
  const b = await run([...args, '--precision', 'bf16']);
  assert.equal(b.code, 0, b.err);
  assert.match(b.err, /^precision: bf16$/m);
  assert.match(f.err, /^precision: fp32$/m, 'auto is fp32 on the CPU');
  const jf = JSON.parse(f.out) as { loss: number; kl: number; agreement: number; precision: string };
  const jb = JSON.parse(b.out) as typeof jf;
  assert.equal(jb.precision, 'bf16');
  assert.notEqual(jb.loss, jf.loss, 'bf16 storage changes the numbers');
  // docs/cli.md: eval in bf16 stays within 1% of the fp32 loss and 0.02 nats of its KL.
  assert.ok(Math.abs(jb.loss - jf.loss) <= 0.01 * jf.loss, `bf16 loss ${jb.loss} vs fp32 ${jf.loss}`);
  assert.ok(Math.abs(jb.kl - jf.kl) <= 0.02, `bf16 KL ${jb.kl} vs fp32 ${jf.kl}`);
  const g = ['generate', '--model', model, '--prompt', 'The teacher', '--max-new-tokens', '8', '--threads', '1', '--precision', 'bf16'];
  const g1 = await run(g), g2 = await run(g);
  assert.equal(g1.code, 0, g1.err);
  assert.match(g1.err, /^precision: bf16$/m);
  assert.equal(g1.out, g2.out, 'bf16 greedy generation is deterministic');
  const bad = await run([...args, '--precision', 'fp8']);
  assert.equal(bad.code, 2);
  assert.match(bad.err, /--precision/);
  const clash = await run([...args, '--precision', 'bf16', '--tf32']);
  assert.equal(clash.code, 2, clash.err);
  assert.match(clash.err, /--tf32 contradicts --precision bf16/);
});
