"""The bindings: schemes, quantization, the reference GEMM and errors, against numpy."""

import numpy as np
import pytest

import qgemm


def test_schemes_round_trip_and_expose_their_parts():
    s = qgemm.Scheme("gptq-w4a16-g128")
    assert s.preset == "gptq-w4a16-g128"
    assert (s.weight_format, s.group, s.zero_point, s.scale_format) == ("uint4", 128, "int", "fp16")
    assert qgemm.Scheme(str(s)) == s
    names = [name for name, _ in qgemm.presets()]
    assert "w4a16" in names and "nvfp4" in names
    assert "e2m1" in qgemm.format_names()


def test_quantize_then_dequantize_stays_within_half_a_step():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((48, 200)).astype(np.float32)
    scheme = qgemm.Scheme("w=uint4:g64:s=fp32:zp=int;a=bf16")
    packed = qgemm.quantize_weight(scheme, w)
    assert (packed.n, packed.k, packed.scale_grid) == (48, 200, (48, 4))
    assert packed.codes.shape == (48 * 100,)
    scales = packed.scales.view(np.float32).reshape(48, 4)
    step = np.repeat(scales, 64, axis=1)[:, :200]
    err = np.abs(qgemm.dequantize_weight(packed) - w)
    assert np.all(err <= 0.5 * step * (1 + 1e-6) + 1e-7)


def test_reference_gemm_matches_numpy_on_the_dequantized_operands():
    rng = np.random.default_rng(2)
    scheme = qgemm.Scheme("w=e2m1:g32:s=e8m0;a=bf16;o=fp32")
    packed = qgemm.quantize_weight(scheme, rng.standard_normal((40, 96)).astype(np.float32))
    a = rng.standard_normal((3, 96)).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    c = qgemm.reference_gemm(scheme, a, packed, bias)
    a_bf16 = (a.view(np.uint32) + 0x7FFF + ((a.view(np.uint32) >> 16) & 1)) & 0xFFFF0000
    expected = a_bf16.view(np.float32).astype(np.float64) @ qgemm.dequantize_weight(packed).T
    expected += bias
    np.testing.assert_allclose(c, expected, rtol=1e-6, atol=1e-6)


def test_bad_input_raises_an_error_that_names_the_argument():
    with pytest.raises(qgemm.Error, match="group"):
        qgemm.Scheme("w=uint4:g0")
    s = qgemm.Scheme("w4a16")
    packed = qgemm.quantize_weight(s, np.ones((8, 64), np.float32))
    with pytest.raises(qgemm.Error, match="codes"):
        qgemm.PackedWeight.from_parts(s, 8, 64, packed.codes[:-1], packed.scales)
    with pytest.raises(qgemm.Error, match="columns"):
        qgemm.reference_gemm(s, np.ones((2, 32), np.float32), packed)
    with pytest.raises(qgemm.Error, match="NaN|Inf|finite"):
        qgemm.quantize_weight(s, np.full((8, 64), np.nan, np.float32))


def test_schemes_pickle_as_their_text():
    import pickle

    for text in ("w4a16", "w=e2m1:g32:s=e8m0;a=e4m3:tok:s=fp32;o=fp16"):
        s = qgemm.Scheme(text)
        copy = pickle.loads(pickle.dumps(s))
        assert copy == s and str(copy) == str(s) and copy.preset == s.preset


def run_python(code):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ), timeout=120)


def test_import_qgemm_leaves_torch_alone():
    # `import qgemm` must not pay for torch's import; the torch parts load on first use.
    result = run_python("import sys, qgemm; print('torch' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_the_torch_parts_say_they_need_torch_where_it_is_missing():
    code = """
import sys
sys.modules["torch"] = None  # as if torch were not installed
import qgemm
for name in ("nn", "ops", "quantize_model"):
    try:
        getattr(qgemm, name)
    except ImportError as error:
        print(error)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"qgemm.{name} needs torch, which is not installed"
        for name in ("nn", "ops", "quantize_model")]
