/**
 * `eval --choices` with generation items, end to end on tiny checkpoints: the texts are each prompt's greedy
 * continuation as an unbatched float64 generator computes it (src/model/generate.ts's Generator, argmax on the host),
 * ended by the config's end-of-sequence id or the budget and cut before the first stop string; exact_match per filter
 * follows from those texts and the targets; batching, a teacher, few-shot prompts and the errors.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { readCheckpoint } from '../../src/model/checkpoint.js';
import { Generator } from '../../src/model/generate.js';
import { Transformer } from '../../src/model/transformer.js';
import { DEFAULT_RUN_OPTIONS } from '../../src/train/options.js';
import { prepareRunChoices } from '../../src/train/run-choices.js';
import { DEFAULT_CHAT_FORMAT } from '../../src/tokenizer/chat.js';
import { runCli, tempDir, tinyTokenizer, writeTinyCheckpoint } from '../cli/fixtures.js';

const EOS = '<|endoftext|>';

/** Greedy continuation of `prompt` in float64, one token at a time, ended at `eos` or after `max` tokens. */
function greedy(dir: string, prompt: string, max: number, eos: number): number[] {
  const ck = readCheckpoint(dir), tok = tinyTokenizer();
  const be = createCpuBackend({ dtype: 'f64', threads: 1 });
  const m = new Transformer(be, ck.config, { batch: 1, seq: 1, training: false });
  m.setWeights(ck.weights);
  const ids = tok.encode(prompt), g = new Generator(m, ids.length + max + 1), out: number[] = [];
  let logits = g.step(Int32Array.from(ids));
  while (out.length < max) {
    let best = 0;
    for (let v = 1; v < ck.config.vocabSize; v++) if (logits[v]! > logits[best]!) best = v;
    if (best === eos) break;
    out.push(best);
    logits = g.step(Int32Array.of(best));
  }
  be.dispose();
  return out;
}

/** The text the harness keeps: decoded without special tokens, cut before each stop string in turn. */
function kept(ids: number[], until: string[]): string {
  let s = tinyTokenizer().decode(ids, { skipSpecialTokens: true });
  for (const u of until) s = s.split(u)[0]!;
  return s;
}

interface Line { where: string; generation: string; tokens: number; answers: Record<string, string>; exact_match: Record<string, number>; teacher_generation?: string; teacher_exact_match?: Record<string, number> }

