/**
 * Reading a run's --config file: YAML (.yaml/.yml) or JSON (.json), one top-level mapping of settings whose keys
 * are RunOptions fields in camelCase, kebab-case or snake_case (validated by options.ts). Syntax errors name the
 * file and, where the parser knows it, the line.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { parseDocument } from 'yaml';
import { UsageError } from './args.js';

/** How many alias expansions a config may make: plenty for hand-written files, far below an alias bomb. */
const MAX_ALIAS_COUNT = 100;

/** Parses config text; `file` decides the format by its extension and names the file in errors. */
export function parseConfigText(text: string, file: string): Record<string, unknown> {
  const ext = path.extname(file).toLowerCase();
  let value: unknown;
  if (ext === '.json') {
    try {
      value = JSON.parse(text);
    } catch (e) {
      throw new UsageError(`${file}: not valid JSON (${(e as Error).message})`, 'fix the syntax, or write the config as YAML (.yaml)');
    }
  } else if (ext === '.yaml' || ext === '.yml') {
    const doc = parseDocument(text, { prettyErrors: true, uniqueKeys: true });
    if (doc.errors.length) {
      const e = doc.errors[0]!;
      const line = e.linePos?.[0]?.line;
      throw new UsageError(`${file}${line !== undefined ? `:${line}` : ''}: not valid YAML (${e.message.split('\n')[0]})`, 'fix the syntax: one "key: value" per line');
    }
    try {
      value = doc.toJS({ maxAliasCount: MAX_ALIAS_COUNT });
    } catch (e) {
      // The yaml package refuses alias expansions beyond maxAliasCount ("billion laughs") with a ReferenceError.
      throw new UsageError(`${file}: too many YAML alias expansions (${(e as Error).message})`,
        'a run config needs no anchors or aliases (&name / *name): write the settings out');
    }
  } else {
    throw new UsageError(`--config ${file}: unsupported file type '${ext || '(none)'}'`, 'use a .yaml, .yml or .json file');
  }
  if (value === null || value === undefined) return {};
  if (typeof value !== 'object' || Array.isArray(value)) {
    throw new UsageError(`${file}: the config must be a mapping of settings (key: value), got ${Array.isArray(value) ? 'a list' : JSON.stringify(value)}`,
      'write e.g. "steps: 200" on its own line');
  }
  return value as Record<string, unknown>;
}

/** Reads and parses a config file. */
export function loadConfigFile(file: string): Record<string, unknown> {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new UsageError(code === 'ENOENT' ? `--config: file ${file} does not exist` : `--config: cannot read ${file} (${(e as Error).message})`,
      'check the path of the config file');
  }
  return parseConfigText(text, file);
}
