/**
 * GPU GEMM micro-benchmark at the 8×1024 distillation shapes (run on the GPU machine: `node dist/bench/gemm-shapes.js`):
 * each matmulForward of the Qwen2.5-1.5B teacher and 0.5B student layers in bf16 (with and without a bias, into a bf16
 * and an f32 output) and in fp32/TF32, timed over repeated launches with one synchronize; prints µs per call and
 * TFLOP/s, so a slow cuBLAS choice for one shape shows up by itself rather than inside a step profile.
 * `--random` fills the operands with random values (all-zero operands run faster); `--model` / `--model-only` add / run
 * only the teacher's whole forward (profile it with DISTILLERY_CUDA_PROFILE=1); `--attn-shapes` times the training attention kernels
 * at the job's shapes (beside scripts/cuda/sdpa-times.py), and with `--docs=<max>` again over packed documents of 20..max tokens
 * each attending only to itself (the 'bfd' windows' DocPositions); `--fusions` times the student's q/k/v and gate/up products separate
 * against fused (what fusing them would save per layer) and the passes over its whole gradient; `--row-ops` times the
 * memory-bound per-layer backward ops at 8192 rows as a bf16 model runs them (the norm backward into the f32 residual
 * gradient with its bf16 copy; attention and RoPE backward zeroed then accumulated, against overwriting) with the bytes
 * each moves at least and the bandwidth that implies. `--loss-rows` times the fused loss kernels over one head chunk of bf16
 * logits with the gradient in place: the sparse loss over a teacher cache's 4096 rows (32 slots) and the dense KL over an
 * online step's 820 rows of student and teacher logits (151936 columns).
 */
import { createCudaBackend } from '../src/backend/cuda/index.js';
import { usPerCall } from './gpu-timing.js';
import { MAX_ATTN_DKV_FLOATS, MAX_ATTN_DS_ELEMS, type AttentionBackwardImpl } from '../src/backend/cuda/attention-plan.js';
import { LOSS_STATS, type Buf, type DType } from '../src/backend/backend.js';
import { presetConfig } from '../src/model/config.js';
import { Transformer } from '../src/model/transformer.js';
import { documentPositions } from '../src/data/pack.js';

// The attention backward's dK/dV partials at their largest (a run sizes them in prepare(); this script does not prepare).
// --attn-backward=recompute|stored-ds picks the tensor-core attention backward (default: the backend's), its dS scratch at
// its largest too.
const attnBackward = process.argv.find((x) => x.startsWith('--attn-backward='))?.split('=')[1] as AttentionBackwardImpl | undefined;
if (attnBackward !== undefined && attnBackward !== 'recompute' && attnBackward !== 'stored-ds') throw new Error(`--attn-backward: ${attnBackward}?`);
const be = createCudaBackend({
  log: (l) => { if (!l.startsWith('[kernel-cache]') && !l.startsWith('[cuda-timeline]')) process.stderr.write(`${l}\n`); },
  attnDkvFloats: MAX_ATTN_DKV_FLOATS, attnDsElems: MAX_ATTN_DS_ELEMS,
  ...(attnBackward ? { attnBackward } : {}),
});
const N = 8192, REPS = 20;
const shapes: Array<[string, number, number]> = [
  ['teacher q/o 1536x1536', 1536, 1536], ['teacher k/v 1536x256', 1536, 256], ['teacher gate/up 1536x8960', 1536, 8960],
  ['teacher down 8960x1536', 8960, 1536], ['student q/o 896x896', 896, 896], ['student gate/up 896x4864', 896, 4864],
  ['student down 4864x896', 4864, 896],
];
const time = (f: () => void): number => usPerCall(be, f, REPS);
// --random: random inputs and weights (tensor cores on all-zero data draw less power and run faster than on real data).
const random = process.argv.includes('--random');
const fill = (b: Buf, n: number): void => {
  if (!random) return;
  const a = new Float32Array(n);
  let x = 12345;
  for (let i = 0; i < n; i++) { x = (x * 1103515245 + 12345) >>> 0; a[i] = (x / 2 ** 32 - 0.5) * 0.1; }
  be.upload(b, a);
};
for (const [name, k, m] of ['--model-only', '--attn-shapes', '--fusions', '--row-ops', '--loss-rows', '--head-gemms', '--gate-up'].some((f) => process.argv.some((x) => x.startsWith(f))) ? [] : shapes) {
  const row: string[] = [];
  for (const [inDt, outDt, bias] of [['bf16', 'bf16', false], ['bf16', 'bf16', true], ['bf16', 'f32', false], ['bf16', 'f32', true], ['f32', 'f32', false]] as Array<[DType, DType, boolean]>) {
    const x = be.alloc(N * k, 'x', inDt), w = be.alloc(m * k, 'w', inDt), o = be.alloc(N * m, 'o', outDt);
    fill(x, N * k); fill(w, m * k);
    const b: Buf | null = bias ? be.alloc(m, 'b', inDt) : null;
    const us = time(() => be.matmulForward(o, x, w, b, N, k, m));
    row.push(`${inDt}->${outDt}${bias ? '+bias' : ''} ${us.toFixed(1)} us ${(2 * N * k * m / us / 1e6).toFixed(0)} TF/s`);
  }
  console.log(`${name.padEnd(26)} ${row.join(' | ')}`);
}

