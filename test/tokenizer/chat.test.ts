/**
 * Chat templates run as Jinja (src/tokenizer/chat.ts) against fixtures rendered by the Python side
 * (test/fixtures/chat-templates/expected.json, written by scripts/hf-compat/chat-fixtures.py: transformers'
 * apply_chat_template where it ran, else jinja2 in transformers' settings; its "source" says which): the real Qwen2.5, Qwen3,
 * Llama 3.2 Instruct and SmolLM3 templates over conversations with and without a system turn, multi-turn, Qwen3
 * reasoning, a tool call with tools, enable_thinking on and off, and SmolLM3's xml_tools. The text must be equal; where the fixture has
 * transformers' token ids, our tokenizer's ids of our text must be equal; where it has transformers' assistant mask
 * (templates with {% generation %}), the tokens our spans select must be equal. Also: spans of templates without
 * markers, raise_exception, template options, and the data loader.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { CHATML_TEMPLATE, DEFAULT_CHAT_FORMAT, checkChatTokens, chatFormatOf, chatTemplateFromConfig, chatRenderer, renderChat, renderChatWithSpans, type ChatMessage } from '../../src/tokenizer/chat.js';
import { loadDocs, loadDocuments } from '../../src/data/documents.js';
import { Tokenizer } from '../../src/tokenizer/bpe.js';
import { DistilleryError } from '../../src/util/errors.js';
import { qwenTokenizerPath } from './qwen.js';

const FIX = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../test/fixtures/chat-templates');
interface Spec {
  now: string;
  conversations: Record<string, { messages: ChatMessage[]; tools?: unknown[] }>;
  templates: Record<string, { file: string; bos_token: string | null; eos_token: string | null; kwargs: Array<Record<string, unknown>> }>;
}
interface Case { template: string; conversation: string; kwargs: Record<string, unknown>; add_generation_prompt: boolean; text?: string; ids?: number[]; assistant_mask?: number[]; error?: string }
const spec = JSON.parse(fs.readFileSync(path.join(FIX, 'conversations.json'), 'utf8')) as Spec;
const expected = JSON.parse(fs.readFileSync(path.join(FIX, 'expected.json'), 'utf8')) as { source: string; cases: Case[] };
const [y, mo, d] = spec.now.split('-').map(Number) as [number, number, number];
const NOW = new Date(y, mo - 1, d);
const tok = Tokenizer.fromFile(qwenTokenizerPath());

function formatOf(name: string) {
  const t = spec.templates[name]!;
  return chatFormatOf(fs.readFileSync(path.join(FIX, t.file), 'utf8'), `fixture ${name}`, { bos_token: t.bos_token, eos_token: t.eos_token });
}

/** The end-of-turn marker of a template family. */
const endMarker = (name: string): string => (name.startsWith('llama') ? '<|eot_id|>' : '<|im_end|>');

test(`chat templates render as the fixtures (${expected.source}): text, ids, assistant spans`, () => {
  assert.ok(expected.cases.length >= 20, 'the fixtures hold the cases');
  let ids = 0, masks = 0;
  for (const c of expected.cases) {
    const f = formatOf(c.template), conv = spec.conversations[c.conversation]!;
    const opts = { addGenerationPrompt: c.add_generation_prompt, kwargs: c.kwargs, tools: conv.tools ?? null, now: NOW };
    const what = `${c.template} / ${c.conversation} / ${JSON.stringify(c.kwargs)}`;
    if (c.error !== undefined) {
      assert.throws(() => renderChat(f, conv.messages, opts), DistilleryError, what);
      continue;
    }
    assert.equal(renderChat(f, conv.messages, opts), c.text, what);
    const r = renderChatWithSpans(f, conv.messages, opts);
    assert.equal(r.text, c.text, `${what} (with spans)`);
    const replies = conv.messages.filter((m) => m.role === 'assistant');
    assert.equal(r.assistant.length, replies.length, `${what}: one span per assistant reply`);
    r.assistant.forEach(([a, b], i) => {
      const s = r.text.slice(a, b);
      assert.ok(s.trimEnd().endsWith(endMarker(c.template)), `${what}: span ${i} ends with the end-of-turn marker: ${JSON.stringify(s)}`);
      const content = (replies[i]!.content ?? '').trim();
      if (content) assert.ok(s.includes(content), `${what}: span ${i} holds the reply ${JSON.stringify(content)}: ${JSON.stringify(s)}`);
    });
    // transformers registers the fixture's bos/eos strings as special tokens of Qwen's tokenizer; where it had to add
    // one (Llama's <|begin_of_text|>, <|eot_id|>: ids past the vocabulary), the ids compare different tokenizers.
    if (c.ids && c.ids.every((id) => id < tok.vocabSize)) {
      assert.deepEqual(tok.encode(r.text), c.ids, `${what}: token ids`);
      ids++;
    }
    if (c.assistant_mask) {
      const e = tok.encodeWithOffsets(r.text);
      const ours = e.offsets.map(([s]) => (r.assistant.some(([a, b]) => s >= a && s < b) ? 1 : 0));
      assert.deepEqual(ours, c.assistant_mask, `${what}: assistant mask`);
      masks++;
    }
  }
  if (expected.source.startsWith('transformers')) assert.ok(ids > 0 && masks > 0, 'transformers fixtures carry ids and masks');
});

