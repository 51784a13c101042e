#!/usr/bin/env bash
# Nsight Compute over the kernels that bound the 8x1024 step, run ON the GPU machine in one call (issue 13): (1) the
# training attention kernels alone at the job's shapes and PyTorch's SDPA beside them (wall timings); (2) `ncu --set full`
# on the first launch of each bf16 attention kernel at the teacher's and the student's shape (occupancy, stall reasons,
# shared-memory traffic); (3) every kernel's GPU duration (gpu__time_duration, clocks and caches left as they are) over
# the teacher's whole forward (gemm-shapes.js --model-only), so an in-model GEMM can be set beside the same GEMM alone
# without the per-op profiler's CUDA events in between. Expects dist/ and .devmods/ carried and node on PATH
# (source .device/setup.sh); (4) every kernel of one whole training step of the 1.5B -> 0.5B job at 8x1024 (bf16, KL,
# through scripts/cuda/lora-step.js: the library's StepRunner, captured) with its duration, as a table
# (ncu-step-table.py). Env: PARTS (default "attn ncu-attn forward step"). Output under $OUT: ncu-attention.txt,
# ncu-forward.csv, ncu-step.csv, step-table.txt, kernels.txt.
# Usage (device tool): source .device/setup.sh && bash scripts/cuda/ncu-kernels.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
ln -sfn .devmods/node_modules node_modules
out=${OUT:-/tmp/distillery-ncu}; mkdir -p "$out"
txt="$out/kernels.txt"; : > "$txt"
source scripts/cuda/bench-lib.sh
PARTS=${PARTS:-attn ncu-attn forward step}
has() { [[ " $PARTS " == *" $1 "* ]]; }
say "== device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1); node $(node --version); $(ncu --version | tail -1)"
if has attn; then
node dist/bench/gemm-shapes.js --attn-shapes 2>&1 | tee -a "$txt"
PYTHONUNBUFFERED=1 python3 scripts/cuda/sdpa-times.py 2>&1 | tee -a "$txt"
fi
# (2) one launch per kernel and shape: the teacher's shape is the first of each kernel, the student's comes after the
# teacher's 21 launches (one warm-up and 20 timed, gemm-shapes.js)
if has ncu-attn; then
: > "$out/ncu-attention.txt"
for k in attention_fwd_bf16 attention_bwd_dq_bf16 attention_bwd_dkv_bf16; do
  for skip in 0 21; do
    echo "######## $k (launch-skip $skip)" >> "$out/ncu-attention.txt"
    timeout 120 ncu --clock-control none --set full -k "$k" --launch-skip "$skip" --launch-count 1 --page details \
      node dist/bench/gemm-shapes.js --attn-shapes >> "$out/ncu-attention.txt" 2>&1
    say "ncu $k skip $skip: rc=$?"
  done
done
fi
# (3) every kernel of the teacher's forward with its duration
if has forward; then
timeout 200 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
  node dist/bench/gemm-shapes.js --model-only > "$out/ncu-forward.csv" 2>&1
say "ncu forward: rc=$? $(wc -l < "$out/ncu-forward.csv") lines"
fi
# (4) one training step, every kernel (three steps run: eager, captured, replayed; the table takes the last)
if has step; then
timeout 400 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
  node dist/scripts/cuda/lora-step.js qwen2.5-1.5b qwen2.5-0.5b full 8 1024 1 > "$out/ncu-step.csv" 2>&1
say "ncu step: rc=$? $(wc -l < "$out/ncu-step.csv") lines"
python3 scripts/cuda/ncu-step-table.py "$out/ncu-step.csv" > "$out/step-table.txt" 2>&1
head -45 "$out/step-table.txt" | tee -a "$txt"
fi
say "== done"