// --attn-shapes: the training attention kernels alone at the job's shapes (forward; backward = D, dQ, dK/dV), timed over
// repeated launches, with TFLOP/s by the causal count (forward 2·B·H·T²·hd, backward 2.5× that), beside sdpa-times.py.
// --attn-shapes=<word> times only the shapes whose name holds it (so DISTILLERY_CUDA_PROFILE=1's per-kernel table is one shape's).
const attnArg = process.argv.find((x) => x === '--attn-shapes' || x.startsWith('--attn-shapes='));
// --docs=<max>: also with packed documents of 20..max tokens each attending only to itself (Backend DocPositions).
const docsMax = Number(process.argv.find((x) => x.startsWith('--docs='))?.slice(7) ?? 0);
if (attnArg) {
  const only = attnArg.includes('=') ? attnArg.slice(attnArg.indexOf('=') + 1) : '';
  for (const [name, B, T, nH, nKv, hd] of ([['qwen2.5-1.5b teacher', 8, 1024, 12, 2, 128], ['qwen2.5-0.5b student', 8, 1024, 14, 2, 64],
    ['qwen3 (16/8 heads, hd 128)', 8, 1024, 16, 8, 128]] as Array<[string, number, number, number, number, number]>).filter(([n]) => n.includes(only))) {
    const n = B * T, rnd = (len: number): Float32Array => Float32Array.from({ length: len }, (_, i) => Math.sin(i * 12.9898) * 0.5);
    const q = be.alloc(n * nH * hd, 'q', 'bf16'), k = be.alloc(n * nKv * hd, 'k', 'bf16'), v = be.alloc(n * nKv * hd, 'v', 'bf16');
    be.upload(q, rnd(n * nH * hd)); be.upload(k, rnd(n * nKv * hd)); be.upload(v, rnd(n * nKv * hd));
    const out = be.alloc(n * nH * hd, 'out', 'bf16'), lse = be.alloc(B * nH * T, 'lse'), dout = be.alloc(n * nH * hd, 'dout', 'bf16');
    be.upload(dout, rnd(n * nH * hd));
    const dq = be.alloc(n * nH * hd, 'dq', 'bf16'), dk = be.alloc(n * nKv * hd, 'dk', 'bf16'), dv = be.alloc(n * nKv * hd, 'dv', 'bf16');
    const flops = 2 * B * nH * T * T * hd;
    const f = time(() => be.attentionForward(out, lse, q, k, v, B, T, nH, nKv, hd));
    const bw = time(() => be.attentionBackward(dq, dk, dv, dout, q, k, v, out, lse, B, T, nH, nKv, hd));
    console.log(`[attention ${be.attentionBackwardImpl}] ${name}: B=${B} T=${T} H=${nH} KV=${nKv} hd=${hd}: forward ${f.toFixed(1)} us (${(flops / f / 1e6).toFixed(0)} TFLOP/s), ` +
      `backward ${bw.toFixed(1)} us (${(2.5 * flops / bw / 1e6).toFixed(0)} TFLOP/s)`);
    if (docsMax > 0) {
      // packed documents (DocPositions): seeded lengths uniform in [20, docsMax] filling each window, the rest padding
      let seed = 12345;
      const next = (): number => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return seed / 2 ** 32; };
      const pos = new Int32Array(n);
      let docsN = 0;
      for (let w = 0; w < B; w++) {
        const starts: number[] = [];
        let at = 0;
        while (at < T) { starts.push(at); at += 20 + Math.floor(next() * (docsMax - 19)); docsN++; }
        pos.set(documentPositions(T, starts, T), w * T);
      }
      const docPositions = be.allocInt(n, 'positions');
      be.uploadInt(docPositions, pos);
      const docs = { docPositions };
      const fd = time(() => be.attentionForward(out, lse, q, k, v, B, T, nH, nKv, hd, docs));
      const bd = time(() => be.attentionBackward(dq, dk, dv, dout, q, k, v, out, lse, B, T, nH, nKv, hd, true, docs));
      console.log(`[attention ${be.attentionBackwardImpl}] ${name}, ${docsN} documents of 20..${docsMax} tokens: forward ${fd.toFixed(1)} us (${(f / fd).toFixed(2)}x the causal window), ` +
        `backward ${bd.toFixed(1)} us (${(bw / bd).toFixed(2)}x)`);
    }
  }
}

