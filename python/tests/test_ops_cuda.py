"""torch.ops.qgemm.gemm and QuantLinear on a GPU: against the CPU reference element by element,
opcheck, torch.compile (fullgraph) and CUDA graph capture and replay.

Needs torch with CUDA and a GPU: skipped, with the reason, elsewhere."""

import copy

import numpy as np
import pytest

import qgemm

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)
import qgemm.nn  # noqa: E402  (registers torch.ops.qgemm.gemm)
from qgemm.nn import QuantLinear  # noqa: E402


def element_bounds(a, packed, reference):
    """What each GPU output element may differ from the CPU reference by (test_engine.py's
    bound): the output's rounding (a bf16 ulp is 2^-7 of the value at most), and the weight's
    rounding to the 16-bit tensor-core operand (2^-8 of each weight at most in bf16) where a
    kernel dequantizes into one, a sum of K independent errors bounded at 7 of its standard
    deviations."""
    w = qgemm.dequantize_weight(packed).astype(np.float64)
    operand_rounding = 4 * 2.0**-8 * np.sqrt((a.astype(np.float64) ** 2) @ (w**2).T)
    return np.abs(reference) / 128 + operand_rounding + 1e-6


def activations(rng, shape, dtype):
    x = rng.standard_normal(shape)
    x = np.where(np.abs(x) < 0.25, np.sign(x + 1e-9) * 0.25, x)  # no zeros
    return torch.from_numpy(x).to("cuda", dtype)


def registered(rng, scheme_text, n, k):
    scheme = qgemm.Scheme(scheme_text)
    packed = qgemm.quantize_weight(scheme, (rng.standard_normal((n, k)) * 0.05).astype(np.float32))
    return packed, qgemm.ops.register_weight(packed, scheme)


def poisoned_pool(shape, dtype):
    """Leaves a NaN-filled block of this size in the caching allocator's pool, which the next
    allocation of the size on this stream takes (the operator's torch.empty output): elements a
    kernel failed to write then show as NaN rather than as a stale, plausible value."""
    block = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    del block


def cpu_expected(a, weight, bias, out_dtype):
    """The CPU implementation (the reference) on the same inputs, and each element's bound."""
    a_cpu = a.cpu()
    expected = torch.ops.qgemm.gemm(a_cpu, weight.handle, weight.n,
                                    None if bias is None else bias.cpu(), out_dtype)
    a2 = a_cpu.float().reshape(-1, a.shape[-1]).numpy()
    reference = expected.double().reshape(-1, weight.n).numpy()
    return expected, element_bounds(a2, weight.packed, reference).reshape(expected.shape)


@pytest.mark.parametrize("scheme_text, batch, a_dtype, out_dtype, with_bias", [
    ("w4a16", (1,), torch.bfloat16, None, False),
    ("w4a16", (2, 9), torch.bfloat16, None, True),
    ("gptq-w4a16-g128", (64,), torch.float16, None, True),
    ("mxfp4-a16", (4, 64), torch.bfloat16, torch.float32, False),
    ("w8a16", (300,), torch.bfloat16, torch.float16, True),
    ("w4a8-fp8", (32,), torch.bfloat16, None, False),
])
def test_cuda_op_matches_the_cpu_reference(rng, scheme_text, batch, a_dtype, out_dtype,
                                           with_bias):
    n, k = 640, 2880
    packed, weight = registered(rng, scheme_text, n, k)
    a = activations(rng, (*batch, k), a_dtype)
    bias = torch.from_numpy(rng.standard_normal(n)).to("cuda", torch.bfloat16) \
        if with_bias else None
    poisoned_pool((*batch, n), out_dtype or a_dtype)
    out = torch.ops.qgemm.gemm(a, weight.handle, n, bias, out_dtype)
    torch.cuda.synchronize()
    assert out.device == a.device and out.dtype == (out_dtype or a_dtype)
    expected, bound = cpu_expected(a, weight, bias, out_dtype)
    got = out.cpu().double().numpy()
    assert np.all(np.isfinite(got))
    if qgemm.Scheme(scheme_text).activation_quantized:
        # The GPU's activation quantization may round a code differently where a value sits on
        # a tie: compare as a whole, then element-wise with one activation step's slack.
        error = np.linalg.norm(got - expected.double().numpy()) / \
            np.linalg.norm(expected.double().numpy())
        assert error < 1e-2, error
    else:
        excess = np.abs(got - expected.double().numpy()) - bound
        assert np.all(excess <= 0), excess.max()


