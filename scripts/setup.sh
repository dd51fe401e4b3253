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

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=${QGEMM_BUILD_TYPE:-RelWithDebInfo} >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
