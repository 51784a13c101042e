/**
 * lm-evaluation-harness's `generate_until` tasks (GSM8K's kind): the model continues each item's prompt greedily, the
 * text is cut where a stop string first appears, a filter pipeline pulls the answer out of it, and `exact_match`
 * compares the answer with the item's target. Every step is the harness's own (as of its 2026 source):
 * - generation (HFLM.generate_until): greedy, at most `max_gen_toks` new tokens (default 256), ended by the model's
 *   end-of-sequence ids; the prompt cut on the left to max_length − max_gen_toks tokens; the text decoded without special
 *   tokens and cut before the first stop string (postprocess_generated_text), the stop strings the task's `until`
 *   (default: the few-shot delimiter) and the tokenizer's eos_token text;
 * - filters (the task's filter_list; default one pipeline, "none", that keeps the text): `regex` (RegexFilter:
 *   findall, group_select, a tuple's first non-empty group, strip, fallback "[invalid]"), `take_first`,
 *   `remove_whitespace`, `lowercase`, `uppercase`, `map`;
 * - exact_match (exact_match_hf_evaluate): each of regexes_to_ignore removed from both, then ignore_case,
 *   ignore_punctuation (string.punctuation), ignore_numbers; equal or not; over a list of targets, 1 if any is equal.
 * Python's regular expressions run through src/eval/py-regex.ts.
 */
import { InputError } from '../util/errors.js';
import { isJsonObject } from '../util/py-json.js';
import { pyFindall, pyRegex, pyStrip, pySub, type PyPattern } from './py-regex.js';

/** One step of a filter pipeline (the harness's filter functions). */
export type FilterStep =
  | { function: 'regex'; pattern: PyPattern; groupSelect: number; fallback: string }
  | { function: 'take_first' | 'remove_whitespace' | 'lowercase' | 'uppercase' }
  | { function: 'map'; mapping: Record<string, string>; defaultValue: string | null };

/** A named filter pipeline (one entry of the harness's filter_list). */
export interface FilterPipeline { name: string; steps: FilterStep[] }

/** exact_match's settings (the harness's metric_list kwargs). */
export interface ExactMatchOptions { regexesToIgnore: PyPattern[]; ignoreCase: boolean; ignorePunctuation: boolean; ignoreNumbers: boolean }

/** How generation items are generated and scored. */
export interface GenerationSettings {
  /** Stop strings (the task's generation_kwargs.until); the tokenizer's eos_token text is added where it is not one. */
  until: string[];
  /** New tokens at most (max_gen_toks). */
  maxGenToks: number;
  filters: FilterPipeline[];
  match: ExactMatchOptions;
}

export const DEFAULT_MAX_GEN_TOKS = 256;

/** The harness's default pipeline when a task names none: the text as generated. */
export const NO_FILTER: FilterPipeline = { name: 'none', steps: [{ function: 'take_first' }] };

const FILTER_HINT = 'a JSON object as a filter_list entry of a harness task: {"name": "strict-match", "filter": [{"function": "regex", "regex_pattern": "#### (\\\\-?[0-9\\\\.\\\\,]+)"}, {"function": "take_first"}]}';

