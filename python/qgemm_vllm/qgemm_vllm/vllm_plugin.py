"""qgemm as a vLLM quantization method: `vllm serve <model> --quantization qgemm`.

Imported by qgemm_vllm.register (vLLM's general-plugin entry point) in every vLLM process.
QgemmConfig claims a checkpoint (GPTQ, AWQ, compressed-tensors, modelopt NVFP4/FP8, gpt-oss
MXFP4, FP8-block) only when the user asked for qgemm; QgemmLinearMethod creates the
checkpoint's tensors as vLLM parameters (so that tensor parallelism and the fused QKV /
gate_up loaders work), turns them into one qgemm weight after loading, and calls
torch.ops.qgemm.gemm. QgemmMoEMethod does the same for a MoE layer's quantized experts: it
creates each expert's checkpoint tensors stacked along an experts dimension (w13 = gate_up,
w2 = down; gpt-oss MXFP4 as its loader places them), turns every expert into qgemm weights
after loading, registers them (qgemm.ops.register_experts) and calls torch.ops.qgemm.moe with
vLLM's routing and expert map. Each loaded layer registers a QgemmLayerWarmup with vLLM's JIT
warm-up, which compiles its kernels before CUDA-graph capture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

import qgemm.ops  # noqa: F401  (registers torch.ops.qgemm in this process)
from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.linear import (LinearBase, LinearMethodBase,
                                               UnquantizedLinearMethod,
                                               register_weight_loader_v2_supported_method)
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import (QuantizationConfig,
                                                                 QuantizeMethodBase)
from vllm.model_executor import parameter as vllm_parameter
from vllm.model_executor.utils import set_weight_attrs
from vllm.model_executor.warmup.jit_warmup import VllmJitKernel

from .layout import (CLAIMED_METHODS, GLU_OF_VLLM, ExpertsPartition, LayerPartition,
                     PluginError, QgemmExperts, QgemmLinearKernel, Settings, build_experts,
                     build_weight, expert_specs, initial_tensor, is_quantized, linear_forward,
                     load_expert_tensor, moe_forward, normalized_config, tensor_specs,
                     warm_up_counts, warm_up_experts, warm_up_linear)

logger = init_logger(__name__)

NAME = "qgemm"


def claimable(hf_quant_cfg: Optional[dict]) -> Optional[str]:
    """None where qgemm serves the checkpoint's format, else the reason it does not."""
    if not hf_quant_cfg:
        return "the checkpoint has no quantization_config (qgemm serves quantized checkpoints)"
    try:
        config = normalized_config(hf_quant_cfg)
    except PluginError as error:
        return str(error)
    method = config.get("quant_method")
    if method not in CLAIMED_METHODS:
        return (f"its quant_method {method!r} is not one qgemm serves "
                f"({', '.join(CLAIMED_METHODS)})")
    if method == "fp8" and not config.get("weight_block_size"):
        return "quant_method fp8 without weight_block_size: qgemm serves FP8-block checkpoints"
    if method == "modelopt" and str(config.get("quant_algo", "")).upper() not in (
            "NVFP4", "FP8", "FP8_PER_CHANNEL_PER_TOKEN"):
        return f"modelopt quant_algo {config.get('quant_algo')!r} is not one qgemm serves"
    return None