test('eval --choices with generation items: greedy texts cut at the stop strings, exact_match per filter, any target of a list, a teacher beside, the same at any --batch', async () => {
  const dir = tempDir(), tok = tinyTokenizer(), eos = tok.tokenToId(EOS)!;
  const model = path.join(dir, 'm'), teacher = path.join(dir, 't');
  writeTinyCheckpoint(model, 3, { eosTokenId: eos });
  writeTinyCheckpoint(teacher, 4, { eosTokenId: eos });
  const contexts = ['The teacher model', 'A tokenizer splits text into', 'Distillation trains a small', 'The quick brown fox jumps over the'];
  const max = 10;
  const ref = contexts.map((c) => greedy(model, c, max, eos)), tref = contexts.map((c) => greedy(teacher, c, max, eos));
  // a stop string from the middle of the first text (a random model's text is bytes, seldom words): it cuts there,
  // and generation may end before the budget
  const full0 = tok.decode(ref[0]!, { skipSpecialTokens: true });
  const k = [...Array(full0.length).keys()].find((i) => i >= full0.length / 3 && !/\uFFFD/.test(full0.slice(i, i + 2)) && full0.slice(i, i + 2).length === 2)!;
  const until = [full0.slice(k, k + 2), 'dog'];
  const texts = ref.map((r) => kept(r, [...until, EOS])), ttexts = tref.map((r) => kept(r, [...until, EOS]));
  assert.ok(texts[0]!.length < full0.length, 'the stop string cut the first text');
  // Python's \w on a str: letters, numbers and the underscore
  const firstWord = (s: string): string => /[\p{L}\p{N}_]+/u.exec(s)?.[0] ?? '[invalid]';
  // targets: the text itself; its first word; a list with the text second; something else
  const targets: Array<string | string[]> = [texts[0]!, firstWord(texts[1]!), ['no such answer', texts[2]!], 'no such answer'];
  const items = path.join(dir, 'g.jsonl');
  fs.writeFileSync(items, contexts.map((c, i) => JSON.stringify({ context: c, target: targets[i] })).join('\n') + '\n');
  const filters = ['--filter', JSON.stringify({ name: 'raw', filter: [{ function: 'take_first' }] }), JSON.stringify({ name: 'first-word', filter: [{ function: 'regex', regex_pattern: '(\\w+)' }, { function: 'take_first' }] })];
  const run = async (batch: number, withTeacher: boolean): Promise<{ j: Record<string, unknown>; lines: Line[]; err: string; text: string }> => {
    const out = path.join(dir, `out-${batch}-${withTeacher}.jsonl`);
    const args = ['eval', '--model', model, ...(withTeacher ? ['--teacher', teacher] : []), '--choices', items, '--until', ...until, '--max-gen-toks', String(max), ...filters, '--batch', String(batch)];
    const r = await runCli([...args, '--choices-out', out, '--json']);
    assert.equal(r.code, 0, r.err);
    const text = await runCli(args);
    return { j: JSON.parse(r.out) as Record<string, unknown>, lines: fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Line), err: r.err, text: text.out };
  };
  const a = await run(3, true);
  assert.deepEqual(a.lines.map((l) => l.generation), texts);
  assert.deepEqual(a.lines.map((l) => l.teacher_generation), ttexts);
  // the tokens generated: up to the end-of-sequence id or the budget, or fewer when a stop string ended it early
  a.lines.forEach((l, i) => assert.ok(l.tokens <= ref[i]!.length && tok.decode(ref[i]!.slice(0, l.tokens), { skipSpecialTokens: true }).startsWith(texts[i]!)));
  assert.ok(a.lines[0]!.tokens < ref[0]!.length, `the first item's generation ended at its stop string (${a.lines[0]!.tokens} of ${ref[0]!.length} tokens)`);
  const want = (t: string[]): Record<string, number> => {
    const raw = t.map((x, i) => ([targets[i]!].flat().includes(x) ? 1 : 0));
    const fw = t.map((x, i) => ([targets[i]!].flat().includes(firstWord(x)) ? 1 : 0));
    return { raw: raw.reduce((p: number, q) => p + q, 0) / 4, 'first-word': fw.reduce((p: number, q) => p + q, 0) / 4 };
  };
  const g = a.j.generation as { items: number; exactMatch: Record<string, number>; teacher: { exactMatch: Record<string, number> }; until: string[]; maxGenToks: number };
  assert.deepEqual(g.exactMatch, want(texts));
  assert.equal(g.exactMatch.raw, 0.5, 'the first item (its text) and the third (the second of its targets)');
  assert.deepEqual(g.teacher.exactMatch, want(ttexts));
  assert.deepEqual(g.until, [...until, EOS], 'the tokenizer\'s eos_token is a stop string too');
  assert.equal(g.items, 4);
  assert.match(a.text, /exact_match \d+\.\d\d% {2}\(raw\); teacher/);
  assert.match(a.err, /generation: 4 items, greedy, up to 10 new tokens/);
  // one at a time: the same texts
  const b = await run(1, false);
  assert.deepEqual(b.lines.map((l) => l.generation), texts);
  assert.equal(b.lines[0]!.teacher_generation, undefined);
});

