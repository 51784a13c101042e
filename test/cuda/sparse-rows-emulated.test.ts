/**
 * No GPU (needs g++; skips without it; about 20 seconds, so it runs by default, also in CI): the GENERATED sample_rows
 * kernel (src/backend/cuda/kernels/sparse-rows.ts: a teacher cache's systematic draws on the device) compiled for the
 * host on the emulator of ./emulator.ts and compared with the CPU backend's float64 rows
 * (src/backend/cpu/kernels/sparse-rows.ts): the same distinct ids in the same order, log-probabilities to float32
 * rounding, the argmax; for random, peaked and flat rows, a vocabulary that is not a multiple of the block, one smaller
 * than the block (threads without tokens), from 1 to 256 draws, uniforms at the ends of [0, 1), rows that are not
 * 16-byte aligned, a chunk whose float32 mass underflows (every draw still lands) and NaN logits (the row's slots all
 * −1). Likewise top_rows (a top-K cache): the same K ids in the same order (ties: lower id first, also when more tokens
 * tie at the K-th logit than the K can hold), log q, the tail mass and the argmax, at K = the vocabulary too, and at
 * Qwen's vocabulary.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { sampleRowsKernel, topRowsKernel } from '../../src/backend/cuda/kernels/sparse-rows.js';
import { sparseRow } from '../../src/backend/cpu/kernels/sparse-rows.js';
import { build, cleanUp, gxx, workDir } from './emulator.js';
import { rng } from './helpers.js';

const skip = gxx() ? false : 'g++ not found';
const n = 8, V = 700, LD = 704, BLOCK = 128, T = 1.5;

/** The rows a kernel run wrote (files <prefix>ids, lq, tl, am of the work folder). */
function readRows(prefix: string): { ids: Int32Array; lq: Float32Array; tl: Float32Array; am: Int32Array } {
  const rd = (f: string): ArrayBuffer => { const b = readFileSync(join(workDir(), prefix + f)); return b.buffer.slice(b.byteOffset, b.byteOffset + b.length); };
  return { ids: new Int32Array(rd('ids')), lq: new Float32Array(rd('lq')), tl: new Float32Array(rd('tl')), am: new Int32Array(rd('am')) };
}

/** sample_rows (block 128) on the emulator over rows [rows, LD] of z (V tokens each) for each S: the rows it wrote (readRows). */
function runSample(z: Float32Array, u: Float32Array, rows: number, V: number, LD: number, T: number, slots: number[]): Map<number, ReturnType<typeof readRows>> {
  writeFileSync(join(workDir(), 'zs'), z); writeFileSync(join(workDir(), 'us'), u);
  const exe = build(sampleRowsKernel.make({ block: 128 }), `int main(int argc, char** argv) { const char* d = "${workDir()}";
  const int S = atoi(argv[1]);
  auto z = readf<float>(d, "zs", ${rows * LD}); auto u = readf<float>(d, "us", ${rows});
  std::vector<int> ids(${rows} * S), am(${rows}); std::vector<float> lq(${rows} * S), tl(${rows});
  launch({${rows}, 1, 1}, 128, 0, [&] { sample_rows(z.data(), u.data(), ids.data(), lq.data(), tl.data(), am.data(), ${rows}, ${V}, ${LD}, S, (float)${T}); });
  writef(d, "ids", ids); writef(d, "lq", lq); writef(d, "tl", tl); writef(d, "am", am); }`);
  const out = new Map<number, ReturnType<typeof readRows>>();
  for (const S of slots) {
    execFileSync(exe, [String(S)]);
    out.set(S, readRows(''));
  }
  return out;
}

