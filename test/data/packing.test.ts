/**
 * Packing: 'bfd' (conversations whole, best-fit decreasing; longer documents split across windows of their own) against
 * an independent walk over the windows, 'auto', a resumed run's packing, the assistant-token rule against transformers'
 * char_to_token rule, and EOS appended once.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describePacking, packDocuments, packForJob, packingFor, packingOfDescription, PACKINGS } from '../../src/data/index.js';
import { DEFAULT_CHAT_FORMAT } from '../../src/tokenizer/chat.js';
import { DistilleryError } from '../../src/util/errors.js';
import { tokenMeetsSpan, type PackDoc } from '../../src/data/pack.js';
import { runPacking } from '../../src/train/run-data.js';
import type { SavedState } from '../../src/train/run-state.js';
import { UsageError } from '../../src/cli/args.js';

/** One token per character; EOS is id 0 (no character encodes to it). */
const charTok = {
  encode: (s: string): number[] => Array.from(s, (c) => c.charCodeAt(0)),
  encodeWithOffsets: (s: string) => ({ ids: Array.from(s, (c) => c.charCodeAt(0)), offsets: Array.from(s, (_c, i): [number, number] => [i, i + 1]) }),
};
const EOS = 0;

/** Documents of the given lengths, each of distinct letters so that its tokens can be found again. */
function docsOf(lengths: number[]): string[] {
  return lengths.map((n, d) => Array.from({ length: n }, (_x, i) => String.fromCharCode(0x100 + d * 64 + i)).join(''));
}

/** Each window's tokens (inputs then the last target), padding dropped. */
function windowTokens(w: { inputs: Int32Array; targets: Int32Array; mask: Float32Array }): number[] {
  const out: number[] = [];
  let last = -1;
  for (let i = 0; i < w.targets.length; i++) if (w.targets[i]! >= 0) last = i;
  for (let i = 0; i <= last; i++) out.push(w.inputs[i]!);
  if (last >= 0) out.push(w.targets[last]!);
  return out;
}

test('bfd: every document that fits lies whole in one window, placed longest first where it leaves the least room; every token after its document\'s first is a target once', () => {
  // room 11 (seq 10): lengths with EOS 7, 6, 5, 4, 3 (25 tokens): 7 -> w0 (room 4), 6 -> w1 (5), 5 -> w1 (0),
  // 4 -> w0 (0), 3 -> w2: windows of 11, 11 and 3 tokens.
  const docs = docsOf([6, 5, 4, 3, 2]);
  const p = packDocuments(charTok, docs, { seqLen: 10, eosId: EOS, packing: 'bfd' });
  assert.equal(p.packing, 'bfd');
  assert.equal(p.splitDocs, 0);
  const wins = p.windows.map(windowTokens);
  assert.equal(wins.length, 3);
  assert.deepEqual(wins.map((w) => w.length), [11, 11, 3]);
  assert.deepEqual(wins[0], [...charTok.encode(docs[0]!), EOS, ...charTok.encode(docs[3]!), EOS]);
  // each document (its tokens then EOS) is a contiguous run in exactly one window
  for (const d of docs) {
    const seq = [...charTok.encode(d), EOS];
    const holders = wins.filter((w) => w.some((_t, i) => seq.every((x, k) => w[i + k] === x)));
    assert.equal(holders.length, 1, `document ${d.length} lies whole in one window`);
  }
  // targets: every token but each document's first (which its window's row before it, another document's end, does not
  // see coming), once; mask 1 exactly there
  const total = docs.reduce((a, d) => a + d.length + 1, 0);
  assert.equal(p.totalTokens, total);
  assert.equal(p.targetTokens, total - docs.length);
  for (const w of p.windows) {
    const len = w.targets.filter((x) => x >= 0).length; // input rows with a token after them (then the padding document)
    for (let i = 0; i < 10; i++) assert.equal(w.mask[i], w.targets[i]! >= 0 && !(i + 1 < len && w.positions![i + 1] === 0) ? 1 : 0, `row ${i}`);
  }
});

test('bfd: a document longer than a window fills windows of its own, split with stride seq; each of its tokens after the first is a target once', () => {
  const docs = docsOf([25, 3]);
  const p = packDocuments(charTok, docs, { seqLen: 10, eosId: EOS, packing: 'bfd' });
  assert.equal(p.splitDocs, 1);
  const long = [...charTok.encode(docs[0]!), EOS]; // 26 tokens: pieces [0, 11), [10, 21), [20, 26)
  const wins = p.windows.map(windowTokens);
  assert.deepEqual(wins[0], long.slice(0, 11));
  assert.deepEqual(wins[1], long.slice(10, 21));
  // the last piece (6 tokens) takes the short document (4) after it
  const short = [...charTok.encode(docs[1]!), EOS];
  assert.deepEqual(wins[2], [...long.slice(20), ...short]);
  // every token of the long document after its first is a target exactly once
  const counts = new Map<number, number>();
  for (const w of p.windows) for (let i = 0; i < 10; i++) if (w.mask[i]) counts.set(w.targets[i]!, (counts.get(w.targets[i]!) ?? 0) + 1);
  for (const t of long.slice(1, -1)) assert.equal(counts.get(t), 1, `token ${t}`);
  assert.equal(p.targetTokens, 25 + 3, 'the long document\'s 25 targets, the short one\'s 3 (its first, after the piece, is not a target)');
});

