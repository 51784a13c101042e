/**
 * Rotary embedding (rotate-half layout) forward and backward, one family pair per RoPE kind (src/backend/rope.ts).
 *
 * - rope_fwd / rope_bwd (plain RoPE). Baked: headDim, theta, block.
 * - rope_linear_*, rope_llama3_*, rope_yarn_* (scaled RoPE). Baked: headDim, the kind's every parameter, block.
 * Every kind bakes its inverse frequencies, computed on the host by ropeInvFreq (the same float64 function the CPU
 * backend uses), into the source as a double table, with yarn's attention factor as ATTN; so the kernel source, and
 * therefore its cache key, changes with every parameter that changes the math. The angle (position · frequency) and
 * its cos and sin are double; only the final rotation is float32. A forward family bakes `bias` ('none', or the dtype
 * of a [heads · HD] bias added to every row before the rotation: the q/k projections' bias, so that no separate pass
 * adds it; in float, one rounding at the store); a backward family bakes `acc` (true: dinp += Rᵀ dout; false: dinp =
 * Rᵀ dout, overwritten, so the caller need not zero it and the old values are never read). Every family also bakes
 * the dtypes ('f32' | 'bf16') of `out` and `inp` (out may alias inp: both must then have one dtype); a bf16 store
 * rounds once (the accumulating backward's += reads, adds in float, rounds).
 *
 * Launch (CudaBackend.rope): one thread per (token row r of the B·T rows, pair i < HALF), a grid-stride loop over
 * rows·HALF: idx ↦ (r = idx / HALF, i = idx % HALF), a bijection of [0, rows·HALF) onto the (r, i) pairs, so any grid
 * covers each pair exactly once. The thread computes the angle's (c, s) once (position pos0 + r % T) and rotates pair
 * i of every head of row r: elements r·stride + h·HD + {i, i + HALF}, h < heads — which are all the elements of the
 * tensor, each touched by exactly one thread (once per pair, once per head). Rows of out and inp start outStride and
 * inStride elements apart (runtime arguments; heads·HD for a packed tensor, more for the q or k columns of a fused
 * q/k/v product's [N, Q + 2·KV] output or gradient). Heads go in groups of HU: the group's
 * inputs (and the backward's old outputs) are read before any of its stores, so that the loads overlap (the compiler
 * may not reorder them across the stores since out may alias inp); reading first is also what makes the forward
 * in place correct, as every element read is written only by the same thread.
 */
import { ropeInvFreq, yarnMscale, type RopeSpec } from '../../rope.js';
import {
  BLOCK_DOMAIN, DTYPE_DOMAIN, OPTIONAL_DTYPE_DOMAIN, ctype, defineFamily, dtypeHelpers, f64, type KernelFamily, type KernelSpec, type ParamRecord, type Schema,
} from './spec.js';

type RopeP = { headDim: number; theta: number; out: string; inp: string; seqPos: boolean; bias: string; block: number };
const schema = {
  headDim: { kind: 'int', min: 2, step: 2 }, theta: { kind: 'float', min: 1 }, out: DTYPE_DOMAIN, inp: DTYPE_DOMAIN, seqPos: { kind: 'bool' },
  // `bias` (forward only): 'none', or the dtype of a bias [heads · HD] added to each row before the rotation
  bias: OPTIONAL_DTYPE_DOMAIN, block: BLOCK_DOMAIN,
} as const;
/** A backward family's parameters: the forward's without the bias, with `acc` (accumulate into dinp, or overwrite it). */
type Bwd<P> = Omit<P, 'bias'> & { acc: boolean };
/** A backward family's schema: the forward's without the bias, with `acc`. */
function backwardSchema<S extends { bias: unknown }>(s: S): Omit<S, 'bias'> & { acc: { kind: 'bool' } } {
  const { bias: _bias, ...rest } = s;
  return { ...rest, acc: { kind: 'bool' } };
}
/**
 * The operand dtypes of one rope launch, and whether it reads per-sequence start positions (`seqPos`: an int array of B
 * positions, row r of sequence r / T at seqPos[r / T] + r % T; batched generation of prompts of different lengths).
 */
export interface RopeDtypes { out: string; inp: string; seqPos?: boolean; bias?: string; acc?: boolean }

