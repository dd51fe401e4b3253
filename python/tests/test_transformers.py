"""qgemm.quantize_model on an HF transformers model built from a config (random weights, no
download), on the CPU operator: every projection but lm_head replaced, logits close to the float
model's. Skipped where torch or transformers is not installed."""

import pytest

import qgemm

torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")


def tiny_llama(seed):
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
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
    out = model.generate(ids[:1], attention_mask=torch.ones_like(ids[:1]), max_new_tokens=3,
                         do_sample=False)
    assert out.shape == (1, 12)
