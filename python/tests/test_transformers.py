"""qgemm.quantize_model on an HF transformers model built from a config (random weights, no
download), on the CPU operator: every projection but lm_head replaced, logits close to the float
model's. Skipped where torch or transformers is not installed."""

import pytest

import qgemm

torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")


def tiny_llama(seed, tie_word_embeddings=False):
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=tie_word_embeddings)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantized_llama_keeps_its_logits(rng, dtype):
    model = tiny_llama(int(rng.integers(2**31))).to(dtype)
    ids = torch.from_numpy(rng.integers(0, 256, size=(2, 9)))
    with torch.no_grad():
        reference = model(ids).logits.float()
    qgemm.quantize_model(model, "w8a16", ignore=("lm_head",))
    names = {name for name, m in model.named_modules() if isinstance(m, qgemm.nn.QuantLinear)}
    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert names == {f"model.layers.{i}.{kind}.{p}" for i in (0, 1)
                     for kind, ps in (("self_attn", projections[:4]), ("mlp", projections[4:]))
                     for p in ps}
    assert type(model.lm_head) is torch.nn.Linear
    with torch.no_grad():
        got = model(ids).logits.float()
    assert got.dtype == reference.dtype and got.shape == reference.shape
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), reference.flatten(), dim=0)
    # 8-bit weights: the logits move by well under a percent of their size.
    assert cosine > 0.999, cosine
    # And greedy decoding runs through the quantized layers.
    # min_new_tokens: a random tiny model may pick its end-of-sequence token (which stopped a
    # CI run after one token).
    out = model.generate(ids[:1], attention_mask=torch.ones_like(ids[:1]), max_new_tokens=3,
                         min_new_tokens=3, do_sample=False)
    assert out.shape == (1, 12)


def tiny_qwen3_moe(seed):
    config = transformers.Qwen3MoeConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                         moe_intermediate_size=32, num_experts=8,
                                         num_experts_per_tok=2, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         head_dim=16, max_position_embeddings=64,
                                         decoder_sparse_step=1, mlp_only_layers=[])
    torch.manual_seed(seed)
    return transformers.Qwen3MoeForCausalLM(config).eval()


def test_quantized_moe_model_replaces_its_experts_and_keeps_its_logits(rng):
    """A Qwen3-MoE model: every fused experts module becomes a QuantMoE (the routers stay
    float), every projection a QuantLinear, and the logits stay close to the float model's."""
    model = tiny_qwen3_moe(int(rng.integers(2**31))).to(torch.bfloat16)
    ids = torch.from_numpy(rng.integers(0, 256, size=(2, 7)))
    with torch.no_grad():
        reference = model(ids).logits.float()
    qgemm.quantize_model(model, "w8a16", ignore=("lm_head",))
    experts = {name for name, m in model.named_modules() if isinstance(m, qgemm.nn.QuantMoE)}
    assert experts == {f"model.layers.{i}.mlp.experts" for i in (0, 1)}
    assert all(not isinstance(m, qgemm.nn.QuantLinear) for name, m in model.named_modules()
               if name.endswith("mlp.gate"))
    with torch.no_grad():
        got = model(ids).logits.float()
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), reference.flatten(), dim=0)
    assert cosine > 0.995, cosine
    # A model whose experts are left alone (ignored by name) keeps its float experts.
    other = tiny_qwen3_moe(1).to(torch.bfloat16)
    qgemm.quantize_model(other, "w8a16", ignore=("lm_head", "experts"))
    assert not any(isinstance(m, qgemm.nn.QuantMoE) for m in other.modules())