def test_cuda_op_on_a_strided_view_and_an_empty_batch(rng):
    packed, weight = registered(rng, "w4a16", 256, 512)
    wide = activations(rng, (8, 1024), torch.bfloat16)
    a = wide[:, :512]  # unit column stride, rows 1024 apart
    out = torch.ops.qgemm.gemm(a, weight.handle, 256)
    expected, bound = cpu_expected(a, weight, None, None)
    assert np.all(np.abs(out.cpu().double().numpy() - expected.double().numpy()) <= bound)
    empty = torch.ops.qgemm.gemm(wide[:0, :512], weight.handle, 256)
    assert empty.shape == (0, 256) and empty.is_cuda


def test_opcheck_on_cuda(rng):
    packed, weight = registered(rng, "w4a16", 256, 512)
    bias = torch.from_numpy(rng.standard_normal(256)).to("cuda", torch.float32)
    samples = [
        ((activations(rng, (7, 512), torch.bfloat16), weight.handle, 256), {}),
        ((activations(rng, (2, 3, 512), torch.bfloat16), weight.handle, 256),
         {"bias": bias, "out_dtype": torch.float32}),
    ]
    for args, kwargs in samples:
        torch.library.opcheck(torch.ops.qgemm.gemm.default, args, kwargs)


def test_cuda_errors_name_the_argument(rng):
    packed, weight = registered(rng, "w4a16", 64, 128)
    a = activations(rng, (4, 128), torch.bfloat16)
    with pytest.raises(qgemm.Error, match="bias is on cpu"):
        torch.ops.qgemm.gemm(a, weight.handle, 64, torch.ones(64))
    with pytest.raises(qgemm.Error, match="a must be bfloat16 or float16"):
        torch.ops.qgemm.gemm(a.float(), weight.handle, 64)


class Mlp(torch.nn.Module):
    def __init__(self, scheme):
        super().__init__()
        self.up = QuantLinear.from_float(torch.nn.Linear(512, 1024), scheme)
        self.down = QuantLinear.from_float(torch.nn.Linear(1024, 256, bias=False), scheme)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_on_cuda(rng, backend):
    if backend == "inductor":
        pytest.importorskip("triton", reason="inductor's GPU code needs triton")
    torch.manual_seed(int(rng.integers(2**31)))
    model = Mlp("w4a16").to("cuda", torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=backend, dynamic=True)
    for rows in (2, 16, 5):  # not 1: dynamic shapes specialize a size of 1 (a second graph)
        x = activations(rng, (2, rows, 512), torch.bfloat16)
        got, eager = compiled(x), model(x)
        # Inductor may fuse the gelu differently (a bf16 rounding of the hidden layer apart).
        torch.testing.assert_close(got, eager, rtol=2e-2, atol=2e-2)


