/**
 * Hub ids and what comes with a Hub model, through the CLI (main) and src/io/hf-cache.ts:
 * - a fake Hugging Face cache in a temp folder (refs/main, refs/<branch>, snapshots/<commit>/ with a symlinked file,
 *   as huggingface_hub lays it out) resolves `owner/name`, `owner/name@branch` and `owner/name@<commit prefix>` for
 *   inspect, generate, eval and distill/train option resolution; the search order is HF_HUB_CACHE, HF_HOME/hub, ...;
 * - an id that is not cached is one sentence naming where distillery looked and that it does not download (exit 2);
 * - distill (the real run) and eval --teacher refuse a teacher whose tokenizer has the same size but differs (exit 1);
 * - generation_config.json's eos ids stop generation; --chat refuses a non-ChatML template (exit 2).
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { main } from '../../src/cli/main.js';
import { hubCacheDirs, looksLikeHubId, resolveHubModel } from '../../src/io/hf-cache.js';
import type { RunOptions } from '../../src/train/options.js';
import { capture, tempDir, tinyTokenizer, TEXT, writeTinyCheckpoint } from './fixtures.js';

type Json = Record<string, unknown>;
let dir = '', cache = '', dataFile = '', snap = '', snapDev = '';
const COMMIT = '0123456789abcdef0123456789abcdef01234567';
const DEV = 'fedcba9876543210fedcba9876543210fedcba98';
const saved = { HF_HUB_CACHE: process.env.HF_HUB_CACHE, HF_HOME: process.env.HF_HOME };

/** A cached repo: refs/main → COMMIT, refs/dev → DEV, each snapshot a tiny checkpoint whose config.json is a blob symlink. */
function cacheRepo(root: string, id: string): { main: string; dev: string } {
  const repo = path.join(root, `models--${id.replace('/', '--')}`);
  fs.mkdirSync(path.join(repo, 'refs'), { recursive: true });
  fs.writeFileSync(path.join(repo, 'refs', 'main'), COMMIT);
  fs.writeFileSync(path.join(repo, 'refs', 'dev'), DEV + '\n');
  const out = { main: path.join(repo, 'snapshots', COMMIT), dev: path.join(repo, 'snapshots', DEV) };
  writeTinyCheckpoint(out.main, 1);
  writeTinyCheckpoint(out.dev, 2, { hiddenSize: 32, intermediateSize: 48, headDim: 8 });
  fs.mkdirSync(path.join(repo, 'blobs'));
  fs.renameSync(path.join(out.main, 'config.json'), path.join(repo, 'blobs', 'cfgblob'));
  fs.symlinkSync(path.join('..', '..', 'blobs', 'cfgblob'), path.join(out.main, 'config.json'));
  return out;
}

before(() => {
  dir = tempDir();
  cache = path.join(dir, 'hub');
  ({ main: snap, dev: snapDev } = cacheRepo(cache, 'Tiny/qwen-test'));
  dataFile = path.join(dir, 'data.txt');
  fs.writeFileSync(dataFile, TEXT.join('\n\n').repeat(3));
  process.env.HF_HUB_CACHE = cache;
  delete process.env.HF_HOME;
});
after(() => {
  for (const [k, v] of Object.entries(saved)) { if (v === undefined) delete process.env[k]; else process.env[k] = v; }
  fs.rmSync(dir, { recursive: true, force: true });
});

async function run(argv: string[], deps = {}) {
  const io = capture();
  const code = await main(argv, io, deps);
  return { code, out: io.stdout(), err: io.stderr() };
}

test('Hub ids: shape, cache folder order, refs/main, @branch, @commit prefix', () => {
  for (const ok of ['Qwen/Qwen2.5-0.5B', 'meta-llama/Llama-3.2-1B@main', 'a/b@0123abc']) assert.ok(looksLikeHubId(ok), ok);
  for (const no of ['qwen2.5-0.5b', 'runs/a/final', '/abs/x', './a/b', 'a/b@', 'a/../b', 'a/b@x/../y', 'configs/student.json', 'x/model.safetensors']) assert.ok(!looksLikeHubId(no), no);
  assert.deepEqual(hubCacheDirs({ HF_HUB_CACHE: '/c1', HF_HOME: '/h', XDG_CACHE_HOME: '/x' }, '/home/u'),
    ['/c1', '/h/hub', '/x/huggingface/hub', '/home/u/.cache/huggingface/hub']);
  assert.deepEqual(hubCacheDirs({}, '/home/u'), ['/home/u/.cache/huggingface/hub']);
  // HF_HOME/hub is searched when HF_HUB_CACHE does not have the model.
  const env = { HF_HUB_CACHE: path.join(dir, 'empty'), HF_HOME: dir };
  assert.deepEqual(resolveHubModel('Tiny/qwen-test', env, '/nonexistent'), { ok: true, dir: snap, revision: COMMIT });
  assert.deepEqual(resolveHubModel('Tiny/qwen-test@dev', env, '/nonexistent'), { ok: true, dir: snapDev, revision: DEV });
  assert.deepEqual(resolveHubModel(`Tiny/qwen-test@${DEV.slice(0, 8)}`, env, '/nonexistent'), { ok: true, dir: snapDev, revision: DEV });
  const miss = resolveHubModel('Tiny/qwen-test@nope', env, '/nonexistent');
  assert.equal(miss.ok, false);
});

