#!/usr/bin/env bash
# The whole device session in one call, for when machines are scarce: the decode session (probe,
# dense GPU tests, quick bench), then every GPU test with the memcheck subset and the CLI checks
# (gpu_session.sh --quick), a decode-kernel ncu summary and the full dense bench. Logs in $OUT.
#   PROBE_VARIANTS=... scripts/validate_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}; mkdir -p "$out"
scripts/decode_session.sh 2>&1 | grep -v "splits [18] "
ncu --clock-control none --kernel-name regex:dense_ --launch-count 1 --section SpeedOfLight \
  --section WarpStateStats --section SchedulerStats build-gpu/bench/qgemm_dense_bench --quick \
  > "$out/ncu.txt" 2>&1
grep -E "Duration|DRAM Throughput|Issued Warp|No Eligible|Warp Cycles Per Issued" "$out/ncu.txt"
OUT="$out" scripts/gpu_session.sh --quick 2>&1 | grep -v "^repack"
build-gpu/bench/qgemm_dense_bench > "$out/bench_full.log" 2>&1
cut -c1-110 "$out/bench_full.log"
