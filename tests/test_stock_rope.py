"""A uniform curve is stock RoPE where that is exact: a Hub folder with no custom code.

Each composition rule of `hf_folder.compose_rope` is proved against the reference
(`reference.apply` on the stock base model): the written folder, loaded by plain
`AutoModelForCausalLM.from_pretrained(DIR)` without trust_remote_code, gives the
reference's logits within 1e-5 (float32), at lengths past the base's original context.
Where no stock type is exact the folder keeps the custom code and a plain load fails.
"""

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_model_dir
from transformers import AutoConfig, AutoModelForCausalLM

from lpes.converter.hf_folder import compose_rope, stock_rope_parameters, write_hf_folder
from lpes.converter.loading import resolve_for_spec
from lpes.converter.reference import apply
from lpes.foundation.spec import Spec


def uses_custom_code(folder: Path) -> bool:
    """The written Hub folder needs trust_remote_code (its config.json names LPES code in auto_map)."""
    return bool(json.loads((Path(folder) / "config.json").read_text()).get("auto_map"))


LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0 + k / 20 for k in range(4)],
            "long_factor": [2.0 + k / 10 for k in range(4)], "factor": 4.0, "original_max_position_embeddings": 64}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
DYNAMIC = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}


def write(tmp_path, base, scales):
    out = tmp_path / "out"
    out.mkdir()
    return write_hf_folder(resolve_for_spec(base, Spec.from_scales(scales)), out, "tiny", "test")


def max_logit_diff(base, out, scales, seq=200, trust_remote_code=False):
    ids = torch.randint(4, 100, (2, seq), generator=torch.Generator().manual_seed(0))
    reference = apply(AutoModelForCausalLM.from_pretrained(base).eval(), Spec.from_scales(scales))
    written = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=trust_remote_code).eval()
    with torch.no_grad():
        return (written(ids).logits - reference(ids).logits).abs().max().item()


@pytest.mark.parametrize(
    "model_type, overrides, scale, expected",
    [
        ("llama", {}, 2.5, {"rope_type": "linear", "factor": 2.5}),
        ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}, 1.5,
         {"rope_type": "linear", "factor": 3.0}),
        ("qwen3", {}, 3.0, {"rope_type": "linear", "factor": 3.0}),
        ("phi3", {"rope_parameters": LONGROPE, "original_max_position_embeddings": 64}, 2.0,
         {"rope_type": "longrope", "short_factor": [2.0, 2.1, 2.2, 2.3], "long_factor": [4.0, 4.2, 4.4, 4.6]}),
    ],
    ids=["default", "linear", "qwen3-default", "longrope"],
)
def test_uniform_scale_is_a_stock_config_equal_to_the_reference(tmp_path, model_type, overrides, scale, expected):
    base = tiny_model_dir(model_type, tmp_path, **overrides)
    written = write(tmp_path, base, [scale] * 3)
    assert written.stock_rope and "no custom code" in written.note
    out = written.path
    assert not uses_custom_code(out)
    assert not (out / "modeling_lpes.py").exists() and not (out / "lpes_rope.py").exists()
    data = json.loads((out / "config.json").read_text())
    assert data["model_type"] == model_type and "auto_map" not in data
    rope = AutoConfig.from_pretrained(out).rope_parameters
    for key, value in expected.items():
        assert rope[key] == pytest.approx(value), key
    # 200 positions: past longrope's original 64, so its long factors are the ones in use.
    assert max_logit_diff(base, out, [scale] * 3) <= 1e-5


def test_longrope_short_factors_too(tmp_path):
    base = tiny_model_dir("phi3", tmp_path, rope_parameters=LONGROPE, original_max_position_embeddings=64)
    out = write(tmp_path, base, [1.5] * 3).path
    assert max_logit_diff(base, out, [1.5] * 3, seq=40) <= 1e-5


def test_gemma3_one_scale_per_layer_type_is_stock(tmp_path):
    layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    base = tiny_model_dir("gemma3_text", tmp_path, head_dim=8, sliding_window=16, layer_types=layer_types)
    scales = [1.5, 4.0, 1.5]
    written = write(tmp_path, base, scales)
    assert written.stock_rope
    rope = AutoConfig.from_pretrained(written.path).rope_parameters
    assert rope["sliding_attention"]["rope_type"] == "linear" and rope["sliding_attention"]["factor"] == 1.5
    assert rope["full_attention"]["rope_type"] == "linear" and rope["full_attention"]["factor"] == 4.0
    assert max_logit_diff(base, written.path, scales) <= 1e-5


@pytest.mark.parametrize("variant", [YARN, LLAMA3, DYNAMIC], ids=lambda v: v["rope_type"])
def test_types_that_do_not_compose_keep_the_custom_code(tmp_path, variant):
    base = tiny_model_dir("llama", tmp_path, rope_parameters=variant)
    written = write(tmp_path, base, [2.0] * 3)
    assert not written.stock_rope and uses_custom_code(written.path)
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoModelForCausalLM.from_pretrained(written.path, trust_remote_code=False)
    assert max_logit_diff(base, written.path, [2.0] * 3, trust_remote_code=True) <= 1e-5


@pytest.mark.parametrize("variant", [YARN, LLAMA3], ids=lambda v: v["rope_type"])
def test_the_obvious_stock_candidate_is_not_exact(tmp_path, variant):
    """Why yarn and llama3 are refused: their factor times s is another RoPE than LPES's inv_freq / s."""
    base = tiny_model_dir("llama", tmp_path / "base", rope_parameters=variant)
    # Same seed, same weights; only the RoPE config differs.
    doubled = {**variant, "factor": variant["factor"] * 2}
    candidate = tiny_model_dir("llama", tmp_path / "candidate", rope_parameters=doubled)
    ids = torch.randint(4, 100, (1, 200), generator=torch.Generator().manual_seed(0))
    reference = apply(AutoModelForCausalLM.from_pretrained(base).eval(), Spec.from_scales([2.0] * 3))
    stock = AutoModelForCausalLM.from_pretrained(candidate).eval()
    with torch.no_grad():
        assert (stock(ids).logits - reference(ids).logits).abs().max().item() > 1e-3


def test_per_layer_curve_keeps_the_loud_failure(tmp_path):
    base = tiny_model_dir("llama", tmp_path)
    written = write(tmp_path, base, [2.0, 1.0, 3.0])
    assert not written.stock_rope and "trust_remote_code=True" in written.note
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoModelForCausalLM.from_pretrained(written.path, trust_remote_code=False)


def test_composition_rules():
    assert compose_rope({"rope_type": "default", "rope_theta": 1e4}, 1.0) == {"rope_type": "default", "rope_theta": 1e4}
    assert compose_rope({"rope_type": "linear", "factor": 2.0}, 4.0)["factor"] == 8.0
    for variant in (YARN, LLAMA3, DYNAMIC):
        assert compose_rope(variant, 2.0) is None
        assert compose_rope(variant, 1.0) == variant  # scale 1 leaves any RoPE as it is
    assert stock_rope_parameters({"rope_type": "default"}, [2.0, 2.0, 2.5], None) is None
    nested = {"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "default"}}
    types = ["sliding_attention", "full_attention", "sliding_attention"]
    assert stock_rope_parameters(nested, [2.0, 3.0, 2.5], types) is None
