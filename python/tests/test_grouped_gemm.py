"""torch.ops.qgemm.grouped_gemm: rows an engine grouped by expert (contiguous with offsets,
masked with counts) times their expert's weight. On the CPU against products written here in
float64 from the experts' exact dequantized values (rows of no expert and broken groupings
zero), biases, per-token quantized activations against the dense operator on each expert's
rows, opcheck and bad input; on a GPU (skipped without one) the CUDA implementation against the
CPU one, element by element."""

import numpy as np
import pytest

import qgemm

torch = pytest.importorskip("torch", reason="torch is not installed")
import qgemm.ops  # noqa: E402  (registers torch.ops.qgemm.grouped_gemm)

BF16_ULP = 2.0**-8


def experts_of(rng, scheme, experts, n, k):
    scheme = qgemm.Scheme(scheme)
    packed = [qgemm.quantize_weight(scheme, (rng.standard_normal((n, k)) / np.sqrt(k))
                                    .astype(np.float32)) for _ in range(experts)]
    values = torch.from_numpy(np.stack([qgemm.dequantize_weight(w) for w in packed]))
    return packed, values.to(torch.float64), qgemm.ops.register_grouped_weight(packed, scheme)


def rows_of(rng, shape):
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(torch.bfloat16)


def expected(rows2, values, spans, bias=None):
    """rows2 [R, K] bf16; spans[e] = (first, end) rows of expert e; float64 products."""
    out = torch.zeros(rows2.shape[0], values.shape[1], dtype=torch.float64)
    x = rows2.to(torch.float64)
    for e, (first, end) in enumerate(spans):
        if end > first:
            out[first:end] = x[first:end] @ values[e].T
            if bias is not None:
                out[first:end] += bias[e].to(torch.float64)
    return out


def assert_close_bf16(got, want):
    got = got.to(torch.float64)
    bound = want.abs() * BF16_ULP + 1e-30
    assert torch.all((got - want).abs() <= bound), float(((got - want).abs() / bound).max())


def test_cpu_contiguous_rows_match_their_experts(rng):
    packed, values, w = experts_of(rng, "w4a16", 4, 96, 256)
    rows = rows_of(rng, (20, 256))
    offsets = torch.tensor([1, 6, 6, 15, 18], dtype=torch.int32)  # row 0 and 18, 19: no expert
    got = torch.ops.qgemm.grouped_gemm(rows, w.handle, w.n, offsets=offsets)
    assert got.shape == (20, 96) and got.dtype == torch.bfloat16
    want = expected(rows, values, [(1, 6), (6, 6), (6, 15), (15, 18)])
    assert_close_bf16(got, want)
    assert torch.all(got[0] == 0) and torch.all(got[18:] == 0)
    assert torch.count_nonzero(got[1:18]) > 0.99 * 17 * 96  # the control: real products


def test_cpu_masked_rows_with_bias_and_fp32_output(rng):
    packed, values, w = experts_of(rng, "mxfp4-a16", 3, 64, 128)
    rows = rows_of(rng, (3, 5, 128))
    counts = torch.tensor([5, 0, 2], dtype=torch.int64)
    bias = torch.from_numpy(rng.standard_normal((3, 64)).astype(np.float32))
    got = torch.ops.qgemm.grouped_gemm(rows, w.handle, w.n, counts=counts, bias=bias,
                                       out_dtype=torch.float32)
    assert got.shape == (3, 5, 64) and got.dtype == torch.float32
    want = expected(rows.reshape(15, 128), values, [(0, 5), (5, 5), (10, 12)], bias)
    got2 = got.reshape(15, 64).to(torch.float64)
    assert torch.all((got2 - want).abs() <= want.abs() * 2.0**-22 + 1e-6)
    unrouted = [5, 6, 7, 8, 9, 12, 13, 14]
    assert torch.all(got2[unrouted] == 0)


def test_cpu_broken_groupings_route_nothing(rng):
    _, _, w = experts_of(rng, "w4a16", 3, 32, 128)
    rows = rows_of(rng, (10, 128))
    falling = torch.tensor([0, 6, 4, 10], dtype=torch.int32)
    assert torch.all(torch.ops.qgemm.grouped_gemm(rows, w.handle, w.n, offsets=falling) == 0)
    over = torch.tensor([1, 5, 0], dtype=torch.int32)  # capacity 4
    rows3 = rows_of(rng, (3, 4, 128))
    assert torch.all(torch.ops.qgemm.grouped_gemm(rows3, w.handle, w.n, counts=over) == 0)


def test_cpu_per_token_quantized_rows_equal_the_dense_operator(rng):
    # w4a8-fp8 quantizes each row on its own: each expert's rows through the dense operator.
    packed, _, w = experts_of(rng, "w4a8-fp8", 3, 64, 256)
    rows = rows_of(rng, (12, 256))
    offsets = torch.tensor([0, 4, 9, 12], dtype=torch.int32)
    got = torch.ops.qgemm.grouped_gemm(rows, w.handle, w.n, offsets=offsets)
    for e, (first, end) in enumerate([(0, 4), (4, 9), (9, 12)]):
        dense = qgemm.ops.register_weight(packed[e], "w4a8-fp8")
        want = torch.ops.qgemm.gemm(rows[first:end], dense.handle, dense.n)
        assert torch.equal(got[first:end], want)


