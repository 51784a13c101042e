/**
 * Python `re` patterns, as lm-evaluation-harness's tasks write them (its `regex` filter's regex_pattern, exact_match's
 * regexes_to_ignore), run with JavaScript's RegExp: the pattern is translated so that it matches what Python's `re`
 * matches on a str, and `findall` / `sub` walk the matches as CPython's sre does (an empty match right after another
 * match is kept, the next search then has to move on).
 *
 * What the translation carries over: leading global flags `(?aims)` (ASCII, IGNORECASE, MULTILINE, DOTALL); `.` (not
 * `\n` alone, as Python's); `^`, `$` (Python's `$` also matches before a final `\n`), `\A`, `\Z`; `\d`, `\w`, `\s`,
 * `\b`, `\B` and their negations as Python's Unicode str classes (`\d`: Nd, `\w`: letters, numbers and `_`, `\s`:
 * str.isspace), inside classes too (`[\s\S]`); `(?P<name>…)`; `{,n}` and `{,}`; octal escapes; escapes of any
 * punctuation; a literal `{`, `}` or `]`; a `]` first in a class. What Python has and JavaScript cannot say, or says
 * otherwise, is refused by name: `(?x)` (verbose), scoped flags `(?i:…)`, conditionals `(?(1)…)`, atomic groups,
 * possessive quantifiers, `\N{…}` names, `(?L)`, back-references (`\1`, `(?P=name)`: a group that did not take part
 * matches nothing in Python, the empty string in JavaScript) and a capturing group inside a group repeated more than
 * once (JavaScript clears its capture at each repetition, Python keeps the last). Case-insensitive matching folds case
 * as JavaScript does (a few characters, such as U+0130 and the Kelvin sign, fold otherwise in Python).
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
  let out = '', groups = 0;
  // open groups: whether each captures, and whether it holds a capturing group (a repeated one is refused: see below)
  const open: Array<{ captures: boolean; holds: boolean }> = [];
  while (i < pattern.length) {
    const c = pattern[i]!;
    if (c === '[') {
      const cls = translateClass(pattern, i, { W, D, S });
      out += cls.out; i = cls.end; continue;
    }
    if (c === ')') {
      const g = open.pop();
      if (!g) refuse(pattern, 'an unbalanced parenthesis');
      const holds = g.captures || g.holds;
      if (open.length && holds) open[open.length - 1]!.holds = true;
      // JavaScript clears a group's capture at each repetition, Python keeps the last one that took part
      if (holds && repeats(pattern, i + 1)) refuse(pattern, 'a capturing group inside a repeated group (JavaScript and Python capture it differently)');
      out += ')'; i++; continue;
    }
    if (c === '\\') {
      const n = pattern[i + 1];
      if (n === undefined) refuse(pattern, 'a trailing backslash');
      i += 2;
      switch (n) {
        case 'd': out += `[${D}]`; break;
        case 'w': out += `[${W}]`; break;
        case 's': out += `[${S}]`; break;
        case 'D': case 'W': case 'S': out += `[^${n === 'D' ? D : n === 'W' ? W : S}]`; break;
        case 'b': out += boundary; break;
        case 'B': out += notBoundary; break;
        case 'A': out += '(?<![\\s\\S])'; break;
        case 'Z': out += '(?![\\s\\S])'; break;
        default: {
          const e = charEscape(pattern, i - 2);
          out += e.out; i = e.end;
        }
      }
      continue;
    }
    if (c === '(') {
      if (pattern[i + 1] !== '?') { groups++; open.push({ captures: true, holds: false }); out += '('; i++; continue; }
      const rest = pattern.slice(i + 2);
      let m: RegExpExecArray | null;
      if ((m = /^P<([A-Za-z_][A-Za-z0-9_]*)>/.exec(rest))) { groups++; open.push({ captures: true, holds: false }); out += `(?<${m[1]}>`; i += 2 + m[0].length; continue; }
      if (/^P=/.test(rest)) refuse(pattern, 'a back-reference (Python and JavaScript differ on a group that did not take part)');
      if (rest.startsWith('#')) {
        const end = pattern.indexOf(')', i);
        if (end < 0) refuse(pattern, 'an unclosed comment');
        i = end + 1; continue;
      }
      if (/^(:|=|!|<=|<!)/.test(rest)) { const k = /^(:|=|!|<=|<!)/.exec(rest)![0]; open.push({ captures: false, holds: false }); out += `(?${k}`; i += 2 + k.length; continue; }
      if (rest.startsWith('>')) refuse(pattern, 'an atomic group (?>...)');
      if (rest.startsWith('(')) refuse(pattern, 'a conditional group (?(...)...)');
      if (/^[-aiLmsux]+[:)]/.test(rest)) refuse(pattern, 'flags inside the pattern (Python\'s (?i:...) or a flag group not at the start)');
      refuse(pattern, `the group syntax (?${rest.slice(0, 2)}`);
    }
    if (c === '{') {
      const m = /^\{(\d*)(,?)(\d*)\}/.exec(pattern.slice(i));
      if (m && (m[1] !== '' || m[2] === ',')) {
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
  if (open.length) refuse(pattern, 'an unclosed group');
  let re: RegExp;
  try { re = new RegExp(out, `gu${flags.i ? 'i' : ''}`); } catch (e) {
    throw new InputError(`the regular expression ${JSON.stringify(pattern)} does not compile (${(e as Error).message.replace(/^Invalid regular expression: /, '')})`, 'check the pattern (Python re syntax)');
  }
  return { source: pattern, re, groups };
}

/** Whether the text at i quantifies what precedes it more than once: *, + or {m,n} with n unbounded or above 1 (lazy or not). */
function repeats(pattern: string, i: number): boolean {
  const c = pattern[i];
  if (c === '*' || c === '+') return true;
  const m = /^\{(\d*)(,?)(\d*)\}/.exec(pattern.slice(i));
  if (!m || (m[1] === '' && m[2] === '')) return false;
  if (m[2] === '') return Number(m[1]) > 1;
  return m[3] === '' || Number(m[3]) > 1;
}

