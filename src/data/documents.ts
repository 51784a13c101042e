/**
 * Loading training documents from files.
 *
 * - Plain text (`.txt`, `.md`, or any extension other than `.jsonl`): ONE DOCUMENT PER FILE (the whole file, with
 *   line endings normalized to `\n`). Blank lines inside a file do not split it: a file is the unit of context.
 * - JSON Lines (`.jsonl`): one document per non-blank line, either `{"text": "..."}` or a chat
 *   `{"messages": [{"role": "user", "content": "..."}, ...], "tools": [...]?, "chat_template_kwargs": {...}?}` rendered
 *   with the renderer a run passes
 *   (its model's chat template, src/tokenizer/chat.ts; ChatML by default), which may also give the assistant replies'
 *   character ranges: the tokens that carry loss (loadDocs). A conversation without an assistant turn then carries no
 *   loss: it is left out and listed. A bad line throws a DistilleryError naming `file:line` and what is wrong.
 * - A directory is expanded to the `.txt`, `.md` and `.jsonl` files under it (recursively, sorted by path).
 * Documents that are empty (or whitespace only) are dropped. A file that cannot be read, a broken symbolic link, a
 * link loop or a link that leads back into a folder being listed is an InputError (exit code 2) naming the path.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { DistilleryError, InputError } from '../util/errors.js';
import { PyFloat, isJsonObject, parsePyJson } from '../util/py-json.js';

/** One message of a conversation: role and content, plus whatever else the line gives (tool_calls, reasoning_content, ...). */
export interface ChatMessage {
  role: string;
  content: string | null;
  [field: string]: unknown;
}

/** Renders chat messages in ChatML: `<|im_start|>{role}\n{content}<|im_end|>\n` per message. */
export function renderChatML(messages: readonly ChatMessage[]): string {
  return messages.map((m) => `<|im_start|>${m.role}\n${m.content ?? ''}<|im_end|>\n`).join('');
}

/**
 * A training document: its text and the character ranges [start, end) whose tokens carry loss (null: every token).
 * Chat lines under `--loss-on assistant` carry the assistant replies' ranges; text documents carry null.
 */
export interface Doc {
  text: string;
  lossSpans: Array<[number, number]> | null;
  /** A chat line's rendering (packed whole by default: packingFor). */
  conversation?: boolean;
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
    // only a regular file: a FIFO or a device would block the run (or never end)
    const st = fs.statSync(f);
    if (!st.isFile() && !st.isDirectory()) throw new InputError(`cannot read data file ${f}: it is not a regular file`, 'pass files or folders of them (.txt, .md, .jsonl)');
    return fs.readFileSync(f, 'utf8');
  } catch (e) {
    if (e instanceof InputError) throw e;
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ERR_STRING_TOO_LONG') {
      throw new InputError(`cannot read data file ${f}: it is larger than the longest string Node.js holds (about 512 MiB)`,
        'split it into smaller files (e.g. split -C 200m); a folder of them is read in order');
    }
    const why = code === 'EACCES' || code === 'EPERM' ? 'permission denied' : code === 'EISDIR' ? 'it is a folder'
      : code === 'EIO' ? 'input/output error' : code ?? (e as Error).message;
    throw new InputError(`cannot read data file ${f}: ${why}`, code === 'EACCES' || code === 'EPERM'
      ? 'check its permissions (e.g. chmod a+r), or leave it out of --data' : 'check the file, or leave it out of --data');
  }
}

/** Renders a conversation (with the line's `tools`, or null) into one document (default: renderChatML, no spans). */
export type ChatRenderer = (messages: readonly ChatMessage[], tools: unknown[] | null, kwargs?: Record<string, unknown> | null) => string | { text: string; assistant: Array<[number, number]> };

/** What a JSONL line holds: text, or a conversation with its tools. */
export type JsonlRecord = { text: string } | { messages: ChatMessage[]; tools: unknown[] | null; kwargs: Record<string, unknown> | null };

