#!/usr/bin/env bash
# One device-machine session: build, GPU tests, a compute-sanitizer memcheck subset, the dense
# bench. Logs go to $OUT (or ./gpu_out); a short table comes last.
#   scripts/gpu_session.sh [--quick | --no-profile]   (--quick: no bench; --no-profile: the read
#                                                      ceiling and the bench, no SASS or ncu)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}; mkdir -p "$out"
# At most 8 files come back: info.txt (with the check lines), build.log, gpu_tests.log,
# memcheck.log, bench.log, read_ceiling.log, ncu.txt, ncu_repack.txt. (The decode kernel's SASS:
# scripts/decode_probe.sh.)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.total --format=csv | tee "$out/info.txt"
OUT="$out" scripts/gpu_build.sh || exit 1
export QGEMM_CACHE_DIR=/tmp/qgemm-cache
build-gpu/qgemm info 2>&1 | tee -a "$out/info.txt"
echo "built at ${SECONDS}s"
# Four at a time: most of a GPU test's time is NVRTC compiling kernels on the CPU (the disk
# cache is safe to share), and the tests check results, not timings.
ctest --test-dir build-gpu -L gpu -j4 --output-on-failure -V > "$out/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "tests passed|Failed|FAILED|Failure" "$out/gpu_tests.log" | head -20
echo "dense cases checked: $(grep -c 'rel=' "$out/gpu_tests.log") (tests done at ${SECONDS}s)"
# Memory errors and races on a subset (the README's sanitizer command).
QGEMM_GPU_TEST_SUBSET=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
  build-gpu/tests/qgemm_tests_gpu \
  --gtest_filter='DenseGemmGpu.MatchesReferenceForEveryScheme:DenseGemmGpu.QuantizedActivationsMatchReference' \
  > "$out/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -4 "$out/memcheck.log"
# qgemm check through the CLI on the GPU for the quantized-activation presets.
for s in w4a8-fp8 w8a8-fp8 fp8-block w8a8-int8 mxfp4-a8 mxfp8-mxfp4 nvfp4 bitnet; do
  build-gpu/qgemm check --scheme $s --m 33 --n 1000 --k 2048 --backend gpu > /tmp/check_$s.txt 2>&1
  echo "check $s rc=$? $(tail -1 /tmp/check_$s.txt)" | tee -a "$out/info.txt"
done
# The repack kernel alone (w4a16 28672x8192, the 13th repack launch of the test).
ncu --clock-control none --kernel-name regex:mma_repack --launch-skip 12 --launch-count 1 \
  --section SpeedOfLight build-gpu/tests/qgemm_tests_gpu --gtest_filter='MmaRepackGpu.*' \
  > "$out/ncu_repack.txt" 2>&1
grep -E "Duration|DRAM Throughput|Memory Throughput" "$out/ncu_repack.txt" | sed 's/^/repack: /'
echo "profiled at ${SECONDS}s"
if [ "${1:-}" = "--no-profile" ]; then
  nvcc -O3 -arch=sm_90a -std=c++17 -Ikernels -o build-gpu/read_ceiling bench/read_ceiling.cu \
    && build-gpu/read_ceiling | tee "$out/read_ceiling.log"
  build-gpu/bench/qgemm_dense_bench 2>&1 | tee "$out/bench.log"
elif [ "${1:-}" != "--quick" ]; then
  nvcc -O3 -arch=sm_90a -o build-gpu/mma_ceiling bench/mma_ceiling.cu && build-gpu/mma_ceiling | tee "$out/bench.log"
  build-gpu/bench/qgemm_dense_bench 2>&1 | tee -a "$out/bench.log"
  # Where the decode kernel spends its time (w4a16 M=1 28672x8192, the first bench launch).
  ncu --clock-control none --kernel-name regex:dense_ --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats \
    build-gpu/bench/qgemm_dense_bench --quick > "$out/ncu.txt" 2>&1
  grep -E "Duration|Throughput|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp|Registers|Stall|One or More|No Eligible" "$out/ncu.txt" | head -40
fi
