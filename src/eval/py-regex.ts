/**
 * Python `re` patterns, as lm-evaluation-harness's tasks write them (its `regex` filter's regex_pattern, exact_match's
 * regexes_to_ignore), run with JavaScript's RegExp: the pattern is translated so that it matches what Python's `re`
 * matches on a str, and `findall` / `sub` walk the matches as CPython's sre does (an empty match right after another
 * match is kept, the next search then has to move on).
 *
 * What the translation carries over: leading global flags `(?aims)` (ASCII, IGNORECASE, MULTILINE, DOTALL); `.` (not
 * `\n` alone, as Python's); `^`, `$` (Python's `$` also matches before a final `\n`), `\A`, `\Z`; `\d`, `\w`, `\s`,
 * `\b`, `\B` and their negations as Python's Unicode str classes (`\d`: Nd, `\w`: letters, numbers and `_`, `\s`:
 * str.isspace); `(?P<name>…)` and `(?P=name)`; `{,n}`; escapes of any punctuation; a literal `{`, `}` or `]`; a `]`
 * first in a class. What Python has and JavaScript cannot say is refused by name: `(?x)` (verbose), scoped flags
 * `(?i:…)`, conditionals `(?(1)…)`, atomic groups, possessive quantifiers, `\N{…}` names, `(?L)`.
 */
import { InputError } from '../util/errors.js';

/** Python's str.isspace() characters, for use inside a character class. */
const SPACE_CHARS = '\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';
const ASCII_SPACE_CHARS = '\\t\\n\\v\\f\\r ';
/** JavaScript's syntax characters: the only ones a `u`-mode pattern may escape as themselves. */
const SYNTAX = new Set('^$\\.*+?()[]{}|/'.split(''));

/** A compiled pattern: the RegExp (flags g and u) and its count of capturing groups. */
export interface PyPattern { source: string; re: RegExp; groups: number }

function refuse(pattern: string, what: string): never {
  throw new InputError(`the regular expression ${JSON.stringify(pattern)} uses ${what}, which distillery cannot run`, 'write the pattern without it (Python re syntax: distillery runs it with JavaScript\'s RegExp, translated)');
}

