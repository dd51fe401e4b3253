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

compressed-tensors (`quant_method: "compressed-tensors"`; the layer's config_group by its
targets: exact name, then "re:" regex, then "Linear"; the `ignore` list is not quantized):
  pack-quantized (int, 2/4/8 bits; strategy group, channel or tensor):
    weight_packed      int32 [n, ceil(k·b / 32)]  element j of a row at bit j·b of the row's
                                                  little-endian int32 stream, stored as q + 2^(b−1)
    weight_scale       fp32/fp16/bf16 [n, groups] ([n, 1] channel, [1] tensor)
    weight_zero_point  asymmetric only: int32 [ceil(n·b / 32), groups] packed along N the same
                                                  way (z + 2^(b−1)); int8 as is for tensor
    weight_shape       int64 [2] = [n, k]
    weight_g_idx       int32 [k], act-order "group" checkpoints (as GPTQ's g_idx)
    w = (q − z) · s, q and z signed → uint<b> codes with zp=mid (symmetric) or zp=int.
  float-quantized (FP8): weight e4m3 [n, k], weight_scale per tensor, channel, group or 2-D
    block [ceil(n / bn), ceil(k / bk)]: w = e4m3 · s. int-quantized / naive-quantized: weight
    int8 [n, k] holding b-bit values, w = (q − z) · s.
  nvfp4-pack-quantized: weight_packed uint8 [n, k / 2] (e2m1, low nibble first), weight_scale
    e4m3 [n, k / 16], weight_global_scale fp32: w = e2m1 · s / global (qgemm multiplies by
    1 / global rounded to fp32).
  input_activations map onto qgemm's dynamic activation quantization: fp8 per token/tensor →
    e4m3:tok, fp8 groups → e4m3:g<G>, int8 → int8:tok, NVFP4 → e2m1:nv.

modelopt (`quant_method: "modelopt"` in config.json, or hf_quant_config.json's "quantization"):
  NVFP4: weight uint8 [n, k / 2] (two e2m1 codes, low nibble first), weight_scale e4m3
    [n, k / 16], weight_scale_2 fp32 scalar, input_scale fp32 scalar (kept as input_scale):
    w = e2m1 · weight_scale · weight_scale_2 → the nvfp4 preset (global = weight_scale_2).
    Fused shards (QKV, gate_up) share one weight_scale_2 in modelopt's export; see concat_rows.
  FP8 / FP8_PER_CHANNEL_PER_TOKEN: weight e4m3 [n, k], weight_scale fp32 per tensor / channel.

gpt-oss MXFP4 (`quant_method: "mxfp4"`): <name>_blocks uint8 [experts, n, k / 32, 16] (two e2m1
  codes a byte, low nibble = even element), <name>_scales uint8 [experts, n, k / 32] (e8m0,
  2^(s − 127)) → mxfp4-a16, one expert at a time (import_mxfp4(expert=)); gate_up_proj's rows
  interleave gate (even) and up (odd): split_interleaved_gate_up. A whole expert layer
  (<prefix>.gate_up_proj_* and .down_proj_*, biases included): import_mxfp4_experts, found by
  quantized_experts.

FP8 block (`quant_method: "fp8"`, DeepSeek-V3 / transformers FineGrainedFP8): weight e4m3
  [n, k], weight_scale_inv fp32 (or e8m0) [ceil(n / 128), ceil(k / 128)] multiplying its block
  → the fp8-block preset (activations e4m3 in 1 x 128 groups).

BitNet (`quant_method: "bitnet"`, transformers integrations/bitnet.py): weight uint8
  [ceil(n / 4), k] (row block i of ceil(n / 4) rows in bits [2i, 2i + 2), value + 1),
  weight_scale one value (BitLinear: w = t / weight_scale; AutoBitLinear: t · weight_scale)
  → the bitnet preset (ternary, per-tensor fp32 scale, int8 per-token activations).

Every importer checks the tensors' types and shapes and raises qgemm.Error naming the tensor
and the rule; `import_linear` / `load_linear` dispatch on the quantization_config.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Iterable, Mapping, Optional, Sequence, Tuple

import numpy as np

from ._core import Error, PackedWeight, Scheme, reference_gemm
from .tensors import (E4M3_VALUES, FLOAT_TYPES, INT_TYPES, SafetensorsFile, StoredTensor,
                      as_stored)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclasses.dataclass
class ImportedLinear:
    """A quantized linear layer: y = x[:, input_permutation] · dequant(weight)ᵀ."""

    scheme: Scheme
    weight: PackedWeight
    input_permutation: Optional[np.ndarray] = None  # int64 [k], or None (identity)
    # The checkpoint's static (calibrated) activation scale, where it has one (FP8, NVFP4
    # input_scale): kept for reference; qgemm's schemes quantize activations dynamically.
    input_scale: Optional[float] = None

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


_INT_LIMIT = 1 << 31  # config numbers (bits, group and block sizes) are C++ ints in the scheme


def _is_config_int(value) -> bool:
    """Whether a quantization_config number is an integer qgemm takes: an int (not a bool), or a
    float of integral value as a JSON writer may give it, in [-2^31, 2^31). The one rule for
    every such number (bits, group sizes, block shapes)."""
    integral = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) \
        or isinstance(value, float) and value.is_integer()
    return integral and -_INT_LIMIT <= value < _INT_LIMIT


def _is_block_shape(value) -> bool:
    """Whether a quantization_config block shape ([rows, cols]: compressed-tensors'
    block_structure, fp8's weight_block_size) is two positive config integers."""
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(
        _is_config_int(v) and v > 0 for v in value)


def _as_int(value, field: str) -> int:
    """A quantization_config number as an int (_is_config_int), else qgemm.Error naming the
    field."""
    _require(_is_config_int(value), f"{field} is {value!r} (rule: an integer in [-2^31, 2^31))")
    return int(value)


def _int_field(config: Mapping, key: str, where: str, default=None) -> int:
    """config[key] as an int (_as_int); a missing or null field is `default`, or qgemm.Error
    naming the field where there is no default."""
    value = config.get(key)
    if value is None:
        _require(default is not None, f"{where}: the quantization_config has no {key} (rule: "
                 f"{where} needs it)")
        return default
    return _as_int(value, f"{where}: quantization_config {key}")


def _mapping(value, field: str, optional: bool = False) -> Mapping:
    """A quantization_config object (a JSON object), else qgemm.Error naming the field; an
    optional one may be null (then {})."""
    if value is None and optional:
        return {}
    _require(isinstance(value, Mapping), f"{field} is {value!r} (rule: a JSON object)")
    return value


def _names(value, field: str) -> list:
    """A quantization_config list of names (targets, ignore), null as none."""
    if value is None:
        return []
    _require(isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value),
             f"{field} is {value!r} (rule: a list of names)")
    return list(value)


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
    _require(qweight.ndim == 2 and qzeros.ndim == 2 and scales.ndim == 2 and qweight.size > 0,
             f"import_gptq: qweight {list(qweight.shape)}, qzeros {list(qzeros.shape)} and scales "
             f"{list(scales.shape)} (rule: matrices, [k / {32 // bits}, n], "
             f"[groups, n / {32 // bits}] and [groups, n], n and k positive)")
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
    _require(qweight.ndim == 2 and qzeros.ndim == 2 and qweight.size > 0,
             f"import_awq: qweight {list(qweight.shape)} and qzeros {list(qzeros.shape)} (rule: "
             "matrices, [k, n / 8] and [groups, n / 8], n and k positive)")
    codes_kn = _unpack_words(qweight, 4, axis=1, order=AWQ_ORDER)
    zeros = _unpack_words(qzeros, 4, axis=1, order=AWQ_ORDER)
    k, n = codes_kn.shape
    group = group_size if group_size > 0 else k
    _require(scales.shape == (-(-k // group), n) and zeros.shape == scales.shape,
             f"import_awq: scales {scales.shape} and unpacked qzeros {zeros.shape} must be "
             f"[ceil(k / group) = {-(-k // group)}, n = {n}]")
    return _build(4, group_size, np.ascontiguousarray(codes_kn.T), zeros, scales, activation, None)


# ---------------------------------------------------------------------------------------------
# The other formats of issue #18: tensors as stored (qgemm.tensors.StoredTensor), so that BF16
# and FP8 tensors keep their exact type without torch.

_SCALE_FORMATS = {"F32": "fp32", "F16": "fp16", "BF16": "bf16", "F8_E4M3": "e4m3",
                  "F8_E8M0": "e8m0"}
_SIXTEEN_BIT = ("fp16", "bf16")


class _Layer:
    """One layer's tensors (`prefix` + suffix), with errors that name the missing tensor."""

    def __init__(self, tensors: Mapping, prefix: str, function: str, what: str):
        self.tensors, self.prefix, self.function, self.what = tensors, prefix, function, what

    def name(self, suffix: str) -> str:
        return self.prefix + suffix

    def get(self, suffix: str, rule: str) -> StoredTensor:
        name = self.prefix + suffix
        if name not in self.tensors:
            raise Error(f"{self.function}: {name} is missing (rule: {self.what} {rule})")
        return as_stored(self.tensors[name], name)

    def opt(self, suffix: str) -> Optional[StoredTensor]:
        name = self.prefix + suffix
        return as_stored(self.tensors[name], name) if name in self.tensors else None

    def fail(self, message: str):
        raise Error(f"{self.function}: {message}")

    def require(self, condition: bool, message: str) -> None:
        if not condition:
            self.fail(message)

    def dtype(self, t: StoredTensor, suffix: str, allowed: Sequence[str]) -> None:
        self.require(t.dtype in allowed,
                     f"{self.name(suffix)} is {t.dtype}; {self.what} stores it as "
                     f"{' or '.join(allowed)}")

    def shape(self, t: StoredTensor, suffix: str, expected: Sequence[int], rule: str) -> None:
        """Shapes equal up to dimensions of size 1 ([n, 1] is [n]; [], [1], [1, 1] alike)."""
        squeeze = lambda shape: tuple(int(d) for d in shape if d != 1)
        self.require(squeeze(t.shape) == squeeze(expected),
                     f"{self.name(suffix)} has shape {list(t.shape)}; {rule} needs "
                     f"{list(expected)}")

    def scales(self, t: StoredTensor, suffix: str, rows: int, cols: int, rule: str,
               allowed=("F32", "F16", "BF16")) -> Tuple[str, np.ndarray]:
        """The scale format's name and the scale grid's bytes [rows, cols], row-major."""
        self.dtype(t, suffix, allowed)
        self.shape(t, suffix, (rows, cols), rule)
        values = t.values()
        self.require(bool(np.all(np.isfinite(values))),
                     f"{self.name(suffix)} holds NaN or infinite scales (rule: finite)")
        data = np.ascontiguousarray(t.data).reshape(rows, cols)
        return _SCALE_FORMATS[t.dtype], data.view(np.uint8).reshape(-1)

    def scalar(self, t: StoredTensor, suffix: str) -> float:
        self.dtype(t, suffix, ("F32", "F16", "BF16"))
        self.require(t.data.size == 1, f"{self.name(suffix)} has shape {list(t.shape)}; it is "
                     "one value (shape [] or [1])")
        value = float(t.values().reshape(-1)[0])
        self.require(np.isfinite(value) and value > 0,
                     f"{self.name(suffix)} = {value} (rule: positive and finite)")
        return value


def _activation_part(activation: str, quantized: Optional[str]) -> str:
    """The scheme's a= and o= parts: `quantized` (e.g. "e4m3:tok") or 16-bit activations."""
    _require(activation in _SIXTEEN_BIT,
             f"activation must be 'fp16' or 'bf16' (the model's 16-bit type; {activation!r} given)")
    return f"a={quantized or activation};o={activation}"


def _dense_rows(words: np.ndarray, count: int, bits: int) -> np.ndarray:
    """Rows of a dense LSB-first bit stream (element j of a row in bits [j·bits, (j + 1)·bits)
    of the row's little-endian words or bytes) as canonical rows of ceil(count·bits / 8) bytes,
    the bits past the last element cleared."""
    rows = words.shape[0]
    row_bytes = -(-count * bits // 8)
    data = np.ascontiguousarray(words).view(np.uint8).reshape(rows, -1)[:, :row_bytes].copy()
    pad = row_bytes * 8 - count * bits
    if pad:
        data[:, -1] &= np.uint8((1 << (8 - pad)) - 1)
    return data


def _unpack_dense(rows_bytes: np.ndarray, count: int, bits: int) -> np.ndarray:
    """Codes [rows, count] (uint32) of canonical rows (see _dense_rows)."""
    rows = rows_bytes.shape[0]
    bit_array = np.unpackbits(np.ascontiguousarray(rows_bytes, dtype=np.uint8), axis=1,
                              bitorder="little")[:, :count * bits].reshape(rows, count, bits)
    weights = (np.uint32(1) << np.arange(bits, dtype=np.uint32))
    return (bit_array.astype(np.uint32) * weights).sum(axis=2, dtype=np.uint32)


def _packed(scheme_text: str, n: int, k: int, codes: np.ndarray, scales: np.ndarray,
            zeros: Optional[np.ndarray] = None, global_scale: float = 1.0,
            permutation=None, input_scale=None) -> "ImportedLinear":
    scheme = Scheme(scheme_text)
    weight = PackedWeight.from_parts(scheme, n, k, np.ascontiguousarray(codes).reshape(-1),
                                     np.ascontiguousarray(scales).reshape(-1),
                                     None if zeros is None else
                                     np.ascontiguousarray(zeros).reshape(-1), global_scale)
    return ImportedLinear(scheme, weight, permutation, input_scale)


def _group_permutation(layer: _Layer, g_idx: Optional[StoredTensor], k: int, group: int):
    """Act-order (GPTQ desc_act, compressed-tensors actorder "group"): the K permutation that
    makes each group contiguous, or None when g_idx is the identity's k // group."""
    if g_idx is None:
        return None
    g = np.asarray(g_idx.values()).astype(np.int64).reshape(-1)
    layer.require(g.shape == (k,), f"{layer.name('.weight_g_idx')} has {g.size} entries; "
                  f"the layer's k is {k}")
    if np.array_equal(g, np.arange(k) // group):
        return None
    permutation = np.argsort(g, kind="stable")
    layer.require(np.array_equal(g[permutation], np.arange(k) // group),
                  f"{layer.name('.weight_g_idx')} does not assign {group} columns to each group")
    return permutation


def _permute_columns(codes_nk: np.ndarray, permutation) -> np.ndarray:
    return codes_nk if permutation is None else np.ascontiguousarray(codes_nk[:, permutation])


# --- compressed-tensors --------------------------------------------------------------------------

def _ct_target_rank(prefix: str, target: str) -> Optional[int]:
    """compressed-tensors' target precedence (utils/match.py, match_targets): an exact name,
    then a "re:" regular expression matched from the name's start, then a class name; only
    "Linear" (and names ending in Linear) are class names that a linear layer matches here."""
    if target == prefix:
        return 0
    if target.startswith("re:"):
        try:
            return 1 if re.match(target[3:], prefix) else None
        except (re.error, RecursionError, OverflowError) as error:
            raise Error(f"import_compressed_tensors: the quantization_config's target or ignore "
                        f"entry {target!r} is no regular expression ({error}) (rule: \"re:\" "
                        "then a Python regular expression)") from None
    if target.endswith("Linear") and "." not in target:
        return 2
    return None


def _ct_group(config: Mapping, prefix: str, layer: _Layer) -> Mapping:
    where = "import_compressed_tensors: quantization_config"
    for pattern in _names(config.get("ignore"), f"{where} ignore"):
        if _ct_target_rank(prefix, pattern) in (0, 1):
            layer.fail(f"{prefix} is in the quantization_config's ignore list (stored "
                       "unquantized, not a quantized layer)")
    best = None
    groups = _mapping(config.get("config_groups"), f"{where} config_groups", optional=True)
    for group_name, group in groups.items():
        group = _mapping(group, f"{where} config_groups.{group_name}")
        for target in _names(group.get("targets"), f"{where} config_groups.{group_name}.targets"):
            rank = _ct_target_rank(prefix, target)
            if rank is not None and (best is None or rank < best[0]):
                best = (rank, group_name, group)
    if best is None:
        layer.fail(f"no config_group of the quantization_config targets {prefix}")
    return best[2]


def _ct_strategy(args: Mapping) -> str:
    strategy = args.get("strategy")
    if strategy is None:  # QuantizationArgs' inference (quant_args.py, validate_model_after)
        group = args.get("group_size")
        strategy = "tensor" if group is None else "group" if _ct_int(
            args, "group_size", 0) > 0 else "channel"
    return str(strategy).lower()


def _ct_int(args: Mapping, key: str, default: int) -> int:
    """A number of a compressed-tensors QuantizationArgs (num_bits, group_size); missing or
    null: `default`."""
    return _int_field(args, key, "import_compressed_tensors", default)


def _ct_activation(args: Optional[Mapping]) -> Optional[str]:
    """qgemm's activation quantization for a compressed-tensors `input_activations`, or None
    (16-bit activations) where qgemm has no counterpart. qgemm quantizes activations
    dynamically: a static (calibrated) per-tensor scale becomes a per-token one."""
    args = _mapping(args, "import_compressed_tensors: quantization_config input_activations",
                    optional=True)
    if not args:
        return None
    bits, kind = _ct_int(args, "num_bits", 8), str(args.get("type", "int")).lower()
    strategy = _ct_strategy(args)
    if kind == "float" and bits == 4 and strategy == "tensor_group":
        return "e2m1:nv"
    element = {("float", 8): "e4m3", ("int", 8): "int8"}.get((kind, bits))
    if element is None:
        return None
    if strategy == "group" and (group := _ct_int(args, "group_size", 0)) > 0:
        return f"{element}:g{group}"
    return f"{element}:tok"


def import_compressed_tensors(tensors: Mapping, prefix: str, config: Mapping,
                              activation: str = "fp16", *,
                              quantize_activations: bool = True) -> "ImportedLinear":
    """One linear layer of a compressed-tensors checkpoint (`quant_method: "compressed-tensors"`;
    see the module's docstring for the layouts)."""
    layer = _Layer(tensors, prefix, "import_compressed_tensors", "compressed-tensors")
    group = _ct_group(config, prefix, layer)
    args = group.get("weights")
    layer.require(bool(args), f"the config_group targeting {prefix} quantizes no weights")
    args = _mapping(args, f"import_compressed_tensors: the weights of the config_group "
                    f"targeting {prefix}")
    fmt = group.get("format") or config.get("format")
    if fmt in (None, "mixed-precision"):  # per-layer formats: read them off the tensors
        packed = layer.opt(".weight_packed")
        fmt = ("nvfp4-pack-quantized" if packed is not None and packed.dtype == "U8" else
               "pack-quantized" if packed is not None else "naive-quantized")
    act = _ct_activation(group.get("input_activations")) if quantize_activations else None
    if fmt == "pack-quantized":
        return _ct_pack_quantized(layer, args, act, activation)
    if fmt in ("float-quantized", "int-quantized", "naive-quantized"):
        return _ct_naive_quantized(layer, args, act, activation, fmt)
    if fmt == "nvfp4-pack-quantized":
        return _ct_nvfp4(layer, args, act, activation)
    layer.fail(f"compressed-tensors format {fmt!r} is not supported (pack-quantized, "
               "float-quantized, int-quantized, naive-quantized, nvfp4-pack-quantized)")


def _ct_grid(layer: _Layer, args: Mapping, n: int, k: int) -> Tuple[str, int, int]:
    """The qgemm weight granularity and the scale grid [rows, cols] of a strategy."""
    strategy = _ct_strategy(args)
    if strategy == "tensor":
        return "t", 1, 1
    if strategy == "channel":
        return "ch", n, 1
    if strategy == "group":
        group = _ct_int(args, "group_size", 0)
        layer.require(group > 0, f"strategy group needs a positive group_size ({group} given)")
        return f"g{group}", n, -(-k // group)
    if strategy == "block":
        given = block = args.get("block_structure")
        if isinstance(block, str):  # "128x128"
            try:
                block = [int(v) for v in block.split("x")]
            except ValueError:
                pass
        layer.require(_is_block_shape(block), "strategy block needs block_structure [rows, cols] "
                      f"of two positive integers below 2^31 ({given!r} given)")
        bn, bk = (int(v) for v in block)
        return f"b{bn}x{bk}", -(-n // bn), -(-k // bk)
    layer.fail(f"weight strategy {strategy!r} is not supported (tensor, channel, group, block)")


def _ct_zero_points(layer: _Layer, bits: int, rows: int, cols: int, rule: str) -> np.ndarray:
    """Unsigned zero points [rows, cols] (the stored signed zero point + 2^(bits − 1)): int32
    packed along N like the codes (pack-quantized, group and channel strategies), or int8 as
    is (tensor strategy, and the naive formats)."""
    z = layer.get(".weight_zero_point", rule)
    offset = 1 << (bits - 1)
    if z.dtype == "I32":
        words = z.data if z.data.ndim == 2 or z.data.size % cols else \
            np.ascontiguousarray(z.data).reshape(-1, cols)
        layer.require(words.shape == (-(-rows * bits // 32), cols),
                      f"{layer.name('.weight_zero_point')} has shape {list(z.shape)}; packed "
                      f"along N it needs [ceil(n · {bits} / 32), groups] = "
                      f"[{-(-rows * bits // 32)}, {cols}]")
        columns = _dense_rows(np.ascontiguousarray(words.T), rows, bits)  # [cols, row bytes]
        return np.ascontiguousarray(_unpack_dense(columns, rows, bits).T)
    layer.dtype(z, ".weight_zero_point", ("I32", "I8"))
    layer.shape(z, ".weight_zero_point", (rows, cols), "one zero point per scale")
    zeros = z.data.astype(np.int64).reshape(rows, cols) + offset
    layer.require(bool(np.all((zeros >= 0) & (zeros < 2 * offset))),
                  f"{layer.name('.weight_zero_point')} holds values outside the {bits}-bit "
                  f"range [{-offset}, {offset - 1}]")
    return zeros.astype(np.uint32)


def _ct_pack_quantized(layer: _Layer, args: Mapping, act: Optional[str],
                       activation: str) -> "ImportedLinear":
    rule = "pack-quantized stores weight_packed, weight_scale, weight_shape (and " \
           "weight_zero_point when asymmetric)"
    bits = _ct_int(args, "num_bits", 8)
    layer.require(str(args.get("type", "int")).lower() == "int",
                  f"pack-quantized weights are integers (type {args.get('type')!r} given)")
    layer.require(bits in (2, 4, 8),
                  f"num_bits {bits} is not supported for pack-quantized (rule: 2, 4 or 8 bits, "
                  "whose int32 words hold whole codes; the 3/5/6/7-bit packing changed across "
                  "compressed-tensors versions)")
    packed = layer.get(".weight_packed", rule)
    layer.dtype(packed, ".weight_packed", ("I32",))
    layer.require(packed.data.ndim == 2, f"{layer.name('.weight_packed')} has shape "
                  f"{list(packed.shape)}; a linear layer's is [n, ceil(k · bits / 32)]")
    shape = layer.get(".weight_shape", rule)
    layer.require(shape.data.size == 2 and shape.dtype in INT_TYPES,
                  f"{layer.name('.weight_shape')} must hold the two integers [n, k] "
                  f"({shape.dtype} {list(shape.shape)} given)")
    n, k = (int(v) for v in shape.data.reshape(-1))
    layer.require(n > 0 and k > 0, f"{layer.name('.weight_shape')} is [{n}, {k}] (rule: n and k "
                  "positive)")
    words = -(-k * bits // 32)
    layer.require(packed.shape == (n, words),
                  f"{layer.name('.weight_packed')} has shape {list(packed.shape)}; weight_shape "
                  f"[{n}, {k}] at {bits} bits needs [n, ceil(k · {bits} / 32)] = [{n}, {words}]")
    codes = _dense_rows(packed.data.astype("<i4"), k, bits)  # stored code = q + 2^(bits − 1)
    granularity, rows, cols = _ct_grid(layer, args, n, k)
    layer.require(not granularity.startswith("b"), "pack-quantized has no block strategy")
    sf, scales = layer.scales(layer.get(".weight_scale", rule), ".weight_scale", rows, cols,
                              f"strategy {_ct_strategy(args)} at [{n}, {k}]")
    zeros = None
    if not args.get("symmetric", True):
        zeros = pack_canonical(_ct_zero_points(layer, bits, rows, cols, rule), bits)
    permutation = None
    if granularity.startswith("g"):
        permutation = _group_permutation(layer, layer.opt(".weight_g_idx"), k,
                                         _ct_int(args, "group_size", 0))
        if permutation is not None:
            codes = pack_canonical(_permute_columns(_unpack_dense(codes, k, bits), permutation),
                                   bits)
    zp = "mid" if zeros is None else "int"
    text = f"w=uint{bits}:{granularity}:s={sf}:zp={zp};{_activation_part(activation, act)}"
    return _packed(text, n, k, codes, scales, zeros, permutation=permutation)


def _ct_naive_quantized(layer: _Layer, args: Mapping, act: Optional[str], activation: str,
                        fmt: str) -> "ImportedLinear":
    rule = f"{fmt} stores weight (in the quantized type) and weight_scale"
    bits = _ct_int(args, "num_bits", 8)
    kind = str(args.get("type", "int")).lower()
    weight = layer.get(".weight", rule)
    layer.require(weight.data.ndim == 2, f"{layer.name('.weight')} has shape "
                  f"{list(weight.shape)}; a linear layer's is [n, k]")
    n, k = weight.shape
    granularity, rows, cols = _ct_grid(layer, args, n, k)
    sf, scales = layer.scales(layer.get(".weight_scale", rule), ".weight_scale", rows, cols,
                              f"strategy {_ct_strategy(args)} at [{n}, {k}]")
    if kind == "float":
        layer.require(bits == 8, f"float weights of {bits} bits are not {fmt} (FP8 is 8 bits; "
                      "FP4 is nvfp4-pack-quantized)")
        layer.dtype(weight, ".weight", ("F8_E4M3",))
        layer.require(not bool(np.any((weight.data & 0x7F) == 0x7F)),
                      f"{layer.name('.weight')} holds NaN codes (rule: finite e4m3)")
        layer.require(args.get("symmetric", True), "FP8 weights are symmetric (no zero point)")
        text = f"w=e4m3:{granularity}:s={sf};{_activation_part(activation, act)}"
        return _packed(text, n, k, weight.data, scales)
    layer.require(kind == "int", f"weight type {kind!r} is not int or float")
    layer.require(1 <= bits <= 8, f"num_bits {bits} is not supported (rule: 1 to 8)")
    layer.dtype(weight, ".weight", ("I8",))
    offset = 1 << (bits - 1)
    q = weight.data.astype(np.int64) + offset
    layer.require(bool(np.all((q >= 0) & (q < 2 * offset))),
                  f"{layer.name('.weight')} holds values outside the {bits}-bit range "
                  f"[{-offset}, {offset - 1}]")
    zeros = None
    if not args.get("symmetric", True):
        zeros = pack_canonical(_ct_zero_points(layer, bits, rows, cols, rule), bits)
    zp = "mid" if zeros is None else "int"
    text = f"w=uint{bits}:{granularity}:s={sf}:zp={zp};{_activation_part(activation, act)}"
    return _packed(text, n, k, pack_canonical(q, bits), scales, zeros)


def _ue4m3_codes(layer: _Layer, t: StoredTensor, suffix: str) -> np.ndarray:
    """NVFP4 block scales: e4m3fn bytes as ue4m3 codes (the same bits without the sign): −0
    reads as 0; a negative or NaN scale is an error."""
    codes = np.where(t.data == 0x80, 0, t.data).astype(np.uint8)
    layer.require(not bool(np.any(codes & 0x80)),
                  f"{layer.name(suffix)} holds negative scales (rule: NVFP4 block scales are "
                  "non-negative e4m3)")
    layer.require(not bool(np.any(codes == 0x7F)), f"{layer.name(suffix)} holds NaN scales")
    return codes


def _nvfp4(layer: _Layer, packed_suffix: str, rule: str, group: int, act: Optional[str],
           activation: str, global_scale: float, input_scale=None) -> "ImportedLinear":
    layer.require(group == 16, f"NVFP4 blocks are 16 values along K (group_size {group} given)")
    weight = layer.get(packed_suffix, rule)
    layer.dtype(weight, packed_suffix, ("U8",))
    layer.require(weight.data.ndim == 2 and weight.data.size > 0,
                  f"{layer.name(packed_suffix)} has shape {list(weight.shape)}; it is "
                  "[n, k / 2] (two e2m1 codes a byte), not empty")
    n, k = weight.shape[0], 2 * weight.shape[1]
    scale = layer.get(".weight_scale", rule)
    layer.dtype(scale, ".weight_scale", ("F8_E4M3",))
    layer.shape(scale, ".weight_scale", (n, -(-k // 16)), "one e4m3 scale per 16 values: "
                "[n, ceil(k / 16)]")
    codes = _ue4m3_codes(layer, scale, ".weight_scale")
    text = f"w=e2m1:g16:s=ue4m3:global;{_activation_part(activation, act)}"
    return _packed(text, n, k, weight.data, codes.reshape(n, -1), None, global_scale,
                   input_scale=input_scale)


def _ct_nvfp4(layer: _Layer, args: Mapping, act: Optional[str],
              activation: str) -> "ImportedLinear":
    rule = "nvfp4-pack-quantized stores weight_packed, weight_scale and weight_global_scale"
    layer.require(args.get("symmetric", True), "asymmetric NVFP4 is not supported")
    global_scale = layer.scalar(layer.get(".weight_global_scale", rule), ".weight_global_scale")
    # compressed-tensors divides by its global scale (w = q · s / g); qgemm multiplies by
    # the reciprocal, rounded to fp32 (relative error ≤ 2^-24 against the division).
    reciprocal = float(np.float32(1.0 / global_scale))
    return _nvfp4(layer, ".weight_packed", rule, _ct_int(args, "group_size", 16) or 16, act,
                  activation, reciprocal)


# --- modelopt -------------------------------------------------------------------------------

def import_modelopt(tensors: Mapping, prefix: str, config: Mapping, activation: str = "fp16",
                    *, quantize_activations: bool = True) -> "ImportedLinear":
    """One linear layer of a TensorRT Model Optimizer (modelopt) checkpoint: quant_algo NVFP4
    (w = e2m1 · weight_scale · weight_scale_2), FP8 (per tensor) or FP8_PER_CHANNEL_PER_TOKEN."""
    layer = _Layer(tensors, prefix, "import_modelopt", "modelopt")
    algo = str(config.get("quant_algo", "")).upper()
    input_scale = layer.opt(".input_scale")
    input_value = None if input_scale is None else layer.scalar(input_scale, ".input_scale")
    if algo == "NVFP4":
        rule = "NVFP4 stores weight, weight_scale, weight_scale_2 and input_scale"
        global_scale = layer.scalar(layer.get(".weight_scale_2", rule), ".weight_scale_2")
        act = "e2m1:nv" if quantize_activations else None
        group = _int_field(config, "group_size", "import_modelopt", 16) or 16
        return _nvfp4(layer, ".weight", rule, group, act, activation, global_scale, input_value)
    if algo in ("FP8", "FP8_PER_CHANNEL_PER_TOKEN"):
        rule = f"{algo} stores weight (e4m3) and weight_scale"
        weight = layer.get(".weight", rule)
        layer.dtype(weight, ".weight", ("F8_E4M3",))
        layer.require(weight.data.ndim == 2, f"{layer.name('.weight')} has shape "
                      f"{list(weight.shape)}; a linear layer's is [n, k]")
        layer.require(not bool(np.any((weight.data & 0x7F) == 0x7F)),
                      f"{layer.name('.weight')} holds NaN codes (rule: finite e4m3)")
        n, k = weight.shape
        per_channel = algo != "FP8"
        sf, scales = layer.scales(layer.get(".weight_scale", rule), ".weight_scale",
                                  n if per_channel else 1, 1,
                                  "per channel" if per_channel else "per tensor")
        act = "e4m3:tok" if quantize_activations else None
        text = f"w=e4m3:{'ch' if per_channel else 't'}:s={sf};{_activation_part(activation, act)}"
        return _packed(text, n, k, weight.data, scales, input_scale=input_value)
    layer.fail(f"modelopt quant_algo {config.get('quant_algo')!r} is not supported (NVFP4, FP8, "
               "FP8_PER_CHANNEL_PER_TOKEN)")


# --- gpt-oss MXFP4 --------------------------------------------------------------------------

def import_mxfp4(blocks, scales, *, expert: Optional[int] = None, activation: str = "bf16",
                 name: str = "mxfp4") -> "ImportedLinear":
    """One gpt-oss MXFP4 weight: `blocks` uint8 [.., n, k / 32, 16] (two e2m1 codes a byte,
    the low nibble first), `scales` uint8 [.., n, k / 32] (e8m0: 2^(s − 127)); a leading
    experts dimension takes `expert`. The layer is [n, k] = [out, in] (gate_up_proj: the
    2·intermediate rows interleaved, gate even and up odd; see split_interleaved_gate_up)."""
    layer = _Layer({f"{name}_blocks": blocks, f"{name}_scales": scales}, name, "import_mxfp4",
                   "gpt-oss MXFP4")
    b = layer.get("_blocks", "stores <name>_blocks and <name>_scales")
    s = layer.get("_scales", "stores <name>_blocks and <name>_scales")
    layer.dtype(b, "_blocks", ("U8",))
    layer.dtype(s, "_scales", ("U8", "F8_E8M0"))
    bd, sd = b.data, s.data
    if bd.ndim == 4:
        layer.require(expert is not None, f"{name}_blocks holds {bd.shape[0]} experts "
                      f"{list(bd.shape)}: pass expert= (0 .. {bd.shape[0] - 1})")
        layer.require(sd.ndim == 3 and sd.shape[0] == bd.shape[0] and
                      0 <= int(expert) < bd.shape[0],
                      f"expert {expert} of {name}_blocks {list(bd.shape)} and {name}_scales "
                      f"{list(sd.shape)}")
        bd, sd = bd[int(expert)], sd[int(expert)]
    else:
        layer.require(expert is None, f"{name}_blocks {list(bd.shape)} holds no experts "
                      f"(expert={expert} given)")
    layer.require(bd.ndim == 3 and bd.shape[2] == 16,
                  f"{name}_blocks has shape {list(b.shape)}; it is [(experts,) n, k / 32, 16]")
    n, blocks_k = bd.shape[:2]
    layer.require(sd.shape == (n, blocks_k),
                  f"{name}_scales has shape {list(s.shape)}; one e8m0 scale per 32 values "
                  f"needs [(experts,) n, k / 32] = [{n}, {blocks_k}]")
    layer.require(not bool(np.any(sd == 0xFF)), f"{name}_scales holds the e8m0 NaN code 255")
    k = 32 * blocks_k
    text = f"w=e2m1:g32:s=e8m0;{_activation_part(activation, None)}"
    return _packed(text, n, k, bd.reshape(n, k // 2), sd)


def select_rows(layer: "ImportedLinear", rows) -> "ImportedLinear":
    """The output rows `rows` (indices or a slice) of an imported layer, exactly: codes, scales
    and zero points of per-channel or per-group weights (and per-tensor ones) travel with
    their rows. 2-D block scales are shared across rows: not selectable."""
    w = layer.weight
    scheme = layer.scheme
    _require(scheme.granularity != "block",
             f"select_rows: a {scheme.granularity}-scaled weight's scales are shared by "
             "blocks of rows")
    index = np.arange(w.n)[rows] if isinstance(rows, slice) else np.asarray(rows, np.int64)
    _require(index.ndim == 1 and index.size > 0 and bool(np.all((index >= 0) & (index < w.n))),
             f"select_rows: rows must be indices in [0, {w.n})")
    codes = w.codes.reshape(w.n, -1)[index]
    grid_rows, grid_cols = w.scale_grid
    scales, zeros = w.scales, w.zeros
    if grid_rows == w.n:
        scales = scales.reshape(w.n, -1)[index]
        zeros = zeros.reshape(w.n, -1)[index] if zeros.size else zeros
    packed = PackedWeight.from_parts(scheme, int(index.size), w.k, codes.reshape(-1),
                                     np.ascontiguousarray(scales).reshape(-1),
                                     np.ascontiguousarray(zeros).reshape(-1) if zeros.size
                                     else None, w.global_scale)
    return ImportedLinear(scheme, packed, layer.input_permutation, layer.input_scale)


@dataclasses.dataclass
class ImportedExperts:
    """A routed expert layer (qgemm.nn.QuantMoE's parts): gate_up [E] of [2I, H] (gate rows,
    then up rows), down [E] of [H, I], fp32 biases [E, 2I] (the same row order) and [E, H] or
    None, one scheme."""

    scheme: Scheme
    gate_up: list
    down: list
    gate_up_bias: Optional[np.ndarray] = None
    down_bias: Optional[np.ndarray] = None


def import_mxfp4_experts(tensors: Mapping, prefix: str,
                         activation: str = "bf16") -> ImportedExperts:
    """gpt-oss's MXFP4 experts `prefix` (e.g. "model.layers.0.mlp.experts"):
    <prefix>.gate_up_proj_blocks / _scales / _bias and <prefix>.down_proj_blocks / _scales /
    _bias. gate_up's interleaved rows (gate even, up odd) become gate rows then up rows, its bias
    alike; every expert exact (import_mxfp4)."""
    layer = _Layer(tensors, prefix, "import_mxfp4_experts", "gpt-oss MXFP4 experts")
    rule = "store gate_up_proj_blocks / _scales and down_proj_blocks / _scales"
    blocks = {name: layer.get(f".{name}_blocks", rule) for name in ("gate_up_proj", "down_proj")}
    scales = {name: layer.get(f".{name}_scales", rule) for name in ("gate_up_proj", "down_proj")}
    experts = blocks["gate_up_proj"].data.shape[0] if blocks["gate_up_proj"].data.ndim == 4 else 0
    layer.require(experts > 0 and blocks["down_proj"].data.ndim == 4 and
                  blocks["down_proj"].data.shape[0] == experts,
                  f"gate_up_proj_blocks {list(blocks['gate_up_proj'].shape)} and down_proj_blocks "
                  f"{list(blocks['down_proj'].shape)} (rule: [experts, n, k / 32, 16] each, as "
                  "many experts)")
    gate_up, down = [], []
    for e in range(experts):
        fused = import_mxfp4(blocks["gate_up_proj"], scales["gate_up_proj"], expert=e,
                             activation=activation, name=f"{prefix}.gate_up_proj")
        scheme = fused.scheme
        gate_up.append(concat_rows(split_interleaved_gate_up(fused)).weight)
        down.append(import_mxfp4(blocks["down_proj"], scales["down_proj"], expert=e,
                                 activation=activation, name=f"{prefix}.down_proj").weight)
    inter, hidden = gate_up[0].n // 2, gate_up[0].k
    layer.require(down[0].n == hidden and down[0].k == inter,
                  f"down_proj is [{down[0].n}, {down[0].k}] an expert, gate_up_proj "
                  f"[{2 * inter}, {hidden}] (rule: down [hidden, intermediate])")

    def bias(name, rows, interleaved):
        t = layer.opt(f".{name}_bias")
        if t is None:
            return None
        layer.dtype(t, f".{name}_bias", ("F32", "F16", "BF16"))
        layer.require(t.shape == (experts, rows),
                      f"{prefix}.{name}_bias has shape {list(t.shape)} (rule: [{experts}, {rows}])")
        value = np.asarray(t.values(), np.float32)
        return np.concatenate([value[:, 0::2], value[:, 1::2]], axis=1) if interleaved else value

    return ImportedExperts(scheme, gate_up, down, bias("gate_up_proj", 2 * inter, True),
                           bias("down_proj", hidden, False))


def split_interleaved_gate_up(layer: "ImportedLinear"):
    """gpt-oss's gate_up_proj holds the gate and up projections interleaved along its output
    rows (GptOssExperts: gate = gate_up[..., ::2], up = gate_up[..., 1::2]). Returns the two
    [intermediate, k] layers (gate, up), exact; their biases split alike: bias[::2], bias[1::2]."""
    _require(layer.weight.n % 2 == 0,
             f"split_interleaved_gate_up: {layer.weight.n} rows do not interleave two halves")
    return select_rows(layer, slice(0, None, 2)), select_rows(layer, slice(1, None, 2))


_UE4M3_VALUES = np.array([E4M3_VALUES[c] for c in range(0x7F)])  # ue4m3 codes 0 .. 126


def _round_ue4m3(values: np.ndarray) -> np.ndarray:
    """ue4m3 codes of non-negative values, rounded to nearest (ties to the even code),
    saturating at 448."""
    values = np.minimum(values, _UE4M3_VALUES[-1])
    hi = np.clip(np.searchsorted(_UE4M3_VALUES, values), 1, len(_UE4M3_VALUES) - 1)
    lo = hi - 1
    d_lo, d_hi = values - _UE4M3_VALUES[lo], _UE4M3_VALUES[hi] - values
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    return np.where(pick_hi, hi, lo).astype(np.uint8)


def concat_rows(layers: Sequence["ImportedLinear"], *,
                rescale_global: bool = False) -> "ImportedLinear":
    """Layers of one input stacked along their outputs (fused QKV, gate_up), exactly, where
    they share their scheme and global scale. NVFP4 shards carry one global scale each
    (weight_scale_2): modelopt's export gives the shards of a fused layer the same one
    (quant_utils.preprocess_linear_fusion: one weight amax for them all), and vLLM keeps the
    max. Shards whose global scales differ are an error, unless rescale_global: then the
    global scale is the largest, and each shard's block scales are multiplied by
    its_global / largest and rounded to ue4m3 again (an error of up to 1/16 of a scale, which
    keeping the shards as separate layers avoids)."""
    _require(len(layers) > 0, "concat_rows: no layers given")
    first = layers[0]
    for other in layers[1:]:
        _require(other.scheme == first.scheme,
                 f"concat_rows: schemes differ ({first.scheme} and {other.scheme})")
        _require(other.weight.k == first.weight.k,
                 f"concat_rows: k differs ({first.weight.k} and {other.weight.k})")
        same_permutation = (other.input_permutation is None and first.input_permutation is None
                            ) or (other.input_permutation is not None and
                                  first.input_permutation is not None and
                                  np.array_equal(other.input_permutation,
                                                 first.input_permutation))
        _require(same_permutation, "concat_rows: the layers' input permutations differ")
    scheme = first.scheme
    _require(scheme.granularity in ("channel", "group"),
             f"concat_rows: {scheme.granularity} scales do not stack by rows exactly")
    globals_ = [layer.weight.global_scale for layer in layers]
    scales = [layer.weight.scales for layer in layers]
    target = max(globals_)
    if any(g != target for g in globals_):
        _require(rescale_global,
                 f"concat_rows: the layers' global scales differ ({globals_}); modelopt gives "
                 "fused shards one global scale (pass rescale_global=True to rescale the block "
                 "scales to the largest, or keep the layers separate)")
        _require(scheme.scale_format == "ue4m3",
                 f"concat_rows: rescaling {scheme.scale_format} scales is not supported")
        scales = [s if g == target else _round_ue4m3(_UE4M3_VALUES[s] * (g / target))
                  for s, g in zip(scales, globals_)]
    n = sum(layer.weight.n for layer in layers)
    zeros = [layer.weight.zeros for layer in layers]
    packed = PackedWeight.from_parts(
        scheme, n, first.weight.k, np.concatenate([l.weight.codes for l in layers]),
        np.concatenate(scales), np.concatenate(zeros) if zeros[0].size else None, target)
    return ImportedLinear(scheme, packed, first.input_permutation, None)


# --- FP8 block (DeepSeek-V3) ------------------------------------------------------------------

def import_fp8_block(weight, weight_scale_inv, *, block_size=(128, 128), activation="bf16",
                     quantize_activations: bool = True, name: str = "fp8") -> "ImportedLinear":
    """One FP8 layer as DeepSeek-V3 and transformers' FineGrainedFP8 store it: `weight` e4m3
    [n, k], `weight_scale_inv` [ceil(n / bn), ceil(k / bk)] (fp32, or e8m0 with scale_fmt
    ue8m0) multiplying each block: w = e4m3 · weight_scale_inv. block_size None: one
    per-tensor scale. Activations: dynamic e4m3 in 1 x bk groups (the fp8-block preset)."""
    layer = _Layer({f"{name}.weight": weight, f"{name}.weight_scale_inv": weight_scale_inv},
                   name, "import_fp8_block", "FP8 (quant_method fp8)")
    w = layer.get(".weight", "stores weight and weight_scale_inv")
    layer.dtype(w, ".weight", ("F8_E4M3",))
    layer.require(w.data.ndim == 2, f"{name}.weight has shape {list(w.shape)}; a linear "
                  "layer's is [n, k]")
    layer.require(not bool(np.any((w.data & 0x7F) == 0x7F)),
                  f"{name}.weight holds NaN codes (rule: finite e4m3)")
    n, k = w.shape
    s = layer.get(".weight_scale_inv", "stores weight and weight_scale_inv")
    if block_size is None:
        granularity, rows, cols, act = "t", 1, 1, "e4m3:tok"
    else:
        layer.require(_is_block_shape(block_size), "weight_block_size must be two positive "
                      f"integers below 2^31 ({block_size!r} given)")
        bn, bk = (int(v) for v in block_size)
        granularity, rows, cols = f"b{bn}x{bk}", -(-n // bn), -(-k // bk)
        act = f"e4m3:g{bk}"
    sf, scales = layer.scales(s, ".weight_scale_inv", rows, cols,
                              f"[ceil(n / {block_size[0]}), ceil(k / {block_size[1]})]"
                              if block_size is not None else "per tensor",
                              allowed=("F32", "BF16", "F16", "F8_E8M0"))
    text = (f"w=e4m3:{granularity}:s={sf};"
            f"{_activation_part(activation, act if quantize_activations else None)}")
    return _packed(text, n, k, w.data, scales)


# --- BitNet --------------------------------------------------------------------------------

BITNET_VALUES_PER_BYTE = 4


def unpack_bitnet(packed: np.ndarray, n: int) -> np.ndarray:
    """Ternary values [n, k] (int8 −1, 0, 1) of transformers' BitNet packing: uint8
    [ceil(n / 4), k]; row r of the 4 row blocks' i-th holds row i · ceil(n / 4) + r of the
    weight in bits [2i, 2i + 2), stored as value + 1."""
    rows = packed.shape[0]
    out = np.empty((rows * BITNET_VALUES_PER_BYTE, packed.shape[1]), np.int16)
    for i in range(BITNET_VALUES_PER_BYTE):
        out[i * rows:(i + 1) * rows] = (packed >> np.uint8(2 * i)) & np.uint8(3)
    return (out[:n] - 1).astype(np.int8)


def import_bitnet(weight, weight_scale, *, linear_class: str = "bitlinear",
                  out_features: Optional[int] = None, activation: str = "bf16",
                  quantize_activations: bool = True, name: str = "bitnet") -> "ImportedLinear":
    """One offline-quantized BitNet b1.58 layer as transformers stores it
    (integrations/bitnet.py): `weight` uint8 [ceil(n / 4), k] (see unpack_bitnet; for
    autobitlinear also the ternary values themselves, [n, k] in a float type) and
    `weight_scale` (one value). BitLinear divides by it (y = x·Wᵀ / weight_scale): qgemm's
    per-tensor scale is its reciprocal in fp32 (relative error ≤ 2^-24); AutoBitLinear
    multiplies (y = x·Wᵀ · weight_scale): the scale as is. Maps to the bitnet preset (ternary
    weights, per-tensor fp32 scale; int8 per-token activations as BitLinear quantizes them)."""
    layer = _Layer({f"{name}.weight": weight, f"{name}.weight_scale": weight_scale}, name,
                   "import_bitnet", "BitNet")
    _require(linear_class in ("bitlinear", "autobitlinear"),
             f"import_bitnet: linear_class must be 'bitlinear' or 'autobitlinear' "
             f"({linear_class!r})")
    w = layer.get(".weight", "stores weight and weight_scale")
    layer.require(w.data.ndim == 2, f"{name}.weight has shape {list(w.shape)}; it is "
                  "[ceil(n / 4), k] packed (or [n, k] ternary values)")
    if w.dtype == "U8":
        rows, k = w.shape
        n = rows * BITNET_VALUES_PER_BYTE if out_features is None else int(out_features)
        layer.require(rows == -(-n // BITNET_VALUES_PER_BYTE),
                      f"{name}.weight has {rows} packed rows; out_features {n} needs "
                      f"ceil(n / 4) = {-(-n // BITNET_VALUES_PER_BYTE)}")
        fields = np.stack([(w.data >> np.uint8(2 * i)) & np.uint8(3) for i in range(4)])
        layer.require(not bool(np.any(fields == 3)),
                      f"{name}.weight holds the 2-bit code 3, which is no ternary value "
                      "(rule: stored value + 1 in {0, 1, 2})")
        values = unpack_bitnet(w.data, n)
    else:
        layer.require(linear_class == "autobitlinear" and w.dtype in FLOAT_TYPES,
                      f"{name}.weight is {w.dtype}; BitLinear stores it packed as U8")
        values = np.asarray(w.values(), np.float64)
        layer.require(bool(np.all(np.isin(values, (-1.0, 0.0, 1.0)))),
                      f"{name}.weight holds values other than -1, 0, 1 (an online-quantized "
                      "checkpoint stores full-precision weights: quantize them with "
                      "qgemm.quantize_model(model, 'bitnet'))")
        n, k = values.shape
        layer.require(out_features is None or int(out_features) == n,
                      f"{name}.weight has {n} rows; out_features is {out_features}")
        values = values.astype(np.int8)
    stored = layer.scalar(layer.get(".weight_scale", "stores weight and weight_scale"),
                          ".weight_scale")
    scale = np.float32(1.0 / stored if linear_class == "bitlinear" else stored)
    codes = pack_canonical(values.astype(np.int64) & 3, 2)  # ternary: 2-bit two's complement
    act = "int8:tok" if quantize_activations else None
    text = f"w=ternary:t:s=fp32;{_activation_part(activation, act)}"
    return _packed(text, n, k, codes, np.array([scale], "<f4").view(np.uint8))


# --- configs, dispatch, files --------------------------------------------------------------

def _json_type(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def _read_json_object(path: str) -> dict:
    """A JSON file holding an object (config.json, hf_quant_config.json), else qgemm.Error
    naming the file and the rule."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError
        raise Error(f"{path} is not JSON ({type(error).__name__}: {error})") from None
    _require(isinstance(value, dict), f"{path} holds a JSON {_json_type(value)} (rule: a JSON "
             "object)")
    return value


def quantization_config(model_dir: str) -> dict:
    """The `quantization_config` of a model directory's config.json; for modelopt exports
    that keep it in hf_quant_config.json ({"producer", "quantization": {"quant_algo", ...}}),
    that one's "quantization" with quant_method "modelopt"."""
    config = {}
    path = os.path.join(model_dir, "config.json")
    if os.path.exists(path):
        config = _read_json_object(path)
    if "quantization_config" in config:
        q = config["quantization_config"]
        _require(isinstance(q, dict), f"{path}: quantization_config is a JSON "
                 f"{_json_type(q)} (rule: a JSON object)")
        q = dict(q)
        if q.get("quant_method") == "modelopt" and isinstance(q.get("quantization"), dict):
            q = {**q.pop("quantization"), **q}
        return q
    modelopt = os.path.join(model_dir, "hf_quant_config.json")
    if os.path.exists(modelopt):
        q = _read_json_object(modelopt)
        _require(isinstance(q.get("quantization"), dict),
                 f"{modelopt} has no 'quantization' object")
        return {"quant_method": "modelopt", **q["quantization"]}
    raise Error(f"{model_dir}/config.json has no quantization_config (nor is there a modelopt "
                "hf_quant_config.json)")


SUPPORTED_METHODS = ("gptq", "awq", "compressed-tensors", "modelopt", "mxfp4", "fp8", "bitnet")


def import_linear(tensors: Mapping, prefix: str, config: Mapping, activation: str = "fp16", *,
                  quantize_activations: bool = True,
                  expert: Optional[int] = None) -> ImportedLinear:
    """The layer `prefix` (e.g. "model.layers.0.mlp.down_proj") of a checkpoint's tensors
    (numpy arrays, torch tensors or qgemm.tensors.StoredTensor), as its quantization_config
    describes it. `activation`: the model's 16-bit type (the scheme's output, and its
    activations where they stay 16-bit). quantize_activations: where the checkpoint quantizes
    activations (FP8 W8A8, NVFP4 W4A4, BitNet's int8, DeepSeek's 1x128 FP8) the scheme does too,
    dynamically; False keeps them 16-bit. expert: gpt-oss MXFP4 experts' index."""
    method = config.get("quant_method")
    if method in ("gptq", "awq"):
        layer = _Layer(tensors, prefix + ".", "import_linear", method.upper())
        rule = "stores qweight, qzeros and scales"
        get = lambda name: layer.get(name, rule).values()
    if method == "gptq":
        g_idx = layer.opt("g_idx")
        return import_gptq(get("qweight"), get("qzeros"), get("scales"),
                           None if g_idx is None else g_idx.values(),
                           bits=_int_field(config, "bits", "import_linear (GPTQ)"),
                           group_size=_int_field(config, "group_size", "import_linear (GPTQ)"),
                           checkpoint_format=config.get("checkpoint_format", "gptq"),
                           activation=activation)
    if method == "awq":
        group_key = "group_size" if config.get("group_size") is not None else "q_group_size"
        bits_key = "bits" if config.get("bits") is not None else "w_bit"
        return import_awq(get("qweight"), get("qzeros"), get("scales"),
                          group_size=_int_field(config, group_key, "import_linear (AWQ)"),
                          bits=_int_field(config, bits_key, "import_linear (AWQ)", 4),
                          activation=activation)
    if method == "compressed-tensors":
        return import_compressed_tensors(tensors, prefix, config, activation,
                                         quantize_activations=quantize_activations)
    if method == "modelopt":
        return import_modelopt(tensors, prefix, config, activation,
                               quantize_activations=quantize_activations)
    if method == "mxfp4":
        layer = _Layer(tensors, prefix, "import_linear", "gpt-oss MXFP4")
        rule = "stores <name>_blocks and <name>_scales"
        return import_mxfp4(layer.get("_blocks", rule), layer.get("_scales", rule),
                            expert=expert, activation=activation, name=prefix)
    if method == "fp8":
        layer = _Layer(tensors, prefix, "import_linear", "FP8 (quant_method fp8)")
        rule = "stores weight and weight_scale_inv"
        block = config.get("weight_block_size", (128, 128))
        return import_fp8_block(layer.get(".weight", rule), layer.get(".weight_scale_inv", rule),
                                block_size=block, activation=activation,
                                quantize_activations=quantize_activations, name=prefix)
    if method == "bitnet":
        _require(config.get("quantization_mode", "offline") == "offline",
                 "import_linear: BitNet quantization_mode 'online' stores full-precision "
                 "weights; quantize them with qgemm.quantize_model(model, 'bitnet')")
        _require(not config.get("use_rms_norm", False),
                 "import_linear: BitNet use_rms_norm puts an RMSNorm inside each BitLinear, "
                 "which a qgemm linear layer does not hold")
        layer = _Layer(tensors, prefix, "import_linear", "BitNet")
        rule = "stores weight and weight_scale"
        return import_bitnet(layer.get(".weight", rule), layer.get(".weight_scale", rule),
                             linear_class=config.get("linear_class", "bitlinear"),
                             activation=activation, quantize_activations=quantize_activations,
                             name=prefix)
    raise Error(f"import_linear: quant_method {method!r} is not supported "
                f"({', '.join(SUPPORTED_METHODS)})")


def quantized_prefixes(keys: Iterable[str], config: Mapping) -> list:
    """The layers a checkpoint stores quantized, by their tensors' names: <prefix>.qweight
    (GPTQ, AWQ), .weight_packed (compressed-tensors packed), .weight_scale_inv (FP8 block), or
    .weight beside .weight_scale (FP8, NVFP4, BitNet, compressed-tensors' naive formats).
    gpt-oss MXFP4 experts are routed expert layers: quantized_experts."""
    keys = set(keys)
    method = config.get("quant_method")
    _require(method in SUPPORTED_METHODS,
             f"quant_method {method!r} is not supported ({', '.join(SUPPORTED_METHODS)})")
    prefixes = set()
    for key in keys:
        base, _, leaf = key.rpartition(".")
        if leaf in ("qweight", "weight_packed", "weight_scale_inv") or (
                leaf == "weight_scale" and f"{base}.weight" in keys):
            prefixes.add(base)
    return sorted(prefixes)


def quantized_experts(keys: Iterable[str], config: Mapping) -> list:
    """The routed expert layers a checkpoint stores quantized: gpt-oss MXFP4's
    <prefix>.gate_up_proj_blocks beside <prefix>.down_proj_blocks (import_mxfp4_experts)."""
    keys = set(keys)
    if config.get("quant_method") != "mxfp4":
        return []
    found = sorted(key[:-len(".gate_up_proj_blocks")] for key in keys
                   if key.endswith(".gate_up_proj_blocks"))
    for prefix in found:
        _require(f"{prefix}.down_proj_blocks" in keys,
                 f"{prefix}.gate_up_proj_blocks has no {prefix}.down_proj_blocks beside it "
                 "(rule: gpt-oss MXFP4 experts store both)")
    return found


def load_linear(model_dir: str, prefix: str, activation: str = "fp16", *,
                quantize_activations: bool = True, expert: Optional[int] = None) -> ImportedLinear:
    """The layer `prefix` of a model directory (config.json and *.safetensors; a layer's
    tensors may lie in several shards). gpt-oss MXFP4: `prefix` names the experts' weight
    (e.g. "model.layers.0.mlp.experts.down_proj") and `expert` the expert."""
    config = quantization_config(model_dir)
    mxfp4 = config.get("quant_method") == "mxfp4"
    found = {}
    for name in sorted(os.listdir(model_dir)):
        if not name.endswith(".safetensors"):
            continue
        f = SafetensorsFile(os.path.join(model_dir, name))
        for key in f.keys():
            if key.startswith(prefix + ".") or (mxfp4 and key in (f"{prefix}_blocks",
                                                                   f"{prefix}_scales")):
                found[key] = f.get(key)
    _require(bool(found), f"load_linear: no tensors named {prefix}.* in {model_dir}")
    return import_linear(found, prefix, config, activation,
                         quantize_activations=quantize_activations, expert=expert)
