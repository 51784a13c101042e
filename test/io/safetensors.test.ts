/**
 * safetensors: f32 round trip bit-exact, bf16 against an independent nearest-even reference, f16 read of a file built
 * by hand with an independent half-float encoder, and every kind of corrupt file giving a DistilleryError.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import fsCjs from 'node:fs';
import { syncBuiltinESMExports } from 'node:module';
import * as os from 'node:os';
import * as path from 'node:path';
import { BF16_WRITE_CHUNK, f32ToBf16Bits, lazySafetensors, readSafetensors, readSafetensorsHeader, writeSafetensors } from '../../src/io/safetensors.js';
import { packBf16 } from '../../src/backend/bf16.js';
import { DistilleryError } from '../../src/util/errors.js';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-st-'));
process.on('exit', () => fs.rmSync(tmp, { recursive: true, force: true }));

function bits(a: Float32Array): Uint32Array {
  return new Uint32Array(a.buffer, a.byteOffset, a.length);
}

/** Builds a safetensors file byte by byte (independent of the writer). */
function rawFile(header: object, data: Uint8Array, pad = true): Buffer {
  let h = JSON.stringify(header);
  if (pad) while ((8 + h.length) % 8) h += ' ';
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(Buffer.byteLength(h)));
  return Buffer.concat([len, Buffer.from(h), data]);
}

function expectCorrupt(file: string, re: RegExp): void {
  assert.throws(() => readSafetensors(file), (e: unknown) => {
    assert.ok(e instanceof DistilleryError, `expected DistilleryError, got ${String(e)}`);
    assert.ok(e.message.includes(file), `message names the file: ${e.message}`);
    assert.match(e.message, re);
    return true;
  });
}

test('f32 round trip is bit-exact (incl. -0, subnormals, inf, NaN payloads) and keeps metadata', () => {
  const a = new Float32Array([0, -0, 1, -1.5, 3.4028234663852886e38, 1.401298464324817e-45, Infinity, -Infinity, Math.PI]);
  const withNaN = new Float32Array(4);
  bits(withNaN).set([0x7fc00001, 0xffc12345, 0x3f800000, 0x00000001]);
  const big = new Float32Array(1000).map((_, i) => Math.sin(i) * 1e3);
  const f = path.join(tmp, 'a.safetensors');
  writeSafetensors(f, new Map([['a', { shape: [3, 3], data: a }], ['nan', { shape: [4], data: withNaN }], ['big', { shape: [10, 10, 10], data: big }],
    ['empty', { shape: [0, 4], data: new Float32Array(0) }]]), { metadata: { format: 'pt', note: 'hé' } });
  const r = readSafetensors(f);
  assert.deepEqual(r.metadata, { format: 'pt', note: 'hé' });
  assert.deepEqual([...r.tensors.keys()].sort(), ['a', 'big', 'empty', 'nan']);
  assert.deepEqual(r.tensors.get('a')!.shape, [3, 3]);
  assert.equal(r.tensors.get('a')!.dtype, 'F32');
  assert.deepEqual(bits(r.tensors.get('a')!.data), bits(a));
  assert.deepEqual(bits(r.tensors.get('nan')!.data), bits(withNaN));
  assert.deepEqual(bits(r.tensors.get('big')!.data), bits(big));
  assert.equal(r.tensors.get('empty')!.data.length, 0);
  // Header is padded so the data starts 8-byte aligned, as the reference writer does.
  const h = readSafetensorsHeader(f);
  assert.equal(h.dataStart % 8, 0);
  // No temp files left beside it.
  assert.deepEqual(fs.readdirSync(tmp).filter((n) => n.includes('.tmp-')), []);
});

/** Independent bf16 reference: the nearer of the two bf16 neighbours, ties to the even mantissa. */
function refBf16(x: number): number {
  const u = bits(new Float32Array([x]))[0]!;
  const lo = u >>> 16, hi = lo + 1;
  const val = (h: number): number => new Float32Array(new Uint32Array([(h << 16) >>> 0]).buffer)[0]!;
  const dlo = Math.abs(x - val(lo)), dhi = Math.abs(val(hi) - x);
  if ((u & 0xffff) === 0) return lo;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return lo % 2 === 0 ? lo : hi;
}

