"""GPU check of qgemm's vLLM plugin, on a machine without vLLM (it cannot be installed there).

    PYTHONPATH=build-gpu/python:python/qgemm_vllm python3 python/qgemm_vllm/gpu_check.py

QgemmLinearMethod (qgemm_vllm.vllm_plugin) subclasses vLLM's classes, so it cannot be built
without vLLM; everything it does lives in qgemm_vllm.layout, which this check drives the same
way: tensor_specs (the checkpoint's tensors of a layer), build_weight (loaded tensors -> one
qgemm weight, fused shards included), QgemmLinearKernel.attach (registration and upload to the
GPU) and linear_forward (the method's apply). What stands in for vLLM here is the weight
loading at TP = 1: each logical shard's tensors are placed along the layer's output rows (and
per-shard scales one per shard), as vLLM's loaders place them; the CPU tests (ctest -L vllm)
check vLLM's own loaders.

The layers are those of the CPU tests (python/qgemm_vllm/tests): checkpoint-format tensors from
python/tests' writers, whose weights w[n, k] are computed there in numpy. Each layer runs on the
GPU through torch.ops.qgemm.gemm and is compared element-wise with x · wᵀ in float64; then one
layer's forward is captured in a CUDA graph and replayed on new inputs, and run through
torch.compile(fullgraph=True, dynamic=True). Exit status 0 when every check passes.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import test_checkpoint as gptq_fixtures  # noqa: E402
import test_checkpoint_formats as fixtures  # noqa: E402

import qgemm.ops  # noqa: E402,F401
from qgemm_vllm import layout  # noqa: E402


def as_torch(value):
    if isinstance(value, tuple):
        dtype, raw = value
        t = torch.from_numpy(np.ascontiguousarray(raw))
        view = {"F8_E4M3": torch.float8_e4m3fn, "BF16": torch.bfloat16}.get(dtype)
        return t.view(view) if view is not None else t
    return torch.from_numpy(np.ascontiguousarray(value))


def load_tp1(specs, shards):
    """The layer's parameters after loading each logical shard's tensors at TP = 1."""
    out = []
    for spec in specs:
        parts = [as_torch(s[spec.name]) if spec.name in s else None for s in shards]
        if all(p is None for p in parts):
            out.append(layout.initial_tensor(spec))
        elif spec.param_class == "PerTensorScaleParameter":
            out.append(torch.stack([p.reshape(()).to(spec.dtype) for p in parts]))
        elif spec.output_dim is None:
            out.append(parts[0].to(spec.dtype).reshape(spec.shape))
        else:
            out.append(torch.cat(parts, dim=spec.output_dim).to(spec.dtype))
        assert tuple(out[-1].shape) == tuple(spec.shape), (spec.name, out[-1].shape, spec.shape)
    return out


DEVICE = "cuda"


def build(config, prefix, shard_names, output_sizes, k, shards, **settings):
    part = layout.LayerPartition(prefix, output_sizes, k, shard_names)
    specs = layout.tensor_specs(layout.normalized_config(config), part, torch.bfloat16)
    tensors = load_tp1(specs, shards)
    settings = layout.Settings(**settings)
    imported, scheme = layout.build_weight(layout.normalized_config(config), part, specs,
                                           tensors, torch.bfloat16, settings)
    module = torch.nn.Module()
    layout.QgemmLinearKernel(imported, scheme, settings).attach(module, DEVICE)
    return module


def cases(rng):
    """(name, module, w [n, k] float64, activation_rtol)."""
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True,
            "sym": False}
    t, w = gptq_fixtures.gptq_tensors(rng, 512, 1024, 4, 128, v1=True, act_order=True)
    yield ("gptq-act-order", build(gptq, "l.down_proj", ["l.down_proj"], [512], 1024, [t]),
           w, 0.0)

    ts, ws = zip(*[gptq_fixtures.gptq_tensors(rng, n, 1024, 4, 128, v1=True, act_order=False)
                   for n in (256, 128)])
    yield ("gptq-gate-up", build({**gptq, "desc_act": False}, "l.gate_up_proj",
                                 ["l.gate_proj", "l.up_proj"], [256, 128], 1024, list(ts)),
           np.concatenate(ws), 0.0)

    n, k, group = 256, 640, 64
    q = rng.integers(0, 16, size=(k, n))
    z = rng.integers(0, 16, size=(k // group, n))
    s = (rng.random((k // group, n)) * 0.02 + 0.001).astype(np.float16)
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    pack = gptq_fixtures.pack_words_along_rows
    g = np.arange(k) // group
    yield ("awq", build({"quant_method": "awq", "bits": 4, "group_size": group}, "l.o_proj",
                        ["l.o_proj"], [n], k,
                        [{"qweight": pack(q.T, 4, order).T.copy(),
                          "qzeros": pack(z.T, 4, order).T.copy(), "scales": s}]),
           ((q - z[g]) * s[g].astype(np.float64)).T, 0.0)

    ct = fixtures.ct_config(4, False, "group", 32)
    shards, ws = [], []
    for n in (128, 64, 64):
        t, w = fixtures.ct_pack_tensors(rng, "p", 4, False, "group", "BF16", n, 256, 32)
        shards.append({name[2:]: v for name, v in t.items()})
        ws.append(w)
    yield ("compressed-tensors-qkv", build(ct, "l.qkv_proj", ["l.q_proj", "l.k_proj",
                                                               "l.v_proj"],
                                           [128, 64, 64], 256, shards),
           np.concatenate(ws), 0.0)

    shards, ws = [], []
    for n in (128, 192):
        t, w = fixtures.nvfp4_tensors(rng, "p", n, 256, weight_scale_2=0.004)
        shards.append({name[2:]: v for name, v in t.items()})
        ws.append(w)
    for activations, rtol in (("16bit", 0.0), ("checkpoint", 0.5)):
        yield (f"nvfp4-gate-up-{activations}",
               build(fixtures.MODELOPT_NVFP4, "l.gate_up_proj", ["l.gate_proj", "l.up_proj"],
                     [128, 192], 256, shards, activations=activations),
               np.concatenate(ws), rtol)

    shards, ws = [], []
    for n in (128, 64, 64):
        codes = fixtures.random_e4m3_codes(rng, (n, 256))
        scale = np.float32(rng.uniform(1e-3, 1e-2))
        shards.append({"weight": ("F8_E4M3", codes), "weight_scale": np.array(scale),
                       "input_scale": np.array(0.5, np.float32)})
        ws.append(fixtures.e4m3fn(codes) * np.float64(scale))
    yield ("modelopt-fp8-qkv", build({"quant_method": "modelopt", "quant_algo": "FP8"},
                                     "l.qkv_proj", ["l.q_proj", "l.k_proj", "l.v_proj"],
                                     [128, 64, 64], 256, shards, activations="16bit"),
           np.concatenate(ws), 0.0)

    n, k = 512, 768
    codes = fixtures.random_e4m3_codes(rng, (n, k))
    s = rng.uniform(1e-4, 1e-2, size=(4, 6)).astype(np.float32)
    w = fixtures.e4m3fn(codes) * s.astype(np.float64)[np.arange(n) // 128][:, np.arange(k) //
                                                                           128]
    yield ("fp8-block", build({"quant_method": "fp8", "weight_block_size": [128, 128]},
                              "l.gate_proj", ["l.gate_proj"], [n], k,
                              [{"weight": ("F8_E4M3", codes), "weight_scale_inv": s}]),
           w, 2.0 ** -3)


def check(name, y, x, w, activation_rtol, bias=None):
    """Element-wise: the output's rounding to bf16 (unit roundoff 2^-8, doubled) and the
    weights' (a kernel may round dequantized weights to bf16: 2^-8 of |x|·|w|ᵀ, doubled, which
    also covers fp32 accumulation), plus the activation quantization's error where there is
    one."""
    x64 = x.double().cpu().numpy()
    ref = x64 @ w.T + (0.0 if bias is None else bias.double().cpu().numpy())
    scale = np.abs(x64) @ np.abs(w).T
    bound = 2.0 ** -7 * np.abs(ref) + (2.0 ** -7 + activation_rtol) * scale + 1e-30
    err = np.abs(y.double().cpu().numpy() - ref)
    ok = bool(np.all(err <= bound))
    print(f"{'ok  ' if ok else 'FAIL'} {name}: max |error| / bound = {(err / bound).max():.3f}",
          flush=True)
    return ok


def main() -> int:
    global DEVICE
    if "--cpu" in sys.argv:  # a dry run of the layers on qgemm's CPU reference operator
        DEVICE = "cpu"
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device (--cpu runs the layers on the CPU reference)")
        return 2
    seed = int(os.environ.get("QGEMM_TEST_SEED", np.random.SeedSequence().entropy % 2**63))
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else "the CPU reference"
    print(f"gpu_check on {where}, seed {seed} (QGEMM_TEST_SEED "
          "replays it)")
    rng = np.random.default_rng(seed)
    ok = True
    built = []
    for name, module, w, rtol in cases(rng):
        for m in ((1, 7, 300) if DEVICE == "cuda" else (1, 7)):
            x = torch.from_numpy(rng.standard_normal((m, w.shape[1])).astype(np.float32)).to(
                DEVICE, torch.bfloat16)
            start = time.time()
            y = layout.linear_forward(module, x)
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            assert y.dtype == torch.bfloat16 and y.shape == (m, w.shape[0])
            ok &= check(f"{name} m={m} ({time.time() - start:.2f} s)", y, x, w, rtol)
        built.append((name, module, w, rtol))
    if DEVICE == "cpu":
        print("gpu_check --cpu:", "passed" if ok else "FAILED")
        return 0 if ok else 1

    # A CUDA-graph capture of a layer's forward (act-order: the permutation's index_select and
    # the GEMM), replayed on new inputs; and another layer with its bias.
    for name, module, w, rtol in (built[0], built[2]):
        k = w.shape[1]
        bias = torch.from_numpy(rng.standard_normal(w.shape[0]).astype(np.float32)).to(
            "cuda", torch.bfloat16) if name == "awq" else None
        static_x = torch.zeros((16, k), device="cuda", dtype=torch.bfloat16)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # eager warm-up: plans and compiles for this shape
            for _ in range(2):
                layout.linear_forward(module, static_x, bias)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = layout.linear_forward(module, static_x, bias)
        for replay in range(3):
            x = torch.from_numpy(rng.standard_normal((16, k)).astype(np.float32)).to(
                "cuda", torch.bfloat16)
            static_x.copy_(x)
            graph.replay()
            torch.cuda.synchronize()
            ok &= check(f"cuda graph {name} replay {replay}", static_y, x, w, rtol, bias)

    name, module, w, rtol = built[1]
    compiled = torch.compile(lambda x: layout.linear_forward(module, x), fullgraph=True,
                             dynamic=True)
    for m in (3, 33, 5):
        x = torch.from_numpy(rng.standard_normal((m, w.shape[1])).astype(np.float32)).to(
            "cuda", torch.bfloat16)
        ok &= check(f"torch.compile {name} m={m}", compiled(x), x, w, rtol)
    print("gpu_check:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
