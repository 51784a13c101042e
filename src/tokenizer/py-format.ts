/**
 * Python's printf-style string formatting (`'%s: %.2f' % (name, x)`, Jinja's `format` filter) and its float conversions,
 * for chat templates (src/tokenizer/jinja-python.ts installs them into the engine, which has neither). Floats are
 * rounded as Python rounds them: half to even on the double's exact binary value (JavaScript's toFixed rounds a tie
 * up: 0.125 to 2 places is '0.13' there, '0.12' in Python). Errors carry Python's messages.
 */

/** A template value as the engine has it (its `type` names the kind: StringValue, IntegerValue, ...). */
export interface FormatValue { type: string; value: unknown }

/** How the caller's values print and unpack (Python's str, repr; a tuple's items; a dict's entries). */
export interface FormatHooks {
  str(v: FormatValue): string;
  repr(v: FormatValue): string;
  /** The items of a Python tuple, else null (a list is one argument, as in Python). */
  tupleItems(v: FormatValue): FormatValue[] | null;
  /** A dict's entries, else null. */
  mapping(v: FormatValue): Map<string, FormatValue> | null;
  /**
   * Whether Python's `%` takes v as its mapping: a value with __getitem__ other than a tuple or a str (a dict, a list,
   * jinja2's Undefined). A mapping is never "not all arguments converted".
   */
  isMapping(v: FormatValue): boolean;
}

/** Python's name of a value's type, for error messages. */
export function pyTypeName(v: FormatValue, hooks: FormatHooks): string {
  switch (v.type) {
    case 'StringValue': return 'str';
    case 'IntegerValue': return 'int';
    case 'FloatValue': return 'float';
    case 'BooleanValue': return 'bool';
    case 'NullValue': case 'UndefinedValue': return 'NoneType';
    case 'ObjectValue': case 'KeywordArgumentsValue': return 'dict';
    default: return hooks.tupleItems(v) ? 'tuple' : v.type === 'ArrayValue' ? 'list' : v.type;
  }
}

// ---- exact decimal rounding of a double -------------------------------------------------------------------------
/** |x| (finite) as mant · 2^exp exactly. */
function binaryParts(x: number): { mant: bigint; exp: number } {
  const dv = new DataView(new ArrayBuffer(8));
  dv.setFloat64(0, Math.abs(x));
  const hi = dv.getUint32(0), lo = dv.getUint32(4);
  const e = (hi >>> 20) & 0x7ff, m = (BigInt(hi & 0xfffff) << 32n) | BigInt(lo);
  return e === 0 ? { mant: m, exp: -1074 } : { mant: m | (1n << 52n), exp: e - 1075 };
}

/** round(|x| · 10^k) to an integer, half to even, on x's exact value (k may be negative). */
function scaledRound(x: number, k: number): bigint {
  const { mant, exp } = binaryParts(x);
  let num = mant, den = 1n;
  if (exp >= 0) num <<= BigInt(exp); else den <<= BigInt(-exp);
  if (k >= 0) num *= 10n ** BigInt(k); else den *= 10n ** BigInt(-k);
  const q = num / den, r2 = 2n * (num % den);
  return r2 > den || (r2 === den && (q & 1n) === 1n) ? q + 1n : q;
}

/** |x| with `prec` decimals (Python's '%.{prec}f' without the sign); `alt` keeps the point at 0 decimals. */
function fixedDigits(x: number, prec: number, alt: boolean): string {
  const s = scaledRound(x, prec).toString().padStart(prec + 1, '0');
  const int = s.slice(0, s.length - prec), frac = s.slice(s.length - prec);
  return prec > 0 ? `${int}.${frac}` : alt ? `${int}.` : int;
}

/** |x| as d.ddd (prec digits after the point) and its decimal exponent, rounded half to even. */
function expParts(x: number, prec: number): { digits: string; exp: number } {
  if (x === 0) return { digits: '0'.repeat(prec + 1), exp: 0 };
  let e = Math.floor(Math.log10(Math.abs(x)));
  for (;;) {
    const n = scaledRound(x, prec - e), s = n.toString();
    if (s.length > prec + 1) { e++; continue; } // rounded up to the next power of ten, or log10 fell short
    if (s.length < prec + 1) { e--; continue; } // log10 overshot
    return { digits: s, exp: e };
  }
}