test('emulated CUDA: sample_rows equals the float64 systematic draws (ids, order, log q, argmax)', { skip, timeout: 300_000 }, () => {
  const r = rng(21);
  const z = new Float32Array(n * LD);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < LD; j++) z[i * LD + j] = (r() - 0.5) * (i === 1 ? 30 : 8);
    if (i === 2) z[i * LD + 345] = 40; // one token takes nearly all the mass
    if (i === 3) z.fill(0.25, i * LD, i * LD + LD); // flat: the first maximum is the argmax
    if (i === 4) { z[i * LD + 699] = 30; z[i * LD + 698] = 29.5; } // the mass at the very end of the vocabulary
  }
  const u = Float32Array.from({ length: n }, (_, i) => (i === 5 ? 0 : i === 6 ? 0.99999994 : r()));
  for (const [S, { ids, lq, tl, am }] of runSample(z, u, n, V, LD, T, [1, 7, 32, 200])) {
    for (let i = 0; i < n; i++) {
      const want = sparseRow(z, i * LD, V, T, { kind: 'sample', n: S }, () => u[i]!);
      const got = [...ids.subarray(i * S, i * S + S)];
      assert.deepEqual(got.filter((x) => x >= 0), want.ids, `S=${S} row ${i}: ids`);
      assert.ok(got.slice(want.ids.length).every((x) => x === -1), `S=${S} row ${i}: unused slots are -1`);
      want.logq.forEach((l, k) => assert.ok(Math.abs(lq[i * S + k]! - l) <= 2e-5 * Math.max(1, Math.abs(l)), `S=${S} row ${i}: log q ${lq[i * S + k]} vs ${l}`));
      assert.equal(am[i], want.argmax, `S=${S} row ${i}: argmax`);
      assert.equal(tl[i], -1);
    }
    process.stderr.write(`[sparse-rows-emulated] S=${S}: ${n} rows equal the float64 draws\n`);
  }
});

/** runSample against the float64 draws, several S. */
function checkSample(tag: string, z: Float32Array, u: Float32Array, rows: number, V: number, LD: number, T: number): void {
  for (const [S, { ids, am }] of runSample(z, u, rows, V, LD, T, [1, 5, 64, 256])) {
    for (let i = 0; i < rows; i++) {
      const want = sparseRow(z, i * LD, V, T, { kind: 'sample', n: S }, () => u[i]!);
      const got = [...ids.subarray(i * S, i * S + S)];
      assert.deepEqual(got.filter((x) => x >= 0), want.ids, `${tag} S=${S} row ${i}: ids`);
      assert.ok(got.slice(want.ids.length).every((x) => x === -1), `${tag} S=${S} row ${i}: unused slots are -1`);
      assert.equal(am[i], want.argmax, `${tag} S=${S} row ${i}: argmax`);
    }
  }
  process.stderr.write(`[sparse-rows-emulated] ${tag}: V=${V} LD=${LD} (block 128): the float64 draws\n`);
}

test('emulated CUDA: sample_rows over a vocabulary smaller than the block (threads without tokens, one token holding everything)', { skip, timeout: 300_000 }, () => {
  const rows = 6, V2 = 40, r = rng(5);
  const z = new Float32Array(rows * V2);
  for (let i = 0; i < z.length; i++) z[i] = (r() - 0.5) * 6;
  z[3 * V2 + 39] = 25; // the mass on the last token
  z.fill(1, 4 * V2, 5 * V2); // flat
  const u = Float32Array.from({ length: rows }, (_, i) => (i === 5 ? 0.99999994 : r()));
  checkSample('small vocabulary', z, u, rows, V2, V2, 0.7);
});

test('emulated CUDA: sample_rows over rows that are not 16-byte aligned (odd row stride and width: the one-token loads)', { skip, timeout: 300_000 }, () => {
  const rows = 5, V2 = 701, LD2 = 703, r = rng(9);
  const z = new Float32Array(rows * LD2);
  for (let i = 0; i < z.length; i++) z[i] = (r() - 0.5) * 8;
  z[1 * LD2 + 700] = 30; // the mass on the last token of a row
  z.fill(0.5, 2 * LD2, 3 * LD2); // flat
  const u = Float32Array.from({ length: rows }, () => r());
  checkSample('unaligned rows', z, u, rows, V2, LD2, 1.3);
});

