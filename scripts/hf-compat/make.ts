/**
 * Writes small checkpoints (Qwen2 tied with biases, Qwen2 untied, Llama without biases, Llama with attention_bias
 * (q/k/v AND o_proj biases, as transformers' LlamaAttention has them), llama3 / yarn / linear
 * RoPE scaling; f32 and bf16; one sharded into model-0000x-of-0000y.safetensors + model.safetensors.index.json) with
 * random weights, plus the logits distillery's CPU backend computes for fixed token ids, the ids our tokenizer gives
 * for a few texts, and our ChatML rendering of a conversation. check.py then loads each folder with HF transformers
 * and compares (the chat rendering against AutoTokenizer.apply_chat_template on the exported tokenizer_config.json).
 * Usage: node dist/scripts/hf-compat/make.js <out-dir>
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { yarnMscale } from '../../src/backend/rope.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { readCheckpoint, writeCheckpoint } from '../../src/model/checkpoint.js';
import { trainBpe } from '../../src/tokenizer/train-bpe.js';
import { DEFAULT_CHAT_FORMAT, renderChat } from '../../src/tokenizer/chat.js';
import { loadDocCorpus } from '../../src/data/index.js';
import { Rng } from '../../src/util/rng.js';

const out = process.argv[2] ?? 'hf-compat-out';
fs.mkdirSync(out, { recursive: true });
const corpus = loadDocCorpus({ maxChars: 200_000 });
const tok = trainBpe(corpus.documents, { vocabSize: 400, specialTokens: ['<|endoftext|>', '<|im_start|>', '<|im_end|>'] });
const texts = ['Returns the number of elements in the array.', 'naïve café — 東京 🚀 <|im_start|>user\nhi<|im_end|>', '  for (let i = 0; i < n; i++) {\n\treturn x;\n}'];
const base: ModelConfig = {
  architecture: 'qwen2', vocabSize: tok.vocabSize, hiddenSize: 64, intermediateSize: 160, numLayers: 2, numHeads: 4,
  numKvHeads: 2, headDim: 16, rope: { type: 'default', theta: 1e6 }, rmsNormEps: 1e-6, tieWordEmbeddings: true, maxPositionEmbeddings: 256, qkvBias: true, qkNorm: false, noRopeLayers: [],
};
const cases: Array<[string, ModelConfig, 'f32' | 'bf16', number?]> = [
  ['qwen2-tied-f32', base, 'f32'],
  ['qwen2-untied-bf16', { ...base, tieWordEmbeddings: false, rope: { type: 'default', theta: 1e4 }, rmsNormEps: 1e-5 }, 'bf16'],
  ['llama-nobias-f32', { ...base, architecture: 'llama', qkvBias: false, numKvHeads: 1, rope: { type: 'default', theta: 5e5 } }, 'f32'],
  // RoPE scaling as we write it (rope_theta + rope_scaling for transformers 4, rope_parameters for 5); small original
  // contexts so the scaled frequencies differ from plain ones within 24 positions.
  ['llama-llama3-f32', { ...base, architecture: 'llama', qkvBias: false, rope: { type: 'llama3', theta: 5e5, factor: 32, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 64 } }, 'f32'],
  ['qwen2-yarn-bf16', { ...base, tieWordEmbeddings: false, rope: { type: 'yarn', theta: 1e6, factor: 4, originalMaxPositionEmbeddings: 64, betaFast: 32, betaSlow: 1, attentionFactor: yarnMscale(4), truncate: true } }, 'bf16'],
  ['qwen2-yarn-custom-f32', { ...base, rope: { type: 'yarn', theta: 1e4, factor: 8, originalMaxPositionEmbeddings: 32, betaFast: 16, betaSlow: 2, attentionFactor: 1.25, truncate: false } }, 'f32'],
  // attention_bias true: q/k/v biases and o_proj.bias (transformers reads a missing o_proj.bias as zeros, so the
  // weights perturbed below make this case fail if it is not written).
  ['llama-linear-f32', { ...base, architecture: 'llama', qkvBias: true, rope: { type: 'linear', theta: 1e4, factor: 4 } }, 'f32'],
  // Shards of at most 64 KiB: several files and an index, as save_pretrained(max_shard_size=...) writes them.
  ['qwen2-untied-sharded-f32', { ...base, tieWordEmbeddings: false }, 'f32', 65536],
  // Qwen3 (q/k norms; head_dim 32: query width 128 against hidden 64) and SmolLM3 (RoPE off on layer 1 of 3; o bias).
  ['qwen3-hd32-untied-f32', { ...base, architecture: 'qwen3', qkvBias: false, qkNorm: true, headDim: 32, tieWordEmbeddings: false }, 'f32'],
  ['qwen3-bias-bf16', { ...base, architecture: 'qwen3', qkvBias: true, qkNorm: true }, 'bf16'],
  ['smollm3-nope-bias-f32', { ...base, architecture: 'smollm3', qkvBias: true, numLayers: 3, noRopeLayers: [1], rope: { type: 'default', theta: 2e6 } }, 'f32'],
];
const be = createCpuBackend({ threads: 1 });
const manifest: Array<Record<string, unknown>> = [];
const ids = Int32Array.from({ length: 24 }, (_, i) => (i * 37 + 11) % tok.vocabSize);
for (const [name, cfg, dtype, maxShardBytes] of cases) {
  const rng = new Rng(42);
  const layout = parameterLayout(cfg);
  const w = initialWeights(layout, cfg, rng, 0.2);
  for (const t of layout.tensors) if (t.init === 'zeros' || t.init === 'ones') for (let i = 0; i < t.size; i++) w[t.offset + i]! += 0.1 * rng.normal();
  const dir = path.join(out, name);
  writeCheckpoint(dir, cfg, w, { dtype, tokenizerJson: tok.toJSON(), ...(maxShardBytes !== undefined ? { maxShardBytes } : {}) });
  // Logits from the weights as stored (bf16 rounding included) so both sides see the same numbers.
  const stored = readCheckpoint(dir).weights;
  const m = new Transformer(be, cfg, { batch: 1, seq: ids.length, training: false });
  m.setWeights(stored);
  const logits = Array.from(be.download(m.forward(ids, 1, ids.length)));
  manifest.push({ name, dir: name, ids: Array.from(ids), logits });
}
be.dispose();
const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'What is distillation?' }, { role: 'assistant', content: 'Training a small model\non a big one.' }, { role: 'user', content: 'Why?' }];
fs.writeFileSync(path.join(out, 'manifest.json'), JSON.stringify({
  cases: manifest, tokenizer: 'qwen2-tied-f32/tokenizer.json', texts: texts.map((t) => ({ text: t, ids: tok.encode(t) })),
  chat: { dir: 'qwen2-tied-f32', messages, rendered: renderChat(DEFAULT_CHAT_FORMAT, messages, { addGenerationPrompt: true }) },
}));
console.log(`wrote ${manifest.length} checkpoints and expected logits to ${out}`);