/** Heads per group in the kernel's head loop (loads of a group are issued before its stores). */
const HEAD_GROUP = 4;

/**
 * The kernel of every kind, with `rope`'s inverse-frequency table and attention factor baked. Arguments:
 * (out, inp, rows = B·T, T, heads, pos0, outStride, inStride, rowPos (null, or a position per row)[, seqPos][, bias]); launch rows·HD/2 threads or fewer
 * (grid-stride loop).
 */
function ropeSource(name: string, backward: boolean, rope: RopeSpec, headDim: number, block: number, dt: RopeDtypes): string {
  const seq = dt.seqPos === true, bias = dt.bias ?? 'none', acc = backward && dt.acc !== false;
  const inv = ropeInvFreq(rope, headDim);
  const attn = rope.type === 'yarn' ? rope.attentionFactor : 1;
  const table = Array.from(inv, (v) => f64(v)).join(', ');
  const load = acc
    ? `y1[u] = ldf(inp, ei); y2[u] = ldf(inp, ei + HALF); o1[u] = ldf(out, eo); o2[u] = ldf(out, eo + HALF);`
    : `y1[u] = ldf(inp, ei); y2[u] = ldf(inp, ei + HALF);${bias === 'none' ? '' : ' y1[u] += ldf(bias, (h0 + u) * HD + i); y2[u] += ldf(bias, (h0 + u) * HD + i + HALF);'}`;
  const store = acc
    ? `stf(out, eo, o1[u] + (y1[u] * c + y2[u] * s)); stf(out, eo + HALF, o2[u] + (-y1[u] * s + y2[u] * c));`
    : backward
      ? `stf(out, eo, y1[u] * c + y2[u] * s); stf(out, eo + HALF, -y1[u] * s + y2[u] * c);`
      : `stf(out, eo, y1[u] * c - y2[u] * s); stf(out, eo + HALF, y2[u] * c + y1[u] * s);`;
  return `#define BLOCK ${block}
#define HD ${headDim}
#define HALF ${headDim / 2}
#define HU ${HEAD_GROUP}
__device__ const double ${name}_inv_freq[HALF] = { ${table} };
#define ATTN ${f64(attn)}
${dtypeHelpers()}
/* rows = B*T token rows of heads*HD elements, row r of out at r*outStride and of inp at r*inStride; row r has position ${seq ? 'seqPos[r / T]' : 'pos0'} + r % T,
   or rowPos[r] where rowPos is given (documents packed in a window: each row's position in its document). One thread per (row, pair i), all heads.
   out may alias inp (with equal strides).${bias === 'none' ? '' : ' bias[heads*HD] is added to every row before the rotation (in float, one rounding at the store).'} */
extern "C" __global__ void ${name}(${ctype(dt.out)}* out, const ${ctype(dt.inp)}* inp, long long rows, int T, int heads, int pos0, long long outStride,
                                   long long inStride, const int* __restrict__ rowPos${seq ? ', const int* seqPos' : ''}${bias === 'none' ? '' : `, const ${ctype(bias)}* bias`}) {
  long long total = rows * HALF;
  for (long long idx = (long long)blockIdx.x * BLOCK + threadIdx.x; idx < total; idx += (long long)gridDim.x * BLOCK) {
    int i = (int)(idx % HALF);
    long long row = idx / HALF;
    int t = (int)(row % T);
    double ang = (double)(rowPos != nullptr ? rowPos[row] : ${seq ? 'seqPos[row / T]' : 'pos0'} + t) * ${name}_inv_freq[i];
    double sd, cd;
    sincos(ang, &sd, &cd);
    float c = (float)(ATTN * cd);
    float s = (float)(ATTN * sd);
    const long long bo = row * outStride + i, bi = row * inStride + i;
    for (int h0 = 0; h0 < heads; h0 += HU) {
      float y1[HU], y2[HU]${acc ? ', o1[HU], o2[HU]' : ''};
#pragma unroll
      for (int u = 0; u < HU; u++) {
        if (h0 + u < heads) { const long long ei = bi + (long long)(h0 + u) * HD${acc ? ', eo = bo + (long long)(h0 + u) * HD' : ''}; ${load} }
      }
#pragma unroll
      for (int u = 0; u < HU; u++) {
        if (h0 + u < heads) { const long long eo = bo + (long long)(h0 + u) * HD; ${store} }
      }
    }
  }
}
`;
}