test('bf16 write rounds to nearest even and reads back', () => {
  const specials = [1, Math.PI, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 65504.5, 1e-40, -0, 0.1];
  const rand = Array.from({ length: 2000 }, (_, i) => Math.sin(i * 12.9898) * 10 ** ((i % 20) - 10));
  const data = new Float32Array([...specials, ...rand]);
  const f = path.join(tmp, 'b.safetensors');
  writeSafetensors(f, { w: { shape: [data.length], data } }, { dtype: 'bf16' });
  const raw = fs.readFileSync(f);
  const n = Number(raw.readBigUInt64LE(0));
  assert.equal(JSON.parse(raw.subarray(8, 8 + n).toString()).w.dtype, 'BF16');
  const stored = new Uint16Array(raw.buffer.slice(raw.byteOffset + 8 + n, raw.byteOffset + raw.length));
  assert.equal(stored[0], 0x3f80);
  assert.equal(stored[1], 0x4049);
  assert.equal(stored[2], 0x3f80, '1 + 2^-8 is a tie: rounds to the even 1.0');
  assert.equal(stored[3], 0x3f82, '1 + 3*2^-8 is a tie: rounds to the even 1 + 2^-6');
  assert.equal(stored[4], 0xbf80);
  for (let i = 0; i < data.length; i++) assert.equal(stored[i], refBf16(data[i]!), `value ${data[i]}`);
  const back = readSafetensors(f).tensors.get('w')!;
  assert.equal(back.dtype, 'BF16');
  for (let i = 0; i < data.length; i++) {
    assert.equal(back.data[i], new Float32Array(new Uint32Array([(stored[i]! << 16) >>> 0]).buffer)[0]);
    const x = data[i]!;
    if (Math.abs(x) >= 2 ** -126) assert.ok(Math.abs(back.data[i]! - x) <= Math.abs(x) * 2 ** -8, `relative error of ${x}`);
  }
  // NaN stays NaN.
  writeSafetensors(f, { w: { shape: [1], data: new Float32Array([NaN]) } }, { dtype: 'bf16' });
  assert.ok(Number.isNaN(readSafetensors(f).tensors.get('w')!.data[0]));
});

/** Independent float → IEEE half encoder (exact values only: the test uses representable numbers). */
function toHalf(x: number): number {
  if (Number.isNaN(x)) return 0x7e00;
  const sign = x < 0 || Object.is(x, -0) ? 0x8000 : 0;
  const a = Math.abs(x);
  if (a === Infinity) return sign | 0x7c00;
  if (a === 0) return sign;
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e--;
  if (e < -14) return sign | Math.round(a / 2 ** -24);
  const m = Math.round((a / 2 ** e - 1) * 1024);
  return sign | ((e + 15) << 10) | m;
}

test('f16 files are read exactly', () => {
  const vals = [0, -0, 1, -2, 0.5, 65504, 6.103515625e-5, 5.960464477539063e-8, 0.333251953125, -1234, 1234.5 - 0.5, Infinity, -Infinity, NaN];
  const u16 = new Uint16Array(vals.map(toHalf));
  assert.equal(u16[2], 0x3c00); // sanity check of the encoder
  assert.equal(u16[5], 0x7bff);
  const f = path.join(tmp, 'h.safetensors');
  fs.writeFileSync(f, rawFile({ h: { dtype: 'F16', shape: [vals.length], data_offsets: [0, vals.length * 2] } }, new Uint8Array(u16.buffer)));
  const t = readSafetensors(f).tensors.get('h')!;
  assert.equal(t.dtype, 'F16');
  vals.forEach((v, i) => {
    if (Number.isNaN(v)) assert.ok(Number.isNaN(t.data[i]));
    else assert.ok(Object.is(t.data[i], v), `${t.data[i]} vs ${v}`);
  });
});

