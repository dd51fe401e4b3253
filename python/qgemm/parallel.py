"""qgemm.parallel: tensor and expert parallelism over torch.distributed (issue #20).

    w = qgemm.quantize_weight(scheme, full)                    # or a checkpoint import
    up = ColumnParallelQuantLinear.from_packed(w, scheme)      # this rank's rows of W
    down = RowParallelQuantLinear.from_packed(w2, scheme)      # this rank's columns of W2
    y = down(silu(up(x)))                                      # the row-parallel layer all-reduces

Shards are cut from the canonical packed weight exactly: codes are unpacked, sliced and packed
again (any bit width), the scale grid and zero points are sliced with them, and the cut falls on
the scale grid's cells, so that every shard is a canonical weight whose dequantization is the
same slice of the full weight's (`shard_weight`; `concat_shards` puts them back, and the tests
check the round trip bit for bit). How a dimension is split (`shard_bounds`): into `world`
parts of whole scale cells, as even as the cells allow, the last part taking what remains (a
partial last cell stays partial: K = 2880 over 8 ranks of g128 gives 384, ..., 192).

Column parallel: rank r holds W rows [n0, n1) and computes y[:, n0:n1] (the bias slice too);
`gather_output=True` all-gathers the full y. Row parallel: rank r holds W columns [k0, k1),
takes x[:, k0:k1] (or an input already split), and all-reduces the partial products (fp32, then
the output type); the bias is added once, after the reduction. Both run through
torch.ops.qgemm.gemm on whatever device the tensors are (the CPU reference, or a GPU), and
through torch.distributed's current process group (NCCL between GPUs, gloo on CPUs).

Expert parallel (`ExpertParallelQuantMoE`): rank r holds experts [e0, e1) of E (whole experts,
as even as they go) and its own tokens; each (token, choice) row travels to the rank holding its
expert and its result back (all-to-all), and every token sums its choices where it lives:

    rank 0 tokens ──┐ sort slots by owner   ┌─► rank 0 experts ─┐ results back  ┌─► Σ_j w_j·y_j
    rank 1 tokens ──┘ all_to_all (rows, ids) └─► rank 1 experts ─┘ all_to_all    └─► (fp32, choice order)
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from ._core import Error, PackedWeight, Scheme
from . import ops
from .nn import QuantLinear, QuantMoE, _scheme

__all__ = ["shard_bounds", "shard_weight", "concat_shards", "ColumnParallelQuantLinear",
           "RowParallelQuantLinear", "ExpertParallelQuantMoE"]


def shard_bounds(size: int, cell: int, world: int, rank: int) -> tuple[int, int]:
    """[begin, end) of part `rank` of `world` along a dimension of `size` whose scale cells are
    `cell` long: whole cells per part, as even as they allow, the last part taking the rest. A
    dimension that is one cell (per-tensor scales, per-channel ones along K) splits anywhere, in
    runs of 64 where it is long enough (every part then keeps that one scale)."""
    if world < 1 or not 0 <= rank < world:
        raise Error(f"shard_bounds: rank {rank} of world {world} (rule: 0 <= rank < world)")
    if cell >= size:
        cell = 64 if size >= 64 * world else 1
    cells = -(-size // cell)
    if cells < world:
        raise Error(f"shard_bounds: {size} values in {cells} scale cells of {cell} cannot be "
                    f"split over {world} ranks (rule: at least one whole cell per rank)")
    per = cells // world
    extra = cells % world
    first = rank * per + min(rank, extra)
    count = per + (1 if rank < extra else 0)
    return first * cell, min(size, (first + count) * cell)


def _unpack(packed_rows: np.ndarray, count: int, bits: int) -> np.ndarray:
    """[rows, bytes] LSB-first codes -> [rows, count] integers."""
    bit_rows = np.unpackbits(packed_rows, axis=1, bitorder="little")[:, :count * bits]
    weights = (1 << np.arange(bits, dtype=np.uint32))
    return (bit_rows.reshape(len(packed_rows), count, bits).astype(np.uint32) * weights).sum(-1)


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """[rows, count] integers -> [rows, ceil(count · bits / 8)] LSB-first bytes (pad bits 0)."""
    rows, count = codes.shape
    bit_rows = ((codes[..., None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8)
    bit_rows = bit_rows.reshape(rows, count * bits)
    return np.packbits(bit_rows, axis=1, bitorder="little")


def _parts(w: PackedWeight, scheme: Scheme):
    """The canonical parts as arrays: codes [n, k] integers, scale codes [grid rows, grid cols,
    bytes], zero points (integers [grid rows, grid cols], or like the scales, or None)."""
    rows, cols = w.scale_grid
    codes = _unpack(w.codes.reshape(w.n, -1), w.k, w.bits)
    scale_bytes = w.scales.size // (rows * cols)
    scales = w.scales.reshape(rows, cols, scale_bytes)
    zeros = None
    if w.zeros.size:
        if scheme.zero_point == "int":
            zeros = _unpack(w.zeros.reshape(rows, -1), cols, w.bits)
        else:
            zeros = w.zeros.reshape(rows, cols, -1)
    return codes, scales, zeros


def _build(scheme: Scheme, n, k, codes, scales, zeros, bits, global_scale) -> PackedWeight:
    z = None
    if zeros is not None:
        z = _pack(zeros, bits).reshape(-1) if zeros.ndim == 2 else zeros.reshape(-1)
    return PackedWeight.from_parts(scheme, n, k, _pack(codes, bits).reshape(-1),
                                   np.ascontiguousarray(scales.reshape(-1)),
                                   None if z is None else np.ascontiguousarray(z), global_scale)


def shard_weight(w: PackedWeight, scheme, axis: str, world: int, rank: int,
                 align: int = 1) -> PackedWeight:
    """Part `rank` of `world` of W [n, k] along axis "n" (rows: column parallel) or "k"
    (columns: row parallel), cut on whole scale cells (shard_bounds), exactly. `align` (along
    n): cut on multiples of it too, e.g. the K cells of the row-parallel layer that reads this
    one's output (a cut inside one of its groups would leave that group's scale in two parts,
    which no canonical shard can hold)."""
    scheme = _scheme(scheme, "shard_weight")
    if axis not in ("n", "k"):
        raise Error(f"shard_weight: axis '{axis}' (rule: 'n' or 'k')")
    codes, scales, zeros = _parts(w, scheme)
    rows_per, cols_per = w.scale_cell
    if axis == "n":
        b, e = shard_bounds(w.n, _row_cell(w, align), world, rank)
        cb, ce = b // rows_per, -(-e // rows_per)  # one cell along n: (0, 1) for every part
        return _build(scheme, e - b, w.k, codes[b:e], scales[cb:ce],
                      None if zeros is None else zeros[cb:ce], w.bits, w.global_scale)
    b, e = shard_bounds(w.k, cols_per, world, rank)
    cb, ce = b // cols_per, -(-e // cols_per)
    return _build(scheme, w.n, e - b, codes[:, b:e], scales[:, cb:ce],
                  None if zeros is None else zeros[:, cb:ce], w.bits, w.global_scale)


def _row_cell(w: PackedWeight, align: int) -> int:
    """The unit rows are cut in: the scale cells' rows, and multiples of `align` too (a single
    cell along n — per-tensor scales — cuts anywhere, so only `align` matters then)."""
    rows_per = w.scale_cell[0]
    if align <= 1:
        return rows_per
    return rows_per * align // int(np.gcd(rows_per, align)) if rows_per < w.n else align


def concat_shards(shards, scheme, axis: str) -> PackedWeight:
    """The inverse of shard_weight: the parts of every rank, in rank order, joined."""
    scheme = _scheme(scheme, "concat_shards")
    parts = [_parts(s, scheme) for s in shards]
    join = 0 if axis == "n" else 1
    codes = np.concatenate([p[0] for p in parts], axis=join)
    # A dimension that is one scale cell (per tensor; per channel along K) kept that one cell in
    # every part: the whole has it once.
    single = scheme.granularity == "tensor" or (scheme.granularity == "channel" and axis == "k")
    scales = parts[0][1] if single else np.concatenate([p[1] for p in parts], axis=join)
    zeros = parts[0][2]
    if zeros is not None and not single:
        zeros = np.concatenate([p[2] for p in parts], axis=join)
    n, k = codes.shape
    return _build(scheme, n, k, codes, scales, zeros, shards[0].bits, shards[0].global_scale)


def _group():
    if not dist.is_available() or not dist.is_initialized():
        raise Error("qgemm.parallel: torch.distributed is not initialized (init_process_group "
                    "first; world size 1 works too)")
    return dist.get_world_size(), dist.get_rank()


def _through_host(*tensors: torch.Tensor) -> bool:
    """gloo moves CPU tensors only: where the group is gloo and the tensors live on a GPU (ranks
    sharing one GPU, which NCCL refuses), a collective runs on host copies."""
    return dist.get_backend() == "gloo" and any(t.is_cuda for t in tensors)


def _all_reduce(tensor: torch.Tensor) -> None:
    if _through_host(tensor):
        host = tensor.cpu()
        dist.all_reduce(host)
        tensor.copy_(host)
    else:
        dist.all_reduce(tensor)


def _all_gather(parts: list[torch.Tensor], tensor: torch.Tensor) -> None:
    if _through_host(tensor):
        host = [p.cpu() for p in parts]
        dist.all_gather(host, tensor.cpu())
        for part, h in zip(parts, host):
            part.copy_(h)
    else:
        dist.all_gather(parts, tensor)


def _all_to_all_single(out: torch.Tensor, tensor: torch.Tensor, out_splits=None,
                       in_splits=None) -> None:
    if _through_host(out, tensor):
        host = out.cpu()
        dist.all_to_all_single(host, tensor.cpu(), out_splits, in_splits)
        out.copy_(host)
    else:
        dist.all_to_all_single(out, tensor, out_splits, in_splits)


class ColumnParallelQuantLinear(torch.nn.Module):
    """y[:, this rank's rows] = x · W[rows]ᵀ (+ bias[rows]); gather_output: the whole y."""

    def __init__(self, local: QuantLinear, out_features: int, bounds: tuple[int, int],
                 gather_output: bool = False, cell: int = 1):
        super().__init__()
        self.local = local
        self.out_features = out_features
        self.bounds = bounds
        self.gather_output = gather_output
        self.cell = cell  # the unit the rows were cut in (shard_bounds)

    @classmethod
    def from_packed(cls, w: PackedWeight, scheme, bias: Optional[torch.Tensor] = None, *,
                    gather_output: bool = False, align: int = 1, max_rows: int = 65536):
        """`align`: cut the rows on multiples of it (the K scale cells of the row-parallel layer
        fed by this one's output; shard_weight)."""
        world, rank = _group()
        cell = _row_cell(w, align)
        bounds = shard_bounds(w.n, cell, world, rank)
        shard = shard_weight(w, scheme, "n", world, rank, align)
        local_bias = None if bias is None else bias[bounds[0]:bounds[1]]
        local = QuantLinear.from_packed(shard, scheme, local_bias, max_rows=max_rows)
        return cls(local, w.n, bounds, gather_output, cell)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.local(x)
        if not self.gather_output:
            return y
        world, _ = _group()
        # Ranks hold uneven parts where the cells do not split evenly: pad to the largest.
        sizes = [shard_bounds(self.out_features, self.cell, world, r) for r in range(world)]
        widest = max(e - b for b, e in sizes)
        padded = torch.nn.functional.pad(y, (0, widest - y.shape[-1]))
        parts = [torch.empty_like(padded) for _ in range(world)]
        _all_gather(parts, padded.contiguous())
        return torch.cat([p[..., :e - b] for p, (b, e) in zip(parts, sizes)], dim=-1)


class RowParallelQuantLinear(torch.nn.Module):
    """y = Σ_ranks x[:, this rank's columns] · W[:, columns]ᵀ (all-reduced) + bias."""

    def __init__(self, local: QuantLinear, in_features: int, bounds: tuple[int, int],
                 bias: Optional[torch.Tensor], input_is_split: bool):
        super().__init__()
        self.local = local
        self.in_features = in_features
        self.bounds = bounds
        self.input_is_split = input_is_split
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @classmethod
    def from_packed(cls, w: PackedWeight, scheme, bias: Optional[torch.Tensor] = None, *,
                    input_is_split: bool = True, max_rows: int = 65536):
        world, rank = _group()
        _, cols_per = w.scale_cell
        bounds = shard_bounds(w.k, cols_per, world, rank)
        shard = shard_weight(w, scheme, "k", world, rank)
        local = QuantLinear.from_packed(shard, scheme, None, max_rows=max_rows)
        return cls(local, w.k, bounds, bias, input_is_split)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_split:
            x = x[..., self.bounds[0]:self.bounds[1]]
        # The partial products summed across ranks in fp32, then rounded once, as one GEMM's
        # accumulation would be; the bias once, after the sum.
        partial = torch.ops.qgemm.gemm(x.contiguous(), self.local.qweight.handle,
                                       self.local.out_features, None, torch.float32)
        _all_reduce(partial)
        if self.bias is not None:
            partial = partial + self.bias.to(torch.float32)
        return partial.to(x.dtype)


def _exchange(tensor: torch.Tensor, send: list[int], receive: list[int]) -> torch.Tensor:
    """all_to_all_single of `tensor`'s rows: send[r] of them to rank r (in rank order), receive[r]
    from rank r. Rows travel as bytes (gloo moves neither bf16 nor int16)."""
    data = tensor.contiguous()
    rows = data.reshape(data.shape[0], -1).view(torch.uint8)
    out = rows.new_empty((sum(receive), rows.shape[1]))
    _all_to_all_single(out, rows, receive, send)
    return out.view(tensor.dtype).reshape((sum(receive),) + tuple(tensor.shape[1:]))


class ExpertParallelQuantMoE(torch.nn.Module):
    """A routed expert layer split over the ranks by experts: this rank's experts [first, last)
    are a QuantMoE of its own, its tokens are its own (a data-parallel attention before it).

        y[t] = Σ_j topk_weights[t, j] · expert_{topk_ids[t, j]}(x[t])   (global expert ids)

    forward sends every (token, choice) row to the rank holding its expert, with its local id
    (all_to_all_single: the counts, then the rows), runs the local experts on what it received
    (one choice per row, weight 1), sends the results back the same way, and sums each token's
    choices in fp32 in choice order, rounded once to the hidden states' type. Against one rank
    holding every expert, each choice's result is rounded to that type once more before the sum.
    """

    def __init__(self, local: QuantMoE, experts: int, bounds: tuple[int, int]):
        super().__init__()
        self.local = local
        self.experts = experts
        self.bounds = bounds

    @classmethod
    def from_packed(cls, gate_up, down, scheme, activation: str = "silu", *,
                    gate_up_bias: Optional[torch.Tensor] = None,
                    down_bias: Optional[torch.Tensor] = None, **kwargs):
        """gate_up / down: every rank's list of the E experts' PackedWeights ([2I, H], [H, I]);
        this rank registers its own. Biases: [E, 2I] and [E, H] (sliced likewise)."""
        world, rank = _group()
        if len(gate_up) != len(down) or not gate_up:
            raise Error(f"ExpertParallelQuantMoE: {len(gate_up)} gate_up and {len(down)} down "
                        f"experts (rule: as many of each, at least one)")
        first, last = shard_bounds(len(gate_up), 1, world, rank)
        experts = ops.register_experts(list(gate_up[first:last]), list(down[first:last]),
                                       _scheme(scheme, "ExpertParallelQuantMoE"))
        part = lambda b: None if b is None else b[first:last]  # noqa: E731
        local = QuantMoE(experts, activation, gate_up_bias=part(gate_up_bias),
                         down_bias=part(down_bias), **kwargs)
        return cls(local, len(gate_up), (first, last))

    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor) -> torch.Tensor:
        world, _ = _group()
        x = hidden.reshape(-1, hidden.shape[-1])
        if x.dtype not in ops.ACTIVATION_DTYPES:
            x = x.to(torch.bfloat16)
        tokens = x.shape[0]
        ids = topk_ids.reshape(tokens, -1).to(torch.int64)
        top_k = ids.shape[1]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.experts):
            raise Error(f"ExpertParallelQuantMoE: topk_ids in [{int(ids.min())}, "
                        f"{int(ids.max())}] (rule: global expert ids in [0, {self.experts}))")
        firsts = torch.tensor([shard_bounds(self.experts, 1, world, r)[0] for r in range(world)],
                              device=ids.device)
        slots = ids.reshape(-1)  # slot s = token s // top_k, choice s % top_k
        owner = torch.searchsorted(firsts, slots, right=True) - 1
        order = torch.argsort(owner, stable=True)
        send = torch.bincount(owner, minlength=world)
        receive = torch.empty_like(send)
        _all_to_all_single(receive, send)
        send_list, receive_list = send.tolist(), receive.tolist()
        rows = _exchange(x[order // top_k], send_list, receive_list)
        local_ids = _exchange((slots[order] - firsts[owner[order]]).to(torch.int32).unsqueeze(1),
                              send_list, receive_list)
        results = self.local(rows, local_ids,
                             torch.ones(local_ids.shape, dtype=torch.float32, device=x.device))
        back = _exchange(results, receive_list, send_list)
        per_slot = torch.empty_like(back)
        per_slot[order] = back
        per_slot = per_slot.reshape(tokens, top_k, -1).to(torch.float32)
        weights = topk_weights.reshape(tokens, top_k).to(torch.float32)
        y = torch.zeros((tokens, x.shape[1]), dtype=torch.float32, device=x.device)
        for j in range(top_k):  # choice order, as the one-rank layer sums
            y += weights[:, j:j + 1] * per_slot[:, j]
        # Rounded once to the 16-bit type the layer ran in (float32 hidden states went through
        # bf16, as QuantMoE's do).
        return y.to(x.dtype).to(hidden.dtype).reshape(hidden.shape)

