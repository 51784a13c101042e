/**
 * Chat templates, run as Jinja. A model's chat template (tokenizer_config.json `chat_template`, or a
 * chat_template.jinja file) is rendered with @huggingface/jinja (the engine transformers.js runs
 * `apply_chat_template` with), with the variables transformers passes: `messages` (as given: tool_calls,
 * reasoning_content and any other fields included), `add_generation_prompt`, `bos_token`, `eos_token` (from
 * tokenizer_config.json), `tools` where the data has them, and the user's template options (`--chat-template-kwargs`,
 * e.g. `{"enable_thinking": false}`) as further top-level variables; `raise_exception(msg)` and `strftime_now(fmt)` are
 * defined as in transformers. A model without a template renders with CHATML_TEMPLATE.
 *
 * Assistant spans (the tokens the loss counts on chat data, renderChatWithSpans): where the template marks the
 * assistant's output with `{% generation %}...{% endgeneration %}` (transformers' `return_assistant_tokens_mask`), the
 * marked text; otherwise each assistant message's text found by rendering prefixes: the conversation up to it with a
 * generation prompt, then with it; what it adds is the reply and its end-of-turn marker (trailing whitespace after the
 * marker excluded). Where the prefixes do not render as prefixes of the whole conversation (Qwen3's template drops
 * the reasoning of earlier turns), the reply is located in the whole rendering: the longest tail (whole lines) of
 * what its own prefix rendering added that appears after the previous span (holding the reply's content).
 */
import { Template } from '@huggingface/jinja';
import { installPythonSemantics } from './jinja-python.js';
import { DistilleryError } from '../util/errors.js';
import { pyRstrip, pyStripSpace } from '../util/py-space.js';

/** One message of a conversation: role and content, plus whatever else the data gives (tool_calls, reasoning_content, ...). */
export interface ChatMessage {
  role: string;
  content: string | null;
  [field: string]: unknown;
}

export interface ChatFormat {
  /** The Jinja source. */
  template: string;
  /** Where it came from (for errors), e.g. `runs/t/final's tokenizer_config.json`. */
  from: string;
  /** No template came with the model: the default ChatML one. */
  isDefault: boolean;
  bosToken: string;
  eosToken: string;
  /** A named template list's `tool_use` entry: what transformers renders a conversation with tools with. */
  toolTemplate?: string;
  /**
   * The names of a model's templates when none is the default (`template` is then ''): transformers renders only a
   * conversation with tools (with `tool_use`) and refuses the rest, as renderChat does.
   */
  noDefault?: string[];
}

export interface ChatRenderOptions {
  addGenerationPrompt?: boolean;
  /** The conversation's tool definitions (transformers passes `tools` only when given). */
  tools?: unknown[] | null;
  /** Template options (`--chat-template-kwargs`), top-level variables such as enable_thinking. */
  kwargs?: Record<string, unknown>;
  /** The clock strftime_now reads (tests fix it; default now). */
  now?: Date;
  /**
   * End the text inside the last message, which generation continues (transformers' continue_final_message; with
   * addGenerationPrompt false): the template's own end of that turn is cut off.
   */
  continueFinalMessage?: boolean;
}

/** A plain ChatML template (Jinja, as transformers / transformers.js `apply_chat_template` run it). */
export const CHATML_TEMPLATE = [
  "{%- for message in messages -%}",
  "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' -}}",
  "{%- endfor -%}",
  "{%- if add_generation_prompt -%}",
  "{{- '<|im_start|>assistant\\n' -}}",
  "{%- endif -%}",
].join('\n');

/** The default ChatML format (models without a template). */
export const DEFAULT_CHAT_FORMAT: ChatFormat = { template: CHATML_TEMPLATE, from: 'the default ChatML template', isDefault: true, bosToken: '', eosToken: '' };

/** A special token as tokenizer_config.json writes it: a string or an AddedToken object `{content: ...}`. */
function tokenString(v: unknown): string {
  if (typeof v === 'string') return v;
  if (v && typeof v === 'object' && typeof (v as { content?: unknown }).content === 'string') return (v as { content: string }).content;
  return '';
}

