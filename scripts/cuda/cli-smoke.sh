#!/usr/bin/env bash
# The CLI on the GPU, end to end, in strict kernel mode (a miss after pre-warm fails the command): train a small
# model with --device cuda, generate from it with the KV cache, and evaluate it on CUDA and on the CPU — the two
# evaluations must agree. Run ON the GPU machine (see device-run.sh for what must be carried). Output: stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
w=${WORK:-/tmp/distillery-cli-smoke}; rm -rf "$w"; mkdir -p "$w"
cuda=(--device cuda --strict-kernels --kernel-cache-dir "$w/kernels")
node bin/distillery.js train "${cuda[@]}" --data builtin:docs --max-chars 200000 --model small --vocab-size 512 \
  --steps 60 --batch 16 --seq 128 --eval-every 30 --out "$w/run" --quiet 2>&1 | grep -E 'kernel-cache|train:|student'
echo "== generate (cuda, greedy)"
node bin/distillery.js generate "${cuda[@]}" --model "$w/run/final" --prompt "Returns the" --max-new-tokens 24 2>&1 | grep -v '^\[kernel-cache\] compile'
echo
for dev in cuda cpu; do
  extra=(); [ $dev = cuda ] && extra=("${cuda[@]}")
  echo "== eval ($dev)"
  node bin/distillery.js eval "${extra[@]}" --device $dev --model "$w/run/final" --data builtin:docs --max-chars 60000 --seq 128 --json 2>/dev/null | tee "$w/eval-$dev.json"
done
node -e '
  const [a, b] = process.argv.slice(1).map((f) => JSON.parse(require("fs").readFileSync(f, "utf8")));
  const rel = Math.abs(a.loss - b.loss) / Math.abs(b.loss);
  console.log(`eval loss cuda ${a.loss} vs cpu ${b.loss}: relative difference ${rel.toExponential(2)} ${rel < 1e-4 ? "OK" : "MISMATCH"}`);
  process.exit(rel < 1e-4 ? 0 : 1);
' "$w/eval-cuda.json" "$w/eval-cpu.json"
