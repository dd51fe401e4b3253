#!/usr/bin/env bash
# A short device session for decode-kernel work: build, the dense GPU tests (every decode config
# and scheme against the CPU reference), the decode probe, the quick dense bench. Logs in $OUT.
#   PROBE_VARIANTS=... scripts/decode_session.sh      (default probe variants: full NO_EPILOGUE)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}; mkdir -p "$out"
export PROBE_VARIANTS=${PROBE_VARIANTS:-full NO_EPILOGUE}
scripts/decode_probe.sh --build-only > /dev/null 2>&1 &  # compiles beside the build
probe=$!
OUT="$out" scripts/gpu_build.sh qgemm_tests_gpu qgemm_dense_bench || exit 1
echo "built at ${SECONDS}s"
wait $probe
scripts/decode_probe.sh  # times alone: a busy host delays launches between the timing events
export QGEMM_CACHE_DIR=/tmp/qgemm-cache
ctest --test-dir build-gpu -R 'DenseGemmGpu' -j4 --output-on-failure -V > "$out/gpu_tests.log" 2>&1
echo "dense gpu tests rc=$? at ${SECONDS}s, cases checked: $(grep -c 'rel=' "$out/gpu_tests.log")"
grep -E "FAILED|Failure" "$out/gpu_tests.log" | head -10
build-gpu/bench/qgemm_dense_bench --quick 2>&1 | tee "$out/bench.log" | cut -c1-100