test('templates without generation markers: spans from prefix renderings (ChatML), located where prefixes differ (Qwen3)', () => {
  const conv: ChatMessage[] = [
    { role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello!' }, { role: 'user', content: 'Bye' }, { role: 'assistant', content: 'See you.' },
  ];
  const chatml = renderChatWithSpans(chatFormatOf(null, 'x'), conv);
  assert.deepEqual(chatml.assistant.map(([a, b]) => chatml.text.slice(a, b)), ['Hello!<|im_end|>', 'See you.<|im_end|>']);
  // Qwen3 drops earlier turns' reasoning, so the conversation up to a reply is not a prefix of the whole one.
  const q3 = formatOf('qwen3');
  const withReasoning: ChatMessage[] = [
    { role: 'user', content: 'Q1' }, { role: 'assistant', content: 'A1', reasoning_content: 'r1' }, { role: 'user', content: 'Q2' },
    { role: 'assistant', content: 'A2', reasoning_content: 'r2' },
  ];
  const r = renderChatWithSpans(q3, withReasoning);
  const spans = r.assistant.map(([a, b]) => r.text.slice(a, b));
  assert.equal(spans.length, 2);
  assert.ok(spans[0]!.startsWith('A1') || spans[0]!.includes('A1<|im_end|>'), spans[0]);
  assert.ok(spans[1]!.includes('r2') && spans[1]!.endsWith('A2<|im_end|>'), `the last reply keeps its reasoning: ${spans[1]}`);
  // No assistant turn: no span.
  assert.deepEqual(renderChatWithSpans(q3, [{ role: 'user', content: 'Hi' }]).assistant, []);
});

test('Qwen3 multi-turn spans (not prefix-stable): each reply in its own turn, never a user turn with the same words, reasoning written in content, no header newline', () => {
  const q3 = formatOf('qwen3');
  const spansOf = (conv: ChatMessage[]): string[] => { const r = renderChatWithSpans(q3, conv); return r.assistant.map(([a, b]) => r.text.slice(a, b)); };
  const u = (content: string): ChatMessage => ({ role: 'user', content }), a = (content: string): ChatMessage => ({ role: 'assistant', content });
  // a user turn that says what the next reply says: the reply is counted, the user turn is not
  const echo = spansOf([u('Hi'), a('A'), u('Same'), a('Same'), u('x'), a('y')]);
  assert.deepEqual(echo.slice(0, 2), ['A<|im_end|>', 'Same<|im_end|>']);
  assert.equal(echo.length, 3);
  assert.ok(echo[2]!.endsWith('y<|im_end|>'));
  // a reply the user repeats and the last reply repeats: both replies
  const rep = spansOf([u('Hi'), a('Hello!'), u('Hello!'), a('Hello!')]);
  assert.equal(rep.length, 2);
  assert.equal(rep[0], 'Hello!<|im_end|>');
  // reasoning written inside content (the usual form of Qwen3 distillation data): the earlier reply is still found
  const think = spansOf([u('Q1'), a('<think>\nthink one\n</think>\n\nHello!'), u('Q2'), a('Bye')]);
  assert.equal(think.length, 2);
  assert.equal(think[0], 'Hello!<|im_end|>');
  // no span starts with the role header's newline
  for (const sp of [...echo, ...rep, ...think]) assert.ok(!sp.startsWith('\n'), JSON.stringify(sp));
});

test('the default ChatML template refuses tool calls by name (it would drop them), and renders a null content as empty', () => {
  const call: ChatMessage = { role: 'assistant', content: null, tool_calls: [{ type: 'function', function: { name: 'w', arguments: '{}' } }] };
  assert.throws(() => renderChat(DEFAULT_CHAT_FORMAT, [{ role: 'user', content: 'weather?' }, call]),
    (e: unknown) => e instanceof DistilleryError && /the default ChatML template does not render tool calls/.test(e.message));
  assert.equal(renderChat(chatFormatOf(CHATML_TEMPLATE, 'a model without a template'), [{ role: 'user', content: 'Hi' }, { role: 'assistant', content: null }]),
    '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n');
});

test('raise_exception in a template is a DistilleryError with its message; a template that does not parse names its source', () => {
  const f = chatFormatOf("{%- if messages[0]['role'] != 'user' %}{{ raise_exception('Conversations must start with a user turn') }}{% endif %}", 'runs/m tokenizer_config.json');
  assert.throws(() => renderChat(f, [{ role: 'assistant', content: 'x' }]),
    (e: unknown) => e instanceof DistilleryError && /runs\/m tokenizer_config\.json refused the conversation: Conversations must start with a user turn/.test(e.message));
  assert.throws(() => renderChat(chatFormatOf('{% for m in messages %}', 'bad.jinja'), [{ role: 'user', content: 'x' }]),
    (e: unknown) => e instanceof DistilleryError && /bad\.jinja cannot be parsed/.test(e.message));
});

test('template options reach the template (enable_thinking off adds Qwen3\'s empty think block to the generation prompt)', () => {
  const q3 = formatOf('qwen3');
  const on = renderChat(q3, [{ role: 'user', content: 'Hi' }], { addGenerationPrompt: true });
  const off = renderChat(q3, [{ role: 'user', content: 'Hi' }], { addGenerationPrompt: true, kwargs: { enable_thinking: false } });
  assert.equal(on, '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n');
  assert.equal(off, `${on}<think>\n\n</think>\n\n`);
});

test('the data loader renders chat lines with the run\'s renderer: spans under --loss-on assistant, none under all; no-assistant lines listed', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-chat-'));
  const f = path.join(dir, 'chat.jsonl');
  const conv = { messages: [{ role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello!' }] };
  fs.writeFileSync(f, `${JSON.stringify(conv)}\n${JSON.stringify({ messages: [{ role: 'user', content: 'only a question' }] })}\n{"text": "plain"}\n`);
  const fmt = chatFormatOf(CHATML_TEMPLATE, 'test');
  const a = loadDocs([f], { renderChat: chatRenderer(fmt, { lossOn: 'assistant' }) });
  assert.equal(a.docs.length, 2);
  assert.deepEqual(a.docs[0]!.lossSpans!.map(([s, e]) => a.docs[0]!.text.slice(s, e)), ['Hello!<|im_end|>']);
  assert.equal(a.docs[1]!.lossSpans, null, 'a text line carries no spans');
  assert.deepEqual(a.noAssistant, [`${f}:2`]);
  assert.equal(a.conversations, 2);
  const all = loadDocs([f], { renderChat: chatRenderer(fmt, { lossOn: 'all' }) });
  assert.equal(all.docs.length, 3);
  assert.ok(all.docs.every((x) => x.lossSpans === null));
  assert.deepEqual(loadDocuments([f]).slice(0, 1), ['<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n']);
  fs.rmSync(dir, { recursive: true, force: true });
});

test('encodeWithOffsets: encode()\'s ids, and each token\'s range in the text (multi-byte characters, emoji, special tokens)', () => {
  const text = '<|im_start|>user\nnaïve café 東京 🚀 x<|im_end|>\n<|im_start|>assistant\nOK  done.\n';
  const e = tok.encodeWithOffsets(text);
  assert.deepEqual(e.ids, tok.encode(text));
  let prev = 0;
  e.offsets.forEach(([a, b], i) => {
    assert.ok(a >= prev - 3 && b > a && b <= text.length, `token ${i}: [${a}, ${b})`);
    prev = a;
  });
  // Decoding each token whose bytes are whole characters gives exactly its range's text.
  e.ids.forEach((id, i) => {
    const s = tok.decode([id]);
    if (!s.includes('\uFFFD')) assert.equal(text.slice(e.offsets[i]![0], e.offsets[i]![1]), s, `token ${i}`);
  });
  assert.equal(e.offsets[0]![0], 0);
  assert.equal(e.offsets[e.offsets.length - 1]![1], text.length);
});

test('encodeWithOffsets where the normalizer changes the text (Qwen: NFC): each token keeps its own range, a composed character covers its base and marks', () => {
  // "e" + combining acute: NFC composes it into "é". Every token used to get the whole run's range, so a reply holding
  // one such character lost the loss on every token (they all "started" before the assistant's span).
  const text = 'e\u0301cole caf\u00e9 \u1f71\u03b2 x';
  const e = tok.encodeWithOffsets(text);
  assert.deepEqual(e.ids, tok.encode(text));
  const pieces = e.ids.map((id) => tok.decode([id]));
  assert.equal(tok.decode(e.ids), text.normalize('NFC'));
  // the first token starts at 0; no token spans the whole text; ranges are in order and cover it
  assert.equal(e.offsets[0]![0], 0);
  assert.equal(e.offsets[e.offsets.length - 1]![1], text.length);
  e.offsets.forEach(([a, b], i) => {
    assert.ok(b - a < text.length, `token ${i} (${JSON.stringify(pieces[i])}) spans [${a}, ${b})`);
    if (i > 0) assert.ok(a >= e.offsets[i - 1]![0], `token ${i} starts before token ${i - 1}`);
    // the range's text, normalized, is the token's text where the token holds whole characters
    if (!pieces[i]!.includes('\uFFFD')) assert.equal(text.slice(a, b).normalize('NFC'), pieces[i], `token ${i}`);
  });
  // a chat reply with such a character: every token of the reply counts
  const fmt = chatFormatOf(CHATML_TEMPLATE, 'test');
  const r = renderChatWithSpans(fmt, [{ role: 'user', content: 'Say a word' }, { role: 'assistant', content: 'e\u0301cole is a French word' }]);
  const enc = tok.encodeWithOffsets(r.text);
  const [s0, s1] = r.assistant[0]!;
  const counted = enc.ids.filter((_, i) => enc.offsets[i]![0] >= s0 && enc.offsets[i]![0] < s1);
  assert.equal(tok.decode(counted), 'école is a French word<|im_end|>');
});

test('str.strip / lstrip / rstrip take the characters to strip, as in Python (the engine ignored them: Qwen3 and SmolLM3 lost a reply\'s indentation)', () => {
  const f = chatFormatOf("{{ messages[0]['content'].lstrip('\\n') }}|{{ messages[0]['content'].rstrip('\\n') }}|{{ messages[0]['content'].strip('\\n ') }}|{{ messages[0]['content'].strip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'ab'.lstrip('') }}", 'test');
  // Python: s.lstrip('\n'), s.rstrip('\n'), s.strip('\n '), s.strip(), 'xxhixx'.strip('x'), 'ab'.lstrip('')
  assert.equal(renderChat(f, [{ role: 'user', content: '\n  indented code  \n\n' }]),
    '  indented code  \n\n|\n  indented code  |indented code|indented code|hi|ab');
  // Qwen3's template: an assistant reply's leading indentation survives (content.lstrip('\n'))
  const qwen3 = chatFormatOf((JSON.parse(fs.readFileSync(path.join(path.dirname(qwenTokenizerPath()), 'tokenizer_config.json'), 'utf8')) as { chat_template: string }).chat_template, 'qwen3');
  const text = renderChat(qwen3, [{ role: 'user', content: 'Code?' }, { role: 'assistant', content: '    x = 1\nprint(x)' }]);
  assert.ok(text.includes('\n\n    x = 1\nprint(x)<|im_end|>'), JSON.stringify(text));
});

test('tools and documents are null where the data has none (transformers passes None): `tools is not none` works', () => {
  const f = chatFormatOf("{% if tools is not none %}{{ tools|length }} tools{% else %}no tools{% endif %}/{{ documents is none }}", 'test');
  // (a boolean prints as Python prints it: True)
  assert.equal(renderChat(f, [{ role: 'user', content: 'hi' }]), 'no tools/True');
  assert.equal(renderChat(f, [{ role: 'user', content: 'hi' }], { tools: [{ type: 'function' }, { type: 'function' }] }), '2 tools/True');
});

test('a line\'s chat_template_kwargs reach the template over --chat-template-kwargs; a non-object is refused with file:line', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-kw-'));
  const f = path.join(dir, 'c.jsonl');
  fs.writeFileSync(f, [
    JSON.stringify({ messages: [{ role: 'user', content: 'a' }] }),
    JSON.stringify({ messages: [{ role: 'user', content: 'b' }], chat_template_kwargs: { mode: 'row' } }),
  ].join('\n') + '\n');
  const fmt = chatFormatOf("{{ messages[0]['content'] }}:{{ mode }}:{{ other }}", 'test');
  const docs = loadDocuments([f], { renderChat: chatRenderer(fmt, { lossOn: 'all', kwargs: { mode: 'run', other: 'x' } }) });
  assert.deepEqual(docs, ['a:run:x', 'b:row:x']);
  fs.writeFileSync(f, JSON.stringify({ messages: [{ role: 'user', content: 'a' }], chat_template_kwargs: 'no' }) + '\n');
  assert.throws(() => loadDocuments([f], { renderChat: chatRenderer(fmt, { lossOn: 'all' }) }), (e: unknown) => e instanceof DistilleryError && /c\.jsonl:1: "chat_template_kwargs" must be an object/.test(e.message));
  fs.rmSync(dir, { recursive: true, force: true });
});

test('conversations without a chat template need the tokenizer\'s ChatML tokens (else the turn markers would be plain text): refused by name', () => {
  const withChatml = { tokenToId: (t: string): number | undefined => ({ '<|im_start|>': 1, '<|im_end|>': 2 } as Record<string, number>)[t] };
  const without = { tokenToId: (): number | undefined => undefined };
  const chat = [{ conversation: true }];
  checkChatTokens(DEFAULT_CHAT_FORMAT, chat, withChatml);
  checkChatTokens(DEFAULT_CHAT_FORMAT, [{}], without); // text data: no template needed
  checkChatTokens(chatFormatOf(CHATML_TEMPLATE, 'a model'), chat, without); // the model's own template: its business
  assert.throws(() => checkChatTokens(DEFAULT_CHAT_FORMAT, chat, without),
    (e: unknown) => e instanceof DistilleryError && /no chat template and its tokenizer has no <\|im_start\|> or <\|im_end\|> token/.test(e.message) && /chat_template/.test(e.hint ?? ''));
});

test('an integer beyond 2^53 in a chat line is refused with file:line (JavaScript would change its digits, transformers keeps them)', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-big-'));
  const f = path.join(dir, 'c.jsonl');
  fs.writeFileSync(f, '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"order_id": 12345678901234567890, "n": 21.5}}}]}]}\n');
  assert.throws(() => loadDocuments([f], { renderChat: chatRenderer(chatFormatOf(CHATML_TEMPLATE, 't'), { lossOn: 'all' }) }),
    (e: unknown) => e instanceof DistilleryError && /c\.jsonl:1: the number 12345678901234567000 is beyond 2\^53/.test(e.message) && /string/.test(e.hint ?? ''));
  fs.writeFileSync(f, '{"messages": [{"role": "user", "content": "a"}], "tools": [{"max": 9007199254740991}]}\n');
  assert.equal(loadDocuments([f], { renderChat: chatRenderer(chatFormatOf(CHATML_TEMPLATE, 't'), { lossOn: 'all' }) }).length, 1, '2^53 - 1 is exact');
  fs.rmSync(dir, { recursive: true, force: true });
});

test('a line with both "text" and "messages" is a conversation (TRL takes the messages)', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-both-'));
  const f = path.join(dir, 'c.jsonl');
  fs.writeFileSync(f, JSON.stringify({ text: 'pre-rendered', messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'yo' }] }) + '\n');
  const docs = loadDocs([f], { renderChat: chatRenderer(chatFormatOf(CHATML_TEMPLATE, 't'), { lossOn: 'assistant' }) }).docs;
  assert.equal(docs.length, 1);
  assert.equal(docs[0]!.text, '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n');
  assert.equal(docs[0]!.conversation, true);
  assert.ok(docs[0]!.lossSpans && docs[0]!.lossSpans.length === 1);
  fs.rmSync(dir, { recursive: true, force: true });
});