function expString(digits: string, exp: number, upper: boolean, alt: boolean): string {
  const mant = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : alt ? `${digits}.` : digits;
  return `${mant}${upper ? 'E' : 'e'}${exp < 0 ? '-' : '+'}${String(Math.abs(exp)).padStart(2, '0')}`;
}

/** Python's '%{type}' of a float's magnitude (no sign) for type e, E, f, F, g or G at `prec` (null: 6). */
export function pyFloatFormat(x: number, type: string, prec: number | null, alt = false): string {
  const upper = type === 'E' || type === 'F' || type === 'G';
  if (Number.isNaN(x)) return upper ? 'NAN' : 'nan';
  if (!Number.isFinite(x)) return upper ? 'INF' : 'inf';
  const p = prec ?? 6;
  if (type === 'f' || type === 'F') return fixedDigits(x, p, alt);
  if (type === 'e' || type === 'E') { const { digits, exp } = expParts(x, p); return expString(digits, exp, upper, alt); }
  // g: P significant digits; fixed where the exponent is in [-4, P), trailing zeros dropped unless alt
  const P = p === 0 ? 1 : p;
  const { digits, exp } = expParts(x, P - 1);
  let out = exp >= -4 && exp < P ? fixedDigits(x, P - 1 - exp, alt) : expString(digits, exp, upper, alt);
  if (!alt) {
    const [m, e] = out.split(/(?=[eE])/) as [string, string | undefined];
    out = (m.includes('.') ? m.replace(/0+$/, '').replace(/\.$/, '') : m) + (e ?? '');
  }
  return out;
}

// ---- the % operator ----------------------------------------------------------------------------------------------
/** A Python exception raised by formatting or arithmetic: its message reads `TypeError: not enough arguments ...`. */
export class PyFormatError extends Error {
  constructor(readonly pyType: 'TypeError' | 'ValueError' | 'KeyError' | 'OverflowError' | 'ZeroDivisionError' | 'UndefinedError', readonly pyMessage: string) {
    super(`${pyType}: ${pyMessage}`);
  }
}

/** A conversion specifier; `at`: the index of its type character (Python's error messages name it). */
interface Spec { key: string | null; flags: string; width: number | '*' | null; prec: number | '*' | null; type: string; at: number }

/** The conversion specifiers of `fmt` and the literal text between them. */
function parse(fmt: string): Array<string | Spec> {
  const out: Array<string | Spec> = [];
  let i = 0, lit = '';
  while (i < fmt.length) {
    const c = fmt[i]!;
    if (c !== '%') { lit += c; i++; continue; }
    const start = i++;
    let key: string | null = null;
    if (fmt[i] === '(') {
      let depth = 1, j = i + 1;
      while (j < fmt.length && depth > 0) { if (fmt[j] === '(') depth++; else if (fmt[j] === ')') depth--; j++; }
      if (depth > 0) throw new PyFormatError('ValueError', 'incomplete format key');
      key = fmt.slice(i + 1, j - 1);
      i = j;
    }
    let flags = '';
    while (i < fmt.length && '-+ #0'.includes(fmt[i]!)) flags += fmt[i++];
    const num = (): number | '*' | null => {
      if (fmt[i] === '*') { i++; return '*'; }
      const m = /^\d+/.exec(fmt.slice(i));
      if (!m) return null;
      i += m[0].length;
      return Number(m[0]);
    };
    const width = num();
    let prec: number | '*' | null = null;
    if (fmt[i] === '.') { i++; prec = num() ?? 0; }
    while (i < fmt.length && 'hlL'.includes(fmt[i]!)) i++; // length modifiers: Python ignores them
    if (i >= fmt.length) throw new PyFormatError('ValueError', 'incomplete format');
    const type = fmt[i++]!;
    if (type === '%' && i - start === 2) { lit += '%'; continue; } // '%%'; with anything between, an unsupported conversion
    if (lit) { out.push(lit); lit = ''; }
    out.push({ key, flags, width, prec, type, at: i - 1 });
  }
  if (lit) out.push(lit);
  return out;
}

function pad(body: string, sign: string, prefix: string, spec: { flags: string; width: number }, numeric: boolean): string {
  const len = sign.length + prefix.length + body.length;
  if (len >= spec.width) return sign + prefix + body;
  const fill = spec.width - len;
  if (spec.flags.includes('-')) return sign + prefix + body + ' '.repeat(fill);
  if (numeric && spec.flags.includes('0')) return sign + prefix + '0'.repeat(fill) + body;
  return ' '.repeat(fill) + sign + prefix + body;
}