test('emulated CUDA: sample_rows lands every draw when a chunk of the vocabulary is so far below the maximum that its float32 terms are zero (its double mass is not), at u = 0 and at u rounded up to 1', { skip, timeout: 300_000 }, () => {
  // (a second pair of eyes found these: a chunk 150 below the maximum at T = 1 owned the first or the last point while
  // its walk saw no mass, and the draw was lost: no id at all for S = 1)
  const V2 = 40, rows = 2, z = new Float32Array(rows * V2);
  z.fill(-150, 0, 4); // row 0: tokens 0-3 (one 4-token chunk at block 128) far below the flat rest
  z.fill(-150, V2 + 36, 2 * V2); // row 1: tokens 36-39
  const u = Float32Array.from([0, 1]);
  const massive = (row: number, j: number): boolean => Math.fround(Math.exp(z[row * V2 + j]!)) > 0;
  for (const [S, { ids }] of runSample(z, u, rows, V2, V2, 1, [1, 4])) {
    for (let i = 0; i < rows; i++) {
      const got = [...ids.subarray(i * S, i * S + S)];
      // 36 tokens of equal mass, S points spaced 36/S tokens apart: S distinct ids, each on a token with float32 mass
      assert.equal(new Set(got.filter((x) => x >= 0)).size, S, `S=${S} row ${i}: ${S} draws, got ${got}`);
      assert.ok(got.every((x) => x >= 0 && massive(i, x)), `S=${S} row ${i}: every draw on a token with mass, got ${got}`);
    }
  }
});

test('emulated CUDA: sample_rows with tiles of the vocabulary that have no float32 mass between, before and after those that have (their points go to the last tile with mass before them)', { skip, timeout: 300_000 }, () => {
  // 512-token tiles (SAMPLE_TILE): V = 2900 is 5 full tiles and a partial one
  const V2 = 2900, rows = 4, r = rng(31), z = new Float32Array(rows * V2);
  for (let i = 0; i < z.length; i++) z[i] = (r() - 0.5) * 6;
  const far = (row: number, t0: number, t1: number): void => { z.fill(-300, row * V2 + t0 * 512, row * V2 + Math.min(V2, t1 * 512)); };
  far(0, 0, 1); far(0, 2, 3); // massless tiles first and in the middle
  far(1, 4, 6); // the last tiles massless: points rounded past the total go to tile 3
  far(2, 0, 3); far(2, 4, 6); // one tile with mass, in the middle
  far(3, 1, 5); z[3 * V2 + 2899] = 2; // the first tile and the partial last one
  checkSample('massless tiles', z, Float32Array.from({ length: rows }, () => r()), rows, V2, V2, 1);
  // at the ends of [0, 1) (where float64 lands a draw on a token of float32 mass zero: the reference is not compared)
  const ends = Float32Array.from({ length: rows }, (_, i) => (i % 2 === 0 ? 0 : 0.99999994));
  for (const [S, { ids }] of runSample(z, ends, rows, V2, V2, 1, [1, 64])) {
    for (let i = 0; i < rows; i++) {
      const got = [...ids.subarray(i * S, i * S + S)].filter((x) => x >= 0);
      assert.ok(got.length > 0 && got.every((x) => z[i * V2 + x]! > -300), `S=${S} row ${i}: every draw on a token with mass`);
    }
  }
});

