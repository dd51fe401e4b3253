"""The plugin's core, free of vLLM: which tensors a quantized linear layer of a checkpoint
stores (names, per-partition shapes, dtypes, and how tensor parallelism splits them), how the
loaded tensors of a layer (fused QKV / gate_up included) become one qgemm weight, and the
forward. vLLM's side (qgemm_vllm.vllm_plugin) turns each TensorSpec into the vLLM parameter
class it names; the GPU check (python/qgemm_vllm/gpu_check.py) builds the same layers without
vLLM, with plain parameters.

A layer's partition: `output_sizes` are its logical shards on this rank (one for a plain
layer; q, k, v for QKV; gate, up for gate_up), each a checkpoint layer of its own
(`shard_prefixes`); `k` is its input features on this rank. The tensors below are as the
checkpoint stores them (see qgemm.checkpoint for the layouts), restricted to this rank:

  GPTQ              qweight [k/p, n] (packed along K, p = 32/bits), qzeros [groups, n/p],
                    scales fp16 [groups, n], g_idx [k]
  AWQ               qweight [k, n/8], qzeros [groups, n/8] (packed along N), scales fp16
                    [groups, n]
  compressed-tensors pack-quantized: weight_packed [n, k·bits/32], weight_scale [n, groups]
                    (channel [n, 1], tensor: one per shard), weight_zero_point (asymmetric)
                    [n·bits/32, groups], weight_g_idx [k] (act-order); float/int-quantized:
                    weight [n, k] (e4m3 / int8), weight_scale (tensor, channel, group, block);
                    nvfp4-pack-quantized: weight_packed uint8 [n, k/2], weight_scale e4m3
                    [n, k/16], weight_global_scale one per shard
  modelopt          NVFP4: weight uint8 [n, k/2], weight_scale e4m3 [n, k/16], weight_scale_2
                    and input_scale one per shard; FP8: weight e4m3 [n, k], weight_scale one
                    per shard (per channel: [n, 1]), input_scale one per shard
  FP8 block         weight e4m3 [n, k], weight_scale_inv fp32 [ceil(n/bn), ceil(k/bk)]

How a layer becomes one qgemm weight (`build_weight`): where every tensor splits by output
rows (no per-shard values), the fused tensor is itself a checkpoint layer of that format, and
qgemm.checkpoint imports it whole. Where a shard has a value of its own (a per-tensor scale,
NVFP4's global scale), each shard is imported on its own and the shards are stacked with
qgemm.checkpoint.concat_rows: per-tensor scales become per-channel ones (exact); NVFP4 shards
with different global scales are rescaled to the largest (concat_rows' rescale_global, an
error of up to 1/16 of a block scale; modelopt's exports give fused shards one global scale).
"""

from __future__ import annotations

import dataclasses
import os
import re
from fractions import Fraction
from typing import Mapping, Optional, Sequence

import numpy as np
import torch

import qgemm
from qgemm import checkpoint
from qgemm.checkpoint import ImportedLinear

# The checkpoint formats the plugin claims, by quant_method (mxfp4: gpt-oss, whose quantized
# weights are all MoE experts).
CLAIMED_METHODS = ("gptq", "awq", "compressed-tensors", "modelopt", "mxfp4", "fp8")

ACTIVATION_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


class PluginError(ValueError):
    """A checkpoint or setting the plugin cannot serve, with the reason."""


def normalized_config(config: Mapping) -> dict:
    """The checkpoint's quantization config as qgemm.checkpoint reads it: modelopt's nested
    {"quantization": {"quant_algo", ...}} (hf_quant_config.json, or config.json with
    quant_method "modelopt") is flattened, with quant_method "modelopt"."""
    config = dict(config or {})
    inner = config.get("quantization")
    if isinstance(inner, dict) and (config.get("quant_method") in (None, "modelopt")):
        config = {**{k: v for k, v in config.items() if k != "quantization"}, **inner,
                  "quant_method": "modelopt"}
    if config.get("quant_method") == "modelopt" and "quant_algo" not in config:
        raise PluginError("the modelopt quantization config has no quant_algo")
    return config


