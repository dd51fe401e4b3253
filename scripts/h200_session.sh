#!/usr/bin/env bash
# A whole-library check on the device machine, in two calls that fit its 10-minute limit:
#   scripts/h200_session.sh tests   build, every GPU test (sampled matrices), then `python`
#   scripts/h200_session.sh python  the Python suite (pytest) on the GPU
#   scripts/h200_session.sh bench   sanitizers over the wgmma family, the hopper/decode/fallback
#                                   gates, Humming on the issue #15 rows
#   scripts/h200_session.sh profile SCHEME:M:N:K CONFIG...   the forced configs' times on one case,
#                                   then ncu of each CONFIG (a wgmma/decode candidate name)
#   scripts/h200_session.sh moe     the MoE GPU tests, then qgemm_moe_bench (issue #17's rows)
#   scripts/h200_session.sh sweep [N]   qgemm sweep --n N (default 1000) on the GPU (issue #19),
#                                   12 cases at once
#   scripts/h200_session.sh sanitize    memcheck, racecheck, synccheck over one test of every
#                                   kernel family (sampled matrices; issue #19)
#   scripts/h200_session.sh moe-decode   the grouped decode kernel: its GPU tests, memcheck
#                                   over them, its bench (experts in the mma layout, then Qwen3
#                                   in the wgmma order) and the wgmma baseline on the same card
#   scripts/h200_session.sh quantize  the GPU weight quantizer (issue #18): its GPU tests,
#                                   memcheck over them, its pytest cases, qgemm_quantize_bench
#   scripts/h200_session.sh actquant  the activation quantizer: its GPU tests, then the
#                                   quantized-activation rows timed from bf16 and from codes
#   scripts/h200_session.sh focus FILTER [K]  the GPU tests FILTER, the pytest cases -k K, then
#                                   the activation quantizer's bench: a session's own changes
#   scripts/h200_session.sh grouped  rows grouped by the caller (moe_gemm_grouped: the in-place
#                                   table, both paths) and the MoE
#                                   recipe cases: their GPU tests, the quickstart bench test, the
#                                   grouped pytest cases, then qgemm bench bench/recipes/moe.yaml
#   scripts/h200_session.sh eight-bit  the FP8 / INT8 wgmma tiles: their GPU test, memcheck over
#                                   it, qgemm_dense_bench --fp8 (every config forced)
#   scripts/h200_session.sh vllm-check  python/qgemm_vllm/gpu_check.py (issue #21)
#   scripts/h200_session.sh moe8    the gate_up GEMM on the grouped 8-bit tiles (issue #17): its
#                                   GPU test, memcheck over it, then DeepSeek-V3's fp8-block
#                                   layer with an 8-bit tile forced (wgmma-fp8-8 at M = 256, -128 at
#                                   4096) and as the selector chooses
#   scripts/h200_session.sh glu-ab [CASE...]  the MoE layer with the GLU fused and as its own
#                                   pass (QGEMM_FUSED_GLU=1 / 0), alternating, 3 rounds
#                                   (qgemm_moe_bench --case LAYER:SCHEME:M; default: issue #17's)
#   scripts/h200_session.sh moe-candidates CASE CONFIG...  the MoE layer of CASE (qgemm_moe_bench
#                                   --case LAYER:SCHEME:M) with each grouped config forced ("auto":
#                                   the selector's), alternating, 3 rounds
#   scripts/h200_session.sh e2e MODEL VARIANTS [ARG...]  scripts/e2e_bench.py (issue #18): one
#                                   model, the variants given (comma-separated), in one call
#   scripts/h200_session.sh multi   scripts/multi_gpu.py (issue #20) on this machine's GPUs:
#                                   world 1, then 2 processes (through gloo on one GPU)
# Logs go to $OUT (or ./gpu_out); the short table comes last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}; mkdir -p "$out"
export QGEMM_CACHE_DIR=/tmp/qgemm-cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$out/info.txt"
# Incremental: a warm machine keeps build-gpu from the last call, the sources may have changed.
OUT="$out" scripts/gpu_build.sh || exit 1
echo "built at ${SECONDS}s"
# The GPU tests TESTS (log $out/NAME_tests.log), then compute-sanitizer memcheck over MEMCHECK
# (NAME_memcheck.log), each within its timeout: a mode's own kernels checked before its bench.
#   tests_and_memcheck NAME TESTS TESTS_TIMEOUT MEMCHECK MEMCHECK_TIMEOUT
tests_and_memcheck() {
  local tests=build-gpu/tests/qgemm_tests_gpu
  timeout "$3" $tests --gtest_filter="$2" > "$out/$1_tests.log" 2>&1
  echo "$1 tests rc=$? at ${SECONDS}s"
  grep -E "^\[  (PASSED|FAILED|  OK|SKIPPED) |Failure|of its bound|seed|runs checked" \
    "$out/$1_tests.log" | head -40
  timeout "$5" compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 $tests \
    --gtest_filter="$4" > "$out/$1_memcheck.log" 2>&1
  echo "$1 memcheck rc=$? at ${SECONDS}s: $(grep 'ERROR SUMMARY' "$out/$1_memcheck.log")"
}
# The quantized-activation rows of fallback.yaml timed from bf16 and from codes: qgemm (bf16
# in) − qgemm-codes is the activation quantizer's time.
actquant_bench() {
  cat > "$out/actquant.yaml" <<'YAML'
name: actquant
timing: cold-l2
repeats: 30
warmup: 5
backends: [qgemm, qgemm-codes, cublaslt-fp8-exact]
cases:
  - {scheme: fp8-block, n: 7168, k: 18432, m: [1, 256, 4096]}
  - {scheme: w4a8-fp8, n: 8192, k: 8192, m: [256, 4096]}
  - {scheme: mxfp8-mxfp4, n: 14336, k: 4096, m: [4096]}
YAML
  timeout 150 build-gpu/qgemm bench "$out/actquant.yaml" > "$out/actquant.txt" 2>&1
  echo "activation quantizer bench rc=$? at ${SECONDS}s"; cat "$out/actquant.txt"
}
case "${1:-tests}" in
tests)
  # Sampled matrices keep the whole GPU suite within the call (most of its time is NVRTC).
  QGEMM_GPU_TEST_SUBSET=1 timeout 330 ctest --test-dir build-gpu -L gpu -j4 --output-on-failure \
    > "$out/gpu_tests.log" 2>&1
  echo "gpu tests rc=$? at ${SECONDS}s"
  grep -E "tests passed|Failed|\*\*\*Skipped|Timeout" "$out/gpu_tests.log" | head -20
  ;&  # then the Python suite
