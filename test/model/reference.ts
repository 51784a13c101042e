/**
 * An independent float64 reference of the Qwen2/Llama/Qwen3/SmolLM3 forward pass (Qwen3: RMSNorm over each head's
 * slice of q and k with [head_dim] weights, before RoPE; SmolLM3: no RoPE on the layers noRopeLayers lists), written the plain way (nested loops over
 * named tensors, no backend, no shared kernels) for the model tests to compare against.
 */
import type { ModelConfig } from '../../src/model/config.js';
import type { ParamLayout } from '../../src/model/params.js';
import { refRotate } from './rope-reference.js';

type Mat = Float64Array;

export function referenceLogits(c: ModelConfig, layout: ParamLayout, w: ArrayLike<number>, ids: ArrayLike<number>, b: number, t: number): Float64Array {
  const get = (name: string): Mat => {
    const ti = layout.tensors.find((x) => x.name === name);
    if (!ti) throw new Error(`no tensor ${name}`);
    return Float64Array.from({ length: ti.size }, (_, i) => w[ti.offset + i]!);
  };
  const C = c.hiddenSize, hd = c.headDim, nH = c.numHeads, nKv = c.numKvHeads, I = c.intermediateSize, V = c.vocabSize;
  const linear = (x: Mat, rows: number, inF: number, W: Mat, outF: number, bias: Mat | null): Mat => {
    const y = new Float64Array(rows * outF);
    for (let r = 0; r < rows; r++) {
      for (let o = 0; o < outF; o++) {
        let s = bias ? bias[o]! : 0;
        for (let i = 0; i < inF; i++) s += x[r * inF + i]! * W[o * inF + i]!;
        y[r * outF + o] = s;
      }
    }
    return y;
  };
  const rmsnorm = (x: Mat, rows: number, g: Mat): Mat => {
    const y = new Float64Array(rows * C);
    for (let r = 0; r < rows; r++) {
      let ss = 0;
      for (let i = 0; i < C; i++) ss += x[r * C + i]! ** 2;
      const inv = 1 / Math.sqrt(ss / C + c.rmsNormEps);
      for (let i = 0; i < C; i++) y[r * C + i] = x[r * C + i]! * inv * g[i]!;
    }
    return y;
  };
  const rope = (x: Mat, heads: number): void => refRotate(x, c.rope, b, t, heads, hd, 0);
  const N = b * t;
  const embed = get('model.embed_tokens.weight');
  let x = new Float64Array(N * C);
  for (let r = 0; r < N; r++) for (let i = 0; i < C; i++) x[r * C + i] = embed[ids[r]! * C + i]!;
  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}.`;
    const opt = (n: string): Mat | null => (c.qkvBias ? get(n) : null);
    const h1 = rmsnorm(x, N, get(`${p}input_layernorm.weight`));
    const q = linear(h1, N, C, get(`${p}self_attn.q_proj.weight`), nH * hd, opt(`${p}self_attn.q_proj.bias`));
    const k = linear(h1, N, C, get(`${p}self_attn.k_proj.weight`), nKv * hd, opt(`${p}self_attn.k_proj.bias`));
    const v = linear(h1, N, C, get(`${p}self_attn.v_proj.weight`), nKv * hd, opt(`${p}self_attn.v_proj.bias`));
    if (c.qkNorm) {
      // transformers' Qwen3Attention: q_norm(q_proj(x).view(..., head_dim)), one RMSNorm per (token, head) row.
      const headNorm = (x: Mat, heads: number, g: Mat): void => {
        for (let r = 0; r < N * heads; r++) {
          let ss = 0;
          for (let d = 0; d < hd; d++) ss += x[r * hd + d]! ** 2;
          const inv = 1 / Math.sqrt(ss / hd + c.rmsNormEps);
          for (let d = 0; d < hd; d++) x[r * hd + d] = x[r * hd + d]! * inv * g[d]!;
        }
      };
      headNorm(q, nH, get(`${p}self_attn.q_norm.weight`));
      headNorm(k, nKv, get(`${p}self_attn.k_norm.weight`));
    }
    // SmolLM3Attention: `if self.use_rope` (config.no_rope_layers[layer_idx] == 1).
    if (!c.noRopeLayers.includes(l)) { rope(q, nH); rope(k, nKv); }
    const att = new Float64Array(N * nH * hd);
    for (let bb = 0; bb < b; bb++) for (let h = 0; h < nH; h++) {
      const kh = Math.floor(h / (nH / nKv));
      for (let i = 0; i < t; i++) {
        const scores: number[] = [];
        for (let j = 0; j <= i; j++) {
          let s = 0;
          for (let d = 0; d < hd; d++) s += q[((bb * t + i) * nH + h) * hd + d]! * k[((bb * t + j) * nKv + kh) * hd + d]!;
          scores.push(s / Math.sqrt(hd));
        }
        const mx = Math.max(...scores);
        const e = scores.map((s) => Math.exp(s - mx));
        const z = e.reduce((a, bq) => a + bq, 0);
        for (let d = 0; d < hd; d++) {
          let s = 0;
          for (let j = 0; j <= i; j++) s += (e[j]! / z) * v[((bb * t + j) * nKv + kh) * hd + d]!;
          att[((bb * t + i) * nH + h) * hd + d] = s;
        }
      }
    }
    // transformers: Llama/Qwen3/SmolLM3 attention's o_proj has bias=attention_bias like q/k/v; Qwen2Attention's has none.
    const oBias = c.architecture !== 'qwen2' && c.qkvBias ? get(`${p}self_attn.o_proj.bias`) : null;
    const o = linear(att, N, nH * hd, get(`${p}self_attn.o_proj.weight`), C, oBias);
    const hres = x.map((xv, i) => xv + o[i]!);
    const h2 = rmsnorm(hres, N, get(`${p}post_attention_layernorm.weight`));
    const g = linear(h2, N, C, get(`${p}mlp.gate_proj.weight`), I, null);
    const u = linear(h2, N, C, get(`${p}mlp.up_proj.weight`), I, null);
    const a = g.map((gv, i) => (gv / (1 + Math.exp(-gv))) * u[i]!);
    const down = linear(a, N, I, get(`${p}mlp.down_proj.weight`), C, null);
    x = hres.map((hv, i) => hv + down[i]!);
  }
  const xf = rmsnorm(x, N, get('model.norm.weight'));
  const head = c.tieWordEmbeddings ? embed : get('lm_head.weight');
  return linear(xf, N, C, head, V, null);
}
