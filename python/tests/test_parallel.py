"""qgemm.parallel (issue #20) without GPUs: shards of a packed weight are exact slices of its
dequantization and join back bit for bit (every bit width, zero-point kind, scale format,
partial groups, blocks); a 2-process gloo group runs a column-parallel then a row-parallel layer
(a TP=2 MLP) and matches the 1-process layers on the CPU operator; and an expert-parallel MoE
layer (EP=2, tokens exchanged all-to-all) matches one QuantMoE holding every expert."""

import os

import numpy as np
import pytest

import qgemm

torch = pytest.importorskip("torch", reason="torch is not installed")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from qgemm import parallel  # noqa: E402

SCHEMES = ["w4a16", "w4a16-zp", "w3a16", "w8a16", "mxfp4-a16", "nvfp4-a16", "fp8-block",
           "w=uint6:g64:s=fp16:zp=float;a=bf16;o=bf16", "w8a8-fp8", "bitnet"]


@pytest.mark.parametrize("scheme_text", SCHEMES)
@pytest.mark.parametrize("axis", ["n", "k"])
def test_shards_are_exact_slices_and_join_back(rng, scheme_text, axis):
    scheme = qgemm.Scheme(scheme_text)
    n, k = (520, 2880) if axis == "k" else (1000, 384)
    w = qgemm.quantize_weight(scheme, rng.standard_normal((n, k)).astype(np.float32))
    full = qgemm.dequantize_weight(w)
    world = 4
    shards, covered = [], 0
    for rank in range(world):
        cell = w.scale_cell[0] if axis == "n" else w.scale_cell[1]
        b, e = parallel.shard_bounds(n if axis == "n" else k, cell, world, rank)
        assert b == covered  # contiguous, in rank order
        covered = e
        shard = parallel.shard_weight(w, scheme, axis, world, rank)
        expected = full[b:e] if axis == "n" else full[:, b:e]
        assert np.array_equal(qgemm.dequantize_weight(shard), expected)
        shards.append(shard)
    assert covered == (n if axis == "n" else k)
    joined = parallel.concat_shards(shards, scheme, axis)
    assert np.array_equal(joined.codes, w.codes)
    assert np.array_equal(joined.scales, w.scales)
    assert np.array_equal(joined.zeros, w.zeros)


def test_bounds_keep_whole_cells_and_refuse_too_many_ranks():
    # K = 2880 over 8 ranks in groups of 128: 23 cells (the last of 64), 3 each and 2 for the
    # last ranks, the partial cell at the end.
    bounds = [parallel.shard_bounds(2880, 128, 8, r) for r in range(8)]
    assert bounds[0] == (0, 384) and bounds[-1] == (2688, 2880)
    assert all(b % 128 == 0 for b, _ in bounds)
    with pytest.raises(ValueError, match="at least one whole cell per rank"):
        parallel.shard_bounds(256, 128, 4, 0)
    with pytest.raises(ValueError, match="0 <= rank < world"):
        parallel.shard_bounds(256, 16, 2, 2)