# --- settings ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Settings:
    """What the user chooses beyond the checkpoint. From QGEMM_* environment variables, or
    from a "qgemm" object inside the checkpoint's quantization_config (for example through
    `--hf-overrides`); the environment wins.

    activations  QGEMM_ACTIVATIONS / "activations": "checkpoint" (default: the checkpoint's
                 activation quantization: FP8 W8A8 and NVFP4 W4A4 quantize activations,
                 W4A16 keeps them 16-bit), "16bit" (never quantize them), or a qgemm
                 activation format that replaces the scheme's a= part, e.g. "e4m3:tok"
                 (W4A8 on a W4A16 checkpoint) or "int8:tok".
    max_rows     QGEMM_MAX_ROWS / "max_rows": the most tokens one call is expected to have
                 (Engine.prepare_weight's max_rows; default 65536). Larger calls still work.
    """

    activations: str = "checkpoint"
    max_rows: int = 65536

    @classmethod
    def load(cls, config: Optional[Mapping] = None) -> "Settings":
        given = dict((config or {}).get("qgemm") or {})
        unknown = set(given) - {"activations", "max_rows"}
        if unknown:
            raise PluginError(f"quantization_config.qgemm: unknown settings {sorted(unknown)} "
                              "(activations, max_rows)")
        activations = os.environ.get("QGEMM_ACTIVATIONS", given.get("activations",
                                                                    "checkpoint"))
        max_rows_text = os.environ.get("QGEMM_MAX_ROWS", given.get("max_rows", 65536))
        try:
            max_rows = int(max_rows_text)
        except (TypeError, ValueError):
            raise PluginError(f"QGEMM_MAX_ROWS must be a positive integer "
                              f"({max_rows_text!r} given)") from None
        if max_rows < 1:
            raise PluginError(f"QGEMM_MAX_ROWS must be a positive integer ({max_rows} given)")
        activations = str(activations).strip()
        if activations not in ("checkpoint", "16bit"):
            # A format some weight takes (whether the checkpoint's does is checked per layer).
            errors = []
            for weights in ("w=uint4:g128:s=fp16:zp=mid", "w=e4m3:ch:s=fp32",
                            "w=e2m1:g16:s=ue4m3:global"):
                try:
                    qgemm.Scheme(f"{weights};a={activations};o=bf16")
                    break
                except qgemm.Error as error:
                    errors.append(str(error))
            else:
                raise PluginError(f"QGEMM_ACTIVATIONS must be 'checkpoint', '16bit' or a "
                                  f"qgemm activation format such as 'e4m3:tok' "
                                  f"({activations!r} given: {errors[0]})")
        return cls(activations, max_rows)


