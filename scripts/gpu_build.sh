#!/usr/bin/env bash
# Configures and builds build-gpu (Release, Ninja) on the device machine: every target, or only
# the named ones. The log goes to $OUT/build.log (or ./gpu_out); errors are printed.
#   scripts/gpu_build.sh [target ...]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}; mkdir -p "$out"
extra=()
# xxhash.h travels in .deps/include (copied from Debian's libxxhash-dev) where the image lacks it.
[ -f /usr/include/xxhash.h ] || extra+=(-DXXHASH_INCLUDE_DIR=$PWD/.deps/include)
# More configure arguments, e.g. QGEMM_CMAKE_ARGS=-DQGEMM_PYTHON=OFF.
read -r -a more <<< "${QGEMM_CMAKE_ARGS:-}"
extra+=("${more[@]}")
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release "${extra[@]}" > "$out/build.log" 2>&1 \
  || { tail -30 "$out/build.log"; exit 1; }
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build-gpu -j16 "${targets[@]}" >> "$out/build.log" 2>&1 \
  || { grep -E "error" "$out/build.log" | head -30; exit 1; }
