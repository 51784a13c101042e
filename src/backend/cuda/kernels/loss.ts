/**
 * The fused per-token loss (and its gradient): one block per row, block reductions over the vocabulary.
 * Baked (they shape the code): kind, withGrad, the dtypes of dlogits, logits and teacher ('f32' | 'bf16': values are
 * read as float32, the gradient is computed in float32 and rounded once; dlogits may alias the logits only when both
 * have the same dtype, CudaBackend refuses the rest), block size. stats and weights are float32. The teacher is read
 * iff kind != 'none'.
 * Runtime arguments (a schedule may change them every step without a compile): temperature, alpha, beta.
 *
 * Formulas (z: student logits, zt: teacher logits, T: temperature, y: target; s = z/T, u = zt/T,
 * q = softmax(s), p = softmax(u)):
 *   CE       = logsumexp(z) - z[y]                (at T = 1; 0 where y < 0)
 *   kl       DIV = T² · KL(p ‖ q)                  dDIV/dz = T · (q - p)
 *   reverse-kl DIV = T² · KL(q ‖ p)                dDIV/dz = T · q ⊙ (log q - log p - KL(q ‖ p))
 *   jsd      m = β·p + (1-β)·q, DIV = T² · (β·KL(p ‖ m) + (1-β)·KL(q ‖ m))
 *            dDIV/dz = T · q ⊙ (g - Σ q g), g = (1-β) · (log q - log m)
 *   loss     = CE (kind 'none') or (1-α)·CE + α·DIV
 *   dlogits  = weights[row] · dloss/dz  (overwritten; may alias logits)
 *   agree    = [argmax z == argmax zt] (first index on ties), 0 for kind 'none'
 *   acc      = [argmax z == y] (first index on ties): token accuracy, and a row's part of is_greedy
 * stats row (storeStats, STAT_* of backend.ts): [loss, CE, DIV, agree, acc]; a padding row (y = -1, weight 0) gets zero
 * stats and a zero gradient.
 * Same math as the CPU backend (src/backend/cpu/kernels/loss.ts), there in float64.
 */
import { LD8_HELPERS, BLOCK_DOMAIN, DTYPE_DOMAIN, ctype, defineFamily, dtypeHelpers, reductionHelpers } from './spec.js';
import { LOSS_STATS, STAT_ACC, STAT_AGREE, STAT_CE, STAT_DIV, STAT_LOSS } from '../../backend.js';

export const LOSS_KINDS = ['none', 'kl', 'reverse-kl', 'jsd'] as const;

export type LossP = { kind: string; withGrad: boolean; dlogits: string; logits: string; teacher: string; block: number };

/**
 * The row loops of the dense and the sparse loss kernels (after BLOCK and dtypeHelpers), shared so that the vector and
 * the scalar forms of a pass are one piece of code:
 * - st8(p, j, v): eight consecutive gradient elements from j (a multiple of 8 in a 16-byte aligned row): two 16-byte
 *   stores (f32) or one (bf16);
 * - ld8(p, j8, o): elements 8·j8 .. 8·j8+7 of an f32 (two float4 loads) or bf16 (one 16-byte load) row, as floats;
 * - forRow<HAS_T>(z, zt, V, vec, f): f(z[j], zt[j], j) for this thread's j of [0, V) (strided by BLOCK, ascending), eight
 *   at a time from ld8 where `vec` (every row aligned, vecCondition: uniform over the grid; the row then streams at
 *   memory bandwidth, where one scalar load per step left the kernel latency-bound), then the rest one at a time;
 *   without a teacher row (HAS_T false) zt is not read and f gets 0; z and zt are each f32 or bf16;
 * - mapRow<HAS_T>(g, z, zt, V, vec, f): g[j] = f(z[j], zt[j], j) over the same elements, eight per vector store.
 * 16-byte accesses for bf16 rows: the two passes over 4096 rows of 151936 bf16 logits (gradient in place) took 1443 us
 * with 8-byte ones and 1332 us with these on an H100 (scripts/cuda/loss-row-passes.cu, session 20).
 */
