#!/usr/bin/env bash
# The GPU suite for a device call (run from the repo root with .device, .devmods and dist carried): every CUDA test
# except the nvcc cross-architecture gate (CI runs it), with the parity table, via device-check.sh; results under $OUT
# (check.txt, tests.txt, parity.tsv). Env: TIMEOUT (seconds for the suite, default 480: session 51's run took 374 s, and
# a call's limit is 600 s with the machine's start).
# Usage (device tool): source .device/setup.sh && bash scripts/cuda/gpu-suite.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
ln -sfn .devmods/node_modules node_modules
out=${OUT:-/tmp/distillery-gpu-suite}; mkdir -p "$out"
T=$(ls dist/test/cuda/*.test.js | grep -v compile-gate-nvcc | tr '\n' ' ')
DISTILLERY_TESTS="$T" OUT="$out" timeout "${TIMEOUT:-480}" scripts/cuda/device-check.sh > "$out/check.txt" 2>&1
rc=$?
echo "check rc=$rc" >> "$out/check.txt"
tail -40 "$out/check.txt"
exit $rc