def test_cuda_graph_capture_and_replay(rng):
    torch.manual_seed(int(rng.integers(2**31)))
    model = Mlp("w4a16").to("cuda", torch.bfloat16)
    static_x = activations(rng, (4, 512), torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        # Warm up on the capture stream: the first call on a shape uploads the weight, plans
        # and compiles, and sizes this stream's workspace, none of which a capture may do.
        for _ in range(2):
            model(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        static_y = model(static_x)
    previous = static_y.clone()
    for _ in range(3):
        fresh = activations(rng, (4, 512), torch.bfloat16)
        static_x.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        # The same kernels on the new input (a split-K reduction may add in another order).
        torch.testing.assert_close(static_y, model(fresh), rtol=1e-2, atol=1e-2)
        assert not torch.allclose(static_y, previous, rtol=1e-2, atol=1e-2)
        previous = static_y.clone()


def test_moe_captured_on_a_stream_it_was_not_warmed_up_on(rng):
    """torch.cuda.graph captures on a stream of its own: a layer warmed up on another stream
    meets a new stream inside the capture (as vLLM's warm-up and capture do; its GPU check found
    the engine allocating that stream's workspace there, which the global capture mode refuses).
    The capture succeeds and replays new hidden states and routings."""
    torch.manual_seed(int(rng.integers(2**31)))
    experts, hidden, inter = 8, 256, 96
    gate_up = torch.randn(experts, 2 * inter, hidden) / 16
    down = torch.randn(experts, hidden, inter) / 10
    module = qgemm.nn.QuantMoE.from_float(gate_up.cuda(), down.cuda(), "w4a16")
    x = torch.randn(16, hidden, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, experts, (16, 2), device="cuda")
    weights = torch.rand(16, 2, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # plans and compiles for this shape, on `side`
        for _ in range(2):
            module(x, ids, weights)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # torch's own capture stream
        y = module(x, ids, weights)
    previous = None
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        ids.copy_(torch.randint(0, experts, ids.shape, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        eager = module(x, ids, weights)
        assert torch.isfinite(eager).all() and eager.abs().max() > 0
        torch.testing.assert_close(y, eager, rtol=1e-2, atol=1e-2)
        if previous is not None:
            assert not torch.allclose(y, previous)
        previous = y.clone()


def test_warm_up_then_calls_at_warmed_counts_compile_nothing(rng):
    """qgemm.ops.warm_up / warm_up_moe, a deployment's start (the vLLM plugin's warm-up hook):
    afterwards, calls at the warmed token counts compile nothing and read nothing from the disk
    cache (qgemm.kernel_cache_counts), and give the CPU reference's results."""
    n, k = 384, 1536
    packed, weight = registered(rng, "gptq-w4a16-g128", n, k)
    bias = torch.from_numpy(rng.standard_normal(n)).to("cuda", torch.float32)
    qgemm.ops.warm_up(weight.handle, 512, torch.float16, bias=True)
    torch.manual_seed(int(rng.integers(2**31)))
    experts, hidden, inter, top_k, counts = 8, 256, 96, 2, (1, 16, 40)
    module = qgemm.nn.QuantMoE.from_float(torch.randn(experts, 2 * inter, hidden).cuda() / 16,
                                          torch.randn(experts, hidden, inter).cuda() / 10,
                                          "w4a16", "gelu")
    qgemm.ops.warm_up_moe(module.experts.handle, counts, top_k, torch.float16, "gelu")
    before = qgemm.kernel_cache_counts()
    for m in (1, 16, 77, 512):
        a = activations(rng, (m, k), torch.float16)
        poisoned_pool((m, n), torch.float16)
        out = torch.ops.qgemm.gemm(a, weight.handle, n, bias)
        torch.cuda.synchronize()
        expected, bound = cpu_expected(a, weight, bias, None)
        excess = np.abs(out.cpu().double().numpy() - expected.double().numpy()) - bound
        assert np.all(excess <= 0), (m, excess.max())
    for tokens in counts:
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.float16)
        ids = torch.randint(0, experts, (tokens, top_k), device="cuda")
        weights = torch.rand(tokens, top_k, device="cuda")
        y = module(x, ids, weights)
        torch.cuda.synchronize()
        reference = module(x.cpu(), ids.cpu(), weights.cpu())  # the CPU operator
        assert torch.isfinite(y).all() and reference.abs().max() > 0
        torch.testing.assert_close(y.cpu().float(), reference.float(), rtol=2e-2, atol=2e-2)
    assert qgemm.kernel_cache_counts() == before
    with pytest.raises(qgemm.Error, match="top_k = 0"):
        qgemm.ops.warm_up_moe(module.experts.handle, counts, 0, torch.float16, "gelu")
    with pytest.raises(qgemm.Error, match="token count of 0"):
        qgemm.ops.warm_up_moe(module.experts.handle, (0,), top_k, torch.float16, "gelu")


def test_compiled_with_cuda_graphs(rng):
    pytest.importorskip("triton", reason="inductor's GPU code needs triton")
    torch.manual_seed(int(rng.integers(2**31)))
    model = Mlp("w4a16").to("cuda", torch.bfloat16)
    compiled = torch.compile(model, fullgraph=True, mode="reduce-overhead")
    for _ in range(4):  # warm-up runs, the capture, then replays
        x = activations(rng, (8, 512), torch.bfloat16)
        got = compiled(x).clone()
        torch.testing.assert_close(got, model(x), rtol=2e-2, atol=2e-2)


def test_quant_linear_on_cuda_matches_the_cpu_layer(rng):
    torch.manual_seed(int(rng.integers(2**31)))
    layer = QuantLinear.from_float(torch.nn.Linear(2880, 640), "w4a16")
    x = activations(rng, (3, 5, 2880), torch.float32)
    expected = layer(x.cpu())
    layer.to("cuda")
    got = layer(x)
    assert got.dtype == torch.float32 and got.is_cuda
    a = x.to(torch.bfloat16).reshape(-1, 2880).cpu().float().numpy()
    bound = element_bounds(a, layer.qweight.packed, expected.reshape(-1, 640).double().numpy())
    error = np.abs(got.cpu().double().reshape(-1, 640).numpy() -
                   expected.reshape(-1, 640).double().numpy())
    assert np.all(error <= bound)


@pytest.mark.parametrize("scheme_text", ["w4a16", "awq-w4a16-g128", "nvfp4", "fp8-block", "bitnet"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_quantizer_gives_the_host_quantizers_packing(rng, scheme_text, dtype):
    scheme = qgemm.Scheme(scheme_text)
    w = torch.from_numpy(rng.standard_normal((384, 1024)) * 0.05).to("cuda", dtype)
    engine = qgemm.ops.engine(torch.cuda.current_device())
    gpu = engine.quantize_weight(w, scheme, torch.cuda.current_stream().cuda_stream)
    host = qgemm.quantize_weight(scheme, w.float().cpu().numpy())
    for part in ("codes", "scales", "zeros"):
        assert np.array_equal(getattr(gpu, part), getattr(host, part)), part
    assert gpu.global_scale == host.global_scale


def test_gpu_quantizer_names_a_non_finite_weight(rng):
    w = torch.from_numpy(rng.standard_normal((64, 256))).to("cuda", torch.bfloat16)
    w[3, 9] = float("inf")
    engine = qgemm.ops.engine(torch.cuda.current_device())
    with pytest.raises(qgemm.Error, match=r"weight\[3, 9\] = inf is not finite"):
        engine.quantize_weight(w, qgemm.Scheme("w4a16"))
    with pytest.raises(qgemm.Error, match="Engine.quantize_weight: weight must be 2-D"):
        engine.quantize_weight(w[0], qgemm.Scheme("w4a16"))


def test_device_preparation_names_bad_input(rng):
    w = torch.from_numpy(rng.standard_normal((4, 64, 256))).to("cuda", torch.bfloat16)
    engine = qgemm.ops.engine(torch.cuda.current_device())
    scheme = qgemm.Scheme("w4a16")
    with pytest.raises(qgemm.Error, match="experts must be 3-D"):
        engine.quantize_and_prepare_experts(w[0], scheme)
    with pytest.raises(qgemm.Error, match="experts must have unit column stride"):
        engine.quantize_and_prepare_experts(w.transpose(1, 2), scheme)
    with pytest.raises(qgemm.Error, match=r"layout = 'tiles' \(rule: auto, wgmma or mma\)"):
        engine.quantize_and_prepare_experts(w, scheme, "tiles")
    with pytest.raises(qgemm.Error, match=r"role = 'gate' \(rule: plain or gate_up\)"):
        engine.quantize_and_prepare_experts(w, scheme, "auto", "gate")
    w[2, 5, 7] = float("nan")
    with pytest.raises(qgemm.Error, match=r"expert 2: .*weight\[5, 7\] = nan is not finite"):
        engine.quantize_and_prepare_experts(w, scheme)
    with pytest.raises(qgemm.Error, match="quantize_and_register: weight must be a CUDA tensor"):
        qgemm.ops.quantize_and_register(w[0].cpu(), scheme)
    with pytest.raises(qgemm.Error, match="gate_up and down must be CUDA tensors on one device"):
        qgemm.ops.quantize_and_register_experts(w.cpu(), w, scheme)
    with pytest.raises(qgemm.Error, match="Engine.quantize_and_prepare_weight: weight must be 2-D"):
        engine.quantize_and_prepare_weight(w, scheme)


@pytest.mark.parametrize("scheme_text", ["w4a16", "nvfp4", "w4a8-fp8"])
def test_from_float_takes_the_gpu_quantizer_for_a_cuda_layer_and_gets_the_host_codes(rng,
                                                                                   scheme_text):
    """QuantLinear.from_float and QuantMoE.from_float of CUDA tensors quantize on the GPU and
    prepare there (Engine.quantize_and_prepare_weight / _experts): the same packed weight as of
    the same tensors on the CPU (the host quantizer), and the same outputs, bit for bit, as that
    packed weight prepared from the host."""
    torch.manual_seed(int(rng.integers(2**31)))
    linear = torch.nn.Linear(1024, 320).to(torch.bfloat16)
    on_cpu = QuantLinear.from_float(linear, scheme_text)
    on_gpu = QuantLinear.from_float(linear.to("cuda"), scheme_text)
    assert on_gpu.bias.is_cuda
    for part in ("codes", "scales", "zeros"):
        assert np.array_equal(getattr(on_gpu.qweight.packed, part),
                              getattr(on_cpu.qweight.packed, part)), part
    assert on_gpu.qweight.packed.global_scale == on_cpu.qweight.packed.global_scale
    x = torch.randn(37, 1024, device="cuda", dtype=torch.bfloat16)
    from_host = on_cpu.to("cuda")(x)  # prepared on the device from the host packing
    assert torch.isfinite(from_host).all()
    assert torch.equal(on_gpu(x), from_host)

    # 4 experts with an NVFP4 global scale each: the device path refolds them as the host's does.
    gate_up, down = torch.randn(4, 96, 256) / 16, torch.randn(4, 256, 48) / 7
    gate_up[1] *= 3  # a different global scale for expert 1
    host = qgemm.nn.QuantMoE.from_float(gate_up, down, scheme_text)
    gpu = qgemm.nn.QuantMoE.from_float(gate_up.cuda(), down.cuda(), scheme_text)
    for mine, theirs in zip(gpu.experts.packed[0] + gpu.experts.packed[1],
                            host.experts.packed[0] + host.experts.packed[1]):
        assert np.array_equal(mine.codes, theirs.codes)
        assert np.array_equal(mine.scales, theirs.scales)
        assert mine.global_scale == theirs.global_scale
    hidden = torch.randn(19, 256, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 4, (19, 2), device="cuda")
    weights = torch.rand(19, 2, device="cuda")
    from_host = host(hidden, ids, weights)  # the host packing, prepared on first use
    assert torch.isfinite(from_host).all() and from_host.abs().max() > 0
    assert torch.equal(gpu(hidden, ids, weights), from_host)
    gate_up_weight, down_weight = qgemm.ops.prepare(gpu.experts)  # the set prepared above
    assert (gate_up_weight.experts, down_weight.experts) == (4, 4)
    assert gate_up_weight.device_bytes > 0 and down_weight.device_bytes > 0
    # gate_up interleaved for the GLU fused into its GEMM (Engine.moe only), down plain.
    assert (gate_up_weight.role, down_weight.role) == ("gate_up", "plain")


@pytest.mark.parametrize("scheme_text", ["w4a16", "mxfp4-a16"])
def test_host_copy_false_serves_the_same_outputs_and_names_what_needs_the_host_form(rng,
                                                                                   scheme_text):
    """from_float(host_copy=False) prepares on the GPU with nothing downloaded: the same kernels
    on the same codes, so the outputs equal host_copy=True's bit for bit; what needs the host
    packed form (state_dict, the CPU path, a copy, the packed property) raises, naming the
    rule."""
    torch.manual_seed(int(rng.integers(2**31)))
    linear = torch.nn.Linear(512, 192).to(torch.bfloat16).cuda()
    kept = QuantLinear.from_float(linear, scheme_text)
    lean = QuantLinear.from_float(linear, scheme_text, host_copy=False)
    assert kept.qweight.has_host_copy and not lean.qweight.has_host_copy
    assert (lean.qweight.n, lean.qweight.k) == (192, 512)
    x = torch.randn(23, 512, device="cuda", dtype=torch.bfloat16)
    expected = kept(x)
    assert torch.isfinite(expected).all() and expected.abs().max() > 0
    assert torch.equal(lean(x), expected)
    rule = "host_copy=False, which keeps none"
    with pytest.raises(qgemm.Error, match=f"QuantLinear.state_dict needs .*{rule}"):
        lean.state_dict()
    with pytest.raises(qgemm.Error, match=f"qgemm.gemm on the CPU needs .*{rule}"):
        lean.cpu()(x.cpu())
    with pytest.raises(qgemm.Error, match=f"copying a RegisteredWeight .*{rule}"):
        copy.deepcopy(lean.qweight)
    with pytest.raises(qgemm.Error, match=rule):
        lean.qweight.packed

    gate_up, down = torch.randn(4, 96, 256) / 16, torch.randn(4, 256, 48) / 7
    kept_moe = qgemm.nn.QuantMoE.from_float(gate_up.cuda(), down.cuda(), scheme_text)
    lean_moe = qgemm.nn.QuantMoE.from_float(gate_up.cuda(), down.cuda(), scheme_text,
                                            host_copy=False)
    assert not lean_moe.experts.has_host_copy
    assert (lean_moe.experts.experts, lean_moe.experts.hidden,
            lean_moe.experts.intermediate) == (4, 256, 48)
    hidden = torch.randn(19, 256, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 4, (19, 2), device="cuda")
    weights = torch.rand(19, 2, device="cuda")
    expected = kept_moe(hidden, ids, weights)
    assert torch.isfinite(expected).all() and expected.abs().max() > 0
    assert torch.equal(lean_moe(hidden, ids, weights), expected)
    with pytest.raises(qgemm.Error, match=f"qgemm.moe on the CPU needs .*{rule}"):
        lean_moe(hidden.cpu(), ids.cpu(), weights.cpu())
    with pytest.raises(qgemm.Error, match=rule):
        lean_moe.experts.packed

    # quantize_model passes it on.
    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64)).to(torch.bfloat16).cuda()
    qgemm.nn.quantize_model(model, scheme_text, ignore=(), host_copy=False)
    assert all(isinstance(model[i], QuantLinear) and not model[i].qweight.has_host_copy
               for i in (0, 2))
    assert torch.isfinite(model(torch.randn(5, 256, device="cuda", dtype=torch.bfloat16))).all()
