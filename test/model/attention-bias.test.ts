/**
 * Llama's `attention_bias`: in transformers' LlamaAttention it gives q_proj, k_proj, v_proj AND o_proj a bias;
 * Qwen2's o_proj never has one. These tests pin the config side (which tensors a config implies, the parameter
 * count, the config.json round trip) and the checkpoint side (a folder laid out the way transformers writes such a
 * Llama loads with its o_proj.bias in place; our own checkpoints carry o_proj.bias and read back unchanged).
 * The math (logits vs the float64 reference, gradients vs finite differences) is in transformer.test.ts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { describeBaked, oProjBias, parameterCount, parseHfConfig, toHfConfig, type ModelConfig } from '../../src/model/config.js';
import { parameterLayout } from '../../src/model/params.js';
import { readFlatCheckpoint, writeCheckpoint } from '../../src/model/checkpoint.js';
import { loadModelDir, saveModelDirSync } from '../../src/io/checkpoint-dir.js';
import { Rng } from '../../src/util/rng.js';

const llamaJson = {
  architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 29, hidden_size: 16, intermediate_size: 24,
  num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 4, rms_norm_eps: 1e-5, rope_theta: 1e4,
  tie_word_embeddings: false, max_position_embeddings: 64, attention_bias: true, mlp_bias: false, hidden_act: 'silu',
};
const qwenJson = {
  architectures: ['Qwen2ForCausalLM'], model_type: 'qwen2', vocab_size: 29, hidden_size: 16, intermediate_size: 24,
  num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, rms_norm_eps: 1e-6, rope_theta: 1e6,
  tie_word_embeddings: true, max_position_embeddings: 64, hidden_act: 'silu',
};

const names = (c: ModelConfig): string[] => parameterLayout(c).tensors.map((t) => t.name);

test('attention_bias: a Llama gets q/k/v AND o_proj biases, a Qwen2 never an o_proj bias', () => {
  const llama = parseHfConfig(llamaJson);
  assert.equal(llama.qkvBias, true);
  assert.equal(oProjBias(llama), true);
  const layout = parameterLayout(llama);
  for (let l = 0; l < llama.numLayers; l++) {
    const ob = layout.tensors.find((t) => t.name === `model.layers.${l}.self_attn.o_proj.bias`);
    assert.ok(ob, `layer ${l} has o_proj.bias`);
    assert.deepEqual(ob.shape, [16]);
    assert.equal(ob.decay, false);
    assert.deepEqual(layout.layers[l]!.bo, ob);
  }
  // Parameter count: the bias-free Llama plus, per layer, q (4·4) + k, v (2·4 each) + o (16) biases.
  const plain = parseHfConfig({ ...llamaJson, attention_bias: false });
  assert.equal(oProjBias(plain), false);
  assert.ok(!names(plain).some((n) => n.endsWith('_proj.bias')));
  assert.equal(parameterCount(llama) - parameterCount(plain), 2 * (16 + 8 + 8 + 16));
  assert.equal(parameterCount(llama), layout.total);
  assert.equal(parameterCount(plain), parameterLayout(plain).total);
  // config.json round trip keeps the biases (attention_bias true covers o_proj in transformers).
  const hf = toHfConfig(llama);
  assert.equal(hf.attention_bias, true);
  assert.deepEqual(parseHfConfig(hf), llama);
  assert.match(describeBaked(llama), / qkv_bias yes o_bias yes tied no$/);
  assert.match(describeBaked(plain), / qkv_bias no tied no$/);

  // Qwen2: Q/K/V biases always, o_proj never (whatever attention_bias says).
  for (const q of [parseHfConfig(qwenJson), parseHfConfig({ ...qwenJson, attention_bias: true })]) {
    assert.equal(q.qkvBias, true);
    assert.equal(oProjBias(q), false);
    assert.ok(!names(q).some((n) => n.includes('o_proj.bias')));
    assert.ok(names(q).includes('model.layers.1.self_attn.v_proj.bias'));
    assert.equal(parameterCount(q), parameterLayout(q).total);
    assert.ok(!/o_bias/.test(describeBaked(q)));
    assert.equal(parseHfConfig(toHfConfig(q)).qkvBias, true);
  }
});

/** The tensors transformers' LlamaForCausalLM(attention_bias=True) has, by name and shape, written independently. */
function hfLlamaTensors(rng: Rng): Map<string, { shape: number[]; data: Float32Array }> {
  const C = 16, Q = 16, KV = 8, I = 24, V = 29;
  const m = new Map<string, { shape: number[]; data: Float32Array }>();
  const put = (name: string, shape: number[]): void => {
    const n = shape.reduce((a, b) => a * b, 1);
    m.set(name, { shape, data: Float32Array.from({ length: n }, () => rng.normal()) });
  };
  put('model.embed_tokens.weight', [V, C]);
  for (let l = 0; l < 2; l++) {
    const p = `model.layers.${l}.`;
    put(`${p}input_layernorm.weight`, [C]);
    put(`${p}post_attention_layernorm.weight`, [C]);
    for (const [proj, out] of [['q', Q], ['k', KV], ['v', KV]] as const) {
      put(`${p}self_attn.${proj}_proj.weight`, [out, C]);
      put(`${p}self_attn.${proj}_proj.bias`, [out]);
    }
    put(`${p}self_attn.o_proj.weight`, [C, Q]);
    put(`${p}self_attn.o_proj.bias`, [C]);
    put(`${p}mlp.gate_proj.weight`, [I, C]);
    put(`${p}mlp.up_proj.weight`, [I, C]);
    put(`${p}mlp.down_proj.weight`, [C, I]);
  }
  put('model.norm.weight', [C]);
  put('lm_head.weight', [V, C]);
  return m;
}

test('a Llama folder with attention_bias true (as transformers writes it) loads with o_proj.bias; ours round-trips it', () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-obias-'));
  try {
    // 1. A transformers-layout folder: every tensor placed where the layout says, o_proj.bias included.
    const hfDir = path.join(root, 'hf');
    const tensors = hfLlamaTensors(new Rng(7));
    saveModelDirSync(hfDir, { config: llamaJson, tensors, dtype: 'f32' });
    const ck = readFlatCheckpoint(hfDir);
    const layout = parameterLayout(ck.config);
    assert.equal(layout.tensors.length, tensors.size);
    for (const t of layout.tensors) {
      assert.deepEqual(Array.from(ck.weights.subarray(t.offset, t.offset + t.size)), Array.from(tensors.get(t.name)!.data), t.name);
    }
    // 2. Our writer: config.json says attention_bias true and the safetensors hold o_proj.bias; reading back is exact.
    const outDir = path.join(root, 'ours');
    writeCheckpoint(outDir, ck.config, ck.weights, { dtype: 'f32' });
    const raw = loadModelDir(outDir);
    assert.equal(raw.config.attention_bias, true);
    assert.deepEqual([...raw.tensors.keys()].sort(), [...tensors.keys()].sort());
    const back = readFlatCheckpoint(outDir);
    assert.deepEqual(back.config, ck.config);
    assert.deepEqual(back.weights, ck.weights);
  } finally {
    fs.rmSync(root, { recursive: true, force: true });
  }
});
