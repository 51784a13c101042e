/**
 * Python's semantics inside chat templates, where @huggingface/jinja 0.5.11 has JavaScript's: str.strip(chars) (see
 * pyStrip below), the printing of values, string formatting (`'%s: %.2f' % (k, x)` and the `format` filter, which the
 * engine refuses: src/tokenizer/py-format.ts) and the division and modulo of numbers (`-7 % 3` is 2, not -1; a zero
 * divisor raises Python's ZeroDivisionError, not Infinity or NaN), a str's or list's repetition (`'-' * 3`) and bools
 * as ints (`True + 1`), which the engine refuses; installPythonSemantics() installs them, once.
 *
 * Printing. Templates run in Python's Jinja under transformers, where a
 * value becomes text by Python's str(): `{{ flag }}` prints `True`, `{{ none }}` prints `None`, a dict or a list prints
 * its repr (`{'name': 'f', 'n': [1, 2.5]}`), `x ~ y` and the `string` filter use str(), a float prints as Python's repr
 * (`1e-05`, `1.5e+16`) and `tojson` is transformers' json.dumps (floats by repr, sort_keys by code point).
 * @huggingface/jinja 0.5.11 prints JavaScript's forms instead (`true`, nothing, JSON, `0.00001`) and has no `string`
 * filter for a dict or None at all, so SmolLM3's template, which lists `xml_tools` with `tool | string`, fails.
 *
 * installPythonPrinting() wraps three methods of the engine's Interpreter (evaluateBlock: what `{{ }}` prints;
 * evaluateBinaryExpression: `~`; applyFilter: `string`, `tojson` and `join`) so that they print as Python does. The engine's
 * value types are told apart by their `type` field, which the engine sets on every value. A float with an integral
 * value in the data (`21.0`), which JavaScript cannot tell from an integer, comes as a PyFloat from parsePyJson
 * (src/util/py-json.ts): Environment.set is wrapped to give the engine a float for it.
 */
import { Environment, Interpreter } from '@huggingface/jinja';
import { PyFloat } from '../util/py-json.js';
import { pyArith, pyEscape, pyPercentFormat, type FormatHooks } from './py-format.js';

/** The engine's runtime value, as far as printing needs it. */
export interface JinjaValue { type: string; value: unknown }

/** Python's repr of a float (shortest round-trip digits; exponent form below 1e-4 and from 1e16). */
export function pyFloatRepr(x: number): string {
  if (Number.isNaN(x)) return 'nan';
  if (!Number.isFinite(x)) return x > 0 ? 'inf' : '-inf';
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const [mant, exp] = Math.abs(x).toExponential().split('e') as [string, string];
  const digits = mant.replace('.', '');
  const e = Number(exp), decpt = e + 1, sign = x < 0 ? '-' : '';
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) return `${sign}0.${'0'.repeat(-decpt)}${digits}`;
    if (decpt >= digits.length) return `${sign}${digits}${'0'.repeat(decpt - digits.length)}.0`;
    return `${sign}${digits.slice(0, decpt)}.${digits.slice(decpt)}`;
  }
  const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
  return `${sign}${m}e${e < 0 ? '-' : '+'}${String(Math.abs(e)).padStart(2, '0')}`;
}

/** Characters Python's str.isprintable() rejects (other than the escapes repr writes by name). */
const NON_PRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}]|[^\P{Zs} ]/u;

/** Python's repr of a str: single quotes unless it holds a ' and no ", escapes for what is not printable. */
export function pyStrRepr(s: string): string {
  const q = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = q;
  for (const ch of s) {
    const cp = ch.codePointAt(0)!;
    if (ch === '\\' || ch === q) out += '\\' + ch;
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (ch === '\t') out += '\\t';
    else if (NON_PRINTABLE.test(ch)) out += pyEscape(cp);
    else out += ch;
  }
  return out + q;
}

function entries(v: JinjaValue): Array<[string, JinjaValue]> {
  return Array.from((v.value as Map<string, JinjaValue>).entries());
}

