/**
 * The teacher cache as an artifact: the record encoding round-trips (ids, counts, quantized log-probabilities, tails);
 * the job stores, for every counted position, exactly the sparse row of the teacher's own logits (recomputed here with
 * a plain forward); a job stopped after a shard, or killed with SIGKILL, continues on rerun into the bytes of an
 * uninterrupted job; a damaged shard is named and recomputed; a cache of other settings is refused with what differs;
 * distill --teacher-cache refuses a cache that does not match the run, trains with no teacher, and resumes bit-exactly.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { createHash } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { buildTeacherCache, type CacheJobOptions } from '../../src/cache/build.js';
import { weightsHash } from '../../src/model/weights-hash.js';
import { decodeWindow, encodeWindow, recordLayout, bitsFor, LOGQ_SCALE } from '../../src/cache/format.js';
import { cacheUniform, DEFAULT_SPARSE, sparseRow, type SparseEntry, type SparseRep } from '../../src/cache/sparse.js';
import { maxBitsPerPosition } from '../../src/cache/dry-run.js';
import { CACHE_FORMAT, CACHE_VERSION, TeacherCache, readManifest } from '../../src/cache/store.js';
import { loadTransformer } from '../../src/model/checkpoint.js';
import { packDocuments } from '../../src/data/index.js';
import { runTraining } from '../../src/train/run.js';
import { DEFAULT_RUN_OPTIONS, type RunOptions } from '../../src/train/options.js';
import { DistilleryError, InputError } from '../../src/util/errors.js';
import { Rng } from '../../src/util/rng.js';
import { TEXT, tempDir, tinyTokenizer, writeTinyCheckpoint } from '../cli/fixtures.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const CLI = path.resolve(here, '../../../bin/distillery.js');

function writeData(dir: string, copies = 12): string {
  const file = path.join(dir, 'data.txt');
  // One document: a few hundred tokens of the fixture sentences.
  fs.writeFileSync(file, Array.from({ length: copies }, (_, i) => TEXT[i % TEXT.length]).join(' '));
  return file;
}

function jobOptions(teacher: string, data: string, out: string, over: Partial<CacheJobOptions> = {}): CacheJobOptions {
  return {
    teacher, data: [data], out, seq: 8, batch: 3, sparse: { kind: 'sample', n: 6 }, temperature: 2, seed: 5, valFraction: 0.2,
    lossOn: 'assistant', maxChars: 0, device: 'cpu', precision: 'fp32', threads: 1, shardWindows: 4, overwrite: false, quiet: true, ...over,
  };
}

function shardFiles(dir: string): Map<string, Buffer> {
  return new Map(fs.readdirSync(dir).filter((f) => f.endsWith('.bin')).sort().map((f) => [f, fs.readFileSync(path.join(dir, f))]));
}

test('weightsHash: hashing in chunks (any chunk size, any sub-array offset) gives the SHA-256 of the float32 bytes', () => {
  // The chunked walk exists because a 1.5B-parameter teacher's 6 GB does not fit one Uint8Array view (V8's limit).
  const backing = new Float32Array(1003);
  const rng = new Rng(7);
  for (let i = 0; i < backing.length; i++) backing[i] = rng.normal();
  const w = backing.subarray(3, 1000);
  const expect = createHash('sha256').update(Buffer.from(w.buffer, w.byteOffset, w.byteLength)).digest('hex');
  for (const chunk of [4, 12, 1000, 3988, 3989, 1 << 28]) assert.equal(weightsHash(w, { tensors: [{ offset: 0, size: w.length }] }, chunk), expect, `chunk ${chunk}`);
});

test('cache records: sample and top-K rows round-trip (ids, counts, tails; log-probabilities to half a quantization step)', () => {
  const rng = new Rng(3);
  for (const rep of [{ kind: 'sample', n: 16 }, { kind: 'top', k: 5 }, { kind: 'top', k: 40 }] as SparseRep[]) {
    const V = rep.kind === 'top' && rep.k === 40 ? 40 : 151936;
    const lay = recordLayout(rep, V);
    assert.equal(lay.idBits, bitsFor(V - 1));
    const entries: SparseEntry[] = [];
    for (let p = 0; p < 7; p++) {
      const z = Float64Array.from({ length: Math.min(V, 500) }, () => rng.normal() * 3);
      const e = sparseRow(z, 0, z.length, 2, rep, () => rng.next());
      // spread the ids over the whole vocabulary (the bits an id takes)
      if (V > 500) e.ids = e.ids.map((id) => (rep.kind === 'sample' ? id * 300 : id + V - 500));
      if (rep.kind === 'sample') e.argmax = V - 1;
      entries.push(e);
    }
    const rec = encodeWindow(lay, entries);
    const back = decodeWindow(lay, rec, entries.length);
    entries.forEach((e, p) => {
      const b = back[p]!;
      assert.deepEqual(b.ids, e.ids);
      assert.equal(b.argmax, rep.kind === 'top' ? e.ids[0] : e.argmax);
      e.logq.forEach((l, k) => assert.ok(Math.abs(b.logq[k]! - l) <= 0.5 / LOGQ_SCALE + 1e-12, `logq ${b.logq[k]} vs ${l}`));
      if (e.tail < 0) assert.equal(b.tail, -1);
      else assert.ok(Math.abs(Math.log(b.tail) - Math.log(e.tail)) <= 0.5 / LOGQ_SCALE + 1e-12);
    });
    assert.throws(() => decodeWindow(lay, rec.subarray(0, rec.length - 2), entries.length), /past the end|holds/);
  }
});

test('the default representation stays at or under 100 bytes per token over Qwen\'s 151936 rows, even when every draw differs', () => {
  // The worst case (a near-uniform teacher: a random-init 1.5B on the H100 gave 138.9 bytes per token with the old
  // 16-bit sample:32 records); the bound is the encoder's real output, not arithmetic.
  const lay = recordLayout(DEFAULT_SPARSE, 151936);
  assert.equal(DEFAULT_SPARSE.kind, 'sample');
  const n = DEFAULT_SPARSE.kind === 'sample' ? DEFAULT_SPARSE.n : 0;
  const positions = 64;
  const entries: SparseEntry[] = Array.from({ length: positions }, (_, p) => ({
    ids: Array.from({ length: n }, (_, k) => 151935 - k * 997 - p), counts: [], logq: Array.from({ length: n }, () => -Math.log(151936)), tail: -1, argmax: 151935,
  }));
  const bytes = encodeWindow(lay, entries).length / positions;
  assert.ok(bytes <= 100, `${bytes} bytes per token`);
  assert.ok(Math.abs(bytes - maxBitsPerPosition(lay) / 8) < 1 / positions + 1e-12, `${bytes} vs the dry run's ${maxBitsPerPosition(lay) / 8}`);
});

test('teacher-cache: every counted position holds the sparse row of the teacher\'s own logits; the manifest says what the cache is of', async () => {
  const dir = tempDir();
  const teacherDir = path.join(dir, 'teacher');
  writeTinyCheckpoint(teacherDir, 11);
  const data = writeData(dir);
  const out = path.join(dir, 'cache');
  const logs: string[] = [];
  const s = await buildTeacherCache(jobOptions(teacherDir, data, out), { log: (l) => logs.push(l) });
  assert.ok(s.complete);
  assert.ok(logs.some((l) => /bytes per token \(sample:6\)/.test(l)), logs.join('\n'));
  const m = readManifest(out)!;
  assert.equal(m.sparse, 'sample:6'); assert.equal(m.temperature, 2); assert.equal(m.seq, 8);
  assert.equal(m.shards.length, Math.ceil(m.windows / 4));
  assert.equal(m.shards.reduce((a, x) => a + x.positions, 0), m.data.loss_tokens);
  // Recompute: the teacher's logits for every window, then the sparse row with the cache's draws.
  const tok = tinyTokenizer();
  const packed = packDocuments(tok, [fs.readFileSync(data, 'utf8')], { seqLen: 8, eosId: tok.eosId ?? tok.tokenToId('<|endoftext|>')! });
  assert.equal(packed.windows.length, m.windows);
  const be = createCpuBackend({ threads: 1 });
  const { model } = loadTransformer(be, teacherDir, { batch: 1, seq: 8, training: false });
  const cache = TeacherCache.open(out);
  const V = tok.vocabSize;
  for (const w of packed.windows) {
    const z = be.download(model.forward(w.inputs, 1, 8));
    const got = cache.entries(w.id!);
    let k = 0;
    for (let p = 0; p < 8; p++) {
      if (w.mask[p] === 0) continue;
      const want = sparseRow(z, p * model.config.vocabSize, V, 2, { kind: 'sample', n: 6 }, (i) => cacheUniform(5, w.id!, p, i));
      const g = got[k++]!;
      assert.deepEqual(g.ids, want.ids, `window ${w.id} position ${p}`);
      assert.equal(g.argmax, want.argmax);
      g.logq.forEach((l, i) => assert.ok(Math.abs(l - want.logq[i]!) <= 0.5 / LOGQ_SCALE + 1e-6));
    }
    assert.equal(k, got.length);
  }
  be.dispose();
  // The teacher's header travels with the cache: config, tokenizer.
  const header = cache.teacherHeader();
  assert.equal(header.config.vocabSize, model.config.vocabSize);
  assert.equal(header.tokenizer!.vocabSize, V);
});

test('teacher-cache: a job stopped after a shard, with a torn temp file and a damaged shard, continues into the bytes of an uninterrupted job', async () => {
  const dir = tempDir();
  const teacherDir = path.join(dir, 'teacher');
  writeTinyCheckpoint(teacherDir, 12);
  const data = writeData(dir);
  const whole = path.join(dir, 'whole'), part = path.join(dir, 'part');
  await buildTeacherCache(jobOptions(teacherDir, data, whole), { log: () => {} });
  class Stop extends Error {}
  await assert.rejects(buildTeacherCache(jobOptions(teacherDir, data, part), { log: () => {}, afterShard: (i) => { if (i === 1) throw new Stop(); } }), Stop);
  let m = readManifest(part)!;
  assert.equal(m.complete, false);
  assert.equal(m.shards.length, 2);
  assert.throws(() => TeacherCache.open(part), /incomplete \(8 of \d+ windows written\)/);
  // A torn write and a damaged listed shard.
  fs.writeFileSync(path.join(part, '.shard-00002.bin.tmp-123'), 'torn');
  const s1 = path.join(part, 'shard-00001.bin');
  const bytes = fs.readFileSync(s1); bytes[bytes.length - 1]! ^= 0xff; fs.writeFileSync(s1, bytes);
  const logs: string[] = [];
  const s = await buildTeacherCache(jobOptions(teacherDir, data, part), { log: (l) => logs.push(l) });
  assert.ok(s.complete);
  assert.ok(logs.some((l) => /shard shard-00001\.bin is missing or damaged; computing it again/.test(l)), logs.join('\n'));
  assert.equal(s.shardsKept, 1);
  assert.deepEqual(shardFiles(part), shardFiles(whole));
  assert.ok(!fs.readdirSync(part).some((f) => f.includes('.tmp')));
  m = readManifest(part)!;
  assert.deepEqual(m.shards, readManifest(whole)!.shards);
  // A reader names a shard damaged after the fact.
  const s0 = path.join(part, 'shard-00000.bin');
  const b0 = fs.readFileSync(s0); b0[20]! ^= 1; fs.writeFileSync(s0, b0);
  assert.throws(() => TeacherCache.open(part).entries(0), (e: unknown) => e instanceof DistilleryError && /shard-00000\.bin is damaged \(its SHA-256/.test(e.message));
  // Other settings into the same folder are refused, naming what differs.
  await assert.rejects(buildTeacherCache(jobOptions(teacherDir, data, whole, { temperature: 1, sparse: { kind: 'top', k: 4 } }), { log: () => {} }),
    (e: unknown) => e instanceof DistilleryError && /--temperature: 2 vs 1; --sparse: sample:6 vs top:4/.test(e.message));
  // The same data named by another path is the same data: the rerun continues (it was refused: "data files: ... vs ...").
  const again = await buildTeacherCache(jobOptions(teacherDir, path.relative(process.cwd(), data), whole), { log: () => {} });
  assert.ok(again.complete);
  assert.equal(again.shardsWritten, 0);
  // --overwrite with another teacher keeps nothing of the old one's header: its tokenizer_config.json (chat template)
  // and generation_config.json (eos ids) would have reached every student distilled from the cache.
  fs.writeFileSync(path.join(teacherDir, 'generation_config.json'), JSON.stringify({ eos_token_id: 3 }));
  const other = path.join(dir, 'teacher-bare');
  fs.mkdirSync(other);
  for (const f of ['config.json', 'model.safetensors', 'tokenizer.json']) fs.copyFileSync(path.join(teacherDir, f), path.join(other, f));
  const fresh = path.join(dir, 'fresh');
  await buildTeacherCache(jobOptions(teacherDir, data, fresh), { log: () => {} });
  assert.ok(fs.existsSync(path.join(fresh, 'teacher', 'generation_config.json')) && fs.existsSync(path.join(fresh, 'teacher', 'tokenizer_config.json')));
  await buildTeacherCache(jobOptions(other, data, fresh, { overwrite: true }), { log: () => {} });
  assert.deepEqual(fs.readdirSync(path.join(fresh, 'teacher')).sort(), ['config.json', 'tokenizer.json']);
  // --overwrite replaces a cache, never a folder of other files (a model here): nothing is mixed into it
  await assert.rejects(buildTeacherCache(jobOptions(teacherDir, data, other, { overwrite: true }), { log: () => {} }),
    (e: unknown) => e instanceof InputError && /holds files that are not a teacher cache/.test(e.message));
  assert.deepEqual(fs.readdirSync(other).sort(), ['config.json', 'model.safetensors', 'tokenizer.json']);
});

test('teacher-cache: kill -9 mid-job loses at most the shard in progress; rerunning the command completes the same cache', async () => {
  const dir = tempDir();
  const teacherDir = path.join(dir, 'teacher');
  writeTinyCheckpoint(teacherDir, 13);
  const data = writeData(dir, 200);
  const args = (out: string): string[] => [CLI, 'teacher-cache', '--teacher', teacherDir, '--data', data, '--out', out, '--seq', '8',
    '--batch', '2', '--sparse', 'sample:8', '--shard-windows', '2', '--threads', '1', '--quiet'];
  const whole = path.join(dir, 'whole'), killed = path.join(dir, 'killed');
  const runToEnd = (out: string): Promise<number> => new Promise((resolve) => {
    const p = spawn(process.execPath, args(out), { stdio: 'ignore' });
    p.on('exit', (code) => resolve(code ?? -1));
  });
  assert.equal(await runToEnd(whole), 0);
  const total = readManifest(whole)!.shards.length;
  // Kill once the manifest lists a few shards.
  const p = spawn(process.execPath, args(killed), { stdio: 'ignore' });
  const exited = new Promise<void>((resolve) => p.on('exit', () => resolve()));
  for (let i = 0; i < 2000; i++) {
    const m = fs.existsSync(path.join(killed, 'manifest.json')) ? readManifest(killed) : null;
    if (m && m.shards.length >= 3) break;
    await new Promise((r) => setTimeout(r, 5));
  }
  p.kill('SIGKILL');
  await exited;
  const m = readManifest(killed)!;
  assert.ok(m.shards.length >= 3 && m.shards.length < total, `killed after ${m.shards.length} of ${total} shards`);
  assert.equal(await runToEnd(killed), 0);
  assert.deepEqual(shardFiles(killed), shardFiles(whole));
});

function runOpts(dir: string, data: string, over: Partial<RunOptions>): RunOptions {
  return {
    ...DEFAULT_RUN_OPTIONS, mode: 'distill', out: path.join(dir, 'run'), data: [data], model: path.join(dir, 'student.json'),
    batch: 3, seq: 8, steps: 6, warmup: 1, evalEvery: 3, saveEvery: 3, seed: 5, valFraction: 0.2, threads: 1, quiet: true,
    loss: 'kl', alpha: 0.8, temperature: 2, ...over,
  };
}

test('distill --teacher-cache: refuses a cache made for other settings; trains without a teacher; resumes bit-exactly', async () => {
  const dir = tempDir();
  const teacherDir = path.join(dir, 'teacher');
  writeTinyCheckpoint(teacherDir, 14);
  fs.writeFileSync(path.join(dir, 'student.json'), JSON.stringify({
    architectures: ['Qwen2ForCausalLM'], model_type: 'qwen2', vocab_size: tinyTokenizer().vocabSize, hidden_size: 8, intermediate_size: 16,
    num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, max_position_embeddings: 256, rms_norm_eps: 1e-6, rope_theta: 10000,
    tie_word_embeddings: true,
  }));
  const data = writeData(dir, 24);
  const cacheDir = path.join(dir, 'cache');
  await buildTeacherCache(jobOptions(teacherDir, data, cacheDir, { sparse: { kind: 'top', k: 5 } }), { log: () => {} });
  for (const [over, re] of [
    [{ temperature: 1 }, /--temperature \(2 in the cache, 1 for this run\)/],
    [{ seq: 16 }, /--seq \(8 in the cache, 16 for this run\)/],
    [{ data: [path.join(dir, 'other.txt')] }, /data \(sha256 .* for this run\)/],
  ] as Array<[Partial<RunOptions>, RegExp]>) {
    fs.writeFileSync(path.join(dir, 'other.txt'), TEXT.join('\n') + ' more');
    await assert.rejects(runTraining(runOpts(dir, data, { teacherCache: cacheDir, overwrite: true, ...over }), { log: () => {} }),
      (e: unknown) => e instanceof DistilleryError && re.test(e.message), String(re));
  }
  const logs: string[] = [];
  const full = await runTraining(runOpts(dir, data, { teacherCache: cacheDir, out: path.join(dir, 'full') }), { log: (l) => logs.push(l) });
  assert.equal(full.status, 'completed');
  assert.ok(logs.some((l) => /teacher cache .*top:5 at temperature 2/.test(l)), logs.join('\n'));
  assert.ok(Number.isFinite(full.finalValLoss) && full.finalAgreement !== null);
  const metrics = fs.readFileSync(path.join(dir, 'full', 'metrics.jsonl'), 'utf8');
  assert.match(metrics, /"val_div":/);
  // stop after 3 steps, resume: the same weights as the uninterrupted run
  const part = path.join(dir, 'part');
  await runTraining(runOpts(dir, data, { teacherCache: cacheDir, out: part, stopAfter: 3 }), { log: () => {} });
  const resumed = await runTraining(runOpts(dir, data, { teacherCache: cacheDir, out: part, resume: true }), { log: () => {} });
  assert.equal(resumed.status, 'completed');
  assert.deepEqual(fs.readFileSync(path.join(part, 'final', 'model.safetensors')), fs.readFileSync(path.join(dir, 'full', 'final', 'model.safetensors')));
  assert.equal(resumed.finalValLoss, full.finalValLoss);
});

/** A tiny teacher (also the student's config) and n two-turn conversations of the demo text (each turn cut to `chars`). */
function chatFixture(n: number, chars?: number): { dir: string; teacherDir: string; chat: string } {
  const dir = tempDir();
  const teacherDir = path.join(dir, 'teacher');
  writeTinyCheckpoint(teacherDir, 15);
  const chat = path.join(dir, 'chat.jsonl');
  const turn = (i: number): string => TEXT[i % TEXT.length]!.slice(0, chars);
  fs.writeFileSync(chat, Array.from({ length: n }, (_, i) => JSON.stringify({ messages: [
    { role: 'user', content: turn(i) }, { role: 'assistant', content: turn(i + 1) },
  ] })).join('\n') + '\n');
  fs.writeFileSync(path.join(dir, 'student.json'), fs.readFileSync(path.join(teacherDir, 'config.json')));
  return { dir, teacherDir, chat };
}

