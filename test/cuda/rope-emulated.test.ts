/**
 * No GPU (needs g++; skips without it; about a second): the RoPE kernels as CudaBackend launches them. A device-mode
 * CudaBackend over a fake driver records each rope launch (its generated source, grid, block and argument slots);
 * the GENERATED source is compiled for the host (the bf16 helpers' inline PTX replaced by host round-to-nearest-even)
 * and every (block, thread) of the recorded grid runs sequentially, then, where that grid has several blocks, again
 * with one block (the grid-stride loop). The result is compared with the CPU backend (the float64-angle reference, bf16 emulated) for every kind, odd
 * shapes (HD/2 odd, heads not a multiple of the kernel's head group), both dtypes, forward out of place (out filled
 * with NaN: a pair no thread covers stays NaN) and in place, and backward accumulating into nonzero dinp (a pair two
 * threads cover is added twice). Bounds: f32 outputs 1e-6 absolute (values of order 1: float32 rounding of c, s and
 * the rotation); bf16 outputs 1 bf16 ulp of the larger of the two plus 1e-6.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { packBf16, unpackBf16 } from '../../src/backend/bf16.js';
import type { Backend, Buf, DocPositions, DType } from '../../src/backend/backend.js';
import { docPositionsOf } from '../backend/reference.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { CudaBackend } from '../../src/backend/cuda/cuda-backend.js';
import { KernelCache } from '../../src/backend/cuda/kernel-cache.js';
import { dtypeHelpers } from '../../src/backend/cuda/kernels/spec.js';
import { plainRope, type RopeSpec } from '../../src/backend/rope.js';
import { FakeCompiler, fakeCublas, fakeDriver, rand, rng, scaledRopes } from './helpers.js';

function gxx(): boolean {
  try { execFileSync('g++', ['--version'], { stdio: 'ignore' }); return true; } catch { return false; }
}
const skip = gxx() ? false : 'g++ not found';

/** The host replacement of dtypeHelpers() (cvt.rn.bf16.f32 = round to nearest even, NaN kept quiet). */
const HOST_HELPERS = `
typedef unsigned short bf16;
inline float bf2f(bf16 h) { return __uint_as_float(((unsigned)h) << 16); }
inline bf16 f2bf(float f) {
  unsigned u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40);
  return (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float ldf(const float* p, long long i) { return p[i]; }
inline float ldf(const bf16* p, long long i) { return bf2f(p[i]); }
inline void stf(float* p, long long i, float v) { p[i] = v; }
inline void stf(bf16* p, long long i, float v) { p[i] = f2bf(v); }
`;

const PRELUDE = String.raw`#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
struct dim3e { unsigned x, y, z; };
dim3e threadIdx, blockIdx, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
template <class T> std::vector<T> readAll(const char* path) {
  FILE* f = fopen(path, "rb"); if (!f) { perror(path); exit(2); }
  fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
  std::vector<T> v(n / sizeof(T)); if (fread(v.data(), 1, n, f) != (size_t)n) exit(3); fclose(f); return v;
}
template <class O, class I> void run(void (*k)(O*, const I*, long long, int, int, int, long long, long long, const int*), char** a) {
  unsigned grid = atoi(a[2]), block = atoi(a[3]);
  long long rows = atoll(a[4]); int T = atoi(a[5]), heads = atoi(a[6]), pos0 = atoi(a[7]);
  long long so = atoll(a[10]), si = atoll(a[11]);
  std::vector<int> rowPos;  /* "-": none (null) */
  if (strcmp(a[12], "-") != 0) rowPos = readAll<int>(a[12]);
  const int* rp = rowPos.empty() ? nullptr : rowPos.data();
  std::vector<O> out = readAll<O>(a[8]);
  std::vector<I> inp;
  const I* ip = (const I*)out.data();  // "-": inp aliases out
  if (strcmp(a[9], "-") != 0) { inp = readAll<I>(a[9]); ip = inp.data(); }
  gridDim = { grid, 1, 1 };
  for (unsigned b = 0; b < grid; b++)
    for (unsigned t = 0; t < block; t++) { blockIdx = { b, 0, 0 }; threadIdx = { t, 0, 0 }; k(out.data(), ip, rows, T, heads, pos0, so, si, rp); }
  FILE* f = fopen(a[8], "wb"); fwrite(out.data(), sizeof(O), out.size(), f); fclose(f);
}
`;

