"""qgemm: JIT-compiled quantized GEMM kernels for LLM inference.

The host side lives here: schemes, round-to-nearest quantization into qgemm's canonical packed
form, exact dequantization, the CPU reference GEMM, and checkpoint import
(`qgemm.checkpoint`); and the GPU: `Engine(device)` prepares a weight
(`prepare_weight`) and runs `gemm(a, weight, out, stream)` on CUDA arrays passed through DLPack
(torch, CuPy, JAX). Errors raise `qgemm.Error` (a ValueError) with the library's message.

    import numpy as np, qgemm
    scheme = qgemm.Scheme("w4a16")
    w = qgemm.quantize_weight(scheme, np.random.randn(640, 2880).astype(np.float32))
    c = qgemm.reference_gemm(scheme, np.random.randn(7, 2880).astype(np.float32), w)
"""

from ._core import (
    Engine,
    Error,
    PackedWeight,
    QuantWeight,
    Scheme,
    __version__,
    dequantize_weight,
    format_names,
    presets,
    quantize_weight,
    reference_gemm,
)

__all__ = [
    "Engine",
    "Error",
    "PackedWeight",
    "QuantWeight",
    "Scheme",
    "__version__",
    "dequantize_weight",
    "format_names",
    "presets",
    "quantize_weight",
    "reference_gemm",
]