export const ROW_HELPERS = `/* e^x for the per-element terms of a row pass (loss and sparse_loss): ex2.approx of x·log2(e), one multiply and one
   MUFU op (as __expf). Its relative error grows with |x| through the product's rounding (about 1e-6 at x = -20, a term
   e^-20 of the row's largest); subnormal results flush to 0. expf's range reduction made the sparse loss's two passes
   ~25% arithmetic-bound (scripts/cuda/loss-row-passes.cu: 1244 -> 1018 us over 4096 rows of 151936 bf16 logits, H200);
   the dense loss takes three exponentials per element in each pass. The block-level rescales keep expf. */
__device__ __forceinline__ float fexp(float x) { float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * 1.4426950408889634f)); return r; }
__device__ __forceinline__ void st8(float* p, int j, const float* v) {
  *(float4*)(p + j) = make_float4(v[0], v[1], v[2], v[3]); *(float4*)(p + j + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void st8(bf16* p, int j, const float* v) {
  *(uint4*)(p + j) = make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
}
${LD8_HELPERS}template <bool HAS_T, typename TZ, typename TT, typename F>
__device__ __forceinline__ void forRow(const TZ* z, const TT* zt, int V, bool vec, F f) {
  const int V8 = vec ? V >> 3 : 0;
  for (int j8 = threadIdx.x; j8 < V8; j8 += BLOCK) {
    float x[8], t[8];
    ld8(z, j8, x);
    if (HAS_T) ld8(zt, j8, t);
#pragma unroll
    for (int e = 0; e < 8; e++) f(x[e], HAS_T ? t[e] : 0.0f, 8 * j8 + e);
  }
  for (int j = 8 * V8 + threadIdx.x; j < V; j += BLOCK) f(ldf(z, j), HAS_T ? ldf(zt, j) : 0.0f, j);
}
template <bool HAS_T, typename G, typename TZ, typename TT, typename F>
__device__ __forceinline__ void mapRow(G* g, const TZ* z, const TT* zt, int V, bool vec, F f) {
  const int V8 = vec ? V >> 3 : 0;
  for (int j8 = threadIdx.x; j8 < V8; j8 += BLOCK) {
    float x[8], t[8], r[8];
    ld8(z, j8, x);
    if (HAS_T) ld8(zt, j8, t);
#pragma unroll
    for (int e = 0; e < 8; e++) r[e] = f(x[e], HAS_T ? t[e] : 0.0f, 8 * j8 + e);
    st8(g, 8 * j8, r);
  }
  for (int j = 8 * V8 + threadIdx.x; j < V; j += BLOCK) stf(g, j, f(ldf(z, j), HAS_T ? ldf(zt, j) : 0.0f, j));
}`;

/**
 * The vector-path condition of a row kernel: every row of every operand aligned for its 8-element loads or stores (16
 * bytes, f32 and bf16 alike), uniform over the grid. `ptrs`: [C expression, dtype] of each operand's base.
 */
export function vecCondition(ptrs: ReadonlyArray<readonly [string, string]>): string {
  const misaligned = ptrs.map(([e]) => `(reinterpret_cast<unsigned long long>(${e}) & 15)`).join(' | ');
  return `(LD & 7) == 0 && (${misaligned}) == 0`;
}

/**
 * A loss kernel's padding row (target < 0): zero stats and, with a gradient, a zero dlogits row, then return (the
 * condition is uniform per block, so returning before any barrier is safe). Shared by loss and sparse_loss.
 */
export function paddingRow(withGrad: boolean): string {
  return `if (y < 0) {  /* padding: uniform per block, so returning before any barrier is safe */
    if (threadIdx.x < ${LOSS_STATS}) stats[(long long)row * ${LOSS_STATS} + threadIdx.x] = 0.0f;
    ${withGrad ? 'for (int j = threadIdx.x; j < LD; j += BLOCK) stf(dlogits, (long long)row * LD + j, 0.0f);' : ''}
    return;
  }`;
}

/**
 * Thread 0's store of a row's stats, LOSS_STATS floats in the STAT_* order of backend.ts (the host reads them by those
 * names). Shared by loss and sparse_loss; the arguments are C expressions.
 */
