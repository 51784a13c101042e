#!/usr/bin/env bash
# transformers WRITES, distillery READS: hf-writes.py has transformers (>= 5) save Qwen2 and Llama checkpoints of many
# configurations with save_pretrained (tied/untied, biases, GQA/MHA, explicit head_dim, each RoPE kind, f32/bf16/f16,
# sharded) plus its logits; read-hf.js loads each folder with distillery on the CPU and (if present) CUDA backends and
# compares (max relative error <= 1e-5). Run ON the GPU machine from the repo root with dist/ built and node on PATH.
# Output: the table on stdout; exit status 1 if any case fails. Env: WORK (scratch folder).
source "$(dirname "$0")/lib.sh" hf-writes
python3 scripts/hf-compat/hf-writes.py "$w/ckpts"
node dist/scripts/hf-compat/read-hf.js "$w/ckpts" "$@"
