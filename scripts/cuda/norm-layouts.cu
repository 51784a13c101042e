// Layouts of the RMSNorm kernels at the training shapes (8192 rows of 896 and 1536 columns: f32 residual, bf16 products),
// timed alone with CUDA events: the block-per-row kernels distillery generates (norm.ts) against a warp per row with
// 16-byte (f32) / 8-byte (bf16) vector accesses, and, for the backward, more blocks or two rows in flight per warp.
// Experiment, not part of the library: it decides the layout norm.ts generates. Every variant's output is compared with
// the first's (max abs difference printed).
// Usage (device): nvcc -O3 -arch=sm_90 -o /tmp/norm-layouts scripts/cuda/norm-layouts.cu && /tmp/norm-layouts
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>
typedef unsigned short bf16;
__device__ __forceinline__ float bf2f(bf16 h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ bf16 f2bf(float f) { unsigned short r; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f)); return r; }
__device__ __forceinline__ float warpSum(float v) { for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o); return v; }
template <int BLOCK> __device__ float blockSum(float v) {
  __shared__ float sh[BLOCK / 32];
  v = warpSum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = 0.0f;
  for (int i = 0; i < BLOCK / 32; i++) r += sh[i];
  return r;
}
#define EPS 1e-6f
struct bf4 { bf16 x, y, z, w; };
__device__ __forceinline__ void ld4(const bf16* p, float* o) { uint2 u = *(const uint2*)p; o[0] = __uint_as_float(u.x << 16); o[1] = __uint_as_float(u.x & 0xffff0000u); o[2] = __uint_as_float(u.y << 16); o[3] = __uint_as_float(u.y & 0xffff0000u); }
__device__ __forceinline__ void ld4(const float* p, float* o) { float4 u = *(const float4*)p; o[0] = u.x; o[1] = u.y; o[2] = u.z; o[3] = u.w; }
__device__ __forceinline__ void st4(bf16* p, const float* o) { uint2 u; u.x = (unsigned)f2bf(o[0]) | ((unsigned)f2bf(o[1]) << 16); u.y = (unsigned)f2bf(o[2]) | ((unsigned)f2bf(o[3]) << 16); *(uint2*)p = u; }
__device__ __forceinline__ void st4(float* p, const float* o) { *(float4*)p = make_float4(o[0], o[1], o[2], o[3]); }

// ---- forward: sum = a + b (f32 = f32 + bf16), out = sum * rstd * w (bf16) ----
template <int C, int BLOCK> __global__ void fwd_block(float* sum, bf16* out, float* rstd, const float* a, const bf16* b, const bf16* w, int n) {
  constexpr int NV = (C + BLOCK - 1) / BLOCK;
  int row = blockIdx.x; if (row >= n) return;
  const long long base = (long long)row * C;
  float v[NV]; float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; j++) { int i = threadIdx.x + j * BLOCK; if (i < C) v[j] = a[base + i] + bf2f(b[base + i]); }
#pragma unroll
  for (int j = 0; j < NV; j++) { int i = threadIdx.x + j * BLOCK; if (i < C) { sum[base + i] = v[j]; ss += v[j] * v[j]; } }
  ss = blockSum<BLOCK>(ss);
  float r = 1.0f / sqrtf(ss / (float)C + EPS);
  if (threadIdx.x == 0) rstd[row] = r;
#pragma unroll
  for (int j = 0; j < NV; j++) { int i = threadIdx.x + j * BLOCK; if (i < C) out[base + i] = f2bf(v[j] * r * bf2f(w[i])); }
}
// a warp per row, WARPS rows per block, lane owns 4-column groups lane + 32 j
template <int C, int WARPS> __global__ void fwd_warp(float* sum, bf16* out, float* rstd, const float* a, const bf16* b, const bf16* w, int n) {
  constexpr int G = C / 4, NG = (G + 31) / 32;
  const int row = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= n) return;
  const long long base = (long long)row * C;
  float v[NG][4]; float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < NG; j++) {
    const int gi = lane + 32 * j;
    if (gi < G) { float x[4], y[4]; ld4(a + base + 4 * gi, x); ld4(b + base + 4 * gi, y); for (int e = 0; e < 4; e++) v[j][e] = x[e] + y[e]; }
  }
#pragma unroll
  for (int j = 0; j < NG; j++) {
    const int gi = lane + 32 * j;
    if (gi < G) { st4(sum + base + 4 * gi, v[j]); for (int e = 0; e < 4; e++) ss += v[j][e] * v[j][e]; }
  }
  ss = warpSum(ss);
  const float r = 1.0f / sqrtf(ss / (float)C + EPS);
  if (lane == 0) rstd[row] = r;
