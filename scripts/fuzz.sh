#!/usr/bin/env bash
# Fuzzes qgemm's parsers with libFuzzer (issue #19): configures and builds the fuzz build
# (clang, -fsanitize=fuzzer,address,undefined) into build-fuzz/ (or $QGEMM_FUZZ_BUILD_DIR), then
# runs each target for SECONDS, one after the other.
#
#   scripts/fuzz.sh SECONDS [TARGET...]     targets: scheme format recipe tuning_table jit_cache
#                                                    safetensors_header quantization_config
#
# safetensors_header and quantization_config fuzz the Python checkpoint importers
# (python/qgemm/checkpoint.py, tensors.py) with atheris, libFuzzer for Python:
# tests/fuzz/python/fuzz_<target>.py, run by the package's build (build/, or $QGEMM_BUILD_DIR:
# scripts/setup.sh makes it, atheris included) with PYTHONPATH=<build>/python; their seeds are
# tests/fuzz/python/<target>/, their dictionaries tests/fuzz/python/<target>.dict. The C++
# build is made only when a C++ target is named.
#
# Seeds: tests/fuzz/<target>/ (read only); the growing corpus: <build>/fuzz-corpus/<target>/;
# logs: <build>/fuzz-logs/<target>.log. A target passes when its parser returns a valid object
# or throws qgemm::Error (raises qgemm.Error) for every input; a crash, another exception, a
# failed check, a sanitizer report, a slow input (> 10 s) or running out of memory stops it, and
# the script prints the reproducer and exits 1 after the remaining targets have run.
set -euo pipefail
cd "$(dirname "$0")/.."

cpp_all=(scheme format recipe tuning_table jit_cache)
python_all=(safetensors_header quantization_config)
all_targets=("${cpp_all[@]}" "${python_all[@]}")
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
    quantization_config) echo 4096 ;;
    safetensors_header) echo 8192 ;;
    *) echo "scripts/fuzz.sh: unknown target '$1' (targets: ${all_targets[*]})" >&2; exit 2 ;;
  esac
}
for t in "${targets[@]}"; do max_len "$t" >/dev/null; done
is_python() { [[ " ${python_all[*]} " == *" $1 "* ]]; }
want_cpp=0; want_python=0
for t in "${targets[@]}"; do
  if is_python "$t"; then want_python=1; else want_cpp=1; fi
done

if [ "$want_cpp" = 1 ]; then
  # clang, and its runtimes (libFuzzer, the sanitizers): only recommended by clang's package.
  missing=()
  for p in clang libclang-rt-dev; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}"
  fi
  cuda_args=()
  [ -x /usr/local/cuda/bin/nvcc ] && cuda_args=(-DCUDAToolkit_ROOT=/usr/local/cuda)
  if [ "${QGEMM_FUZZ_NO_BUILD:-0}" = 0 ]; then
    cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DQGEMM_FUZZ=ON \
      -DQGEMM_BUILD_TESTS=OFF -DQGEMM_PYTHON=OFF "${cuda_args[@]}" >/dev/null
    cmake --build "$build_dir" -j"$(nproc)" --target fuzz_all
  fi
fi

# The Python targets: the package's build tree (its qgemm._core and a copy of python/qgemm,
# brought up to date here) and its virtual environment, with atheris. Where either is missing,
# those targets fail with the reason.
python_build=${QGEMM_BUILD_DIR:-build}
python="$python_build/python-env/bin/python"
python_problem=""
if [ "$want_python" = 1 ]; then
  if [ ! -x "$python" ] || [ ! -f "$python_build/build.ninja" ]; then
    python_problem="no package build in $python_build/ (run scripts/setup.sh)"
  else
    if [ "${QGEMM_FUZZ_NO_BUILD:-0}" = 0 ]; then
      cmake --build "$python_build" -j"$(nproc)" --target _core >/dev/null ||
        python_problem="building qgemm._core in $python_build/ failed"
    fi
    if [ -z "$python_problem" ] &&
       ! PYTHONPATH="$python_build/python" "$python" -c "import qgemm" 2>/dev/null; then
      python_problem="$python_build/python has no importable qgemm (run scripts/setup.sh)"
    elif [ -z "$python_problem" ] && ! "$python" -c "import atheris" 2>/dev/null; then
      python_problem="atheris is not installed in $python_build/python-env (scripts/setup.sh \
installs it; or: $python -m pip install atheris)"
    fi
  fi
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
  if is_python "$t"; then
    if [ -n "$python_problem" ]; then
      echo "fuzz $t: FAILED: $python_problem"
      failed+=("$t")
      continue
    fi
    runner=(env PYTHONPATH="$python_build/python" PYTHONDONTWRITEBYTECODE=1 "$python"
            "tests/fuzz/python/fuzz_$t.py")
    extra=(-dict="tests/fuzz/python/$t.dict")
    seeds="tests/fuzz/python/$t"
    # The files each input becomes (a .safetensors file, config.json): on tmpfs where there is one.
    shm=/dev/shm; [ -d "$shm" ] && [ -w "$shm" ] || shm=${TMPDIR:-/tmp}
    export QGEMM_FUZZ_SCRATCH; QGEMM_FUZZ_SCRATCH=$(mktemp -d "$shm/qgemm-fuzz-$t.XXXXXX")
  else
    runner=("$build_dir/tests/fuzz/fuzz_$t")
    extra=()
    seeds="tests/fuzz/$t"
  fi
  status=0
  "${runner[@]}" -max_total_time="$seconds" -max_len="$(max_len "$t")" \
    -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$artifacts/" \
    "${extra[@]}" "$corpus" "$seeds" >"$log" 2>&1 || status=$?
  if is_python "$t"; then rm -rf "$QGEMM_FUZZ_SCRATCH"; unset QGEMM_FUZZ_SCRATCH; fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 || true)
  if [ "$status" = 0 ]; then
    echo "fuzz $t: ${seconds} s, ${execs:-?} execs, ${cov:-cov: ?}, corpus $(ls "$corpus" | wc -l), 0 crashes"
  else
    reproducer=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    echo "fuzz $t: FAILED (exit $status) after ${execs:-?} execs; log $log"
    grep -E 'FINDING|ERROR: |runtime error|SUMMARY' "$log" | head -5 | sed 's/^/  /' || true
    echo "  reproducer: ${reproducer:-(none written)}"
    [ -n "$reproducer" ] && echo "  re-run: ${runner[*]} $reproducer"
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, 0 crashes"
