/**
 * Honest errors (issue 8, item 10): each mistake a user can make around files, sizes and configs is one sentence
 * with a hint and the exit code docs/cli.md promises (2: bad usage or input; 1: a failure while running), never
 * a stack trace. Every case runs through the CLI's main() with the real commands (and the real runTraining).
 */
import { test, before, after, mock } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import nodeFs from 'node:fs';
import { syncBuiltinESMExports } from 'node:module';
import * as path from 'node:path';
import { main } from '../../src/cli/main.js';
import { checkOutDir, type FsProbe } from '../../src/cli/options.js';
import { allocateWeights } from '../../src/model/params.js';
import { DistilleryError, InputError } from '../../src/util/errors.js';
import { UsageError } from '../../src/cli/args.js';
import { capture, tempDir, tinyTokenizer, TEXT, writeTinyCheckpoint } from './fixtures.js';
import { trainBpe } from '../../src/tokenizer/train-bpe.js';

let dir = '', data = '', model = '';
const TRAIN = ['--steps', '2', '--warmup', '0', '--model', 'tiny', '--vocab-size', '300', '--threads', '1', '--quiet', '--eval-every', '0'];

before(() => {
  dir = tempDir();
  data = path.join(dir, 'data.txt');
  fs.writeFileSync(data, TEXT.join('\n\n').repeat(20));
  model = path.join(dir, 'model');
  writeTinyCheckpoint(model, 1);
});
after(() => { fs.rmSync(dir, { recursive: true, force: true }); });

async function run(argv: string[]): Promise<{ code: number; err: string; out: string }> {
  const io = capture();
  const code = await main(argv, io, {});
  return { code, err: io.stderr(), out: io.stdout() };
}

