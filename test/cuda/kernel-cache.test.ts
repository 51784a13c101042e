/**
 * Kernel cache tests with a fake compiler (no NVRTC needed): key formula, disk round trip, corrupt / truncated /
 * foreign files recompiled and rewritten, atomic writes, sealed misses (logged; thrown in strict mode),
 * verbose compile lines, counters, parallel pre-warm, an unwritable cache folder, entries that are not regular
 * files (a FIFO, a symbolic link to /dev/zero) skipped at once, reads bounded by the header's length.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, lstatSync, symlinkSync } from 'node:fs';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, truncateSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DistilleryError } from '../../src/util/errors.js';
import {
  KernelCache, MAX_ENTRY_BYTES, cacheKey, decodeEntry, defaultCacheDir, defaultStrict, encodeEntry, readEntryFile, writeFileAtomic,
} from '../../src/backend/cuda/kernel-cache.js';
import { rmsnormForward, ropeForward, addKernel } from '../../src/backend/cuda/kernels/index.js';
import { FakeCompiler } from './helpers.js';

const specA = rmsnormForward.make({ eps: 1e-6, C: 896, out: 'f32', inp: 'f32', weight: 'f32', block: 256 });
const specB = rmsnormForward.make({ eps: 1e-5, C: 896, out: 'f32', inp: 'f32', weight: 'f32', block: 256 });
const specC = ropeForward.make({ headDim: 64, theta: 1e6, out: 'f32', inp: 'f32', seqPos: false, bias: 'none', block: 256 });
const tmp = () => mkdtempSync(join(tmpdir(), 'distillery-kc-'));

function mk(dir: string | null, extra: Partial<ConstructorParameters<typeof KernelCache>[0]> = {}) {
  const lines: string[] = [];
  const compiler = new FakeCompiler();
  const cache = new KernelCache({ compiler, arch: 'sm_90', dir, strict: true, log: (l) => lines.push(l), ...extra });
  return { cache, lines, compiler };
}

test('key: sha256 hex of source, options, arch, compiler version and build; each one changes it', () => {
  const { cache, compiler } = mk(null);
  const id = { version: compiler.version, build: compiler.build };
  const base = cacheKey(specA.source(), cache.options, 'sm_90', id);
  assert.match(base, /^[0-9a-f]{64}$/);
  assert.equal(cache.keyOf(specA), base, 'the cache keys with the same function and its compiler');
  const variants = [
    cacheKey(specB.source(), cache.options, 'sm_90', id),
    cacheKey(specA.source(), [...cache.options, '-lineinfo'], 'sm_90', id),
    cacheKey(specA.source(), cache.options, 'sm_80', id),
    cacheKey(specA.source(), cache.options, 'sm_90', { ...id, version: 'fake-1.1' }),
    cacheKey(specA.source(), cache.options, 'sm_90', { ...id, build: 'fake-build-b' }),
  ];
  assert.equal(new Set([base, ...variants]).size, variants.length + 1);
  // Fields are separated, so moving text from one field into the next cannot collide.
  assert.notEqual(cacheKey('s', cache.options, 'sm_90', { version: 'v1', build: '0' }),
    cacheKey('s', cache.options, 'sm_90', { version: 'v', build: '10' }));
  assert.ok(cache.options.includes('--gpu-architecture=sm_90'));
});

test('two builds of one compiler version do not share disk entries', async () => {
  const dir = tmp();
  const a = mk(dir);
  await a.cache.prewarm([specA]);
  const other = new FakeCompiler();
  other.build = 'fake-build-b';
  const b = new KernelCache({ compiler: other, arch: 'sm_90', dir, strict: true, log: () => {} });
  assert.notEqual(b.keyOf(specA), a.cache.keyOf(specA));
  await b.prewarm([specA]);
  assert.equal(other.calls, 1, 'the other build compiles its own entry');
  assert.equal(b.counters.loadedFromDisk, 0);
});

test('the cache passes spec.describe() to the compiler (compile errors name the baked parameters)', async () => {
  const { cache, compiler } = mk(null, { strict: false });
  await cache.prewarm([specA], { seal: false });
  cache.get(specC);
  assert.deepEqual(compiler.labels, [specA.describe(), specC.describe()]);
  assert.match(compiler.labels[0]!, /rmsnorm_fwd .*eps=0\.000001 .*C=896/);
});

test('disk round trip: a second cache loads instead of compiling', async () => {
  const dir = tmp();
  const a = mk(dir);
  await a.cache.prewarm([specA, specB, specC]);
  assert.equal(a.compiler.calls, 3);
  assert.equal(readdirSync(dir).filter((f) => f.endsWith('.cubin')).length, 3);
  const b = mk(dir);
  await b.cache.prewarm([specA, specB, specC]);
  assert.equal(b.compiler.calls, 0);
  assert.equal(b.cache.counters.loadedFromDisk, 3);
  assert.deepEqual(Buffer.from(b.cache.get(specA)), Buffer.from(a.cache.get(specA)));
  assert.equal(b.cache.counters.hits, 1);
});

for (const [what, damage] of [
  ['corrupt payload', (p: string) => { const f = readFileSync(p); f[f.length - 1]! ^= 0xff; writeFileSync(p, f); }],
  ['truncated file', (p: string) => truncateSync(p, 40)],
  ['truncated payload', (p: string) => { const f = readFileSync(p); truncateSync(p, f.length - 3); }],
  ['foreign file', (p: string) => writeFileSync(p, 'hello, I am not a cubin at all, just some text in the way')],
  ['empty file', (p: string) => writeFileSync(p, '')],
] as const) {
  test(`${what} is detected, recompiled and rewritten`, async () => {
    const dir = tmp();
    const a = mk(dir);
    await a.cache.prewarm([specA]);
    const path = join(dir, `${a.cache.keyOf(specA)}.cubin`);
    damage(path);
    const b = mk(dir);
    await b.cache.prewarm([specA]);
    assert.equal(b.compiler.calls, 1);
    assert.equal(b.cache.counters.diskRejected, 1);
    assert.ok(b.lines.some((l) => l.startsWith('[kernel-cache] ignoring ')), b.lines.join('\n'));
    const r = decodeEntry(a.cache.keyOf(specA), readFileSync(path));
    assert.ok('payload' in r, 'file rewritten and valid');
  });
}

test("another key's file under this key's name is rejected", async () => {
  const dir = tmp();
  const a = mk(dir);
  await a.cache.prewarm([specA, specB]);
  const pa = join(dir, `${a.cache.keyOf(specA)}.cubin`), pb = join(dir, `${a.cache.keyOf(specB)}.cubin`);
  writeFileSync(pa, readFileSync(pb));
  const b = mk(dir);
  assert.notDeepEqual(Buffer.from(b.cache.get(specA)), readFileSync(pb).subarray(112));
  assert.equal(b.cache.counters.diskRejected, 1);
});

test('atomic write: a failure mid-write leaves the old file and no temp file', () => {
  const dir = tmp();
  const p = join(dir, 'x.cubin');
  writeFileSync(p, 'old');
  const made: string[] = [];
  assert.throws(() => writeFileAtomic(p, Buffer.from('new'), {
    writeFileSync: (t, d) => { made.push(t); writeFileSync(t, d); },
    renameSync: () => { throw new Error('disk full'); },
    unlinkSync: (t) => unlinkSync(t),
  }), /disk full/);
  assert.equal(readFileSync(p, 'utf8'), 'old');
  assert.equal(made.length, 1);
  assert.deepEqual(readdirSync(dir), ['x.cubin']);
  writeFileAtomic(p, Buffer.from('new'));
  assert.equal(readFileSync(p, 'utf8'), 'new');
  assert.deepEqual(readdirSync(dir), ['x.cubin']);
});

test('after seal a miss is logged by name and thrown in strict mode', async () => {
  const { cache, lines } = mk(null);
  await cache.prewarm([specA]);
  assert.ok(cache.sealed);
  cache.get(specA);
  assert.throws(() => cache.get(specB), (e: unknown) => e instanceof DistilleryError && /not pre-warmed/.test(e.message));
  assert.ok(lines.includes(`[kernel-cache] miss after pre-warm: ${specB.describe()}`), lines.join('\n'));
  assert.match(lines.find((l) => l.includes('miss after'))!, /^\[kernel-cache\] miss after pre-warm: rmsnorm_fwd eps=0\.00001 C=896 out=f32 inp=f32 weight=f32 block=256$/);
  assert.equal(cache.counters.missesAfterSeal, 1);
});

test('non-strict: a sealed miss is logged, counted and compiled', async () => {
  const { cache, lines, compiler } = mk(null, { strict: false });
  await cache.prewarm([specA]);
  assert.ok(cache.get(specB).length > 0);
  assert.equal(cache.counters.missesAfterSeal, 1);
  assert.equal(compiler.calls, 2);
  assert.equal(lines.filter((l) => l.includes('miss after pre-warm')).length, 1);
  assert.equal(cache.summary(), '[kernel-cache] compiled 2, loaded from disk 0, hits 0, misses after seal 1');
});

test('verbose prints one compile line per compile with the key and time', async () => {
  const { cache, lines } = mk(null, { verbose: true });
  await cache.prewarm([specA, specC, specA]);
  const compiles = lines.filter((l) => l.startsWith('[kernel-cache] compile '));
  assert.equal(compiles.length, 2);
  assert.match(compiles[0]!, /^\[kernel-cache\] compile (rmsnorm_fwd|rope_fwd) .* [0-9a-f]{64} \d+ms$/);
});

test('pre-warm compiles in parallel and counts', async () => {
  const compiler = new FakeCompiler(20);
  const cache = new KernelCache({ compiler, arch: 'sm_90', dir: null, strict: true, log: () => {} });
  const specs = [32, 64, 128, 256, 512, 1024].map((b) => addKernel.make({ out: 'f32', a: 'f32', b: 'f32', block: b }));
  await cache.prewarm(specs, { concurrency: 4 });
  assert.ok(compiler.maxInFlight > 1, `max in flight ${compiler.maxInFlight}`);
  assert.equal(cache.counters.compiled, 6);
});

test('an unwritable cache folder degrades to memory with one warning', async () => {
  const dir = tmp();
  const file = join(dir, 'not-a-dir');
  writeFileSync(file, 'x');
  const { cache, lines } = mk(join(file, 'kernels'));
  await cache.prewarm([specA, specB]);
  assert.equal(lines.filter((l) => l.includes('caching in memory only')).length, 1);
  assert.ok(cache.get(specA).length > 0);
});

test('defaults: cache folder and strict mode from the environment', () => {
  assert.equal(defaultCacheDir({ DISTILLERY_CACHE_DIR: '/x' }), '/x');
  assert.equal(defaultCacheDir({ XDG_CACHE_HOME: '/c' }), '/c/distillery/kernels');
  assert.match(defaultCacheDir({}), /\.cache\/distillery\/kernels$/);
  assert.equal(defaultStrict({ NODE_ENV: 'test' }), true);
  assert.equal(defaultStrict({ DISTILLERY_STRICT_KERNELS: '1' }), true);
  assert.equal(defaultStrict({}), false);
});

const canFifo = (): boolean => {
  if (process.platform === 'win32') return false;
  try { execFileSync('mkfifo', ['--version'], { stdio: 'ignore' }); return true; } catch { return false; }
};

test('an entry that is a FIFO is skipped at once (not read, so it cannot block), then replaced by a real entry', { skip: canFifo() ? false : 'no mkfifo', timeout: 20_000 }, async () => {
  const dir = tmp();
  const { cache, lines, compiler } = mk(dir);
  const p = join(dir, `${cache.keyOf(specA)}.cubin`);
  execFileSync('mkfifo', [p]);
  // No writer: a plain (blocking) open or read of this FIFO never returns. (A writer process here would race the
  // cache: started after the FIFO is replaced, its `> file` truncates the new entry.)
  {
    const t0 = performance.now();
    await cache.prewarm([specA]);
    const ms = performance.now() - t0;
    assert.ok(ms < 2000, `pre-warm took ${ms.toFixed(0)} ms`);
    assert.equal(compiler.calls, 1);
    assert.equal(cache.counters.diskRejected, 1);
    assert.ok(lines.some((l) => /ignoring .*: a FIFO \(named pipe\), not a regular file; recompiling/.test(l)), lines.join('\n'));
    assert.ok(lstatSync(p).isFile(), 'the FIFO was replaced by a regular file');
    assert.ok('payload' in decodeEntry(cache.keyOf(specA), readFileSync(p)));
  }
});

test('an entry that is a symbolic link to /dev/zero is skipped at once (links are never followed)', { skip: existsSync('/dev/zero') ? false : 'no /dev/zero', timeout: 20_000 }, async () => {
  const dir = tmp();
  const { cache, lines } = mk(dir);
  const p = join(dir, `${cache.keyOf(specA)}.cubin`);
  symlinkSync('/dev/zero', p);
  const t0 = performance.now();
  await cache.prewarm([specA]);
  assert.ok(performance.now() - t0 < 2000);
  assert.equal(cache.counters.diskRejected, 1);
  assert.ok(lines.some((l) => /ignoring .*: a symbolic link/.test(l)), lines.join('\n'));
  assert.ok(lstatSync(p).isFile(), 'the link itself was replaced, /dev/zero untouched');
  // A link to a valid entry is not followed either.
  const q = join(dir, `${cache.keyOf(specB)}.cubin`);
  const real = join(dir, 'elsewhere.bin');
  writeFileSync(real, encodeEntry(cache.keyOf(specB), new Uint8Array([1, 2, 3])));
  symlinkSync(real, q);
  assert.deepEqual(readEntryFile(q, cache.keyOf(specB)), { bad: 'a symbolic link (the cache reads only regular files, never through links)', skipped: true });
  assert.ok('payload' in readEntryFile(real, cache.keyOf(specB)));
});

test('reads are bounded by the header: a huge declared length is refused without reading it', () => {
  const dir = tmp();
  const key = 'c'.repeat(64);
  const p = join(dir, `${key}.cubin`);
  const f = encodeEntry(key, new Uint8Array(16));
  f.writeBigUInt64LE(BigInt(MAX_ENTRY_BYTES) + 1n, 72);
  writeFileSync(p, f);
  const r = readEntryFile(p, key);
  assert.ok('bad' in r && /more than the \d+-byte limit/.test(r.bad), JSON.stringify(r));
  // A length that disagrees with the file's size (a file still growing, or cut) is refused too.
  f.writeBigUInt64LE(1000n, 72);
  writeFileSync(p, f);
  const r2 = readEntryFile(p, key);
  assert.ok('bad' in r2 && /payload length 1000 but 16 bytes present/.test(r2.bad), JSON.stringify(r2));
  assert.deepEqual(readEntryFile(join(dir, 'absent.cubin'), key), { missing: true });
});