export function storeStats(loss: string, ce: string, div: string, agree: string, acc: string): string {
  return `if (threadIdx.x == 0) {
    float* sr = stats + (long long)row * ${LOSS_STATS};
    sr[${STAT_LOSS}] = ${loss}; sr[${STAT_CE}] = ${ce}; sr[${STAT_DIV}] = ${div}; sr[${STAT_AGREE}] = ${agree}; sr[${STAT_ACC}] = ${acc};
  }`;
}

/** Both generators' opening: the block size, the helpers, and the kernel's signature up to its opening brace. */
function lossOpening(p: Readonly<LossP>): string {
  return `#define BLOCK ${p.block}
${reductionHelpers()}
${dtypeHelpers()}
${ROW_HELPERS}
extern "C" __global__ void loss(float* stats, ${ctype(p.dlogits)}* dlogits, const ${ctype(p.logits)}* logits, const ${ctype(p.teacher)}* teacher,
                                const int* targets, const float* weights, int n, int V, int LD,
                                float TEMP, float ALPHA, float BETA) {`;
}

/**
 * The multi-pass form, for jsd only (the other kinds run generateOnePass): its log m needs both log-sum-exps before the
 * divergence's pass, so the student row is read for its maximum, its T = 1 and T sums, the divergence and the gradient.
 */
function generateJsd(p: Readonly<LossP>): string {
  const lines: string[] = [];
  // log m = log(β·p + (1−β)·q), with the β = 0 and β = 1 ends exact (β is uniform over the grid: no divergence).
  const logm = `(BETA <= 0.0f ? lq : BETA >= 1.0f ? lp : fmaxf(LOGB + lp, LOG1MB + lq) + log1pf(expf(-fabsf((LOGB + lp) - (LOG1MB + lq)))))`;
  lines.push(`${lossOpening(p)}
  int row = blockIdx.x;
  if (row >= n) return;
  const ${ctype(p.logits)}* z = logits + (long long)row * LD;
  int y = targets[row];
  ${paddingRow(p.withGrad)}
  /* read z[y] before any thread may overwrite logits (dlogits may alias logits) */
  float zy = ldf(z, y);
  float mx = NEG_INF, bestS = NEG_INF;
  int argS = V;
  for (int j = threadIdx.x; j < V; j += BLOCK) { float x = ldf(z, j); if (x > bestS) { bestS = x; argS = j; } }
  mx = blockMax(bestS);`);
  lines.push(`  const ${ctype(p.teacher)}* zt = teacher + (long long)row * LD;
  float bestT = NEG_INF;
  int argT = V;
  for (int j = threadIdx.x; j < V; j += BLOCK) { float x = ldf(zt, j); if (x > bestT) { bestT = x; argT = j; } }
  float mxt = blockMax(bestT);
  int amS = blockArgMax(bestS, argS);
  int amT = blockArgMax(bestT, argT);
  float agree = amS == amT ? 1.0f : 0.0f;`);
  lines.push(`  float s1 = 0.0f;
  for (int j = threadIdx.x; j < V; j += BLOCK) s1 += fexp(ldf(z, j) - mx);
  float lse1 = mx + logf(blockSum(s1));
  float ce = lse1 - zy;`);
  lines.push(`  const float INV_T = 1.0f / TEMP;
  const float LOGB = logf(fmaxf(BETA, 1e-30f)), LOG1MB = logf(fmaxf(1.0f - BETA, 1e-30f));
  (void)LOGB; (void)LOG1MB; (void)BETA;
  float ss = 0.0f, st = 0.0f;
  for (int j = threadIdx.x; j < V; j += BLOCK) { ss += fexp((ldf(z, j) - mx) * INV_T); st += fexp((ldf(zt, j) - mxt) * INV_T); }
  float lseS = mx * INV_T + logf(blockSum(ss));
  float lseT = mxt * INV_T + logf(blockSum(st));
  float dv = 0.0f, qg = 0.0f;
  for (int j = threadIdx.x; j < V; j += BLOCK) {
    float lq = ldf(z, j) * INV_T - lseS;
    float lp = ldf(zt, j) * INV_T - lseT;
    float q = fexp(lq), pp = fexp(lp);
    float lm = ${logm};
    dv += BETA * pp * (lp - lm) + (1.0f - BETA) * q * (lq - lm);
    qg += q * (1.0f - BETA) * (lq - lm);
  }
  float divRaw = blockSum(dv);
  qg = blockSum(qg);
  float div = TEMP * TEMP * divRaw;
  float lossv = (1.0f - ALPHA) * ce + ALPHA * div;`);
  lines.push(`  ${storeStats('lossv', 'ce', 'div', 'agree', 'amS == y ? 1.0f : 0.0f')}`);
  if (p.withGrad) {
    lines.push(`  float w = weights[row];
  ${ctype(p.dlogits)}* g = dlogits + (long long)row * LD;
  for (int j = V + threadIdx.x; j < LD; j += BLOCK) stf(g, j, 0.0f); /* columns past the loss vocabulary: no gradient */
  for (int j = threadIdx.x; j < V; j += BLOCK) {
    float x = ldf(z, j);
    float ceg = fexp(x - lse1) - (j == y ? 1.0f : 0.0f);
    float lq = x * INV_T - lseS;
    float lp = ldf(zt, j) * INV_T - lseT;
    float q = fexp(lq), pp = fexp(lp);
    float lm = ${logm};
    float d = (1.0f - ALPHA) * ceg + ALPHA * TEMP * q * ((1.0f - BETA) * (lq - lm) - qg);
    stf(g, j, w * d);
  }`);
  }
  lines.push('}\n');
  return lines.join('\n');
}

