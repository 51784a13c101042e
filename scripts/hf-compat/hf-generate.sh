#!/usr/bin/env bash
# transformers GENERATES, distillery generates the same: hf-generate.py records transformers' generate() on a tiny random
# Qwen2 (greedy with repetition_penalty; sampled with temperature, top_k, top_p, min_p and repetition_penalty, with its
# raw logits and processed scores); generate-hf.js compares distillery's generation and sampling rule with it on the CPU
# and (if present) CUDA backends. Run ON the GPU machine from the repo root with dist/ built and node on PATH.
# Exit status 1 if any check fails. Env: WORK (scratch folder).
source "$(dirname "$0")/lib.sh" hf-generate
python3 scripts/hf-compat/hf-generate.py "$w"
node dist/scripts/hf-compat/generate-hf.js "$w" "$@"
