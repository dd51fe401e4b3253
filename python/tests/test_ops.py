"""torch.ops.qgemm.gemm on the CPU (the reference implementation), its fake implementation, and
torch.compile over it; qgemm.nn.QuantLinear and qgemm.quantize_model. No GPU needed: the CUDA
variants are in test_ops_cuda.py.

Expected values come from numpy: the activations' exact values times qgemm.dequantize_weight in
float64, never from the operator's own path, with a per-element bound for the output's rounding.
"""

import copy
import io
import pickle

import numpy as np
import pytest

import qgemm

torch = pytest.importorskip("torch", reason="torch is not installed")
import qgemm.nn  # noqa: E402  (registers torch.ops.qgemm.gemm)
from qgemm.nn import QuantLinear  # noqa: E402

# Half an ulp of each output type, relative, and its smallest subnormal's half (absolute).
ROUNDING = {torch.bfloat16: (2.0**-8, 2.0**-134), torch.float16: (2.0**-11, 2.0**-25),
            torch.float32: (2.0**-24, 2.0**-150)}


def random_weight(rng, scheme, n, k):
    scheme = qgemm.Scheme(scheme)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    return scheme, qgemm.quantize_weight(scheme, w), w


def exact_product(a, packed, bias=None):
    """a (any torch float tensor) · dequant(W)ᵀ + bias in float64, over a's last dimension."""
    a64 = a.detach().to(torch.float64).numpy().reshape(-1, a.shape[-1])
    c = a64 @ qgemm.dequantize_weight(packed).T
    if bias is not None:
        c = c + bias.detach().to(torch.float64).numpy()
    return c.reshape(*a.shape[:-1], packed.n), np.abs(a64) @ np.abs(qgemm.dequantize_weight(packed)).T


def assert_within_rounding(got, exact, magnitude, dtype):
    """Each element within half an ulp of its type (plus the double sums' own error, far
    below it) of the exact product."""
    relative, absolute = ROUNDING[dtype]
    got = got.to(torch.float64).numpy()
    bound = np.abs(exact) * relative + absolute + 1e-12 * magnitude.reshape(exact.shape)
    assert got.shape == exact.shape
    assert np.all(np.isfinite(got))
    excess = np.abs(got - exact) - bound
    assert np.all(excess <= 0), f"worst excess {excess.max()} at {np.unravel_index(excess.argmax(), excess.shape)}"


def activations(rng, shape, dtype):
    # Away from zero (|x| ≥ 0.25): every input takes part in the product.
    x = rng.standard_normal(shape)
    x = np.where(np.abs(x) < 0.25, np.sign(x + 1e-9) * 0.25, x)
    return torch.from_numpy(x).to(dtype)


@pytest.mark.parametrize("scheme_text, a_dtype, out_dtype, batch, with_bias", [
    ("w4a16", torch.bfloat16, None, (3, 7), False),
    ("gptq-w4a16-g128", torch.float16, None, (5,), True),
    # fp16 activations with a scheme that names bf16: used as they are, not rounded to bf16.
    ("w=uint4:g64:s=fp32:zp=int;a=bf16", torch.float16, torch.float32, (2, 1, 4), True),
    ("mxfp4-a16", torch.bfloat16, torch.float32, (), False),
    ("w8a16", torch.bfloat16, torch.float16, (9,), True),
    ("nvfp4-a16", torch.bfloat16, torch.bfloat16, (4,), False),
])
def test_cpu_op_matches_the_exact_product(rng, scheme_text, a_dtype, out_dtype, batch, with_bias):
    n, k = int(rng.choice([48, 96])), int(rng.choice([128, 192, 320]))
    scheme, packed, _ = random_weight(rng, scheme_text, n, k)
    weight = qgemm.ops.register_weight(packed, scheme)
    a = activations(rng, (*batch, k), a_dtype)
    bias = torch.from_numpy(rng.standard_normal(n)).to(torch.bfloat16) if with_bias else None
    out = torch.ops.qgemm.gemm(a, weight.handle, n, bias, out_dtype)
    expected_dtype = out_dtype or a_dtype
    assert out.dtype == expected_dtype and out.shape == (*batch, n)
    exact, magnitude = exact_product(a, packed, bias)
    assert_within_rounding(out, exact, magnitude, expected_dtype)


