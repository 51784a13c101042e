"""transformers GENERATES; distillery's generation must do what it does (repetition_penalty, min_p and the other cuts).

Builds a tiny random Qwen2 model with transformers' own class, saves it with save_pretrained, and records:
  greedy: model.generate(prompt, do_sample=False, repetition_penalty=P, max_new_tokens=N) for penalties above and below 1
          (the ids; distillery's greedy decoding must give the same ones);
  sampled: model.generate(prompt, do_sample=True, temperature, top_k, top_p, min_p, repetition_penalty, output_logits,
          output_scores): the ids drawn, each step's raw logits and transformers' processed scores (-inf where a cut
          removed a token): distillery's sampling rule on the raw logits, the sequence so far seen, must keep the same
          tokens with the same probabilities.
Then `node dist/scripts/hf-compat/generate-hf.js <out>` compares, on the CPU and CUDA backends.

Usage: python3 scripts/hf-compat/hf-generate.py <out-dir>      (needs torch and transformers >= 5)
"""
import json
import math
import os
import sys

import torch
import transformers
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

out = sys.argv[1] if len(sys.argv) > 1 else 'hf-generate-out'
os.makedirs(out, exist_ok=True)
VOCAB = 320
torch.manual_seed(0)
# a larger init than the default: logits with a spread, so that the cuts cut and greedy decoding repeats itself
cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  initializer_range=0.25, pad_token_id=None, bos_token_id=None, eos_token_id=None)
model = Qwen2ForCausalLM(cfg).eval()
model.save_pretrained(os.path.join(out, 'model'))
PROMPTS = [[5, 17, 5, 99, 5, 200], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [300]]

greedy = []
for pen in [1.3, 0.85, 1.0]:
    for p in PROMPTS:
        with torch.no_grad():
            ids = model.generate(torch.tensor([p]), do_sample=False, repetition_penalty=pen, max_new_tokens=24,
                                 pad_token_id=0)
        greedy.append({'prompt': p, 'repetition_penalty': pen, 'ids': ids[0, len(p):].tolist()})

SETTINGS = [
    dict(temperature=0.7, top_k=20, top_p=0.8, min_p=0.05, repetition_penalty=1.2),
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1, repetition_penalty=1.5),
    dict(temperature=1.3, top_k=50, top_p=0.95, min_p=None, repetition_penalty=0.9),
]
sampled = []
for si, s in enumerate(SETTINGS):
    for p in PROMPTS[:2]:
        torch.manual_seed(100 + si)
        gc = GenerationConfig(do_sample=True, max_new_tokens=16, pad_token_id=0, **s)
        with torch.no_grad():
            r = model.generate(torch.tensor([p]), generation_config=gc, output_logits=True, output_scores=True,
                               return_dict_in_generate=True)
        steps = []
        for lg, sc in zip(r.logits, r.scores):
            probs = torch.softmax(sc[0].double(), -1)
            steps.append({'logits': lg[0].tolist(), 'probs': probs.tolist()})
        sampled.append({'prompt': p, 'settings': s, 'ids': r.sequences[0, len(p):].tolist(), 'steps': steps})

with open(os.path.join(out, 'generate.json'), 'w') as f:
    json.dump({'transformers': transformers.__version__, 'torch': torch.__version__, 'vocab': VOCAB,
               'greedy': greedy, 'sampled': sampled}, f)
print(f'hf-generate: transformers {transformers.__version__}: {len(greedy)} greedy and {len(sampled)} sampled generations '
      f'written to {out}')
