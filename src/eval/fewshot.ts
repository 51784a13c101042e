/**
 * An item's prompt as lm-evaluation-harness builds it (`ConfigurableTask.fewshot_context` and `build_qa_turn`, as of
 * its 2026 source): the item's description as a system turn, then `n` examples, each a user turn (the example's
 * context) and an assistant turn (its answer), then the item's context as a user turn. As plain text the turns are
 * joined with their delimiters:
 *
 *     description + (context + target_delimiter + answer + fewshot_delimiter) × n + context
 *
 * (the harness's descriptions carry their own trailing "\n\n"); with a chat template the turns go to it as they are
 * (the harness's default `fewshot_as_multiturn` with `--apply_chat_template`), or all but the system turn as one user
 * turn joined as in plain text (`multiturn_to_singleturn`).
 *
 * The examples: `random` (the harness's `default` sampler) draws them with CPython's `random.Random(seed).sample` over
 * the examples' file, one Random per items file (a task: the harness seeds each task's sampler with its few-shot seed,
 * 1234 by default) drawing for its items in file order; from the items' own file it draws n + 1 and drops the item
 * itself (and any item equal to it, compared by value as Python compares the docs), keeping the first n. `first_n`
 * takes the first n examples (MMLU's canonical order), the item itself left out when they are its own file's.
 * An example's answer follows its context after the target delimiter: a multiple-choice example's right choice, a
 * continuation example's continuation (the harness puts the delimiter there too, so LAMBADA's examples read
 * "…  word" with its own leading space). Text items (rolling) get no examples and are none.
 */
import { InputError } from '../util/errors.js';
import type { ChatMessage } from '../tokenizer/chat.js';
import { examplesPairing, itemsByFile, pyIsSpace, type ChoiceItem } from './items.js';
import { PyRandom } from './py-random.js';

/** The harness's few-shot settings (`--num_fewshot`, the task's fewshot_config, `--seed`'s fourth value). */
export interface FewshotOptions {
  /** Examples before each item (num_fewshot; 0: none). */
  n: number;
  /** 'random' (the harness's default sampler) or 'first_n'. */
  sampler: 'random' | 'first_n';
  /** The random sampler's seed (the harness's fewshot_random_seed, default 1234). */
  seed: number;
  /** After each example (fewshot_delimiter, default "\n\n"). */
  delimiter: string;
  /**
   * The examples of each items file, in the files' order (the harness's fewshot_split, another split than the one
   * scored); absent: each file's own items, the item itself left out.
   */
  pools?: ReadonlyArray<readonly ChoiceItem[]> | undefined;
  /**
   * The pools are the items' own files, whole (eval --limit scores the first items of each, and their examples are
   * drawn as without it): the item itself is left out, as with no pools.
   */
  ownPools?: boolean | undefined;
}

export const FEWSHOT_DEFAULTS = { sampler: 'random', seed: 1234, delimiter: '\n\n' } as const;

export const FEWSHOT_SAMPLERS = ['random', 'first_n'] as const;

/** One turn of a prompt, with what follows it when the turns are joined as text (the harness's `Message`). */
export interface PromptTurn { role: 'system' | 'user' | 'assistant'; content: string; after: string }

/**
 * Each item's examples, in the items' order. The items files are told apart by each item's `file` (one group without);
 * `o.pools`, when given, holds one pool per file in the order the files first appear.
 */
