"""Checkpoint importers of the formats beyond GPTQ/AWQ, on files in each format.

Each test writes a small model directory (a .safetensors file and config.json, or modelopt's
hf_quant_config.json) with random contents, loads a layer through qgemm.checkpoint.load_linear
and compares qgemm.dequantize_weight of the imported weight with the source values computed
here, in numpy, from the raw tensors (never from the importer). The layouts:

  compressed-tensors  written by the real producing tool (compressed-tensors' ModelCompressor,
      pack-quantized / float-quantized) where the package is installed, and independently from
      its documented layout: compressors/pack_quantized/helpers.py (pack_to_int32: element i of
      a row at bit i · num_bits of the row's int32 stream, value + 2^(bits − 1); zero points
      packed the same way along N, packed_dim=0) and quantization/lifecycle/forward.py
      (w = (q − z) · s), in github.com/vllm-project/compressed-tensors.
  modelopt NVFP4      github.com/NVIDIA/TensorRT-Model-Optimizer modelopt/torch/export
      (weight uint8 [n, k/2], two e2m1 codes a byte, the low nibble first; weight_scale e4m3
      [n, k/16]; weight_scale_2 fp32: w = e2m1 · weight_scale · weight_scale_2), as
      compressed-tensors' entrypoints/convert/converters/modelopt_nvfp4.py reads it (weight ->
      weight_packed as is, weight_global_scale = 1 / weight_scale_2); checked against that
      converter and compressed-tensors' NVFP4 decompressor where installed.
  gpt-oss MXFP4       transformers integrations/mxfp4.py (_convert_moe_packed_tensors: the low
      nibble is the even element, FP4_VALUES, ldexp by scale − 127) and
      models/gpt_oss/modeling_gpt_oss.py (gate = gate_up[..., ::2], up = gate_up[..., 1::2]);
      checked against convert_moe_packed_tensors where transformers is installed.
  FP8 block           DeepSeek-V3 (weight e4m3 [n, k], weight_scale_inv fp32
      [ceil(n/128), ceil(k/128)] multiplying its block), as transformers
      integrations/finegrained_fp8.py dequantizes it (_dequantize_fp8_weight); checked against it.
  BitNet              transformers integrations/bitnet.py (pack_weights: uint8
      [ceil(n/4), k], row block i in bits 2i, value + 1; BitLinear divides by weight_scale,
      AutoBitLinear multiplies); packed with its pack_weights where transformers is installed.
"""

import json
import struct

import numpy as np
import pytest

import qgemm
from qgemm import checkpoint

# --- writers and decoders, independent of qgemm -----------------------------------------------


def write_safetensors(path, tensors):
    """A .safetensors file from {name: (dtype name, numpy array of its raw storage)}."""
    header, chunks, offset = {}, [], 0
    for name, (dtype, array) in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(np.shape(array)),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def write_model(directory, tensors, quantization_config, config_name="config.json"):
    write_safetensors(directory / "model.safetensors", tensors)
    content = {"quantization_config": quantization_config} if config_name == "config.json" \
        else quantization_config
    (directory / config_name).write_text(json.dumps(content))
    return str(directory)


