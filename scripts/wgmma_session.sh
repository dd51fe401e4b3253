#!/usr/bin/env bash
# The SM90 wgmma family on the device machine: build, the forced-config correctness test (subset
# first, under a time limit: a wrong mbarrier protocol hangs rather than fails), memcheck of the
# subset when it fails, then the full test and the --wgmma bench rows. Logs go to $OUT.
#   scripts/wgmma_session.sh [--bench-only | --test-only | --quick | --sanitize]
# --quick: the subset test, then the bench's --wgmma-quick rows (a short device call).
# --sanitize: the subset under compute-sanitizer memcheck, then racecheck (0 errors expected).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/info.txt"
OUT="$out" scripts/gpu_build.sh qgemm qgemm_tests_gpu qgemm_dense_bench || exit 1
echo "built at ${SECONDS}s"
export QGEMM_CACHE_DIR=/tmp/qgemm-cache
tests=build-gpu/tests/qgemm_tests_gpu
filter='--gtest_filter=WgmmaGemmGpu.*'
summary() {  # failures (the first lines of each), then the count of checked runs
  grep -E "Failure|FAILED|worst|checked|timed out" "$1" | head -${2:-40}
  echo "runs printed: $(grep -c 'rel=' "$1")"
}
if [ "${1:-}" = "--sanitize" ]; then
  for tool in memcheck racecheck; do
    QGEMM_GPU_TEST_SUBSET=1 timeout 280 compute-sanitizer --tool $tool --error-exitcode 9 \
      --print-limit 20 $tests "$filter" > "$out/$tool.log" 2>&1
    echo "$tool rc=$? at ${SECONDS}s: $(grep 'ERROR SUMMARY' "$out/$tool.log")"
  done
  exit 0
fi
if [ "${1:-}" != "--bench-only" ]; then
  QGEMM_GPU_TEST_SUBSET=1 timeout 150 stdbuf -oL $tests "$filter" > "$out/subset.log" 2>&1
  rc=$?; echo "subset rc=$rc at ${SECONDS}s"; summary "$out/subset.log"
  if [ $rc -ne 0 ]; then
    tail -5 "$out/subset.log"
    QGEMM_GPU_TEST_SUBSET=1 timeout 200 compute-sanitizer --tool memcheck --print-limit 20 \
      $tests "$filter" > "$out/memcheck.log" 2>&1
    echo "memcheck rc=$?"; grep -E "Invalid|at 0x|by thread|ERROR SUMMARY" "$out/memcheck.log" | head -30
    exit 1
  fi
  if [ "${1:-}" != "--quick" ]; then
    timeout 300 stdbuf -oL $tests "$filter" > "$out/full.log" 2>&1
    echo "full rc=$? at ${SECONDS}s"; summary "$out/full.log"
  fi
fi
[ "${1:-}" = "--test-only" ] && exit 0
mode=--wgmma; [ "${1:-}" = "--quick" ] && mode=--wgmma-quick
timeout 240 stdbuf -oL build-gpu/bench/qgemm_dense_bench $mode > "$out/bench.log" 2>&1
echo "bench rc=$? at ${SECONDS}s"; cat "$out/bench.log"