export function fewshotExamples(items: readonly ChoiceItem[], o: FewshotOptions): Array<readonly ChoiceItem[]> {
  const groups = itemsByFile(items);
  const pairing = o.pools ? examplesPairing(o.pools.length, groups.length, 'few-shot', 'items') : null;
  if (pairing) throw new InputError(pairing.message, pairing.hint);
  const out: Array<readonly ChoiceItem[]> = new Array<readonly ChoiceItem[]>(items.length);
  groups.forEach(({ idx }, g) => {
    const own = o.pools === undefined || o.ownPools === true;
    // text items (the harness's rolling tasks, scored whole) get no examples and are none
    const pool: readonly ChoiceItem[] = (o.pools ? o.pools[g]! : idx.map((i) => items[i]!)).filter((x) => !x.rolling);
    const rnd = new PyRandom(o.seed);
    const file = items[idx[0]!]!.file ?? 'the items';
    if (o.n === 0) { for (const i of idx) out[i] = []; return; }
    for (const i of idx) {
      const it = items[i]!;
      if (it.rolling) { out[i] = []; continue; }
      const need = o.n + (own ? 1 : 0);
      if (o.sampler === 'first_n') {
        const left = own ? pool.filter((x) => docKey(x) !== docKey(it)) : pool;
        if (left.length < o.n) throw shortPool(o.n, file, left.length, own, it);
        out[i] = left.slice(0, o.n);
        continue;
      }
      if (pool.length < need) throw shortPool(o.n, file, pool.length - (own ? 1 : 0), own, it);
      const drawn = rnd.sample(pool.length, need).map((j) => pool[j]!);
      const kept = own ? drawn.filter((x) => docKey(x) !== docKey(it)).slice(0, o.n) : drawn;
      // the harness asserts here: the item has a twin among the draws, so fewer than n examples are left
      if (kept.length < o.n) {
        throw new InputError(`${it.where}: an item equal to it is among its ${need} drawn examples, so fewer than --fewshot ${o.n} are left (the harness stops here too)`,
          'remove the duplicate lines from the file, or give the examples in a file of their own (--fewshot-from)');
      }
      out[i] = kept;
    }
  });
  return out;
}

function shortPool(n: number, file: string, have: number, own: boolean, it: ChoiceItem): InputError {
  return new InputError(`--fewshot ${n} needs ${n} examples for ${it.where}, and ${own ? `${file} holds ${have} other than the item itself` : `its few-shot file holds ${have}`}`,
    `pass a smaller --fewshot${own ? ', or examples from a file of their own (--fewshot-from)' : ''}`);
}

/** The value Python's `!=` compares docs by: the line's object with its keys sorted (key order does not count). */
export function docKey(it: ChoiceItem): string {
  return it.doc ?? JSON.stringify({ answer: it.answer, choices: it.choices, context: it.context });
}

/**
 * The turns of every item's prompt: [system: description]?, (user: example context, assistant: example answer) × n,
 * user: the item's context. `targetDelimiter` goes between a multiple-choice example's context and its answer (the
 * harness's target_delimiter, which its chat mode keeps for the examples).
 */
export function promptTurns(items: readonly ChoiceItem[], o: FewshotOptions | null, targetDelimiter: string, systemInstruction?: string): PromptTurn[][] {
  const shots = o && o.n > 0 ? fewshotExamples(items, o) : null;
  return items.map((it, i) => {
    const turns: PromptTurn[] = [];
    // the harness's system prompt: maybe_delimit(system_instruction, description, fewshot_delimiter)
    const system = maybeDelimit(systemInstruction ?? '', it.description ?? '', o?.delimiter ?? FEWSHOT_DEFAULTS.delimiter);
    if (system) turns.push({ role: 'system', content: system, after: '' });
    for (const ex of shots?.[i] ?? []) {
      // an example without an answer (a target of "") is its context alone (and its gen_prefix), as the item is
      if (ex.generate?.noAnswer) { turns.push(...questionTurns(ex.context, ex.genPrefix, targetDelimiter)); continue; }
      // the harness's build_qa_turn puts the target delimiter after every example's context, a loglikelihood task's too
      // (with a gen_prefix: only where the two would touch, and the answer after the gen_prefix and a space)
      // a multiple-input example (Winogrande's): its right context, then the continuation they share
      const q = ex.shared !== undefined ? ex.choices[ex.answer]! : ex.context, gp = ex.genPrefix;
      turns.push({ role: 'user', content: q, after: !gp || requiresDelimiter(q, gp) ? targetDelimiter : '' });
      turns.push({ role: 'assistant', content: maybeDelimit(gp ?? '', ex.shared ?? ex.choices[ex.answer]!, ' '), after: o!.delimiter });
    }
    turns.push(...questionTurns(it.context, it.genPrefix, targetDelimiter));
    return turns;
  });
}