// The same products as a model runs them: the teacher's (Qwen2.5-1.5B-shaped) whole forward at 8×1024, profiled, so the
// per-op GPU times can be set beside the isolated ones above (DISTILLERY_CUDA_PROFILE=1 prints the table on dispose).
if (process.argv.includes('--attn')) {
  // o_proj after attention: the product of an attention output (bf16) into an f32 residual, against the same product
  // of a random bf16 matrix (the step profile showed the in-model o_proj 8x slower than this benchmark's).
  const T = 1024, B = 8, nH = 12, nKv = 2, hd = 128, Q = nH * hd, C = 1536;
  const rnd = (n: number): Float32Array => Float32Array.from({ length: n }, (_, i) => Math.sin(i * 12.9898) * 0.5);
  const q = be.alloc(N * Q, 'q', 'bf16'), k = be.alloc(N * nKv * hd, 'k', 'bf16'), v = be.alloc(N * nKv * hd, 'v', 'bf16');
  be.upload(q, rnd(N * Q)); be.upload(k, rnd(N * nKv * hd)); be.upload(v, rnd(N * nKv * hd));
  const att = be.alloc(N * Q, 'att', 'bf16'), lse = be.alloc(B * nH * T, 'lse'), wo = be.alloc(C * Q, 'wo', 'bf16'), h = be.alloc(N * C, 'h');
  const h16 = be.alloc(N * C, 'h16', 'bf16'), r16 = be.alloc(N * Q, 'rand', 'bf16');
  be.upload(wo, rnd(C * Q)); be.upload(r16, rnd(N * Q));
  be.attentionForward(att, lse, q, k, v, B, T, nH, nKv, hd);
  console.log(`o_proj attention output -> f32: ${time(() => be.matmulForward(h, att, wo, null, N, Q, C)).toFixed(1)} us`);
  console.log(`o_proj random bf16      -> f32: ${time(() => be.matmulForward(h, r16, wo, null, N, Q, C)).toFixed(1)} us`);
  console.log(`o_proj attention output -> bf16: ${time(() => be.matmulForward(h16, att, wo, null, N, Q, C)).toFixed(1)} us`);
  console.log(`attention then o_proj -> f32: ${time(() => { be.attentionForward(att, lse, q, k, v, B, T, nH, nKv, hd); be.matmulForward(h, att, wo, null, N, Q, C); }).toFixed(1)} us`);
  console.log(`attention alone: ${time(() => be.attentionForward(att, lse, q, k, v, B, T, nH, nKv, hd)).toFixed(1)} us`);
}
// --fusions: what fusing a layer's projections would gain, per layer of the 0.5B student at 8×1024 (bf16, random data):
// q, k, v as three products against one of width Q + 2·KV, and gate, up as two against one of width 2·I, each for the
// forward (bf16 out), the input gradient (f32, the second and third accumulating) and the weight gradient (f32 +=);
// and the step's two passes over the whole fp32 gradient (zeroing, the squared norm).
if (process.argv.includes('--fusions')) {
  const C = 896, Q = 896, KV = 128, I = 4864;
  const buf = (n: number, what: string, d: DType): Buf => { const b = be.alloc(n, what, d); fill(b, n); return b; };
  const x = buf(N * C, 'ln', 'bf16'), dln = buf(N * C, 'dln', 'f32');
  const group = (name: string, widths: number[]): void => {
    const W = widths.reduce((a, b) => a + b, 0);
    const ws = widths.map((m, i) => buf(m * C, `w${i}`, 'bf16')), wf = buf(W * C, 'wf', 'bf16');
    const ys = widths.map((m, i) => buf(N * m, `y${i}`, 'bf16')), yf = buf(N * W, 'yf', 'bf16');
    const gs = widths.map((m, i) => buf(m * C, `g${i}`, 'f32')), gf = buf(W * C, 'gf', 'f32');
    const fwd = [time(() => widths.forEach((m, i) => be.matmulForward(ys[i]!, x, ws[i]!, null, N, C, m))), time(() => be.matmulForward(yf, x, wf, null, N, C, W))];
    const dinp = [time(() => widths.forEach((m, i) => be.matmulBackward(dln, null, null, ys[i]!, x, ws[i]!, N, C, m, i > 0))),
      time(() => be.matmulBackward(dln, null, null, yf, x, wf, N, C, W, false))];
    const dw = [time(() => widths.forEach((m, i) => be.matmulBackward(null, gs[i]!, null, ys[i]!, x, ws[i]!, N, C, m))),
      time(() => be.matmulBackward(null, gf, null, yf, x, wf, N, C, W))];
    const fmt = ([a, b]: number[]): string => `${a!.toFixed(1)} -> ${b!.toFixed(1)} us`;
    console.log(`[fusions] ${name} (${widths.join(' + ')} = ${W}): forward ${fmt(fwd)}, input grad ${fmt(dinp)}, weight grad ${fmt(dw)}; ` +
      `saved per layer ${(fwd[0]! - fwd[1]! + dinp[0]! - dinp[1]! + dw[0]! - dw[1]!).toFixed(1)} us`);
  };
  group('student q/k/v', [Q, KV, KV]);
  group('student gate/up', [I, I]);
  const P = 494_032_768, g = be.alloc(P, 'grads');
  console.log(`[fusions] the 0.5B student's fp32 gradient (${P} floats): zeroing ${time(() => be.zero(g)).toFixed(1)} us, ` +
    `squared norm ${time(() => be.sumSquares(g, P)).toFixed(1)} us (with its download)`);
}
if (process.argv.includes('--row-ops')) {
  const buf = (n: number, what: string, d: DType): Buf => { const b = be.alloc(n, what, d); fill(b, n); return b; };
  const gbs = (bytes: number, us: number): string => `${us.toFixed(1)} us (${(bytes / us / 1e3).toFixed(0)} GB/s of ${(bytes / 1e6).toFixed(1)} MB)`;
  for (const C of [896, 1024, 1536]) {
    const dx = buf(N * C, 'dx', 'f32'), dxB = buf(N * C, 'dxB', 'bf16'), dln = buf(N * C, 'dln', 'bf16'), h = buf(N * C, 'h', 'f32');
    const w = buf(C, 'w', 'bf16'), gw = buf(C, 'gw', 'f32'), rstd = be.alloc(N, 'rstd');
    be.upload(rstd, new Float32Array(N).fill(1.3));
    // dx read and written (f32), dln (bf16) and h (f32) read, the bf16 copy written
    const us = time(() => be.rmsnormBackward(dx, gw, dln, h, w, rstd, N, C, dxB));
    console.log(`[row-ops] rmsnorm backward ${N}x${C} (f32 residual gradient, bf16 copy): ${gbs(N * C * (4 + 4 + 2 + 4 + 2), us)}`);
  }
  for (const [name, B, T, nH, nKv, hd] of [['qwen2.5-0.5b student', 8, 1024, 14, 2, 64], ['qwen2.5-1.5b', 8, 1024, 12, 2, 128]] as Array<[string, number, number, number, number, number]>) {
    const n = B * T, qn = n * nH * hd, kn = n * nKv * hd;
    const q = buf(qn, 'q', 'bf16'), k = buf(kn, 'k', 'bf16'), v = buf(kn, 'v', 'bf16'), out = be.alloc(qn, 'out', 'bf16'), lse = be.alloc(B * nH * T, 'lse');
    const dout = buf(qn, 'dout', 'bf16'), dq = be.alloc(qn, 'dq', 'bf16'), dk = be.alloc(kn, 'dk', 'bf16'), dv = be.alloc(kn, 'dv', 'bf16');
    be.attentionForward(out, lse, q, k, v, B, T, nH, nKv, hd);
    const acc = time(() => { be.zero(dq); be.zero(dk); be.zero(dv); be.attentionBackward(dq, dk, dv, dout, q, k, v, out, lse, B, T, nH, nKv, hd); });
    const st = time(() => be.attentionBackward(dq, dk, dv, dout, q, k, v, out, lse, B, T, nH, nKv, hd, false));
    const fq = be.alloc(qn, 'fq', 'bf16'), fk = be.alloc(kn, 'fk', 'bf16'), rope = presetConfig(name.startsWith('qwen2.5-0.5b') ? 'qwen2.5-0.5b' : 'qwen2.5-1.5b', 151936).rope;
    const racc = time(() => { be.zero(fq); be.zero(fk); be.ropeBackward(fq, dq, B, T, nH, hd, rope, 0); be.ropeBackward(fk, dk, B, T, nKv, hd, rope, 0); });
    const rst = time(() => { be.ropeBackward(fq, dq, B, T, nH, hd, rope, 0, false); be.ropeBackward(fk, dk, B, T, nKv, hd, rope, 0, false); });
    console.log(`[row-ops] ${name} attention backward: zeroed + accumulated ${acc.toFixed(1)} us, overwritten ${st.toFixed(1)} us; ` +
      `q and k RoPE backward: zeroed + accumulated ${racc.toFixed(1)} us, overwritten ${gbs(2 * 2 * (qn + kn), rst)}`);
  }
}
if (process.argv.includes('--model') || process.argv.includes('--model-only')) {
  const t = new Transformer(be, presetConfig('qwen2.5-1.5b', 151936), { batch: 8, seq: 1024, training: false, precision: 'bf16', label: 'teacher' });
  const ids = Int32Array.from({ length: N }, (_, i) => (i * 7919) % 151936);
  for (let i = 0; i < 3; i++) t.forwardHidden(ids, 8, 1024);
  be.synchronize();
  const t0 = process.hrtime.bigint();
  t.forwardHidden(ids, 8, 1024);
  be.synchronize();
  console.log(`teacher forward (bf16, 8x1024): ${(Number(process.hrtime.bigint() - t0) / 1e6).toFixed(1)} ms`);
  // The teacher's q_proj product (8192 x 1536 -> 1536) with its weight a view into the model's flat buffer, against the
  // same product on a fresh weight allocation, and with the model's weights filled with random values.
  const L0 = t.layout.layers[0]!;
  const x = be.alloc(N * 1536, 'x', 'bf16'), o = be.alloc(N * 1536, 'o', 'bf16'), o32 = be.alloc(N * 1536, 'o32'), wf = be.alloc(1536 * 1536, 'w', 'bf16');
  const wv = be.view(t.weights, L0.wq.offset, L0.wq.size);
  const say = (what: string, us: number): void => console.log(`${what.padEnd(48)} ${us.toFixed(1)} us`);
  say('q_proj, fresh zero weight, zero x', time(() => be.matmulForward(o, x, wf, null, N, 1536, 1536)));
  say('q_proj, model weight view (zero), zero x', time(() => be.matmulForward(o, x, wv, null, N, 1536, 1536)));
  fill(x, N * 1536); fill(wf, 1536 * 1536);
  const rnd = new Float32Array(L0.wq.size);
  for (let i = 0; i < rnd.length; i++) rnd[i] = Math.sin(i * 0.37) * 0.05;
  be.upload(t.weights, rnd, L0.wq.offset);
  say('q_proj, fresh weight, x (random with --random)', time(() => be.matmulForward(o, x, wf, null, N, 1536, 1536)));
  say('q_proj, model weight view (sin), x', time(() => be.matmulForward(o, x, wv, null, N, 1536, 1536)));
  say('q_proj, model weight view (sin), x -> f32', time(() => be.matmulForward(o32, x, wv, null, N, 1536, 1536)));
  say('q_proj, fresh weight, x -> f32', time(() => be.matmulForward(o32, x, wf, null, N, 1536, 1536)));
}
// --loss-rows: the fused loss kernels alone at the head chunks of the 8 x 1024 job (bf16 logits, gradient in place).
if (process.argv.includes('--loss-rows')) {
  const V = 151936, S = 32, spec = { kind: 'kl' as const, alpha: 0.5, temperature: 2, beta: 0 };
  const rnd = (n: number, scale: number): Float32Array => { const a = new Float32Array(n); let x = 7; for (let i = 0; i < n; i++) { x = (x * 1103515245 + 12345) >>> 0; a[i] = (x / 2 ** 32 - 0.5) * scale; } return a; };
  for (const [what, n] of [['sparse (teacher cache)', 4096], ['dense KL (online)', 820]] as Array<[string, number]>) {
    const z = be.alloc(n * V, 'logits', 'bf16'), zt = be.alloc(n * V, 'teacher logits', 'bf16');
    be.upload(z, rnd(n * V, 16)); be.upload(zt, rnd(n * V, 16));
    const stats = be.alloc(n * LOSS_STATS, 'stats'), w = be.alloc(n, 'weights'), y = be.allocInt(n, 'targets');
    be.upload(w, new Float32Array(n).fill(1 / 8192)); be.uploadInt(y, Int32Array.from({ length: n }, (_, i) => (i * 7919) % V));
    const ids = be.allocInt(n * S, 'ids'), prob = be.alloc(n * S, 'prob'), logq = be.alloc(n * S, 'logq'), tail = be.alloc(n, 'tail'), am = be.allocInt(n, 'argmax');
    be.uploadInt(ids, Int32Array.from({ length: n * S }, (_, i) => (i * 104729) % V)); be.upload(prob, new Float32Array(n * S).fill(1 / S));
    be.upload(logq, new Float32Array(n * S).fill(-3)); be.upload(tail, new Float32Array(n).fill(-1));
    const sparse = { slots: S, ids, prob, logq, tail, argmax: am };
    // the gradient overwrites the logits (as the step's head does); the values stay finite, so repeats time the same work
    const us = time(() => (n === 4096 ? be.sparseLossForward(stats, z, z, y, w, sparse, n, V, spec, V) : be.lossForward(stats, z, z, zt, y, w, n, V, spec, V)));
    const bytes = (n === 4096 ? 3 : 4) * n * V * 2;
    console.log(`[loss-rows] ${what}: ${n} rows x ${V}: ${us.toFixed(1)} us (${(bytes / us / 1e3).toFixed(0)} GB/s over ${n === 4096 ? 'two reads and a write' : 'two reads of both rows and a write'})`);
  }
}

