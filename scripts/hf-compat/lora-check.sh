#!/usr/bin/env bash
# distillery WRITES LoRA adapters and merged exports, transformers / PEFT READ them (issue 16): lora-make.js trains
# real LoRA runs on small random bases and exports the merged models; lora-check.py loads them with transformers (and
# PEFT when installed) and compares logits (<= 1e-5 relative). Run where python3 has torch and transformers (the GPU
# machine) from the repo root with dist/ built and node on PATH. Exit status 1 if any check fails. Env: WORK.
source "$(dirname "$0")/lib.sh" lora-compat
node dist/scripts/hf-compat/lora-make.js "$w"
python3 scripts/hf-compat/lora-check.py "$w"