test('emulated CUDA: sample_rows walks a tile with the terms that gave the tile its mass (a draw in the last 1e-6 of a tile lands on the token float64 gives, not on the tile\'s last token with mass)', { skip, timeout: 300_000 }, () => {
  // (a review found it: the walk summed e^{(z - M)/T} in float32 while the tile's mass was phase 1's e^{(z - m)/T}
  // times e^{(m - M)/T}; with z - M rounded in float32 the walk's terms fall short, and a point in the gap went to the
  // tile's last token with mass, here token 511 at log q near -96, where float64 gives token 510)
  const V2 = 1024, M = 16, z = new Float32Array(V2).fill(-200), r = rng(41);
  z[600] = M; // tile 1: one token
  const ulp = 2 ** -19; // float32's spacing of z - M near -16.5
  for (let j = 0; j < 511; j++) {
    // tile 0: z - M in float32 rounds away from zero by about 0.44 of its spacing, every term of the old walk too small
    z[j] = -(0.5 + (Math.floor(r() * 2 ** 18) + 0.5625) * ulp);
    assert.ok(Math.fround(z[j]! - M) < z[j]! - M - 0.4 * ulp, 'the construction rounds z - M down');
  }
  z[511] = -80; // the tile's last token: next to no mass
  const f = Math.fround, m0 = Math.max(...z.subarray(0, 512));
  let own = 0, walk = 0;
  for (let j = 0; j < 512; j++) { own += f(Math.exp(f(z[j]! - m0))); walk += f(Math.exp(f(z[j]! - M))); }
  const tile0 = own * Math.exp(m0 - M), total = tile0 + 1;
  const u = Math.fround((tile0 * (1 - 4e-7)) / total), p = u * total;
  assert.ok(p > walk * (1 + 1e-7) && p < tile0 * (1 - 1e-7), `the point ${p} lies between the old walk's sum ${walk} and the tile's mass ${tile0}`);
  const want = sparseRow(z, 0, V2, 1, { kind: 'sample', n: 1 }, () => u);
  assert.deepEqual(want.ids, [510], 'float64 draws token 510');
  const { ids, lq } = runSample(z, Float32Array.from([u]), 1, V2, V2, 1, [1]).get(1)!;
  assert.equal(ids[0], 510, `the draw: ${ids[0]}`);
  assert.ok(Math.abs(lq[0]! - want.logq[0]!) <= 1e-6 * Math.max(1, Math.abs(want.logq[0]!)), `log q ${lq[0]} vs ${want.logq[0]}`);
});

test('emulated CUDA: log q at large logits and a low temperature keeps float32 precision ((z - M)/T - log sum in double)', { skip, timeout: 300_000 }, () => {
  // (z/T - (M/T + log sum) in float32 was off by about 6e-5 at logits near 300, T = 0.25)
  const V2 = 300, rows = 2, r = rng(8), z = new Float32Array(rows * V2);
  for (let i = 0; i < z.length; i++) z[i] = 300 + (r() - 0.5) * 4;
  const u = Float32Array.from({ length: rows }, () => r());
  for (const [S, { ids, lq }] of runSample(z, u, rows, V2, V2, 0.25, [16])) {
    for (let i = 0; i < rows; i++) {
      const want = sparseRow(z, i * V2, V2, 0.25, { kind: 'sample', n: S }, () => u[i]!);
      assert.deepEqual([...ids.subarray(i * S, i * S + want.ids.length)], want.ids, `row ${i}: ids`);
      // float32's own rounding of the result, a few ulps: |log q| is at most about 16 here
      want.logq.forEach((l, k) => assert.ok(Math.abs(lq[i * S + k]! - l) <= 4e-6, `row ${i}: log q ${lq[i * S + k]} vs ${l}`));
    }
  }
});

test('emulated CUDA: a NaN logit anywhere in a row (also before its chunk\'s first finite one) leaves every slot of the row -1; a row of -inf too, its argmax 0', { skip, timeout: 300_000 }, () => {
  const V2 = 40, rows = 4, r = rng(12), z = new Float32Array(rows * V2);
  for (let i = 0; i < z.length; i++) z[i] = (r() - 0.5) * 4;
  z[8] = Number.NaN; // row 0: the first token of a chunk
  z[V2 + 13] = Number.NaN; // row 1: inside a chunk
  z.fill(-Infinity, 2 * V2 + 20, 2 * V2 + 23); z[2 * V2 + 23] = Number.NaN; // row 2: after -inf tokens of its chunk
  z.fill(-Infinity, 3 * V2, 4 * V2); // row 3: no finite logit (no draw; the argmax is 0, as in float64)
  const u = Float32Array.from({ length: rows }, () => r());
  for (const [S, { ids, am }] of runSample(z, u, rows, V2, V2, 1, [1, 64])) {
    for (let i = 0; i < rows; i++) assert.ok([...ids.subarray(i * S, i * S + S)].every((x) => x === -1), `S=${S} row ${i}: all -1`);
    assert.equal(am[3], sparseRow(z, 3 * V2, V2, 1, { kind: 'sample', n: S }, () => u[3]!).argmax, `S=${S}: the argmax of a row without a finite logit`);
  }
});

