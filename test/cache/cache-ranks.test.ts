/**
 * A teacher-cache job of several processes (`teacher-cache --gpus N`, or torchrun's variables), on the CPU with real
 * processes over the host communicator: the ranks share the shards and write the bytes one process writes (shards and
 * manifest); rank 0 killed with SIGKILL stops the others with an error naming it, and rerunning the command adopts the
 * shards every rank finished (the other ranks' notes, verified) and completes the same cache; SIGINT to the launcher
 * stops every rank after its shard (exit 130), and a rerun completes it. The shard ledger alone: notes are folded into
 * the manifest, and on a rerun only shards that match their note are adopted. Rank 0's refusal reaches the other
 * ranks as its own message; a rank started with other options stops the job, naming the difference; the job's figures.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { createHash } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { readManifest, sha256, type CacheManifest, type ShardInfo } from '../../src/cache/store.js';
import { ShardLedger, shardNoteName } from '../../src/cache/ledger.js';
import { jobFigures, type RankFigures } from '../../src/cache/job-ranks.js';
import type { Communicator } from '../../src/parallel/comm.js';
import { TEXT, tempDir, writeTinyCheckpoint } from '../cli/fixtures.js';
import { freePort } from '../parallel/launch.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const CLI = path.resolve(here, '../../../bin/distillery.js');

function setup(copies: number): { dir: string; teacher: string; data: string } {
  const dir = tempDir();
  const teacher = path.join(dir, 'teacher');
  writeTinyCheckpoint(teacher, 17);
  const data = path.join(dir, 'data.txt');
  fs.writeFileSync(data, Array.from({ length: copies }, (_, i) => TEXT[i % TEXT.length]).join(' '));
  return { dir, teacher, data };
}

const jobArgs = (teacher: string, data: string, out: string, shardWindows: number): string[] => [CLI, 'teacher-cache', '--teacher', teacher,
  '--data', data, '--out', out, '--seq', '8', '--batch', '2', '--sparse', 'sample:8', '--shard-windows', String(shardWindows), '--threads', '1', '--quiet'];

/** Every shard file's SHA-256, by name. */
function shardFiles(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const f of fs.readdirSync(dir).filter((f) => /^shard-\d+\.bin$/.test(f)).sort()) out[f] = createHash('sha256').update(fs.readFileSync(path.join(dir, f))).digest('hex');
  return out;
}

/** The manifest without the folder it names (the teacher's path is the same; `out` is not recorded). */
const manifestText = (dir: string): string => JSON.stringify(readManifest(dir));

