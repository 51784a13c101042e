/**
 * Items into tokens as lm-evaluation-harness's HF backend makes them (ChoiceEncoder): text is encoded as transformers'
 * tokenizer.encode encodes it, with the tokenizer's own special tokens (Llama 3's BOS; none for Qwen); whitespace at the
 * end of the context moves to the start of the continuation, and the continuation's tokens are those of context +
 * continuation past the context's, so a merge across the boundary is scored as the whole's tokens. An empty context is
 * the prefix token alone (tokenizer_config.json's bos_token, else its eos_token). A multiple-choice item's continuation
 * is `delimiter + choice` (the harness's `target_delimiter`, a space by default); a continuation item's goes as
 * written; a text item's tokens are cut into the harness's rolling windows (rollingWindows). encodeForModel builds each
 * item's prompt first (src/eval/fewshot.ts: description, examples, context; as text or chat turns).
 */
import type { Tokenizer } from '../tokenizer/bpe.js';
import { DistilleryError, InputError } from '../util/errors.js';
import { ChatContinueError, renderChat, type ChatFormat } from '../tokenizer/chat.js';
import { choiceTurns, promptTurns, turnsMessages, turnsText, type FewshotOptions } from './fewshot.js';
import { PY_TRAILING_SPACE, type ChoiceItem } from './items.js';

/** tokenizer_config.json's special tokens as strings ('' where it has none), e.g. ChatFormat's bosToken / eosToken. */
export interface SpecialTokens { bosToken: string; eosToken: string }

/**
 * Encodes text as lm-evaluation-harness's HF backend does (`HFLM.tok_encode` with its default `add_bos_token=None`):
 * transformers' `tokenizer.encode(text)` with the tokenizer's own special tokens (its post-processor's: Llama 3's
 * `<|begin_of_text|>`, nothing for Qwen), except for text that already starts with the prefix token's text.
 */
export class ChoiceEncoder {
  private prefix: { id: number; text: string } | null | undefined;
  constructor(readonly tok: Tokenizer, private readonly special: SpecialTokens) {}

  /**
   * The harness's `prefix_token_id`, put before an empty context: tokenizer_config.json's bos_token, else its eos_token
   * (else, for a folder without one, the tokenizer's BOS or end-of-text token by name); null when there is none.
   */
  prefixToken(): { id: number; text: string } | null {
    if (this.prefix === undefined) {
      const named = [this.special.bosToken, this.special.eosToken].find((t) => t !== '' && this.tok.tokenToId(t) !== undefined);
      const id = named !== undefined ? this.tok.tokenToId(named)! : this.tok.bosId ?? this.tok.eosId;
      this.prefix = id === undefined ? null : { id, text: this.tok.idToToken(id)! };
    }
    return this.prefix;
  }

  /** transformers' tokenizer.encode(text) (add_special_tokens: the tokenizer's own, unless the text starts with the prefix token's text). */
  encode(text: string, specialTokens = true): number[] {
    const ids = this.tok.encode(text);
    const p = this.prefixToken();
    if (!specialTokens || (p !== null && text.startsWith(p.text))) return ids;
    const { documentPrefix: pre, documentSuffix: suf } = this.tok;
    return pre.length || suf.length ? [...pre, ...ids, ...suf] : ids;
  }

  /**
   * The context's and the continuation's tokens as the harness splits them: an empty context (or one of whitespace
   * alone, which the harness cannot score) is the prefix token, the continuation encoded without special tokens (the
   * prefix taken from its start when it begins with it); otherwise (its `_encode_pair`) trailing whitespace of the
   * context moves to the continuation, and the continuation's tokens are the whole's past the context's.
   */
  pair(context: string, continuation: string, where: string): { ctx: number[]; cont: number[] } {
    const trimmed = context.replace(PY_TRAILING_SPACE, '');
    const cont = context.slice(trimmed.length) + continuation;
    if (trimmed === '') {
      const p = this.prefixToken();
      if (p === null) throw new InputError(`${where}: an empty context needs a token to stand for it, and the tokenizer has no BOS or end-of-text token`, 'give the item a context');
      const ids = this.encode(cont, false);
      return ids[0] === p.id ? { ctx: ids.slice(0, 1), cont: ids.slice(1) } : { ctx: [p.id], cont: ids };
    }
    const whole = this.encode(trimmed + cont);
    const ctx = this.encode(trimmed);
    return { ctx, cont: whole.slice(ctx.length) };
  }
}

