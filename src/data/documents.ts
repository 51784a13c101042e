/**
 * Loading training documents from files.
 *
 * - Plain text (`.txt`, `.md`, or any extension other than `.jsonl`): ONE DOCUMENT PER FILE (the whole file, with
 *   line endings normalized to `\n`). Blank lines inside a file do not split it: a file is the unit of context.
 * - JSON Lines (`.jsonl`): one document per non-blank line, either `{"text": "..."}` or a chat
 *   `{"messages": [{"role": "user", "content": "..."}, ...]}` rendered with ChatML
 *   (`<|im_start|>{role}\n{content}<|im_end|>\n` per message), or with the renderer a run passes (its model's chat
 *   format, src/tokenizer/chat.ts). A bad line throws a DistilleryError naming
 *   `file:line` and what is wrong.
 * - A directory is expanded to the `.txt`, `.md` and `.jsonl` files under it (recursively, sorted by path).
 * Documents that are empty (or whitespace only) are dropped. A file that cannot be read, a broken symbolic link, a
 * link loop or a link that leads back into a folder being listed is an InputError (exit code 2) naming the path.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { DistilleryError, InputError } from '../util/errors.js';

export interface ChatMessage {
  role: string;
  content: string;
}

/** Renders chat messages in ChatML: `<|im_start|>{role}\n{content}<|im_end|>\n` per message. */
export function renderChatML(messages: readonly ChatMessage[]): string {
  return messages.map((m) => `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`).join('');
}

const DATA_EXT = new Set(['.txt', '.md', '.jsonl']);

/** Why `p` cannot be followed: a broken symbolic link (to what), a link loop, or another file system error. */
function statProblem(p: string, e: unknown, inFolder: string | null): InputError {
  const code = (e as NodeJS.ErrnoException).code;
  const where = inFolder === null ? `data file ${p}` : `data folder ${inFolder}: ${p}`;
  let isLink = false, target = '';
  try { isLink = fs.lstatSync(p).isSymbolicLink(); if (isLink) target = fs.readlinkSync(p); } catch { /* absent */ }
  if (code === 'ENOENT' && isLink) {
    return new InputError(`${where} is a broken symbolic link (to ${target}, which does not exist)`, 'fix or remove the link');
  }
  if (code === 'ENOENT') return new InputError(`${where} does not exist`, 'check the path in your data settings');
  if (code === 'ELOOP') return new InputError(`${where} is a symbolic link loop (it never reaches a file)`, 'fix or remove the link');
  if (code === 'EACCES' || code === 'EPERM') return new InputError(`${where} cannot be read: permission denied`, 'check its permissions (and those of its folders)');
  return new InputError(`${where} cannot be read (${code ?? (e as Error).message})`, 'check the path and the file');
}

function expand(p: string, out: string[], inFolder: string | null, seen: Set<string>): void {
  let st: fs.Stats;
  try {
    st = fs.statSync(p);
  } catch (e) {
    throw statProblem(p, e, inFolder);
  }
  if (st.isDirectory()) {
    // A link back to a folder being listed (a/b/up -> ..) would make the walk endless.
    let real = p;
    try { real = fs.realpathSync(p); } catch (e) { throw statProblem(p, e, inFolder); }
    if (seen.has(real)) {
      throw new InputError(`data folder ${inFolder ?? p}: ${p} leads back into a folder already being read (a symbolic link cycle)`,
        'remove the link, or pass the folders you want explicitly');
    }
    seen.add(real);
    let names: string[];
    try { names = fs.readdirSync(p).sort(); } catch (e) { throw statProblem(p, e, inFolder); }
    for (const n of names) {
      const q = path.join(p, n);
      let qs: fs.Stats;
      try { qs = fs.statSync(q); } catch (e) { throw statProblem(q, e, inFolder ?? p); }
      if (qs.isDirectory()) expand(q, out, inFolder ?? p, seen);
      else if (DATA_EXT.has(path.extname(n).toLowerCase())) out.push(q);
    }
    seen.delete(real);
  } else {
    out.push(p);
  }
}

