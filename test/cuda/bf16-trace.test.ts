/**
 * The CUDA backend's mixed-precision (bf16) path without a GPU: the trace plans bf16 kernel variants for the bf16 data
 * flow (allOpsStepBf16), every operand dtype of a planned kernel reaches its code and key, a device-mode backend over
 * fakes sends bf16 matrix products to cublasGemmEx (CUDA_R_16BF = 14) and f32 ones to cublasSgemm, runs the bf16 step
 * pre-warmed from its own trace with zero misses, and the dtype rules (matrix operands share a dtype; operands kept in
 * f32; a bf16 dlogits not aliasing logits) are enforced by name.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CudaBackend, createTraceBackend } from '../../src/backend/cuda/cuda-backend.js';
import { planKernels } from '../../src/backend/cuda/plan.js';
import { KernelCache, cacheKey, compileOptions } from '../../src/backend/cuda/kernel-cache.js';
import { DTYPE_DOMAIN, familyByName } from '../../src/backend/cuda/kernels/index.js';
import { CUDA_R_16BF, CUDA_R_32F } from '../../src/backend/cuda/ffi/cublas.js';
import { LOSS_STATS, type Backend } from '../../src/backend/backend.js';
import { FakeCompiler, LLAMA_LIKE, QWEN_LIKE, allOpsStep, allOpsStepBf16, fakeCublas, fakeDriver } from './helpers.js';

const ADAM = { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1, step: 1, gradScale: 1 };
const stripComments = (s: string) => s.replace(/\/\/[^\n]*/g, '').replace(/\/\*[\s\S]*?\*\//g, '');
const key = (src: string) => cacheKey(src, compileOptions('sm_90'), 'sm_90', { version: 'nvrtc-test', build: 'test-build' });

test('trace: a matrix product with operands of two dtypes throws, naming both operands', () => {
  const b = createTraceBackend();
  const inp = b.alloc(4 * 8, 'inp', 'bf16'), w = b.alloc(3 * 8, 'w'), out = b.alloc(4 * 3, 'out');
  assert.throws(() => b.matmulForward(out, inp, w, null, 4, 8, 3), /matmulForward: inp is bf16 but weight is f32/);
  const dout = b.alloc(4 * 3, 'dout', 'bf16'), w16 = b.alloc(3 * 8, 'w16', 'bf16'), inp32 = b.alloc(4 * 8, 'inp32');
  assert.throws(() => b.matmulBackward(null, null, null, dout, inp, w, 4, 8, 3), /matmulBackward: dout is bf16 but weight is f32/);
  assert.throws(() => b.matmulBackward(null, null, null, dout, inp32, w16, 4, 8, 3), /matmulBackward: dout is bf16 but inp is f32/);
  assert.equal(b.traced.size, 0, 'nothing was launched');
  b.matmulForward(out, inp, w16, null, 4, 8, 3); // bf16 · bf16 → f32 is allowed
  b.matmulBackward(b.alloc(4 * 8, 'di'), b.alloc(3 * 8, 'dw'), null, dout, inp, w16, 4, 8, 3);
});

test('the plan of the bf16 data flow holds bf16 variants of every non-attention family it launches; the f32 step none', () => {
  const bf = planKernels([allOpsStepBf16(QWEN_LIKE)]);
  const bf16Families = new Set(bf.filter((s) => / \w+=bf16/.test(s.id)).map((s) => s.family));
  for (const f of ['embedding_fwd', 'rmsnorm_fwd', 'add_rmsnorm_fwd', 'rmsnorm_bwd', 'bias_add', 'rope_fwd', 'rope_bwd', 'rope_linear_fwd', 'rope_yarn_bwd',
    'swiglu_fwd', 'swiglu_bwd', 'bias_grad', 'loss', 'adamw', 'convert']) {
    assert.ok(bf16Families.has(f), `bf16 variant of ${f} planned (got ${[...bf16Families].join(', ')})`);
  }
  assert.ok(bf.some((s) => s.id === 'loss kind=jsd withGrad=true dlogits=bf16 logits=f32 teacher=f32 block=512'));
  assert.ok(bf.some((s) => s.id === 'adamw copy=bf16 block=256'));
  assert.ok(bf.some((s) => s.id === 'bias_add out=bf16 bias=bf16 block=256'), 'a bias onto a bf16 output is added after the GEMM');
  assert.ok(bf.some((s) => s.id === 'bias_add out=f32 bias=bf16 block=256'), 'a bf16 bias onto an f32 output is added after the GEMM');
  const f32 = planKernels([allOpsStep(QWEN_LIKE), allOpsStep(LLAMA_LIKE)]);
  assert.deepEqual(f32.filter((s) => s.id.includes('bf16')).map((s) => s.id), [], 'the fp32 path launches no bf16 kernel');
});

test('every operand dtype of every kernel the bf16 data flow plans reaches the code and the key', () => {
  let flipped = 0;
  for (const spec of planKernels([allOpsStepBf16(QWEN_LIKE), allOpsStepBf16(LLAMA_LIKE)])) {
    const fam = familyByName(spec.family)!;
    for (const [p, domain] of Object.entries(fam.schema)) {
      if (domain !== DTYPE_DOMAIN) continue;
      const other = fam.make({ ...spec.params, [p]: spec.params[p] === 'bf16' ? 'f32' : 'bf16' });
      assert.notEqual(stripComments(other.source()), stripComments(spec.source()), `${spec.id}: ${p}`);
      assert.notEqual(key(other.source()), key(spec.source()), `${spec.id}: ${p}`);
      flipped++;
    }
  }
  assert.ok(flipped >= 40, `flipped ${flipped} operand dtypes`);
});

function device(cache?: KernelCache, lines: string[] = []) {
  const cublas = fakeCublas();
  const c = cache ?? new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: false, log: () => {} });
  const b = new CudaBackend('device', { driver: fakeDriver(), cublas, cache: c, log: (l) => lines.push(l) });
  return { b, cublas };
}

