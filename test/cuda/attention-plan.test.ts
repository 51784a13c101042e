/**
 * The attention backward's dispatch (src/backend/cuda/attention-plan.ts) alone, no backend and no GPU: at the shapes
 * users run and at the scratch limits, which kernels run, whether dK/dV splits over the GQA group, how the batch is
 * chunked and what scratch the call asks for. The rules' numbers are the measured ones the module documents
 * (DKV_SPLIT_BELOW_BLOCKS; the dS triangle of 64 × 64 tiles); the launches a backend makes from the plan are tested in
 * flash-bf16-plan.test.ts and trace-plan.test.ts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { DType } from '../../src/backend/backend.js';
import {
  DEFAULT_ATTN_DSUM, DKV_SPLIT_BELOW_BLOCKS, MAX_ATTN_DKV_FLOATS, MAX_ATTN_DS_ELEMS, planAttentionBackward,
  type AttentionBackwardBackend, type AttentionBackwardCall,
} from '../../src/backend/cuda/attention-plan.js';
import { DistilleryError } from '../../src/util/errors.js';

const all = (d: DType): AttentionBackwardCall['dtypes'] => ({ dq: d, dk: d, dv: d, dout: d, q: d, k: d, v: d, out: d });
const call = (b: number, t: number, nHeads: number, nKv: number, hd: number, d: DType = 'bf16', accumulate = true): AttentionBackwardCall =>
  ({ b, t, nHeads, nKv, hd, dtypes: all(d), accumulate });
/** A backend whose scratch prepare() sized to the largest (the run's own need fits). */
const roomy: AttentionBackwardBackend = { impl: 'stored-ds', dsumFloats: DEFAULT_ATTN_DSUM, dkvFloats: MAX_ATTN_DKV_FLOATS, dsElems: MAX_ATTN_DS_ELEMS };
/** Causal 64 × 64 tiles of one head of one sequence: n(n + 1)/2 tiles of 4096 bf16. */
const triangle = (t: number): number => { const n = Math.ceil(t / 64); return (n * (n + 1) / 2) * 64 * 64; };

test('the 0.5B student at 8 x 1024 (14/2 heads, hd 64, bf16): stored dS, dK/dV split over the group of 7, one chunk', () => {
  const p = planAttentionBackward(call(8, 1024, 14, 2, 64), roomy);
  assert.equal(p.mma, true);
  assert.equal(p.storedDs, true);
  assert.equal(p.S, 7, '16 key tiles x 2 kv heads x 8 = 256 blocks unsplit, below the bound: split over the 7 query heads');
  assert.ok(16 * 2 * 8 < DKV_SPLIT_BELOW_BLOCKS);
  assert.equal(p.bPer, 8);
  assert.equal(p.pre?.family, 'attention_bwd_pre');
  assert.equal(p.preRowsPerWarp, 4, 'bf16 rows of 64: 8 lanes a row, 4 rows a warp');
  assert.equal(p.reduce?.family, 'attention_dkv_reduce');
  assert.equal(p.dkv.spec.family, 'attention_bwd_dkv_ds_bf16');
  assert.equal(p.dq.spec.family, 'attention_bwd_dq_ds_bf16');
  assert.equal(p.dkv.gridX, 16);
  assert.equal(p.dq.gridX, 16);
  assert.deepEqual(p.need, { dsum: 8 * 14 * 1024, dkv: 2 * 8 * 14 * 1024 * 64, ds: 8 * 14 * triangle(1024), cached: 0 });
  assert.equal(p.zeroFirst, false);
});

test('Qwen3-0.6B-shaped (16/8 heads, hd 128): 1024 blocks unsplit, so no split and no reduction', () => {
  const p = planAttentionBackward(call(8, 1024, 16, 8, 128), roomy);
  assert.equal(p.S, 1);
  assert.equal(p.reduce, null);
  assert.equal(p.need.dkv, 0, 'no partials asked for');
  assert.equal(p.dkv.spec.family, 'attention_bwd_dkv_ds_bf16');
});

