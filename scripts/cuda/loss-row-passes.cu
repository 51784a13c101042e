// The two passes of a fused distillation-loss row kernel (sparse_loss, loss) at the head's shapes (4096 rows of 151936
// bf16 logits, the gradient written in place), timed alone with CUDA events: today's layout (one 512-thread block per
// row, 8-byte loads: every row is read twice from DRAM when 4 blocks per SM keep ~528 rows in flight, 157 MB, more than
// the 50 MB L2) against persistent grids that keep only a few rows per SM in flight (so the second pass may hit L2) and
// 16-byte loads. The arithmetic is the sparse loss's dense part (two exponentials per element in each pass).
// Experiment, not part of the library: it decides the layout the loss kernels use. Each variant's gradient is compared
// with the first's (max abs difference printed).
// The last two variants take the exponentials another way (ex<MATH>): how much of a pass is arithmetic, not memory.
// Usage (device): nvcc -O3 -arch=sm_90 -o /tmp/loss-row-passes scripts/cuda/loss-row-passes.cu && /tmp/loss-row-passes
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <cstring>
#include <cuda_runtime.h>
typedef unsigned short bf16;
__device__ __forceinline__ float bf2f(unsigned h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ unsigned pack2(float a, float b) {
  unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a)); return r;
}
__device__ __forceinline__ float warpSum(float v) { for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o); return v; }
__device__ __forceinline__ float warpMax(float v) { for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o)); return v; }
template <int B> __device__ float blockSum(float v) {
  __shared__ float sh[B / 32];
  v = warpSum(v); __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = 0.0f; for (int i = 0; i < B / 32; i++) r += sh[i];
  return r;
}
template <int B> __device__ float blockMax(float v) {
  __shared__ float sh[B / 32];
  v = warpMax(v); __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = -INFINITY; for (int i = 0; i < B / 32; i++) r = fmaxf(r, sh[i]);
  return r;
}
#define TEMP 2.0f
#define INV_T 0.5f
#define ALPHA 0.5f
// MATH: how e^x is taken (expf by default; 1: ex2.approx of x·log2 e, what --use_fast_math makes of __expf; 2: no
// exponential at all, x itself: the memory traffic and the loop alone, a floor for the other two).
template <int MATH> __device__ __forceinline__ float ex(float x) {
  if (MATH == 0) return expf(x);
  if (MATH == 2) return x;
  float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * 1.4426950408889634f)); return r;
}
// W: bf16 elements per load (4: uint2, 8: uint4).
template <int B, int W, int MATH = 0>
__global__ void __launch_bounds__(B) rows(bf16* z, const int* targets, int n, int V) {
  for (int row = blockIdx.x; row < n; row += gridDim.x) {
    bf16* zr = z + (long long)row * V;
    const int y = targets[row];
    float m = -INFINITY, s1 = 0.0f, ss = 0.0f;
    const int VW = V / W;
    for (int jw = threadIdx.x; jw < VW; jw += B) {
      unsigned u[W / 2];
      if (W == 8) { const uint4 q = ((const uint4*)zr)[jw]; u[0] = q.x; u[1] = q.y; u[2] = q.z; u[3] = q.w; }
      else { const uint2 q = ((const uint2*)zr)[jw]; u[0] = q.x; u[1] = q.y; }
#pragma unroll
      for (int e = 0; e < W; e++) {
        const float x = e & 1 ? __uint_as_float(u[e / 2] & 0xffff0000u) : bf2f(u[e / 2] & 0xffffu);
        if (x > m) { s1 *= ex<MATH>(m - x); ss *= ex<MATH>((m - x) * INV_T); m = x; }
        s1 += ex<MATH>(x - m); ss += ex<MATH>((x - m) * INV_T);
      }
    }
    const float M = blockMax<B>(m);
    const float lse1 = M + logf(blockSum<B>(m == -INFINITY ? 0.0f : s1 * expf(m - M)));
    const float lseS = M * INV_T + logf(blockSum<B>(m == -INFINITY ? 0.0f : ss * expf((m - M) * INV_T)));
    const float Gamma = 0.3f, w = 1.0f / 8192.0f;
    for (int jw = threadIdx.x; jw < VW; jw += B) {
      unsigned u[W / 2];
      if (W == 8) { const uint4 q = ((const uint4*)zr)[jw]; u[0] = q.x; u[1] = q.y; u[2] = q.z; u[3] = q.w; }
      else { const uint2 q = ((const uint2*)zr)[jw]; u[0] = q.x; u[1] = q.y; }
      float g[W];
#pragma unroll
      for (int e = 0; e < W; e++) {
        const float x = e & 1 ? __uint_as_float(u[e / 2] & 0xffff0000u) : bf2f(u[e / 2] & 0xffffu);
        const int j = jw * W + e;
        const float ceg = ex<MATH>(x - lse1) - (j == y ? 1.0f : 0.0f);
        const float qs = ex<MATH>(x * INV_T - lseS);
        g[e] = w * ((1.0f - ALPHA) * ceg + ALPHA * TEMP * (-Gamma * qs));
      }
      if (W == 8) ((uint4*)zr)[jw] = make_uint4(pack2(g[0], g[1]), pack2(g[2], g[3]), pack2(g[4], g[5]), pack2(g[6], g[7]));
      else ((uint2*)zr)[jw] = make_uint2(pack2(g[0], g[1]), pack2(g[2], g[3]));
    }
    __syncthreads();
  }
}