test('device (fake cuBLAS): bf16 products call cublasGemmEx with CUDA_R_16BF operands and the output\'s type; f32 ones call sgemm', () => {
  assert.equal(CUDA_R_16BF, 14);
  assert.equal(CUDA_R_32F, 0);
  const { b, cublas } = device();
  const n = 4, k = 8, m = 3;
  const i16 = b.alloc(n * k, 'i16', 'bf16'), w16 = b.alloc(m * k, 'w16', 'bf16'), o16 = b.alloc(n * m, 'o16', 'bf16'), o32 = b.alloc(n * m, 'o32');
  b.matmulForward(o16, i16, w16, null, n, k, m);
  b.matmulForward(o32, i16, w16, null, n, k, m);
  assert.deepEqual(cublas.calls, ['gemmEx 14/14→14', 'gemmEx 14/14→0']);
  cublas.calls.length = 0;
  const d16 = b.alloc(n * m, 'd16', 'bf16'), di16 = b.alloc(n * k, 'di16', 'bf16'), dw32 = b.alloc(m * k, 'dw32');
  b.matmulBackward(di16, dw32, null, d16, i16, w16, n, k, m);
  assert.deepEqual(cublas.calls, ['gemmEx 14/14→14', 'gemmEx 14/14→0']);
  cublas.calls.length = 0;
  const i32 = b.alloc(n * k, 'i32'), w32 = b.alloc(m * k, 'w32');
  b.matmulForward(o32, i32, w32, null, n, k, m);
  b.matmulBackward(b.alloc(n * k, 'di'), dw32, null, o32, i32, w32, n, k, m);
  assert.deepEqual(cublas.calls, ['sgemm', 'sgemm', 'sgemm']);
  // an f32 product cannot write a bf16 output (sgemm has none)
  assert.throws(() => b.matmulForward(o16, i32, w32, null, n, k, m), /cannot write the bf16 output o16/);
  b.dispose();
});

test('device (fakes): the bf16 data flow pre-warmed from its own trace runs with zero misses in strict mode', async () => {
  const lines: string[] = [];
  const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: true, log: (l) => lines.push(l) });
  const { b, cublas } = device(cache, lines);
  const step = allOpsStepBf16(QWEN_LIKE);
  await b.prepare([step]);
  step(b);
  assert.equal(cache.counters.missesAfterSeal, 0, lines.join('\n'));
  assert.ok(cublas.calls.length > 10 && cublas.calls.every((c) => c.startsWith('gemmEx 14/14')), cublas.calls.join(', '));
  b.dispose();
});

