"""The stock RoPE baselines (YaRN, dynamic NTK) are what transformers itself loads from a config.json.

`reference.use_stock_rope` swaps a loaded model's rotary module; the independent reference
is a second model loaded by plain `from_pretrained` from a folder whose config.json carries
`baseline_rope_parameters`. Their logits must agree past the trained length, for each
architecture shape (partial rotary, head_dim apart from hidden/heads). Dynamic NTK is
compared with a freshly loaded model per sequence: transformers' module otherwise keeps the
longest length it met, and the baseline must not depend on what was scored before it.
"""

import json

import pytest
import torch
from conftest import tiny_config, tiny_model_dir
from transformers import AutoModelForCausalLM

from lpes.converter.reference import apply, baseline_rope_parameters, stock_rope_unsupported, use_stock_rope
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import Spec, StockRope

TRAINED = 64  # max_position_embeddings of the test models: every sequence below is longer


def _model(folder):
    return AutoModelForCausalLM.from_pretrained(folder).eval()


def _with_rope_in_config(folder, tmp_path, rope: StockRope):
    """A copy of `folder` whose config.json sets `rope` as a user would: the independent reference."""
    out = tmp_path / f"{folder.name}-{rope.rope_type}"
    model = _model(folder)
    own = model.config.rope_parameters
    written = {"rope_type": rope.rope_type, "rope_theta": own["rope_theta"], "factor": rope.factor}
    if rope.rope_type == "yarn":  # YaRN's ramp is placed by the length the model was trained for
        written["original_max_position_embeddings"] = TRAINED
    if "partial_rotary_factor" in own:
        written["partial_rotary_factor"] = own["partial_rotary_factor"]
    assert baseline_rope_parameters(model.config, rope) == written
    model.config.rope_parameters = written
    if getattr(model.config, "head_dim", 0) is None:  # Mixtral: yarn/dynamic need it written out, as a user would
        model.config.head_dim = model.config.hidden_size // model.config.num_attention_heads
    model.save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["rope_parameters"]["rope_type"] == rope.rope_type
    return out


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _ids(length, seed=0):
    return torch.randint(4, 100, (1, length), generator=torch.Generator().manual_seed(seed))


# Partial rotary at half of an 8-wide head: dynamic NTK's exponent dim / (dim - 2) needs dim > 2.
PARTIAL = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}


@pytest.mark.parametrize("model_type, overrides",
                         [("llama", {}), ("qwen3", {}), ("stablelm", PARTIAL), ("mixtral", {})],
                         ids=["llama", "qwen3-head-dim", "stablelm-partial-rotary", "mixtral-head-dim-none"])
@pytest.mark.parametrize("rope", [StockRope("yarn", 2.5), StockRope("dynamic", 2.0)], ids=lambda r: r.rope_type)
def test_a_baseline_is_the_config_json_transformers_loads(tmp_path, model_type, overrides, rope):
    folder = tiny_model_dir(model_type, tmp_path, max_position_embeddings=TRAINED, **overrides)
    swapped = use_stock_rope(_model(folder), rope)
    stock = _with_rope_in_config(folder, tmp_path, rope)
    # Longest first: transformers' dynamic module would keep the first length for the second.
    for length, seed in ((200, 0), (130, 1)):
        ids = _ids(length, seed)
        reference = _logits(_model(stock), ids)  # loaded afresh per sequence
        assert torch.allclose(_logits(swapped, ids), reference, atol=1e-5, rtol=0)
        assert not torch.allclose(_logits(_model(folder), ids), reference, atol=1e-3)  # it is not the plain model


def test_a_reused_dynamic_model_in_transformers_does_depend_on_the_order(tmp_path):
    """Why the baseline restarts with every sequence: without it the second answer would differ."""
    folder = tiny_model_dir("llama", tmp_path, max_position_embeddings=TRAINED)
    stock = _with_rope_in_config(folder, tmp_path, StockRope("dynamic", 2.0))
    reused = _model(stock)
    _logits(reused, _ids(200))
    short = _ids(130, 1)
    assert not torch.allclose(_logits(reused, short), _logits(_model(stock), short), atol=1e-4)


def test_switching_back_restores_the_model_and_lpes_exactly(tmp_path):
    folder = tiny_model_dir("llama", tmp_path, max_position_embeddings=TRAINED)
    ids = _ids(150)
    model = _model(folder)
    plain = _logits(model, ids)
    spec = Spec.from_scales([1.0, 2.0, 3.0])
    lpes = _logits(apply(_model(folder), spec), ids)
    use_stock_rope(model, StockRope("yarn", 3.0))
    assert not torch.equal(_logits(model, ids), plain)
    assert torch.equal(_logits(use_stock_rope(model, None), ids), plain)
    use_stock_rope(model, StockRope("dynamic", 2.0))
    assert torch.equal(_logits(apply(model, spec), ids), lpes)  # the curve replaces the baseline
    use_stock_rope(model, StockRope("yarn", 2.0))
    assert len(model.model.layers[1]._forward_pre_hooks) == 0  # the curve's hooks are gone


def test_yarn_at_factor_one_is_the_plain_model(tmp_path):
    folder = tiny_model_dir("llama", tmp_path, max_position_embeddings=TRAINED)
    ids = _ids(150)
    assert torch.allclose(_logits(use_stock_rope(_model(folder), StockRope("yarn", 1.0)), ids),
                          _logits(_model(folder), ids), atol=1e-6, rtol=0)


@pytest.mark.parametrize("model_type, overrides, why", [
    ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}, "'linear'"),
    ("gemma3_text", {"head_dim": 8}, "one RoPE per layer type"),
    ("phi3", {}, "Phi3Config refuses rope_type 'yarn'"),  # transformers' own validation, asked not guessed
    # 2 rotated dims per head: NTK's exponent dim / (dim - 2) divides by zero in transformers; asked, not guessed.
    ("stablelm", {}, "dynamic RoPE fails on this config (ZeroDivisionError"),
])
def test_models_the_baselines_cannot_stand_in_for_say_why(tmp_path, model_type, overrides, why):
    yarn = StockRope("yarn", 2.0)
    rope_type = "dynamic" if "dynamic" in why else "yarn"
    assert why in stock_rope_unsupported(tiny_config(model_type, **overrides), rope_type)
    if model_type == "llama":
        folder = tiny_model_dir(model_type, tmp_path, **overrides)
        with pytest.raises(LpesError, match="no YaRN f=2 baseline"):
            use_stock_rope(_model(folder), yarn)
    assert stock_rope_unsupported(tiny_config("llama"), "yarn") is None