int main() {
  const int n = 4096, V = 151936;
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceProp prop; cudaGetDeviceProperties(&prop, 0);
  printf("device %s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
  const size_t elems = (size_t)n * V;
  std::vector<bf16> host(elems);
  unsigned s = 12345;
  for (size_t i = 0; i < elems; i++) { s = s * 1103515245u + 12345u; const float f = ((s >> 8) / 16777216.0f - 0.5f) * 16.0f; unsigned b; memcpy(&b, &f, 4); host[i] = (bf16)(b >> 16); }
  std::vector<int> tg(n); for (int i = 0; i < n; i++) tg[i] = (i * 7919) % V;
  bf16 *z, *z0; int* t;
  cudaMalloc(&z, elems * 2); cudaMalloc(&z0, elems * 2); cudaMalloc(&t, n * 4);
  cudaMemcpy(z0, host.data(), elems * 2, cudaMemcpyHostToDevice); cudaMemcpy(t, tg.data(), n * 4, cudaMemcpyHostToDevice);
  std::vector<bf16> first(elems), got(elems);
  struct Var { const char* name; void (*k)(bf16*, const int*, int, int); int block; int grid; };
  const Var vars[] = {
    {"grid n, 512 threads, 8-byte loads (today)", rows<512, 4>, 512, n},
    {"grid n, 512 threads, 16-byte loads", rows<512, 8>, 512, n},
    {"grid n, 1024 threads, 16-byte loads", rows<1024, 8>, 1024, n},
    {"grid 1/SM, 1024 threads, 16-byte loads", rows<1024, 8>, 1024, sms},
    {"grid 2/SM, 1024 threads, 16-byte loads", rows<1024, 8>, 1024, 2 * sms},
    {"grid 2/SM, 512 threads, 16-byte loads", rows<512, 8>, 512, 2 * sms},
    {"grid 4/SM, 512 threads, 16-byte loads", rows<512, 8>, 512, 4 * sms},
    {"grid 1/SM, 1024 threads, 8-byte loads", rows<1024, 4>, 1024, sms},
    {"grid n, 512 threads, 16-byte loads, ex2.approx", rows<512, 8, 1>, 512, n},
    {"grid n, 512 threads, 16-byte loads, no exp (floor)", rows<512, 8, 2>, 512, n},
  };
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int vi = 0; vi < (int)(sizeof(vars) / sizeof(vars[0])); vi++) {
    const Var& v = vars[vi];
    float best = 1e30f;
    for (int rep = 0; rep < 6; rep++) {
      cudaMemcpy(z, z0, elems * 2, cudaMemcpyDeviceToDevice);
      cudaEventRecord(a);
      v.k<<<v.grid, v.block>>>(z, t, n, V);
      cudaEventRecord(b); cudaEventSynchronize(b);
      float ms = 0; cudaEventElapsedTime(&ms, a, b);
      if (rep > 0 && ms < best) best = ms;
    }
    const cudaError_t e = cudaGetLastError();
    cudaMemcpy(vi == 0 ? first.data() : got.data(), z, elems * 2, cudaMemcpyDeviceToHost);
    float diff = 0.0f;
    if (vi > 0) for (size_t i = 0; i < elems; i += 97) { unsigned x = (unsigned)first[i] << 16, y = (unsigned)got[i] << 16; float fx, fy; memcpy(&fx, &x, 4); memcpy(&fy, &y, 4); diff = fmaxf(diff, fabsf(fx - fy)); }
    printf("%-44s %8.1f us  %6.0f GB/s (3 row passes)  max |diff| %.2e  %s\n", v.name, best * 1000, 3.0 * elems * 2 / (best * 1e-3) / 1e9, diff, e == cudaSuccess ? "" : cudaGetErrorString(e));
  }
  return 0;
}