test('operands the CUDA backend keeps in f32 refuse a bf16 buffer by name; a dlogits may alias only logits of its own dtype', () => {
  const b: Backend = createTraceBackend();
  const n = 2, c = 8, V = 16;
  const x = b.alloc(n * c, 'x'), y16 = b.alloc(n * c, 'y16', 'bf16'), w = b.alloc(c, 'w', 'bf16');
  assert.throws(() => b.rmsnormForward(y16, b.alloc(n, 'rstd16', 'bf16'), x, w, n, c, 1e-6), /rmsnormForward: rstd \(rstd16\) is bf16/);
  assert.throws(() => b.rmsnormBackward(x, b.alloc(c, 'dw'), x, x, w, b.alloc(n, 'r16', 'bf16'), n, c), /rmsnormBackward: rstd \(r16\) is bf16/);
  const ids = b.allocInt(n, 'ids');
  assert.throws(() => b.embeddingBackward(b.alloc(4 * c, 'dt16', 'bf16'), x, ids, n, c), /embeddingBackward: dtable \(dt16\) is bf16/);
  const p = b.alloc(10, 'p'), g = b.alloc(10, 'g'), m = b.alloc(10, 'm'), v = b.alloc(10, 'v');
  assert.throws(() => b.adamw(p, b.alloc(10, 'g16', 'bf16'), m, v, 10, ADAM), /adamw: grad \(g16\) is bf16/);
  assert.throws(() => b.adamw(p, g, m, v, 10, ADAM, p), /may not alias param/);
  b.adamw(p, g, m, v, 10, ADAM, b.alloc(10, 'copy', 'bf16'));
  b.adamw(p, g, m, v, 10, ADAM, b.alloc(10, 'copy32'));
  const stats = b.alloc(n * LOSS_STATS, 'stats'), wts = b.alloc(n, 'weights'), t = b.allocInt(n, 't'), z = b.alloc(n * V, 'z');
  const spec = { kind: 'none' as const, alpha: 0, temperature: 1, beta: 0 };
  assert.throws(() => b.lossForward(b.alloc(n * LOSS_STATS, 's16', 'bf16'), null, z, null, t, wts, n, V, spec), /lossForward: stats \(s16\) is bf16/);
  // bf16 logits (--logits bf16) are read as such; a dlogits of another dtype aliasing (overlapping) them is refused
  const dz16 = b.alloc(n * V * 2, 'dz16', 'bf16');
  b.lossForward(stats, null, b.alloc(n * V, 'z16', 'bf16'), null, t, wts, n, V, spec);
  b.lossForward(stats, dz16, dz16, null, t, wts, n, V, spec); // bf16 in place: the head's layout with bf16 logits
  // overlapping without being the same elements (a shifted view) is refused: in place means the very logits
  assert.throws(() => b.lossForward(stats, b.view(dz16, 5, n * V), b.view(dz16, 20, n * V), null, t, wts, n, V, spec),
    /the dlogits \(dz16\[5:37\]\) overlap the logits \(dz16\[20:52\]\) without being them/);
  b.lossForward(stats, b.view(dz16, 0, n * V), b.view(dz16, n * V, n * V), null, t, wts, n, V, spec); // disjoint bf16 views
  b.lossForward(stats, b.view(dz16, 0, n * V), z, null, t, wts, n, V, spec); // a bf16 dlogits from f32 logits
  b.lossForward(stats, z, z, null, t, wts, n, V, spec); // f32 in place stays allowed
});

for (const logits of ['f32', 'bf16'] as const) {
  test(`the model's bf16 job (train + eval + generation, ${logits} logits) pre-warmed from its trace runs with zero misses; every product on GemmEx`, async () => {
    const { jobClosures } = await import('../../src/train/kernel-plan.js');
    const { presetConfig } = await import('../../src/model/config.js');
    const runs = jobClosures({
      student: presetConfig('tiny', 300), teacher: presetConfig('small', 300), batch: 2, seq: 8, train: true, evaluate: true,
      generateLen: 4, loss: { kind: 'kl', alpha: 0.5, temperature: 2, beta: 0 }, precision: 'bf16', logits,
    });
    const lines: string[] = [];
    const cache = new KernelCache({ compiler: new FakeCompiler(), arch: 'sm_90', dir: null, strict: true, log: (l) => lines.push(l) });
    const { b, cublas } = device(cache, lines);
    await b.prepare(runs);
    for (const run of runs) run(b);
    assert.equal(cache.counters.missesAfterSeal, 0, lines.join('\n'));
    const planned = planKernels(runs).map((s) => s.id);
    assert.ok(planned.includes('adamw_multi copy=bf16 block=256'), planned.join('\n'));
    assert.ok(planned.some((id) => id.startsWith(`loss kind=kl withGrad=true dlogits=bf16 logits=${logits} teacher=${logits} `)), planned.join('\n'));
    assert.ok(cublas.calls.length > 10 && cublas.calls.every((c) => c.startsWith('gemmEx 14/14')), cublas.calls.join(', '));
    b.dispose();
  });
}