/** The first integer in `v` that a float64 cannot hold exactly (its digits as JSON.parse left them), else null. */
function unsafeInteger(v: unknown): string | null {
  if (typeof v === 'number') return Number.isInteger(v) && !Number.isSafeInteger(v) ? String(v) : null;
  if (v === null || typeof v !== 'object' || v instanceof PyFloat) return null; // a float (1e300) is one in Python too
  for (const x of Array.isArray(v) ? v : Object.values(v as Record<string, unknown>)) {
    const r = unsafeInteger(x);
    if (r !== null) return r;
  }
  return null;
}

/** Parses one JSONL line; `where` is `file:line` for errors. */
export function parseJsonlLine(line: string, where: string): JsonlRecord {
  let j: unknown;
  try {
    j = parsePyJson(line); // floats as Python reads them (21.0 stays a float for the chat template)
  } catch (e) {
    throw new InputError(`${where}: invalid JSON (${(e as Error).message})`, 'each line of a .jsonl file must be one JSON object');
  }
  if (!isJsonObject(j)) {
    throw new InputError(`${where}: expected a JSON object, got ${Array.isArray(j) ? 'an array' : JSON.stringify(j)}`,
      'write {"text": "..."} or {"messages": [{"role": "user", "content": "..."}]} on each line');
  }
  const o = j as Record<string, unknown>;
  const big = 'messages' in o ? unsafeInteger(o) : null;
  if (big !== null) {
    throw new InputError(`${where}: the number ${big} is beyond 2^53: JavaScript would change its digits (transformers keeps them)`,
      'write it as a string in the data (an id in a tool call, for one)');
  }
  // a line with both is a conversation (TRL takes "messages" then)
  if ('messages' in o) {
    const ms = o.messages;
    if (!Array.isArray(ms) || ms.length === 0) {
      throw new InputError(`${where}: "messages" must be a non-empty array`, 'write {"messages": [{"role": "user", "content": "..."}]}');
    }
    const msgs: ChatMessage[] = ms.map((m, i) => {
      const mo = m as Record<string, unknown>;
      // content may be null only beside tool_calls (an assistant turn that only calls tools)
      const contentOk = typeof mo?.content === 'string' || (mo?.content === null && Array.isArray(mo.tool_calls));
      if (typeof m !== 'object' || m === null || typeof mo.role !== 'string' || !contentOk) {
        throw new InputError(`${where}: messages[${i}] must be {"role": string, "content": string}, got ${JSON.stringify(m)}`,
          'give every message a string "role" and a string "content" (null only with "tool_calls")');
      }
      return { ...mo, role: mo.role, content: mo.content as string | null };
    });
    if (o.tools !== undefined && o.tools !== null && !Array.isArray(o.tools)) {
      throw new InputError(`${where}: "tools" must be a list of tool definitions`, 'write "tools": [{"type": "function", "function": {...}}]');
    }
    const kw = o.chat_template_kwargs;
    if (kw !== undefined && kw !== null && !isJsonObject(kw)) {
      throw new InputError(`${where}: "chat_template_kwargs" must be an object of template variables`, 'write "chat_template_kwargs": {"enable_thinking": false}');
    }
    return { messages: msgs, tools: (o.tools as unknown[] | undefined) ?? null, kwargs: (kw as Record<string, unknown> | undefined) ?? null };
  }
  if ('text' in o) {
    if (typeof o.text !== 'string') throw new InputError(`${where}: "text" must be a string, got ${typeof o.text}`, 'write {"text": "..."}');
    return { text: o.text };
  }
  throw new InputError(`${where}: object has neither "text" nor "messages" (keys: ${Object.keys(o).join(', ') || 'none'})`,
    'write {"text": "..."} or {"messages": [...]} on each line');
}

/** Renders a record into a document; a renderer's errors are prefixed with `where`. */
function recordDoc(r: JsonlRecord, where: string, render: ChatRenderer): Doc {
  if ('text' in r) return { text: r.text, lossSpans: null };
  let out: ReturnType<ChatRenderer>;
  try {
    out = render(r.messages, r.tools, r.kwargs);
  } catch (e) {
    // a conversation the template refuses or cannot render is bad input (exit 2), named by its file and line
    if (e instanceof DistilleryError) throw new InputError(`${where}: ${e.message}`, e.hint);
    throw e;
  }
  return typeof out === 'string' ? { text: out, lossSpans: null, conversation: true } : { text: out.text, lossSpans: out.assistant, conversation: true };
}