/** Translates a Python `re` pattern (str, default flags) into a JavaScript RegExp that matches the same. */
export function pyRegex(pattern: string): PyPattern {
  let i = 0, flags = { a: false, i: false, m: false, s: false };
  // global flags: only at the very start in Python 3.11+
  while (pattern.startsWith('(?', i) && /^[aiLmsux]+\)/.test(pattern.slice(i + 2))) {
    const end = pattern.indexOf(')', i);
    for (const f of pattern.slice(i + 2, end)) {
      if (f === 'x') refuse(pattern, 'verbose mode (?x)');
      if (f === 'L') refuse(pattern, 'the locale flag (?L)');
      if (f === 'a' || f === 'i' || f === 'm' || f === 's') flags = { ...flags, [f]: true };
    }
    i = end + 1;
  }
  const W = flags.a ? 'A-Za-z0-9_' : '\\p{L}\\p{N}_';
  const D = flags.a ? '0-9' : '\\p{Nd}';
  const S = flags.a ? ASCII_SPACE_CHARS : SPACE_CHARS;
  const boundary = `(?:(?<=[${W}])(?![${W}])|(?<![${W}])(?=[${W}]))`;
  const notBoundary = `(?:(?<=[${W}])(?=[${W}])|(?<![${W}])(?![${W}]))`;
  let out = '', groups = 0, inClass = false, classStart = false;
  const names: string[] = [];
  const hex = (c: string): string => `\\u{${c.codePointAt(0)!.toString(16)}}`;
  while (i < pattern.length) {
    const c = pattern[i]!;
    if (c === '\\') {
      const n = pattern[i + 1];
      if (n === undefined) refuse(pattern, 'a trailing backslash');
      i += 2;
      const inside = (s: string): string => s;
      switch (n) {
        case 'd': out += inClass ? inside(D) : `[${D}]`; break;
        case 'w': out += inClass ? inside(W) : `[${W}]`; break;
        case 's': out += inClass ? inside(S) : `[${S}]`; break;
        case 'D': case 'W': case 'S':
          if (inClass) refuse(pattern, `\\${n} inside a character class`);
          out += `[^${n === 'D' ? D : n === 'W' ? W : S}]`; break;
        case 'b': out += inClass ? '\\x08' : boundary; break;
        case 'B': if (inClass) refuse(pattern, '\\B inside a character class'); out += notBoundary; break;
        case 'A': out += '(?<![\\s\\S])'; break;
        case 'Z': out += '(?![\\s\\S])'; break;
        case 'N': refuse(pattern, 'a named character \\N{...}'); break;
        case 'x': case 'u': case 'U': {
          const len = n === 'x' ? 2 : n === 'u' ? 4 : 8;
          const h = pattern.slice(i, i + len);
          if (!new RegExp(`^[0-9a-fA-F]{${len}}$`).test(h)) refuse(pattern, `a malformed \\${n} escape`);
          out += `\\u{${parseInt(h, 16).toString(16)}}`; i += len; break;
        }
        case '0': {
          const oct = /^[0-7]{0,2}/.exec(pattern.slice(i))![0];
          out += `\\u{${parseInt(`0${oct}`, 8).toString(16)}}`; i += oct.length; break;
        }
        case 'a': out += '\\x07'; break;
        case 'n': case 't': case 'r': case 'f': case 'v': out += `\\${n}`; break;
        default:
          if (/[1-9]/.test(n)) {
            const num = /^[0-9]?/.exec(pattern.slice(i))![0];
            if (inClass) refuse(pattern, 'an octal escape inside a character class');
            out += `\\${n}${num}`; i += num.length; break;
          }
          if (/[A-Za-z]/.test(n)) refuse(pattern, `the unknown escape \\${n}`);
          out += SYNTAX.has(n) || (inClass && n === '-') ? `\\${n}` : hex(n);
      }
      classStart = false;
      continue;
    }
    if (inClass) {
      if (c === ']' && !classStart) { inClass = false; out += ']'; i++; continue; }
      if (c === '^' && classStart && out.endsWith('[')) { out += '^'; i++; continue; }
      classStart = false;
      out += c === '[' || c === ']' || c === '/' ? `\\${c}` : c;
      i++;
      continue;
    }
    if (c === '[') {
      inClass = true; classStart = true; out += '['; i++;
      if (pattern[i] === '^') { out += '^'; i++; }
      continue;
    }
    if (c === '(') {
      if (pattern[i + 1] !== '?') { groups++; out += '('; i++; continue; }
      const rest = pattern.slice(i + 2);
      let m: RegExpExecArray | null;
      if ((m = /^P<([A-Za-z_][A-Za-z0-9_]*)>/.exec(rest))) { groups++; names.push(m[1]!); out += `(?<${m[1]}>`; i += 2 + m[0].length; continue; }
      if ((m = /^P=([A-Za-z_][A-Za-z0-9_]*)\)/.exec(rest))) { out += `\\k<${m[1]}>`; i += 2 + m[0].length; continue; }
      if ((m = /^<([A-Za-z_][A-Za-z0-9_]*)>/.exec(rest))) { groups++; names.push(m[1]!); out += `(?<${m[1]}>`; i += 2 + m[0].length; continue; }
      if (rest.startsWith('#')) {
        const end = pattern.indexOf(')', i);
        if (end < 0) refuse(pattern, 'an unclosed comment');
        i = end + 1; continue;
      }
      if (/^(:|=|!|<=|<!)/.test(rest)) { const k = /^(:|=|!|<=|<!)/.exec(rest)![0]; out += `(?${k}`; i += 2 + k.length; continue; }
      if (rest.startsWith('>')) refuse(pattern, 'an atomic group (?>...)');
      if (rest.startsWith('(')) refuse(pattern, 'a conditional group (?(...)...)');
      if (/^[-aiLmsux]+[:)]/.test(rest)) refuse(pattern, 'flags inside the pattern (Python\'s (?i:...) or a flag group not at the start)');
      refuse(pattern, `the group syntax (?${rest.slice(0, 2)}`);
    }
    if (c === '{') {
      const m = /^\{(\d*)(,?)(\d*)\}/.exec(pattern.slice(i));
      if (m && (m[1] !== '' || (m[2] === ',' && m[3] !== ''))) {
        if (pattern[i + m[0].length] === '+') refuse(pattern, 'a possessive quantifier');
        out += `{${m[1] === '' ? '0' : m[1]}${m[2]}${m[3]}}`; i += m[0].length; continue;
      }
      out += '\\{'; i++; continue;
    }
    if (c === '}' || c === ']' || c === '/') { out += `\\${c}`; i++; continue; }
    if ((c === '*' || c === '+' || c === '?' || c === '}') && pattern[i + 1] === '+') refuse(pattern, 'a possessive quantifier');
    if (c === '.') { out += flags.s ? '[\\s\\S]' : '[^\\n]'; i++; continue; }
    if (c === '^') { out += flags.m ? '(?<![^\\n])' : '(?<![\\s\\S])'; i++; continue; }
    if (c === '$') { out += flags.m ? '(?![^\\n])' : '(?=\\n?(?![\\s\\S]))'; i++; continue; }
    out += c; i++;
  }
  if (inClass) refuse(pattern, 'an unterminated character class');
  let re: RegExp;
  try { re = new RegExp(out, `gu${flags.i ? 'i' : ''}`); } catch (e) {
    throw new InputError(`the regular expression ${JSON.stringify(pattern)} does not compile (${(e as Error).message.replace(/^Invalid regular expression: /, '')})`, 'check the pattern (Python re syntax)');
  }
  void names;
  return { source: pattern, re, groups };
}

