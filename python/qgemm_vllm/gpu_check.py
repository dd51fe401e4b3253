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
torch.compile(fullgraph=True, dynamic=True). The MoE layers (QgemmMoEMethod's steps: int4 GPTQ,
AWQ and compressed-tensors experts, gpt-oss MXFP4 with its interleaved gate/up rows, biases and
clamped SwiGLU) run through torch.ops.qgemm.moe with random routing against the layer in float64,
and one is captured in a CUDA graph and replayed on new hidden states and routing. Every layer is
first warmed up as vLLM's JIT warm-up does it (layout.warm_up_linear / warm_up_experts, through
QgemmLayerWarmup): no forward after it compiles a kernel or reads one from the disk cache
(qgemm.kernel_cache_counts). Exit status 0 when every check passes.
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
sys.path.insert(0, os.path.join(HERE, "tests"))

import test_checkpoint as gptq_fixtures  # noqa: E402
import test_checkpoint_formats as fixtures  # noqa: E402
from moe_fixtures import (MOE_INT4_CONFIGS, gpt_oss_mxfp4, int4_expert_tensors,  # noqa: E402
                          moe_reference)

import qgemm  # noqa: E402
import qgemm.ops  # noqa: E402,F401
from qgemm_vllm import layout  # noqa: E402


def as_torch(value):
    if isinstance(value, torch.Tensor):
        return value
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


# --- MoE layers: QgemmMoEMethod's steps (create_weights, the loaders,
# process_weights_after_loading, apply), driven through qgemm_vllm.layout as the method does.


def build_moe(config, experts, hidden, inter, loads, glu="silu", has_bias=False):
    """The layer's experts as QgemmMoEMethod makes them: one stacked parameter [E, *spec] per
    stored tensor (expert_specs), each checkpoint tensor placed by load_expert_tensor as vLLM's
    loaders call it (`loads`: (w13, name, tensor, shard_id, expert or None for all)), then
    build_experts and QgemmExperts.attach."""
    config = layout.normalized_config(config)
    part = layout.ExpertsPartition("l.experts", experts, hidden, inter, has_bias=has_bias)
    w13_specs, w2_specs = layout.expert_specs(config, part, torch.bfloat16)
    params = {}
    for w13, specs in ((True, w13_specs), (False, w2_specs)):
        for spec in specs:
            params[w13, spec.name] = (spec, layout.initial_tensor(spec).unsqueeze(0).repeat(
                (experts,) + (1,) * len(spec.shape)).contiguous())
    for w13, name, tensor, shard_id, expert in loads:
        spec, data = params[w13, name]
        layout.load_expert_tensor(data, spec, w13, part, as_torch(tensor), shard_id, expert)
    gate_up, down, scheme, gate_up_bias, down_bias = layout.build_experts(
        config, part, w13_specs, w2_specs, [params[True, s.name][1] for s in w13_specs],
        [params[False, s.name][1] for s in w2_specs], torch.bfloat16, layout.Settings())
    module = torch.nn.Module()
    layout.QgemmExperts(gate_up, down, scheme, gate_up_bias, down_bias, glu).attach(module,
                                                                                  DEVICE)
    return module


def moe_cases(rng):
    """(name, module, gate_up [E, 2I, H] float64 (gate rows, then up rows), down [E, H, I],
    gate_up bias or None, down bias or None, GLU)."""
    experts, hidden, inter = 8, 256, 128
    for fmt, config in MOE_INT4_CONFIGS.items():
        loads, gate_up, down = [], [], []
        for e in range(experts):
            ws = []
            for shard_id, (n, k) in (("w1", (inter, hidden)), ("w3", (inter, hidden)),
                                     ("w2", (hidden, inter))):
                tensors, w = int4_expert_tensors(rng, fmt, n, k)
                loads += [(shard_id != "w2", name, v, shard_id, e) for name, v in tensors.items()]
                ws.append(w)
            gate_up.append(np.concatenate(ws[:2]))
            down.append(ws[2])
        yield (f"moe-{fmt}", build_moe(config, experts, hidden, inter, loads),
               np.stack(gate_up), np.stack(down), None, None, "silu")

    # gpt-oss: every expert's MXFP4 blocks in one tensor, gate/up rows interleaved, biases, the
    # clamped SwiGLU (vLLM's gpt-oss loader passes them so).
    b13, s13, w13 = gpt_oss_mxfp4(rng, experts, 2 * inter, hidden)
    b2, s2, w2 = gpt_oss_mxfp4(rng, experts, hidden, inter)
    bias13 = rng.standard_normal((experts, 2 * inter)).astype(np.float32)
    bias2 = rng.standard_normal((experts, hidden)).astype(np.float32)
    bf16 = lambda a: torch.from_numpy(a).to(torch.bfloat16)  # noqa: E731
    loads = [(True, "weight", b13.reshape(experts, 2 * inter, -1), None, None),
             (True, "weight_scale", s13, None, None), (True, "bias", bf16(bias13), None, None),
             (False, "weight", b2.reshape(experts, hidden, -1), None, None),
             (False, "weight_scale", s2, None, None), (False, "bias", bf16(bias2), None, None)]
    module = build_moe({"quant_method": "mxfp4"}, experts, hidden, inter, loads,
                       "clamped-swiglu", has_bias=True)
    stored13 = bf16(bias13).double().numpy()  # the bias as the layer holds it
    yield ("moe-gpt-oss-mxfp4", module, np.concatenate([w13[:, 0::2], w13[:, 1::2]], axis=1),
           w2, np.concatenate([stored13[:, 0::2], stored13[:, 1::2]], axis=1),
           bf16(bias2).double().numpy(), "clamped-swiglu")