@pytest.mark.parametrize("scheme_text", ["w4a8-fp8", "w8a8-int8", "nvfp4", "fp8-block"])
def test_cpu_op_quantizes_activations_as_the_scheme_says(rng, scheme_text):
    n, k = 64, 256
    scheme, packed, _ = random_weight(rng, scheme_text, n, k)
    weight = qgemm.ops.register_weight(packed, scheme)
    a = activations(rng, (2, 3, k), torch.bfloat16)
    out = torch.ops.qgemm.gemm(a, weight.handle, n, None, torch.float32)
    # The reference on the same activations with the output in fp32: the very same numbers.
    text = ";".join(p for p in str(scheme).split(";") if not p.startswith("o=")) + ";o=fp32"
    expected = qgemm.reference_gemm(qgemm.Scheme(text), a.float().reshape(6, k).numpy(), packed)
    np.testing.assert_array_equal(out.reshape(6, n).numpy(), expected.astype(np.float32))
    # And it is the product up to the activations' quantization (a few percent at 8 bits or
    # fewer), not something else.
    exact, _ = exact_product(a, packed)
    error = np.linalg.norm(out.numpy() - exact) / np.linalg.norm(exact)
    assert error < 0.15, error


def test_an_empty_batch_gives_an_empty_output(rng):
    scheme, packed, _ = random_weight(rng, "w4a16", 32, 128)
    weight = qgemm.ops.register_weight(packed, scheme)
    out = torch.ops.qgemm.gemm(torch.ones((0, 128), dtype=torch.bfloat16), weight.handle, 32)
    assert out.shape == (0, 32)


def test_opcheck_on_cpu(rng):
    scheme, packed, _ = random_weight(rng, "w4a16", 64, 256)
    weight = qgemm.ops.register_weight(packed, scheme)
    bias = torch.from_numpy(rng.standard_normal(64)).float()
    samples = [
        ((activations(rng, (5, 256), torch.bfloat16), weight.handle, 64), {}),
        ((activations(rng, (2, 3, 256), torch.float16), weight.handle, 64),
         {"bias": bias, "out_dtype": torch.float32}),
        ((activations(rng, (256,), torch.bfloat16), weight.handle, 64), {"bias": bias}),
    ]
    for args, kwargs in samples:
        torch.library.opcheck(torch.ops.qgemm.gemm.default, args, kwargs)


def test_the_fake_implementation_gives_shape_and_dtype_without_computing(rng):
    from torch._subclasses.fake_tensor import FakeTensorMode

    scheme, packed, _ = random_weight(rng, "w4a16", 96, 128)
    weight = qgemm.ops.register_weight(packed, scheme)
    with FakeTensorMode():
        a = torch.empty((4, 11, 128), dtype=torch.bfloat16)
        out = torch.ops.qgemm.gemm(a, weight.handle, 96, None, torch.float32)
        assert out.shape == (4, 11, 96) and out.dtype == torch.float32
        assert out.is_contiguous()
        # The rules hold at trace time too.
        with pytest.raises(ValueError, match="a has 64 columns"):
            torch.ops.qgemm.gemm(torch.empty((4, 64), dtype=torch.bfloat16), weight.handle, 96)


class TwoLayers(torch.nn.Module):
    def __init__(self, rng, scheme):
        super().__init__()
        self.up = QuantLinear.from_float(torch.nn.Linear(128, 192, bias=True), scheme)
        self.down = QuantLinear.from_float(torch.nn.Linear(192, 64, bias=False), scheme)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_fullgraph_matches_eager(rng, backend):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(int(rng.integers(2**31)))
    model = TwoLayers(rng, "w4a16")
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(model, fullgraph=True, backend=counter, dynamic=True)
    for rows in (3, 17, 5):
        x = activations(rng, (2, rows, 128), torch.bfloat16)
        got = compiled(x)
        assert torch.equal(got, model(x))  # the same CPU implementation underneath
    assert counter.frame_count == 1  # one graph serves every batch size (no recompilation)
    assert counter.op_count >= 2


