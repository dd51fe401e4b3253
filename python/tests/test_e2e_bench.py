"""scripts/e2e_bench.py's CPU smoke mode (`--device cpu --quick --tiny`, one variant, w4a16): it
runs as a process, exits 0, writes its JSON with every section, and its logits checks pass their
thresholds; `--from-json` reports and gates the file again (and fails, exit 1, when a threshold
is not met). On the CPU torch.ops.qgemm.gemm is qgemm's reference, so the shapes are tiny.
Skipped where torch or transformers is not installed (the benchmark builds transformers models)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("transformers", reason="transformers is not installed")

import qgemm  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                      "scripts", "e2e_bench.py")


def load_script():
    spec = importlib.util.spec_from_file_location("e2e_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(*arguments):
    # The child imports the very qgemm this test does.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(qgemm.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [package_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.run([sys.executable, SCRIPT, *arguments], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    path = tmp_path_factory.mktemp("e2e") / "e2e.json"
    done = run_script("--device", "cpu", "--quick", "--tiny", "--model", "llama8b",
                      "--variants", "w4a16", "--profile", "--json", str(path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(path) as f:
        return path, json.load(f), done.stdout


def test_smoke_run_writes_every_section(smoke):
    _, results, stdout = smoke
    bench = load_script()
    assert results["schema"] == bench.SCHEMA
    machine = results["machine"]
    assert machine["device"] == "cpu"
    assert machine["qgemm"] == qgemm.__version__ and machine["torch"] and machine["transformers"]
    assert results["settings"]["variants"] == ["w4a16"]
    model = results["models"]["llama8b"]
    assert (model["layers"], model["full_layers"], model["tiny"]) == (2, 32, True)
    assert model["params"] > 0
    w4a16 = model["variants"]["w4a16"]
    assert w4a16["scheme"] == str(qgemm.Scheme("w4a16"))
    assert w4a16["coverage"]["quantized_fraction"] == 1.0  # a dense model: every body weight
    assert [p["shape"] for p in w4a16["prefill"]] == ["1x16", "2x16"]
    assert all(p["tokens_per_s"] > 0 for p in w4a16["prefill"])
    assert [d["batch"] for d in w4a16["decode"]] == [1, 4]
    for d in w4a16["decode"]:
        assert d["tokens_per_s"] > 0 and d["mode"] == "eager"
        assert d["fallback_reason"] == "CUDA graphs need a CUDA device"
        assert d["profile"] == {"skipped": "the kernel profile needs a CUDA device"}
    # The GPU-only parts say why they did not run.
    for key in ("kernel_check", "jit", "memory"):
        assert "skipped" in w4a16[key], key
    assert {t["model"] for t in results["targets"]} == {"llama8b", "qwen3moe"}
    assert results["checks"] == {"passed": True, "failures": [], "min_cosine_override": None}
    assert "checks: all passed" in stdout


def test_smoke_logits_pass_their_thresholds(smoke):
    _, results, _ = smoke
    bench = load_script()
    check = results["models"]["llama8b"]["variants"]["w4a16"]["logits"]
    assert check["layers"] == 2 and check["threshold"] == bench.LOGITS_THRESHOLDS["w4a16"]
    assert check["vs_bf16"]["cosine"] >= bench.LOGITS_THRESHOLDS["w4a16"]
    assert 0 <= check["vs_bf16"]["top1"] <= 1
    # The reference operator against the host-dequantized weights in torch: the same numbers
    # up to fp32 summation order.
    assert check["vs_dequantized"]["cosine"] >= bench.DEQUANTIZED_THRESHOLD
    assert check["vs_dequantized"]["cosine"] > 0.9999


def test_from_json_reports_and_gates(smoke, tmp_path):
    path, results, _ = smoke
    merged = tmp_path / "merged.json"
    done = run_script("--from-json", str(path), "--json", str(merged))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "llama8b" in done.stdout and "targets (issue #18)" in done.stdout
    with open(merged) as f:
        assert json.load(f)["models"] == results["models"]
    # A threshold no logits can meet: the gate fails loudly, with exit status 1.
    done = run_script("--from-json", str(path), "--min-cosine", "1.01")
    assert done.returncode == 1
    assert "FAILED" in done.stdout and "logits vs bf16" in done.stdout


def test_a_wrong_kernel_fails_the_logits_check(tmp_path):
    # --inject-fault k-tail: every quantized layer ignores the last eighth of its inputs, as a
    # kernel dropping its K tail would. The run still writes its JSON, then exits 1.
    path = tmp_path / "fault.json"
    done = run_script("--device", "cpu", "--tiny", "--check-only", "--model", "llama8b",
                      "--variants", "w4a16", "--inject-fault", "k-tail", "--json", str(path))
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    with open(path) as f:
        results = json.load(f)
    check = results["models"]["llama8b"]["variants"]["w4a16"]["logits"]
    assert check["vs_dequantized"]["cosine"] < load_script().DEQUANTIZED_THRESHOLD
    assert not results["checks"]["passed"]
    assert any("dequantized" in failure for failure in results["checks"]["failures"])
    assert "FAILED llama8b w4a16: logits vs dequantized weights" in done.stdout


def test_the_moe_model_quantizes_its_experts_with_quantized_activations(tmp_path):
    # The MoE model with a scheme that quantizes activations: its experts become QuantMoE (the
    # whole body quantized, router excepted), and the logits checks pass.
    path = tmp_path / "moe.json"
    done = run_script("--device", "cpu", "--tiny", "--check-only", "--model", "qwen3moe",
                      "--variants", "w4a8-fp8", "--json", str(path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(path) as f:
        results = json.load(f)
    variant = results["models"]["qwen3moe"]["variants"]["w4a8-fp8"]
    assert "error" not in variant, variant.get("error")
    assert variant["coverage"]["quantized_fraction"] > 0.9
    assert variant["logits"]["vs_dequantized"]["cosine"] >= \
        load_script().DEQUANTIZED_THRESHOLD_QUANTIZED_ACTIVATIONS
    assert results["checks"]["passed"]


def test_the_kernel_profile_sorts_kernels_by_name():
    bench = load_script()
    kernels = [("_ZN5qgemm7kernels15wgmma_gemm_sm90ILi2ELi8E", 30.0),   # a JIT kernel of qgemm
               ("void qgemm::kernels::moe_glue_kernel<0>(...)", 10.0),
               ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize", 40.0),  # cuBLAS
               ("cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>", 4.0),
               ("void pytorch_flash::flash_fwd_kernel<...>", 8.0),
               ("void at::native::vectorized_elementwise_kernel<4, ...>", 6.0)]
    ms = bench.kernel_ms_by_kind(kernels, 2)
    assert ms == pytest.approx({"qgemm": 0.02, "gemm": 0.022, "attention": 0.004, "other": 0.003})
