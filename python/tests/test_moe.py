"""torch.ops.qgemm.moe and qgemm.nn.QuantMoE on the CPU (the reference implementation), against
a routed expert layer written here in float64 torch from the experts' exact dequantized values;
opcheck, the fake implementation, torch.compile (fullgraph), expert parallelism, bad input; and on
a GPU (skipped without one) the CUDA implementation against the CPU one, element by element."""

import numpy as np
import pytest

import qgemm

torch = pytest.importorskip("torch", reason="torch is not installed")
import qgemm.nn  # noqa: E402  (registers torch.ops.qgemm.moe)
from qgemm.nn import QuantMoE  # noqa: E402

BF16_ULP = 2.0**-8  # a bf16 value's spacing relative to it, at most


def glu(kind, gate, up, alpha=1.702, limit=7.0):
    if kind == "silu":
        return gate * torch.sigmoid(gate) * up
    if kind == "gelu":
        return 0.5 * gate * (1 + torch.erf(gate / 2**0.5)) * up
    gate = gate.clamp(max=limit)
    up = up.clamp(-limit, limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


class Layer:
    """E random experts quantized as `scheme`, with their exact values."""

    def __init__(self, rng, scheme, experts, hidden, inter, bias=False):
        self.scheme = qgemm.Scheme(scheme)
        draw = lambda n, k: (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)  # noqa
        self.gate_up = [qgemm.quantize_weight(self.scheme, draw(2 * inter, hidden))
                        for _ in range(experts)]
        self.down = [qgemm.quantize_weight(self.scheme, draw(hidden, inter))
                     for _ in range(experts)]
        self.gate_up_values = torch.from_numpy(
            np.stack([qgemm.dequantize_weight(w) for w in self.gate_up]))
        self.down_values = torch.from_numpy(np.stack([qgemm.dequantize_weight(w) for w in self.down]))
        self.gate_up_bias = torch.from_numpy(
            rng.standard_normal((experts, 2 * inter)).astype(np.float32)) if bias else None
        self.down_bias = torch.from_numpy(
            rng.standard_normal((experts, hidden)).astype(np.float32)) if bias else None
        self.registered = qgemm.ops.register_experts(self.gate_up, self.down, self.scheme)

    def expected(self, x, ids, weights, kind, alpha=1.702, limit=7.0):
        """The layer in float64, with the roundings the definition has (gate_up rows and the
        activation to bf16, the sum once); also each element's magnitude for the bounds."""
        bf16 = lambda t: t.to(torch.bfloat16).to(torch.float64)  # noqa: E731
        x = x.to(torch.float64)
        out = torch.zeros_like(x)
        magnitude = torch.zeros_like(x)
        inter = self.down_values.shape[2]
        for t in range(x.shape[0]):
            for j in range(ids.shape[1]):
                e, w = int(ids[t, j]), float(weights[t, j])
                g = self.gate_up_values[e] @ x[t]
                if self.gate_up_bias is not None:
                    g = g + self.gate_up_bias[e].to(torch.float64)
                g = bf16(g)
                h = bf16(glu(kind, g[:inter], g[inter:], alpha, limit))
                y = self.down_values[e] @ h
                if self.down_bias is not None:
                    y = y + self.down_bias[e].to(torch.float64)
                out[t] += w * y
                magnitude[t] += abs(w) * (self.down_values[e].abs() @ h.abs() + y.abs())
        return out, magnitude


def routing(rng, tokens, top_k, experts):
    ids = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)]).astype(np.int64)
    weights = rng.uniform(0.05, 1.0, (tokens, top_k)).astype(np.float32)
    return torch.from_numpy(ids), torch.from_numpy(weights)


def hidden_states(rng, tokens, hidden, dtype=torch.bfloat16):
    return torch.from_numpy(rng.standard_normal((tokens, hidden)).astype(np.float32)).to(dtype)


def assert_close(got, want, magnitude):
    # Intermediate roundings may land on the other side of a midpoint where the summation
    # order differs: one bf16 step of an activation value moves y by 2^-8 of its magnitude.
    bound = BF16_ULP * magnitude + BF16_ULP * want.abs() + 1e-6
    err = (got.to(torch.float64) - want).abs()
    assert bool((err <= bound).all()), f"{int((err > bound).sum())} elements outside"


@pytest.mark.parametrize("kind,bias", [("silu", False), ("gelu", True), ("clamped-swiglu", True)])
def test_cpu_op_matches_the_layer_written_out(rng, kind, bias):
    layer = Layer(rng, "w4a16", experts=6, hidden=64, inter=32, bias=bias)
    x = hidden_states(rng, 9, 64)
    ids, weights = routing(rng, 9, 3, 6)
    got = torch.ops.qgemm.moe(x, ids, weights, layer.registered.handle, kind, 1.702, 1.5,
                              layer.gate_up_bias, layer.down_bias)
    assert got.shape == x.shape and got.dtype == x.dtype
    want, magnitude = layer.expected(x, ids, weights, kind, limit=1.5)
    assert_close(got, want, magnitude)
    # The check can fail: the layer with every router weight 1 instead does not pass it.
    unweighted = torch.ops.qgemm.moe(x, ids, torch.ones_like(weights), layer.registered.handle,
                                     kind, 1.702, 1.5, layer.gate_up_bias, layer.down_bias)
    assert not bool(((unweighted.to(torch.float64) - want).abs() <=
                     BF16_ULP * magnitude + BF16_ULP * want.abs() + 1e-6).all())