test('teacher-cache --gpus 2 (--device cpu: 2 processes) writes the shards and manifest of one process; the summary counts both ranks', { timeout: 120_000 }, () => {
  const { dir, teacher, data } = setup(120);
  const one = spawnSync(process.execPath, [...jobArgs(teacher, data, path.join(dir, 'one'), 4), '--json'], { encoding: 'utf8' });
  assert.equal(one.status, 0, one.stderr);
  const two = spawnSync(process.execPath, [...jobArgs(teacher, data, path.join(dir, 'two'), 4), '--json', '--gpus', '2', '--device', 'cpu'], { encoding: 'utf8' });
  assert.equal(two.status, 0, two.stderr);
  const s1 = JSON.parse(one.stdout) as { shardsWritten: number; ranks: number; complete: boolean };
  const s2 = JSON.parse(two.stdout) as { shardsWritten: number; ranks: number; complete: boolean; tokensPerSecond: number };
  assert.equal(s1.ranks, 1); assert.equal(s2.ranks, 2);
  assert.ok(s2.complete && s1.shardsWritten >= 6, `${s1.shardsWritten} shards`);
  assert.equal(s2.shardsWritten, s1.shardsWritten, 'the ranks wrote every shard once between them');
  assert.ok(s2.tokensPerSecond > 0);
  assert.deepEqual(shardFiles(path.join(dir, 'two')), shardFiles(path.join(dir, 'one')));
  assert.equal(manifestText(path.join(dir, 'two')).replaceAll('/two', '/X'), manifestText(path.join(dir, 'one')).replaceAll('/one', '/X'));
  // no note is left behind, no lock
  assert.deepEqual(fs.readdirSync(path.join(dir, 'two')).filter((f) => !/^shard-\d+\.bin$/.test(f)).sort(), ['manifest.json', 'teacher']);
  // --dry-run --gpus 2: the shards and each rank's share, memory per process (each rank holds a teacher)
  const dry = (extra: string[]): { ranks: number; shards: number; shards_per_rank: number; device_bytes: number } =>
    JSON.parse(spawnSync(process.execPath, [...jobArgs(teacher, data, path.join(dir, 'dry'), 4), '--dry-run', '--json', ...extra], { encoding: 'utf8' }).stdout) as
      { ranks: number; shards: number; shards_per_rank: number; device_bytes: number };
  const [d1, d2] = [dry([]), dry(['--gpus', '2'])];
  assert.equal(d1.ranks, 1); assert.equal(d2.ranks, 2);
  assert.equal(d1.shards, s1.shardsWritten); assert.equal(d2.shards, s1.shardsWritten);
  assert.equal(d2.shards_per_rank, Math.ceil(s1.shardsWritten / 2));
  assert.equal(d2.device_bytes, d1.device_bytes);
  assert.ok(!fs.existsSync(path.join(dir, 'dry')), 'a dry run writes nothing');
  // --gpus inside a group a launcher started is refused
  const bad = spawnSync(process.execPath, [...jobArgs(teacher, data, path.join(dir, 'bad'), 4), '--gpus', '2'], { encoding: 'utf8', env: { ...process.env, WORLD_SIZE: '2', RANK: '0' } });
  assert.equal(bad.status, 2);
  assert.match(bad.stderr, /--gpus 2 starts its own processes, but this one is already rank 0 of WORLD_SIZE 2/);
});

test('teacher-cache on 2 ranks: rank 0 killed with SIGKILL stops rank 1 with an error naming it; a rerun adopts every shard rank 1 noted and completes the same cache', { timeout: 180_000 }, async () => {
  const { dir, teacher, data } = setup(400);
  const whole = path.join(dir, 'whole'), killed = path.join(dir, 'killed');
  const w = spawnSync(process.execPath, jobArgs(teacher, data, whole, 2), { encoding: 'utf8' });
  assert.equal(w.status, 0, w.stderr);
  const total = readManifest(whole)!.shards.length;
  const port = await freePort();
  const env = (rank: number): NodeJS.ProcessEnv => ({ ...process.env, RANK: String(rank), LOCAL_RANK: String(rank), WORLD_SIZE: '2',
    MASTER_ADDR: '127.0.0.1', MASTER_PORT: String(port), DISTILLERY_MASTER_PORT: String(port) });
  const r0 = spawn(process.execPath, jobArgs(teacher, data, killed, 2), { env: env(0), stdio: 'ignore' });
  const r1 = spawn(process.execPath, jobArgs(teacher, data, killed, 2), { env: env(1), stdio: ['ignore', 'ignore', 'pipe'] });
  let err1 = ''; r1.stderr.on('data', (d) => { err1 += d; });
  const closed0 = new Promise<void>((r) => r0.on('close', () => r()));
  const closed1 = new Promise<number | null>((r) => r1.on('close', (c) => r(c)));
  // rank r computes shards r, r + 2, ...: kill rank 0 once it has written a few
  const even = (f: string): boolean => /^shard-\d+\.bin$/.test(f) && Number(/\d+/.exec(f)![0]) % 2 === 0;
  for (let i = 0; i < 4000; i++) {
    if (fs.existsSync(killed) && fs.readdirSync(killed).filter(even).length >= 3) break;
    await new Promise((r) => setTimeout(r, 5));
  }
  r0.kill('SIGKILL');
  await closed0;
  // rank 1 computes its share, then finds rank 0 gone at the job's end
  assert.equal(await closed1, 1, err1);
  assert.match(err1, /rank 0 disconnected/);
  assert.match(err1, /hint: a rank stopped: rerun the same command; it keeps every shard already written/);
  const m = readManifest(killed)!;
  assert.ok(!m.complete && m.shards.length < total, `${m.shards.length} of ${total} shards listed`);
  // rank 0 lists folded shards before it removes their notes, so a kill in between leaves notes of listed shards:
  // what the rerun can adopt is the union of the listed and the noted shards
  const listed = new Set(m.shards.map((s) => s.file));
  const noted = fs.readdirSync(killed).filter((f) => /^shard-\d+\.json$/.test(f)).map((f) => f.replace(/\.json$/, '.bin'));
  const notes = noted.filter((f) => !listed.has(f)).length;
  assert.ok(notes >= 2, `rank 1 left ${notes} notes of shards rank 0 never listed`);
  // the rerun (one process) adopts what the manifest lists and what rank 1 noted, and computes the rest
  const again = spawnSync(process.execPath, jobArgs(teacher, data, killed, 2).filter((x) => x !== '--quiet'), { encoding: 'utf8' });
  assert.equal(again.status, 0, again.stderr);
  const verified = Number(/continuing .*: (\d+) shards verified/.exec(again.stderr)?.[1]);
  assert.equal(verified, listed.size + notes, `${verified} shards kept: ${listed.size} listed, ${notes} noted and not listed`);
  assert.deepEqual(shardFiles(killed), shardFiles(whole));
  assert.equal(manifestText(killed).replaceAll('/killed', '/X'), manifestText(whole).replaceAll('/whole', '/X'));
});