test('inspect, generate and eval take a Hub id from the local cache (refs/main; @branch)', async () => {
  const i = await run(['inspect', 'Tiny/qwen-test']);
  assert.equal(i.code, 0, i.err);
  assert.match(i.out, new RegExp(`^folder +${snap.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}$`, 'm'));
  assert.match(i.out, /^chat template {2}ChatML-style Jinja template/m, 'writeCheckpoint gave the ChatML tokenizer its template');
  // kernels plan reads the snapshot's config.json for a Hub id.
  let kargs: Record<string, unknown> = {};
  const k = await run(['kernels', 'plan', '--model', 'Tiny/qwen-test'], { kernelsCommand: async (_s: string, a: Record<string, unknown>) => { kargs = a; return 0; } });
  assert.equal(k.code, 0, k.err);
  assert.equal(kargs.model, snap);
  const byId = await run(['generate', '--model', 'Tiny/qwen-test@dev', '--prompt', 'The teacher', '--max-new-tokens', '6', '--threads', '1']);
  const byDir = await run(['generate', '--model', snapDev, '--prompt', 'The teacher', '--max-new-tokens', '6', '--threads', '1']);
  assert.equal(byId.code, 0, byId.err);
  assert.equal(byId.out, byDir.out);
  const e = await run(['eval', '--model', 'Tiny/qwen-test', '--data', dataFile, '--seq', '16', '--threads', '1', '--json']);
  assert.equal(e.code, 0, e.err);
  assert.ok(Number.isFinite((JSON.parse(e.out) as { loss: number }).loss));
});

test('an id that is not cached: exit 2, one sentence with where it looked and that distillery does not download', async () => {
  const r = await run(['generate', '--model', 'Qwen/Not-There', '--prompt', 'x']);
  assert.equal(r.code, 2);
  const line = r.err.split('\n')[0]!;
  assert.ok(line.startsWith(`error: --model: Qwen/Not-There is not a local folder and is not in the local Hugging Face cache (looked in ${path.join(cache, 'models--Qwen--Not-There')}`), line);
  assert.match(line, /\); distillery does not download models$/);
  assert.match(r.err, /hint: download it first \(e\.g\. `hf download Qwen\/Not-There`/);
  const d = await run(['distill', '--teacher', 'Qwen/Not-There', '--data', dataFile, '--out', path.join(dir, 'o')], { runTraining: async () => { throw new Error('must not run'); } });
  assert.equal(d.code, 2);
  assert.match(d.err, /^error: --teacher: Qwen\/Not-There is not a local folder/);
});

test('distill/train resolve --teacher, --init, --tokenizer and --model Hub ids to the cached snapshot (--model: its config.json)', async () => {
  let got: RunOptions | null = null;
  const deps = { runTraining: async (o: RunOptions) => { got = o; return {}; } };
  const r = await run(['distill', '--teacher', 'Tiny/qwen-test', '--init', 'Tiny/qwen-test@dev', '--tokenizer', 'Tiny/qwen-test', '--data', dataFile, '--out', path.join(dir, 'o')], deps);
  assert.equal(r.code, 0, r.err);
  assert.equal(got!.teacher, snap);
  assert.equal(got!.init, snapDev);
  assert.equal(got!.tokenizer, snap);
  const t = await run(['train', '--model', 'Tiny/qwen-test', '--data', dataFile, '--out', path.join(dir, 'o')], deps);
  assert.equal(t.code, 0, t.err);
  assert.equal(got!.model, path.join(snap, 'config.json'));
});