/** Python's repr of a value (inside a list or dict). */
export function pyRepr(v: JinjaValue): string {
  return v.type === 'StringValue' ? pyStrRepr(v.value as string) : v.type === 'UndefinedValue' ? 'Undefined' : pyStr(v);
}

/** Python's str() of a value; null for a value Python has no plain form of here (the engine's own printing stays). */
export function pyStrOrNull(v: JinjaValue): string | null {
  switch (v.type) {
    case 'StringValue': return v.value as string;
    case 'IntegerValue': return String(v.value);
    case 'FloatValue': return pyFloatRepr(v.value as number);
    case 'BooleanValue': return v.value ? 'True' : 'False';
    case 'NullValue': return 'None';
    case 'UndefinedValue': return '';
    case 'ArrayValue': case 'TupleValue': {
      const items = (v.value as JinjaValue[]).map(pyRepr);
      // a dict's view (`d.items()`, `d.keys()`, `d.values()`: patchDictPairs) as Python prints it, `dict_items([...])`
      const view = dictViews.get(v);
      if (view) return `${view}([${items.join(', ')}])`;
      // a tuple, or a dict's (key, value) pair (patchDictPairs, tupleLists), as Python prints tuples
      if (!isTuple(v)) return `[${items.join(', ')}]`;
      return `(${items.join(', ')}${items.length === 1 ? ',' : ''})`;
    }
    case 'ObjectValue': case 'KeywordArgumentsValue':
      return `{${entries(v).map(([k, x]) => `${pyStrRepr(k)}: ${pyRepr(x)}`).join(', ')}}`;
    case 'NamespaceValue':
      return `<Namespace {${entries(v).map(([k, x]) => `${pyStrRepr(k)}: ${pyRepr(x)}`).join(', ')}}>`;
    default: return null;
  }
}

/** Python's str() of a value, else the engine's printing of it. */
export function pyStr(v: JinjaValue): string {
  return pyStrOrNull(v) ?? String(v);
}

/** json.dumps' string: JSON's escapes; with ensure_ascii, every character past '~' (DEL and non-ASCII) as \uXXXX (surrogate pairs). */
function jsonString(s: string, ensureAscii: boolean): string {
  const j = JSON.stringify(s);
  if (!ensureAscii) return j;
  let out = '';
  for (let i = 0; i < j.length; i++) {
    const c = j.charCodeAt(i);
    out += c < 0x7f ? j[i] : `\\u${c.toString(16).padStart(4, '0')}`;
  }
  return out;
}

/** Python's order of str: by code point (JavaScript's < compares UTF-16 units: an emoji before U+FF01). */
export function byCodePoint(a: string, b: string): number {
  const x = Array.from(a, (c) => c.codePointAt(0)!), y = Array.from(b, (c) => c.codePointAt(0)!);
  for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i]! - y[i]!;
  return x.length - y.length;
}

export interface JsonDumpsOptions { indent: string | null; ensureAscii: boolean; sortKeys: boolean; separators: [string, string] | null }

/**
 * transformers' tojson: json.dumps(x, ensure_ascii, indent, separators, sort_keys). Floats by Python's repr (NaN,
 * Infinity as json.dumps writes them), sort_keys by code point, the separators (', ', ': ') or, with an indent,
 * (',', ': '); an undefined value is null, as the engine's tojson has it.
 */
