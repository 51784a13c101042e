/**
 * The fused per-token loss against a sparse teacher (a teacher cache): one block per row. The estimator, its
 * gradient and the stats row are those of the CPU backend's src/backend/cpu/kernels/sparse-loss.ts (float64 there):
 *   D̂ = T² [Σ_k a_k h(q_s(k), q_t(k)) + h(Q_s, r)],  a_k = π_k / q_t(k)
 *   ∂D̂/∂z_i = T [γ_i [i in slots] + γ_r q_s(i)/Q_s [i not in slots] − Γ q_s(i)],  γ_k = a_k ∂h/∂ℓ_s
 * Thread k < S owns slot k (S ≤ MAX_SPARSE_SLOTS ≤ BLOCK): it reads its logit before any thread writes the gradient
 * (an f32 dlogits may alias the logits) and, after the dense pass, overwrites its token's gradient with the full value
 * (computed in float32 and rounded once, as every other element).
 * Baked: kind, withGrad, the dtypes of dlogits and logits (f32 | bf16; a dlogits may alias logits of its own dtype), withTail (a top-K cache: the rows may carry a tail bucket; Q_s is then
 * summed over the tokens outside the slots, marked in a shared bitmap of the vocabulary, instead of 1 − Σ slots,
 * which cancels in float32), block size. Runtime: temperature, alpha, beta.
 */
import { BLOCK_DOMAIN, DTYPE_DOMAIN, ctype, defineFamily, dtypeHelpers, reductionHelpers } from './spec.js';
import { ROW_HELPERS, paddingRow, storeStats, vecCondition } from './loss.js';

/** The largest vocabulary the tail bitmap covers (32 KiB of shared memory). */
export const SPARSE_TAIL_MAX_VOCAB = 262144;

export type SparseLossP = { kind: string; withGrad: boolean; dlogits: string; logits: string; withTail: boolean; block: number };

function termFn(kind: string): string {
  const body = kind === 'kl'
    ? 'const float qt = expf(lt); h = qt > 0.0f ? qt * (lt - ls) : 0.0f; dh = -qt;'
    : kind === 'reverse-kl'
      ? 'const float qs = expf(ls); if (qs > 0.0f) { h = qs * (ls - lt); dh = qs * (ls - lt + 1.0f); } else { h = 0.0f; dh = 0.0f; }'
      : `const float qs = expf(ls), qt = expf(lt);
  const float a = BETA > 0.0f ? logf(BETA) + lt : NEG_INF, b = BETA < 1.0f ? log1pf(-BETA) + ls : NEG_INF;
  const float lm = a == NEG_INF ? b : b == NEG_INF ? a : fmaxf(a, b) + log1pf(expf(-fabsf(a - b)));
  h = 0.0f; dh = 0.0f;
  if (BETA > 0.0f && qt > 0.0f) h += BETA * qt * (lt - lm);
  if (BETA < 1.0f && qs > 0.0f) { const float g = (1.0f - BETA) * qs * (ls - lm); h += g; dh = g; }`;
  return `/* h(q_s, q_t) of one token (or the tail bucket) and dh/d(log q_s), from ls = log q_s, lt = log q_t */
__device__ __forceinline__ void term(float ls, float lt, float BETA, float& h, float& dh) {
  (void)BETA;
  ${body}
}`;
}

