/**
 * Sharded model folders (src/io/checkpoint-dir.ts): the shard plan follows transformers' rule (huggingface_hub's
 * documented example: sizes [6, 6, 2, 6, 2, 2] with a limit of 10 give [6], [6+2], [6+2+2]); a sharded write reads
 * back equal to the unsharded one (every tensor bit-exact, f32 and bf16), with transformers' file names and an index
 * holding metadata.total_size and weight_map; a missing shard or a tensor the index places in a shard that lacks it
 * is a clear error; the default limit is transformers 5's 50 GB. Also: chat_template.jinja is read over
 * tokenizer_config.json's chat_template (as transformers does); writeCheckpoint writes a ChatML chat_template and generation_config.json.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { DEFAULT_MAX_SHARD_BYTES, loadModelDir, planShards, saveModelDirSync, shardFileName } from '../../src/io/checkpoint-dir.js';
import { readFlatCheckpoint, writeCheckpoint } from '../../src/model/checkpoint.js';
import { presetConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { CHATML_TEMPLATE } from '../../src/tokenizer/chat.js';
import { DistilleryError } from '../../src/util/errors.js';
import { Rng } from '../../src/util/rng.js';
import { tinyTokenizer } from '../cli/fixtures.js';
import { inspectCommand } from '../../src/cli/commands/inspect.js';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-shards-'));
process.on('exit', () => fs.rmSync(root, { recursive: true, force: true }));

test('planShards: tensors in order, a new shard when the next would overflow, an oversized tensor alone', () => {
  const sizes = [6, 6, 2, 6, 2, 2].map((bytes, i) => ({ name: `t${i}`, bytes }));
  assert.deepEqual(planShards(sizes, 10), [['t0'], ['t1', 't2'], ['t3', 't4', 't5']]);
  assert.deepEqual(planShards([{ name: 'big', bytes: 30 }, { name: 'a', bytes: 1 }], 10), [['big'], ['a']]);
  assert.deepEqual(planShards(sizes, 1e9), [sizes.map((s) => s.name)]);
  assert.equal(shardFileName(2, 3), 'model-00002-of-00003.safetensors');
  assert.equal(DEFAULT_MAX_SHARD_BYTES, 50e9);
});

test('a sharded checkpoint reads back equal to the unsharded one (f32 and bf16), with transformers\' names and index', () => {
  const cfg = presetConfig('tiny', 300);
  const w = initialWeights(parameterLayout(cfg), cfg, new Rng(4));
  for (const dtype of ['f32', 'bf16'] as const) {
    const one = path.join(root, `one-${dtype}`), many = path.join(root, `many-${dtype}`);
    writeCheckpoint(one, cfg, w, { dtype });
    const esize = dtype === 'f32' ? 4 : 2;
    const limit = Math.ceil(w.length * esize / 3);
    writeCheckpoint(many, cfg, w, { dtype, maxShardBytes: limit });
    assert.ok(fs.existsSync(path.join(one, 'model.safetensors')) && !fs.existsSync(path.join(one, 'model.safetensors.index.json')));
    assert.ok(!fs.existsSync(path.join(many, 'model.safetensors')));
    const index = JSON.parse(fs.readFileSync(path.join(many, 'model.safetensors.index.json'), 'utf8')) as { metadata: { total_size: number }; weight_map: Record<string, string> };
    assert.equal(index.metadata.total_size, w.length * esize);
    const files = [...new Set(Object.values(index.weight_map))].sort();
    assert.ok(files.length >= 3, `${files.length} shards`);
    assert.deepEqual(files, files.map((_, i) => shardFileName(i + 1, files.length)));
    for (const f of files) {
      const shardBytes = fs.statSync(path.join(many, f)).size;
      const tensorsIn = Object.values(index.weight_map).filter((x) => x === f).length;
      // A shard over the limit holds one tensor (larger than the limit by itself).
      assert.ok(tensorsIn === 1 || shardBytes <= limit + 4096, `${f}: ${shardBytes} bytes, ${tensorsIn} tensors`);
    }
    const a = readFlatCheckpoint(one), b = readFlatCheckpoint(many);
    assert.deepEqual(b.config, a.config);
    assert.ok(Buffer.from(a.weights.buffer).equals(Buffer.from(b.weights.buffer)), `${dtype}: sharded weights differ`);
    assert.equal(loadModelDir(many).shards!.length, files.length);
  }
});

test('a missing shard, or a tensor the index places in a shard that lacks it, is a clear error (loader and inspect)', async () => {
  const cfg = presetConfig('tiny', 64);
  const w = initialWeights(parameterLayout(cfg), cfg, new Rng(5));
  const dir = path.join(root, 'broken');
  writeCheckpoint(dir, cfg, w, { dtype: 'f32', maxShardBytes: Math.ceil(w.length * 4 / 2) });
  const indexFile = path.join(dir, 'model.safetensors.index.json');
  const index = JSON.parse(fs.readFileSync(indexFile, 'utf8')) as { weight_map: Record<string, string> };
  const [name0, file0] = Object.entries(index.weight_map)[0]!;
  const other = Object.values(index.weight_map).find((f) => f !== file0)!;
  // The index says tensor name0 is in `other`, which does not hold it.
  fs.writeFileSync(indexFile, JSON.stringify({ ...index, weight_map: { ...index.weight_map, [name0]: other } }));
  assert.throws(() => readFlatCheckpoint(dir), (e: unknown) => e instanceof DistilleryError && e.message === `${path.join(dir, other)}: tensor "${name0}" listed in the index is not in the shard`);
  // `inspect` checks the index as the loader does (it listed every tensor of the shards' headers and called the folder healthy)
  const io = { out: (): void => {}, err: (): void => {} };
  await assert.rejects(inspectCommand.run([dir], io, {}), (e: unknown) => e instanceof DistilleryError && /listed in the index is not in the shard/.test(e.message));
  fs.writeFileSync(indexFile, JSON.stringify({ ...index, weight_map: [] }));
  await assert.rejects(inspectCommand.run([dir], io, {}), (e: unknown) => e instanceof DistilleryError && /no "weight_map" object/.test(e.message));
  assert.throws(() => readFlatCheckpoint(dir), (e: unknown) => e instanceof DistilleryError && /no "weight_map" object/.test(e.message));
  fs.writeFileSync(indexFile, JSON.stringify(index));
  fs.rmSync(path.join(dir, other));
  assert.throws(() => readFlatCheckpoint(dir), (e: unknown) => e instanceof DistilleryError && e.message === `model folder ${dir} is missing shard ${other}`);
});

test('chat template: chat_template.jinja, else tokenizer_config.json\'s; writeCheckpoint adds ChatML and generation_config.json', () => {
  const tok = tinyTokenizer();
  const cfg = { ...presetConfig('tiny', tok.vocabSize), eosTokenId: tok.eosId };
  const w = initialWeights(parameterLayout(cfg), cfg, new Rng(6));
  const dir = path.join(root, 'chat');
  writeCheckpoint(dir, cfg, w, { dtype: 'f32', tokenizerJson: tok.toJSON() });
  const ck = readFlatCheckpoint(dir);
  assert.equal(ck.chatTemplate, CHATML_TEMPLATE, 'a tokenizer with <|im_start|>/<|im_end|> gets the ChatML template');
  assert.deepEqual(ck.generationConfig, { eos_token_id: tok.eosId });
  assert.deepEqual(ck.generationEosIds, [tok.eosId]);
  // transformers writes the template to chat_template.jinja in newer versions: read it when tokenizer_config has none.
  const tc = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
  delete tc.chat_template;
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(tc));
  fs.writeFileSync(path.join(dir, 'chat_template.jinja'), '{{ messages[0].content }}');
  assert.equal(readFlatCheckpoint(dir).chatTemplate, '{{ messages[0].content }}');
  // Both: chat_template.jinja wins, as transformers loads them (the file clobbers the config's template).
  tc.chat_template = 'FROM CONFIG';
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(tc));
  assert.equal(readFlatCheckpoint(dir).chatTemplate, '{{ messages[0].content }}');
  fs.rmSync(path.join(dir, 'chat_template.jinja'));
  // A list of named templates: the 'default' one.
  tc.chat_template = [{ name: 'tool_use', template: 'T' }, { name: 'default', template: 'D' }];
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(tc));
  assert.equal(readFlatCheckpoint(dir).chatTemplate, 'D');
  // transformers' save_jinja_files layout: chat_template.jinja is the default, additional_chat_templates/<name>.jinja
  // the named ones; where any file is there, the config's chat_template is not read at all
  fs.writeFileSync(path.join(dir, 'chat_template.jinja'), 'FILE-D');
  fs.mkdirSync(path.join(dir, 'additional_chat_templates'));
  fs.writeFileSync(path.join(dir, 'additional_chat_templates', 'tool_use.jinja'), 'FILE-T');
  fs.writeFileSync(path.join(dir, 'additional_chat_templates', 'notes.txt'), 'not a template');
  const named = readFlatCheckpoint(dir);
  assert.equal(named.chatTemplate, 'FILE-D');
  assert.deepEqual(named.tokenizerConfig?.chat_template, [{ name: 'default', template: 'FILE-D' }, { name: 'tool_use', template: 'FILE-T' }]);
  // carried into a folder distillery writes: the named ones kept beside the default (transformers' list form)
  const carried = path.join(root, 'carried');
  writeCheckpoint(carried, named.config, named.weights, { dtype: 'f32', tokenizerJson: named.tokenizerJson, tokenizerConfig: named.tokenizerConfig, chatTemplate: named.chatTemplate });
  assert.deepEqual((JSON.parse(fs.readFileSync(path.join(carried, 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>).chat_template,
    [{ name: 'default', template: 'FILE-D' }, { name: 'tool_use', template: 'FILE-T' }]);
  // named files without chat_template.jinja: no default (the config's own template is not read either)
  fs.rmSync(path.join(dir, 'chat_template.jinja'));
  const noDefault = readFlatCheckpoint(dir);
  assert.equal(noDefault.chatTemplate, null);
  assert.deepEqual(noDefault.tokenizerConfig?.chat_template, [{ name: 'tool_use', template: 'FILE-T' }]);
  fs.rmSync(path.join(dir, 'additional_chat_templates'), { recursive: true });
  // Without the ChatML tokens no template is invented.
  const plain = path.join(root, 'plain');
  const noChat = tok.toJSON();
  noChat.added_tokens = (noChat.added_tokens as Array<{ content: string }>).filter((t) => t.content === '<|endoftext|>');
  saveModelDirSync(plain, { config: { model_type: 'qwen2' }, tensors: new Map(), dtype: 'f32', tokenizerJson: noChat });
  assert.equal(loadModelDir(plain).chatTemplate, undefined);
});