def test_quant_linear_matches_float_linear_within_the_quantization_bound(rng):
    torch.manual_seed(int(rng.integers(2**31)))
    linear = torch.nn.Linear(320, 80)
    with torch.no_grad():
        linear.bias.copy_(torch.from_numpy(rng.standard_normal(80)))
    # fp32 scales: the quantization step of each weight is its group's scale, exactly.
    scheme = qgemm.Scheme("w=uint4:g64:s=fp32:zp=int;a=bf16")
    layer = QuantLinear.from_float(linear, scheme)
    x = activations(rng, (3, 4, 320), torch.float32)
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (3, 4, 80)

    x64 = x.to(torch.float64).reshape(-1, 320).numpy()
    w64 = linear.weight.detach().to(torch.float64).numpy()
    exact = x64 @ w64.T + linear.bias.detach().to(torch.float64).numpy()
    step = np.repeat(layer.qweight.packed.scales.view(np.float32).reshape(80, 5), 64, axis=1)
    # Round to nearest moves each weight by half a step at most, and x's rounding to bf16 moves
    # each input by 2^-9 of it at most (fp32 output rounding is negligible beside these): the
    # worst case, which a correct layer can never exceed ...
    error = np.abs(y.reshape(-1, 80).to(torch.float64).numpy() - exact)
    worst = np.abs(x64) @ (0.5 * step).T + 2.0**-9 * (np.abs(x64) @ np.abs(w64).T) + 1e-6
    assert np.all(error <= worst), np.max(error / worst)
    # ... but adds K errors of either sign: they are independent and uniform within those
    # limits, so their sum stays within 7 standard deviations (√(Σ x²·step²/12 + Σ x²w²·2^-18/3))
    # in all but ~1e-12 of cases, a bound tight enough that a wrong weight cannot pass it.
    sigma = np.sqrt((x64**2) @ (step**2 / 12).T + (x64**2) @ (w64**2).T * 2.0**-18 / 3)
    bound = 7 * sigma + 1e-6
    assert np.all(error <= bound), np.max(error / bound)
    other = QuantLinear.from_float(torch.nn.Linear(320, 80), scheme)
    with torch.no_grad():
        other.bias.copy_(linear.bias)
    wrong = np.abs(other(x).reshape(-1, 80).to(torch.float64).numpy() - exact)
    assert np.mean(wrong > bound) > 0.5


def test_quant_linear_keeps_the_input_dtype_and_bias(rng):
    linear = torch.nn.Linear(128, 48).to(torch.bfloat16)
    layer = QuantLinear.from_float(linear, "w4a16")
    assert layer.bias.dtype == torch.bfloat16 and torch.equal(layer.bias, linear.bias)
    assert not layer.bias.requires_grad
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert layer(activations(rng, (2, 128), dtype)).dtype == dtype
    assert "scheme='w=uint4:g128" in repr(layer)


def test_quant_linear_state_dict_deepcopy_and_pickle_round_trip(rng):
    torch.manual_seed(int(rng.integers(2**31)))
    layer = QuantLinear.from_float(torch.nn.Linear(256, 64), "w4a16-zp")
    x = activations(rng, (3, 256), torch.bfloat16)
    y = layer(x)
    buffer = io.BytesIO()
    torch.save(layer.state_dict(), buffer)
    buffer.seek(0)
    fresh = QuantLinear(256, 64, "w4a16-zp")
    with pytest.raises(ValueError, match="no weight"):
        fresh(x)
    fresh.load_state_dict(torch.load(buffer, weights_only=False))
    assert torch.equal(fresh(x), y)
    for copied in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert copied.qweight.handle != layer.qweight.handle
        assert torch.equal(copied(x), y)
    # A state of another scheme is refused.
    with pytest.raises(ValueError, match="scheme"):
        QuantLinear(256, 64, "w8a16").load_state_dict(layer.state_dict())


