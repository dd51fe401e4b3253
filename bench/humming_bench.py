#!/usr/bin/env python3
# needs wheels: none (only .whl/humming_kernels-0.1.19-*.whl; its other imports are in the GPU image)
"""Time Humming (PyPI humming-kernels==0.1.19, the JIT GEMM library vLLM ships) on the
issue #15 / #16 dense shapes and the issue #17 MoE (routed-expert) rows, with the same
conventions as qgemm's benches, for a side-by-side.

  python3 bench/humming_bench.py [--rows issue15|issue16|issue17|all] [--json OUT.json]
                                 [--repeats 30] [--cache-dir DIR]
                                 [--moe-filter REGEX] [--moe-ms 1,16,256,4096]
                                 [--moe-tuning restricted|full] [--moe-pad-n 1] [--moe-pad-k 1]
                                 [--ref-tokens 256]

On the GPU machine (humming installed from the carried wheel into /tmp/site):
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  PYTHONUNBUFFERED=1 python3 bench/humming_bench.py --rows issue15 --json $OUT/humming15.json
  PYTHONUNBUFFERED=1 python3 bench/humming_bench.py --rows issue17 --json $OUT/humming17.json

needs wheels: none beyond humming_kernels-0.1.19 itself. What the humming package imports at
run time (torch, triton, numpy, jinja2, filelock, packaging, cuda-bindings) is all in the GPU
image; tqdm and tabulate are declared by the wheel but never imported by the package.

What it assumes about the GPU machine, and how Humming compiles its kernels:
- Kernels are generated per layer (jinja2) and JIT-compiled on the first call. By default
  Humming uses NVRTC (when `cuda.bindings.nvrtc` imports), driven by the nvrtc_compile binary
  shipped precompiled in the wheel; HUMMING_COMPILER=nvcc switches to nvcc. It needs no nvcc in
  the NVRTC case, but it does need a CUDA 13 tree (same major as torch.version.cuda) with
  nvrtc.h, cuda_runtime.h and libnvrtc: it looks in /usr/local/cuda, /usr/local/cuda-*,
  $CUDA_HOME, $CUDA_PATH and pip's nvidia/cu13. We default CUDA_HOME to /usr/local/cuda
  (nvcc at /usr/local/cuda/bin/nvcc) when it exists.
- The torch-op launcher is precompiled in the wheel for torch >= 2.11, so no C++ build happens.
- Compiled cubins are cached in ~/.humming/cache (or $HUMMING_CACHE_DIR / --cache-dir): the
  "first call" column is a cold JIT only when that cache is empty.

Timing: before each timed call a buffer of 2x L2 is read (torch.sum) to evict the L2, then a
GPU sleep covers Humming's Python/launch overhead so that the CUDA events around the call time
the GPU work only (without it the start event would fire while the host was still preparing
the launch). Median and min of --repeats calls after >= 3 warm-up calls.

What is timed is the layer's forward (HummingLayer.__call__), as Humming's own
benchmarks/bench_humming.py does. For w4a8-fp8 the main number, like Humming's bench, takes
activations already quantized to fp8 (per-token dynamic scales); the extra "incl. act quant"
column times the whole bf16-in call (quantization kernel + GEMM).

MoE rows (--rows issue17; see the "MoE" section below for the details):
- Each row is one routed-expert GEMM, gate_up or down, of an E-expert HummingLayer
  (num_experts=E, weights [E, N, K] quantized by Humming's own quantizer), called the way
  vLLM's HummingIndexedExperts calls it: compute_config gemm_type "indexed", tokens sorted by
  expert and padded to the kernel's M tile (sorted_ids / expert_ids / num_tokens_padded, the
  layout of vLLM's moe_align_block_size), top_k, valid_shape_m = M * top_k.
- Humming's indexed GEMM writes one output row per (token, choice), [M * top_k, N], and does
  not apply the router weights (vLLM reduces afterwards with moe_fused_mul_sum). The check
  compares those rows; the router-weighted sum is also reported, for information.
- gate_up takes hidden states [M, K] with top_k; down takes one activation row per
  (token, choice), [M * top_k, K], with top_k = 1 (as vLLM's w2 call does).
- Humming ships no routing-preparation kernel (only a Python loop in humming.testing); the
  sorted ids are built here by a sync-free torch routine, checked equal to Humming's helper,
  and timed on its own, cold L2 like the GEMM (JSON prep_median_us; the GEMM is median_us,
  their sum total_median_us). The GEMM median is the number to compare with the issue's table.
- By default only the kernels of the run's M are compiled (--moe-tuning restricted), all M of
  a layer in one parallel JIT on its first call; if that shared table fails (e.g. one config
  hits an assertion), each M falls back to its own config, so the others keep their figures.
  A cold cache may cost on the order of a minute per layer and scheme (an estimate, not yet
  measured): to stay under a 10-minute command, split the run, e.g. --moe-filter qwen3 then
  --moe-filter gpt-oss (same --cache-dir).
"""
import argparse
import json
import os
import re
import statistics
import sys
import time