python)
  PYTHONPATH=build-gpu/python timeout 240 python3 -m pytest -q -rs --durations=8 python/tests \
    > "$out/pytest.log" 2>&1
  echo "pytest rc=$? at ${SECONDS}s"; tail -8 "$out/pytest.log"
  ;;
bench)
  tests=build-gpu/tests/qgemm_tests_gpu
  for tool in memcheck racecheck synccheck; do
    QGEMM_GPU_TEST_SUBSET=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
      --print-limit 20 $tests --gtest_filter='WgmmaGemmGpu.*' > "$out/$tool.log" 2>&1
    echo "$tool rc=$? at ${SECONDS}s: $(grep 'ERROR SUMMARY' "$out/$tool.log")"
  done
  for recipe in hopper decode fallback; do
    timeout 200 build-gpu/qgemm bench bench/recipes/$recipe.yaml --gate 1.10 \
      --json "$out/$recipe.json" > "$out/$recipe.txt" 2> "$out/$recipe.log"
    echo "gate $recipe rc=$? at ${SECONDS}s"; tail -3 "$out/$recipe.log"
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > /dev/null 2>&1
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 200 python3 bench/humming_bench.py \
    --rows issue15 --json "$out/humming15.json" > "$out/humming15.txt" 2>&1
  echo "humming rc=$? at ${SECONDS}s"
  cat "$out/hopper.txt"; tail -25 "$out/humming15.txt"
  ;;
moe)
  QGEMM_GPU_TEST_SUBSET=1 timeout 300 build-gpu/tests/qgemm_tests_gpu \
    --gtest_filter='MoeLayerGpu.*:MoeRoutingGpu.*' > "$out/moe_tests.log" 2>&1
  echo "moe tests rc=$? at ${SECONDS}s"
  grep -E "^\[  (PASSED|FAILED|  OK|SKIPPED) |Failure|rel .* of its bound|seed" "$out/moe_tests.log" | head -40
  timeout 240 build-gpu/bench/qgemm_moe_bench "${@:2}" > "$out/moe_bench.txt" 2>&1
  echo "moe bench rc=$? at ${SECONDS}s"; cat "$out/moe_bench.txt"
  ;;
