/**
 * Chat formats. A Hub model's chat template (tokenizer_config.json `chat_template`, or a chat_template.jinja file)
 * is a Jinja program; distillery does not run Jinja, it recognizes the ChatML family and renders that itself:
 *
 *   [<|im_start|>system\n{default system prompt}<|im_end|>\n]   when the template has a literal default system turn
 *   <|im_start|>{role}\n{content}<|im_end|>\n                   per message
 *   <|im_start|>assistant\n                                      with a generation prompt
 *
 * A template is ChatML when it writes both `<|im_start|>` and `<|im_end|>` (Qwen2/2.5/3 and most small chat models).
 * Its default system prompt is taken when the template holds it as one literal string
 * (`'<|im_start|>system\n...<|im_end|>\n'`, as Qwen2.5's does) and is used when a conversation has no system turn.
 * Template extras (tools, reasoning blocks) are not rendered. Any other template (Llama 3 headers, ...) is
 * reported as such, and rendering chat with it is refused with a clear error: nothing is silently re-formatted.
 *
 * Exports carry CHATML_TEMPLATE (a plain ChatML Jinja template, no default system prompt) when the tokenizer has
 * the ChatML tokens and no template came with the model, so transformers.js can `apply_chat_template`.
 */
import { DistilleryError } from '../util/errors.js';

export interface ChatMessage {
  role: string;
  content: string;
}

export type ChatFormat =
  | { kind: 'chatml'; defaultSystem: string | null; template: string | null; from: string }
  | { kind: 'other'; template: string; from: string };

/** A plain ChatML template (Jinja, as transformers / transformers.js `apply_chat_template` run it). */
export const CHATML_TEMPLATE = [
  "{%- for message in messages -%}",
  "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}",
  "{%- endfor -%}",
  "{%- if add_generation_prompt -%}",
  "{{- '<|im_start|>assistant\\n' -}}",
  "{%- endif -%}",
].join('\n');

/** ChatML with no default system prompt: what distillery uses when a model comes with no template. */
export const DEFAULT_CHAT_FORMAT: ChatFormat = { kind: 'chatml', defaultSystem: null, template: null, from: 'the default ChatML format' };

function unescapeJinjaString(s: string): string {
  return s.replace(/\\(n|t|r|'|"|\\)/g, (_, c: string) => (c === 'n' ? '\n' : c === 't' ? '\t' : c === 'r' ? '\r' : c));
}

/** Classifies a chat template (null/undefined: none, the default ChatML). `from` names where it came from. */
export function chatFormatOf(template: string | null | undefined, from: string): ChatFormat {
  if (template === null || template === undefined || template === '') return DEFAULT_CHAT_FORMAT;
  if (!template.includes('<|im_start|>') || !template.includes('<|im_end|>')) return { kind: 'other', template, from };
  const m = /<\|im_start\|>system\\n([^'"+{}%]*?)<\|im_end\|>/.exec(template);
  return { kind: 'chatml', defaultSystem: m ? unescapeJinjaString(m[1]!) : null, template, from };
}

/**
 * Renders a conversation (the data's `{"messages": [...]}` lines, generate --chat). Throws a DistilleryError for a
 * template that is not ChatML.
 */
export function renderChat(format: ChatFormat, messages: readonly ChatMessage[], opts: { addGenerationPrompt?: boolean } = {}): string {
  if (format.kind !== 'chatml') {
    throw new DistilleryError(`the chat template of ${format.from} is not ChatML (it does not write <|im_start|> and <|im_end|>); distillery renders ChatML only`,
      'render the conversations with the model\'s own template beforehand (e.g. apply_chat_template in Python) and pass them as {"text": ...} lines or a plain prompt');
  }
  let out = '';
  if (format.defaultSystem !== null && messages[0]?.role !== 'system') out += `<|im_start|>system\n${format.defaultSystem}<|im_end|>\n`;
  for (const m of messages) out += `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`;
  if (opts.addGenerationPrompt) out += '<|im_start|>assistant\n';
  return out;
}

/** A tokenizer_config.json `chat_template` value: a string, or a list of {name, template} (the 'default' one). */
export function chatTemplateFromConfig(v: unknown): string | null {
  if (typeof v === 'string') return v;
  if (Array.isArray(v)) {
    const named = v as Array<{ name?: unknown; template?: unknown }>;
    const d = named.find((t) => t && t.name === 'default') ?? named[0];
    return d && typeof d.template === 'string' ? d.template : null;
  }
  return null;
}
