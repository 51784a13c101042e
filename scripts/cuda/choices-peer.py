"""The PyTorch + transformers peer of `distillery eval --choices`: scores the same multiple-choice items the way
lm-evaluation-harness's HF backend does (the harness's token split; rows sorted longest first, batched, padded on the
right; log_softmax over each continuation's positions), in bf16 on the GPU, and prints the scoring time and acc /
acc_norm. The model folder is one distillery wrote (transformers reads it).

Usage: python3 scripts/cuda/choices-peer.py <model dir> <items.jsonl> [--batch 16] [--delimiter ' ']
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

ap = argparse.ArgumentParser()
ap.add_argument('model'); ap.add_argument('items')
ap.add_argument('--batch', type=int, default=16); ap.add_argument('--delimiter', default=' ')
a = ap.parse_args()
tok = PreTrainedTokenizerFast(tokenizer_file=f'{a.model}/tokenizer.json')
model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).cuda().eval()
items = [json.loads(line) for line in open(a.items) if line.strip()]
prefix = tok.convert_tokens_to_ids('<|endoftext|>')


def encode_pair(context, continuation):
    if context == '':
        return [prefix], tok(continuation, add_special_tokens=False)['input_ids']
    n = len(context) - len(context.rstrip())
    if n:
        continuation, context = context[-n:] + continuation, context[:-n]
    whole = tok(context + continuation, add_special_tokens=False)['input_ids']
    ctx = tok(context, add_special_tokens=False)['input_ids']
    return ctx, whole[len(ctx):]


rows = []
for i, it in enumerate(items):
    for k, c in enumerate(it['choices']):
        ctx, cont = encode_pair(it['context'], a.delimiter + c)
        rows.append((i, k, ctx + cont, len(cont)))
order = sorted(range(len(rows)), key=lambda r: -len(rows[r][2]))
ll = [[0.0] * len(it['choices']) for it in items]


def run():
    for s in range(0, len(order), a.batch):
        part = [rows[r] for r in order[s:s + a.batch]]
        L = max(len(p[2]) - 1 for p in part)
        inp = torch.zeros((len(part), L), dtype=torch.long)
        for b, p in enumerate(part):
            inp[b, :len(p[2]) - 1] = torch.tensor(p[2][:-1])
        with torch.no_grad():
            logits = model(inp.cuda()).logits
        for b, (i, k, ids, n) in enumerate(part):
            T = len(ids) - 1
            lp = torch.log_softmax(logits[b, T - n:T].float(), -1)
            ll[i][k] = float(lp.gather(-1, torch.tensor(ids[T - n + 1:T + 1], device='cuda')[:, None]).sum())


run()  # warm-up (cuBLAS, allocator)
torch.cuda.synchronize(); t0 = time.time(); run(); torch.cuda.synchronize(); sec = time.time() - t0
acc = sum(max(range(len(l)), key=lambda k: (l[k], -k)) == it['answer'] for l, it in zip(ll, items)) / len(items)
accn = sum(max(range(len(l)), key=lambda k: (l[k] / len(it['choices'][k]), -k)) == it['answer'] for l, it in zip(ll, items)) / len(items)
print(json.dumps({'rows': len(rows), 'seconds': round(sec, 3), 'rows_per_s': round(len(rows) / sec), 'acc': acc, 'acc_norm': accn,
                  'peak_gib': round(torch.cuda.max_memory_allocated() / 2**30, 2)}))