/**
 * A character escape at i (the backslash) outside the class escapes (\d \w \s \b...): its JavaScript form and where the
 * pattern goes on. Python's octal escapes (\0, \0oo, \ooo) become the character; \1 to \99 otherwise are back-references,
 * refused (Python and JavaScript differ on a group that did not take part).
 */
function charEscape(pattern: string, i: number): { out: string; end: number } {
  const n = pattern[i + 1]!;
  const hex = (cp: number): string => `\\u{${cp.toString(16)}}`;
  let m: RegExpExecArray | null;
  switch (n) {
    case 'N': refuse(pattern, 'a named character \\N{...}');
    // falls through (refuse throws)
    case 'x': case 'u': case 'U': {
      const len = n === 'x' ? 2 : n === 'u' ? 4 : 8;
      const h = pattern.slice(i + 2, i + 2 + len);
      if (!new RegExp(`^[0-9a-fA-F]{${len}}$`).test(h)) refuse(pattern, `a malformed \\${n} escape`);
      return { out: hex(parseInt(h, 16)), end: i + 2 + len };
    }
    case 'a': return { out: '\\x07', end: i + 2 };
    case 'n': case 't': case 'r': case 'f': case 'v': return { out: `\\${n}`, end: i + 2 };
    default:
      if (n === '0') { const oct = /^[0-7]{0,2}/.exec(pattern.slice(i + 2))![0]; return { out: hex(parseInt(`0${oct}`, 8)), end: i + 2 + oct.length }; }
      if ((m = /^[0-7]{3}/.exec(pattern.slice(i + 1)))) return { out: hex(parseInt(m[0], 8)), end: i + 4 };
      if (/[1-9]/.test(n)) refuse(pattern, 'a back-reference (Python and JavaScript differ on a group that did not take part)');
      if (/[A-Za-z0-9]/.test(n)) refuse(pattern, `the unknown escape \\${n}`);
      return { out: SYNTAX.has(n) ? `\\${n}` : hex(n.codePointAt(0)!), end: i + 1 + (n.codePointAt(0)! > 0xffff ? 2 : 1) };
  }
}

/**
 * A character class at i ('['): Python's rules (a ']' first is a character; '[' inside is one too), its \d \w \s as
 * Unicode classes, and \D \W \S inside it (which a JavaScript class cannot hold) as a union with their complements:
 * [A\S] is (?:[A]|[^S]), [^A\S] is a character in S and not in A.
 */
function translateClass(pattern: string, i: number, sets: { W: string; D: string; S: string }): { out: string; end: number } {
  let j = i + 1, pos = '';
  const neg: string[] = [];
  const negated = pattern[j] === '^';
  if (negated) j++;
  let first = true;
  for (;;) {
    const c = pattern[j];
    if (c === undefined) refuse(pattern, 'an unterminated character class');
    if (c === ']' && !first) break;
    first = false;
    if (c === '\\') {
      const n = pattern[j + 1];
      if (n === undefined) refuse(pattern, 'a trailing backslash');
      if (n === 'd' || n === 'w' || n === 's') { pos += n === 'd' ? sets.D : n === 'w' ? sets.W : sets.S; j += 2; continue; }
      if (n === 'D' || n === 'W' || n === 'S') { neg.push(n === 'D' ? sets.D : n === 'W' ? sets.W : sets.S); j += 2; continue; }
      if (n === 'b') { pos += '\\x08'; j += 2; continue; }
      if (n === '-' || n === ']' || n === '[' || n === '\\' || n === '^') { pos += `\\${n}`; j += 2; continue; }
      if (n === 'B' || n === 'A' || n === 'Z') refuse(pattern, `\\${n} inside a character class`);
      const e = charEscape(pattern, j);
      pos += e.out; j = e.end; continue;
    }
    pos += c === '[' || c === ']' || c === '/' ? `\\${c}` : c;
    j += c.codePointAt(0)! > 0xffff ? 2 : 1;
  }
  const end = j + 1;
  if (!neg.length) return { out: `[${negated ? '^' : ''}${pos}]`, end };
  if (!negated) return { out: `(?:${[...(pos ? [`[${pos}]`] : []), ...neg.map((n) => `[^${n}]`)].join('|')})`, end };
  return { out: `(?:${pos ? `(?![${pos}])` : ''}${neg.map((n) => `(?=[${n}])`).join('')}[\\s\\S])`, end };
}

/**
 * Python's non-overlapping matches, in order, as sre finds them: after an empty match the next search starts where it
 * was and first looks for a non-empty match there (the pattern followed by "not where it started"), then from the next
 * character on, where an empty match is allowed again.
 */
function matches(p: PyPattern, s: string): RegExpExecArray[] {
  const out: RegExpExecArray[] = [];
  const re = new RegExp(p.re.source, p.re.flags);
  let start = 0, mustAdvance = false;
  while (start <= s.length) {
    let m: RegExpExecArray | null = null;
    if (mustAdvance) {
      const before = [...s.slice(0, start)].length;
      const nonEmpty = new RegExp(`(?:${p.re.source})(?<!^[\\s\\S]{${before}})`, p.re.flags.replace('g', '') + 'y');
      nonEmpty.lastIndex = start;
      m = nonEmpty.exec(s);
      if (!m) {
        if (start >= s.length) break;
        re.lastIndex = start + (s.codePointAt(start)! > 0xffff ? 2 : 1);
        m = re.exec(s);
      }
    } else {
      re.lastIndex = start;
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