test('a named template list: the default renders conversations, its tool_use entry those with tools (as transformers picks)', () => {
  const cfg = { chat_template: [{ name: 'default', template: 'D:{{ messages[0].content }}' }, { name: 'tool_use', template: 'T:{{ tools|length }}:{{ messages[0].content }}' }] };
  const f = chatFormatOf('D:{{ messages[0].content }}', 'test', cfg);
  assert.equal(renderChat(f, [{ role: 'user', content: 'hi' }]), 'D:hi');
  assert.equal(renderChat(f, [{ role: 'user', content: 'hi' }], { tools: [{}, {}] }), 'T:2:hi');
  assert.equal(renderChatWithSpans(f, [{ role: 'user', content: 'hi' }], { tools: [{}] }).text, 'T:1:hi');
  // a template given another way (chat_template.jinja) is not the list's default: no tool_use swap
  assert.equal(renderChat(chatFormatOf('J:{{ messages[0].content }}', 'test', cfg), [{ role: 'user', content: 'hi' }], { tools: [{}] }), 'J:hi');
  // named templates without a default: transformers renders a conversation with tools (tool_use) and refuses the rest;
  // before, the first entry (or plain ChatML) was used silently
  const only = { chat_template: [{ name: 'tool_use', template: 'T:{{ tools|length }}' }, { name: 'rag', template: 'R' }] };
  const g = chatFormatOf(chatTemplateFromConfig(only.chat_template), 'a model', only);
  assert.equal(g.isDefault, false);
  assert.equal(renderChat(g, [{ role: 'user', content: 'hi' }], { tools: [{}] }), 'T:1');
  assert.throws(() => renderChat(g, [{ role: 'user', content: 'hi' }]),
    (e: unknown) => e instanceof DistilleryError && /a model has named chat templates \(tool_use, rag\) but no default one/.test(e.message) && /chat_template\.jinja/.test(e.hint ?? ''));
  assert.throws(() => renderChatWithSpans(chatFormatOf(null, 'a model', { chat_template: [{ name: 'rag', template: 'R' }] }), [{ role: 'user', content: 'hi' }], { tools: [{}] }),
    (e: unknown) => e instanceof DistilleryError && /no default one, which a conversation renders with/.test(e.message));
});

