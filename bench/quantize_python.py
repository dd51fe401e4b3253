"""GPU weight quantization from Python (issue #18): bf16 torch.nn.Linear weights on the GPU,
quantized by `Engine.quantize_weight` (the packing downloaded: what QuantLinear keeps for its
state_dict and CPU path), by `QuantLinear.from_float` (Engine.quantize_and_prepare_weight: that
packing downloaded and the layouts made from the same device arrays), and by
`Engine.prepare_weight` of the CUDA tensor itself (nothing leaves the device), and by
`QuantLinear.from_float(host_copy=False)` (that preparation, no host copy kept). Medians of 5 after
a warm-up call; GB/s of bf16 input. Last, the rates a download of the int4 codes can reach: into
fresh pageable memory and into pinned memory.

    PYTHONPATH=build/python python3 bench/quantize_python.py [--shape 28672x8192]
"""

import argparse
import statistics
import time

import torch

import qgemm
import qgemm.nn


def median_ms(call, repeats=5):
    call()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="28672x8192")
    args = parser.parse_args()
    n, k = (int(v) for v in args.shape.split("x"))
    linear = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    weight = linear.weight.detach()
    engine = qgemm.ops.engine(torch.cuda.current_device())
    gigabytes = n * k * 2 / 1e9
    print(f"{'scheme':<10} {'shape':<12} {'quantize_ms':>12} {'GB/s':>7} {'from_float_ms':>14} "
          f"{'GB/s':>7} {'prepare_ms':>11} {'GB/s':>7} {'no_host_copy_ms':>16} {'GB/s':>7}")
    for name in ("w4a16", "w4a16-zp", "nvfp4", "mxfp4-a16", "fp8-block", "bitnet"):
        scheme = qgemm.Scheme(name)
        quantize = median_ms(lambda: engine.quantize_weight(weight, scheme))
        from_float = median_ms(lambda: qgemm.nn.QuantLinear.from_float(linear, scheme))
        prepare = median_ms(lambda: engine.prepare_weight(weight, scheme))
        lean = median_ms(lambda: qgemm.nn.QuantLinear.from_float(linear, scheme, host_copy=False))
        print(f"{name:<10} {args.shape:<12} {quantize:>12.2f} {gigabytes / quantize * 1e3:>7.0f} "
              f"{from_float:>14.2f} {gigabytes / from_float * 1e3:>7.0f} {prepare:>11.2f} "
              f"{gigabytes / prepare * 1e3:>7.0f} {lean:>16.2f} {gigabytes / lean * 1e3:>7.0f}",
              flush=True)
    # What the downloads above can reach: the int4 codes' bytes (n · k / 2) from the device into
    # fresh pageable memory (torch's .cpu()) and into pinned memory allocated once.
    codes = torch.randint(0, 256, (n * k // 2,), dtype=torch.uint8, device="cuda")
    pinned = torch.empty(codes.shape, dtype=torch.uint8, pin_memory=True)
    pageable_ms = median_ms(lambda: codes.cpu())
    pinned_ms = median_ms(lambda: pinned.copy_(codes))
    megabytes = codes.numel() / 1e6
    print(f"download of {megabytes:.0f} MB: pageable (fresh) {pageable_ms:.2f} ms "
          f"({megabytes / pageable_ms:.1f} GB/s), pinned {pinned_ms:.2f} ms "
          f"({megabytes / pinned_ms:.1f} GB/s)", flush=True)


if __name__ == "__main__":
    main()