test('bfd: a split document\'s last piece placed after another document does not make its first token a target again', () => {
  // seq 10, room 11: a 14-token document (13 + EOS) splits into [0, 11) and [10, 14) (4 tokens); a 7-token document
  // opens a window first (longest first), the 4-token piece joins it
  const docs = docsOf([13, 6]);
  const p = packDocuments(charTok, docs, { seqLen: 10, eosId: EOS, packing: 'bfd' });
  const long = [...charTok.encode(docs[0]!), EOS];
  const wins = p.windows.map(windowTokens);
  assert.equal(wins.length, 2);
  const w = p.windows[1]!;
  const at = windowTokens(w).indexOf(long[10]!);
  assert.ok(at > 0, 'the piece follows the other document');
  assert.equal(w.mask[at - 1], 0, 'the piece\'s first token, already a target of the first piece, is not one here');
  assert.equal(p.targetTokens, 13 + 6);
});

test('none (TRL without packing): one document a window in the data\'s order, padded; a longer one split as bfd splits it; each window starts at its document\'s first token', () => {
  const docs = docsOf([6, 25, 2, 10]);
  const p = packDocuments(charTok, docs, { seqLen: 10, eosId: EOS, packing: 'none' });
  assert.equal(p.packing, 'none');
  assert.equal(p.splitDocs, 1);
  const toks = docs.map((d) => [...charTok.encode(d), EOS]); // 7, 26, 3, 11 tokens
  // the 26-token document: pieces [0, 11), [10, 21), [20, 26), as under bfd, each in a window of its own
  assert.deepEqual(p.windows.map(windowTokens), [toks[0], toks[1]!.slice(0, 11), toks[1]!.slice(10, 21), toks[1]!.slice(20), toks[2], toks[3]]);
  // the padding: inputs EOS, targets -1, mask 0 past each document
  const w0 = p.windows[0]!;
  assert.deepEqual([...w0.inputs.subarray(7)], [EOS, EOS, EOS]);
  assert.deepEqual([...w0.targets.subarray(6)], [-1, -1, -1, -1]);
  assert.deepEqual([...w0.mask.subarray(5)], [1, 0, 0, 0, 0]);
  // every token after a document's first is a target exactly once (a split piece's first token only in the piece before)
  assert.equal(p.targetTokens, 6 + 25 + 2 + 10);
  assert.deepEqual(p.windows.map((w) => w.id), [0, 1, 2, 3, 4, 5]);
  // the same windows as bfd gives each document packed alone
  docs.forEach((d, i) => {
    const alone = packDocuments(charTok, [d], { seqLen: 10, eosId: EOS, packing: 'bfd' }).windows.map(windowTokens);
    assert.deepEqual(p.windows.map(windowTokens).filter((w) => toks[i]!.includes(w[0]!)), alone, `document ${i}`);
  });
  assert.equal(packingFor('none', [{ conversation: true }]), 'none');
});

test('a packing\'s description (a teacher cache\'s manifest) names the packing again, with or without the tokenizer\'s note', () => {
  for (const p of PACKINGS) {
    assert.equal(packingOfDescription(describePacking(p)), p);
    assert.equal(packingOfDescription(describePacking(p, { documentPrefix: [1] })), p);
  }
  assert.equal(new Set(PACKINGS.map((p) => describePacking(p))).size, PACKINGS.length);
  assert.equal(packingOfDescription('something an older version wrote'), null);
});

test('wrapped is the old stream packing; bfd and wrapped agree on a single document that fits; auto picks bfd on conversations', () => {
  const docs = docsOf([6, 5, 4]);
  const w = packDocuments(charTok, docs, { seqLen: 8, eosId: EOS });
  assert.equal(w.packing, 'wrapped');
  assert.equal(w.targetTokens, w.totalTokens - 1);
  const one = docsOf([6]);
  // (the bfd window also names its rows' document positions: one document, then the padding's)
  const [bfdOne] = packDocuments(charTok, one, { seqLen: 8, eosId: EOS, packing: 'bfd' }).windows;
  const { positions, ...rest } = bfdOne!;
  assert.deepEqual([rest], packDocuments(charTok, one, { seqLen: 8, eosId: EOS }).windows);
  assert.deepEqual(Array.from(positions!), [0, 1, 2, 3, 4, 5, 0, 1]); // 6 tokens and the EOS: 6 input rows, then 2 of padding
  assert.equal(packingFor('auto', [{}, { conversation: true }]), 'bfd');
  assert.equal(packingFor(undefined, [{}, {}]), 'wrapped');
  assert.equal(packingFor('wrapped', [{ conversation: true }]), 'wrapped');
});

