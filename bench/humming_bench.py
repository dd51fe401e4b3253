#!/usr/bin/env python3
# needs wheels: none (only .whl/humming_kernels-0.1.19-*.whl; its other imports are in the GPU image)
"""Time Humming (PyPI humming-kernels==0.1.19, the JIT GEMM library vLLM ships) on the
issue #15 / #16 shapes, with the same conventions as qgemm's benches, for a side-by-side.

  python3 bench/humming_bench.py [--rows issue15|issue16|all] [--json OUT.json] [--repeats 30]
                                 [--cache-dir DIR]

On the GPU machine (humming installed from the carried wheel into /tmp/site):
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  PYTHONUNBUFFERED=1 python3 bench/humming_bench.py --rows issue15 --json $OUT/humming15.json

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
"""
import argparse
import json
import os
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
    p = argparse.ArgumentParser(description="Time Humming GEMMs on the issue #15/#16 shapes (cold L2).")
    p.add_argument("--rows", choices=["issue15", "issue16", "all"], default="all")
    p.add_argument("--json", default=None, help="write full results here")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--cache-dir", default=None, help="HUMMING_CACHE_DIR for compiled cubins")
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
    print("# " + json.dumps(meta), flush=True)
    if "H200" not in props.name:
        print(f"# warning: expected an H200, running on {props.name}", flush=True)

    ctx = {"torch": torch, "HummingLayer": HummingLayer, "HummingWeightSchema": HummingWeightSchema,
           "may_process_input": may_process_input, "timer": timer}
    results = []
    for i, (scheme, n, k, ms) in enumerate(ROWS[args.rows]):
        try:
            results += bench_case(ctx, scheme, n, k, ms, args.repeats, seed=1234 + i)
        except Exception as e:  # layer build / quantization failed: every M of the case fails
            err = f"{type(e).__name__}: {e}"
            print(f"{scheme:10s} {n}x{k} FAILED: {err}", flush=True)
            results += [{"scheme": scheme, "N": n, "K": k, "M": m, "status": "FAILED", "error": err} for m in ms]
            torch.cuda.empty_cache()

    print()
    print(markdown_table(results), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)
        print(f"# wrote {args.json}", flush=True)


if __name__ == "__main__":
    main()
