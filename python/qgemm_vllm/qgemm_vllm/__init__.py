"""qgemm's vLLM plugin: `vllm serve <quantized model> --quantization qgemm`.

vLLM calls `register` (entry point group vllm.general_plugins, name qgemm) once in each of its
processes: the engine, every worker, and the model-inspection subprocess. It registers the
quantization method "qgemm" (qgemm_vllm.vllm_plugin.QgemmConfig) and qgemm's torch operators.
`register` is idempotent and, being a module-level function, picklable.

qgemm_vllm.layout holds what does not need vLLM (the checkpoint tensors of a layer, their
conversion into a qgemm weight, the forward); the GPU check uses it on machines without vLLM.
"""

_registered = False


def register() -> None:
    """Registers --quantization qgemm with vLLM (a second call does nothing)."""
    global _registered
    if _registered:
        return
    from . import vllm_plugin  # noqa: F401  (its class decorators register it)

    _registered = True


__all__ = ["register"]
