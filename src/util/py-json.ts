/**
 * JSON as Python's json module reads it, where that differs from JSON.parse: a number written with a fraction or an
 * exponent is a float in Python even when its value is an integer (`21.0`, `1e3`), and a chat template prints it so
 * (`21.0`, `1000.0`; with `tojson` too). JavaScript has one number type, so JSON.parse loses that; parsePyJson keeps
 * it by giving such numbers as PyFloat (every other value as JSON.parse gives it). The chat templates' engine turns a
 * PyFloat into its float (src/tokenizer/jinja-python.ts); anything else that reads one gets its value from valueOf(),
 * and JSON.stringify writes it as a number.
 */

/** A JSON number that Python reads as a float although its value is an integer. */
export class PyFloat {
  constructor(readonly value: number) {}
  valueOf(): number { return this.value; }
  toJSON(): number { return this.value; }
  toString(): string { return String(this.value); }
}

/** A JSON object (not an array, null or a number: a PyFloat is an object to typeof). */
export function isJsonObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v) && !(v instanceof PyFloat);
}

const NUMBER = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/y;
const WS = /[ \t\n\r]*/y;

/**
 * Parses JSON text as JSON.parse does (its errors too), but for numbers with a fraction or an exponent and an integral
 * value, which come out as PyFloat. Text without such a number gives exactly JSON.parse's result.
 */
export function parsePyJson(text: string): unknown {
  const plain = JSON.parse(text) as unknown; // JSON.parse's errors, and the answer when no number needs marking
  if (!hasIntegralFloat(text)) return plain;
  let i = 0;
  const ws = (): void => { WS.lastIndex = i; WS.exec(text); i = WS.lastIndex; };
  const value = (): unknown => {
    ws();
    const c = text[i];
    if (c === '{') {
      i++;
      const o: Record<string, unknown> = {};
      ws();
      if (text[i] === '}') { i++; return o; }
      for (;;) {
        ws();
        const k = str();
        ws(); i++; // ':'
        // an own property even for "__proto__", as JSON.parse makes it
        Object.defineProperty(o, k, { value: value(), writable: true, enumerable: true, configurable: true });
        ws();
        if (text[i++] === '}') return o;
      }
    }
    if (c === '[') {
      i++;
      const a: unknown[] = [];
      ws();
      if (text[i] === ']') { i++; return a; }
      for (;;) {
        a.push(value());
        ws();
        if (text[i++] === ']') return a;
      }
    }
    if (c === '"') return str();
    if (c === 't') { i += 4; return true; }
    if (c === 'f') { i += 5; return false; }
    if (c === 'n') { i += 4; return null; }
    NUMBER.lastIndex = i;
    const m = NUMBER.exec(text)!;
    i = NUMBER.lastIndex;
    const x = Number(m[0]);
    return (m[1] !== undefined || m[2] !== undefined) && Number.isInteger(x) ? new PyFloat(x) : x;
  };
  const str = (): string => {
    const start = i;
    let j = i + 1;
    for (;;) {
      const q = text.indexOf('"', j);
      let b = q - 1, n = 0;
      while (text[b] === '\\') { b--; n++; }
      if (n % 2 === 0) { i = q + 1; break; }
      j = q + 1;
    }
    const s = text.slice(start, i);
    return s.includes('\\') ? JSON.parse(s) as string : s.slice(1, -1);
  };
  return value();
}

/** Whether the text holds, outside its strings, a number with a fraction or an exponent and an integral value. */
function hasIntegralFloat(text: string): boolean {
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 34) { // a string: to its closing quote
      for (i++; i < text.length && text.charCodeAt(i) !== 34; i++) if (text.charCodeAt(i) === 92) i++;
      continue;
    }
    if (c === 45 || (c >= 48 && c <= 57)) {
      NUMBER.lastIndex = i;
      const m = NUMBER.exec(text);
      if (m && (m[1] !== undefined || m[2] !== undefined) && Number.isInteger(Number(m[0]))) return true;
      if (m) i = NUMBER.lastIndex - 1;
    }
  }
  return false;
}
