/**
 * Python's whitespace (str.isspace(): what str.strip() removes and `\s` matches in a str pattern; U+001C..U+001F among
 * them, not U+FEFF), for text that must be cut as transformers and lm-evaluation-harness cut it in Python.
 */
export const PY_SPACE = '[\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]+';
const LEADING = new RegExp(`^${PY_SPACE}`, 'u'), TRAILING = new RegExp(`${PY_SPACE}$`, 'u');

/** Python's `s.rstrip()`. */
export function pyRstrip(s: string): string {
  return s.replace(TRAILING, '');
}

/** Python's `s.strip()`. */
export function pyStripSpace(s: string): string {
  return pyRstrip(s).replace(LEADING, '');
}
