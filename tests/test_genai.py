"""`--to genai`: onnxruntime-genai packages with one RoPE cache per layer scale.

The reference is transformers itself, patched by `converter.reference.apply`, decoded
by a plain argmax loop over full forward passes (no KV cache), so neither the
runtime's cache handling nor transformers' `generate` is trusted on either side.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import plain_greedy, tiny_model_dir
from onnx import numpy_helper

pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (pip install 'lpes[genai]')")

from lpes.converter.loading import resolve_for_spec  # noqa: E402
from lpes.converter.reference import apply  # noqa: E402
from lpes.exporters.genai import rope as genai_rope  # noqa: E402
from lpes.exporters.genai.package import check_genai, export_genai  # noqa: E402
from lpes.exporters.genai.runner import GenaiGreedy  # noqa: E402
from lpes.foundation.errors import LpesError  # noqa: E402
from lpes.foundation.spec import Spec, load_spec  # noqa: E402

PROMPT = [1] + list(range(5, 45))  # 41 positions, so the scales move real angles
NEW_TOKENS = 32
SCALES = (4.0, 1.0, 2.0)

# The tiny shapes onnxruntime's CPU kernels accept: head_dim 16 (a multiple of 16),
# rotary half-width a multiple of 8; phi3 rotates half of a 32-wide head.
GENAI_SHAPES = {
    "llama": {"hidden_size": 64},
    "qwen2": {"hidden_size": 64},
    "mistral": {"hidden_size": 64, "sliding_window": None},
    "phi3": {"hidden_size": 128, "original_max_position_embeddings": 512},
    "qwen3": {"hidden_size": 64, "head_dim": 16},
}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    # On a small shared CPU more threads only contend: a tiny forward then takes 0.3 s, not 3 ms.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def genai_model_dir(model_type: str, root: Path, **overrides) -> Path:
    return tiny_model_dir(model_type, root, **{**GENAI_SHAPES[model_type], **overrides})


def torch_greedy(model_dir: Path, spec: Spec | None, prompt: list[int], steps: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    if spec is not None:
        apply(model, spec)
    return plain_greedy(model, prompt, steps)


def genai_greedy(package: Path, prompt: list[int] = PROMPT, eos_token_id: int | None = None) -> list[int]:
    return GenaiGreedy(package).greedy([prompt], NEW_TOKENS, eos_token_id)[0]


@pytest.fixture(scope="module")
def llama_builds(tmp_path_factory):
    """A tiny llama, its package with scales (3, 1, 3), and its unscaled package."""
    root = tmp_path_factory.mktemp("genai-llama")
    model_dir = genai_model_dir("llama", root)
    scaled = export_genai(resolve_for_spec(model_dir, Spec.from_scales([3.0, 1.0, 3.0])), root / "scaled")
    unscaled = export_genai(resolve_for_spec(model_dir, Spec.from_scales([1.0, 1.0, 1.0])), root / "unscaled")
    return model_dir, scaled, unscaled


@pytest.mark.parametrize("model_type", sorted(GENAI_SHAPES))
def test_genai_generates_the_reference_tokens(model_type, tmp_path):
    model_dir = genai_model_dir(model_type, tmp_path)
    spec = Spec.from_scales(SCALES)
    package = export_genai(resolve_for_spec(model_dir, spec), tmp_path / "genai")
    assert genai_greedy(package) == torch_greedy(model_dir, spec, PROMPT, NEW_TOKENS)
    assert {"genai_config.json", "tokenizer.json", "model.onnx", "model.onnx.data"} <= {
        p.name for p in package.iterdir()
    }
    assert load_spec(package / "lpes_spec.json").scales == SCALES
    assert not (package / ".lpes-genai-build").exists()


def _rope_inputs(package: Path) -> tuple[dict[int, tuple[str, str]], dict[str, np.ndarray]]:
    """Layer -> (cos, sin) initializer names its attention node reads; and the initializers."""
    graph = onnx.load(package / "model.onnx").graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    layers = {}
    for node in graph.node:
        if node.op_type == "GroupQueryAttention":
            layer = int(node.name.split("/")[2].removeprefix("layers."))
            layers[layer] = (node.input[7], node.input[8])
    return layers, inits


def _expected_cache(model_dir: Path, length: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of position * inv_freq / s, from the config alone (default RoPE)."""
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config["head_dim"]
    theta = config["rope_parameters"]["rope_theta"]
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(length, dtype=np.float64)[:, None] * (inv_freq / scale)[None]
    return np.cos(angles), np.sin(angles)