test('corrupt, truncated and inconsistent files throw DistilleryError naming the file', () => {
  const f = path.join(tmp, 'c.safetensors');
  const good = () => rawFile({ a: { dtype: 'F32', shape: [2], data_offsets: [0, 8] }, b: { dtype: 'F32', shape: [1], data_offsets: [8, 12] } }, new Uint8Array(12));
  fs.writeFileSync(f, good());
  assert.equal(readSafetensors(f).tensors.size, 2);

  fs.writeFileSync(f, Buffer.alloc(5));
  expectCorrupt(f, /shorter than/);
  const g = good();
  fs.writeFileSync(f, g.subarray(0, g.length - 3));
  expectCorrupt(f, /truncated|trailing|ends at/);
  fs.writeFileSync(f, g.subarray(0, 20));
  expectCorrupt(f, /header length/);
  const huge = Buffer.from(g); huge.writeBigUInt64LE(1n << 60n);
  fs.writeFileSync(f, huge);
  expectCorrupt(f, /exceeds the file size/);
  const badJson = Buffer.from(g); badJson[9] = 0x7b; badJson[10] = 0x7b;
  fs.writeFileSync(f, badJson);
  expectCorrupt(f, /JSON/);
  fs.writeFileSync(f, rawFile({ a: { dtype: 'F32', shape: [2], data_offsets: [0, 8] }, b: { dtype: 'F32', shape: [2], data_offsets: [4, 12] } }, new Uint8Array(12)));
  expectCorrupt(f, /overlaps/);
  fs.writeFileSync(f, rawFile({ a: { dtype: 'F32', shape: [1], data_offsets: [0, 4] }, b: { dtype: 'F32', shape: [1], data_offsets: [8, 12] } }, new Uint8Array(12)));
  expectCorrupt(f, /gap/);
  fs.writeFileSync(f, rawFile({ a: { dtype: 'F32', shape: [3], data_offsets: [0, 8] } }, new Uint8Array(8)));
  expectCorrupt(f, /shape \[3\]/);
  fs.writeFileSync(f, rawFile({ a: { dtype: 'F32', shape: [-1], data_offsets: [0, 8] } }, new Uint8Array(8)));
  expectCorrupt(f, /invalid shape/);
  fs.writeFileSync(f, rawFile({ a: { dtype: 'Q4', shape: [2], data_offsets: [0, 8] } }, new Uint8Array(8)));
  expectCorrupt(f, /unknown dtype/);
  fs.writeFileSync(f, rawFile({ a: { dtype: 'F32', shape: [2], data_offsets: [8, 0] } }, new Uint8Array(8)));
  expectCorrupt(f, /begin > end/);
  fs.writeFileSync(f, rawFile([1, 2], new Uint8Array(0)));
  expectCorrupt(f, /not a JSON object/);
  // a header that is not valid UTF-8 (a tensor name with a lone 0xff byte): refused, not read as U+FFFD
  const name = Buffer.from(good()); const at = name.indexOf(Buffer.from('"a"')); name[at + 1] = 0xff;
  fs.writeFileSync(f, name);
  expectCorrupt(f, /not valid UTF-8/);
  // A valid file with an unsupported dtype: a clear refusal, not garbage.
  fs.writeFileSync(f, rawFile({ i: { dtype: 'I64', shape: [1], data_offsets: [0, 8] } }, new Uint8Array(8)));
  assert.throws(() => readSafetensors(f), (e: unknown) => e instanceof DistilleryError && /I64/.test(e.message) && e.message.includes(f));
  assert.throws(() => readSafetensors(path.join(tmp, 'missing.safetensors')), DistilleryError);
});

test('writer rejects a shape that does not match the data', () => {
  assert.throws(() => writeSafetensors(path.join(tmp, 'x.safetensors'), { a: { shape: [2, 2], data: new Float32Array(3) } }),
    (e: unknown) => e instanceof DistilleryError && /shape \[2, 2\]/.test(e.message));
  assert.equal(fs.existsSync(path.join(tmp, 'x.safetensors')), false);
});

test('a bf16 write converts in chunks: a tensor past BF16_WRITE_CHUNK (and an empty one) reads back as the whole conversion', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-st-chunk-'));
  try {
    const n = BF16_WRITE_CHUNK * 2 + 12345, a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = Math.sin(i * 0.001) * (1 + (i % 7)) + (i % 1000 === 0 ? NaN : 0);
    const f = path.join(dir, 'big.safetensors');
    // count the write calls: an empty or small first tensor must not shrink the conversion chunk of the later ones
    let writes = 0;
    const orig = fsCjs.writeSync;
    fsCjs.writeSync = ((...args: Parameters<typeof fsCjs.writeSync>) => { writes++; return orig(...args); }) as typeof fsCjs.writeSync;
    syncBuiltinESMExports();
    try {
      writeSafetensors(f, new Map([['empty', { shape: [0], data: new Float32Array(0) }], ['small', { shape: [3], data: new Float32Array([1, 2, 3]) }],
        ['a', { shape: [n], data: a }]]), { dtype: 'bf16' });
    } finally { fsCjs.writeSync = orig; syncBuiltinESMExports(); }
    assert.ok(writes <= 8, `${writes} write calls for a header and ${n + 3} bf16 values in chunks of ${BF16_WRITE_CHUNK}`);
    const back = readSafetensors(f).tensors, want = f32ToBf16Bits(a);
    const got = back.get('a')!.data;
    assert.equal(got.length, n);
    for (const i of [0, 1, 999, 1000, BF16_WRITE_CHUNK - 1, BF16_WRITE_CHUNK, 2 * BF16_WRITE_CHUNK + 12344]) {
      const bits = new Uint32Array(new Float32Array([got[i]!]).buffer)[0]! >>> 16;
      assert.equal(bits, want[i], `element ${i}`);
    }
    let mismatches = 0;
    const g32 = new Uint32Array(got.buffer, got.byteOffset, got.length);
    for (let i = 0; i < n; i++) if (g32[i]! >>> 16 !== want[i]) mismatches++;
    assert.equal(mismatches, 0);
    assert.equal(back.get('empty')!.data.length, 0);
  } finally { fs.rmSync(dir, { recursive: true, force: true }); }
});

