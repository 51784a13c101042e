# Final GPU call A of session 3: the CUDA test suite (minus the nvcc gate), the 50-step bf16-vs-fp32 loss curve, and
# distillery alone at 16x1024 (the eager peer runs out of memory there; measured in call B's shape too).
source .device/setup.sh && ln -sfn .devmods/node_modules node_modules
T=$(ls dist/test/cuda/*.test.js | grep -v compile-gate-nvcc | tr '\n' ' ')
DISTILLERY_TESTS="$T" OUT=$OUT/check timeout 250 scripts/cuda/device-check.sh > $OUT/check.txt 2>&1
echo "check rc=$?" >> $OUT/check.txt
STEPS=50 SHAPE=4x512 OUT=$OUT/curve timeout 200 scripts/cuda/precision-curve.sh > $OUT/curve-log.txt 2>&1
echo "curve rc=$?" >> $OUT/curve-log.txt
SHAPES=16x1024 STEPS=8 PEER_MODES=eager PROFILE=0 OUT=$OUT/bench16 timeout 140 scripts/cuda/bench-shapes.sh > $OUT/bench16-log.txt 2>&1
echo "bench rc=$?" >> $OUT/bench16-log.txt