sanitize)
  tests=build-gpu/tests/qgemm_tests_gpu
  families='DenseGemmGpu.MatchesReferenceForEveryScheme:DenseGemmGpu.EveryDecodeConfig*'
  families+=':WgmmaGemmGpu.EveryConfigMatchesReferenceForEveryScheme:WgmmaGemmGpu.EightBitConfigs*'
  families+=':MoeLayerGpu.EveryRoutingShape*:MoeLayerGpu.GroupedRows*:MoeRoutingGpu.*'
  families+=':JitKernelsGpu.*:MmaDequantizeGpu.*'
  families+=':MmaRepackGpu.*:CublasLtFp8Gpu.MatchesTheReference'
  for tool in memcheck synccheck; do
    QGEMM_GPU_TEST_SUBSET=1 timeout 180 compute-sanitizer --tool $tool --error-exitcode 9 \
      --print-limit 20 $tests --gtest_filter="$families" > "$out/$tool.log" 2>&1
    echo "$tool rc=$? at ${SECONDS}s: $(grep 'ERROR SUMMARY' "$out/$tool.log")"
  done
  # racecheck is the slowest tool: the MoE families first, then the rest; cuBLASLt's own kernels
  # (nvjet) report hazards racecheck cannot model (their mbarrier pipelines), so the cuBLASLt test
  # and the bandwidth-timing tests are left out.
  for part in 'MoeLayerGpu.EveryRoutingShape*:MoeLayerGpu.GroupedRows*:MoeRoutingGpu.*' \
      'DenseGemmGpu.MatchesReferenceForEveryScheme:DenseGemmGpu.EveryDecodeConfig*:WgmmaGemmGpu.EveryConfigMatchesReferenceForEveryScheme:WgmmaGemmGpu.EightBitConfigs*:JitKernelsGpu.*:MmaDequantizeGpu.EveryElement*'; do
    QGEMM_GPU_TEST_SUBSET=1 timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 \
      --print-limit 20 $tests --gtest_filter="$part" >> "$out/racecheck.log" 2>&1
    echo "racecheck ${part%%:*}... rc=$? at ${SECONDS}s: $(grep 'RACECHECK SUMMARY' "$out/racecheck.log" | tail -1)"
  done
  ;;
sweep)
  # 12 cases at once: a case's time is mostly the host's (NVRTC, the CPU reference in double),
  # and the machine has 16 cores.
  timeout 560 build-gpu/qgemm sweep --n "${2:-1000}" --jobs 12 --moe --backend gpu \
    > "$out/sweep.txt" 2>&1
  echo "sweep rc=$? at ${SECONDS}s"
  grep -E "wrong|crash|hang|qgemm check" "$out/sweep.txt" | head -30; tail -1 "$out/sweep.txt"
  ;;
moe-decode)
  tests_and_memcheck decode 'MoeLayerGpu.GroupedDecode*' 200 \
    'MoeLayerGpu.GroupedDecodeGemmAlone*' 100
  timeout 150 build-gpu/bench/qgemm_moe_bench --decode > "$out/moe_decode_bench.txt" 2>&1
  echo "decode bench rc=$? at ${SECONDS}s"; cat "$out/moe_decode_bench.txt"
  # The same kernel reading the experts in the wgmma order (SM90's auto layout).
  for m in 1 4 16 64; do
    timeout 40 build-gpu/bench/qgemm_moe_bench --decode --layout wgmma \
      --case qwen3-30b-a3b:w4a16:$m 2>&1 | tail -1
  done
  for m in 1 4 16 64; do
    timeout 40 build-gpu/bench/qgemm_moe_bench --case qwen3-30b-a3b:w4a16:$m 2>&1 | tail -1
  done
  ;;