def test_act_order_checkpoint_layer_permutes_its_inputs(rng):
    """A layer imported with an input permutation (GPTQ act-order) computes x · Wᵀ in the
    checkpoint's own input order."""
    scheme, packed, _ = random_weight(rng, "gptq-w4a16-g128", 32, 256)
    permutation = rng.permutation(256)
    layer = QuantLinear.from_packed(packed, scheme, input_permutation=permutation)
    x = activations(rng, (4, 256), torch.float16)
    exact, magnitude = exact_product(x[:, torch.from_numpy(permutation)], packed)
    assert_within_rounding(layer(x), exact, magnitude, torch.float16)


def test_a_gptq_act_order_import_runs_as_a_quant_linear(rng):
    """Checkpoint import → QuantLinear: the module computes the imported layer (the importer's
    act-order permutation applied to x) as its CPU reference does."""
    from qgemm import checkpoint
    from test_checkpoint import gptq_tensors

    t, w = gptq_tensors(rng, 64, 384, 4, 128, v1=True, act_order=True)
    imported = checkpoint.import_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], bits=4,
                                      group_size=128)
    assert imported.input_permutation is not None
    layer = QuantLinear.from_packed(imported.weight, imported.scheme,
                                    input_permutation=imported.input_permutation)
    x = activations(rng, (5, 384), torch.float16)
    got = layer(x).to(torch.float64).numpy()
    # The checkpoint's own weights, in its own input order: x · Wᵀ.
    exact = x.to(torch.float64).numpy() @ w.T
    magnitude = np.abs(x.to(torch.float64).numpy()) @ np.abs(w).T
    assert_within_rounding(torch.from_numpy(got), exact, magnitude, torch.float16)
    np.testing.assert_array_equal(got, imported.reference(x.float().numpy()))
    # The permutation travels with the weight through a state_dict.
    fresh = QuantLinear(384, 64, imported.scheme, bias=False)
    fresh.load_state_dict(layer.state_dict())
    assert torch.equal(fresh(x), layer(x))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(64, 64)
        self.v_proj = torch.nn.Linear(64, 64)
        self.gate = torch.nn.Linear(64, 4)  # a router
        self.attention = torch.nn.MultiheadAttention(64, 4)  # out_proj: a Linear subclass


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 64)
        self.layers = torch.nn.ModuleList([Block(), Block()])
        self.shared = torch.nn.Linear(64, 64, bias=False)
        self.layers[0].tied = self.shared  # one Linear reached by two names
        self.lm_head = torch.nn.Linear(64, 10)


def test_quantize_model_replaces_the_right_linears():
    torch.manual_seed(0)
    model = Model()
    returned = qgemm.quantize_model(model, "w4a16", ignore=("lm_head", "re:.*\\.v_proj$",
                                                            "layers.*.gate"))
    assert returned is model
    kinds = {name: type(m).__name__ for name, m in model.named_modules(remove_duplicate=False)}
    for i in (0, 1):
        assert kinds[f"layers.{i}.q_proj"] == "QuantLinear"
        assert kinds[f"layers.{i}.v_proj"] == "Linear"
        assert kinds[f"layers.{i}.gate"] == "Linear"
        assert kinds[f"layers.{i}.attention.out_proj"] == "NonDynamicallyQuantizableLinear"
    assert kinds["lm_head"] == "Linear" and kinds["embed"] == "Embedding"
    assert model.shared is model.layers[0].tied and kinds["shared"] == "QuantLinear"
    # The default ignore list leaves lm_head alone; a single name works as the list.
    other = qgemm.quantize_model(Model(), "w4a16")
    assert type(other.lm_head) is torch.nn.Linear and type(other.layers[1].gate) is QuantLinear
    only = qgemm.quantize_model(Model(), "w4a16", ignore="q_proj")
    assert type(only.layers[0].q_proj) is torch.nn.Linear and type(only.lm_head) is QuantLinear