/**
 * The chat format of a model: its template (null/undefined/empty: the default ChatML one) with the bos/eos token
 * strings of its tokenizer_config.json. `from` names where the template came from.
 */
export function chatFormatOf(template: string | null | undefined, from: string, tokenizerConfig?: Record<string, unknown> | null): ChatFormat {
  const bosToken = tokenString(tokenizerConfig?.bos_token), eosToken = tokenString(tokenizerConfig?.eos_token);
  // tokenizer_config.json's list of named templates (additional_chat_templates/ reads into one: readModelDirExtras):
  // transformers takes "tool_use" for a conversation with tools, else "default"
  const named = Array.isArray(tokenizerConfig?.chat_template) ? tokenizerConfig.chat_template as Array<{ name?: unknown; template?: unknown }> : [];
  const tool = named.find((t) => t && t.name === 'tool_use' && typeof t.template === 'string');
  if (template === null || template === undefined || template === '') {
    if (named.length > 0 && !named.some((t) => t && t.name === 'default')) {
      return { template: '', from, isDefault: false, bosToken, eosToken, noDefault: named.map((t) => String(t?.name)),
        ...(tool ? { toolTemplate: tool.template as string } : {}) };
    }
    return { ...DEFAULT_CHAT_FORMAT, bosToken, eosToken };
  }
  const isDefaultEntry = named.some((t) => t && t.name === 'default' && t.template === template);
  return { template, from, isDefault: false, bosToken, eosToken, ...(tool && isDefaultEntry ? { toolTemplate: tool.template as string } : {}) };
}

/** A short description for `inspect`. */
/** The tokens that end a turn in the chat templates distillery runs (ChatML's, Llama 3's), by their text. */
export const END_OF_TURN_TOKENS = ['<|im_end|>', '<|eot_id|>'] as const;

/** The ids of END_OF_TURN_TOKENS that a tokenizer holds: where a generated reply stops. */
export function endOfTurnIds(tokenizer: { tokenToId(token: string): number | undefined }): number[] {
  return END_OF_TURN_TOKENS.map((t) => tokenizer.tokenToId(t)).filter((id): id is number => id !== undefined);
}

/**
 * Conversations rendered with the default ChatML template (the model has no chat template) need the tokenizer's
 * <|im_start|> and <|im_end|> tokens: without them the turn markers would be trained as plain text, which generation
 * cannot stop on (transformers refuses a chat without a template).
 */
export function checkChatTokens(chat: ChatFormat, docs: ReadonlyArray<{ conversation?: boolean }>, tokenizer: { tokenToId(t: string): number | undefined }): void {
  if (!chat.isDefault || !docs.some((d) => d.conversation === true)) return;
  const missing = ['<|im_start|>', '<|im_end|>'].filter((t) => tokenizer.tokenToId(t) === undefined);
  if (missing.length === 0) return;
  throw new DistilleryError(`the data has conversations, but the model has no chat template and its tokenizer has no ${missing.join(' or ')} token for the default ChatML one`,
    'give the model a chat template (tokenizer_config.json "chat_template", or chat_template.jinja beside it), or render the conversations yourself and pass {"text": ...} lines');
}

export function describeChatFormat(f: ChatFormat): string {
  if (f.isDefault) return 'none (chat renders with plain ChatML)';
  if (f.noDefault) return `named templates only (${f.noDefault.join(', ')}), no default one`;
  const kind = /\{%-?\s*generation\s*-?%\}/.test(f.template) ? ', marks assistant output ({% generation %})' : '';
  const family = f.template.includes('<|im_start|>') ? 'ChatML-style' : f.template.includes('<|start_header_id|>') ? 'Llama 3-style' : 'Jinja';
  return `${family} Jinja template (${f.template.length} characters${kind})`;
}

const MONTHS = ['January', 'February', 'March', 'April', 'May', 'June', 'July', 'August', 'September', 'October', 'November', 'December'];
const DAYS = ['Sunday', 'Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday'];