test('a resumed run keeps the packing it started with (an older run: wrapped); another explicit one is refused', () => {
  const saved = (packing: string | undefined): SavedState => ({ options: packing === undefined ? {} : { packing } } as unknown as SavedState);
  const chat = [{ conversation: true }];
  const logs: string[] = [];
  assert.equal(runPacking({ packing: 'auto' }, saved(undefined), chat, (l) => logs.push(l)), 'wrapped');
  assert.match(logs.join('\n'), /keeps the run's packing, wrapped/);
  assert.equal(runPacking({ packing: 'auto' }, saved('auto'), chat, () => {}), 'bfd');
  assert.equal(runPacking({ packing: 'auto' }, null, chat, () => {}), 'bfd');
  assert.throws(() => runPacking({ packing: 'bfd' }, saved('wrapped'), chat, () => {}),
    (e: unknown) => e instanceof UsageError && /started with --packing wrapped, not bfd/.test(e.message) && /--packing wrapped/.test(e.hint ?? ''));
});

test('assistant tokens: transformers\' rule (char_to_token(start) .. char_to_token(end - 1)), a token that begins before the span included', () => {
  // tokens over "ab|cde|f" as [0,2) [2,5) [5,6); a span [3, 6) starts inside the second token
  const offsets: Array<[number, number]> = [[0, 2], [2, 5], [5, 6]];
  const charToToken = (c: number): number => offsets.findIndex(([s, e]) => s <= c && c < e);
  for (const [a, b] of [[3, 6], [0, 1], [2, 5], [4, 5], [1, 3], [5, 6]] as const) {
    const want = new Set<number>();
    for (let k = charToToken(a); k <= charToToken(b - 1); k++) want.add(k);
    const got = new Set(offsets.map(([s, e], i) => (tokenMeetsSpan(s, e, a, b) ? i : -1)).filter((i) => i >= 0));
    assert.deepEqual([...got].sort(), [...want].sort(), `span [${a}, ${b})`);
  }
  // through packing: a document whose span starts mid-token counts that token
  const tok = {
    encode: (s: string): number[] => [s.length],
    encodeWithOffsets: (): { ids: number[]; offsets: Array<[number, number]> } => ({ ids: [1, 2, 3], offsets }),
  };
  const doc: PackDoc = { text: 'abcdef', lossSpans: [[3, 6]] };
  const p = packDocuments(tok, [doc], { seqLen: 8, eosId: 0, packing: 'wrapped' });
  // targets are tokens 1, 2, EOS: token 1 ([2, 5)) and 2 ([5, 6)) count, EOS does not
  assert.deepEqual(Array.from(p.windows[0]!.mask.subarray(0, 3)), [1, 1, 0]);
});

test('EOS is appended once: a text that already ends with it gets no second one', () => {
  const tok = { encode: (s: string): number[] => (s.endsWith('!') ? [...Array.from(s.slice(0, -1), (c) => c.charCodeAt(0)), 0] : Array.from(s, (c) => c.charCodeAt(0))) };
  const p = packDocuments(tok, ['ab!', 'cd'], { seqLen: 8, eosId: 0 });
  assert.equal(p.totalTokens, 3 + 3);
  assert.deepEqual(Array.from(p.windows[0]!.inputs.subarray(0, 5)), [97, 98, 0, 99, 100]);
});

test('a text document is tokenized as transformers\' tokenizer(text) does: inside the post-processor\'s special tokens (Llama 3\'s <|begin_of_text|>); a conversation is not', async () => {
  const { trainBpe } = await import('../../src/tokenizer/train-bpe.js');
  const { Tokenizer } = await import('../../src/tokenizer/bpe.js');
  const base = trainBpe(['hello world, hello tokens'], { vocabSize: 280, specialTokens: ['<|end_of_text|>', '<|begin_of_text|>'] });
  const json = base.toJSON() as Record<string, unknown>;
  const bos = base.tokenToId('<|begin_of_text|>')!;
  // Llama 3.x: a Sequence of ByteLevel and TemplateProcessing "$A" after <|begin_of_text|>
  const llama = Tokenizer.fromJSON({ ...json, post_processor: { type: 'Sequence', processors: [
    { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [], special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [bos], tokens: ['<|begin_of_text|>'] } } },
  ] } });
  assert.deepEqual(llama.documentPrefix, [bos]);
  assert.deepEqual(llama.documentSuffix, []);
  assert.deepEqual(llama.encodeDocument('hello'), [bos, ...llama.encode('hello')]);
  const eos = llama.tokenToId('<|end_of_text|>')!;
  const p = packDocuments(llama, ['hello world', { text: 'hello', lossSpans: null, conversation: true }], { seqLen: 32, eosId: eos });
  const ids = Array.from(p.windows[0]!.inputs.subarray(0, p.totalTokens));
  assert.deepEqual(ids, [bos, ...llama.encode('hello world'), eos, ...llama.encode('hello'), eos].slice(0, p.totalTokens));
  // Qwen-style (ByteLevel post-processor only) and absent ones add nothing
  assert.deepEqual(Tokenizer.fromJSON({ ...json, post_processor: { type: 'ByteLevel' } }).documentPrefix, []);
  assert.deepEqual(base.encodeDocument('hello'), base.encode('hello'));
  // a template naming a token the vocabulary lacks is refused
  assert.throws(() => Tokenizer.fromJSON({ ...json, post_processor: { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }], special_tokens: {} } }),
    /post_processor: the special token "<s>"/);
});

