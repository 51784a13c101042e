/**
 * gen_prefix (the harness's: the start of the answer after the context, e.g. Llama 3's instruct tasks' "The best answer
 * is"): the item's scored continuations and its generation prompt, as the harness's construct_requests and
 * fewshot_context make them (the prompt turns themselves: test/eval/fewshot.test.ts against the harness's own code;
 * continue_final_message: test/tokenizer/chat.test.ts against transformers).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseChoiceItems } from '../../src/eval/items.js';
import { chatSaid } from '../../src/eval/choices.js';
import { ChoiceEncoder, encodeForModel } from '../../src/eval/encode.js';
import { encodePrompts } from '../../src/eval/generate-items.js';
import { ChatContinueError, DEFAULT_CHAT_FORMAT, chatFormatOf, renderChat } from '../../src/tokenizer/chat.js';
import { tinyTokenizer } from '../cli/fixtures.js';

const Q = 'Which is larger, 3 or 5?\nA. 3\nB. 5';
const items = (lines: object[]) => parseChoiceItems(lines.map((l) => JSON.stringify(l)).join('\n'), 'gp.jsonl');

test('a multiple-choice item with a gen_prefix: after it in text, a space then the choice; with the chat template, the prefix continued and the target delimiter kept unless the prefix ends in whitespace', () => {
  const tok = tinyTokenizer(), enc = new ChoiceEncoder(tok, DEFAULT_CHAT_FORMAT);
  const [plain, spaced] = items([{ context: Q, choices: ['A', 'B'], answer: 1, gen_prefix: 'The best answer is' }, { context: Q, choices: ['A', 'B'], answer: 1, gen_prefix: 'Answer: ' }]);
  assert.equal(plain!.genPrefix, 'The best answer is');
  // plain text: context + target delimiter (they would touch) + prefix, then ' ' + choice (the target delimiter)
  const got = encodeForModel(tok, DEFAULT_CHAT_FORMAT, [plain!], { chat: false });
  assert.deepEqual(got.map((e) => [e.ctx, e.cont]), ['A', 'B'].map((ch) => { const p = enc.pair(`${Q} The best answer is`, ` ${ch}`, 'x'); return [p.ctx, p.cont]; }));
  // chat: the assistant turn holds the prefix and is continued; the choice after the target delimiter (the prefix ends in no space)
  const rendered = renderChat(DEFAULT_CHAT_FORMAT, [{ role: 'user', content: Q }, { role: 'assistant', content: 'The best answer is' }], { continueFinalMessage: true });
  assert.ok(rendered.endsWith('<|im_start|>assistant\nThe best answer is'), rendered);
  const chat = encodeForModel(tok, DEFAULT_CHAT_FORMAT, [plain!], { chat: true });
  assert.deepEqual(chat.map((e) => [e.ctx, e.cont]), ['A', 'B'].map((ch) => { const p = enc.pair(rendered, ` ${ch}`, 'x'); return [p.ctx, p.cont]; }));
  // a prefix that ends in a space: no delimiter before the choice in chat mode (the harness's ends_with_whitespace rule)
  const renderedSpaced = renderChat(DEFAULT_CHAT_FORMAT, [{ role: 'user', content: Q }, { role: 'assistant', content: 'Answer: ' }], { continueFinalMessage: true });
  const chatSpaced = encodeForModel(tok, DEFAULT_CHAT_FORMAT, [spaced!], { chat: true });
  assert.deepEqual(chatSpaced.map((e) => [e.ctx, e.cont]), ['A', 'B'].map((ch) => { const p = enc.pair(renderedSpaced, ch, 'x'); return [p.ctx, p.cont]; }));
  // without a gen_prefix the chat mode's choices go without a delimiter, as before
  const [bare] = items([{ context: Q, choices: ['A', 'B'], answer: 1 }]);
  const open = renderChat(DEFAULT_CHAT_FORMAT, [{ role: 'user', content: Q }], { addGenerationPrompt: true });
  assert.deepEqual(encodeForModel(tok, DEFAULT_CHAT_FORMAT, [bare!], { chat: true }).map((e) => e.cont), ['A', 'B'].map((ch) => enc.pair(open, ch, 'x').cont));
});

test('a generation item with a gen_prefix: the prompt ends with it (text and chat), so the model continues the answer', () => {
  const tok = tinyTokenizer(), enc = new ChoiceEncoder(tok, DEFAULT_CHAT_FORMAT);
  const [g] = items([{ context: 'Question: 2 + 3?\nAnswer:', target: '5', gen_prefix: "Let's think step by step." }]);
  assert.deepEqual(encodePrompts(tok, DEFAULT_CHAT_FORMAT, [g!], { chat: false }), [enc.encode("Question: 2 + 3?\nAnswer: Let's think step by step.")]);
  const chat = renderChat(DEFAULT_CHAT_FORMAT, [{ role: 'user', content: 'Question: 2 + 3?\nAnswer:' }, { role: 'assistant', content: "Let's think step by step." }], { continueFinalMessage: true });
  assert.deepEqual(encodePrompts(tok, DEFAULT_CHAT_FORMAT, [g!], { chat: true }), [enc.encode(chat)]);
});

test('gen_prefix goes with a context: refused on text and multiple-input items, and as a non-string', () => {
  assert.throws(() => items([{ text: 'a text', gen_prefix: 'x' }]), /gp\.jsonl:1: "gen_prefix" goes with a "context" .* not a text item/);
  assert.throws(() => items([{ contexts: ['a', 'b'], continuation: 'c', answer: 0, gen_prefix: 'x' }]), /not a multiple-input item/);
  assert.throws(() => items([{ context: 'q', choices: ['a', 'b'], answer: 0, gen_prefix: 3 }]), /"gen_prefix" must be a string/);
  assert.equal(items([{ context: 'q', choices: ['a', 'b'], answer: 0, gen_prefix: '' }])[0]!.genPrefix, undefined, 'an empty one is none (the harness tests it for truth)');
});

test('gen_prefix: null is none; an item with an unrelated "text" key still takes one; a template that never reads content cannot be continued', () => {
  assert.equal(items([{ context: 'q', choices: ['a', 'b'], answer: 0, gen_prefix: null }])[0]!.genPrefix, undefined);
  assert.equal(items([{ context: 'q', text: 'an id', choices: ['a', 'b'], answer: 0, gen_prefix: 'X' }])[0]!.genPrefix, 'X');
  const noContent = chatFormatOf("{% for m in messages %}{{ m.role }}\n{% endfor %}", 'a test template', {});
  assert.throws(() => renderChat(noContent, [{ role: 'user', content: 'q' }, { role: 'assistant', content: 'X' }], { continueFinalMessage: true }), ChatContinueError);
  // a prefix the template cannot continue is an error, not a refused system turn to retry without
  const [it] = items([{ context: 'q', choices: ['a', 'b'], answer: 0, gen_prefix: 'X', description: 'A system turn.' }]);
  const warned: string[] = [];
  assert.throws(() => encodeForModel(tinyTokenizer(), noContent, [it!], { chat: true, warn: (l) => warned.push(l) }), ChatContinueError);
  assert.deepEqual(warned, []);
});

test('the log says gen_prefix turns are continued', () => {
  assert.equal(chatSaid(items([{ context: 'q', choices: ['a', 'b'], answer: 0, gen_prefix: 'X' }]), 0, false), ' (contexts as turns of the chat template, each gen_prefix an assistant turn continued)');
  assert.equal(chatSaid(items([{ context: 'q', choices: ['a', 'b'], answer: 0 }]), 0, false), ' (contexts as a user turn of the chat template)');
});
