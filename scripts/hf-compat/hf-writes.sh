#!/usr/bin/env bash
# transformers WRITES, distillery READS: hf-writes.py has transformers (>= 5) save Qwen2 and Llama checkpoints of many
# configurations with save_pretrained (tied/untied, biases, GQA/MHA, explicit head_dim, each RoPE kind, f32/bf16/f16,
# sharded) plus its logits; read-hf.js loads each folder with distillery on the CPU and (if present) CUDA backends and
# compares (max relative error <= 1e-5). Run ON the GPU machine from the repo root with dist/ built and node on PATH.
# Output: the table on stdout; exit status 1 if any case fails. Env: WORK (scratch folder).
set -euo pipefail
cd "$(dirname "$0")/../.."
w=${WORK:-/tmp/distillery-hf-writes}; rm -rf "$w"; mkdir -p "$w"
export DISTILLERY_CACHE_DIR="${DISTILLERY_CACHE_DIR:-$w/kernels}"
python3 scripts/hf-compat/hf-writes.py "$w/ckpts"
node dist/scripts/hf-compat/read-hf.js "$w/ckpts" "$@"