def check_moe(name, got, want, magnitude):
    """Element-wise within 2^-7 of the output's magnitude and of itself: the bf16 roundings
    of the rows between the two GEMMs (one unit each way), the output's, and the weights'."""
    bound = 2.0 ** -7 * (magnitude + want.abs()) + 1e-6
    err = (got.cpu().to(torch.float64) - want).abs()
    ok = bool((err <= bound).all())
    print(f"{'ok  ' if ok else 'FAIL'} {name}: max |error| / bound = "
          f"{float((err / bound).max()):.3f}", flush=True)
    return ok


def routing(rng, tokens, top_k, experts):
    ids = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)])
    weights = rng.uniform(0.05, 1.0, (tokens, top_k)).astype(np.float32)
    return (torch.from_numpy(ids.astype(np.int64)).to(DEVICE),
            torch.from_numpy(weights).to(DEVICE))


def check_moe_layers(rng):
    """Every MoE case at a few token counts, then one layer captured in a CUDA graph (GPU)."""
    ok = True
    built = []
    for name, module, gate_up, down, gate_up_bias, down_bias, kind in moe_cases(rng):
        # vLLM's JIT warm-up of the layer (QgemmLayerWarmup); its forwards then compile nothing.
        layout.warm_up_experts(module, (1, 9, 16, 200), 2, torch.bfloat16, DEVICE)
        warmed = qgemm.kernel_cache_counts()
        for tokens in ((1, 9, 200) if DEVICE == "cuda" else (1, 9)):
            x = torch.from_numpy(rng.standard_normal((tokens, gate_up.shape[2])).astype(
                np.float32)).to(DEVICE, torch.bfloat16)
            ids, weights = routing(rng, tokens, 2, gate_up.shape[0])
            y = layout.moe_forward(module, x, ids, weights)
            assert y.dtype == torch.bfloat16 and y.shape == x.shape
            want, magnitude = moe_reference(x, ids, weights, gate_up, down, kind, gate_up_bias,
                                            down_bias)
            ok &= check_moe(f"{name} tokens={tokens}", y, want, magnitude)
        # The check can fail: the reference with gate and up swapped must not pass it.
        inter = down.shape[2]
        swapped = np.concatenate([gate_up[:, inter:], gate_up[:, :inter]], axis=1)
        swapped_bias = None if gate_up_bias is None else \
            np.concatenate([gate_up_bias[:, inter:], gate_up_bias[:, :inter]], axis=1)
        want, magnitude = moe_reference(x, ids, weights, swapped, down, kind, swapped_bias,
                                        down_bias)
        bound = 2.0 ** -7 * (magnitude + want.abs()) + 1e-6
        if bool(((y.cpu().to(torch.float64) - want).abs() <= bound).all()):
            print(f"FAIL {name}: the output also passes against gate and up swapped")
            ok = False
        ok &= check_nothing_compiled(f"{name} after its warm-up", warmed)
        built.append((name, module, gate_up, down, gate_up_bias, down_bias, kind))
    if DEVICE != "cuda":
        return ok
    name, module, gate_up, down, gate_up_bias, down_bias, kind = built[-1]
    tokens, hidden, experts = 16, gate_up.shape[2], gate_up.shape[0]
    static_x = torch.zeros((tokens, hidden), device="cuda", dtype=torch.bfloat16)
    static_ids, static_weights = routing(rng, tokens, 2, experts)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # eager warm-up: plans and compiles for this shape
        for _ in range(2):
            layout.moe_forward(module, static_x, static_ids, static_weights)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = layout.moe_forward(module, static_x, static_ids, static_weights)
    for replay in range(3):  # new hidden states and a new routing each time
        x = torch.from_numpy(rng.standard_normal((tokens, hidden)).astype(np.float32)).to(
            "cuda", torch.bfloat16)
        ids, weights = routing(rng, tokens, 2, experts)
        static_x.copy_(x)
        static_ids.copy_(ids)
        static_weights.copy_(weights)
        graph.replay()
        torch.cuda.synchronize()
        want, magnitude = moe_reference(x, ids, weights, gate_up, down, kind, gate_up_bias,
                                        down_bias)
        ok &= check_moe(f"cuda graph {name} replay {replay}", static_y, want, magnitude)
    return ok


def check_nothing_compiled(name, warmed) -> bool:
    """Whether the process's kernel cache compiled or read from disk nothing since `warmed`."""
    now = qgemm.kernel_cache_counts()
    ok = now == warmed
    print(f"{'ok  ' if ok else 'FAIL'} {name}: kernel cache {now} (after the warm-up: {warmed})",
          flush=True)
    return ok


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
    linear = list(cases(rng))
    # vLLM's JIT warm-up (QgemmLayerWarmup) of every layer, for up to 512 tokens, with and
    # without a bias: every forward below (eager, captured, compiled) compiles nothing.
    for name, module, w, rtol in linear:
        layout.warm_up_linear(module.qgemm_handle, 512, torch.bfloat16, DEVICE, True)
    warmed = qgemm.kernel_cache_counts()
    for name, module, w, rtol in linear:
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
    ok &= check_nothing_compiled("linear layers after their warm-up", warmed)
    ok &= check_moe_layers(rng)
    warmed = qgemm.kernel_cache_counts()
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
    ok &= check_nothing_compiled("captured and compiled forwards", warmed)
    print("gpu_check:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