/** The fixture tokenizer with two merged tokens' ids swapped: same size, another tokenizer. */
function swapped(): { json: Json; id: number; a: string; b: string } {
  const json = tinyTokenizer().toJSON();
  const vocab = (json.model as Json).vocab as Record<string, number>;
  const [[a, ia], [b, ib]] = Object.entries(vocab).filter(([, id]) => id >= 256).sort((x, y) => x[1] - y[1]);
  vocab[a!] = ib!; vocab[b!] = ia!;
  return { json, id: ia!, a: a!, b: b! };
}

test('distill and eval --teacher refuse a teacher whose tokenizer has the same size but differs (exit 1, both sizes, first difference)', async () => {
  const student = path.join(dir, 'student');
  const teacher = path.join(dir, 'teacher-swapped');
  writeTinyCheckpoint(student, 1);
  writeTinyCheckpoint(teacher, 2);
  const sw = swapped();
  fs.writeFileSync(path.join(teacher, 'tokenizer.json'), JSON.stringify(sw.json));
  const n = tinyTokenizer().vocabSize;
  const first = `first difference: token ${sw.id}: teacher ${JSON.stringify(sw.b)} vs`;
  const e = await run(['eval', '--model', student, '--teacher', teacher, '--data', dataFile, '--seq', '16', '--threads', '1']);
  assert.equal(e.code, 1);
  assert.equal(e.out, '', 'no agreement figure may be printed');
  // (stderr first names the baked parameters of each model, then the error)
  assert.ok(`\n${e.err}`.includes(`\nerror: the teacher and the model use different tokenizers (teacher: ${n} tokens, model: ${n} tokens); ${first} model ${JSON.stringify(sw.a)}\n`), e.err);
  const d = await run(['distill', '--teacher', teacher, '--init', student, '--data', dataFile, '--out', path.join(dir, 'run'),
    '--steps', '2', '--warmup', '0', '--batch', '2', '--seq', '16', '--threads', '1', '--quiet']);
  assert.equal(d.code, 1);
  assert.match(d.err, new RegExp(`^error: the teacher and the student use different tokenizers \\(teacher: ${n} tokens, student: ${n} tokens\\); first difference: token ${sw.id}: `, 'm'));
  assert.match(d.err, /hint: distillation compares the two models token by token/);
});

test('generate stops at generation_config.json\'s eos ids; --chat renders with any template, reports its refusals (exit 1) and bad options (exit 2)', async () => {
  const flat = path.join(dir, 'flat');
  writeTinyCheckpoint(flat, 1, {}, true); // every logit 0: greedy always picks id 0
  const tok = tinyTokenizer();
  assert.notEqual(tok.eosId, 0);
  const argv = ['generate', '--model', flat, '--prompt', 'The', '--max-new-tokens', '5', '--threads', '1'];
  const before = await run(argv);
  assert.equal(before.code, 0, before.err);
  assert.equal(before.out, tok.decode([0, 0, 0, 0, 0]) + '\n');
  fs.writeFileSync(path.join(flat, 'generation_config.json'), JSON.stringify({ eos_token_id: [tok.eosId, 0] }));
  const after = await run(argv);
  assert.equal(after.code, 0, after.err);
  assert.equal(after.out, '\n', 'id 0 is an eos id of generation_config.json: nothing is generated');
  fs.writeFileSync(path.join(flat, 'generation_config.json'), JSON.stringify({ eos_token_id: 'zero' }));
  const bad = await run(argv);
  assert.equal(bad.code, 1);
  assert.match(bad.err, /generation_config\.json: eos_token_id must be a token id or a list of token ids, got "zero"/);
  fs.rmSync(path.join(flat, 'generation_config.json'));
  const tc = JSON.parse(fs.readFileSync(path.join(flat, 'tokenizer_config.json'), 'utf8')) as Json;
  tc.chat_template = "{% for m in messages %}{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}{% endfor %}";
  fs.writeFileSync(path.join(flat, 'tokenizer_config.json'), JSON.stringify(tc));
  const chat = await run([...argv, '--chat']);
  assert.equal(chat.code, 0, chat.err);
  tc.chat_template = "{{ raise_exception('System turns are not supported') }}";
  fs.writeFileSync(path.join(flat, 'tokenizer_config.json'), JSON.stringify(tc));
  const refused = await run([...argv, '--chat']);
  assert.equal(refused.code, 1);
  assert.match(refused.err, /refused the conversation: System turns are not supported/);
  const badKw = await run([...argv, '--chat', '--chat-template-kwargs', 'nope']);
  assert.equal(badKw.code, 2);
  assert.match(badKw.err, /--chat-template-kwargs: not valid JSON/);
});
