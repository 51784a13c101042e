/**
 * Python's printing in chat templates (src/tokenizer/jinja-python.ts) against jinja2 itself in transformers' settings
 * (test/fixtures/chat-templates/python-values.json, written by scripts/hf-compat/jinja-values.py from
 * python-values-probes.json): booleans, None, floats by Python's repr, str/list/dict/tuple reprs (quotes, escapes,
 * characters Python does not print), `~`, the `string` filter, transformers' `tojson` (indent, sort_keys by code point,
 * ensure_ascii, separators, floats), message fields. Also Python's float repr against its rules, and the difference
 * that stays: an integral float in the data prints as an integer.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chatFormatOf, renderChat } from '../../src/tokenizer/chat.js';
import { installPythonPrinting, pyFloatRepr } from '../../src/tokenizer/jinja-python.js';

const FIX = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../test/fixtures/chat-templates');
const probes = JSON.parse(fs.readFileSync(path.join(FIX, 'python-values-probes.json'), 'utf8')) as { vars: Record<string, unknown> };
const expected = JSON.parse(fs.readFileSync(path.join(FIX, 'python-values.json'), 'utf8')) as { source: string; cases: Array<{ template: string; text: string }> };

/** Renders a probe with the fixture's variables as template options (the variables a template sees). */
function render(template: string): string {
  return renderChat(chatFormatOf(template, 'probe'), [{ role: 'user', content: 'unused' }], { kwargs: probes.vars });
}

test('the engine takes Python\'s printing (its Interpreter still has the methods wrapped)', () => {
  assert.equal(installPythonPrinting(), true);
});

test(`values print as Python's jinja prints them (${expected.source})`, () => {
  assert.ok(expected.cases.length >= 10);
  for (const c of expected.cases) assert.equal(render(c.template), c.text, c.template);
});

test('SmolLM3\'s xml_tools listing (`tool | string`) renders, as a Python dict\'s repr', () => {
  const smol = fs.readFileSync(path.join(FIX, 'smollm3.jinja'), 'utf8');
  const tool = { type: 'function', function: { name: 'f', description: "it's", parameters: { type: 'object', properties: {} } } };
  const text = renderChat(chatFormatOf(smol, 'smollm3'), [{ role: 'user', content: 'hi' }], { kwargs: { xml_tools: [tool] }, addGenerationPrompt: true });
  assert.ok(text.includes(`<tools>\n{'type': 'function', 'function': {'name': 'f', 'description': "it's", 'parameters': {'type': 'object', 'properties': {}}}}\n</tools>`), text);
});

test('pyFloatRepr follows Python\'s repr: shortest digits, exponent form below 1e-4 and from 1e16, two exponent digits at least', () => {
  const cases: Array<[number, string]> = [
    [0.5, '0.5'], [1e-4, '0.0001'], [1e-5, '1e-05'], [1.5e-5, '1.5e-05'], [123.25, '123.25'], [1e15 + 0.5, '1000000000000000.5'],
    [9.999999999999998e15, '9999999999999998.0'], [1.7976931348623157e308, '1.7976931348623157e+308'], [5e-324, '5e-324'],
    [-0.0, '-0.0'], [0, '0.0'], [100, '100.0'], [Infinity, 'inf'], [-Infinity, '-inf'], [NaN, 'nan'], [-2.5e-7, '-2.5e-07'], [0.1 + 0.2, '0.30000000000000004'],
  ];
  for (const [x, want] of cases) assert.equal(pyFloatRepr(x), want, String(x));
});

test('what stays different: an integral float in the data is an integer in JavaScript (21.0 prints 21; Python prints 21.0)', () => {
  assert.equal(render('{{ x }}|{{ [x] | tojson }}'.replace(/x/g, 'n')), '7|[7]');
  const f = chatFormatOf('{{ t }}', 'probe');
  assert.equal(renderChat(f, [{ role: 'user', content: '' }], { kwargs: { t: JSON.parse('21.0') as number } }), '21');
});