/** Reads one data file as text, or says in one sentence why it cannot be read. */
function readDataFile(f: string): string {
  try {
    return fs.readFileSync(f, 'utf8');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    const why = code === 'EACCES' || code === 'EPERM' ? 'permission denied' : code === 'EISDIR' ? 'it is a folder'
      : code === 'EIO' ? 'input/output error' : code ?? (e as Error).message;
    throw new InputError(`cannot read data file ${f}: ${why}`, code === 'EACCES' || code === 'EPERM'
      ? 'check its permissions (e.g. chmod a+r), or leave it out of --data' : 'check the file, or leave it out of --data');
  }
}

/** Renders a conversation into one document (default: renderChatML; a run passes its model's chat format). */
export type ChatRenderer = (messages: readonly ChatMessage[]) => string;

/** Parses one JSONL line into a document; `where` is `file:line` for errors. */
export function parseJsonlRecord(line: string, where: string, render: ChatRenderer = renderChatML): string {
  let j: unknown;
  try {
    j = JSON.parse(line);
  } catch (e) {
    throw new DistilleryError(`${where}: invalid JSON (${(e as Error).message})`, 'each line of a .jsonl file must be one JSON object');
  }
  if (typeof j !== 'object' || j === null || Array.isArray(j)) {
    throw new DistilleryError(`${where}: expected a JSON object, got ${Array.isArray(j) ? 'an array' : JSON.stringify(j)}`,
      'write {"text": "..."} or {"messages": [{"role": "user", "content": "..."}]} on each line');
  }
  const o = j as Record<string, unknown>;
  if ('text' in o) {
    if (typeof o.text !== 'string') throw new DistilleryError(`${where}: "text" must be a string, got ${typeof o.text}`, 'write {"text": "..."}');
    return o.text;
  }
  if ('messages' in o) {
    const ms = o.messages;
    if (!Array.isArray(ms) || ms.length === 0) {
      throw new DistilleryError(`${where}: "messages" must be a non-empty array`, 'write {"messages": [{"role": "user", "content": "..."}]}');
    }
    const msgs: ChatMessage[] = ms.map((m, i) => {
      const mo = m as Record<string, unknown>;
      if (typeof m !== 'object' || m === null || typeof mo.role !== 'string' || typeof mo.content !== 'string') {
        throw new DistilleryError(`${where}: messages[${i}] must be {"role": string, "content": string}, got ${JSON.stringify(m)}`,
          'give every message a string "role" and a string "content"');
      }
      return { role: mo.role, content: mo.content };
    });
    try {
      return render(msgs);
    } catch (e) {
      if (e instanceof DistilleryError) throw new DistilleryError(`${where}: ${e.message}`, e.hint);
      throw e;
    }
  }
  throw new DistilleryError(`${where}: object has neither "text" nor "messages" (keys: ${Object.keys(o).join(', ') || 'none'})`,
    'write {"text": "..."} or {"messages": [...]} on each line');
}

/** Loads documents from text / JSONL files or directories (see the module comment for the rules). */
export function loadDocuments(paths: string[], opts: { renderChat?: ChatRenderer } = {}): string[] {
  if (paths.length === 0) throw new DistilleryError('no data files given', 'pass at least one .txt, .md or .jsonl file or folder');
  const files: string[] = [];
  for (const p of paths) expand(p, files, null, new Set());
  const docs: string[] = [];
  for (const f of files) {
    const text = readDataFile(f).replace(/^\uFEFF/, '').replace(/\r\n?/g, '\n');
    if (path.extname(f).toLowerCase() === '.jsonl') {
      const lines = text.split('\n');
      lines.forEach((line, i) => {
        if (line.trim() === '') return;
        const d = parseJsonlRecord(line, `${f}:${i + 1}`, opts.renderChat);
        if (d.trim() !== '') docs.push(d);
      });
    } else if (text.trim() !== '') {
      docs.push(text);
    }
  }
  return docs;
}
