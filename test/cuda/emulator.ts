/**
 * The host emulator of the generated CUDA kernels (opt-in tests: DISTILLERY_EMULATE_CUDA=1, g++ with C++20): the
 * source of a kernel spec compiled for the host with a SIMT emulation header (threads with real barriers, warp
 * shuffles, mma.m16n8k16 and ldmatrix.trans from the PTX fragment layouts). Used by flash-emulated.test.ts and
 * loss-emulated.test.ts; `workDir()` is removed by `cleanUp()`.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { KernelSpec } from '../../src/backend/cuda/kernels/spec.js';

export function gxx(): boolean {
  try { execFileSync('g++', ['--version'], { stdio: 'ignore' }); return true; } catch { return false; }
}
export const skip = process.env.DISTILLERY_EMULATE_CUDA !== '1' ? 'opt-in: DISTILLERY_EMULATE_CUDA=1 runs the CUDA kernels on a host emulator (about a minute)'
  : gxx() ? false : 'g++ not found';

export const EMU = String.raw`// Host emulation of the CUDA subset the attention kernels use: a block = BLOCK std::threads, __syncthreads = a
// block barrier, shuffles and mma.m16n8k16 = warp barriers + exchange slots, fragment layouts per the PTX ISA.
#include <cstdint>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <barrier>
#include <vector>
#include <algorithm>
#include <memory>
#include <atomic>
using std::min; using std::max;
struct dim3e { unsigned x, y, z; };
thread_local dim3e threadIdx, blockIdx;
dim3e gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(x)
#define __shared__ static
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
inline unsigned fbits(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline unsigned __float_as_uint(float f) { return fbits(f); }
typedef unsigned short bf16;
inline bf16 f2bf_host(float f) {
  unsigned u = fbits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16)(u >> 16);
}
unsigned char* g_smem;
std::barrier<>* g_block_bar;
std::barrier<>* g_warp_bar[32];
float g_xf[32][32];
unsigned g_xu[32][32][6];
float g_xc[32][32][4];
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
inline unsigned atomicOr(unsigned* a, unsigned v) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned* a, unsigned v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }
inline int atomicAdd(int* a, int v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline float __ldcg(const float* p) { float v; __atomic_load(p, &v, __ATOMIC_SEQ_CST); return v; }
inline void warpsync() { g_warp_bar[threadIdx.x >> 5]->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { warpsync(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_xf[w][l] = v; warpsync(); float r = g_xf[w][l ^ o]; warpsync(); return r;
}
inline float __shfl_sync(unsigned, float v, int src) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_xf[w][l] = v; warpsync(); float r = g_xf[w][src & 31]; warpsync(); return r;
}
inline float __shfl_up_sync(unsigned, float v, int o) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_xf[w][l] = v; warpsync(); float r = l >= o ? g_xf[w][l - o] : v; warpsync(); return r;
}
double g_xdd[32][32];
inline double __shfl_xor_sync(unsigned, double v, int o) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_xdd[w][l] = v; warpsync(); double r = g_xdd[w][l ^ o]; warpsync(); return r;
}
inline int __shfl_xor_sync(unsigned, int v, int o) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_xu[w][l][0] = (unsigned)v; warpsync(); int r = (int)g_xu[w][l ^ o][0]; warpsync(); return r;
}
inline double __shfl_sync(unsigned, double v, int src) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_xdd[w][l] = v; warpsync(); double r = g_xdd[w][src & 31]; warpsync(); return r;
}
inline double __shfl_up_sync(unsigned, double v, int o) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_xdd[w][l] = v; warpsync(); double r = l >= o ? g_xdd[w][l - o] : v; warpsync(); return r;
}
inline int __shfl_sync(unsigned, int v, int src) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_xu[w][l][0] = (unsigned)v; warpsync(); int r = (int)g_xu[w][src & 31][0]; warpsync(); return r;
}
inline int __shfl_up_sync(unsigned, int v, int o) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_xu[w][l][0] = (unsigned)v; warpsync(); int r = l >= o ? (int)g_xu[w][l - o][0] : v; warpsync(); return r;
}
inline unsigned __ballot_sync(unsigned, int p) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_xu[w][l][0] = p ? 1u : 0u; warpsync();
  unsigned r = 0; for (int i = 0; i < 32; i++) r |= g_xu[w][i][0] << i;
  warpsync(); return r;
}
/* prmt: byte i of the result is byte (s >> 4i) & 7 of y:x */
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  unsigned long long v = ((unsigned long long)y << 32) | x; unsigned r = 0;
  for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
  return r;
}
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline float lo16(unsigned r) { return __uint_as_float((r & 0xffffu) << 16); }
inline float hi16(unsigned r) { return __uint_as_float(r & 0xffff0000u); }
/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, layouts from the PTX ISA */
inline void mma16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  for (int i = 0; i < 4; i++) g_xu[w][l][i] = a[i];
  g_xu[w][l][4] = b0; g_xu[w][l][5] = b1;
  warpsync();
  float A[16][16], B[16][8];
  for (int L = 0; L < 32; L++) {
    int g = L >> 2, t = L & 3; unsigned* r = g_xu[w][L];
    A[g][2 * t] = lo16(r[0]); A[g][2 * t + 1] = hi16(r[0]);
    A[g + 8][2 * t] = lo16(r[1]); A[g + 8][2 * t + 1] = hi16(r[1]);
    A[g][2 * t + 8] = lo16(r[2]); A[g][2 * t + 9] = hi16(r[2]);
    A[g + 8][2 * t + 8] = lo16(r[3]); A[g + 8][2 * t + 9] = hi16(r[3]);
    B[2 * t][g] = lo16(r[4]); B[2 * t + 1][g] = hi16(r[4]);
    B[2 * t + 8][g] = lo16(r[5]); B[2 * t + 9][g] = hi16(r[5]);
  }
  warpsync();
  int g = l >> 2, t = l & 3;
  auto dot = [&](int row, int col) { float s = 0; for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col]; return s; };
  c[0] += dot(g, 2 * t); c[1] += dot(g, 2 * t + 1); c[2] += dot(g + 8, 2 * t); c[3] += dot(g + 8, 2 * t + 1);
}
const void* g_xp[32][32];
/* shared-state-space addresses: offsets into the block's dynamic shared memory */
inline unsigned __cvta_generic_to_shared(const void* p) { return (unsigned)((const unsigned char*)p - g_smem); }
struct float2 { float x, y; };
inline float2 make_float2(float a, float b) { return {a, b}; }
struct float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct uint2 { unsigned x, y; };
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8m + r address row r of matrix m (a shared address); not
   transposed, lane 4g + t receives elements [g][2t] (low half) and [g][2t + 1] of matrix m in register m; transposed,
   elements [2t][g] and [2t + 1][g] */