quantize)
  # Most telling first: a run cut short by its limit still prints what it reached.
  tests=build-gpu/tests/qgemm_tests_gpu
  timeout 150 $tests --gtest_filter='QuantizeWeightGpu.*' > "$out/quantize_tests.log" 2>&1
  echo "quantize tests rc=$? at ${SECONDS}s"
  grep -E "^\[  (PASSED|FAILED|  OK|SKIPPED) |Failure|differ|seed" "$out/quantize_tests.log" | head -40
  timeout 120 build-gpu/bench/qgemm_quantize_bench "${@:2}" > "$out/quantize_bench.txt" 2>&1
  echo "quantize bench rc=$? at ${SECONDS}s"; cat "$out/quantize_bench.txt"
  PYTHONPATH=build-gpu/python timeout 150 python3 -m pytest -q -rs python/tests/test_ops_cuda.py \
    python/tests/test_engine.py -k "quantizer or quant_linear or sm90" > "$out/pytest.log" 2>&1
  echo "pytest rc=$? at ${SECONDS}s"; tail -4 "$out/pytest.log"
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 $tests \
    --gtest_filter='QuantizeWeightGpu.Grids*:QuantizeWeightGpu.BadInput*' \
    > "$out/quantize_memcheck.log" 2>&1
  echo "memcheck rc=$? at ${SECONDS}s: $(grep 'ERROR SUMMARY' "$out/quantize_memcheck.log")"
  PYTHONPATH=build-gpu/python timeout 90 python3 bench/quantize_python.py \
    > "$out/quantize_python.txt" 2>&1
  echo "python quantize rc=$? at ${SECONDS}s"; cat "$out/quantize_python.txt"
  # Where prepare's time goes: each kernel's mean duration under ncu (quick shape, one scheme).
  for scheme in nvfp4 w4a16; do
    timeout 100 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      build-gpu/bench/qgemm_quantize_bench --quick --scheme $scheme \
      > "$out/ncu_quantize_$scheme.csv" 2> "$out/ncu_quantize_$scheme.log"
    echo "ncu $scheme rc=$? at ${SECONDS}s"
    python3 - "$out/ncu_quantize_$scheme.csv" <<'PY'
import csv, collections, re, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14 and r[12] == "gpu__time_duration.sum"]
times = collections.defaultdict(list)
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3}
for r in rows:  # the kernel's name, its step / order parameters and its grid
    params = re.search(r"<([^>]*)>", r[4])
    name = re.sub(r"<.*", "", r[4]).replace("void ", "")
    name += " <" + ",".join(params.group(1).split(", ")[2:5]) + "> grid " + r[8] if params else ""
    times[name].append(float(r[14].replace(",", "")) * scale.get(r[13], float("nan")))
for name, t in sorted(times.items(), key=lambda kv: -sum(kv[1])):
    print(f"  {name:<64} x{len(t):<3} mean {sum(t) / len(t):9.1f} us")
PY
  done
  ;;
actquant)
  # Its tests (codes and scales bit for bit against the host), then actquant_bench.
  filter='JitKernelsGpu.Quantize*:CublasLtFp8Gpu.*:DenseGemmGpu.QuantizedActivations*'
  filter+=':BadInputGpu.OddStrided*'
  timeout 150 build-gpu/tests/qgemm_tests_gpu --gtest_filter="$filter" \
    > "$out/actquant_tests.log" 2>&1
  echo "activation quantizer tests rc=$? at ${SECONDS}s"
  grep -E "^\[  (PASSED|FAILED) |Failure" "$out/actquant_tests.log" | head -20
  actquant_bench
  ;;
focus)
  # A session's own changes in one call: the GPU tests FILTER (sampled matrices), the pytest
  # cases matching K, then actquant_bench.
  QGEMM_GPU_TEST_SUBSET=1 timeout 240 build-gpu/tests/qgemm_tests_gpu --gtest_filter="$2" \
    > "$out/focus_tests.log" 2>&1
  echo "tests rc=$? at ${SECONDS}s"
  grep -E "^\[  (PASSED|FAILED) |Failure|of its bound|seed" "$out/focus_tests.log" | head -40
  if [ -n "${3:-}" ]; then
    PYTHONPATH=build-gpu/python timeout 150 python3 -m pytest -q -rs python/tests -k "$3" \
      > "$out/focus_pytest.log" 2>&1
    echo "pytest rc=$? at ${SECONDS}s"; tail -6 "$out/focus_pytest.log"
  fi
  actquant_bench
  ;;
