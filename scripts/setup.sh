#!/usr/bin/env bash
# Installs what qgemm needs on a fresh Debian/Ubuntu machine (apt), then configures and builds it
# into ./build (or $QGEMM_BUILD_DIR). Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${QGEMM_BUILD_DIR:-build}

packages=(cmake ninja-build g++ pkg-config libfmt-dev nlohmann-json3-dev libyaml-cpp-dev
          libcli11-dev libxxhash-dev libgtest-dev python3 python3-matplotlib)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The CUDA toolkit (NVRTC, headers, cuBLAS): the one under /usr/local/cuda when present, else
# Debian's (non-free) package. No GPU or driver is needed to build or to run the CPU paths.
if [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDAToolkit_ROOT=/usr/local/cuda
elif ! command -v nvcc >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nvidia-cuda-toolkit
fi

# The Python package (python/): nanobind, numpy, safetensors and pytest from PyPI in a virtual
# environment inside the build directory, whose interpreter CMake then builds the module for.
# Without venv support or the registry the package is not built, and ctest reports its suite as
# skipped with the reason.
venv="$(mkdir -p "$build_dir" && cd "$build_dir" && pwd)/python-env"
python_args=()
python_modules="import nanobind, numpy, safetensors, pytest"
if [ -x "$venv/bin/python" ] || python3 -m venv "$venv" >/dev/null 2>&1; then
  "$venv/bin/python" -c "$python_modules" 2>/dev/null ||
    "$venv/bin/python" -m pip install -q --disable-pip-version-check nanobind numpy safetensors \
      pytest >/dev/null 2>&1 || true
  if "$venv/bin/python" -c "$python_modules" 2>/dev/null; then
    python_args=(-DPython_EXECUTABLE="$venv/bin/python")
  fi
fi

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=${QGEMM_BUILD_TYPE:-RelWithDebInfo} \
  "${python_args[@]}" >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