/** A filter pipeline from its JSON (a harness task's filter_list entry); `what` names it in errors. */
export function parseFilter(json: unknown, what: string): FilterPipeline {
  if (!isJsonObject(json)) throw new InputError(`${what} must be a JSON object`, FILTER_HINT);
  const o = json as Record<string, unknown>;
  const unknown = Object.keys(o).find((k) => k !== 'name' && k !== 'filter');
  if (unknown !== undefined) throw new InputError(`${what}: unknown key "${unknown}"`, FILTER_HINT);
  if (typeof o.name !== 'string' || o.name === '') throw new InputError(`${what}: "name" must be a non-empty string`, FILTER_HINT);
  if (!Array.isArray(o.filter) || o.filter.length === 0) throw new InputError(`${what}: "filter" must be a non-empty list of steps`, FILTER_HINT);
  const steps = o.filter.map((s: unknown, k: number): FilterStep => {
    const at = `${what} step ${k + 1}`;
    if (!isJsonObject(s) || typeof (s as Record<string, unknown>).function !== 'string') throw new InputError(`${at} must be an object with a "function"`, FILTER_HINT);
    const f = s as Record<string, unknown>;
    const keys = (allowed: string[]): void => {
      const bad = Object.keys(f).find((key) => key !== 'function' && !allowed.includes(key));
      if (bad !== undefined) throw new InputError(`${at}: the ${String(f.function)} filter takes no "${bad}"`, allowed.length ? `its settings: ${allowed.join(', ')}` : 'it takes no settings');
    };
    switch (f.function) {
      case 'regex': {
        keys(['regex_pattern', 'group_select', 'fallback']);
        const pattern = f.regex_pattern ?? '#### (\\-?[0-9\\.\\,]+)', group = f.group_select ?? 0, fallback = f.fallback ?? '[invalid]';
        if (typeof pattern !== 'string') throw new InputError(`${at}: "regex_pattern" must be a string`, FILTER_HINT);
        if (typeof group !== 'number' || !Number.isInteger(group)) throw new InputError(`${at}: "group_select" must be an integer`, 'the index of the match to keep (0: the first, -1: the last)');
        if (typeof fallback !== 'string') throw new InputError(`${at}: "fallback" must be a string`, 'what an answer with no match becomes (default "[invalid]")');
        return { function: 'regex', pattern: pyRegex(pattern), groupSelect: group, fallback };
      }
      case 'take_first': case 'remove_whitespace': case 'lowercase': case 'uppercase':
        keys([]);
        return { function: f.function };
      case 'map': {
        keys(['mapping_dict', 'default_value']);
        const m = f.mapping_dict;
        if (!isJsonObject(m) || !Object.values(m as object).every((v) => typeof v === 'string')) throw new InputError(`${at}: "mapping_dict" must be an object of strings`, 'e.g. {"yes": "A", "no": "B"}');
        const d = f.default_value ?? null;
        if (d !== null && typeof d !== 'string') throw new InputError(`${at}: "default_value" must be a string`, 'what an answer not in mapping_dict becomes');
        return { function: 'map', mapping: m as Record<string, string>, defaultValue: d };
      }
      default:
        throw new InputError(`${at}: the filter function ${JSON.stringify(f.function)} is not one distillery runs`, 'regex, take_first, remove_whitespace, lowercase, uppercase or map');
    }
  });
  // the harness's take_first turns each item's responses into one string: a step after it would run over its characters
  const first = steps.findIndex((st) => st.function === 'take_first');
  if (first >= 0 && first < steps.length - 1) throw new InputError(`${what}: take_first must be the last step`, 'the harness\'s take_first leaves a string, which a later step would take apart character by character: move it to the end');
  return { name: o.name, steps };
}

/** exact_match's settings from their JSON (the harness's metric kwargs: regexes_to_ignore, ignore_case, ignore_punctuation, ignore_numbers). */
export function parseExactMatch(json: unknown, what: string): ExactMatchOptions {
  const hint = 'a JSON object of exact_match\'s settings, e.g. {"ignore_case": true, "regexes_to_ignore": [",", "\\\\$"]}';
  if (!isJsonObject(json)) throw new InputError(`${what} must be a JSON object`, hint);
  const o = json as Record<string, unknown>;
  const known = ['regexes_to_ignore', 'ignore_case', 'ignore_punctuation', 'ignore_numbers'];
  // a metric_list entry as the task writes it: its metric, aggregation and direction are exact_match's own
  const entry = { metric: 'exact_match', aggregation: 'mean', higher_is_better: true } as Record<string, unknown>;
  const bad = Object.keys(o).find((k) => !known.includes(k) && !(k in entry));
  if (bad !== undefined) throw new InputError(`${what}: unknown key "${bad}"`, `its keys: ${known.join(', ')} (and a metric_list entry's metric, aggregation, higher_is_better)`);
  const other = Object.keys(entry).find((k) => o[k] !== undefined && o[k] !== entry[k]);
  if (other !== undefined) throw new InputError(`${what}: "${other}" is ${JSON.stringify(o[other])}, and generation items are scored by exact_match (${other} ${JSON.stringify(entry[other])})`, 'leave it out, or give exact_match\'s');
  for (const k of known.slice(1)) if (o[k] !== undefined && typeof o[k] !== 'boolean') throw new InputError(`${what}: "${k}" must be true or false`, hint);
  const r = o.regexes_to_ignore ?? [];
  if (!Array.isArray(r) || !r.every((x) => typeof x === 'string')) throw new InputError(`${what}: "regexes_to_ignore" must be a list of strings`, hint);
  return { regexesToIgnore: (r as string[]).map((x) => pyRegex(x)), ignoreCase: o.ignore_case === true, ignorePunctuation: o.ignore_punctuation === true, ignoreNumbers: o.ignore_numbers === true };
}

