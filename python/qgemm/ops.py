"""torch.ops.qgemm: qgemm's GEMM as a PyTorch operator (imported only where torch is).

    out = torch.ops.qgemm.gemm(a, weight, n, bias=None, out_dtype=None)

computes out = a · dequant(W)ᵀ (+ bias) over the last dimension of `a` (any leading shape, bf16
or fp16), with W the weight registered under the integer `weight`, which has `n` rows:

    weight = qgemm.ops.register_weight(qgemm.quantize_weight(scheme, w), scheme)
    y = torch.ops.qgemm.gemm(x, weight.handle, weight.n)

How the weight travels: an integer handle into a registry of this process.
    A torch operator's arguments are tensors, numbers, strings, dtypes and lists of them. A
    prepared weight is none of these: it is a C++ object holding device buffers in the kernel
    layouts (a QuantWeight) plus the host canonical form the CPU reference reads. So
    `register_weight` keeps both in a registry and hands out a `RegisteredWeight` whose `handle`
    (an int) is what the operator carries; `n` travels beside it so that the fake
    implementation can give the output's shape without the registry (under torch.compile the
    handle may be a symbolic int). The handle names an immutable weight: a new weight gets a new
    handle, and the entry lives as long as its RegisteredWeight (keep a module alive while a
    CUDA graph that captured its calls may replay: the graph reads its prepared buffers).
    Alternatives considered: the canonical packed tensors as operator arguments would put a
    second, unused copy of every weight on the GPU beside its kernel layouts (and the CUDA path
    would still need a lookup for the prepared layouts); torch's opaque objects
    (torch._library.opaque_object) are private and still changing in 2.11; a TorchBind class
    needs a C++ extension built against libtorch, which the core must not depend on. Limits of
    this choice: an exported program (torch.export) carries process-local handles, so it runs
    only in the process that made it.

Implementations:
    fake (meta)  the output's shape (a.shape[:-1] + (n,)) and dtype (out_dtype, default a's):
                 torch.compile(fullgraph=True) traces through it, and CUDA graphs capture the
                 CUDA implementation's launches.
    CUDA         Engine.gemm on the current torch stream, one Engine per device (cached), the
                 weight prepared on that device on first use (`prepare` does it ahead, e.g.
                 before capturing a CUDA graph: a first call on a shape also plans and compiles,
                 which a capture cannot contain), into a fresh output tensor.
    CPU          qgemm.reference_gemm (exact in double, rounded to the output type): the
                 operator works, and is checked, without a GPU. It is the oracle, not fast.

`warm_up(weight, max_tokens, ...)` and `warm_up_moe(experts, tokens, top_k, ...)` compile ahead
what the CUDA implementations will choose (a deployment's start, before CUDA-graph capture).

Both real implementations treat 16-bit activations the way the Engine does: a scheme whose
activations are not quantized takes `a` in its own type (the scheme's `a=` part does not round
it again); a scheme with quantized activations (w4a8-fp8, nvfp4, ...) quantizes `a` as its
`a=` part says. Autograd is not implemented: the operator is for inference.

MoE: a routed expert layer, its expert weights registered the same way:

    experts = qgemm.ops.register_experts(gate_up, down, scheme)   # lists of E PackedWeights
    y = torch.ops.qgemm.moe(x, topk_ids, topk_weights, experts.handle, "silu", 1.702, 7.0)

gate_up[e] is expert e's [2I, H] (gate rows, then up rows), down[e] its [H, I]; y (x's shape and
dtype) = Σ_j topk_weights[t, j] · down_e(glu(gate_up_e(x_t))), e = topk_ids[t, j] (int32 or
int64). CUDA: Engine.moe (route, gather, grouped GEMMs, GLU, top-k sum; capturable once a
shape has run). CPU: reference_moe_layer. An optional expert_map (int [global experts]: local id
or -1) computes this rank's experts only (expert parallelism); biases are fp32 [E, 2I] and
[E, H].

Grouped GEMM over rows an engine already grouped by expert (its own dispatch):

    grouped = qgemm.ops.register_grouped_weight(experts, scheme)   # E PackedWeights [N, K]
    y = torch.ops.qgemm.grouped_gemm(rows, grouped.handle, grouped.n, offsets=offsets)
    y = torch.ops.qgemm.grouped_gemm(rows3, grouped.handle, grouped.n, counts=counts)

contiguous: rows [R, K] with expert e's rows at offsets[e] .. offsets[e+1]-1 (int [E + 1]);
masked: rows [E, C, K] with expert e's first counts[e] rows (int [E]). y has rows' shape with N
last; a row of no expert is zero, and so is every row of a grouping that breaks its rule
(offsets that fall, a count outside [0, C]). CUDA: Engine.moe_gemm_grouped (sizes read on the
device: capturable once a shape has run). CPU: reference_gemm per expert.
"""

from __future__ import annotations

import functools
import itertools
import threading
import weakref
from typing import Optional

import numpy as np
import torch

from ._core import (Engine, Error, PackedWeight, QuantWeight, Scheme, reference_gemm,
                    reference_moe_layer)

__all__ = ["RegisteredWeight", "register_weight", "quantize_and_register", "lookup", "prepare",
           "engine", "gemm", "RegisteredExperts", "register_experts",
           "quantize_and_register_experts", "moe", "RegisteredGroupedWeight",
           "register_grouped_weight", "grouped_gemm"]

# The activation and output types the operator takes, by torch dtype and qgemm format name.
ACTIVATION_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
OUTPUT_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}

_lock = threading.Lock()
_registry: dict[int, "_Entry"] = {}
_handles = itertools.count(1)  # 0 stays unused, so that a default-initialized int is no handle
_engines: dict[int, Engine] = {}


