"""qgemm: JIT-compiled quantized GEMM kernels for LLM inference.

The host side lives here: schemes, round-to-nearest quantization into qgemm's canonical packed
form, exact dequantization, the CPU reference GEMM, and checkpoint import
(`qgemm.checkpoint`); and the GPU: `Engine(device)` prepares a weight
(`prepare_weight`) and runs `gemm(a, weight, out, stream)` on CUDA arrays passed through DLPack
(torch, CuPy, JAX). Errors raise `qgemm.Error` (a ValueError) with the library's message.

With torch: `qgemm.ops` registers `torch.ops.qgemm.gemm`; `qgemm.nn` holds `QuantLinear`;
`qgemm.quantize_model(model, scheme)` swaps a model's linear layers in place;
`qgemm.load_quantized(path)` builds a model from a quantized checkpoint (GPTQ, AWQ,
compressed-tensors, modelopt NVFP4/FP8, FP8-block, BitNet: `qgemm.checkpoint`). They are imported on
first use (or at once when torch is already imported), so that `import qgemm` itself never
imports torch.

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
    kernel_cache_counts,
    presets,
    quantize_weight,
    reference_gemm,
    reference_moe_layer,
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
    "kernel_cache_counts",
    "presets",
    "quantize_weight",
    "reference_gemm",
    "reference_moe_layer",
]


# The torch parts, on first use (PEP 562): qgemm.ops, qgemm.nn, qgemm.quantize_model,
# qgemm.load_quantized.
_TORCH_ATTRIBUTES = {"ops": "ops", "nn": "nn", "quantize_model": "nn", "load_quantized": "nn",
                     "QuantLinear": "nn", "QuantMoE": "nn"}


def __getattr__(name):
    module_name = _TORCH_ATTRIBUTES.get(name)
    if module_name is None:
        raise AttributeError(f"module 'qgemm' has no attribute {name!r}")
    import importlib

    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ModuleNotFoundError as error:
        if error.name != "torch":
            raise
        raise ImportError(f"qgemm.{name} needs torch, which is not installed") from error
    return module if name == module_name else getattr(module, name)


def _register_torch_ops_if_torch_is_loaded():
    # A program that imported torch first can call torch.ops.qgemm.gemm right after
    # `import qgemm`; one that has not keeps qgemm's import free of torch's.
    import sys

    if sys.modules.get("torch") is not None:
        from . import ops  # noqa: F401


_register_torch_ops_if_torch_is_loaded()
