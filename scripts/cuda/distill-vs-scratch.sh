#!/usr/bin/env bash
# The embedded default's question on the GPU: does a student distilled from a trained teacher beat the same student
# trained without one (same architecture, initial weights, data, order and steps)? Runs the real CLI with
# --device cuda --strict-kernels on builtin:docs and prints the three validation cross-entropies. Run ON the GPU
# machine (carry as for device-run.sh). Env: TSTEPS (300), SSTEPS (150), B (32), S (128).
set -euo pipefail
cd "$(dirname "$0")/../.."
w=${WORK:-/tmp/distillery-distill-vs-scratch}; rm -rf "$w"; mkdir -p "$w"
TSTEPS=${TSTEPS:-300}; SSTEPS=${SSTEPS:-150}
common=(--device cuda --strict-kernels --kernel-cache-dir "$w/kernels" --data builtin:docs --batch "${B:-32}" --seq "${S:-128}" --seed 7
  --val-fraction 0.05 --eval-batches 16 --quiet)
node bin/distillery.js train "${common[@]}" --model base --vocab-size 2048 --steps "$TSTEPS" --warmup 50 --lr 2e-3 \
  --eval-every "$TSTEPS" --save-every "$TSTEPS" --out "$w/teacher" 2>&1 | grep -E '^(train|student):'
student=(--model small --tokenizer "$w/teacher/tokenizer.json" --steps "$SSTEPS" --warmup 30 --lr 3e-3 --eval-every "$SSTEPS" --save-every "$SSTEPS")
node bin/distillery.js distill "${common[@]}" "${student[@]}" --teacher "$w/teacher/final" --loss kl --alpha 0.9 --temperature 1 \
  --out "$w/distilled" 2>&1 | grep -E '^(distill|student):'
node bin/distillery.js train "${common[@]}" "${student[@]}" --out "$w/scratch" 2>&1 | grep -E '^(train|student):'
node -e '
  const w = process.argv[1];
  const r = (n) => JSON.parse(require("fs").readFileSync(`${w}/${n}/summary.json`, "utf8"));
  const rows = ["teacher", "distilled", "scratch"].map((n) => [n, r(n)]);
  console.log("model      parameters  steps  val loss (CE)  tokens/s");
  for (const [n, s] of rows) console.log(`${n.padEnd(10)} ${String(s.parameters).padStart(10)}  ${String(s.steps).padStart(5)}  ${s.finalValCe.toFixed(4).padStart(13)}  ${String(Math.round(s.tokensPerSecond)).padStart(8)}`);
  const gain = rows[2][1].finalValCe - rows[1][1].finalValCe;
  console.log(`distilled vs scratch: ${gain > 0 ? "lower" : "HIGHER"} validation CE by ${Math.abs(gain).toFixed(4)} nats`);
' "$w"
