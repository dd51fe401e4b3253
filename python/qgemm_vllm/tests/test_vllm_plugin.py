"""qgemm's vLLM plugin against the installed vLLM, on the CPU (ctest -L vllm; the environment
is scripts/vllm_env.sh's build/vllm-env, and without vLLM every test here skips).

The checkpoint tensors come from the writers of python/tests (test_checkpoint.py and
test_checkpoint_formats.py), which lay them out as the producing tools do and compute the
weights they stand for, w[n, k], in numpy from the raw values, independently of qgemm. A layer
is built by vLLM's own linear classes with TP = 1 on a gloo group, loaded through vLLM's
weight loaders (shard by shard for fused layers), processed, and run on qgemm's CPU reference
operator; its output is compared element-wise with x · wᵀ in float64, within the rounding of
the output to bf16 (plus the activation quantization, where the scheme quantizes them).
"""

import os
import pickle
import socket
import sys

import numpy as np
import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/vllm_env.sh makes "
                                          "its environment)")
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))
import test_checkpoint as gptq_fixtures  # noqa: E402
import test_checkpoint_formats as fixtures  # noqa: E402

from moe_fixtures import (MOE_INT4_CONFIGS, gpt_oss_mxfp4, int4_expert_tensors,  # noqa: E402
                          moe_reference)
from qgemm_vllm import layout  # noqa: E402


@pytest.fixture(scope="module")
def plugin():
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    from qgemm_vllm import vllm_plugin

    return vllm_plugin


@pytest.fixture(scope="module")
def tp1(plugin):
    """A one-rank gloo group: vLLM's tensor-parallel world of size 1."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import (init_distributed_environment, initialize_model_parallel)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from vllm.config import DeviceConfig

    # Without a GPU, vLLM's CUDA build finds no platform and cannot infer the device (and its
    # CPU platform needs triton-cpu): name the device.
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(1, 1)
        yield config


# --- loading and claiming ----------------------------------------------------------------------

def test_entry_point_registers_qgemm_idempotently(plugin):
    import importlib.metadata as md

    from vllm.model_executor.layers.quantization import (QUANTIZATION_METHODS,
                                                         get_quantization_config)

    import qgemm_vllm

    entry = [ep for ep in md.entry_points(group="vllm.general_plugins") if ep.name == "qgemm"]
    assert [ep.value for ep in entry] == ["qgemm_vllm:register"]
    assert entry[0].load() is qgemm_vllm.register
    qgemm_vllm.register()
    qgemm_vllm.register()
    assert QUANTIZATION_METHODS.count("qgemm") == 1
    assert get_quantization_config("qgemm") is plugin.QgemmConfig
    assert pickle.loads(pickle.dumps(qgemm_vllm.register)) is qgemm_vllm.register
    # vLLM builds the config without arguments for unquantized checkpoints; it pickles.
    empty = pickle.loads(pickle.dumps(plugin.QgemmConfig()))
    assert empty.get_name() == "qgemm" and empty.checkpoint_config == {}
    assert hasattr(torch.ops.qgemm, "gemm")


GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True,
       "version": "gemm"}
CT_W4A16 = fixtures.ct_config(4, False, "group", 32)
NVFP4 = dict(fixtures.MODELOPT_NVFP4)
MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                              "lm_head"]}
FP8_BLOCK = {"quant_method": "fp8", "activation_scheme": "dynamic",
             "weight_block_size": [128, 128]}
CLAIMED = {"gptq": GPTQ, "awq": AWQ, "compressed-tensors": CT_W4A16, "modelopt-nvfp4": NVFP4,
           "gpt-oss-mxfp4": MXFP4, "fp8-block": FP8_BLOCK}


@pytest.mark.parametrize("name", sorted(CLAIMED))
def test_claims_only_when_asked(plugin, name):
    config = CLAIMED[name]
    cls = plugin.QgemmConfig
    assert cls.override_quantization_method(config, "qgemm") == "qgemm"
    assert cls.override_quantization_method(config, None) is None
    assert cls.override_quantization_method(config, config["quant_method"]) is None
    restored = pickle.loads(pickle.dumps(cls.from_config(config)))
    assert restored.checkpoint_config["quant_method"] == config["quant_method"]


def test_refuses_what_it_cannot_serve_with_the_reason(plugin):
    cls = plugin.QgemmConfig
    with pytest.raises(ValueError, match="quant_method 'bitsandbytes'"):
        cls.override_quantization_method({"quant_method": "bitsandbytes"}, "qgemm")
    with pytest.raises(ValueError, match="without weight_block_size"):
        cls.override_quantization_method({"quant_method": "fp8"}, "qgemm")
    assert cls.override_quantization_method({"quant_method": "bitsandbytes"}, "fp8") is None


def tiny_model_dir(tmp_path, quantization_config, model_type="llama"):
    """A model directory with config.json only (no weights: create_model_config reads the
    config)."""
    import json

    common = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
              "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 512,
              "max_position_embeddings": 256, "torch_dtype": "bfloat16",
              "quantization_config": quantization_config}
    if model_type == "gpt_oss":
        common.update({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
                       "num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 64,
                       "sliding_window": 128, "layer_types": ["full_attention"]})
    else:
        common.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    (tmp_path / "config.json").write_text(json.dumps(common))
    return str(tmp_path)


@pytest.mark.parametrize("name", sorted(CLAIMED))
def test_model_config_chooses_qgemm(plugin, tmp_path, name):
    from vllm.config import ModelConfig

    model_type = "gpt_oss" if name == "gpt-oss-mxfp4" else "llama"
    path = tiny_model_dir(tmp_path, CLAIMED[name], model_type)
    config = ModelConfig(model=path, quantization="qgemm", skip_tokenizer_init=True,
                         dtype="bfloat16")
    assert config.quantization == "qgemm"
    plain = ModelConfig(model=path, skip_tokenizer_init=True, dtype="bfloat16")
    assert plain.quantization != "qgemm"


# --- linear layers on one rank --------------------------------------------------------------

def torch_tensor(value):
    """A fixture's tensor ((safetensors dtype, raw numpy) or a numpy array) as torch."""
    if isinstance(value, tuple):
        dtype, raw = value
        t = torch.from_numpy(np.ascontiguousarray(raw))
        view = {"F8_E4M3": torch.float8_e4m3fn, "BF16": torch.bfloat16}.get(dtype)
        return t.view(view) if view is not None else t
    return torch.from_numpy(np.ascontiguousarray(value))


