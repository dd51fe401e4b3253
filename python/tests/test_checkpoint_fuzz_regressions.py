"""Regression tests of the checkpoint importers' fuzz findings (issue #19; the targets are
tests/fuzz/python/fuzz_safetensors_header.py and fuzz_quantization_config.py, run by
scripts/fuzz.sh). Each input below once raised something other than qgemm.Error (KeyError,
TypeError, AttributeError, OverflowError, ZeroDivisionError, RecursionError, MemoryError,
re.error, a numpy ValueError, or was silently accepted); now it raises qgemm.Error naming the
file, tensor or quantization_config field and the rule."""

import json
import os
import struct
import sys

import numpy as np
import pytest

import qgemm
from qgemm import checkpoint
from qgemm import tensors as qt

PREFIX = "m.proj"
FUZZ_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fuzz",
                        "python")


def raw_safetensors(path, header, data=b""):
    """A .safetensors file from a header given as JSON text (or bytes) and its data."""
    text = header.encode() if isinstance(header, str) else header
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    return str(path)


def model_dir(tmp_path, config=None, tensors=None, config_text=None, name="config.json"):
    """A model directory: config.json ({"quantization_config": config}, or config_text as
    is) and model.safetensors of {name: StoredTensor}."""
    text = config_text if config_text is not None else json.dumps(
        {"quantization_config": config} if name == "config.json" else config)
    (tmp_path / name).write_bytes(text.encode() if isinstance(text, str) else text)
    if tensors is not None:
        qt.write_safetensors(str(tmp_path / "model.safetensors"), tensors)
    return str(tmp_path)


def st(dtype, values):
    return qt.StoredTensor(dtype, np.ascontiguousarray(values, dtype=qt.STORAGE[dtype]))