test('teacher-cache on chat data: only the assistant positions are cached; distill --teacher-cache trains on them and refuses another --loss-on', async () => {
  const { dir, teacherDir, chat } = chatFixture(12);
  const cacheDir = path.join(dir, 'cache');
  await buildTeacherCache(jobOptions(teacherDir, chat, cacheDir), { log: () => {} });
  const m = readManifest(cacheDir)!;
  assert.equal(m.data.loss_on, 'assistant');
  assert.ok(m.data.loss_tokens > 0 && m.data.loss_tokens < m.data.tokens, `${m.data.loss_tokens} of ${m.data.tokens} tokens counted`);
  assert.equal(m.shards.reduce((a, x) => a + x.positions, 0), m.data.loss_tokens);
  const ok = await runTraining(runOpts(dir, chat, { teacherCache: cacheDir, out: path.join(dir, 'run') }), { log: () => {} });
  assert.equal(ok.status, 'completed');
  assert.equal(ok.dataLossTokens, m.data.loss_tokens);
  await assert.rejects(runTraining(runOpts(dir, chat, { teacherCache: cacheDir, out: path.join(dir, 'all'), lossOn: 'all' }), { log: () => {} }),
    (e: unknown) => e instanceof DistilleryError && /--loss-on \(assistant in the cache, all for this run\)/.test(e.message));
  // conversations pack whole by default (bfd), and the manifest says so; a run packing them another way is refused
  assert.match(m.packing, /^best-fit decreasing/);
  await assert.rejects(runTraining(runOpts(dir, chat, { teacherCache: cacheDir, out: path.join(dir, 'wrapped'), packing: 'wrapped' }), { log: () => {} }),
    (e: unknown) => e instanceof DistilleryError && /packing \(best-fit decreasing.* in the cache, documents joined by EOS.* for this run; the cache's is --packing bfd\)/.test(e.message));
  await assert.rejects(runTraining(runOpts(dir, chat, { teacherCache: cacheDir, out: path.join(dir, 'none'), packing: 'none' }), { log: () => {} }),
    (e: unknown) => e instanceof DistilleryError && /packing \(best-fit decreasing.* in the cache, no packing: one document a window.* for this run; the cache's is --packing bfd\)/.test(e.message));
});

test('--packing none (one conversation a window): the cache holds a window per conversation, and a distillation packing the same trains from it', async () => {
  const { dir, teacherDir, chat } = chatFixture(10, 3);
  const logs: string[] = [];
  const cacheDir = path.join(dir, 'cache');
  await buildTeacherCache(jobOptions(teacherDir, chat, cacheDir, { packing: 'none', seq: 64 }), { log: () => {} });
  const m = readManifest(cacheDir)!;
  assert.match(m.packing, /^no packing: one document a window/);
  assert.equal(m.windows, 10, 'ten conversations, each shorter than a window: ten windows');
  const ok = await runTraining(runOpts(dir, chat, { teacherCache: cacheDir, packing: 'none', seq: 64, steps: 3 }), { log: (l) => logs.push(l) });
  assert.equal(ok.status, 'completed');
  assert.match(logs.join('\n'), /windows of 64 \(packing none\)/);
  await assert.rejects(runTraining(runOpts(dir, chat, { teacherCache: cacheDir, out: path.join(dir, 'auto'), seq: 64, steps: 3 }), { log: () => {} }),
    (e: unknown) => e instanceof DistilleryError && /packing \(no packing.* in the cache, best-fit decreasing.* for this run; the cache's is --packing none\)/.test(e.message));
});

test('a cache of an older format version is refused by name, with what to do', () => {
  const dir = tempDir();
  const file = path.join(dir, 'manifest.json');
  fs.writeFileSync(file, JSON.stringify({ format: CACHE_FORMAT, version: CACHE_VERSION - 1, seq: 8 }));
  assert.throws(() => readManifest(dir), (e: unknown) => e instanceof DistilleryError && /format version 1; this distillery reads version 2/.test(e.message) && /rebuild/.test(e.hint ?? ''));
  // a manifest of this version without its packing (inspect and distill read it) is not a manifest
  fs.writeFileSync(file, JSON.stringify({ format: CACHE_FORMAT, version: CACHE_VERSION, seq: 8, windows: 1, loss_vocab: 300, temperature: 2, windows_per_shard: 1, shards: [], sparse: 'sample:8' }));
  assert.throws(() => readManifest(dir), (e: unknown) => e instanceof DistilleryError && /not a distillery teacher-cache manifest \("packing" must be a string\)/.test(e.message));
});

test('teacher-cache --teacher-dtype nf4: the rows are the NF4 teacher\'s (its dequantized weights), the manifest records it, and another dtype is another cache', async () => {
  const dir = tempDir();
  const teacherDir = path.join(dir, 'teacher');
  writeTinyCheckpoint(teacherDir, 12);
  const data = writeData(dir);
  const out = path.join(dir, 'cache-nf4');
  await buildTeacherCache(jobOptions(teacherDir, data, out, { teacherDtype: 'nf4' }), { log: () => {} });
  const m = readManifest(out)!;
  assert.equal(m.teacher_dtype, 'nf4');
  const tok = tinyTokenizer();
  const packed = packDocuments(tok, [fs.readFileSync(data, 'utf8')], { seqLen: 8, eosId: tok.eosId ?? tok.tokenToId('<|endoftext|>')! });
  const be = createCpuBackend({ threads: 1 });
  const { model: q } = loadTransformer(be, teacherDir, { batch: 1, seq: 8, training: false, frozenDtype: 'nf4' });
  const { model: full } = loadTransformer(be, teacherDir, { batch: 1, seq: 8, training: false });
  const cache = TeacherCache.open(out);
  let differs = 0;
  for (const w of packed.windows) {
    const zq = be.download(q.forward(w.inputs, 1, 8)), zf = be.download(full.forward(w.inputs, 1, 8));
    const got = cache.entries(w.id!);
    let k = 0;
    for (let p = 0; p < 8; p++) {
      if (w.mask[p] === 0) continue;
      const u = (i: number): number => cacheUniform(5, w.id!, p, i);
      const want = sparseRow(zq, p * q.config.vocabSize, tok.vocabSize, 2, { kind: 'sample', n: 6 }, u);
      const g = got[k++]!;
      assert.deepEqual(g.ids, want.ids, `window ${w.id} position ${p}`);
      const other = sparseRow(zf, p * full.config.vocabSize, tok.vocabSize, 2, { kind: 'sample', n: 6 }, u);
      if (other.logq.some((l, i) => Math.abs(l - want.logq[i]!) > 1e-6) || other.ids.join() !== want.ids.join()) differs++;
    }
  }
  assert.ok(differs > 0, 'the nf4 rows should not be the full-precision teacher\'s');
  be.dispose();
  await assert.rejects(buildTeacherCache(jobOptions(teacherDir, data, out), { log: () => {} }),
    (e) => e instanceof DistilleryError && /--teacher-dtype: nf4 vs auto/.test(e.message));
});

test('teacher-cache summary: the steady rate counts the batches after the first two (null when there are none)', async () => {
  const dir = tempDir();
  try {
    const teacherDir = path.join(dir, 'teacher');
    writeTinyCheckpoint(teacherDir, 12);
    const data = writeData(dir);
    const logs: string[] = [];
    const s = await buildTeacherCache(jobOptions(teacherDir, data, path.join(dir, 'c')), { log: (l) => logs.push(l) });
    assert.ok(s.tokensPerSecond > 0);
    assert.ok(s.steadyTokensPerSecond !== null && s.steadyTokensPerSecond > 0, 'a job of more than two batches has a steady rate');
    assert.ok(logs.some((l) => /once warm: after the first two batches/.test(l)), logs.join('\n'));
    const one = await buildTeacherCache(jobOptions(teacherDir, data, path.join(dir, 'one'), { batch: 64, shardWindows: 64 }), { log: () => {} });
    assert.equal(one.steadyTokensPerSecond, null, 'one batch: no steady rate');
  } finally { fs.rmSync(dir, { recursive: true, force: true }); }
});

test('a cache job that fails on its data removes the --out folder it created (empty)', async () => {
  const dir = tempDir();
  const teacherDir = path.join(dir, 'teacher');
  writeTinyCheckpoint(teacherDir, 3);
  const empty = path.join(dir, 'empty.txt');
  fs.writeFileSync(empty, ' \n');
  const out = path.join(dir, 'new-cache');
  await assert.rejects(buildTeacherCache(jobOptions(teacherDir, empty, out), { log: () => {} }), (e: unknown) => e instanceof DistilleryError && /no documents/.test(e.message));
  assert.ok(!fs.existsSync(out));
});
