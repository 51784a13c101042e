/**
 * Few-shot prompts (src/eval/fewshot.ts) against lm-evaluation-harness's own code: test/fixtures/fewshot/
 * harness-prompts.json holds what the harness's ConfigurableTask.fewshot_context, samplers and Message /
 * multiturn_to_singleturn built (scripts/hf-compat/fewshot-fixture.py over its source at the commit the file names) for
 * random and first_n samplers, examples from the items' own file (the item left out) and from another, descriptions,
 * other delimiters, continuation items, and both of CPython's sample() paths; as text, as chat turns and as one user
 * turn. Then the refusals, and an item's twin left out of its own examples.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseChoiceItems, type ChoiceItem } from '../../src/eval/items.js';
import { encodeForModel } from '../../src/eval/encode.js';
import { chatSaid, rowCounts, rowsSaid } from '../../src/eval/choices.js';
import { chatFormatOf, CHATML_TEMPLATE } from '../../src/tokenizer/chat.js';
import { tinyTokenizer } from '../cli/fixtures.js';
import { choiceTurns, fewshotExamples, promptTurns, turnsMessages, turnsText, type FewshotOptions, type PromptTurn } from '../../src/eval/fewshot.js';
import { InputError } from '../../src/util/errors.js';

const FIX = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../test/fixtures/fewshot/harness-prompts.json');

interface Case {
  name: string; items: object[]; pool: object[] | null; n: number; sampler: 'random' | 'first_n'; seed: number;
  fewshot_delimiter: string; target_delimiter: string; system_instruction: string | null;
  // a multiple-input item's prompts: one per context
  text: Array<string | string[]>; multiturn?: Array<Rendered | Rendered[]>; singleturn?: Array<Rendered | Rendered[]>;
}

/** What the harness passed its chat template: the messages and whether the assistant turn is opened (not with a gen_prefix). */
interface Rendered { messages: unknown[]; add_generation_prompt: boolean
}

const lines = (docs: object[], file: string): ChoiceItem[] => parseChoiceItems(docs.map((d) => JSON.stringify(d)).join('\n'), file);

test('few-shot prompts are the harness\'s own: the same examples, text, chat turns and single user turn (gen_prefix too)', () => {
  const fix = JSON.parse(fs.readFileSync(FIX, 'utf8')) as { cases: Case[] };
  assert.equal(fix.cases.length, 19);
  let compared = 0;
  for (const c of fix.cases) {
    const items = lines(c.items, `${c.name}.jsonl`);
    const o: FewshotOptions = { n: c.n, sampler: c.sampler, seed: c.seed, delimiter: c.fewshot_delimiter, ...(c.pool ? { pools: [lines(c.pool, 'pool.jsonl')] } : {}) };
    const turns = promptTurns(items, o, c.target_delimiter, c.system_instruction ?? undefined);
    // each item's prompt, or a multiple-input item's prompts, one per context
    const each = <T>(f: (t: readonly PromptTurn[]) => T): Array<T | T[]> => turns.map((t, i) => (items[i]!.shared !== undefined ? items[i]!.choices.map((_, k) => f(choiceTurns(t, items[i]!, k))) : f(t)));
    const msgs = (m: { messages: unknown[] } | Array<{ messages: unknown[] }>): unknown => (Array.isArray(m) ? m.map((x) => x.messages) : m.messages);
    assert.deepEqual(each(turnsText), c.text, `${c.name}: text`);
    if (c.multiturn) assert.deepEqual(each((t) => turnsMessages(t, false)), c.multiturn.map(msgs), `${c.name}: turns`);
    if (c.singleturn) assert.deepEqual(each((t) => turnsMessages(t, true)), c.singleturn.map(msgs), `${c.name}: one user turn`);
    // the assistant turn is opened unless the item has a gen_prefix, which the rendering ends inside (src/eval/encode.ts)
    for (const [i, r] of (c.multiturn ?? []).entries()) {
      for (const x of Array.isArray(r) ? r : [r]) assert.equal(x.add_generation_prompt, !items[i]!.genPrefix, `${c.name} ${i}: add_generation_prompt`);
    }
    compared += c.text.length;
  }
  assert.ok(compared > 150);
});

test('few-shot examples are drawn per items file, each file with its own seeded Random, as the harness seeds each task', () => {
  const fix = JSON.parse(fs.readFileSync(FIX, 'utf8')) as { cases: Case[] };
  const a = fix.cases.find((c) => c.name === 'mc-own-random-3')!, b = fix.cases.find((c) => c.name === 'mc-own-random-delims')!;
  // the two files scored together: each file's prompts are those it gets alone (its seeded Random is not shared)
  const items = [...lines(a.items, 'a.jsonl'), ...lines(b.items, 'b.jsonl')];
  const o: FewshotOptions = { n: 2, sampler: 'random', seed: b.seed, delimiter: b.fewshot_delimiter };
  const both = promptTurns(items, o, b.target_delimiter).map(turnsText);
  assert.deepEqual(both.slice(a.items.length), b.text);
  assert.deepEqual(both.slice(0, a.items.length), promptTurns(lines(a.items, 'a.jsonl'), o, b.target_delimiter).map(turnsText));
  // one examples file per items file
  assert.throws(() => fewshotExamples(items, { ...o, pools: [lines(a.items, 'p.jsonl')] }), (e: unknown) => e instanceof InputError && /1 few-shot file for 2 items files/.test(e.message));
});