export function pyJsonDumps(v: JinjaValue, o: JsonDumpsOptions, depth = 0): string {
  const [itemSep, keySep] = o.separators ?? (o.indent !== null ? [',', ': '] : [', ', ': ']);
  switch (v.type) {
    case 'NullValue': case 'UndefinedValue': return 'null';
    case 'BooleanValue': return v.value ? 'true' : 'false';
    case 'IntegerValue': return String(v.value);
    case 'FloatValue': {
      const x = v.value as number;
      return Number.isNaN(x) ? 'NaN' : !Number.isFinite(x) ? (x > 0 ? 'Infinity' : '-Infinity') : pyFloatRepr(x);
    }
    case 'StringValue': return jsonString(v.value as string, o.ensureAscii);
    case 'ArrayValue': case 'TupleValue': case 'ObjectValue': case 'KeywordArgumentsValue': case 'NamespaceValue': {
      const isList = v.type === 'ArrayValue' || v.type === 'TupleValue';
      let items: string[];
      if (isList) items = (v.value as JinjaValue[]).map((x) => pyJsonDumps(x, o, depth + 1));
      else {
        let es = entries(v);
        if (o.sortKeys) es = es.sort(([a], [b]) => byCodePoint(a, b));
        items = es.map(([k, x]) => `${jsonString(k, o.ensureAscii)}${keySep}${pyJsonDumps(x, o, depth + 1)}`);
      }
      const [open, close] = isList ? ['[', ']'] : ['{', '}'];
      if (items.length === 0) return open + close;
      if (o.indent === null) return open + items.join(itemSep) + close;
      const pad = '\n' + o.indent.repeat(depth + 1), end = '\n' + o.indent.repeat(depth);
      return open + pad + items.join(itemSep + pad) + end + close;
    }
    default: throw new Error(`Object of type ${v.type} is not JSON serializable`);
  }
}

type Node = { type: string; value?: unknown; left?: Node; right?: Node; operator?: { value: string }; callee?: Node; args?: Node[] };
type Env = unknown;
interface InterpreterShape {
  evaluate(n: Node, env: Env): JinjaValue;
  evaluateBlock(statements: Node[], env: Env): JinjaValue;
  evaluateBinaryExpression(n: Node, env: Env): JinjaValue;
  applyFilter(operand: JinjaValue, filter: Node, env: Env): JinjaValue;
  evaluateArguments(args: Node[], env: Env): [JinjaValue[], Map<string, JinjaValue>];
  evaluateSliceExpression(object: JinjaValue, expr: Node, env: Env): JinjaValue;
}

/** Whether a template variable holds a PyFloat anywhere. */
function hasPyFloat(v: unknown): boolean {
  if (v instanceof PyFloat) return true;
  if (v === null || typeof v !== 'object') return false;
  return (Array.isArray(v) ? v : Object.values(v as Record<string, unknown>)).some(hasPyFloat);
}

/** Statements: what they evaluate to is not printed (an expression's None is). */
const STATEMENTS = new Set(['Set', 'If', 'For', 'Macro', 'CallStatement', 'Break', 'Continue', 'FilterStatement', 'Comment', 'Program']);

let installed: boolean | null = null;

/** How pyPercentFormat prints and unpacks the engine's values: Python's str and repr; tuples (and dict pairs); dicts. */
const formatHooks: FormatHooks = {
  str: (v) => pyStr(v as JinjaValue),
  repr: (v) => pyRepr(v as JinjaValue),
  tupleItems: (v) => (isTuple(v as JinjaValue) ? v.value as JinjaValue[] : null),
  mapping: (v) => (v.type === 'ObjectValue' || v.type === 'KeywordArgumentsValue' ? v.value as Map<string, JinjaValue> : null),
  // what has __getitem__ in Python: a dict, a list (not a tuple; a dict view has none), jinja2's Undefined
  isMapping: (v) => v.type === 'ObjectValue' || v.type === 'KeywordArgumentsValue' || v.type === 'UndefinedValue'
    || (v.type === 'ArrayValue' && !isTuple(v as JinjaValue) && !dictViews.has(v)),
};

/**
 * Installs Python's printing into the engine (once; returns whether it could: false when the engine no longer has the
 * methods it wraps, which test/tokenizer/jinja-python.test.ts reports).
 */