def load(layer, tensors, shard_id=None):
    """Loads one checkpoint layer's tensors (name without prefix -> tensor) through the
    parameters' vLLM weight loaders, as vLLM's model loader does."""
    for name, value in tensors.items():
        param = getattr(layer, name)
        if shard_id is None:
            param.weight_loader(param, torch_tensor(value))
        else:
            param.weight_loader(param, torch_tensor(value), shard_id)


def check_forward(layer, w, rng, rtol=2.0 ** -7, activation_rtol=0.0, m=5):
    """layer(x) against x · wᵀ (float64) on bf16 x, element-wise: the output's rounding to
    bf16 (its unit roundoff 2^-8, doubled for margin) and, where activations are quantized,
    their error bounded by activation_rtol · |x| · |w|ᵀ."""
    k = w.shape[1]
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
    y = layer.quant_method.apply(layer, x)
    assert y.dtype == torch.bfloat16 and y.shape == (m, w.shape[0])
    x64 = x.double().numpy()
    ref = x64 @ w.T
    bound = rtol * np.abs(ref) + activation_rtol * (np.abs(x64) @ np.abs(w).T) + 1e-30
    err = np.abs(y.double().numpy() - ref)
    assert np.all(err <= bound), (f"max error {err.max()}, worst ratio "
                                  f"{(err / bound).max()}")
    return x, y


def quant_config(plugin, config, **settings):
    return plugin.QgemmConfig(config, layout.Settings(**settings) if settings else None)


def test_gptq_act_order_column_parallel(plugin, tp1, rng):
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    n, k = 64, 256
    tensors, w = gptq_fixtures.gptq_tensors(rng, n, k, 4, 128, v1=True, act_order=True)
    config = quant_config(plugin, {**GPTQ, "desc_act": True, "sym": False})
    layer = ColumnParallelLinear(k, n, bias=False, params_dtype=torch.bfloat16,
                                 quant_config=config, prefix="model.layers.0.mlp.down_proj")
    assert type(layer.quant_method).__name__ == "QgemmLinearMethod"
    load(layer, tensors)
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.qgemm_input_permutation is not None
    check_forward(layer, w, rng)


def test_gptq_fused_gate_up(plugin, tp1, rng):
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear

    k, sizes = 256, [64, 32]
    config = quant_config(plugin, GPTQ)
    config.packed_modules_mapping = {"gate_up_proj": ["gate_proj", "up_proj"]}
    layer = MergedColumnParallelLinear(k, sizes, bias=False, params_dtype=torch.bfloat16,
                                       quant_config=config,
                                       prefix="model.layers.0.mlp.gate_up_proj")
    ws = []
    for shard, n in enumerate(sizes):
        tensors, w = gptq_fixtures.gptq_tensors(rng, n, k, 4, 128, v1=True, act_order=False)
        load(layer, tensors, shard)
        ws.append(w)
    layer.quant_method.process_weights_after_loading(layer)
    check_forward(layer, np.concatenate(ws), rng)


def test_w4a8_on_a_w4a16_checkpoint(plugin, tp1, rng):
    """QGEMM_ACTIVATIONS=e4m3:tok: the GPTQ weights with e4m3 per-token activations (each
    activation within 2^-4 of itself; bounded by 2^-3 of |x| · |w|ᵀ)."""
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    n, k = 64, 256
    tensors, w = gptq_fixtures.gptq_tensors(rng, n, k, 4, 128, v1=True, act_order=False)
    layer = ColumnParallelLinear(k, n, bias=False, params_dtype=torch.bfloat16,
                                 quant_config=quant_config(plugin, GPTQ, activations="e4m3:tok"),
                                 prefix="model.layers.0.mlp.down_proj")
    load(layer, tensors)
    layer.quant_method.process_weights_after_loading(layer)
    scheme = layer.qgemm_weight.scheme
    assert scheme.activation_quantized and scheme.activation_format == "e4m3", str(scheme)
    check_forward(layer, w, rng, activation_rtol=2.0 ** -3)


