/**
 * The CLI's own argument parser (no framework dependency) and the small helpers around it.
 *
 * Syntax, for every command:
 * - `--flag value` and `--flag=value` for flags that take a value (a value may start with '-' as in `--lr -1`,
 *   but not with '--': `--out --lr` is "--out expects a value"; write `--prompt=--x` for such values);
 * - `--flag`, `--no-flag`, `--flag=true|false` for boolean flags;
 * - list flags (`--data`) are repeatable AND greedy: `--data a.txt b.txt` (what a shell glob expands to) takes
 *   every following argument up to the next one that starts with '-';
 * - `-h` / `--help` anywhere before `--` asks for the command's help; `--` ends the flags;
 * - anything else is a positional argument.
 * Values are converted and type-checked here ("--lr expects a number, got 'abc'"); unknown flags are rejected
 * with the closest known name. Every problem is a UsageError (exit code 2).
 */
import { InputError } from '../util/errors.js';

/** Bad usage or bad input: the CLI prints message and hint and exits with code 2. */
export class UsageError extends InputError {
  constructor(message: string, hint?: string) {
    super(message, hint);
    this.name = 'UsageError';
  }
}

/** `f()`, its input errors made usage errors (settings checked while the flags are read). */
export function asUsage<T>(f: () => T): T {
  try { return f(); } catch (e) { throw e instanceof InputError && !(e instanceof UsageError) ? new UsageError(e.message, e.hint) : e; }
}

/** Where a command writes: tests pass collectors, the binary passes process.stdout / process.stderr. */
export interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
}

export type FlagKind = 'string' | 'number' | 'integer' | 'boolean' | 'list';

export interface FlagSpec {
  /** kebab-case name without the dashes, e.g. 'grad-accum'. */
  name: string;
  kind: FlagKind;
  /** Allowed values of a 'string' flag. */
  choices?: readonly string[];
  /** Placeholder in the help text, e.g. '<dir>'. */
  metavar?: string;
  /** One line for the help text. */
  description: string;
  /** The default as shown in the help text. */
  defaultText?: string;
  /** A 'string' flag that may be given as '' (a delimiter); others refuse an empty string. */
  allowEmpty?: boolean;
}

export interface ParsedArgs {
  /** Flag values by kebab-case name, converted to their kind (lists as string[]); only flags that were given. */
  values: Record<string, unknown>;
  positionals: string[];
  /** -h or --help was given. */
  help: boolean;
}

// ---- names and suggestions ------------------------------------------------------------------------------

/** 'gradAccum' → 'grad-accum' ('beta1' stays 'beta1'). */
export function camelToKebab(s: string): string {
  return s.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
}

/** 'grad-accum' or 'grad_accum' → 'gradAccum'. */
export function kebabToCamel(s: string): string {
  return s.replace(/[-_]+([a-z0-9])/g, (_, c: string) => c.toUpperCase());
}