export function installPythonPrinting(): boolean {
  if (installed !== null) return installed;
  const proto = Interpreter.prototype as unknown as InterpreterShape;
  type EnvShape = { set(name: string, v: unknown): unknown; declareVariable(name: string, v: JinjaValue): unknown; variables: Map<string, JinjaValue> };
  const envProto = Environment.prototype as unknown as EnvShape;
  if (typeof proto.evaluateBlock !== 'function' || typeof proto.evaluateBinaryExpression !== 'function'
    || typeof proto.applyFilter !== 'function' || typeof proto.evaluateArguments !== 'function'
    || typeof envProto.set !== 'function' || typeof envProto.declareVariable !== 'function'
    || typeof proto.evaluateSliceExpression !== 'function') return (installed = false);
  // the engine's own conversion of a JavaScript value, and the constructors of its float, list and dict values
  const origSet = envProto.set;
  const engine = (v: unknown): JinjaValue => {
    const e = new Environment() as unknown as EnvShape;
    origSet.call(e, 'v', v);
    return e.variables.get('v')!;
  };
  type Ctor<T> = new (v: T) => JinjaValue;
  const FloatValue = engine(0.5).constructor as Ctor<number>;
  const ArrayValue = engine([]).constructor as Ctor<JinjaValue[]>;
  const ObjectValue = engine({}).constructor as Ctor<Map<string, JinjaValue>>;
  const convert = (v: unknown): JinjaValue => {
    if (v instanceof PyFloat) return new FloatValue(v.value);
    if (!hasPyFloat(v)) return engine(v);
    if (Array.isArray(v)) return new ArrayValue(v.map(convert));
    return new ObjectValue(new Map(Object.entries(v as Record<string, unknown>).map(([k, x]) => [k, convert(x)])));
  };
  envProto.set = function (this: EnvShape, name: string, v: unknown): unknown {
    return hasPyFloat(v) ? this.declareVariable(name, convert(v)) : origSet.call(this, name, v);
  };
  const origBinary = proto.evaluateBinaryExpression, origFilter = proto.applyFilter;
  // any block's result is a StringValue: the engine's own one, reused
  const StringValue = (proto.evaluateBlock.call(Object.create(proto) as InterpreterShape, [], null) as unknown as { constructor: new (s: string) => JinjaValue }).constructor;
  proto.evaluateBlock = function (this: InterpreterShape, statements: Node[], env: Env): JinjaValue {
    let out = '';
    for (const s of statements) {
      const v = this.evaluate(s, env);
      if (v.type === 'UndefinedValue' || (v.type === 'NullValue' && STATEMENTS.has(s.type))) continue;
      out += pyStr(v);
    }
    return new StringValue(out);
  };
  const IntegerValue = engine(1).constructor as Ctor<number>;
  // a slice of a tuple is a tuple (the engine's is a list): remembered with the pairs, which print as tuples
  const origSlice = proto.evaluateSliceExpression;
  proto.evaluateSliceExpression = function (this: InterpreterShape, object: JinjaValue, expr: Node, env: Env): JinjaValue {
    const out = origSlice.call(this, object, expr, env);
    if (isTuple(object)) tupleLists.add(out);
    return out;
  };
  const numeric = (v: JinjaValue): boolean => v.type === 'IntegerValue' || v.type === 'FloatValue' || v.type === 'BooleanValue';
  proto.evaluateBinaryExpression = function (this: InterpreterShape, n: Node, env: Env): JinjaValue {
    const op = n.operator?.value;
    if (op === '~') return new StringValue(pyStr(this.evaluate(n.left!, env)) + pyStr(this.evaluate(n.right!, env)));
    if (op !== '%' && op !== '/' && op !== '//' && op !== '*' && op !== '+' && op !== '-') return origBinary.call(this, n, env);
    // Python's string formatting, its division and modulo of numbers (the engine's are JavaScript's), a str's or a list's
    // repetition and bools as ints (the engine refuses both); other operands go to the engine, which is given the operands
    // evaluated here (not evaluated twice) and refuses what Python refuses
    const left = this.evaluate(n.left!, env);
    if (op === '%' && left.type === 'StringValue') return new StringValue(pyPercentFormat(left.value as string, this.evaluate(n.right!, env), formatHooks));
    const right = this.evaluate(n.right!, env);
    const int = left.type !== 'FloatValue' && right.type !== 'FloatValue';
    if (numeric(left) && numeric(right)) {
      if (op === '%' || op === '/' || op === '//') {
        const r = pyArith(op, Number(left.value), Number(right.value), int);
        return r.int ? new IntegerValue(r.value) : new FloatValue(r.value);
      }
      if (left.type === 'BooleanValue' || right.type === 'BooleanValue') {
        const a = Number(left.value), b = Number(right.value), v = op === '+' ? a + b : op === '-' ? a - b : a * b;
        return int ? new IntegerValue(v) : new FloatValue(v);
      }
    }
    if (op === '*') {
      const [seq, count] = right.type === 'IntegerValue' || right.type === 'BooleanValue' ? [left, right] : [right, left];
      if ((count.type === 'IntegerValue' || count.type === 'BooleanValue') && seq !== count) {
        const k = Math.max(0, Number(count.value));
        if (seq.type === 'StringValue') return new StringValue((seq.value as string).repeat(k));
        if (seq.type === 'ArrayValue' || seq.type === 'TupleValue') {
          const items = seq.value as JinjaValue[], out = new ArrayValue(Array.from({ length: k }, () => items).flat());
          if (isTuple(seq)) tupleLists.add(out); // a tuple's repetition is a tuple
          return out;
        }
      }
    }
    const operands = Object.create(this) as InterpreterShape;
    operands.evaluate = (node: Node, e: Env): JinjaValue => (node === n.left ? left : node === n.right ? right : this.evaluate(node, e));
    return origBinary.call(operands, n, env);
  };
  proto.applyFilter = function (this: InterpreterShape, operand: JinjaValue, filter: Node, env: Env): JinjaValue {
    if (filter.type === 'Identifier' && filter.value === 'string') return new StringValue(pyStr(operand));
    // `f` or `f(...)`: the filter's name, and its arguments (evaluated only for the filters handled here)
    const name = filter.type === 'Identifier' ? filter.value : filter.type === 'CallExpression' && filter.callee?.type === 'Identifier' ? filter.callee.value : null;
    const argsOf = (): [JinjaValue[], Map<string, JinjaValue>] => (filter.type === 'CallExpression' ? this.evaluateArguments(filter.args ?? [], env) : [[], new Map()]);
    if (name === 'tojson') {
      // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False), by position or name
      const [args, kw] = argsOf();
      const arg = (i: number, name: string): JinjaValue | undefined => kw.get(name) ?? args[i];
      const indent = arg(1, 'indent'), ascii = arg(0, 'ensure_ascii'), sep = arg(2, 'separators'), sort = arg(3, 'sort_keys');
      const none = (x: JinjaValue | undefined): boolean => x === undefined || x.type === 'NullValue';
      let indentStr: string | null = null;
      if (!none(indent)) {
        if (indent!.type === 'StringValue') indentStr = indent!.value as string;
        else if (indent!.type === 'IntegerValue' || indent!.type === 'BooleanValue') indentStr = ' '.repeat(Math.max(0, Number(indent!.value)));
        else throw new Error('If set, indent must be a number or a string');
      }
      if (!none(ascii) && ascii!.type !== 'BooleanValue') throw new Error('If set, ensure_ascii must be a boolean');
      if (!none(sort) && sort!.type !== 'BooleanValue') throw new Error('If set, sort_keys must be a boolean');
      let separators: [string, string] | null = null;
      if (!none(sep)) {
        const xs = sep!.type === 'ArrayValue' || sep!.type === 'TupleValue' ? sep!.value as JinjaValue[] : [];
        if (xs.length !== 2 || xs.some((x) => x.type !== 'StringValue')) throw new Error('separators must be a tuple of two strings');
        separators = [xs[0]!.value as string, xs[1]!.value as string];
      }
      return new StringValue(pyJsonDumps(operand, { indent: indentStr, ensureAscii: ascii?.value === true, sortKeys: sort?.value === true, separators }));
    }
    // join(d='') over a list: Python's str of each item (True, None, 1.0); join(attribute=...) stays the engine's
    if (name === 'join' && (operand.type === 'ArrayValue' || operand.type === 'TupleValue')) {
      const [args, kw] = argsOf();
      if (!kw.has('attribute')) {
        const d = kw.get('d') ?? args[0];
        return new StringValue((operand.value as JinjaValue[]).map(pyStr).join(d === undefined ? '' : pyStr(d)));
      }
    }
    // format(*args) or format(**kwargs): Python's `fmt % args` (a tuple) or `fmt % kwargs`, as Jinja's filter
    if (name === 'format') {
      const [args, kw] = argsOf();
      if (args.length > 0 && kw.size > 0) throw new Error("can't handle positional and keyword arguments at the same time");
      // the arguments as formatHooks reads them (they stay out of the engine)
      const right: JinjaValue = kw.size > 0 ? { type: 'ObjectValue', value: kw } : { type: 'TupleValue', value: args };
      return new StringValue(pyPercentFormat(pyStr(operand), right, formatHooks)); // Jinja's soft_str(value) % ...
    }
    // a dict's items as (key, value) pairs, printed as Python's tuples (patchDictPairs, tupleLists)
    if (name === 'items' && operand.type === 'ObjectValue') return (operand as unknown as { items(): JinjaValue }).items();
    // list(pair) and list(d.items()) are lists (the engine's list filter returns its operand itself, which would stay a
    // pair or a view)
    if (name === 'list' && (tupleLists.has(operand) || dictViews.has(operand))) return new ArrayValue([...operand.value as JinjaValue[]]);
    return origFilter.call(this, operand, filter, env);
  };
  return (installed = true);
}