def test_opcheck_and_bad_input(rng):
    _, _, w = experts_of(rng, "w4a16", 2, 32, 128)
    rows = rows_of(rng, (6, 128))
    offsets = torch.tensor([0, 2, 6], dtype=torch.int32)
    torch.library.opcheck(torch.ops.qgemm.grouped_gemm.default, (rows, w.handle, w.n),
                          {"offsets": offsets})
    with pytest.raises(qgemm.Error, match="one of them"):
        torch.ops.qgemm.grouped_gemm(rows, w.handle, w.n)
    with pytest.raises(qgemm.Error, match="offsets has 2 values"):
        torch.ops.qgemm.grouped_gemm(rows, w.handle, w.n, offsets=offsets[:2])
    with pytest.raises(qgemm.Error, match=r"\[E, C, K\]"):
        torch.ops.qgemm.grouped_gemm(rows, w.handle, w.n, counts=offsets[:2])
    with pytest.raises(qgemm.Error, match="experts' K"):
        torch.ops.qgemm.grouped_gemm(rows[:, :64], w.handle, w.n, offsets=offsets)
    with pytest.raises(qgemm.Error, match="one shape"):
        qgemm.ops.register_grouped_weight(
            [qgemm.quantize_weight(qgemm.Scheme("w4a16"), np.ones((32, 128), np.float32)),
             qgemm.quantize_weight(qgemm.Scheme("w4a16"), np.ones((64, 128), np.float32))],
            "w4a16")


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")


@cuda
@pytest.mark.parametrize("scheme, grouping", [
    ("w4a16", "contiguous"), ("w4a16", "masked"), ("mxfp4-a16", "contiguous"),
    ("w4a8-fp8", "contiguous"), ("nvfp4", "masked"),
])
def test_cuda_op_matches_the_cpu_op(rng, scheme, grouping):
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the grouped GEMM runs on sm_90a")
    packed, values, w = experts_of(rng, scheme, 5, 192, 512)
    if grouping == "contiguous":
        rows = rows_of(rng, (70, 512))
        grouping_args = {"offsets": torch.tensor([2, 20, 20, 41, 42, 66], dtype=torch.int32)}
        routed = torch.zeros(70, dtype=torch.bool)
        routed[2:66] = True
    else:
        rows = rows_of(rng, (5, 16, 512))
        counts = [12, 0, 3, 9, 1]
        grouping_args = {"counts": torch.tensor(counts, dtype=torch.int32)}
        routed = torch.arange(16).expand(5, 16) < torch.tensor(counts)[:, None]
        rows[~routed] = 30000.0  # rows past the counts: never seen by a tensor scale
        routed = routed.reshape(-1)
    want = torch.ops.qgemm.grouped_gemm(rows, w.handle, w.n, **grouping_args)
    got = torch.ops.qgemm.grouped_gemm(rows.cuda(), w.handle, w.n,
                                       **{k: v.cuda() for k, v in grouping_args.items()})
    torch.cuda.synchronize()
    got = got.cpu().to(torch.float64).reshape(-1, 192)
    want = want.to(torch.float64).reshape(-1, 192)
    assert torch.all(got[~routed] == 0) and torch.all(want[~routed] == 0)
    got, want = got[routed], want[routed]
    # The CPU reference rounds once; the GPU adds the 16-bit operand's rounding and a different
    # summation order: 2 bf16 ulps of the value plus 2^-8 of the row's magnitude.
    magnitude = rows.reshape(-1, 512)[routed].to(torch.float64).abs() @ values.abs().amax(0).T
    bound = want.abs() * 2 * BF16_ULP + magnitude * 2.0**-8 + 1e-6
    assert torch.all((got - want).abs() <= bound), float(((got - want).abs() / bound).max())
    assert torch.count_nonzero(want) > 0.9 * want.numel()  # the control: real products


@cuda
def test_cuda_engine_leaves_rows_of_no_expert_when_asked(rng):
    """Engine.moe_gemm_grouped(..., zero_rows_of_no_expert=False) on a masked layout, read in
    place (the default): the routed rows equal the op's (which zeroes the
    rest), the unused capacity keeps the NaN it held."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the grouped GEMM runs on sm_90a")
    _, _, w = experts_of(rng, "w4a16", 4, 128, 256)
    rows = rows_of(rng, (4, 24, 256)).cuda()
    counts = torch.tensor([24, 0, 7, 13], dtype=torch.int32, device="cuda")
    want = torch.ops.qgemm.grouped_gemm(rows, w.handle, w.n, counts=counts)
    out = torch.full((4 * 24, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    device = torch.cuda.current_device()
    qgemm.ops.engine(device).moe_gemm_grouped(
        rows.reshape(-1, 256), qgemm.ops._grouped(w.handle).on_device(device), out,
        torch.cuda.current_stream().cuda_stream, counts=counts, capacity=24,
        zero_rows_of_no_expert=False)
    torch.cuda.synchronize()
    routed = (torch.arange(24, device="cuda").expand(4, 24) < counts[:, None]).reshape(-1)
    assert torch.equal(out[routed], want.reshape(-1, 128)[routed])
    assert torch.all(torch.isnan(out[~routed]))
    assert torch.all(want.reshape(-1, 128)[~routed] == 0)