/**
 * The turns of a question without its answer (build_qa_turn without one): the user's context, then with a gen_prefix an
 * assistant turn holding it (the target delimiter between them where they would touch), which generation continues.
 */
function questionTurns(q: string, genPrefix: string | undefined, targetDelimiter: string): PromptTurn[] {
  if (!genPrefix) return [{ role: 'user', content: q, after: '' }];
  return [{ role: 'user', content: q, after: requiresDelimiter(q, genPrefix) ? targetDelimiter : '' }, { role: 'assistant', content: genPrefix, after: '' }];
}

/** The harness's requires_delimiter: whether neither string has whitespace where they join (an empty prefix needs none). */
export function requiresDelimiter(prefix: string, suffix: string): boolean {
  if (prefix === '') return false;
  return !(pyIsSpace([...prefix].pop()!) || pyIsSpace([...suffix][0] ?? ''));
}

/**
 * The turns of an item's prompt for its choice k: a multiple-input item's last user turn is its k-th context (the
 * harness's multiple_input_context: the same description and examples before each), any other item's its own.
 */
export function choiceTurns(turns: readonly PromptTurn[], it: ChoiceItem, k: number): readonly PromptTurn[] {
  if (it.shared === undefined) return turns;
  return [...turns.slice(0, -1), { ...turns[turns.length - 1]!, content: it.choices[k]! }];
}

/** The harness's maybe_delimit: prefix + delimiter + suffix, without the delimiter where either has whitespace at the join. */
export function maybeDelimit(prefix: string, suffix: string, delimiter: string): string {
  if (!prefix) return suffix;
  if (!suffix) return prefix;
  return pyIsSpace([...prefix].pop()!) || pyIsSpace([...suffix][0]!) ? prefix + suffix : prefix + delimiter + suffix;
}

/** The turns as plain text (the harness's `messages_to_text`). */
export function turnsText(turns: readonly PromptTurn[]): string {
  return turns.map((t) => t.content + t.after).join('');
}

/**
 * The turns as a chat template's messages: each its own (`fewshot_as_multiturn`, the harness's default with a chat
 * template), or with `singleTurn` the system turn and then one user turn holding the rest as text, the last turn's
 * delimiter dropped (`multiturn_to_singleturn`).
 */
export function turnsMessages(turns: readonly PromptTurn[], singleTurn: boolean): ChatMessage[] {
  const system = turns[0]?.role === 'system' ? [{ role: 'system', content: turns[0].content }] : [];
  const rest = turns.slice(system.length);
  if (!singleTurn) return [...system, ...rest.map((t) => ({ role: t.role, content: t.content }))];
  // a last assistant turn (a gen_prefix) stays a turn of its own after the one user turn
  const last = rest.at(-1)?.role === 'assistant' ? rest.at(-1)! : null, user = last ? rest.slice(0, -1) : rest;
  return [...system, { role: 'user', content: turnsText(user.map((t, k) => (k === user.length - 1 ? { ...t, after: '' } : t))) },
    ...(last ? [{ role: 'assistant', content: last.content }] : [])];
}

/** How the examples were chosen, for a log line: ", 5-shot (random, seed 1234, from dev.jsonl)" ('' without). */
export function fewshotSaid(o: FewshotOptions | undefined, from?: readonly string[]): string {
  if (!o || o.n === 0) return '';
  const how = o.sampler === 'random' ? `random, seed ${o.seed}` : 'the first';
  return `, ${o.n}-shot (${how}, from ${from?.length ? from.join(', ') : 'each file\'s other items'})`;
}