def test_quant_moe_module_and_expert_parallelism(rng):
    torch.manual_seed(int(rng.integers(2**31)))
    gate_up = torch.randn(8, 48, 32) / 32**0.5
    down = torch.randn(8, 32, 24) / 24**0.5
    module = QuantMoE.from_float(gate_up, down, "w4a16")
    x = hidden_states(rng, 2 * 5, 32).reshape(2, 5, 32)
    ids, weights = routing(rng, 10, 2, 8)
    full = module(x, ids, weights)
    assert full.shape == x.shape
    # This rank holds the even experts (as local 0..3): its output is the full layer with the
    # odd experts' choices left out.
    gate_up, down = module.experts.packed
    local = QuantMoE(qgemm.ops.register_experts(gate_up[::2], down[::2], "w4a16"))
    expert_map = torch.tensor([0, -1, 1, -1, 2, -1, 3, -1], dtype=torch.int32)
    part = local(x, ids, weights, expert_map)
    kept = weights * (ids % 2 == 0)
    assert torch.equal(part, module(x, ids, kept))


def test_opcheck_fake_and_compile(rng):
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = Layer(rng, "w4a16", experts=4, hidden=32, inter=16)
    ids, weights = routing(rng, 5, 2, 4)
    x = hidden_states(rng, 5, 32)
    torch.library.opcheck(torch.ops.qgemm.moe.default,
                          (x, ids.to(torch.int32), weights, layer.registered.handle))
    with FakeTensorMode():
        fake = torch.ops.qgemm.moe(torch.empty((7, 32), dtype=torch.float16),
                                   torch.empty((7, 2), dtype=torch.int64),
                                   torch.empty((7, 2)), layer.registered.handle)
        assert fake.shape == (7, 32) and fake.dtype == torch.float16
    module = QuantMoE(layer.registered)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(module, fullgraph=True, backend=counter, dynamic=True)
    frames = None
    for tokens in (3, 11, 6):
        ids, weights = routing(rng, tokens, 2, 4)
        x = hidden_states(rng, tokens, 32)
        assert torch.equal(compiled(x, ids, weights), module(x, ids, weights))
        frames = counter.frame_count if frames is None else frames
    assert counter.frame_count == frames  # what the first call compiled serves every token count


def test_bad_input_names_the_rule(rng):
    layer = Layer(rng, "w4a16", experts=4, hidden=32, inter=16)
    x = hidden_states(rng, 3, 32)
    ids, weights = routing(rng, 3, 2, 4)
    handle = layer.registered.handle
    with pytest.raises(ValueError, match="activation 'relu'"):
        torch.ops.qgemm.moe(x, ids, weights, handle, "relu")
    with pytest.raises(ValueError, match="topk_ids"):
        torch.ops.qgemm.moe(x, ids[:2], weights[:2], handle)
    with pytest.raises(ValueError, match="H is 32"):
        torch.ops.qgemm.moe(hidden_states(rng, 3, 48), ids, weights, handle)
    with pytest.raises(ValueError, match="0 <= id < experts"):
        torch.ops.qgemm.moe(x, ids + 4, weights, handle)
    with pytest.raises(ValueError, match="not registered"):
        torch.ops.qgemm.moe(x, ids, weights, 10**9)
    with pytest.raises(ValueError, match=r"\[2I, H\]"):
        qgemm.ops.register_experts(layer.gate_up, layer.gate_up, "w4a16")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")
@pytest.mark.parametrize("scheme,kind,tokens", [("w4a16", "silu", 1), ("w4a16", "silu", 37),
                                                ("mxfp4-a16", "clamped-swiglu", 20),
                                                ("w4a8-fp8", "silu", 16),
                                                ("fp8-block", "gelu", 5)])
def test_cuda_op_matches_the_cpu_op(rng, scheme, kind, tokens):
    layer = Layer(rng, scheme, experts=16, hidden=256, inter=128, bias=kind != "silu")
    x = hidden_states(rng, tokens, 256)
    ids, weights = routing(rng, tokens, 4, 16)
    args = (layer.registered.handle, kind, 1.702, 7.0, layer.gate_up_bias, layer.down_bias)
    cpu = torch.ops.qgemm.moe(x, ids, weights, *args)
    cuda_args = args[:4] + tuple(None if b is None else b.cuda() for b in args[4:])
    gpu = torch.ops.qgemm.moe(x.cuda(), ids.cuda(), weights.cuda(), *cuda_args).cpu()
    _, magnitude = layer.expected(x, ids, weights, kind)
    # The GPU rounds each weight to bf16 for the tensor cores (2^-8 of it) and sums in fp32.
    bound = 4 * BF16_ULP * magnitude + BF16_ULP * cpu.abs().to(torch.float64) + 1e-6
    err = (gpu.to(torch.float64) - cpu.to(torch.float64)).abs()
    assert bool((err <= bound).all()), f"{int((err > bound).sum())} elements outside"