/** Python's datetime.strftime for the directives chat templates use (local time, English names). */
export function strftime(d: Date, fmt: string): string {
  const p2 = (n: number): string => String(n).padStart(2, '0');
  return fmt.replace(/%([a-zA-Z%])/g, (m, c: string) => {
    switch (c) {
      case 'd': return p2(d.getDate());
      case 'm': return p2(d.getMonth() + 1);
      case 'Y': return String(d.getFullYear());
      case 'y': return p2(d.getFullYear() % 100);
      case 'B': return MONTHS[d.getMonth()]!;
      case 'b': return MONTHS[d.getMonth()]!.slice(0, 3);
      case 'A': return DAYS[d.getDay()]!;
      case 'a': return DAYS[d.getDay()]!.slice(0, 3);
      case 'H': return p2(d.getHours());
      case 'M': return p2(d.getMinutes());
      case 'S': return p2(d.getSeconds());
      case '%': return '%';
      default: return m;
    }
  });
}

// Python's semantics where the engine differs: str.strip(chars) and printing (src/tokenizer/jinja-python.ts)
installPythonSemantics();

const compiled = new Map<string, Template>();

/**
 * The engine declares raise_exception and strftime_now itself (its own clock, its own error); the template's calls are
 * renamed to ours, so that a refusal is reported as one and strftime_now reads the render's clock (tests fix it).
 */
const OWN_GLOBALS = /\b(raise_exception|strftime_now)\b/g;

function compile(f: ChatFormat, source: string): Template {
  let t = compiled.get(source);
  if (!t) {
    try {
      t = new Template(source.replace(OWN_GLOBALS, 'distillery_$1'));
    } catch (e) {
      throw new DistilleryError(`the chat template of ${f.from} cannot be parsed: ${(e as Error).message}`,
        'fix the template (tokenizer_config.json "chat_template" or chat_template.jinja), or render the conversations beforehand and pass {"text": ...} lines');
    }
    compiled.set(source, t);
  }
  return t;
}

function run(f: ChatFormat, source: string, messages: readonly ChatMessage[], o: ChatRenderOptions): string {
  if (f.isDefault && messages.some((m) => Array.isArray(m.tool_calls) && m.tool_calls.length > 0)) {
    throw new DistilleryError(`${f.from} does not render tool calls (a message has tool_calls)`,
      'give the model a chat template that renders them (tokenizer_config.json chat_template, e.g. Qwen2.5 Instruct\'s), or drop the tool calls');
  }
  const t = compile(f, source);
  const now = o.now ?? new Date();
  const vars: Record<string, unknown> = {
    ...(o.kwargs ?? {}),
    messages: messages.map((m) => ({ ...m })),
    add_generation_prompt: o.addGenerationPrompt ?? false,
    bos_token: f.bosToken, eos_token: f.eosToken,
    distillery_raise_exception: (msg: unknown): never => {
      throw new DistilleryError(`the chat template of ${f.from} refused the conversation: ${String(msg)}`,
        'check the conversation\'s roles and order against what the model\'s template accepts');
    },
    distillery_strftime_now: (fmt: unknown): string => strftime(now, String(fmt)),
  };
  // transformers passes tools and documents always (None when not given): `tools is not none` reads them
  vars.tools = o.tools ?? null;
  vars.documents = null;
  try {
    return t.render(vars);
  } catch (e) {
    if (e instanceof DistilleryError) throw e;
    throw new DistilleryError(`the chat template of ${f.from} failed on a conversation: ${(e as Error).message}`,
      'check the conversation (roles, content types, tool calls) against what the template expects');
  }
}

/** Renders a conversation with the format's template (the data's chat lines, generate --chat). */
export function renderChat(format: ChatFormat, messages: readonly ChatMessage[], opts: ChatRenderOptions = {}): string {
  const f = formatFor(format, opts);
  return opts.continueFinalMessage ? continued(f, messages, opts) : run(f, f.template, messages, opts);
}

/** A conversation whose final message the template cannot end inside (transformers' ValueError; not a template refusal to retry). */
export class ChatContinueError extends DistilleryError {}

/** transformers' marker for continue_final_message: put after the last message's text, the rendering is cut where it lands. */
const CONTINUE_TAG = 'CONTINUE_FINAL_MESSAGE_TAG ';

