#!/usr/bin/env bash
# Where the mma.sync decode kernel's warps wait (the first step the fifth session's notes ask
# for): ncu on the probe's production config (w4a16 g128 M = 1, 28672×8192, k128 s3, 2 splits),
# stall reasons per active warp, scheduler and memory sections. Logs in $OUT (or ./probe_out).
#   scripts/decode_stalls.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-probe_out}; mkdir -p "$out"
PROBE_VARIANTS=full scripts/decode_probe.sh --build-only
# The probe launches the k128 s3 config first: split 1, then 2 (16 timed launches each).
ncu --clock-control none --kernel-name regex:dense_decode_sm80 --launch-skip 20 --launch-count 1 \
  --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis \
  --metrics regex:smsp__warp_issue_stalled_.*_per_warp_active.pct \
  build-probe/probe_full > "$out/decode_stalls.txt" 2>&1
grep -E "Duration|DRAM Throughput|Issued Warp|Warp Cycles Per Issued|stalled_.*pct" \
  "$out/decode_stalls.txt"