class _PerDevice:
    """A registry entry's prepared form per device, made by `_prepare(engine)` on first use."""

    def __init__(self):
        self.prepared: dict = {}
        self.lock = threading.Lock()

    def on_device(self, device: int):
        prepared = self.prepared.get(device)
        if prepared is None:
            with self.lock:  # one upload per device, even when threads race to it
                prepared = self.prepared.get(device)
                if prepared is None:
                    prepared = self.prepared[device] = self._prepare(engine(device))
        return prepared


def _scheme_of(scheme, function: str) -> Scheme:
    """`scheme` as a Scheme (given as one or as its text)."""
    scheme = Scheme(scheme) if isinstance(scheme, str) else scheme
    if not isinstance(scheme, Scheme):
        raise Error(f"{function}: scheme must be a qgemm.Scheme or its text "
                    f"({type(scheme).__name__} given)")
    return scheme


def _check_packed(weights, scheme: Scheme, name: str, function: str) -> None:
    """Every one of `weights` a PackedWeight quantized as `scheme`'s weight part."""
    for e, w in enumerate(weights):
        if not isinstance(w, PackedWeight):
            raise Error(f"{function}: {name}[{e}] must be a qgemm.PackedWeight "
                        f"({type(w).__name__} given)")
        if str(w.scheme).split(";")[0] != str(scheme).split(";")[0]:
            raise Error(f"{function}: {name}[{e}] is quantized as {w.scheme}, the scheme's "
                        f"weight part is {scheme}")


def _enter(owner, registry: dict, entry) -> int:
    """Puts `entry` in `registry` under a fresh handle, released when `owner` is collected."""
    with _lock:
        handle = next(_handles)
        registry[handle] = entry
    weakref.finalize(owner, _release, registry, handle)
    return handle


def _release(registry: dict, handle: int) -> None:
    with _lock:
        registry.pop(handle, None)


def _no_host_copy(what: str) -> Error:
    return Error(f"{what} needs the weight's host packed form, and it was quantized on the GPU "
                 "with host_copy=False, which keeps none (rule: quantize with host_copy=True for "
                 "the CPU path, a state_dict, a copy or another GPU)")


class _Entry(_PerDevice):
    """A registered weight: its scheme, shape, the host canonical form (the CPU path and any new
    device's preparation read it; None where the weight was quantized on a GPU with
    host_copy=False) and its prepared form (a QuantWeight) per device."""

    def __init__(self, packed: Optional[PackedWeight], scheme: Scheme, max_rows: int,
                 shape: Optional[tuple] = None):
        super().__init__()
        self._packed = packed
        self.n, self.k = (packed.n, packed.k) if packed is not None else shape
        self.scheme = scheme
        self.max_rows = max_rows

    def host_packed(self, what: str) -> PackedWeight:
        """The host canonical form, which `what` (named in the error) needs."""
        if self._packed is None:
            raise _no_host_copy(what)
        return self._packed

    packed = property(lambda self: self.host_packed("qgemm: the packed weight"))

    def _prepare(self, e: Engine) -> QuantWeight:
        return e.prepare_weight(self.host_packed("qgemm: preparing a weight on another GPU"),
                                self.scheme, self.max_rows)


class RegisteredWeight:
    """A weight the operator can name: `handle` (an int) and `n` are its arguments to
    torch.ops.qgemm.gemm. The registry entry is released when this object is collected; copies
    (copy.deepcopy, pickle) register the weight again under a new handle."""

    def __init__(self, packed: PackedWeight, scheme: Scheme, max_rows: int = 65536):
        if not isinstance(packed, PackedWeight):
            raise Error(f"register_weight: weight must be a qgemm.PackedWeight "
                        f"({type(packed).__name__} given)")
        scheme = _scheme_of(scheme, "register_weight")
        if str(packed.scheme).split(";")[0] != str(scheme).split(";")[0]:
            raise Error(f"register_weight: the scheme's weight part ({scheme}) differs from the "
                        f"weight's ({packed.scheme})")
        if int(max_rows) < 1:
            raise Error(f"register_weight: max_rows must be at least 1 ({max_rows} given)")
        self._entry = _Entry(packed, scheme, int(max_rows))
        self.handle = _enter(self, _registry, self._entry)

    @classmethod
    def _prepared_only(cls, n: int, k: int, scheme: Scheme, max_rows: int, device: int,
                       prepared: QuantWeight) -> "RegisteredWeight":
        """A weight prepared on `device` with no host packed form (host_copy=False)."""
        registered = cls.__new__(cls)
        registered._entry = _Entry(None, scheme, int(max_rows), (n, k))
        registered._entry.prepared[device] = prepared
        registered.handle = _enter(registered, _registry, registered._entry)
        return registered

    packed = property(lambda self: self._entry.packed,
                      doc="The host canonical packed weight (an Error with host_copy=False).")
    has_host_copy = property(lambda self: self._entry._packed is not None)

    def host_packed(self, what: str) -> PackedWeight:
        """`packed`, for `what` (which the error of a weight kept without it names)."""
        return self._entry.host_packed(what)

    scheme = property(lambda self: self._entry.scheme)
    n = property(lambda self: self._entry.n, doc="Output features (the weight's rows).")
    k = property(lambda self: self._entry.k, doc="Input features.")
    max_rows = property(lambda self: self._entry.max_rows)

    def __repr__(self):
        return (f"qgemm.ops.RegisteredWeight(handle={self.handle}, n={self.n}, k={self.k}, "
                f"scheme='{self.scheme}')")

    def __reduce__(self):
        # The canonical parts, from which a copy registers a weight of its own (a shared handle
        # would be released by whichever copy goes first).
        p = self.host_packed("copying a RegisteredWeight (pickle, deepcopy)")
        zeros = p.zeros if p.zeros.size else None
        return (_rebuild, (str(self.scheme), p.n, p.k, p.codes, p.scales, zeros, p.global_scale,
                           self.max_rows))


