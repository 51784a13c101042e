/**
 * Elementwise and reduction kernels: add, accumulate, scale, sum of squares (per-block double partials summed
 * on the host), matmul bias add and bias-gradient column reduction, SwiGLU forward/backward, embedding
 * forward/backward (atomicAdd), AdamW. Baked: block size (and AdamW's beta1, beta2, eps).
 * All use grid-stride loops with 64-bit indices.
 */
import { BLOCK_DOMAIN, DTYPE_DOMAIN, ctype, defineFamily, dtypeHelpers, reductionHelpers } from './spec.js';

type BlockP = { block: number };
const blockSchema = { block: BLOCK_DOMAIN } as const;
const loop = 'for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (long long)gridDim.x * BLOCK)';

function simple(name: string, sig: string, body: string) {
  return defineFamily<BlockP>({
    name, schema: blockSchema, example: { block: 256 },
    generate: (p) => `#define BLOCK ${p.block}
extern "C" __global__ void ${name}(${sig}, long long n) {
  ${loop} {
    ${body}
  }
}
`,
  });
}

export const addKernel = simple('add', 'float* out, const float* a, const float* b', 'out[i] = a[i] + b[i];');
export const accumulateKernel = simple('accumulate', 'float* dst, const float* src', 'dst[i] += src[i];');
export const scaleKernel = simple('scale', 'float* buf, float s', 'buf[i] *= s;');
export const swigluForward = simple('swiglu_fwd', 'float* out, const float* gate, const float* up',
  'float g = gate[i]; out[i] = g / (1.0f + expf(-g)) * up[i];');
export const swigluBackward = simple('swiglu_bwd', 'float* dgate, float* dup, const float* dout, const float* gate, const float* up',
  `float g = gate[i]; float sg = 1.0f / (1.0f + expf(-g)); float silu = g * sg;
    float dy = dout[i];
    dgate[i] += dy * up[i] * sg * (1.0f + g * (1.0f - sg));
    dup[i] += dy * silu;`);