/**
 * Python's str.strip / lstrip / rstrip take the characters to strip (`content.lstrip('\n')` in Qwen3's and SmolLM3's
 * templates); @huggingface/jinja 0.5.11 ignores the argument and strips all whitespace, which drops a reply's leading
 * indentation. The string methods are replaced, once, by ones that honour it (no argument or None: whitespace, as
 * before). The engine's classes are not exported: they are reached through a value the Environment converts. Should
 * the engine change shape, nothing is replaced, and test/tokenizer/jinja-python.test.ts says so.
 */
function pyStrip(s: string, chars: string | null, side: 'both' | 'left' | 'right'): string {
  if (chars === null) return side === 'both' ? s.trim() : side === 'left' ? s.trimStart() : s.trimEnd();
  const set = new Set(Array.from(chars));
  const cps = Array.from(s);
  let a = 0, b = cps.length;
  if (side !== 'right') while (a < b && set.has(cps[a]!)) a++;
  if (side !== 'left') while (b > a && set.has(cps[b - 1]!)) b--;
  return cps.slice(a, b).join('');
}

interface EngineValue { value: unknown; builtins: Map<string, unknown> }
/** Replaces the `builtins` getter of an engine class's prototype: each value's map (made once, lazily) is rewritten once. */
function rewriteBuiltins(proto: object, getter: () => unknown, rewrite: (m: Map<string, unknown>, value: EngineValue) => void): void {
  const done = new WeakSet<Map<string, unknown>>();
  Object.defineProperty(proto, 'builtins', {
    configurable: true,
    get(this: EngineValue) {
      const m = getter.call(this) as Map<string, unknown>;
      if (!done.has(m)) { rewrite(m, this); done.add(m); }
      return m;
    },
  });
}
let stripInstalled: boolean | null = null;
function patchStringStrip(): boolean {
  if (stripInstalled !== null) return stripInstalled;
  stripInstalled = false;
  const env = new Environment();
  env.set('s', '');
  const sv = (env as unknown as { variables: Map<string, EngineValue> }).variables.get('s');
  if (!sv) return false;
  const proto = Object.getPrototypeOf(sv) as object;
  const getter = Object.getOwnPropertyDescriptor(proto, 'builtins')?.get;
  const fn = sv.builtins.get('strip');
  if (!getter || !fn || typeof fn !== 'object') return false;
  type Ctor<T> = new (v: T) => EngineValue;
  const FunctionValue = (fn as { constructor: Ctor<(args: EngineValue[]) => EngineValue> }).constructor;
  const StringValue = (sv as unknown as { constructor: Ctor<string> }).constructor;
  rewriteBuiltins(proto, getter, (m, value) => {
    const text = String(value.value);
    const method = (side: 'both' | 'left' | 'right') => new FunctionValue((args: EngineValue[]) => {
      const c = args[0]?.value;
      return new StringValue(pyStrip(text, typeof c === 'string' ? c : null, side));
    });
    m.set('strip', method('both')); m.set('lstrip', method('left')); m.set('rstrip', method('right'));
  });
  return (stripInstalled = true);
}