#pragma unroll
  for (int j = 0; j < NG; j++) {
    const int gi = lane + 32 * j;
    if (gi < G) { float ww[4], o[4]; ld4(w + 4 * gi, ww); for (int e = 0; e < 4; e++) o[e] = v[j][e] * r * ww[e]; st4(out + base + 4 * gi, o); }
  }
}

// ---- backward: dinp += ..., dcopy = bf16(dinp), part[blk][C] = Σ dout*inp*rstd ----
template <int C, int BLOCK> __global__ void bwd_block(float* dinp, float* part, const bf16* dout, const float* inp, const bf16* w, const float* rstd, int n, bf16* dcopy) {
  constexpr int NV = (C + BLOCK - 1) / BLOCK;
  float wv[NV], dw[NV];
#pragma unroll
  for (int j = 0; j < NV; j++) { int i = threadIdx.x + j * BLOCK; wv[j] = i < C ? bf2f(w[i]) : 0.0f; dw[j] = 0.0f; }
  for (int row = blockIdx.x; row < n; row += gridDim.x) {
    const long long base = (long long)row * C; const float r = rstd[row];
    float g[NV], x[NV], o[NV]; float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; j++) { int i = threadIdx.x + j * BLOCK; g[j] = i < C ? bf2f(dout[base + i]) : 0.0f; x[j] = i < C ? inp[base + i] : 0.0f; o[j] = i < C ? dinp[base + i] : 0.0f; dot += g[j] * wv[j] * x[j]; dw[j] += g[j] * x[j] * r; }
    dot = blockSum<BLOCK>(dot);
    const float k = dot * r * r * r / (float)C;
#pragma unroll
    for (int j = 0; j < NV; j++) { int i = threadIdx.x + j * BLOCK; if (i < C) { float v = o[j] + (r * wv[j] * g[j] - x[j] * k); dinp[base + i] = v; dcopy[base + i] = f2bf(v); } }
  }
#pragma unroll
  for (int j = 0; j < NV; j++) { int i = threadIdx.x + j * BLOCK; if (i < C) part[(long long)blockIdx.x * C + i] = dw[j]; }
}
// a warp per row (vector accesses), WARPS warps per block, warps stride over rows; PF: the next row's loads are issued
// before the current row's reduction and stores (two rows in flight per warp)
template <int C, int WARPS, bool PF> __global__ void bwd_warp(float* dinp, float* part, const bf16* dout, const float* inp, const bf16* w, const float* rstd, int n, bf16* dcopy) {
  constexpr int G = C / 4, NG = (G + 31) / 32;
  __shared__ float sh[WARPS][C];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float wv[NG][4], dw[NG][4];
#pragma unroll
  for (int j = 0; j < NG; j++) { const int gi = lane + 32 * j; if (gi < G) ld4(w + 4 * gi, wv[j]); else for (int e = 0; e < 4; e++) wv[j][e] = 0.0f; for (int e = 0; e < 4; e++) dw[j][e] = 0.0f; }
  const int stride = gridDim.x * WARPS;
  int row = blockIdx.x * WARPS + warp;
  float g[NG][4], x[NG][4], o[NG][4];
  auto load = [&](int rr, float (*gg)[4], float (*xx)[4], float (*oo)[4]) {
    const long long base = (long long)rr * C;
#pragma unroll
    for (int j = 0; j < NG; j++) { const int gi = lane + 32 * j; if (gi < G) { ld4(dout + base + 4 * gi, gg[j]); ld4(inp + base + 4 * gi, xx[j]); ld4(dinp + base + 4 * gi, oo[j]); } else for (int e = 0; e < 4; e++) { gg[j][e] = 0.0f; xx[j][e] = 0.0f; oo[j][e] = 0.0f; } }
  };
  if (row < n) load(row, g, x, o);
  for (; row < n; row += stride) {
    const float r = rstd[row];
    float g2[NG][4], x2[NG][4], o2[NG][4];
    if (PF && row + stride < n) load(row + stride, g2, x2, o2);
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < NG; j++) for (int e = 0; e < 4; e++) { dot += g[j][e] * wv[j][e] * x[j][e]; dw[j][e] += g[j][e] * x[j][e] * r; }
    dot = warpSum(dot);
    const float k = dot * r * r * r / (float)C;
    const long long base = (long long)row * C;
#pragma unroll
    for (int j = 0; j < NG; j++) {
      const int gi = lane + 32 * j;
      if (gi < G) { float v[4]; for (int e = 0; e < 4; e++) v[e] = o[j][e] + (r * wv[j][e] * g[j][e] - x[j][e] * k); st4(dinp + base + 4 * gi, v); st4(dcopy + base + 4 * gi, v); }
    }
    if (PF) {
#pragma unroll
      for (int j = 0; j < NG; j++) for (int e = 0; e < 4; e++) { g[j][e] = g2[j][e]; x[j][e] = x2[j][e]; o[j][e] = o2[j][e]; }
    } else if (row + stride < n) load(row + stride, g, x, o);
  }
