/**
 * Data pipeline: document loading (text, JSONL text/chat, folders, errors with file:line), packing against a
 * hand-computed stream, the train/val split, and BatchLoader epochs and exact resume.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { BatchLoader, capDocs, loadDocuments, packDocuments, splitTrainVal, type Batch } from '../../src/data/index.js';
import { execFileSync } from 'node:child_process';
import { DistilleryError, InputError } from '../../src/util/errors.js';
import { Rng } from '../../src/util/rng.js';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-data-'));
process.on('exit', () => fs.rmSync(root, { recursive: true, force: true }));

/** A stand-in tokenizer: one token per UTF-16 code unit (an independent, obvious encoding). */
const charTok = { encode: (s: string): number[] => Array.from(s, (c) => c.charCodeAt(0)) };

function write(name: string, content: string): string {
  const p = path.join(root, name);
  fs.mkdirSync(path.dirname(p), { recursive: true });
  fs.writeFileSync(p, content);
  return p;
}

function expectError(fn: () => unknown, re: RegExp): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof DistilleryError, String(e));
    assert.match(e.message, re);
    assert.ok(e.hint, 'has a hint');
    return true;
  });
}

test('loadDocuments: one document per text file, JSONL text and ChatML chat, folders', () => {
  const a = write('corpus/a.txt', 'para one\r\n\r\npara two\n');
  write('corpus/sub/b.md', '# title');
  write('corpus/empty.txt', '  \n');
  write('corpus/skip.bin', 'ignored in folders');
  const j = write('chat.jsonl', [
    JSON.stringify({ text: 'plain doc' }),
    '',
    JSON.stringify({ messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello!' }] }),
  ].join('\n'));
  assert.deepEqual(loadDocuments([a]), ['para one\n\npara two\n']);
  assert.deepEqual(loadDocuments([path.join(root, 'corpus')]), ['para one\n\npara two\n', '# title']);
  assert.deepEqual(loadDocuments([j]), [
    'plain doc',
    '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n',
  ]);
});

test('loadDocuments: bad JSONL lines name file:line and the problem', () => {
  const bad = (lines: string[]) => write(`bad-${Math.random().toString(36).slice(2)}.jsonl`, lines.join('\n'));
  const f1 = bad(['{"text":"ok"}', '', '{"text": "unterminated']);
  expectError(() => loadDocuments([f1]), new RegExp(`${f1.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:3: invalid JSON`));
  const f2 = bad(['{"txt":"typo"}']);
  expectError(() => loadDocuments([f2]), /:1: object has neither "text" nor "messages" \(keys: txt\)/);
  const f3 = bad(['{"text":"ok"}', '{"text": 5}']);
  expectError(() => loadDocuments([f3]), /:2: "text" must be a string/);
  const f4 = bad(['{"messages":[{"role":"user"}]}']);
  expectError(() => loadDocuments([f4]), /:1: messages\[0\] must be/);
  const f5 = bad(['[1,2]']);
  expectError(() => loadDocuments([f5]), /:1: expected a JSON object/);
  expectError(() => loadDocuments([path.join(root, 'missing.txt')]), /does not exist/);
  expectError(() => loadDocuments([]), /no data files/);
  // bad input: exit 2 (InputError), as docs/cli.md promises for an unreadable or malformed data file
  for (const f of [f1, f2, f3, f4, f5]) assert.throws(() => loadDocuments([f]), (e: unknown) => e instanceof InputError);
});

test('loadDocuments: a FIFO (or another file that is not a regular one) is refused by name instead of blocking the run', () => {
  const fifo = path.join(root, 'pipe.txt');
  try { execFileSync('mkfifo', [fifo]); } catch { return; } // no mkfifo here
  assert.throws(() => loadDocuments([fifo]), (e: unknown) => e instanceof InputError && /pipe\.txt: it is not a regular file/.test(e.message));
  fs.rmSync(fifo);
});

test('packDocuments: windows of seqLen+1 with stride seqLen, EOS after each doc, padded masked tail', () => {
  const EOS = 1;
  const docs = ['abc', 'defgh', 'ij'];
  // Independent reference stream.
  const stream = [97, 98, 99, EOS, 100, 101, 102, 103, 104, EOS, 105, 106, EOS];
  const T = 4;
  const p = packDocuments(charTok, docs, { seqLen: T, eosId: EOS, padId: 0 });
  assert.equal(p.totalTokens, stream.length);
  assert.equal(p.numDocs, 3);
  assert.equal(p.windows.length, 3); // 12 targets → 4 + 4 + 4
  p.windows.forEach((w, i) => {
    assert.deepEqual(Array.from(w.inputs), stream.slice(i * T, i * T + T));
    assert.deepEqual(Array.from(w.targets), stream.slice(i * T + 1, i * T + T + 1));
  });
  const q = packDocuments(charTok, docs, { seqLen: 5, eosId: EOS });
  assert.equal(q.windows.length, 3); // 12 targets → 5 + 5 + 2 (padded)
  const tail = q.windows[2]!;
  assert.deepEqual(Array.from(tail.inputs), [stream[10], stream[11], EOS, EOS, EOS]);
  assert.deepEqual(Array.from(tail.targets), [stream[11], stream[12], -1, -1, -1]);
  assert.deepEqual(Array.from(tail.mask), [1, 1, 0, 0, 0]);
  // Every token after the first is a counted target exactly once, in order.
  const targets = q.windows.flatMap((w) => Array.from(w.targets).filter((_, i) => w.mask[i] === 1));
  assert.deepEqual(targets, stream.slice(1));
  assert.equal(q.targetTokens, stream.length - 1);
  expectError(() => packDocuments(charTok, [], { seqLen: 4, eosId: EOS }), /no documents/);
  expectError(() => packDocuments({ encode: () => [] }, ['x'], { seqLen: 4, eosId: EOS }), /no tokens/);
  expectError(() => packDocuments(charTok, ['x'], { seqLen: 0, eosId: EOS }), /seqLen/);
});

test('splitTrainVal: seeded, disjoint, at least one validation window', () => {
  const items = Array.from({ length: 50 }, (_, i) => i);
  const a = splitTrainVal(items, 0.1, new Rng(7));
  const b = splitTrainVal(items, 0.1, new Rng(7));
  const c = splitTrainVal(items, 0.1, new Rng(8));
  assert.deepEqual(a, b);
  assert.notDeepEqual(a.val, c.val);
  assert.equal(a.val.length, 5);
  assert.deepEqual([...a.train, ...a.val].sort((x, y) => x - y), items);
  assert.equal(splitTrainVal([1, 2], 0.01, new Rng(1)).val.length, 1);
  assert.equal(splitTrainVal([1, 2], 0.01, new Rng(1)).train.length, 1);
  assert.equal(splitTrainVal([1], 0.5, new Rng(1)).val.length, 0);
  assert.equal(splitTrainVal(items, 0, new Rng(1)).val.length, 0);
  expectError(() => splitTrainVal(items, 1, new Rng(1)), /valFraction/);
});

function batchKey(b: Batch): string {
  return `${Array.from(b.inputs).join(',')}|${Array.from(b.targets).join(',')}|${Array.from(b.mask).join(',')}|${b.tokens}`;
}

test('BatchLoader: every window once per epoch, seeded order, exact resume from state()', () => {
  const text = Array.from({ length: 30 }, (_, i) => `document number ${i} with some words`);
  const { windows } = packDocuments(charTok, text, { seqLen: 8, eosId: 3 });
  const n = windows.length;
  const B = 4;
  const L = new BatchLoader(windows, { batchSize: B, seed: 11 });
  assert.equal(L.batchesPerEpoch, Math.ceil(n / B));
  // Epoch 0 order covers each window exactly once.
  const seen = Array.from(L.epochOrder(0)).sort((x, y) => x - y);
  assert.deepEqual(seen, Array.from({ length: n }, (_, i) => i));
  const first = L.next();
  const o = L.epochOrder(0);
  for (let b = 0; b < B; b++) {
    assert.deepEqual(Array.from(first.inputs.subarray(b * 8, b * 8 + 8)), Array.from(windows[o[b]!]!.inputs));
  }
  assert.equal(first.tokens, first.mask.reduce((s, v) => s + v, 0));
  assert.notDeepEqual(Array.from(L.epochOrder(1)), Array.from(o), 'epochs are reshuffled');
  // Run past an epoch boundary, save, continue; a fresh loader restored from JSON yields the same batches.
  for (let i = 0; i < L.batchesPerEpoch + 2; i++) L.next();
  const saved = JSON.parse(JSON.stringify(L.state()));
  assert.equal(saved.epoch, 1);
  const expected = Array.from({ length: 2 * L.batchesPerEpoch }, () => batchKey(L.next()));
  const R = new BatchLoader(windows, { batchSize: B, seed: 999 });
  R.restore(saved);
  assert.deepEqual(Array.from({ length: expected.length }, () => batchKey(R.next())), expected);
  // Another seed gives another order.
  const S = new BatchLoader(windows, { batchSize: B, seed: 12 });
  assert.notEqual(batchKey(S.next()), batchKey(first));
  expectError(() => R.restore({ epoch: 0, index: n + 5, seed: 1 }), /cannot resume/);
  expectError(() => new BatchLoader([], { batchSize: 2, seed: 1 }), /empty/);
  expectError(() => new BatchLoader(windows, { batchSize: 0, seed: 1 }), /batchSize/);
});

test('BatchLoader fills batches larger than the dataset by continuing into the next epoch', () => {
  const { windows } = packDocuments(charTok, ['abcdefgh'], { seqLen: 4, eosId: 0 });
  assert.equal(windows.length, 2);
  const L = new BatchLoader(windows, { batchSize: 5, seed: 1 });
  const b = L.next();
  assert.equal(b.inputs.length, 20);
  assert.deepEqual(L.state(), { epoch: 2, index: 1, seed: 1 });
});

test('capDocs (--max-chars) never cuts a surrogate pair in half (it tokenized as U+FFFD); the spans are clipped with the text', () => {
  assert.deepEqual(capDocs([{ text: 'ab\u{1F600}cd', lossSpans: null }], 3).map((d) => d.text), ['ab']);
  assert.deepEqual(capDocs([{ text: 'ab\u{1F600}cd', lossSpans: null }], 4).map((d) => d.text), ['ab\u{1F600}']);
  assert.deepEqual(capDocs([{ text: 'abcdef', lossSpans: [[1, 3], [4, 6]] }], 5), [{ text: 'abcde', lossSpans: [[1, 3], [4, 5]] }]);
});
