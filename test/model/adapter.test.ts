/**
 * PEFT adapter folders (src/model/adapter.ts): adapter_config.json as PEFT writes it round-trips; what distillery does
 * not run is refused by name; tensors are matched by PEFT's names (with or without the adapter name) and shapes; an
 * adapter without distillery's base reference (PEFT's own) loads onto its base by tensor shapes.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parseAdapterConfig, peftAdapterConfig, readAdapterHeader, readAdapterWeights, readModelOrAdapter, writeAdapter, baseShape } from '../../src/model/adapter.js';
import { loraInitialWeights, loraLayout, mergeLora, LORA_TARGETS } from '../../src/model/lora.js';
import { presetConfig } from '../../src/model/config.js';
import { flatWeights, initialWeights, parameterLayout } from '../../src/model/params.js';
import { writeCheckpoint } from '../../src/model/checkpoint.js';
import { writeSafetensors } from '../../src/io/safetensors.js';
import { weightsHash } from '../../src/model/weights-hash.js';
import { Rng } from '../../src/util/rng.js';

const tmp = (): string => fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-adapter-'));
const cfg = presetConfig('tiny', 300);
const spec = { rank: 3, alpha: 5, targets: ['k_proj', 'down_proj'] as const };

test('adapter_config.json round-trips its spec; PEFT features distillery does not run are refused by name', () => {
  const c = peftAdapterConfig({ ...spec, targets: [...spec.targets] }, '/base');
  assert.deepEqual(parseAdapterConfig(c, 'f'), { rank: 3, alpha: 5, targets: ['k_proj', 'down_proj'] });
  assert.deepEqual(parseAdapterConfig({ ...c, target_modules: 'all-linear' }, 'f').targets, [...LORA_TARGETS]);
  const refusals: Array<[Record<string, unknown>, RegExp]> = [
    [{ peft_type: 'IA3' }, /peft_type "IA3" is not supported/],
    [{ use_dora: true }, /DoRA/],
    [{ use_rslora: true }, /rsLoRA/],
    [{ rank_pattern: { q_proj: 8 } }, /per-module ranks or alphas \(rank_pattern\)/],
    [{ bias: 'lora_only' }, /adapters that train biases/],
    [{ modules_to_save: ['lm_head'] }, /modules_to_save/],
    [{ layers_to_transform: [0] }, /layers_to_transform/],
    [{ target_modules: '.*proj' }, /a regular expression or another form is not supported/],
    [{ target_modules: ['q_proj', 'c_attn'] }, /target_modules names "c_attn"/],
    [{ r: 0 }, /r must be a positive integer/],
    [{ task_type: 'SEQ_CLS' }, /CAUSAL_LM/],
    [{ init_lora_weights: 'pissa' }, /init_lora_weights "pissa": an adapter saved without conversion to plain LoRA/],
    [{ exclude_modules: ['q_proj'] }, /exclude_modules is not supported/],
    [{ layer_replication: [[0, 2]] }, /layer_replication is not supported/],
    [{ trainable_token_indices: [5] }, /trainable_token_indices is not supported/],
    [{ alora_invocation_tokens: [151644, 77091] }, /alora_invocation_tokens is not supported/],
  ];
  // PEFT's own defaults for these fields are accepted
  assert.doesNotThrow(() => parseAdapterConfig({ ...c, init_lora_weights: 'gaussian', exclude_modules: null, layer_replication: null, megatron_config: null, use_qalora: false, alora_invocation_tokens: null }, 'f'));
  // EVA chooses the adapters' starting values only (the base is untouched): a trained EVA adapter is plain LoRA
  assert.deepEqual(parseAdapterConfig({ ...c, init_lora_weights: 'eva' }, 'f'), parseAdapterConfig(c, 'f'));
  for (const [over, re] of refusals) assert.throws(() => parseAdapterConfig({ ...c, ...over }, 'f'), re, JSON.stringify(over));
});

test('an adapter folder round-trips its weights exactly (f32) by PEFT\'s names; a PEFT-written folder without base_model.json loads on its base', () => {
  const dir = tmp();
  const lay = loraLayout(cfg, { ...spec, targets: [...spec.targets] });
  const w = loraInitialWeights(lay, new Rng(1));
  for (let i = 0; i < w.length; i++) if (w[i] === 0) w[i] = (i % 7) * 1e-3; // nonzero B as well
  const baseDir = path.join(dir, 'base');
  const bw = initialWeights(parameterLayout(cfg), cfg, new Rng(2));
  writeCheckpoint(baseDir, cfg, bw, { dtype: 'f32' });
  writeAdapter(path.join(dir, 'a'), lay, w, { dtype: 'f32', base: { path: baseDir, weights_sha256: weightsHash(bw, parameterLayout(cfg)), shape: baseShape(cfg) } });
  const h = readAdapterHeader(path.join(dir, 'a'));
  const back = readAdapterWeights(path.join(dir, 'a'), h.spec, cfg).weights;
  assert.ok(Buffer.from(back.buffer).equals(Buffer.from(w.buffer)));
  // PEFT's own folder: names with the adapter name, no base_model.json, base named by base_model_name_or_path
  const peft = path.join(dir, 'peft');
  fs.mkdirSync(peft);
  fs.writeFileSync(path.join(peft, 'adapter_config.json'), JSON.stringify(peftAdapterConfig({ ...spec, targets: [...spec.targets] }, baseDir)));
  writeSafetensors(path.join(peft, 'adapter_model.safetensors'), new Map(lay.tensors.map((t) => [t.name.replace(/\.weight$/, '.default.weight'), { shape: t.shape, data: w.slice(t.offset, t.offset + t.size) }])));
  const m = readModelOrAdapter(peft);
  assert.equal(m.adapter?.adapter.base, null);
  const want = mergeLora(bw, parameterLayout(cfg).layers, lay, w);
  assert.ok(Buffer.from(flatWeights(m.weights, "m").buffer).equals(Buffer.from(flatWeights(want, "want").buffer)));
  // a missing tensor, a wrong shape, an unexpected tensor
  const write = (entries: Array<[string, number[], Float32Array]>): string => {
    const d = fs.mkdtempSync(path.join(dir, 'bad-'));
    fs.copyFileSync(path.join(peft, 'adapter_config.json'), path.join(d, 'adapter_config.json'));
    writeSafetensors(path.join(d, 'adapter_model.safetensors'), new Map(entries.map(([n, s, x]) => [n, { shape: s, data: x }])));
    return d;
  };
  const all = lay.tensors.map((t): [string, number[], Float32Array] => [t.name, t.shape, w.slice(t.offset, t.offset + t.size)]);
  assert.throws(() => readModelOrAdapter(write(all.slice(1))), new RegExp(`tensor "${lay.tensors[0]!.name.replace(/\./g, '\\.')}" is missing`));
  const t0 = lay.tensors[0]!;
  assert.throws(() => readModelOrAdapter(write([[t0.name, [t0.shape[0]! + 1, t0.shape[1]!], new Float32Array(t0.size + t0.shape[1]!)], ...all.slice(1)])), /has shape \[4, 64\], the base needs \[3, 64\]/);
  assert.throws(() => readModelOrAdapter(write([...all, ['base_model.model.lm_head.lora_A.weight', [3, 64], new Float32Array(192)]])), /lm_head\.lora_A\.weight" not expected/);
  // a base that is not found
  const lost = path.join(dir, 'lost');
  fs.mkdirSync(lost);
  fs.writeFileSync(path.join(lost, 'adapter_config.json'), JSON.stringify(peftAdapterConfig({ ...spec, targets: [...spec.targets] }, path.join(dir, 'nowhere'))));
  assert.throws(() => readModelOrAdapter(lost), /which is not a model folder here/);
});

test('the Hub id of a local Hub-cache snapshot folder (what an adapter names as its base, as PEFT does)', async () => {
  const { hubIdOfSnapshot } = await import('../../src/io/hf-cache.js');
  assert.equal(hubIdOfSnapshot('/home/u/.cache/huggingface/hub/models--Qwen--Qwen2.5-0.5B/snapshots/7ae557604adf67be50417f59c2c2f167def9a775'), 'Qwen/Qwen2.5-0.5B');
  assert.equal(hubIdOfSnapshot('/home/u/.cache/huggingface/hub/models--HuggingFaceTB--SmolLM3-3B/snapshots/abc/'), 'HuggingFaceTB/SmolLM3-3B');
  assert.equal(hubIdOfSnapshot('/runs/base/final'), null);
  assert.equal(hubIdOfSnapshot('/x/models--a--b/snapshots'), null);
});