/** One launch as the fake driver saw it. */
interface Launch { source: string; entry: string; grid: number[]; block: number; slots: Buffer }

/** A device-mode CudaBackend (fake driver and compiler) that records every launch with its generated source. */
function recordingBackend(): { be: CudaBackend; launches: Launch[] } {
  const sources = new Map<string, string>();
  class Recording extends FakeCompiler {
    override compileSync(source: string, name: string, options: readonly string[], label?: string): Uint8Array {
      const cubin = super.compileSync(source, name, options, label);
      sources.set(Buffer.from(cubin).toString('hex'), source);
      return cubin;
    }
  }
  const cache = new KernelCache({ compiler: new Recording(), arch: 'sm_90', dir: null, strict: false, log: () => {} });
  const driver = fakeDriver();
  const launches: Launch[] = [];
  driver.loadFunction = (c: Uint8Array, entry: string) => ({ module: {}, fn: { entry, source: sources.get(Buffer.from(c).toString('hex'))! } });
  const be = new CudaBackend('device', { driver, cublas: fakeCublas(), cache, log: () => {} });
  driver.launch = (fn: unknown, grid: readonly [number, number, number], block: number) => {
    const f = fn as { entry: string; source: string };
    // the argument slots (8 bytes each) the backend filled for this launch
    const slots = Buffer.from((be as unknown as { argSlots: Buffer }).argSlots);
    launches.push({ source: f.source, entry: f.entry, grid: [...grid], block, slots });
  };
  return { be, launches };
}

/** docs: the document lengths of every window (the rest of a window is the padding document): RoPE by DocPositions. */
interface Shape { B: number; T: number; H: number; hd: number; pos0: number; docs?: number[] }

type Op = 'fwd' | 'fwd-inplace' | 'bwd' | 'bwd-set';
interface Case { rope: RopeSpec; s: Shape; op: Op; out: DType; inp: DType; launch: Launch; outInit: Float32Array; inpInit: Float32Array; ref: ArrayLike<number> }


function apply(b: Backend, c: Omit<Case, 'launch' | 'ref'>): { out: Buf; inp: Buf } {
  const { B, T, H, hd, pos0 } = c.s;
  const n = B * T * H * hd;
  const out = b.alloc(n, 'out', c.out);
  b.upload(out, c.outInit);
  const inp = c.op === 'fwd-inplace' ? out : b.alloc(n, 'inp', c.inp);
  if (inp !== out) b.upload(inp, c.inpInit);
  let at: number | DocPositions = pos0;
  if (c.s.docs) {
    const docPositions = b.allocInt(B * T, 'positions');
    b.uploadInt(docPositions, docPositionsOf(c.s.B, c.s.T, [c.s.docs!]));
    at = { docPositions };
  }
  if (c.op === 'bwd' || c.op === 'bwd-set') b.ropeBackward(out, inp, B, T, H, hd, c.rope, at, c.op === 'bwd');
  else b.ropeForward(out, inp, B, T, H, hd, c.rope, at);
  return { out, inp };
}

const bf16Ulp = (x: number): number => (Math.abs(x) < 2 ** -126 ? 2 ** -133 : 2 ** (Math.floor(Math.log2(Math.abs(x))) - 7));

function writeOperand(path: string, a: Float32Array, dt: DType): void {
  writeFileSync(path, dt === 'bf16' ? packBf16(a) : a);
}
function readOperand(path: string, dt: DType): Float32Array {
  const b = readFileSync(path);
  const ab = b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
  return dt === 'bf16' ? unpackBf16(new Uint16Array(ab)) : new Float32Array(ab);
}

