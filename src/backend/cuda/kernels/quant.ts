/**
 * Frozen 4-bit weights (src/quant/nf4.ts is the format and the host reference): dequant_nf4 expands an NF4 tensor into
 * its compute dtype right before the products that read it (Backend.dequantNf4; the model keeps one layer's matrices
 * expanded at a time, src/model/frozen.ts). Each thread step takes one int32 word (8 codes: byte j of the word holds
 * elements 2j (high nibble) and 2j + 1 (low nibble)), multiplies each code's level by its block's absmax in float32,
 * and stores through stf (one rounding into bf16). Baked: the out dtype, the thread block, the NF4 block size (the
 * format's, 64 in QLoRA) and the 16 levels (constants of the format, in the source and so in the cache key).
 */
import { NF4_LEVELS } from '../../../quant/nf4.js';
import { BLOCK_DOMAIN, DTYPE_DOMAIN, ctype, defineFamily, dtypeHelpers } from './spec.js';

type DequantP = { out: string; block: number; nf4Block: number };

/** A float32 constant as a C literal that rounds back to exactly that float (its shortest double form, suffixed f). */
function f32Literal(v: number): string {
  const s = String(v);
  return `${/[.eE]/.test(s) ? s : `${s}.0`}f`;
}

export const dequantNf4 = defineFamily<DequantP>({
  name: 'dequant_nf4',
  schema: { out: DTYPE_DOMAIN, block: BLOCK_DOMAIN, nf4Block: { kind: 'int', min: 2, max: 4096, step: 2 } },
  example: { out: 'bf16', block: 256, nf4Block: 64 },
  generate: (p) => `#define BLOCK ${p.block}
#define NF4_BLOCK ${p.nf4Block}
${dtypeHelpers()}
__device__ __forceinline__ float nf4Level(unsigned c) {
  const float levels[16] = { ${Array.from(NF4_LEVELS, f32Literal).join(', ')} };
  return levels[c];
}
extern "C" __global__ void dequant_nf4(${ctype(p.out)}* out, const unsigned* codes, const float* absmax, long long n) {
  // The levels in shared memory: a dynamically indexed local array would live in (slow) local memory.
  __shared__ float lv[16];
  if (threadIdx.x < 16) lv[threadIdx.x] = nf4Level(threadIdx.x);
  __syncthreads();
  const long long words = (n + 7) / 8;
  for (long long w = (long long)blockIdx.x * BLOCK + threadIdx.x; w < words; w += (long long)gridDim.x * BLOCK) {
    const unsigned word = codes[w];
    #pragma unroll
    for (int j = 0; j < 8; j++) {
      const long long i = w * 8 + j;
      if (i >= n) break;
      const unsigned byte = (word >> (8 * (j >> 1))) & 0xffu;
      const unsigned c = (j & 1) == 0 ? byte >> 4 : byte & 15u;
      stf(out, i, lv[c] * absmax[i / NF4_BLOCK]); // one float32 product (nothing to contract into an FMA)
    }
  }
}
`,
});
