/**
 * The sharded optimizer (src/parallel/data-parallel.ts) on one rank equals AdamW bit for bit (the path a --gpus 1 NCCL
 * run takes): the shard's segments, offsets, weight-decay mask and compute copy, through real training steps; and the
 * shards of several ranks tile the buffer, each tensor's decay flag kept.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer, type Precision } from '../../src/model/transformer.js';
import { AdamW } from '../../src/train/optimizer.js';
import { StepRunner } from '../../src/train/step.js';
import { LocalComm, shardOf, type Communicator } from '../../src/parallel/comm.js';
import { ShardedAdamW } from '../../src/parallel/data-parallel.js';
import { Rng } from '../../src/util/rng.js';

const c: ModelConfig = {
  architecture: 'qwen2', vocabSize: 37, hiddenSize: 16, intermediateSize: 24, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 4,
  rope: { type: 'default', theta: 10000 }, rmsNormEps: 1e-6, tieWordEmbeddings: false, maxPositionEmbeddings: 64, qkvBias: true, qkNorm: false, noRopeLayers: [],
};
const adam = { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 };

for (const precision of ['fp32', 'bf16'] as Precision[]) {
  test(`ShardedAdamW on one rank equals AdamW bit for bit through 3 training steps (${precision})`, () => {
    const be = createCpuBackend({ threads: 1 });
    const w = initialWeights(parameterLayout(c), c, new Rng(1));
    const run = (sharded: boolean): Float32Array | Float64Array => {
      const m = new Transformer(be, c, { batch: 2, seq: 8, training: true, precision });
      m.setWeights(w);
      const opt = sharded ? new ShardedAdamW(m, adam, new LocalComm()) : new AdamW(m, adam);
      const runner = new StepRunner(m, null, { kind: 'none', alpha: 0, temperature: 1, beta: 0 });
      for (let s = 0; s < 3; s++) {
        const n = 16, inputs = Int32Array.from({ length: n }, (_, i) => (i * 7 + s) % 37), targets = Int32Array.from({ length: n }, (_, i) => (i * 5 + 3 * s + 1) % 37);
        runner.trainStep([{ inputs, targets, mask: new Float32Array(n).fill(1), b: 2, t: 8 }], opt, 1e-2, 0.5);
      }
      const got = m.getWeights();
      return precision === 'bf16' ? Float32Array.from(be.download(m.weights)) : got;
    };
    const a = run(false), b = run(true);
    assert.ok(Buffer.from(new Float32Array(a).buffer).equals(Buffer.from(new Float32Array(b).buffer)), 'weights differ');
    be.dispose();
  });
}

test('the shards of N ranks tile the trainable buffer; their segments keep the weight decay of each tensor', () => {
  const lay = parameterLayout(c);
  for (const world of [2, 3, 7]) {
    const covered = new Uint8Array(lay.total);
    for (let r = 0; r < world; r++) {
      const comm = { rank: r, world } as unknown as Communicator;
      const be = createCpuBackend({ threads: 1 });
      const m = new Transformer(be, c, { batch: 1, seq: 2, training: true });
      const opt = new ShardedAdamW(m, adam, comm);
      const { begin, end } = shardOf(lay.total, world, r);
      assert.deepEqual(opt.shard, shardOf(lay.total, world, r));
      const segs = (opt as unknown as { segments: Array<{ offset: number; size: number; decay: boolean }> }).segments;
      let pos = 0;
      for (const s of segs) {
        assert.equal(s.offset, pos, 'segments are contiguous from the shard start');
        const abs = begin + s.offset, t = lay.tensors.find((x) => abs >= x.offset && abs < x.offset + x.size)!;
        assert.equal(s.decay, t.decay, `decay of ${t.name}`);
        assert.ok(abs + s.size <= t.offset + t.size, 'a segment stays inside its tensor');
        for (let i = 0; i < s.size; i++) covered[abs + i]!++;
        pos += s.size;
      }
      assert.equal(pos, end - begin);
      be.dispose();
    }
    assert.ok(covered.every((x) => x === 1), `world ${world}: every element in exactly one shard`);
  }
});
