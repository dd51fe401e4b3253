"""qgemm.nn: torch modules over torch.ops.qgemm.gemm (needs torch; `import qgemm` does not).

    model = qgemm.quantize_model(model, "w4a16", ignore=("lm_head",))   # in place
    layer = qgemm.nn.QuantLinear.from_float(torch.nn.Linear(4096, 11008), "w4a16")

QuantLinear is a drop-in for torch.nn.Linear at inference: any leading batch shape, output in
the input's dtype, optional bias (added in fp32 before the output's rounding). Its weight is a
qgemm.ops.RegisteredWeight: the host canonical form (quantized on the host, or imported from a
checkpoint), uploaded to a GPU in the kernel layouts at the first call there. The module has no
weight tensors of its own, so `model.to("cuda")` moves only its bias (and an act-order
permutation): the GPU holds the kernel layouts once, not a second canonical copy. Its state
(`state_dict`) carries the canonical parts as the module's extra state, so saving and loading
round-trip.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Iterable, Optional, Union

import numpy as np
import torch

from . import ops
from ._core import Error, PackedWeight, Scheme, quantize_weight

__all__ = ["QuantLinear", "QuantMoE", "quantize_model", "load_quantized"]


def _scheme(scheme, function: str) -> Scheme:
    if isinstance(scheme, Scheme):
        return scheme
    if isinstance(scheme, str):
        return Scheme(scheme)
    raise Error(f"{function}: scheme must be a qgemm.Scheme or its text "
                f"({type(scheme).__name__} given)")


def _device_quantizable(weight: torch.Tensor) -> torch.Tensor:
    """A CUDA weight in a type the GPU quantizer reads (bf16, fp16, fp32: others go through
    fp32)."""
    weight = weight.detach()
    return weight if weight.dtype in (torch.bfloat16, torch.float16, torch.float32) else \
        weight.to(torch.float32)


def _quantize(scheme: Scheme, weight: torch.Tensor) -> PackedWeight:
    """A float weight [n, k] quantized as `scheme`, round to nearest: on its GPU where it lies on
    one (Engine.quantize_weight: the host quantizer's codes, byte for byte, at device speed),
    else on the host."""
    weight = weight.detach()
    if weight.is_cuda:
        weight = _device_quantizable(weight)
        with torch.cuda.device(weight.device):
            stream = torch.cuda.current_stream(weight.device).cuda_stream
            return ops.engine(weight.device.index).quantize_weight(weight, scheme, stream)
    return quantize_weight(scheme, np.ascontiguousarray(weight.to(torch.float32).numpy()))


class QuantLinear(torch.nn.Module):
    """y = x · dequant(W)ᵀ + bias through torch.ops.qgemm.gemm.

    in_features, out_features: W is [out_features, in_features].
    scheme: a qgemm.Scheme or its text (a preset such as "w4a16", or the compact form).
    max_rows: the most rows (tokens) a call is expected to have; on the GPU fewer can mean
        fewer kernel layouts (see Engine.prepare_weight). Larger calls are still served.
    A new QuantLinear has no weight yet: `from_float`, `from_packed`, `set_weight` or
    `load_state_dict` give it one.
    """

    def __init__(self, in_features: int, out_features: int, scheme, bias: bool = True, *,
                 device=None, dtype=None, max_rows: int = 65536):
        super().__init__()
        if int(in_features) < 1 or int(out_features) < 1:
            raise Error(f"QuantLinear: in_features and out_features must be at least 1 "
                        f"({in_features}, {out_features} given)")
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.scheme = _scheme(scheme, "QuantLinear")
        self.max_rows = int(max_rows)
        # The 16-bit type float32 inputs are cast to: the scheme's when it names fp16, else bf16
        # (float32's range). Kept as a plain attribute: forward reads nothing of the scheme
        # object, which torch.compile could not trace into.
        self.float32_input_dtype = (torch.float16 if self.scheme.activation_format == "fp16"
                                    else torch.bfloat16)
        self.qweight: Optional[ops.RegisteredWeight] = None
        if bias:
            self.bias = torch.nn.Parameter(
                torch.zeros(self.out_features, device=device, dtype=dtype), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        # Act-order checkpoints (GPTQ desc_act): the kernel's K order is a permutation of the
        # layer's inputs, applied to x's last dimension. A buffer so that it moves with the
        # module; saved in the extra state with the weight it belongs to, not on its own.
        self.register_buffer("input_permutation", None, persistent=False)

    def set_weight(self, packed: PackedWeight,
                   input_permutation: Optional[np.ndarray] = None) -> "QuantLinear":
        """Takes a canonical packed weight [out_features, in_features] quantized as the
        module's scheme."""
        if not isinstance(packed, PackedWeight):
            raise Error(f"QuantLinear.set_weight: packed must be a qgemm.PackedWeight "
                        f"({type(packed).__name__} given)")
        if (packed.n, packed.k) != (self.out_features, self.in_features):
            raise Error(f"QuantLinear.set_weight: packed is [{packed.n}, {packed.k}]; the layer "
                        f"needs [out_features, in_features] = "
                        f"[{self.out_features}, {self.in_features}]")
        self.qweight = ops.register_weight(packed, self.scheme, self.max_rows)
        if input_permutation is not None:
            permutation = torch.as_tensor(np.asarray(input_permutation), dtype=torch.int64)
            if permutation.shape != (self.in_features,) or not torch.equal(
                    torch.sort(permutation).values, torch.arange(self.in_features)):
                raise Error(f"QuantLinear.set_weight: input_permutation must be a permutation "
                            f"of the {self.in_features} inputs")
            # Where the module's tensors are (the module may have moved before its weight came).
            here = self.input_permutation if self.input_permutation is not None else self.bias
            self.input_permutation = permutation.to(None if here is None else here.device)
        else:
            self.input_permutation = None
        return self

    @classmethod
    def from_float(cls, linear: torch.nn.Linear, scheme, *, max_rows: int = 65536,
                   host_copy: bool = True) -> "QuantLinear":
        """A torch.nn.Linear quantized (round to nearest, as qgemm.quantize_weight): on its GPU
        when it lies on one, else on the host, the same codes either way; the bias is kept in
        the layer's dtype and device. host_copy=False (a weight on a GPU only): no host packed
        form is kept (qgemm.ops.quantize_and_register), so nothing leaves the GPU; the layer
        then serves that GPU, and state_dict, copies and the CPU path say they need the form."""
        if not isinstance(linear, torch.nn.Linear):
            raise Error(f"QuantLinear.from_float: linear must be a torch.nn.Linear "
                        f"({type(linear).__name__} given)")
        scheme = _scheme(scheme, "QuantLinear.from_float")
        weight = linear.weight.detach()
        module = cls(linear.in_features, linear.out_features, scheme,
                     bias=linear.bias is not None, device=weight.device, dtype=weight.dtype,
                     max_rows=max_rows)
        if linear.bias is not None:
            module.bias.data.copy_(linear.bias.detach())
        if weight.is_cuda:  # prepared where it lies: the packed form comes down, nothing goes up
            module.qweight = ops.quantize_and_register(_device_quantizable(weight), scheme,
                                                       max_rows, host_copy=host_copy)
            return module
        return module.set_weight(_quantize(scheme, weight))

    @classmethod
    def from_packed(cls, packed: PackedWeight, scheme, bias: Optional[torch.Tensor] = None, *,
                    input_permutation=None, max_rows: int = 65536) -> "QuantLinear":
        """A layer over a packed weight, e.g. a checkpoint importer's (qgemm.checkpoint's
        ImportedLinear: `from_packed(l.weight, l.scheme, input_permutation=l.input_permutation)`).
        """
        module = cls(packed.k, packed.n, scheme, bias=bias is not None,
                     device=None if bias is None else bias.device,
                     dtype=None if bias is None else bias.dtype, max_rows=max_rows)
        if bias is not None:
            if bias.shape != (packed.n,):
                raise Error(f"QuantLinear.from_packed: bias must have n = {packed.n} values "
                            f"(shape {tuple(bias.shape)} given)")
            module.bias.data.copy_(bias.detach())
        return module.set_weight(packed, input_permutation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.qweight is None:
            raise Error("QuantLinear: the layer has no weight yet (from_float, from_packed, "
                        "set_weight or load_state_dict give it one)")
        if x.shape[-1] != self.in_features:
            raise Error(f"QuantLinear: x's last dimension is {x.shape[-1]}, in_features is "
                        f"{self.in_features}")
        if x.dtype not in ops.OUTPUT_DTYPES:
            raise Error(f"QuantLinear: x must be bfloat16, float16 or float32 ({x.dtype} given)")
        if self.input_permutation is not None:
            x = x.index_select(-1, self.input_permutation)
        a = x if x.dtype in ops.ACTIVATION_DTYPES else x.to(self.float32_input_dtype)
        return torch.ops.qgemm.gemm(a, self.qweight.handle, self.out_features, self.bias,
                                    x.dtype)

    # The canonical weight as the module's extra state (state_dict key "<prefix>_extra_state"):
    # host tensors, so that torch.save / load_state_dict round-trip without a GPU.
    def get_extra_state(self):
        if self.qweight is None:
            return {"scheme": str(self.scheme)}
        p = self.qweight.host_packed("QuantLinear.state_dict")
        permutation = self.input_permutation
        return {"scheme": str(self.scheme), "codes": torch.from_numpy(p.codes.copy()),
                "scales": torch.from_numpy(p.scales.copy()),
                "zeros": torch.from_numpy(p.zeros.copy()), "global_scale": p.global_scale,
                "input_permutation": None if permutation is None else permutation.cpu()}

    def set_extra_state(self, state):
        if not isinstance(state, dict) or "scheme" not in state:
            raise Error("QuantLinear.load_state_dict: the extra state is not a QuantLinear's")
        scheme = Scheme(state["scheme"])
        if str(scheme) != str(self.scheme):
            raise Error(f"QuantLinear.load_state_dict: the state's scheme ({scheme}) differs "
                        f"from the layer's ({self.scheme})")
        if "codes" not in state:
            self.qweight = None
            return
        as_bytes = lambda t: np.ascontiguousarray(t.cpu().numpy(), dtype=np.uint8).reshape(-1)
        zeros = as_bytes(state["zeros"]) if state["zeros"].numel() else None
        packed = PackedWeight.from_parts(scheme, self.out_features, self.in_features,
                                         as_bytes(state["codes"]), as_bytes(state["scales"]),
                                         zeros, float(state["global_scale"]))
        permutation = state.get("input_permutation")
        self.set_weight(packed, None if permutation is None else permutation.cpu().numpy())

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, scheme='{self.scheme}'")


class QuantMoE(torch.nn.Module):
    """A routed expert layer through torch.ops.qgemm.moe:

        y[t] = Σ_j topk_weights[t, j] · down_e(glu(gate_up_e(x[t]))),  e = topk_ids[t, j]

    gate_up_e is expert e's [2I, H] (gate rows, then up rows, each + its bias), down_e its
    [H, I]. The router and its top-k stay the caller's (they differ between models): forward
    takes their result. activation: "silu", "gelu" or "clamped-swiglu" (gpt-oss; alpha, limit).
    Biases are kept as fp32 buffers ([E, 2I], [E, H]), so `.to()` moves them; the experts
    themselves are a qgemm.ops.RegisteredExperts (host canonical form, uploaded in the kernel
    layout at the first call on a GPU).
    """

    def __init__(self, experts: "ops.RegisteredExperts", activation: str = "silu", *,
                 alpha: float = 1.702, limit: float = 7.0,
                 gate_up_bias: Optional[torch.Tensor] = None,
                 down_bias: Optional[torch.Tensor] = None):
        super().__init__()
        if not isinstance(experts, ops.RegisteredExperts):
            raise Error(f"QuantMoE: experts must be a qgemm.ops.RegisteredExperts "
                        f"({type(experts).__name__} given; register_experts makes one)")
        if activation not in ops.GLU_ACTIVATIONS:
            raise Error(f"QuantMoE: activation '{activation}' (rule: one of "
                        f"{ops.GLU_ACTIVATIONS})")
        self.experts = experts
        self.activation = activation
        self.alpha = float(alpha)
        self.limit = float(limit)
        e, i, h = experts.experts, experts.intermediate, experts.hidden
        for name, bias, shape in (("gate_up_bias", gate_up_bias, (e, 2 * i)),
                                  ("down_bias", down_bias, (e, h))):
            if bias is not None and tuple(bias.shape) != shape:
                raise Error(f"QuantMoE: {name} must be {list(shape)} "
                            f"({list(bias.shape)} given)")
            self.register_buffer(name, None if bias is None else
                                 bias.detach().to(torch.float32).contiguous())

    @classmethod
    def from_float(cls, gate_up: torch.Tensor, down: torch.Tensor, scheme,
                   activation: str = "silu", *, host_copy: bool = True,
                   **kwargs) -> "QuantMoE":
        """Quantizes float experts (gate_up [E, 2I, H], down [E, H, I]) as QuantLinear.from_float
        does: on their GPU when they lie on one (host_copy as there), else on the host."""
        scheme = _scheme(scheme, "QuantMoE.from_float")
        if gate_up.dim() != 3 or down.dim() != 3 or gate_up.shape[0] != down.shape[0]:
            raise Error(f"QuantMoE.from_float: gate_up must be [E, 2I, H] and down [E, H, I] "
                        f"({list(gate_up.shape)}, {list(down.shape)} given)")
        if gate_up.is_cuda and down.device == gate_up.device:
            # Prepared where they lie: the packed forms come down, nothing goes up.
            experts = ops.quantize_and_register_experts(_device_quantizable(gate_up),
                                                        _device_quantizable(down), scheme,
                                                        host_copy=host_copy)
        else:
            experts = ops.register_experts([_quantize(scheme, w) for w in gate_up],
                                           [_quantize(scheme, w) for w in down], scheme)
        return cls(experts, activation, **kwargs)

    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                expert_map: Optional[torch.Tensor] = None) -> torch.Tensor:
        # The signature of transformers' fused experts modules (hidden_states, top_k_index,
        # top_k_weights), so that quantize_model can put a QuantMoE in their place. float32
        # hidden states (a float32 model) go through bf16, as QuantLinear's do.
        x = hidden.reshape(-1, hidden.shape[-1])
        if x.dtype not in ops.ACTIVATION_DTYPES:
            x = x.to(torch.bfloat16)
        y = torch.ops.qgemm.moe(x, topk_ids.reshape(x.shape[0], -1),
                                topk_weights.reshape(x.shape[0], -1), self.experts.handle,
                                self.activation, self.alpha, self.limit, self.gate_up_bias,
                                self.down_bias, expert_map)
        return y.to(hidden.dtype).reshape(hidden.shape)

    @property
    def quantized_parameters(self) -> int:
        """Weights the experts hold (E · 3 · H · I), for coverage reports."""
        e = self.experts
        return e.experts * 3 * e.hidden * e.intermediate

    def extra_repr(self) -> str:
        return (f"experts={self.experts.experts}, hidden={self.experts.hidden}, "
                f"intermediate={self.experts.intermediate}, scheme='{self.experts.scheme}', "
                f"activation={self.activation}")


def _ignored(name: str, patterns: Iterable[str]) -> bool:
    """Whether the module named `name` is left alone: a pattern matches the whole name, its
    last components (e.g. "lm_head" matches "model.lm_head", "mlp.gate" "layers.0.mlp.gate"),
    the name as a glob ("*.router"), or, prefixed "re:", as a regular expression matched from the
    name's start (compressed-tensors' convention)."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], name):
                return True
        elif name == pattern or name.endswith("." + pattern) or \
                fnmatch.fnmatchcase(name, pattern):
            return True
    return False


def _fused_experts_activation(module: torch.nn.Module) -> Optional[str]:
    """The GLU of a transformers fused-experts module (3-D gate_up_proj [E, 2I, H] with gate rows
    then up rows, down_proj [E, H, I], act_fn, forward(hidden_states, top_k_index,
    top_k_weights): Qwen3-MoE, Qwen2-MoE, Mixtral, DeepSeek and most of their kind), or None when
    `module` is not one QuantMoE computes exactly (biases, interleaved gate/up, other
    activations)."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gate_up, torch.nn.Parameter) or not isinstance(down, torch.nn.Parameter):
        return None
    if gate_up.dim() != 3 or down.dim() != 3 or gate_up.shape[0] != down.shape[0] or \
            gate_up.shape[1] != 2 * down.shape[2] or gate_up.shape[2] != down.shape[1]:
        return None
    if any(p is not None for p in (getattr(module, "gate_up_proj_bias", None),
                                   getattr(module, "down_proj_bias", None))):
        return None
    # torch's modules or transformers' own (SiLUActivation, GELUActivation: the erf GELU; its
    # tanh and "new"/"fast" approximations are other functions, left alone).
    act = getattr(module, "act_fn", None)
    kind = type(act).__name__
    if kind in ("SiLU", "SiLUActivation"):
        return "silu"
    if (kind == "GELU" and getattr(act, "approximate", "none") == "none") or \
            kind == "GELUActivation":
        return "gelu"
    return None


def quantize_model(model: torch.nn.Module, scheme, ignore: Union[str, Iterable[str]] = ("lm_head",),
                   *, max_rows: int = 65536, host_copy: bool = True) -> torch.nn.Module:
    """Replaces, in place, every torch.nn.Linear of `model` (exactly that type: subclasses such
    as MultiheadAttention's out_proj are read by their owners as plain weights) with a
    QuantLinear quantized as `scheme`, and every transformers fused-experts module (MoE layers'
    `experts`: see _fused_experts_activation) with a QuantMoE, except those `ignore` names (see
    _ignored: full names, trailing names such as "lm_head", globs, "re:" regular expressions;
    routers are Linears or parameters of their own, so "gate" / "router" keep them). A module
    shared by two owners stays shared. Returns the model (the replacement when `model` itself is
    a Linear). host_copy=False: layers on a GPU keep no host packed form (QuantLinear.from_float),
    for a model that is only served there."""
    scheme = _scheme(scheme, "quantize_model")
    if isinstance(ignore, str):
        ignore = (ignore,)
    ignore = tuple(ignore)
    if not all(isinstance(p, str) for p in ignore):
        raise Error(f"quantize_model: ignore must hold module names or patterns (strings): "
                    f"{ignore!r}")
    if type(model) is torch.nn.Linear:
        return QuantLinear.from_float(model, scheme, max_rows=max_rows, host_copy=host_copy)
    targets = []
    for owner_name, owner in model.named_modules(remove_duplicate=False):
        for child_name, child in owner.named_children():
            name = f"{owner_name}.{child_name}" if owner_name else child_name
            if _ignored(name, ignore):
                continue
            if type(child) is torch.nn.Linear or _fused_experts_activation(child) is not None:
                targets.append((owner, child_name, child, name))
    replacements = {}
    # Each float module is let go once replaced (a module shared by two owners lives on until its
    # last owner's turn; ids stay unique among the modules still listed), so that the model's
    # float weights and its quantized ones are not all held at once.
    for at in range(len(targets)):
        owner, child_name, child, name = targets[at]
        targets[at] = None
        if id(child) not in replacements:
            _return_cached_memory()
            try:
                if type(child) is torch.nn.Linear:
                    replacement = QuantLinear.from_float(child, scheme, max_rows=max_rows,
                                                         host_copy=host_copy)
                else:
                    replacement = QuantMoE.from_float(child.gate_up_proj, child.down_proj, scheme,
                                                      _fused_experts_activation(child),
                                                      host_copy=host_copy)
                replacements[id(child)] = replacement
            except ValueError as error:
                raise Error(f"quantize_model: {name}: {error}") from error
        setattr(owner, child_name, replacements[id(child)])
        del child
    return model


def _return_cached_memory() -> None:
    """Hands torch's cached free blocks back to the driver when they reach a GiB: qgemm's prepared
    weights are allocated outside torch's allocator, which keeps the memory of the float weights
    quantize_model frees (a 30B-parameter model would otherwise run out of memory part way)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for device in range(torch.cuda.device_count()):
            if torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device) > 1 << 30:
                torch.cuda.empty_cache()
                return


def _model_from_config(path: str, dtype):
    try:
        import transformers
    except ImportError as error:
        raise Error("load_quantized: building the model from config.json needs transformers "
                    "(or pass the model to load into as model=)") from error
    config = transformers.AutoConfig.from_pretrained(path)
    # Its quantized layers become QuantLinear here: transformers must not set up its own.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    dtype = dtype or getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or \
        torch.float16
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    # Parameters made in the model's dtype from the start (transformers 4 and 5 name the
    # from_config argument differently; the default dtype serves both).
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return transformers.AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(previous)


def _checkpoint_module(model: torch.nn.Module, prefix: str, what: str) -> torch.nn.Module:
    """The model's module at a checkpoint's `prefix` (an Error naming it when absent)."""
    try:
        return model.get_submodule(prefix)
    except AttributeError:
        raise Error(f"load_quantized: the checkpoint's {what} {prefix} is not in the model") \
            from None


def _replace_module(model: torch.nn.Module, prefix: str, module: torch.nn.Module) -> None:
    owner_name, _, child_name = prefix.rpartition(".")
    setattr(model.get_submodule(owner_name) if owner_name else model, child_name, module)


def load_quantized(path: str, model: Optional[torch.nn.Module] = None, *, dtype=None,
                   max_rows: int = 65536) -> torch.nn.Module:
    """A model from a quantized checkpoint directory (config.json with a quantization_config,
    and *.safetensors): each layer stored quantized (GPTQ, AWQ, compressed-tensors, modelopt
    NVFP4/FP8, FP8-block, BitNet: see qgemm.checkpoint) becomes a QuantLinear through
    qgemm.checkpoint's importers, gpt-oss's MXFP4 experts a QuantMoE (clamped SwiGLU, biases),
    and every other tensor (embeddings, norms, lm_head, biases) is loaded as stored.

    model: the model to load into, whose layers at the quantized prefixes are torch.nn.Linear
        (replaced in place). Default: transformers' AutoModelForCausalLM.from_config of the
        directory's config.json (needs transformers; its weights are initialized, then
        overwritten) in `dtype` (default: the config's).
    Returns the model, in eval mode, on the CPU: `.to("cuda")` moves it (its quantized layers
    are uploaded at their first call there)."""
    import os

    from safetensors import safe_open

    from . import checkpoint

    config = checkpoint.quantization_config(path)
    files = sorted(name for name in os.listdir(path) if name.endswith(".safetensors"))
    if not files:
        raise Error(f"load_quantized: {path} holds no *.safetensors file")
    tensors = {}
    for name in files:
        with safe_open(os.path.join(path, name), framework="pt") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    # The layers stored quantized, by the format's tensor names (checkpoint.quantized_prefixes),
    # and the routed expert layers (checkpoint.quantized_experts: gpt-oss MXFP4).
    prefixes = checkpoint.quantized_prefixes(tensors, config)
    expert_prefixes = checkpoint.quantized_experts(tensors, config)
    if not prefixes and not expert_prefixes:
        raise Error(f"load_quantized: {path} has no quantized layer (no <prefix>.qweight, "
                    ".weight_packed, .weight_scale_inv, .weight with .weight_scale, or MXFP4 "
                    "experts' _blocks)")
    if model is None:
        model = _model_from_config(path, dtype)
    model_dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()),
                       torch.float16)
    # The 16-bit activations the layers will see (the scheme's a= part, for the CPU path).
    activation = "bf16" if model_dtype == torch.bfloat16 else "fp16"

    for prefix in prefixes:
        linear = _checkpoint_module(model, prefix, "layer")
        if not isinstance(linear, torch.nn.Linear):
            raise Error(f"load_quantized: {prefix} is a {type(linear).__name__} in the model, "
                        "not a torch.nn.Linear")
        names = [key for key in tensors if key.startswith(prefix + ".") and
                 key != prefix + ".bias"]
        # The importers take torch tensors as stored (bf16 and fp8 types included).
        imported = checkpoint.import_linear({key: tensors.pop(key) for key in names},
                                            prefix, config, activation)
        if (imported.weight.n, imported.weight.k) != (linear.out_features, linear.in_features):
            raise Error(f"load_quantized: {prefix} is [{imported.weight.n}, {imported.weight.k}] "
                        f"in the checkpoint, [{linear.out_features}, {linear.in_features}] in "
                        "the model")
        bias = tensors.pop(prefix + ".bias", None)
        module = QuantLinear.from_packed(imported.weight, imported.scheme,
                                         None if bias is None else bias.to(model_dtype),
                                         input_permutation=imported.input_permutation,
                                         max_rows=max_rows)
        _replace_module(model, prefix, module)

    for prefix in expert_prefixes:
        fused = _checkpoint_module(model, prefix, "experts")
        # transformers' GptOssExperts: gate_up_proj [E, H, 2I] (transposed, gate/up interleaved),
        # the clamped SwiGLU's alpha and limit; forward(hidden_states, router_indices,
        # routing_weights [T, top_k]), which QuantMoE takes as they are.
        gate_up = getattr(fused, "gate_up_proj", None)
        if not (isinstance(gate_up, torch.Tensor) and gate_up.dim() == 3 and
                hasattr(fused, "alpha") and hasattr(fused, "limit")):
            raise Error(f"load_quantized: {prefix} is a {type(fused).__name__} in the model, not "
                        "gpt-oss's experts (3-D gate_up_proj, alpha and limit)")
        names = [key for key in tensors if key.startswith(prefix + ".")]
        imported = checkpoint.import_mxfp4_experts({key: tensors.pop(key) for key in names},
                                                   prefix, activation)
        e, i2, h = len(imported.gate_up), imported.gate_up[0].n, imported.gate_up[0].k
        if tuple(gate_up.shape) != (e, h, i2):
            raise Error(f"load_quantized: {prefix} holds {e} experts of [{i2}, {h}] in the "
                        f"checkpoint, gate_up_proj {list(gate_up.shape)} in the model")
        bias = lambda b: None if b is None else torch.from_numpy(b)  # noqa: E731
        module = QuantMoE(ops.register_experts(imported.gate_up, imported.down, imported.scheme),
                          "clamped-swiglu", alpha=float(fused.alpha), limit=float(fused.limit),
                          gate_up_bias=bias(imported.gate_up_bias),
                          down_bias=bias(imported.down_bias))
        _replace_module(model, prefix, module)

    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected:
        raise Error(f"load_quantized: the model has no place for {len(unexpected)} of the "
                    f"checkpoint's tensors, e.g. {unexpected[:3]}")
    if hasattr(model, "tie_weights"):
        model.tie_weights()  # lm_head shares the embeddings' tensor where the config says so
    # Missing: a QuantLinear's own state (it came from the quantized tensors), or a tensor
    # tied to one that was loaded; anything else was not in the checkpoint.
    state = model.state_dict(keep_vars=True)
    loaded = {state[name].data_ptr() for name in tensors
              if isinstance(state.get(name), torch.Tensor)}
    missing = [name for name in missing if not name.endswith("._extra_state") and
               not any(name.startswith(prefix + ".") for prefix in expert_prefixes) and
               not (isinstance(state.get(name), torch.Tensor) and
                    state[name].data_ptr() in loaded)]
    if missing:
        raise Error(f"load_quantized: the checkpoint lacks {len(missing)} of the model's "
                    f"tensors, e.g. {missing[:3]}")
    return model.eval()