def _gloo_rank(rank, world, port, body, args, results):
    """One process of a gloo group: results[rank] = body(rank, world, *args)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results[rank] = body(rank, world, *args)
    finally:
        dist.destroy_process_group()


def _on_two_ranks_then_one(rng, body, *args):
    """body's results on a 2-process gloo group, then on a 1-process one: ({0: .., 1: ..},
    {0: ..})."""
    port = 29500 + int(rng.integers(2000))
    runs = []
    with mp.Manager() as manager:
        for world in (2, 1):
            results = manager.dict()
            mp.spawn(_gloo_rank, args=(world, port + world, body, args, results), nprocs=world,
                     join=True)
            runs.append(dict(results))
    return runs


def _mlp_rank(rank, world, scheme_text, seed):
    rng = np.random.default_rng(seed)
    scheme = qgemm.Scheme(scheme_text)
    up = qgemm.quantize_weight(scheme, (rng.standard_normal((640, 256)) / 16).astype(np.float32))
    down = qgemm.quantize_weight(scheme, (rng.standard_normal((256, 640)) / 25).astype(np.float32))
    up_bias = torch.from_numpy(rng.standard_normal(640).astype(np.float32))
    down_bias = torch.from_numpy(rng.standard_normal(256).astype(np.float32))
    x = torch.from_numpy(rng.standard_normal((5, 256)).astype(np.float32)).to(torch.bfloat16)
    # The up rows are cut where down's K groups are cut.
    col = parallel.ColumnParallelQuantLinear.from_packed(up, scheme, up_bias,
                                                         align=down.scale_cell[1])
    row = parallel.RowParallelQuantLinear.from_packed(down, scheme, down_bias)
    gathered = parallel.ColumnParallelQuantLinear.from_packed(up, scheme, up_bias,
                                                              gather_output=True)
    with torch.no_grad():
        y = row(torch.nn.functional.silu(col(x)))
        g = gathered(x)
    return y.float().numpy(), g.float().numpy()


@pytest.mark.parametrize("scheme_text", ["w4a16", "w4a16-zp", "mxfp4-a16"])
def test_tensor_parallel_mlp_on_two_gloo_ranks_matches_one(rng, scheme_text):
    two, one = _on_two_ranks_then_one(rng, _mlp_rank, scheme_text, int(rng.integers(2**31)))
    y1, g1 = one[0]
    for rank in (0, 1):
        y2, g2 = two[rank]
        # The column-parallel gather is the 1-rank layer bit for bit (each column is computed
        # by one rank, the same way).
        assert np.array_equal(g2, g1)
        # The row-parallel sum adds two fp32 partial sums instead of one: within a bf16 step.
        assert np.allclose(y2, y1, rtol=2**-7, atol=1e-3), np.abs(y2 - y1).max()
        assert np.array_equal(y2, two[0][0])  # every rank holds the same result


def _moe_rank(rank, world, scheme_text, seed):
    rng = np.random.default_rng(seed)
    scheme = qgemm.Scheme(scheme_text)
    experts, hidden, inter, top_k = 6, 128, 64, 3
    gate_up = [qgemm.quantize_weight(
        scheme, (rng.standard_normal((2 * inter, hidden)) / 11).astype(np.float32))
        for _ in range(experts)]
    down = [qgemm.quantize_weight(
        scheme, (rng.standard_normal((hidden, inter)) / 8).astype(np.float32))
        for _ in range(experts)]
    gate_up_bias = torch.from_numpy(rng.standard_normal((experts, 2 * inter)).astype(np.float32))
    down_bias = torch.from_numpy(rng.standard_normal((experts, hidden)).astype(np.float32))
    # Every rank's own tokens (different counts), distinct experts per token.
    all_tokens = 9
    x = torch.from_numpy(rng.standard_normal((all_tokens, hidden)).astype(np.float32))
    ids = torch.from_numpy(np.stack([rng.permutation(experts)[:top_k]
                                     for _ in range(all_tokens)]).astype(np.int32))
    weights = torch.from_numpy(rng.uniform(0.05, 1.0, (all_tokens, top_k)).astype(np.float32))
    mine = slice(0, 4) if world == 2 and rank == 0 else slice(4, 9) if world == 2 \
        else slice(0, 9)
    layer = parallel.ExpertParallelQuantMoE.from_packed(
        gate_up, down, scheme, gate_up_bias=gate_up_bias, down_bias=down_bias)
    with torch.no_grad():
        y = layer(x[mine].to(torch.bfloat16), ids[mine], weights[mine])
        plain = None
        if world == 1:  # every expert in one QuantMoE: the layer EP must reproduce
            every = qgemm.nn.QuantMoE(qgemm.ops.register_experts(gate_up, down, scheme),
                                      gate_up_bias=gate_up_bias, down_bias=down_bias)
            plain = every(x.to(torch.bfloat16), ids, weights).float().numpy()
    return y.float().numpy(), plain, layer.bounds


@pytest.mark.parametrize("scheme_text", ["w4a16", "mxfp4-a16"])
def test_expert_parallel_moe_on_two_gloo_ranks_matches_one(rng, scheme_text):
    """EP=2 (three experts a rank, 4 and 5 tokens) and EP=1 against one QuantMoE holding every
    expert: each token's choices went to both ranks and came back; one more bf16 rounding per
    choice."""
    two, one = _on_two_ranks_then_one(rng, _moe_rank, scheme_text, int(rng.integers(2**31)))
    assert [two[r][2] for r in (0, 1)] == [(0, 3), (3, 6)]
    plain = one[0][1]
    scale = np.abs(plain).max()
    for ep in (np.concatenate([two[0][0], two[1][0]]), one[0][0]):
        assert ep.shape == plain.shape
        assert np.allclose(ep, plain, rtol=2**-6, atol=2**-7 * scale), np.abs(ep - plain).max()
        # A choice sent to the wrong expert, or weighted wrongly, moves whole rows by O(|y|).
        assert np.abs(ep - plain).max() < 0.05 * scale


def test_multi_gpu_script_runs_on_two_gloo_ranks(tmp_path):
    """scripts/multi_gpu.py (torchrun) with tiny shapes on CPUs: both layers match the one-rank
    layers (it exits 1 otherwise) and every rank reports its throughputs."""
    import json
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "multi_gpu.json"
    port = 29500 + int(np.random.default_rng().integers(2000))
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(port), os.path.join(root, "scripts", "multi_gpu.py"), "--tiny",
         "--decode-batch", "8", "--prefill-batch", "1", "--prefill-len", "32", "--repeats", "2",
         "--json", str(out)],
        capture_output=True, text=True, timeout=600,
        # CPUs even where a GPU is (NCCL takes one GPU per rank; this machine may have one).
        env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    figures = json.loads(out.read_text())
    assert [f["rank"] for f in figures] == [0, 1]
    for f in figures:
        assert f["world"] == 2
        assert f["mlp_gap"] <= 2**-5 and f["moe_gap"] <= 2**-5
        assert all(f[f"{layer}_{phase}_tokens_per_s"] > 0
                   for layer in ("mlp", "moe") for phase in ("decode", "prefill"))
