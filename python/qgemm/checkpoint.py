"""Checkpoint import: quantized linear layers from safetensors into qgemm's canonical form.

Each importer turns a checkpoint's tensors into a `qgemm.PackedWeight` (codes [n, k] packed
LSB-first along K, the scale grid [n, groups], integer zero points packed like codes) and the
scheme that describes it, so that `qgemm.dequantize_weight` gives exactly the checkpoint's
weights. The layouts, as the producing tools write them:

GPTQ (AutoGPTQ / GPTQModel, `quant_method: "gptq"`):
    qweight  int32 [k / (32 / bits), n]   packed along K: word i of column j holds k = i·p + t in
                                          bits [t·bits, (t + 1)·bits), p = 32 / bits
    qzeros   int32 [groups, n / p]        packed along N the same way
    scales   fp16  [groups, n]
    g_idx    int32 [k]                    the group of each k (act-order when not k // group)
    w[n, k] = (q − z) · s. Format v1 (`checkpoint_format: "gptq"`, the default) stores z − 1
    (modulo 2^bits); v2 (`"gptq_v2"`) stores z. With act-order (desc_act) the groups are not
    contiguous in K; K is permuted once so that they are, and the layer permutes its
    activations' columns the same way (`input_permutation`).

AWQ (AutoAWQ GEMM, `quant_method: "awq"`):
    qweight  int32 [k, n / 8]             packed along N: nibble t of word i holds column
                                          8i + (0, 2, 4, 6, 1, 3, 5, 7)[t]
    qzeros   int32 [groups, n / 8]        the same packing
    scales   fp16  [groups, n]
    w[n, k] = (q − z) · s.

Only 2-, 4- and 8-bit GPTQ codes are read (3-bit GPTQ words straddle int32 boundaries).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping, Optional

import numpy as np

from ._core import Error, PackedWeight, Scheme, reference_gemm

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclasses.dataclass
class ImportedLinear:
    """A quantized linear layer: y = x[:, input_permutation] · dequant(weight)ᵀ."""

    scheme: Scheme
    weight: PackedWeight
    input_permutation: Optional[np.ndarray] = None  # int64 [k], or None (identity)

    def permute_input(self, x: np.ndarray) -> np.ndarray:
        return x if self.input_permutation is None else x[:, self.input_permutation]

    def reference(self, x: np.ndarray) -> np.ndarray:
        """The CPU reference of the layer on float32 activations [m, k]."""
        x = np.ascontiguousarray(self.permute_input(np.asarray(x, dtype=np.float32)))
        return reference_gemm(self.scheme, x, self.weight)


def pack_canonical(codes: np.ndarray, bits: int) -> np.ndarray:
    """Rows of unsigned codes [rows, count] in qgemm's canonical packing: code j of a row in bits
    [j·bits, (j + 1)·bits) of the row, LSB-first through little-endian bytes, rows padded to
    whole bytes."""
    codes = np.asarray(codes, dtype=np.uint32)
    rows, count = codes.shape
    shifts = np.arange(bits, dtype=np.uint32)
    bit_array = ((codes[:, :, None] >> shifts) & 1).astype(np.uint8).reshape(rows, count * bits)
    pad = (-(count * bits)) % 8
    if pad:
        bit_array = np.concatenate([bit_array, np.zeros((rows, pad), np.uint8)], axis=1)
    return np.packbits(bit_array, axis=1, bitorder="little").reshape(-1)


def _unpack_words(words: np.ndarray, bits: int, axis: int, order=None) -> np.ndarray:
    """Unsigned codes from int32 words packed along `axis`: word i holds elements i·p + order[t]
    in bits [t·bits, (t + 1)·bits), p = 32 / bits."""
    per_word = 32 // bits
    order = tuple(range(per_word)) if order is None else order
    words = np.ascontiguousarray(np.moveaxis(np.asarray(words), axis, -1)).view(np.uint32)
    out = np.empty(words.shape[:-1] + (words.shape[-1] * per_word,), np.uint32)
    for t in range(per_word):
        out[..., order[t]::per_word] = (words >> np.uint32(t * bits)) & np.uint32((1 << bits) - 1)
    return np.moveaxis(out, -1, axis)


def _fp16_bytes(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype="<f2").view(np.uint8).reshape(-1)


def _scheme_text(bits: int, group: int, zero: str, activation: str) -> str:
    grouping = "ch" if group <= 0 else f"g{group}"
    return f"w=uint{bits}:{grouping}:s=fp16:zp={zero};a={activation};o={activation}"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise Error(message)


def _build(bits, group, codes_nk, zeros_gn, scales_gn, activation, permutation):
    """PackedWeight and scheme from unsigned codes [n, k], zeros [groups, n] and fp16 scales
    [groups, n]; zero points that are all 2^(bits − 1) become the implied midpoint."""
    n, k = codes_nk.shape
    mid = 1 << (bits - 1)
    midpoint = bool(np.all(zeros_gn == mid))
    scheme = Scheme(_scheme_text(bits, group, "mid" if midpoint else "int", activation))
    zeros = None if midpoint else pack_canonical(zeros_gn.T, bits)
    weight = PackedWeight.from_parts(
        scheme, n, k, pack_canonical(codes_nk, bits), _fp16_bytes(scales_gn.T), zeros
    )
    return ImportedLinear(scheme, weight, permutation)


def import_gptq(qweight, qzeros, scales, g_idx=None, *, bits: int, group_size: int,
                checkpoint_format: str = "gptq", activation: str = "fp16") -> ImportedLinear:
    """One GPTQ linear layer (see the module's docstring for the layout)."""
    _require(bits in (2, 4, 8), f"import_gptq: bits must be 2, 4 or 8 ({bits} given; 3-bit "
             "GPTQ words straddle int32 boundaries and are not read)")
    _require(checkpoint_format in ("gptq", "gptq_v2"),
             f"import_gptq: checkpoint_format must be 'gptq' or 'gptq_v2' ({checkpoint_format!r})")
    qweight, qzeros = np.asarray(qweight), np.asarray(qzeros)
    scales = np.asarray(scales, dtype=np.float16)
    _require(qweight.dtype == np.int32 and qzeros.dtype == np.int32,
             "import_gptq: qweight and qzeros must be int32")
    codes_kn = _unpack_words(qweight, bits, axis=0)
    k, n = codes_kn.shape
    zeros = _unpack_words(qzeros, bits, axis=1)
    groups = scales.shape[0]
    _require(scales.shape == (groups, n) and zeros.shape == (groups, n),
             f"import_gptq: scales {scales.shape} and unpacked qzeros {zeros.shape} must both be "
             f"[groups, n = {n}]")
    if checkpoint_format == "gptq":
        zeros = (zeros + 1) & ((1 << bits) - 1)
    group = group_size if group_size > 0 else k
    permutation = None
    if g_idx is not None:
        g_idx = np.asarray(g_idx).astype(np.int64)
        _require(g_idx.shape == (k,), f"import_gptq: g_idx must have k = {k} entries")
        if not np.array_equal(g_idx, np.arange(k) // group):
            # Act-order: sort K by group so that every group is contiguous again.
            permutation = np.argsort(g_idx, kind="stable")
            _require(np.array_equal(g_idx[permutation], np.arange(k) // group),
                     f"import_gptq: g_idx does not assign {group} columns to each group")
            codes_kn = codes_kn[permutation]
    _require(groups == -(-k // group),
             f"import_gptq: {groups} scale rows for k = {k} and group {group}")
    return _build(bits, group_size, np.ascontiguousarray(codes_kn.T), zeros, scales, activation,
                  permutation)


def import_awq(qweight, qzeros, scales, *, group_size: int, bits: int = 4,
               activation: str = "fp16") -> ImportedLinear:
    """One AWQ (GEMM-packed) linear layer (see the module's docstring for the layout)."""
    _require(bits == 4, f"import_awq: AWQ packs 4-bit codes ({bits} given)")
    qweight, qzeros = np.asarray(qweight), np.asarray(qzeros)
    _require(qweight.dtype == np.int32 and qzeros.dtype == np.int32,
             "import_awq: qweight and qzeros must be int32")
    scales = np.asarray(scales, dtype=np.float16)
    codes_kn = _unpack_words(qweight, 4, axis=1, order=AWQ_ORDER)
    zeros = _unpack_words(qzeros, 4, axis=1, order=AWQ_ORDER)
    k, n = codes_kn.shape
    group = group_size if group_size > 0 else k
    _require(scales.shape == (-(-k // group), n) and zeros.shape == scales.shape,
             f"import_awq: scales {scales.shape} and unpacked qzeros {zeros.shape} must be "
             f"[ceil(k / group) = {-(-k // group)}, n = {n}]")
    return _build(4, group_size, np.ascontiguousarray(codes_kn.T), zeros, scales, activation, None)


def quantization_config(model_dir: str) -> dict:
    """The `quantization_config` of a model directory's config.json."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    _require("quantization_config" in config,
             f"{model_dir}/config.json has no quantization_config")
    return config["quantization_config"]


def import_linear(tensors: Mapping[str, np.ndarray], prefix: str, config: Mapping,
                  activation: str = "fp16") -> ImportedLinear:
    """The layer `prefix` (e.g. "model.layers.0.mlp.down_proj") of a checkpoint's tensors, as
    its quantization_config describes it."""
    method = config.get("quant_method")
    get = lambda name: tensors[f"{prefix}.{name}"]
    if method == "gptq":
        g_idx = tensors.get(f"{prefix}.g_idx")
        return import_gptq(get("qweight"), get("qzeros"), get("scales"), g_idx,
                           bits=int(config["bits"]), group_size=int(config["group_size"]),
                           checkpoint_format=config.get("checkpoint_format", "gptq"),
                           activation=activation)
    if method == "awq":
        group = config.get("group_size", config.get("q_group_size"))
        return import_awq(get("qweight"), get("qzeros"), get("scales"), group_size=int(group),
                          bits=int(config.get("bits", config.get("w_bit", 4))),
                          activation=activation)
    raise Error(f"import_linear: quant_method {method!r} is not supported yet (gptq, awq)")


def load_linear(model_dir: str, prefix: str, activation: str = "fp16") -> ImportedLinear:
    """The layer `prefix` of a model directory (config.json and *.safetensors)."""
    from safetensors import safe_open

    config = quantization_config(model_dir)
    for name in sorted(os.listdir(model_dir)):
        if not name.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(model_dir, name), framework="numpy") as f:
            keys = [key for key in f.keys() if key.startswith(prefix + ".")]
            if keys:
                return import_linear({key: f.get_tensor(key) for key in keys}, prefix, config,
                                     activation)
    raise Error(f"load_linear: no tensors named {prefix}.* in {model_dir}")
