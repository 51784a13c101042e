source .device/setup.sh && ln -sfn .devmods/node_modules node_modules
T=$(ls dist/test/cuda/*.test.js | grep -v compile-gate-nvcc | tr '\n' ' ')
DISTILLERY_TESTS="$T" OUT=$OUT/check timeout 330 scripts/cuda/device-check.sh > $OUT/check.txt 2>&1
echo "check rc=$?" >> $OUT/check.txt
SHAPES=8x1024 STEPS=8 PEER_MODES="" PROFILE=1 OUT=$OUT/bench timeout 240 scripts/cuda/bench-shapes.sh > $OUT/bench-log.txt 2>&1
echo "bench rc=$?" >> $OUT/bench-log.txt