def e4m3fn(codes):
    """float8_e4m3fn values of uint8 codes (bias 7, no infinities, S.1111.111 NaN)."""
    codes = np.asarray(codes, np.int64)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    e, m = (codes >> 3) & 15, codes & 7
    value = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))
    return np.where((codes & 0x7F) == 0x7F, np.nan, sign * value)


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def random_bf16(rng, shape, low, high):
    """Random bf16 values in [low, high): (raw uint16, float64 values)."""
    f = rng.uniform(low, high, size=shape).astype(np.float32)
    raw = (f.view(np.uint32) >> 16).astype(np.uint16)
    return raw, (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def random_scales(rng, shape, dtype):
    """(safetensors dtype, raw storage, float64 values) of random positive scales."""
    if dtype == "BF16":
        raw, values = random_bf16(rng, shape, 1e-3, 2e-2)
        return dtype, raw, values
    np_type = {"F16": np.float16, "F32": np.float32}[dtype]
    raw = rng.uniform(1e-3, 2e-2, size=shape).astype(np_type)
    return dtype, raw, raw.astype(np.float64)


def random_e4m3_codes(rng, shape, positive=False):
    """e4m3fn codes of finite values (no NaN), positive or of either sign."""
    magnitude = rng.integers(0, 0x7F, size=shape)  # 0x7F is NaN
    sign = 0 if positive else rng.integers(0, 2, size=shape) << 7
    return (magnitude | sign).astype(np.uint8)


def pack_dense_int32(codes, bits):
    """compressed-tensors' pack_to_int32 layout (one row at a time, with Python integers):
    element j of a row in bits [j · bits, (j + 1) · bits) of the row's stream of int32 words."""
    rows, cols = codes.shape
    words = -(-cols * bits // 32)
    out = np.zeros((rows, words), np.uint32)
    for r in range(rows):
        stream = 0
        for j, code in enumerate(codes[r]):
            stream |= int(code) << (j * bits)
        for w in range(words):
            out[r, w] = (stream >> (32 * w)) & 0xFFFFFFFF
    return out.view(np.int32)


def dequantized(layer):
    return qgemm.dequantize_weight(layer.weight)


# --- compressed-tensors pack-quantized, from the documented layout ----------------------------

CT_LAYOUT_CASES = [
    # bits, symmetric, strategy, scale dtype, n, k, group
    (4, True, "group", "BF16", 20, 96, 32),
    (4, False, "group", "F16", 20, 80, 32),    # a partial last group (80 = 2.5 groups)
    (4, False, "channel", "F32", 21, 77, None),  # odd n and k: partial words and bytes
    (8, True, "channel", "BF16", 12, 45, None),
    (8, False, "group", "F32", 9, 64, 16),
    (2, False, "group", "BF16", 17, 64, 32),
    (4, True, "tensor", "F32", 8, 40, None),
]


def ct_config(bits, symmetric, strategy, group, fmt="pack-quantized", kind="int",
              input_activations=None, targets=("Linear",), ignore=()):
    weights = {"num_bits": bits, "type": kind, "symmetric": symmetric, "strategy": strategy,
               "group_size": group, "dynamic": False}
    return {"quant_method": "compressed-tensors", "format": fmt, "ignore": list(ignore),
            "config_groups": {"group_0": {"targets": list(targets), "weights": weights,
                                          "input_activations": input_activations,
                                          "format": fmt}}}


def ct_pack_tensors(rng, prefix, bits, symmetric, strategy, scale_dtype, n, k, group):
    """A pack-quantized layer: the stored tensors and w = (q − z) · s (q, z signed)."""
    rows, cols = {"group": (n, -(-k // (group or 1))), "channel": (n, 1),
                  "tensor": (1, 1)}[strategy]
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1))
    q = rng.integers(lo, hi, size=(n, k))
    z = np.zeros((rows, cols), np.int64) if symmetric else rng.integers(lo, hi, size=(rows, cols))
    dtype, raw, s = random_scales(rng, (rows, cols), scale_dtype)
    column_cell = np.arange(k) // group if strategy == "group" else np.zeros(k, np.int64)
    row_cell = np.arange(n) if rows == n else np.zeros(n, np.int64)
    cell_s = s[row_cell][:, column_cell]
    cell_z = z[row_cell][:, column_cell]
    tensors = {
        f"{prefix}.weight_packed": ("I32", pack_dense_int32(q - lo, bits)),
        f"{prefix}.weight_scale": (dtype, raw),
        f"{prefix}.weight_shape": ("I64", np.array([n, k], np.int64)),
    }
    if not symmetric:
        tensors[f"{prefix}.weight_zero_point"] = (
            ("I32", np.ascontiguousarray(pack_dense_int32((z - lo).T, bits).T))
            if strategy != "tensor" else ("I8", z.astype(np.int8).reshape(1)))
    return tensors, (q - cell_z) * cell_s


@pytest.mark.parametrize("bits, symmetric, strategy, scale_dtype, n, k, group", CT_LAYOUT_CASES)
def test_compressed_tensors_pack_quantized_layout(rng, tmp_path, bits, symmetric, strategy,
                                                  scale_dtype, n, k, group):
    prefix = "model.layers.0.mlp.down_proj"
    tensors, w = ct_pack_tensors(rng, prefix, bits, symmetric, strategy, scale_dtype, n, k,
                                 group)
    path = write_model(tmp_path, tensors, ct_config(bits, symmetric, strategy, group))
    layer = checkpoint.load_linear(path, prefix, "bf16")
    assert (layer.weight.n, layer.weight.k) == (n, k)
    assert layer.scheme.weight_format == f"uint{bits}"
    assert layer.scheme.zero_point == ("mid" if symmetric else "int")
    assert layer.scheme.scale_format == {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}[
        scale_dtype]
    assert np.array_equal(dequantized(layer), w)


def test_compressed_tensors_act_order_g_idx(rng, tmp_path):
    """actorder "group" checkpoints (compressed-tensors before 2026) store weight_g_idx: K is
    permuted once so that each group is contiguous, the layer permutes its inputs alike."""
    prefix, n, k, group = "proj", 16, 96, 32
    tensors, _ = ct_pack_tensors(rng, prefix, 4, False, "group", "BF16", n, k, group)
    g_idx = (np.arange(k) // group)[rng.permutation(k)]
    # Re-derive the source weight with g_idx's groups: w[n, k] = (q − z[g]) · s[g].
    q = np.zeros((n, k), np.int64)
    words = tensors[f"{prefix}.weight_packed"][1].view(np.uint32)
    for j in range(k):
        q[:, j] = ((words[:, j // 8] >> np.uint32(4 * (j % 8))) & 15).astype(np.int64) - 8
    zp_words = tensors[f"{prefix}.weight_zero_point"][1].view(np.uint32)
    z = np.stack([((zp_words[r // 8] >> np.uint32(4 * (r % 8))) & 15).astype(np.int64) - 8
                  for r in range(n)])
    raw = tensors[f"{prefix}.weight_scale"][1]
    s = (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    w = (q - z[:, g_idx]) * s[:, g_idx]
    tensors[f"{prefix}.weight_g_idx"] = ("I32", g_idx.astype(np.int32))
    layer = checkpoint.load_linear(write_model(tmp_path, tensors,
                                               ct_config(4, False, "group", group)), prefix)
    assert layer.input_permutation is not None
    assert np.array_equal(dequantized(layer), w[:, layer.input_permutation])
    # The layer's product is x · wᵀ with x in the checkpoint's own column order.
    x = rng.standard_normal((3, k)).astype(np.float32)
    expected = x.astype(np.float64) @ w.T
    assert np.allclose(layer.reference(x), expected, rtol=2e-2, atol=2e-2 * np.abs(expected).max())


def test_compressed_tensors_int_and_float_quantized_layouts(rng, tmp_path):
    """int-quantized (int8 weights as is, W8A8) and float-quantized (e4m3 weights; per channel,
    per tensor, 2-D blocks with partial edge blocks)."""
    n, k = 200, 300
    q = rng.integers(-128, 128, size=(n, k))
    dtype, raw, s = random_scales(rng, (n, 1), "BF16")
    act = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    path = write_model(tmp_path, {"a.weight": ("I8", q.astype(np.int8)),
                                  "a.weight_scale": (dtype, raw)},
                       ct_config(8, True, "channel", None, "int-quantized", "int", act))
    layer = checkpoint.load_linear(path, "a", "bf16")
    assert str(layer.scheme) == "w=uint8:ch:s=bf16:zp=mid;a=int8:tok:s=fp32;o=bf16"
    assert np.array_equal(dequantized(layer), q * s)

    codes = random_e4m3_codes(rng, (n, k))
    fp8_act = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group",
               "group_size": 128, "dynamic": True}
    for strategy, grid, extra, per in (("channel", (n, 1), {}, (1, k)),
                                       ("tensor", (1, 1), {}, (n, k)),
                                       ("block", (2, 3), {"block_structure": [128, 128]},
                                        (128, 128))):
        directory = tmp_path / strategy
        directory.mkdir()
        _, raw, s = random_scales(rng, grid, "F32")
        config = ct_config(8, True, strategy, None, "float-quantized", "float", fp8_act)
        config["config_groups"]["group_0"]["weights"].update(extra)
        layer = checkpoint.load_linear(write_model(directory, {
            "b.weight": ("F8_E4M3", codes), "b.weight_scale": ("F32", raw)}, config), "b")
        rows, cols = np.arange(n) // per[0], np.arange(k) // per[1]
        assert layer.scheme.weight_format == "e4m3"
        assert layer.scheme.activation_format == "e4m3"
        assert np.array_equal(dequantized(layer), e4m3fn(codes) * s[rows][:, cols])


# --- compressed-tensors, written by compressed-tensors itself -----------------------------------

CT_TOOL_CASES = [
    # name, weight args, model dtype, n, k
    ("w4a16-sym-g32", dict(num_bits=4, symmetric=True, strategy="group", group_size=32),
     "bfloat16", 20, 96),
    ("w4a16-asym-g32", dict(num_bits=4, symmetric=False, strategy="group", group_size=32),
     "bfloat16", 20, 96),
    ("w4-asym-channel-odd", dict(num_bits=4, symmetric=False, strategy="channel"),
     "float16", 21, 77),
    ("w8a16-sym-channel", dict(num_bits=8, symmetric=True, strategy="channel"),
     "float16", 24, 64),
    ("w8-asym-group", dict(num_bits=8, symmetric=False, strategy="group", group_size=16),
     "bfloat16", 9, 64),
    ("fp8-channel", dict(num_bits=8, type="float", symmetric=True, strategy="channel"),
     "bfloat16", 24, 64),
    ("fp8-tensor", dict(num_bits=8, type="float", symmetric=True, strategy="tensor"),
     "bfloat16", 24, 64),
    ("fp8-block-partial", dict(num_bits=8, type="float", symmetric=True, strategy="block",
                               block_structure=[128, 128]), "bfloat16", 200, 300),
]


def ct_calibrate(module, args, n, k):
    """Min/max scales and zero points for the module's weight through compressed-tensors'
    calculate_qparams (what its observers feed it)."""
    import torch
    from compressed_tensors.quantization.utils import calculate_qparams

    w = module.weight.detach().float()
    strategy = args.strategy
    if strategy == "group":
        cells = w.reshape(n, k // args.group_size, args.group_size)
        lo, hi = cells.amin(-1), cells.amax(-1)
    elif strategy == "channel":
        lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    elif strategy == "tensor":
        lo, hi = w.min().reshape(1), w.max().reshape(1)
    else:  # block: pad to whole blocks with zeros
        bn, bk = args.block_structure
        rows, cols = -(-n // bn), -(-k // bk)
        padded = torch.zeros(rows * bn, cols * bk)
        padded[:n, :k] = w
        cells = padded.reshape(rows, bn, cols, bk).transpose(1, 2)
        lo, hi = cells.amin((-1, -2)), cells.amax((-1, -2))
    scale, zero = calculate_qparams(lo, hi, args)
    module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
    if hasattr(module, "weight_zero_point"):
        module.weight_zero_point.data.copy_(zero.reshape(module.weight_zero_point.shape))


@pytest.mark.parametrize("name, weight_args, dtype, n, k", CT_TOOL_CASES,
                         ids=[c[0] for c in CT_TOOL_CASES])
def test_compressed_tensors_checkpoints_from_compressed_tensors(rng, tmp_path, name, weight_args,
                                                                dtype, n, k):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("compressed_tensors", reason="compressed-tensors is not installed")
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig,
                                                 QuantizationScheme, apply_quantization_config)
    from safetensors.torch import load_file, save_file

    torch.manual_seed(int(rng.integers(2**31)))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(k, n, bias=False, dtype=getattr(torch, dtype))
            self.head = torch.nn.Linear(n, 4, bias=False, dtype=getattr(torch, dtype))

    model = Model()
    args = QuantizationArgs(**weight_args)
    inputs = QuantizationArgs(num_bits=8, type="float", strategy="token", dynamic=True) \
        if args.type == "float" else None
    scheme = QuantizationScheme(targets=["Linear"], weights=args, input_activations=inputs)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme},
                                                        ignore=["head"]))
    ct_calibrate(model.proj, args, n, k)
    fmt = "float-quantized" if args.type == "float" else "pack-quantized"
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
    compressor.compress_model(model)
    save_file({key: v.contiguous() for key, v in model.state_dict().items()},
              str(tmp_path / "model.safetensors"))
    compressor.update_config(str(tmp_path))

    layer = checkpoint.load_linear(str(tmp_path), "proj",
                                   "bf16" if dtype == "bfloat16" else "fp16")
    got = dequantized(layer)
    # The source values, from the file's raw tensors.
    stored = load_file(str(tmp_path / "model.safetensors"))
    scale = stored["proj.weight_scale"].double().numpy()
    if args.type == "float":
        q = e4m3fn(stored["proj.weight"].view(torch.uint8).numpy())
        zero = np.zeros_like(scale)
    else:
        bits, words = args.num_bits, stored["proj.weight_packed"].numpy().view(np.uint32)
        per = 32 // bits
        q = np.stack([(words[:, j // per] >> np.uint32(bits * (j % per))) & ((1 << bits) - 1)
                      for j in range(k)], axis=1).astype(np.int64) - (1 << (bits - 1))
        if args.symmetric:
            zero = np.zeros_like(scale)
        else:
            zw = stored["proj.weight_zero_point"].numpy().view(np.uint32)
            zero = np.stack([(zw[r // per] >> np.uint32(bits * (r % per))) & ((1 << bits) - 1)
                             for r in range(n)]).astype(np.int64) - (1 << (bits - 1))
    if args.strategy == "block":
        bn, bk = args.block_structure
        scale = scale[np.arange(n) // bn][:, np.arange(k) // bk]
        zero = np.zeros_like(scale)
    elif args.strategy == "group":
        scale = np.repeat(scale, args.group_size, axis=1)
        zero = np.repeat(zero, args.group_size, axis=1)
    scale = np.broadcast_to(scale.reshape(-1, scale.shape[-1]) if scale.ndim > 1 else scale,
                            (n, k)) if args.strategy != "tensor" else np.full((n, k), scale.item())
    expected = (q - np.broadcast_to(zero, (n, k))) * scale
    assert np.array_equal(got, expected)
    # And compressed-tensors' own decompression, in float32 (exact for these products).
    from compressed_tensors.compressors import BaseCompressor

    state = {key.split(".", 1)[1]: v for key, v in stored.items() if key.startswith("proj.")}
    state["weight_scale"] = state["weight_scale"].float()
    decompressor = BaseCompressor.get_value_from_registry(fmt)
    theirs = decompressor.decompress(state, model.proj.quantization_scheme)["weight"]
    assert np.array_equal(got, theirs.double().numpy())
    # The head is in the ignore list: stored as it was, no quantized layer.
    with pytest.raises(qgemm.Error, match="ignore list"):
        checkpoint.load_linear(str(tmp_path), "head")


# --- modelopt NVFP4 ---------------------------------------------------------------------------


def nvfp4_tensors(rng, prefix, n, k, weight_scale_2=None):
    """A modelopt NVFP4 layer: the stored tensors and w = e2m1 · e4m3 scale · weight_scale_2."""
    codes = rng.integers(0, 16, size=(n, k))
    scales = random_e4m3_codes(rng, (n, -(-k // 16)), positive=True)
    g = np.float32(weight_scale_2 if weight_scale_2 is not None else rng.uniform(1e-4, 1e-2))
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    tensors = {
        f"{prefix}.weight": ("U8", packed),
        f"{prefix}.weight_scale": ("F8_E4M3", scales),
        f"{prefix}.weight_scale_2": ("F32", np.array(g, np.float32)),
        f"{prefix}.input_scale": ("F32", np.array(0.25, np.float32)),
    }
    w = E2M1[codes] * e4m3fn(scales)[:, np.arange(k) // 16] * np.float64(g)
    return tensors, w


MODELOPT_NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                  "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}


@pytest.mark.parametrize("check", ["layout", "vs-compressed-tensors"])
@pytest.mark.parametrize("config_name", ["config.json", "hf_quant_config.json"])
@pytest.mark.parametrize("n, k", [(32, 64), (7, 48), (5, 40)])  # 40: a partial last block
def test_modelopt_nvfp4(rng, tmp_path, config_name, n, k, check):
    prefix = "model.layers.0.self_attn.o_proj"
    tensors, w = nvfp4_tensors(rng, prefix, n, k)
    config = MODELOPT_NVFP4 if config_name == "config.json" else {
        "producer": {"name": "modelopt", "version": "0.0"},
        "quantization": {k_: v for k_, v in MODELOPT_NVFP4.items() if k_ != "quant_method"}}
    path = write_model(tmp_path, tensors, config, config_name)
    layer = checkpoint.load_linear(path, prefix, "bf16")
    assert str(layer.scheme) == str(qgemm.Scheme("nvfp4"))
    assert layer.input_scale == 0.25
    assert np.array_equal(dequantized(layer), w)
    weight_only = checkpoint.load_linear(path, prefix, "bf16", quantize_activations=False)
    assert str(weight_only.scheme) == str(qgemm.Scheme("nvfp4-a16"))

    if check == "layout":
        return
    if k % 16:
        pytest.skip("compressed-tensors' NVFP4 decompressor needs whole blocks of 16")
    # compressed-tensors' converter of this very layout, then its NVFP4 decompressor (bf16).
    torch = pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("compressed_tensors", reason="compressed-tensors is not installed")
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import (
        ModelOptNvfp4Converter)
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import NVFP4
    from safetensors.torch import load_file

    converted = ModelOptNvfp4Converter(targets=["re:.*o_proj$"]).process(
        load_file(str(tmp_path / "model.safetensors")))
    state = {key.rsplit(".", 1)[1]: v for key, v in converted.items()}
    theirs = NVFP4PackedCompressor.decompress(
        state, QuantizationScheme(targets=["Linear"], **NVFP4))["weight"].double().numpy()
    # theirs: the scale divided by 1 / weight_scale_2, rounded to bf16.
    assert np.allclose(theirs, w, rtol=2**-7, atol=0)


def test_compressed_tensors_nvfp4_pack_quantized(rng, tmp_path):
    """compressed-tensors' own NVFP4 names: weight_packed, weight_global_scale (= 1 /
    modelopt's weight_scale_2: w = e2m1 · s / g); qgemm multiplies by the reciprocal in fp32."""
    n, k, g = 16, 64, np.float32(rng.uniform(100, 1000))
    tensors, w = nvfp4_tensors(rng, "p", n, k, weight_scale_2=1.0)
    tensors = {"p.weight_packed": tensors["p.weight"], "p.weight_scale": tensors["p.weight_scale"],
               "p.weight_global_scale": ("F32", np.array([g], np.float32))}
    config = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
              "config_groups": {"group_0": {
                  "targets": ["Linear"], "format": "nvfp4-pack-quantized",
                  "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                              "group_size": 16, "symmetric": True},
                  "input_activations": {"num_bits": 4, "type": "float", "group_size": 16,
                                        "strategy": "tensor_group", "dynamic": "local"}}}}
    layer = checkpoint.load_linear(write_model(tmp_path, tensors, config), "p", "bf16")
    assert str(layer.scheme) == str(qgemm.Scheme("nvfp4"))
    assert np.allclose(dequantized(layer), w / np.float64(g), rtol=2**-24, atol=0)


def test_nvfp4_fused_shards_with_different_global_scales(rng, tmp_path):
    """q, k, v shards fused along N: exact when they share weight_scale_2 (modelopt's export
    gives fused shards one); otherwise an error unless rescale_global, which rescales the
    block scales to the largest global scale within ue4m3's rounding."""
    k = 64
    shards, sources = [], []
    for i, n in enumerate((32, 16, 16)):
        directory = tmp_path / str(i)
        directory.mkdir()
        tensors, w = nvfp4_tensors(rng, "p", n, k, weight_scale_2=[1e-3, 1e-3, 1e-3][i])
        shards.append(checkpoint.load_linear(write_model(directory, tensors, MODELOPT_NVFP4),
                                             "p", "bf16"))
        sources.append(w)
    fused = checkpoint.concat_rows(shards)
    assert (fused.weight.n, fused.weight.k) == (64, k)
    assert np.array_equal(dequantized(fused), np.concatenate(sources))

    directory = tmp_path / "other"
    directory.mkdir()
    tensors, w = nvfp4_tensors(rng, "p", 16, k, weight_scale_2=3e-3)
    other = checkpoint.load_linear(write_model(directory, tensors, MODELOPT_NVFP4), "p", "bf16")
    with pytest.raises(qgemm.Error, match="global scales differ"):
        checkpoint.concat_rows([shards[0], other])
    rescaled = checkpoint.concat_rows([shards[0], other], rescale_global=True)
    assert rescaled.weight.global_scale == other.weight.global_scale  # the larger one
    got, expected = dequantized(rescaled), np.concatenate([sources[0], w])
    assert np.array_equal(got[32:], w)  # the shard that had the largest scale: unchanged
    # The rescaled shard: each block scale within half a ue4m3 step (1/16 relative for
    # normals, 2^-10 absolute below 2^-6), times the largest global scale.
    step = np.maximum(np.abs(sources[0]) / 16, 2.0**-10 * 6 * other.weight.global_scale)
    assert np.all(np.abs(got[:32] - sources[0]) <= step)


# --- gpt-oss MXFP4 ----------------------------------------------------------------------------


@pytest.mark.parametrize("check", ["layout", "vs-transformers"])
def test_gpt_oss_mxfp4_experts(rng, tmp_path, check):
    experts, n, k = 3, 2 * 12, 64  # gate_up: 2 · intermediate rows, hidden inputs
    name = "model.layers.0.mlp.experts.gate_up_proj"
    blocks = rng.integers(0, 256, size=(experts, n, k // 32, 16)).astype(np.uint8)
    scales = rng.integers(118, 136, size=(experts, n, k // 32)).astype(np.uint8)
    codes = np.empty((experts, n, k), np.int64)  # the even element in the low nibble
    flat = blocks.reshape(experts, n, k // 2)
    codes[..., 0::2], codes[..., 1::2] = flat & 15, flat >> 4
    w = E2M1[codes] * 2.0 ** (np.repeat(scales, 32, axis=-1).astype(np.int64) - 127)
    path = write_model(tmp_path, {f"{name}_blocks": ("U8", blocks),
                                  f"{name}_scales": ("U8", scales),
                                  f"{name}_bias": ("F32", np.zeros((experts, n), np.float32))},
                       {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]})
    for e in range(experts):
        layer = checkpoint.load_linear(path, name, "bf16", expert=e)
        assert str(layer.scheme) == str(qgemm.Scheme("mxfp4-a16"))
        assert np.array_equal(dequantized(layer), w[e])
    gate, up = checkpoint.split_interleaved_gate_up(layer)
    assert np.array_equal(dequantized(gate), w[-1][0::2])
    assert np.array_equal(dequantized(up), w[-1][1::2])
    with pytest.raises(qgemm.Error, match="pass expert="):
        checkpoint.load_linear(path, name)
    with pytest.raises(qgemm.Error, match="expert 3"):
        checkpoint.load_linear(path, name, expert=3)
    # Expert weights are not dense layers (quantized_experts finds whole expert layers).
    assert checkpoint.quantized_prefixes([f"{name}_blocks", f"{name}_scales"],
                                         {"quant_method": "mxfp4"}) == []

    if check == "layout":
        return
    # transformers' own dequantization of these tensors ([E, k, n] after its transpose).
    torch = pytest.importorskip("torch", reason="torch is not installed")
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4",
                                reason="transformers is not installed")
    theirs = mxfp4.convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                              dtype=torch.float32)
    assert np.array_equal(theirs.transpose(1, 2).double().numpy(), w)


def test_gpt_oss_mxfp4_expert_layer(rng):
    """A whole expert layer (hidden 64, intermediate 32, 3 experts): gate_up's interleaved rows
    become gate rows then up rows, its bias alike, down stays as stored; quantized_experts finds
    the layer and names a missing half."""
    experts, hidden, inter = 3, 64, 32
    prefix = "model.layers.1.mlp.experts"

    def stored(n, k):
        blocks = rng.integers(0, 256, size=(experts, n, k // 32, 16)).astype(np.uint8)
        scales = rng.integers(118, 136, size=(experts, n, k // 32)).astype(np.uint8)
        flat = blocks.reshape(experts, n, k // 2).astype(np.int64)
        codes = np.empty((experts, n, k), np.int64)
        codes[..., 0::2], codes[..., 1::2] = flat & 15, flat >> 4
        return blocks, scales, E2M1[codes] * 2.0 ** (np.repeat(scales, 32, -1).astype(np.int64) - 127)

    gu_blocks, gu_scales, gate_up = stored(2 * inter, hidden)
    dn_blocks, dn_scales, down = stored(hidden, inter)
    gu_bias = rng.standard_normal((experts, 2 * inter)).astype(np.float32)
    tensors = {f"{prefix}.gate_up_proj_blocks": gu_blocks, f"{prefix}.gate_up_proj_scales": gu_scales,
               f"{prefix}.gate_up_proj_bias": gu_bias}
    config = {"quant_method": "mxfp4"}
    assert checkpoint.quantized_prefixes(tensors, config) == []
    with pytest.raises(qgemm.Error, match=f"no {prefix}.down_proj_blocks"):
        checkpoint.quantized_experts(tensors, config)
    tensors.update({f"{prefix}.down_proj_blocks": dn_blocks, f"{prefix}.down_proj_scales": dn_scales})
    assert checkpoint.quantized_experts(tensors, config) == [prefix]
    assert checkpoint.quantized_experts(tensors, {"quant_method": "gptq"}) == []
    layer = checkpoint.import_mxfp4_experts(tensors, prefix)
    assert str(layer.scheme) == str(qgemm.Scheme("mxfp4-a16"))
    assert layer.down_bias is None
    for e in range(experts):
        assert np.array_equal(qgemm.dequantize_weight(layer.gate_up[e]),
                              np.concatenate([gate_up[e][0::2], gate_up[e][1::2]]))
        assert np.array_equal(qgemm.dequantize_weight(layer.down[e]), down[e])
    assert np.array_equal(layer.gate_up_bias, np.concatenate([gu_bias[:, 0::2], gu_bias[:, 1::2]], 1))
    # Halves that do not fit each other are named.
    short = dict(tensors)
    short[f"{prefix}.down_proj_blocks"] = dn_blocks[:, :32]
    short[f"{prefix}.down_proj_scales"] = dn_scales[:, :32]
    with pytest.raises(qgemm.Error, match=r"down_proj is \[32, 32\]"):
        checkpoint.import_mxfp4_experts(short, prefix)


# --- FP8 block (DeepSeek-V3) ----------------------------------------------------------------


@pytest.mark.parametrize("n, k, scale_dtype", [(256, 384, "F32"), (200, 300, "F32"),
                                               (130, 129, "F8_E8M0")])
@pytest.mark.parametrize("check", ["layout", "vs-transformers"])
def test_fp8_block_deepseek(rng, tmp_path, n, k, scale_dtype, check):
    codes = random_e4m3_codes(rng, (n, k))
    grid = (-(-n // 128), -(-k // 128))
    if scale_dtype == "F32":
        raw = rng.uniform(1e-4, 1e-2, size=grid).astype(np.float32)
        s = raw.astype(np.float64)
    else:  # scale_fmt ue8m0 (DeepSeek-V3.1 style): powers of two as e8m0 codes
        raw = rng.integers(110, 130, size=grid).astype(np.uint8)
        s = 2.0 ** (raw.astype(np.int64) - 127)
    prefix = "model.layers.0.mlp.gate_proj"
    path = write_model(tmp_path, {f"{prefix}.weight": ("F8_E4M3", codes),
                                  f"{prefix}.weight_scale_inv": (scale_dtype, raw)},
                       {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                        "weight_block_size": [128, 128]})
    layer = checkpoint.load_linear(path, prefix, "bf16")
    if scale_dtype == "F32":
        assert str(layer.scheme) == str(qgemm.Scheme("fp8-block"))
    w = e4m3fn(codes) * s[np.arange(n) // 128][:, np.arange(k) // 128]
    assert np.array_equal(dequantized(layer), w)
    if check == "layout":
        return
    torch = pytest.importorskip("torch", reason="torch is not installed")
    fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8",
                              reason="transformers is not installed")
    if not hasattr(fp8, "_dequantize_fp8_weight"):  # private; transformers < 5.2x lacks it
        pytest.skip("this transformers has no finegrained_fp8._dequantize_fp8_weight")
    scale_t = torch.from_numpy(s.astype(np.float32))
    theirs = fp8._dequantize_fp8_weight(torch.from_numpy(codes).view(torch.float8_e4m3fn),
                                        scale_t, [128, 128], torch.float32)
    # theirs: each product rounded to float32.
    assert np.allclose(theirs.double().numpy(), w, rtol=2**-24, atol=0)


# --- BitNet --------------------------------------------------------------------------------


def pack_bitnet(values):
    """transformers' BitNet layout: uint8 [ceil(n / 4), k], row block i (rows i·r .. i·r + r − 1,
    r = ceil(n / 4)) in bits [2i, 2i + 2) of the byte, stored as value + 1."""
    n, k = values.shape
    r = -(-n // 4)
    packed = np.zeros((r, k), np.uint8)
    for row in range(n):
        packed[row % r] |= ((values[row] + 1).astype(np.uint8) << np.uint8(2 * (row // r)))
    return packed


@pytest.mark.parametrize("linear_class, n", [("bitlinear", 24), ("autobitlinear", 24),
                                             ("bitlinear", 22)])
@pytest.mark.parametrize("check", ["layout", "vs-transformers"])
def test_bitnet(rng, tmp_path, linear_class, n, check):
    k = 40
    values = rng.integers(-1, 2, size=(n, k))
    packed = pack_bitnet(values)
    raw, ws = random_bf16(rng, (1,), 2.0, 10.0)
    prefix = "model.layers.0.mlp.up_proj"
    path = write_model(tmp_path, {f"{prefix}.weight": ("U8", packed),
                                  f"{prefix}.weight_scale": ("BF16", raw)},
                       {"quant_method": "bitnet", "linear_class": linear_class,
                        "quantization_mode": "offline", "modules_to_not_convert": ["lm_head"]})
    if n % 4:
        # The packed rows hold ceil(n / 4) · 4 rows; the layer's n comes from the model.
        layer = checkpoint.import_bitnet(packed, checkpoint.as_stored(
            checkpoint.StoredTensor("BF16", raw)), out_features=n, activation="bf16")
    else:
        layer = checkpoint.load_linear(path, prefix, "bf16")
    assert str(layer.scheme) == str(qgemm.Scheme("bitnet"))
    got = dequantized(layer)
    if linear_class == "bitlinear":  # y = x·Wᵀ / weight_scale: 1 / weight_scale in fp32
        assert np.allclose(got, values / ws[0], rtol=2**-24, atol=0)
    else:  # AutoBitLinear: y = x·Wᵀ · weight_scale, exact
        assert np.array_equal(got, values * ws[0])
    assert set(np.unique(np.sign(got))) <= {-1.0, 0.0, 1.0}
    assert np.array_equal(np.sign(got), values)
    if check == "layout":
        return
    torch = pytest.importorskip("torch", reason="torch is not installed")
    bitnet = pytest.importorskip("transformers.integrations.bitnet",
                                 reason="transformers is not installed")
    # transformers' own packer gives the same bytes.
    assert np.array_equal(bitnet.pack_weights(torch.from_numpy(values.copy())).numpy(), packed)


# --- load_quantized: tiny Llama checkpoints in each format -----------------------------------


def quantize_llama_layer(rng, name, w, fmt):
    """Tensors of one projection (float64 weight w [n, k]) in `fmt`, and its dequantized
    weight. The quantization itself is crude (what matters: the importer reads what is
    written)."""
    n, k = w.shape
    if fmt == "fp8":
        grid = (-(-n // 128), -(-k // 128))
        s = np.full(grid, np.abs(w).max() / 448, np.float32)
        q = np.clip(w / s.max(), -448, 448)
        import torch

        codes = torch.from_numpy(q.astype(np.float32)).to(torch.float8_e4m3fn).view(
            torch.uint8).numpy()
        deq = e4m3fn(codes) * np.float64(s.max())
        return {f"{name}.weight": ("F8_E4M3", codes), f"{name}.weight_scale_inv": ("F32", s)}, deq
    if fmt == "nvfp4":
        g = np.float32(np.abs(w).max() / (6 * 448))
        block = np.abs(w).reshape(n, k // 16, 16).max(-1) / 6 / np.float64(g)
        import torch

        scales = torch.from_numpy(block.astype(np.float32)).to(torch.float8_e4m3fn).view(
            torch.uint8).numpy()
        s = e4m3fn(scales)[:, np.arange(k) // 16] * np.float64(g)
        target = np.where(s > 0, w / np.where(s > 0, s, 1), 0)
        codes = np.abs(E2M1[:8][None, None, :] - np.abs(target)[..., None]).argmin(-1)
        codes = codes | np.where(target < 0, 8, 0)
        packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
        return ({f"{name}.weight": ("U8", packed), f"{name}.weight_scale": ("F8_E4M3", scales),
                 f"{name}.weight_scale_2": ("F32", np.array(g, np.float32)),
                 f"{name}.input_scale": ("F32", np.array(1.0, np.float32))},
                E2M1[codes] * s)
    if fmt == "compressed-tensors":
        group = 32
        cells = w.reshape(n, k // group, group)
        s = (np.abs(cells).max(-1) / 7).astype(np.float16)
        s = np.where(s == 0, np.float16(1e-3), s)
        q = np.clip(np.round(cells / s[..., None].astype(np.float64)), -8, 7).astype(np.int64)
        q = q.reshape(n, k)
        return ({f"{name}.weight_packed": ("I32", pack_dense_int32(q + 8, 4)),
                 f"{name}.weight_scale": ("F16", s),
                 f"{name}.weight_shape": ("I64", np.array([n, k], np.int64))},
                q * np.repeat(s.astype(np.float64), group, axis=1))
    if fmt == "bitnet":
        mean = np.abs(w).mean()
        values = np.clip(np.round(w / mean), -1, 1).astype(np.int64)
        raw = (np.array([1 / mean], np.float32).view(np.uint32) >> 16).astype(np.uint16)
        ws = (raw.astype(np.uint32) << 16).view(np.float32)[0]
        return ({f"{name}.weight": ("U8", pack_bitnet(values)),
                 f"{name}.weight_scale": ("BF16", raw)},
                values * np.float64(np.float32(1 / np.float64(ws))))
    raise AssertionError(fmt)


LOAD_CONFIGS = {
    "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128]},
    "nvfp4": MODELOPT_NVFP4,
    "compressed-tensors": ct_config(4, True, "group", 32, targets=("Linear",),
                                    ignore=("lm_head",)),
    "bitnet": {"quant_method": "bitnet", "linear_class": "bitlinear",
               "quantization_mode": "offline", "modules_to_not_convert": ["lm_head"]},
}


@pytest.mark.parametrize("fmt", sorted(LOAD_CONFIGS))
def test_load_quantized_builds_a_model_in_each_format(rng, tmp_path, fmt):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(int(rng.integers(2**31)))
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    tensors, expected = {}, {}
    for key, value in model.state_dict().items():
        name = key[: -len(".weight")]
        module = model.get_submodule(name) if key.endswith(".weight") else None
        if type(module) is torch.nn.Linear and name != "lm_head":
            written, expected[name] = quantize_llama_layer(
                rng, name, value.double().numpy(), fmt)
            tensors.update(written)
        else:
            raw = value.contiguous().view(torch.int16).numpy().view(np.uint16)
            tensors[key] = ("BF16", raw)
    write_safetensors(tmp_path / "model.safetensors", tensors)
    full = config.to_dict()
    full["quantization_config"] = LOAD_CONFIGS[fmt]
    (tmp_path / "config.json").write_text(json.dumps(full, default=str))

    loaded = qgemm.load_quantized(str(tmp_path))
    for name, w in expected.items():
        layer = loaded.get_submodule(name)
        assert type(layer).__name__ == "QuantLinear", name
        got = qgemm.dequantize_weight(layer.qweight.packed)
        if fmt == "bitnet":
            assert np.allclose(got, w, rtol=2**-24, atol=0)
        else:
            assert np.array_equal(got, w), name
    assert type(loaded.lm_head) is torch.nn.Linear
    ids = torch.from_numpy(rng.integers(0, 128, size=(2, 5)))
    with torch.no_grad():
        logits = loaded(ids).logits
    assert logits.shape == (2, 5, 128) and torch.isfinite(logits).all()


# --- bad inputs ------------------------------------------------------------------------------


def test_bad_inputs_name_the_tensor_and_the_rule(rng, tmp_path):
    prefix = "m.proj"
    tensors, _ = ct_pack_tensors(rng, prefix, 4, False, "group", "BF16", 16, 64, 32)

    def load(tensors, config=None, name=prefix, **kwargs):
        directory = tmp_path / str(len(list(tmp_path.iterdir())))
        directory.mkdir()
        return checkpoint.load_linear(write_model(directory, tensors, config or ct_config(
            4, False, "group", 32)), name, **kwargs)

    missing = {k: v for k, v in tensors.items() if not k.endswith("weight_scale")}
    with pytest.raises(qgemm.Error, match=r"m\.proj\.weight_scale is missing \(rule: "):
        load(missing)
    missing = {k: v for k, v in tensors.items() if not k.endswith("zero_point")}
    with pytest.raises(qgemm.Error, match=r"m\.proj\.weight_zero_point is missing"):
        load(missing)
    wrong = dict(tensors)
    wrong[f"{prefix}.weight_scale"] = ("BF16", np.zeros((16, 3), np.uint16))
    with pytest.raises(qgemm.Error, match=r"m\.proj\.weight_scale has shape \[16, 3\].*needs "
                                          r"\[16, 2\]"):
        load(wrong)
    wrong = dict(tensors)
    wrong[f"{prefix}.weight_shape"] = ("I64", np.array([16, 72], np.int64))
    with pytest.raises(qgemm.Error, match=r"weight_packed has shape \[16, 8\]"):
        load(wrong)
    with pytest.raises(qgemm.Error, match=r"num_bits 3 is not supported for pack-quantized "
                                          r"\(rule: 2, 4 or 8"):
        load(tensors, ct_config(3, False, "group", 32))
    with pytest.raises(qgemm.Error, match="format 'marlin-24' is not supported"):
        load(tensors, ct_config(4, False, "group", 32, fmt="marlin-24"))
    with pytest.raises(qgemm.Error, match="no config_group .* targets m.proj"):
        load(tensors, ct_config(4, False, "group", 32, targets=("re:.*other",)))
    with pytest.raises(qgemm.Error, match="quant_method 'hqq' is not supported"):
        load(tensors, {"quant_method": "hqq"})
    with pytest.raises(qgemm.Error, match="no tensors named nothing"):
        load(tensors, name="nothing")

    nv, _ = nvfp4_tensors(rng, prefix, 16, 32)
    negative = dict(nv)
    negative[f"{prefix}.weight_scale"] = ("F8_E4M3", nv[f"{prefix}.weight_scale"][1] | 0x81)
    with pytest.raises(qgemm.Error, match=r"weight_scale holds negative scales"):
        load(negative, MODELOPT_NVFP4)
    wrong = dict(nv)
    wrong[f"{prefix}.weight_scale"] = ("F32", np.ones((16, 2), np.float32))
    with pytest.raises(qgemm.Error, match=r"m\.proj\.weight_scale is F32; modelopt stores it "
                                          r"as F8_E4M3"):
        load(wrong, MODELOPT_NVFP4)
    with pytest.raises(qgemm.Error, match=r"weight_scale_2 is missing \(rule: modelopt NVFP4"):
        load({k: v for k, v in nv.items() if not k.endswith("_2")}, MODELOPT_NVFP4)
    with pytest.raises(qgemm.Error, match="quant_algo 'W4A8_AWQ' is not supported"):
        load(nv, {**MODELOPT_NVFP4, "quant_algo": "W4A8_AWQ"})
    with pytest.raises(qgemm.Error, match="NVFP4 blocks are 16 values"):
        load(nv, {**MODELOPT_NVFP4, "group_size": 32})

    fp8 = {f"{prefix}.weight": ("F8_E4M3", random_e4m3_codes(rng, (16, 32))),
           f"{prefix}.weight_scale_inv": ("F32", np.ones((2, 1), np.float32))}
    with pytest.raises(qgemm.Error, match=r"weight_scale_inv has shape \[2, 1\]; "
                                          r"\[ceil\(n / 128\), ceil\(k / 128\)\] needs \[1, 1\]"):
        load(fp8, LOAD_CONFIGS["fp8"])
    nan = dict(fp8)
    nan[f"{prefix}.weight"] = ("F8_E4M3", np.full((16, 32), 0x7F, np.uint8))
    with pytest.raises(qgemm.Error, match="holds NaN codes"):
        load(nan, LOAD_CONFIGS["fp8"])

    bad = np.full((4, 8), 0xFF, np.uint8)  # 2-bit code 3: no ternary value
    with pytest.raises(qgemm.Error, match="holds the 2-bit code 3"):
        load({f"{prefix}.weight": ("U8", bad),
              f"{prefix}.weight_scale": ("F32", np.ones(1, np.float32))},
             LOAD_CONFIGS["bitnet"])
    with pytest.raises(qgemm.Error, match="use_rms_norm"):
        load({f"{prefix}.weight": ("U8", bad)}, {**LOAD_CONFIGS["bitnet"], "use_rms_norm": True})
    with pytest.raises(qgemm.Error, match="online"):
        load({f"{prefix}.weight": ("U8", bad)},
             {**LOAD_CONFIGS["bitnet"], "quantization_mode": "online"})

    with pytest.raises(qgemm.Error, match="e8m0 NaN code 255"):
        checkpoint.import_mxfp4(np.zeros((4, 1, 16), np.uint8), np.full((4, 1), 255, np.uint8))
    with pytest.raises(qgemm.Error, match=r"mxfp4_scales has shape \[4, 2\]"):
        checkpoint.import_mxfp4(np.zeros((4, 1, 16), np.uint8), np.zeros((4, 2), np.uint8))
    # qgemm.Error is a ValueError.
    with pytest.raises(ValueError):
        load(tensors, ct_config(3, False, "group", 32))


def test_tensors_reader_matches_safetensors(rng, tmp_path):
    """qgemm.tensors reads what the safetensors package writes, bf16 and fp8 included, and
    writes what it reads."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from safetensors.torch import load_file, save_file

    from qgemm import tensors as qt

    source = {
        "bf16": torch.from_numpy(rng.standard_normal((3, 5)).astype(np.float32)).bfloat16(),
        "f8": torch.from_numpy(rng.standard_normal((4, 4)).astype(np.float32)).to(
            torch.float8_e4m3fn),
        "e8m0": torch.from_numpy(rng.integers(0, 255, size=(6,)).astype(np.uint8)).view(
            torch.float8_e8m0fnu),
        "i32": torch.from_numpy(rng.integers(-2**31, 2**31, size=(2, 3)).astype(np.int32)),
        "f16": torch.from_numpy(rng.standard_normal(7).astype(np.float16)),
        "scalar": torch.tensor(0.5),
    }
    save_file(source, str(tmp_path / "a.safetensors"))
    read = qt.read_safetensors(str(tmp_path / "a.safetensors"))
    assert read["bf16"].dtype == "BF16" and read["f8"].dtype == "F8_E4M3"
    assert read["e8m0"].dtype == "F8_E8M0" and read["scalar"].shape == ()
    for key, t in source.items():
        assert read[key].shape == tuple(t.shape)
        assert np.array_equal(qt.as_stored(t).data, read[key].data), key
    assert np.array_equal(read["bf16"].values(), source["bf16"].float().numpy())
    assert np.array_equal(read["f8"].values(), source["f8"].double().numpy())
    assert np.array_equal(read["e8m0"].values(), source["e8m0"].double().numpy(), equal_nan=True)
    qt.write_safetensors(str(tmp_path / "b.safetensors"), read)
    back = load_file(str(tmp_path / "b.safetensors"))
    for key, t in source.items():
        as_bytes = lambda x: x.reshape(-1).view(torch.uint8)
        assert back[key].dtype == t.dtype and torch.equal(as_bytes(back[key]), as_bytes(t)), key
