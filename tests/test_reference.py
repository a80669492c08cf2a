"""The reference patch against computations that do not use lpes_rope or transformers' RoPE."""

import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from lpes.converter.reference import apply
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import Spec

SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)


def tiny(model_type: str, seed: int = 0, **overrides):
    config = AutoConfig.for_model(model_type, **{**SMALL, **overrides})
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def manual_llama_logits(model, ids: torch.Tensor, scales: list[float]) -> torch.Tensor:
    """A Llama forward written out by hand in float64, layer h rotating at positions i / s_h."""
    cfg = model.config
    w = {k: v.double() for k, v in model.state_dict().items()}
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    dim = cfg.hidden_size // heads
    seq = ids.shape[1]

    def rms(x, weight):
        return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)

    def rotate(x, positions):  # x: [seq, heads, dim]
        inv_freq = torch.tensor([cfg.rope_parameters["rope_theta"] ** (-2 * k / dim) for k in range(dim // 2)],
                                dtype=torch.float64)
        angle = positions[:, None, None] * inv_freq
        x1, x2 = x[..., : dim // 2], x[..., dim // 2:]
        return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], -1)

    h = w["model.embed_tokens.weight"][ids[0]]
    mask = torch.full((seq, seq), -math.inf, dtype=torch.float64).triu(1)
    for layer, scale in enumerate(scales):
        p = f"model.layers.{layer}."
        x = rms(h, w[p + "input_layernorm.weight"])
        positions = torch.arange(seq, dtype=torch.float64) / scale
        q = rotate((x @ w[p + "self_attn.q_proj.weight"].T).view(seq, heads, dim), positions)
        k = rotate((x @ w[p + "self_attn.k_proj.weight"].T).view(seq, kv_heads, dim), positions)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(seq, kv_heads, dim)
        k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(dim) + mask
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(seq, heads * dim)
        h = h + attn @ w[p + "self_attn.o_proj.weight"].T
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        gate = torch.nn.functional.silu(x @ w[p + "mlp.gate_proj.weight"].T)
        h = h + (gate * (x @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return rms(h, w["model.norm.weight"]) @ w["lm_head.weight"].T


@pytest.mark.parametrize("scales", [[1.0, 1.0, 1.0], [2.0, 1.0, 3.5], [0.5, 4.0, 1.25]])
def test_reference_matches_hand_written_llama(scales):
    model = tiny("llama")
    ids = torch.randint(0, 97, (1, 150), generator=torch.Generator().manual_seed(1))
    expected = manual_llama_logits(model, ids, scales)
    apply(model, Spec.from_scales(scales))
    with torch.no_grad():
        got = model(ids).logits[0].double()
    assert (got - expected).abs().max().item() < 1e-4


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral", "gemma2", "phi3", "stablelm", "qwen3"])
def test_uniform_scale_equals_linear_rope(model_type):
    """LPES with one scale s everywhere is linear position interpolation with factor s."""
    extra = {"partial_rotary_factor": 0.5} if model_type in ("phi3", "stablelm") else {}
    model = tiny(model_type, **extra)
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(2))
    linear = tiny(model_type, **extra)
    linear.config.rope_parameters = {**model.config.rope_parameters, "rope_type": "linear", "factor": 2.5}
    linear = AutoModelForCausalLM.from_config(linear.config).eval()
    linear.load_state_dict(model.state_dict())
    apply(model, Spec.from_scales([2.5] * 3))
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, linear(ids).logits, atol=1e-5, rtol=0)


ROPE_VARIANTS = [
    {"rope_type": "default"},
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 128},
    {"rope_type": "longrope", "factor": 4.0, "short_factor": [1.0] * 8, "long_factor": [2.0 + k / 10 for k in range(8)],
     "original_max_position_embeddings": 128},
]


def _record_layers(model) -> list[dict]:
    """Per decoder layer, filled on each forward: the (cos, sin) it computed with and its output.

    Forward hooks with kwargs see the kwargs as the pre-hooks left them, so this records
    the position embeddings after LPES's swap, whatever the hook order.
    """
    seen = [{} for _ in model.model.layers]

    def recorder(store):
        def hook(module, args, kwargs, out):
            store["cos_sin"] = kwargs["position_embeddings"]
            store["output"] = out[0] if isinstance(out, tuple) else out

        return hook

    for layer, store in zip(model.model.layers, seen):
        layer.register_forward_hook(recorder(store), with_kwargs=True)
    return seen


