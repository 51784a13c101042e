/**
 * config.json parsing: the fields each family needs, defaults, and refusals of features distillery does not
 * compute (so a model never silently runs a different function than transformers would).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describeBaked, parseHfConfig, toHfConfig, presetConfig, parameterCount, type ModelConfig, type RopeSpec } from '../../src/model/config.js';
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
  assert.deepEqual(c.rope, { type: 'default', theta: 1e6 });
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
    [{ rope_scaling: { rope_type: 'llama3', factor: 8 } }, /rope_scaling\.low_freq_factor/],
    [{ hidden_act: 'gelu' }, /hidden_act/],
    [{ use_sliding_window: true }, /use_sliding_window/],
    [{ attention_bias: false }, /attention_bias/],
    [{ num_key_value_heads: 3 }, /multiple of num_key_value_heads/],
    [{ hidden_size: 'big' }, /hidden_size/],
    [{ model_type: 'gpt2', architectures: ['GPT2LMHeadModel'] }, /model_type/],
    [{ attention_dropout: 0.1 }, /attention_dropout/],
    // a family that resembles one distillery runs is refused naming it, not read as that family
    [{ model_type: 'qwen2_moe', architectures: ['Qwen2MoeForCausalLM'] }, /Qwen2-MoE/],
    [{ model_type: '', architectures: ['Qwen2MoeForCausalLM'] }, /unsupported model_type/],
  ];
  for (const [patch, re] of cases) {
    assert.throws(() => parseHfConfig({ ...qwen, ...patch }), (e: unknown) => e instanceof DistilleryError && re.test(e.message), JSON.stringify(patch));
  }
  assert.deepEqual(parseHfConfig({ ...qwen, rope_scaling: null }).rope, { type: 'default', theta: 1e6 });
  // "swish" is SiLU's other name in transformers' ACT2FN: the same model as "silu"
  assert.deepEqual(parseHfConfig({ ...qwen, hidden_act: 'swish' }), parseHfConfig(qwen));
});

test('presets are valid Qwen2-style configs and unknown presets name the choices', () => {
  for (const p of ['tiny', 'small', 'base', 'qwen2.5-0.5b', 'qwen2.5-1.5b']) assert.equal(presetConfig(p, 100).vocabSize, 100);
  assert.throws(() => presetConfig('huge', 100), (e: unknown) => e instanceof DistilleryError && /tiny/.test(e.hint ?? ''));
});

// ---- both transformers layouts (committed fixtures: real configs, and tiny ones used to build checkpoints) ----

const fixture = (name: string): Record<string, unknown> =>
  JSON.parse(readFileSync(new URL(`../../../test/fixtures/hf-configs/${name}.json`, import.meta.url), 'utf8')) as Record<string, unknown>;

test('fixtures: transformers 4 and 5 layouts of the same model parse to the same config, with the published values', () => {
  const expected: Record<string, Partial<ModelConfig>> = {
    'qwen2.5-0.5b': {
      architecture: 'qwen2', vocabSize: 151936, hiddenSize: 896, numHeads: 14, numKvHeads: 2, headDim: 64, rmsNormEps: 1e-6,
      tieWordEmbeddings: true, qkvBias: true, rope: { type: 'default', theta: 1e6 }, eosTokenId: 151643,
    },
    'qwen2.5-7b-yarn': {
      architecture: 'qwen2', vocabSize: 152064, hiddenSize: 3584, numHeads: 28, numKvHeads: 4, headDim: 128, tieWordEmbeddings: false,
      rope: { type: 'yarn', theta: 1e6, factor: 4, originalMaxPositionEmbeddings: 32768, betaFast: 32, betaSlow: 1, attentionFactor: 0.1 * Math.log(4) + 1, truncate: true },
    },
    'llama-3.2-1b-instruct': {
      architecture: 'llama', vocabSize: 128256, hiddenSize: 2048, numHeads: 32, numKvHeads: 8, headDim: 64, rmsNormEps: 1e-5,
      tieWordEmbeddings: true, qkvBias: false, maxPositionEmbeddings: 131072, bosTokenId: 128000, eosTokenId: [128001, 128008, 128009],
      rope: { type: 'llama3', theta: 5e5, factor: 32, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 },
    },
    // No rope_theta in its 4.x config: LlamaConfig's default 10000.
    'tinyllama-1.1b': { architecture: 'llama', numKvHeads: 4, headDim: 64, rope: { type: 'default', theta: 10000 }, tieWordEmbeddings: false, bosTokenId: 1, eosTokenId: 2 },
  };
  for (const [name, want] of Object.entries(expected)) {
    const v4 = parseHfConfig(fixture(`${name}.v4`)), v5 = parseHfConfig(fixture(`${name}.v5`));
    assert.deepEqual(v5, v4, `${name}: the 5.x layout reads as the 4.x one`);
    for (const [k, v] of Object.entries(want)) assert.deepEqual(v4[k as keyof ModelConfig], v, `${name}.${k}`);
    // What we write reads back identically, and both layouts' blocks are in it.
    const written = toHfConfig(v4);
    assert.deepEqual(parseHfConfig(written), v4, `${name}: round trip`);
    assert.equal((written.rope_parameters as Record<string, unknown>).rope_theta, v4.rope.theta);
    assert.equal(written.rope_theta, v4.rope.theta);
    assert.equal(written.rope_scaling === null, v4.rope.type === 'default');
  }
  for (const name of ['tiny-llama3', 'tiny-qwen2-yarn', 'tiny-qwen2']) {
    assert.deepEqual(parseHfConfig(fixture(`${name}.v5`)), parseHfConfig(fixture(`${name}.v4`)), name);
  }
});

test('transformers 5 layout: theta is read from rope_parameters (the old reader fell back to 10000)', () => {
  const { rope_theta: _, ...v4 } = qwen;
  const c = parseHfConfig({ ...v4, rope_parameters: { rope_type: 'default', rope_theta: 1000000.0 } });
  assert.equal(c.rope.theta, 1e6);
  assert.equal(parseHfConfig(v4).rope.theta, 10000, 'absent everywhere: Qwen2Config default');
  // rope_scaling wins over rope_parameters in transformers 5; "type" is the older name of "rope_type".
  const y = parseHfConfig({ ...qwen, max_position_embeddings: 1024, rope_scaling: { type: 'linear', factor: 2 } });
  assert.deepEqual(y.rope, { type: 'linear', theta: 1e6, factor: 2 });
  // Both blocks, written differently but computing the same (transformers 5 standardizes original_max_position_embeddings).
  const both = parseHfConfig({ ...qwen, rope_scaling: { type: 'yarn', factor: 4 },
    rope_parameters: { rope_type: 'yarn', factor: 4.0, original_max_position_embeddings: 32768, rope_theta: 1e6 } });
  assert.equal(both.rope.type === 'yarn' && both.rope.originalMaxPositionEmbeddings, 32768);
  // llama3 / yarn without original_max_position_embeddings: max_position_embeddings (transformers 5 standardization).
  const l = parseHfConfig({ ...v4, max_position_embeddings: 4096, rope_parameters: { rope_type: 'llama3', rope_theta: 5e5, factor: 8, low_freq_factor: 1, high_freq_factor: 4 } });
  assert.equal(l.rope.type === 'llama3' && l.rope.originalMaxPositionEmbeddings, 4096);
});

test('a rope block of per-layer-type blocks (transformers 5, Gemma 3 style) is refused by name, not read as the default RoPE', () => {
  const { rope_theta: _, ...v4 } = qwen;
  const perLayer = { full_attention: { rope_type: 'default', rope_theta: 1e6 }, sliding_attention: { rope_type: 'default', rope_theta: 1e4 } };
  assert.throws(() => parseHfConfig({ ...v4, rope_parameters: perLayer }), (e: unknown) => e instanceof DistilleryError
    && e.message === 'config.json: "rope_parameters" holds per-layer-type blocks ("full_attention", "sliding_attention"), which this family does not read'
    && /rope_theta/.test(e.hint ?? ''));
  assert.throws(() => parseHfConfig({ ...qwen, rope_scaling: { full_attention: { rope_type: 'linear', factor: 2 } } }), /"rope_scaling" holds per-layer-type blocks/);
  // the flat block (the form these families read) is unaffected
  assert.deepEqual(parseHfConfig({ ...v4, rope_parameters: perLayer.full_attention }).rope, { type: 'default', theta: 1e6 });
});

test('yarn: attention factor from attention_factor, mscale / mscale_all_dim, or factor; beta defaults; truncate', () => {
  const yarn = (extra: Record<string, unknown>): RopeSpec =>
    parseHfConfig({ ...qwen, rope_scaling: { rope_type: 'yarn', factor: 4, original_max_position_embeddings: 8192, ...extra } }).rope;
  const af = (r: RopeSpec): number => (r.type === 'yarn' ? r.attentionFactor : Number.NaN);
  assert.equal(af(yarn({})), 1 + 0.1 * Math.log(4));
  assert.equal(af(yarn({ attention_factor: 0.9 })), 0.9);
  assert.equal(af(yarn({ mscale: 0.707, mscale_all_dim: 1 })), (1 + 0.0707 * Math.log(4)) / (1 + 0.1 * Math.log(4)));
  assert.equal(af(yarn({ mscale: 0.707 })), 1 + 0.1 * Math.log(4), 'mscale without mscale_all_dim is ignored');
  assert.equal(af(parseHfConfig({ ...qwen, rope_scaling: { rope_type: 'yarn', factor: 0.5 } }).rope), 1, 'factor <= 1: 1');
  const r = yarn({ beta_fast: 0, beta_slow: null });
  assert.ok(r.type === 'yarn' && r.betaFast === 32 && r.betaSlow === 1 && r.truncate, 'Python `or` defaults');
  const t = yarn({ truncate: false, beta_fast: 16 });
  assert.ok(t.type === 'yarn' && !t.truncate && t.betaFast === 16);
  assert.deepEqual(parseHfConfig(toHfConfig(parseHfConfig({ ...qwen, rope_scaling: { rope_type: 'yarn', factor: 4, truncate: false, attention_factor: 1.5 } }))).rope,
    parseHfConfig({ ...qwen, rope_scaling: { rope_type: 'yarn', factor: 4, truncate: false, attention_factor: 1.5 } }).rope, 'round trip keeps truncate and attention_factor');
});

test('absent fields take the defaults of Qwen2Config / LlamaConfig', () => {
  const minimal = { vocab_size: 64, hidden_size: 64, intermediate_size: 96, num_hidden_layers: 1, num_attention_heads: 4 };
  const q = parseHfConfig({ model_type: 'qwen2', ...minimal, num_attention_heads: 32 });
  assert.equal(q.numKvHeads, 32, 'Qwen2Config.num_key_value_heads = 32');
  assert.equal(q.maxPositionEmbeddings, 32768);
  assert.equal(q.rmsNormEps, 1e-6);
  assert.equal(q.tieWordEmbeddings, false);
  assert.equal(q.eosTokenId, undefined);
  const l = parseHfConfig({ model_type: 'llama', ...minimal });
  assert.equal(l.numKvHeads, 4, 'LlamaConfig: num_attention_heads');
  assert.equal(l.headDim, 16);
  assert.equal(l.maxPositionEmbeddings, 2048);
  assert.equal(l.rmsNormEps, 1e-6);
  assert.deepEqual([l.bosTokenId, l.eosTokenId], [1, 2]);
  assert.deepEqual(l.rope, { type: 'default', theta: 10000 });
  assert.equal(parseHfConfig({ model_type: 'llama', ...minimal, num_key_value_heads: null, head_dim: null }).numKvHeads, 4, 'null = derived');
  const sizes = parseHfConfig({ model_type: 'llama', num_attention_heads: 32, num_hidden_layers: 1 });
  assert.deepEqual([sizes.vocabSize, sizes.hiddenSize, sizes.intermediateSize], [32000, 4096, 11008]);
  // What we write for a model without bos/eos reads back without them (null, not LlamaConfig's 1 and 2).
  const { bosTokenId: _b, eosTokenId: _e, ...noIds } = l;
  assert.deepEqual(parseHfConfig(toHfConfig(noIds)), noIds);
});

test('a string (or other wrong type) where a boolean or number belongs is refused, naming the field', () => {
  const cases: Array<[Record<string, unknown>, RegExp]> = [
    [{ tie_word_embeddings: 'false' }, /"tie_word_embeddings" must be true or false, got "false" \(a string\)/],
    [{ tie_word_embeddings: 0 }, /"tie_word_embeddings"/],
    [{ attention_bias: 'true' }, /"attention_bias"/],
    [{ use_sliding_window: 'false' }, /"use_sliding_window"/],
    [{ rms_norm_eps: '1e-6' }, /"rms_norm_eps" must be a number/],
    [{ rope_theta: '1000000' }, /"rope_theta"/],
    [{ num_key_value_heads: 2.5 }, /"num_key_value_heads" must be an integer/],
    [{ max_position_embeddings: null }, /"max_position_embeddings"/],
    [{ rope_scaling: { rope_type: 'linear', factor: '2' } }, /"rope_scaling\.factor"/],
    [{ rope_parameters: { rope_type: 'yarn', factor: 4, truncate: 'no' } }, /"rope_parameters\.truncate"/],
    [{ rope_scaling: 'yarn' }, /"rope_scaling" must be an object/],
    [{ eos_token_id: '2' }, /"eos_token_id"/],
    [{ dtype: 16 }, /"dtype"/],
    [{ layer_types: 'full_attention' }, /"layer_types"/],
  ];
  for (const [patch, re] of cases) {
    assert.throws(() => parseHfConfig({ ...qwen, ...patch }), (e: unknown) => e instanceof DistilleryError && re.test(e.message), JSON.stringify(patch));
  }
});

test('rope kinds, layer types and ambiguities distillery does not compute are refused by name', () => {
  const cases: Array<[Record<string, unknown>, RegExp]> = [
    [{ rope_scaling: { rope_type: 'dynamic', factor: 2 } }, /rope type "dynamic"/],
    [{ rope_parameters: { rope_type: 'longrope', rope_theta: 1e6, short_factor: [1], long_factor: [1] } }, /rope type "longrope"/],
    [{ rope_scaling: { type: 'su', factor: 2 } }, /rope type "su"/],
    [{ partial_rotary_factor: 0.5 }, /partial_rotary_factor/],
    [{ layer_types: Array.from({ length: 24 }, (_, i) => (i < 20 ? 'full_attention' : 'sliding_attention')) }, /"layer_types" has "sliding_attention" at layer 20/],
    [{ layer_types: ['full_attention'] }, /lists 1 layers/],
    [{ rope_parameters: { rope_type: 'default', rope_theta: 5e5 } }, /"rope_parameters\.rope_theta" is 500000 but "rope_theta" is 1000000|"rope_theta" is 1000000 but "rope_parameters\.rope_theta" is 500000/],
    [{ rope_scaling: { rope_type: 'linear', factor: 2 }, rope_parameters: { rope_type: 'linear', factor: 3 } }, /"rope_scaling" \(theta 1000000 rope linear factor 2\) and "rope_parameters" \(theta 1000000 rope linear factor 3\) disagree/],
    [{ rope_scaling: { rope_type: 'linear', factor: 2 }, rope_parameters: { rope_type: 'yarn', factor: 2 } }, /disagree/],
    [{ rope_scaling: { rope_type: 'linear', type: 'yarn', factor: 2 } }, /rope_type "linear" and type "yarn"/],
    [{ rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 4, high_freq_factor: 1 } }, /high_freq_factor/],
    [{ rope_scaling: { rope_type: 'yarn' } }, /"rope_scaling\.factor" is missing/],
    [{ rope_theta: undefined, rope_scaling: { rope_type: 'linear', factor: 2 }, rope_parameters: { rope_type: 'linear', factor: 2, rope_theta: 5e5 } },
      /rope theta is only in "rope_parameters" but "rope_scaling" is set/],
  ];
  for (const [patch, re] of cases) {
    assert.throws(() => parseHfConfig({ ...qwen, ...patch }), (e: unknown) => e instanceof DistilleryError && re.test(e.message), JSON.stringify(patch));
  }
});

test('describeBaked: one line with theta and scaling, eps, head_dim, Q/K/V bias, tied', () => {
  assert.equal(describeBaked(parseHfConfig(qwen)), 'qwen2 theta 1000000 rope default eps 1e-6 head_dim 64 qkv_bias yes tied yes');
  assert.equal(describeBaked(parseHfConfig(fixture('llama-3.2-1b-instruct.v5'))),
    'llama theta 500000 rope llama3 factor 32 low_freq_factor 1 high_freq_factor 4 original_max_position_embeddings 8192 eps 1e-5 head_dim 64 qkv_bias no tied yes');
  assert.match(describeBaked(parseHfConfig(fixture('qwen2.5-7b-yarn.v5'))), /^qwen2 theta 1000000 rope yarn factor 4 original_max_position_embeddings 32768 beta_fast 32 beta_slow 1 attention_factor 1\.13863 eps 1e-6 head_dim 128 qkv_bias yes tied no$/);
});

test('config.json files transformers 5.17 wrote for Qwen3 and SmolLM3 parse as those families (test/fixtures/hf-configs/transformers-5.17)', async () => {
  const fsm = await import('node:fs');
  const pathm = await import('node:path');
  const { fileURLToPath } = await import('node:url');
  const dir = pathm.resolve(pathm.dirname(fileURLToPath(import.meta.url)), '../../../test/fixtures/hf-configs/transformers-5.17');
  const files = fsm.readdirSync(dir).filter((f) => f.endsWith('.json'));
  assert.ok(files.some((f) => f.startsWith('qwen3')), 'Qwen3 fixtures present');
  for (const f of files) {
    const j = JSON.parse(fsm.readFileSync(pathm.join(dir, f), 'utf8')) as Record<string, unknown>;
    const c = parseHfConfig(j);
    assert.equal(c.architecture, j.model_type, f);
    assert.equal(c.headDim, (j.head_dim as number | undefined) ?? (j.hidden_size as number) / (j.num_attention_heads as number), f);
    assert.equal(c.qkNorm, j.model_type === 'qwen3', f);
    assert.equal(c.qkvBias, j.attention_bias === true, f);
    if (j.model_type === 'smollm3') {
      const flags = j.no_rope_layers as number[];
      assert.deepEqual(c.noRopeLayers, flags.map((x, l) => (x ? -1 : l)).filter((l) => l >= 0), f);
    }
    // what we write back reads as the same model
    assert.deepEqual(parseHfConfig(toHfConfig(c)), c, `${f} round trip`);
  }
});

test('parameterCount equals the tensors parameterLayout enumerates for every preset and every transformers-written Qwen3 / SmolLM3 config, and the released sizes', async () => {
  const { parameterLayout } = await import('../../src/model/params.js');
  const { PRESET_NAMES } = await import('../../src/model/config.js');
  for (const name of PRESET_NAMES) {
    const c = presetConfig(name, 151936);
    assert.equal(parameterCount(c), parameterLayout(c).total, name);
  }
  const dir = new URL('../../../test/fixtures/hf-configs/transformers-5.17/', import.meta.url);
  const { readdirSync } = await import('node:fs');
  const files = readdirSync(dir).filter((f) => /^(qwen3|smollm3)-.*\.json$/.test(f));
  assert.ok(files.length >= 7, files.join(', '));
  for (const f of files) {
    const c = parseHfConfig(JSON.parse(readFileSync(new URL(f, dir), 'utf8')) as Record<string, unknown>);
    assert.equal(parameterCount(c), parameterLayout(c).total, f);
  }
  // The released checkpoints' sizes (tied embeddings counted once; Qwen3-8B unties them).
  const released: Array<[string, number]> = [['qwen2.5-0.5b', 494_032_768], ['qwen2.5-1.5b', 1_543_714_304], ['qwen3-0.6b', 596_049_920],
    ['qwen3-4b', 4_022_468_096], ['qwen3-8b', 8_190_735_360]];
  for (const [name, n] of released) assert.equal(parameterCount(presetConfig(name, 151936)), n, name);
  // Qwen2.5-3B ties its embeddings, Qwen2.5-7B (vocab_size 152064) does not.
  assert.equal(parameterCount(presetConfig('qwen2.5-3b', 151936)), 3_085_938_688);
  assert.equal(parameterCount(presetConfig('qwen2.5-7b', 152064)), 7_615_616_512);
});

test('an invalid config value is one sentence and a hint (the hint was missing)', () => {
  const hf = toHfConfig(presetConfig('tiny', 300)) as Record<string, unknown>;
  for (const [k, v, re] of [['num_attention_heads', 0, /num_attention_heads must be a positive integer, got 0/], ['head_dim', 7, /head_dim \(7\) must be even/],
    ['rms_norm_eps', -1, /rms_norm_eps must be in \(0, 1\)/]] as const) {
    assert.throws(() => parseHfConfig({ ...hf, [k]: v }), (e: unknown) => e instanceof DistilleryError && re.test(e.message) && /config\.json/.test(e.hint ?? ''), k);
  }
});