def test_each_scale_has_its_own_cache_shared_by_its_layers(llama_builds):
    model_dir, scaled, unscaled = llama_builds
    layers, inits = _rope_inputs(scaled)
    assert sorted(layers) == [0, 1, 2]
    assert layers[0] == layers[2]  # same scale, one shared pair
    assert layers[0][0] != layers[1][0] and layers[0][1] != layers[1][1]
    for layer, scale in ((0, 3.0), (1, 1.0)):
        cos_name, sin_name = layers[layer]
        cos, sin = _expected_cache(model_dir, inits[cos_name].shape[0], scale)
        # float64 here, float32 angles of up to ~500 rad in the package: ~3e-5 apart at most.
        np.testing.assert_allclose(inits[cos_name], cos, atol=1e-4)
        np.testing.assert_allclose(inits[sin_name], sin, atol=1e-4)
    assert json.loads(onnx.load(scaled / "model.onnx").metadata_props[0].value) == [3.0, 1.0, 3.0]

    unscaled_layers, _ = _rope_inputs(unscaled)
    assert set(unscaled_layers.values()) == {("cos_cache", "sin_cache")}


def test_scaled_package_generates_differently_from_unscaled(llama_builds):
    model_dir, scaled, unscaled = llama_builds
    scaled_tokens, unscaled_tokens = genai_greedy(scaled), genai_greedy(unscaled)
    assert scaled_tokens != unscaled_tokens
    assert unscaled_tokens == torch_greedy(model_dir, None, PROMPT, NEW_TOKENS)


def test_a_layer_scaled_everywhere_drops_the_builders_cache(tmp_path):
    model_dir = genai_model_dir("llama", tmp_path)
    package = export_genai(resolve_for_spec(model_dir, Spec.from_scales([2.0, 2.0, 2.0])), tmp_path / "genai")
    layers, inits = _rope_inputs(package)
    assert len(set(layers.values())) == 1
    assert "cos_cache" not in inits and "sin_cache" not in inits


def test_per_layer_yarn_package_generates_the_reference_tokens_with_yarns_own_caches(tmp_path):
    """Each scaled layer reads YaRN's cos/sin at its factor (attention factor included), as transformers'
    own rotary module computes them from a config.json that says yarn; layer 1 (factor 1) the builder's."""
    from transformers import AutoModelForCausalLM

    from lpes.foundation.spec import RopeScheme

    model_dir = genai_model_dir("llama", tmp_path)
    spec = Spec.from_scales(SCALES, rope=RopeScheme("yarn"))
    package = export_genai(resolve_for_spec(model_dir, spec), tmp_path / "genai")
    assert genai_greedy(package) == torch_greedy(model_dir, spec, PROMPT, NEW_TOKENS)
    assert load_spec(package / "lpes_spec.json") == spec
    layers, inits = _rope_inputs(package)
    assert layers[1] == ("cos_cache", "sin_cache")
    for layer, factor in ((0, 4.0), (2, 2.0)):
        config = json.loads((model_dir / "config.json").read_text())
        config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": config["rope_parameters"]["rope_theta"],
                                     "factor": factor,
                                     "original_max_position_embeddings": config["max_position_embeddings"]}
        stock_dir = tmp_path / f"yarn-{factor:g}"
        shutil.copytree(model_dir, stock_dir)
        (stock_dir / "config.json").write_text(json.dumps(config))
        rotary = AutoModelForCausalLM.from_pretrained(stock_dir).model.rotary_emb
        cos_name, sin_name = layers[layer]
        with torch.no_grad():
            cos, sin = rotary(torch.zeros(1), torch.arange(inits[cos_name].shape[0])[None])
        half = cos.shape[-1] // 2
        np.testing.assert_allclose(inits[cos_name], cos[0, :, :half].numpy(), atol=1e-6, rtol=0)
        np.testing.assert_allclose(inits[sin_name], sin[0, :, :half].numpy(), atol=1e-6, rtol=0)
        linear, _ = _expected_cache(model_dir, inits[cos_name].shape[0], factor)
        assert np.abs(inits[cos_name] - linear).max() > 1e-2  # not the linear scale's cache