type ConvertP = { out: string; inp: string; block: number };
/** out[i] = inp[i] converted between dtypes (into bf16: round to nearest even). Backend.copy across dtypes. */
export const convertKernel = defineFamily<ConvertP>({
  name: 'convert', schema: { out: DTYPE_DOMAIN, inp: DTYPE_DOMAIN, block: BLOCK_DOMAIN }, example: { out: 'bf16', inp: 'f32', block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
${dtypeHelpers()}
extern "C" __global__ void convert(${ctype(p.out)}* out, const ${ctype(p.inp)}* inp, long long n) {
  ${loop} stf(out, i, ldf(inp, i));
}
`,
});

/** out[r, c] += bias[c] over n = rows·m elements (after the cuBLAS GEMM wrote out). */
export const biasAdd = defineFamily<BlockP>({
  name: 'bias_add', schema: blockSchema, example: { block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
extern "C" __global__ void bias_add(float* out, const float* bias, long long n, int m) {
  ${loop} out[i] += bias[i % m];
}
`,
});

/**
 * Stage 1 of the bias gradient. Grid (ceil(m / block), R): part[y·m + c] = Σ of dout[r, c] over rows
 * [y·rowsPer, (y+1)·rowsPer); col_reduce adds the R partials (in order) into dbias. Deterministic.
 */
export const biasGrad = defineFamily<BlockP>({
  name: 'bias_grad', schema: blockSchema, example: { block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
extern "C" __global__ void bias_grad(float* part, const float* dout, int rows, int m, int rowsPer) {
  int c = blockIdx.x * BLOCK + threadIdx.x;
  if (c >= m) return;
  int r0 = blockIdx.y * rowsPer, r1 = min(rows, r0 + rowsPer);
  float acc = 0.0f;
  for (int r = r0; r < r1; r++) acc += dout[(long long)r * m + c];
  part[(long long)blockIdx.y * m + c] = acc;
}
`,
});

/** Stage 2 of the column reductions: dst[c] += Σ_{y < R} part[y·m + c], y in order; grid ceil(m / block). */
export const colReduce = defineFamily<BlockP>({
  name: 'col_reduce', schema: blockSchema, example: { block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
extern "C" __global__ void col_reduce(float* dst, const float* part, int R, int m) {
  int c = blockIdx.x * BLOCK + threadIdx.x;
  if (c >= m) return;
  float acc = 0.0f;
  for (int y = 0; y < R; y++) acc += part[(long long)y * m + c];
  dst[c] += acc;
}
`,
});

/** partials[blockIdx.x] = Σ x² over the block's grid-stride share, in double; the host sums the partials. */
export const sumSquares = defineFamily<BlockP>({
  name: 'sum_squares', schema: blockSchema, example: { block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
${reductionHelpers()}
extern "C" __global__ void sum_squares(double* partials, const float* x, long long n) {
  double acc = 0.0;
  ${loop} { double v = (double)x[i]; acc += v * v; }
  acc = blockSumD(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}
`,
});

/** out[i, j] = table[ids[i], j]; n·c elements. */
export const embeddingForward = defineFamily<BlockP>({
  name: 'embedding_fwd', schema: blockSchema, example: { block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
extern "C" __global__ void embedding_fwd(float* out, const int* ids, const float* table, long long n, int c) {
  ${loop} {
    long long row = i / c;
    int j = (int)(i % c);
    out[i] = table[(long long)ids[row] * c + j];
  }
}
`,
});

/** dtable[ids[i], j] += dout[i, j] (atomicAdd: repeated ids collide). */
export const embeddingBackward = defineFamily<BlockP>({
  name: 'embedding_bwd', schema: blockSchema, example: { block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
extern "C" __global__ void embedding_bwd(float* dtable, const float* dout, const int* ids, long long n, int c) {
  ${loop} {
    long long row = i / c;
    int j = (int)(i % c);
    atomicAdd(&dtable[(long long)ids[row] * c + j], dout[i]);
  }
}
`,
});

type AdamP = { block: number };

/**
 * AdamW. Baked: the block size. Runtime arguments (a schedule or a resumed run may change any of them without a
 * compile): beta1, beta2, eps, lr, weightDecay, gradScale and the bias corrections bc1 = 1 - beta1^step,
 * bc2 = 1 - beta2^step (computed on the host).
 * param = param · (1 - lr · weightDecay) - lr · m̂ / (sqrt(v̂) + eps)   (as the CPU backend)
 */
export const adamwKernel = defineFamily<AdamP>({
  name: 'adamw',
  schema: { block: BLOCK_DOMAIN },
  example: { block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
struct AdamConst { float beta1, beta2, eps, lr, wd, gradScale, bc1, bc2; };
__device__ __forceinline__ void adamwOne(float& p, float gr, float& m, float& v, const AdamConst& k) {
  float g = gr * k.gradScale;
  float mi = k.beta1 * m + (1.0f - k.beta1) * g;
  float vi = k.beta2 * v + (1.0f - k.beta2) * g * g;
  m = mi;
  v = vi;
  p = p * (1.0f - k.lr * k.wd) - k.lr * (mi / k.bc1) / (sqrtf(vi / k.bc2) + k.eps);
}
/* float4 over the first n/4·4 elements when all four pointers are 16-byte aligned (views may not be), then scalar. */
extern "C" __global__ void adamw(float* param, const float* grad, float* m, float* v, long long n,
                                 float beta1, float beta2, float eps, float lr, float wd, float gradScale, float bc1, float bc2) {
  const AdamConst k = { beta1, beta2, eps, lr, wd, gradScale, bc1, bc2 };
  const long long start = (long long)blockIdx.x * BLOCK + threadIdx.x, stride = (long long)gridDim.x * BLOCK;
  const bool vec = ((reinterpret_cast<unsigned long long>(param) | reinterpret_cast<unsigned long long>(grad) |
                     reinterpret_cast<unsigned long long>(m) | reinterpret_cast<unsigned long long>(v)) & 15ull) == 0;
  const long long nv = vec ? n / 4 : 0;
  for (long long i = start; i < nv; i += stride) {
    float4 p4 = reinterpret_cast<float4*>(param)[i], m4 = reinterpret_cast<float4*>(m)[i], v4 = reinterpret_cast<float4*>(v)[i];
    const float4 g4 = reinterpret_cast<const float4*>(grad)[i];
    adamwOne(p4.x, g4.x, m4.x, v4.x, k);
    adamwOne(p4.y, g4.y, m4.y, v4.y, k);
    adamwOne(p4.z, g4.z, m4.z, v4.z, k);
    adamwOne(p4.w, g4.w, m4.w, v4.w, k);
    reinterpret_cast<float4*>(param)[i] = p4;
    reinterpret_cast<float4*>(m)[i] = m4;
    reinterpret_cast<float4*>(v)[i] = v4;
  }
  for (long long i = nv * 4 + start; i < n; i += stride) adamwOne(param[i], grad[i], m[i], v[i], k);
}
`,
});
