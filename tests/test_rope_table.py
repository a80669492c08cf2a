"""foundation/rope_schemes.py's table against transformers' own RoPE functions (ROPE_INIT_FUNCTIONS, every scheme
and factor range) and against vLLM's formulas, written out here from vllm/model_executor/layers/rotary_embedding
(LinearScalingRotaryEmbedding, YaRNScalingRotaryEmbedding, DynamicNTKScalingRotaryEmbedding): each fact the table
states is what the two libraries compute."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from lpes.foundation.rope_schemes import SCHEMES

HEAD_DIM, THETA, TRAINED = 16, 10000.0, 256


def _config(rope_type: str, factor: float) -> LlamaConfig:
    parameters = {"rope_type": rope_type, "factor": factor, "rope_theta": THETA}
    if rope_type == "yarn":
        parameters["original_max_position_embeddings"] = TRAINED
    return LlamaConfig(hidden_size=HEAD_DIM * 2, num_attention_heads=2, num_key_value_heads=2, head_dim=HEAD_DIM,
                       max_position_embeddings=TRAINED, rope_parameters=parameters)


def _transformers(rope_type: str, factor: float, seq_len: int) -> tuple[torch.Tensor, float]:
    inv_freq, attention = ROPE_INIT_FUNCTIONS[rope_type](_config(rope_type, factor), "cpu", seq_len=seq_len)
    return inv_freq.double(), float(attention)


def _own() -> torch.Tensor:
    """The model's own RoPE frequencies (the independent reference: the formula itself)."""
    return 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)


def _vllm(rope_type: str, factor: float) -> tuple[torch.Tensor, float]:
    """What vLLM's cos/sin cache is built from: frequencies (per position, as positions / cache index) and the
    attention scale, at every length (its caches are static)."""
    own = _own()
    if rope_type == "linear":  # t / factor over the base frequencies
        return own / factor, 1.0
    if rope_type == "dynamic":  # one cache, the base grown for max_position_embeddings x factor
        longest = TRAINED * factor
        base = THETA * (factor * longest / TRAINED - (factor - 1)) ** (HEAD_DIM / (HEAD_DIM - 2))
        return 1.0 / base ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM), 1.0

    def correction_dim(rotations: float) -> float:
        return HEAD_DIM * math.log(TRAINED / (rotations * 2 * math.pi)) / (2 * math.log(THETA))

    low, high = max(math.floor(correction_dim(32)), 0), min(math.ceil(correction_dim(1)), HEAD_DIM - 1)
    ramp = ((torch.arange(HEAD_DIM // 2, dtype=torch.float64) - low) / (high - low if high != low else 0.001))
    keep = 1 - ramp.clamp(0, 1)  # 1: extrapolate (the model's own), 0: interpolate (/ factor)
    return own / factor * (1 - keep) + own * keep, 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


@pytest.mark.parametrize("rope_type", list(SCHEMES))
@pytest.mark.parametrize("factor", [1.0, 1.5, 4.0])
def test_each_fact_is_what_transformers_computes(rope_type, factor):
    facts = SCHEMES[rope_type]
    within, beyond, further = (_transformers(rope_type, factor, n) for n in (TRAINED, 2 * TRAINED, 4 * TRAINED))
    own = _own()

    def unscaled(result) -> bool:
        return torch.allclose(result[0], own, rtol=1e-6) and result[1] == pytest.approx(1.0)

    if factor == 1.0:
        assert unscaled(within) and unscaled(beyond) == facts.unscaled_at_factor_one
    else:
        assert unscaled(within) == facts.unscaled_within_trained
        assert not unscaled(beyond)
    assert (not torch.allclose(beyond[0], further[0])) == facts.length_dependent
    for seq_len in (TRAINED, 2 * TRAINED):
        assert facts.same_as_unscaled(factor, seq_len, TRAINED) == unscaled(_transformers(rope_type, factor, seq_len))


@pytest.mark.parametrize("rope_type", list(SCHEMES))
def test_transformers_warns_below_the_least_factor(rope_type, caplog):
    least = SCHEMES[rope_type].least_factor
    for factor, warns in ((least, False), (least * 0.75, True)):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            _config(rope_type, factor)
        assert any("factor" in r.getMessage() and ">= 1" in r.getMessage() for r in caplog.records) == warns


@pytest.mark.parametrize("rope_type", list(SCHEMES))
@pytest.mark.parametrize("factor", [1.5, 4.0])
def test_vllm_computes_the_same_exactly_where_the_table_says(rope_type, factor):
    """vLLM's static cache against transformers at every length up to the one vLLM builds its cache for."""
    theirs = _vllm(rope_type, factor)
    same = all(torch.allclose(theirs[0], got[0], rtol=1e-6) and theirs[1] == pytest.approx(got[1])
               for got in (_transformers(rope_type, factor, n) for n in (TRAINED // 2, TRAINED, 2 * TRAINED)))
    assert same == SCHEMES[rope_type].vllm_same
