export QGEMM_CACHE_DIR=/tmp/qc; o=$OUT; S=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$o scripts/gpu_build.sh || exit 1; echo "built at $((SECONDS-S))s"
t=build-gpu/tests/qgemm_tests_gpu
QGEMM_GPU_TEST_SUBSET=1 timeout 220 $t --gtest_filter='MoeLayerGpu.FusedGlu*:MoeLayerGpu.EveryRoutingShape*:MoeLayerGpu.SchemesActivations*:MoeLayerGpu.Captured*:MoeLayerGpu.GroupedDecodeMatches*' > $o/moe.log 2>&1; echo "moe tests rc=$? at $((SECONDS-S))s"
grep -E "^\[  (PASSED|FAILED) |Failure|differ|seed|worst [0-9.]+ of" $o/moe.log | grep -vE "worst 0\.[0-8]" | head -40
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 10 $t --gtest_filter='MoeLayerGpu.FusedGlu*' > $o/memcheck.log 2>&1; echo "memcheck rc=$? $(grep 'ERROR SUMMARY' $o/memcheck.log) at $((SECONDS-S))s"
for f in 1 0; do for m in 1 16 256 4096; do QGEMM_FUSED_GLU=$f timeout 40 build-gpu/bench/qgemm_moe_bench --case qwen3-30b-a3b:w4a16:$m 2>&1 | tail -1 | sed "s/^/fused=$f /"; done; done
QGEMM_FUSED_GLU=1 timeout 40 build-gpu/bench/qgemm_moe_bench --case gpt-oss-120b:mxfp4-a16:256 2>&1 | tail -1
QGEMM_FUSED_GLU=0 timeout 40 build-gpu/bench/qgemm_moe_bench --case gpt-oss-120b:mxfp4-a16:256 2>&1 | tail -1
echo "at $((SECONDS-S))s"
timeout 100 $t --gtest_filter='QuantizeWeightGpu.*' > $o/qw.log 2>&1; echo "quantize tests rc=$?"; grep -E "^\[  (PASSED|FAILED) |Failure" $o/qw.log | head
PYTHONPATH=build-gpu/python timeout 60 python3 bench/quantize_python.py 2>&1 | tail -8
cd $o && tar czf logs.tgz *.log && rm -f *.log
