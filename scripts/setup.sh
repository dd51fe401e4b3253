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
  # atheris (libFuzzer for Python, a ~35 MB wheel), for scripts/fuzz.sh's Python targets
  # (safetensors_header, quantization_config: the checkpoint importers). Best effort, a wheel
  # only (no source build): without it those fuzz targets fail with the reason.
  if ! "$venv/bin/python" -c "import atheris" 2>/dev/null; then
    timeout 300 "$venv/bin/python" -m pip install -q --disable-pip-version-check \
      --only-binary atheris atheris >/dev/null 2>&1 ||
      echo "setup.sh: atheris not installed; scripts/fuzz.sh's Python targets will fail" >&2
  fi
  # torch, for the torch ops and qgemm.nn tests (python/tests/test_ops*.py). The package index's
  # Linux torch is its CUDA build (~3 GB with its CUDA libraries; it runs on the CPU too): about
  # a minute to install here, so CI runs those tests (its CPU ones; the GPU ones skip) well
  # within its budget. QGEMM_TORCH=0 leaves it out, QGEMM_TORCH_SPEC picks another version (the
  # default is the GPU test machine's). Best effort: where the install fails or runs past 10
  # minutes, the torch tests skip ("torch is not installed") rather than fail.
  if [ "${QGEMM_TORCH:-1}" != 0 ] && ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    timeout 600 "$venv/bin/python" -m pip install -q --disable-pip-version-check \
      "${QGEMM_TORCH_SPEC:-torch==2.11.*}" >/dev/null 2>&1 || true
    if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
      # An install cut short can leave a torch that fails to import: none beats a broken one.
      "$venv/bin/python" -m pip uninstall -q -y torch >/dev/null 2>&1 || true
      echo "setup.sh: torch was not installed; the torch tests will skip" >&2
    fi
  fi
  # compressed-tensors (with transformers) writes the test files of its checkpoint importer with
  # the producing tool itself, and transformers runs the tiny-model tests. Best effort, as torch:
  # without them those tests skip with the reason.
  if [ "${QGEMM_TORCH:-1}" != 0 ] && "$venv/bin/python" -c "import torch" 2>/dev/null &&
     ! "$venv/bin/python" -c "import compressed_tensors, transformers" 2>/dev/null; then
    timeout 300 "$venv/bin/python" -m pip install -q --disable-pip-version-check \
      compressed-tensors transformers >/dev/null 2>&1 ||
      echo "setup.sh: compressed-tensors / transformers not installed; their tests will skip" >&2
  fi
fi

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=${QGEMM_BUILD_TYPE:-RelWithDebInfo} \
  "${python_args[@]}" >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
