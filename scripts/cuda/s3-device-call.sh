# This session's GPU call (run on the device from the repo root with .device, .devmods and dist carried):
# the CUDA test suite (minus the nvcc gate, which CI runs), the GEMM shape micro-benchmark, and the 8x1024 benchmark.
# Env: TESTS (1), GEMM (1), SHAPES (8x1024), PEER_MODES (none), PROFILE (1), STEPS (10).
source .device/setup.sh && ln -sfn .devmods/node_modules node_modules
if [ "${TESTS:-1}" = 1 ]; then
  T=$(ls dist/test/cuda/*.test.js | grep -v compile-gate-nvcc | tr '\n' ' ')
  DISTILLERY_TESTS="$T" OUT=$OUT/check timeout 300 scripts/cuda/device-check.sh > $OUT/check.txt 2>&1
  echo "check rc=$?" >> $OUT/check.txt
fi
[ "${GEMM:-1}" = 1 ] && timeout 60 node dist/bench/gemm-shapes.js > $OUT/gemm.txt 2>&1
SHAPES=${SHAPES:-8x1024} STEPS=${STEPS:-10} PEER_MODES=${PEER_MODES:-none} PROFILE=${PROFILE:-1} OUT=$OUT/bench \
  timeout ${BENCH_TIMEOUT:-280} scripts/cuda/bench-shapes.sh > $OUT/bench-log.txt 2>&1
echo "bench rc=$?" >> $OUT/bench-log.txt
