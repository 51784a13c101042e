/**
 * RMSNorm kernels: forward (saves rstd), input backward, and the weight-gradient column reduction.
 * Baked: eps (forward only), C (row width), block size.
 */
import { BLOCK_DOMAIN, defineFamily, f32, reductionHelpers } from './spec.js';

type NormP = { eps: number; C: number; block: number };

/** Grid: one block per row. out/rstd/inp/weight, n rows. */
export const rmsnormForward = defineFamily<NormP>({
  name: 'rmsnorm_fwd',
  schema: { eps: { kind: 'float', min: 0 }, C: { kind: 'int', min: 1 }, block: BLOCK_DOMAIN },
  example: { eps: 1e-6, C: 896, block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
#define C ${p.C}
#define EPS ${f32(p.eps)}
${reductionHelpers()}
extern "C" __global__ void rmsnorm_fwd(float* out, float* rstd, const float* inp, const float* w, int n) {
  int row = blockIdx.x;
  if (row >= n) return;
  const float* x = inp + (long long)row * C;
  float* y = out + (long long)row * C;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < C; i += BLOCK) { float v = x[i]; ss += v * v; }
  ss = blockSum(ss);
  float r = 1.0f / sqrtf(ss / (float)C + EPS);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int i = threadIdx.x; i < C; i += BLOCK) y[i] = x[i] * r * w[i];
}
`,
});

type NormBwdP = { C: number; block: number };

/** Grid: one block per row. dinp += d(out)/d(inp)ᵀ dout. */
export const rmsnormBackward = defineFamily<NormBwdP>({
  name: 'rmsnorm_bwd',
  schema: { C: { kind: 'int', min: 1 }, block: BLOCK_DOMAIN },
  example: { C: 896, block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
#define C ${p.C}
${reductionHelpers()}
extern "C" __global__ void rmsnorm_bwd(float* dinp, const float* dout, const float* inp, const float* w,
                                       const float* rstd, int n) {
  int row = blockIdx.x;
  if (row >= n) return;
  const long long base = (long long)row * C;
  float r = rstd[row];
  float dot = 0.0f;
  for (int i = threadIdx.x; i < C; i += BLOCK) dot += dout[base + i] * w[i] * inp[base + i];
  dot = blockSum(dot);
  float k = dot * r * r * r / (float)C;
  for (int i = threadIdx.x; i < C; i += BLOCK) {
    dinp[base + i] += r * w[i] * dout[base + i] - inp[base + i] * k;
  }
}
`,
});

/**
 * Stage 1 of the weight gradient. Grid (ceil(C / block), R): block (x, y) sums rows [y·rowsPer, (y+1)·rowsPer) of
 * dout ⊙ inp · rstd for its columns into part[y·C + col]; col_reduce then adds Σ_y part[y, col] (in y order) into
 * dweight. Deterministic.
 */
export const rmsnormWeightGrad = defineFamily<NormBwdP>({
  name: 'rmsnorm_dweight',
  schema: { C: { kind: 'int', min: 1 }, block: BLOCK_DOMAIN },
  example: { C: 896, block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
#define C ${p.C}
extern "C" __global__ void rmsnorm_dweight(float* part, const float* dout, const float* inp, const float* rstd, int n, int rowsPer) {
  int col = blockIdx.x * BLOCK + threadIdx.x;
  if (col >= C) return;
  int r0 = blockIdx.y * rowsPer, r1 = min(n, r0 + rowsPer);
  float acc = 0.0f;
  for (int row = r0; row < r1; row++) {
    long long i = (long long)row * C + col;
    acc += dout[i] * inp[i] * rstd[row];
  }
  part[(long long)blockIdx.y * C + col] = acc;
}
`,
});