/** The task settings a preset stands for, as the harness's YAML writes them (`--preset`). */
export const GENERATION_PRESETS = {
  /** lm_eval/tasks/gsm8k/gsm8k.yaml (version 3.0). */
  gsm8k: {
    until: ['Question:', '</s>', '<|im_end|>'], fewshot: 5,
    filters: [
      { name: 'strict-match', filter: [{ function: 'regex', regex_pattern: '#### (\\-?[0-9\\.\\,]+)' }, { function: 'take_first' }] },
      { name: 'flexible-extract', filter: [{ function: 'regex', group_select: -1, regex_pattern: '(-?[$0-9.,]{2,})|(-?[0-9]+)' }, { function: 'take_first' }] },
    ],
    exactMatch: { ignore_case: true, ignore_punctuation: false, regexes_to_ignore: [',', '\\$', '(?s).*#### ', '\\.$'] },
  },
} as const;

export type GenerationPreset = keyof typeof GENERATION_PRESETS;

/** The generation settings as given on a command line (eval's --max-gen-toks …, a run's --eval-max-gen-toks …). */
export interface GenerationFlags { maxGenToks?: number | undefined; until?: string[] | undefined; filter?: string[] | undefined; exactMatch?: string | undefined; preset?: string | undefined }

/**
 * The generation items' settings: the flags', else the preset's, else the harness's defaults (until: the few-shot
 * delimiter). `flag` names a setting's flag in errors (e.g. 'maxGenToks' → '--max-gen-toks'); errors are InputErrors.
 */
export function generationSettings(v: GenerationFlags, fewshotDelimiter: string, flag: (k: keyof GenerationFlags) => string): GenerationSettings {
  const preset = v.preset !== undefined ? GENERATION_PRESETS[v.preset as GenerationPreset] : undefined;
  if (v.preset !== undefined && !preset) throw new InputError(`${flag('preset')} ${v.preset} is not a preset distillery knows`, `one of: ${Object.keys(GENERATION_PRESETS).join(', ')}`);
  const maxGenToks = v.maxGenToks ?? DEFAULT_MAX_GEN_TOKS;
  if (!(Number.isInteger(maxGenToks) && maxGenToks >= 1)) throw new InputError(`${flag('maxGenToks')} must be a positive integer, got ${maxGenToks}`, `e.g. ${flag('maxGenToks')} ${DEFAULT_MAX_GEN_TOKS} (the harness's default)`);
  const json = (text: string, what: string): unknown => {
    try { return JSON.parse(text); } catch (e) { throw new InputError(`${what}: not valid JSON (${(e as Error).message})`, `quote the JSON for the shell, e.g. ${flag('exactMatch')} '{"ignore_case": true}'`); }
  };
  const filterJson = v.filter?.map((t, k) => ({ j: json(t, `${flag('filter')} ${k + 1}`), what: `${flag('filter')} ${k + 1}` }))
    ?? preset?.filters.map((j) => ({ j: j as unknown, what: `${flag('preset')} ${String(v.preset)}'s filter ${j.name}` }));
  const filters = filterJson ? filterJson.map(({ j, what }) => parseFilter(j, what)) : [NO_FILTER];
  checkFilterNames(filters);
  const matchJson = v.exactMatch !== undefined ? json(v.exactMatch, flag('exactMatch')) : preset?.exactMatch ?? {};
  return {
    until: v.until ?? (preset ? [...preset.until] : [fewshotDelimiter]), maxGenToks, filters,
    match: parseExactMatch(matchJson, v.exactMatch !== undefined ? flag('exactMatch') : `${flag('preset')} ${String(v.preset)}'s exact_match`),
  };
}

/** The harness's postprocess_generated_text: the text before the first appearance of any non-empty stop string. */
export function cutAtStops(text: string, until: readonly string[]): string {
  let out = text;
  for (const t of until) if (t.length > 0) out = out.split(t)[0]!;
  return out;
}

/** The stop strings generation ends at: the task's, then the tokenizer's eos_token text where it is not among them (handle_stop_sequences). */
export function stopStrings(until: readonly string[], eosText: string | null): string[] {
  return eosText !== null && eosText !== '' && !until.includes(eosText) ? [...until, eosText] : [...until];
}

