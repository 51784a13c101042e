/**
 * Exported folders carry a chat template transformers.js applies as distillery renders chat: a checkpoint written by
 * writeCheckpoint (ChatML tokens, no template given → the plain ChatML template; a carried template with a default
 * system turn) is loaded with transformers.js' AutoTokenizer, whose apply_chat_template output must equal
 * renderChat's, and whose encoding of it must equal ours.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { writeCheckpoint } from '../../src/model/checkpoint.js';
import { presetConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { chatFormatOf, renderChat, DEFAULT_CHAT_FORMAT, type ChatMessage } from '../../src/tokenizer/chat.js';
import { Rng } from '../../src/util/rng.js';
import { tinyTokenizer } from '../cli/fixtures.js';

interface TjsTokenizer {
  apply_chat_template(messages: ChatMessage[], opts: Record<string, unknown>): string;
  encode(text: string, opts?: Record<string, unknown>): number[];
}
interface Tjs {
  env: { allowRemoteModels: boolean; allowLocalModels: boolean; localModelPath: string };
  AutoTokenizer: { from_pretrained(id: string): Promise<TjsTokenizer> };
}

const PKG = '@huggingface/transformers';
let tjs: Tjs | null = null;
let root = '';

before(async () => {
  try {
    tjs = (await import(PKG)) as unknown as Tjs;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ERR_MODULE_NOT_FOUND') throw e;
  }
  root = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-chat-tjs-'));
  if (tjs) {
    tjs.env.allowRemoteModels = false;
    tjs.env.allowLocalModels = true;
    tjs.env.localModelPath = root;
  }
});
after(() => { if (root) fs.rmSync(root, { recursive: true, force: true }); });

const messages: ChatMessage[] = [
  { role: 'user', content: 'What is distillation?' },
  { role: 'assistant', content: 'Training a small model\non a big one.' },
  { role: 'user', content: 'Why?' },
];

const WITH_SYSTEM = "{%- if messages[0]['role'] != 'system' -%}{{- '<|im_start|>system\\nYou answer in one line.<|im_end|>\\n' -}}{%- endif -%}"
  + "{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}{%- endfor -%}"
  + "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

test('transformers.js applies the exported chat template exactly as distillery renders chat', async (t) => {
  if (!tjs) { t.skip(`${PKG} is not installed`); return; }
  const tok = tinyTokenizer();
  const cfg = { ...presetConfig('tiny', tok.vocabSize), eosTokenId: tok.eosId };
  const w = initialWeights(parameterLayout(cfg), cfg, new Rng(1));
  writeCheckpoint(path.join(root, 'plain'), cfg, w, { dtype: 'f32', tokenizerJson: tok.toJSON() });
  writeCheckpoint(path.join(root, 'system'), cfg, w, { dtype: 'f32', tokenizerJson: tok.toJSON(), chatTemplate: WITH_SYSTEM });
  for (const [name, format] of [['plain', DEFAULT_CHAT_FORMAT], ['system', chatFormatOf(WITH_SYSTEM, 'test')]] as const) {
    const hf = await tjs.AutoTokenizer.from_pretrained(name);
    for (const gen of [false, true]) {
      const got = hf.apply_chat_template(messages, { tokenize: false, add_generation_prompt: gen });
      const want = renderChat(format, messages, { addGenerationPrompt: gen });
      assert.equal(got, want, `${name}, generation prompt ${gen}`);
      assert.deepEqual(Array.from(hf.encode(got, { add_special_tokens: false })), tok.encode(want), `${name}: ids`);
    }
  }
});
