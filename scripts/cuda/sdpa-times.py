"""Times PyTorch's scaled_dot_product_attention (causal, bf16, GQA expanded as the peer runs it) at the distillation
job's attention shapes, forward and forward+backward, with CUDA events over repeated calls (median of 5 runs of 20).
Prints TFLOP/s with the causal FLOP count (half of 4·B·H·T²·hd forward; backward 2.5× forward), the same count
distillery's profile rows are compared with. Usage: python3 scripts/cuda/sdpa-times.py"""
import torch
import torch.nn.functional as F

SHAPES = [  # name, batch, seq, query heads, kv heads, head dim
    ("qwen2.5-1.5b teacher", 8, 1024, 12, 2, 128),
    ("qwen2.5-0.5b student", 8, 1024, 14, 2, 64),
    ("qwen3-1.7b teacher", 8, 1024, 16, 8, 128),
    ("qwen3-0.6b student", 8, 1024, 16, 8, 128),
]


def bench(f, reps=20, runs=5):
    f()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            f()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps * 1000)
    return sorted(times)[len(times) // 2]


for name, B, T, H, KV, D in SHAPES:
    q = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, KV, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, KV, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    fwd_flops = 4 * B * H * T * T * D / 2
    def fwd():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out = fwd()
    g = torch.randn_like(out)
    def fwd_bwd():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        o.backward(g)
    tf = bench(lambda: fwd())
    tfb = bench(fwd_bwd)
    tb = tfb - tf
    print(f"[sdpa] {name}: B={B} T={T} H={H} KV={KV} hd={D}: forward {tf:.1f} us ({fwd_flops / tf / 1e6:.0f} TFLOP/s), "
          f"backward {tb:.1f} us ({2.5 * fwd_flops / tb / 1e6:.0f} TFLOP/s), forward+backward {tfb:.1f} us")