/**
 * A rendering that ends inside the last message, as transformers' apply_chat_template(continue_final_message=True)
 * makes it: the marker appended to that message's text, the conversation rendered, then cut at the marker's last
 * appearance (and, where the template trimmed the space after the marker, the trailing whitespace before it too). A
 * template that drops the message's text or the marker is refused, as transformers refuses it.
 */
function continued(f: ChatFormat, messages: readonly ChatMessage[], opts: ChatRenderOptions): string {
  if (opts.addGenerationPrompt) throw new Error('renderChat: continueFinalMessage goes without addGenerationPrompt (transformers refuses both)');
  // transformers looks for the field it continues ("content") in the template's source first
  if (!f.template.includes('content')) throw new ChatContinueError(`the chat template of ${f.from} never reads a message's content, so the final message cannot be continued (transformers refuses it too)`, 'use a template that renders the messages\' text, or evaluate without the chat template');
  const last = messages.at(-1);
  if (!last || typeof last.content !== 'string') {
    throw new DistilleryError('continuing the final message needs a last message with text', 'end the conversation with the turn to continue (e.g. an assistant turn holding the start of the answer)');
  }
  const text = run(f, f.template, [...messages.slice(0, -1), { ...last, content: last.content + CONTINUE_TAG }], { ...opts, addGenerationPrompt: false });
  const tag = CONTINUE_TAG.trim(), at = text.lastIndexOf(tag);
  if (!text.includes(pyStripSpace(last.content)) || at < 0) {
    throw new ChatContinueError(`the chat template of ${f.from} drops part of the final message, so it cannot be continued (transformers refuses it too)`,
      'use a template that renders the last turn\'s text as given, or evaluate without the chat template');
  }
  return text.slice(at, at + CONTINUE_TAG.length) === CONTINUE_TAG ? text.slice(0, at) : pyRstrip(text.slice(0, at));
}

/** The format a conversation renders with: the `tool_use` template when it has tools and the model names one. */
function formatFor(format: ChatFormat, opts: ChatRenderOptions): ChatFormat {
  if (!opts.tools || format.toolTemplate === undefined) {
    if (format.noDefault) {
      throw new DistilleryError(`${format.from} has named chat templates (${format.noDefault.join(', ')}) but no default one, which a conversation${opts.tools ? '' : ' without tools'} renders with (transformers refuses it too)`,
        'add the default template (chat_template.jinja, or a "default" entry in tokenizer_config.json\'s chat_template list)');
    }
    return format;
  }
  const { toolTemplate, ...rest } = format;
  return { ...rest, template: toolTemplate, from: `${format.from} (its tool_use template)` };
}

const GEN_OPEN = /\{%(-?)\s*generation\s*(-?)%\}/g;
const GEN_CLOSE = /\{%(-?)\s*endgeneration\s*(-?)%\}/g;
const MARK_OPEN = '\u0002', MARK_CLOSE = '\u0003';

/** A rendering and the [start, end) character ranges of the assistant's replies in it (see the module comment). */
export interface RenderedChat { text: string; assistant: Array<[number, number]> }

