"""python/qgemm_vllm/gpu_check.py's dry run (`--cpu`): the vLLM plugin's linear and MoE layers,
built through qgemm_vllm.layout without vLLM, on qgemm's CPU reference operator against their
checkpoint weights in float64. It exits 0 with every line ok (the GPU run is the same script
without --cpu). Skipped where torch is not installed."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not installed")

import qgemm  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "qgemm_vllm",
                      "gpu_check.py")


def test_the_gpu_checks_dry_run_passes_every_layer():
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(qgemm.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [package_root, os.path.dirname(SCRIPT)] +
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    done = subprocess.run([sys.executable, SCRIPT, "--cpu"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "gpu_check --cpu: passed"
    checks = [line for line in lines if line.startswith(("ok", "FAIL"))]
    assert checks and all(line.startswith("ok") for line in checks)
    for layer in ("gptq-act-order", "awq", "fp8-block", "moe-gptq", "moe-awq", "moe-ct",
                  "moe-gpt-oss-mxfp4"):
        assert any(line.split()[1] == layer for line in checks), layer
