"""The PyTorch + transformers peer of `eval --choices` generation items: lm-evaluation-harness's HFLM.generate_until as
of its 2026 source, transcribed (requests sorted longest first, batches left-padded, greedy model.generate with
max_length = padded length + max_gen_toks, a MultiTokenEOSCriteria per stop string, the eos_token text added, each
continuation decoded without special tokens and cut at the stop strings), on a checkpoint folder in bf16 with SDPA.

  python3 scripts/cuda/generation-items-peer.py --model <dir> --items items.jsonl --batch 32 --max-gen-toks 256

Prints one JSON line: items, generated tokens, seconds, tokens/s and items/s (after one warm-up batch), peak memory.
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, StoppingCriteria, StoppingCriteriaList


class MultiTokenEOSCriteria(StoppingCriteria):
    def __init__(self, tok, sequence, initial_len, batch_size):
        self.tok, self.sequence, self.initial_len, self.done = tok, sequence, initial_len, [False] * batch_size
        self.look = len(tok.encode(sequence, add_special_tokens=False)) + 2

    def __call__(self, input_ids, scores, **kwargs):
        texts = self.tok.batch_decode(input_ids[:, self.initial_len:][:, -self.look:])
        for i, d in enumerate(self.done):
            if not d:
                self.done[i] = self.sequence in texts[i]
        return False not in self.done


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', required=True); ap.add_argument('--items', required=True)
    ap.add_argument('--batch', type=int, default=32); ap.add_argument('--max-gen-toks', type=int, default=256)
    ap.add_argument('--until', nargs='*', default=['Question:', '</s>', '<|im_end|>'])
    a = ap.parse_args()
    tok = PreTrainedTokenizerFast(tokenizer_file=f'{a.model}/tokenizer.json', eos_token='<|endoftext|>', pad_token='<|endoftext|>')
    tok.padding_side = 'left'
    m = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation='sdpa').to('cuda').eval()
    prompts = [json.loads(line)['context'] for line in open(a.items)]
    eos = tok.decode([tok.eos_token_id], skip_special_tokens=False)
    stops = a.until + ([eos] if eos not in a.until else [])
    order = sorted(range(len(prompts)), key=lambda i: (-len(tok.encode(prompts[i])), prompts[i]))

    def run(idx):
        generated = 0
        for s in range(0, len(idx), a.batch):
            part = idx[s:s + a.batch]
            enc = tok([prompts[i] for i in part], padding='longest', return_tensors='pt').to('cuda')
            L = enc['input_ids'].shape[1]
            crit = StoppingCriteriaList([MultiTokenEOSCriteria(tok, u, L, len(part)) for u in stops])
            with torch.no_grad():
                out = m.generate(input_ids=enc['input_ids'], attention_mask=enc['attention_mask'], max_length=L + a.max_gen_toks,
                                 stopping_criteria=crit, pad_token_id=tok.pad_token_id, use_cache=True, do_sample=False)
            for k in range(len(part)):
                toks = out[k, L:].tolist()
                text = tok.decode(toks, skip_special_tokens=True)
                for u in stops:
                    text = text.split(u)[0]
                generated += sum(1 for t in toks if t != tok.pad_token_id)
        return generated

    run(order[:a.batch])  # warm-up
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    generated = run(order)
    torch.cuda.synchronize()
    sec = time.time() - t0
    print(json.dumps({'peer': 'transformers generate (harness generate_until)', 'items': len(prompts), 'batch': a.batch, 'tokens': generated,
                      'seconds': round(sec, 2), 'tokens_per_s': round(generated / sec), 'items_per_s': round(len(prompts) / sec, 2),
                      'peak_gib': round(torch.cuda.max_memory_allocated() / 2**30, 2)}))


main()
