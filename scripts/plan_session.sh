#!/usr/bin/env bash
# One device-machine session for the plan/selector work (issue #14), in phases so that a
# session can split them over calls (the machine keeps build-gpu between warm calls):
#   scripts/plan_session.sh tests      build, every GPU test, the memcheck subset
#   scripts/plan_session.sh gate       quickstart + fallback bake-offs with --gate 1.10
#   scripts/plan_session.sh decode     the decode recipe with --gate 1.10
#   scripts/plan_session.sh tune       qgemm tune on the recipes, then the gates with the table
# Several phases may be given. Logs and JSON under $OUT; a short summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}; mkdir -p "$out"
export QGEMM_CACHE_DIR=${QGEMM_CACHE_DIR:-/tmp/qgemm-cache}
OUT="$out" scripts/gpu_build.sh > /dev/null || { tail -30 "$out/build.log"; exit 1; }
echo "built at ${SECONDS}s"
summary=()
gate() {  # recipe, ratio, [table]
  local name; name=$(basename "$1" .yaml)
  local tag=${3:+-tuned}
  QGEMM_TUNING_TABLE=${3:-} timeout 420 build-gpu/qgemm bench "$1" --gate "$2" \
    --json "$out/$name$tag.json" > "$out/$name$tag.txt" 2> "$out/$name$tag.log"
  local rc=$?
  summary+=("bench $name$tag gate $2: rc=$rc; $(grep -c 'gate.*: .* M=' "$out/$name$tag.log") over")
  grep "gate" "$out/$name$tag.log" | tail -12
}
for phase in "$@"; do
  case $phase in
    tests)
      timeout 400 ctest --test-dir build-gpu -L gpu -j4 --output-on-failure -V \
        > "$out/gpu_tests.log" 2>&1
      summary+=("gpu tests rc=$?: $(grep -E 'tests passed' "$out/gpu_tests.log")")
      grep -E "^\s*[0-9]+ - .*\(Failed|\*\*\*Failed|Failure|FAILED" "$out/gpu_tests.log" | head -20
      QGEMM_GPU_TEST_SUBSET=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 \
        build-gpu/tests/qgemm_tests_gpu \
        --gtest_filter='DenseGemmGpu.MatchesReferenceForEveryScheme:DenseGemmGpu.QuantizedActivationsMatchReference:PlanGpu.EveryPath*' \
        > "$out/memcheck.log" 2>&1
      summary+=("memcheck rc=$? $(grep 'ERROR SUMMARY' "$out/memcheck.log")")
      build-gpu/qgemm check --scheme w4a16 --m 7 --n 640 --k 2880 --backend gpu > "$out/check.txt" 2>&1
      summary+=("check w4a16 7x640x2880 gpu rc=$?");;
    gate)
      gate bench/recipes/quickstart.yaml 1.10
      gate bench/recipes/fallback.yaml 1.10;;
    decode) gate bench/recipes/decode.yaml 1.10;;
    tune)
      for r in fallback quickstart; do
        timeout 240 build-gpu/qgemm tune bench/recipes/$r.yaml --out "$out/h200.json" \
          --report "$out/tune_$r.json" > "$out/tune_$r.log" 2>&1
        summary+=("tune $r rc=$?")
      done
      gate bench/recipes/fallback.yaml 1.03 "$out/h200.json"
      gate bench/recipes/quickstart.yaml 1.03 "$out/h200.json";;
  esac
  echo "$phase done at ${SECONDS}s"
done
# At most 8 files come back: the logs and JSON go together into one archive.
(cd "$out" && tar czf logs.tgz --remove-files ./*.log ./*.json ./*.txt 2>/dev/null)
printf '%s\n' "${summary[@]}"
