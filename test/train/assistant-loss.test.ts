/**
 * The loss on the assistant's turns only (chat data, --loss-on assistant, the default): packing counts exactly the
 * tokens of the assistant replies and their end-of-turn marker (checked by decoding the counted targets), keeps the
 * mask aligned across documents and windows, and --loss-on all packs as before; a run reports the tokens that carry
 * loss, and its loss differs from an all-token run; conversations without an assistant turn are reported, and data
 * with none is refused with the hint.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { packDocuments } from '../../src/data/pack.js';
import { loadDocs } from '../../src/data/documents.js';
import { CHATML_TEMPLATE, chatFormatOf, chatRenderer, renderChatWithSpans, type ChatMessage } from '../../src/tokenizer/chat.js';
import { Tokenizer } from '../../src/tokenizer/bpe.js';
import { runTraining, type RunSummary } from '../../src/train/run.js';
import { DEFAULT_RUN_OPTIONS, type RunOptions } from '../../src/train/options.js';
import { DistilleryError } from '../../src/util/errors.js';
import { writeCheckpoint } from '../../src/model/checkpoint.js';
import { parseHfConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Rng } from '../../src/util/rng.js';
import { evaluate } from '../../src/cli/commands/eval.js';
import { qwenTokenizerPath } from '../tokenizer/qwen.js';

const tmp = (): string => fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-aloss-'));
const chatml = chatFormatOf(CHATML_TEMPLATE, 'test');

function conversations(userPad = ''): ChatMessage[][] {
  const out: ChatMessage[][] = [];
  for (let i = 0; i < 24; i++) {
    out.push([
      { role: 'system', content: 'You answer briefly.' },
      { role: 'user', content: `Question ${i}: what is ${i} plus ${i + 1}?${userPad} Please explain the steps in detail, café 東京.` },
      { role: 'assistant', content: `It is ${2 * i + 1}.` },
      { role: 'user', content: 'And doubled?' },
      { role: 'assistant', content: `${2 * (2 * i + 1)}, naïvely.` },
    ]);
  }
  return out;
}

test('packing counts exactly the assistant replies and their end marker; --loss-on all packs as plain text', () => {
  const tok = Tokenizer.fromFile(qwenTokenizerPath());
  const rendered = conversations().map((c) => renderChatWithSpans(chatml, c));
  const docs = rendered.map((r) => ({ text: r.text, lossSpans: r.assistant }));
  for (const T of [7, 24, 64]) {
    const p = packDocuments(tok, docs, { seqLen: T, eosId: tok.eosId! });
    const counted: number[] = [];
    for (const w of p.windows) for (let i = 0; i < T; i++) if (w.mask[i]) counted.push(w.targets[i]!);
    assert.equal(counted.length, p.targetTokens);
    // Decoded in order, the counted targets spell the assistant replies (with <|im_end|>), nothing else.
    const want = rendered.flatMap((r) => r.assistant.map(([a, b]) => r.text.slice(a, b))).join('');
    assert.equal(tok.decode(counted), want, `seq ${T}`);
    assert.ok(p.targetTokens < p.totalTokens / 2, 'the user and system turns carry no loss');
  }
  // --loss-on all: documents without spans pack exactly as their texts do.
  const plain = packDocuments(tok, rendered.map((r) => r.text), { seqLen: 24, eosId: tok.eosId! });
  const all = packDocuments(tok, rendered.map((r) => ({ text: r.text, lossSpans: null })), { seqLen: 24, eosId: tok.eosId! });
  assert.deepEqual(all, plain);
  assert.equal(plain.targetTokens, plain.totalTokens - 1);
});

function writeChat(dir: string, convs: ChatMessage[][], name = 'chat.jsonl'): string {
  const f = path.join(dir, name);
  fs.writeFileSync(f, convs.map((c) => JSON.stringify({ messages: c })).join('\n') + '\n');
  return f;
}

function opts(dir: string, data: string, over: Partial<RunOptions> = {}): RunOptions {
  return {
    ...DEFAULT_RUN_OPTIONS, mode: 'train', out: path.join(dir, `run-${Math.random().toString(36).slice(2)}`), data: [data], model: 'tiny',
    tokenizer: qwenTokenizerPath(), batch: 2, seq: 32, steps: 3, evalEvery: 0, saveEvery: 0, warmup: 0, quiet: true, threads: 1,
    ...over,
  } as RunOptions;
}

test('train and distill on chat data: the log and summary count the assistant tokens; the loss differs from --loss-on all; user text does not change the count', async () => {
  const dir = tmp();
  const data = writeChat(dir, conversations());
  const logs: string[] = [];
  const cfg = path.join(dir, 'config.json');
  // a small Qwen3 student over Qwen's vocabulary
  fs.writeFileSync(cfg, JSON.stringify({ model_type: 'qwen3', vocab_size: 151669, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1,
    num_attention_heads: 2, num_key_value_heads: 1, head_dim: 8, max_position_embeddings: 256, tie_word_embeddings: true }));
  const a: RunSummary = await runTraining(opts(dir, data, { model: cfg }), { log: (l: string) => { logs.push(l); } });
  const line = logs.find((l) => /the loss counts \d+ of \d+ tokens/.test(l));
  assert.ok(line, logs.join('\n'));
  const tok = Tokenizer.fromFile(qwenTokenizerPath());
  // The run renders with the template beside its tokenizer.json (Qwen3's, from tokenizer_config.json).
  const qwen3 = chatFormatOf((JSON.parse(fs.readFileSync(path.join(path.dirname(qwenTokenizerPath()), 'tokenizer_config.json'), 'utf8')) as { chat_template: string }).chat_template, 'qwen3');
  const loaded = loadDocs([data], { renderChat: chatRenderer(qwen3, { lossOn: 'assistant' }) });
  // Independently: the tokens of the assistant spans, tokenized in context, by transformers' rule (tokens
  // char_to_token(start) .. char_to_token(end - 1) of each span: the first may begin before the span).
  let want = 0;
  for (const d of loaded.docs) {
    const e = tok.encodeWithOffsets(d.text);
    const charToToken = (c: number): number => e.offsets.findIndex(([s, t]) => s <= c && c < t);
    const marked = new Set<number>();
    for (const [x, y] of d.lossSpans!) for (let k = charToToken(x); k <= charToToken(y - 1); k++) marked.add(k);
    want += marked.size;
  }
  assert.equal(a.dataLossTokens, want);
  assert.match(line, new RegExp(`the loss counts ${want} of ${a.dataTokens} tokens`));
  // (wrapped packing: every token but the first is a target)
  const all = await runTraining(opts(dir, data, { model: cfg, lossOn: 'all', packing: 'wrapped' }), { log: () => {} });
  assert.equal(all.dataLossTokens, all.dataTokens - 1);
  assert.notEqual(all.initialValLoss, a.initialValLoss);
  // Longer user turns: more tokens, the same loss tokens.
  const longer = await runTraining(opts(dir, writeChat(dir, conversations(' (a much longer question, padded with words)'), 'long.jsonl'), { model: cfg }), { log: () => {} });
  assert.equal(longer.dataLossTokens, a.dataLossTokens);
  assert.ok(longer.dataTokens > a.dataTokens);
  // distill: a Qwen3 teacher over the same tokenizer (its chat template, Qwen3's): the same assistant tokens carry the
  // cross-entropy and the KL term.
  const teacherDir = path.join(dir, 'teacher');
  const tcfg = parseHfConfig(JSON.parse(fs.readFileSync(cfg, 'utf8')) as Record<string, unknown>);
  const teacherCfg = { ...tcfg, hiddenSize: 24, intermediateSize: 40 };
  writeCheckpoint(teacherDir, teacherCfg, initialWeights(parameterLayout(teacherCfg), teacherCfg, new Rng(5), 0.2), {
    dtype: 'f32', tokenizerJson: JSON.parse(fs.readFileSync(qwenTokenizerPath(), 'utf8')) as object,
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(path.dirname(qwenTokenizerPath()), 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>,
  });
  // eval follows the same mask: its token count is the assistant tokens of the windows it evaluates.
  const evalOf = (lossOn: 'assistant' | 'all') => evaluate({ model: a.finalDir!, data: [data], seq: 32, batch: 2, maxChars: 0, device: 'cpu', threads: 1, json: false, lossOn, packing: lossOn === 'all' ? 'wrapped' : 'auto' });
  const ea = await evalOf('assistant'), eall = await evalOf('all');
  assert.equal(ea.tokens, want);
  assert.equal(eall.tokens, a.dataTokens - 1);
  assert.notEqual(ea.loss, eall.loss);
  const kd = await runTraining(opts(dir, data, { mode: 'distill', teacher: teacherDir, model: cfg, tokenizer: undefined }), { log: () => {} });
  assert.equal(kd.status, 'completed');
  assert.equal(kd.dataLossTokens, want);
  assert.ok(kd.finalAgreement !== null && Number.isFinite(kd.finalAgreement));
});

test('conversations without an assistant turn are reported; data with none is refused with the --loss-on all hint', async () => {
  const dir = tmp();
  const noReply = conversations().map((c) => c.slice(0, 2));
  const data = writeChat(dir, [...conversations().slice(0, 20), ...noReply.slice(0, 2)]);
  const logs: string[] = [];
  const cfg = path.join(dir, 'config.json');
  fs.writeFileSync(cfg, JSON.stringify({ model_type: 'qwen2', vocab_size: 151669, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1,
    num_attention_heads: 2, num_key_value_heads: 1, max_position_embeddings: 256, tie_word_embeddings: true }));
  await runTraining(opts(dir, data, { model: cfg, steps: 1 }), { log: (l: string) => { logs.push(l); } });
  assert.ok(logs.some((l) => /warning: 2 of 22 conversations have no assistant turn and are left out: .*chat\.jsonl:21, .*chat\.jsonl:22/.test(l)), logs.join('\n'));
  const none = writeChat(dir, noReply, 'none.jsonl');
  await assert.rejects(runTraining(opts(dir, none, { model: cfg, steps: 1 }), { log: () => {} }),
    (e: unknown) => e instanceof DistilleryError && /none of the 24 conversations has an assistant turn/.test(e.message) && /--loss-on all/.test(e.hint ?? ''));
});

test('--resume refuses another --loss-on (the windows would carry other tokens) and names the one to use', async () => {
  const dir = tmp();
  const data = writeChat(dir, conversations());
  const out = path.join(dir, 'run');
  const a = await runTraining(opts(dir, data, { out, steps: 4, stopAfter: 2 }), { log: () => {} });
  assert.equal(a.status, 'stopped');
  await assert.rejects(runTraining(opts(dir, data, { out, steps: 4, resume: true, lossOn: 'all' }), { log: () => {} }),
    (e: unknown) => e instanceof DistilleryError && /--resume: the run was started with --loss-on assistant, not all/.test(e.message)
      && /resume with --loss-on assistant/.test(e.hint ?? ''));
  // the same --loss-on resumes
  const b = await runTraining(opts(dir, data, { out, steps: 4, resume: true }), { log: () => {} });
  assert.equal(b.status, 'completed');
  assert.equal(b.steps, 4);
});