test('an item is never its own example, nor is a line equal to it (key order aside); too few examples are refused', () => {
  const docs = [
    { context: 'Q1', choices: ['a', 'b'], answer: 0 },
    { context: 'Q2', choices: ['a', 'b'], answer: 1 },
    { context: 'Q3', choices: ['c', 'd'], answer: 0 },
    { answer: 0, choices: ['a', 'b'], context: 'Q1' }, // line 1's twin, its keys in another order
    { context: 'Q5', choices: ['e', 'f'], answer: 'f' },
  ];
  const items = lines(docs, 'x.jsonl');
  const first = fewshotExamples(items, { n: 2, sampler: 'first_n', seed: 1234, delimiter: '\n\n' });
  assert.deepEqual(first[0]!.map((x) => x.where), ['x.jsonl:2', 'x.jsonl:3'], 'line 4, equal to line 1, is left out with it');
  assert.deepEqual(first[1]!.map((x) => x.where), ['x.jsonl:1', 'x.jsonl:3']);
  for (let seed = 0; seed < 40; seed++) {
    let shots: ReadonlyArray<readonly ChoiceItem[]>;
    try { shots = fewshotExamples(items, { n: 2, sampler: 'random', seed, delimiter: '\n\n' }); } catch (e) {
      // a draw holding the item and its twin leaves one example: the harness asserts there, distillery says so
      assert.ok(e instanceof InputError && /an item equal to it is among its 3 drawn examples/.test(e.message), String(e));
      continue;
    }
    shots.forEach((ex, i) => {
      assert.equal(ex.length, 2);
      for (const x of ex) assert.notEqual(x.doc, items[i]!.doc, `seed ${seed}: item ${i} among its own examples`);
    });
  }
  assert.throws(() => fewshotExamples(items, { n: 5, sampler: 'random', seed: 1, delimiter: '' }),
    (e: unknown) => e instanceof InputError && /--fewshot 5 needs 5 examples for x\.jsonl:1, and x\.jsonl holds 4 other than the item itself/.test(e.message));
  assert.throws(() => fewshotExamples(items, { n: 4, sampler: 'first_n', seed: 1, delimiter: '' }),
    (e: unknown) => e instanceof InputError && /holds 3 other than the item itself/.test(e.message), 'first_n: line 1 and its twin both left out');
  assert.throws(() => fewshotExamples(items, { n: 3, sampler: 'first_n', seed: 1, delimiter: '', pools: [items.slice(0, 2)] }),
    (e: unknown) => e instanceof InputError && /its few-shot file holds 2/.test(e.message));
});

test('a description goes first, even with no examples; an item\'s description must be a string', () => {
  const items = lines([{ context: 'Q', choices: ['a', 'b'], answer: 0, description: 'About letters.\n\n' }], 'd.jsonl');
  assert.equal(turnsText(promptTurns(items, null, ' ')[0]!), 'About letters.\n\nQ');
  assert.deepEqual(turnsMessages(promptTurns(items, null, ' ')[0]!, false), [{ role: 'system', content: 'About letters.\n\n' }, { role: 'user', content: 'Q' }]);
  assert.throws(() => parseChoiceItems('{"context": "Q", "choices": ["a", "b"], "answer": 0, "description": 3}', 'd.jsonl'),
    (e: unknown) => e instanceof InputError && /d\.jsonl:1: "description" must be a string/.test(e.message));
});

test('a chat template that refuses a system turn gets the prompt again without it, with one warning, as the harness retries', () => {
  const tok = tinyTokenizer();
  const items = parseChoiceItems([
    JSON.stringify({ context: 'Q1', choices: ['a', 'b'], answer: 0, description: 'About letters.' }),
    JSON.stringify({ context: 'Q2', choices: ['a', 'b'], answer: 1, description: 'About letters.' }),
  ].join('\n'), 'c.jsonl');
  const strict = chatFormatOf(`{%- if messages[0]['role'] == 'system' -%}{{ raise_exception('System role not supported') }}{%- endif -%}${CHATML_TEMPLATE}`, 'strict', null);
  const plain = chatFormatOf(CHATML_TEMPLATE, 'plain', null);
  const warned: string[] = [];
  const got = encodeForModel(tok, strict, items, { chat: true, warn: (l) => warned.push(l) });
  const without = encodeForModel(tok, plain, items.map((it) => ({ ...it, description: undefined }) as ChoiceItem), { chat: true });
  assert.deepEqual(got, without);
  assert.equal(warned.length, 1);
  assert.match(warned[0]!, /strict's chat template refused a system turn \(System role not supported\): the descriptions go without it/);
  // with the system turn kept where the template takes it
  assert.notDeepEqual(encodeForModel(tok, plain, items, { chat: true }), without);
  assert.equal(chatSaid(items, 0, false), ' (contexts as turns of the chat template)');
  assert.equal(rowsSaid(items, [{ item: 0, choice: 0, ids: [1, 2], contStart: 1, cut: false }]), '1 continuation');
  assert.deepEqual([rowCounts(1, 0), rowCounts(0, 3), rowCounts(2, 1), rowCounts(0, 0)], ['1 continuation', '3 text windows', '2 continuations and 1 text window', '0 continuations']);
});