/**
 * The one-pass statistics variant for kinds 'none', 'kl' and 'reverse-kl' (jsd keeps the multi-pass form above). Each
 * thread walks its columns once, keeping online (running-max rescaled) sums:
 *   m, s1 = Σ e^(z−m), ss = Σ e^((z−m)/T)             (student, T = 1 and T)
 *   mt, st = Σ e^((zt−mt)/T)                             (teacher)
 *   kl:  a = Σ e^((zt−mt)/T) · (zt − z)    → Σ p·(u − s) = a / (T·st), KL(p‖q) = Σ p(u − s) − lseT + lseS
 *   rkl: a = Σ e^((z−m)/T) · (z − zt)      → KL(q‖p) = a / (T·ss) − lseS + lseT
 * (u = zt/T, s = z/T); the block then rescales every thread's sums to the block maxima and adds them. So the row is
 * read once for the statistics and once more for the gradient (the multi-pass form read the student logits five
 * times and the teacher's three: the loss was 9% of an 8×1024 bf16 step on the H100, bandwidth-bound), 8 elements a
 * load and a store (ROW_HELPERS) where the rows are 16-byte aligned and the stride a multiple of 8 (scalar one element
 * per step held it at about 1.8 TB/s, latency-bound: 1.34 ms per 884-row chunk of Qwen's vocabulary in ncu, session 9;
 * a stride of 4 mod 8 runs scalar: the head's width is a multiple of 16 wherever the vocabularies allow, headWidth).
 */