test('the scratch limits: partials for 2 sequences chunk the batch by 2; for none, dK/dV runs unsplit; a dS triangle that does not fit recomputes', () => {
  const perSeq = 2 * 14 * 1024 * 64;
  const two = planAttentionBackward(call(8, 1024, 14, 2, 64), { ...roomy, dkvFloats: 2 * perSeq + 5 });
  assert.equal(two.S, 7);
  assert.equal(two.bPer, 2);
  assert.equal(two.need.dkv, 8 * perSeq, 'the need is the whole batch (prepare() sizes the scratch to it)');
  const none = planAttentionBackward(call(8, 1024, 14, 2, 64), { ...roomy, dkvFloats: perSeq - 1 });
  assert.equal(none.S, 1);
  assert.equal(none.reduce, null);
  assert.equal(none.bPer, 8);
  const small = planAttentionBackward(call(8, 1024, 14, 2, 64), { ...roomy, dsElems: 14 * triangle(1024) - 1 });
  assert.equal(small.storedDs, false);
  assert.equal(small.pre, null, 'the recomputing dQ kernel writes D itself');
  assert.equal(small.dq.spec.family, 'attention_bwd_dq_bf16');
  assert.equal(small.dkv.spec.family, 'attention_bwd_dkv_bf16');
  const three = planAttentionBackward(call(8, 1024, 14, 2, 64), { ...roomy, dsElems: 3 * 14 * triangle(1024) });
  assert.equal(three.storedDs, true);
  assert.equal(three.bPer, 3);
  const rec = planAttentionBackward(call(8, 1024, 14, 2, 64), { ...roomy, impl: 'recompute' });
  assert.equal(rec.storedDs, false);
  assert.equal(rec.need.ds, 0);
  const dsum = planAttentionBackward(call(8, 1024, 14, 2, 64), { ...roomy, dsumFloats: 3 * 14 * 1024 });
  assert.equal(dsum.bPer, 3);
  assert.throws(() => planAttentionBackward(call(1, 1024, 14, 2, 64), { ...roomy, dsumFloats: 14 * 1024 - 1 }),
    (e: unknown) => e instanceof DistilleryError && /14 heads × 1024 positions exceed the 14335-float scratch/.test(e.message));
});

test('f32 operands or a head dim the tensor cores do not take: the SIMT kernels, split whenever the group has several heads', () => {
  const f = planAttentionBackward(call(8, 1024, 16, 8, 128, 'f32'), roomy);
  assert.equal(f.mma, false);
  assert.equal(f.S, 2, 'even at 1024 blocks: the bound is the tensor-core kernels\'');
  assert.equal(f.storedDs, false);
  assert.equal(f.pre?.family, 'attention_bwd_pre');
  assert.equal(f.preRowsPerWarp, 1, 'f32 operands: a warp a row');
  assert.equal(f.dq.spec.family, 'attention_bwd');
  assert.equal(f.dkv.spec.family, 'attention_bwd_dkv');
  const odd = planAttentionBackward(call(2, 64, 4, 4, 40), roomy);
  assert.equal(odd.mma, false, 'hd 40 is no multiple of 16');
  assert.equal(odd.S, 1, 'no GQA group to split');
  assert.throws(() => planAttentionBackward(call(1, 64, 4, 4, 1024, 'f32'), roomy),
    (e: unknown) => e instanceof DistilleryError && /head dimension 1024 is above/.test(e.message) && /--device cpu/.test(e.hint ?? ''));
});

test('overwriting (accumulate false): the tensor-core kernels and the reduction store; the SIMT outputs are zeroed first', () => {
  const mma = planAttentionBackward(call(8, 1024, 14, 2, 64, 'bf16', false), roomy);
  assert.equal(mma.zeroFirst, false);
  for (const s of [mma.dq.spec, mma.dkv.spec, mma.reduce!]) assert.equal(s.params.accumulate, false, s.describe());
  const acc = planAttentionBackward(call(8, 1024, 14, 2, 64, 'bf16', true), roomy);
  for (const s of [acc.dq.spec, acc.dkv.spec, acc.reduce!]) assert.equal(s.params.accumulate, true, s.describe());
  const simt = planAttentionBackward(call(2, 64, 4, 2, 64, 'f32', false), roomy);
  assert.equal(simt.zeroFirst, true);
  assert.equal(simt.reduce?.params.accumulate, true, 'into the zeroed outputs');
});