# --- tensor specs ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One stored tensor of a layer, on this rank.

    param_class  the vLLM parameter class that loads it (its tensor-parallel split):
                 PackedvLLMParameter, ModelWeightParameter, GroupQuantScaleParameter,
                 BlockQuantScaleParameter, PackedColumnParameter, ChannelQuantScaleParameter,
                 RowvLLMParameter, PerTensorScaleParameter (one value per logical shard) or
                 BasevLLMParameter (replicated).
    output_rows  stored entries along output_dim per output row (1; 1/p packed along N;
                 1/bn for block scales, rounded up per shard).
    fill         the value before loading (a checkpoint that leaves the tensor out keeps it):
                 None (torch.empty), a number, or "group_index" (k // group: GPTQ's g_idx of a
                 checkpoint without act-order).
    used         False for tensors loaded only so that the checkpoint loads (static activation
                 scales: qgemm quantizes activations dynamically).
    """

    name: str
    shape: tuple
    dtype: torch.dtype
    param_class: str
    output_dim: Optional[int] = None
    input_dim: Optional[int] = None
    packed_dim: Optional[int] = None
    packed_factor: Optional[int] = None
    output_rows: Fraction = Fraction(1)
    block_rows: Optional[int] = None
    fill: object = None
    group: Optional[int] = None
    used: bool = True


def _exact(value, what: str) -> int:
    value = Fraction(value)
    if value.denominator != 1:
        raise PluginError(f"{what} is not a whole number ({value})")
    return int(value)


@dataclasses.dataclass
class LayerPartition:
    """A linear layer on this rank: its logical shards' output sizes and checkpoint prefixes,
    its input features k, and whether tensor parallelism splits its inputs (row-parallel)."""

    prefix: str
    output_sizes: Sequence[int]
    k: int
    shard_prefixes: Sequence[str]
    input_split: bool = False

    @property
    def n(self) -> int:
        return int(sum(self.output_sizes))


def _ct_group(config: Mapping, prefix: str) -> Optional[Mapping]:
    """The compressed-tensors config group of a layer (its targets' precedence as
    qgemm.checkpoint applies it), or None where the layer is ignored or untargeted."""
    for pattern in config.get("ignore") or ():
        if checkpoint._ct_target_rank(prefix, pattern) in (0, 1):
            return None
    best = None
    for group in (config.get("config_groups") or {}).values():
        for target in group.get("targets") or ():
            rank = checkpoint._ct_target_rank(prefix, target)
            if rank is not None and (best is None or rank < best[0]):
                best = (rank, group)
    return None if best is None or not best[1].get("weights") else best[1]


def is_quantized(config: Mapping, prefix: str, experts: bool = False) -> bool:
    """Whether the checkpoint stores the layer `prefix` quantized: a linear layer (or, with
    experts=True, a MoE layer's experts) not in its ignore / exclude lists and targeted
    (compressed-tensors). MoE routers and lm_head are never quantized here; gpt-oss MXFP4
    quantizes only its experts. Unquantized layers stay with vLLM's own methods."""
    method = config.get("quant_method")
    name = prefix.rsplit(".", 1)[-1]
    if "lm_head" in prefix:
        return False
    if not experts and (method == "mxfp4" or name in ("gate", "router")):
        return False
    if method == "compressed-tensors":
        return _ct_group(config, prefix) is not None
    skip = []
    for key in ("modules_to_not_convert", "exclude_modules", "ignored_layers", "ignore"):
        skip += list(config.get(key) or [])
    for pattern in skip:  # vLLM's rule: a "re:" regex, else a substring of the name
        if pattern.startswith("re:"):
            if re.match(pattern[3:], prefix):
                return False
        elif pattern and pattern in prefix:
            return False
    return True


def tensor_specs(config: Mapping, part: LayerPartition, params_dtype: torch.dtype
                 ) -> list:
    """The stored tensors of one quantized linear layer on this rank (see the module's
    docstring). Raises PluginError naming the rule where the layer cannot be served."""
    method = config.get("quant_method")
    n, k, shards = part.n, part.k, len(part.output_sizes)
    I32, F32, F16 = torch.int32, torch.float32, torch.float16
    E4M3, U8 = torch.float8_e4m3fn, torch.uint8

    def per_shard(name, used=True, fill=None):
        return TensorSpec(name, (shards,), F32, "PerTensorScaleParameter", used=used,
                          fill=fill)

    if method in ("gptq", "awq"):
        bits = int(config.get("bits", config.get("w_bit", 4)))
        group = int(config.get("group_size", config.get("q_group_size", -1)))
        if method == "gptq" and bits not in (2, 4, 8):
            raise PluginError(f"GPTQ bits {bits}: qgemm reads 2-, 4- and 8-bit GPTQ")
        if method == "awq" and bits != 4:
            raise PluginError(f"AWQ bits {bits}: AWQ packs 4-bit codes")
        p = 32 // bits
        group_k = k if group <= 0 else group
        if k % group_k or k % p:
            raise PluginError(f"{part.prefix}: k = {k} on this rank is not a multiple of the "
                              f"group size {group_k} and of {p} codes per word")
        act_order = bool(config.get("desc_act", False))
        if act_order and part.input_split:
            raise PluginError(f"{part.prefix}: GPTQ act-order (desc_act) with the layer's "
                              "inputs split by tensor parallelism is not supported by the "
                              "qgemm plugin yet (its groups span ranks)")
        groups = 1 if group <= 0 else k // group
        if group > 0:
            scale_cls, scale_dims = "GroupQuantScaleParameter", dict(output_dim=1, input_dim=0)
            zero_cls, zero_dims = "PackedvLLMParameter", dict(output_dim=1, input_dim=0)
        else:
            scale_cls, scale_dims = "ChannelQuantScaleParameter", dict(output_dim=1)
            zero_cls, zero_dims = "PackedColumnParameter", dict(output_dim=1)
        if n % p:
            raise PluginError(f"{part.prefix}: n = {n} is not a multiple of {p}")
        zeros = TensorSpec("qzeros", (groups, n // p), I32, zero_cls, packed_dim=1,
                           packed_factor=p, output_rows=Fraction(1, p), **zero_dims)
        scales = TensorSpec("scales", (groups, n), F16, scale_cls, **scale_dims)
        if method == "awq":
            return [TensorSpec("qweight", (k, n // p), I32, "PackedvLLMParameter", output_dim=1,
                               input_dim=0, packed_dim=1, packed_factor=p,
                               output_rows=Fraction(1, p)), zeros, scales]
        return [TensorSpec("qweight", (k // p, n), I32, "PackedvLLMParameter", output_dim=1,
                           input_dim=0, packed_dim=0, packed_factor=p),
                zeros, scales,
                TensorSpec("g_idx", (k,), I32, "RowvLLMParameter", input_dim=0,
                           fill="group_index", group=group_k)]

    if method == "fp8":
        block = config.get("weight_block_size")
        if not block:
            raise PluginError("quant_method fp8 without weight_block_size (per-tensor FP8) is "
                              "not claimed by qgemm; FP8-block checkpoints are")
        bn, bk = (int(v) for v in block)
        return [TensorSpec("weight", (n, k), E4M3, "ModelWeightParameter", output_dim=0,
                           input_dim=1),
                TensorSpec("weight_scale_inv", (-(-n // bn), -(-k // bk)), F32,
                           "BlockQuantScaleParameter", output_dim=0, input_dim=1,
                           block_rows=bn)]

    if method == "modelopt":
        algo = str(config.get("quant_algo", "")).upper()
        if algo == "NVFP4":
            return [TensorSpec("weight", (n, k // 2), U8, "PackedvLLMParameter", output_dim=0,
                               input_dim=1, packed_dim=1, packed_factor=2),
                    TensorSpec("weight_scale", (n, -(-k // 16)), E4M3,
                               "GroupQuantScaleParameter", output_dim=0, input_dim=1),
                    per_shard("weight_scale_2"), per_shard("input_scale", used=False, fill=1.0)]
        if algo in ("FP8", "FP8_PER_CHANNEL_PER_TOKEN"):
            scale = (per_shard("weight_scale") if algo == "FP8" else
                     TensorSpec("weight_scale", (n, 1), F32, "ChannelQuantScaleParameter",
                                output_dim=0))
            return [TensorSpec("weight", (n, k), E4M3, "ModelWeightParameter", output_dim=0,
                               input_dim=1), scale,
                    per_shard("input_scale", used=False, fill=1.0)]
        raise PluginError(f"modelopt quant_algo {config.get('quant_algo')!r} is not claimed "
                          "by qgemm (NVFP4, FP8, FP8_PER_CHANNEL_PER_TOKEN)")

    if method == "compressed-tensors":
        group_cfg = _ct_group(config, part.shard_prefixes[0])
        if group_cfg is None:
            raise PluginError(f"{part.prefix}: no compressed-tensors config group quantizes it")
        args = group_cfg["weights"]
        fmt = group_cfg.get("format") or config.get("format")
        strategy = checkpoint._ct_strategy(args)
        bits = int(args.get("num_bits", 8))
        symmetric = bool(args.get("symmetric", True))
        inputs = group_cfg.get("input_activations") or {}
        static_input = [per_shard("input_scale", used=False, fill=1.0)] if (
            inputs and not inputs.get("dynamic", True)) else []
        scale_dtype = params_dtype

        def scale_spec(dtype):
            if strategy == "tensor":
                return per_shard("weight_scale")
            if strategy == "channel":
                return TensorSpec("weight_scale", (n, 1), dtype, "ChannelQuantScaleParameter",
                                  output_dim=0)
            if strategy == "group":
                g = int(args.get("group_size") or 0)
                if g <= 0 or k % g:
                    raise PluginError(f"{part.prefix}: k = {k} on this rank is not a multiple "
                                      f"of group_size {g}")
                return TensorSpec("weight_scale", (n, k // g), dtype,
                                  "GroupQuantScaleParameter", output_dim=0, input_dim=1)
            if strategy == "block":
                block = args.get("block_structure")
                bn, bk = (int(v) for v in (block.split("x") if isinstance(block, str)
                                           else block))
                return TensorSpec("weight_scale", (-(-n // bn), -(-k // bk)), dtype,
                                  "BlockQuantScaleParameter", output_dim=0, input_dim=1,
                                  block_rows=bn)
            raise PluginError(f"compressed-tensors strategy {strategy!r} is not supported")

        if fmt == "pack-quantized":
            if bits not in (2, 4, 8):
                raise PluginError(f"compressed-tensors pack-quantized num_bits {bits}: qgemm "
                                  "reads 2, 4 and 8")
            p = 32 // bits
            if k % p:
                raise PluginError(f"{part.prefix}: k = {k} is not a multiple of {p}")
            specs = [TensorSpec("weight_packed", (n, k // p), I32, "PackedvLLMParameter",
                                output_dim=0, input_dim=1, packed_dim=1, packed_factor=p),
                     scale_spec(scale_dtype),
                     TensorSpec("weight_shape", (2,), torch.int64, "BasevLLMParameter",
                                used=False)]
            if not symmetric:
                if strategy not in ("group", "channel") or n % p:
                    raise PluginError(f"{part.prefix}: asymmetric pack-quantized needs the "
                                      f"group or channel strategy and n a multiple of {p}")
                groups = specs[1].shape[1]
                dims = dict(output_dim=0, input_dim=1) if strategy == "group" else \
                    dict(output_dim=0)
                cls = "PackedvLLMParameter" if strategy == "group" else "PackedColumnParameter"
                specs.append(TensorSpec("weight_zero_point", (n // p, groups), I32, cls,
                                        packed_dim=0, packed_factor=p,
                                        output_rows=Fraction(1, p), **dims))
            if args.get("actorder") and strategy == "group":
                if part.input_split:
                    raise PluginError(f"{part.prefix}: act-order with the layer's inputs "
                                      "split by tensor parallelism is not supported yet")
                g = int(args["group_size"])
                specs.append(TensorSpec("weight_g_idx", (k,), I32, "RowvLLMParameter",
                                        input_dim=0, fill="group_index", group=g))
            return specs + static_input
        if fmt in ("float-quantized", "int-quantized", "naive-quantized"):
            kind = str(args.get("type", "int")).lower()
            if not symmetric:
                raise PluginError(f"{part.prefix}: asymmetric {fmt} is not claimed by qgemm")
            dtype = E4M3 if kind == "float" else torch.int8
            scale = scale_spec(F32 if kind == "float" else scale_dtype)
            return [TensorSpec("weight", (n, k), dtype, "ModelWeightParameter", output_dim=0,
                               input_dim=1), scale] + static_input
        if fmt == "nvfp4-pack-quantized":
            return [TensorSpec("weight_packed", (n, k // 2), U8, "PackedvLLMParameter",
                               output_dim=0, input_dim=1, packed_dim=1, packed_factor=2),
                    TensorSpec("weight_scale", (n, -(-k // 16)), E4M3,
                               "GroupQuantScaleParameter", output_dim=0, input_dim=1),
                    per_shard("weight_global_scale"),
                    per_shard("input_global_scale", used=False, fill=1.0)]
        raise PluginError(f"compressed-tensors format {fmt!r} is not claimed by qgemm "
                          "(pack-quantized, float-quantized, int-quantized, naive-quantized, "
                          "nvfp4-pack-quantized)")
    raise PluginError(f"quant_method {method!r} has no qgemm linear layers "
                      f"({', '.join(CLAIMED_METHODS)})")


def initial_tensor(spec: TensorSpec, device=None) -> torch.Tensor:
    """The tensor a spec's parameter starts as."""
    if spec.fill == "group_index":
        return (torch.arange(spec.shape[0], dtype=torch.int64, device=device) // spec.group
                ).to(spec.dtype)
    if spec.fill is not None:
        return torch.full(spec.shape, spec.fill, dtype=spec.dtype, device=device)
    return torch.empty(spec.shape, dtype=spec.dtype, device=device)


# --- from loaded tensors to a qgemm weight ----------------------------------------------------

def _shard_slice(spec: TensorSpec, tensor: torch.Tensor, part: LayerPartition, index: int):
    """The part of a loaded tensor that belongs to logical shard `index`."""
    if spec.param_class == "PerTensorScaleParameter":
        return tensor[index:index + 1]
    if spec.output_dim is None:
        return tensor
    offset = sum(part.output_sizes[:index])
    size = part.output_sizes[index]
    if spec.block_rows is not None:
        if offset % spec.block_rows:
            raise PluginError(f"{part.prefix}: shard {index} starts at row {offset}, not at a "
                              f"block of {spec.block_rows} rows")
        start, length = offset // spec.block_rows, -(-size // spec.block_rows)
    else:
        what = f"{part.prefix}.{spec.name} of shard {index}"
        start = _exact(offset * spec.output_rows, f"the first row of {what}")
        length = _exact(size * spec.output_rows, f"the rows of {what}")
    return tensor.narrow(spec.output_dim, start, length)


def _import(config, prefix, tensors, specs, activation, quantize_activations, n, k):
    found = {f"{prefix}.{s.name}": t for s, t in zip(specs, tensors) if s.used}
    if config.get("quant_method") == "compressed-tensors":
        # The stored shape of the part imported here (the checkpoint's is a whole shard's).
        found[f"{prefix}.weight_shape"] = torch.tensor([n, k], dtype=torch.int64)
    return checkpoint.import_linear(found, prefix, config, activation,
                                    quantize_activations=quantize_activations)


def _tensor_to_channel(layer: ImportedLinear) -> ImportedLinear:
    """A per-tensor-scaled layer as a per-channel one with that scale on every row (exact)."""
    w = layer.weight
    if layer.scheme.granularity != "tensor":
        return layer
    if w.zeros.size:
        raise PluginError("per-tensor zero points of fused shards are not supported")
    parts = str(layer.scheme).split(";")
    fields = parts[0].split(":")
    fields[1] = "ch"
    scheme = qgemm.Scheme(";".join([":".join(fields)] + parts[1:]))
    packed = qgemm.PackedWeight.from_parts(scheme, w.n, w.k, w.codes, np.tile(w.scales, w.n),
                                           None, w.global_scale)
    return ImportedLinear(scheme, packed, layer.input_permutation, layer.input_scale)


def _with_activations(layer: ImportedLinear, settings: Settings, activation: str):
    if settings.activations in ("checkpoint", "16bit"):
        return layer.scheme
    parts = [p for p in str(layer.scheme).split(";") if not p.startswith(("a=", "o="))]
    text = ";".join(parts + [f"a={settings.activations}", f"o={activation}"])
    try:
        return qgemm.Scheme(text)
    except qgemm.Error as error:
        raise PluginError(f"QGEMM_ACTIVATIONS={settings.activations!r} does not fit the "
                          f"checkpoint's weights ({layer.scheme}): {error}") from None


def build_weight(config: Mapping, part: LayerPartition, specs: Sequence[TensorSpec],
                 tensors: Sequence[torch.Tensor], params_dtype: torch.dtype,
                 settings: Settings):
    """The qgemm weight of a loaded layer: (ImportedLinear, the scheme its calls compute).
    `tensors` are the loaded parameters, in the order of `specs`."""
    if params_dtype not in ACTIVATION_NAMES:
        raise PluginError(f"{part.prefix}: the model's dtype must be bfloat16 or float16 for "
                          f"qgemm ({params_dtype} given; pass --dtype bfloat16)")
    activation = ACTIVATION_NAMES[params_dtype]
    quantize = settings.activations != "16bit"
    tensors = [t.detach().to("cpu") for t in tensors]
    if part.input_split:
        # A rank's slice of g_idx holds the checkpoint's group numbers (those of its inputs'
        # groups: contiguous, act-order being refused here); its own groups count from 0.
        tensors = [t - t.min() if s.fill == "group_index" and t.numel() else t
                   for s, t in zip(specs, tensors)]
    if len(part.output_sizes) == 1 or not any(
            s.param_class == "PerTensorScaleParameter" and s.used for s in specs):
        layer = _import(config, part.shard_prefixes[0], tensors, specs, activation, quantize,
                        part.n, part.k)
    else:
        shards = []
        for index, prefix in enumerate(part.shard_prefixes):
            sliced = [_shard_slice(s, t, part, index) for s, t in zip(specs, tensors)]
            shards.append(_tensor_to_channel(_import(config, prefix, sliced, specs, activation,
                                                     quantize, part.output_sizes[index],
                                                     part.k)))
        layer = checkpoint.concat_rows(shards, rescale_global=True)
    if (layer.weight.n, layer.weight.k) != (part.n, part.k):
        raise PluginError(f"{part.prefix}: the imported weight is [{layer.weight.n}, "
                          f"{layer.weight.k}]; the layer is [{part.n}, {part.k}] on this rank")
    return layer, _with_activations(layer, settings, activation)


class QgemmLinearKernel:
    """A loaded layer's qgemm weight, attached to the layer (`attach`), and the forward
    (`linear_forward`): y = x[..., perm] · Wᵀ (+ bias) through torch.ops.qgemm.gemm only, so
    that torch.compile(fullgraph=True) traces it and no Python code branches on the token
    count."""

    def __init__(self, layer: ImportedLinear, scheme, settings: Settings):
        from qgemm import ops

        self.weight = ops.register_weight(layer.weight, scheme, settings.max_rows)
        self.permutation = None if layer.input_permutation is None else torch.as_tensor(
            np.asarray(layer.input_permutation), dtype=torch.int64)

    def attach(self, module: torch.nn.Module, device=None) -> None:
        """Sets module.qgemm_weight (the RegisteredWeight: its registry entry lives as long
        as the module), qgemm_handle and qgemm_n (ints the operator takes), and the buffer
        qgemm_input_permutation (act-order, or None). On a CUDA device the weight is uploaded
        now, before any CUDA-graph capture."""
        from qgemm import ops

        module.qgemm_weight = self.weight
        module.qgemm_handle = int(self.weight.handle)
        module.qgemm_n = int(self.weight.n)
        perm = None if self.permutation is None else self.permutation.to(device)
        module.register_buffer("qgemm_input_permutation", perm, persistent=False)
        if device is not None and torch.device(device).type == "cuda":
            ops.prepare(self.weight, device)


def linear_forward(module: torch.nn.Module, x: torch.Tensor,
                   bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The forward of a layer that QgemmLinearKernel.attach prepared."""
    if module.qgemm_input_permutation is not None:
        x = x.index_select(-1, module.qgemm_input_permutation)
    return torch.ops.qgemm.gemm(x, module.qgemm_handle, module.qgemm_n, bias)


# --- MoE experts -------------------------------------------------------------------------------
#
# A MoE layer on this rank holds E local experts, each a fused gate_up layer [2I, H] (gate rows,
# then up rows: vLLM's w13, loaded shard by shard as w1 = gate, w3 = up) and a down layer [H, I]
# (w2), I being this rank's part of the intermediate size. Each expert's tensors are those of a
# linear layer of the checkpoint's format (tensor_specs), with a leading experts dimension. gpt-oss
# MXFP4 stores every expert in one tensor and interleaves gate (even rows) and up (odd rows):
#   w13_weight uint8 [E, 2I, H/2], w13_weight_scale uint8 [E, 2I, H/32] (e8m0), w13_bias [E, 2I],
#   w2_weight uint8 [E, H, I/2], w2_weight_scale uint8 [E, H, I/32], w2_bias [E, H]
# (vLLM's gpt-oss loader flattens <name>_blocks [E, n, k/32, 16] to [E, n, k/2]).

GLU_OF_VLLM = {"silu": "silu", "gelu": "gelu", "swigluoai": "clamped-swiglu",
               "swigluoai_uninterleave": "clamped-swiglu"}


@dataclasses.dataclass
class ExpertsPartition:
    """A MoE layer's experts on this rank: `experts` local experts of hidden size H and
    intermediate size `inter` (this rank's part), the checkpoint prefixes of one expert's
    projections (for the format's per-layer rules), and the tensor-parallel split."""

    prefix: str
    experts: int
    hidden: int
    inter: int
    tp_size: int = 1
    tp_rank: int = 0
    has_bias: bool = False

    def gate_up(self) -> LayerPartition:
        return LayerPartition(f"{self.prefix}.w13", [self.inter, self.inter], self.hidden,
                              [f"{self.prefix}.0.gate_proj", f"{self.prefix}.0.up_proj"])

    def down(self) -> LayerPartition:
        return LayerPartition(f"{self.prefix}.w2", [self.hidden], self.inter,
                              [f"{self.prefix}.0.down_proj"], input_split=self.tp_size > 1)


def expert_specs(config: Mapping, part: ExpertsPartition, params_dtype: torch.dtype):
    """(w13 specs, w2 specs): one expert's stored tensors (without the experts dimension) of
    the gate_up and down projections, named as the checkpoint names them (vLLM's parameters
    are w13_<name> and w2_<name>). Raises PluginError naming the rule."""
    method = config.get("quant_method")
    U8, F32 = torch.uint8, torch.float32
    if method == "mxfp4":
        for what, size in (("hidden size", part.hidden), ("intermediate size on this rank",
                                                          part.inter)):
            if size % 32:
                raise PluginError(f"{part.prefix}: the {what} {size} is not a multiple of 32 "
                                  "(gpt-oss MXFP4 blocks)")
        h, i = part.hidden, part.inter
        w13 = [TensorSpec("weight", (2 * i, h // 2), U8, "ModelWeightParameter", output_dim=0,
                          input_dim=1),
               TensorSpec("weight_scale", (2 * i, h // 32), U8, "ModelWeightParameter",
                          output_dim=0, input_dim=1)]
        w2 = [TensorSpec("weight", (h, i // 2), U8, "ModelWeightParameter", output_dim=0,
                         input_dim=1),
              TensorSpec("weight_scale", (h, i // 32), U8, "ModelWeightParameter",
                         output_dim=0, input_dim=1)]
    else:
        w13 = tensor_specs(config, part.gate_up(), params_dtype)
        w2 = tensor_specs(config, part.down(), params_dtype)
    if part.has_bias:
        w13 = w13 + [TensorSpec("bias", (2 * part.inter,), F32, "ModelWeightParameter",
                                output_dim=0)]
        w2 = w2 + [TensorSpec("bias", (part.hidden,), F32, "BasevLLMParameter")]
    return w13, w2


def _place(dest: torch.Tensor, loaded: torch.Tensor, part: ExpertsPartition, what: str):
    """Copies a checkpoint tensor into its place on this rank: each dimension is either this
    rank's size (copied whole) or tp_size times it (tensor parallelism: this rank's slice)."""
    if loaded.dim() > dest.dim() >= 1:  # gpt-oss blocks [.., n, k/32, 16] as [.., n, k/2]
        loaded = loaded.reshape(tuple(loaded.shape[:dest.dim() - 1]) + (-1,))
    if loaded.dim() == 0 and dest.numel() == 1:
        loaded = loaded.reshape(dest.shape)
    if loaded.dim() != dest.dim():
        raise PluginError(f"{what}: a checkpoint tensor of shape {list(loaded.shape)} for a "
                          f"parameter of shape {list(dest.shape)}")
    for d, (have, want) in enumerate(zip(loaded.shape, dest.shape)):
        if have == want:
            continue
        if have == want * part.tp_size:
            loaded = loaded.narrow(d, part.tp_rank * want, want)
            continue
        raise PluginError(f"{what}: dimension {d} of the checkpoint tensor "
                          f"{list(loaded.shape)} is neither this rank's {want} nor "
                          f"{part.tp_size} × {want} (the parameter is {list(dest.shape)})")
    dest.copy_(loaded)


def load_expert_tensor(param: torch.Tensor, spec: TensorSpec, w13: bool,
                       part: ExpertsPartition, loaded: torch.Tensor, shard_id,
                       local_expert) -> None:
    """One checkpoint tensor into a stacked expert parameter `param` [E, *spec.shape]:
    local_expert None: every local expert at once (gpt-oss: [E, ...], already this rank's);
    else one expert's tensor of the projection `shard_id` (w1 = gate, w3 = up, w2 = down, or
    gpt-oss's gpt_oss_w13 / gpt_oss_w2: the whole fused projection)."""
    name = f"{part.prefix}.{'w13' if w13 else 'w2'}_{spec.name}"
    loaded = loaded.detach()
    if local_expert is None:
        _place(param, loaded, part, name)
        return
    dest = param[local_expert]
    if w13 and shard_id in ("w1", "w3"):
        index = 0 if shard_id == "w1" else 1
        dest = _shard_slice(spec, dest, part.gate_up(), index)
    elif shard_id not in ("w1", "w2", "w3", "gpt_oss_w13", "gpt_oss_w2"):
        raise PluginError(f"{name}: shard_id {shard_id!r} is not w1, w2 or w3")
    elif (shard_id in ("w2", "gpt_oss_w2")) == w13:
        raise PluginError(f"{name}: shard_id {shard_id!r} loads the other projection")
    if spec.name == "bias" and not w13 and part.tp_rank != 0:
        loaded = torch.zeros_like(loaded)  # the ranks' partial sums add the bias once
    _place(dest, loaded, part, f"{name} of expert {local_expert}")


def build_experts(config: Mapping, part: ExpertsPartition, w13_specs, w2_specs,
                  w13_tensors, w2_tensors, params_dtype: torch.dtype, settings: Settings):
    """The qgemm experts of a loaded MoE layer: (gate_up ImportedLinears [2I, H], down
    ImportedLinears [H, I], the scheme, gate_up bias fp32 [E, 2I] or None, down bias [E, H] or
    None). gpt-oss's interleaved gate/up rows (and bias) become gate rows, then up rows."""
    if params_dtype not in ACTIVATION_NAMES:
        raise PluginError(f"{part.prefix}: the model's dtype must be bfloat16 or float16 for "
                          f"qgemm ({params_dtype} given; pass --dtype bfloat16)")
    activation = ACTIVATION_NAMES[params_dtype]
    mxfp4 = config.get("quant_method") == "mxfp4"
    w13 = dict(zip([s.name for s in w13_specs], [t.detach().cpu() for t in w13_tensors]))
    w2 = dict(zip([s.name for s in w2_specs], [t.detach().cpu() for t in w2_tensors]))
    quantized = [s for s in w13_specs if s.name != "bias"]
    quantized_down = [s for s in w2_specs if s.name != "bias"]
    gate_up, down = [], []
    for e in range(part.experts):
        if mxfp4:
            blocks = lambda t: t[e].numpy().reshape(t.shape[1], -1, 16)  # noqa: E731
            layer = checkpoint.import_mxfp4(blocks(w13["weight"]), w13["weight_scale"][e].numpy(),
                                            activation=activation, name=f"{part.prefix}.w13")
            gate, up = checkpoint.split_interleaved_gate_up(layer)
            g = checkpoint.concat_rows([gate, up])
            d = checkpoint.import_mxfp4(blocks(w2["weight"]), w2["weight_scale"][e].numpy(),
                                        activation=activation, name=f"{part.prefix}.w2")
            scheme = _with_activations(g, settings, activation)
        else:
            g, scheme = build_weight(config, part.gate_up(), quantized,
                                     [w13[s.name][e] for s in quantized], params_dtype,
                                     settings)
            d, _ = build_weight(config, part.down(), quantized_down,
                                [w2[s.name][e] for s in quantized_down], params_dtype,
                                settings)
        for what, imported in (("gate_up", g), ("down", d)):
            if imported.input_permutation is not None:
                raise PluginError(f"{part.prefix}: expert {e}'s {what} projection has an "
                                  "act-order input permutation (GPTQ desc_act / "
                                  "compressed-tensors actorder): qgemm's MoE operator takes "
                                  "experts without one")
        gate_up.append(g)
        down.append(d)
    gate_up_bias = down_bias = None
    if "bias" in w13:
        gate_up_bias = w13["bias"].to(torch.float32)
        if mxfp4:
            gate_up_bias = torch.cat([gate_up_bias[:, 0::2], gate_up_bias[:, 1::2]], dim=1)
        down_bias = w2["bias"].to(torch.float32)
    return gate_up, down, scheme, gate_up_bias, down_bias


class QgemmExperts:
    """A loaded MoE layer's experts registered for torch.ops.qgemm.moe, attached to the layer
    (`attach`), and the forward (`moe_forward`): the operator alone, with vLLM's routing
    (topk_ids, topk_weights) and expert map."""

    def __init__(self, gate_up, down, scheme, gate_up_bias, down_bias, activation: str,
                 alpha: float = 1.702, limit: float = 7.0):
        from qgemm import ops

        if activation not in ops.GLU_ACTIVATIONS:
            raise PluginError(f"activation {activation!r}: qgemm's MoE operator computes "
                              f"{', '.join(ops.GLU_ACTIVATIONS)}")
        self.experts = ops.register_experts([g.weight for g in gate_up],
                                            [d.weight for d in down], scheme)
        self.gate_up_bias, self.down_bias = gate_up_bias, down_bias
        self.activation, self.alpha, self.limit = activation, float(alpha), float(limit)

    def attach(self, module: torch.nn.Module, device=None) -> None:
        """Sets module.qgemm_experts (the RegisteredExperts, alive as long as the module),
        qgemm_experts_handle, qgemm_activation / _alpha / _limit, and the buffers
        qgemm_gate_up_bias and qgemm_down_bias (or None). On a CUDA device the experts are
        uploaded now, before any CUDA-graph capture."""
        module.qgemm_experts = self.experts
        module.qgemm_experts_handle = int(self.experts.handle)
        module.qgemm_activation = self.activation
        module.qgemm_alpha, module.qgemm_limit = self.alpha, self.limit
        for name, bias in (("qgemm_gate_up_bias", self.gate_up_bias),
                           ("qgemm_down_bias", self.down_bias)):
            module.register_buffer(name, None if bias is None else bias.to(device),
                                   persistent=False)
        if device is not None and torch.device(device).type == "cuda":
            index = torch.device(device).index
            self.experts._entry.on_device(torch.cuda.current_device() if index is None
                                          else index)


def moe_forward(module: torch.nn.Module, x: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor, expert_map: Optional[torch.Tensor] = None
                ) -> torch.Tensor:
    """The routed experts' output of a layer that QgemmExperts.attach prepared."""
    return torch.ops.qgemm.moe(x, topk_ids, topk_weights, module.qgemm_experts_handle,
                               module.qgemm_activation, module.qgemm_alpha,
                               module.qgemm_limit, module.qgemm_gate_up_bias,
                               module.qgemm_down_bias, expert_map)


# --- JIT warm-up ------------------------------------------------------------------------------
#
# vLLM compiles its JIT kernels before capturing CUDA graphs (kernel_warmup, through the model
# runner's warm-up registry). A layer's qgemm kernels are compiled there too: a linear layer's
# for every token count a step may bring (qgemm plans per count, from kernels compiled once per
# M bucket), a MoE layer's for the counts below (its plans are made per count).

def warm_up_counts(max_tokens: int, capture_sizes) -> tuple:
    """The token counts a MoE layer is warmed up for: vLLM's CUDA-graph capture sizes (each
    replayed as captured), the powers of two up to the largest step and that step. A step of
    another count plans on its first call, from the kernels these compiled where it selects
    the same ones."""
    counts = {int(s) for s in capture_sizes or () if 1 <= int(s) <= max_tokens}
    power = 1
    while power < max_tokens:
        counts.add(power)
        power *= 2
    counts.add(int(max_tokens))
    return tuple(sorted(counts))


def warm_up_linear(handle: int, max_tokens: int, dtype: torch.dtype, device,
                   with_bias: bool) -> None:
    """Compiles what a linear layer prepared on `device` (QgemmLinearKernel.attach) runs for 1
    .. max_tokens tokens of `dtype`, without its bias and, where it has one, with it (vLLM adds
    a row-parallel layer's bias on one rank only); nothing off CUDA (the reference operator)."""
    from qgemm import ops

    if device is None or torch.device(device).type != "cuda":
        return
    # Layers of one shape and scheme (a model's many identical blocks) select the same kernels:
    # the first compiles them, the others' first calls plan from memory (a selection for each
    # M of the range costs ~25 µs).
    entry = ops.lookup(handle)
    shape = (str(entry.scheme), entry.n, entry.k, max_tokens, dtype, str(device), with_bias)
    if shape in _warmed_linear_shapes:
        return
    for bias in (False, True) if with_bias else (False,):
        ops.warm_up(handle, max_tokens, dtype, bias=bias, device=device)
    _warmed_linear_shapes.add(shape)


_warmed_linear_shapes: set = set()


def warm_up_experts(module: torch.nn.Module, counts, top_k: int, dtype: torch.dtype,
                    device) -> None:
    """Makes the plans of a MoE layer prepared on `device` (QgemmExperts.attach) for each token
    count, with its activation and biases; nothing off CUDA."""
    from qgemm import ops

    if device is None or torch.device(device).type != "cuda":
        return
    ops.warm_up_moe(module.qgemm_experts_handle, counts, top_k, dtype, module.qgemm_activation,
                    module.qgemm_alpha, module.qgemm_limit,
                    gate_up_bias=module.qgemm_gate_up_bias is not None,
                    down_bias=module.qgemm_down_bias is not None, device=device)