test('SIGINT to teacher-cache --gpus 2 stops both ranks after their shard (exit 130); rerunning on 2 ranks completes the same cache', { timeout: 180_000 }, async () => {
  const { dir, teacher, data } = setup(400);
  const whole = path.join(dir, 'whole'), cut = path.join(dir, 'cut');
  assert.equal(spawnSync(process.execPath, jobArgs(teacher, data, whole, 2)).status, 0);
  const total = readManifest(whole)!.shards.length;
  const p = spawn(process.execPath, [...jobArgs(teacher, data, cut, 2), '--gpus', '2', '--device', 'cpu'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = ''; p.stderr.on('data', (d) => { err += d; });
  const closed = new Promise<number | null>((r) => p.on('close', (c) => r(c)));
  for (let i = 0; i < 4000; i++) {
    if ((fs.existsSync(path.join(cut, 'manifest.json')) ? readManifest(cut)?.shards.length ?? 0 : 0) >= 4) break;
    await new Promise((r) => setTimeout(r, 5));
  }
  p.kill('SIGINT');
  assert.equal(await closed, 130, err);
  assert.match(err, /SIGINT: stopped with \d+ of \d+ shards listed; rerun the same command to continue/);
  const m = readManifest(cut)!;
  assert.ok(!m.complete && m.shards.length < total, `${m.shards.length} of ${total}`);
  // every shard a rank finished is listed: nothing but listed shards, the manifest and the teacher's files remain
  assert.deepEqual(Object.keys(shardFiles(cut)).sort(), m.shards.map((s) => s.file).sort());
  const again = spawnSync(process.execPath, [...jobArgs(teacher, data, cut, 2), '--gpus', '2', '--device', 'cpu'], { encoding: 'utf8' });
  assert.equal(again.status, 0, again.stderr);
  assert.deepEqual(shardFiles(cut), shardFiles(whole));
});

test('ShardLedger: rank 0 lists its shards and folds the others\' notes; a rerun adopts only shards that match their note', () => {
  const dir = tempDir();
  const manifestOf = (shards: ShardInfo[], complete: boolean): CacheManifest => ({ shards, complete } as unknown as CacheManifest);
  const write = (i: number, bytes: Uint8Array): ShardInfo => {
    const file = `shard-${String(i).padStart(5, '0')}.bin`;
    fs.writeFileSync(path.join(dir, file), bytes);
    return { file, first_window: 4 * i, windows: 4, positions: 10 + i, bytes: bytes.length, sha256: sha256(bytes) };
  };
  const zero = new ShardLedger(dir, 0, 14, 4, manifestOf), one = new ShardLedger(dir, 1, 14, 4, manifestOf);
  assert.equal(zero.nShards, 4);
  zero.record(0, write(0, Uint8Array.of(1, 2, 3)));
  assert.deepEqual((JSON.parse(fs.readFileSync(path.join(dir, 'manifest.json'), 'utf8')) as CacheManifest).shards.map((s) => s.file), ['shard-00000.bin']);
  one.record(1, write(1, Uint8Array.of(4, 5)));
  one.record(3, write(3, Uint8Array.of(6)));
  assert.ok(fs.existsSync(path.join(dir, shardNoteName(1))) && fs.existsSync(path.join(dir, shardNoteName(3))));
  assert.equal(zero.fold(false), 2);
  const m = JSON.parse(fs.readFileSync(path.join(dir, 'manifest.json'), 'utf8')) as CacheManifest;
  assert.deepEqual(m.shards.map((s) => s.file), ['shard-00000.bin', 'shard-00001.bin', 'shard-00003.bin']);
  assert.equal(m.complete, false);
  assert.ok(!fs.existsSync(path.join(dir, shardNoteName(1))), 'a folded note goes');
  assert.equal(zero.windowsDone(), 12);
  // a rerun: rank 1 had noted shard 2, but the shard was damaged afterwards; and a note of a shard never written
  const again = new ShardLedger(dir, 0, 14, 4, manifestOf);
  one.record(2, write(2, Uint8Array.of(7, 8, 9)));
  fs.writeFileSync(path.join(dir, 'shard-00002.bin'), Uint8Array.of(7, 8, 0));
  fs.writeFileSync(path.join(dir, 'shard-00004.json'), JSON.stringify({ file: 'shard-00004.bin', first_window: 16, windows: 4, positions: 1, bytes: 1, sha256: 'x' }));
  assert.equal(again.fold(true), 0);
  assert.equal(again.done.size, 0);
  assert.deepEqual(fs.readdirSync(dir).filter((f) => f.endsWith('.json') && f !== 'manifest.json'), [], 'every note went');
  // an intact noted shard is adopted
  one.record(2, write(2, Uint8Array.of(7, 8, 9)));
  assert.equal(again.fold(true), 1);
  assert.deepEqual([...again.done.keys()], [2]);
});

test('teacher-cache on 2 ranks: rank 0\'s refusal reaches rank 1 (one message, rank 0\'s exit code); a rank started with other options stops the job, naming the difference; ranks writing different folders are an error, not a complete cache', { timeout: 120_000 }, async () => {
  const { dir, teacher, data } = setup(40);
  // a folder of other files: rank 0 refuses it before any teacher is read; the launcher reports rank 0's reason once
  const busy = path.join(dir, 'busy');
  fs.mkdirSync(busy); fs.writeFileSync(path.join(busy, 'notes.txt'), 'mine');
  const r = spawnSync(process.execPath, [...jobArgs(teacher, data, busy, 4), '--gpus', '2', '--device', 'cpu'], { encoding: 'utf8' });
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /holds files that are not a teacher cache \(notes\.txt\)/);
  assert.doesNotMatch(r.stderr, /disconnected|rank 1 exited/);
  assert.deepEqual(fs.readdirSync(busy), ['notes.txt']);
  // rank 1 at another temperature: both ranks stop before computing, rank 1 naming what differs
  const port = await freePort();
  const env = (rank: number): NodeJS.ProcessEnv => ({ ...process.env, RANK: String(rank), LOCAL_RANK: String(rank), WORLD_SIZE: '2',
    MASTER_ADDR: '127.0.0.1', MASTER_PORT: String(port), DISTILLERY_MASTER_PORT: String(port) });
  const out = path.join(dir, 'mixed');
  const run = (rank: number, extra: string[]): Promise<{ code: number | null; err: string }> => new Promise((resolve) => {
    const p = spawn(process.execPath, [...jobArgs(teacher, data, out, 4), ...extra], { env: env(rank), stdio: ['ignore', 'ignore', 'pipe'] });
    let err = ''; p.stderr.on('data', (d) => { err += d; });
    p.on('close', (code) => resolve({ code, err }));
  });
  const [a, b] = await Promise.all([run(0, []), run(1, ['--temperature', '1'])]);
  assert.equal(a.code, 1, a.err); assert.equal(b.code, 2, b.err);
  assert.match(b.err, /rank 1: the job's inputs differ from rank 0's \(--temperature: 2 vs 1\)/);
  assert.match(a.err, /rank 0: rank 1 read other inputs than rank 0 \(its error names what differs\)/);
  assert.deepEqual(readManifest(out)!.shards, []);
  // rank 1 writing another folder (as on two hosts without a shared file system): rank 0 does not call the cache complete
  const elsewhere = path.join(dir, 'elsewhere'), ours = path.join(dir, 'ours');
  fs.mkdirSync(elsewhere);
  const port2 = await freePort();
  const env2 = (rank: number): NodeJS.ProcessEnv => ({ ...env(rank), MASTER_PORT: String(port2), DISTILLERY_MASTER_PORT: String(port2) });
  const split = (rank: number, o: string): Promise<{ code: number | null; err: string }> => new Promise((resolve) => {
    const p = spawn(process.execPath, jobArgs(teacher, data, o, 4), { env: env2(rank), stdio: ['ignore', 'ignore', 'pipe'] });
    let err = ''; p.stderr.on('data', (d) => { err += d; });
    p.on('close', (code) => resolve({ code, err }));
  });
  const [c] = await Promise.all([split(0, ours), split(1, elsewhere)]);
  assert.equal(c.code, 1, c.err);
  assert.match(c.err, /rank 0 sees \d+ of the \d+ shards the ranks wrote/);
  assert.equal(readManifest(ours)!.complete, false);
});

test('the job\'s figures over ranks: shards and tokens summed, the rate over the slowest rank\'s time, no steady rate unless every computing rank has one', () => {
  const world = 3;
  const figures = (ranks: RankFigures[]): ReturnType<typeof jobFigures> => {
    const vecs = ranks.map((f, rank) => {
      let v = new Float64Array(0);
      jobFigures({ rank, world, allReduceHost: (x: Float64Array) => { v = Float64Array.from(x); return v; } } as unknown as Communicator, f);
      return v;
    });
    const sum = vecs.reduce((acc, v) => acc.map((x, i) => x + v[i]!));
    return jobFigures({ rank: 0, world, allReduceHost: () => sum } as unknown as Communicator, ranks[0]!);
  };
  const idle: RankFigures = { written: 0, tokens: 0, seconds: 0, steadyTokens: 0, steadySeconds: 0, stopped: false };
  const a = figures([
    { written: 2, tokens: 200, seconds: 2, steadyTokens: 100, steadySeconds: 1, stopped: false },
    { written: 1, tokens: 100, seconds: 1, steadyTokens: 60, steadySeconds: 0.5, stopped: true },
    idle,
  ]);
  assert.equal(a.written, 3);
  assert.equal(a.tokensPerSecond, 150); // 300 tokens over the 2 s of the slowest rank, not 100 + 100
  assert.equal(a.steadyTokensPerSecond, 160); // 160 steady tokens over 1 s; the idle rank has no say
  assert.equal(a.stopped, true);
  const b = figures([{ written: 1, tokens: 100, seconds: 1, steadyTokens: 0, steadySeconds: 0, stopped: false }, { written: 1, tokens: 100, seconds: 1, steadyTokens: 50, steadySeconds: 0.5, stopped: false }, idle]);
  assert.equal(b.steadyTokensPerSecond, null);
  assert.equal(b.stopped, false);
});
