"""Fuzz target quantization_config (issue #19): a model directory's config.json, and modelopt's
hf_quant_config.json, as qgemm.checkpoint reads and interprets them.

The input is the file's text. It is written as <dir>/config.json, then (on its own) as
<dir>/hf_quant_config.json, and read by checkpoint.quantization_config. The config it returns
then picks and drives an importer: checkpoint.import_linear on small valid layers of the
formats its quant_method names (samples.py; compressed-tensors' config groups, targets, ignore
list, strategies and input_activations, GPTQ / AWQ bits and group sizes, modelopt's quant_algo,
FP8 block sizes, BitNet's options), with 16-bit and quantized activations, and
checkpoint.quantized_prefixes / quantized_experts on their tensors' names. Contract: each call
returns a valid result (fuzz_support.check_layer) or raises qgemm.Error.

    PYTHONPATH=build/python python tests/fuzz/python/fuzz_quantization_config.py \
        [libFuzzer flags] CORPUS_DIR... | FILE...
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzz_support import (check, check_layer, checkpoint, expect_result_or_error,  # noqa: E402
                          main, Scratch)
import samples  # noqa: E402

LAYERS = samples.layers()
BY_METHOD = samples.layers_by_method()
scratch = Scratch()


def interpret(config) -> None:
    """quant_method → importers, as load_linear and load_quantized use the config."""
    method = config.get("quant_method") if isinstance(config, dict) else None
    names = BY_METHOD.get(method) if isinstance(method, str) else None
    names = names or ["gptq"]  # an unknown method: its error, on any layer
    for name in names:
        prefix, tensors, expert = LAYERS[name]
        for activation, quantize in (("bf16", True), ("fp16", False)):
            def load():
                layer = checkpoint.import_linear(tensors, prefix, config, activation,
                                                 quantize_activations=quantize, expert=expert)
                check_layer(layer, f"{name} with {activation}")
            expect_result_or_error(load)

        def find():
            found = checkpoint.quantized_prefixes(tensors.keys(), config)
            check(isinstance(found, list) and all(isinstance(p, str) for p in found),
                  f"quantized_prefixes: {found!r}")
            experts = checkpoint.quantized_experts(tensors.keys(), config)
            check(isinstance(experts, list), f"quantized_experts: {experts!r}")
        expect_result_or_error(find)


def test_one_input(data: bytes) -> None:
    for name in ("config.json", "hf_quant_config.json"):
        other = "hf_quant_config.json" if name == "config.json" else "config.json"
        scratch.remove(other)
        scratch.write(name, data)
        result = {}

        def read():
            config = checkpoint.quantization_config(scratch.path)
            check(isinstance(config, dict), f"quantization_config gives {type(config).__name__}")
            result["config"] = config
        expect_result_or_error(read)
        if "config" in result:
            interpret(result["config"])


if __name__ == "__main__":
    main(test_one_input)