function signOf(negative: boolean, flags: string): string {
  return negative ? '-' : flags.includes('+') ? '+' : flags.includes(' ') ? ' ' : '';
}

function asNumber(v: FormatValue, type: string, hooks: FormatHooks, integer: boolean): number {
  if (v.type === 'IntegerValue' || v.type === 'FloatValue') {
    const x = v.value as number;
    if (integer && v.type === 'FloatValue') {
      if (type !== 'd' && type !== 'i' && type !== 'u') throw new PyFormatError('TypeError', `%${type} format: an integer is required, not float`);
      if (Number.isNaN(x)) throw new PyFormatError('ValueError', 'cannot convert float NaN to integer');
      if (!Number.isFinite(x)) throw new PyFormatError('OverflowError', 'cannot convert float infinity to integer');
      return Math.trunc(x);
    }
    return x;
  }
  if (v.type === 'BooleanValue') return v.value ? 1 : 0;
  const t = pyTypeName(v, hooks);
  if (!integer) throw new PyFormatError('TypeError', `must be real number, not ${t}`);
  throw new PyFormatError('TypeError', type === 'd' || type === 'i' || type === 'u' ? `%${type} format: a real number is required, not ${t}` : `%${type} format: an integer is required, not ${t}`);
}

/** Python's escape of a code point in a str's repr: \\xhh, \\uhhhh or \\Uhhhhhhhh. */
export function pyEscape(cp: number): string {
  return cp < 0x100 ? `\\x${cp.toString(16).padStart(2, '0')}` : cp < 0x10000 ? `\\u${cp.toString(16).padStart(4, '0')}` : `\\U${cp.toString(16).padStart(8, '0')}`;
}

/** Python's ascii(): repr with every non-ASCII character escaped. */
function asciiOf(repr: string): string {
  let out = '';
  for (const ch of repr) {
    const cp = ch.codePointAt(0)!;
    out += cp < 0x80 ? ch : pyEscape(cp);
  }
  return out;
}

function convert(spec: { flags: string; width: number; prec: number | null; type: string; at: number }, v: FormatValue, hooks: FormatHooks): string {
  const { flags, prec, type } = spec;
  switch (type) {
    case 's': case 'r': case 'a': {
      let s = type === 's' ? hooks.str(v) : type === 'r' ? hooks.repr(v) : asciiOf(hooks.repr(v));
      if (prec !== null) s = Array.from(s).slice(0, prec).join('');
      return pad(s, '', '', spec, false);
    }
    case 'c': {
      let ch: string;
      const chars = v.type === 'StringValue' ? Array.from(v.value as string) : null;
      if (chars && chars.length === 1) ch = chars[0]!;
      else if (v.type === 'IntegerValue' || v.type === 'BooleanValue') {
        const n = Number(v.value);
        if (n < 0 || n > 0x10ffff) throw new PyFormatError('OverflowError', '%c arg not in range(0x110000)');
        ch = String.fromCodePoint(n);
      } else throw new PyFormatError('TypeError', '%c requires int or char');
      return pad(ch, '', '', spec, false);
    }
    case 'd': case 'i': case 'u': case 'o': case 'x': case 'X': {
      const n = asNumber(v, type, hooks, true);
      const radix = type === 'o' ? 8 : type === 'x' || type === 'X' ? 16 : 10;
      // BigInt: a number past 2^53 prints all its digits, as Python's int does (toString would round or use an exponent)
      let digits = (n < 0 ? -BigInt(n) : BigInt(n)).toString(radix);
      if (type === 'X') digits = digits.toUpperCase();
      if (prec !== null && digits.length < prec) digits = digits.padStart(prec, '0');
      const prefix = flags.includes('#') && radix !== 10 ? (type === 'o' ? '0o' : type === 'x' ? '0x' : '0X') : '';
      return pad(digits, signOf(n < 0, flags), prefix, spec, true);
    }
    case 'e': case 'E': case 'f': case 'F': case 'g': case 'G': {
      const x = asNumber(v, type, hooks, false);
      const body = pyFloatFormat(x, type, prec, flags.includes('#'));
      return pad(body, signOf(x < 0 || Object.is(x, -0), flags), '', spec, true); // Python zero-fills inf and nan too
    }
    default: {
      const cp = type.codePointAt(0)!;
      throw new PyFormatError('ValueError', `unsupported format character '${type}' (0x${cp.toString(16)}) at index ${spec.at}`);
    }
  }
}

