source .device/setup.sh
ln -sfn .devmods/node_modules node_modules
node dist/bench/gemm-shapes.js --random --attn > $OUT/gemm-random.txt 2>&1
python3 scripts/cuda/sdpa-times.py > $OUT/sdpa.txt 2>&1
cat $OUT/gemm-random.txt $OUT/sdpa.txt
TESTS="dist/test/cuda/graphs-gpu.test.js" PROFILE=1 OUT=$OUT bash scripts/cuda/step-check.sh 2>&1 | tail -30
