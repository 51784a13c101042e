#!/usr/bin/env bash
# 4-bit frozen weights on the GPU, run ON the GPU machine in one call (issue 16): a Qwen2.5-7B-shaped teacher distilled
# into a 0.5B-shaped student (fully trained) with the teacher in bf16 and in NF4, and a QLoRA student (r = 16 adapters on
# an NF4 1.5B-shaped base) under the 3B-shaped teacher, each through scripts/cuda/lora-step.ts (random weights, vocab
# 151936, bf16 compute, KL, strict pre-warm): tokens/s, load time and peak memory (nvidia-smi, as bench-shapes.sh).
# Expects dist/ and .devmods/ carried and node on PATH (source .device/setup.sh).
# Env: BIG (qwen2.5-7b), SMALL (qwen2.5-0.5b), SHAPE (8x1024), STEPS (10), RUNS (which of "nf4 bf16 qlora", default all).
# Output: $OUT/nf4-bench.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-bench}; mkdir -p "$out"
txt="$out/nf4-bench.txt"; : > "$txt"
BIG=${BIG:-qwen2.5-7b}; SMALL=${SMALL:-qwen2.5-0.5b}; SHAPE=${SHAPE:-8x1024}; STEPS=${STEPS:-10}
B=${SHAPE%x*}; S=${SHAPE#*x}
work=/tmp/distillery-bench; mkdir -p "$work"
source scripts/cuda/bench-lib.sh
say_device
one() { # label teacher student mode teacher_dtype
  local label=$1; shift
  run_s() { TEACHER_DTYPE=$4 node dist/scripts/cuda/lora-step.js "$1" "$2" "$3" "$B" "$S" "$STEPS" > "$work/nf4-$label.json" 2> "$work/nf4-$label.log"; }
  read -r rc mib < <(peak_of run_s "$@")
  say "== $label: rc=$rc peak ${mib} MiB (nvidia-smi) $(tail -1 "$work/nf4-$label.json")"
  grep -E '^\[kernel-cache\] (pre-warm|miss)|rror' "$work/nf4-$label.log" | head -4 | tee -a "$txt"
  [ "$rc" != 0 ] && tail -12 "$work/nf4-$label.log" | tee -a "$txt"
}
RUNS=${RUNS:-nf4 bf16 qlora}
has() { [[ " $RUNS " == *" $1 "* ]]; }
has nf4 && one "teacher-$BIG-nf4" "$BIG" "$SMALL" full nf4
has bf16 && one "teacher-$BIG-bf16" "$BIG" "$SMALL" full bf16
has qlora && one "qlora-r16-qwen2.5-1.5b" qwen2.5-3b qwen2.5-1.5b qlora:16 bf16
say "== done"
