#!/usr/bin/env bash
# GPU check for the CUDA backend, run ON the GPU machine. Builds nothing: it expects dist/ (tsc output) and
# node_modules with koffi (+ @koromix/koffi-linux-x64) in the project root, e.g. carried by the device tool.
# Runs every test under dist/test/cuda (GPU parity vs the CPU backend, compile gate, cache, trace/seal) and
# prints a parity table. Outputs go to $OUT (or /tmp/distillery-device-check): tests.txt, parity.tsv.
# Usage: scripts/cuda/device-check.sh            (exit status: that of the test run)
#        DISTILLERY_TESTS='dist/test/cuda/a.test.js ...' scripts/cuda/device-check.sh   (a subset)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/distillery-device-check}
mkdir -p "$out"
export DISTILLERY_PARITY_TABLE="$out/parity.tsv"
export DISTILLERY_CACHE_DIR="${DISTILLERY_CACHE_DIR:-/tmp/distillery-device-check-cache}"
: > "$DISTILLERY_PARITY_TABLE"
echo "== device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
echo "== node $(node --version)"
start=$(date +%s)
# shellcheck disable=SC2086
node --test --test-concurrency=1 --test-reporter=spec ${DISTILLERY_TESTS:-dist/test/cuda/} > "$out/tests.txt" 2>&1
rc=$?
echo "== tests: rc=$rc in $(( $(date +%s) - start ))s"
grep -E '^ *(✔|✖|﹣)|^ℹ (tests|pass|fail|skipped)|compile gate:|\[kernel-cache\]' "$out/tests.txt" | grep -v '^ *✔' | head -60
grep -cE '^ *✔' "$out/tests.txt" | sed 's/^/passed lines: /'
echo "== parity (op, max relative error, tolerance, verdict)"
column -t -s $'\t' "$DISTILLERY_PARITY_TABLE" 2>/dev/null || cat "$DISTILLERY_PARITY_TABLE"
echo "== flash attention (max relative errors per case; all lines in $out/flash-attention.txt)"
grep -o '\[flash-attention\].*' "$out/tests.txt" > "$out/flash-attention.txt" || true
grep -c . "$out/flash-attention.txt" | sed 's/^/cases x references: /'
grep -E 'T=(1030|4096)|hd 256|chunked' "$out/flash-attention.txt" | head -40
if [ "$rc" -ne 0 ]; then echo "== failures"; grep -A12 -E '✖' "$out/tests.txt" | head -150; fi
exit "$rc"