function generateOnePass(p: Readonly<LossP>): string {
  const dist = p.kind !== 'none', kl = p.kind === 'kl', rkl = p.kind === 'reverse-kl';
  // One element of each pass, as a lambda over (x = z[j], xt = zt[j], j), run by forRow / mapRow (ROW_HELPERS).
  const stat = `[&](float x, float xt, int j) {
    ${dist ? '' : '(void)xt;'}
    if (x > m) { /* first index wins ties within a thread (its j ascend) */
      s1 *= fexp(m - x);
      ${dist ? `const float r = fexp((m - x) * INV_T); ss *= r; ${rkl ? 'a *= r;' : ''}` : ''}
      m = x; argS = j;
    }
    s1 += fexp(x - m);
    ${dist ? `const float es = fexp((x - m) * INV_T);
    ss += es;
    if (xt > mt) { const float r = fexp((mt - xt) * INV_T); st *= r; ${kl ? 'a *= r;' : ''} mt = xt; argT = j; }
    const float et = fexp((xt - mt) * INV_T);
    st += et;
    ${kl ? 'a += et * (xt - x);' : 'a += es * (x - xt);'}` : ''}
  }`;
  const gradOf = `[&](float x, float xt, int j) -> float {
    ${dist ? '' : '(void)xt;'}
    const float ceg = fexp(x - lse1) - (j == y ? 1.0f : 0.0f);
    ${dist ? `const float lq = x * INV_T - lseS, lp = xt * INV_T - lseT;
    const float q = fexp(lq), pp = fexp(lp);
    ${kl ? '(void)lq; (void)lp;' : '(void)pp;'}
    return w * ((1.0f - ALPHA) * ceg + ALPHA * TEMP * ${kl ? '(q - pp)' : 'q * (lq - lp - divRaw)'});` : 'return w * ceg;'}
  }`;
  const grad = !p.withGrad ? '' : `
  const float w = weights[row];
  ${ctype(p.dlogits)}* g = dlogits + (long long)row * LD;
  for (int j = V + threadIdx.x; j < LD; j += BLOCK) stf(g, j, 0.0f); /* past the loss vocabulary: no gradient */
  mapRow<${dist}>(g, z, zt, V, vec, ${gradOf});`;
  return `${lossOpening(p)}
  (void)BETA;
  const int row = blockIdx.x;
  if (row >= n) return;
  const ${ctype(p.logits)}* z = logits + (long long)row * LD;
  const int y = targets[row];
  ${paddingRow(p.withGrad)}
  const float zy = ldf(z, y); /* read before any thread may overwrite logits (a dlogits of their dtype may alias them) */
  ${dist ? 'const float INV_T = 1.0f / TEMP;' : '(void)TEMP;'}
  float m = NEG_INF, s1 = 0.0f${dist ? ', ss = 0.0f' : ''};
  int argS = V;
  ${dist ? `const ${ctype(p.teacher)}* zt = teacher + (long long)row * LD;
  float mt = NEG_INF, st = 0.0f, a = 0.0f;
  int argT = V;` : `const ${ctype(p.logits)}* zt = z; (void)teacher;`}
  /* 8-element loads where every row is aligned (uniform over the grid): forRow / mapRow */
  const bool vec = ${vecCondition([['logits', p.logits], ...(dist ? [['teacher', p.teacher] as const] : []), ...(p.withGrad ? [['dlogits', p.dlogits] as const] : [])])};
  forRow<${dist}>(z, zt, V, vec, ${stat});
  const float M = blockMax(m);
  const float lse1 = M + logf(blockSum(s1 * expf(m - M)));
  const float ce = lse1 - zy;
  ${dist ? `const float ssB = blockSum(ss * expf((m - M) * INV_T));
  const float lseS = M * INV_T + logf(ssB);
  const float MT = blockMax(mt);
  const float stB = blockSum(st * expf((mt - MT) * INV_T));
  const float lseT = MT * INV_T + logf(stB);
  const float aB = blockSum(a * expf((${kl ? 'mt - MT' : 'm - M'}) * INV_T));
  /* lseS − lseT as (M − MT)/T + log(ssB/stB): no cancellation of two large log-sum-exps when the models agree */
  const float divRaw = ${kl ? 'aB * INV_T / stB + (M - MT) * INV_T + logf(ssB / stB)' : 'aB * INV_T / ssB + (MT - M) * INV_T + logf(stB / ssB)'};
  const float div = TEMP * TEMP * divRaw;
  const int amS = blockArgMax(m, argS);
  const int amT = blockArgMax(mt, argT);
  const float agree = amS == amT ? 1.0f : 0.0f;
  const float lossv = (1.0f - ALPHA) * ce + ALPHA * div;` : `const int amS = blockArgMax(m, argS);
  const float div = 0.0f, agree = 0.0f, lossv = ce;`}
  ${storeStats('lossv', 'ce', 'div', 'agree', 'amS == y ? 1.0f : 0.0f')}${grad}
}
`;
}

export const lossKernel = defineFamily<LossP>({
  name: 'loss',
  schema: {
    kind: { kind: 'enum', values: LOSS_KINDS }, withGrad: { kind: 'bool' }, dlogits: DTYPE_DOMAIN, logits: DTYPE_DOMAIN,
    teacher: DTYPE_DOMAIN, block: BLOCK_DOMAIN,
  },
  example: { kind: 'jsd', withGrad: true, dlogits: 'bf16', logits: 'bf16', teacher: 'f32', block: 256 },
  generate: (p) => (p.kind === 'jsd' ? generateJsd(p) : generateOnePass(p)),
});