def test_quantize_model_lets_each_float_linear_go_once_replaced(monkeypatch):
    # A model's float weights and its quantized ones must not all be held at once (a 30B model
    # would not fit its GPU): when a layer is quantized, the Linears replaced before it are gone
    # (the shared one only after its second owner's turn).
    import gc
    import weakref

    torch.manual_seed(0)
    model = Model()
    replaced, alive_at_each_call = [], []
    real = QuantLinear.from_float.__func__

    def recording(cls, linear, scheme, **kwargs):
        gc.collect()
        alive_at_each_call.append(sum(r() is not None for r in replaced))
        replaced.append(weakref.ref(linear))
        return real(cls, linear, scheme, **kwargs)

    monkeypatch.setattr(QuantLinear, "from_float", classmethod(recording))
    qgemm.quantize_model(model, "w4a16")
    assert len(alive_at_each_call) > 4
    # At most the shared Linear (whose second owner comes later) outlives its replacement.
    assert max(alive_at_each_call) <= 1, alive_at_each_call
    assert type(model.shared) is QuantLinear and model.shared is model.layers[0].tied


def test_quantized_model_runs_close_to_the_float_one(rng):
    torch.manual_seed(int(rng.integers(2**31)))
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 128))
    x = activations(rng, (8, 256), torch.float32)
    reference = model(x).detach()
    qgemm.quantize_model(model, "w8a16")
    assert all(type(m) is not torch.nn.Linear for m in model)
    error = torch.linalg.norm(model(x) - reference) / torch.linalg.norm(reference)
    assert error < 0.02, error  # 8-bit weights, bf16 activations: well under a percent or two


def test_bad_input_raises_an_error_that_names_the_argument(rng):
    scheme, packed, _ = random_weight(rng, "w4a16", 32, 128)
    weight = qgemm.ops.register_weight(packed, scheme)
    a = activations(rng, (2, 128), torch.bfloat16)
    gemm = torch.ops.qgemm.gemm
    model_with_a_nan = Model()
    with torch.no_grad():
        model_with_a_nan.layers[1].v_proj.weight[3, 5] = float("nan")
    cases = [
        (lambda: gemm(a.float(), weight.handle, 32), "a must be bfloat16 or float16"),
        (lambda: gemm(a[:, :64], weight.handle, 32), "a has 64 columns"),
        (lambda: gemm(a, weight.handle, 16), "n = 16"),
        (lambda: gemm(a, 10**9, 32), "weight handle 1000000000 is not registered"),
        (lambda: gemm(a, weight.handle, 32, torch.ones(31)), "bias must be 1-D with n = 32"),
        (lambda: gemm(a, weight.handle, 32, torch.ones(32, dtype=torch.int32)),
         "bias must be floating point"),
        (lambda: gemm(a, weight.handle, 32, None, torch.int8), "out_dtype"),
        (lambda: qgemm.ops.register_weight(packed, "w8a16"), "weight part"),
        (lambda: qgemm.ops.register_weight(packed, scheme, max_rows=0), "max_rows"),
        (lambda: QuantLinear.from_float(torch.nn.Conv1d(2, 2, 1), "w4a16"),
         "linear must be a torch.nn.Linear"),
        (lambda: QuantLinear(128, 64, "w4a16").set_weight(packed), r"packed is \[32, 128\]"),
        (lambda: QuantLinear(128, 32, 4), "scheme must be"),
        (lambda: QuantLinear.from_packed(packed, scheme)(torch.ones(2, 64)),
         "last dimension is 64, in_features is 128"),
        (lambda: QuantLinear.from_packed(packed, scheme)(torch.ones(2, 128, dtype=torch.float64)),
         "x must be bfloat16, float16 or float32"),
        (lambda: qgemm.quantize_model(Model(), "w4a16", ignore=[1]), "ignore"),
        (lambda: qgemm.quantize_model(Model(), "w=uint4:g0"), "group"),
        (lambda: qgemm.quantize_model(model_with_a_nan, "w4a16"), "layers.1.v_proj"),
    ]
    for call, message in cases:
        with pytest.raises(qgemm.Error, match=message):
            call()


def test_a_released_weight_is_no_longer_reachable(rng):
    scheme, packed, _ = random_weight(rng, "w4a16", 32, 128)
    weight = qgemm.ops.register_weight(packed, scheme)
    handle = weight.handle
    a = activations(rng, (2, 128), torch.bfloat16)
    torch.ops.qgemm.gemm(a, handle, 32)
    del weight
    with pytest.raises(qgemm.Error, match="not registered"):
        torch.ops.qgemm.gemm(a, handle, 32)