/** One `error:` sentence, one `hint:` line, no stack trace, the expected exit code. */
function expectError(r: { code: number; err: string }, code: 1 | 2, message: RegExp): void {
  assert.equal(r.code, code, r.err);
  const lines = r.err.trimEnd().split('\n');
  const e = lines.findIndex((l) => l.startsWith('error: '));
  assert.ok(e >= 0, r.err);
  assert.match(lines[e]!, message);
  assert.match(lines[e + 1] ?? '', /^ {2}hint: \S/, r.err);
  assert.equal(lines.length, e + 2, `nothing after the hint:\n${r.err}`);
  assert.doesNotMatch(r.err, /\n\s+at \S+ \(|Error: /, 'no stack trace');
}

test('--out is a file, or a folder under a file: exit 2 (train, distill, demo)', async () => {
  const file = path.join(dir, 'a-file');
  fs.writeFileSync(file, 'x');
  expectError(await run(['train', '--data', data, '--out', file, ...TRAIN]), 2, /^error: --out .*a-file is a file, not a folder$/);
  expectError(await run(['train', '--data', data, '--out', `${file}/`, ...TRAIN]), 2, /is a file, not a folder$/);
  expectError(await run(['train', '--data', data, '--out', path.join(file, 'sub', 'run'), ...TRAIN]), 2,
    /^error: --out .*a-file\/sub\/run: .*a-file is a file, so no folder can be made under it$/);
  expectError(await run(['distill', '--teacher', model, '--data', data, '--out', path.join(file, 'x'), ...TRAIN]), 2, /is a file/);
  expectError(await run(['demo', '--quick', '--out', path.join(file, 'demo')]), 2, /is a file, so no folder can be made under it/);
  assert.equal(fs.readFileSync(file, 'utf8'), 'x', 'the file is untouched');
});

test('--out without write permission: exit 2 (simulated for root, real otherwise)', async () => {
  const probe: FsProbe = { exists: (p) => p === '/' || p === '/locked', isDirectory: () => true, writable: (p) => p !== '/locked' };
  assert.throws(() => checkOutDir(probe, '/locked/runs/a', '--out'),
    (e: unknown) => e instanceof UsageError && /^--out \/locked\/runs\/a: no permission to write in \/locked$/.test(e.message));
  checkOutDir(probe, '/elsewhere/a', '--out');
  if (process.getuid?.() === 0 || process.platform === 'win32') return; // root writes anywhere: nothing more to see
  const locked = path.join(dir, 'locked');
  fs.mkdirSync(locked);
  fs.chmodSync(locked, 0o555);
  try {
    expectError(await run(['train', '--data', data, '--out', path.join(locked, 'run'), ...TRAIN]), 2, /no permission to write in .*locked$/);
  } finally { fs.chmodSync(locked, 0o755); }
});

test('an unreadable data file: exit 2 naming it', { skip: fs.existsSync('/proc/self/mem') ? false : 'needs /proc/self/mem' }, async () => {
  // /proc/self/mem fails every read with EIO, for root too.
  const link = path.join(dir, 'unreadable.txt');
  fs.symlinkSync('/proc/self/mem', link);
  expectError(await run(['train', '--data', link, '--out', path.join(dir, 'r1'), ...TRAIN]), 2, /^error: cannot read data file .*unreadable\.txt: input\/output error$/);
  expectError(await run(['eval', '--model', model, '--data', link]), 2, /cannot read data file/);
  expectError(await run(['eval', '--model', model, '--data', link, '--teacher-dtype', 'nf4']), 2, /--teacher-dtype goes with --teacher/);
  if (process.getuid?.() !== 0) {
    const secret = path.join(dir, 'secret.txt');
    fs.writeFileSync(secret, 'text');
    fs.chmodSync(secret, 0o000);
    expectError(await run(['train', '--data', secret, '--out', path.join(dir, 'r1b'), ...TRAIN]), 2, /cannot read data file .*secret\.txt: permission denied$/);
  }
});

test('a dangling symbolic link, a link loop, a link back up in a data folder: exit 2 naming the link', async () => {
  const mk = (name: string): string => { const d = path.join(dir, name); fs.mkdirSync(d); fs.copyFileSync(data, path.join(d, 'a.txt')); return d; };
  const dangling = mk('dangling');
  fs.symlinkSync(path.join(dir, 'nowhere.txt'), path.join(dangling, 'b.txt'));
  expectError(await run(['train', '--data', dangling, '--out', path.join(dir, 'r2'), ...TRAIN]), 2,
    /^error: data folder .*dangling: .*b\.txt is a broken symbolic link \(to .*nowhere\.txt, which does not exist\)$/);
  const loop = mk('loop');
  fs.symlinkSync('l2', path.join(loop, 'l1'));
  fs.symlinkSync('l1', path.join(loop, 'l2'));
  expectError(await run(['train', '--data', loop, '--out', path.join(dir, 'r3'), ...TRAIN]), 2, /l1 is a symbolic link loop/);
  const cycle = mk('cycle');
  fs.mkdirSync(path.join(cycle, 'sub'));
  fs.symlinkSync('..', path.join(cycle, 'sub', 'up'));
  expectError(await run(['eval', '--model', model, '--data', cycle]), 2, /sub\/up leads back into a folder already being read/);
  // A link to a folder elsewhere is fine.
  const ok = mk('ok');
  fs.symlinkSync(dangling.replace('dangling', 'loop'), path.join(ok, 'other'));
  fs.rmSync(path.join(loop, 'l1')); fs.rmSync(path.join(loop, 'l2'));
  const r = await run(['eval', '--model', model, '--data', ok, '--threads', '1', '--json']);
  assert.equal(r.code, 0, r.err);
});

test('a tokenizer bigger than the model\'s vocabulary: eval and generate exit 1 naming both sizes', async () => {
  const big = path.join(dir, 'tok-big');
  writeTinyCheckpoint(big, 3);
  const bigger = trainBpe(TEXT, { vocabSize: tinyTokenizer().vocabSize + 40, specialTokens: ['<|endoftext|>'], minFrequency: 1 });
  fs.writeFileSync(path.join(big, 'tokenizer.json'), JSON.stringify(bigger.toJSON()));
  const want = new RegExp(`^error: .*tok-big: tokenizer\\.json has ${bigger.vocabSize} tokens but config\\.json's vocab_size is ${tinyTokenizer().vocabSize}$`);
  expectError(await run(['eval', '--model', big, '--data', data]), 1, want);
  expectError(await run(['generate', '--model', big, '--prompt', 'The quick brown fox']), 1, want);
});

test('vocab_size 1e9: a checkpoint is refused before its weights are allocated; --vocab-size 1e9 exits 2', async () => {
  const huge = path.join(dir, 'huge');
  writeTinyCheckpoint(huge, 4);
  const cfgPath = path.join(huge, 'config.json');
  fs.writeFileSync(cfgPath, JSON.stringify({ ...JSON.parse(fs.readFileSync(cfgPath, 'utf8')) as object, vocab_size: 1e9 }));
  const before = process.memoryUsage().arrayBuffers;
  for (const argv of [['eval', '--model', huge, '--data', data], ['generate', '--model', huge, '--prompt', 'x']]) {
    expectError(await run(argv), 1, /tensor "model\.embed_tokens\.weight" has shape \[\d+, 16\] but config\.json implies \[1000000000, 16\]$/);
  }
  assert.ok(process.memoryUsage().arrayBuffers - before < 1e8, 'nothing large was allocated');
  assert.throws(() => allocateWeights(2 ** 40, 'huge'), (e: unknown) => e instanceof DistilleryError && /^huge: cannot allocate 4096\.00 GiB for 1099511627776 float32 parameters$/.test(e.message));
  // A config.json asking for a model of that size: refused naming the size, before any weights are made.
  const bigCfg = path.join(dir, 'big-config.json');
  fs.writeFileSync(bigCfg, fs.readFileSync(cfgPath));
  const r = await run(['train', '--data', data, '--out', path.join(dir, 'r4b'), ...TRAIN, '--model', bigCfg]);
  expectError(r, 1, /cannot allocate student parameters \(\d+\.\d+ GiB/);
  expectError(await run(['train', '--data', data, '--out', path.join(dir, 'r4'), ...TRAIN, '--vocab-size', '1000000000']), 2,
    /^error: --vocab-size must be an integer from 256 .* to 1048575, got 1000000000$/);
});

test('--threads 1e12: exit 2 in train, eval, generate and demo', async () => {
  const want = /^error: --threads must be an integer from 0 to 1024 \(0 = all cores\), got 1000000000000$/;
  expectError(await run(['train', '--data', data, '--out', path.join(dir, 'r5'), ...TRAIN, '--threads', '1e12']), 2, want);
  expectError(await run(['eval', '--model', model, '--data', data, '--threads', '1e12']), 2, want);
  expectError(await run(['generate', '--model', model, '--prompt', 'x', '--threads', '1e12']), 2, want);
  expectError(await run(['demo', '--out', path.join(dir, 'demo'), '--threads', '1e12']), 2, want);
});

test('--seq 1e12: exit 2 naming max_position_embeddings, before any data is packed', async () => {
  expectError(await run(['train', '--data', data, '--out', path.join(dir, 'r6'), ...TRAIN, '--seq', '1e12']), 2,
    /^error: --seq 1000000000000 exceeds the model's max_position_embeddings \(32768\)$/);
  expectError(await run(['distill', '--teacher', model, '--data', data, '--out', path.join(dir, 'r7'), ...TRAIN, '--seq', '300']), 2,
    /^error: --seq 300 exceeds the teacher's max_position_embeddings \(256\)$/);
  expectError(await run(['eval', '--model', model, '--data', data, '--seq', '1e12']), 2, /exceeds the model's max_position_embeddings/);
});

test('a YAML alias bomb in --config: exit 2 at once; ordinary aliases still work', async () => {
  const bomb = path.join(dir, 'bomb.yaml');
  const rows = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'];
  for (const [x, y] of [['b', 'a'], ['c', 'b'], ['d', 'c'], ['e', 'd'], ['f', 'e'], ['g', 'f'], ['h', 'g'], ['i', 'h']]) rows.push(`${x}: &${x} [${Array(9).fill(`*${y}`).join(',')}]`);
  fs.writeFileSync(bomb, rows.join('\n') + '\n');
  const t0 = performance.now();
  expectError(await run(['train', '--config', bomb]), 2, /^error: .*bomb\.yaml: too many YAML alias expansions/);
  assert.ok(performance.now() - t0 < 3000);
  const fine = path.join(dir, 'fine.yaml');
  fs.writeFileSync(fine, `data: &d [${JSON.stringify(data)}]\nout: ${JSON.stringify(path.join(dir, 'r8'))}\nsteps: 2\nwarmup: 0\nmodel: nope-preset\n`);
  const r = await run(['train', '--config', fine]);
  expectError(r, 2, /'nope-preset' is neither a preset/);
});

test('a corrupt state.json: --resume exits 1 with one sentence (truncated, not an object, missing fields)', async () => {
  const out = path.join(dir, 'r9');
  const ok = await run(['train', '--data', data, '--out', out, ...TRAIN]);
  assert.equal(ok.code, 0, ok.err);
  const state = path.join(out, 'checkpoints', 'latest', 'state.json');
  const good = fs.readFileSync(state, 'utf8');
  for (const [content, why] of [
    [good.slice(0, 40), /is corrupt \(.*JSON.*\)$/],
    ['[1, 2]', /is corrupt \(not a JSON object\)$/],
    [JSON.stringify({ ...JSON.parse(good) as object, step: 'two' }), /is corrupt \("step" must be an integer >= 0, got "two"\)$/],
    [JSON.stringify({ ...JSON.parse(good) as object, options: undefined }), /is corrupt \("options" is missing\)$/],
  ] as const) {
    fs.writeFileSync(state, content);
    expectError(await run(['train', '--data', data, '--out', out, ...TRAIN, '--steps', '3', '--resume']), 1, why);
  }
});

test('a damaged model folder or optimizer state in the checkpoint: --resume exits 1 (a corrupt checkpoint, not bad input) with the run\'s hint', async () => {
  const out = path.join(dir, 'r9b');
  const ok = await run(['train', '--data', data, '--out', out, ...TRAIN]);
  assert.equal(ok.code, 0, ok.err);
  const latest = path.join(out, 'checkpoints', 'latest');
  const backup = path.join(dir, 'r9b-latest');
  fs.cpSync(latest, backup, { recursive: true });
  for (const [file, damage, why] of [
    ['model/config.json', 'remove', /model folder .*has no config\.json/],
    ['model/model.safetensors', 'remove', /has no model\.safetensors/],
    ['model/model.safetensors', 'truncate', /not a valid safetensors file/],
    ['model/tokenizer.json', 'truncate', /tokenizer\.json: not valid JSON/],
    ['optimizer.safetensors', 'truncate', /not a valid safetensors file/],
  ] as const) {
    fs.rmSync(latest, { recursive: true, force: true });
    fs.cpSync(backup, latest, { recursive: true });
    const p = path.join(latest, file);
    if (damage === 'remove') fs.rmSync(p); else fs.writeFileSync(p, fs.readFileSync(p).subarray(0, fs.statSync(p).size >> 1));
    const r = await run(['train', '--data', data, '--out', out, ...TRAIN, '--steps', '3', '--resume']);
    expectError(r, 1, why);
    assert.match(r.err, /(^|\n)error: --resume: the checkpoint is damaged: /, `${damage} ${file}`);
    assert.match(r.err, /hint: restore the checkpoint from a copy of the run, or start afresh with --overwrite/);
  }
});

/** Makes fs.<name> throw ENOSPC for paths matching `when` (for every module: the ESM bindings are re-synced). */
function diskFullFor(name: 'appendFileSync' | 'writeFileSync', when: (p: string) => boolean): { restore(): void; hits: () => number } {
  let hits = 0;
  const real = nodeFs[name] as (...a: unknown[]) => unknown;
  const m = mock.method(nodeFs, name, (...args: unknown[]) => {
    if (typeof args[0] === 'string' && when(args[0])) {
      hits++;
      throw Object.assign(new Error(`ENOSPC: no space left on device, write`), { code: 'ENOSPC', errno: -28, syscall: 'write' });
    }
    return real.apply(nodeFs, args);
  });
  syncBuiltinESMExports();
  return { restore: () => { m.mock.restore(); syncBuiltinESMExports(); }, hits: () => hits };
}

test('disk full while appending metrics: exit 1, one sentence naming metrics.jsonl, the checkpoint kept', async () => {
  const out = path.join(dir, 'r10');
  const full = diskFullFor('appendFileSync', (p) => p.endsWith('metrics.jsonl') && fs.existsSync(path.join(out, 'checkpoints', 'latest')));
  // checkpoints written on this thread: the mock's trigger (latest exists) then comes at step 2, not when the writer is done
  process.env.DISTILLERY_BACKGROUND_CHECKPOINTS = '0';
  let r;
  try {
    r = await run(['train', '--data', data, '--out', out, ...TRAIN, '--steps', '3', '--save-every', '1']);
  } finally { full.restore(); delete process.env.DISTILLERY_BACKGROUND_CHECKPOINTS; }
  assert.ok(full.hits() > 0);
  expectError(r, 1, /^error: cannot append to .*r10\/metrics\.jsonl: no space left on the device \(disk full\) \(ENOSPC\)$/);
  assert.match(r.err, /hint: free disk space, then continue with --resume \(the last checkpoint, .*latest, is intact\)/);
  const state = JSON.parse(fs.readFileSync(path.join(out, 'checkpoints', 'latest', 'state.json'), 'utf8')) as { step: number };
  assert.equal(state.step, 1);
});

test('disk full while writing a checkpoint\'s state.json: exit 1, the previous checkpoint intact', async () => {
  const out = path.join(dir, 'r11');
  let saves = 0;
  const full = diskFullFor('writeFileSync', (p) => p.endsWith('state.json') && ++saves === 2);
  // the mock reaches this thread's fs only: the checkpoint is written here, not on the writer thread
  process.env.DISTILLERY_BACKGROUND_CHECKPOINTS = '0';
  let r;
  try {
    r = await run(['train', '--data', data, '--out', out, ...TRAIN, '--steps', '3', '--save-every', '1']);
  } finally { full.restore(); delete process.env.DISTILLERY_BACKGROUND_CHECKPOINTS; }
  expectError(r, 1, /^error: cannot write .*r11\/checkpoints\/latest: no space left on the device \(disk full\) \(ENOSPC\)$/);
  const state = JSON.parse(fs.readFileSync(path.join(out, 'checkpoints', 'latest', 'state.json'), 'utf8')) as { step: number };
  assert.equal(state.step, 1, 'the step-1 checkpoint survived the failed step-2 write');
  assert.deepEqual(fs.readdirSync(path.join(out, 'checkpoints')), ['latest'], 'no temp folder left behind');
});

test('the real binary: exit code and stderr as main() gives them (no stack)', () => {
  const bin = path.resolve('bin', 'distillery.js');
  if (!fs.existsSync(bin) || !fs.existsSync(path.resolve('dist', 'src', 'cli', 'main.js'))) return;
  const file = path.join(dir, 'b-file');
  fs.writeFileSync(file, 'x');
  const r = spawnSync(process.execPath, [bin, 'train', '--data', data, '--out', path.join(file, 'x'), ...TRAIN], { encoding: 'utf8' });
  expectError({ code: r.status ?? -1, err: r.stderr }, 2, /is a file, so no folder can be made under it$/);
});

test('runTraining itself (without the CLI\'s checks) reports an --out under a file as bad input', async () => {
  const { runTraining } = await import('../../src/train/run.js');
  const { DEFAULT_RUN_OPTIONS } = await import('../../src/train/options.js');
  const file = path.join(dir, 'c-file');
  fs.writeFileSync(file, 'x');
  await assert.rejects(runTraining({ ...DEFAULT_RUN_OPTIONS, mode: 'train', out: path.join(file, 'run'), data: [data] }, { log: () => {} }),
    (e: unknown) => e instanceof InputError && /^--out .*c-file\/run: cannot create the run folder: a part of the path is a file, not a folder \(ENOTDIR\)$/.test(e.message));
});
