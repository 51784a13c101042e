"""The PyTorch + HF peer of a teacher-cache job: the teacher's forward alone (bf16, no grad, full logits), the work every
cache job and every online distillation step pays for. Same model builder as torch_kd_peer.py (random init).

  python3 scripts/cuda/teacher-forward-peer.py --teacher 1.5b --batch 8 --seq 1024 [--mode compile]

Prints one JSON line: ms per forward, tokens/s, peak memory.
"""
import argparse, json, os, sys, time
import torch

sys.path.insert(0, os.environ.get('PEER_DIR', '.devmods/bench'))
from torch_kd_peer import model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--teacher', default='1.5b'); ap.add_argument('--vocab', type=int, default=151936)
    ap.add_argument('--batch', type=int, default=8); ap.add_argument('--seq', type=int, default=1024)
    ap.add_argument('--mode', default='eager', choices=['eager', 'compile']); ap.add_argument('--steps', type=int, default=10)
    a = ap.parse_args()
    torch.manual_seed(0)
    teacher = model(a.teacher, a.vocab).to('cuda', torch.bfloat16).eval()
    if a.mode == 'compile':
        teacher.forward = torch.compile(teacher.forward)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), device='cuda')

    def fwd():
        with torch.no_grad():
            return teacher(input_ids=ids).logits

    for _ in range(3): fwd()
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    for _ in range(a.steps): fwd()
    torch.cuda.synchronize()
    ms = 1000 * (time.time() - t0) / a.steps
    print(json.dumps({'peer': 'pytorch-hf teacher forward', 'mode': a.mode, 'teacher': a.teacher, 'batch': a.batch, 'seq': a.seq,
                      'ms_per_forward': round(ms, 2), 'tokens_per_s': round(a.batch * a.seq * 1000 / ms),
                      'peak_gib': round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)}))


if __name__ == '__main__':
    main()