@pytest.mark.parametrize("variant", ROPE_VARIANTS, ids=lambda v: v["rope_type"])
def test_scale_one_is_bit_exact_and_other_scales_change_only_their_layers(variant):
    model = tiny("llama", rope_parameters={"rope_theta": 10000.0, **variant})
    ids = torch.randint(0, 97, (2, 300), generator=torch.Generator().manual_seed(3))
    seen = _record_layers(model)
    with torch.no_grad():
        base = model(ids).logits
        base_layers = [dict(layer) for layer in seen]
        apply(model, Spec.from_scales([1.0, 1.0, 1.0]))
        assert torch.equal(model(ids).logits, base)
        apply(model, Spec.from_scales([1.0, 3.0, 1.0]))
        scaled = model(ids).logits
    assert not torch.allclose(scaled, base, atol=1e-4)
    # Layers 0 and 2 keep the model's own cos/sin; layer 1 alone gets its scaled pair.
    for h in (0, 2):
        assert all(torch.equal(a, b) for a, b in zip(seen[h]["cos_sin"], base_layers[h]["cos_sin"]))
    assert not torch.allclose(seen[1]["cos_sin"][0], base_layers[1]["cos_sin"][0], atol=1e-4)
    # Layer 0 comes before the scaled layer: its output is unchanged, bit for bit; layer 1's is not.
    assert torch.equal(seen[0]["output"], base_layers[0]["output"])
    assert not torch.allclose(seen[1]["output"], base_layers[1]["output"], atol=1e-4)


def test_variant_attention_scaling_is_kept_and_frequencies_divided():
    """yarn: layer cos/sin must be cos(i * inv_freq_yarn / s) * yarn's attention factor."""
    model = tiny("llama", rope_parameters={"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0,
                                           "original_max_position_embeddings": 128})
    rotary = model.model.rotary_emb
    inv_freq, factor = rotary.inv_freq.clone(), rotary.attention_scaling
    assert factor != 1.0
    seen = {}
    apply(model, Spec.from_scales([1.0, 2.0, 1.0]))
    # Registered after the patch, so it runs after the LPES hook and sees the layer's own cos.
    model.model.layers[1].register_forward_pre_hook(
        lambda m, a, kw: seen.__setitem__("cos", kw["position_embeddings"][0]), with_kwargs=True)
    with torch.no_grad():
        model(torch.arange(10)[None])
    angles = torch.arange(10, dtype=torch.float64)[:, None] * inv_freq.double() / 2.0
    expected = torch.cat([angles, angles], -1).cos() * factor
    assert torch.allclose(seen["cos"][0].double(), expected, atol=1e-6)


def test_gemma3_per_layer_type_rope():
    model = tiny("gemma3_text", num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2,
                 sliding_window=16, head_dim=16)
    ids = torch.randint(0, 97, (1, 60), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        base = model(ids).logits
        apply(model, Spec.from_scales([1.0] * 4))
        assert torch.equal(model(ids).logits, base)
        apply(model, Spec.from_scales([1.0, 1.0, 1.0, 2.0]))
        assert not torch.allclose(model(ids).logits, base, atol=1e-4)
    assert set(model.model.rotary_emb.per_scale) == {("full_attention", 2.0)}


def test_cos_sin_computed_once_per_distinct_scale():
    model = tiny("llama", num_hidden_layers=4)
    apply(model, Spec.from_scales([2.0, 2.0, 1.0, 3.0]))
    with torch.no_grad():
        model(torch.arange(5)[None])
    assert set(model.model.rotary_emb.per_scale) == {(None, 2.0), (None, 3.0)}
    hooked = [len(layer._lpes_hooks) for layer in model.model.layers]
    assert hooked == [1, 1, 0, 1]


def test_wrong_layer_count_and_non_rope_model():
    with pytest.raises(LpesError, match="3 entries but the model has 4 layers"):
        apply(tiny("llama", num_hidden_layers=4), Spec.from_scales([1, 2, 3]))
    gpt2 = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", n_layer=2, n_embd=32, n_head=2))
    with pytest.raises(LpesError, match="no RoPE"):
        apply(gpt2, Spec.from_scales([1, 2]))
