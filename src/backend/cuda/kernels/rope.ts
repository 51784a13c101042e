/**
 * Rotary embedding (rotate-half layout) forward and backward. Baked: headDim, theta, block size.
 * Angles are computed in double (theta^(-2i/headDim) and position · frequency), matching a float64 host
 * reference; only the final rotation is float32.
 */
import { BLOCK_DOMAIN, defineFamily, f64 } from './spec.js';

type RopeP = { headDim: number; theta: number; block: number };
const schema = { headDim: { kind: 'int', min: 2, step: 2 }, theta: { kind: 'float', min: 1 }, block: BLOCK_DOMAIN } as const;

function ropeSource(name: string, backward: boolean, p: Readonly<RopeP>): string {
  const body = backward
    ? `out[base + i] += y1 * c + y2 * s;
    out[base + i + HALF] += -y1 * s + y2 * c;`
    : `out[base + i] = y1 * c - y2 * s;
    out[base + i + HALF] = y2 * c + y1 * s;`;
  return `#define BLOCK ${p.block}
#define HD ${p.headDim}
#define HALF ${p.headDim / 2}
#define THETA ${f64(p.theta)}
/* rows = B*T*heads; row r has position pos0 + (r / heads) % T. out may alias inp (forward). */
extern "C" __global__ void ${name}(float* out, const float* inp, long long rows, int T, int heads, int pos0) {
  long long total = rows * HALF;
  for (long long idx = (long long)blockIdx.x * BLOCK + threadIdx.x; idx < total; idx += (long long)gridDim.x * BLOCK) {
    int i = (int)(idx % HALF);
    long long row = idx / HALF;
    int t = (int)((row / heads) % T);
    double freq = pow(THETA, -2.0 * (double)i / (double)HD);
    double ang = (double)(pos0 + t) * freq;
    float c = (float)cos(ang);
    float s = (float)sin(ang);
    long long base = row * HD;
    float y1 = inp[base + i];
    float y2 = inp[base + i + HALF];
    ${body}
  }
}
`;
}

export const ropeForward = defineFamily<RopeP>({
  name: 'rope_fwd', schema, example: { headDim: 64, theta: 1000000, block: 256 },
  generate: (p) => ropeSource('rope_fwd', false, p),
});

/** dinp += Rᵀ dout (out = dinp, inp = dout in the generated signature). */
export const ropeBackward = defineFamily<RopeP>({
  name: 'rope_bwd', schema, example: { headDim: 64, theta: 1000000, block: 256 },
  generate: (p) => ropeSource('rope_bwd', true, p),
});