#pragma unroll
  for (int j = 0; j < NG; j++) { const int gi = lane + 32 * j; if (gi < G) for (int e = 0; e < 4; e++) sh[warp][4 * gi + e] = dw[j][e]; }
  __syncthreads();
  for (int i = threadIdx.x; i < C; i += 32 * WARPS) { float s = 0.0f; for (int k = 0; k < WARPS; k++) s += sh[k][i]; part[(long long)blockIdx.x * C + i] = s; }
}

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
static std::vector<float> hostF(const float* d, size_t n) { std::vector<float> h(n); CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost)); return h; }
static std::vector<bf16> hostB(const bf16* d, size_t n) { std::vector<bf16> h(n); CK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost)); return h; }
static float b2f(bf16 h) { unsigned u = ((unsigned)h) << 16; float f; memcpy(&f, &u, 4); return f; }
__global__ void fillF(float* p, size_t n, unsigned seed, float sc) { for (size_t i = blockIdx.x * 256ull + threadIdx.x; i < n; i += (size_t)gridDim.x * 256) { unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; p[i] = sc * ((h & 0xffffff) / 16777216.0f - 0.5f); } }
__global__ void fillB(bf16* p, size_t n, unsigned seed, float sc) { for (size_t i = blockIdx.x * 256ull + threadIdx.x; i < n; i += (size_t)gridDim.x * 256) { unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; p[i] = f2bf(sc * ((h & 0xffffff) / 16777216.0f - 0.5f)); } }

template <class F> static float timeIt(F f, int reps = 50) {
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < 5; i++) f();
  CK(cudaEventRecord(a)); for (int i = 0; i < reps; i++) f(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
  float ms; CK(cudaEventElapsedTime(&ms, a, b)); return ms * 1000.0f / reps;
}

