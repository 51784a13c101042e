/**
 * Python's printing in chat templates (src/tokenizer/jinja-python.ts) against jinja2 itself in transformers' settings
 * (test/fixtures/chat-templates/python-values.json, written by scripts/hf-compat/jinja-values.py from
 * python-values-probes.json): booleans, None, floats by Python's repr, str/list/dict/tuple reprs (quotes, escapes,
 * characters Python does not print), `~`, the `string` filter, transformers' `tojson` (indent, sort_keys by code point,
 * ensure_ascii, separators, floats), message fields, floats with an integral value read from JSON (21.0), a dict's
 * items / dictsort pairs as tuples (unpacked by `for k, v`). Also
 * Python's float repr against its rules, parsePyJson against JSON.parse, and a data line's floats through a real
 * template.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chatFormatOf, chatRenderer, renderChat, type ChatMessage } from '../../src/tokenizer/chat.js';
import { installPythonSemantics, pyFloatRepr } from '../../src/tokenizer/jinja-python.js';
import { PyFloat, isJsonObject, parsePyJson } from '../../src/util/py-json.js';
import { parseTemplateKwargs } from '../../src/cli/options.js';
import { UsageError } from '../../src/cli/args.js';
import { DistilleryError, InputError } from '../../src/util/errors.js';
import { loadDocuments, parseJsonlLine } from '../../src/data/documents.js';

const FIX = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../test/fixtures/chat-templates');
// read as the data is read (parsePyJson: 21.0 stays a float), as Python's json.load reads it
const probes = parsePyJson(fs.readFileSync(path.join(FIX, 'python-values-probes.json'), 'utf8')) as { vars: Record<string, unknown> };
const expected = JSON.parse(fs.readFileSync(path.join(FIX, 'python-values.json'), 'utf8')) as { source: string; cases: Array<{ template: string; text: string }> };

/** Renders a probe with the fixture's variables as template options (the variables a template sees). */
function render(template: string): string {
  return renderChat(chatFormatOf(template, 'probe'), [{ role: 'user', content: 'unused' }], { kwargs: probes.vars });
}

test('the engine takes Python\'s semantics (its Interpreter, Environment and string values still have what is wrapped)', () => {
  assert.equal(installPythonSemantics(), true);
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

test('parsePyJson: JSON.parse\'s values (and errors), but numbers written with a fraction or an exponent and an integral value are PyFloats', () => {
  const text = '{"a": 21.0, "b": 21, "c": 1.5, "d": [1e3, -0.0, 2E-0, 0], "e": "21.0 \\"q\\" \\\\", "__proto__": {"x": 1.0}, "f": 1e300, "g": {}, "h": []}';
  const v = parsePyJson(text) as Record<string, unknown>;
  const plain = JSON.parse(text) as Record<string, unknown>;
  assert.ok(v.a instanceof PyFloat && (v.a as PyFloat).value === 21);
  assert.equal(v.b, 21); assert.equal(v.c, 1.5);
  const d = v.d as unknown[];
  assert.ok(d[0] instanceof PyFloat && d[1] instanceof PyFloat && Object.is((d[1] as PyFloat).value, -0) && d[2] instanceof PyFloat);
  assert.equal(d[3], 0);
  assert.equal(v.e, plain.e);
  assert.ok(Object.prototype.hasOwnProperty.call(v, '__proto__') && Object.getPrototypeOf(v) === Object.prototype, '__proto__ an own key, as JSON.parse makes it');
  assert.ok(v.f instanceof PyFloat);
  assert.deepEqual([v.g, v.h], [{}, []]);
  // the same value everywhere else: JSON.stringify writes it as JSON.parse's number
  assert.equal(JSON.stringify(v), JSON.stringify(plain));
  // without such a number, JSON.parse's result itself; invalid JSON, JSON.parse's error
  assert.deepEqual(parsePyJson('{"a": [1, 2.5, "3.0"]}'), { a: [1, 2.5, '3.0'] });
  assert.throws(() => parsePyJson('{"a": 1.0,}'), SyntaxError);
  // a PyFloat is an object to typeof: a top-level 1.0 is still not a JSON object where one is wanted
  assert.equal(isJsonObject(parsePyJson('1.0')), false);
  assert.throws(() => parseTemplateKwargs('1.0'), (e: unknown) => e instanceof UsageError && /must be a JSON object/.test(e.message));
  assert.throws(() => parseJsonlLine('1.0', 'd:1'), (e: unknown) => e instanceof InputError && /d:1: expected a JSON object/.test(e.message));
  assert.throws(() => parseJsonlLine('{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 2.0}', 'd:2'),
    (e: unknown) => e instanceof InputError && /"chat_template_kwargs" must be an object/.test(e.message));
});

test('a float of the data keeps its form through a chat line to the template (Qwen2.5\'s tojson of the tools; a tool call\'s arguments)', () => {
  const qwen = chatFormatOf(fs.readFileSync(path.join(FIX, 'qwen2.5-instruct.jinja'), 'utf8'), 'qwen2.5');
  const line = JSON.stringify({ messages: [{ role: 'user', content: 'weather?' }] }).slice(0, -1)
    + ', "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {"t": {"type": "number", "default": 1.0, "maximum": 1e2}}}}}]}';
  const rec = parseJsonlLine(line, 'test:1') as { messages: ChatMessage[]; tools: unknown[] };
  const text = renderChat(qwen, rec.messages, { tools: rec.tools, addGenerationPrompt: true });
  assert.ok(text.includes('"default": 1.0, "maximum": 100.0'), text);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-pyf-'));
  const f = path.join(dir, 'c.jsonl');
  fs.writeFileSync(f, '{"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": {"t": 20.0, "n": 3}}}]}]}\n');
  const [doc] = loadDocuments([f], { renderChat: chatRenderer(qwen, { lossOn: 'all' }) });
  assert.ok(String(doc).includes('"arguments": {"t": 20.0, "n": 3}'), String(doc));
  // a float beyond 2^53 is a float in Python too: not refused as an integer JavaScript would change
  assert.doesNotThrow(() => parseJsonlLine('{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"big": 1e300}}', 'test:2'));
});

test('a template\'s formatting or arithmetic error fails as Python\'s does, by its message (not a JavaScript NaN or Infinity)', () => {
  for (const [template, message] of [["{{ '%d' % 'a' }}", 'TypeError: %d format: a real number is required, not str'], ["{{ 'x' % 1 }}", 'TypeError: not all arguments converted during string formatting'],
    ["{{ '%s %s' % list }}", 'TypeError: not enough arguments for format string'], ['{{ n // 0 }}', 'ZeroDivisionError: integer division or modulo by zero'],
    ['{{ half % 0 }}', 'ZeroDivisionError: float modulo'], ['{{ n / 0 }}', 'ZeroDivisionError: division by zero'], ["{{ '%q' | format(1) }}", "ValueError: unsupported format character 'q' (0x71) at index 1"]] as const) {
    assert.throws(() => render(template), (e: Error) => e instanceof DistilleryError && e.message.includes(message), template);
  }
});