test('eval --choices --fewshot with generation items: the prompt holds the examples (context, delimiter, target), as the harness builds it', async () => {
  const dir = tempDir(), tok = tinyTokenizer(), eos = tok.tokenToId(EOS)!;
  const model = path.join(dir, 'm');
  writeTinyCheckpoint(model, 5, { eosTokenId: eos });
  const rows = [{ context: 'The teacher model', target: 'predicts.' }, { context: 'A tokenizer splits', target: 'text.' }, { context: 'The quick brown fox', target: 'jumps.' }];
  const items = path.join(dir, 'g.jsonl'), out = path.join(dir, 'o.jsonl');
  fs.writeFileSync(items, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  const r = await runCli(['eval', '--model', model, '--choices', items, '--fewshot', '1', '--fewshot-sampler', 'first_n', '--max-gen-toks', '6', '--choices-out', out, '--json']);
  assert.equal(r.code, 0, r.err);
  const got = fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => (JSON.parse(l) as Line).generation);
  // first_n from the item's own file: the first other item; the default stop string is the few-shot delimiter
  rows.forEach((row, i) => {
    const ex = rows[i === 0 ? 1 : 0]!;
    const prompt = `${ex.context} ${ex.target}\n\n${row.context}`;
    assert.equal(got[i], kept(greedy(model, prompt, 6, eos), ['\n\n', EOS]), `item ${i}`);
  });
  // --choices-chat: the context as a user turn of the chat template (ChatML here), the assistant turn opened
  const c = await runCli(['eval', '--model', model, '--choices', items, '--choices-chat', '--max-gen-toks', '6', '--choices-out', out, '--json']);
  assert.equal(c.code, 0, c.err);
  const chat = fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => (JSON.parse(l) as Line).generation);
  rows.forEach((row, i) => {
    const prompt = `<|im_start|>user\n${row.context}<|im_end|>\n<|im_start|>assistant\n`;
    assert.equal(chat[i], kept(greedy(model, prompt, 6, eos), ['\n\n', EOS]), `chat item ${i}`);
  });
  // --preset gsm8k: its stop strings, and 5 examples unless --fewshot says otherwise
  const six = path.join(dir, 'six.jsonl');
  fs.writeFileSync(six, Array.from({ length: 6 }, (_, i) => JSON.stringify({ context: `Question: ${i}?\nAnswer:`, target: `#### ${i}` })).join('\n') + '\n');
  const p = await runCli(['eval', '--model', model, '--choices', six, '--preset', 'gsm8k', '--max-gen-toks', '2', '--json']);
  assert.equal(p.code, 0, p.err);
  const pg = (JSON.parse(p.out) as { generation: { until: string[]; exactMatch: Record<string, number> } }).generation;
  assert.deepEqual(pg.until, ['Question:', '</s>', '<|im_end|>', EOS]);
  assert.deepEqual(Object.keys(pg.exactMatch), ['strict-match', 'flexible-extract']);
  assert.match(p.err, /generation: 6 items, 5-shot \(random, seed 1234/);
});

test('a stop string far into a long generation (past the last tokens the step decodes) ends it where the whole text says', async () => {
  const dir = tempDir(), tok = tinyTokenizer(), eos = tok.tokenToId(EOS)!;
  const model = path.join(dir, 'm');
  writeTinyCheckpoint(model, 7, { eosTokenId: eos });
  const context = 'The teacher model', max = 120;
  const ref = greedy(model, context, max, eos);
  assert.ok(ref.length > 100, `the reference runs long (${ref.length} tokens)`);
  // a stop string from about 90 tokens in: far past the 16 last tokens the check decodes each step
  const before = tok.decode(ref.slice(0, 90), { skipSpecialTokens: true });
  const full = tok.decode(ref, { skipSpecialTokens: true });
  const k = [...Array(full.length - before.length).keys()].map((x) => x + before.length).find((i) => !/\uFFFD/.test(full.slice(i, i + 2)) && full.slice(i, i + 2).length === 2 && !full.slice(0, i).includes(full.slice(i, i + 2)))!;
  const stop = full.slice(k, k + 2);
  const items = path.join(dir, 'g.jsonl'), out = path.join(dir, 'o.jsonl');
  fs.writeFileSync(items, `${JSON.stringify({ context, target: 'x' })}\n`);
  const r = await runCli(['eval', '--model', model, '--choices', items, `--until=${stop}`, '--max-gen-toks', String(max), '--choices-out', out]);
  assert.equal(r.code, 0, r.err);
  const line = JSON.parse(fs.readFileSync(out, 'utf8')) as Line;
  assert.equal(line.generation, kept(ref, [stop, EOS]));
  assert.equal(line.generation, full.slice(0, k));
  assert.ok(line.tokens > 80 && line.tokens < ref.length, `ended at the stop string: ${line.tokens} of ${ref.length} tokens`);
});