/**
 * Python's `fmt % right`, as CPython's formatter runs it: a tuple's items are the positional arguments, anything else (a
 * list too) is one; a mapping (hooks.isMapping: a dict, a list, Undefined) also serves `%(key)s`, after which no
 * positional argument is left; an argument is taken before its conversion is checked; every positional argument of a
 * tuple or of a single value that is not a mapping must be used.
 */
export function pyPercentFormat(fmt: string, right: FormatValue, hooks: FormatHooks): string {
  const parts = parse(fmt);
  const items = hooks.tupleItems(right);
  const dict = items === null && right.type !== 'StringValue' && hooks.isMapping(right) ? right : null;
  // CPython's state: a tuple's items (arglen its length, argidx from 0), or one value (arglen -1, argidx -2)
  let single = right, arglen = items ? items.length : -1, argidx = items ? 0 : -2;
  const take = (): FormatValue => {
    if (argidx >= arglen) throw new PyFormatError('TypeError', 'not enough arguments for format string');
    const i = argidx++;
    return arglen < 0 ? single : items![i]!;
  };
  const star = (x: number | '*' | null): number | null => {
    if (x !== '*') return x;
    const v = take();
    if (v.type !== 'IntegerValue' && v.type !== 'BooleanValue') throw new PyFormatError('TypeError', '* wants int');
    return Number(v.value);
  };
  let out = '';
  for (const p of parts) {
    if (typeof p === 'string') { out += p; continue; }
    if (p.key !== null) {
      if (!dict) throw new PyFormatError('TypeError', 'format requires a mapping');
      const map = hooks.mapping(dict);
      if (!map) {
        if (dict.type === 'UndefinedValue') throw new PyFormatError('UndefinedError', 'the value of the format is undefined');
        throw new PyFormatError('TypeError', 'list indices must be integers or slices, not str');
      }
      const got = map.get(p.key);
      if (got === undefined) throw new PyFormatError('KeyError', `'${p.key}'`);
      single = got; arglen = -1; argidx = -2;
    }
    let width = star(p.width) ?? 0, flags = p.flags;
    if (width < 0) { flags += '-'; width = -width; } // a negative '*' width left-justifies, as in Python
    const precIn = star(p.prec), prec = precIn !== null && precIn < 0 ? 0 : precIn;
    out += convert({ flags, width, prec, type: p.type, at: p.at }, take(), hooks);
  }
  if (argidx < arglen && !dict) throw new PyFormatError('TypeError', 'not all arguments converted during string formatting');
  return out;
}

// ---- numbers ----------------------------------------------------------------------------------------------------
/**
 * Python's `a / b`, `a // b` and `a % b` over numbers (`int`: both operands are ints or bools): true division is a float;
 * floor division and modulo round toward negative infinity, so a modulo takes the divisor's sign (`-7 % 3` is 2 where
 * JavaScript's remainder is -1); a zero divisor raises ZeroDivisionError (JavaScript gives Infinity or NaN).
 */
export function pyArith(op: '/' | '//' | '%', a: number, b: number, int: boolean): { value: number; int: boolean } {
  if (b === 0) {
    throw new PyFormatError('ZeroDivisionError', op === '/' ? (int ? 'division by zero' : 'float division by zero')
      : int ? (op === '//' ? 'integer division or modulo by zero' : 'integer modulo by zero') : op === '//' ? 'float floor division by zero' : 'float modulo');
  }
  if (op === '/') return { value: a / b, int: false };
  // CPython's divmod of floats (float_divmod), exact for ints within 2^53: the remainder by fmod (JavaScript's %), moved
  // to the divisor's sign; the quotient (a - mod) / b, rounded to the nearest integer (Math.floor(a / b) is off where
  // a / b rounds up to an integer: 1 // 0.1 is 9.0 in Python)
  // C's tests of nonzero (a NaN is nonzero there, falsy in JavaScript)
  let mod = a % b, div = (a - mod) / b;
  if (mod !== 0) {
    if ((b < 0) !== (mod < 0)) { mod += b; div -= 1; }
  } else mod = b < 0 ? -0 : 0;
  let floordiv: number;
  if (div !== 0) {
    floordiv = Math.floor(div);
    if (div - floordiv > 0.5) floordiv += 1;
  } else {
    const q = a / b;
    floordiv = q < 0 || Object.is(q, -0) ? -0 : 0; // copysign(0, a / b)
  }
  const value = op === '//' ? floordiv : mod;
  return { value: int ? value + 0 : value, int }; // an int has no negative zero
}