inline void ldsmX4(unsigned* r, unsigned a, bool trans) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_xp[w][l] = g_smem + a; warpsync();
  int g = l >> 2, t = l & 3;
  auto M = [&](int m, int row, int col) -> unsigned { return ((const bf16*)g_xp[w][m * 8 + row])[col]; };
  for (int m = 0; m < 4; m++) r[m] = trans ? M(m, 2 * t, g) | (M(m, 2 * t + 1, g) << 16) : M(m, g, 2 * t) | (M(m, g, 2 * t + 1) << 16);
  warpsync();
}
inline void ldsm4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, unsigned a) {
  unsigned r[4]; ldsmX4(r, a, false); r0 = r[0]; r1 = r[1]; r2 = r[2]; r3 = r[3];
}
inline void ldsmT4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, unsigned a) {
  unsigned r[4]; ldsmX4(r, a, true); r0 = r[0]; r1 = r[1]; r2 = r[2]; r3 = r[3];
}
template <class F> void launch(dim3e grid, int block, size_t smem, F f) {
  gridDim = grid;
  std::vector<unsigned char> sm(smem + 16);
  g_smem = sm.data();
  for (unsigned z = 0; z < grid.z; z++) for (unsigned y = 0; y < grid.y; y++) for (unsigned x = 0; x < grid.x; x++) {
    std::barrier<> bb(block);
    std::vector<std::unique_ptr<std::barrier<>>> wb;
    for (int w = 0; w < block / 32; w++) { wb.emplace_back(new std::barrier<>(32)); g_warp_bar[w] = wb.back().get(); }
    g_block_bar = &bb;
    memset(sm.data(), 0xcd, sm.size()); /* garbage, as on a GPU */
    std::vector<std::thread> th;
    for (int i = 0; i < block; i++) th.emplace_back([=] { threadIdx = {(unsigned)i, 0, 0}; blockIdx = {x, y, z}; f(); });
    for (auto& t : th) t.join();
  }
}
template <class T> std::vector<T> readf(const char* dir, const char* name, size_t n) {
  std::vector<T> v(n);
  char p[512]; snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE* f = fopen(p, "rb"); if (!f) { fprintf(stderr, "no %s\n", p); exit(2); }
  if (fread(v.data(), sizeof(T), n, f) != n) { fprintf(stderr, "short %s\n", p); exit(2); }
  fclose(f); return v;
}
template <class T> void writef(const char* dir, const char* name, const std::vector<T>& v) {
  char p[512]; snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE* f = fopen(p, "wb"); fwrite(v.data(), sizeof(T), v.size(), f); fclose(f);
}
`;

/** The generated source with its inline PTX and CUDA-only declarations replaced by host equivalents. */
export function hostify(src: string): string {
  let s = src;
  s = s.replace(/__device__ __forceinline__ bf16 f2bf\(float f\) \{[^\n]*\n/, '__device__ __forceinline__ bf16 f2bf(float f) { return f2bf_host(f); }\n');
  s = s.replace(/__device__ __forceinline__ unsigned pack2\(float lo, float hi\) \{\n[^\n]*\n\}\n/,
    'inline unsigned pack2(float lo, float hi) { return (unsigned)f2bf_host(lo) | ((unsigned)f2bf_host(hi) << 16); }\n');
  s = s.replace(/__device__ __forceinline__ float fexp\(float x\) \{[^\n]*\n/, 'inline float fexp(float x) { return exp2f(x * 1.4426950408889634f); }\n');
  s = s.replace(/\/\* c \+= a · b on one m16n8k16 tile[\s\S]*?\n\}\n/, '');
  s = s.replace(/\/\* ldmatrix\.x4 \(not transposed\)[\s\S]*?\n\}\n/, '');
  s = s.replace(/\/\* ldmatrix\.x4\.trans of four 8×8 bf16 matrices[\s\S]*?\n\}\n/, '');
  // cp.async: a synchronous 16-byte copy (zeros when !ok); commit and wait do nothing (the barriers that follow remain).
  s = s.replace(/\/\* cp\.async \(sm_80\+\)[\s\S]*?\/\* end cp\.async \*\/\n/,
    'inline void cpAsync16(bf16* d, const bf16* s, bool ok) { for (int i = 0; i < 8; i++) d[i] = ok ? s[i] : bf16{}; }\n' +
    'inline void cpAsync4(float* d, const float* s, bool ok) { *d = ok ? *s : 0.0f; }\n' +
    'inline void cpAsync16s(unsigned d, const bf16* s, bool ok) { cpAsync16((bf16*)(g_smem + d), s, ok); }\n' +
    'inline void cpCommit() {}\ntemplate <int N> inline void cpWait() {}\n');
  s = s.replace('extern __shared__ __align__(16) unsigned char smraw[];', 'unsigned char* smraw = g_smem;');
  s = s.replace('extern __shared__ float smem[];', 'float* smem = (float*)g_smem;');
  assert.doesNotMatch(s, /asm\(/, 'inline PTX left after hostify');
  return s;
}

let dir = '';
let built = 0;
export function workDir(): string {
  if (!dir) dir = mkdtempSync(join(tmpdir(), 'dk-emu-'));
  return dir;
}
export function build(spec: KernelSpec, main: string): string {
  const exe = join(workDir(), `k${built++}`);
  writeFileSync(join(workDir(), 'emu.h'), EMU);
  writeFileSync(`${exe}.cpp`, `#include "emu.h"\n${hostify(spec.source())}\n${main}`);
  execFileSync('g++', ['-std=c++20', '-O1', '-pthread', '-w', '-o', exe, `${exe}.cpp`]);
  return exe;
}


/** Removes the work folder. */
export function cleanUp(): void { if (dir) rmSync(dir, { recursive: true, force: true }); dir = ''; }
