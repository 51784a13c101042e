/**
 * The CLI argument parser: --flag value / --flag=value, booleans and --no-flag, greedy repeatable lists,
 * positionals and --, help detection, type conversion with messages that name the flag, unknown flags with
 * suggestions; plus the name helpers (kebab/camel, edit distance, closest).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { camelToKebab, closest, coerceValue, editDistance, formatHelp, kebabToCamel, parseArgs, UsageError, type FlagSpec } from '../../src/cli/args.js';
import { usageError } from './fixtures.js';

const FLAGS: FlagSpec[] = [
  { name: 'out', kind: 'string', description: 'out' },
  { name: 'lr', kind: 'number', description: 'lr' },
  { name: 'steps', kind: 'integer', description: 'steps' },
  { name: 'quiet', kind: 'boolean', description: 'quiet' },
  { name: 'data', kind: 'list', description: 'data' },
  { name: 'loss', kind: 'string', choices: ['kl', 'reverse-kl', 'jsd'], description: 'loss' },
  { name: 'temperature', kind: 'number', description: 'T' },
];


test('values: --flag value, --flag=value, numbers and integers converted', () => {
  const p = parseArgs(['--out', 'runs/x', '--lr=3e-4', '--steps', '10'], FLAGS, 'train');
  assert.deepEqual(p.values, { out: 'runs/x', lr: 3e-4, steps: 10 });
  assert.deepEqual(p.positionals, []);
  assert.equal(p.help, false);
});

test('negative numbers are values, not flags', () => {
  assert.equal(parseArgs(['--lr', '-1'], FLAGS, 'train').values.lr, -1);
  assert.equal(parseArgs(['--lr', '-.5'], FLAGS, 'train').values.lr, -0.5);
});

test('booleans: --flag, --no-flag, --flag=false; last one wins', () => {
  assert.equal(parseArgs(['--quiet'], FLAGS, 't').values.quiet, true);
  assert.equal(parseArgs(['--no-quiet'], FLAGS, 't').values.quiet, false);
  assert.equal(parseArgs(['--quiet=false'], FLAGS, 't').values.quiet, false);
  assert.equal(parseArgs(['--quiet', '--no-quiet'], FLAGS, 't').values.quiet, false);
  usageError(() => parseArgs(['--quiet=maybe'], FLAGS, 't'), /--quiet expects true or false, got 'maybe'/);
  usageError(() => parseArgs(['--no-lr'], FLAGS, 't'), /--lr is not a boolean flag/);
});

test('a boolean does not swallow the next argument', () => {
  const p = parseArgs(['--quiet', 'file.txt'], FLAGS, 't');
  assert.equal(p.values.quiet, true);
  assert.deepEqual(p.positionals, ['file.txt']);
});

test('lists are repeatable and greedy up to the next flag', () => {
  const p = parseArgs(['--data', 'a.txt', 'b.txt', '--steps', '3', '--data=c.jsonl', '--data', 'd'], FLAGS, 't');
  assert.deepEqual(p.values.data, ['a.txt', 'b.txt', 'c.jsonl', 'd']);
  assert.equal(p.values.steps, 3);
  usageError(() => parseArgs(['--data', '--steps', '3'], FLAGS, 't'), /--data expects a value/);
});

test('positionals and -- (everything after it is positional)', () => {
  const p = parseArgs(['dir', '--out', 'o', '--', '--lr', '-h'], FLAGS, 'inspect');
  assert.deepEqual(p.positionals, ['dir', '--lr', '-h']);
  assert.equal(p.help, false);
});

test('-h and --help anywhere set help', () => {
  assert.equal(parseArgs(['--out', 'x', '-h'], FLAGS, 't').help, true);
  assert.equal(parseArgs(['--help'], FLAGS, 't').help, true);
  // also beside a typo or a flag missing its value (they were errors instead of the help)
  assert.equal(parseArgs(['--lrr', '1', '--help'], FLAGS, 'train').help, true);
  assert.equal(parseArgs(['--lr', '-h'], FLAGS, 'train').help, true);
});

test('wrong types name the flag and quote the value', () => {
  usageError(() => parseArgs(['--lr', 'abc'], FLAGS, 'train'), /^--lr expects a number, got 'abc'$/);
  usageError(() => parseArgs(['--steps', '2.5'], FLAGS, 'train'), /--steps expects an integer, got '2.5'/);
  usageError(() => parseArgs(['--steps=1e400'], FLAGS, 'train'), /--steps expects an integer/);
  usageError(() => parseArgs(['--loss', 'kll'], FLAGS, 'train'), /--loss expects one of kl, reverse-kl, jsd, got 'kll'/, /did you mean 'kl'/);
});

test('a value flag without a value is an error, and does not take the next flag', () => {
  usageError(() => parseArgs(['--out'], FLAGS, 'train'), /train: --out expects a value/);
  usageError(() => parseArgs(['--out', '--lr', '1'], FLAGS, 'train'), /--out expects a value/);
  assert.equal(parseArgs(['--out=--weird'], FLAGS, 'train').values.out, '--weird');
});

test('unknown flags suggest the closest known one', () => {
  usageError(() => parseArgs(['--lrr', '1'], FLAGS, 'train'), /train: unknown option --lrr/, /did you mean --lr\?/);
  usageError(() => parseArgs(['--temp', '1'], FLAGS, 'train'), /unknown option --temp/, /did you mean --temperature\?/);
  usageError(() => parseArgs(['--zzzzzzzz'], FLAGS, 'train'), /unknown option/, /distillery train --help/);
  usageError(() => parseArgs(['-x'], FLAGS, 'train'), /unknown option -x/);
});

test('coerceValue accepts config-file values (numbers, booleans, lists) and names the key', () => {
  assert.equal(coerceValue(FLAGS[1]!, 0.5, 'lr in a.yaml'), 0.5);
  assert.equal(coerceValue(FLAGS[1]!, '1e-3', 'lr in a.yaml'), 1e-3);
  assert.equal(coerceValue(FLAGS[3]!, 'yes', 'quiet in a.yaml'), true);
  assert.deepEqual(coerceValue(FLAGS[4]!, 'one.txt', 'data in a.yaml'), ['one.txt']);
  assert.deepEqual(coerceValue(FLAGS[4]!, ['a', 'b'], 'data in a.yaml'), ['a', 'b']);
  usageError(() => coerceValue(FLAGS[1]!, true, 'lr in a.yaml'), /^lr in a.yaml expects a number, got true$/);
  usageError(() => coerceValue(FLAGS[4]!, [1, 2], 'data in a.yaml'), /data in a.yaml expects one or more file names/);
  usageError(() => coerceValue(FLAGS[0]!, { a: 1 }, 'out in a.yaml'), /out in a.yaml expects a string, got an object/);
  // every refusal has a hint (a config key's says to quote it)
  assert.throws(() => coerceValue(FLAGS[0]!, { a: 1 }, 'out in a.yaml'), (e: unknown) => e instanceof UsageError && /out: "<value>"/.test(e.hint ?? ''));
  assert.throws(() => coerceValue(FLAGS[0]!, '', 'out in a.yaml'), (e: unknown) => e instanceof UsageError && (e.hint ?? '') !== '');
  // a JSON-valued option written as a YAML mapping is that JSON
  const json: FlagSpec = { name: 'chat-template-kwargs', kind: 'string', metavar: '<json>', description: 'x' };
  assert.equal(coerceValue(json, { enable_thinking: false, n: 2 }, 'chatTemplateKwargs in a.yaml'), '{"enable_thinking":false,"n":2}');
  usageError(() => coerceValue(json, [1], 'chatTemplateKwargs in a.yaml'), /expects a string, got/);
  // and a list of JSON values (a run's evalFilter) written as YAML mappings: each that JSON; strings as they are
  const jsons: FlagSpec = { name: 'eval-filter', kind: 'list', metavar: '<json>...', description: 'x' };
  assert.deepEqual(coerceValue(jsons, [{ name: 'a', filter: [{ function: 'take_first' }] }, '{"name": "b"}'], 'evalFilter in a.yaml'),
    ['{"name":"a","filter":[{"function":"take_first"}]}', '{"name": "b"}']);
  assert.deepEqual(coerceValue(jsons, { name: 'a' }, 'evalFilter in a.yaml'), ['{"name":"a"}']);
  usageError(() => coerceValue({ ...jsons, metavar: '<file>...' }, [{ name: 'a' }], 'data in a.yaml'), /expects one or more file names/);
});

test('name helpers', () => {
  assert.equal(camelToKebab('gradAccum'), 'grad-accum');
  assert.equal(camelToKebab('minLrRatio'), 'min-lr-ratio');
  assert.equal(camelToKebab('beta1'), 'beta1');
  assert.equal(kebabToCamel('grad-accum'), 'gradAccum');
  assert.equal(kebabToCamel('min_lr_ratio'), 'minLrRatio');
  assert.equal(editDistance('kitten', 'sitting'), 3);
  assert.equal(editDistance('', 'abc'), 3);
  assert.equal(closest('trian', ['train', 'distill', 'eval']), 'train');
  assert.equal(closest('xyzzy', ['train', 'distill', 'eval']), undefined);
});

test('formatHelp lists every flag with its default', () => {
  const h = formatHelp({ usage: 'distillery x', description: 'does x', flags: [{ name: 'lr', kind: 'number', description: 'rate', defaultText: '0.1' }] });
  assert.match(h, /usage: distillery x/);
  assert.match(h, /--lr <n> +rate \(default: 0\.1\)/);
  assert.match(h, /-h, --help/);
});
