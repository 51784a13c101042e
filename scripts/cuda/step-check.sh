#!/usr/bin/env bash
# GPU check of the training step's machinery (issue 13: stream-ordered, captured step), run ON the GPU machine in one
# call (carry .device, .devmods, dist): the CUDA tests named by TESTS (default: the graph tests and the whole-model
# parity), then the Qwen2.5-1.5B -> 0.5B benchmark (bench-shapes.sh) at SHAPES with CUDA graphs on and, with
# NOGRAPHS=1, once more with DISTILLERY_CUDA_GRAPHS=0, each printing its region timeline; PROFILE=1 adds the op profile.
# Outputs under $OUT: check/, bench/ (graphs on), bench-nographs/.
# Env: TESTS ("none" skips; "all": every CUDA test but the nvcc gate), SHAPES (8x1024), PEER_MODES ("none"),
#      NOGRAPHS (0/1), PROFILE (0/1), TEST_TIMEOUT / BENCH_TIMEOUT (seconds).
set -uo pipefail
cd "$(dirname "$0")/../.."
ln -sfn .devmods/node_modules node_modules
out=${OUT:-/tmp/distillery-step-check}; mkdir -p "$out"
tests=${TESTS:-dist/test/cuda/graphs-gpu.test.js dist/test/cuda/model-parity.test.js}
[ "$tests" = all ] && tests=$(ls dist/test/cuda/*.test.js | grep -v compile-gate-nvcc | tr '\n' ' ')
if [ "$tests" != none ]; then
  DISTILLERY_TESTS="$tests" OUT=$out/check timeout "${TEST_TIMEOUT:-300}" scripts/cuda/device-check.sh > "$out/check.txt" 2>&1
  echo "check rc=$?" >> "$out/check.txt"
  rm -f "$out/check/flash-attention.txt"
  tail -5 "$out/check.txt"
fi
bench() {
  SHAPES=${SHAPES:-8x1024} PEER_MODES=${PEER_MODES:-none} PROFILE=${PROFILE:-0} OUT=$1 \
    timeout "${BENCH_TIMEOUT:-400}" scripts/cuda/bench-shapes.sh > "$1-log.txt" 2>&1
  echo "bench rc=$?" >> "$1-log.txt"
  grep -E '^(== distillery|\[cuda-timeline\]|\[cuda-graphs\]|ratio|== peer)' "$1-log.txt"
}
echo "== graphs on"; bench "$out/bench"
if [ "${NOGRAPHS:-0}" = 1 ]; then echo "== graphs off"; DISTILLERY_CUDA_GRAPHS=0 PROFILE=0 bench "$out/bench-nographs"; fi