/** One (item, choice) pair's tokens, uncut. */
export interface EncodedChoice { item: number; choice: number; ctx: number[]; cont: number[] }

/**
 * Every item's choices encoded: the context (`context(item, index, choice)`, default the item's own, a multiple-input
 * item's choice-th context; its prompt with a description, examples or a chat template: encodeForModel) and
 * `delimiter + choice` (a continuation item's continuation as written; a multiple-input item's `delimiter + shared`).
 */
export function encodeChoices(enc: ChoiceEncoder, items: readonly ChoiceItem[], delimiterOf: string | ((it: ChoiceItem) => string),
  context: (it: ChoiceItem, i: number, k: number) => string = (it, _i, k) => (it.shared !== undefined ? it.choices[k]! : it.context), window?: number): EncodedChoice[] {
  const out: EncodedChoice[] = [];
  items.forEach((it, i) => {
    const delimiter = typeof delimiterOf === 'string' ? delimiterOf : delimiterOf(it);
    if (it.rolling) {
      if (window === undefined) throw new Error('text items need the rolling window');
      const p = enc.prefixToken();
      if (p === null) throw new InputError(`${it.where}: a text is scored after a token that stands for its start, and the tokenizer has no BOS or end-of-text token`, 'score it as a continuation item with a context instead');
      rollingWindows(enc.encode(it.choices[0]!), p.id, window).forEach(([ctx, cont], w) => out.push({ item: i, choice: w, ctx, cont }));
      return;
    }
    const c = it.shared === undefined ? context(it, i, 0) : '';
    it.choices.forEach((ch, k) => {
      // a loglikelihood task's target goes as written (the harness puts target_delimiter before choices only); a
      // multiple-input item scores its one continuation after each of its contexts
      const { ctx, cont } = it.shared !== undefined ? enc.pair(context(it, i, k), delimiter + it.shared, it.where)
        : enc.pair(c, (it.continuation ? '' : delimiter) + ch, it.where);
      if (cont.length === 0) throw new InputError(`${it.where}: ${it.continuation || it.shared !== undefined ? 'the continuation' : `choice ${k}`} encodes to no tokens past the context`, 'check its text');
      out.push({ item: i, choice: k, ctx, cont });
    });
  });
  return out;
}

/**
 * The harness's rolling windows of a text's tokens (utils.get_rolling_token_windows with context_len 1, then
 * make_disjoint_window, as HFLM.loglikelihood_rolling calls them): [context, scored tokens] pairs. The first window
 * scores the first `window` tokens after `prefix`; each later one the next `window` (the last: what is left), after as
 * many of the tokens before them as fill the window's inputs (one, but for the last).
 */
export function rollingWindows(tokens: readonly number[], prefix: number, window: number): Array<[number[], number[]]> {
  if (!(Number.isInteger(window) && window >= 1)) throw new Error(`rollingWindows: window ${window}`);
  const out: Array<[number[], number[]]> = [];
  if (tokens.length === 0) return out;
  const first = Math.min(window, tokens.length);
  out.push([[prefix], tokens.slice(0, first)]);
  for (let done = first; done < tokens.length;) {
    const len = Math.min(tokens.length - done, window), end = done + len;
    // inputs tokens[end - window - 1, end - 1), of which the ones before the scored tokens are the context
    out.push([tokens.slice(end - window - 1, end - len), tokens.slice(end - len, end)]);
    done = end;
  }
  return out;
}