# Scheme -> (Humming weight config, Humming input config); keys are the aliases that
# HummingWeightSchema / HummingInputSchema accept (as in Humming's bench_humming.py).
# "uint4" without zero point = symmetric codes with the implicit midpoint 8 (GPTQ sym).
SCHEMES = {
    "w4a16": ({"dtype": "uint4", "group_size": 128, "scale_dtype": "bfloat16"}, {"dtype": "bfloat16"}),
    "w3a16": ({"dtype": "uint3", "group_size": 128, "scale_dtype": "bfloat16"}, {"dtype": "bfloat16"}),
    "w8a16": ({"dtype": "uint8", "group_size": 128, "scale_dtype": "bfloat16"}, {"dtype": "bfloat16"}),
    "mxfp4-a16": ({"dtype": "float4e2m1", "group_size": 32, "scale_dtype": "float8e8m0"}, {"dtype": "bfloat16"}),
    # fp8 activations with no input group size -> InputQuantizationMode.DynamicToken.
    "w4a8-fp8": ({"dtype": "uint4", "group_size": 128, "scale_dtype": "bfloat16"}, {"dtype": "float8e4m3"}),
    # gpt-oss's K = 2880 is not a multiple of 128 (issue #17's "w4a8-fp8 g64" row).
    "w4a8-fp8-g64": ({"dtype": "uint4", "group_size": 64, "scale_dtype": "bfloat16"}, {"dtype": "float8e4m3"}),
}

# (scheme, N, K, M list); N = output features, K = input features.
ROWS = {
    "issue15": [
        ("w4a16", 8192, 8192, [1, 16, 64, 256, 1024, 4096]),
        ("w4a16", 28672, 8192, [1, 16, 64, 256, 1024, 4096]),
        ("w4a16", 8192, 28672, [1, 16, 4096]),
        ("w3a16", 28672, 8192, [1, 4096]),
        ("w8a16", 28672, 8192, [1, 4096]),
        ("mxfp4-a16", 28672, 8192, [1, 4096]),
        ("mxfp4-a16", 8192, 8192, [1, 4096]),
    ],
    "issue16": [
        ("w4a8-fp8", 8192, 8192, [1, 16, 256, 4096]),
        ("w4a8-fp8", 28672, 8192, [1, 16, 4096]),
    ],
}
ROWS["all"] = ROWS["issue15"] + ROWS["issue16"]

WARMUP = 3
REL_ERR_LIMIT = 2e-2


def parse_args():
    p = argparse.ArgumentParser(
        description="Time Humming GEMMs on the issue #15/#16 dense shapes and the issue #17 MoE rows (cold L2).")
    p.add_argument("--rows", choices=["issue15", "issue16", "issue17", "all"], default="all",
                   help="issue15/issue16: dense rows; issue17: MoE rows; all: every row")
    p.add_argument("--json", default=None, help="write full results here")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--cache-dir", default=None, help="HUMMING_CACHE_DIR for compiled cubins")
    g = p.add_argument_group("MoE rows (issue17)")
    g.add_argument("--moe-filter", default=None, metavar="REGEX",
                   help="only MoE cases whose label 'model proj scheme' matches (re.search), "
                        "e.g. 'qwen3.*gate_up' or 'gpt-oss'")
    g.add_argument("--moe-ms", default=None, metavar="LIST",
                   help="comma-separated token counts M (default: 1,16,256,4096)")
    g.add_argument("--moe-tuning", choices=["restricted", "full"], default="restricted",
                   help="restricted (default): Humming's heuristic config for each M * top_k of the "
                        "run, as one table (only those kernels are compiled); full: the layer's whole "
                        "default table, as vLLM passes it (compiles every entry on the first call)")
    g.add_argument("--moe-pad-n", type=int, default=1,
                   help="HummingLayer pad_n_to_multiple (default 1, HummingLayer's own; vLLM pads MoE layers to 256)")
    g.add_argument("--moe-pad-k", type=int, default=1,
                   help="HummingLayer pad_k_to_multiple (default 1, HummingLayer's own; vLLM pads MoE layers to 128)")
    g.add_argument("--ref-tokens", type=int, default=256,
                   help="tokens (random subset when M is larger) checked against the torch reference")
    return p.parse_args()


