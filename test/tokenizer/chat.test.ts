/**
 * Chat formats (src/tokenizer/chat.ts) against a Jinja engine (@huggingface/jinja, the one transformers.js runs
 * `apply_chat_template` with): distillery's ChatML rendering equals the engine's rendering of the exported
 * CHATML_TEMPLATE and of a template with a literal default system turn (Qwen2.5's style), with and without a
 * generation prompt and a system message; Qwen3's real template is ChatML without a default system prompt; a Llama 3
 * style template is not ChatML and rendering with it is refused; the data loader uses the renderer it is given.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Template } from '@huggingface/jinja';
import { CHATML_TEMPLATE, chatFormatOf, renderChat, type ChatMessage } from '../../src/tokenizer/chat.js';
import { loadDocuments } from '../../src/data/documents.js';
import { DistilleryError } from '../../src/util/errors.js';
import { qwenTokenizerPath } from './qwen.js';

const convs: ChatMessage[][] = [
  [{ role: 'user', content: 'What is distillation?' }],
  [{ role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello!\nHow can I help?' }, { role: 'user', content: 'Explain KL.' }],
  [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Why?' }],
];

function jinja(template: string, messages: ChatMessage[], addGenerationPrompt: boolean): string {
  return new Template(template).render({ messages, add_generation_prompt: addGenerationPrompt, bos_token: '', eos_token: '' });
}

/** A ChatML template with a default system turn written as one literal string, as Qwen2.5's template does. */
const WITH_SYSTEM = [
  "{%- if messages[0]['role'] == 'system' -%}",
  "{%- else -%}{{- '<|im_start|>system\\nYou are a careful assistant; answer in one line.<|im_end|>\\n' -}}{%- endif -%}",
  "{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}{%- endfor -%}",
  "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}",
].join('\n');

test('ChatML rendering equals the Jinja engine on the exported template and on a template with a default system turn', () => {
  for (const template of [CHATML_TEMPLATE, WITH_SYSTEM]) {
    const f = chatFormatOf(template, 'test');
    assert.equal(f.kind, 'chatml');
    for (const msgs of convs) {
      for (const gen of [false, true]) {
        assert.equal(renderChat(f, msgs, { addGenerationPrompt: gen }), jinja(template, msgs, gen), `${template === CHATML_TEMPLATE ? 'plain' : 'system'} ${JSON.stringify(msgs)} ${gen}`);
      }
    }
  }
  const f = chatFormatOf(WITH_SYSTEM, 'test');
  assert.equal(f.kind === 'chatml' ? f.defaultSystem : null, 'You are a careful assistant; answer in one line.');
});

test('Qwen3\'s real chat template is ChatML without a default system prompt; a Llama 3 template is not ChatML', () => {
  const tc = JSON.parse(fs.readFileSync(path.join(path.dirname(qwenTokenizerPath()), 'tokenizer_config.json'), 'utf8')) as { chat_template: string };
  const q = chatFormatOf(tc.chat_template, 'Qwen3');
  assert.equal(q.kind, 'chatml');
  assert.equal(q.kind === 'chatml' ? q.defaultSystem : 'x', null);
  const llama = "{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}{% endfor %}";
  const l = chatFormatOf(llama, 'runs/llama/tokenizer_config.json');
  assert.equal(l.kind, 'other');
  assert.throws(() => renderChat(l, convs[0]!), (e: unknown) => e instanceof DistilleryError && /runs\/llama\/tokenizer_config\.json is not ChatML/.test(e.message));
  assert.equal(chatFormatOf(undefined, 'x').kind, 'chatml');
});

test('the data loader renders chat lines with the renderer it is given', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-chat-'));
  const f = path.join(dir, 'chat.jsonl');
  fs.writeFileSync(f, `${JSON.stringify({ messages: convs[0] })}\n`);
  const sys = chatFormatOf(WITH_SYSTEM, 'test');
  assert.deepEqual(loadDocuments([f], { renderChat: (m) => renderChat(sys, m) }), [jinja(WITH_SYSTEM, convs[0]!, false)]);
  assert.deepEqual(loadDocuments([f]), [jinja(CHATML_TEMPLATE, convs[0]!, false)]);
  fs.rmSync(dir, { recursive: true, force: true });
});