@register_quantization_config(NAME)
class QgemmConfig(QuantizationConfig):
    """The checkpoint's own quantization config, served by qgemm's kernels. The no-argument
    form (vLLM builds one for an unquantized checkpoint) quantizes nothing."""

    def __init__(self, checkpoint_config: Optional[dict] = None,
                 settings: Optional[Settings] = None):
        super().__init__()
        self.checkpoint_config = normalized_config(checkpoint_config or {})
        self.settings = settings if settings is not None else \
            Settings.load(self.checkpoint_config)

    def __repr__(self) -> str:
        return (f"QgemmConfig(quant_method={self.checkpoint_config.get('quant_method')!r}, "
                f"settings={self.settings})")

    @classmethod
    def get_name(cls) -> str:
        return NAME

    @classmethod
    def get_supported_act_dtypes(cls) -> list:
        return [torch.bfloat16, torch.float16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 80  # qgemm's kernels start at Ampere

    @staticmethod
    def get_config_filenames() -> list:
        return ["hf_quant_config.json"]

    @classmethod
    def from_config(cls, config: dict) -> "QgemmConfig":
        reason = claimable(config)
        if reason is not None:
            raise ValueError(f"--quantization qgemm: {reason}")
        return cls(config)

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None):
        if user_quant != NAME:
            return None  # qgemm claims a checkpoint only when the user asks for it
        reason = claimable(hf_quant_cfg)
        if reason is not None:
            raise ValueError(f"--quantization qgemm cannot serve this checkpoint: {reason}")
        return NAME

    @staticmethod
    def get_checkpoint_weight_mapper():
        # vLLM's default drops GPTQ's g_idx; qgemm reads act-order checkpoints through it.
        from vllm.model_executor.models.utils import WeightsMapper

        return WeightsMapper()

    def apply_vllm_mapper(self, hf_to_vllm_mapper) -> None:
        self.hf_to_vllm_mapper = hf_to_vllm_mapper

    def shard_prefixes(self, prefix: str) -> list:
        """The checkpoint layers a vLLM layer fuses (qkv_proj: q_proj, k_proj, v_proj), by
        the model's packed_modules_mapping; [prefix] for a layer that fuses nothing."""
        base, _, name = prefix.rpartition(".")
        shards = self.packed_modules_mapping.get(name)
        if not shards:
            return [prefix]
        return [f"{base}.{shard}" if base else shard for shard in shards]

    def get_quant_method(self, layer: torch.nn.Module, prefix: str
                         ) -> Optional[QuantizeMethodBase]:
        from vllm.model_executor.layers.fused_moe import RoutedExperts

        if isinstance(layer, RoutedExperts):
            if self.checkpoint_config and is_quantized(self.checkpoint_config, prefix,
                                                       experts=True):
                return QgemmMoEMethod(self, prefix, layer.moe_config)
            return None
        if not isinstance(layer, LinearBase):
            return None
        shards = self.shard_prefixes(prefix)
        if not self.checkpoint_config:
            return UnquantizedLinearMethod()
        quantized = [is_quantized(self.checkpoint_config, p) for p in shards]
        if not any(quantized):
            return UnquantizedLinearMethod()
        if not all(quantized):
            raise ValueError(f"--quantization qgemm: {prefix} fuses {shards}, of which the "
                             "checkpoint quantizes only some")
        return QgemmLinearMethod(self, prefix, shards)


_PARAM_ARGS = ("input_dim", "output_dim", "packed_dim", "packed_factor")


def make_parameter(spec, tensor: torch.Tensor, weight_loader):
    """A spec's tensor as the vLLM parameter class it names."""
    cls = getattr(vllm_parameter, spec.param_class)
    kwargs = {"data": tensor, "weight_loader": weight_loader}
    init_args = {
        "PackedvLLMParameter": _PARAM_ARGS,
        "ModelWeightParameter": ("input_dim", "output_dim"),
        "GroupQuantScaleParameter": ("input_dim", "output_dim"),
        "BlockQuantScaleParameter": ("input_dim", "output_dim"),
        "PackedColumnParameter": ("output_dim", "packed_dim", "packed_factor"),
        "ChannelQuantScaleParameter": ("output_dim",),
        "RowvLLMParameter": ("input_dim",),
        "PerTensorScaleParameter": (),
        "BasevLLMParameter": (),
    }[spec.param_class]
    for name in init_args:
        kwargs[name] = getattr(spec, name)
    return cls(**kwargs)


class QgemmLayerWarmup(VllmJitKernel["QgemmLayerWarmup.CompileKey"]):
    """One loaded layer's qgemm kernels in vLLM's JIT warm-up (kernel_warmup, before CUDA-graph
    capture). process_weights_after_loading registers one per layer (vLLM loads the model
    inside its runner's warm-up registry); vLLM then passes its config to get_warmup_keys, whose
    one key is the token counts a step may bring (the scheduler's largest step, the CUDA-graph
    capture sizes), and `compile` warms the layer up for them (layout.warm_up_linear /
    warm_up_experts)."""

    @dataclass(frozen=True)
    class CompileKey:
        max_tokens: int
        counts: tuple  # a MoE layer's token counts (layout.warm_up_counts)

    def __init__(self, warm: Callable[["QgemmLayerWarmup.CompileKey"], None]):
        super().__init__()
        self.warm = warm

    def get_warmup_keys(self, vllm_config) -> list:
        max_tokens = int(vllm_config.scheduler_config.max_num_batched_tokens)
        sizes = vllm_config.compilation_config.cudagraph_capture_sizes
        return [self.CompileKey(max_tokens, warm_up_counts(max_tokens, sizes))]

    def compile(self, compile_key: "QgemmLayerWarmup.CompileKey") -> None:
        if compile_key not in self._compiled_cache:
            self.warm(compile_key)
            self._compiled_cache[compile_key] = True


