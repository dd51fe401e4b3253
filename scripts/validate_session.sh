#!/usr/bin/env bash
# The whole device session in one call, for when machines are scarce (~5 min): build, every GPU
# test with the memcheck subset and the CLI checks (gpu_session.sh --quick), the decode probe,
# a decode-kernel ncu summary and the quick dense bench. Logs in $OUT.
#   PROBE_VARIANTS=... scripts/validate_session.sh [--full-bench]
#   (--full-bench: every bench case instead of the three decode ones; ~5 min more)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}; mkdir -p "$out"
export PROBE_VARIANTS=${PROBE_VARIANTS:-full}
scripts/decode_probe.sh --build-only > /dev/null 2>&1 &  # compiles beside the build
probe=$!
OUT="$out" scripts/gpu_session.sh --quick 2>&1 | grep -v "^repack"
wait $probe
OUT="$out" scripts/decode_probe.sh 2>&1 | grep -v "splits [18] "
export QGEMM_CACHE_DIR=/tmp/qgemm-cache
ncu --clock-control none --kernel-name regex:dense_ --launch-count 1 --section SpeedOfLight \
  --section WarpStateStats --section SchedulerStats build-gpu/bench/qgemm_dense_bench --quick \
  > "$out/ncu.txt" 2>&1
grep -E "Duration|DRAM Throughput|Issued Warp|No Eligible|Warp Cycles Per Issued" "$out/ncu.txt"
bench=(--quick); [ "${1:-}" = --full-bench ] && bench=()
build-gpu/bench/qgemm_dense_bench "${bench[@]}" > "$out/bench.log" 2>&1
cut -c1-110 "$out/bench.log"