const plainSource = (name: string, backward: boolean, p: Readonly<RopeP>): string =>
  ropeSource(name, backward, { type: 'default', theta: p.theta }, p.headDim, p.block, p);

export const ropeForward = defineFamily<RopeP>({
  name: 'rope_fwd', schema, example: { headDim: 64, theta: 1000000, out: 'bf16', inp: 'bf16', seqPos: false, bias: 'bf16', block: 256 },
  generate: (p) => plainSource('rope_fwd', false, p),
});

/** dinp += Rᵀ dout, or with acc false dinp = Rᵀ dout (out = dinp, inp = dout in the generated signature). */
export const ropeBackward = defineFamily<Bwd<RopeP>>({
  name: 'rope_bwd', schema: backwardSchema(schema), example: { headDim: 64, theta: 1000000, out: 'f32', inp: 'bf16', seqPos: false, block: 256, acc: true },
  generate: (p) => plainSource('rope_bwd', true, { ...p, bias: 'none' }),
});

// ---- scaled kinds -------------------------------------------------------------------------------------------

type LinearP = { headDim: number; theta: number; factor: number; out: string; inp: string; seqPos: boolean; bias: string; block: number };
const linearSchema = { ...schema, factor: { kind: 'float', min: 1e-6 } } as const;
const linearRope = (p: Readonly<LinearP>): RopeSpec => ({ type: 'linear', theta: p.theta, factor: p.factor });

type Llama3P = {
  headDim: number; theta: number; factor: number; lowFreqFactor: number; highFreqFactor: number;
  originalMaxPositionEmbeddings: number; out: string; inp: string; seqPos: boolean; bias: string; block: number;
};
const llama3Schema = {
  ...schema, factor: { kind: 'float', min: 1e-6 }, lowFreqFactor: { kind: 'float', min: 1e-6 },
  highFreqFactor: { kind: 'float', min: 1e-6 }, originalMaxPositionEmbeddings: { kind: 'int', min: 1 },
} as const;
const llama3Rope = (p: Readonly<Llama3P>): RopeSpec => ({
  type: 'llama3', theta: p.theta, factor: p.factor, lowFreqFactor: p.lowFreqFactor, highFreqFactor: p.highFreqFactor,
  originalMaxPositionEmbeddings: p.originalMaxPositionEmbeddings,
});
// Llama 3.2 1B/3B: theta 500000, factor 32, low 1, high 4, original context 8192.
const llama3Example: Llama3P = {
  headDim: 64, theta: 500000, factor: 32, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192, out: 'bf16', inp: 'bf16', seqPos: false, bias: 'none', block: 256,
};

type YarnP = {
  headDim: number; theta: number; factor: number; originalMaxPositionEmbeddings: number; betaFast: number; betaSlow: number;
  attentionFactor: number; truncate: boolean; out: string; inp: string; seqPos: boolean; bias: string; block: number;
};
const yarnSchema = {
  ...schema, factor: { kind: 'float', min: 1e-6 }, originalMaxPositionEmbeddings: { kind: 'int', min: 1 },
  betaFast: { kind: 'float', min: 1e-6 }, betaSlow: { kind: 'float', min: 1e-6 }, attentionFactor: { kind: 'float', min: 1e-6 },
  truncate: { kind: 'bool' },
} as const;
const yarnRope = (p: Readonly<YarnP>): RopeSpec => ({
  type: 'yarn', theta: p.theta, factor: p.factor, originalMaxPositionEmbeddings: p.originalMaxPositionEmbeddings,
  betaFast: p.betaFast, betaSlow: p.betaSlow, attentionFactor: p.attentionFactor, truncate: p.truncate,
});
// Qwen2.5 long context (factor 4 over 32768). truncate false in the example so that every parameter moves the table
// (with truncation a small change of beta_slow can land on the same integer bound: same math, same kernel).
const yarnExample: YarnP = {
  headDim: 64, theta: 1000000, factor: 4, originalMaxPositionEmbeddings: 32768, betaFast: 32, betaSlow: 1,
  attentionFactor: yarnMscale(4), truncate: false, out: 'bf16', inp: 'bf16', seqPos: false, bias: 'f32', block: 256,
};