/** How an item's context is presented, and the delimiter before each choice. */
export interface ChoicePrompt {
  /** As turns of the chat template with the assistant turn opened (the harness's --apply_chat_template). */
  chat: boolean;
  /** The template's options (--chat-template-kwargs). */
  kwargs?: Record<string, unknown> | undefined;
  /** Default: '' with `chat` (the harness drops its target_delimiter then), else ' '. */
  delimiter?: string | undefined;
  /** Examples before each item (src/eval/fewshot.ts; default none). */
  fewshot?: FewshotOptions | undefined;
  /** With `chat` and examples: the examples and the item as one user turn (default: a turn each, the harness's default). */
  singleTurn?: boolean | undefined;
  /** The rolling windows' length for text items (the harness's max_length; required with text items). */
  rollingWindow?: number | undefined;
  /** Before each item's description, in its system turn (the harness's --system_instruction). */
  systemInstruction?: string | undefined;
  /** Where a warning goes (a template that refused the description's system turn). */
  warn?: ((line: string) => void) | undefined;
}

/**
 * Every item's choices encoded for a model: its tokenizer, and its chat format (tokenizer_config.json's special
 * tokens, and its template with `prompt.chat`). The context is the item's prompt (src/eval/fewshot.ts): its
 * description, its examples and its own context, as text or as the chat template's turns.
 */
export function encodeForModel(tok: Tokenizer, format: ChatFormat, items: readonly ChoiceItem[], prompt: ChoicePrompt): EncodedChoice[] {
  return encodeChoices(new ChoiceEncoder(tok, format), items, (it) => choiceDelimiter(it, prompt), itemPrompts(format, items, prompt), prompt.rollingWindow);
}

/**
 * The delimiter before an item's choices (the harness's construct_requests): the target delimiter (default ' '); with
 * the chat template none (default ''), but after a gen_prefix that does not end in whitespace the target delimiter.
 */
export function choiceDelimiter(it: ChoiceItem, prompt: Pick<ChoicePrompt, 'chat' | 'delimiter'>): string {
  if (!prompt.chat) return prompt.delimiter ?? ' ';
  const gp = it.genPrefix;
  return gp && !PY_TRAILING_SPACE.test(gp) ? prompt.delimiter ?? ' ' : prompt.delimiter ?? '';
}

/**
 * Each item's prompt as text, for its choice k (a multiple-input item's k-th context; 0 otherwise): its description,
 * examples and context (src/eval/fewshot.ts), joined as text or rendered by the chat template with the assistant turn
 * opened. A template that refuses the system turn gets the conversation again without it (as the harness retries).
 */
export function itemPrompts(format: ChatFormat, items: readonly ChoiceItem[], prompt: ChoicePrompt): (it: ChoiceItem, i: number, k: number) => string {
  const kwargs = prompt.kwargs;
  // the examples keep the target delimiter in chat mode too (the harness drops it before the scored choice alone)
  const turns = promptTurns(items, prompt.fewshot ?? null, prompt.delimiter ?? ' ', prompt.systemInstruction);
  let warned = false;
  const chat = (i: number, k: number): string => {
    // a gen_prefix is an assistant turn the rendering ends inside (the harness: add_generation_prompt off, transformers'
    // continue_final_message on); otherwise the assistant turn is opened
    const gp = Boolean(items[i]!.genPrefix);
    const opts = { addGenerationPrompt: !gp, continueFinalMessage: gp, ...(kwargs ? { kwargs } : {}) };
    const msgs = turnsMessages(choiceTurns(turns[i]!, items[i]!, k), prompt.singleTurn === true);
    try { return renderChat(format, msgs, opts); } catch (e) {
      // (the harness retries a template's refusal only, not a final message that cannot be continued)
      if (!(e instanceof DistilleryError) || e instanceof ChatContinueError || msgs[0]?.role !== 'system') throw e;
      if (!warned) { warned = true; prompt.warn?.(`warning: ${format.from}'s chat template refused a system turn (${e.message.replace(/^.*refused the conversation: /, '')}): the descriptions go without it, as the harness retries`); }
      return renderChat(format, msgs.slice(1), opts);
    }
  };
  return prompt.chat ? (_it, i, k) => chat(i, k) : (it, i, k) => turnsText(choiceTurns(turns[i]!, it, k));
}