def test_per_layer_dynamic_ntk_is_refused_in_one_line(tmp_path):
    from lpes.foundation.spec import RopeScheme

    model_dir = genai_model_dir("llama", tmp_path)
    with pytest.raises(LpesError, match="cannot run per-layer dynamic NTK .*fixed cos/sin caches") as info:
        check_genai(resolve_for_spec(model_dir, Spec.from_scales(SCALES, rope=RopeScheme("dynamic"))))
    assert "\n" not in str(info.value)


def test_runner_goes_past_the_packages_own_eos(llama_builds, tmp_path):
    """The runtime stops at genai_config's EOS and drops it; eos_token_id=None must not."""
    _, scaled, _ = llama_builds
    expected = genai_greedy(scaled)
    eos = expected[3]
    package = Path(shutil.copytree(scaled, tmp_path / "eos"))
    config = json.loads((package / "genai_config.json").read_text())
    config["model"]["eos_token_id"] = eos
    (package / "genai_config.json").write_text(json.dumps(config))
    assert genai_greedy(package) == expected
    assert genai_greedy(package, eos_token_id=eos) == expected[: expected.index(eos) + 1]


def test_builder_cache_check_rejects_another_rope(llama_builds):
    import onnx_ir as ir
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    model_dir, scaled, _ = llama_builds
    model = ir.load(scaled / "model.onnx")
    length = genai_rope.builder_caches(model)[0].shape[0]
    config = AutoConfig.from_pretrained(model_dir)
    genai_rope.check_builder_cache(model, genai_rope.model_cache(LlamaRotaryEmbedding(config), length), "default")
    config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(LpesError, match="not the model's own 'linear' RoPE"):
        genai_rope.check_builder_cache(model, genai_rope.model_cache(LlamaRotaryEmbedding(config), length), "linear")