def test_awq_row_parallel_with_bias(plugin, tp1, rng):
    from vllm.model_executor.layers.linear import RowParallelLinear

    n, k, group = 128, 320, 64
    q = rng.integers(0, 16, size=(k, n))
    z = rng.integers(0, 16, size=(k // group, n))
    s = (rng.random((k // group, n)) * 0.02 + 0.001).astype(np.float16)
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    pack = gptq_fixtures.pack_words_along_rows
    tensors = {"qweight": pack(q.T, 4, order).T.copy(), "qzeros": pack(z.T, 4, order).T.copy(),
               "scales": s}
    g = np.arange(k) // group
    w = ((q - z[g]) * s[g].astype(np.float64)).T
    layer = RowParallelLinear(k, n, bias=True, params_dtype=torch.bfloat16,
                              quant_config=quant_config(plugin, AWQ),
                              prefix="model.layers.0.self_attn.o_proj")
    load(layer, tensors)
    bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(torch.bfloat16)
    layer.bias.weight_loader(layer.bias, bias)
    layer.quant_method.process_weights_after_loading(layer)
    x = torch.from_numpy(rng.standard_normal((3, k)).astype(np.float32)).to(torch.bfloat16)
    y = layer.quant_method.apply(layer, x, layer.bias)
    ref = x.double().numpy() @ w.T + bias.double().numpy()
    assert np.all(np.abs(y.double().numpy() - ref) <= 2.0 ** -7 * np.abs(ref) + 1e-30)


def test_compressed_tensors_fused_qkv(plugin, tp1, rng):
    from vllm.model_executor.layers.linear import QKVParallelLinear

    hidden, head, heads, kv_heads = 96, 16, 4, 2
    config = quant_config(plugin, CT_W4A16)
    config.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    layer = QKVParallelLinear(hidden, head, heads, kv_heads, bias=False,
                              params_dtype=torch.bfloat16, quant_config=config,
                              prefix="model.layers.0.self_attn.qkv_proj")
    ws = []
    for shard, n in zip("qkv", (heads * head, kv_heads * head, kv_heads * head)):
        tensors, w = fixtures.ct_pack_tensors(rng, "p", 4, False, "group", "BF16", n, hidden,
                                              32)
        load(layer, {name[2:]: v for name, v in tensors.items()}, shard)
        ws.append(w)
    layer.quant_method.process_weights_after_loading(layer)
    check_forward(layer, np.concatenate(ws), rng)


def test_modelopt_nvfp4_fused_gate_up(plugin, tp1, rng):
    """Shards with one global scale (weight_scale_2, as modelopt exports fused layers): exact.
    Activations kept 16-bit (QGEMM_ACTIVATIONS=16bit), then the checkpoint's W4A4."""
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear

    k, sizes, g = 64, [32, 48], 0.004
    ws, shards = [], []
    for n in sizes:
        tensors, w = fixtures.nvfp4_tensors(rng, "p", n, k, weight_scale_2=g)
        shards.append({name[2:]: v for name, v in tensors.items()})
        ws.append(w)
    for activations, activation_rtol in (("16bit", 0.0), ("checkpoint", 2.0 ** -1)):
        config = quant_config(plugin, NVFP4, activations=activations)
        config.packed_modules_mapping = {"gate_up_proj": ["gate_proj", "up_proj"]}
        layer = MergedColumnParallelLinear(k, sizes, bias=False, params_dtype=torch.bfloat16,
                                           quant_config=config,
                                           prefix="model.layers.0.mlp.gate_up_proj")
        for shard, tensors in enumerate(shards):
            load(layer, tensors, shard)
        layer.quant_method.process_weights_after_loading(layer)
        assert layer.qgemm_weight.scheme.activation_quantized == (activations == "checkpoint")
        # e2m1 activations with a per-16 e4m3 scale: each value within a quarter of itself
        # (e2m1's steps) plus the scale's rounding; bounded loosely by half.
        check_forward(layer, np.concatenate(ws), rng, activation_rtol=activation_rtol)


def test_nvfp4_shards_with_different_global_scales(plugin, tp1, rng):
    """Each shard's own weight_scale_2: the block scales are rescaled to the largest and
    rounded to ue4m3 again, a relative error of at most 2^-4 on each weight."""
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear

    k, sizes = 64, [32, 16]
    config = quant_config(plugin, NVFP4, activations="16bit")
    config.packed_modules_mapping = {"gate_up_proj": ["gate_proj", "up_proj"]}
    layer = MergedColumnParallelLinear(k, sizes, bias=False, params_dtype=torch.bfloat16,
                                       quant_config=config,
                                       prefix="model.layers.0.mlp.gate_up_proj")
    ws = []
    for shard, (n, g) in enumerate(zip(sizes, (0.004, 0.001))):
        tensors, w = fixtures.nvfp4_tensors(rng, "p", n, k, weight_scale_2=g)
        load(layer, {name[2:]: v for name, v in tensors.items()}, shard)
        ws.append(w)
    layer.quant_method.process_weights_after_loading(layer)
    check_forward(layer, np.concatenate(ws), rng, activation_rtol=2.0 ** -4)


def test_modelopt_fp8_per_shard_scales_become_per_channel(plugin, tp1, rng):
    from vllm.model_executor.layers.linear import QKVParallelLinear

    hidden, head, heads, kv_heads = 64, 16, 2, 1
    config = quant_config(plugin, {"quant_method": "modelopt", "quant_algo": "FP8"},
                          activations="16bit")
    config.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    layer = QKVParallelLinear(hidden, head, heads, kv_heads, bias=False,
                              params_dtype=torch.bfloat16, quant_config=config,
                              prefix="model.layers.0.self_attn.qkv_proj")
    ws = []
    for shard, n in zip("qkv", (heads * head, kv_heads * head, kv_heads * head)):
        codes = fixtures.random_e4m3_codes(rng, (n, hidden))
        scale = np.float32(rng.uniform(1e-3, 1e-2))
        load(layer, {"weight": ("F8_E4M3", codes),
                     "weight_scale": np.array(scale, np.float32),
                     "input_scale": np.array(0.5, np.float32)}, shard)
        ws.append(fixtures.e4m3fn(codes) * np.float64(scale))
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.qgemm_weight.scheme.granularity == "channel"
    check_forward(layer, np.concatenate(ws), rng)


def test_fp8_block_checkpoint_activations(plugin, tp1, rng):
    """DeepSeek-style FP8 blocks with the checkpoint's 1 x 128 e4m3 activations: e4m3 rounds
    each activation within 2^-4 of itself (the group scale maps the group's max to 448)."""
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    n, k = 256, 384
    codes = fixtures.random_e4m3_codes(rng, (n, k))
    s = rng.uniform(1e-4, 1e-2, size=(2, 3)).astype(np.float32)
    layer = ColumnParallelLinear(k, n, bias=False, params_dtype=torch.bfloat16,
                                 quant_config=quant_config(plugin, FP8_BLOCK),
                                 prefix="model.layers.0.mlp.gate_proj")
    load(layer, {"weight": ("F8_E4M3", codes), "weight_scale_inv": s})
    layer.quant_method.process_weights_after_loading(layer)
    w = fixtures.e4m3fn(codes) * s.astype(np.float64)[np.arange(n) // 128][:, np.arange(k) //
                                                                           128]
    check_forward(layer, w, rng, activation_rtol=2.0 ** -3)


def test_vllm_model_loader_on_a_gptq_llama(plugin, tp1, rng, tmp_path, monkeypatch):
    """vLLM's own model loader (get_model) on a one-layer GPTQ Llama checkpoint with
    --quantization qgemm: the model's packed_modules_mapping, its stacked-parameter loading of
    q/k/v and gate/up, the checkpoint weight mapper (act-order g_idx kept), and
    process_weights_after_loading. Each linear layer is then compared with the checkpoint's
    weights. (Attention is not under test: its backend is set to vLLM's CPU one, which the
    CUDA build of vLLM does not select on a machine without a GPU.)"""
    import json

    from safetensors.numpy import save_file
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.model_loader import get_model
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "get_attn_backend_cls", lambda *args, **kwargs:
                        "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend")
    hidden, inter, heads, kv_heads, vocab = 128, 256, 4, 2, 512
    head = hidden // heads
    shapes = {"self_attn.q_proj": (heads * head, hidden), "self_attn.k_proj":
              (kv_heads * head, hidden), "self_attn.v_proj": (kv_heads * head, hidden),
              "self_attn.o_proj": (hidden, heads * head), "mlp.gate_proj": (inter, hidden),
              "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
    tensors, weights = {}, {}
    for name, (n, k) in shapes.items():
        # Act-order where the layer is not fused (fused shards share one input, so GPTQ gives
        # them one g_idx).
        stored, w = gptq_fixtures.gptq_tensors(rng, n, k, 4, 64, v1=True,
                                               act_order=name in ("mlp.down_proj",
                                                                  "self_attn.o_proj"))
        tensors.update({f"model.layers.0.{name}.{t}": v for t, v in stored.items()})
        weights[name] = w
    small = lambda *shape: (rng.standard_normal(shape) * 0.02).astype(np.float32)
    tensors.update({"model.embed_tokens.weight": small(vocab, hidden),
                    "lm_head.weight": small(vocab, hidden),
                    "model.norm.weight": np.ones(hidden, np.float32),
                    "model.layers.0.input_layernorm.weight": np.ones(hidden, np.float32),
                    "model.layers.0.post_attention_layernorm.weight":
                        np.ones(hidden, np.float32)})
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "num_hidden_layers": 1, "vocab_size": vocab,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "quantization_config": {**GPTQ, "group_size": 64, "desc_act": True, "sym": False}}))
    model_config = ModelConfig(model=str(tmp_path), quantization="qgemm",
                               skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=True)
    config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(config):
        model = get_model(vllm_config=config)
    layer0 = model.model.layers[0]
    fused = {
        "self_attn.qkv_proj": (layer0.self_attn.qkv_proj,
                               ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
        "self_attn.o_proj": (layer0.self_attn.o_proj, ["self_attn.o_proj"]),
        "mlp.gate_up_proj": (layer0.mlp.gate_up_proj, ["mlp.gate_proj", "mlp.up_proj"]),
        "mlp.down_proj": (layer0.mlp.down_proj, ["mlp.down_proj"]),
    }
    for name, (layer, parts) in fused.items():
        assert type(layer.quant_method).__name__ == "QgemmLinearMethod", name
        check_forward(layer, np.concatenate([weights[p] for p in parts]), rng)
    assert layer0.mlp.down_proj.qgemm_input_permutation is not None
    assert type(model.lm_head.quant_method).__name__ == "UnquantizedEmbeddingMethod"


# --- two ranks -----------------------------------------------------------------------------

def _tp2_rank(rank, port, directory):
    """One rank of test_tensor_parallel_two_ranks: builds the layers with TP = 2, loads the
    whole checkpoint tensors (vLLM's loaders take this rank's part), and checks this rank's
    output: its columns (column-parallel) or its partial sum over its inputs (row-parallel)."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers.linear import (ColumnParallelLinear, QKVParallelLinear,
                                                   RowParallelLinear)
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    from qgemm_vllm import vllm_plugin

    data = dict(np.load(os.path.join(directory, "data.npz"), allow_pickle=True))
    rng = np.random.default_rng(int(data["seed"]) + rank)
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    results = []
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=2, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(2, 1)

        def run(name, layer, tensors, w, shard_ids=None, row=False):
            if shard_ids is None:
                load(layer, tensors)
            else:
                for shard, part in zip(shard_ids, tensors):
                    load(layer, part, shard)
            layer.quant_method.process_weights_after_loading(layer)
            k_part = layer.input_size_per_partition
            x = torch.from_numpy(rng.standard_normal((4, k_part)).astype(np.float32)).to(
                torch.bfloat16)
            y = layer.quant_method.apply(layer, x).double().numpy()
            if row:
                w_part = w[:, rank * k_part:(rank + 1) * k_part]
            else:
                w_part = w
            ref = x.double().numpy() @ w_part.T
            err = np.abs(y - ref)
            bound = 2.0 ** -7 * np.abs(ref) + 1e-30
            results.append((name, float((err / bound).max())))

        gptq = vllm_plugin.QgemmConfig({**GPTQ, "group_size": 64, "sym": False})
        t = {key[5:]: data[key] for key in data if key.startswith("gptq_")}
        n = t["scales"].shape[1]
        w = data["w_gptq"]
        run("gptq column", ColumnParallelLinear(256, n, bias=False, params_dtype=torch.bfloat16,
                                                quant_config=gptq, prefix="l.gate_proj"),
            t, w[rank * n // 2:(rank + 1) * n // 2])
        run("gptq row", RowParallelLinear(256, n, bias=False, params_dtype=torch.bfloat16,
                                          quant_config=gptq, prefix="l.down_proj"),
            t, w, row=True)
        awq = vllm_plugin.QgemmConfig(AWQ)
        t = {key[4:]: data[key] for key in data if key.startswith("awq_")}
        run("awq row", RowParallelLinear(256, 128, bias=False, params_dtype=torch.bfloat16,
                                         quant_config=awq, prefix="l.o_proj"),
            t, data["w_awq"], row=True)
        ct = vllm_plugin.QgemmConfig(CT_W4A16)
        ct.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
        shards, parts = [], []
        for shard in "qkv":
            # (the scales are bf16, stored as their uint16 bits)
            shards.append({key[len(shard) + 4:]: ("BF16", data[key]) if key.endswith(
                "weight_scale") else data[key] for key in data if key.startswith(f"ct_{shard}_")})
            w_shard = data[f"w_ct_{shard}"]
            half = w_shard.shape[0] // 2
            parts.append(w_shard[rank * half:(rank + 1) * half])
        run("compressed-tensors qkv", QKVParallelLinear(96, 16, 4, 2, bias=False,
                                                        params_dtype=torch.bfloat16,
                                                        quant_config=ct, prefix="l.qkv_proj"),
            shards, np.concatenate(parts), shard_ids="qkv")
        fp8 = vllm_plugin.QgemmConfig(FP8_BLOCK)
        run("fp8-block column", ColumnParallelLinear(384, 256, bias=False,
                                                     params_dtype=torch.bfloat16,
                                                     quant_config=vllm_plugin.QgemmConfig(
                                                         {**FP8_BLOCK}, layout.Settings(
                                                             activations="16bit")),
                                                     prefix="l.gate_proj"),
            {"weight": ("F8_E4M3", data["fp8_codes"]), "weight_scale_inv": data["fp8_s"]},
            data["w_fp8"][rank * 128:(rank + 1) * 128])
    with open(os.path.join(directory, f"rank{rank}.txt"), "w") as f:
        for name, ratio in results:
            f.write(f"{name}\t{ratio}\n")


def test_tensor_parallel_two_ranks(plugin, rng, tmp_path):
    """TP = 2 on gloo (two processes): vLLM's loaders split the checkpoint tensors of GPTQ
    (column- and row-parallel, groups split with K), AWQ (row), compressed-tensors fused QKV
    (heads split) and FP8 blocks (column, whole blocks per rank); each rank's output is checked
    against its part of the checkpoint's weights."""
    import torch.multiprocessing as mp

    data = {"seed": np.int64(rng.integers(1 << 62))}
    t, w = gptq_fixtures.gptq_tensors(rng, 64, 256, 4, 64, v1=True, act_order=False)
    data.update({f"gptq_{key}": v for key, v in t.items()}, w_gptq=w)
    n, k, group = 128, 256, 64
    q = rng.integers(0, 16, size=(k, n))
    z = rng.integers(0, 16, size=(k // group, n))
    s = (rng.random((k // group, n)) * 0.02 + 0.001).astype(np.float16)
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    pack = gptq_fixtures.pack_words_along_rows
    g = np.arange(k) // group
    data.update(awq_qweight=pack(q.T, 4, order).T.copy(), awq_qzeros=pack(z.T, 4, order).T.copy(),
                awq_scales=s, w_awq=((q - z[g]) * s[g].astype(np.float64)).T)
    for shard, rows in zip("qkv", (64, 32, 32)):
        tensors, w = fixtures.ct_pack_tensors(rng, "p", 4, False, "group", "BF16", rows, 96, 32)
        for name, (dtype, raw) in tensors.items():
            assert dtype in ("BF16", "I32", "I64"), dtype
            data[f"ct_{shard}_{name[2:]}"] = raw  # BF16: its uint16 bits
        data[f"w_ct_{shard}"] = w
    codes = fixtures.random_e4m3_codes(rng, (256, 384))
    s = rng.uniform(1e-4, 1e-2, size=(2, 3)).astype(np.float32)
    data.update(fp8_codes=codes, fp8_s=s,
                w_fp8=fixtures.e4m3fn(codes) * s.astype(np.float64)[np.arange(256) // 128][
                    :, np.arange(384) // 128])
    np.savez(tmp_path / "data.npz", **data)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_tp2_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        lines = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert len(lines) == 5, lines
        for line in lines:
            name, ratio = line.split("\t")
            assert float(ratio) <= 1.0, f"rank {rank}, {name}: error / bound = {ratio}"


def test_unquantized_layers_stay_with_vllm(plugin, tp1):
    from vllm.model_executor.layers.linear import ReplicatedLinear, UnquantizedLinearMethod

    config = quant_config(plugin, {**CT_W4A16, "ignore": ["re:.*o_proj$"]})
    attn = ReplicatedLinear(64, 64, bias=False, params_dtype=torch.bfloat16,
                            quant_config=config, prefix="model.layers.0.self_attn.o_proj")
    router = ReplicatedLinear(64, 8, bias=False, params_dtype=torch.bfloat16,
                              quant_config=quant_config(plugin, GPTQ),
                              prefix="model.layers.0.mlp.gate")
    oss = ReplicatedLinear(64, 64, bias=False, params_dtype=torch.bfloat16,
                           quant_config=quant_config(plugin, MXFP4),
                           prefix="model.layers.0.self_attn.q_proj")
    plain = ReplicatedLinear(64, 64, bias=False, params_dtype=torch.bfloat16,
                             quant_config=plugin.QgemmConfig(),
                             prefix="model.layers.0.self_attn.q_proj")
    for layer in (attn, router, oss, plain):
        assert isinstance(layer.quant_method, UnquantizedLinearMethod)


def test_torch_compile_fullgraph_dynamic(plugin, tp1, rng):
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    n, k = 64, 256
    tensors, w = gptq_fixtures.gptq_tensors(rng, n, k, 4, 128, v1=False, act_order=True)
    layer = ColumnParallelLinear(k, n, bias=False, params_dtype=torch.bfloat16,
                                 quant_config=quant_config(plugin, {**GPTQ, "desc_act": True,
                                                                    "checkpoint_format":
                                                                        "gptq_v2"}),
                                 prefix="model.layers.0.mlp.down_proj")
    load(layer, tensors)
    layer.quant_method.process_weights_after_loading(layer)
    torch._dynamo.reset()

    def forward(x):
        return layer.quant_method.apply(layer, x) * 2

    def through_the_layer(x):  # vLLM's ColumnParallelLinear.forward: (output, bias)
        return layer(x)[0] * 2

    for function in (forward, through_the_layer):
        compiled = torch.compile(function, fullgraph=True, dynamic=True)
        for m in (3, 7, 12):  # new token counts reuse the one dynamic graph
            x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(
                torch.bfloat16)
            with torch._dynamo.config.patch(error_on_recompile=m != 3):
                y = compiled(x)
            ref = 2 * (x.double().numpy() @ w.T)
            assert np.all(np.abs(y.double().numpy() - ref) <= 2.0 ** -7 * np.abs(ref) + 1e-30)


def test_settings_errors_name_the_setting(monkeypatch):
    monkeypatch.setenv("QGEMM_MAX_ROWS", "many")
    with pytest.raises(ValueError, match="QGEMM_MAX_ROWS"):
        layout.Settings.load({})
    monkeypatch.delenv("QGEMM_MAX_ROWS")
    monkeypatch.setenv("QGEMM_ACTIVATIONS", "fp7")
    with pytest.raises(ValueError, match="QGEMM_ACTIVATIONS"):
        layout.Settings.load({})
    monkeypatch.setenv("QGEMM_ACTIVATIONS", "e4m3:tok")
    assert layout.Settings.load({"qgemm": {"max_rows": 128}}) == layout.Settings("e4m3:tok",
                                                                                 128)


# --- MoE layers on one rank -------------------------------------------------------------------
#
# vLLM's FusedMoE layer (FusedMoEFactory: its RoutedExperts) with TP = 1 on gloo, its experts'
# checkpoint tensors loaded through the parameters' weight loaders as vLLM's model loaders call
# them (per expert and projection: shard_id w1 = gate, w3 = up, w2 = down; gpt-oss: all experts
# at once), processed, and run on the CPU operator through QgemmMoEMethod.apply with random
# routing. The reference is the layer written out in float64 from the weights the fixtures'
# tensors stand for, with the roundings its definition has (gate_up rows and the activation to
# bf16); the bound is python/tests/test_moe.py's: one bf16 step of the magnitudes involved.

BF16_ULP = 2.0 ** -8


def assert_moe_close(got, want, magnitude):
    bound = BF16_ULP * magnitude + BF16_ULP * want.abs() + 1e-6
    err = (got.to(torch.float64) - want).abs()
    assert bool((err <= bound).all()), (f"{int((err > bound).sum())} elements outside, worst "
                                        f"ratio {float((err / bound).max())}")
    return bound


_moe_layers = iter(range(10**6))


def moe_layer(config, experts, hidden, inter, **kwargs):
    from vllm.model_executor.layers.fused_moe import FusedMoEFactory

    # vLLM registers each MoE layer under its name, once per process.

    runner = FusedMoEFactory(num_experts=experts, top_k=2, hidden_size=hidden,
                             intermediate_size=inter, params_dtype=torch.bfloat16,
                             quant_config=config,
                             prefix=f"model.layers.{next(_moe_layers)}.mlp.experts", **kwargs)
    layer = runner.routed_experts
    assert type(layer.quant_method).__name__ == "QgemmMoEMethod"
    return layer


def load_expert(layer, tensors, shard_id, expert):
    """One expert's projection as vLLM's MoE loaders pass it: the parameter w13_<name> /
    w2_<name>, the checkpoint tensor, shard_id and the (global) expert id."""
    for name, value in tensors.items():
        pname = f"{'w2' if shard_id == 'w2' else 'w13'}_{name}"
        param = getattr(layer, pname)
        assert param.weight_loader(param, torch_tensor(value), pname, shard_id=shard_id,
                                   expert_id=expert, return_success=True)


def routing(rng, tokens, top_k, experts):
    ids = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)])
    weights = rng.uniform(0.05, 1.0, (tokens, top_k)).astype(np.float32)
    return torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(weights)


def run_moe(layer, x, ids, weights):
    return layer.quant_method.apply(layer, x, weights, ids, None, None)


@pytest.mark.parametrize("fmt", sorted(MOE_INT4_CONFIGS))
def test_int4_moe_layer(plugin, tp1, rng, fmt):
    experts, hidden, inter = 4, 64, 32
    layer = moe_layer(quant_config(plugin, MOE_INT4_CONFIGS[fmt]), experts, hidden, inter)
    gate_up, down = [], []
    for e in range(experts):
        ws = []
        for shard_id, (n, k) in (("w1", (inter, hidden)), ("w3", (inter, hidden)),
                                 ("w2", (hidden, inter))):
            tensors, w = int4_expert_tensors(rng, fmt, n, k)
            load_expert(layer, tensors, shard_id, e)
            ws.append(w)
        gate_up.append(np.concatenate(ws[:2]))
        down.append(ws[2])
    layer.quant_method.process_weights_after_loading(layer)
    assert not any(name.startswith(("w13_", "w2_")) for name, _ in layer.named_parameters())
    x = torch.from_numpy(rng.standard_normal((7, hidden)).astype(np.float32)).to(torch.bfloat16)
    ids, weights = routing(rng, 7, 2, experts)
    got = run_moe(layer, x, ids, weights)
    assert got.shape == x.shape and got.dtype == torch.bfloat16
    want, magnitude = moe_reference(x, ids, weights, np.stack(gate_up), np.stack(down), "silu")
    bound = assert_moe_close(got, want, magnitude)
    # The check can fail: gate and up swapped (the order vLLM's w13 holds) does not pass it.
    swapped, _ = moe_reference(x, ids, weights, np.stack([np.concatenate([g[inter:], g[:inter]])
                                                          for g in gate_up]), np.stack(down),
                               "silu")
    assert not bool(((got.to(torch.float64) - swapped).abs() <= bound).all())

    # Expert parallelism: with an expert map holding the even experts only, the odd experts'
    # choices contribute nothing.
    layer._expert_map = torch.tensor([0, -1, 2, -1], dtype=torch.int32)
    part = run_moe(layer, x, ids, weights)
    kept = weights * (ids % 2 == 0)
    want, magnitude = moe_reference(x, ids, kept, np.stack(gate_up), np.stack(down), "silu")
    assert_moe_close(part, want, magnitude)
    assert not torch.equal(part, got)


def test_warm_up_counts_cover_the_capture_sizes_and_the_powers_of_two():
    assert layout.warm_up_counts(40, [1, 2, 4, 8, 24, 48]) == (1, 2, 4, 8, 16, 24, 32, 40)
    assert layout.warm_up_counts(1, None) == (1,)
    assert layout.warm_up_counts(8192, []) == tuple(2**i for i in range(14))


def test_loaded_layers_register_their_jit_warm_up(plugin, tp1, rng, monkeypatch):
    """Each processed layer registers one QgemmLayerWarmup with the active warm-up registry
    (vLLM loads the model inside its runner's); vLLM's own warm-up then passes its config for
    the key (the scheduler's largest step, the capture sizes) and warms each layer up for it."""
    from vllm.model_executor.layers.linear import ColumnParallelLinear
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    calls = []
    monkeypatch.setattr(plugin, "warm_up_linear", lambda *args: calls.append(("linear", args)))
    monkeypatch.setattr(plugin, "warm_up_experts", lambda *args: calls.append(("moe", args)))
    registry = JitWarmupRegistry(tp1)
    with registry.activate():
        n, k = 64, 256
        tensors, _ = gptq_fixtures.gptq_tensors(rng, n, k, 4, 128, v1=True, act_order=False)
        linear = ColumnParallelLinear(k, n, bias=True, params_dtype=torch.bfloat16,
                                      quant_config=quant_config(plugin, GPTQ),
                                      prefix="model.layers.0.mlp.down_proj")
        load(linear, tensors)
        linear.quant_method.process_weights_after_loading(linear)
        experts, hidden, inter = 4, 64, 32
        moe = moe_layer(quant_config(plugin, MOE_INT4_CONFIGS["gptq"]), experts, hidden, inter)
        for e in range(experts):
            for shard_id, (rows, cols) in (("w1", (inter, hidden)), ("w3", (inter, hidden)),
                                           ("w2", (hidden, inter))):
                load_expert(moe, int4_expert_tensors(rng, "gptq", rows, cols)[0], shard_id, e)
        moe.quant_method.process_weights_after_loading(moe)
    assert len(registry) == 2 and calls == []
    registry.warmup()
    max_tokens = tp1.scheduler_config.max_num_batched_tokens
    counts = layout.warm_up_counts(max_tokens,
                                   tp1.compilation_config.cudagraph_capture_sizes)
    assert calls == [
        ("linear", (linear.qgemm_handle, max_tokens, torch.bfloat16, torch.device("cpu"), True)),
        ("moe", (moe, counts, 2, torch.bfloat16, torch.device("cpu")))]


def test_moe_loader_skips_other_ranks_experts(plugin, tp1, rng, monkeypatch):
    layer = moe_layer(quant_config(plugin, MOE_INT4_CONFIGS["gptq"]), 4, 64, 32)
    tensors, _ = int4_expert_tensors(rng, "gptq", 32, 64)
    monkeypatch.setattr(layer, "_map_global_expert_id_to_local_expert_id",
                        lambda e: -1 if e % 2 else e // 2)
    param = layer.w13_qweight
    before = param.data.clone()
    assert param.weight_loader(param, torch_tensor(tensors["qweight"]), "w13_qweight",
                               shard_id="w1", expert_id=3, return_success=True) is False
    assert torch.equal(param.data, before)
    assert param.weight_loader(param, torch_tensor(tensors["qweight"]), "w13_qweight",
                               shard_id="w1", expert_id=2, return_success=True)
    assert torch.equal(param.data[1, :, :32], torch_tensor(tensors["qweight"]))
    with pytest.raises(ValueError, match="w13_qweight.*neither"):
        param.weight_loader(param, torch_tensor(tensors["qweight"])[:, :20], "w13_qweight",
                            shard_id="w3", expert_id=0)


def test_gpt_oss_mxfp4_moe_layer(plugin, tp1, rng):
    """gpt-oss: every expert's MXFP4 blocks in one tensor, gate/up rows interleaved, biases,
    the clamped SwiGLU (vLLM's swigluoai), loaded as vLLM's gpt-oss loader passes them."""
    experts, hidden, inter = 4, 64, 32
    layer = moe_layer(quant_config(plugin, MXFP4), experts, hidden, inter,
                      activation="swigluoai", has_bias=True)

    b13, s13, w13 = gpt_oss_mxfp4(rng, experts, 2 * inter, hidden)
    b2, s2, w2 = gpt_oss_mxfp4(rng, experts, hidden, inter)
    bias13 = torch.from_numpy(rng.standard_normal((experts, 2 * inter)).astype(
        np.float32)).to(torch.bfloat16)
    bias2 = torch.from_numpy(rng.standard_normal((experts, hidden)).astype(
        np.float32)).to(torch.bfloat16)
    # vLLM's gpt-oss loader: blocks viewed [E, n, k / 2], one call for all experts.
    for name, value in (("w13_weight", torch.from_numpy(b13).view(experts, 2 * inter, -1)),
                        ("w13_weight_scale", torch.from_numpy(s13)), ("w13_bias", bias13),
                        ("w2_weight", torch.from_numpy(b2).view(experts, hidden, -1)),
                        ("w2_weight_scale", torch.from_numpy(s2)), ("w2_bias", bias2)):
        param = getattr(layer, name)
        param.weight_loader(param, value, weight_name=name, shard_id=None, expert_id=None)
    layer.quant_method.process_weights_after_loading(layer)
    assert str(layer.qgemm_experts.scheme).startswith("w=e2m1:g32:s=e8m0")
    x = torch.from_numpy(rng.standard_normal((9, hidden)).astype(np.float32)).to(torch.bfloat16)
    ids, weights = routing(rng, 9, 2, experts)
    got = run_moe(layer, x, ids, weights)
    gate_up = np.concatenate([w13[:, 0::2], w13[:, 1::2]], axis=1)  # gate rows, then up rows
    b = bias13.double().numpy()
    want, magnitude = moe_reference(x, ids, weights, gate_up, w2, "clamped-swiglu",
                                    np.concatenate([b[:, 0::2], b[:, 1::2]], axis=1),
                                    bias2.double().numpy())
    bound = assert_moe_close(got, want, magnitude)
    # The check can fail: the interleaved rows taken as they stand do not pass it.
    wrong, _ = moe_reference(x, ids, weights, w13, w2, "clamped-swiglu", b,
                             bias2.double().numpy())
    assert not bool(((got.to(torch.float64) - wrong).abs() <= bound).all())


def test_moe_model_configs_choose_qgemm(plugin, tmp_path):
    """A Qwen3-MoE-like GPTQ config and gpt-oss: vLLM's ModelConfig chooses qgemm, and the
    experts of each get QgemmMoEMethod (no longer refused)."""
    import json

    from vllm.config import ModelConfig

    qwen = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
            "num_hidden_layers": 1, "vocab_size": 512, "max_position_embeddings": 256,
            "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "norm_topk_prob": True, "torch_dtype": "bfloat16",
            "quantization_config": {**GPTQ, "modules_to_not_convert": ["mlp.gate"]}}
    (tmp_path / "config.json").write_text(json.dumps(qwen))
    config = ModelConfig(model=str(tmp_path), quantization="qgemm", skip_tokenizer_init=True,
                         dtype="bfloat16")
    assert config.quantization == "qgemm"
    (tmp_path / "oss").mkdir()
    gpt_oss = ModelConfig(model=tiny_model_dir(tmp_path / "oss", MXFP4, "gpt_oss"),
                          quantization="qgemm", skip_tokenizer_init=True, dtype="bfloat16")
    assert gpt_oss.quantization == "qgemm"
