/**
 * The embedded default corpus: documentation comments from TypeScript's own declaration files
 * (`node_modules/typescript/lib/lib.*.d.ts`: the DOM, ES5, ES2015+ ... APIs), real English prose already on the
 * machine after `npm install`, with no download.
 *
 * Each `/** ... *\/` comment becomes one document: the leading `*` of each line is stripped, `@param` and other tags
 * are kept as text, comments shorter than `minChars` are dropped, and exact duplicates are removed (the same
 * comment appears in many lib files). Files are read in a fixed order (lib.es5.d.ts, lib.dom.d.ts, then the rest
 * sorted by name), and documents are added until `maxChars` would be exceeded, so the corpus is deterministic for a
 * given TypeScript version.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { createRequire } from 'node:module';
import { DistilleryError } from '../util/errors.js';

export interface DocCorpusOptions {
  /** Cap on total characters (default 2,000,000). */
  maxChars?: number;
  /** Drop comments shorter than this (default 16 characters). */
  minChars?: number;
  /** Override the folder holding lib.*.d.ts (default: found through require.resolve('typescript')). */
  libDir?: string;
}

export interface DocCorpus {
  documents: string[];
  totalChars: number;
  /** The declaration files the documents came from. */
  files: string[];
  /** TypeScript version the corpus was read from ('' if unknown). */
  typescriptVersion: string;
}

/** Finds TypeScript's lib folder. */
export function typescriptLibDir(): string {
  let entry: string;
  try {
    entry = createRequire(import.meta.url).resolve('typescript');
  } catch {
    throw new DistilleryError('the default corpus needs the typescript package, which was not found',
      'run `npm install` in the distillery folder, or pass your own data files');
  }
  return path.dirname(entry);
}

/** Extracts the text of every `/** ... *\/` comment in a source text. */
export function extractDocComments(source: string): string[] {
  const out: string[] = [];
  for (const m of source.matchAll(/\/\*\*([\s\S]*?)\*\//g)) {
    const text = m[1]!
      .split('\n')
      .map((l) => l.replace(/^\s*\*? ?/, '').replace(/\s+$/, ''))
      .join('\n')
      .trim();
    if (text) out.push(text);
  }
  return out;
}

/** Loads the default documentation corpus (see the module comment). */
export function loadDocCorpus(opts: DocCorpusOptions = {}): DocCorpus {
  const maxChars = opts.maxChars ?? 2_000_000;
  const minChars = opts.minChars ?? 16;
  const dir = opts.libDir ?? typescriptLibDir();
  let names: string[];
  try {
    names = fs.readdirSync(dir).filter((n) => /^lib\..+\.d\.ts$/.test(n));
  } catch {
    names = [];
  }
  if (names.length === 0) {
    throw new DistilleryError(`no TypeScript lib declaration files (lib.*.d.ts) in ${dir}`,
      'reinstall dependencies with `npm install`, or pass your own data files');
  }
  const first = ['lib.es5.d.ts', 'lib.dom.d.ts'];
  names.sort((a, b) => {
    const ia = first.indexOf(a), ib = first.indexOf(b);
    if (ia !== ib) return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib);
    return a < b ? -1 : a > b ? 1 : 0;
  });
  const seen = new Set<string>();
  const documents: string[] = [];
  const files: string[] = [];
  let total = 0;
  outer: for (const n of names) {
    const file = path.join(dir, n);
    let used = false;
    for (const c of extractDocComments(fs.readFileSync(file, 'utf8'))) {
      if (c.length < minChars || seen.has(c)) continue;
      if (total + c.length > maxChars) break outer;
      seen.add(c);
      documents.push(c);
      total += c.length;
      used = true;
    }
    if (used) files.push(file);
  }
  let typescriptVersion = '';
  try {
    const pkg = JSON.parse(fs.readFileSync(path.join(dir, '..', 'package.json'), 'utf8')) as { version?: string };
    typescriptVersion = pkg.version ?? '';
  } catch { /* ignore */ }
  return { documents, totalChars: total, files, typescriptVersion };
}