grouped)
  filter='MoeRoutingGpu.RowBlockTable*:MoeLayerGpu.GroupedRows*'
  filter+=':MoeLayerGpu.QuantizedActivationSchemes'
  filter+=':MoeLayerGpu.SchemesActivationsBiasesAndTypes:BenchCliGpu.Quickstart*'
  QGEMM_GPU_TEST_SUBSET=1 timeout 240 build-gpu/tests/qgemm_tests_gpu --gtest_filter="$filter" \
    > "$out/grouped_tests.log" 2>&1
  echo "tests rc=$? at ${SECONDS}s"
  grep -E "^\[  (PASSED|FAILED) |Failure|of its bound|seed|expected|got " "$out/grouped_tests.log" | head -40
  PYTHONPATH=build-gpu/python timeout 120 python3 -m pytest -q -rs python/tests/test_grouped_gemm.py \
    > "$out/grouped_pytest.log" 2>&1
  echo "pytest rc=$? at ${SECONDS}s"; tail -8 "$out/grouped_pytest.log"
  # What is left of the call (600 s, or DEADLINE when less device time is left), the build and
  # the tests having come first.
  left=$((${DEADLINE:-560} - SECONDS)); [ $left -gt 30 ] || left=30
  # 10 repeats (the recipe's 20 may not fit): each run's line is in moe.log as it ends.
  sed -e 's/^repeats: .*/repeats: 10/' bench/recipes/moe.yaml > "$out/moe.yaml"
  timeout $left build-gpu/qgemm bench "$out/moe.yaml" --gate 1.10 --json "$out/moe.json" \
    > "$out/moe.txt" 2> "$out/moe.log"
  echo "moe recipe rc=$? at ${SECONDS}s"
  grep -E '^\[' "$out/moe.log" | sed -E 's/^\[ *[0-9]+\/[0-9]+ [0-9:]+\] //; s/ +\(error [^)]*\)//'
  tail -25 "$out/moe.txt"
  # The in-place rows against the gather path they replace, on Qwen3's gate_up (w4a16), if the
  # call has time left.
  left=$((${DEADLINE:-560} - SECONDS))
  if [ $left -gt 40 ]; then
    sed -n '1,/^cases:/p' "$out/moe.yaml" | sed -e 's/^backends: .*/backends: [qgemm]/' \
      > "$out/moe_gather.yaml"
    echo '  - {label: qwen3 gate_up w4a16, scheme: w4a16, kind: moe, experts: 128, top_k: 8, n: 1536, k: 2048, m: [16, 256, 4096]}' \
      >> "$out/moe_gather.yaml"
    for in_place in 1 0; do
      QGEMM_GROUPED_IN_PLACE=$in_place timeout $((left / 2)) build-gpu/qgemm bench \
        "$out/moe_gather.yaml" > "$out/moe_in_place_$in_place.txt" 2>&1
      echo "QGEMM_GROUPED_IN_PLACE=$in_place rc=$?"; tail -5 "$out/moe_in_place_$in_place.txt"
    done
  fi
  ;;
eight-bit)
  # The FP8 and INT8 wgmma tiles (#16): their GPU test (sampled), memcheck over it, then every
  # config forced on the issue's rows (qgemm_dense_bench --fp8: FP8 and INT8 rows).
  QGEMM_GPU_TEST_SUBSET=1 tests_and_memcheck eight_bit \
    'WgmmaGemmGpu.EightBitConfigs*:WgmmaGemmGpu.Fp8ConfigsRefuse*' 200 \
    'WgmmaGemmGpu.EightBitConfigs*' 150
  left=$((${DEADLINE:-560} - SECONDS)); [ $left -gt 30 ] || left=30
  timeout $left build-gpu/bench/qgemm_dense_bench --fp8 > "$out/eight_bit_bench.txt" 2>&1
  echo "bench rc=$? at ${SECONDS}s"; cat "$out/eight_bit_bench.txt"
  ;;
multi)
  gpus=$(nvidia-smi --list-gpus | wc -l)
  # World 2 on one GPU shares it through gloo (NCCL takes a GPU per rank).
  for world in 1 2; do
    PYTHONPATH=build-gpu/python timeout 280 python3 -m torch.distributed.run \
      --nproc-per-node $world scripts/multi_gpu.py --json "$out/multi_$world.json" \
      > "$out/multi_$world.txt" 2>&1
    echo "multi_gpu world $world on $gpus GPU(s) rc=$? at ${SECONDS}s"
    grep -E "^\||multi_gpu:|Error" "$out/multi_$world.txt" | head -8
  done
  ;;