def gptq_layer(n=16, k=64, group=32):
    groups = k // group
    return {f"{PREFIX}.qweight": st("I32", np.zeros((k // 8, n))),
            f"{PREFIX}.qzeros": st("I32", np.zeros((groups, n // 8))),
            f"{PREFIX}.scales": st("F16", np.full((groups, n), 0.01))}


def ct_config(weights=None, fmt="pack-quantized", targets=("Linear",), ignore=(), **group):
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
               "group_size": 32} if weights is None else weights
    return {"quant_method": "compressed-tensors", "format": fmt, "ignore": list(ignore),
            "config_groups": {"group_0": {"targets": list(targets), "weights": weights,
                                          **group}}}


def ct_pack_layer(n=16, k=64, group=32):
    return {f"{PREFIX}.weight_packed": st("I32", np.zeros((n, k * 4 // 32))),
            f"{PREFIX}.weight_scale": st("F32", np.full((n, k // group), 0.01)),
            f"{PREFIX}.weight_shape": st("I64", [n, k])}


# --- config.json / hf_quant_config.json (fuzz_quantization_config) ----------------------------

@pytest.mark.parametrize("name", ["config.json", "hf_quant_config.json"])
@pytest.mark.parametrize("text, was", [
    (b"", "JSONDecodeError"),
    (b'{"quantization_config": {"quant_method": "gptq",', "JSONDecodeError"),
    (b'{"quantization_config": {"quant_method": "\xb5"}}', "UnicodeDecodeError"),
    (b"[" * 100000, "RecursionError"),
])
def test_config_files_that_are_not_json(tmp_path, name, text, was):
    with pytest.raises(qgemm.Error, match=rf"{name} is not JSON"):
        checkpoint.quantization_config(model_dir(tmp_path, config_text=text, name=name))


@pytest.mark.parametrize("name", ["config.json", "hf_quant_config.json"])
@pytest.mark.parametrize("text, kind", [("1", "number"), ("[]", "array"),
                                        ('"quantization_config"', "string"), ("null", "null")])
def test_config_files_that_are_not_objects(tmp_path, name, text, kind):
    # was: TypeError (config.json: `in` on an int, a string indexed by a string) and
    # AttributeError (hf_quant_config.json: .get of a list)
    with pytest.raises(qgemm.Error, match=rf"{name} holds a JSON {kind} \(rule: a JSON object\)"):
        checkpoint.quantization_config(model_dir(tmp_path, config_text=text, name=name))


@pytest.mark.parametrize("value, kind", [([["quant_method", "gptq"]], "array"), (5, "number"),
                                         ("gptq", "string")])
def test_quantization_config_that_is_not_an_object(tmp_path, value, kind):
    # was: dict() of a list of pairs accepted silently; TypeError for the others
    with pytest.raises(qgemm.Error, match=rf"quantization_config is a JSON {kind} \(rule: a "
                                          r"JSON object\)"):
        checkpoint.quantization_config(model_dir(tmp_path, value))


def test_gptq_and_awq_configs_without_their_numbers(tmp_path):
    layer = gptq_layer()
    with pytest.raises(qgemm.Error, match=r"quantization_config has no bits"):  # was: KeyError
        checkpoint.import_linear(layer, PREFIX, {"quant_method": "gptq", "group_size": 32})
    with pytest.raises(qgemm.Error, match=r"quantization_config has no bits"):  # TypeError
        checkpoint.import_linear(layer, PREFIX, {"quant_method": "gptq", "bits": None,
                                                 "group_size": 32})
    with pytest.raises(qgemm.Error, match=r"quantization_config has no group_size"):
        checkpoint.import_linear(layer, PREFIX, {"quant_method": "gptq", "bits": 4})
    # was: TypeError (int(None))
    with pytest.raises(qgemm.Error, match=r"\(AWQ\): the quantization_config has no "
                                          r"q_group_size"):
        checkpoint.import_linear(layer, PREFIX, {"quant_method": "awq", "bits": 4})


@pytest.mark.parametrize("field, value", [
    ("bits", float("inf")),    # JSON 1e400: was OverflowError
    ("bits", "4"),             # was accepted through int()
    ("bits", 4.5),             # was truncated to 4
    ("bits", True),
    ("group_size", 2**70),     # was OverflowError in numpy (arange(k) // group)
    ("group_size", [32]),      # was TypeError
])
@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_gptq_and_awq_numbers_that_are_not_integers(method, field, value):
    config = {"quant_method": method, "bits": 4, "group_size": 32, field: value}
    match = rf"quantization_config {field} is .* \(rule: an integer in \[-2\^31, 2\^31\)\)"
    with pytest.raises(qgemm.Error, match=match):
        checkpoint.import_linear(gptq_layer(), PREFIX, config)


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_gptq_and_awq_layers_without_their_tensors(method):
    # was: KeyError (the layer's tensors indexed directly)
    layer = {k: v for k, v in gptq_layer().items() if not k.endswith("qzeros")}
    with pytest.raises(qgemm.Error, match=rf"m\.proj\.qzeros is missing \(rule: "
                                          rf"{method.upper()} stores qweight, qzeros and scales"):
        checkpoint.import_linear(layer, PREFIX, {"quant_method": method, "bits": 4,
                                                 "group_size": 32})


@pytest.mark.parametrize("pattern", ["re:*", "re:(", "re:[a-"])
@pytest.mark.parametrize("where", ["targets", "ignore"])
def test_compressed_tensors_targets_that_are_not_regular_expressions(pattern, where):
    # was: re.error
    config = ct_config(targets=[pattern] if where == "targets" else ["Linear"],
                       ignore=[pattern] if where == "ignore" else [])
    with pytest.raises(qgemm.Error, match=r"entry '.*' is no regular expression"):
        checkpoint.import_linear(ct_pack_layer(), PREFIX, config)


@pytest.mark.parametrize("change, match", [
    ({"ignore": 5}, r"quantization_config ignore is 5 \(rule: a list of names\)"),  # TypeError
    ({"ignore": [5]}, r"ignore is \[5\] \(rule: a list of names\)"),  # AttributeError
    ({"config_groups": "group_0"}, r"config_groups is 'group_0' \(rule: a JSON object\)"),
    ({"config_groups": {"group_0": 5}}, r"config_groups\.group_0 is 5 \(rule: a JSON object\)"),
    ({"config_groups": {"group_0": {"targets": 7, "weights": {}}}},
     r"config_groups\.group_0\.targets is 7 \(rule: a list of names\)"),
])
def test_compressed_tensors_config_structure(change, match):
    config = {**ct_config(), **change}
    with pytest.raises(qgemm.Error, match=match):
        checkpoint.import_linear(ct_pack_layer(), PREFIX, config)


@pytest.mark.parametrize("weights, input_activations, match", [
    ([4], None, r"the weights of the config_group targeting m\.proj is \[4\] \(rule: a JSON "
                r"object\)"),  # was: AttributeError
    (None, [8], r"input_activations is \[8\] \(rule: a JSON object\)"),  # AttributeError
    ({"num_bits": 4, "type": "int", "group_size": "float"}, None,
     r"group_size is 'float' \(rule: an integer"),  # was: TypeError ('<' of int and str)
    ({"num_bits": 4, "type": "int", "strategy": "group", "group_size": float("inf")}, None,
     r"group_size is inf \(rule: an integer"),  # was: OverflowError
    ({"num_bits": float("inf"), "type": "int", "strategy": "channel"}, None,
     r"num_bits is inf \(rule: an integer"),  # was: OverflowError
    (None, {"num_bits": "x", "type": "int"}, r"num_bits is 'x' \(rule: an integer"),  # ValueError
    (None, {"num_bits": 8, "type": "int", "strategy": "group", "group_size": 1e400},
     r"group_size is inf \(rule: an integer"),  # was: OverflowError
])
def test_compressed_tensors_args_of_the_wrong_type(weights, input_activations, match):
    config = ct_config(weights, input_activations=input_activations)
    with pytest.raises(qgemm.Error, match=match):
        checkpoint.import_linear(ct_pack_layer(), PREFIX, config)


def test_compressed_tensors_naive_and_nvfp4_numbers():
    weight = {f"{PREFIX}.weight": st("I8", np.zeros((16, 64))),
              f"{PREFIX}.weight_scale": st("F32", np.full((16, 1), 0.01))}
    with pytest.raises(qgemm.Error, match=r"num_bits is inf \(rule"):  # was: OverflowError
        checkpoint.import_linear(weight, PREFIX, ct_config(
            {"num_bits": float("inf"), "type": "int", "strategy": "channel"},
            fmt="int-quantized"))
    nvfp4 = {f"{PREFIX}.weight_packed": st("U8", np.zeros((16, 32))),
             f"{PREFIX}.weight_scale": st("F8_E4M3", np.full((16, 4), 0x38)),
             f"{PREFIX}.weight_global_scale": st("F32", [1.0])}
    with pytest.raises(qgemm.Error, match=r"group_size is 'float' \(rule"):  # was: ValueError
        checkpoint.import_linear(nvfp4, PREFIX, ct_config(
            {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": "float"},
            fmt="nvfp4-pack-quantized"))


@pytest.mark.parametrize("block", [[0, 128], [128, 0], "0x128", "axb", [1.5, 2], [2**40, 1],
                                   [True, 1]])
def test_compressed_tensors_block_structures(block):
    # was: ZeroDivisionError ([0, 128]), ValueError ("axb"), a truncated 1.5
    weight = {f"{PREFIX}.weight": st("F8_E4M3", np.zeros((16, 64))),
              f"{PREFIX}.weight_scale": st("F32", [[0.01]])}
    with pytest.raises(qgemm.Error, match=r"block_structure \[rows, cols\] of two positive "
                                          r"integers below 2\^31"):
        checkpoint.import_linear(weight, PREFIX, ct_config(
            {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": block},
            fmt="float-quantized"))


def test_block_shapes_take_integral_floats_as_every_config_number_does():
    # One rule for config integers (checkpoint._is_config_int): 128.0 is 128 in a block shape as
    # in a group_size; 128.5 is refused above and below.
    weight = {f"{PREFIX}.weight": st("F8_E4M3", np.full((16, 64), 0x38)),
              f"{PREFIX}.weight_scale": st("F32", [[0.01]])}
    imported = checkpoint.import_linear(weight, PREFIX, ct_config(
        {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128.0, 128.0]},
        fmt="float-quantized"))
    layer = {f"{PREFIX}.weight": st("F8_E4M3", np.full((16, 64), 0x38)),
             f"{PREFIX}.weight_scale_inv": st("F32", [[0.01]])}
    fp8 = checkpoint.import_linear(layer, PREFIX, {"quant_method": "fp8",
                                                   "weight_block_size": [128.0, 128.0]})
    for linear in (imported, fp8):
        assert "b128x128" in str(linear.scheme), linear.scheme


@pytest.mark.parametrize("block", [5, "ab", ["a", "b"], [0, 128], [128.5, 128], [2**40, 128],
                                   {"a": 1, "b": 2}])
def test_fp8_weight_block_sizes(block):
    # was: TypeError (len of an int), ValueError (int("a")), or a truncated 128.5
    layer = {f"{PREFIX}.weight": st("F8_E4M3", np.zeros((16, 64))),
             f"{PREFIX}.weight_scale_inv": st("F32", [[0.01]])}
    with pytest.raises(qgemm.Error, match=r"weight_block_size must be two positive integers"):
        checkpoint.import_linear(layer, PREFIX, {"quant_method": "fp8",
                                                 "weight_block_size": block})


def test_modelopt_group_size_of_the_wrong_type():
    layer = {f"{PREFIX}.weight": st("U8", np.zeros((16, 32))),
             f"{PREFIX}.weight_scale": st("F8_E4M3", np.full((16, 4), 0x38)),
             f"{PREFIX}.weight_scale_2": st("F32", [1.0])}
    with pytest.raises(qgemm.Error, match=r"import_modelopt: quantization_config group_size is "
                                          r"'16' \(rule: an integer"):  # was: accepted by int()
        checkpoint.import_linear(layer, PREFIX, {"quant_method": "modelopt",
                                                 "quant_algo": "NVFP4", "group_size": "16"})
    with pytest.raises(qgemm.Error, match=r"group_size is 'x' \(rule"):  # was: ValueError
        checkpoint.import_linear(layer, PREFIX, {"quant_method": "modelopt",
                                                 "quant_algo": "NVFP4", "group_size": "x"})


# --- .safetensors headers (fuzz_safetensors_header) ------------------------------------------

def test_header_length_past_the_end_of_the_file(tmp_path):
    # was: MemoryError / OverflowError (f.read of the declared length)
    for length in (2**63, 2**40, 100):
        path = tmp_path / f"{length}.safetensors"
        path.write_bytes(struct.pack("<Q", length) + b"{}")
        with pytest.raises(qgemm.Error, match=r"header length \d+ runs past the end of the "
                                              r"file \(rule: 8 \+ header length <= the file's "
                                              r"10 bytes\)"):
            qt.SafetensorsFile(str(path))


@pytest.mark.parametrize("header, match", [
    ("true", r"the safetensors header is a JSON bool \(rule: an object"),  # AttributeError
    ("[1, 2]", r"the safetensors header is a JSON list"),  # was: TypeError (list.pop)
    ("[" * 50000, r"the safetensors header is not JSON \(RecursionError"),
    (b'{"\xff": 1}', r"the safetensors header is not JSON \(UnicodeDecodeError"),
])
def test_headers_that_are_not_objects(tmp_path, header, match):
    with pytest.raises(qgemm.Error, match=match):
        qt.SafetensorsFile(raw_safetensors(tmp_path / "a.safetensors", header))


ENTRY = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("entry, match", [
    ("F32", r"tensor 't' is a JSON str \(rule: an object"),  # was: TypeError
    ({"shape": [2], "data_offsets": [0, 8]}, r"tensor 't' has no dtype"),  # was: KeyError
    ({"dtype": "F32", "data_offsets": [0, 8]}, r"has no shape"),  # was: KeyError
    ({"dtype": "F32", "shape": [2]}, r"has no data_offsets"),  # was: KeyError
    ({**ENTRY, "dtype": ["F32"]}, r"has dtype \['F32'\] \(rule: a dtype name"),  # TypeError
    ({**ENTRY, "shape": ["I"]}, r"has shape \['I'\] \(rule: a list of at most 32 non-negative "
                                r"integers\)"),  # was: ValueError (int('I'))
    ({**ENTRY, "shape": [{"a": 1}]}, r"has shape"),  # was: TypeError
    ({**ENTRY, "shape": [2.0]}, r"has shape \[2\.0\]"),  # was: TypeError in reshape
    ({**ENTRY, "shape": [-1, -2]}, r"has shape \[-1, -2\]"),  # was: a negative count
    ({**ENTRY, "shape": 2}, r"has shape 2 \("),  # was: TypeError
    ({**ENTRY, "shape": [1] * 33}, r"has shape \[1, 1,"),  # was: ValueError (numpy's 32/64)
    ({**ENTRY, "shape": [2**70]}, r"holds 8 bytes; its shape \[1180591620717411303424\] of "
                                  r"F32 needs 4722366482869645213696"),  # was: OverflowError
    ({**ENTRY, "data_offsets": [0, 4, 8]}, r"has data_offsets \[0, 4, 8\] \(rule: \[begin, "
                                           r"end\], 0 <= begin <= end <= 8"),  # ValueError
    ({**ENTRY, "data_offsets": ["0", "8"]}, r"has data_offsets \['0', '8'\]"),  # TypeError
    ({**ENTRY, "data_offsets": [8, 0]}, r"has data_offsets \[8, 0\]"),
    ({**ENTRY, "data_offsets": [0, 16]}, r"has data_offsets \[0, 16\]"),  # was: ValueError
    ({**ENTRY, "data_offsets": [-8, 0]}, r"has data_offsets \[-8, 0\]"),
])
def test_header_entries_that_break_the_format(tmp_path, entry, match):
    header = json.dumps({"t": entry})
    path = raw_safetensors(tmp_path / "a.safetensors", header, b"\0" * 8)
    with pytest.raises(qgemm.Error, match=match):
        qt.read_safetensors(path)


def test_shape_whose_count_overflows_int64(tmp_path):
    # was: np.prod wrapped to 0, then a ValueError from reshape
    header = json.dumps({"t": {"dtype": "U8", "shape": [2**32, 2**32], "data_offsets": [0, 0]}})
    with pytest.raises(qgemm.Error, match=r"tensor t holds 0 bytes; its shape \[4294967296, "
                                          r"4294967296\] of U8 needs 18446744073709551616"):
        qt.read_safetensors(raw_safetensors(tmp_path / "a.safetensors", header))


def test_header_entries_are_checked_when_the_file_is_opened(tmp_path):
    good = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    path = raw_safetensors(tmp_path / "a.safetensors", json.dumps(
        {"__metadata__": {"format": "pt"}, "good": good, "bad": {**good, "shape": "x"}}),
        b"\0" * 8)
    with pytest.raises(qgemm.Error, match=r"tensor 'bad' has shape 'x'"):
        qt.SafetensorsFile(path)
    f = qt.SafetensorsFile(raw_safetensors(tmp_path / "b.safetensors",
                                           json.dumps({"good": good}), b"\0" * 8))
    with pytest.raises(qgemm.Error, match=r"no tensor named 'other'"):  # was: KeyError
        f.get("other")
    assert f.get("good").shape == (2,)


# --- tensors that a checkpoint maps into the importers ----------------------------------------

@pytest.mark.parametrize("shape, match", [
    ([16, -1], r"weight_shape is \[16, -1\] \(rule: n and k positive\)"),  # was: IndexError
    ([0, 2**40], r"weight_shape is \[0, 1099511627776\]"),  # was: ValueError (reshape)
])
def test_compressed_tensors_weight_shape_not_positive(shape, match):
    layer = ct_pack_layer()
    layer[f"{PREFIX}.weight_shape"] = st("I64", shape)
    n, k = shape
    layer[f"{PREFIX}.weight_packed"] = st("I32", np.zeros((n, -(-k * 4 // 32))))
    layer[f"{PREFIX}.weight_scale"] = st("F32", np.zeros((n, 1)))
    with pytest.raises(qgemm.Error, match=match):
        checkpoint.import_linear(layer, PREFIX, ct_config(
            {"num_bits": 4, "type": "int", "strategy": "channel"}))


def test_compressed_tensors_zero_points_that_do_not_reshape():
    # was: ValueError from reshape of a 1-D int32 zero point tensor of the wrong size
    layer = ct_pack_layer()
    layer[f"{PREFIX}.weight_zero_point"] = st("I32", np.zeros(3))
    with pytest.raises(qgemm.Error, match=r"weight_zero_point has shape \[3\]; packed along N "
                                          r"it needs \[ceil\(n · 4 / 32\), groups\] = \[2, 2\]"):
        checkpoint.import_linear(layer, PREFIX, ct_config(
            {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
             "group_size": 32}))


@pytest.mark.parametrize("config, tensors, match", [
    # was: ValueError (reshape of an empty array into [0, -1])
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"},
     {".weight": st("U8", np.zeros((0, 8))), ".weight_scale": st("F8_E4M3", np.zeros((0, 1))),
      ".weight_scale_2": st("F32", [1.0])},
     r"m\.proj\.weight has shape \[0, 8\]; it is \[n, k / 2\] \(two e2m1 codes a byte\), not "
     r"empty"),
])
def test_empty_weights(config, tensors, match):
    layer = {PREFIX + suffix: t for suffix, t in tensors.items()}
    with pytest.raises(qgemm.Error, match=match):
        checkpoint.import_linear(layer, PREFIX, config)


@pytest.mark.parametrize("qweight, group, match", [
    (np.zeros(16), 32, r"import_gptq: qweight \[16\], .* \(rule: matrices"),  # was: ValueError
    (np.zeros((0, 16)), -1, r"import_gptq: qweight \[0, 16\]"),  # was: ZeroDivisionError
])
def test_gptq_weights_that_are_no_matrices(qweight, group, match):
    layer = gptq_layer()
    layer[f"{PREFIX}.qweight"] = st("I32", qweight)
    with pytest.raises(qgemm.Error, match=match):
        checkpoint.import_linear(layer, PREFIX, {"quant_method": "gptq", "bits": 4,
                                                 "group_size": group})


def test_awq_weights_that_are_no_matrices():
    layer = gptq_layer()
    layer[f"{PREFIX}.qweight"] = st("I32", np.zeros(16))
    with pytest.raises(qgemm.Error, match=r"import_awq: qweight \[16\]"):  # was: AxisError
        checkpoint.import_linear(layer, PREFIX, {"quant_method": "awq", "group_size": 32})


# --- the fuzz targets' seeds: valid layers that import -----------------------------------------

def test_fuzz_seeds_import():
    """The seeds of the fuzz targets (tests/fuzz/python/samples.py) are valid checkpoints of
    each format: every layer imports with its config, so that mutations start from there."""
    if not os.path.isdir(FUZZ_DIR):
        pytest.skip("tests/fuzz/python is not beside the package's tests")
    sys.path.insert(0, FUZZ_DIR)
    try:
        import samples
    finally:
        sys.path.remove(FUZZ_DIR)
    layers = samples.layers()
    for name, (config, names) in samples.configs().items():
        for layer_name in names:
            prefix, tensors, expert = layers[layer_name]
            layer = checkpoint.import_linear(tensors, prefix, config, "bf16", expert=expert)
            assert layer.weight.n > 0 and layer.weight.k > 0, name
            assert prefix in checkpoint.quantized_prefixes(tensors, config) or \
                checkpoint.quantized_experts(tensors, config), name
