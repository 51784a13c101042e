/** Hugging Face model folders: save/load round trip (f32, bf16, sharded), tokenizer files, errors. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { loadModelDir, saveModelDir, saveModelDirSync } from '../../src/io/checkpoint-dir.js';
import { readSafetensors, writeSafetensors } from '../../src/io/safetensors.js';
import { DistilleryError } from '../../src/util/errors.js';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-ckpt-'));
process.on('exit', () => fs.rmSync(root, { recursive: true, force: true }));

const tensors = new Map([
  ['model.embed_tokens.weight', { shape: [10, 4], data: new Float32Array(40).map((_, i) => i / 7) }],
  ['model.norm.weight', { shape: [4], data: new Float32Array([1, 1.5, -2, 0.25]) }],
]);
const config = { model_type: 'qwen2', architectures: ['Qwen2ForCausalLM'], vocab_size: 10, max_position_embeddings: 64 };
const tok = { version: '1.0', added_tokens: [{ id: 9, content: '<|endoftext|>', special: true }], model: { type: 'BPE', vocab: {}, merges: [] } };

test('f32 save/load round trip with tokenizer and extra files', async () => {
  const dir = path.join(root, 'f32');
  await saveModelDir(dir, { config, tensors, dtype: 'f32', tokenizerJson: tok, extraFiles: { 'generation_config.json': '{}', 'distillery/state.bin': new Uint8Array([1, 2]) } });
  const m = loadModelDir(dir);
  assert.equal(m.config.model_type, 'qwen2');
  assert.equal(m.config.torch_dtype, 'float32');
  assert.deepEqual(m.metadata, { format: 'pt' });
  for (const [k, t] of tensors) {
    assert.deepEqual(m.tensors.get(k)!.shape, t.shape);
    assert.deepEqual(Array.from(m.tensors.get(k)!.data), Array.from(t.data));
  }
  assert.deepEqual(m.tokenizerJson, tok);
  assert.equal(m.tokenizerConfig!.eos_token, '<|endoftext|>');
  assert.equal(m.tokenizerConfig!.pad_token, '<|endoftext|>');
  assert.equal(m.tokenizerConfig!.tokenizer_class, 'PreTrainedTokenizerFast');
  assert.equal(m.tokenizerConfig!.model_max_length, 64);
  assert.deepEqual([...fs.readFileSync(path.join(dir, 'distillery/state.bin'))], [1, 2]);
  // Overwrite in place (sync variant) with bf16.
  saveModelDirSync(dir, { config, tensors, dtype: 'bf16' });
  const b = loadModelDir(dir);
  assert.equal(b.config.torch_dtype, 'bfloat16');
  assert.equal(b.tensors.get('model.norm.weight')!.dtype, 'BF16');
  assert.deepEqual(Array.from(b.tensors.get('model.norm.weight')!.data), [1, 1.5, -2, 0.25]);
  assert.equal(b.tokenizerJson, undefined, 'the new folder replaced the old one entirely');
});

test('sharded folders load through model.safetensors.index.json', () => {
  const dir = path.join(root, 'sharded');
  fs.mkdirSync(dir);
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config));
  writeSafetensors(path.join(dir, 'model-00001-of-00002.safetensors'), { a: tensors.get('model.norm.weight')! });
  writeSafetensors(path.join(dir, 'model-00002-of-00002.safetensors'), { b: tensors.get('model.embed_tokens.weight')! });
  fs.writeFileSync(path.join(dir, 'model.safetensors.index.json'), JSON.stringify({ weight_map: { a: 'model-00001-of-00002.safetensors', b: 'model-00002-of-00002.safetensors' } }));
  const m = loadModelDir(dir);
  assert.deepEqual([...m.tensors.keys()].sort(), ['a', 'b']);
  assert.deepEqual(m.tensors.get('b')!.shape, [10, 4]);
  fs.writeFileSync(path.join(dir, 'model.safetensors.index.json'), JSON.stringify({ weight_map: { a: 'model-00001-of-00002.safetensors', c: 'model-00001-of-00002.safetensors' } }));
  assert.throws(() => loadModelDir(dir), (e: unknown) => e instanceof DistilleryError && /"c"/.test(e.message));
});

test('missing folder / files give DistilleryErrors', () => {
  assert.throws(() => loadModelDir(path.join(root, 'nope')), (e: unknown) => e instanceof DistilleryError && /does not exist/.test(e.message));
  const dir = path.join(root, 'partial');
  fs.mkdirSync(dir);
  assert.throws(() => loadModelDir(dir), (e: unknown) => e instanceof DistilleryError && /config\.json/.test(e.message));
  fs.writeFileSync(path.join(dir, 'config.json'), '{not json');
  assert.throws(() => loadModelDir(dir), (e: unknown) => e instanceof DistilleryError && /not valid JSON/.test(e.message));
  fs.writeFileSync(path.join(dir, 'config.json'), '{}');
  assert.throws(() => loadModelDir(dir), (e: unknown) => e instanceof DistilleryError && /model\.safetensors/.test(e.message));
  fs.writeFileSync(path.join(dir, 'model.safetensors'), Buffer.alloc(3));
  assert.throws(() => loadModelDir(dir), (e: unknown) => e instanceof DistilleryError && e.message.includes(path.join(dir, 'model.safetensors')));
  // The written model.safetensors is a plain safetensors file.
  const ok = path.join(root, 'f32', 'model.safetensors');
  assert.equal(readSafetensors(ok).tensors.size, 2);
});