/** Levenshtein edit distance. */
export function editDistance(a: string, b: string): number {
  const m = a.length, n = b.length;
  let prev = Array.from({ length: n + 1 }, (_, j) => j);
  for (let i = 1; i <= m; i++) {
    const cur = [i];
    for (let j = 1; j <= n; j++) {
      cur[j] = Math.min(prev[j]! + 1, cur[j - 1]! + 1, prev[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    }
    prev = cur;
  }
  return prev[n]!;
}

/** The candidate closest to `word` (case-insensitive), when it is close enough to be a plausible typo. */
export function closest(word: string, candidates: Iterable<string>): string | undefined {
  const w = word.toLowerCase();
  let best: string | undefined;
  let bestD = Infinity;
  for (const c of candidates) {
    const lc = c.toLowerCase();
    let d = editDistance(w, lc);
    // A prefix ("--temp" for "--temperature") is a strong hint even when the distance is large.
    if (w.length >= 3 && lc.startsWith(w)) d = Math.min(d, 1);
    if (d < bestD) { bestD = d; best = c; }
  }
  const limit = Math.max(2, Math.floor(w.length / 3));
  return bestD <= limit ? best : undefined;
}

/** ' (did you mean X?)'-style hint text, or a fallback. */
export function didYouMean(word: string, candidates: Iterable<string>, fallback: string, format: (s: string) => string = (s) => s): string {
  const c = closest(word, candidates);
  return c !== undefined ? `did you mean ${format(c)}?` : fallback;
}

// ---- value conversion -----------------------------------------------------------------------------------

function show(v: unknown): string {
  if (typeof v === 'string') return `'${v}'`;
  if (Array.isArray(v)) return `a list (${JSON.stringify(v)})`;
  if (v === null) return 'null';
  if (typeof v === 'object') return `an object (${JSON.stringify(v)})`;
  return String(v);
}

function parseNumberText(s: string): number | undefined {
  const t = s.trim();
  if (t === '' || !/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(t)) return undefined;
  const n = Number(t);
  return Number.isFinite(n) ? n : undefined;
}

/**
 * Converts a raw value (a command-line string, or a YAML/JSON value) to the flag's kind. `label` names the
 * setting in the error ('--lr', or 'lr in run.yaml').
 */
export function coerceValue(spec: FlagSpec, raw: unknown, label: string): unknown {
  switch (spec.kind) {
    case 'number':
    case 'integer': {
      const n = typeof raw === 'number' ? (Number.isFinite(raw) ? raw : undefined) : typeof raw === 'string' ? parseNumberText(raw) : undefined;
      const what = spec.kind === 'integer' ? 'an integer' : 'a number';
      if (n === undefined) throw new UsageError(`${label} expects ${what}, got ${show(raw)}`, `e.g. ${label.startsWith('--') ? `${label} ${spec.defaultText ?? '1'}` : `${spec.name}: ${spec.defaultText ?? '1'}`}`);
      if (spec.kind === 'integer' && !Number.isSafeInteger(n)) throw new UsageError(`${label} expects an integer, got ${show(raw)}`, 'use a whole number');
      return n;
    }
    case 'boolean': {
      if (typeof raw === 'boolean') return raw;
      if (typeof raw === 'string') {
        const t = raw.trim().toLowerCase();
        if (['true', 'yes', '1', 'on'].includes(t)) return true;
        if (['false', 'no', '0', 'off'].includes(t)) return false;
      }
      throw new UsageError(`${label} expects true or false, got ${show(raw)}`,
        label.startsWith('--') ? `write ${label} or --no-${spec.name}` : `write ${spec.name}: true or ${spec.name}: false`);
    }
    case 'list': {
      // JSON-valued entries written as mappings in a config file (YAML's natural form) are that JSON
      const json = (x: unknown): unknown => (spec.metavar === '<json>...' && x !== null && typeof x === 'object' && !Array.isArray(x) ? JSON.stringify(x) : x);
      const arr = (Array.isArray(raw) ? raw : [raw]).map(json);
      if (arr.length === 0 || !arr.every((x) => typeof x === 'string' && x !== '')) {
        throw new UsageError(`${label} expects one or more ${spec.metavar !== undefined && !spec.metavar.startsWith('<file') ? 'non-empty values' : 'file names'}, got ${show(raw)}`, 'give each entry as a non-empty string');
      }
      return arr.slice() as string[];
    }
    case 'string': {
      let s: string;
      if (typeof raw === 'string') s = raw;
      else if (typeof raw === 'number' && Number.isFinite(raw)) s = String(raw);
      // a JSON-valued option written as a mapping in a config file (YAML's natural form) is that JSON
      else if (spec.metavar === '<json>' && raw !== null && typeof raw === 'object' && !Array.isArray(raw)) s = JSON.stringify(raw);
      else {
        throw new UsageError(`${label} expects ${spec.choices ? `one of ${spec.choices.join(', ')}` : 'a string'}, got ${show(raw)}`,
          spec.choices ? `choose one of: ${spec.choices.join(', ')}` : label.startsWith('--') ? `pass ${label} <value>` : `write ${spec.name}: "<value>" (quoted)`);
      }
      if (s === '' && spec.allowEmpty !== true) throw new UsageError(`${label} expects a value, got an empty string`, label.startsWith('--') ? `pass a non-empty value, or leave ${label} out` : `give ${spec.name} a non-empty value, or remove the line`);
      if (spec.choices && !spec.choices.includes(s)) {
        const c = closest(s, spec.choices);
        throw new UsageError(`${label} expects one of ${spec.choices.join(', ')}, got '${s}'`,
          c !== undefined ? `did you mean '${c}'?` : `choose one of: ${spec.choices.join(', ')}`);
      }
      return s;
    }
  }
}

// ---- parsing --------------------------------------------------------------------------------------------

/** Parses argv against the command's flags. `command` names the command in messages ('train'). */
export function parseArgs(argv: readonly string[], flags: readonly FlagSpec[], command: string): ParsedArgs {
  const byName = new Map(flags.map((f) => [f.name, f]));
  const values: Record<string, unknown> = {};
  const positionals: string[] = [];
  let help = false;
  const dashed = (): string[] => [...byName.keys()].map((n) => `--${n}`);
  const unknown = (arg: string): UsageError => new UsageError(`${command}: unknown option ${arg}`,
    didYouMean(arg, [...dashed(), '--help'], `run 'distillery ${command} --help' to list the options`));

  // -h / --help anywhere before `--` asks for help, whatever else the line holds (a typo, a missing value)
  const dd = argv.indexOf('--');
  if ((dd < 0 ? argv : argv.slice(0, dd)).some((a) => a === '-h' || a === '--help')) return { values: {}, positionals: [], help: true };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--') { positionals.push(...argv.slice(i + 1)); break; }
    if (arg === '-h' || arg === '--help') { help = true; continue; }
    if (!arg.startsWith('-') || arg === '-' || /^-[\d.]/.test(arg)) { positionals.push(arg); continue; }
    if (!arg.startsWith('--')) throw unknown(arg);
    const eq = arg.indexOf('=');
    const name = arg.slice(2, eq < 0 ? undefined : eq);
    const inline = eq < 0 ? undefined : arg.slice(eq + 1);
    const spec = byName.get(name);
    if (!spec && name.startsWith('no-')) {
      const base = byName.get(name.slice(3));
      if (base?.kind === 'boolean') {
        if (inline !== undefined) throw new UsageError(`${command}: --${name} takes no value, got '${inline}'`, `write --${name} or --${base.name}=${inline}`);
        values[base.name] = false;
        continue;
      }
      if (base) throw new UsageError(`${command}: --${name}: --${base.name} is not a boolean flag`, `give a value: --${base.name} ${base.metavar ?? '<value>'}`);
    }
    if (!spec) throw unknown(`--${name}`);
    const label = `--${spec.name}`;
    if (spec.kind === 'boolean') {
      values[spec.name] = inline === undefined ? true : coerceValue(spec, inline, label);
      continue;
    }
    const isFlagLike = (s: string | undefined): boolean => s === undefined || s.startsWith('--') || s === '-h';
    if (spec.kind === 'list') {
      const got: string[] = [];
      if (inline !== undefined) got.push(inline);
      else {
        while (i + 1 < argv.length && !argv[i + 1]!.startsWith('-')) got.push(argv[++i]!);
        if (got.length === 0) throw new UsageError(`${command}: ${label} expects a value`, `e.g. ${label} ${spec.metavar ?? '<value>'}`);
      }
      const prev = (values[spec.name] as string[] | undefined) ?? [];
      values[spec.name] = [...prev, ...(coerceValue(spec, got, label) as string[])];
      continue;
    }
    let raw: string;
    if (inline !== undefined) raw = inline;
    else {
      const next = argv[i + 1];
      if (isFlagLike(next)) throw new UsageError(`${command}: ${label} expects a value`, `e.g. ${label} ${spec.metavar ?? '<value>'}`);
      raw = next!;
      i++;
    }
    values[spec.name] = coerceValue(spec, raw, label);
  }
  return { values, positionals, help };
}

// ---- help text ------------------------------------------------------------------------------------------

export interface HelpText {
  usage: string;
  description: string;
  flags: readonly FlagSpec[];
  examples?: readonly string[];
  /** Extra paragraphs after the options. */
  notes?: readonly string[];
}

/** Renders a command's --help text. */
export function formatHelp(h: HelpText): string {
  const lines = [`usage: ${h.usage}`, '', h.description, ''];
  {
    lines.push('options:');
    const left = h.flags.map((f) => {
      const mv = f.kind === 'boolean' ? '' : ` ${f.metavar ?? (f.choices ? f.choices.join('|') : f.kind === 'list' ? '<file>...' : `<${f.kind === 'string' ? 'value' : 'n'}>`)}`;
      return `  --${f.name}${mv}`;
    });
    left.push('  -h, --help');
    const w = Math.min(34, Math.max(...left.map((l) => l.length)) + 2);
    h.flags.forEach((f, i) => {
      const l = left[i]!;
      const desc = f.description + (f.defaultText !== undefined ? ` (default: ${f.defaultText})` : '');
      lines.push(l.length + 1 > w ? `${l}\n${' '.repeat(w)}${desc}` : `${l.padEnd(w)}${desc}`);
    });
    lines.push(`${left[left.length - 1]!.padEnd(w)}show this help`);
    lines.push('');
  }
  for (const n of h.notes ?? []) lines.push(n, '');
  if (h.examples?.length) {
    lines.push('examples:');
    for (const e of h.examples) lines.push(`  ${e}`);
    lines.push('');
  }
  return lines.join('\n');
}