def _rebuild(scheme_text, n, k, codes, scales, zeros, global_scale, max_rows):
    scheme = Scheme(scheme_text)
    packed = PackedWeight.from_parts(scheme, n, k, codes, scales, zeros, global_scale)
    return RegisteredWeight(packed, scheme, max_rows)


def register_weight(packed: PackedWeight, scheme, max_rows: int = 65536) -> RegisteredWeight:
    """Registers a packed weight (quantize_weight's or a checkpoint importer's) for the operator.
    `scheme` must quantize weights as `packed` is quantized; its activation part says how 16-bit
    activations are quantized for it. `max_rows` is Engine.prepare_weight's: the most rows a
    call is expected to have (fewer can mean fewer kernel layouts on the GPU)."""
    return RegisteredWeight(packed, scheme, max_rows)


def quantize_and_register(weight: torch.Tensor, scheme, max_rows: int = 65536, *,
                          host_copy: bool = True) -> RegisteredWeight:
    """A CUDA weight [n, k] (bf16, fp16 or fp32) quantized on its GPU (round to nearest, the codes
    qgemm.quantize_weight gives) and registered, prepared there from that one quantization: the
    host packed form (the CPU path, state_dict, copies, other GPUs) is downloaded, nothing is
    uploaded back. host_copy=False keeps no host form: nothing leaves the GPU (the download into
    fresh host memory is most of the time otherwise), and what needs the host form says so."""
    if not weight.is_cuda:
        raise Error(f"quantize_and_register: weight must be a CUDA tensor ({weight.device} given; "
                    "qgemm.quantize_weight quantizes on the host)")
    scheme = _scheme_of(scheme, "quantize_and_register")
    device = _cuda_index(weight.device)
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device).cuda_stream
        if not host_copy:
            prepared = engine(device).prepare_weight(weight.detach(), scheme, int(max_rows), stream)
            return RegisteredWeight._prepared_only(weight.shape[0], weight.shape[1], scheme,
                                                   max_rows, device, prepared)
        packed, prepared = engine(device).quantize_and_prepare_weight(
            weight.detach(), scheme, int(max_rows), stream)
    registered = RegisteredWeight(packed, scheme, max_rows)
    registered._entry.prepared[device] = prepared
    return registered


def lookup(handle: int) -> _Entry:
    entry = _registry.get(handle)
    if entry is None:
        raise Error(f"qgemm.gemm: weight handle {handle} is not registered (register_weight "
                    "makes one; it is released when its RegisteredWeight or QuantLinear goes)")
    return entry


def engine(device: int) -> Engine:
    """The process's Engine for CUDA device `device` (one per device: it holds the compiled
    kernels, plans and per-stream workspaces that every weight on that device shares)."""
    found = _engines.get(device)
    if found is None:
        with _lock:
            found = _engines.get(device)
            if found is None:
                found = _engines[device] = Engine(device)
    return found


def _cuda_index(device: torch.device) -> int:
    """The index of a CUDA device ("cuda" alone: the current one)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def prepare(weight, device=None):
    """Uploads a registered weight (a RegisteredWeight or its handle: its QuantWeight is
    returned) or expert set (a RegisteredExperts: its (gate_up, down) QuantWeights) to a CUDA
    device (default: the current one) now rather than at its first call."""
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else \
        torch.device(device)
    if device.type != "cuda":
        raise Error(f"qgemm.ops.prepare: device must be a CUDA device ({device} given)")
    if isinstance(weight, RegisteredExperts):
        return _experts(weight.handle).on_device(_cuda_index(device))
    handle = weight.handle if isinstance(weight, RegisteredWeight) else int(weight)
    return lookup(handle).on_device(_cuda_index(device))


def _check(a: torch.Tensor, weight, n, bias: Optional[torch.Tensor],
           out_dtype: Optional[torch.dtype]) -> torch.dtype:
    """The rules every implementation applies (the fake one too, so that torch.compile reports
    them at trace time); returns the output's dtype."""
    if a.dim() < 1:
        raise Error("qgemm.gemm: a must have at least one dimension (its last is k)")
    if a.dtype not in ACTIVATION_DTYPES:
        raise Error(f"qgemm.gemm: a must be bfloat16 or float16 ({a.dtype} given; QuantLinear "
                    "casts float32 inputs)")
    out_dtype = a.dtype if out_dtype is None else out_dtype
    if out_dtype not in OUTPUT_DTYPES:
        raise Error(f"qgemm.gemm: out_dtype must be bfloat16, float16 or float32 "
                    f"({out_dtype} given)")
    if bias is not None:
        if bias.dim() != 1 or (isinstance(n, int) and bias.shape[0] != n):
            raise Error(f"qgemm.gemm: bias must be 1-D with n = {n} values "
                        f"(shape {tuple(bias.shape)} given)")
        if not bias.dtype.is_floating_point:
            raise Error(f"qgemm.gemm: bias must be floating point ({bias.dtype} given)")
        if bias.device != a.device:
            raise Error(f"qgemm.gemm: bias is on {bias.device}, a on {a.device}")
    # The registry is consulted only where the handle is a plain int (under torch.compile it
    # may be symbolic), and only where it is registered (the real kernels say when it is not).
    entry = _registry.get(weight) if isinstance(weight, int) else None
    if entry is not None:
        if isinstance(n, int) and n != entry.n:
            raise Error(f"qgemm.gemm: n = {n}, but weight {weight} has n = {entry.n}")
        k = a.shape[-1]
        if isinstance(k, int) and k != entry.k:
            raise Error(f"qgemm.gemm: a has {k} columns (its last dimension); weight {weight} "
                        f"has k = {entry.k}")
    return out_dtype