// --head-gemms: the LM head's three products at the job's chunk shapes (bf16 logits, hidden 896, vocab width 151680 as the
// student's head runs it): the forward, the input gradient (f32, accumulated) and the weight gradient (f32, accumulated and
// overwritten), whole and as sub-chunks of rows, with TF/s, so a poor cuBLAS choice at one shape shows by itself.
if (process.argv.includes('--head-gemms')) {
  const V = 151680, C = 896;
  const rnd = (n: number): Float32Array => { const a = new Float32Array(n); let x = 11; for (let i = 0; i < n; i++) { x = (x * 1103515245 + 12345) >>> 0; a[i] = (x / 2 ** 32 - 0.5) * 0.1; } return a; };
  const W = be.alloc(V * C, 'head weight', 'bf16'); be.upload(W, rnd(V * C));
  const dW = be.alloc(V * C, 'head weight grad', 'f32');
  const tf = (n: number, us: number): string => `${us.toFixed(1)} us ${(2 * n * C * V / us / 1e6).toFixed(0)} TF/s`;
  for (const n of [820, 1024, 2048, 4096]) {
    const x = be.alloc(n * C, 'hidden', 'bf16'), z = be.alloc(n * V, 'logits', 'bf16'), dx = be.alloc(n * C, 'hidden grad', 'f32');
    be.upload(x, rnd(n * C)); be.upload(z, rnd(n * V));
    const fwd = time(() => be.matmulForward(z, x, W, null, n, C, V));
    const dinp = time(() => be.matmulBackward(dx, null, null, z, x, W, n, C, V));
    const dw = time(() => be.matmulBackward(null, dW, null, z, x, W, n, C, V));
    const row = [`forward ${tf(n, fwd)}`, `dinp ${tf(n, dinp)}`, `dweight += ${tf(n, dw)}`];
    for (const sub of [512, 1024, 2048]) {
      if (sub >= n || n % sub !== 0) continue;
      const parts = n / sub;
      const dinpSub = time(() => { for (let p = 0; p < parts; p++) be.matmulBackward(be.view(dx, p * sub * C, sub * C), null, null, be.view(z, p * sub * V, sub * V), be.view(x, p * sub * C, sub * C), W, sub, C, V); });
      row.push(`dinp as ${parts}x${sub} ${tf(n, dinpSub)}`);
    }
    console.log(`[head-gemms] rows ${n}: ${row.join(' | ')}`);
  }
}
// --gate-up: one layer's MLP gate/up products and SwiGLU at 8192 rows (bf16, random operands), two products against the
// fused one over the adjacent weights (forward: products + SwiGLU; backward: SwiGLU's gradient + the input and weight
// gradients of the products), for the student's and the teacher's shapes.
if (process.argv.includes('--gate-up')) {
  const rnd = (n: number): Float32Array => { const a = new Float32Array(n); let x = 3; for (let i = 0; i < n; i++) { x = (x * 1103515245 + 12345) >>> 0; a[i] = (x / 2 ** 32 - 0.5) * 0.2; } return a; };
  for (const [name, C, I] of [['student', 896, 4864], ['teacher', 1536, 8960]] as Array<[string, number, number]>) {
    const h = (n: number, what: string): Buf => { const b = be.alloc(n, what, 'bf16'); be.upload(b, rnd(n)); return b; };
    const ln2 = h(N * C, 'ln2'), wgu = h(2 * I * C, 'w gate|up'), gu = h(2 * N * I, 'gate|up'), gate = h(N * I, 'gate'), up = h(N * I, 'up');
    const act = h(N * I, 'act'), dact = h(N * I, 'dact'), dgu = h(2 * N * I, 'dgate|dup'), dg = h(N * I, 'dgate'), du = h(N * I, 'dup');
    const dln = be.alloc(N * C, 'dln'), dW = be.alloc(2 * I * C, 'dW');
    const wg = be.view(wgu, 0, I * C), wu = be.view(wgu, I * C, I * C), dWg = be.view(dW, 0, I * C), dWu = be.view(dW, I * C, I * C);
    const sepF = time(() => { be.matmulForward(gate, ln2, wg, null, N, C, I); be.matmulForward(up, ln2, wu, null, N, C, I); be.swigluForward(act, gate, up, N * I); });
    const fusF = time(() => { be.matmulForward(gu, ln2, wgu, null, N, C, 2 * I); be.swigluForwardRows(act, gu, N, I); });
    const sepB = time(() => {
      be.swigluBackward(dg, du, dact, gate, up, N * I, false);
      be.matmulBackward(dln, dWg, null, dg, ln2, wg, N, C, I, false, false); be.matmulBackward(dln, dWu, null, du, ln2, wu, N, C, I, true, false);
    });
    const fusB = time(() => { be.swigluBackwardRows(dgu, dact, gu, N, I); be.matmulBackward(dln, dW, null, dgu, ln2, wgu, N, C, 2 * I, false, false); });
    const swF = time(() => be.swigluForward(act, gate, up, N * I)), swFr = time(() => be.swigluForwardRows(act, gu, N, I));
    const swB = time(() => be.swigluBackward(dg, du, dact, gate, up, N * I, false)), swBr = time(() => be.swigluBackwardRows(dgu, dact, gu, N, I));
    console.log(`[gate-up] ${name} ${C}x${I}: forward ${sepF.toFixed(1)} -> ${fusF.toFixed(1)} us, backward ${sepB.toFixed(1)} -> ${fusB.toFixed(1)} us; `
      + `swiglu fwd ${swF.toFixed(1)} / rows ${swFr.toFixed(1)} us, bwd ${swB.toFixed(1)} / rows ${swBr.toFixed(1)} us`);
  }
}
be.dispose();