/** Parses one JSONL line into a document's text; `where` is `file:line` for errors. */
export function parseJsonlRecord(line: string, where: string, render: ChatRenderer = renderChatML): string {
  return recordDoc(parseJsonlLine(line, where), where, render).text;
}

export interface LoadedDocs {
  docs: Doc[];
  /** `file:line` of each conversation that has no assistant turn (when the renderer gives spans). */
  noAssistant: string[];
  /** Conversations read (chat lines). */
  conversations: number;
}

/**
 * Loads documents with their loss spans: text documents (and chat lines rendered to a string) carry null; chat lines
 * whose renderer gives spans carry them (the assistant replies). Conversations without an assistant turn are listed.
 */
export function loadDocs(paths: string[], opts: { renderChat?: ChatRenderer } = {}): LoadedDocs {
  if (paths.length === 0) throw new DistilleryError('no data files given', 'pass at least one .txt, .md or .jsonl file or folder');
  const files: string[] = [];
  for (const p of paths) expand(p, files, null, new Set());
  const docs: Doc[] = [], noAssistant: string[] = [];
  let conversations = 0;
  const render = opts.renderChat ?? renderChatML;
  for (const f of files) {
    const text = readDataFile(f).replace(/^\uFEFF/, '').replace(/\r\n?/g, '\n');
    if (path.extname(f).toLowerCase() === '.jsonl') {
      const lines = text.split('\n');
      lines.forEach((line, i) => {
        if (line.trim() === '') return;
        const where = `${f}:${i + 1}`;
        const rec = parseJsonlLine(line, where);
        const d = recordDoc(rec, where, render);
        if ('messages' in rec) {
          conversations++;
          if (d.lossSpans !== null && d.lossSpans.length === 0) { noAssistant.push(where); return; }
        }
        if (d.text.trim() !== '') docs.push(d);
      });
    } else if (text.trim() !== '') {
      docs.push({ text, lossSpans: null });
    }
  }
  return { docs, noAssistant, conversations };
}

/**
 * Reports conversations without an assistant turn (they carry no loss and are left out): a warning naming the first
 * few `file:line`s; an error when no conversation has one (nothing would be trained on).
 */
export function reportNoAssistant(l: LoadedDocs, log: (s: string) => void): void {
  if (l.noAssistant.length === 0) return;
  if (l.noAssistant.length === l.conversations && l.docs.length === 0) {
    throw new DistilleryError(`none of the ${l.conversations} conversations has an assistant turn, so no token carries loss (${l.noAssistant.slice(0, 3).join(', ')}${l.noAssistant.length > 3 ? ', ...' : ''})`,
      'add the assistant replies to the data, or pass --loss-on all to train on every token');
  }
  log(`warning: ${l.noAssistant.length} of ${l.conversations} conversations have no assistant turn and are left out: ${l.noAssistant.slice(0, 5).join(', ')}${l.noAssistant.length > 5 ? ', ...' : ''} (--loss-on all trains on them)`);
}

/** The documents cut to `maxChars` characters in all (0: no cap), their loss spans clipped with them. */
export function capDocs(docs: readonly Doc[], maxChars: number): Doc[] {
  if (maxChars <= 0) return docs.slice();
  const kept: Doc[] = [];
  let n = 0;
  for (const d of docs) {
    if (n >= maxChars) break;
    let text = d.text.slice(0, maxChars - n);
    // never half a surrogate pair: it would tokenize as U+FFFD, a character the data does not hold
    if (text.length < d.text.length && /[\ud800-\udbff]$/.test(text)) text = text.slice(0, -1);
    const lossSpans = d.lossSpans === null ? null
      : d.lossSpans.filter(([a]) => a < text.length).map(([a, b]): [number, number] => [a, Math.min(b, text.length)]);
    kept.push(d.conversation ? { text, lossSpans, conversation: true } : { text, lossSpans });
    n += d.text.length;
  }
  return kept;
}

/** Loads documents from text / JSONL files or directories as plain texts (see the module comment for the rules). */
export function loadDocuments(paths: string[], opts: { renderChat?: ChatRenderer } = {}): string[] {
  return loadDocs(paths, opts).docs.map((d) => d.text);
}
