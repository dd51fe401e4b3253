"""Small valid layers in each checkpoint format qgemm imports, and their quantization_configs:
the fuzz targets' fixed tensors and configs, and the source of their seed corpora
(make_seeds.py). Deterministic (a fixed seed), so that the seeds do not change when remade.

Every layer here imports with its config (fuzz_quantization_config.py checks this on its
seeds: a mutated config then starts from a layer that loads)."""

import numpy as np

from qgemm import tensors as qt  # (the fuzz targets import qgemm first: fuzz_support)

PREFIX = "model.layers.0.mlp.down_proj"
EXPERTS = "model.layers.0.mlp.experts"
N, K, GROUP = 16, 64, 32


def _pack_along(codes, bits, axis):
    """int32 words holding 32 / bits codes each along `axis`, LSB-first (GPTQ, AWQ without its
    order)."""
    codes = np.moveaxis(np.asarray(codes, np.uint32), axis, 0)
    per = 32 // bits
    words = np.zeros((codes.shape[0] // per,) + codes.shape[1:], np.uint32)
    for t in range(per):
        words |= codes[t::per] << np.uint32(t * bits)
    return np.moveaxis(words, 0, axis).view(np.int32)


def _awq_pack(codes):
    """AWQ's GEMM packing along N: nibble t of word i holds column
    8i + (0, 2, 4, 6, 1, 3, 5, 7)[t]."""
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    codes = np.asarray(codes, np.uint32)
    words = np.zeros((codes.shape[0], codes.shape[1] // 8), np.uint32)
    for t in range(8):
        words |= codes[:, order[t]::8] << np.uint32(4 * t)
    return words.view(np.int32)


def _dense_int32(codes, bits):
    """compressed-tensors' pack_to_int32: element j of a row at bit j · bits of the row's
    little-endian int32 stream."""
    rows, cols = codes.shape
    bit_array = ((np.asarray(codes, np.uint32)[:, :, None] >> np.arange(bits, dtype=np.uint32))
                 & 1).astype(np.uint8).reshape(rows, cols * bits)
    words = -(-cols * bits // 32)
    bit_array = np.concatenate([bit_array, np.zeros((rows, words * 32 - cols * bits), np.uint8)],
                               axis=1)
    return np.packbits(bit_array, axis=1, bitorder="little").view("<i4").reshape(rows, words)


def _st(dtype, array):
    return qt.StoredTensor(dtype, np.ascontiguousarray(array, dtype=qt.STORAGE[dtype]))


def _bf16(values):
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def layers():
    """{name: (prefix, {tensor name: StoredTensor}, expert)}: one small valid layer per
    format."""
    rng = np.random.default_rng(19)
    groups = K // GROUP
    p = PREFIX
    out = {}

    codes = rng.integers(0, 16, size=(K, N))
    zeros = rng.integers(0, 16, size=(groups, N))
    out["gptq"] = (p, {
        f"{p}.qweight": _st("I32", _pack_along(codes, 4, 0)),
        f"{p}.qzeros": _st("I32", _pack_along((zeros - 1) & 15, 4, 1)),
        f"{p}.scales": _st("F16", rng.uniform(1e-3, 2e-2, (groups, N))),
        f"{p}.g_idx": _st("I32", np.arange(K) // GROUP),
    }, None)
    out["awq"] = (p, {
        f"{p}.qweight": _st("I32", _awq_pack(codes)),
        f"{p}.qzeros": _st("I32", _awq_pack(zeros)),
        f"{p}.scales": _st("F16", rng.uniform(1e-3, 2e-2, (groups, N))),
    }, None)

    q = rng.integers(0, 16, size=(N, K))
    z = rng.integers(0, 16, size=(N, groups))
    out["ct-pack"] = (p, {
        f"{p}.weight_packed": _st("I32", _dense_int32(q, 4)),
        f"{p}.weight_scale": _st("BF16", _bf16(rng.uniform(1e-3, 2e-2, (N, groups)))),
        f"{p}.weight_shape": _st("I64", [N, K]),
        f"{p}.weight_zero_point": _st("I32", _dense_int32(z.T, 4).T),
        f"{p}.weight_g_idx": _st("I32", np.arange(K) % groups),  # act-order
    }, None)
    e4m3 = rng.integers(0, 0x7F, size=(N, K)) | (rng.integers(0, 2, size=(N, K)) << 7)
    out["ct-fp8"] = (p, {
        f"{p}.weight": _st("F8_E4M3", e4m3),
        f"{p}.weight_scale": _st("F32", rng.uniform(1e-3, 2e-2, (N, 1))),
        f"{p}.input_scale": _st("F32", [0.05]),
    }, None)
    out["ct-int8"] = (p, {
        f"{p}.weight": _st("I8", rng.integers(-128, 128, size=(N, K))),
        f"{p}.weight_scale": _st("F16", rng.uniform(1e-3, 2e-2, (N, 1))),
    }, None)
    fp4 = rng.integers(0, 256, size=(N, K // 2))
    block_scales = rng.integers(0x30, 0x50, size=(N, K // 16))
    out["ct-nvfp4"] = (p, {
        f"{p}.weight_packed": _st("U8", fp4),
        f"{p}.weight_scale": _st("F8_E4M3", block_scales),
        f"{p}.weight_global_scale": _st("F32", [448.0 * 6.0]),
    }, None)
    out["modelopt-nvfp4"] = (p, {
        f"{p}.weight": _st("U8", fp4),
        f"{p}.weight_scale": _st("F8_E4M3", block_scales),
        f"{p}.weight_scale_2": _st("F32", np.float32(1 / 2688.0)),
        f"{p}.input_scale": _st("F32", np.float32(0.25)),
    }, None)
    out["modelopt-fp8"] = (p, {
        f"{p}.weight": _st("F8_E4M3", e4m3),
        f"{p}.weight_scale": _st("F32", np.float32(0.01)),
        f"{p}.input_scale": _st("F32", np.float32(0.05)),
    }, None)
    out["fp8-block"] = (p, {
        f"{p}.weight": _st("F8_E4M3", e4m3),
        f"{p}.weight_scale_inv": _st("F32", [[0.0125]]),
    }, None)
    fields = rng.integers(0, 3, size=(4, N // 4, K))
    packed = sum((fields[i] << (2 * i)) for i in range(4))
    out["bitnet"] = (p, {
        f"{p}.weight": _st("U8", packed),
        f"{p}.weight_scale": _st("BF16", _bf16([4.0])),
    }, None)
    hidden, inter = 32, 32
    e = EXPERTS
    out["mxfp4"] = (f"{e}.down_proj", {
        f"{e}.gate_up_proj_blocks": _st("U8", rng.integers(0, 256,
                                                          (1, 2 * inter, hidden // 32, 16))),
        f"{e}.gate_up_proj_scales": _st("U8", rng.integers(120, 130, (1, 2 * inter, hidden // 32))),
        f"{e}.gate_up_proj_bias": _st("BF16", _bf16(rng.uniform(-1, 1, (1, 2 * inter)))),
        f"{e}.down_proj_blocks": _st("U8", rng.integers(0, 256, (1, hidden, inter // 32, 16))),
        f"{e}.down_proj_scales": _st("U8", rng.integers(120, 130, (1, hidden, inter // 32))),
        f"{e}.down_proj_bias": _st("BF16", _bf16(rng.uniform(-1, 1, (1, hidden)))),
    }, 0)
    return out


def _ct(weights, fmt, input_activations=None):
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status":
            "compressed", "version": "0.12.2", "global_compression_ratio": None,
            "ignore": ["lm_head", "re:.*mlp.gate$"], "kv_cache_scheme": None,
            "sparsity_config": {},
            "config_groups": {"group_0": {"targets": ["Linear"], "format": fmt,
                                          "weights": weights,
                                          "input_activations": input_activations,
                                          "output_activations": None}}}


def configs():
    """{name: (quantization_config, the layers of layers() it describes)}, as the producing
    tools write them."""
    ct_weights = {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
                  "group_size": GROUP, "block_structure": None, "dynamic": False,
                  "actorder": "group", "observer": "minmax", "observer_kwargs": {}}
    fp8_weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel",
                   "group_size": None, "dynamic": False, "observer": "minmax"}
    fp8_tokens = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                  "group_size": None, "dynamic": True, "observer": None}
    int8_weights = {**fp8_weights, "type": "int"}
    nvfp4 = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group",
             "group_size": 16, "dynamic": False, "observer": "minmax"}
    return {
        "gptq": ({"bits": 4, "group_size": GROUP, "damp_percent": 0.01, "desc_act": False,
                  "static_groups": False, "sym": True, "true_sequential": True,
                  "model_name_or_path": None, "model_file_base_name": "model",
                  "quant_method": "gptq", "checkpoint_format": "gptq"}, ["gptq"]),
        "awq": ({"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
                 "version": "gemm", "modules_to_not_convert": None}, ["awq"]),
        "compressed-tensors-w4a16": (_ct(ct_weights, "pack-quantized"), ["ct-pack"]),
        "compressed-tensors-fp8-dynamic": (_ct(fp8_weights, "float-quantized", fp8_tokens),
                                           ["ct-fp8"]),
        "compressed-tensors-w8a8-int": (_ct(int8_weights, "int-quantized",
                                            {**fp8_tokens, "type": "int"}), ["ct-int8"]),
        "compressed-tensors-nvfp4": (_ct(nvfp4, "nvfp4-pack-quantized",
                                         {**nvfp4, "dynamic": "local"}), ["ct-nvfp4"]),
        "modelopt-nvfp4": ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                            "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]},
                           ["modelopt-nvfp4"]),
        "modelopt-fp8": ({"quant_method": "modelopt", "quant_algo": "FP8",
                          "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]},
                         ["modelopt-fp8"]),
        "fp8-block": ({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                       "weight_block_size": [128, 128]}, ["fp8-block"]),
        "mxfp4": ({"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
            "lm_head"]}, ["mxfp4"]),
        "bitnet": ({"quant_method": "bitnet", "linear_class": "bitlinear",
                    "quantization_mode": "offline", "use_rms_norm": False,
                    "modules_to_not_convert": ["lm_head"]}, ["bitnet"]),
    }


# The layers a quant_method's configs describe (the config target imports each of them).
def layers_by_method():
    by_method = {}
    for config, names in configs().values():
        by_method.setdefault(config["quant_method"], []).extend(
            n for n in names if n not in by_method.get(config["quant_method"], []))
    return by_method
