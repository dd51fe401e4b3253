#!/usr/bin/env bash
# Builds bench/decode_probe.cu and runs it; the logs go to $OUT (or ./probe_out). See the header
# of bench/decode_probe.cu (variants are copies of the kernel, named in PROBE_VARIANTS with a
# -DQGEMM_PROBE_<NAME> the copy reads).
#   scripts/decode_probe.sh [--build-only]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-probe_out}; mkdir -p "$out" build-probe
variants=(${PROBE_VARIANTS:-full})
for v in "${variants[@]}"; do
  [ -x "build-probe/probe_$v" ] && [ "build-probe/probe_$v" -nt bench/decode_probe.cu ] \
    && [ "build-probe/probe_$v" -nt kernels/gemm/sm80_decode.cuh ] && continue
  flag=""; [ "$v" = full ] || flag="-DQGEMM_PROBE_${v//+/ -DQGEMM_PROBE_}"
  nvcc -O3 -arch=sm_90a -std=c++17 --expt-relaxed-constexpr -Ikernels $flag -DQGEMM_PROBE_NAME="\"$v\"" \
    -o "build-probe/probe_$v" bench/decode_probe.cu > "build-probe/build_$v.log" 2>&1 &
done
wait
[ "${1:-}" = --build-only ] && exit 0
for v in "${variants[@]}"; do
  "build-probe/probe_$v" 2>&1 | tee -a "$out/decode_probe.log" || cat "build-probe/build_$v.log"
done
# The production variant's SASS, for instruction counts per k16 block.
cuobjdump -sass build-probe/probe_full > "$out/decode_probe.sass" 2>&1
