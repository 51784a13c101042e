/**
 * config.json parsing: the fields each family needs, defaults, and refusals of features distillery does not
 * compute (so a model never silently runs a different function than transformers would).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseHfConfig, toHfConfig, presetConfig, parameterCount } from '../../src/model/config.js';
import { DistilleryError } from '../../src/util/errors.js';

const qwen = {
  architectures: ['Qwen2ForCausalLM'], model_type: 'qwen2', vocab_size: 151936, hidden_size: 896, intermediate_size: 4864,
  num_hidden_layers: 24, num_attention_heads: 14, num_key_value_heads: 2, rope_theta: 1000000, rms_norm_eps: 1e-6,
  tie_word_embeddings: true, max_position_embeddings: 32768, hidden_act: 'silu', use_sliding_window: false,
};

test('Qwen2.5-0.5B config: fields, biases, GQA, parameter count as published (494M)', () => {
  const c = parseHfConfig(qwen);
  assert.equal(c.architecture, 'qwen2');
  assert.equal(c.qkvBias, true);
  assert.equal(c.headDim, 64);
  assert.equal(c.rmsNormEps, 1e-6);
  assert.equal(c.ropeTheta, 1e6);
  assert.equal(Math.round(parameterCount(c) / 1e6), 494);
  assert.deepEqual(parseHfConfig(toHfConfig(c)), c);
});

test('Llama config: no biases unless attention_bias, untied head, its own defaults', () => {
  const c = parseHfConfig({ model_type: 'llama', vocab_size: 128, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
    num_attention_heads: 4, num_key_value_heads: 1, rope_theta: 500000, rms_norm_eps: 1e-5 });
  assert.equal(c.qkvBias, false);
  assert.equal(c.tieWordEmbeddings, false);
  assert.equal(c.maxPositionEmbeddings, 2048);
  assert.equal(parseHfConfig({ ...toHfConfig(c), attention_bias: true }).qkvBias, true);
});

test('features distillery does not compute are refused, naming the key', () => {
  const cases: Array<[Record<string, unknown>, RegExp]> = [
    [{ rope_scaling: { rope_type: 'llama3', factor: 8 } }, /rope_scaling/],
    [{ hidden_act: 'gelu' }, /hidden_act/],
    [{ use_sliding_window: true }, /use_sliding_window/],
    [{ attention_bias: false }, /attention_bias/],
    [{ num_key_value_heads: 3 }, /multiple of num_key_value_heads/],
    [{ hidden_size: 'big' }, /hidden_size/],
    [{ model_type: 'gpt2', architectures: ['GPT2LMHeadModel'] }, /model_type/],
  ];
  for (const [patch, re] of cases) {
    assert.throws(() => parseHfConfig({ ...qwen, ...patch }), (e: unknown) => e instanceof DistilleryError && re.test(e.message), JSON.stringify(patch));
  }
  assert.equal(parseHfConfig({ ...qwen, rope_scaling: null }).ropeTheta, 1e6);
});

test('presets are valid Qwen2-style configs and unknown presets name the choices', () => {
  for (const p of ['tiny', 'small', 'base', 'qwen2.5-0.5b', 'qwen2.5-1.5b']) assert.equal(presetConfig(p, 100).vocabSize, 100);
  assert.throws(() => presetConfig('huge', 100), (e: unknown) => e instanceof DistilleryError && /tiny/.test(e.hint ?? ''));
});