@register_weight_loader_v2_supported_method
class QgemmLinearMethod(LinearMethodBase):
    """A quantized linear layer of the checkpoint, computed by torch.ops.qgemm.gemm."""

    def __init__(self, config: QgemmConfig, prefix: str, shard_prefixes: list):
        self.config = config
        self.prefix = prefix
        self.shard_prefixes = list(shard_prefixes)

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list, input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs):
        shards = self.shard_prefixes
        if len(shards) != len(output_partition_sizes):
            if len(shards) != 1:
                raise ValueError(f"{self.prefix}: {len(output_partition_sizes)} output "
                                 f"partitions, but the model maps it to {shards}")
            shards = shards * len(output_partition_sizes)
        part = LayerPartition(self.prefix, [int(s) for s in output_partition_sizes],
                              int(input_size_per_partition), shards,
                              input_split=int(input_size_per_partition) != int(input_size))
        specs = tensor_specs(self.config.checkpoint_config, part, params_dtype)
        weight_loader = extra_weight_attrs.pop("weight_loader")
        for spec in specs:
            param = make_parameter(spec, initial_tensor(spec), weight_loader)
            set_weight_attrs(param, extra_weight_attrs)
            layer.register_parameter(spec.name, param)
            if spec.param_class == "BlockQuantScaleParameter":
                block = self.config.checkpoint_config.get("weight_block_size") or [
                    spec.block_rows, -(-part.k // spec.shape[1])]
                layer.weight_block_size = [int(block[0]), int(block[1])]
        layer.qgemm_partition = part
        layer.qgemm_specs = specs
        layer.qgemm_params_dtype = params_dtype

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        specs = layer.qgemm_specs
        params = [getattr(layer, spec.name) for spec in specs]
        device = params[0].device
        imported, scheme = build_weight(self.config.checkpoint_config, layer.qgemm_partition,
                                        specs, [p.data for p in params],
                                        layer.qgemm_params_dtype, self.config.settings)
        QgemmLinearKernel(imported, scheme, self.config.settings).attach(layer, device)
        # The checkpoint's tensors are no longer needed: qgemm holds the canonical form on the
        # host and its kernel layouts on the GPU.
        for spec in specs:
            delattr(layer, spec.name)
        handle, dtype = layer.qgemm_handle, layer.qgemm_params_dtype
        with_bias = getattr(layer, "bias", None) is not None
        QgemmLayerWarmup(lambda key: warm_up_linear(handle, key.max_tokens, dtype, device,
                                                    with_bias)).register_warmup()
        logger.debug("qgemm: %s as %s", self.prefix, scheme)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return linear_forward(layer, x, bias)


class QgemmMoEMethod(FusedMoEMethodBase):
    """A MoE layer's quantized experts, computed by torch.ops.qgemm.moe (qgemm's grouped GEMMs)
    from vLLM's routing outputs. No modular kernel: vLLM's runner routes (select_experts),
    calls `apply`, and reduces across tensor-parallel ranks; under expert parallelism it
    dispatches and combines the tokens naively and `apply` passes the layer's expert map."""

    def __init__(self, config: QgemmConfig, prefix: str, moe):
        super().__init__(moe)
        self.config = config
        self.prefix = prefix
        activation = getattr(moe.activation, "value", moe.activation)
        glu = GLU_OF_VLLM.get(str(activation))
        if glu is None:
            raise PluginError(f"{prefix}: MoE activation {activation!r} is not one qgemm's MoE "
                              f"operator computes (vLLM's {', '.join(GLU_OF_VLLM)})")
        if glu == "silu" and getattr(moe, "swiglu_limit", None) is not None:
            raise PluginError(f"{prefix}: SiLU with a clamp (swiglu_limit) is not one qgemm's "
                              "MoE operator computes")
        self.glu = glu
        self.alpha = moe.swiglu_alpha if getattr(moe, "swiglu_alpha", None) is not None \
            else 1.702
        self.limit = moe.swiglu_limit if getattr(moe, "swiglu_limit", None) is not None \
            else 7.0
        # gpt-oss's loader (GptOssRoutedExperts) places MXFP4 experts as packed tensors.
        if config.checkpoint_config.get("quant_method") == "mxfp4":
            self.weight_dtype = "mxfp4"

    def create_weights(self, layer: torch.nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs):
        if getattr(layer, "apply_router_weight_on_input", False):
            raise PluginError(f"{self.prefix}: apply_router_weight_on_input is not supported "
                              "by qgemm's MoE operator (it weights the experts' outputs)")
        parallel = self.moe.moe_parallel_config
        part = ExpertsPartition(self.prefix, int(num_experts), int(hidden_size),
                                int(intermediate_size_per_partition),
                                tp_size=int(parallel.tp_size), tp_rank=int(parallel.tp_rank),
                                has_bias=bool(getattr(self.moe, "has_bias", False)))
        w13_specs, w2_specs = expert_specs(self.config.checkpoint_config, part, params_dtype)
        extra_weight_attrs.pop("weight_loader", None)
        for name in ("unpadded_hidden_size", "global_num_experts"):
            extra_weight_attrs.pop(name, None)

        def loader_for(spec, w13):
            def weight_loader(param, loaded_weight, weight_name=None, shard_id=None,
                              expert_id=None, return_success=False):
                local = None
                if expert_id is not None:
                    local = layer._map_global_expert_id_to_local_expert_id(int(expert_id))
                    if local == -1:  # another rank's expert
                        return False if return_success else None
                load_expert_tensor(param.data, spec, w13, part, loaded_weight, shard_id,
                                   local)
                return True if return_success else None

            weight_loader.supports_moe_loading = True
            return weight_loader

        for w13, specs in ((True, w13_specs), (False, w2_specs)):
            for spec in specs:
                data = initial_tensor(spec).unsqueeze(0).repeat(
                    (part.experts,) + (1,) * len(spec.shape)).contiguous()
                param = torch.nn.Parameter(data, requires_grad=False)
                set_weight_attrs(param, {"weight_loader": loader_for(spec, w13),
                                         "qgemm_spec": spec})
                layer.register_parameter(f"{'w13' if w13 else 'w2'}_{spec.name}", param)
        layer.qgemm_experts_partition = part
        layer.qgemm_w13_specs, layer.qgemm_w2_specs = w13_specs, w2_specs
        layer.qgemm_params_dtype = params_dtype

    def get_fused_moe_quant_config(self, layer: torch.nn.Module):
        return None  # no vLLM kernel reads it: torch.ops.qgemm.moe takes the whole layer

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        part = layer.qgemm_experts_partition
        names13 = [f"w13_{s.name}" for s in layer.qgemm_w13_specs]
        names2 = [f"w2_{s.name}" for s in layer.qgemm_w2_specs]
        device = getattr(layer, names13[0]).device
        gate_up, down, scheme, gate_up_bias, down_bias = build_experts(
            self.config.checkpoint_config, part, layer.qgemm_w13_specs, layer.qgemm_w2_specs,
            [getattr(layer, n).data for n in names13], [getattr(layer, n).data for n in names2],
            layer.qgemm_params_dtype, self.config.settings)
        QgemmExperts(gate_up, down, scheme, gate_up_bias, down_bias, self.glu, self.alpha,
                     self.limit).attach(layer, device)
        for name in names13 + names2:
            delattr(layer, name)
        top_k, dtype = int(self.moe.experts_per_token), layer.qgemm_params_dtype
        QgemmLayerWarmup(lambda key: warm_up_experts(layer, key.counts, top_k, dtype, device)
                         ).register_warmup()
        logger.debug("qgemm: %s, %d experts as %s", self.prefix, part.experts, scheme)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, shared_experts=None, shared_experts_input=None):
        return moe_forward(layer, x, topk_ids, topk_weights, layer.expert_map)
