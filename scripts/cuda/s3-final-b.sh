# Final GPU call B of session 3: the headline benchmark at 8x1024 against the PyTorch peer, eager and --mode compile,
# in one call, with distillery's op profile.
source .device/setup.sh && ln -sfn .devmods/node_modules node_modules
SHAPES=8x1024 STEPS=12 PEER_MODES="eager compile" PROFILE=1 OUT=$OUT/bench timeout 560 scripts/cuda/bench-shapes.sh > $OUT/bench-log.txt 2>&1
echo "bench rc=$?" >> $OUT/bench-log.txt