/** The engine's lists that are Python tuples: a dict's pairs, slices and repetitions of tuples. */
const tupleLists = new WeakSet<object>();
/** The engine's lists that are a dict's views, by the view's Python type. */
const dictViews = new WeakMap<object, 'dict_items' | 'dict_keys' | 'dict_values'>();
/** Whether v is a Python tuple: the engine's own (`(a, b)`) or one of its lists that is one (tupleLists). */
function isTuple(v: JinjaValue): boolean {
  return v.type === 'TupleValue' || (v.type === 'ArrayValue' && tupleLists.has(v));
}

/**
 * A dict's `items()`, the `items` filter and `dictsort` give (key, value) pairs, which Python prints as tuples,
 * `[('a', 1)]`; @huggingface/jinja 0.5.11 makes them lists, `[['a', 1]]`. The pairs stay the engine's lists (its
 * `for k, v in ...` unpacks lists only; indexing and tojson are the same) and are remembered as pairs, which pyStr prints
 * as tuples. The methods `d.items()`, `d.keys()` and `d.values()` give Python's views, which print as
 * `dict_items([('a', 1)])`, `dict_keys(['a'])` and `dict_values([1])`: the engine's lists, remembered as views (the
 * `list` filter makes a plain list of one). Installed once; where the engine changed shape, nothing is replaced, and
 * test/tokenizer/jinja-python.test.ts says so.
 */
