"""Writes the Python fuzz targets' seed corpora (tests/fuzz/python/<target>/) from samples.py:

  safetensors_header/   one .safetensors file per format's layer, a minimal file ({}) and one
                        with __metadata__ only
  quantization_config/  config.json of each format (quantization_config beside a few model
                        fields), and modelopt's hf_quant_config.json

    PYTHONPATH=build/python python tests/fuzz/python/make_seeds.py
"""

import json
import os
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)

import samples  # noqa: E402
from fuzz_support import tensors as qt  # noqa: E402


def header_only(header: dict) -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)
    return struct.pack("<Q", len(text)) + text


def main() -> None:
    st_dir = os.path.join(here, "safetensors_header")
    qc_dir = os.path.join(here, "quantization_config")
    for d in (st_dir, qc_dir):
        os.makedirs(d, exist_ok=True)
    for name, (_, tensors, _) in samples.layers().items():
        qt.write_safetensors(os.path.join(st_dir, f"{name}.safetensors"), tensors,
                             {"format": "pt"})
    with open(os.path.join(st_dir, "empty.safetensors"), "wb") as f:
        f.write(header_only({}))
    with open(os.path.join(st_dir, "metadata-only.safetensors"), "wb") as f:
        f.write(header_only({"__metadata__": {"format": "pt", "producer": "qgemm"}}))

    model = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
             "intermediate_size": 16, "model_type": "llama", "num_hidden_layers": 1,
             "torch_dtype": "bfloat16", "vocab_size": 128}
    for name, (config, _) in samples.configs().items():
        with open(os.path.join(qc_dir, f"{name}.json"), "w") as f:
            json.dump({**model, "quantization_config": config}, f, indent=2)
    modelopt = samples.configs()["modelopt-nvfp4"][0]
    with open(os.path.join(qc_dir, "hf_quant_config-nvfp4.json"), "w") as f:
        json.dump({"producer": {"name": "modelopt", "version": "0.29.0"},
                   "quantization": {k: v for k, v in modelopt.items() if k != "quant_method"}},
                  f, indent=2)


if __name__ == "__main__":
    main()