test('--preset gsm8k gives its 5 examples to the generation items only: a multiple-choice file beside them scores as without it', async () => {
  const dir = tempDir(), model = path.join(dir, 'm');
  writeTinyCheckpoint(model, 2);
  const mc = path.join(dir, 'mc.jsonl'), gen = path.join(dir, 'gen.jsonl');
  fs.writeFileSync(mc, Array.from({ length: 7 }, (_, i) => JSON.stringify({ context: `The teacher model ${i}`, choices: ['predicts', 'learns', 'splits'], answer: i % 3 })).join('\n') + '\n');
  fs.writeFileSync(gen, Array.from({ length: 6 }, (_, i) => JSON.stringify({ context: `Question: ${i}?\nAnswer:`, target: `#### ${i}` })).join('\n') + '\n');
  const plain = await runCli(['eval', '--model', model, '--choices', mc, '--json']);
  const both = await runCli(['eval', '--model', model, '--choices', mc, gen, '--preset', 'gsm8k', '--max-gen-toks', '2', '--json']);
  assert.equal(plain.code, 0, plain.err);
  assert.equal(both.code, 0, both.err);
  const a = JSON.parse(plain.out) as { choices: { acc: number; accNorm: number } }, b = JSON.parse(both.out) as { choices: { acc: number; accNorm: number; files?: unknown[] }; generation: { items: number } };
  assert.deepEqual([b.choices.acc, b.choices.accNorm], [a.choices.acc, a.choices.accNorm]);
  assert.equal(b.choices.files, undefined, 'one file of scored items: no per-file lines');
  assert.equal(b.generation.items, 6);
  assert.match(both.err, /choices: 7 items, 21 continuations, in windows/);
  assert.match(both.err, /generation: 6 items, 5-shot/);
});

test('eval --limit scores the first items of each file (or that fraction, rounded up) with the examples they get without it', async () => {
  const dir = tempDir(), model = path.join(dir, 'm');
  writeTinyCheckpoint(model, 2);
  const mc = path.join(dir, 'mc.jsonl'), gen = path.join(dir, 'gen.jsonl');
  fs.writeFileSync(mc, Array.from({ length: 6 }, (_, i) => JSON.stringify({ context: `The teacher model ${i}`, choices: ['predicts', 'learns the', 'splits'], answer: i % 3 })).join('\n') + '\n');
  fs.writeFileSync(gen, Array.from({ length: 5 }, (_, i) => JSON.stringify({ context: `A tokenizer ${i}`, target: `x${i}` })).join('\n') + '\n');
  const lines = async (extra: string[]): Promise<string[]> => {
    const out = path.join(dir, 'o.jsonl');
    const r = await runCli(['eval', '--model', model, '--choices', mc, gen, '--fewshot', '2', '--max-gen-toks', '3', '--choices-out', out, ...extra]);
    assert.equal(r.code, 0, r.err);
    return fs.readFileSync(out, 'utf8').trim().split('\n');
  };
  const all = await lines([]);
  assert.equal(all.length, 11);
  // the first 3 of each file (5 generation items: 3 as well); 0.4 of 6 and of 5, rounded up: 3 and 2
  assert.deepEqual(await lines(['--limit', '3']), [...all.slice(0, 3), ...all.slice(6, 9)]);
  assert.deepEqual(await lines(['--limit', '0.4']), [...all.slice(0, 3), ...all.slice(6, 8)]);
  for (const bad of ['0', '1.5', '-2']) {
    const r = await runCli(['eval', '--model', model, '--choices', mc, '--limit', bad]);
    assert.equal(r.code, 2, bad);
    assert.match(r.err, /--limit must be a whole number of items or a fraction between 0 and 1/);
  }
});

