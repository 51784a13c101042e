/**
 * GPU-only (skips cleanly without libcuda or a GPU): packed documents that attend only to themselves (Backend
 * DocPositions, 'bfd' windows) on the CUDA backend.
 * - Attention forward and backward with document positions against the float64 definition computed on each document
 *   alone (attentionDocsRef, from the same bf16-rounded inputs): the bf16 tensor-core kernels with the stored-dS
 *   backward (the default) and the recomputing one, head dims 64 and 128, GQA 7 and 2, at 8 × 1024 windows of
 *   chat-like documents and at edge layouts (one-row documents, starts on and off the 64-row tiles, a document spanning
 *   tiles, a padding document); the SIMT kernels with f32 operands and with bf16 at head dim 40; the TF32 forward
 *   (attention 'mma'). Bounds as flash-attention-bf16's: out max |error| ≤ 1e-2 · max |out|, lse ≤ 1e-3, gradients
 *   relative Frobenius ≤ 2e-2 (f32 SIMT: 1e-4, 1e-5, 1e-4; TF32 forward: 5e-3).
 * - Positions null gives the plain causal result bit for bit (the same kernels serve both).
 * - A whole model (fp32, Qwen2 shape) over packed windows on CUDA against the CPU backend: logits and every gradient;
 *   and evaluation through StepRunner (a captured graph, replayed) with two position layouts in turn: each equals the
 *   CPU's, so the replay reads the positions uploaded for it.
 *
 * Run on a GPU machine: npm run build && node --test dist/test/cuda/documents-gpu.test.js
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Backend, Buf, DocPositions, DType } from '../../src/backend/backend.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { createCudaBackend } from '../../src/backend/cuda/index.js';
import type { CudaBackend } from '../../src/backend/cuda/cuda-backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { StepRunner, type Batch } from '../../src/train/step.js';
import { Rng } from '../../src/util/rng.js';
import { gpuOrSkip, randBf16, rng } from './helpers.js';
import { relErr as maxRel, relFrob as frob } from '../util/compare.js';
import { attentionDocsRef, docPositionsOf } from '../backend/reference.js';

const { value: backends, skip } = gpuOrSkip(() => {
  const cacheDir = mkdtempSync(join(tmpdir(), 'dk-docs-'));
  return {
    stored: createCudaBackend({ strict: false, cacheDir }),
    recompute: createCudaBackend({ strict: false, cacheDir, attnBackward: 'recompute' }),
    mma: createCudaBackend({ strict: false, cacheDir, attention: 'mma' }),
  };
});
after(() => { if (backends) for (const b of Object.values(backends)) b.dispose(); });


/** Chat-like documents filling T rows: lengths from 20 to 400 (seeded), the last one cut to fit. */
function chatLike(seed: number, T: number): number[] {
  const r = rng(seed), out: number[] = [];
  let at = 0;
  while (at < T - 8) { const len = Math.min(T - at - 4, 20 + Math.floor(r() * 380)); out.push(len); at += len; }
  return out;
}

function up(b: Backend, a: ArrayLike<number>, label: string, dtype: DType): Buf { const x = b.alloc(a.length, label, dtype); b.upload(x, a); return x; }

interface Case { name: string; be: keyof NonNullable<typeof backends>; B: number; T: number; nH: number; nKv: number; hd: number; dt: DType; docs: number[][] }

function runCase(c: Case): Record<string, number> {
  const be = backends![c.be] as CudaBackend;
  const r = rng(c.B * 1000 + c.T + c.hd + c.nH);
  const qn = c.B * c.T * c.nH * c.hd, kn = c.B * c.T * c.nKv * c.hd;
  const q = randBf16(r, qn, 3), k = randBf16(r, kn, 1), v = randBf16(r, kn, 1), dout = randBf16(r, qn, 1);
  const pos = docPositionsOf(c.B, c.T, c.docs);
  const docPositions = be.allocInt(c.B * c.T, 'positions');
  be.uploadInt(docPositions, pos);
  const docs: DocPositions = { docPositions };
  const Q = up(be, q, 'q', c.dt), K = up(be, k, 'k', c.dt), V = up(be, v, 'v', c.dt), G = up(be, dout, 'dout', c.dt);
  const out = be.alloc(qn, 'out', c.dt), lse = be.alloc(c.B * c.nH * c.T, 'lse');
  // the gradients start as NaN: the backward overwrites them (accumulate false), so a row it misses stays NaN
  const dq = up(be, new Float32Array(qn).fill(NaN), 'dq', c.dt), dk = up(be, new Float32Array(kn).fill(NaN), 'dk', c.dt), dv = up(be, new Float32Array(kn).fill(NaN), 'dv', c.dt);
  be.attentionForward(out, lse, Q, K, V, c.B, c.T, c.nH, c.nKv, c.hd, docs);
  be.attentionBackward(dq, dk, dv, G, Q, K, V, out, lse, c.B, c.T, c.nH, c.nKv, c.hd, false, docs);
  const [oR, lR, dqR, dkR, dvR] = attentionDocsRef(dout, q, k, v, pos, c.B, c.T, c.nH, c.nKv, c.hd);
  const lg = be.download(lse);
  let lseErr = 0;
  for (let i = 0; i < lR.length; i++) lseErr = Math.max(lseErr, Math.abs(lg[i]! - lR[i]!));
  const res = {
    out: maxRel(Float64Array.from(be.download(out)), oR), lse: lseErr,
    dq: frob(Float64Array.from(be.download(dq)), dqR), dk: frob(Float64Array.from(be.download(dk)), dkR), dv: frob(Float64Array.from(be.download(dv)), dvR),
  };
  return res;
}