moe8)
  tests_and_memcheck moe8 'MoeLayerGpu.EightBitGateUp*' 200 'MoeLayerGpu.EightBitGateUp*' 120
  # The tile each M's rows an expert fill (256 experts, top 8: 8 rows at M = 256, 128 at 4096);
  # a 4096-token layer takes ~75 s on an H100 with its JIT compiles.
  for run in 256:wgmma-fp8-8 256: 4096:wgmma-fp8-128 4096:; do
    m=${run%%:*} candidate=${run#*:}
    timeout 150 build-gpu/bench/qgemm_moe_bench --case deepseek-v3:fp8-block:$m \
      ${candidate:+--candidate $candidate} 2>&1 | tail -1 | sed "s/^/[${candidate:-auto}] /"
  done | tee "$out/moe8_bench.txt"
  ;;
glu-ab)
  cases=("${@:2}")
  [ ${#cases[@]} -gt 0 ] || cases=(qwen3-30b-a3b:w4a16:16 qwen3-30b-a3b:w4a16:4096
                                    gpt-oss-120b:mxfp4-a16:16 gpt-oss-120b:mxfp4-a16:256)
  for round in 1 2 3; do
    for c in "${cases[@]}"; do
      for fused in 1 0; do
        QGEMM_FUSED_GLU=$fused timeout 60 build-gpu/bench/qgemm_moe_bench --case "$c" 2>&1 \
          | tail -1 | cut -c1-62 | sed "s/^/round $round fused=$fused /"
      done
    done
  done | tee "$out/glu_ab.txt"
  ;;
moe-candidates)
  for round in 1 2 3; do
    for config in "${@:3}"; do
      candidate=$config; [ "$config" = auto ] && candidate=
      timeout 90 build-gpu/bench/qgemm_moe_bench --case "$2" ${candidate:+--candidate $candidate} \
        2>&1 | tail -1 | cut -c1-62 | sed "s/^/round $round $config /"
    done
  done | tee "$out/moe_candidates.txt"
  ;;
vllm-check)
  # The vLLM plugin's layers on the GPU without vLLM (issue #21 item 7).
  PYTHONPATH=build-gpu/python:python/qgemm_vllm timeout 300 python3 \
    python/qgemm_vllm/gpu_check.py > "$out/vllm_check.txt" 2>&1
  echo "vllm gpu_check rc=$? at ${SECONDS}s"; grep -vE "^ok " "$out/vllm_check.txt" | tail -20
  echo "$(grep -c '^ok ' "$out/vllm_check.txt") checks ok"
  ;;
e2e)
  # One run of scripts/e2e_bench.py (issue #18) in what is left of the call: MODEL VARIANTS and
  # any further arguments (e.g. --layers 16, --no-jit); its table last. The JSON travels in the
  # call's archive; runs of several calls merge with --from-json.
  left=$((${DEADLINE:-570} - SECONDS)); [ $left -gt 60 ] || left=60
  PYTHONPATH=build-gpu/python timeout $left python3 scripts/e2e_bench.py --model "$2" \
    --variants "$3" "${@:4}" --json "$out/e2e_$2_${3//,/_}.json" > "$out/e2e.txt" 2>&1
  echo "e2e rc=$? at ${SECONDS}s"
  grep -vE '^  [a-z0-9-]+: (prefill|decode|logits|kernel|JIT|memory|quantize)' "$out/e2e.txt" \
    | tail -40
  ;;
profile)
  case_=$2; shift 2
  bench=build-gpu/bench/qgemm_dense_bench
  # BENCH_MODE: the bench's mode that lists the configs (--wgmma; --fp8 for the 8-bit tiles).
  timeout 120 $bench ${BENCH_MODE:---wgmma} --case "$case_" > "$out/profile_times.txt" 2>&1
  echo "times rc=$?"; cat "$out/profile_times.txt"
  for config in "$@"; do
    timeout 120 ncu --clock-control none --kernel-name regex:'wgmma|dense_' --launch-skip 1 \
      --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
      --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
      $bench ${BENCH_MODE:---wgmma} --case "$case_" --config "$config" > "$out/ncu_$config.txt" 2>&1
    echo "== ncu $config rc=$?"
    grep -iE "spends|stalled|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issued Warp|No Eligible|Warp Cycles Per Issued|Stall|L2 Hit|Compute \(SM\)|Shared|Bank|Pipe|Tensor" \
      "$out/ncu_$config.txt" | head -45
  done
  ;;
esac
# At most 8 files come back from the device machine: every log of this mode travels in one
# archive (modes chained in one call each leave their own).
# An e2e run's archive is named by its model and variants, so that runs chained in one call
# keep theirs.
archive="logs_${1:-tests}.tgz"
[ "${1:-}" = e2e ] && archive="logs_e2e_${2}_${3//,/_}.tgz"
(cd "$out" && tar czf "$archive" --exclude='logs_*.tgz' -- * \
  && find . -maxdepth 1 -type f ! -name 'logs_*.tgz' -delete)
