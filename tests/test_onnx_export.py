"""ONNX export with a KV cache (exporters/onnx/export.py), run by onnxruntime, held to the PyTorch reference.

The default run exports four tiny models (about 40 s of CPU). The full architecture matrix
of the acceptance criteria (llama, mistral, qwen2, qwen3, gemma2, phi3, stablelm, mixtral,
plus yarn, long-RoPE and float16; 8 greedy tokens per parity case) is marked slow:
`pytest -m "not slow"` leaves it out of a quick run; `make test` runs it.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import EOS_ID, tiny_model_dir

from lpes.converter.loading import load_model, resolve_for_spec
from lpes.converter.portable_files import with_legacy_rope
from lpes.converter.reference import apply
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import RopeScheme, Spec, load_spec

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from lpes.exporters.onnx import export as onnx_export  # noqa: E402
from lpes.exporters.onnx.export import export_onnx  # noqa: E402
from lpes.exporters.onnx.parity import check_parity  # noqa: E402
from lpes.exporters.onnx.runner import OrtCausalLM, check_dtype_supported  # noqa: E402
from lpes.generate import generate_text  # noqa: E402

torch.set_num_threads(1)
SPEC = Spec.from_scales([2.0, 1.0, 4.0])  # varies by layer; the middle layer keeps the model's own RoPE
LLAMA3_ROPE = {
    "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 64, "partial_rotary_factor": 0.5,
}


def slow(test):
    """Marked slow (each case exports a model: 10-20 s); `pytest -m "not slow"` leaves them out."""
    return pytest.mark.slow(test)


@pytest.fixture(scope="module")
def main_export(tmp_path_factory):
    """StableLM with partial rotary (half the head) and llama3 RoPE, exported with SPEC."""
    root = tmp_path_factory.mktemp("onnx")
    model_dir = tiny_model_dir("stablelm", root, rope_parameters=LLAMA3_ROPE)
    return model_dir, export_onnx(resolve_for_spec(model_dir, SPEC), root / "onnx")


# -- parity --------------------------------------------------------------------------------


def test_export_matches_reference_through_the_kv_cache(main_export):
    model_dir, onnx_dir = main_export
    report = check_parity(resolve_for_spec(model_dir, SPEC), onnx_dir, "float32")
    assert report.passed, report.format()
    assert report.provider == "CPUExecutionProvider"
    assert report.max_abs_error <= 1e-4
    assert [c.name for c in report.cases] == [
        "prefill 1, batch 1", "prefill 64, batch 1", "prefill 1, batch 3", "prefill 64, batch 3, left padding"
    ]
    assert all(c.tokens_identical and c.top1_agreement == 1.0 for c in report.cases)
    assert report.unscaled_difference > 0.1  # the scales change the logits by far more than the tolerance
    data = json.loads(json.dumps(report.to_json()))
    assert data["passed"] and data["cases"][3]["prompt_lengths"] == [64, 40, 1]
    assert "PASSED" in report.format() and "CPUExecutionProvider" in report.format()


def test_greedy_tokens_are_not_degenerate(main_export):
    # Identical tokens only prove something if the model does not repeat one token forever.
    _, onnx_dir = main_export
    tokens = OrtCausalLM(onnx_dir).greedy([[5, 6, 7], [8, 9, 10, 11, 12]], 32)
    assert all(len(row) == 32 and len(set(row)) >= 4 for row in tokens)


def test_parity_fails_when_the_export_has_other_scales(main_export):
    model_dir, onnx_dir = main_export
    other = resolve_for_spec(model_dir, Spec.from_scales([2.0, 1.0, 1.0]))
    report = check_parity(other, onnx_dir, "float32", num_tokens=8)
    assert not report.passed
    assert any("logits differ" in failure for failure in report.failures)
    assert "FAILED" in report.format()


def test_parity_catches_an_export_that_lost_the_scales(tmp_path, monkeypatch):
    model_dir = tiny_model_dir("llama", tmp_path, num_hidden_layers=1)
    spec = Spec.from_scales([4.0])
    monkeypatch.setattr(onnx_export, "apply", lambda model, spec: model)  # the bug: scales silently dropped
    onnx_dir = export_onnx(resolve_for_spec(model_dir, spec), tmp_path / "onnx")
    assert onnx_export.read_metadata(onnx_dir)["scaled_inv_freq_constants"] == {"4.0": None}
    report = check_parity(resolve_for_spec(model_dir, spec), onnx_dir, "float32", num_tokens=4)
    assert not report.passed
    assert report.unscaled_difference < 1e-4
    assert any("indistinguishable from the unscaled model" in failure for failure in report.failures)


# -- the folder and the graph --------------------------------------------------------------


def test_folder_holds_graph_configs_tokenizer_spec_and_versions(main_export):
    model_dir, onnx_dir = main_export
    names = {p.name for p in onnx_dir.iterdir()}
    assert {"model.onnx", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "lpes_spec.json", "lpes_onnx.json"} <= names
    assert "model.onnx_data" not in names  # weights stay inside model.onnx below 2 GB
    base_config = json.loads((model_dir / "config.json").read_text())
    assert json.loads((onnx_dir / "config.json").read_text()) == with_legacy_rope(base_config)  # + 4.x's RoPE keys
    assert load_spec(onnx_dir / "lpes_spec.json").scales == SPEC.scales
    meta = json.loads((onnx_dir / "lpes_onnx.json").read_text())
    assert meta["opset"] == 18 and meta["dtype"] == "float32"
    assert set(meta["versions"]) == {"torch", "transformers", "onnx"}
    assert (meta["num_layers"], meta["num_key_value_heads"], meta["head_dim"]) == (3, 2, 8)
    assert meta["inputs"][:4] == ["input_ids", "attention_mask", "position_ids", "past_key_values.0.key"]
    assert meta["outputs"][-1] == "present.2.value"


def test_graph_has_optimum_names_dynamic_axes_and_standard_ops_only(main_export):
    _, onnx_dir = main_export
    graph_model = onnx.load(onnx_dir / "model.onnx")
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*graph_model.graph.input, *graph_model.graph.output]}
    assert dims["input_ids"] == ["batch", "sequence_length"]
    assert dims["attention_mask"] == ["batch", "total_sequence_length"]
    assert dims["past_key_values.2.value"] == ["batch", 2, "past_sequence_length", 8]
    assert dims["present.0.key"] == ["batch", 2, "past_sequence_length + sequence_length", 8]
    assert dims["logits"] == ["batch", "sequence_length", 100]
    assert graph_model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert {node.domain for node in graph_model.graph.node} <= {"", "ai.onnx"}
    assert {opset.domain: opset.version for opset in graph_model.opset_import}.get("") == 18


def test_graph_carries_each_layers_scaled_inv_freq_as_a_constant(main_export):
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model_dir, onnx_dir = main_export
    # Independent of lpes: transformers' own llama3 frequencies for the half-head rotary part.
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](AutoConfig.from_pretrained(model_dir), "cpu")
    assert inv_freq.shape == (2,)  # head_dim 8 x partial_rotary_factor 0.5 / 2
    initializers = {
        init.name: onnx.numpy_helper.to_array(init) for init in onnx.load(onnx_dir / "model.onnx").graph.initializer
    }
    for scale in (2.0, 4.0):
        np.testing.assert_allclose(initializers[f"lpes.inv_freq.scale_{scale}"], (inv_freq / scale).numpy(), rtol=1e-7)
    assert not any("scale_1.0" in name for name in initializers)  # scale 1 keeps the model's own tensor
    assert onnx_export.read_metadata(onnx_dir)["scaled_inv_freq_constants"] == {
        "2.0": "lpes.inv_freq.scale_2.0", "4.0": "lpes.inv_freq.scale_4.0"
    }


@pytest.fixture(scope="module")
def split_export(tmp_path_factory):
    """A one-layer llama exported with its weights in model.onnx_data (as above 2 GB), plus its machine paths."""
    root = tmp_path_factory.mktemp("portable")
    model_dir = tiny_model_dir("llama", root, num_hidden_layers=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onnx_export, "EXTERNAL_DATA_THRESHOLD", 0)
        onnx_dir = export_onnx(resolve_for_spec(model_dir, Spec.from_scales([2.0])), root / "onnx")
    return model_dir, onnx_dir, _machine_paths(root)


def _machine_paths(tmp: Path) -> dict[str, bytes]:
    """Absolute paths of this machine that an export must not carry (as bytes, to scan binary files)."""
    import site

    import lpes

    paths = {
        "repository": Path(lpes.__file__).resolve().parents[1],
        "site-packages": Path(torch.__file__).resolve().parents[1],
        "home": Path.home(),
        "tmp dir of the export": tmp.resolve(),
        "temp root": Path(tempfile.gettempdir()).resolve(),
        **{f"site dir {i}": Path(d).resolve() for i, d in enumerate(site.getsitepackages())},
    }
    # "/" alone (root's home may be /root, which stays) would match anything.
    return {name: str(path).encode() for name, path in paths.items() if len(path.parts) > 1}


def _files_carrying(folder: Path, paths: dict[str, bytes]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = file.read_bytes()
        for name, path in paths.items():
            if path in data:
                found.setdefault(file.name, []).append(name)
    return found


def test_no_file_of_the_export_carries_a_path_of_this_machine(split_export):
    _, onnx_dir, paths = split_export
    assert {"model.onnx", "model.onnx_data", "config.json", "lpes_onnx.json"} <= {p.name for p in onnx_dir.iterdir()}
    assert _files_carrying(onnx_dir, paths) == {}


def test_stripping_torchs_node_metadata_removes_the_paths_and_most_of_the_graph(split_export, tmp_path, monkeypatch):
    model_dir, onnx_dir, paths = split_export
    # The same export with torch's metadata left in: what the scan above would have caught.
    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_THRESHOLD", 0)
    monkeypatch.setattr(onnx_export, "strip_exporter_provenance", lambda graph_model: None)
    raw = export_onnx(resolve_for_spec(model_dir, Spec.from_scales([2.0])), tmp_path / "raw")
    assert "site-packages" in _files_carrying(raw, paths).get("model.onnx", [])
    stripped, unstripped = (onnx_dir / "model.onnx").stat().st_size, (raw / "model.onnx").stat().st_size
    assert stripped < unstripped / 3, (stripped, unstripped)  # the graph alone: weights are in model.onnx_data
    assert (onnx_dir / "model.onnx_data").read_bytes() == (raw / "model.onnx_data").read_bytes()
    graph = onnx.load(onnx_dir / "model.onnx", load_external_data=False).graph
    assert not any(node.metadata_props or node.doc_string for node in graph.node)
    assert not graph.metadata_props


def test_onnxruntime_fuses_every_rmsnorm_and_parity_holds(split_export, tmp_path):
    import onnxruntime as ort

    model_dir, onnx_dir, _ = split_export
    graph = onnx.load(onnx_dir / "model.onnx", load_external_data=False).graph
    assert not any(node.op_type == "Reciprocal" for node in graph.node)
    assert {node.domain for node in graph.node} <= {"", "ai.onnx"}  # still standard ops in the file
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "session.onnx")
    ort.InferenceSession(str(onnx_dir / "model.onnx"), options, providers=["CPUExecutionProvider"])
    session = onnx.load(tmp_path / "session.onnx", load_external_data=False).graph
    # One layer: input and post-attention RMSNorm, plus the final norm.
    assert sum(node.op_type == "SimplifiedLayerNormalization" for node in session.node) == 3
    assert onnx_export.read_metadata(onnx_dir)["fusion_friendly_rewrites"]["rms_norm_division"] == 3
    report = check_parity(resolve_for_spec(model_dir, Spec.from_scales([2.0])), onnx_dir, "float32", num_tokens=4)
    assert report.passed and report.max_abs_error <= 1e-4, report.format()


# -- the runner ----------------------------------------------------------------------------


def test_prefill_from_empty_past_then_decode_equals_one_long_prefill(main_export):
    _, onnx_dir = main_export
    lm = OrtCausalLM(onnx_dir)
    ids = np.array([[5, 17, 33, 8, 71, 42, 9]])
    whole, present = lm.forward(ids, np.ones_like(ids), np.arange(7)[None])
    assert present[2][0].shape == (1, 2, 7, 8)
    logits, past = lm.forward(ids[:, :4], np.ones((1, 4), np.int64), np.arange(4)[None])  # past length 0
    steps = [logits[:, -1]]
    for t in range(4, 7):
        logits, past = lm.forward(ids[:, t:t + 1], np.ones((1, t + 1), np.int64), np.array([[t]]), past)
        steps.append(logits[:, -1])
    assert past[0][1].shape == (1, 2, 7, 8)
    np.testing.assert_allclose(np.concatenate(steps), whole[0, 3:], atol=1e-5)


def test_greedy_stops_each_row_at_its_end_token(main_export):
    _, onnx_dir = main_export
    lm = OrtCausalLM(onnx_dir)
    prompts = [[5, 6, 7], [40, 41], [90, 12, 13, 14, 15]]
    free = lm.greedy(prompts, 12)
    stop = free[0][2]  # pretend the third token of row 0 ends a sequence
    expected = [row[: row.index(stop) + 1] if stop in row else row for row in free]
    assert lm.greedy(prompts, 12, eos_token_id=stop) == expected
    assert lm.greedy(prompts, 12, eos_token_id=[stop, 9999]) == expected


def test_generate_text_matches_transformers_generate(main_export):
    from transformers import AutoTokenizer

    model_dir, onnx_dir = main_export
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer("w5 w6 w70 w8", return_tensors="pt")["input_ids"]
    model = apply(load_model(model_dir), SPEC)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=EOS_ID, pad_token_id=0)
    expected = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    text = generate_text(onnx_dir, "w5 w6 w70 w8", max_new_tokens=10)
    assert text == expected and text.split()


def test_provider_choice_and_bfloat16_on_cpu_are_user_errors(main_export):
    _, onnx_dir = main_export
    assert OrtCausalLM(onnx_dir, provider="cpu").provider == "CPUExecutionProvider"
    with pytest.raises(LpesError, match="unknown onnxruntime provider 'tpu'"):
        OrtCausalLM(onnx_dir, provider="tpu")
    with pytest.raises(LpesError, match="bfloat16"):
        check_dtype_supported("bfloat16", "cpu")
    check_dtype_supported("float16", "cpu")


# -- per-layer yarn and dynamic NTK (spec rope_type) ---------------------------------------

# The parity cases (prompts of 1 and 64 tokens, 8-32 decode steps) run on both sides of 16.
SCHEME_TRAINED = 16


def _scheme_export(tmp_path, rope_type: str, num_tokens: int = 16):
    model_dir = tiny_model_dir("llama", tmp_path, max_position_embeddings=SCHEME_TRAINED)
    spec = Spec.from_scales([2.0, 1.0, 3.0], rope=RopeScheme(rope_type))
    onnx_dir = export_onnx(resolve_for_spec(model_dir, spec), tmp_path / "onnx")
    report = check_parity(resolve_for_spec(model_dir, spec), onnx_dir, "float32", num_tokens=num_tokens)
    assert report.passed, report.format()
    assert report.max_abs_error <= 1e-4
    assert report.unscaled_difference > 0.1  # at 64 positions, far from the plain model
    meta = onnx_export.read_metadata(onnx_dir)
    assert meta["rope"] == {"rope_type": rope_type} and load_spec(onnx_dir / "lpes_spec.json") == spec
    return model_dir, spec, onnx_dir, meta


def test_per_layer_dynamic_ntk_follows_the_length_in_the_graph(tmp_path):
    """Its base grows with max(position_ids) + 1 in the graph: exact below and above the trained length."""
    from lpes.exporters.tensorrt.cast import write_cast_onnx
    from lpes.exporters.tensorrt.ops import check_tensorrt_support

    model_dir, spec, onnx_dir, meta = _scheme_export(tmp_path, "dynamic")
    assert meta["scaled_inv_freq_constants"] == {"1.0": None, "2.0": None, "3.0": None}  # computed in-graph
    reference = apply(load_model(model_dir), spec)
    runner = OrtCausalLM(onnx_dir, "cpu", threads=1)
    for length in (SCHEME_TRAINED - 4, 40, 90):  # one graph, three lengths: nothing was frozen at the trace's
        ids = torch.randint(4, 100, (1, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            expected = reference(input_ids=ids).logits[0, -1].numpy()
        _, [got] = runner.greedy_with_logits([ids[0].tolist()], 1)
        assert np.abs(got[0] - expected).max() <= 1e-4
    # The TensorRT path reads the same graph: its operators, and the float16 copy's, are all supported.
    check_tensorrt_support(onnx_dir / "model.onnx")
    write_cast_onnx(onnx_dir / "model.onnx", tmp_path / "cast" / "model.onnx", "float16")
    check_tensorrt_support(tmp_path / "cast" / "model.onnx")


@slow
def test_per_layer_yarn_matches_the_reference_with_its_constants(tmp_path):
    _, _, _, meta = _scheme_export(tmp_path, "yarn", num_tokens=8)
    # YaRN at factor 1 is the model's own RoPE (layer 1); the others are constants of the graph.
    assert meta["scaled_inv_freq_constants"] == {"2.0": "lpes.inv_freq.scale_2.0", "3.0": "lpes.inv_freq.scale_3.0"}


# -- refusals before any work --------------------------------------------------------------


@pytest.fixture
def no_loading(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("weights were loaded although the input was refusable up front")

    monkeypatch.setattr(onnx_export, "load_model", fail)


@pytest.mark.parametrize(
    "overrides, spec, dtype, message",
    [
        ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}}, SPEC, "float32",
         "cannot export dynamic-NTK RoPE"),
        ({}, SPEC, "float64", "--dtype must be one of"),
        ({}, Spec.from_scales([2.0, 1.0]), "float32", "'scales' has 2 entries but the model has 3 layers"),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}},
         Spec.from_scales([2.0, 1.0, 3.0], rope=RopeScheme("yarn")), "float32", "per-layer YaRN .* own RoPE is"),
    ],
)
def test_unexportable_input_fails_before_loading_weights(tmp_path, no_loading, overrides, spec, dtype, message):
    model_dir = tiny_model_dir("llama", tmp_path, **overrides)
    with pytest.raises(LpesError, match=message):
        export_onnx(resolve_for_spec(model_dir, spec), tmp_path / "onnx", dtype=dtype)
    assert not (tmp_path / "onnx").exists()


def test_missing_model_folder_is_a_user_error(tmp_path):
    with pytest.raises(LpesError):
        export_onnx(resolve_for_spec(tmp_path / "nowhere", SPEC), tmp_path / "onnx")


@pytest.mark.parametrize("model_type", ["mistral", "gemma2"])
def test_tiny_sliding_window_models_really_slide(tmp_path, model_type):
    # Otherwise the matrix below would not test sliding-window masks through the cache.
    ids = torch.randint(4, 100, (1, 64), generator=torch.Generator().manual_seed(0))
    logits = []
    for window in (16, 4096):
        model = load_model(tiny_model_dir(model_type, tmp_path / str(window), sliding_window=window))
        with torch.no_grad():
            logits.append(model(input_ids=ids).logits[0, -1])
    assert (logits[0] - logits[1]).abs().max() > 1e-2


# -- the acceptance matrix (slow) ----------------------------------------------------------


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3", "gemma2", "phi3", "stablelm", "mixtral"])
@slow
def test_architecture_matches_reference(tmp_path, model_type):
    _assert_export_matches(tiny_model_dir(model_type, tmp_path), tmp_path, "float32")


ROPE_VARIANTS = {
    "yarn": ("llama", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                       "original_max_position_embeddings": 128}),
    # long-RoPE switches frequencies in-graph once positions pass 32: the 64-token prompts cross it.
    "longrope": ("phi3", {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                          "short_factor": [1.0, 1.1], "long_factor": [2.0, 3.0],
                          "original_max_position_embeddings": 32}),
}


@pytest.mark.parametrize("variant", sorted(ROPE_VARIANTS))
@slow
def test_rope_variant_matches_reference(tmp_path, variant):
    model_type, rope = ROPE_VARIANTS[variant]
    _assert_export_matches(tiny_model_dir(model_type, tmp_path, rope_parameters=rope), tmp_path, "float32")


@slow
def test_float16_export_matches_float16_reference(tmp_path):
    # Not identical tokens: in float16 a near-tie may flip on another CPU (see _assert_export_matches).
    report = _assert_export_matches(tiny_model_dir("llama", tmp_path), tmp_path, "float16")
    assert report.dtype == "float16" and report.max_abs_error > 0  # really ran in half precision


# Greedy tokens per parity case in the matrix (lpes-convert runs 32): the exported cache is fed
# back from the first decode step on, and the 64-token prompts already cross the sliding windows
# (16) and long-RoPE's switch (32), so 8 steps exercise what 32 would; prefill logits and the
# logits of every step are compared as well.
MATRIX_TOKENS = 8


def _assert_export_matches(model_dir, tmp_path, dtype: str):
    onnx_dir = export_onnx(resolve_for_spec(model_dir, SPEC), tmp_path / "onnx", dtype=dtype)
    report = check_parity(resolve_for_spec(model_dir, SPEC), onnx_dir, dtype, num_tokens=MATRIX_TOKENS)
    # passed: logits within the dtype's tolerance at every compared step, and tokens that part only
    # at a near-tie of the reference (its margin between the two tokens within that tolerance).
    assert report.passed, report.format()
    if dtype == "float32":
        assert report.max_abs_error <= 1e-4, report.format()
    return report
