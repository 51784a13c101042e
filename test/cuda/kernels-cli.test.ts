/**
 * `distillery kernels plan|list|audit` without a GPU (warm needs NVRTC and is covered where present).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { adamFromArgs, auditClosures, jobFromArgs, kernelsCommand, notInPlan, setKernelsOutput } from '../../src/backend/cuda/cli.js';
import { planKernels } from '../../src/backend/cuda/plan.js';
import { kernelsCommand as kernelsCli } from '../../src/cli/commands/kernels.js';
import { UsageError } from '../../src/cli/args.js';
import { jobClosures } from '../../src/train/kernel-plan.js';
import { DEFAULT_RUN_OPTIONS as D } from '../../src/train/options.js';
import { DistilleryError, InputError } from '../../src/util/errors.js';
import { encodeEntry } from '../../src/backend/cuda/kernel-cache.js';
import { tryNvrtc } from '../../src/backend/cuda/ffi/nvrtc.js';

async function capture(fn: () => Promise<number>): Promise<{ code: number; text: string }> {
  const chunks: string[] = [];
  const prev = setKernelsOutput((s) => { chunks.push(s); });
  try { return { code: await fn(), text: chunks.join('') }; } finally { setKernelsOutput(prev); }
}

test('kernels plan prints one line per kernel with family, key prefix and baked params', async () => {
  const { code, text } = await capture(() => kernelsCommand('plan', { model: 'tiny', teacher: 'small', loss: 'jsd', beta: 0.25, batch: 2, seq: 16 }));
  assert.equal(code, 0);
  // the default precision (auto: bf16, as a CUDA run) plans the bf16 operand variants...
  assert.match(text, /^loss +[0-9a-f]{16} +kind=jsd withGrad=true dlogits=bf16 logits=f32 teacher=f32 block=512$/m);
  assert.match(text, /^rmsnorm_rows_fwd +[0-9a-f]{16} +eps=0\.000001 C=64 out=bf16 inp=f32 weight=bf16$/m);
  assert.match(text, /^adamw_multi +[0-9a-f]{16} +copy=bf16 block=256$/m);
  assert.match(text, /^attention_cached /m);
  // ...and --precision fp32 the f32 ones
  const fp = await capture(() => kernelsCommand('plan', { model: 'tiny', teacher: 'small', loss: 'jsd', beta: 0.25, batch: 2, seq: 16, precision: 'fp32' }));
  assert.equal(fp.code, 0);
  assert.match(fp.text, /^loss +[0-9a-f]{16} +kind=jsd withGrad=true dlogits=f32 logits=f32 teacher=f32 block=512$/m);
  assert.match(fp.text, /^rmsnorm_rows_fwd +[0-9a-f]{16} +eps=0\.000001 C=64 out=f32 inp=f32 weight=f32$/m);
  assert.doesNotMatch(fp.text, /bf16/);
});

test('kernels audit passes for real configs and reports the verdict', async () => {
  for (const args of [{ model: 'tiny' }, { model: 'tiny', precision: 'fp32' }, { model: 'small', teacher: 'base', loss: 'reverse-kl', batch: 3, seq: 12 }]) {
    const { code, text } = await capture(() => kernelsCommand('audit', args));
    assert.equal(code, 0, text);
    assert.match(text, /^audit: OK: /m);
  }
});

test('kernels list shows entries and flags corrupt files', async () => {
  const dir = fs.mkdtempSync(path.join(tmpdir(), 'dk-list-'));
  const good = 'a'.repeat(64), bad = 'b'.repeat(64);
  fs.writeFileSync(path.join(dir, `${good}.cubin`), encodeEntry(good, new Uint8Array([1, 2, 3])));
  fs.writeFileSync(path.join(dir, `${bad}.cubin`), Buffer.from('garbage'));
  const { code, text } = await capture(() => kernelsCommand('list', { cacheDir: dir }));
  assert.equal(code, 0);
  assert.match(text, new RegExp(`^${good} +\\d+ +\\S+Z$`, 'm'));
  assert.match(text, new RegExp(`^${bad} .*CORRUPT: truncated header`, 'm'));
  fs.rmSync(dir, { recursive: true, force: true });
});

test('kernels list shows what it skipped and why (a FIFO, a symbolic link to /dev/zero), without opening them', { skip: process.platform === 'win32' || !fs.existsSync('/dev/zero') ? 'needs /dev/zero and mkfifo' : false, timeout: 20_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(tmpdir(), 'dk-list-'));
  const good = 'a'.repeat(64), fifo = 'd'.repeat(64), zero = 'e'.repeat(64);
  fs.writeFileSync(path.join(dir, `${good}.cubin`), encodeEntry(good, new Uint8Array([1, 2, 3])));
  execFileSync('mkfifo', [path.join(dir, `${fifo}.cubin`)]);
  fs.symlinkSync('/dev/zero', path.join(dir, `${zero}.cubin`));
  const t0 = performance.now();
  const { code, text } = await capture(() => kernelsCommand('list', { cacheDir: dir }));
  assert.ok(performance.now() - t0 < 2000);
  assert.equal(code, 0);
  assert.match(text, new RegExp(`^${good} +\\d+ +\\S+Z$`, 'm'));
  assert.match(text, new RegExp(`^${fifo}\\.cubin .*SKIPPED: a FIFO \\(named pipe\\), not a regular file$`, 'm'));
  assert.match(text, new RegExp(`^${zero}\\.cubin .*SKIPPED: a symbolic link, not a regular file$`, 'm'));
  assert.match(text, /^# 2 skipped: not regular files/m);
  const json = await capture(() => kernelsCommand('list', { cacheDir: dir, json: true }));
  const entries = (JSON.parse(json.text) as { entries: Array<{ key: string; skipped?: boolean }> }).entries;
  assert.deepEqual(entries.filter((e) => e.skipped).map((e) => e.key), [`${fifo}.cubin`, `${zero}.cubin`]);
  fs.rmSync(dir, { recursive: true, force: true });
});

test('kernels warm compiles the plan into the cache for --arch without a GPU', { skip: tryNvrtc() ? false : 'NVRTC not found', timeout: 120_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(tmpdir(), 'dk-warm-'));
  const first = await capture(() => kernelsCommand('warm', { model: 'tiny', arch: 'sm_80', cacheDir: dir }));
  assert.equal(first.code, 0);
  assert.match(first.text, /^\[kernel-cache\] compile \S+ .* [0-9a-f]{64} \d+ms$/m);
  const again = await capture(() => kernelsCommand('warm', { model: 'tiny', arch: 'sm_80', cacheDir: dir }));
  assert.match(again.text, /^warm: \d+ kernels: compiled 0 /m);
  fs.rmSync(dir, { recursive: true, force: true });
});

test('--beta1/--beta2/--adam-eps are validated and are runtime arguments: the same adamw kernel for any values', async () => {
  assert.deepEqual(adamFromArgs({}), { beta1: D.beta1, beta2: D.beta2, eps: D.adamEps, weightDecay: D.weightDecay });
  const job = jobFromArgs({ model: 'tiny', beta1: 0.8, beta2: 0.999, adamEps: 1e-6 });
  assert.deepEqual(job.adam, { beta1: 0.8, beta2: 0.999, eps: 1e-6, weightDecay: D.weightDecay });
  const adamLine = (t: string): string => /^adamw_multi .*$/m.exec(t)?.[0] ?? '';
  const dflt = await capture(() => kernelsCommand('plan', { model: 'tiny' }));
  const custom = await capture(() => kernelsCommand('plan', { model: 'tiny', beta1: 0.8, beta2: 0.999, adamEps: 1e-6 }));
  assert.match(adamLine(dflt.text), /block=256$/);
  assert.equal(adamLine(custom.text), adamLine(dflt.text), 'same kernel, same key');
  const audit = await capture(() => kernelsCommand('audit', { model: 'tiny', beta2: 0.999 }));
  assert.equal(audit.code, 0, audit.text);
  assert.match(audit.text, /adamw beta1=0\.9 beta2=0\.999/);
  // A run with other betas needs nothing the default plan lacks.
  const planDefault = planKernels(jobClosures(jobFromArgs({ model: 'tiny' })));
  assert.deepEqual(notInPlan(planDefault, auditClosures(job)).missing, []);
  for (const bad of [{ beta1: 1 }, { beta2: -0.1 }, { adamEps: 0 }]) {
    assert.throws(() => jobFromArgs({ model: 'tiny', ...bad }), DistilleryError);
  }
  // bad flags are bad input (exit 2), with one sentence each: they failed with 1, some without a hint
  for (const [bad, re] of [
    [{ batch: 0 }, /--batch must be a positive integer, got 0/], [{ seq: 0 }, /--seq must be a positive integer/],
    [{ seq: 1e8 }, /--seq 100000000 exceeds the model's max_position_embeddings/], [{ model: 'nope' }, /'nope' is neither a preset/],
    [{ beta1: 2 }, /--beta1 must be >= 0 and < 1/], [{ teacher: 'tiny', alpha: 5 }, /--alpha out of range: 5/],
    [{ teacher: 'tiny', temperature: 0 }, /--temperature out of range: 0/],
  ] as Array<[Record<string, unknown>, RegExp]>) {
    assert.throws(() => jobFromArgs({ model: 'tiny', ...bad }), (e: unknown) => e instanceof InputError && e.exitCode === 2 && re.test(e.message) && Boolean(e.hint), JSON.stringify(bad));
  }
});

test('the kernels command accepts --beta1/--beta2/--adam-eps and --kernel-cache-dir as --cache-dir', async () => {
  const calls: Array<[string, Record<string, unknown>]> = [];
  const deps = { kernelsCommand: (sub: string, args: Record<string, unknown>) => { calls.push([sub, args]); return Promise.resolve(0); } };
  const io = { out: () => {}, err: () => {} };
  assert.equal(await kernelsCli.run(['plan', '--beta1', '0.8', '--beta2', '0.999', '--adam-eps', '1e-6', '--kernel-cache-dir', '/tmp/kc'], io, deps), 0);
  assert.deepEqual(calls[0], ['plan', { beta1: 0.8, beta2: 0.999, adamEps: 1e-6, cacheDir: '/tmp/kc' }]);
  assert.equal(await kernelsCli.run(['list', '--cache-dir', '/tmp/a', '--kernel-cache-dir', '/tmp/a'], io, deps), 0);
  assert.deepEqual(calls[1], ['list', { cacheDir: '/tmp/a' }]);
  await assert.rejects(kernelsCli.run(['list', '--cache-dir', '/tmp/a', '--kernel-cache-dir', '/tmp/b'], io, deps), UsageError);
});

test('kernels plan|audit: a teacher and a student of different vocab_size plan the loss over the smaller (the run\'s loss vocabulary)', async () => {
  const { presetConfig, toHfConfig } = await import('../../src/model/config.js');
  const dir = fs.mkdtempSync(path.join(tmpdir(), 'dk-vocab-'));
  try {
    const tfile = path.join(dir, 'teacher.json');
    fs.writeFileSync(tfile, JSON.stringify(toHfConfig(presetConfig('small', 320))));
    const args = { model: 'tiny', vocabSize: 300, teacher: tfile, loss: 'kl', batch: 2, seq: 8 };
    const job = jobFromArgs(args);
    assert.equal(job.student.vocabSize, 300);
    assert.equal(job.teacher?.vocabSize, 320);
    assert.equal(job.lossVocab, 300);
    const plan = await capture(() => kernelsCommand('plan', args));
    assert.equal(plan.code, 0, plan.text);
    assert.match(plan.text, /^loss +[0-9a-f]{16} +kind=kl /m);
    const audit = await capture(() => kernelsCommand('audit', args));
    assert.equal(audit.code, 0, audit.text);
    assert.match(audit.text, /^audit: OK: /m);
    // Same vocab_size: no loss vocabulary of its own (the whole vocabulary).
    assert.equal(jobFromArgs({ model: 'tiny', teacher: 'small', vocabSize: 300 }).lossVocab, undefined);
  } finally { fs.rmSync(dir, { recursive: true, force: true }); }
});

test('kernels plan|audit --tf32: the tensor-core attention forward (what a --tf32 run pre-warms) instead of the fp32 one', async () => {
  const families = async (args: Record<string, unknown>): Promise<string[]> => {
    const r = await capture(() => kernelsCommand('plan', { ...args, json: true }));
    assert.equal(r.code, 0, r.text);
    return (JSON.parse(r.text) as { kernels: Array<{ family: string }> }).kernels.map((k) => k.family);
  };
  const tf32 = await families({ model: 'tiny', tf32: true });
  assert.ok(tf32.includes('attention_fwd_mma') && !tf32.includes('attention_fwd'), tf32.join(' '));
  const fp32 = await families({ model: 'tiny', precision: 'fp32' });
  assert.ok(fp32.includes('attention_fwd') && !fp32.includes('attention_fwd_mma'), fp32.join(' '));
  const audit = await capture(() => kernelsCommand('audit', { model: 'tiny', tf32: true }));
  assert.equal(audit.code, 0, audit.text);
  // The command line accepts --tf32 and forwards it.
  const calls: Array<[string, Record<string, unknown>]> = [];
  const deps = { kernelsCommand: (sub: string, a: Record<string, unknown>) => { calls.push([sub, a]); return Promise.resolve(0); } };
  assert.equal(await kernelsCli.run(['plan', '--tf32'], { out: () => {}, err: () => {} }, deps), 0);
  assert.deepEqual(calls[0], ['plan', { tf32: true }]);
});

test('kernels --arch takes sm_XX from sm_75 (CUDA 13\'s NVRTC) and refuses anything else as usage, before compiling', async () => {
  for (const bad of ['banana', 'sm_10', 'sm_70', '90']) {
    await assert.rejects(kernelsCommand('plan', { model: 'tiny', arch: bad }), (e: unknown) => e instanceof InputError && /is not a GPU architecture/.test(e.message) && /sm_90/.test(e.hint ?? ''));
    await assert.rejects(kernelsCommand('warm', { model: 'tiny', arch: bad, cacheDir: path.join(tmpdir(), 'distillery-arch-never') }), (e: unknown) => e instanceof InputError);
  }
  const { code } = await capture(() => kernelsCommand('plan', { model: 'tiny', arch: 'sm_90a' }));
  assert.equal(code, 0);
});