/** A pipeline's answer from the generated text (the harness runs each over the item's one response). */
export function applyFilter(p: FilterPipeline, text: string): string {
  let v = text;
  for (const s of p.steps) {
    switch (s.function) {
      case 'regex': {
        const found = pyFindall(s.pattern, v);
        if (found.length === 0) { v = s.fallback; break; }
        // Python's list indexing: a negative group_select counts from the end
        const k = s.groupSelect < 0 ? found.length + s.groupSelect : s.groupSelect;
        if (k < 0 || k >= found.length) throw new InputError(`the regex filter's group_select ${s.groupSelect} is out of range for ${found.length} match${found.length === 1 ? '' : 'es'} (Python raises IndexError here)`, 'use a group_select the matches always have, e.g. 0 or -1');
        let m = found[k]!;
        if (Array.isArray(m)) m = m.find((x) => x !== '') ?? s.fallback;
        v = pyStrip(m);
        break;
      }
      case 'take_first': break;
      case 'remove_whitespace': v = pyStrip(v); break;
      case 'lowercase': v = v.toLowerCase(); break;
      case 'uppercase': v = v.toUpperCase(); break;
      case 'map':
        if (Object.prototype.hasOwnProperty.call(s.mapping, v)) v = s.mapping[v]!;
        else if (s.defaultValue !== null) v = s.defaultValue;
        else throw new InputError(`the map filter has no entry for the answer ${JSON.stringify(v)} and no default_value (the harness fails here too)`, 'give the map step a "default_value"');
        break;
    }
  }
  return v;
}

const PUNCTUATION = /[!"#$%&'()*+,\-./:;<=>?@[\\\]^_`{|}~]/g;

/** exact_match_hf_evaluate over one prediction and its targets: 1 if it equals any of them after the settings' normalization, else 0. */
export function exactMatch(prediction: string, targets: readonly string[], o: ExactMatchOptions): number {
  const norm = (s: string): string => {
    let v = s;
    for (const r of o.regexesToIgnore) v = pySub(r, '', v);
    if (o.ignoreCase) v = v.toLowerCase();
    if (o.ignorePunctuation) v = v.replace(PUNCTUATION, '');
    if (o.ignoreNumbers) v = v.replace(/[0-9]/g, '');
    return v;
  };
  const p = norm(prediction);
  return targets.some((t) => norm(t) === p) ? 1 : 0;
}

/** One generation item's outcome for one model. */
export interface GenerationOutcome {
  /** The text as the harness keeps it (cut before the first stop string). */
  text: string;
  /** Tokens generated (up to the end-of-sequence id or the budget; past the stop string they are not in `text`). */
  tokens: number;
  /** Each pipeline's answer and exact_match, in the pipelines' order. */
  answers: string[];
  matches: number[];
}

/** Scores a generated text: each pipeline's answer against the item's targets; `where` names the item in a filter's error. */
export function scoreGeneration(text: string, tokens: number, targets: readonly string[], s: GenerationSettings, where = 'an item'): GenerationOutcome {
  const answers = s.filters.map((f) => {
    try { return applyFilter(f, text); } catch (e) {
      throw e instanceof InputError ? new InputError(`${where}: filter ${JSON.stringify(f.name)}: ${e.message}`, e.hint) : e;
    }
  });
  return { text, tokens, answers, matches: answers.map((a) => exactMatch(a, targets, s.match)) };
}

/** exact_match per pipeline over the items (means), keyed as the harness prints them ("exact_match,strict-match"). */
export interface GenerationMetrics { items: number; exactMatch: Record<string, number> }

export function generationMetrics(outcomes: readonly GenerationOutcome[], s: GenerationSettings): GenerationMetrics {
  const exact: Record<string, number> = {};
  s.filters.forEach((f, k) => { exact[f.name] = outcomes.reduce((a, o) => a + o.matches[k]!, 0) / Math.max(1, outcomes.length); });
  return { items: outcomes.length, exactMatch: exact };
}

/** The pipelines' names must differ: each is a metric of its own. */
export function checkFilterNames(filters: readonly FilterPipeline[]): void {
  const seen = new Set<string>();
  for (const f of filters) {
    if (seen.has(f.name)) throw new InputError(`two filters are named ${JSON.stringify(f.name)}`, 'name each pipeline differently: each one is reported as exact_match,<name>');
    seen.add(f.name);
  }
}