/** The spans of Python's non-overlapping matches, in order: after an empty match the next one must not be empty where it was. */
function matches(p: PyPattern, s: string): RegExpExecArray[] {
  const out: RegExpExecArray[] = [];
  const re = new RegExp(p.re.source, p.re.flags);
  let start = 0, mustAdvance = false;
  while (start <= s.length) {
    re.lastIndex = start;
    let m = re.exec(s);
    if (m && mustAdvance && m[0] === '' && m.index === start) {
      // sre would look for a non-empty match here first; the patterns that can match both ways here are rare
      if (start >= s.length) break;
      re.lastIndex = start + (s.codePointAt(start)! > 0xffff ? 2 : 1);
      m = re.exec(s);
    }
    if (!m) break;
    out.push(m);
    const end = m.index + m[0].length;
    mustAdvance = end === m.index;
    start = end;
  }
  return out;
}

/** Python's `re.findall`: the whole matches without groups, a group's text with one ('' where it did not take part), tuples with more. */
export function pyFindall(p: PyPattern, s: string): Array<string | string[]> {
  return matches(p, s).map((m) => (p.groups === 0 ? m[0] : p.groups === 1 ? m[1] ?? '' : Array.from({ length: p.groups }, (_, g) => m[g + 1] ?? '')));
}

/** Python's `re.sub(pattern, repl, s)` with a literal replacement (no group references in it). */
export function pySub(p: PyPattern, repl: string, s: string): string {
  let out = '', at = 0;
  for (const m of matches(p, s)) {
    out += s.slice(at, m.index) + repl;
    at = m.index + m[0].length;
  }
  return out + s.slice(at);
}

const STRIP = new RegExp(`^[${SPACE_CHARS}]+|[${SPACE_CHARS}]+$`, 'gu');

/** Python's `str.strip()`: str.isspace characters off both ends. */
export function pyStrip(s: string): string {
  return s.replace(STRIP, '');
}