test('emulated CUDA: sample_rows at Qwen\'s vocabulary (151936 tokens, block 512): the draws of the float64 reference, tiny tokens included', { skip, timeout: 600_000 }, () => {
  const V2 = 151936, rows = 8, S = 128, r = rng(77);
  const z = new Float32Array(rows * V2);
  // normal-ish logits (sum of uniforms) with a peak: most of the vocabulary sits far below half an ulp of the running sum
  for (let i = 0; i < z.length; i++) z[i] = ((r() + r() + r() + r() - 2) * 3.5);
  z[12345] = 30; z[V2 + 99] = 25; z[2 * V2 + V2 - 1] = 28; z[5 * V2 + 7] = 12;
  const u = Float32Array.from({ length: rows }, () => r());
  writeFileSync(join(workDir(), 'zq'), z); writeFileSync(join(workDir(), 'uq'), u);
  const exe = build(sampleRowsKernel.make({ block: 512 }), `int main() { const char* d = "${workDir()}";
  auto z = readf<float>(d, "zq", ${rows * V2}); auto u = readf<float>(d, "uq", ${rows});
  std::vector<int> ids(${rows * S}), am(${rows}); std::vector<float> lq(${rows * S}), tl(${rows});
  launch({${rows}, 1, 1}, 512, 0, [&] { sample_rows(z.data(), u.data(), ids.data(), lq.data(), tl.data(), am.data(), ${rows}, ${V2}, ${V2}, ${S}, 1.0f); });
  writef(d, "idsq", ids); }`);
  execFileSync(exe);
  const b = readFileSync(join(workDir(), 'idsq')), ids = new Int32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
  for (let i = 0; i < rows; i++) {
    const want = sparseRow(z, i * V2, V2, 1, { kind: 'sample', n: S }, () => u[i]!);
    assert.deepEqual([...ids.subarray(i * S, i * S + S)].filter((x) => x >= 0), want.ids, `row ${i}`);
  }
  process.stderr.write(`[sparse-rows-emulated] V=${V2}: ${rows} rows of ${S} draws equal the float64 draws\n`);
});

/** Runs top_rows on the emulator over rows [n, LD] of z for each S; compares every row with the float64 reference. */
function checkTop(tag: string, z: Float32Array, rows: number, V: number, LD: number, T: number, block: number, slots: number[]): void {
  writeFileSync(join(workDir(), `zt-${tag}`), z);
  const exe = build(topRowsKernel.make({ block }), `int main(int argc, char** argv) { const char* d = "${workDir()}";
  const int S = atoi(argv[1]);
  auto z = readf<float>(d, "zt-${tag}", ${rows * LD});
  std::vector<int> ids(${rows} * S), am(${rows}); std::vector<float> lq(${rows} * S), tl(${rows});
  launch({${rows}, 1, 1}, ${block}, 0, [&] { top_rows(z.data(), ids.data(), lq.data(), tl.data(), am.data(), ${rows}, ${V}, ${LD}, S, ${T.toFixed(6)}f); });
  writef(d, "tids", ids); writef(d, "tlq", lq); writef(d, "ttl", tl); writef(d, "tam", am); }`);
  for (const S of slots) {
    execFileSync(exe, [String(S)]);
    const { ids, lq, tl, am } = readRows('t');
    for (let i = 0; i < rows; i++) {
      const want = sparseRow(z, i * LD, V, T, { kind: 'top', k: S }, null);
      const got = [...ids.subarray(i * S, i * S + S)];
      assert.deepEqual(got.slice(0, want.ids.length), want.ids, `${tag} S=${S} row ${i}: ids`);
      assert.ok(got.slice(want.ids.length).every((x) => x === -1), `${tag} S=${S} row ${i}: unused slots are -1`);
      want.logq.forEach((l, k) => assert.ok(Math.abs(lq[i * S + k]! - l) <= 1e-6 * Math.max(1, Math.abs(l)), `${tag} S=${S} row ${i}: log q ${lq[i * S + k]} vs ${l}`));
      assert.ok(want.tail === -1 ? tl[i] === -1 : Math.abs(tl[i]! - want.tail) <= 1e-6 * want.tail + 1e-12, `${tag} S=${S} row ${i}: tail ${tl[i]} vs ${want.tail}`);
      assert.equal(am[i], want.argmax, `${tag} S=${S} row ${i}: argmax`);
    }
    process.stderr.write(`[sparse-rows-emulated] top_rows ${tag} S=${S}: ${rows} rows equal the float64 top-K\n`);
  }
}

