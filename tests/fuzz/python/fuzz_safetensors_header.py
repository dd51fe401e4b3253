"""Fuzz target safetensors_header (issue #19): a .safetensors file as qgemm reads it
(qgemm.tensors.SafetensorsFile: the 8-byte header length, the JSON header, each tensor's
dtype, shape and data_offsets, its data) and as qgemm.checkpoint maps its tensors into the
importers (load_linear: the layers quantized_prefixes / quantized_experts find by their names,
for each format's quantization_config in samples.py).

The input is the whole file. A custom mutator keeps the framing consistent most of the time:
it mutates the JSON header (or the data after it) and rewrites the 8-byte length, so that
mutations reach the header's contents; now and then it mutates the raw bytes, length included.
Contract: every call returns a valid result (tensors of the declared dtype and shape; imported
layers that pass fuzz_support.check_layer) or raises qgemm.Error.

    PYTHONPATH=build/python python tests/fuzz/python/fuzz_safetensors_header.py \
        [libFuzzer flags] CORPUS_DIR... | FILE...
"""

import json
import os
import random
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzz_support import (atheris, check, check_layer, checkpoint,  # noqa: E402
                          expect_result_or_error, main, Scratch, tensors)
import samples  # noqa: E402

CONFIGS = {config["quant_method"] + ("-" + config.get("quant_algo", "") if "quant_algo" in config
                                     else ""): config
           for config, _ in samples.configs().values()}
MAX_LAYERS = 4  # layers imported per config and input
scratch = Scratch()


def read_file(path: str) -> dict:
    f = tensors.SafetensorsFile(path)
    keys = list(f.keys())
    check(all(isinstance(key, str) for key in keys), f"keys {keys!r}")
    read = {}
    for key in keys:
        t = f.get(key)
        check(isinstance(t, tensors.StoredTensor) and t.dtype in tensors.STORAGE,
              f"{key}: {t!r}")
        check(t.data.dtype == tensors.STORAGE[t.dtype], f"{key}: {t.dtype} as {t.data.dtype}")
        check(list(t.shape) == list(f.header[key]["shape"]),
              f"{key}: shape {t.shape}, the header says {f.header[key]['shape']}")
        read[key] = t
    return read


def test_one_input(data: bytes) -> None:
    path = scratch.write("model.safetensors", data)
    result = {}

    def read():
        result["tensors"] = read_file(path)
    expect_result_or_error(read)
    if "tensors" not in result:
        return
    keys = list(result["tensors"])
    for method, config in CONFIGS.items():
        found = {}

        def find():
            found["layers"] = checkpoint.quantized_prefixes(keys, config)
            found["experts"] = checkpoint.quantized_experts(keys, config)
        expect_result_or_error(find)
        layers = found.get("layers", [])[:MAX_LAYERS]
        experts = found.get("experts", [])[:MAX_LAYERS]
        if not layers and not experts:
            continue
        scratch.write("config.json", json.dumps({"quantization_config": config}).encode())
        for prefix in layers:
            def load():
                check_layer(checkpoint.load_linear(scratch.path, prefix, "bf16"),
                            f"{method} {prefix}")
            expect_result_or_error(load)
        for prefix in experts:
            def load_experts():
                for half in ("gate_up_proj", "down_proj"):
                    check_layer(checkpoint.load_linear(scratch.path, f"{prefix}.{half}", "bf16",
                                                       expert=0), f"{prefix}.{half}")
                moe = checkpoint.import_mxfp4_experts(result["tensors"], prefix)
                check(len(moe.gate_up) == len(moe.down) > 0, f"{prefix}: experts")
            expect_result_or_error(load_experts)
        scratch.remove("config.json")


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    if len(data) >= 8 and rng.random() < 0.85:
        (length,) = struct.unpack("<Q", data[:8])
        if 8 + length <= len(data):
            header, rest = data[8:8 + length], data[8 + length:]
            if rng.random() < 0.8 or not rest:
                header = atheris.Mutate(header, max(1, max_size - 8 - len(rest)))
            else:
                rest = atheris.Mutate(rest, max(1, max_size - 8 - len(header)))
            return (struct.pack("<Q", len(header)) + header + rest)[:max_size]
    return atheris.Mutate(data, max_size)


if __name__ == "__main__":
    main(test_one_input, custom_mutator if atheris is not None else None)