def write_gptq_checkpoint(model, directory, group=32, desc_act=False, rng=None):
    """The model as AutoGPTQ lays a 4-bit GPTQ v1 checkpoint out (see test_checkpoint.py's
    writers): every decoder projection round-to-nearest with a min/max zero point per group of
    `group` inputs, qweight packed along K, qzeros along N storing z − 1, fp16 scales, g_idx
    (shuffled when desc_act); everything else as it is. Returns the dequantized weights
    (q − z) · s by layer name: what the loaded model must compute with."""
    import json

    import numpy as np
    from safetensors.torch import save_file
    from test_checkpoint import pack_words_along_rows

    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    dequantized = {}
    for name, module in model.named_modules():
        if type(module) is not torch.nn.Linear or name == "lm_head":
            continue
        w = module.weight.detach().double().numpy().T  # [k, n], GPTQ's orientation
        k, n = w.shape
        g_idx = np.arange(k) // group
        if desc_act:
            g_idx = g_idx[rng.permutation(k)]
        lo = np.stack([w[g_idx == g].min(axis=0) for g in range(k // group)])
        hi = np.stack([w[g_idx == g].max(axis=0) for g in range(k // group)])
        s = ((hi - lo) / 15).astype(np.float16)
        s = np.where(s == 0, np.float16(1e-3), s)
        z = np.clip(np.round(-lo / s.astype(np.float64)), 0, 15).astype(np.int64)
        q = np.clip(np.round(w / s[g_idx].astype(np.float64)) + z[g_idx], 0, 15).astype(np.int64)
        del tensors[f"{name}.weight"]
        tensors[f"{name}.qweight"] = torch.from_numpy(pack_words_along_rows(q, 4))
        tensors[f"{name}.qzeros"] = torch.from_numpy(
            pack_words_along_rows(((z - 1) & 15).T, 4).T.copy())
        tensors[f"{name}.scales"] = torch.from_numpy(s)
        tensors[f"{name}.g_idx"] = torch.from_numpy(g_idx.astype(np.int32))
        dequantized[name] = ((q - z[g_idx]) * s[g_idx].astype(np.float64)).T
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(directory / "model.safetensors"))
    config = model.config.to_dict()
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group,
                                     "desc_act": desc_act, "sym": False}
    (directory / "config.json").write_text(json.dumps(config, default=str))
    return dequantized


@pytest.mark.parametrize("desc_act, tied", [(False, False), (True, True)])
def test_load_quantized_builds_the_checkpoints_model(rng, tmp_path, desc_act, tied):
    pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    model = tiny_llama(int(rng.integers(2**31)), tie_word_embeddings=tied).to(torch.float16)
    dequantized = write_gptq_checkpoint(model, tmp_path, desc_act=desc_act, rng=rng)
    # The expected model: the source with each projection's weight set to its checkpoint
    # values, in float32 (its output rounding aside from the fp16 path's).
    expected_model = tiny_llama(0, tie_word_embeddings=tied)
    expected_model.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    with torch.no_grad():
        for name, w in dequantized.items():
            expected_model.get_submodule(name).weight.copy_(torch.from_numpy(w))

    loaded = qgemm.load_quantized(str(tmp_path))
    kinds = {name: type(m).__name__ for name, m in loaded.named_modules()}
    assert all(kinds[name] == "QuantLinear" for name in dequantized)
    assert kinds["lm_head"] == "Linear"
    assert (loaded.lm_head.weight.data_ptr() ==
            loaded.model.embed_tokens.weight.data_ptr()) == tied
    assert next(loaded.parameters()).dtype == torch.float16
    for name, w in dequantized.items():
        layer = loaded.get_submodule(name)
        assert (layer.input_permutation is not None) == desc_act
        # Its weight is the checkpoint's (in the kernel's K order where desc_act permuted it).
        permuted = w if layer.input_permutation is None else \
            w[:, layer.input_permutation.numpy()]
        assert (qgemm.dequantize_weight(layer.qweight.packed) == permuted).all()

    ids = torch.from_numpy(rng.integers(0, 256, size=(2, 7)))
    with torch.no_grad():
        got = loaded(ids).logits.float()
        expected = expected_model(ids).logits
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), expected.flatten(), dim=0)
    assert cosine > 0.9999, cosine  # the fp16 path's roundings only


def test_load_quantized_names_what_does_not_fit(rng, tmp_path):
    pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    model = tiny_llama(int(rng.integers(2**31))).to(torch.float16)
    write_gptq_checkpoint(model, tmp_path)
    other = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(qgemm.Error, match="model.layers.1.*is not in the model"):
        qgemm.load_quantized(str(tmp_path), other)
    from safetensors.torch import save_file

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((tmp_path / "config.json").read_text())
    save_file({"x": torch.ones(2)}, str(empty / "model.safetensors"))
    with pytest.raises(qgemm.Error, match="no quantized layer"):
        qgemm.load_quantized(str(empty), model)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")
@pytest.mark.parametrize("desc_act", [False, True])
def test_a_loaded_checkpoint_runs_on_the_gpu_as_on_the_cpu(rng, tmp_path, desc_act):
    pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    model = tiny_llama(int(rng.integers(2**31))).to(torch.float16)
    write_gptq_checkpoint(model, tmp_path, desc_act=desc_act, rng=rng)
    loaded = qgemm.load_quantized(str(tmp_path))
    ids = torch.from_numpy(rng.integers(0, 256, size=(3, 11)))
    with torch.no_grad():
        on_cpu = loaded(ids).logits.float()
        loaded.to("cuda")
        on_gpu = loaded(ids.cuda()).logits.float().cpu()
    cosine = torch.nn.functional.cosine_similarity(on_gpu.flatten(), on_cpu.flatten(), dim=0)
    assert cosine > 0.9999, cosine  # fp16 roundings in another order only
    assert (on_gpu.argmax(-1) == on_cpu.argmax(-1)).float().mean() > 0.9


E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0,
               -6.0]


def mxfp4_tensors(rng, experts, n, k):
    """gpt-oss MXFP4 storage of random experts (transformers integrations/mxfp4.py's layout: two
    e2m1 codes a byte, the even element in the low nibble; one e8m0 scale per 32) and their
    values [E, n, k]."""
    import numpy as np
    blocks = rng.integers(0, 256, size=(experts, n, k // 32, 16)).astype(np.uint8)
    scales = rng.integers(121, 126, size=(experts, n, k // 32)).astype(np.uint8)
    flat = blocks.reshape(experts, n, k // 2).astype(np.int64)
    codes = np.empty((experts, n, k), np.int64)
    codes[..., 0::2], codes[..., 1::2] = flat & 15, flat >> 4
    values = np.array(E2M1_VALUES)[codes] * 2.0 ** (np.repeat(scales, 32, -1).astype(np.int64) - 127)
    return blocks, scales, values


def test_load_quantized_builds_gpt_oss_with_mxfp4_experts(rng, tmp_path):
    """A gpt-oss-shaped checkpoint (two layers, 4 experts of 64 x 64, biases) stored as gpt-oss
    stores MXFP4: every experts module becomes a QuantMoE (clamped SwiGLU, gate/up
    de-interleaved, biases alike), and the logits match transformers' own GptOssExperts holding
    the same (exactly bf16) values."""
    import json

    import numpy as np
    safetensors_torch = pytest.importorskip("safetensors.torch",
                                            reason="safetensors is not installed")
    config = transformers.GptOssConfig(vocab_size=128, hidden_size=64, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=32, num_local_experts=4,
                                       num_experts_per_tok=2, max_position_embeddings=64,
                                       sliding_window=8,
                                       layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(int(rng.integers(2**31)))
    model = transformers.GptOssForCausalLM(config).to(torch.bfloat16).eval()
    tensors = {}
    for layer in range(2):
        prefix = f"model.layers.{layer}.mlp.experts"
        experts = model.get_submodule(prefix)
        gate_up_blocks, gate_up_scales, gate_up = mxfp4_tensors(rng, 4, 128, 64)
        down_blocks, down_scales, down = mxfp4_tensors(rng, 4, 64, 64)
        gate_up_bias = rng.standard_normal((4, 128)).astype(np.float32) / 4
        down_bias = rng.standard_normal((4, 64)).astype(np.float32) / 4
        with torch.no_grad():  # transformers keeps them [E, in, out]
            experts.gate_up_proj.copy_(torch.from_numpy(gate_up.transpose(0, 2, 1)))
            experts.down_proj.copy_(torch.from_numpy(down.transpose(0, 2, 1)))
            experts.gate_up_proj_bias.copy_(torch.from_numpy(gate_up_bias))
            experts.down_proj_bias.copy_(torch.from_numpy(down_bias))
        for name, array in (("gate_up_proj_blocks", gate_up_blocks),
                            ("gate_up_proj_scales", gate_up_scales),
                            ("down_proj_blocks", down_blocks), ("down_proj_scales", down_scales)):
            tensors[f"{prefix}.{name}"] = torch.from_numpy(array)
        for name in ("gate_up_proj_bias", "down_proj_bias"):
            tensors[f"{prefix}.{name}"] = getattr(experts, name).detach().float().clone()
    for name, value in model.state_dict().items():
        if ".mlp.experts." not in name:
            tensors[name] = value.clone()
    safetensors_torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    stored = model.config.to_dict()
    stored["quantization_config"] = {"quant_method": "mxfp4",
                                     "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                "model.layers.*.mlp.router",
                                                                "model.embed_tokens", "lm_head"]}
    (tmp_path / "config.json").write_text(json.dumps(stored, default=str))

    loaded = qgemm.load_quantized(str(tmp_path), dtype=torch.bfloat16)
    for layer in range(2):
        moe = loaded.get_submodule(f"model.layers.{layer}.mlp.experts")
        assert type(moe).__name__ == "QuantMoE" and moe.activation == "clamped-swiglu"
        assert (moe.experts.experts, moe.experts.hidden, moe.experts.intermediate) == (4, 64, 64)
        # transformers' own experts module holds the alpha (not every version's config does).
        reference = model.get_submodule(f"model.layers.{layer}.mlp.experts")
        assert moe.alpha == pytest.approx(float(reference.alpha))
    ids = torch.from_numpy(rng.integers(0, 128, size=(2, 7)))
    with torch.no_grad():
        got = loaded(ids).logits.float()
        expected = model(ids).logits.float()
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), expected.flatten(), dim=0)
    assert cosine > 0.999, cosine  # bf16 roundings in another order only
    agree = (got.argmax(-1) == expected.argmax(-1)).float().mean()
    assert agree >= 0.85, agree