test('emulated CUDA: top_rows equals the float64 top-K (ids in order, ties by id, log q, tail, argmax)', { skip, timeout: 300_000 }, () => {
  const r = rng(33);
  const z = new Float32Array(n * LD);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < LD; j++) z[i * LD + j] = (r() - 0.5) * (i === 1 ? 30 : 8);
    if (i === 2) z[i * LD + 345] = 40; // one token takes nearly all the mass
    if (i === 3) z.fill(0.25, i * LD, i * LD + LD); // flat: every token ties, the K lowest ids win
    if (i === 4) for (let j = 0; j < LD; j++) z[i * LD + j] = Math.round(z[i * LD + j]! * 2) / 2; // many ties at every K
    if (i === 5) for (let j = 0; j < LD; j++) z[i * LD + j] = -Math.abs(z[i * LD + j]!) - 50; // all negative
    if (i === 6) { z[i * LD + 699] = 30; z[i * LD + 0] = 30; } // a tie at the top: the argmax and the first id are 0
  }
  checkTop('small', z, n, V, LD, T, BLOCK, [1, 7, 32, 256]);
  // K = the vocabulary: every token, no tail
  const V3 = 200, z3 = z.subarray(0, 4 * V3);
  checkTop('whole', Float32Array.from(z3), 4, V3, V3, 1, 64, [200, 256]);
});

test('emulated CUDA: top_rows gives argmax 0 for a row without a finite logit, as float64', { skip, timeout: 300_000 }, () => {
  const V2 = 300, rows = 2, z = new Float32Array(rows * V2).fill(-Infinity);
  z[V2 + 7] = 1; // row 1: one finite logit
  writeFileSync(join(workDir(), 'zt-inf'), z);
  const exe = build(topRowsKernel.make({ block: 128 }), `int main() { const char* d = "${workDir()}";
  auto z = readf<float>(d, "zt-inf", ${rows * V2});
  std::vector<int> ids(${rows * 4}), am(${rows}); std::vector<float> lq(${rows * 4}), tl(${rows});
  launch({${rows}, 1, 1}, 128, 0, [&] { top_rows(z.data(), ids.data(), lq.data(), tl.data(), am.data(), ${rows}, ${V2}, ${V2}, 4, 1.0f); });
  writef(d, "tam", am); }`);
  execFileSync(exe);
  const b = readFileSync(join(workDir(), 'tam')), am = new Int32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
  for (let i = 0; i < rows; i++) assert.equal(am[i], sparseRow(z, i * V2, V2, 1, { kind: 'top', k: 4 }, null).argmax, `row ${i}: argmax`);
});

test('emulated CUDA: top_rows at Qwen\'s vocabulary (151936 tokens, block 512) equals the float64 top-K', { skip, timeout: 600_000 }, () => {
  const V2 = 151936, rows = 4, r = rng(78);
  const z = new Float32Array(rows * V2);
  for (let i = 0; i < z.length; i++) z[i] = ((r() + r() + r() + r() - 2) * 3.5);
  for (let i = 0; i < V2; i += 3) z[3 * V2 + i] = Math.round(z[3 * V2 + i]! * 8) / 8; // ties in row 3
  z[12345] = 30; z[V2 + 99] = 25;
  checkTop('qwen', z, rows, V2, V2, 2, 512, [64]);
});

test('emulated CUDA: sample_rows clean up', { skip }, () => { cleanUp(); });