class ColdL2Timer:
    """CUDA-event timing of one call, L2 evicted before each call."""

    def __init__(self, torch):
        self.torch = torch
        props = torch.cuda.get_device_properties(0)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 60 * 2**20)
        # A read (not a memset, whose dirty lines the GEMM would have to write back) of 2x L2.
        self.flush = torch.ones(2 * self.l2_bytes // 4, dtype=torch.float32, device="cuda")
        self.sink = torch.empty((), dtype=torch.float32, device="cuda")
        self.sleep_cycles = 0

    def calibrate(self, fn):
        """Host time of one call (no sync) -> GPU sleep long enough to hide it (~2 GHz clock)."""
        self.torch.cuda.synchronize()
        host_us = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            host_us.append((time.perf_counter() - t0) * 1e6)
            self.torch.cuda.synchronize()
        # 4x the host time, at least 200 us, capped at 5 ms (a bigger host time means a stall).
        sleep_us = min(max(200.0, 4 * max(host_us)), 5000.0)
        self.sleep_cycles = int(sleep_us * 2000) if hasattr(self.torch.cuda, "_sleep") else 0
        return max(host_us)

    def time_us(self, fn, repeats):
        torch = self.torch
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for i in range(repeats):
            torch.sum(self.flush, dim=0, out=self.sink)
            if self.sleep_cycles:
                torch.cuda._sleep(self.sleep_cycles)  # touches no memory: the L2 stays cold
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
        return statistics.median(times), min(times)


def build_layer(torch, HummingLayer, HummingWeightSchema, scheme, n, k, seed):
    """Quantize a random bf16 W[N,K] with Humming's own quantizer, return (layer, W_deq fp32)."""
    wcfg, icfg = SCHEMES[scheme]
    layer = HummingLayer(
        shape_n=n, shape_k=k, num_experts=0,
        weight_config=dict(wcfg), input_config=dict(icfg), torch_dtype=torch.bfloat16,
    ).to("cuda")
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn((n, k), dtype=torch.bfloat16, device="cuda", generator=g)
    # Same steps as HummingLayer.load_from_unquantized, but keeping the quantized tensors so that
    # the reference uses exactly the weights the kernel sees (Humming's own dequantizer).
    tensors = HummingWeightSchema.quant_tensor(w, layer.weight_schema, torch.bfloat16)
    w_deq = layer.weight_schema.dequant_tensors(tensors).float()
    layer.load_from_tensors(tensors)
    layer.transform()  # repack into Humming's kernel layout; builds layer.humming_config
    del w, tensors
    return layer, w_deq


def bench_case(ctx, scheme, n, k, ms, repeats, seed):
    torch = ctx["torch"]
    results = []
    t0 = time.perf_counter()
    layer, w_deq = build_layer(torch, ctx["HummingLayer"], ctx["HummingWeightSchema"], scheme, n, k, seed)
    torch.cuda.synchronize()
    print(f"# {scheme} {n}x{k}: quantize + transform {time.perf_counter() - t0:.1f} s", flush=True)
    # Bytes a call must read for the weights: packed codes + scales (+ zeros), as laid out.
    weight_bytes = sum(p.nbytes for p in layer.parameters())
    is_fp8 = SCHEMES[scheme][1]["dtype"] == "float8e4m3"
    timer = ctx["timer"]

    for m in ms:
        row = {"scheme": scheme, "N": n, "K": k, "M": m, "weight_bytes": weight_bytes}
        try:
            g = torch.Generator(device="cuda").manual_seed(seed * 1000 + m)
            x = torch.randn((m, k), dtype=torch.bfloat16, device="cuda", generator=g)
            out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
            if is_fp8:
                # Per-token dynamic fp8 quantization by Humming's own input kernel, outside the
                # timed GEMM (as bench_humming.py does). The launcher checks the fp32 token
                # scales against shape [M, 1], which process_input already returns in 0.1.19.
                x_q, _, tok = ctx["may_process_input"](layer.humming_config, x)
                x_ref = x_q.float() * tok.float().reshape(-1, 1)
                scale = tok if tok.dim() == 2 else tok.reshape(-1, 1)
                gemm = lambda: layer(x_q, outputs=out, input_scale=scale)  # noqa: E731
            else:
                x_ref = x.float()
                gemm = lambda: layer(x, outputs=out)  # noqa: E731

            # First call: includes the JIT compile of every kernel in the layer's tuning table
            # (all M ranges at once), unless ~/.humming/cache already held them.
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            gemm()
            torch.cuda.synchronize()
            row["first_call_ms"] = (time.perf_counter() - t0) * 1e3

            # Correctness: fp32 x @ W_deq^T (TF32 off) against Humming's bf16 output.
            ref = x_ref @ w_deq.t()
            row["rel_err"] = float((out.float() - ref).norm() / ref.norm())
            del ref

            for _ in range(WARMUP):
                gemm()
            row["host_call_us"] = timer.calibrate(gemm)
            row["median_us"], row["min_us"] = timer.time_us(gemm, repeats)
            row["tflops"] = 2.0 * m * n * k / (row["median_us"] * 1e-6) / 1e12
            row["weight_tbps"] = weight_bytes / (row["median_us"] * 1e-6) / 1e12

            if is_fp8:
                e2e = lambda: layer(x, outputs=out)  # noqa: E731  bf16 in: quant kernel + GEMM
                for _ in range(WARMUP):
                    e2e()
                timer.calibrate(e2e)
                row["e2e_median_us"], row["e2e_min_us"] = timer.time_us(e2e, repeats)
            row["status"] = "ok"
            flag = "  FLAG rel_err > 2e-2" if row["rel_err"] > REL_ERR_LIMIT else ""
            extra = f"  incl. act quant {row['e2e_median_us']:.2f} us" if is_fp8 else ""
            print(f"{scheme:10s} {n}x{k} M={m:<5d} median {row['median_us']:9.2f} us  "
                  f"min {row['min_us']:9.2f} us  {row['tflops']:7.1f} TFLOPS  "
                  f"{row['weight_tbps']:5.2f} TB/s(w)  rel_err {row['rel_err']:.2e}  "
                  f"first call {row['first_call_ms']:.1f} ms{extra}{flag}", flush=True)
        except Exception as e:  # one failing M must not stop the run
            row.update(status="FAILED", error=f"{type(e).__name__}: {e}")
            print(f"{scheme:10s} {n}x{k} M={m:<5d} FAILED: {row['error']}", flush=True)
        results.append(row)
        torch.cuda.empty_cache()
    del layer, w_deq
    torch.cuda.empty_cache()
    return results


def markdown_table(results):
    lines = [
        "| scheme | N×K | M | humming median µs | min µs | TFLOPS | weight TB/s | rel err "
        "| first call ms | median incl. act quant µs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        shape = f"{r['N']}×{r['K']}"
        if r["status"] != "ok":
            lines.append(f"| {r['scheme']} | {shape} | {r['M']} | FAILED | | | | | | |")
            continue
        err = f"{r['rel_err']:.2e}" + (" (!)" if r["rel_err"] > REL_ERR_LIMIT else "")
        e2e = f"{r['e2e_median_us']:.2f}" if "e2e_median_us" in r else "–"
        lines.append(f"| {r['scheme']} | {shape} | {r['M']} | {r['median_us']:.2f} | {r['min_us']:.2f} "
                     f"| {r['tflops']:.1f} | {r['weight_tbps']:.2f} | {err} | {r['first_call_ms']:.1f} | {e2e} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# MoE (issue #17)
#
# (model, projection, experts E, top_k, N, K, schemes). N = output features of one expert,
# K = its input features: gate_up N = 2 * moe_intermediate, K = hidden; down N = hidden,
# K = moe_intermediate.
MOE_ROWS = {
    "issue17": [
        ("qwen3-30b-a3b", "gate_up", 128, 8, 1536, 2048, ["w4a16", "w4a8-fp8", "mxfp4-a16"]),
        ("qwen3-30b-a3b", "down", 128, 8, 2048, 768, ["w4a16", "w4a8-fp8"]),
        ("gpt-oss-120b", "gate_up", 128, 4, 5760, 2880, ["mxfp4-a16"]),
        # The run stopped on an assertion for mxfp4-a16 here: its error text is recorded.
        ("gpt-oss-120b", "down", 128, 4, 2880, 2880, ["mxfp4-a16", "w4a8-fp8-g64"]),
    ],
}
MOE_MS = [1, 16, 256, 4096]
# What vLLM's HummingIndexedExperts passes (use_batch_invariant / use_f16_accum off).
MOE_COMPUTE_CONFIG = json.dumps({"use_batch_invariant": False, "use_f16_accum": False, "gemm_type": "indexed"})


def build_moe_layer(torch, HummingLayer, HummingWeightSchema, scheme, e, n, k, seed, pad_n, pad_k):
    """E-expert layer from random bf16 W[E,N,K] quantized by Humming's own quantizer.

    Returns (layer, schema, tensors): the quantized tensors (unpadded, Humming's checkpoint
    layout, expert dimension first) and the schema they were made with, so that the reference
    dequantizes exactly the weights the kernel sees, one expert at a time (a full fp32 copy of
    gpt-oss's gate_up would be 8.5 GB)."""
    wcfg, icfg = SCHEMES[scheme]
    layer = HummingLayer(
        shape_n=n, shape_k=k, num_experts=e,
        weight_config=dict(wcfg), input_config=dict(icfg),
        pad_n_to_multiple=pad_n, pad_k_to_multiple=pad_k, torch_dtype=torch.bfloat16,
    ).to("cuda")
    g = torch.Generator(device="cuda").manual_seed(seed)
    # A few experts at a time: gpt-oss's gate_up is 2.1e9 weights (int32 temporaries of 8.5 GB in
    # one call, element counts next to 2^31). Groups run along K inside a row, so quantizing
    # expert chunks gives the same tensors as one call.
    chunk = max(1, (1 << 28) // (n * k))
    parts = []
    for e0 in range(0, e, chunk):
        w = torch.randn((min(chunk, e - e0), n, k), dtype=torch.bfloat16, device="cuda", generator=g)
        parts.append(HummingWeightSchema.quant_tensor(w, layer.weight_schema, torch.bfloat16))
        del w
    tensors = {key: torch.cat([part[key] for part in parts], dim=0) for key in parts[0]}
    del parts
    # transform() may replace layer.weight_schema (symmetric ints become sign-magnitude codes);
    # the tensors above were made with this one.
    schema = layer.weight_schema
    layer.load_from_tensors(tensors)
    layer.transform()  # pads, repacks into Humming's kernel layout, builds layer.humming_config
    return layer, schema, tensors


def moe_align_block_size(torch, topk_ids, num_experts, block_size):
    """Routing preparation for Humming's indexed GEMM, as vLLM's moe_align_block_size lays it out.

    topk_ids [M, top_k] -> (sorted_ids, expert_ids, num_tokens_padded), int32:
    - sorted_ids: the flat (token * top_k + choice) ids grouped by expert (ascending within an
      expert), each expert's group padded to a multiple of block_size with the sentinel
      M * top_k; sized for the worst case, the tail past num_tokens_padded is sentinel too;
    - expert_ids: the expert of each block of block_size ids (blocks past the end: E - 1, never
      read: the kernel takes its block count from num_tokens_padded on the device);
    - num_tokens_padded: shape [1], the padded length.
    No host synchronization (no bincount, nonzero or item), so it can be timed like a kernel.
    """
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + (block_size - 1)) // block_size * block_size
    pad_end = torch.cumsum(padded, 0)
    pad_start = pad_end - padded
    cnt_start = torch.cumsum(counts, 0) - counts
    sorted_experts, order = torch.sort(flat, stable=True)
    rank = torch.arange(n, dtype=torch.int64, device=dev) - cnt_start[sorted_experts]
    dest = pad_start[sorted_experts] + rank
    max_blocks = (n + min(num_experts, n) * (block_size - 1) + block_size - 1) // block_size
    sorted_ids = torch.full((max_blocks * block_size,), n, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(max_blocks, dtype=torch.int64, device=dev) * block_size
    expert_ids = torch.searchsorted(pad_end, block_start, right=True).clamp_(max=num_experts - 1)
    expert_ids = expert_ids.to(torch.int32)
    num_tokens_padded = pad_end[-1:].to(torch.int32)
    return sorted_ids, expert_ids, num_tokens_padded


def check_alignment_against_humming(torch, generate_moe_tensors, topk_ids, num_experts, block_size, prep):
    """Compare moe_align_block_size with humming.testing's generate_moe_tensors (a per-expert loop).

    Returns None when they agree, else a short description of the difference."""
    sorted_ids, expert_ids, num_tokens_padded = prep
    _, _, h_sorted, h_experts, h_padded = generate_moe_tensors(topk_ids, num_experts, "indexed", block_size)
    total = int(num_tokens_padded.item())
    if total != int(h_padded.item()):
        return f"num_tokens_padded {total} != humming {int(h_padded.item())}"
    if not torch.equal(sorted_ids[:total].cpu(), h_sorted.to(torch.int32).cpu()):
        return "sorted_ids differ from humming.testing.generate_moe_tensors"
    if not torch.equal(expert_ids[: total // block_size].cpu(), h_experts.to(torch.int32).cpu()):
        return "expert_ids differ from humming.testing.generate_moe_tensors"
    return None


def _plain(obj):
    """JSON round trip: a private copy (the heuristics are lru-cached), tuples as lists."""
    return json.loads(json.dumps(obj))


def moe_tuning_plan(ctx, layer, valid_ms, mode):
    """Humming's heuristic kernel config for each valid_shape_m (= M * top_k) of the run.

    Returns (per_m, errors, table): per_m {valid_m: config dict}, errors {valid_m: text},
    table: the tuning_config list [[lo, hi, config], ...] passed to every call of this layer.
    - restricted: for each valid_m, get_heuristics_config(shape_m=valid_m), the entry that the
      layer's default table holds for that M (the table is built from the same function at
      sampled M, and these M are sample points), merged into one small table, so that only
      these kernels are compiled, in parallel, on the first call;
    - full: the layer's whole default table (HummingMethod.get_default_tuning_configs), as
      vLLM passes it; every entry is compiled on the first call."""
    get_h = ctx["get_heuristics_config"]
    cfg = layer.humming_config
    per_m, errors = {}, {}
    if mode == "full":
        table = _plain(get_h(cfg, gemm_type="indexed", device=torch_device_index(ctx)))
        for v in valid_ms:
            for lo, hi, conf in table:
                if lo < v <= (hi if hi > 0 else 1 << 30):
                    per_m[v] = conf
                    break
            else:
                errors[v] = f"valid_shape_m {v} is in no interval of the default table"
        return per_m, errors, table

    for v in sorted(set(valid_ms)):
        try:
            per_m[v] = _plain(get_h(cfg, shape_m=v, gemm_type="indexed", device=torch_device_index(ctx)))
        except Exception as e:  # noqa: BLE001  recorded per M
            errors[v] = f"heuristics: {type(e).__name__}: {e}"
    table = []
    keys = sorted(per_m)
    lo = 0
    for i, v in enumerate(keys):
        hi = v if i + 1 < len(keys) else 1 << 30
        if table and table[-1][2] == per_m[v]:
            table[-1][1] = hi
        else:
            table.append([lo, hi, per_m[v]])
        lo = v
    return per_m, errors, table


def torch_device_index(ctx):
    return ctx["torch"].cuda.current_device()


def dequant_expert(schema, tensors, expert, num_experts):
    """fp32 W_e [N, K] from the quantized tensors, with Humming's own dequantizer."""
    sub = {}
    for name, t in tensors.items():
        if t.dim() >= 2 and t.size(0) == num_experts:
            sub[name] = t[expert]
        elif t.dim() == 1 and t.numel() == num_experts:  # a per-expert tensor scale
            sub[name] = t[expert: expert + 1]
        else:
            sub[name] = t
    return schema.dequant_tensors(sub).float()


def moe_reference_check(torch, schema, tensors, num_experts, out, x_ref, topk_ids, topk_w,
                        is_gate_up, ref_tokens, seed):
    """fp32 reference for a subset of tokens; returns (rel_err rows, rel_err weighted, tokens).

    Row r = t * top_k + j of Humming's output is x_t @ W_e^T with e = topk_ids[t, j] (gate_up,
    x [M, K]) or x_r @ W_e^T (down, x [M * top_k, K]). The weighted figure is
    sum_j w_tj * row(t, j) per token, compared with the same sum of the reference rows."""
    m, top_k = topk_ids.shape
    dev = out.device
    if m > ref_tokens:
        g = torch.Generator(device=dev).manual_seed(seed)
        tok = torch.randperm(m, device=dev, generator=g)[:ref_tokens].sort().values
    else:
        tok = torch.arange(m, device=dev)
    rows = (tok[:, None] * top_k + torch.arange(top_k, device=dev)).reshape(-1)
    experts = topk_ids.reshape(-1)[rows].to(torch.int64)
    in_idx = tok.repeat_interleave(top_k) if is_gate_up else rows
    xin = x_ref[in_idx]
    ref = torch.empty((rows.numel(), out.size(1)), dtype=torch.float32, device=dev)
    for ex in experts.unique().tolist():
        sel = (experts == ex).nonzero().squeeze(1)
        w = dequant_expert(schema, tensors, ex, num_experts)
        ref[sel] = xin[sel] @ w.t()
        del w
    got = out[rows].float()
    rel = float((got - ref).norm() / ref.norm())
    wts = topk_w[tok].float().unsqueeze(-1)
    got_w = (got.view(-1, top_k, got.size(1)) * wts).sum(1)
    ref_w = (ref.view(-1, top_k, ref.size(1)) * wts).sum(1)
    rel_w = float((got_w - ref_w).norm() / ref_w.norm())
    return rel, rel_w, int(tok.numel())


def moe_label(model, proj, scheme):
    return f"{model} {proj} {scheme}"


def bench_moe_case(ctx, model, proj, e, top_k, n, k, scheme, ms, args, seed):
    torch = ctx["torch"]
    timer = ctx["timer"]
    repeats = args.repeats
    is_gate_up = proj == "gate_up"
    is_fp8 = SCHEMES[scheme][1]["dtype"] == "float8e4m3"
    name = f"{scheme:12s} {model} {proj:7s} E{e} top{top_k} {n}x{k}"
    base = {"kind": "moe", "model": model, "proj": proj, "scheme": scheme, "E": e, "top_k": top_k,
            "N": n, "K": k, "pad_n_to_multiple": args.moe_pad_n, "pad_k_to_multiple": args.moe_pad_k}
    results = []

    t0 = time.perf_counter()
    layer, schema, tensors = build_moe_layer(torch, ctx["HummingLayer"], ctx["HummingWeightSchema"],
                                             scheme, e, n, k, seed, args.moe_pad_n, args.moe_pad_k)
    torch.cuda.synchronize()
    t_build = time.perf_counter() - t0
    weight_bytes = sum(p.nbytes for p in layer.parameters())  # as laid out (padded), all experts
    bytes_per_expert = weight_bytes / e
    valid_ms = [m * top_k for m in ms]
    t0 = time.perf_counter()
    per_m, plan_errors, table = moe_tuning_plan(ctx, layer, valid_ms, args.moe_tuning)
    table_str = json.dumps(table)
    print(f"# {name}: quantize + transform {t_build:.1f} s, tuning plan {time.perf_counter() - t0:.1f} s, "
          f"{len(table)} table entries ({args.moe_tuning}), layer config {layer.humming_config.to_str()}",
          flush=True)
    table_broken = None  # error text once the shared table failed to compile/launch

    for m in ms:
        valid_m = m * top_k
        row = dict(base, M=m, valid_shape_m=valid_m, weight_bytes=weight_bytes)
        try:
            if valid_m in plan_errors:
                raise RuntimeError(plan_errors[valid_m])
            conf = per_m[valid_m]
            block_m = int(conf["block_shape"][0])
            row["kernel"] = {key: conf.get(key) for key in (
                "mma_type", "block_shape", "warp_shape", "num_stages", "num_ctas_per_sm",
                "use_stream_k", "use_warp_spec", "use_tma", "num_sms")}
            row["block_m"] = block_m

            g = torch.Generator(device="cuda").manual_seed(seed * 1000 + m)
            # Random routing: top_k distinct experts per token, uniform; softmax router weights.
            scores = torch.rand((m, e), device="cuda", generator=g)
            topk_ids = scores.topk(top_k, dim=1).indices.to(torch.int32).contiguous()
            topk_w = torch.softmax(torch.randn((m, top_k), device="cuda", generator=g), dim=-1)
            row["experts_hit"] = int(topk_ids.unique().numel())
            rows_in = m if is_gate_up else m * top_k
            x = torch.randn((rows_in, k), dtype=torch.bfloat16, device="cuda", generator=g)
            out = torch.empty((m * top_k, n), dtype=torch.bfloat16, device="cuda")

            prep_fn = lambda: moe_align_block_size(torch, topk_ids, e, block_m)  # noqa: E731
            sorted_ids, expert_ids, num_tokens_padded = prep_fn()
            row["num_tokens_padded"] = int(num_tokens_padded.item())
            if ctx.get("generate_moe_tensors") is not None:
                diff = check_alignment_against_humming(torch, ctx["generate_moe_tensors"], topk_ids, e, block_m,
                                                       (sorted_ids, expert_ids, num_tokens_padded))
                row["prep_matches_humming"] = diff is None
                if diff is not None:
                    raise RuntimeError(f"routing preparation check: {diff}")

            kt = top_k if is_gate_up else 1
            if is_fp8:
                # Per-token dynamic fp8 by Humming's own input kernel, outside the timed GEMM, as
                # vLLM does (may_quant_input before forward_layer). Scales [rows, 1] fp32.
                x_q, _, tok = ctx["may_process_input"](layer.humming_config, x)
                x_ref = x_q.float() * tok.float().reshape(-1, 1)
                scale = tok if tok.dim() == 2 else tok.reshape(-1, 1)
                x_in = x_q
            else:
                x_ref, scale, x_in = x.float(), None, x

            def make_gemm(tuning):
                return lambda: layer(  # noqa: E731
                    x_in, outputs=out, input_scale=scale,
                    sorted_ids=sorted_ids, expert_ids=expert_ids, num_tokens_padded=num_tokens_padded,
                    top_k=kt, valid_shape_m=valid_m,
                    compute_config=MOE_COMPUTE_CONFIG, tuning_config=tuning)

            # First call: compiles the table's kernels (all M of the layer at once), unless the
            # cache held them. Unwritten rows would stay NaN and show in rel_err.
            out.fill_(float("nan"))
            row["tuning"] = "table" if args.moe_tuning == "restricted" else "full-table"
            gemm = make_gemm(table_str)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            try:
                if table_broken is not None:
                    raise RuntimeError(table_broken)
                gemm()
                torch.cuda.synchronize()
            except Exception as te:  # noqa: BLE001
                if args.moe_tuning != "restricted":
                    raise
                # One kernel of the shared table failed (e.g. an assertion at compile time): try
                # this M's own config alone, so that the other M keep their figures.
                if table_broken is None:
                    table_broken = f"{type(te).__name__}: {te}"
                    print(f"# {name}: shared table failed ({table_broken.splitlines()[0][:300]}); "
                          f"each M now runs its own config", flush=True)
                row["table_error"] = table_broken
                row["tuning"] = "single"
                gemm = make_gemm(json.dumps(conf))
                out.fill_(float("nan"))
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                gemm()
                torch.cuda.synchronize()
            row["first_call_ms"] = (time.perf_counter() - t0) * 1e3

            row["rel_err"], row["rel_err_weighted"], row["ref_tokens"] = moe_reference_check(
                torch, schema, tensors, e, out, x_ref, topk_ids, topk_w, is_gate_up,
                args.ref_tokens, seed * 1000 + m + 7)

            for _ in range(WARMUP):
                gemm()
            row["host_call_us"] = timer.calibrate(gemm)
            row["median_us"], row["min_us"] = timer.time_us(gemm, repeats)

            for _ in range(WARMUP):
                prep_fn()
            row["prep_host_call_us"] = timer.calibrate(prep_fn)
            row["prep_median_us"], row["prep_min_us"] = timer.time_us(prep_fn, repeats)
            row["total_median_us"] = row["median_us"] + row["prep_median_us"]

            if is_fp8:
                aq = lambda: ctx["may_process_input"](layer.humming_config, x)  # noqa: E731
                for _ in range(WARMUP):
                    aq()
                timer.calibrate(aq)
                row["act_quant_median_us"], row["act_quant_min_us"] = timer.time_us(aq, repeats)

            row["tflops"] = 2.0 * m * top_k * n * k / (row["median_us"] * 1e-6) / 1e12
            # Weights of the experts this routing touches, as laid out.
            row["weight_tbps"] = bytes_per_expert * row["experts_hit"] / (row["median_us"] * 1e-6) / 1e12
            row["status"] = "ok"
            bad = not (row["rel_err"] <= REL_ERR_LIMIT)  # NaN counts as bad
            flag = "  FLAG rel_err > 2e-2" if bad else ""
            extra = f"  act quant {row['act_quant_median_us']:.2f} us" if is_fp8 else ""
            single = "  (own config)" if row["tuning"] == "single" else ""
            print(f"{name} M={m:<5d} gemm median {row['median_us']:9.2f} us  min {row['min_us']:9.2f} us  "
                  f"prep {row['prep_median_us']:7.2f} us  sum {row['total_median_us']:9.2f} us  "
                  f"{row['tflops']:7.1f} TFLOPS  {row['weight_tbps']:5.2f} TB/s(w)  "
                  f"rel_err(rows) {row['rel_err']:.2e}  weighted {row['rel_err_weighted']:.2e}  "
                  f"block_m {block_m}  first call {row['first_call_ms']:.1f} ms{extra}{single}{flag}", flush=True)
        except Exception as ex:  # noqa: BLE001  one failing M must not stop the run
            row.update(status="FAILED", error=f"{type(ex).__name__}: {ex}")
            print(f"{name} M={m:<5d} FAILED: {row['error']}", flush=True)
        results.append(row)
        torch.cuda.empty_cache()
    del layer, tensors
    torch.cuda.empty_cache()
    return results


def moe_cases(args):
    ms = MOE_MS if not args.moe_ms else [int(v) for v in args.moe_ms.split(",") if v.strip()]
    cases = []
    for model, proj, e, top_k, n, k, schemes in MOE_ROWS["issue17"]:
        for scheme in schemes:
            if args.moe_filter and not re.search(args.moe_filter, moe_label(model, proj, scheme)):
                continue
            cases.append((model, proj, e, top_k, n, k, scheme, ms))
    return cases


def moe_markdown_tables(results):
    lines = [
        "| layer | scheme | E / top-k | N×K | M | humming gemm median µs | min µs | prep µs | gemm + prep µs "
        "| TFLOPS | weight TB/s | rel err (rows) | rel err (weighted) | block M | first call ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        layer = f"{r['model']} {r['proj']}"
        head = f"| {layer} | {r['scheme']} | {r['E']} / {r['top_k']} | {r['N']}×{r['K']} | {r['M']} "
        if r["status"] != "ok":
            err = r.get("error", "").splitlines()[0][:160].replace("|", "/") if r.get("error") else ""
            lines.append(head + f"| FAILED: {err} | | | | | | | | | |")
            continue
        err = f"{r['rel_err']:.2e}" + ("" if r["rel_err"] <= REL_ERR_LIMIT else " (!)")
        lines.append(head + f"| {r['median_us']:.2f} | {r['min_us']:.2f} | {r['prep_median_us']:.2f} "
                     f"| {r['total_median_us']:.2f} | {r['tflops']:.1f} | {r['weight_tbps']:.2f} | {err} "
                     f"| {r['rel_err_weighted']:.2e} | {r['block_m']} | {r['first_call_ms']:.1f} |")
    # The layout: gemm medians, one column per M.
    ms = sorted({r["M"] for r in results})
    pivot = ["", "| layer | scheme | " + " | ".join(f"M = {m}" for m in ms) + " |",
             "| --- | --- | " + " | ".join("---" for _ in ms) + " |"]
    keys = []
    for r in results:
        key = (r["model"], r["proj"], r["scheme"])
        if key not in keys:
            keys.append(key)
    for key in keys:
        cells = []
        for m in ms:
            hit = [r for r in results if (r["model"], r["proj"], r["scheme"]) == key and r["M"] == m]
            if not hit:
                cells.append("")
            elif hit[0]["status"] != "ok":
                cells.append("FAILED")
            else:
                cells.append(f"{hit[0]['median_us']:.1f}")
        pivot.append(f"| {key[0]} {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    return "\n".join(lines + pivot)


def main():
    args = parse_args()
    # Set before humming is imported: its path helpers cache these on first use.
    if args.cache_dir:
        os.environ["HUMMING_CACHE_DIR"] = os.path.abspath(args.cache_dir)
    if "CUDA_HOME" not in os.environ and os.path.isdir("/usr/local/cuda"):
        os.environ["CUDA_HOME"] = "/usr/local/cuda"

    import torch
    if not torch.cuda.is_available():
        print("no CUDA GPU", flush=True)
        sys.exit(1)
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference must be true fp32

    import humming
    from humming.forward import may_process_input
    from humming.layer import HummingLayer
    from humming.schema import HummingWeightSchema
    from humming.jit.runtime import KernelRuntime

    props = torch.cuda.get_device_properties(0)
    timer = ColdL2Timer(torch)
    meta = {
        "device": props.name,
        "humming": getattr(humming, "__version__", "?"),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "compiler": KernelRuntime._get_compiler().__name__,
        "cuda_home": os.environ.get("CUDA_HOME"),
        "cache_dir": os.environ.get("HUMMING_CACHE_DIR", os.path.expanduser("~/.humming/cache")),
        "l2_bytes": timer.l2_bytes,
        "repeats": args.repeats,
        "warmup": WARMUP,
    }
    run_moe = args.rows in ("issue17", "all")
    if run_moe:
        meta.update(moe_tuning=args.moe_tuning, moe_pad_n=args.moe_pad_n, moe_pad_k=args.moe_pad_k,
                    ref_tokens=args.ref_tokens, moe_compute_config=json.loads(MOE_COMPUTE_CONFIG))
    print("# " + json.dumps(meta), flush=True)
    if "H200" not in props.name:
        print(f"# warning: expected an H200, running on {props.name}", flush=True)

    ctx = {"torch": torch, "HummingLayer": HummingLayer, "HummingWeightSchema": HummingWeightSchema,
           "may_process_input": may_process_input, "timer": timer}
    results = []
    for i, (scheme, n, k, ms) in enumerate(ROWS.get(args.rows, [])):
        try:
            results += bench_case(ctx, scheme, n, k, ms, args.repeats, seed=1234 + i)
        except Exception as e:  # layer build / quantization failed: every M of the case fails
            err = f"{type(e).__name__}: {e}"
            print(f"{scheme:10s} {n}x{k} FAILED: {err}", flush=True)
            results += [{"scheme": scheme, "N": n, "K": k, "M": m, "status": "FAILED", "error": err} for m in ms]
            torch.cuda.empty_cache()
    dense_results = list(results)

    moe_results = []
    if run_moe:
        from humming.tune import get_heuristics_config
        ctx["get_heuristics_config"] = get_heuristics_config
        try:  # Humming's own (per-expert loop) routing helper, to check ours against
            from humming.testing.data import generate_moe_tensors
            ctx["generate_moe_tensors"] = generate_moe_tensors
        except Exception as e:  # noqa: BLE001
            print(f"# humming.testing.data unavailable ({type(e).__name__}: {e}): routing not cross-checked",
                  flush=True)
        for i, (model, proj, e, top_k, n, k, scheme, ms) in enumerate(moe_cases(args)):
            try:
                moe_results += bench_moe_case(ctx, model, proj, e, top_k, n, k, scheme, ms, args, seed=4321 + i)
            except Exception as ex:  # layer build / quantization / tuning failed: every M fails
                err = f"{type(ex).__name__}: {ex}"
                print(f"{scheme:12s} {model} {proj} {n}x{k} FAILED: {err}", flush=True)
                moe_results += [{"kind": "moe", "model": model, "proj": proj, "scheme": scheme, "E": e,
                                 "top_k": top_k, "N": n, "K": k, "M": m, "status": "FAILED", "error": err}
                                for m in ms]
                torch.cuda.empty_cache()
        results += moe_results

    if dense_results or not run_moe:
        print()
        print(markdown_table(dense_results), flush=True)
    if moe_results:
        print()
        print(moe_markdown_tables(moe_results), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)
        print(f"# wrote {args.json}", flush=True)


if __name__ == "__main__":
    main()