test('a conversation whose rendering already ends with EOS keeps its loss mask aligned (no second EOS, no shifted or overflowing mask)', () => {
  // EOS is id 0, which the character \u0000 encodes to: the text ends with it
  for (const packing of ['wrapped', 'bfd'] as const) {
    const p = packDocuments(charTok, [{ text: 'xy', lossSpans: null }, { text: 'ab\u0000', lossSpans: [[1, 3]] }], { seqLen: 8, eosId: EOS, packing });
    assert.equal(p.totalTokens, 3 + 3);
    const w = p.windows.find((x) => Array.from(x.targets).includes(98))!;
    const at = Array.from(w.targets).indexOf(98);
    assert.deepEqual([w.targets[at], w.targets[at + 1]], [98, 0]);
    assert.deepEqual([w.mask[at], w.mask[at + 1]], [1, 1], packing);
    assert.equal(w.mask[at - 1], 0, 'the reply\'s span starts at b');
  }
});

test('packForJob: the end-of-text id (eosId, else <|endoftext|>), the chat-token check, \'auto\' resolved on the data, the split warning', () => {
  const ids: Record<string, number> = { '<|endoftext|>': 0, '<|im_start|>': 1, '<|im_end|>': 2 };
  const tok = { ...charTok, eosId: undefined, tokenToId: (t: string): number | undefined => ids[t] };
  const logs: string[] = [];
  const log = (s: string): void => { logs.push(s); };
  const text = docsOf([3, 4]);
  const t = packForJob(tok, text, DEFAULT_CHAT_FORMAT, { seq: 8, packing: 'auto' }, log);
  assert.equal(t.eosId, 0);
  assert.equal(t.packing, 'wrapped');
  assert.deepEqual(t.packed, packDocuments(tok, text, { seqLen: 8, eosId: 0, packing: 'wrapped' }));
  const chat: PackDoc[] = [{ text: docsOf([20])[0]!, lossSpans: null, conversation: true }, ...text];
  const c = packForJob(tok, chat, DEFAULT_CHAT_FORMAT, { seq: 8, packing: undefined }, log);
  assert.equal(c.packing, 'bfd');
  assert.equal(c.packed.splitDocs, 1);
  assert.match(logs.join('\n'), /1 of 3 documents are longer than --seq 8 \+ 1 tokens/);
  assert.equal(packForJob(tok, chat, DEFAULT_CHAT_FORMAT, { seq: 8, packing: 'wrapped' }, log).packing, 'wrapped');
  // a tokenizer without the ChatML tokens, conversations and no template: refused; with no end-of-text token: refused
  assert.throws(() => packForJob({ ...tok, tokenToId: (s: string) => (s === '<|endoftext|>' ? 0 : undefined) }, chat, DEFAULT_CHAT_FORMAT, { seq: 8 }, log),
    (e: unknown) => e instanceof DistilleryError && /no chat template/.test(e.message));
  assert.throws(() => packForJob({ ...tok, tokenToId: () => undefined }, text, DEFAULT_CHAT_FORMAT, { seq: 8 }, log),
    (e: unknown) => e instanceof DistilleryError && e.message === 'the tokenizer has no end-of-text token');
  // the error names where the tokenizer came from (eval named its --model before packForJob)
  assert.throws(() => packForJob({ ...tok, tokenToId: () => undefined }, text, DEFAULT_CHAT_FORMAT, { seq: 8, tokenizerOf: 'runs/x/best' }, log),
    (e: unknown) => e instanceof DistilleryError && e.message === 'the tokenizer of runs/x/best has no end-of-text token');
  assert.equal(packForJob({ ...tok, eosId: 7, tokenToId: () => undefined }, text, DEFAULT_CHAT_FORMAT, { seq: 8 }, log).eosId, 7);
});
