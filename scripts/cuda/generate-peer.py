"""The PyTorch + HF peer of batched generation: transformers' `generate` on a random-init model of a named shape
(torch_kd_peer.py's builder), a batch of prompts of `--prompt-len` tokens (left-padded as transformers wants for decoder
models, with the attention mask; every prompt the same length here, so no padding is needed), `--new` tokens each,
sampling with temperature / top-k / top-p, bf16, SDPA attention, static or dynamic KV cache.

  python3 scripts/cuda/generate-peer.py --model 0.5b --batch 64 --prompt-len 128 --new 256

Prints one JSON line: generated tokens per second (batch * new / seconds), ms per step, peak memory.
"""
import argparse, json, os, sys, time
import torch

sys.path.insert(0, os.environ.get('PEER_DIR', '.devmods/bench'))
from torch_kd_peer import model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', default='0.5b'); ap.add_argument('--vocab', type=int, default=151936)
    ap.add_argument('--batch', type=int, default=64); ap.add_argument('--prompt-len', type=int, default=128)
    ap.add_argument('--new', type=int, default=256); ap.add_argument('--cache', default='dynamic', choices=['dynamic', 'static'])
    a = ap.parse_args()
    torch.manual_seed(0)
    m = model(a.model, a.vocab).to('cuda', torch.bfloat16).eval()
    ids = torch.randint(0, a.vocab, (a.batch, a.prompt_len), device='cuda')
    mask = torch.ones_like(ids)
    kw = dict(max_new_tokens=a.new, min_new_tokens=a.new, do_sample=True, temperature=0.8, top_k=50, top_p=0.95,
              attention_mask=mask, pad_token_id=0, cache_implementation=a.cache)
    with torch.no_grad():
        m.generate(ids, **{**kw, 'max_new_tokens': 8, 'min_new_tokens': 8})  # warm-up
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        out = m.generate(ids, **kw)
        torch.cuda.synchronize()
    s = time.time() - t0
    n = (out.shape[1] - a.prompt_len) * a.batch
    print(json.dumps({'peer': 'transformers generate', 'model': a.model, 'batch': a.batch, 'prompt_len': a.prompt_len, 'new': a.new,
                      'cache': a.cache, 'seconds': round(s, 3), 'tokens_per_s': round(n / s), 'ms_per_step': round(1000 * s / a.new, 2),
                      'peak_gib': round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)}))


if __name__ == '__main__':
    main()
