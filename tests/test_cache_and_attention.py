"""The search runner's cache and attention (validation/cache_and_attention.py) against transformers' own: the same
logits to the bit, on a tiny grouped-query Llama (4 query heads, 2 key/value heads) with padded rows."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model_dir
from transformers import AutoModelForCausalLM, DynamicCache

from lpes.validation import cache_and_attention
from lpes.validation.cache_and_attention import GROUPED_SDPA, grouped_attention, growing_cache


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tiny_model_dir("llama", tmp_path_factory.mktemp("attention"))
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # grouped
    return model


def padded_batch(rows: int = 3, width: int = 24):
    torch.manual_seed(0)
    ids = torch.randint(4, 100, (rows, width))
    mask = torch.ones_like(ids)
    for row in range(rows):
        mask[row, : 5 * row] = 0  # left padding: transformers passes a mask, and copies the heads out
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0)


def passes(model, cache, ids, mask, positions, steps=(16, 3, 2, 3), start=0):
    """The logits of a prefill of `steps[0]` positions from `start`, then of passes of the next steps' widths
    (drafted rounds), each over the cache so far."""
    out = []
    with torch.inference_mode():
        for width in steps:
            stop = start + width
            out.append(model(input_ids=ids[:, start:stop], attention_mask=mask[:, :stop],
                             position_ids=positions[:, start:stop], past_key_values=cache, use_cache=True).logits)
            start = stop
    return out


def test_grouped_attention_computes_what_transformers_sdpa_does(model, monkeypatch):
    batch = padded_batch()
    expected = passes(model, DynamicCache(), *batch)
    grouped = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: (grouped.append(k.get("enable_gqa", False)), sdpa(*a, **k))[1])
    with grouped_attention(model):
        assert model.config._attn_implementation == GROUPED_SDPA
        got = passes(model, DynamicCache(), *batch)
    assert model.config._attn_implementation == "sdpa"
    assert all(grouped) and len(grouped) == model.config.num_hidden_layers * 4  # every layer, every pass, grouped
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_grouped_attention_leaves_other_implementations_alone(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama", tmp_path), attn_implementation="eager")
    with grouped_attention(model):
        assert model.config._attn_implementation == "eager"


def test_a_growing_cache_holds_what_a_dynamic_one_does(model, monkeypatch):
    """Past its room (a few slots here), then after dropping rows: the same logits and the same keys and values."""
    monkeypatch.setattr(cache_and_attention, "ROOM", 1)
    ids, mask, positions = padded_batch(rows=4, width=30)
    dynamic, growing = DynamicCache(), growing_cache()
    first = [passes(model, cache, ids, mask, positions) for cache in (dynamic, growing)]  # 24 positions
    assert all(torch.equal(a, b) for a, b in zip(*first))
    assert any(layer.buffers[0].shape[-2] > layer.keys.shape[-2] for layer in growing.layers)  # room to spare
    keep = torch.tensor([0, 2, 3])
    for cache in (dynamic, growing):
        cache.batch_select_indices(keep)
    after = [passes(model, cache, ids[keep], mask[keep], positions[keep], steps=(3, 3), start=24)
             for cache in (dynamic, growing)]
    assert all(torch.equal(a, b) for a, b in zip(*after))
    for mine, theirs in zip(growing.layers, dynamic.layers):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)


def test_a_growing_cache_starts_from_given_keys_and_values():
    keys, values = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    cache = growing_cache([(keys, values), (keys + 1, values + 1)])
    assert cache.get_seq_length() == 5
    assert torch.equal(cache.layers[1].keys, keys + 1) and torch.equal(cache.layers[0].values, values)
