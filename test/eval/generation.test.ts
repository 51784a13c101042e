/**
 * Generation items (lm-evaluation-harness's generate_until): Python regular expressions, the answer filters,
 * exact_match and the stop strings, each against what the harness's own code gives (test/fixtures/generation/
 * harness-generation.json, written by scripts/hf-compat/generation-fixture.py from the harness's source: every
 * regex_pattern and regexes_to_ignore of its task YAMLs, run by CPython's re), and the stop rule of generation.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { pyFindall, pyRegex, pyStrip, pySub } from '../../src/eval/py-regex.js';
import { applyFilter, cutAtStops, exactMatch, GENERATION_PRESETS, parseExactMatch, parseFilter, scoreGeneration, stopStrings } from '../../src/eval/generation.js';
import { stopsSettled } from '../../src/eval/generate-items.js';
import { parseChoiceItems } from '../../src/eval/items.js';
import { promptTurns, turnsText } from '../../src/eval/fewshot.js';
import { InputError } from '../../src/util/errors.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const fixture = JSON.parse(fs.readFileSync(path.join(here, '../../../test/fixtures/generation/harness-generation.json'), 'utf8')) as {
  responses: string[];
  patterns: Array<{ pattern: string; results: Array<{ findall: Array<string | string[]>; sub: string }>; filter?: Record<string, Array<string | null>> }>;
  exact_match: Array<{ settings: Record<string, unknown>; prediction: string; reference: string; exact_match: number }>;
  stops: Array<{ generation: string; until: string | string[] | null; stops: string[]; text: string }>;
};

test('Python regular expressions: every regex_pattern and regexes_to_ignore of the harness\'s tasks (and the syntax the translation rewrites) finds and removes what CPython\'s re does', () => {
  assert.ok(fixture.patterns.length >= 120, 'the harness\'s patterns (its task files and templates) and the extra ones');
  for (const c of fixture.patterns) {
    const p = pyRegex(c.pattern);
    c.results.forEach((r, i) => {
      const s = fixture.responses[i]!;
      assert.deepEqual(pyFindall(p, s), r.findall, `findall(${JSON.stringify(c.pattern)}, ${JSON.stringify(s)})`);
      assert.equal(pySub(p, '', s), r.sub, `sub(${JSON.stringify(c.pattern)}, '', ${JSON.stringify(s)})`);
    });
  }
});

test('the regex filter: RegexFilter\'s answer for group_select 0 and -1 over every task pattern and response', () => {
  let n = 0;
  for (const c of fixture.patterns) {
    for (const [g, answers] of Object.entries(c.filter ?? {})) {
      const f = parseFilter({ name: 'f', filter: [{ function: 'regex', regex_pattern: c.pattern, group_select: Number(g) }, { function: 'take_first' }] }, 'f');
      answers.forEach((want, i) => {
        const s = fixture.responses[i]!;
        if (want === null) assert.throws(() => applyFilter(f, s), (e: unknown) => e instanceof InputError && /group_select/.test(e.message));
        else assert.equal(applyFilter(f, s), want, `${JSON.stringify(c.pattern)} group ${g} on ${JSON.stringify(s)}`);
        n++;
      });
    }
  }
  assert.ok(n > 1000, `${n} filter cases`);
});

test('exact_match: exact_match_hf_evaluate\'s verdicts under the settings the tasks use (GSM8K\'s among them)', () => {
  for (const c of fixture.exact_match) {
    const o = parseExactMatch(c.settings, 'settings');
    assert.equal(exactMatch(c.prediction, [c.reference], o), c.exact_match, `${JSON.stringify(c.settings)}: ${JSON.stringify(c.prediction)} vs ${JSON.stringify(c.reference)}`);
  }
  // several targets: any equal one counts (the harness's multiple_target)
  const o = parseExactMatch({ ignore_case: true }, 's');
  assert.equal(exactMatch('Paris', ['London', 'paris'], o), 1);
  assert.equal(exactMatch('Rome', ['London', 'paris'], o), 0);
});

test('stop strings: handle_stop_sequences adds the eos text, postprocess_generated_text cuts before the first', () => {
  for (const c of fixture.stops) {
    const until = c.until === null ? [] : typeof c.until === 'string' ? [c.until] : c.until;
    const stops = stopStrings(until, '<|endoftext|>');
    assert.deepEqual(stops, c.stops);
    assert.equal(cutAtStops(c.generation, stops), c.text, JSON.stringify(c.generation));
  }
});

test('generation may end once nothing that follows can change the text kept (the stop strings split off in their order)', () => {
  const until = ['Question:', '\n\n'];
  assert.equal(stopsSettled('#### 3\n\n', until), true);
  assert.equal(stopsSettled('#### 3\nQuest', until), false);
  // "\n\n" found, but "Question:" cannot start before it: settled
  assert.equal(stopsSettled('a\n\nQues', until), true);
  // the strings split off in their order: XYZ first cuts for good; cXYZW first could still begin at 2
  assert.equal(stopsSettled('abcXYZ', ['XYZ', 'cXYZW']), true);
  assert.equal(stopsSettled('abcXYZ', ['cXYZW', 'XYZ']), false);
  assert.equal(stopsSettled('abcXYZW', ['cXYZW', 'XYZ']), true);
  // a trailing replacement character (a character whose bytes are not all out) is not text yet
  assert.equal(stopsSettled('x\uFFFD', ['\uFFFD']), false);
  // brute force: stopping at the first settled prefix cuts the whole text the same way
  const alphabet = ['a', 'b', 'Q', ':', '\n'];
  const stops = ['Q:', '\n\n', 'ab\nQ'];
  let rng = 7;
  for (let t = 0; t < 2000; t++) {
    let s = '';
    for (let k = 0; k < 12; k++) { rng = (rng * 1103515245 + 12345) >>> 0; s += alphabet[rng % alphabet.length]; }
    const whole = cutAtStops(s, stops);
    let settled = false;
    for (let k = 1; k <= s.length; k++) {
      if (stopsSettled(s.slice(0, k), stops)) { assert.equal(cutAtStops(s.slice(0, k), stops), whole, JSON.stringify(s)); settled = true; break; }
    }
    // and it does end: a stop string whole before the last few characters (the longest stop string's length) settles it
    if (stops.some((u) => s.slice(0, s.length - 4).includes(u))) assert.ok(settled, `never settled: ${JSON.stringify(s)}`);
  }
});

test('Python syntax JavaScript cannot say is refused by name', () => {
  for (const [p, what] of [['(?x) a b', /verbose/], ['(?i:a)b', /flags inside/], ['(?>a)', /atomic/], ['a++', /possessive/], ['(a)?(?(1)b|c)', /conditional/],
    ['\\N{DIGIT ONE}', /named character/], ['\\q', /unknown escape/], ['[a', /unterminated/], ['(a)?b\\1', /back-reference/], ['(?P<n>a)(?P=n)', /back-reference/],
    ['(?:(a)|b)+', /capturing group inside a repeated group/], ['(a*)+b', /capturing group inside a repeated group/], ['(?:x(\\d){2,3})', /capturing group inside a repeated group/],
    ['[\\B]', /inside a character class/], ['(a', /unclosed group/], ['a)', /unbalanced/]] as const) {
    assert.throws(() => pyRegex(p), (e: unknown) => e instanceof InputError && what.test(e.message), p);
  }
  assert.equal(pyStrip('\u3000 x \x1c'), 'x');
});

test('filters and exact_match settings: the harness\'s YAML shape, bad ones named', () => {
  const gsm = GENERATION_PRESETS.gsm8k;
  const [strict, flexible] = gsm.filters.map((f) => parseFilter(f, f.name));
  const match = parseExactMatch(gsm.exactMatch, 'gsm8k');
  const text = 'Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.\n#### 72';
  assert.equal(applyFilter(strict!, text), '72');
  assert.equal(applyFilter(flexible!, 'so she has $1,250.'), '$1,250.');
  assert.equal(exactMatch(applyFilter(flexible!, 'so she has $1,250.'), ['... #### 1250'], match), 1);
  assert.equal(applyFilter(strict!, 'no marker 72'), '[invalid]');
  const mapped = parseFilter({ name: 'm', filter: [{ function: 'remove_whitespace' }, { function: 'lowercase' }, { function: 'map', mapping_dict: { yes: 'A' }, default_value: 'B' }] }, 'm');
  assert.equal(applyFilter(mapped, '  YES '), 'A');
  assert.equal(applyFilter(mapped, 'maybe'), 'B');
  const bad: Array<[unknown, RegExp]> = [
    [[], /must be a JSON object/], [{ name: 'x' }, /"filter" must be a non-empty list/], [{ name: 'x', filter: [{ function: 'majority_vote' }] }, /not one distillery runs/],
    [{ name: 'x', filter: [{ function: 'regex', regex_patern: 'a' }] }, /takes no "regex_patern"/], [{ name: 'x', filter: [], extra: 1 }, /unknown key "extra"/],
  ];
  for (const [j, re] of bad) assert.throws(() => parseFilter(j, '--filter 1'), (e: unknown) => e instanceof InputError && re.test(e.message), JSON.stringify(j));
  assert.throws(() => parseExactMatch({ ignore_case: 'yes' }, '--exact-match'), /"ignore_case" must be true or false/);
  // a metric_list entry as the task writes it is taken; another metric is not
  assert.equal(parseExactMatch({ metric: 'exact_match', aggregation: 'mean', higher_is_better: true, ignore_case: true }, 'm').ignoreCase, true);
  assert.throws(() => parseExactMatch({ metric: 'bleu' }, '--exact-match'), /"metric" is "bleu", and generation items are scored by exact_match/);
  // take_first last (the harness's leaves a string a later step would take apart); map without a default fails on a stray answer, as the harness does
  assert.throws(() => parseFilter({ name: 'x', filter: [{ function: 'take_first' }, { function: 'lowercase' }] }, '--filter 1'), /take_first must be the last step/);
  const noDefault = parseFilter({ name: 'm', filter: [{ function: 'map', mapping_dict: { yes: 'A' } }] }, 'm');
  assert.equal(applyFilter(noDefault, 'yes'), 'A');
  assert.throws(() => applyFilter(noDefault, 'no'), /no entry for the answer "no" and no default_value/);
  // a filter's error names the item and the pipeline
  const far = parseFilter({ name: 'far', filter: [{ function: 'regex', regex_pattern: '(\\d)', group_select: 5 }] }, 'far');
  const settings = { until: [], maxGenToks: 4, filters: [far], match: parseExactMatch({}, 'm') };
  assert.throws(() => scoreGeneration('1 2', 2, ['1'], settings, 'g.jsonl:3'), (e: unknown) => e instanceof InputError && /^g\.jsonl:3: filter "far": the regex filter's group_select 5 is out of range for 2 matches/.test(e.message));
  assert.throws(() => parseExactMatch({ regexes: [] }, '--exact-match'), /unknown key "regexes"/);
});

test('generation items: {"context", "target"} lines, a list of targets, the kinds kept apart', () => {
  const items = parseChoiceItems([
    JSON.stringify({ context: 'Question: 1+1?\nAnswer:', target: 'It is 2.\n#### 2' }),
    JSON.stringify({ context: 'Capital of France?', target: ['Paris', 'paris'] }),
  ].join('\n'), 'g.jsonl');
  assert.deepEqual(items.map((it) => it.generate?.targets), [['It is 2.\n#### 2'], ['Paris', 'paris']]);
  // a few-shot example's answer is its (first) target
  assert.deepEqual(items.map((it) => it.choices[it.answer]), ['It is 2.\n#### 2', 'Paris']);
  assert.throws(() => parseChoiceItems(JSON.stringify({ context: 'c', target: 'x', choices: ['a', 'b'] }), 'g.jsonl'), /"target" goes without "choices"/);
  // as an example, a target of "" is no answer to the harness's build_qa_turn: the context alone, no delimiters; [""] is an empty answer
  const three = parseChoiceItems([{ context: 'Q1', target: '' }, { context: 'Q2', target: [''] }, { context: 'Q3', target: 'A3' }].map((x) => JSON.stringify(x)).join('\n'), 'e.jsonl');
  const turns = promptTurns([three[2]!], { n: 2, sampler: 'first_n', seed: 1234, delimiter: '\n\n', pools: [three.slice(0, 2)] }, ' ');
  assert.equal(turnsText(turns[0]!), 'Q1Q2 \n\nQ3');
  assert.throws(() => parseChoiceItems(JSON.stringify({ context: 'c', target: [] }), 'g.jsonl'), /"target" must be a string or a non-empty list/);
  assert.throws(() => parseChoiceItems(JSON.stringify({ target: 'x' }), 'g.jsonl'), /"context" must be a string/);
});