export function renderChatWithSpans(given: ChatFormat, messages: readonly ChatMessage[], opts: ChatRenderOptions = {}): RenderedChat {
  const format = formatFor(given, opts);
  const marked = GEN_OPEN.test(format.template);
  GEN_OPEN.lastIndex = 0;
  const clean = !holdsControl(messages, MARK_OPEN) && !holdsControl(messages, MARK_CLOSE);
  if (marked && clean) {
    // Each marker becomes an `if` block that prints a sentinel character: block tags keep the marker's whitespace
    // control (its `-`, trim_blocks and lstrip_blocks act as they would on {% generation %}).
    const source = format.template
      .replace(GEN_OPEN, (_m, a: string, b: string) => `{%${a} if true ${b}%}${MARK_OPEN}{% endif %}`)
      .replace(GEN_CLOSE, (_m, a: string, b: string) => `{%${a} if true ${b}%}${MARK_CLOSE}{% endif %}`);
    const raw = run(format, source, messages, opts);
    let text = '';
    const assistant: Array<[number, number]> = [];
    let open = -1;
    for (const ch of raw) {
      if (ch === MARK_OPEN) open = text.length;
      else if (ch === MARK_CLOSE) { if (open >= 0 && text.length > open) assistant.push([open, text.length]); open = -1; } else text += ch;
    }
    return { text, assistant };
  }
  const text = run(format, format.template, messages, opts);
  const assistant: Array<[number, number]> = [];
  let cursor = 0;
  let regions: Array<[number, number]> | null | undefined;
  messages.forEach((m, i) => {
    if (m.role !== 'assistant') return;
    const before = run(format, format.template, messages.slice(0, i), { ...opts, addGenerationPrompt: true });
    const upto = run(format, format.template, messages.slice(0, i + 1), { ...opts, addGenerationPrompt: false });
    // Where the reply starts in `upto`: after the generation prompt; or, when the reply does not begin with it (Qwen3
    // with enable_thinking off prompts an empty think block, a reply with reasoning fills it), after the role header:
    // the first line of what the prompt and the reply share.
    let start = -1;
    if (upto.startsWith(before)) start = before.length;
    else {
      const base = run(format, format.template, messages.slice(0, i), { ...opts, addGenerationPrompt: false });
      if (upto.startsWith(base)) {
        const p = before.slice(base.length), r = upto.slice(base.length);
        let k = 0;
        while (k < p.length && k < r.length && p[k] === r[k]) k++;
        const nl = p.slice(0, k).indexOf('\n');
        start = base.length + (nl >= 0 ? nl + 1 : k);
      }
    }
    const added = start >= 0 ? upto.slice(start) : null;
    let span: [number, number] | null = null;
    if (added !== null && text.startsWith(upto) && start >= cursor) {
      span = [start, start + added.trimEnd().length];
    } else if (added !== null) {
      // Not prefix-stable (the template renders a turn differently once later turns follow it, e.g. Qwen3 drops the
      // reasoning of earlier turns): the longest tail of the reply's own rendering (whole lines, through its end
      // marker, not starting on a blank line: that would take the role header's newline) found in the whole text, in
      // this message's own region (between the neighbouring messages' contents, where they could be located: a user
      // turn or another reply with the same words is never taken) and after the previous span. The tail must hold
      // the reply's visible content (what follows its reasoning); a reply without content (a tool call) needs a tail
      // of two lines or more.
      regions ??= messageRegions(format, messages, opts, text);
      const [lo, hi] = regions?.[i] ?? [0, text.length];
      const content = typeof m.content === 'string' ? visibleContent(m.content) : '';
      const lines = added.trimEnd().split('\n');
      for (let k = 0; k < lines.length && !span; k++) {
        if (lines[k] === '') continue;
        const tail = lines.slice(k).join('\n');
        if (content ? !tail.includes(content) : lines.length - k < 2) break;
        const at = text.indexOf(tail, Math.max(cursor, lo));
        if (at >= 0 && at + tail.length <= hi) span = [at, at + tail.length];
      }
    }
    if (span && span[1] > span[0]) { assistant.push(span); cursor = span[1]; }
  });
  return { text, assistant };
}

/** The part of a message's content a template shows of an earlier turn: after its reasoning (`</think>`), trimmed. */
function visibleContent(c: string): string {
  const [a, b] = visibleRange(c);
  return c.slice(a, b);
}

/** Where the visible part of a content lies: after its last `</think>` and the blank space after it, before trailing blank space. */
function visibleRange(c: string): [number, number] {
  const cut = c.lastIndexOf('</think>');
  let a = cut >= 0 ? cut + '</think>'.length : 0;
  while (a < c.length && /\s/.test(c[a]!)) a++;
  return [a, Math.max(a, c.trimEnd().length)];
}

