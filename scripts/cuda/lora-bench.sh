#!/usr/bin/env bash
# LoRA against full training on the GPU, run ON the GPU machine in one call: the same distillation step (a teacher and
# a student of the given presets, random weights, vocab 151936, bf16, KL, strict pre-warm) with the student trained
# fully and through rank-R LoRA adapters on every projection (scripts/cuda/lora-step.ts), tokens/s and peak memory
# (nvidia-smi, as bench-shapes.sh) of each.
# Expects dist/ and .devmods/ carried and node on PATH (source .device/setup.sh).
# Env: TEACHER (qwen2.5-3b), STUDENT (qwen2.5-1.5b), RANK (16), SHAPE (8x1024), STEPS (10). Output: $OUT/lora-bench.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-bench}; mkdir -p "$out"
txt="$out/lora-bench.txt"; : > "$txt"
TEACHER=${TEACHER:-qwen2.5-3b}; STUDENT=${STUDENT:-qwen2.5-1.5b}; RANK=${RANK:-16}; SHAPE=${SHAPE:-8x1024}; STEPS=${STEPS:-10}
B=${SHAPE%x*}; S=${SHAPE#*x}
work=/tmp/distillery-bench; mkdir -p "$work"
source scripts/cuda/bench-lib.sh
say "== $TEACHER -> $STUDENT at $SHAPE: LoRA r=$RANK (every projection) vs full training"
say_device
for mode in "lora:$RANK" full; do
  run_s() { node dist/scripts/cuda/lora-step.js "$TEACHER" "$STUDENT" "$mode" "$B" "$S" "$STEPS" > "$work/lora-$mode.json" 2> "$work/lora-$mode.log"; }
  read -r rc mib < <(peak_of run_s)
  say "== $mode: rc=$rc peak ${mib} MiB (nvidia-smi) $(tail -1 "$work/lora-$mode.json")"
  grep -E '^\[kernel-cache\] (pre-warm|miss)|rror' "$work/lora-$mode.log" | head -4 | tee -a "$txt"
  [ "$rc" != 0 ] && tail -12 "$work/lora-$mode.log" | tee -a "$txt"
done
say "== done"