test('RoPE kernels (every kind, fwd/bwd, f32/bf16, odd shapes) run on a host emulator over the grid CudaBackend launches: they match the CPU backend', { skip, timeout: 120_000 }, () => {
  const ropes: RopeSpec[] = [plainRope(10000), ...scaledRopes(5e5)];
  const shapes: Shape[] = [
    { B: 3, T: 5, H: 5, hd: 6, pos0: 7 }, // HALF 3, heads = one group of 4 + 1
    { B: 2, T: 37, H: 8, hd: 34, pos0: 0 }, // HALF 17, two head groups, position 0 (identity) included
    { B: 1, T: 1, H: 1, hd: 2, pos0: 4095 }, // one token, one head, one pair (generation)
    { B: 1, T: 9, H: 3, hd: 64, pos0: 100 }, // a real head dim
    { B: 2, T: 13, H: 5, hd: 6, pos0: 0, docs: [4, 1, 6] }, // packed documents: each row at its position in its document
  ];
  const ops: Array<[Op, DType, DType]> = [['fwd', 'f32', 'f32'], ['fwd', 'bf16', 'f32'], ['fwd-inplace', 'bf16', 'bf16'], ['fwd-inplace', 'f32', 'f32'],
    ['bwd', 'bf16', 'bf16'], ['bwd', 'f32', 'bf16'], ['bwd-set', 'bf16', 'bf16'], ['bwd-set', 'f32', 'f32']];
  const { be, launches } = recordingBackend();
  const cpu = createCpuBackend({ dtype: 'f32', threads: 1 });
  const r = rng(20240607);
  const cases: Case[] = [];
  for (const rope of ropes) {
    for (const s of shapes) {
      for (const [op, out, inp] of ops) {
        const n = s.B * s.T * s.H * s.hd;
        // forward out of place: out starts as NaN, so that a pair no thread writes is caught
        // (and the overwriting backward: a read of the old value would show as NaN)
        const outInit = op === 'fwd' || op === 'bwd-set' ? new Float32Array(n).fill(NaN) : rand(r, n);
        const base = { rope, s, op, out, inp, outInit, inpInit: rand(r, n) };
        const before = launches.length;
        const dev = apply(be, base);
        assert.equal(launches.length, before + 1, 'one launch per rope op');
        const launch = launches[before]!;
        // the pointers passed are the operands' (an in-place forward passes one buffer twice)
        const ptr = (b: Buf): bigint => (b as unknown as { ptr: bigint }).ptr;
        assert.equal(launch.slots.readBigUInt64LE(0), ptr(dev.out));
        assert.equal(launch.slots.readBigUInt64LE(8), ptr(dev.inp));
        assert.equal(launch.slots.readBigUInt64LE(64) !== 0n, s.docs !== undefined, 'rowPos is passed exactly with documents');
        // no block without work: the launch is sized by rows·HALF, not by the element count
        const total = Number(launch.slots.readBigInt64LE(16)) * (s.hd / 2);
        assert.ok((launch.grid[0]! - 1) * launch.block < total, `grid ${launch.grid[0]} × ${launch.block} for ${total} (row, pair) items`);
        const c = apply(cpu, base);
        cases.push({ ...base, launch, ref: cpu.download(c.out) });
      }
    }
  }
  cpu.dispose();

  // every distinct generated source, each in its own namespace; main dispatches by index
  const kernels = [...new Set(cases.map((c) => c.launch.source))];
  let prog = PRELUDE;
  kernels.forEach((src, k) => {
    assert.ok(src.includes(dtypeHelpers()), 'the kernel embeds dtypeHelpers()');
    const host = src.replace(dtypeHelpers(), HOST_HELPERS).replace(/extern "C" /g, '');
    prog += `#undef BLOCK\n#undef HD\n#undef HALF\n#undef HU\n#undef ATTN\nnamespace k${k} {\n${host}\n}\n`;
  });
  const entryOf = (src: string): string => /__global__ void (\w+)\(/.exec(src)![1]!;
  prog += `int main(int argc, char** argv) {\n  (void)argc;\n  switch (atoi(argv[1])) {\n${kernels.map((src, k) => `    case ${k}: run(k${k}::${entryOf(src)}, argv); break;`).join('\n')}\n    default: return 4;\n  }\n  return 0;\n}\n`;
  const dir = mkdtempSync(join(tmpdir(), 'dk-rope-emu-'));
  try {
    writeFileSync(join(dir, 'emu.cpp'), prog);
    execFileSync('g++', ['-std=c++17', '-O0', '-o', join(dir, 'emu'), join(dir, 'emu.cpp')], { stdio: ['ignore', 'ignore', 'pipe'] });
    let runs = 0;
    for (const c of cases) {
      const { B, T, H, hd, pos0 } = c.s;
      const rows = Number(c.launch.slots.readBigInt64LE(16));
      const so = c.launch.slots.readBigInt64LE(48), si = c.launch.slots.readBigInt64LE(56);
      assert.deepEqual([rows, c.launch.slots.readInt32LE(24), c.launch.slots.readInt32LE(32), c.launch.slots.readInt32LE(40), Number(so), Number(si)],
        [B * T, T, H, pos0, H * hd, H * hd], 'arguments (rows of B·T, T, heads, pos0, the packed row strides)');
      for (const grid of new Set([c.launch.grid[0]!, 1])) {
        const outPath = join(dir, 'out.bin'), inpPath = join(dir, 'inp.bin');
        writeOperand(outPath, c.outInit, c.out);
        if (c.op !== 'fwd-inplace') writeOperand(inpPath, c.inpInit, c.inp);
        const posPath = join(dir, 'pos.bin');
        if (c.s.docs) writeFileSync(posPath, docPositionsOf(c.s.B, c.s.T, [c.s.docs!]));
        execFileSync(join(dir, 'emu'), [String(kernels.indexOf(c.launch.source)), String(grid), String(c.launch.block),
          String(rows), String(T), String(H), String(pos0), outPath, c.op === 'fwd-inplace' ? '-' : inpPath, String(so), String(si), c.s.docs ? posPath : '-']);
        const got = readOperand(outPath, c.out);
        const what = `${c.launch.entry} ${c.rope.type} ${c.op} out ${c.out} inp ${c.inp} B${B} T${T} H${H} hd${hd} pos0 ${pos0}${c.s.docs ? ` documents ${c.s.docs.join(',')}` : ''} grid ${grid}`;
        assert.equal(got.length, c.ref.length, what);
        for (let i = 0; i < got.length; i++) {
          const g = got[i]!, e = c.ref[i]!;
          const tol = c.out === 'bf16' ? bf16Ulp(Math.max(Math.abs(g), Math.abs(e))) + 1e-6 : 1e-6;
          if (!(Math.abs(g - e) <= tol)) assert.fail(`${what}: element ${i} = ${g}, CPU ${e} (tolerance ${tol})`);
        }
        runs++;
      }
    }
    assert.ok(runs > cases.length, 'some launches ran again on one block');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

/** The host program of rope_*kv_fwd launches: main(argv) runs kernel argv[1] over the files named after it. */
function kvProgram(kernels: string[], params: Array<{ seqPos: boolean; bias: string; out: string; inp: string }>): string {
  const ct = (d: string): string => (d === 'bf16' ? 'unsigned short' : 'float'); // bf16's typedef lives in each kernel's namespace
  let prog = PRELUDE;
  kernels.forEach((src, k) => {
    const host = src.replace(dtypeHelpers(), HOST_HELPERS).replace(/extern "C" /g, '');
    prog += `#undef BLOCK\n#undef HD\n#undef HALF\n#undef HU\n#undef ATTN\nnamespace k${k} {\n${host}\n}\n`;
  });
  const entryOf = (src: string): string => /__global__ void (\w+)\(/.exec(src)![1]!;
  const cases = kernels.map((src, k) => {
    const p = params[k]!, O = ct(p.out), I = ct(p.inp), B = ct(p.bias);
    return `    case ${k}: {
      std::vector<${O}> q = readAll<${O}>(a[4]), kc = readAll<${O}>(a[5]), vc = readAll<${O}>(a[6]);
      std::vector<${I}> qkv = readAll<${I}>(a[7]);
      ${p.seqPos ? 'std::vector<int> sp = readAll<int>(a[8]);' : ''}
      ${p.bias !== 'none' ? `std::vector<${B}> bias = readAll<${B}>(a[9]);` : ''}
      gridDim = { grid, 1, 1 };
      for (unsigned b = 0; b < grid; b++)
        for (unsigned t = 0; t < block; t++) {
          blockIdx = { b, 0, 0 }; threadIdx = { t, 0, 0 };
          k${k}::${entryOf(src)}(q.data(), kc.data(), vc.data(), qkv.data(), rows, T, nH, nKv, pos0, tMax${p.seqPos ? ', sp.data()' : ''}${p.bias !== 'none' ? ', bias.data()' : ''});
        }
      writeAll(a[4], q); writeAll(a[5], kc); writeAll(a[6], vc);
      break;
    }`;
  });
  return `${prog}
template <class T> void writeAll(const char* path, const std::vector<T>& v) { FILE* f = fopen(path, "wb"); fwrite(v.data(), sizeof(T), v.size(), f); fclose(f); }
int main(int argc, char** a) {
  (void)argc;
  unsigned grid = atoi(a[2]), block = atoi(a[3]);
  long long rows = atoll(a[10]); int T = atoi(a[11]), nH = atoi(a[12]), nKv = atoi(a[13]), pos0 = atoi(a[14]), tMax = atoi(a[15]);
  switch (atoi(a[1])) {
${cases.join('\n')}
    default: return 4;
  }
  return 0;
}
`;
}

test('the rotation-with-cache-write kernels (every kind, f32/bf16, biases, per-sequence positions) run on a host emulator over the grid CudaBackend launches: they equal the CPU backend', { skip, timeout: 120_000 }, () => {
  const ropes: RopeSpec[] = [plainRope(10000), ...scaledRopes(5e5)];
  interface KvShape { B: number; T: number; nH: number; nKv: number; hd: number; tMax: number; pos: number | number[] }
  const shapes: KvShape[] = [
    { B: 3, T: 1, nH: 5, nKv: 1, hd: 6, tMax: 7, pos: [0, 6, 2] }, // decode at per-sequence positions; HALF 3; heads = a group of 4 + 1
    { B: 2, T: 3, nH: 8, nKv: 4, hd: 64, tMax: 9, pos: 5 }, // a chunk at a scalar position, a real head dim
    { B: 1, T: 1, nH: 1, nKv: 1, hd: 2, tMax: 4096, pos: [4095] }, // one pair, the cache's last row
  ];
  const { be, launches } = recordingBackend();
  const cpu = createCpuBackend({ dtype: 'f32', threads: 1 });
  const r = rng(20261130);
  interface KvCase { what: string; dt: DType; launch: Launch; files: Array<[string, Float32Array | Int32Array, DType | 'int']>; ref: Float32Array[]; s: KvShape }
  const cases: KvCase[] = [];
  for (const rope of ropes) {
    for (const s of shapes) {
      for (const [dt, inDt, withBias] of [['f32', 'f32', true], ['bf16', 'bf16', true], ['bf16', 'bf16', false], ['bf16', 'f32', true]] as Array<[DType, DType, boolean]>) {
        const Q = s.nH * s.hd, KV = s.nKv * s.hd, W = Q + 2 * KV, N = s.B * s.T, C = s.B * s.tMax * KV;
        const init = { q: new Float32Array(N * Q).fill(NaN), kc: rand(r, C), vc: rand(r, C), qkv: rand(r, N * W), bias: rand(r, W) };
        const onto = (b: Backend): Float32Array[] => {
          const up = (x: Float32Array, d: DType, w: string): Buf => { const buf = b.alloc(x.length, w, d); b.upload(buf, x); return buf; };
          const q = up(init.q, dt, 'q'), kc = up(init.kc, dt, 'kc'), vc = up(init.vc, dt, 'vc'), qkv = up(init.qkv, inDt, 'qkv');
          const bias = withBias ? up(init.bias, inDt, 'bias') : null;
          let pos0: number | { seqPositions: ReturnType<Backend['allocInt']> } = typeof s.pos === 'number' ? s.pos : 0;
          if (typeof s.pos !== 'number') { const sp = b.allocInt(s.B, 'positions'); b.uploadInt(sp, Int32Array.from(s.pos)); pos0 = { seqPositions: sp }; }
          b.ropeKvCacheWrite(q, kc, vc, qkv, s.B, s.T, pos0, s.tMax, s.nH, s.nKv, s.hd, rope, bias);
          return [q, kc, vc].map((x) => Float32Array.from(b.download(x)));
        };
        const before = launches.length;
        onto(be);
        assert.equal(launches.length, before + 1, 'one launch per ropeKvCacheWrite');
        const ref = onto(cpu);
        const files: KvCase['files'] = [['q', init.q, dt], ['kc', init.kc, dt], ['vc', init.vc, dt], ['qkv', init.qkv, inDt],
          ['pos', Int32Array.from(typeof s.pos === 'number' ? [] : s.pos), 'int'], ['bias', init.bias, inDt]];
        cases.push({ what: `${rope.type} ${JSON.stringify(s)} ${dt} qkv ${inDt} bias ${withBias}`, dt, launch: launches[before]!, files, ref, s });
      }
    }
  }
  cpu.dispose();
  const kernels = [...new Set(cases.map((c) => c.launch.source))];
  const params = kernels.map((src) => {
    const m = /\/\/ params: (.*)/.exec(src)![1]!;
    const get = (k: string): string => new RegExp(`\\b${k}=(\\S+)`).exec(m)![1]!;
    return { seqPos: get('seqPos') === 'true', bias: get('bias'), out: get('out'), inp: get('inp') };
  });
  const dir = mkdtempSync(join(tmpdir(), 'dk-rope-kv-emu-'));
  try {
    writeFileSync(join(dir, 'emu.cpp'), kvProgram(kernels, params));
    execFileSync('g++', ['-std=c++17', '-O0', '-o', join(dir, 'emu'), join(dir, 'emu.cpp')], { stdio: ['ignore', 'ignore', 'pipe'] });
    for (const c of cases) {
      const sl = c.launch.slots, { B, T, nH, nKv, tMax } = c.s;
      assert.deepEqual([Number(sl.readBigInt64LE(32)), sl.readInt32LE(40), sl.readInt32LE(48), sl.readInt32LE(56), sl.readInt32LE(64), sl.readInt32LE(72)],
        [B * T, T, nH, nKv, typeof c.s.pos === 'number' ? c.s.pos : 0, tMax], `arguments (rows, T, nH, nKv, pos0, tMax): ${c.what}`);
      for (const grid of new Set([c.launch.grid[0]!, 1])) {
        const paths = c.files.map(([name, data, d]) => {
          const path = join(dir, `${name}.bin`);
          if (d === 'int') writeFileSync(path, data as Int32Array); else writeOperand(path, data as Float32Array, d);
          return path;
        });
        execFileSync(join(dir, 'emu'), [String(kernels.indexOf(c.launch.source)), String(grid), String(c.launch.block), ...paths,
          String(B * T), String(T), String(nH), String(nKv), String(typeof c.s.pos === 'number' ? c.s.pos : 0), String(tMax)]);
        ['q', 'k cache', 'v cache'].forEach((name, j) => {
          const got = readOperand(paths[j]!, c.dt), want = c.ref[j]!;
          assert.equal(got.length, want.length);
          for (let i = 0; i < got.length; i++) {
            const g = got[i]!, e = want[i]!;
            const tol = c.dt === 'bf16' ? bf16Ulp(Math.max(Math.abs(g), Math.abs(e))) + 1e-6 : 1e-6;
            if (!(Math.abs(g - e) <= tol)) assert.fail(`${c.what} grid ${grid}: ${name} element ${i} = ${g}, CPU ${e} (tolerance ${tol})`);
          }
        });
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