/** Whether any string in the messages holds the control character c (JSON writes it escaped, as \u00XX). */
function holdsControl(messages: readonly ChatMessage[], c: string): boolean {
  return JSON.stringify(messages).includes(`\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

/** Sentinels around each message's visible content while locating the messages in a rendering. */
const CONTENT_OPEN = '\u0004', CONTENT_CLOSE = '\u0005';

/**
 * Per message, the region of `text` (the whole conversation's rendering) it may occupy: from the end of the previous
 * message's visible content to the start of the next one's. Found by rendering the conversation with sentinels around
 * every visible content (after any reasoning and leading blank space, before trailing blank space); null when the
 * template does not render each sentinel once and otherwise the same text (then no region is known).
 */
function messageRegions(format: ChatFormat, messages: readonly ChatMessage[], opts: ChatRenderOptions, text: string): Array<[number, number]> | null {
  if (holdsControl(messages, CONTENT_OPEN) || holdsControl(messages, CONTENT_CLOSE)) return null;
  const marked = messages.map((m) => {
    if (typeof m.content !== 'string') return m;
    const c = m.content, [a, b] = visibleRange(c);
    return { ...m, content: c.slice(0, a) + CONTENT_OPEN + c.slice(a, b) + CONTENT_CLOSE + c.slice(b) };
  });
  let raw: string;
  try { raw = run(format, format.template, marked, opts); } catch { return null; }
  let out = '';
  const opens: number[] = [], closes: number[] = [];
  for (const ch of raw) {
    if (ch === CONTENT_OPEN) opens.push(out.length);
    else if (ch === CONTENT_CLOSE) closes.push(out.length);
    else out += ch;
  }
  const withContent = messages.map((m, i) => (typeof m.content === 'string' ? i : -1)).filter((i) => i >= 0);
  if (out !== text || opens.length !== withContent.length || closes.length !== withContent.length) return null;
  const bounds = new Map<number, [number, number]>(withContent.map((i, k) => [i, [opens[k]!, closes[k]!]]));
  return messages.map((_, i) => {
    let lo = 0, hi = text.length;
    for (let j = i - 1; j >= 0; j--) { const b = bounds.get(j); if (b) { lo = b[1]; break; } }
    for (let j = i + 1; j < messages.length; j++) { const b = bounds.get(j); if (b) { hi = b[0]; break; } }
    return [lo, hi];
  });
}

/** A tokenizer_config.json `chat_template` value: a string, or a list of {name, template} (the 'default' one). */
export function chatTemplateFromConfig(v: unknown): string | null {
  if (typeof v === 'string') return v;
  if (Array.isArray(v)) {
    // transformers' named templates: the one called "default" (none: no default, chatFormatOf)
    const d = (v as Array<{ name?: unknown; template?: unknown }>).find((t) => t && t.name === 'default');
    return d && typeof d.template === 'string' ? d.template : null;
  }
  return null;
}

/**
 * The renderer a run gives the data loader: the model's template with the run's template options; under
 * `lossOn: 'assistant'` it also gives the assistant replies' spans (the tokens the loss counts).
 */
export function chatRenderer(format: ChatFormat, o: { lossOn: 'assistant' | 'all'; kwargs?: Record<string, unknown> | undefined }):
  (messages: readonly ChatMessage[], tools: unknown[] | null, rowKwargs?: Record<string, unknown> | null) => string | RenderedChat {
  return (messages, tools, rowKwargs) => {
    // a line's own chat_template_kwargs (TRL's column) over the run's --chat-template-kwargs
    const kwargs = rowKwargs ? { ...(o.kwargs ?? {}), ...rowKwargs } : o.kwargs;
    const base: ChatRenderOptions = kwargs ? { kwargs } : {};
    const opts = tools ? { ...base, tools } : base;
    return o.lossOn === 'assistant' ? renderChatWithSpans(format, messages, opts) : renderChat(format, messages, opts);
  };
}

/**
 * A tokenizer_config.json with `template` as its chat template: a list of named templates keeps its other entries
 * (tool_use, ...) with `template` as the default; otherwise chat_template becomes `template`.
 */
export function withChatTemplate(tokenizerConfig: Record<string, unknown>, template: string): Record<string, unknown> {
  const v = tokenizerConfig.chat_template;
  if (Array.isArray(v) && v.length > 0) {
    const rest = (v as Array<{ name?: unknown }>).filter((t) => !(t && t.name === 'default'));
    return { ...tokenizerConfig, chat_template: [{ name: 'default', template }, ...rest] };
  }
  return { ...tokenizerConfig, chat_template: template };
}
