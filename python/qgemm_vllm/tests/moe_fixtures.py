"""MoE layers' checkpoint tensors and their float64 reference, shared by the plugin's CPU tests
(test_vllm_plugin.py, with vLLM) and its GPU check (gpu_check.py, without): int4 experts in
GPTQ / AWQ / compressed-tensors form, gpt-oss's MXFP4 experts, and the routed layer computed
from the weights they stand for. Imports neither vLLM nor pytest."""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
import test_checkpoint as gptq_fixtures  # noqa: E402
import test_checkpoint_formats as fixtures  # noqa: E402

# The int4 formats' quantization configs, group 32 (the experts' K can be small).
MOE_INT4_CONFIGS = {
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False,
             "sym": True},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
            "version": "gemm"},
    "ct": fixtures.ct_config(4, False, "group", 32)}


def int4_expert_tensors(rng, fmt, n, k):
    """One projection's checkpoint tensors and the w [n, k] (float64) they stand for, in `fmt`
    (gptq, awq or ct), group 32."""
    if fmt == "gptq":
        return gptq_fixtures.gptq_tensors(rng, n, k, 4, 32, v1=True, act_order=False)
    if fmt == "awq":  # packed along N in AWQ's nibble order
        q = rng.integers(0, 16, size=(k, n))
        z = rng.integers(0, 16, size=(k // 32, n))
        s = (rng.random((k // 32, n)) * 0.02 + 0.001).astype(np.float16)
        pack, order = gptq_fixtures.pack_words_along_rows, [0, 2, 4, 6, 1, 3, 5, 7]
        g = np.arange(k) // 32
        return ({"qweight": pack(q.T, 4, order).T.copy(), "qzeros": pack(z.T, 4, order).T.copy(),
                 "scales": s}, ((q - z[g]) * s[g].astype(np.float64)).T)
    tensors, w = fixtures.ct_pack_tensors(rng, "p", 4, False, "group", "BF16", n, k, 32)
    return {name[2:]: v for name, v in tensors.items()}, w


def gpt_oss_mxfp4(rng, experts, n, k):
    """gpt-oss's MXFP4 experts of one projection: blocks [E, n, k / 32, 16] (two e2m1 codes a
    byte, low nibble first), e8m0 scales [E, n, k / 32] near 1, and w [E, n, k] (float64)."""
    blocks = rng.integers(0, 256, size=(experts, n, k // 32, 16)).astype(np.uint8)
    scales = rng.integers(119, 125, size=(experts, n, k // 32)).astype(np.uint8)
    flat = blocks.reshape(experts, n, k // 2)
    codes = np.empty((experts, n, k), np.int64)
    codes[..., 0::2], codes[..., 1::2] = flat & 15, flat >> 4
    w = fixtures.E2M1[codes] * 2.0 ** (np.repeat(scales, 32, axis=-1).astype(np.int64) - 127)
    return blocks, scales, w


def glu(kind, gate, up, alpha=1.702, limit=7.0):
    """The GLU as qgemm computes it (kernels/moe/glue.cuh)."""
    if kind == "silu":
        return gate * torch.sigmoid(gate) * up
    gate = gate.clamp(max=limit)
    up = up.clamp(-limit, limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


def moe_reference(x, ids, weights, gate_up, down, kind, gate_up_bias=None, down_bias=None):
    """The routed layer in float64: gate_up [E, 2I, H] (gate rows, then up rows) and down
    [E, H, I] as float64 arrays, gate_up's rows and the GLU's output rounded to bf16 as the
    operator stores them. Returns (out [tokens, H], each output's magnitude:
    Σ |weight| · (|down| · |h| + |y|))."""
    bf16 = lambda t: t.to(torch.bfloat16).to(torch.float64)  # noqa: E731
    gate_up, down = torch.from_numpy(gate_up), torch.from_numpy(down)
    x = x.cpu().to(torch.float64)
    out, magnitude = torch.zeros_like(x), torch.zeros_like(x)
    inter = down.shape[2]
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e, w = int(ids[t, j]), float(weights[t, j])
            g = gate_up[e] @ x[t]
            if gate_up_bias is not None:
                g = g + torch.as_tensor(gate_up_bias[e], dtype=torch.float64)
            g = bf16(g)
            h = bf16(glu(kind, g[:inter], g[inter:]))
            y = down[e] @ h
            if down_bias is not None:
                y = y + torch.as_tensor(down_bias[e], dtype=torch.float64)
            out[t] += w * y
            magnitude[t] += abs(w) * (down[e].abs() @ h.abs() + y.abs())
    return out, magnitude