test('generation items: bad settings and files are refused with the flag named (exit 2), and runs refuse them by name', async () => {
  const dir = tempDir(), model = path.join(dir, 'm');
  writeTinyCheckpoint(model, 1);
  const items = path.join(dir, 'g.jsonl'), mixed = path.join(dir, 'mixed.jsonl'), mc = path.join(dir, 'mc.jsonl');
  fs.writeFileSync(items, `${JSON.stringify({ context: 'The teacher', target: 'x' })}\n`);
  fs.writeFileSync(mixed, `${JSON.stringify({ context: 'The teacher', target: 'x' })}\n${JSON.stringify({ context: 'A', choices: ['b', 'c'], answer: 0 })}\n`);
  fs.writeFileSync(mc, `${JSON.stringify({ context: 'A', choices: ['b', 'c'], answer: 0 })}\n`);
  const cases: Array<[string[], RegExp]> = [
    [['--choices', items, '--filter', '{not json'], /--filter 1: not valid JSON/],
    [['--choices', items, '--filter', '{"name": "a", "filter": [{"function": "regex", "regex_pattern": "(?x) a"}]}'], /verbose mode/],
    [['--choices', items, '--filter', '{"name": "a", "filter": [{"function": "take_first"}]}', '{"name": "a", "filter": [{"function": "lowercase"}]}'], /two filters are named "a"/],
    [['--choices', items, '--exact-match', '{"ignore_case": 1}'], /"ignore_case" must be true or false/],
    [['--choices', items, '--max-gen-toks', '0'], /--max-gen-toks must be a positive integer/],
    [['--choices', items, '--max-gen-toks', '300'], /--max-gen-toks 300 leaves no room for a prompt in the model's 256 positions[^]*use --max-gen-toks 128 or less/],
    [['--choices', items, '--max-gen-toks', '4', '--filter', '{"name": "a", "filter": [{"function": "regex", "regex_pattern": "([\\\\s\\\\S])", "group_select": 500}]}'], /g\.jsonl:1: filter "a": the regex filter's group_select 500 is out of range/],
    [['--choices', items, '--until', 'a', '--until='], /--until expects one or more non-empty values/],
    [['--choices', mixed], /mixes generation items \("target", e\.g\. .*mixed\.jsonl:1\) with scored ones \(.*mixed\.jsonl:2\)/],
    [['--data', 'builtin:docs', '--until', 'x'], /--until goes with --choices/],
  ];
  for (const [args, re] of cases) {
    const r = await runCli(['eval', '--model', model, ...args]);
    assert.equal(r.code, 2, `${args.join(' ')}: ${r.err}`);
    assert.match(r.err, re, args.join(' '));
    assert.doesNotMatch(r.err, /\n\s+at /, 'no stack trace');
  }
  // generation settings with scored items alone change nothing: said, not refused
  const w = await runCli(['eval', '--model', model, '--choices', mc, '--preset', 'gsm8k', '--fewshot', '0']);
  assert.equal(w.code, 0, w.err);
  assert.match(w.err, /warning: --preset has no effect: no --choices file holds generation items/);
  // a run's generation prompts live in its window: max_gen_toks must leave room in --seq
  assert.throws(() => prepareRunChoices({ files: [items], chat: false, seq: 32 }, tinyTokenizer(), DEFAULT_CHAT_FORMAT, () => {}),
    /--eval-max-gen-toks 256 leaves no room for a generation item's prompt in the run's window \(--seq 32\)/);
  const said: string[] = [];
  const p = prepareRunChoices({ files: [items], chat: false, seq: 32, generation: { ...DEFAULT_RUN_OPTIONS, evalMaxGenToks: 30 } }, tinyTokenizer(), DEFAULT_CHAT_FORMAT, (l) => said.push(l));
  assert.ok(p.generation && p.generation.prompts.ids.every((x) => x.length <= 2) && p.rows.length === 0);
  assert.ok(said.some((l) => /generation prompts are cut on the left to 2 tokens \(--seq 32 less --eval-max-gen-toks 30\)/.test(l)), said.join('\n'));
});
