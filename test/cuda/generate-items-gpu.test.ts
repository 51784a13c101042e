/**
 * GPU-only (skips cleanly without libcuda or a GPU): `eval --choices` with generation items on the CUDA backend, with
 * its kernel cache pre-warmed and sealed (strict: a kernel compiled after the seal fails the command). In fp32 the
 * greedy texts equal the CPU backend's item for item (a teacher's too, batched 3 at a time: prompts of different
 * lengths, a partial last batch); in bf16 the command runs and every text decodes from the model's own tokens.
 *
 * Run on a GPU machine: npm run build && node --test dist/test/cuda/generate-items-gpu.test.js
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { createCudaBackend } from '../../src/backend/cuda/index.js';
import { gpuOrSkip } from './helpers.js';
import { runCli, tempDir, tinyTokenizer, writeTinyCheckpoint } from '../cli/fixtures.js';

const { value: probe, skip } = gpuOrSkip(() => createCudaBackend({ strict: false, cacheDir: tempDir() }));
probe?.dispose();

test('eval --choices generation items on CUDA (sealed kernel cache): fp32 texts equal the CPU\'s, bf16 runs', { skip }, async () => {
  const dir = tempDir(), tok = tinyTokenizer(), eos = tok.tokenToId('<|endoftext|>')!;
  const model = path.join(dir, 'm'), teacher = path.join(dir, 't');
  writeTinyCheckpoint(model, 3, { eosTokenId: eos, hiddenSize: 64, numHeads: 4, numKvHeads: 2, headDim: 16, intermediateSize: 128 });
  writeTinyCheckpoint(teacher, 4, { eosTokenId: eos, hiddenSize: 64, numHeads: 4, numKvHeads: 2, headDim: 16, intermediateSize: 128 });
  const items = path.join(dir, 'g.jsonl');
  const contexts = ['The teacher model', 'A tokenizer splits text into', 'Distillation trains a small model on the soft targets of', 'The quick brown fox', 'A', 'The dog does not mind, and the'];
  fs.writeFileSync(items, contexts.map((c) => JSON.stringify({ context: c, target: 'x' })).join('\n') + '\n');
  const texts = async (device: string, precision: string): Promise<Array<{ generation: string; teacher_generation: string }>> => {
    const out = path.join(dir, `${device}-${precision}.jsonl`);
    const r = await runCli(['eval', '--model', model, '--teacher', teacher, '--choices', items, '--max-gen-toks', '24', '--batch', '4', '--device', device, '--precision', precision,
      '--strict-kernels', '--kernel-cache-dir', path.join(dir, `kc-${precision}`), '--choices-out', out, '--json']);
    assert.equal(r.code, 0, r.err);
    return fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { generation: string; teacher_generation: string });
  };
  const cpu = await texts('cpu', 'fp32'), gpu = await texts('cuda', 'fp32');
  assert.deepEqual(gpu.map((x) => x.generation), cpu.map((x) => x.generation));
  assert.deepEqual(gpu.map((x) => x.teacher_generation), cpu.map((x) => x.teacher_generation));
  const bf16 = await texts('cuda', 'bf16');
  assert.equal(bf16.length, contexts.length);
});
