#!/usr/bin/env bash
# One device-machine session for the bake-off tool (issue #5): build, the bench/tune GPU tests,
# then `qgemm bench bench/recipes/quickstart.yaml` with JSON and plots. Run from anywhere; logs
# and results go to $OUT (or ./bench_out); a short table comes last.
#   scripts/bench_session.sh            build + tests + quickstart bake-off
#   scripts/bench_session.sh --no-tests build + quickstart bake-off only
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench_out}; mkdir -p "$out"
# Files that come back: info.txt, build.log, bench_tests.log, quickstart.{json,csv,txt,log},
# quickstart.png, quickstart_roofline.png.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,memory.total,driver_version \
  --format=csv > "$out/info.txt" 2>&1
extra=()
# xxhash.h travels in .deps/include (copied from Debian's libxxhash-dev) where the image lacks it.
[ -f /usr/include/xxhash.h ] || extra+=(-DXXHASH_INCLUDE_DIR=$PWD/.deps/include)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release "${extra[@]}" > "$out/build.log" 2>&1 \
  || { tail -30 "$out/build.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" >> "$out/build.log" 2>&1 \
  || { grep -E "error" "$out/build.log" | head -30; exit 1; }
export QGEMM_CACHE_DIR=${QGEMM_CACHE_DIR:-/tmp/qgemm-cache}
build-gpu/qgemm info >> "$out/info.txt" 2>&1

if [ "${1:-}" != "--no-tests" ]; then
  # The bench and tune GPU tests (tests/gpu/test_bench_cli.cpp) and the cpu ones of the bench.
  # Three at a time: most of their time is NVRTC compiling kernels on the CPU (the disk cache
  # is safe to share), and they check results, not timings.
  ctest --test-dir build-gpu -R 'BenchCliGpu|TuneCliGpu|Bench|Tune|TunedConfig' -j3 \
    --output-on-failure -V > "$out/bench_tests.log" 2>&1
  echo "bench tests rc=$?"
  grep -E "tests passed|tests failed|\*\*\*Failed|\*\*\*Skipped|Failure" "$out/bench_tests.log" | head -20
fi

# The quickstart bake-off: JSON, CSV, plots; the table on stdout goes to quickstart.txt.
build-gpu/qgemm bench bench/recipes/quickstart.yaml --json "$out/quickstart.json" \
  --csv "$out/quickstart.csv" --plot "$out/quickstart.png" \
  > "$out/quickstart.txt" 2> "$out/quickstart.log"
echo "qgemm bench rc=$? (0 all ok, 1 a run failed, 3 no GPU or no plot)"
tail -3 "$out/quickstart.log"
cat "$out/quickstart.txt"
