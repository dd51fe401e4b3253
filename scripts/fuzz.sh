#!/usr/bin/env bash
# Fuzzes qgemm's parsers with libFuzzer (issue #19): configures and builds the fuzz build
# (clang, -fsanitize=fuzzer,address,undefined) into build-fuzz/ (or $QGEMM_FUZZ_BUILD_DIR), then
# runs each target for SECONDS, one after the other.
#
#   scripts/fuzz.sh SECONDS [TARGET...]     targets: scheme format recipe tuning_table jit_cache
#
# Seeds: tests/fuzz/<target>/ (read only); the growing corpus: <build>/fuzz-corpus/<target>/;
# logs: <build>/fuzz-logs/<target>.log. A target passes when its parser returns a valid object
# or throws qgemm::Error for every input; a crash, another exception, a failed check, a
# sanitizer report, a slow input (> 10 s) or running out of memory stops it, and the script
# prints the reproducer and exits 1 after the remaining targets have run.
set -euo pipefail
cd "$(dirname "$0")/.."

all_targets=(scheme format recipe tuning_table jit_cache)
if [ $# -lt 1 ] || ! [[ $1 =~ ^[0-9]+$ ]]; then
  echo "usage: scripts/fuzz.sh SECONDS [TARGET...]   (targets: ${all_targets[*]})" >&2
  exit 2
fi
seconds=$1
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
build_dir=${QGEMM_FUZZ_BUILD_DIR:-build-fuzz}

# Longest input per target: a little over the largest seed (a whole cache entry is ~9.4 KB).
max_len() {
  case $1 in
    format) echo 64 ;;
    scheme) echo 512 ;;
    tuning_table) echo 4096 ;;
    recipe) echo 8192 ;;
    jit_cache) echo 16384 ;;
    *) echo "scripts/fuzz.sh: unknown target '$1' (targets: ${all_targets[*]})" >&2; exit 2 ;;
  esac
}
for t in "${targets[@]}"; do max_len "$t" >/dev/null; done

# clang, and its runtimes (libFuzzer, the sanitizers): only recommended by clang's package.
missing=()
for p in clang libclang-rt-dev; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
cuda_args=()
[ -x /usr/local/cuda/bin/nvcc ] && cuda_args=(-DCUDAToolkit_ROOT=/usr/local/cuda)
if [ "${QGEMM_FUZZ_NO_BUILD:-0}" = 0 ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DQGEMM_FUZZ=ON \
    -DQGEMM_BUILD_TESTS=OFF -DQGEMM_PYTHON=OFF "${cuda_args[@]}" >/dev/null
  cmake --build "$build_dir" -j"$(nproc)" --target fuzz_all
fi

export QGEMM_LOG_LEVEL=0   # rejected cache entries log a warning each
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for t in "${targets[@]}"; do
  corpus="$build_dir/fuzz-corpus/$t"
  artifacts="$build_dir/fuzz-artifacts/$t"
  log="$build_dir/fuzz-logs/$t.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  status=0
  "$build_dir/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -max_len="$(max_len "$t")" \
    -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$artifacts/" \
    "$corpus" "tests/fuzz/$t" >"$log" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 || true)
  if [ "$status" = 0 ]; then
    echo "fuzz $t: ${seconds} s, ${execs:-?} execs, ${cov:-cov: ?}, corpus $(ls "$corpus" | wc -l), 0 crashes"
  else
    reproducer=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    echo "fuzz $t: FAILED (exit $status) after ${execs:-?} execs; log $log"
    grep -E 'FINDING|ERROR: |runtime error|SUMMARY' "$log" | head -5 | sed 's/^/  /' || true
    echo "  reproducer: ${reproducer:-(none written)}"
    [ -n "$reproducer" ] && echo "  re-run: $build_dir/tests/fuzz/fuzz_$t $reproducer"
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, 0 crashes"