template <int C> static void runShape(int n) {
  const size_t N = (size_t)n * C;
  float *a, *sum, *rstd, *inp, *dinp, *dinp0, *part; bf16 *b, *out, *w, *dout, *dcopy;
  CK(cudaMalloc(&a, N * 4)); CK(cudaMalloc(&sum, N * 4)); CK(cudaMalloc(&rstd, n * 4)); CK(cudaMalloc(&inp, N * 4));
  CK(cudaMalloc(&dinp, N * 4)); CK(cudaMalloc(&dinp0, N * 4)); CK(cudaMalloc(&part, 4096ull * C * 4));
  CK(cudaMalloc(&b, N * 2)); CK(cudaMalloc(&out, N * 2)); CK(cudaMalloc(&w, C * 2)); CK(cudaMalloc(&dout, N * 2)); CK(cudaMalloc(&dcopy, N * 2));
  fillF<<<1024, 256>>>(a, N, 1, 2.0f); fillB<<<1024, 256>>>(b, N, 2, 2.0f); fillB<<<64, 256>>>(w, C, 3, 2.0f);
  fillF<<<1024, 256>>>(inp, N, 4, 2.0f); fillF<<<1024, 256>>>(dinp0, N, 5, 1.0f); fillB<<<1024, 256>>>(dout, N, 6, 1.0f);
  CK(cudaDeviceSynchronize());
  const double fwdBytes = N * (4.0 + 2 + 4 + 2), bwdBytes = N * (2.0 + 4 + 4 + 4 + 2);
  // forward
  std::vector<float> refSum, refRstd; std::vector<bf16> refOut;
  auto fwdCheck = [&](const char* name, float us) {
    auto s = hostF(sum, N); auto r = hostF(rstd, n); auto o = hostB(out, N);
    double ds = 0, dr = 0, dout_ = 0;
    if (refSum.empty()) { refSum = s; refRstd = r; refOut = o; }
    for (size_t i = 0; i < N; i++) { ds = fmax(ds, fabs(s[i] - refSum[i])); dout_ = fmax(dout_, fabs(b2f(o[i]) - b2f(refOut[i]))); }
    for (int i = 0; i < n; i++) dr = fmax(dr, fabs(r[i] - refRstd[i]) / refRstd[i]);
    printf("fwd C=%d %-34s %7.1f us  %6.0f GB/s  (max |dsum| %.2g, rel drstd %.2g, |dout| %.2g)\n", C, name, us, fwdBytes / us / 1e3, ds, dr, dout_);
  };
  { float us = timeIt([&] { fwd_block<C, 256><<<n, 256>>>(sum, out, rstd, a, b, w, n); }); fwdCheck("block/row 256 (today)", us); }
  { float us = timeIt([&] { fwd_block<C, 128><<<n, 128>>>(sum, out, rstd, a, b, w, n); }); fwdCheck("block/row 128", us); }
  { float us = timeIt([&] { fwd_warp<C, 4><<<(n + 3) / 4, 128>>>(sum, out, rstd, a, b, w, n); }); fwdCheck("warp/row vec4, 4 warps", us); }
  { float us = timeIt([&] { fwd_warp<C, 8><<<(n + 7) / 8, 256>>>(sum, out, rstd, a, b, w, n); }); fwdCheck("warp/row vec4, 8 warps", us); }
  // backward (verified once from dinp0; timed by repeating it: dinp keeps accumulating, which costs the same)
  std::vector<float> refD; std::vector<bf16> refC;
  auto bwdCheck = [&](const char* name, float us, int R) {
    printf("bwd C=%d %-34s %7.1f us  %6.0f GB/s  (R=%d)\n", C, name, us, bwdBytes / us / 1e3, R);
  };
  auto bwdVerify = [&](const char* name, auto launch) {
    CK(cudaMemcpy(dinp, dinp0, N * 4, cudaMemcpyDeviceToDevice)); launch(); CK(cudaDeviceSynchronize());
    auto d = hostF(dinp, N); auto c = hostB(dcopy, N);
    if (refD.empty()) { refD = d; refC = c; }
    double dd = 0; for (size_t i = 0; i < N; i++) dd = fmax(dd, fabs(d[i] - refD[i]));
    printf("    %s: max |ddinp| vs the first %.2g\n", name, dd);
  };
#define BWD(NAME, R, LAUNCH) do { auto L = [&] { LAUNCH; }; bwdVerify(NAME, L); float us = timeIt(L); bwdCheck(NAME, us, R); } while (0)
  BWD("block/row 256, R=512 (today)", 512, (bwd_block<C, 256><<<512, 256>>>(dinp, part, dout, inp, w, rstd, n, dcopy)));
  BWD("block/row 256, R=1024", 1024, (bwd_block<C, 256><<<1024, 256>>>(dinp, part, dout, inp, w, rstd, n, dcopy)));
  BWD("block/row 256, R=2048", 2048, (bwd_block<C, 256><<<2048, 256>>>(dinp, part, dout, inp, w, rstd, n, dcopy)));
  BWD("block/row 128, R=2048", 2048, (bwd_block<C, 128><<<2048, 128>>>(dinp, part, dout, inp, w, rstd, n, dcopy)));
  BWD("warp/row vec4 8w, R=1024 (1 row)", 1024, (bwd_warp<C, 8, false><<<1024, 256>>>(dinp, part, dout, inp, w, rstd, n, dcopy)));
  BWD("warp/row vec4 8w, R=512", 512, (bwd_warp<C, 8, false><<<512, 256>>>(dinp, part, dout, inp, w, rstd, n, dcopy)));
  BWD("warp/row vec4 8w, R=256", 256, (bwd_warp<C, 8, false><<<256, 256>>>(dinp, part, dout, inp, w, rstd, n, dcopy)));
  BWD("warp/row vec4 8w, R=256, prefetch", 256, (bwd_warp<C, 8, true><<<256, 256>>>(dinp, part, dout, inp, w, rstd, n, dcopy)));
  BWD("warp/row vec4 4w, R=512, prefetch", 512, (bwd_warp<C, 4, true><<<512, 128>>>(dinp, part, dout, inp, w, rstd, n, dcopy)));
  BWD("warp/row vec4 4w, R=1024, prefetch", 1024, (bwd_warp<C, 4, true><<<1024, 128>>>(dinp, part, dout, inp, w, rstd, n, dcopy)));
  cudaFree(a); cudaFree(sum); cudaFree(rstd); cudaFree(inp); cudaFree(dinp); cudaFree(dinp0); cudaFree(part);
  cudaFree(b); cudaFree(out); cudaFree(w); cudaFree(dout); cudaFree(dcopy);
}

int main() {
  cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0)); printf("device %s, %d SMs\n", p.name, p.multiProcessorCount);
  runShape<896>(8192);
  runShape<1024>(8192);
  runShape<1536>(8192);
  return 0;
}
