/**
 * Translation of the Oniguruma regexes found in Hugging Face tokenizer.json files (compiled by the Rust `tokenizers`
 * crate with Oniguruma) into equivalent JavaScript regexes with the 'u' flag.
 *
 * Handled: inline case-insensitive groups `(?i:...)` (JS has none: letters inside become `[xX]` classes), `\s` / `\S`
 * (Oniguruma's Unicode White_Space set, which differs from JS `\s` on U+0085 and U+FEFF), `.` (Oniguruma excludes
 * only `\n`), `\x{HHHH}`, `\A` / `\z` / `\Z`, and identity escapes that are SyntaxErrors in JS 'u' mode.
 * Possessive quantifiers and atomic groups have no JS equivalent and are rejected with a DistilleryError.
 */
import { DistilleryError } from '../util/errors.js';

const SYNTAX = new Set([...'^$\\.*+?()[]{}|/']);
const WS = '\\p{White_Space}';
const NWS = '\\P{White_Space}';

function caseVariants(ch: string): string {
  const lo = ch.toLowerCase(), up = ch.toUpperCase();
  if (lo === up || [...lo].length !== 1 || [...up].length !== 1) return '';
  return lo === ch ? up : lo;
}

function escapeForClass(ch: string): string {
  return /[\]\\^-]/.test(ch) ? `\\${ch}` : ch;
}

/** Translates an Oniguruma pattern (as used in tokenizer.json) to JS regex source for the 'u' flag. */
export function translateOnigRegex(src: string): string {
  let out = '';
  let inClass = false;
  // Stack of open groups: true where the group is (?i:...).
  const groups: boolean[] = [];
  const ci = (): boolean => groups.includes(true);
  const chars = [...src];
  const bad = (what: string): never => {
    throw new DistilleryError(`tokenizer regex ${JSON.stringify(src)}: ${what} has no JavaScript equivalent`,
      'use a tokenizer whose pre-tokenizer pattern avoids it');
  };
  // True right after a quantifier (*, +, ?, {n,m}) outside a class: a following '+' would be possessive.
  let lastQuant = false;
  for (let i = 0; i < chars.length; i++) {
    const c = chars[i]!;
    if (c === '\\' || inClass || c === '[' || c === '(' || c === ')') lastQuant = false;
    if (c === '\\') {
      const n = chars[i + 1];
      if (n === undefined) bad('a trailing backslash');
      i++;
      if (n === 's') { out += WS; continue; }
      if (n === 'S') { out += NWS; continue; }
      if (n === 'A') { out += inClass ? 'A' : '^'; continue; }
      if (n === 'z') { out += inClass ? 'z' : '$'; continue; }
      if (n === 'Z') { out += inClass ? 'Z' : '(?=\\n?$)'; continue; }
      if (n === 'h' || n === 'H' || n === 'G' || n === 'K' || n === 'R' || n === 'X') bad(`\\${n}`);
      if (n === 'x' && chars[i + 1] === '{') {
        const close = chars.indexOf('}', i + 2);
        if (close < 0) bad('an unterminated \\x{');
        out += `\\u{${chars.slice(i + 2, close).join('')}}`;
        i = close;
        continue;
      }
      if (n === 'p' || n === 'P') {
        // \p{...} copied whole (JS 'u' mode supports the general categories used by tokenizers).
        if (chars[i + 1] === '{') {
          const close = chars.indexOf('}', i + 2);
          if (close < 0) bad('an unterminated \\p{');
          out += `\\${n}{${chars.slice(i + 2, close).join('')}}`;
          i = close;
          continue;
        }
        out += `\\${n}`;
        continue;
      }
      if (/[A-Za-z0-9]/.test(n!)) {
        // \r \n \t \d \w \b \uXXXX ... : same meaning in JS (ASCII-only \d \w as in Oniguruma's Ruby syntax).
        out += `\\${n}`;
        continue;
      }
      if (SYNTAX.has(n!) || (inClass && n === '-')) { out += `\\${n}`; continue; }
      // Identity escape of a non-syntax character: write it as a code point escape.
      out += `\\u{${n!.codePointAt(0)!.toString(16)}}`;
      continue;
    }
    if (inClass) {
      if (c === ']') { inClass = false; out += c; continue; }
      if (c === '[') bad('a nested character class');
      if (c === '&' && chars[i + 1] === '&') bad('character-class intersection (&&)');
      out += c;
      if (ci() && c === '-' && chars[i + 1] !== ']') bad('a character range inside (?i:...)');
      if (ci()) {
        const v = caseVariants(c);
        if (v) out += escapeForClass(v);
      }
      continue;
    }
    if (c === '[') {
      inClass = true;
      out += c;
      if (chars[i + 1] === '^') { out += '^'; i++; }
      if (chars[i + 1] === ']') { out += '\\]'; i++; }
      continue;
    }
    if (c === '(') {
      if (chars[i + 1] === '?') {
        const rest = chars.slice(i + 2, i + 4).join('');
        if (rest.startsWith('i:')) { groups.push(true); out += '(?:'; i += 3; continue; }
        if (rest.startsWith('>')) bad('an atomic group (?>...)');
        if (/^[imx-]/.test(rest)) bad('an inline option group other than (?i:...)');
      }
      groups.push(false);
      out += c;
      continue;
    }
    if (c === ')') { groups.pop(); out += c; continue; }
    if (c === '+' && lastQuant) bad('a possessive quantifier');
    const wasQuant: boolean = lastQuant;
    lastQuant = c === '*' || c === '+' || c === '}' || (c === '?' && !wasQuant);
    if (c === '.') { out += '[^\\n]'; continue; }
    if (ci() && /\p{L}/u.test(c)) {
      const v = caseVariants(c);
      out += v ? `[${c}${v}]` : c;
      continue;
    }
    out += c;
  }
  if (inClass) bad('an unterminated character class');
  return out;
}

/** Compiles a tokenizer.json regex into a global, unicode JS RegExp. */
export function compileOnigRegex(src: string): RegExp {
  const js = translateOnigRegex(src);
  try {
    return new RegExp(js, 'gu');
  } catch (e) {
    throw new DistilleryError(`tokenizer regex ${JSON.stringify(src)} cannot be compiled (${(e as Error).message})`,
      'the pre-tokenizer pattern uses syntax distillery does not translate');
  }
}
