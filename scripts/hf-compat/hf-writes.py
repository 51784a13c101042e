"""HF transformers WRITES checkpoints; distillery must read them (the direction check.py does not cover).

For many configurations (Qwen2, Llama, Qwen3 (q/k norms) and SmolLM3 (NoPE layers); tied and untied; Q/K/V biases; GQA and MHA; an explicit head_dim; each
RoPE kind distillery computes: default, linear, llama3, yarn with default and explicit parameters; f32, bf16 and
f16 weights; sharded folders via max_shard_size) this builds a tiny random model with transformers' own classes,
saves it with save_pretrained, and records the logits transformers computes (float32, on the CPU, from the weights
as saved) for fixed token ids. Then `node dist/scripts/hf-compat/read-hf.js <out>` loads every folder with distillery
on the CPU and CUDA backends and compares.

Usage: python3 scripts/hf-compat/hf-writes.py <out-dir>      (needs torch and transformers >= 5; 4.x also works)
"""
import json
import os
import sys

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          SmolLM3Config, SmolLM3ForCausalLM)

out = sys.argv[1] if len(sys.argv) > 1 else 'hf-writes-out'
os.makedirs(out, exist_ok=True)
MAJOR = int(transformers.__version__.split('.')[0])
VOCAB, T = 320, 40
IDS = [(i * 37 + 11) % VOCAB for i in range(T)]
DTYPES = {'f32': torch.float32, 'bf16': torch.bfloat16, 'f16': torch.float16}

# RoPE blocks in transformers 5's rope_parameters vocabulary. Small original contexts so that, at these head dims
# and 40 positions, the scaled and unscaled frequencies differ clearly.
PLAIN_1E6 = {'rope_type': 'default', 'rope_theta': 1000000.0}
LINEAR = {'rope_type': 'linear', 'rope_theta': 10000.0, 'factor': 4.0}
LLAMA3 = {'rope_type': 'llama3', 'rope_theta': 500000.0, 'factor': 32.0, 'low_freq_factor': 1.0,
          'high_freq_factor': 4.0, 'original_max_position_embeddings': 64}
YARN = {'rope_type': 'yarn', 'rope_theta': 1000000.0, 'factor': 4.0, 'original_max_position_embeddings': 64}
YARN_CUSTOM = {'rope_type': 'yarn', 'rope_theta': 10000.0, 'factor': 8.0, 'original_max_position_embeddings': 32,
               'beta_fast': 16.0, 'beta_slow': 2.0, 'attention_factor': 1.25, 'truncate': False}

NO_IDS = dict(pad_token_id=None, bos_token_id=None, eos_token_id=None)
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)