function generate(p: Readonly<SparseLossP>): string {
  const tail = p.withTail;
  const grad = !p.withGrad ? '' : `
  const float w = weights[row];
  const float Gamma = gS + gT;
  const bool tailOn = gT != 0.0f && logQs > NEG_INF; /* γ_r q_s(j) / Q_s = γ_r exp(log q_s(j) − log Q_s) */
  float dk = 0.0f;
  if (id >= 0) {
    const float ceg = expf(zk - lse1) - (id == y ? 1.0f : 0.0f);
    dk = w * ((1.0f - ALPHA) * ceg + ALPHA * TEMP * (a * dh - Gamma * qsk));
  }
  __syncthreads(); /* every slot's logit is read before the dense pass may overwrite it */
  ${ctype(p.dlogits)}* g = dlogits + (long long)row * LD;
  for (int j = V + threadIdx.x; j < LD; j += BLOCK) stf(g, j, 0.0f); /* past the loss vocabulary */
  mapRow<false>(g, z, (const float*)nullptr, V, vec, [&](float x, float, int j) -> float {
    const float ceg = fexp(x - lse1) - (j == y ? 1.0f : 0.0f);
    const float lq = x * INV_T - lseS;
    const float qs = fexp(lq);
    const float tailPart = tailOn ? gT * fexp(lq - logQs) : 0.0f;
    return w * ((1.0f - ALPHA) * ceg + ALPHA * TEMP * (tailPart - Gamma * qs));
  });
  __syncthreads();
  if (id >= 0) stf(dlogits, (long long)row * LD + id, dk);`;
  return `#define BLOCK ${p.block}
${reductionHelpers()}
${dtypeHelpers()}
${ROW_HELPERS}
${termFn(p.kind)}
extern "C" __global__ void sparse_loss(float* stats, ${ctype(p.dlogits)}* dlogits, const ${ctype(p.logits)}* logits, const int* targets,
                                       const float* weights, const int* ids, const float* prob, const float* logq,
                                       const float* tail, const int* tArgmax, int n, int V, int LD, int S,
                                       float TEMP, float ALPHA, float BETA) {
  const int row = blockIdx.x;
  if (row >= n) return;
  const ${ctype(p.logits)}* z = logits + (long long)row * LD;
  const int y = targets[row];
  ${paddingRow(p.withGrad)}
  const float INV_T = 1.0f / TEMP;
  const float zy = ldf(z, y);
  /* this thread's slot, read before any write */
  int id = -1;
  float zk = 0.0f, pi = 0.0f, lt = 0.0f;
  if ((int)threadIdx.x < S) {
    id = ids[(long long)row * S + threadIdx.x];
    if (id >= V) id = -1; /* never on the host's data (the cache decoder refuses it): no read or write past the row */
    if (id >= 0) { zk = ldf(z, id); pi = prob[(long long)row * S + threadIdx.x]; lt = logq[(long long)row * S + threadIdx.x]; }
  }
  const float tl = tail[row];
  ${tail ? `__shared__ unsigned inSlots[${SPARSE_TAIL_MAX_VOCAB / 32}];
  const bool hasTail = tl >= 0.0f;
  if (hasTail) {
    for (int j = threadIdx.x; j < (V + 31) / 32; j += BLOCK) inSlots[j] = 0u;
    __syncthreads();
    if (id >= 0) atomicOr(&inSlots[id >> 5], 1u << (id & 31));
    __syncthreads();
  }` : ''}
  /* one pass: online sums at T = 1 and at T${tail ? ', and at T over the tokens outside the slots' : ''} */
  float m = NEG_INF, s1 = 0.0f, ss = 0.0f${tail ? ', mo = NEG_INF, so = 0.0f' : ''};
  int argS = V;
  /* 8-element loads where every row is aligned (uniform over the grid), as the dense loss kernel (forRow, mapRow) */
  const bool vec = ${vecCondition([['logits', p.logits], ...(p.withGrad ? [['dlogits', p.dlogits] as const] : [])])};
  forRow<false>(z, (const float*)nullptr, V, vec, [&](float x, float, int j) { /* first index wins ties within a thread (its j ascend) */
    if (x > m) { const float r = fexp((m - x) * INV_T); s1 *= fexp(m - x); ss *= r; m = x; argS = j; }
    s1 += fexp(x - m);
    const float e = fexp((x - m) * INV_T);
    ss += e;
    ${tail ? `if (hasTail && !((inSlots[j >> 5] >> (j & 31)) & 1u)) {
      if (x > mo) { so *= fexp((mo - x) * INV_T); mo = x; }
      so += fexp((x - mo) * INV_T);
    }` : ''}
  });
  const float M = blockMax(m);
  const float lse1 = M + logf(blockSum(s1 * expf(m - M)));
  const float ssB = blockSum(ss * expf((m - M) * INV_T));
  const float lseS = M * INV_T + logf(ssB);
  const int amS = blockArgMax(m, argS);
  const float ce = lse1 - zy;
  /* the slots */
  float a = 0.0f, h = 0.0f, dh = 0.0f, qsk = 0.0f;
  if (id >= 0) {
    const float ls = zk * INV_T - lseS;
    qsk = expf(ls);
    a = pi == 0.0f ? 0.0f : expf(logf(pi) - lt); /* pi / q_t without overflowing expf(-lt) */
    term(ls, lt, BETA, h, dh);
  }
  const float divS = blockSum(a * h);
  const float gS = blockSum(a * dh);
  float gT = 0.0f, logQs = NEG_INF, divT = 0.0f;
  ${tail ? `const float MO = blockMax(mo);
  const float soB = blockSum(MO == NEG_INF ? 0.0f : so * expf((mo - MO) * INV_T));
  if (hasTail) {
    /* log Q_s = (MO − M)/T + log(soB) − log(ssB): finite however far below the slots the other tokens sit */
    logQs = soB > 0.0f ? (MO - M) * INV_T + logf(soB) - logf(ssB) : NEG_INF;
    term(logQs, tl > 0.0f ? logf(tl) : NEG_INF, BETA, divT, gT);
  }` : '(void)tl;'}
  const float div = TEMP * TEMP * (divS + divT);
  const float lossv = (1.0f - ALPHA) * ce + ALPHA * div;
  ${storeStats('lossv', 'ce', 'div', 'amS == tArgmax[row] ? 1.0f : 0.0f', 'amS == y ? 1.0f : 0.0f')}${grad}
}
`;
}

export const sparseLossKernel = defineFamily<SparseLossP>({
  name: 'sparse_loss',
  schema: {
    kind: { kind: 'enum', values: ['kl', 'reverse-kl', 'jsd'] }, withGrad: { kind: 'bool' }, dlogits: DTYPE_DOMAIN,
    logits: DTYPE_DOMAIN, withTail: { kind: 'bool' }, block: BLOCK_DOMAIN,
  },
  example: { kind: 'jsd', withGrad: true, dlogits: 'bf16', logits: 'bf16', withTail: true, block: 512 },
  generate,
});
