"""Checkpoint importers against files written the way the producing tools lay them out.

The writers below follow the documented layouts (AutoGPTQ's `pack` in its QuantLinear: qweight
packed along K, qzeros along N, v1 storing zero − 1; AutoAWQ's GEMM `WQLinear_GEMM.from_linear`:
packed along N in the order 0, 2, 4, 6, 1, 3, 5, 7), one word at a time and independently of
qgemm.checkpoint. The expected weights are the source values (q − z) · s, never the importer's
output.
"""

import json
import os

import numpy as np
import pytest

import qgemm
from qgemm import checkpoint

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def pack_words_along_rows(codes, bits, order=None):
    """int32 words from codes [rows, cols]: word (i, j) holds rows i·p + order[t], t = 0..p−1,
    in bits [t·bits, (t + 1)·bits)."""
    per = 32 // bits
    order = order or list(range(per))
    rows, cols = codes.shape
    words = np.zeros((rows // per, cols), dtype=np.uint64)
    for i in range(rows // per):
        for t in range(per):
            words[i] |= codes[i * per + order[t]].astype(np.uint64) << np.uint64(t * bits)
    return words.astype(np.uint32).view(np.int32)


def gptq_tensors(rng, n, k, bits, group, v1, act_order):
    groups = -(-k // group)
    q = rng.integers(0, 1 << bits, size=(k, n))
    z = rng.integers(0, 1 << bits, size=(groups, n))
    z[0, :4] = 0  # v1 stores 0 − 1 = all ones: the importer must wrap it back to 0
    s = (rng.random((groups, n)) * 0.02 + 0.001).astype(np.float16)
    g_idx = np.arange(k) // group
    if act_order:
        g_idx = g_idx[rng.permutation(k)]
    stored_z = (z - 1) & ((1 << bits) - 1) if v1 else z
    tensors = {
        "qweight": pack_words_along_rows(q, bits),
        "qzeros": pack_words_along_rows(stored_z.T, bits).T.copy(),
        "scales": s,
        "g_idx": g_idx.astype(np.int32),
    }
    # w[n, k] = (q[k, n] − z[g_idx[k], n]) · s[g_idx[k], n]
    w = ((q - z[g_idx]) * s[g_idx].astype(np.float64)).T
    return tensors, w


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("v1", [True, False])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_dequantizes_to_the_source_weights(bits, v1, act_order):
    rng = np.random.default_rng(1000 * bits + 10 * v1 + act_order)
    n, k, group = 64, 384, 128
    t, w = gptq_tensors(rng, n, k, bits, group, v1, act_order)
    layer = checkpoint.import_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], bits=bits,
                                   group_size=group,
                                   checkpoint_format="gptq" if v1 else "gptq_v2")
    assert (layer.input_permutation is not None) == act_order
    got = qgemm.dequantize_weight(layer.weight)
    expected = w if layer.input_permutation is None else w[:, layer.input_permutation]
    np.testing.assert_array_equal(got, expected)
    # The layer on activations in the checkpoint's K order equals x · Wᵀ (fp16 rounding of the
    # activations and the output aside).
    x = rng.standard_normal((5, k)).astype(np.float32)
    y = layer.reference(x)
    exact = x.astype(np.float16).astype(np.float64) @ w.T
    np.testing.assert_allclose(y, exact, rtol=2e-3, atol=2e-3 * np.abs(exact).max())


def test_gptq_symmetric_becomes_the_implied_midpoint():
    rng = np.random.default_rng(7)
    n, k, group = 32, 256, 128
    q = rng.integers(0, 16, size=(k, n))
    s = (rng.random((2, n)) * 0.01 + 0.001).astype(np.float16)
    stored = np.full((2, n), 7)  # v1 stores 8 − 1
    layer = checkpoint.import_gptq(pack_words_along_rows(q, 4),
                                   pack_words_along_rows(stored.T, 4).T.copy(), s, None, bits=4,
                                   group_size=group)
    assert layer.scheme.zero_point == "mid"
    assert len(layer.weight.zeros) == 0
    g = np.arange(k) // group
    np.testing.assert_array_equal(qgemm.dequantize_weight(layer.weight),
                                  ((q - 8) * s[g].astype(np.float64)).T)


def test_awq_dequantizes_to_the_source_weights():
    rng = np.random.default_rng(11)
    n, k, group = 128, 320, 64  # the last group is whole; k is not a multiple of 128
    groups = k // group
    q = rng.integers(0, 16, size=(k, n))
    z = rng.integers(0, 16, size=(groups, n))
    s = (rng.random((groups, n)) * 0.02 + 0.001).astype(np.float16)
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    qweight = pack_words_along_rows(q.T, 4, order).T.copy()
    qzeros = pack_words_along_rows(z.T, 4, order).T.copy()
    layer = checkpoint.import_awq(qweight, qzeros, s, group_size=group)
    g = np.arange(k) // group
    np.testing.assert_array_equal(qgemm.dequantize_weight(layer.weight),
                                  ((q - z[g]) * s[g].astype(np.float64)).T)


def test_load_linear_reads_a_model_directory(tmp_path):
    rng = np.random.default_rng(3)
    t, w = gptq_tensors(rng, 64, 256, 4, 128, v1=True, act_order=True)
    prefix = "model.layers.0.mlp.down_proj"
    safetensors_numpy.save_file({f"{prefix}.{name}": v for name, v in t.items()},
                                str(tmp_path / "model.safetensors"))
    config = {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128,
                                      "desc_act": True, "sym": False}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    layer = checkpoint.load_linear(str(tmp_path), prefix)
    np.testing.assert_array_equal(qgemm.dequantize_weight(layer.weight),
                                  w[:, layer.input_permutation])
    with pytest.raises(qgemm.Error, match="no tensors named"):
        checkpoint.load_linear(str(tmp_path), "model.layers.1.mlp.down_proj")


def test_bad_checkpoints_raise_errors_that_name_the_rule():
    rng = np.random.default_rng(5)
    t, _ = gptq_tensors(rng, 64, 256, 4, 128, v1=True, act_order=False)
    with pytest.raises(qgemm.Error, match="bits must be 2, 4 or 8"):
        checkpoint.import_gptq(t["qweight"], t["qzeros"], t["scales"], bits=3, group_size=128)
    with pytest.raises(qgemm.Error, match="scale rows"):
        checkpoint.import_gptq(t["qweight"], t["qzeros"][:1], t["scales"][:1], bits=4,
                               group_size=64)
    with pytest.raises(qgemm.Error, match="g_idx"):
        bad = t["g_idx"].copy()
        bad[:3] = 1  # group 1 gets 131 columns
        checkpoint.import_gptq(t["qweight"], t["qzeros"], t["scales"], bad, bits=4,
                               group_size=128)
    with pytest.raises(qgemm.Error, match="not supported"):
        checkpoint.import_linear({}, "x", {"quant_method": "hqq"})