const EDGE: number[][] = [[30, 34, 70, 1, 1, 40], [129, 60], [64, 1, 100, 20], [200]];
const cases: Case[] = [
  { name: 'bf16 tensor cores, stored dS, hd 64, 14/2 heads, 8 x 1024 chat-like', be: 'stored', B: 8, T: 1024, nH: 14, nKv: 2, hd: 64, dt: 'bf16', docs: [0, 1, 2, 3].map((s) => chatLike(s, 1024)) },
  { name: 'bf16 tensor cores, stored dS, hd 128, 12/2 heads, 4 x 1024 chat-like', be: 'stored', B: 4, T: 1024, nH: 12, nKv: 2, hd: 128, dt: 'bf16', docs: [4, 5].map((s) => chatLike(s, 1024)) },
  { name: 'bf16 tensor cores, stored dS, hd 64, 7/1 heads, edge layouts', be: 'stored', B: 4, T: 200, nH: 7, nKv: 1, hd: 64, dt: 'bf16', docs: EDGE },
  { name: 'bf16 tensor cores, stored dS, hd 128, 4/2 heads, edge layouts', be: 'stored', B: 4, T: 200, nH: 4, nKv: 2, hd: 128, dt: 'bf16', docs: EDGE },
  { name: 'bf16 tensor cores, recomputing backward, hd 64, 14/2 heads, 4 x 1024 chat-like', be: 'recompute', B: 4, T: 1024, nH: 14, nKv: 2, hd: 64, dt: 'bf16', docs: [6, 7].map((s) => chatLike(s, 1024)) },
  { name: 'bf16 tensor cores, recomputing backward, hd 128, edge layouts', be: 'recompute', B: 4, T: 200, nH: 4, nKv: 2, hd: 128, dt: 'bf16', docs: EDGE },
  { name: 'SIMT f32, hd 64, 4/2 heads, edge layouts', be: 'stored', B: 4, T: 200, nH: 4, nKv: 2, hd: 64, dt: 'f32', docs: EDGE },
  { name: 'SIMT bf16, hd 40, 4/2 heads, edge layouts', be: 'stored', B: 4, T: 200, nH: 4, nKv: 2, hd: 40, dt: 'bf16', docs: EDGE },
  { name: 'TF32 forward (attention mma), f32, hd 64, 4/2 heads, edge layouts', be: 'mma', B: 4, T: 200, nH: 4, nKv: 2, hd: 64, dt: 'f32', docs: EDGE },
];

for (const c of cases) {
  test(`cuda attention over packed documents equals each document alone: ${c.name}`, { skip, timeout: 300_000 }, () => {
    const e = runCase(c);
    process.stderr.write(`[documents] ${c.name}: ${Object.entries(e).map(([k, v]) => `${k} ${v.toExponential(2)}`).join(' ')}\n`);
    const f32 = c.dt === 'f32' && c.be !== 'mma';
    const [to, tl, tg] = f32 ? [1e-4, 1e-5, 1e-4] : c.be === 'mma' ? [5e-3, 1e-3, 1e-4] : [1e-2, 1e-3, 2e-2];
    assert.ok(e.out! <= to && e.lse! <= tl, `forward: out ${e.out}, lse ${e.lse}`);
    for (const k of ['dq', 'dk', 'dv']) assert.ok(e[k]! <= tg, `${k}: ${e[k]}`);
  });
}

