#!/usr/bin/env bash
# Generation's cached attention alone (bench/attention-cached.ts), run ON the GPU machine in one call: this build and, with
# BASE=<folder> (another build's dist carried beside it, src and bench), that build at the same shapes; with SWEEP=1 the
# other layouts of attention_cached (blocks, rows in flight) beside the plan's; then ptxas' registers and spills of the
# planned kernels (nvcc --resource-usage on their generated source, sm_90). Expects dist/ and .devmods/ carried and node
# on PATH (source .device/setup.sh). Env: LENS (256,1024,4096), BATCHES (8,64). Output: $OUT/attention-cached.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-bench}; mkdir -p "$out"
txt="$out/attention-cached.txt"; : > "$txt"
work=/tmp/distillery-bench; mkdir -p "$work"
source scripts/cuda/bench-lib.sh
say_device
args=(--lens="${LENS:-256,1024,4096}" --batches="${BATCHES:-8,64}")
if [ -n "${BASE:-}" ]; then
  say "== build $BASE"
  node "$BASE/bench/attention-cached.js" "${args[@]}" 2>&1 | tee -a "$txt"
fi
say "== this build$([ "${SWEEP:-}" = 1 ] && echo ', with the sweep (block/un us; * the plan)')"
node dist/bench/attention-cached.js "${args[@]}" $([ "${SWEEP:-}" = 1 ] && echo --sweep) 2>&1 | tee -a "$txt"
say "== registers and spills of the planned kernels (ptxas, sm_90)"
node --input-type=module -e '
  import { attentionCachedGqa, cachedAttentionPlan } from "./dist/src/backend/cuda/kernels/attention.js";
  import { writeFileSync } from "node:fs";
  for (const [hd, g] of [[64, 7], [128, 2], [128, 6], [128, 4], [64, 1]]) {
    const p = cachedAttentionPlan(hd, g, true);
    const s = attentionCachedGqa.make({ headDim: hd, group: g, ...p, out: "bf16", q: "bf16", kc: "bf16", vc: "bf16", seqPos: false });
    writeFileSync(`${process.argv[1]}/ac-hd${hd}-g${g}-b${p.block}-un${p.un}.cu`, s.source());
  }' "$work"
for f in "$work"/ac-*.cu; do
  say "$(basename "$f" .cu): $(nvcc -arch=sm_90 -cubin --resource-usage -o "$work/x.cubin" "$f" 2>&1 | grep -oE 'Used [0-9]+ registers|[0-9]+ bytes spill (stores|loads)|[0-9]+ bytes smem' | tr '\n' ' ')"
done
say "== done"