test('continuing the final message (a gen_prefix) renders as transformers\' continue_final_message does (test/fixtures/chat-templates/continued.json)', () => {
  const fix = JSON.parse(fs.readFileSync(path.join(FIX, 'continued.json'), 'utf8')) as {
    source: string; cases: Array<{ template: string; conversation: string; messages: ChatMessage[]; kwargs: Record<string, unknown>; text?: string; error?: string }>;
  };
  assert.ok(fix.source.startsWith('transformers') && fix.cases.length >= 20);
  let trimmed = 0;
  for (const c of fix.cases) {
    const what = `${c.template} / ${c.conversation} / ${JSON.stringify(c.kwargs)}`;
    const opts = { addGenerationPrompt: false, continueFinalMessage: true, kwargs: c.kwargs, now: NOW };
    if (c.error !== undefined) { assert.throws(() => renderChat(formatOf(c.template), c.messages, opts), DistilleryError, what); continue; }
    assert.equal(renderChat(formatOf(c.template), c.messages, opts), c.text, what);
    if (!c.text!.endsWith(c.messages.at(-1)!.content!)) trimmed++; // a template that trims the text: cut before the trailing space
  }
  assert.ok(trimmed > 0, 'a case where the template trimmed the last message');
  // a template that drops the final message's text cannot be continued (transformers refuses it too)
  const drops = chatFormatOf("{% for m in messages %}{{ m.role }}{% if m.role != 'assistant' %}: {{ m.content }}{% endif %}\n{% endfor %}", 'a test template', {});
  assert.throws(() => renderChat(drops, [{ role: 'user', content: 'q' }, { role: 'assistant', content: 'The best answer is' }], { continueFinalMessage: true }), /drops part of the final message/);
});