function scaledPair<P extends ParamRecord & { headDim: number; out: string; inp: string; seqPos: boolean; bias: string; block: number }>(
  kind: string, s: Schema<P>, example: P,
  toRope: (p: Readonly<P>) => RopeSpec,
): [KernelFamily<P>, KernelFamily<Bwd<P>>] {
  const fwd = defineFamily<P>({
    name: `rope_${kind}_fwd`, schema: s, example,
    generate: (p) => ropeSource(`rope_${kind}_fwd`, false, toRope(p), p.headDim, p.block, p),
  });
  const { bias: _bias, ...bwdExample } = example;
  const bwd = defineFamily<Bwd<P>>({
    name: `rope_${kind}_bwd`, schema: backwardSchema(s as Schema<P> & { bias: unknown }) as unknown as Schema<Bwd<P>>,
    example: { ...bwdExample, acc: true } as unknown as Bwd<P>,
    generate: (p) => ropeSource(`rope_${kind}_bwd`, true, toRope({ ...p, bias: 'none' } as unknown as P), p.headDim as number, p.block as number,
      { out: p.out as string, inp: p.inp as string, seqPos: p.seqPos as boolean, acc: p.acc as boolean }),
  });
  return [fwd, bwd];
}

export const [ropeLinearForward, ropeLinearBackward] = scaledPair<LinearP>(
  'linear', linearSchema, { headDim: 64, theta: 10000, factor: 4, out: 'bf16', inp: 'bf16', seqPos: false, bias: 'none', block: 256 }, linearRope);
export const [ropeLlama3Forward, ropeLlama3Backward] = scaledPair<Llama3P>('llama3', llama3Schema, llama3Example, llama3Rope);
export const [ropeYarnForward, ropeYarnBackward] = scaledPair<YarnP>('yarn', yarnSchema, yarnExample, yarnRope);

/**
 * The kernel spec that rotates (forward) or back-propagates (backward) with this RoPE. `dt`: the dtypes of out and inp
 * (default both f32); a backward accumulates into out unless `dt.acc` is false.
 */
export function ropeKernel(backward: boolean, rope: RopeSpec, headDim: number, block: number,
  dt: RopeDtypes = { out: 'f32', inp: 'f32' }): KernelSpec {
  const { out, inp } = dt, seqPos = dt.seqPos === true, bias = dt.bias ?? 'none', acc = dt.acc !== false;
  if (backward && bias !== 'none') throw new Error('rope: a bias is added in the forward only');
  if (!backward && dt.acc !== undefined) throw new Error('rope: the forward overwrites its output (acc is a backward parameter)');
  switch (rope.type) {
    case 'default':
      return backward ? ropeBackward.make({ headDim, theta: rope.theta, out, inp, seqPos, block, acc })
        : ropeForward.make({ headDim, theta: rope.theta, out, inp, seqPos, bias, block });
    case 'linear':
      return backward ? ropeLinearBackward.make({ headDim, theta: rope.theta, factor: rope.factor, out, inp, seqPos, block, acc })
        : ropeLinearForward.make({ headDim, theta: rope.theta, factor: rope.factor, out, inp, seqPos, bias, block });
    case 'llama3': {
      const p = {
        headDim, theta: rope.theta, factor: rope.factor, lowFreqFactor: rope.lowFreqFactor, highFreqFactor: rope.highFreqFactor,
        originalMaxPositionEmbeddings: rope.originalMaxPositionEmbeddings, out, inp, seqPos, block,
      };
      return backward ? ropeLlama3Backward.make({ ...p, acc }) : ropeLlama3Forward.make({ ...p, bias });
    }
    case 'yarn': {
      const p = {
        headDim, theta: rope.theta, factor: rope.factor, originalMaxPositionEmbeddings: rope.originalMaxPositionEmbeddings,
        betaFast: rope.betaFast, betaSlow: rope.betaSlow, attentionFactor: rope.attentionFactor, truncate: rope.truncate, out, inp, seqPos, block,
      };
      return backward ? ropeYarnBackward.make({ ...p, acc }) : ropeYarnForward.make({ ...p, bias });
    }
  }
}