let pairsInstalled: boolean | null = null;
function patchDictPairs(): boolean {
  if (pairsInstalled !== null) return pairsInstalled;
  pairsInstalled = false;
  const env = new Environment();
  env.set('d', { k: 1 });
  const dv = (env as unknown as { variables: Map<string, EngineValue> }).variables.get('d');
  if (!dv) return false;
  const proto = Object.getPrototypeOf(dv) as { items?: () => EngineValue };
  const getter = Object.getOwnPropertyDescriptor(proto, 'builtins')?.get;
  const origItems = proto.items, dictsort = dv.builtins.get('dictsort');
  if (!getter || typeof origItems !== 'function' || !dictsort || typeof dictsort !== 'object') return false;
  const probe = origItems.call(dv);
  if (!Array.isArray(probe.value) || !(probe.value as EngineValue[]).every((p) => Array.isArray(p.value) && p.value.length === 2)) return false;
  const pairsOf = (list: EngineValue): EngineValue => {
    for (const p of list.value as EngineValue[]) tupleLists.add(p);
    return list;
  };
  type Ctor<T> = new (v: T) => EngineValue;
  const FunctionValue = (dictsort as { constructor: Ctor<(args: EngineValue[]) => EngineValue> }).constructor;
  proto.items = function (this: EngineValue): EngineValue { return pairsOf(origItems.call(this)); };
  rewriteBuiltins(proto, getter, (m) => {
    const sort = m.get('dictsort') as { value: (args: EngineValue[]) => EngineValue };
    m.set('dictsort', new FunctionValue((args: EngineValue[]) => pairsOf(sort.value(args))));
    for (const [method, view] of [['items', 'dict_items'], ['keys', 'dict_keys'], ['values', 'dict_values']] as const) {
      const f = m.get(method) as { value: (args: EngineValue[]) => EngineValue } | undefined;
      if (!f || typeof f.value !== 'function') continue;
      m.set(method, new FunctionValue((args: EngineValue[]) => {
        const list = f.value(args);
        dictViews.set(list, view);
        return method === 'items' ? pairsOf(list) : list;
      }));
    }
  });
  return (pairsInstalled = true);
}

/** Python's str.strip(chars) and printing, installed into the engine once (false where the engine changed shape). */
export function installPythonSemantics(): boolean {
  const strip = patchStringStrip(), pairs = patchDictPairs();
  return installPythonPrinting() && strip && pairs;
}