@torch.library.custom_op("qgemm::gemm", mutates_args=())
def gemm(a: torch.Tensor, weight: int, n: int, bias: Optional[torch.Tensor] = None,
         out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """out = a · dequant(W)ᵀ (+ bias): a [..., k] bf16/fp16, W the registered weight `weight`
    with n rows, bias [n] (added in fp32), out [..., n] in out_dtype (default: a's)."""
    raise Error(f"qgemm.gemm: no implementation for {a.device.type} tensors (CPU and CUDA)")


@gemm.register_fake
def _gemm_fake(a, weight, n, bias=None, out_dtype=None):
    out_dtype = _check(a, weight, n, bias, out_dtype)
    return a.new_empty((*a.shape[:-1], n), dtype=out_dtype)


def _rows(a: torch.Tensor) -> torch.Tensor:
    """a as a 2-D [m, k] matrix with unit column stride (a view where its layout allows)."""
    a2 = a.reshape(-1, a.shape[-1])
    return a2 if a2.stride(-1) == 1 else a2.contiguous()


@gemm.register_kernel("cuda")
def _gemm_cuda(a, weight, n, bias=None, out_dtype=None):
    entry = lookup(weight)
    out_dtype = _check(a, weight, n, bias, out_dtype)
    out = torch.empty((*a.shape[:-1], n), dtype=out_dtype, device=a.device)
    a2 = _rows(a)
    if a2.shape[0] == 0:
        return out  # the Engine needs M ≥ 1; an empty batch has nothing to compute
    device = _cuda_index(a.device)
    prepared = entry.on_device(device)
    if bias is not None and (bias.dtype != torch.float32 or bias.stride(0) != 1):
        bias = bias.to(torch.float32).contiguous()  # the epilogue reads fp32
    stream = torch.cuda.current_stream(a.device).cuda_stream
    engine(device).gemm(a2, prepared, out.view(-1, n), stream, bias=bias)
    return out


def warm_up(weight: int, max_tokens: int, dtype: torch.dtype = torch.bfloat16,
            out_dtype: Optional[torch.dtype] = None, bias: bool = False,
            device: Optional[torch.device] = None, progress: bool = False) -> None:
    """Compiles, ahead, every kernel `torch.ops.qgemm.gemm` can choose for the registered weight
    `weight` at 1 .. max_tokens rows of `dtype` activations (out_dtype: default dtype; bias:
    whether the calls pass one), on a pool of threads, and prepares the weight on `device`
    (default: the current CUDA device): a later call of any such shape, or a CUDA-graph capture
    of it, then compiles nothing. Engine.warm_up."""
    entry = lookup(weight)
    out_dtype = dtype if out_dtype is None else out_dtype
    if dtype not in ACTIVATION_DTYPES or out_dtype not in OUTPUT_DTYPES:
        raise Error(f"qgemm.ops.warm_up: dtype {dtype} / out_dtype {out_dtype} (rule: bfloat16 "
                    "or float16 in; bfloat16, float16 or float32 out)")
    index = _cuda_index(torch.device("cuda") if device is None else torch.device(device))
    stream = torch.cuda.current_stream(index).cuda_stream
    engine(index).warm_up(entry.on_device(index), max_tokens, ACTIVATION_DTYPES[dtype],
                          OUTPUT_DTYPES[out_dtype], bias, stream, progress)


@functools.lru_cache(maxsize=256)
def _call_scheme(scheme_text: str, activation: str, output: str) -> Scheme:
    """The scheme a call computes: the weight's scheme with the output rounded to the call's
    type, and with unquantized activations in the call's own 16-bit type."""
    scheme = Scheme(scheme_text)
    parts = [p for p in scheme_text.split(";") if not p.startswith(("a=", "o="))]
    a_part = next(p for p in scheme_text.split(";") if p.startswith("a="))
    if not scheme.activation_quantized:
        a_part = f"a={activation}"
    return Scheme(";".join(parts + [a_part, f"o={output}"]))


@gemm.register_kernel("cpu")
def _gemm_cpu(a, weight, n, bias=None, out_dtype=None):
    entry = lookup(weight)
    out_dtype = _check(a, weight, n, bias, out_dtype)
    scheme = _call_scheme(str(entry.scheme), ACTIVATION_DTYPES[a.dtype], OUTPUT_DTYPES[out_dtype])
    a2 = a.detach().reshape(-1, a.shape[-1])
    if a2.shape[0] == 0:
        return torch.empty((*a.shape[:-1], n), dtype=out_dtype)
    # bf16/fp16 → fp32 is exact, so the reference sees the very values the GPU would.
    a_host = np.ascontiguousarray(a2.to(torch.float32).numpy())
    bias_host = None if bias is None else \
        np.ascontiguousarray(bias.detach().to(torch.float32).numpy())
    c = reference_gemm(scheme, a_host, entry.host_packed("qgemm.gemm on the CPU"), bias_host)
    # The reference rounded every value to out_dtype already: this conversion is exact.
    return torch.from_numpy(c).to(out_dtype).reshape(*a.shape[:-1], n)


# --- MoE ------------------------------------------------------------------------------------


def _as_int32(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A device array the Engine reads as int32 (routing ids, maps, groupings)."""
    return None if t is None else t.to(torch.int32).contiguous()


def _as_fp32(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A device array the Engine reads as fp32 (router weights, biases)."""
    return None if t is None else t.to(torch.float32).contiguous()

GLU_ACTIVATIONS = ("silu", "gelu", "clamped-swiglu")


class _ExpertsEntry(_PerDevice):
    """Registered expert weights: their count and shape, the host canonical experts (the CPU path
    reads them; None with host_copy=False) and their prepared pair (gate_up, down) per device."""

    def __init__(self, gate_up, down, scheme: Scheme, shape: Optional[tuple] = None):
        super().__init__()
        self._host = None if gate_up is None else (list(gate_up), list(down))
        self.experts, self.hidden, self.intermediate = (
            shape if gate_up is None else (len(gate_up), gate_up[0].k, down[0].k))
        self.scheme = scheme

    def host_experts(self, what: str) -> tuple[list, list]:
        """The host (gate_up, down) packed experts, which `what` (named in the error) needs."""
        if self._host is None:
            raise _no_host_copy(what)
        return self._host

    def _prepare(self, e: Engine) -> tuple[QuantWeight, QuantWeight]:
        gate_up, down = self.host_experts("qgemm: preparing experts on another GPU")
        # gate_up in the interleaved rows of the fused GLU (it serves Engine.moe only).
        return (e.prepare_experts(gate_up, self.scheme, role="gate_up"),
                e.prepare_experts(down, self.scheme))


class RegisteredExperts:
    """An MoE layer's expert weights as the operator names them: `handle` is its argument to
    torch.ops.qgemm.moe. Released when this object is collected."""

    def __init__(self, gate_up, down, scheme):
        gate_up, down = list(gate_up), list(down)
        scheme = _scheme_of(scheme, "register_experts")
        if not gate_up or len(gate_up) != len(down):
            raise Error(f"register_experts: {len(gate_up)} gate_up and {len(down)} down experts "
                        "(rule: one or more, equal counts)")
        _check_packed(gate_up, scheme, "gate_up", "register_experts")
        _check_packed(down, scheme, "down", "register_experts")
        h, i2 = gate_up[0].k, gate_up[0].n
        if i2 % 2 or any(w.n != i2 or w.k != h for w in gate_up) or \
                any(w.n != h or w.k != i2 // 2 for w in down):
            raise Error(f"register_experts: gate_up experts must all be [2I, H] and down experts "
                        f"[H, I] (gate_up[0] is [{i2}, {h}], down[0] [{down[0].n}, {down[0].k}])")
        self._entry = _ExpertsEntry(gate_up, down, scheme)
        self.handle = _enter(self, _experts_registry, self._entry)

    @classmethod
    def _prepared_only(cls, experts: int, hidden: int, intermediate: int, scheme: Scheme,
                       device: int, prepared: tuple) -> "RegisteredExperts":
        """Experts prepared on `device` with no host packed forms (host_copy=False)."""
        registered = cls.__new__(cls)
        registered._entry = _ExpertsEntry(None, None, scheme, (experts, hidden, intermediate))
        registered._entry.prepared[device] = prepared
        registered.handle = _enter(registered, _experts_registry, registered._entry)
        return registered

    experts = property(lambda self: self._entry.experts)
    hidden = property(lambda self: self._entry.hidden, doc="H: the layer's in/out features.")
    intermediate = property(lambda self: self._entry.intermediate, doc="I: one expert's width.")
    packed = property(lambda self: self._entry.host_experts("qgemm: the packed experts"),
                      doc="The host canonical (gate_up, down) lists (an Error with "
                          "host_copy=False).")
    has_host_copy = property(lambda self: self._entry._host is not None)
    scheme = property(lambda self: self._entry.scheme)

    def __repr__(self):
        return (f"qgemm.ops.RegisteredExperts(handle={self.handle}, experts={self.experts}, "
                f"hidden={self.hidden}, intermediate={self.intermediate}, scheme='{self.scheme}')")


_experts_registry: dict[int, _ExpertsEntry] = {}


def quantize_and_register_experts(gate_up: torch.Tensor, down: torch.Tensor, scheme, *,
                                  host_copy: bool = True) -> RegisteredExperts:
    """Float experts on a GPU (gate_up [E, 2I, H]: gate rows, then up rows; down [E, H, I])
    quantized there (round to nearest, the codes qgemm.quantize_weight gives per expert) and
    registered, prepared there from that one quantization: the host packed forms (the CPU path)
    are downloaded, nothing is uploaded back; host_copy=False keeps none (quantize_and_register's
    rule)."""
    if not gate_up.is_cuda or gate_up.device != down.device:
        raise Error(f"quantize_and_register_experts: gate_up and down must be CUDA tensors on "
                    f"one device ({gate_up.device}, {down.device} given)")
    scheme = _scheme_of(scheme, "quantize_and_register_experts")
    device = _cuda_index(gate_up.device)
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device).cuda_stream
        e = engine(device)
        if not host_copy:
            if gate_up.dim() != 3 or down.dim() != 3 or gate_up.shape[0] != down.shape[0] or \
                    gate_up.shape[1] != 2 * down.shape[2] or down.shape[1] != gate_up.shape[2]:
                raise Error(f"quantize_and_register_experts: gate_up must be [E, 2I, H] and down "
                            f"[E, H, I] ({list(gate_up.shape)}, {list(down.shape)} given)")
            prepared = (e.prepare_experts(gate_up.detach(), scheme, "auto", "gate_up", stream),
                        e.prepare_experts(down.detach(), scheme, "auto", "plain", stream))
            return RegisteredExperts._prepared_only(gate_up.shape[0], gate_up.shape[2],
                                                    down.shape[2], scheme, device, prepared)
        gate_up_packed, gate_up_prepared = e.quantize_and_prepare_experts(
            gate_up.detach(), scheme, "auto", "gate_up", stream)
        down_packed, down_prepared = e.quantize_and_prepare_experts(
            down.detach(), scheme, "auto", "plain", stream)
    registered = RegisteredExperts(gate_up_packed, down_packed, scheme)
    registered._entry.prepared[device] = (gate_up_prepared, down_prepared)
    return registered


def register_experts(gate_up, down, scheme) -> RegisteredExperts:
    """Registers an MoE layer's experts for torch.ops.qgemm.moe: gate_up (E PackedWeights
    [2I, H]: gate rows, then up rows) and down (E PackedWeights [H, I]), quantized as `scheme`'s
    weight part."""
    return RegisteredExperts(gate_up, down, scheme)


def _experts(handle: int) -> _ExpertsEntry:
    entry = _experts_registry.get(handle)
    if entry is None:
        raise Error(f"qgemm.moe: experts handle {handle} is not registered (register_experts "
                    "makes one; it is released when its RegisteredExperts or QuantMoE goes)")
    return entry


def _check_moe(hidden, topk_ids, topk_weights, experts, activation, expert_map):
    if hidden.dim() != 2:
        raise Error(f"qgemm.moe: hidden must be [tokens, H] ({hidden.dim()} dimensions given)")
    if hidden.dtype not in ACTIVATION_DTYPES:
        raise Error(f"qgemm.moe: hidden must be bfloat16 or float16 ({hidden.dtype} given)")
    if topk_ids.dim() != 2 or topk_weights.shape != topk_ids.shape or \
            topk_ids.shape[0] != hidden.shape[0]:
        raise Error(f"qgemm.moe: topk_ids {tuple(topk_ids.shape)} and topk_weights "
                    f"{tuple(topk_weights.shape)} must both be [tokens, top_k] with tokens = "
                    f"{hidden.shape[0]}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise Error(f"qgemm.moe: topk_ids must be int32 or int64 ({topk_ids.dtype} given)")
    if not topk_weights.dtype.is_floating_point:
        raise Error(f"qgemm.moe: topk_weights must be floating point ({topk_weights.dtype})")
    if activation not in GLU_ACTIVATIONS:
        raise Error(f"qgemm.moe: activation '{activation}' (rule: one of {GLU_ACTIVATIONS})")
    if expert_map is not None and (expert_map.dim() != 1 or
                                   expert_map.dtype not in (torch.int32, torch.int64)):
        raise Error("qgemm.moe: expert_map must be a 1-D int32/int64 tensor (local id or -1)")
    entry = _experts_registry.get(experts) if isinstance(experts, int) else None
    if entry is not None and isinstance(hidden.shape[1], int) and hidden.shape[1] != entry.hidden:
        raise Error(f"qgemm.moe: hidden has {hidden.shape[1]} columns; the experts' H is "
                    f"{entry.hidden}")


@torch.library.custom_op("qgemm::moe", mutates_args=())
def moe(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: int,
        activation: str = "silu", alpha: float = 1.702, limit: float = 7.0,
        gate_up_bias: Optional[torch.Tensor] = None, down_bias: Optional[torch.Tensor] = None,
        expert_map: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A routed expert layer: hidden [tokens, H] bf16/fp16, topk_ids / topk_weights [tokens,
    top_k], the registered experts `experts`; out [tokens, H] in hidden's dtype."""
    raise Error(f"qgemm.moe: no implementation for {hidden.device.type} tensors (CPU and CUDA)")


@moe.register_fake
def _moe_fake(hidden, topk_ids, topk_weights, experts, activation="silu", alpha=1.702,
              limit=7.0, gate_up_bias=None, down_bias=None, expert_map=None):
    _check_moe(hidden, topk_ids, topk_weights, experts, activation, expert_map)
    return torch.empty_like(hidden)


@moe.register_kernel("cuda")
def _moe_cuda(hidden, topk_ids, topk_weights, experts, activation="silu", alpha=1.702,
              limit=7.0, gate_up_bias=None, down_bias=None, expert_map=None):
    _check_moe(hidden, topk_ids, topk_weights, experts, activation, expert_map)
    entry = _experts(experts)
    out = torch.empty_like(hidden)
    if hidden.shape[0] == 0:
        return out
    device = _cuda_index(hidden.device)
    gate_up, down = entry.on_device(device)
    stream = torch.cuda.current_stream(hidden.device).cuda_stream
    engine(device).moe(hidden.contiguous(), _as_int32(topk_ids), _as_fp32(topk_weights), gate_up,
                       down, out, stream, activation=activation, alpha=alpha, limit=limit,
                       gate_up_bias=_as_fp32(gate_up_bias), down_bias=_as_fp32(down_bias),
                       expert_map=_as_int32(expert_map),
                       global_experts=0 if expert_map is None else expert_map.shape[0])
    return out


def warm_up_moe(experts: int, tokens, top_k: int, dtype: torch.dtype = torch.bfloat16,
                activation: str = "silu", alpha: float = 1.702, limit: float = 7.0,
                gate_up_bias: bool = False, down_bias: bool = False,
                device: Optional[torch.device] = None, progress: bool = False) -> None:
    """Makes, ahead, the plans of `torch.ops.qgemm.moe` over the registered experts `experts` for
    each token count in `tokens` at top_k (hidden states and output of `dtype`; the activation
    and whether each bias is given, as the calls will pass them), their kernels compiled on a
    pool of threads, the experts prepared on `device` (default: the current CUDA device): a later
    call of such a count, or a CUDA-graph capture of it, compiles nothing. Engine.warm_up_moe."""
    if dtype not in ACTIVATION_DTYPES:
        raise Error(f"qgemm.ops.warm_up_moe: dtype {dtype} (rule: bfloat16 or float16)")
    if activation not in GLU_ACTIVATIONS:
        raise Error(f"qgemm.ops.warm_up_moe: activation '{activation}' (rule: one of "
                    f"{GLU_ACTIVATIONS})")
    index = _cuda_index(torch.device("cuda") if device is None else torch.device(device))
    gate_up, down = _experts(experts).on_device(index)
    name = ACTIVATION_DTYPES[dtype]
    engine(index).warm_up_moe(gate_up, down, [int(t) for t in tokens], top_k, name, name,
                              activation, alpha, limit, gate_up_bias, down_bias, progress)


@moe.register_kernel("cpu")
def _moe_cpu(hidden, topk_ids, topk_weights, experts, activation="silu", alpha=1.702,
             limit=7.0, gate_up_bias=None, down_bias=None, expert_map=None):
    _check_moe(hidden, topk_ids, topk_weights, experts, activation, expert_map)
    entry = _experts(experts)
    if hidden.shape[0] == 0:
        return torch.empty_like(hidden)
    gate_up, down = entry.host_experts("qgemm.moe on the CPU")
    dtype = ACTIVATION_DTYPES[hidden.dtype]
    scheme = _call_scheme(str(entry.scheme), dtype, dtype)
    ids = topk_ids.detach().to(torch.int64).numpy()
    weights = topk_weights.detach().to(torch.float32).numpy().copy()
    if expert_map is not None:
        # Another rank's choices contribute nothing: weight 0 on a valid local id.
        mapped = expert_map.detach().to(torch.int64).numpy()[ids]
        weights[mapped < 0] = 0.0
        ids = np.where(mapped < 0, 0, mapped)
    host = lambda t: None if t is None else np.ascontiguousarray(  # noqa: E731
        t.detach().to(torch.float32).reshape(len(gate_up), -1).numpy())
    out = reference_moe_layer(scheme, np.ascontiguousarray(hidden.detach().to(torch.float32).numpy()),
                              gate_up, down,
                              np.ascontiguousarray(ids.astype(np.int32)),
                              np.ascontiguousarray(weights), activation, alpha, limit, dtype,
                              host(gate_up_bias), host(down_bias))
    return torch.from_numpy(out).to(hidden.dtype)


# --- Grouped GEMM over rows grouped by the caller ---------------------------------------------

class _GroupedEntry(_PerDevice):
    """A registered expert set: the host canonical experts and their prepared form per device."""

    def __init__(self, experts, scheme: Scheme):
        super().__init__()
        self.experts = list(experts)
        self.scheme = scheme

    def _prepare(self, e: Engine) -> QuantWeight:
        return e.prepare_experts(self.experts, self.scheme)


_grouped_registry: dict[int, _GroupedEntry] = {}


class RegisteredGroupedWeight:
    """An expert set (E PackedWeights of one shape [N, K]) as torch.ops.qgemm.grouped_gemm names
    it: `handle` and `n` are its arguments. Released when this object is collected."""

    def __init__(self, experts, scheme):
        experts = list(experts)
        scheme = _scheme_of(scheme, "register_grouped_weight")
        if not experts:
            raise Error("register_grouped_weight: no experts (rule: one or more)")
        _check_packed(experts, scheme, "experts", "register_grouped_weight")
        for e, w in enumerate(experts):
            if (w.n, w.k) != (experts[0].n, experts[0].k):
                raise Error(f"register_grouped_weight: experts[{e}] is [{w.n}, {w.k}], experts[0] "
                            f"[{experts[0].n}, {experts[0].k}] (rule: one shape)")
        self._entry = _GroupedEntry(experts, scheme)
        self.handle = _enter(self, _grouped_registry, self._entry)

    experts = property(lambda self: len(self._entry.experts))
    n = property(lambda self: self._entry.experts[0].n, doc="One expert's output features.")
    k = property(lambda self: self._entry.experts[0].k, doc="One expert's input features.")
    scheme = property(lambda self: self._entry.scheme)

    def __repr__(self):
        return (f"qgemm.ops.RegisteredGroupedWeight(handle={self.handle}, experts={self.experts}, "
                f"n={self.n}, k={self.k}, scheme='{self.scheme}')")


def register_grouped_weight(experts, scheme) -> RegisteredGroupedWeight:
    """Registers E packed weights of one shape [N, K] (quantized as `scheme`'s weight part; its
    activation part says how the rows are quantized) for torch.ops.qgemm.grouped_gemm."""
    return RegisteredGroupedWeight(experts, scheme)


def _grouped(handle: int) -> _GroupedEntry:
    entry = _grouped_registry.get(handle)
    if entry is None:
        raise Error(f"qgemm.grouped_gemm: weight handle {handle} is not registered "
                    "(register_grouped_weight makes one)")
    return entry


def _check_grouped(rows, weight, n, offsets, counts, bias, out_dtype) -> torch.dtype:
    if (offsets is None) == (counts is None):
        raise Error("qgemm.grouped_gemm: give offsets (rows [R, K] sorted by expert) or counts "
                    "(rows [E, C, K], a capacity per expert), one of them")
    if rows.dtype not in ACTIVATION_DTYPES:
        raise Error(f"qgemm.grouped_gemm: rows must be bfloat16 or float16 ({rows.dtype} given)")
    out_dtype = rows.dtype if out_dtype is None else out_dtype
    if out_dtype not in OUTPUT_DTYPES:
        raise Error(f"qgemm.grouped_gemm: out_dtype must be bfloat16, float16 or float32 "
                    f"({out_dtype} given)")
    grouping = offsets if offsets is not None else counts
    if grouping.dim() != 1 or grouping.dtype not in (torch.int32, torch.int64):
        raise Error(f"qgemm.grouped_gemm: {'offsets' if offsets is not None else 'counts'} must "
                    f"be a 1-D int32/int64 tensor ({grouping.dim()}-D {grouping.dtype} given)")
    if rows.dim() != (2 if offsets is not None else 3):
        raise Error(f"qgemm.grouped_gemm: rows must be "
                    f"{'[R, K] with offsets' if offsets is not None else '[E, C, K] with counts'}"
                    f" ({rows.dim()} dimensions given)")
    entry = _grouped_registry.get(weight) if isinstance(weight, int) else None
    if entry is not None:
        e_count, k = len(entry.experts), entry.experts[0].k
        if isinstance(n, int) and n != entry.experts[0].n:
            raise Error(f"qgemm.grouped_gemm: n = {n}, but weight {weight} has n = "
                        f"{entry.experts[0].n}")
        if isinstance(rows.shape[-1], int) and rows.shape[-1] != k:
            raise Error(f"qgemm.grouped_gemm: rows have {rows.shape[-1]} columns; the experts' K "
                        f"is {k}")
        wanted = e_count + 1 if offsets is not None else e_count
        if isinstance(grouping.shape[0], int) and grouping.shape[0] != wanted:
            raise Error(f"qgemm.grouped_gemm: {'offsets' if offsets is not None else 'counts'} "
                        f"has {grouping.shape[0]} values (rule: {wanted} for {e_count} experts)")
        if counts is not None and isinstance(rows.shape[0], int) and rows.shape[0] != e_count:
            raise Error(f"qgemm.grouped_gemm: rows are [{rows.shape[0]}, C, K] (rule: [E, C, K], "
                        f"E = {e_count})")
        if bias is not None and tuple(bias.shape) != (e_count, n):
            raise Error(f"qgemm.grouped_gemm: bias must be [{e_count}, {n}] "
                        f"({tuple(bias.shape)} given)")
    return out_dtype


@torch.library.custom_op("qgemm::grouped_gemm", mutates_args=())
def grouped_gemm(rows: torch.Tensor, weight: int, n: int, offsets: Optional[torch.Tensor] = None,
                 counts: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                 out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Each row times its expert's dequant(W_e)ᵀ (+ bias[e]): rows [R, K] with offsets, or
    [E, C, K] with counts; out rows' shape with N last, in out_dtype (default: rows')."""
    raise Error(f"qgemm.grouped_gemm: no implementation for {rows.device.type} tensors")


@grouped_gemm.register_fake
def _grouped_gemm_fake(rows, weight, n, offsets=None, counts=None, bias=None, out_dtype=None):
    out_dtype = _check_grouped(rows, weight, n, offsets, counts, bias, out_dtype)
    return rows.new_empty((*rows.shape[:-1], n), dtype=out_dtype)


@grouped_gemm.register_kernel("cuda")
def _grouped_gemm_cuda(rows, weight, n, offsets=None, counts=None, bias=None, out_dtype=None):
    out_dtype = _check_grouped(rows, weight, n, offsets, counts, bias, out_dtype)
    entry = _grouped(weight)
    out = torch.empty((*rows.shape[:-1], n), dtype=out_dtype, device=rows.device)
    rows2 = rows.reshape(-1, rows.shape[-1]).contiguous()
    if rows2.shape[0] == 0:
        return out
    device = _cuda_index(rows.device)
    stream = torch.cuda.current_stream(rows.device).cuda_stream
    engine(device).moe_gemm_grouped(rows2, entry.on_device(device), out.view(-1, n), stream,
                                    offsets=_as_int32(offsets), counts=_as_int32(counts),
                                    capacity=0 if counts is None else rows.shape[1],
                                    bias=_as_fp32(bias))
    return out


@grouped_gemm.register_kernel("cpu")
def _grouped_gemm_cpu(rows, weight, n, offsets=None, counts=None, bias=None, out_dtype=None):
    out_dtype = _check_grouped(rows, weight, n, offsets, counts, bias, out_dtype)
    entry = _grouped(weight)
    experts = len(entry.experts)
    r2 = rows.detach().reshape(-1, rows.shape[-1]).to(torch.float32).numpy()
    out = np.zeros((r2.shape[0], n), dtype=np.float32)
    # Each expert's rows [first, end), as the grouping's rule says; a broken one routes none.
    if offsets is not None:
        o = offsets.detach().to(torch.int64).numpy()
        spans = [(int(o[e]), int(o[e + 1])) for e in range(experts)]
        broken = bool(np.any(o[1:] < o[:-1]))
    else:
        c, capacity = counts.detach().to(torch.int64).numpy(), rows.shape[1]
        spans = [(e * capacity, e * capacity + int(c[e])) for e in range(experts)]
        broken = bool(np.any((c < 0) | (c > capacity)))
    scheme = _call_scheme(str(entry.scheme), ACTIVATION_DTYPES[rows.dtype],
                          OUTPUT_DTYPES[out_dtype])
    routed = np.zeros(r2.shape[0], dtype=bool)
    for first, end in spans:
        routed[max(first, 0):max(min(end, r2.shape[0]), 0)] = True
    if not broken and routed.any():
        # Quantized activations take their scales from every routed row together (a tensor
        # scale, as the CUDA path's), so each expert multiplies all of them and keeps its own.
        quantized = scheme.activation_quantized
        every = np.ascontiguousarray(r2[routed]) if quantized else None
        index = np.cumsum(routed) - 1  # a routed row's place among the routed rows
        for e, (first, end) in enumerate(spans):
            first, end = max(first, 0), min(end, r2.shape[0])
            if end <= first:
                continue
            b = None if bias is None else \
                np.ascontiguousarray(bias[e].detach().to(torch.float32).numpy())
            if quantized:
                c_all = reference_gemm(scheme, every, entry.experts[e], b)
                out[first:end] = c_all[index[first:end]]
            else:
                out[first:end] = reference_gemm(scheme, np.ascontiguousarray(r2[first:end]),
                                                entry.experts[e], b)
    # The reference rounded every value to out_dtype already: this conversion is exact.
    return torch.from_numpy(out).to(out_dtype).reshape(*rows.shape[:-1], n)