test('a lazy tensor reads into a given array (readInto) and as bf16 bits (readBf16): a BF16 tensor\'s own bytes, F32 and F16 values rounded as packBf16 rounds them', () => {
  const vals = [0, -0, 1, -2, 0.5, 65504, 6.103515625e-5, 0.333251953125, -1234, 1.00390625, 3.0000001];
  const f = path.join(tmp, 'lazy.safetensors');
  const f32 = new Float32Array(vals), h16 = new Uint16Array(vals.slice(0, -1).map(toHalf)); // F32 values bf16 rounds (1 + 2^-8 ties to even, 3.0000001 down); F16 ones it holds exactly
  const b16 = f32ToBf16Bits(Float32Array.from([1.5, -3.25, 1e-3, 7, -0, 65504]));
  const bytes = new Uint8Array(f32.byteLength + h16.byteLength + b16.byteLength);
  bytes.set(new Uint8Array(f32.buffer), 0);
  bytes.set(new Uint8Array(h16.buffer), f32.byteLength);
  const bAt = f32.byteLength + h16.byteLength;
  bytes.set(new Uint8Array(b16.buffer), bAt);
  fs.writeFileSync(f, rawFile({
    a: { dtype: 'F32', shape: [vals.length], data_offsets: [0, f32.byteLength] },
    h: { dtype: 'F16', shape: [vals.length - 1], data_offsets: [f32.byteLength, f32.byteLength + h16.byteLength] },
    b: { dtype: 'BF16', shape: [2, 3], data_offsets: [bAt, bAt + b16.byteLength] },
  }, bytes));
  const { tensors } = lazySafetensors(f);
  for (const name of ['a', 'h', 'b']) {
    const t = tensors.get(name)!, v = t.read();
    const into = new Float32Array(v.length + 3);
    t.readInto(into.subarray(2, 2 + v.length));
    assert.deepEqual(into.subarray(2, 2 + v.length), v, `${name}: readInto`);
    assert.deepEqual([into[0], into[1], into[into.length - 1]], [0, 0, 0], `${name}: nothing written outside`);
    assert.deepEqual(t.readBf16(), packBf16(v), `${name}: bits`);
    assert.throws(() => t.readInto(new Float32Array(v.length + 1)), /read into/);
  }
  assert.deepEqual(tensors.get('b')!.readBf16(), b16, 'a BF16 tensor: its own bits');
});

test('a lazy tensor refuses to read a file replaced or written to since its header was read, naming it (a model hashed then uploaded is read twice)', () => {
  const f = path.join(tmp, 'changing.safetensors');
  const one = new Float32Array([1, 2, 3, 4]), two = new Float32Array([5, 6, 7, 8]);
  writeSafetensors(f, { w: { shape: [4], data: one } });
  const lazy = lazySafetensors(f).tensors.get('w')!;
  assert.deepEqual([...lazy.read()], [...one]);
  assert.deepEqual([...lazy.read()], [...one], 'an unchanged file reads again');
  // replaced by an atomic rewrite of the same size (a new inode): the old header's offsets would read the new values
  writeSafetensors(f, { w: { shape: [4], data: two } });
  assert.throws(() => lazy.read(), (e: unknown) => e instanceof DistilleryError && e.message.includes(f) && /changed while/.test(e.message));
  assert.throws(() => lazy.readBf16(), /changed while/);
  // written to in place (same inode, another modification time)
  const again = lazySafetensors(f).tensors.get('w')!;
  assert.deepEqual([...again.read()], [...two]);
  const bytes = fs.readFileSync(f);
  fs.writeFileSync(f, bytes);
  const later = new Date(Date.now() + 10_000);
  fs.utimesSync(f, later, later);
  assert.throws(() => again.readInto(new Float32Array(4)), /changed while/);
});
