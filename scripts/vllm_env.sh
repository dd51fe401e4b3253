#!/usr/bin/env bash
# Creates the virtual environment of the vLLM plugin's tests (ctest -L vllm), $build_dir/vllm-env:
# vLLM (default 0.34.0, QGEMM_VLLM_SPEC picks another) with the dependencies of its own that
# install, qgemm, and the plugin package python/qgemm_vllm (editable, so the tests follow the tree).
#
# vLLM 0.34 pins torch 2.14 and about twenty other exact versions, and one of them
# (flashinfer-python 0.7.3) is not on the package index: a plain `pip install vllm==0.34.0`
# fails. So vLLM goes in with --no-deps, then its requirements (read from the installed wheel's
# metadata, markers evaluated for this machine) go in together, with vLLM's exact pins as
# constraints; a pinned version that pip reports as unavailable is left out and the rest tried
# again; if they still do not install together, one by one. Those left out are listed in
# $venv/vllm-missing.txt and reported at the end. About 8.5 GB (torch and the CUDA libraries are
# most of it): 4 minutes here with a fast network and no pip cache. The log is
# $build_dir/vllm-env.log.
#
# qgemm: the package built in $build_dir/python (scripts/setup.sh, or `ninja -C build _core`) is put
# on the venv's path with a .pth file when its native module matches the venv's Python; otherwise
# `pip install .` builds it (CMake, nanobind, the C++ compiler: minutes).
#
# Idempotent: a second run installs only what is missing. QGEMM_VLLM_PYTHON picks the interpreter
# (default: python3; it must be the one build/python was built for to reuse that build).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build_dir=${QGEMM_BUILD_DIR:-build}
mkdir -p "$build_dir"
build_dir=$(cd "$build_dir" && pwd)
venv=$build_dir/vllm-env
log=$build_dir/vllm-env.log
spec=${QGEMM_VLLM_SPEC:-vllm==0.34.0}
python=${QGEMM_VLLM_PYTHON:-python3}

say() { echo "vllm_env.sh: $*" | tee -a "$log" >&2; }
: >"$log"

if [ ! -x "$venv/bin/python" ]; then
  say "creating $venv with $($python --version 2>&1)"
  "$python" -m venv "$venv" >>"$log" 2>&1
fi
py="$venv/bin/python"
pip() { "$py" -m pip --disable-pip-version-check "$@"; }
pip install -q -U pip setuptools wheel >>"$log" 2>&1

# 1. vLLM itself, without its dependencies.
if ! pip show vllm >/dev/null 2>&1; then
  say "installing $spec (--no-deps)"
  pip install --no-deps "$spec" >>"$log" 2>&1
fi
say "vllm $(pip show vllm | sed -n 's/^Version: //p') installed"

# 2. Its requirements for this machine (packaging evaluates the markers): all of them
# (vllm_reqs all), or those not satisfied yet (vllm_reqs).
vllm_reqs() {
  "$py" - "${1:-missing}" <<'EOF'
import sys
import importlib.metadata as md
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
for text in md.requires("vllm") or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if sys.argv[1] == "all":
        print(text.split(";")[0].strip())
        continue
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        print(text.split(";")[0].strip())
        continue
    if req.specifier and not req.specifier.contains(version, prereleases=True):
        print(text.split(";")[0].strip())
EOF
}
pip install -q packaging >>"$log" 2>&1
# vLLM's exact pins (name==version) as constraints: no requirement installed below may move one
# of them (torchaudio 2.11, say, would take torch back to 2.11); one that would fails instead.
pins() { grep -E '^[A-Za-z0-9_.-]+(\[[^]]*\])?==[^,]+$' | sed 's/\[[^]]*\]//' || true; }
# The lines of stdin whose requirement is none of the packages named in the arguments.
drop() { "$py" -c '
import re, sys
names = {re.sub(r"[-_.]+", "-", a).lower() for a in sys.argv[1:]}
for line in sys.stdin:
    name = re.match(r"[A-Za-z0-9_.-]+", line.strip())
    if name and re.sub(r"[-_.]+", "-", name.group()).lower() not in names:
        sys.stdout.write(line)' "$@"; }
# The packages pip's output says have no distribution for this machine.
unavailable() { "$py" -c '
import re, sys
text = open(sys.argv[1]).read()
found = re.findall(r"No matching distribution found for ([A-Za-z0-9_.-]+)", text)
block = re.search(r"no matching distributions available for your environment:\n((?:    \S+\n)+)", text)
found += block.group(1).split() if block else []
print(" ".join(dict.fromkeys(found)))' "$1"; }
vllm_reqs all | pins >"$venv/vllm-pins.txt"
reqs=$(vllm_reqs)
try=0
while [ -n "$reqs" ] && [ $try -lt 5 ]; do
  try=$((try + 1))
  say "installing $(echo "$reqs" | wc -l) requirements of vllm together"
  echo "$reqs" >"$venv/vllm-todo.txt"
  if pip install -r "$venv/vllm-todo.txt" -c "$venv/vllm-pins.txt" >"$venv/pip.out" 2>&1; then
    cat "$venv/pip.out" >>"$log"
    reqs=""
    break
  fi
  cat "$venv/pip.out" >>"$log"
  # Pinned versions the index does not have: leave those requirements out and try again.
  gone=$(unavailable "$venv/pip.out")
  [ -n "$gone" ] || break
  say "not available: $(echo $gone) (left out)"
  reqs=$(echo "$reqs" | drop $gone)
  vllm_reqs all | pins | drop $gone >"$venv/vllm-pins.txt"
done
if [ -n "$reqs" ]; then
  say "together they do not install; one by one"
  while IFS= read -r req; do
    pip install "$req" -c "$venv/vllm-pins.txt" >>"$log" 2>&1 || say "not installed: $req"
  done <<<"$reqs"
fi
vllm_reqs >"$venv/vllm-missing.txt"
if [ -s "$venv/vllm-missing.txt" ]; then
  say "requirements of vllm left out (not installable here):"
  sed 's/^/  /' "$venv/vllm-missing.txt" | tee -a "$log" >&2
fi

# 3. qgemm: the build tree's package when its module fits this Python, else a wheel built here.
pip install -q numpy safetensors pytest >>"$log" 2>&1
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
if ls "$build_dir"/python/qgemm/_core*"$suffix" >/dev/null 2>&1; then
  echo "$build_dir/python" >"$site/qgemm-build.pth"
  say "qgemm: $build_dir/python (through $site/qgemm-build.pth)"
else
  rm -f "$site/qgemm-build.pth"
  say "qgemm: no module for $suffix in $build_dir/python; building the package (pip install .)"
  pip install "$root" >>"$log" 2>&1
fi

# 4. The plugin, editable: its entry point registers it with vLLM.
pip install -q --no-deps -e "$root/python/qgemm_vllm" >>"$log" 2>&1

"$py" - <<'EOF' 2>&1 | tee -a "$log"
import importlib.metadata as md
import qgemm, torch, vllm
eps = [ep.value for ep in md.entry_points(group="vllm.general_plugins") if ep.name == "qgemm"]
print(f"vllm_env.sh: ok: vllm {vllm.__version__}, torch {torch.__version__}, "
      f"qgemm from {qgemm.__file__}, plugin entry point {eps}")
EOF