# name, family, dtype, max_shard_size (None: one file), config overrides, rope block
CASES = [
    ('qwen2-tied-gqa-f32', 'qwen2', 'f32', None, dict(tie_word_embeddings=True), PLAIN_1E6),
    ('qwen2-untied-bf16', 'qwen2', 'bf16', None, dict(tie_word_embeddings=False, rms_norm_eps=1e-5),
     {'rope_type': 'default', 'rope_theta': 10000.0}),
    ('qwen2-mqa-f16', 'qwen2', 'f16', None, dict(tie_word_embeddings=True, num_key_value_heads=1), PLAIN_1E6),
    ('qwen2-yarn-f32', 'qwen2', 'f32', None, dict(tie_word_embeddings=False), YARN),
    ('qwen2-yarn-custom-bf16', 'qwen2', 'bf16', None, dict(tie_word_embeddings=True), YARN_CUSTOM),
    ('qwen2-linear-f32', 'qwen2', 'f32', None, dict(tie_word_embeddings=True), LINEAR),
    ('qwen2-sharded-f32', 'qwen2', 'f32', '100KB', dict(tie_word_embeddings=False), PLAIN_1E6),
    ('llama-tied-f32', 'llama', 'f32', None, dict(tie_word_embeddings=True), {'rope_type': 'default', 'rope_theta': 500000.0}),
    ('llama-headdim32-llama3-f32', 'llama', 'f32', None, dict(tie_word_embeddings=True, head_dim=32), LLAMA3),
    ('llama-llama3-bf16', 'llama', 'bf16', None, dict(tie_word_embeddings=False, rms_norm_eps=1e-5), LLAMA3),
    ('llama-bias-mha-linear-f16', 'llama', 'f16', None,
     dict(tie_word_embeddings=False, attention_bias=True, num_key_value_heads=4), LINEAR),
    ('llama-yarn-f32', 'llama', 'f32', None, dict(tie_word_embeddings=False), YARN),
    ('llama-llama3-sharded-bf16', 'llama', 'bf16', '60KB', dict(tie_word_embeddings=False), LLAMA3),
    # Qwen3: per-head q/k RMSNorm; head_dim 32 with 4 heads (query width 128 against hidden 64), and its default 128
    ('qwen3-tied-gqa-hd32-f32', 'qwen3', 'f32', None, dict(tie_word_embeddings=True, head_dim=32), PLAIN_1E6),
    ('qwen3-untied-hd128-bf16', 'qwen3', 'bf16', None, dict(tie_word_embeddings=False), PLAIN_1E6),
    ('qwen3-bias-mha-yarn-f32', 'qwen3', 'f32', None, dict(tie_word_embeddings=False, head_dim=16, attention_bias=True,
                                                           num_key_value_heads=4), YARN),
    ('qwen3-sharded-bf16', 'qwen3', 'bf16', '100KB', dict(tie_word_embeddings=True, head_dim=32), PLAIN_1E6),
    # SmolLM3: RoPE off on the layers no_rope_layers marks 0 (default: every 4th); its default pad/bos/eos ids (128004, ...)
    # lie outside this vocabulary
    ('smollm3-default-nope-f32', 'smollm3', 'f32', None, dict(num_hidden_layers=4, **NO_IDS), {'rope_type': 'default', 'rope_theta': 2000000.0}),
    ('smollm3-list-untied-bf16', 'smollm3', 'bf16', None, dict(num_hidden_layers=3, no_rope_layers=[0, 1, 0], **NO_IDS,
                                                               tie_word_embeddings=False), PLAIN_1E6),
    ('smollm3-bias-sharded-f32', 'smollm3', 'f32', '100KB', dict(num_hidden_layers=4, no_rope_layers=[1, 0, 1, 1], **NO_IDS,
                                                                 attention_bias=True), LLAMA3),
]
FAMILIES = {'qwen2': (Qwen2Config, Qwen2ForCausalLM), 'llama': (LlamaConfig, LlamaForCausalLM),
            'qwen3': (Qwen3Config, Qwen3ForCausalLM), 'smollm3': (SmolLM3Config, SmolLM3ForCausalLM)}


def make_config(cls, rope, **kw):
    if MAJOR >= 5:
        return cls(rope_parameters=dict(rope), **kw)
    r = dict(rope)
    theta = r.pop('rope_theta')
    return cls(rope_theta=theta, rope_scaling=None if r['rope_type'] == 'default' else r, **kw)


manifest = []
for i, (name, family, dtype, shard, over, rope) in enumerate(CASES):
    torch.manual_seed(1000 + i)
    cls, model_cls = FAMILIES[family]
    config = make_config(cls, rope, **{**BASE, **over})
    model = model_cls(config).eval()
    with torch.no_grad():
        # Weights large enough that every tensor (norms and biases included) moves the logits.
        for pname, p in model.named_parameters():
            if 'norm' in pname:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif pname.endswith('bias'):
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    model = model.to(DTYPES[dtype])
    folder = os.path.join(out, name)
    kwargs = {'max_shard_size': shard} if shard else {}
    model.save_pretrained(folder, **kwargs)
    # Reference: transformers reloads the folder in float32 (bf16/f16 upcast is exact) and computes the logits; a
    # fresh load also rebuilds the RoPE tables in float32 (casting the live model would have rounded them).
    load_kw = {'dtype': torch.float32} if MAJOR >= 5 else {'torch_dtype': torch.float32}
    model = model_cls.from_pretrained(folder, **load_kw).eval()
    with torch.no_grad():
        logits = model(torch.tensor([IDS])).logits[0]
    files = sorted(f for f in os.listdir(folder) if f.endswith('.safetensors'))
    # config.json as transformers wrote it, for test/fixtures/hf-configs
    os.makedirs(os.path.join(out, 'configs'), exist_ok=True)
    with open(os.path.join(folder, 'config.json')) as src, open(os.path.join(out, 'configs', f'{name}.json'), 'w') as dst:
        dst.write(src.read())
    manifest.append({'name': name, 'dir': name, 'dtype': dtype, 'shards': len(files), 'ids': IDS,
                     'logits': logits.flatten().tolist(), 'rope': rope})
    print(f'hf-writes {name}: {type(model).__name__}, {dtype}, {len(files)} safetensors file(s)')

json.dump({'transformers': transformers.__version__, 'torch': torch.__version__, 'cases': manifest},
          open(os.path.join(out, 'manifest.json'), 'w'))
print(f'wrote {len(manifest)} checkpoints with transformers {transformers.__version__} to {out}')
