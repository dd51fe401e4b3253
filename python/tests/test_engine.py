"""The GPU Engine through DLPack (torch tensors), against the CPU reference, element by element.

Needs torch with CUDA and a GPU: skipped, with the reason, elsewhere."""

import numpy as np
import pytest

import qgemm

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)


def run(scheme_text, m, n, k, seed, out_dtype=torch.bfloat16, max_rows=65536):
    rng = np.random.default_rng(seed)
    scheme = qgemm.Scheme(scheme_text)
    packed = qgemm.quantize_weight(scheme, (rng.standard_normal((n, k)) * 0.05).astype(np.float32))
    engine = qgemm.Engine(0)
    weight = engine.prepare_weight(packed, scheme, max_rows)
    a_host = rng.standard_normal((m, k)).astype(np.float32)
    in_dtype = torch.float16 if scheme.activation_format == "fp16" else torch.bfloat16
    a = torch.from_numpy(a_host).to("cuda", in_dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)  # poisoned
    stream = torch.cuda.current_stream()
    engine.gemm(a, weight, out, stream.cuda_stream)
    stream.synchronize()
    a_exact = a.float().cpu().numpy()
    reference = qgemm.reference_gemm(scheme, a_exact, packed)
    return out.float().cpu().numpy(), reference, element_bounds(a_exact, packed, reference)


def element_bounds(a, packed, reference):
    """What each output element may differ from the exact product by: the output's rounding
    (a bf16 ulp is 2^-7 of the value at most), and the weight's rounding to the 16-bit tensor-core
    operand (2^-8 of each weight at most in bf16) wherever a kernel dequantizes into one. That
    second term is a sum of K independent errors, each uniform within ±2^-8 |a_k w_jk|: the bound
    is 7 of its standard deviations (a wrong tile's errors are of the output's own size)."""
    w = qgemm.dequantize_weight(packed).astype(np.float64)
    operand_rounding = 4 * 2.0**-8 * np.sqrt((a.astype(np.float64) ** 2) @ (w**2).T)
    return np.abs(reference) / 128 + operand_rounding + 1e-6


@pytest.mark.parametrize("scheme, m", [("w4a16", 1), ("w4a16", 17), ("gptq-w4a16-g128", 64),
                                       ("mxfp4-a16", 256), ("w8a16", 1024)])
def test_gemm_matches_the_reference(scheme, m):
    got, ref, bound = run(scheme, m, 640, 2880, seed=m)
    assert np.all(np.isfinite(got))
    assert np.all(np.abs(got - ref) <= bound), np.max(np.abs(got - ref) / bound)


def test_gemm_refuses_mismatched_arrays():
    scheme = qgemm.Scheme("w4a16")
    packed = qgemm.quantize_weight(scheme, np.ones((64, 128), np.float32))
    engine = qgemm.Engine(0)
    weight = engine.prepare_weight(packed, scheme)
    a = torch.ones((4, 96), device="cuda", dtype=torch.bfloat16)
    out = torch.empty((4, 64), device="cuda", dtype=torch.bfloat16)
    with pytest.raises(qgemm.Error, match="needs out"):
        engine.gemm(a, weight, out)
    with pytest.raises(qgemm.Error, match="bf16, fp16 or fp32"):
        engine.gemm(torch.ones((4, 128), device="cuda", dtype=torch.int32), weight, out)


@pytest.mark.skipif(torch.cuda.get_device_capability() != (9, 0),
                    reason="two layouts (mma.sync and wgmma) exist on SM90 only")
def test_sm90_holds_a_weight_once_and_a_decode_only_one_still_serves_prefill(monkeypatch):
    scheme = qgemm.Scheme("w4a16")
    packed = qgemm.quantize_weight(scheme, np.ones((8192, 8192), np.float32))
    # One copy in the wgmma order: the codes, and a float32 scale per group of 128.
    one_copy = packed.codes.size + 4 * (8192 * 8192 // 128)
    engine = qgemm.Engine(0)
    # The decode kernel and dequantize + cuBLAS read the wgmma order too, so a weight for every
    # M is held once, as is one for decode alone.
    assert engine.prepare_weight(packed, scheme).device_bytes == one_copy
    assert engine.prepare_weight(packed, scheme, max_rows=8).device_bytes == one_copy
    # Without those readers (QGEMM_WGMMA_ORDER_READERS=0) every M needs both layouts, and
    # max_rows is what keeps a decode-only weight to one.
    monkeypatch.setenv("QGEMM_WGMMA_ORDER_READERS", "0")
    both = engine.prepare_weight(packed, scheme).device_bytes
    assert engine.prepare_weight(packed, scheme, max_rows=8).device_bytes < 0.7 * both
    got, ref, bound = run("w4a16", 256, 640, 2880, seed=3, max_rows=8)
    assert np.all(np.abs(got - ref) <= bound)
