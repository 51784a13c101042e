/**
 * The teacher-cache command line: usage errors (exit 2), the job's --json summary, --dry-run (memory, kernel plan, the
 * cache's largest size: at least what the job then writes), `inspect` of a cache folder, and `distill --teacher-cache
 * --dry-run --json` (no teacher in memory, the cache's size).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { runCli, tempDir, TEXT, writeTinyCheckpoint } from '../cli/fixtures.js';
import { trainBpe } from '../../src/tokenizer/train-bpe.js';

const run = runCli;

test('teacher-cache CLI: usage errors, --dry-run, the --json summary, inspect, and distill --teacher-cache --dry-run', async () => {
  const dir = tempDir();
  const teacher = path.join(dir, 'teacher');
  writeTinyCheckpoint(teacher, 3);
  const data = path.join(dir, 'data.txt');
  fs.writeFileSync(data, Array.from({ length: 10 }, (_, i) => TEXT[i % TEXT.length]).join(' '));
  const out = path.join(dir, 'cache');
  const base = ['teacher-cache', '--teacher', teacher, '--data', data, '--out', out, '--seq', '8', '--threads', '1'];
  for (const [argv, re] of [
    [['teacher-cache', '--data', data, '--out', out], /no teacher given \(--teacher\)/],
    [['teacher-cache', '--teacher', teacher, '--out', out], /no data given \(--data\)/],
    [[...base, '--sparse', 'random:3'], /--sparse "random:3": expected sample:N or top:K/],
    [[...base, '--sparse', 'top:300'], /N, K from 1 to 256/],
    [[...base, '--temperature', '0'], /--temperature must be > 0/],
    [['teacher-cache', '--teacher', teacher, '--data', path.join(dir, 'nope.txt'), '--out', out], /data file .*nope\.txt does not exist/],
    [['teacher-cache', '--teacher', teacher, '--data', 'builtin:docs', data, '--out', out], /'builtin:docs' cannot be combined with other data files/],
    [['teacher-cache', '--teacher', path.join(dir, 'no-teacher'), '--data', data, '--out', out], /no-teacher/],
  ] as Array<[string[], RegExp]>) {
    const r = await run(argv);
    assert.equal(r.code, 2, `${argv.join(' ')}: ${r.err}`);
    assert.match(r.err, re);
  }
  const dry = await run([...base, '--dry-run', '--json', '--sparse', 'sample:8']);
  assert.equal(dry.code, 0, dry.err);
  const plan = JSON.parse(dry.out) as { windows: number; counted_positions: number; max_disk_bytes: number; max_bytes_per_token: number; kernels: unknown[]; device_bytes: number };
  assert.ok(plan.windows > 0 && plan.counted_positions > 0 && plan.device_bytes > 0);
  assert.deepEqual(plan.kernels, []);
  const job = await run([...base, '--json', '--quiet', '--sparse', 'sample:8']);
  assert.equal(job.code, 0, job.err);
  const s = JSON.parse(job.out) as { complete: boolean; bytes: number; windows: number; positions: number; bytesPerToken: number };
  assert.ok(s.complete);
  assert.equal(s.windows, plan.windows);
  assert.equal(s.positions, plan.counted_positions);
  assert.ok(s.bytes <= plan.max_disk_bytes, `${s.bytes} bytes written, the dry run's bound was ${plan.max_disk_bytes}`);
  assert.ok(s.bytesPerToken <= plan.max_bytes_per_token + 1e-9 + 9 * s.windows / s.positions);
  const insp = await run(['inspect', out]);
  assert.equal(insp.code, 0, insp.err);
  assert.match(insp.out, /teacher cache .* \(complete\)/);
  assert.match(insp.out, /sample:8 at temperature 2 \(unbiased/);
  assert.match(insp.out, /bytes per token/);
  // the packing the cache was built with (distill --teacher-cache refuses another): plain text is packed wrapped
  assert.match(insp.out, /windows +\d+ of --seq \d+, --packing wrapped /);
  const cfg = path.join(dir, 'student.json');
  fs.copyFileSync(path.join(teacher, 'config.json'), cfg);
  const d = await run(['distill', '--teacher-cache', out, '--data', data, '--seq', '8', '--model', cfg, '--out', path.join(dir, 'run'), '--dry-run', '--json']);
  assert.equal(d.code, 0, d.err);
  const r = JSON.parse(d.out) as { teacher_cache: { sparse: string; bytes: number } | null; device_bytes: number };
  assert.equal(r.teacher_cache?.sparse, 'sample:8');
  assert.equal(r.teacher_cache?.bytes, s.bytes);
  // A cached run holds no teacher: less memory than the same run with the teacher.
  const live = await run(['distill', '--teacher', teacher, '--data', data, '--seq', '8', '--model', cfg, '--out', path.join(dir, 'run'), '--dry-run', '--json']);
  assert.ok(r.device_bytes < (JSON.parse(live.out) as { device_bytes: number }).device_bytes);
  // The head's chunk from a cache holds twice the rows (fp32: no teacher chunk beside the student's), as the run's head.
  const rows = async (src: string[]): Promise<number> => {
    const x = await run(['distill', ...src, '--data', data, '--seq', '8', '--batch', '70000', '--model', cfg, '--out', path.join(dir, 'run'), '--dry-run', '--json']);
    assert.equal(x.code, 0, x.err);
    return (JSON.parse(x.out) as { head_chunk_rows: number }).head_chunk_rows;
  };
  const [cachedRows, liveRows] = [await rows(['--teacher-cache', out]), await rows(['--teacher', teacher])];
  assert.ok(liveRows < 560000, `live ${liveRows}`);
  assert.equal(cachedRows, Math.min(560000, 2 * liveRows));
  const both = await run(['distill', '--teacher-cache', out, '--teacher', teacher, '--data', data, '--out', path.join(dir, 'run')]);
  assert.equal(both.code, 2);
});

test('teacher-cache --dry-run refuses what the job refuses: conversations for a teacher with no chat template and no ChatML tokens', async () => {
  const dir = tempDir();
  const teacher = path.join(dir, 'teacher');
  writeTinyCheckpoint(teacher, 3);
  const plain = trainBpe(TEXT, { vocabSize: 300, specialTokens: ['<|endoftext|>'] });
  fs.writeFileSync(path.join(teacher, 'tokenizer.json'), JSON.stringify(plain.toJSON()));
  fs.rmSync(path.join(teacher, 'tokenizer_config.json')); // no chat template
  const data = path.join(dir, 'chat.jsonl');
  fs.writeFileSync(data, JSON.stringify({ messages: [{ role: 'user', content: TEXT[0] }, { role: 'assistant', content: TEXT[1] }] }) + '\n');
  const base = ['teacher-cache', '--teacher', teacher, '--data', data, '--out', path.join(dir, 'cache'), '--seq', '8', '--threads', '1'];
  const job = await run(base);
  const dry = await run([...base, '--dry-run', '--json']);
  for (const r of [job, dry]) {
    assert.notEqual(r.code, 0);
    assert.match(r.err, /no chat template and its tokenizer has no <\|im_start\|> or <\|im_end\|> token/);
  }
  assert.equal(dry.code, job.code);
  assert.ok(!fs.existsSync(path.join(dir, 'cache')), 'nothing written');
  fs.rmSync(dir, { recursive: true, force: true });
});