# Each case: (model_type, tiny-model overrides, check_genai options, words the message must contain).
REFUSED = {
    "no builder class": ("gemma2", {"hidden_size": 64}, {}, "does not support model type 'gemma2'"),
    "llama linear RoPE": (
        "llama", {"hidden_size": 64, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
        {}, "not 'linear'",
    ),
    "sliding window": ("mistral", {"hidden_size": 64}, {}, "sliding_window=16"),
    "MLP as wide as the vocabulary": ("llama", {"hidden_size": 64, "intermediate_size": 100}, {}, "as the LM head"),
    "phi3 read as LongRoPE": ("phi3", {"hidden_size": 128}, {}, "as LongRoPE"),
    "CPU head size 8": ("llama", {}, {}, "head_dim 8"),
    "fp16 on cpu": ("llama", {"hidden_size": 64}, {"precision": "fp16"}, "must be one of fp32, int8, int4"),
    "unknown provider": ("llama", {"hidden_size": 64}, {"execution_provider": "tpu"}, "got 'tpu'"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_input_fails_in_one_line_before_building(case, tmp_path):
    model_type, overrides, options, words = REFUSED[case]
    model_dir = tiny_model_dir(model_type, tmp_path, **overrides)
    with pytest.raises(LpesError) as info:
        export_genai(resolve_for_spec(model_dir, Spec.from_scales([1.0] * 3)), tmp_path / "out", **options)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_builder_failure_is_one_line_and_leaves_no_staging(tmp_path):
    model_dir = genai_model_dir("llama", tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model_dir / name).unlink()
    check_genai(resolve_for_spec(model_dir, Spec.from_scales(SCALES)))  # nothing cheap notices
    with pytest.raises(LpesError, match="^onnxruntime-genai's builder failed: ") as info:
        export_genai(resolve_for_spec(model_dir, Spec.from_scales(SCALES)), tmp_path / "out")
    assert "\n" not in str(info.value)
    assert list((tmp_path / "out").iterdir()) == []


def test_spec_with_wrong_layer_count_is_refused(tmp_path):
    model_dir = genai_model_dir("llama", tmp_path)
    with pytest.raises(LpesError, match="2 entries but the model has 3 layers"):
        check_genai(resolve_for_spec(model_dir, Spec.from_scales([2.0, 1.0])))


def test_model_without_an_end_token_is_refused_before_building():
    from lpes.converter.loading import resolve_model

    with pytest.raises(LpesError, match="end-of-sequence token"):
        check_genai(resolve_for_spec(resolve_model("lpes-tiny-kv"), Spec.from_scales([1.0] * 4)))


def test_the_package_covers_the_lengths_an_lpes_model_is_used_at(llama_builds):
    """The builder alone stops at max_position_embeddings; the package goes to it x the largest scale."""
    model_dir, scaled, unscaled = llama_builds
    trained = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    context = {p: json.loads((p / "genai_config.json").read_text())["model"]["context_length"]
               for p in (scaled, unscaled)}
    assert context == {scaled: 3 * trained, unscaled: trained}
    layers, inits = _rope_inputs(scaled)
    assert {inits[name].shape[0] for pair in layers.values() for name in pair} == {3 * trained}
    prompt = [5 + (i % 40) for i in range(trained + 8)]  # past the trained positions
    spec = Spec.from_scales([3.0, 1.0, 3.0])
    assert genai_greedy(scaled, prompt)[:4] == torch_greedy(model_dir, spec, prompt, NEW_TOKENS)[:4]


def test_the_package_holds_the_prompts_it_is_validated_on(tmp_path):
    """A stock YaRN decision at factor 1.75 on lpes-tiny-induction (trained on 256 positions) is validated on its
    512-position prompts: the package's context covers them (main sized it 448, and make demo's validation failed
    after the export), and lpes-convert plans it before anything is written."""
    from lpes.cli import convert_main
    from lpes.convert_pipeline import ConvertOptions, plan
    from lpes.foundation.spec import RopeScheme, dump_spec

    spec_path = tmp_path / "yarn.json"
    dump_spec(Spec.from_scales([1.75] * 4, rope=RopeScheme("yarn")), spec_path)
    planned = plan(ConvertOptions("lpes-tiny-induction", spec_path, tmp_path / "out", targets="genai",
                                  data="tiny-induction:examples=1"))
    assert planned.job.validation_tokens == 512 + 1  # the prompt, and the answer's one token
    assert planned.targets[0].plan.context_length == 513
    assert convert_main(["lpes-tiny-induction", "--curve", str(spec_path), "--to", "genai", "--data",
                         "tiny-induction:examples=1", "--out", str(tmp_path / "out")]) == 0


def test_a_validation_longer_than_the_package_can_hold_is_refused_at_plan_time(tmp_path):
    model_dir = genai_model_dir("llama", tmp_path)
    resolved = resolve_for_spec(model_dir, Spec.from_scales([1.0] * 3))
    assert check_genai(resolved, min_context=5000).context_length == 5000
    with pytest.raises(LpesError, match=r"^--to genai: validation generates sequences of up to 40000 tokens .* "
                                        r"context length 32768"):
        check_genai(resolve_for_spec(model_dir, Spec.from_scales([1.0] * 3)), min_context=40000)