test('cuda attention: document positions of one document per window give the causal result bit for bit', { skip, timeout: 120_000 }, () => {
  const be = backends!.stored;
  const B = 2, T = 130, nH = 4, nKv = 2, hd = 64, r = rng(9);
  const qn = B * T * nH * hd, kn = B * T * nKv * hd;
  const Q = up(be, randBf16(r, qn, 3), 'q', 'bf16'), K = up(be, randBf16(r, kn, 1), 'k', 'bf16'), V = up(be, randBf16(r, kn, 1), 'v', 'bf16');
  const G = up(be, randBf16(r, qn, 1), 'dout', 'bf16');
  const docPositions = be.allocInt(B * T, 'positions');
  be.uploadInt(docPositions, docPositionsOf(B, T, [[T]]));
  const results = [null, { docPositions }].map((docs) => {
    const out = be.alloc(qn, 'out', 'bf16'), lse = be.alloc(B * nH * T, 'lse');
    const dq = be.alloc(qn, 'dq', 'bf16'), dk = be.alloc(kn, 'dk', 'bf16'), dv = be.alloc(kn, 'dv', 'bf16');
    be.attentionForward(out, lse, Q, K, V, B, T, nH, nKv, hd, docs);
    be.attentionBackward(dq, dk, dv, G, Q, K, V, out, lse, B, T, nH, nKv, hd, false, docs);
    return [out, lse, dq, dk, dv].map((x) => Array.from(be.download(x)));
  });
  assert.deepEqual(results[1], results[0]);
});

const QWEN: ModelConfig = {
  architecture: 'qwen2', vocabSize: 300, hiddenSize: 64, intermediateSize: 176, numLayers: 2, numHeads: 4, numKvHeads: 2,
  headDim: 16, rope: { type: 'default', theta: 1e6 }, rmsNormEps: 1e-6, tieWordEmbeddings: true, maxPositionEmbeddings: 256, qkvBias: true, qkNorm: false, noRopeLayers: [],
};

test('whole model over packed documents, cuda vs cpu (fp32): logits, gradients, and evaluation replayed with new positions', { skip, timeout: 300_000 }, () => {
  const cuda = backends!.stored;
  const cpu = createCpuBackend({ dtype: 'f32', threads: 2 });
  try {
    const B = 2, T = 40, V = QWEN.vocabSize, n = B * T;
    const layout = parameterLayout(QWEN), rngW = new Rng(7);
    const w = initialWeights(layout, QWEN, rngW, 0.1);
    for (const t of layout.tensors) if (t.init === 'zeros' || t.init === 'ones') for (let i = 0; i < t.size; i++) w[t.offset + i]! += 0.1 * rngW.normal();
    const ids = Int32Array.from({ length: n }, (_, i) => (i * 37 + 11) % V);
    const targets = Int32Array.from({ length: n }, (_, i) => (i * 53 + 7) % V);
    const posA = docPositionsOf(B, T, [[7, 1, 20, 9], [40]]), posB = docPositionsOf(B, T, [[3, 30], [12, 12, 12]]);
    const outcome = (be: Backend): { logits: Float32Array | Float64Array; grads: Float32Array | Float64Array; evals: number[] } => {
      const m = new Transformer(be, QWEN, { batch: B, seq: T, training: true, documents: true });
      m.setWeights(w);
      m.zeroGrad();
      const logits = m.forward(ids, B, T, posA);
      const got = be.download(logits);
      const dl = be.alloc(n * V, 'dlogits');
      be.upload(dl, Float32Array.from({ length: n * V }, (_, i) => Math.sin(i * 0.37) / n));
      m.backward(dl);
      const grads = be.download(m.grads!);
      const runner = new StepRunner(m, null, { kind: 'none', alpha: 0, temperature: 1, beta: 0 }, {});
      const batch = (positions: Int32Array): Batch => ({ inputs: ids, targets, mask: new Float32Array(n).fill(1), b: B, t: T, positions });
      const evals = [posA, posB, posA, posB].map((p) => runner.evaluate([batch(p)]).meanCe);
      return { logits: got, grads, evals };
    };
    const g = outcome(cuda), r = outcome(cpu);
    const le = maxRel(g.logits, r.logits), ge = maxRel(g.grads, r.grads);
    process.stderr.write(`[documents] whole model: logits ${le.toExponential(2)} gradients ${ge.toExponential(2)} evaluation ${g.evals.join(' ')} (cpu ${r.evals.join(' ')})\n`);
    assert.ok(le <= 2e-5, `logits ${le}`);
    assert.ok(ge <= 1e-4, `gradients ${ge}`);
    for (let i = 0; i < 4; i++) assert.ok(Math.abs(g.evals[i]! - r.evals[i]!) <= 1e-5 * Math.abs(r.evals[i]!), `evaluation ${i}: cuda ${g.evals[i]} cpu ${r.evals[i]}`);
    assert.notEqual(r.evals[0], r.evals[1], 'the two layouts differ');
    assert.equal(g.evals[2], g.evals[0], 'a replay with the first layout again gives its value');
  } finally { cpu.dispose(); }
});
