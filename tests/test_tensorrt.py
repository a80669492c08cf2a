"""TensorRT engines (exporters/tensorrt*.py, exporters/tensorrt/runner.py).

On CPU (this machine has neither the tensorrt package nor a GPU): the optimization
profile, the CPU-side operator check, the float16/bfloat16 cast of the float32 export
(run by onnxruntime and by onnx's reference evaluator against the float32 export), what
`--to tensorrt` does where it cannot build, and the build orchestration against a
stand-in for the tensorrt module. The GPU tests build and run real engines and skip
here, saying why. One tiny llama export serves the whole file (about 20 s).
"""

from __future__ import annotations

import argparse
import enum
import hashlib
import json
import re
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import EOS_ID, PAD_ID, tiny_model_dir

from lpes.converter.loading import resolve_for_spec
from lpes.foundation import devices
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import Spec

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from lpes.exporters.onnx.export import export_onnx  # noqa: E402
from lpes.exporters.onnx.runner import OrtCausalLM  # noqa: E402
from lpes.exporters.runners import left_pad  # noqa: E402
from lpes.exporters.tensorrt import build as tensorrt_build  # noqa: E402
from lpes.exporters.tensorrt import engine as trt_export  # noqa: E402
from lpes.exporters.tensorrt.cast import write_cast_onnx  # noqa: E402
from lpes.exporters.tensorrt.ops import check_tensorrt_support, find_problems, load_graph  # noqa: E402
from lpes.exporters.tensorrt.profiles import (  # noqa: E402
    Profile,
    add_profile_arguments,
    default_profile,
    input_shapes,
    profile_from_args,
    trtexec_shape_flags,
)

torch.set_num_threads(1)
SPEC = Spec.from_scales([2.0, 1.0, 4.0])
MAX_POSITIONS = 512  # conftest's tiny models
NUM_LAYERS, KV_HEADS, HEAD_DIM = 3, 2, 8
# parity.TOLERANCES: |low - float32| <= atol + rtol * max|float32| on the logits.
TOLERANCE = {"float16": (2e-2, 1e-2), "bfloat16": (1e-1, 3e-2)}


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """(model folder, float32 ONNX export folder) of a tiny llama with SPEC."""
    root = tmp_path_factory.mktemp("trt")
    model_dir = tiny_model_dir("llama", root)
    return model_dir, export_onnx(resolve_for_spec(model_dir, SPEC), root / "onnx", dtype="float32")


@pytest.fixture(scope="module")
def cast16(export, tmp_path_factory):
    """The float16 cast of the export, in a folder OrtCausalLM reads like an export."""
    return _cast_folder(export[1], tmp_path_factory.mktemp("cast16"), "float16")


def _cast_folder(onnx_dir: Path, folder: Path, dtype: str, **kwargs) -> Path:
    write_cast_onnx(onnx_dir / "model.onnx", folder / "model.onnx", dtype, **kwargs)
    metadata = json.loads((onnx_dir / "lpes_onnx.json").read_text())
    (folder / "lpes_onnx.json").write_text(json.dumps({**metadata, "dtype": dtype}))
    return folder


# -- profiles --------------------------------------------------------------------------------


def test_default_profile_spans_prefill_and_decode_up_to_max_positions():
    profile = default_profile(MAX_POSITIONS)
    assert profile.to_json() == {
        "batch": [1, 1, 8],
        "sequence": [1, 128, 512],  # a decode step .. a prefill of every position
        "past": [0, 256, 511],  # an empty cache .. all but the newest position
        "total": [1, 384, 512],  # past + sequence never beyond max positions
    }
    assert Profile.from_json(profile.to_json()) == profile


@pytest.mark.parametrize("positions", [1, 2, 3, 16, 100, 511, 4096, 131072])
def test_default_profile_is_consistent_for_any_model_length(positions):
    p = default_profile(positions)
    for r in (p.batch, p.sequence, p.past, p.total):
        assert r.min <= r.opt <= r.max
    assert p.total.max == positions
    assert p.sequence.max <= p.total.max and p.past.max < p.total.max
    assert p.sequence.opt + p.past.opt == p.total.opt <= p.total.max
    assert (p.sequence.min, p.past.min, p.total.min) == (1, 0, 1)


@pytest.mark.parametrize(
    ("positions", "scale", "total"),
    [
        (256, 4.0, 1024),  # the demo: the bundled model (256 positions) validated at 1024 tokens
        (512, 2.5, 1280),
        (4096, 16.0, 32768),  # capped: 65536 would size the engine's activations for a 64k context
        (131072, 2.0, 131072),  # the cap never cuts the model's own positions
        (512, 0.5, 512),  # a spec that compresses positions still gets the model's own range
    ],
)
def test_default_profile_covers_the_lengths_the_lpes_spec_is_used_at(positions, scale, total):
    profile = default_profile(positions, max_scale=scale)
    assert (profile.total.max, profile.sequence.max, profile.past.max) == (total, total, total - 1)
    assert profile.sequence.opt + profile.past.opt == profile.total.opt <= total


def test_max_total_may_reach_but_not_pass_what_the_spec_covers():
    assert default_profile(4096, max_scale=16.0, max_total=65536).total.max == 65536  # past the cap on request
    says = "max_position_embeddings (256) x the spec's largest scale (4) = 1024"
    with pytest.raises(LpesError, match=re.escape(says)):
        default_profile(256, max_scale=4.0, max_total=1025)
    parser = argparse.ArgumentParser()
    add_profile_arguments(parser)
    assert profile_from_args(parser.parse_args([]), 256, 4.0).total.max == 1024


def test_profile_flags_override_the_defaults():
    parser = argparse.ArgumentParser()
    add_profile_arguments(parser)
    args = parser.parse_args(["--max-batch", "3", "--max-total", "256", "--opt-sequence", "1", "--opt-past", "200"])
    assert profile_from_args(args, MAX_POSITIONS).to_json() == {
        "batch": [1, 1, 3], "sequence": [1, 1, 256], "past": [0, 200, 255], "total": [1, 201, 256],
    }


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"max_total": 1024}, "max_position_embeddings (512)"),
        ({"max_batch": 0}, "--max-batch"),
        ({"opt_batch": 9}, "--opt-batch (9) <= --max-batch (8)"),
        ({"max_sequence": 600}, "--max-sequence (600)"),
        ({"opt_sequence": 300, "opt_past": 300}, "exceeds --max-total"),
    ],
)
def test_impossible_profiles_are_refused_with_the_flag_named(kwargs, says):
    with pytest.raises(LpesError, match=re.escape(says)):
        default_profile(MAX_POSITIONS, **kwargs)


def test_every_graph_input_gets_its_shapes_from_its_named_dimensions(export):
    shapes = input_shapes(trt_export.graph_input_dims(export[1] / "model.onnx"), default_profile(MAX_POSITIONS))
    assert list(shapes) == json.loads((export[1] / "lpes_onnx.json").read_text())["inputs"]
    assert shapes["input_ids"] == ((1, 1), (1, 128), (8, 512))
    assert shapes["attention_mask"] == ((1, 1), (1, 384), (8, 512))
    for i in range(NUM_LAYERS):
        for kind in ("key", "value"):
            assert shapes[f"past_key_values.{i}.{kind}"] == (
                (1, KV_HEADS, 0, HEAD_DIM), (1, KV_HEADS, 256, HEAD_DIM), (8, KV_HEADS, 511, HEAD_DIM)
            )
    with pytest.raises(LpesError, match="'beam'"):
        input_shapes({"x": ["batch", "beam"]}, default_profile(MAX_POSITIONS))


def test_trtexec_shape_flags_name_every_input_once_per_flag():
    shapes = {
        "input_ids": ((1, 1), (1, 4), (2, 8)),
        "past_key_values.0.key": ((1, 2, 0, 8), (1, 2, 3, 8), (2, 2, 7, 8)),
    }
    assert trtexec_shape_flags(shapes) == [
        "--minShapes=input_ids:1x1,past_key_values.0.key:1x2x0x8",
        "--optShapes=input_ids:1x4,past_key_values.0.key:1x2x3x8",
        "--maxShapes=input_ids:2x8,past_key_values.0.key:2x2x7x8",
    ]


# -- operator check --------------------------------------------------------------------------


def _tiny_graph(tmp_path: Path, nodes, inputs, outputs, opset: int = 18, initializers=()) -> Path:
    graph = helper.make_graph(nodes, "planted", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    path = tmp_path / "planted.onnx"
    onnx.save(model, str(path))
    return path


def _vector(name: str, elem: int = TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, [4])


def test_the_real_export_and_its_casts_pass_the_operator_check(export, cast16):
    check_tensorrt_support(export[1] / "model.onnx")
    check_tensorrt_support(cast16 / "model.onnx")


def test_an_unsupported_operator_is_named_with_its_node(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Unique", ["r"], ["y"], name="dedup"),
    ]
    path = _tiny_graph(tmp_path, nodes, [_vector("x")], [_vector("y")])
    with pytest.raises(LpesError, match=r"does not support operator Unique \(node 'dedup', op Unique\)"):
        check_tensorrt_support(path)


def test_a_custom_domain_operator_is_refused(tmp_path):
    nodes = [helper.make_node("FusedRope", ["x"], ["y"], name="rope0", domain="com.example")]
    graph = helper.make_graph(nodes, "custom", [_vector("x")], [_vector("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)])
    problems = find_problems(model)
    assert [(p.node, p.op) for p in problems] == [("rope0", "FusedRope")]
    assert "com.example::FusedRope" in problems[0].message()


def test_an_unsupported_data_type_is_named(tmp_path):
    a = helper.make_tensor_value_info("a", TensorProto.INT32, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, [2, 2])
    path = _tiny_graph(tmp_path, [helper.make_node("MatMul", ["a", "a"], ["y"], name="imm")], [a], [y])
    with pytest.raises(LpesError, match=r"MatMul on int32 \(tensor 'a'\) \(node 'imm'"):
        check_tensorrt_support(path)


def test_computed_reduction_axes_opset_and_io_types_are_checked(tmp_path):
    nodes = [
        helper.make_node("Shape", ["x"], ["axes"], name="shape"),
        helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum"),
    ]
    path = _tiny_graph(tmp_path, nodes, [_vector("x"), _vector("s", TensorProto.STRING)], [_vector("y")], opset=25)
    messages = [p.message() for p in find_problems(load_graph(path))]
    assert any("opset 25" in m for m in messages)
    assert any("network input/output of type string" in m for m in messages)
    assert any("ReduceSum with computed axes" in m for m in messages)


def test_a_planted_operator_stops_the_build_before_anything_is_written(export, tmp_path):
    onnx_dir = tmp_path / "onnx"
    shutil.copytree(export[1], onnx_dir)
    model = onnx.load(str(onnx_dir / "model.onnx"))
    model.graph.node.append(helper.make_node("BitShift", ["input_ids", "input_ids"], ["shifted"], name="planted",
                                             direction="LEFT"))
    model.graph.output.append(helper.make_tensor_value_info("shifted", TensorProto.INT64, None))
    onnx.save(model, str(onnx_dir / "model.onnx"))
    out = tmp_path / "tensorrt"
    with pytest.raises(LpesError, match="operator BitShift \\(node 'planted'"):
        trt_export.build_engine_or_explain(onnx_dir, out, "float32")
    assert not out.exists()


# -- the cast ONNX ---------------------------------------------------------------------------


def _session(path: Path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _feeds(ids, mask, positions, past, dtype):
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    for i in range(NUM_LAYERS):
        for k, kind in enumerate(("key", "value")):
            feeds[f"past_key_values.{i}.{kind}"] = past[2 * i + k].astype(dtype)
    return feeds


def _prompts():
    rng = np.random.default_rng(0)
    rows = [list(rng.integers(3, 100, size=n)) for n in (12, 7)]
    return left_pad(rows)


def _bound(reference: np.ndarray, dtype: str) -> float:
    atol, rtol = TOLERANCE[dtype]
    return atol + rtol * float(np.abs(reference).max())


def _sure_top1_mismatches(reference: np.ndarray, low: np.ndarray, bound: float) -> int:
    """Positions whose top-1 differs although the reference's margin between the two tokens exceeds `bound`
    (parity's rule: a near-tie is one that the precision cannot decide)."""
    ref_top, low_top = reference.argmax(-1), low.argmax(-1)
    def pick(top):
        return np.take_along_axis(reference, top[..., None], -1)[..., 0]

    return int(((ref_top != low_top) & (pick(ref_top) - pick(low_top) > bound)).sum())


def test_float16_cast_matches_the_float32_export_through_the_cache(export, cast16):
    """Prefill, then one decode step fed the prefill's cache: logits within float16 tolerance, same top-1."""
    ids, mask, positions = _prompts()
    real = mask.astype(bool)
    empty = [np.zeros((2, KV_HEADS, 0, HEAD_DIM), np.float32)] * (2 * NUM_LAYERS)
    fp32, fp16 = _session(export[1] / "model.onnx"), _session(cast16 / "model.onnx")
    ref = fp32.run(None, _feeds(ids, mask, positions, empty, np.float32))
    low = fp16.run(None, _feeds(ids, mask, positions, empty, np.float16))
    assert low[0].dtype == np.float32 and low[1].dtype == np.float16  # logits float32, cache float16
    bound = _bound(ref[0][real], "float16")
    assert np.abs(ref[0] - low[0])[real].max() <= bound
    assert _sure_top1_mismatches(ref[0][real], low[0][real], bound) == 0
    step_ids = ref[0][:, -1].argmax(-1)[:, None]
    step = (step_ids, np.concatenate([mask, np.ones((2, 1), np.int64)], 1), positions[:, -1:] + 1)
    ref2 = fp32.run(None, _feeds(*step, ref[1:], np.float32))
    low2 = fp16.run(None, _feeds(*step, low[1:], np.float16))
    bound = _bound(ref2[0], "float16")
    assert np.abs(ref2[0] - low2[0]).max() <= bound
    assert _sure_top1_mismatches(ref2[0], low2[0], bound) == 0


def test_float16_cast_generates_the_float32_tokens(export, cast16):
    rows = [[5, 17, 42, 8, 99, 23, 4, 61], [7, 3]]
    fp32, fp16 = OrtCausalLM(export[1], "cpu", threads=1), OrtCausalLM(cast16, "cpu", threads=1)
    assert fp16.greedy(rows, 24, EOS_ID) == fp32.greedy(rows, 24, EOS_ID)


def test_cast_keeps_the_interface_and_the_rope_in_float32(export, cast16):
    source, cast = onnx.load(str(export[1] / "model.onnx")), onnx.load(str(cast16 / "model.onnx"))
    assert [v.name for v in cast.graph.input] == [v.name for v in source.graph.input]
    assert [v.name for v in cast.graph.output] == [v.name for v in source.graph.output]
    types = {v.name: v.type.tensor_type.elem_type for v in list(cast.graph.input) + list(cast.graph.output)}
    assert types["logits"] == TensorProto.FLOAT and types["input_ids"] == TensorProto.INT64
    assert {types[n] for n in types if n.startswith(("past_key_values.", "present."))} == {TensorProto.FLOAT16}
    # The per-layer scaled inv_freq constants survive bit for bit, and every RoPE angle is float32.
    scaled = {i.name: onnx.numpy_helper.to_array(i) for i in source.graph.initializer if i.name.startswith("lpes.inv")}
    assert len(scaled) == 2  # scales 2.0 and 4.0
    cast_inits = {i.name: i for i in cast.graph.initializer}
    for name, array in scaled.items():
        assert cast_inits[name].data_type == TensorProto.FLOAT
        assert np.array_equal(onnx.numpy_helper.to_array(cast_inits[name]), array)
    value_types = {v.name: v.type.tensor_type.elem_type for v in cast.graph.value_info}
    angles = [n for n in cast.graph.node if n.op_type in ("Cos", "Sin")]
    assert angles and all(value_types[n.input[0]] == TensorProto.FLOAT for n in angles)


def test_float32_constants_beyond_float16_are_clipped_not_infinite(export, cast16):
    source, cast = onnx.load(str(export[1] / "model.onnx")), onnx.load(str(cast16 / "model.onnx"))
    floats = [i for i in source.graph.initializer if i.data_type == TensorProto.FLOAT]
    lowest = [i.name for i in floats if onnx.numpy_helper.to_array(i).min(initial=0) < -65504]
    assert lowest  # the attention mask's "minus infinity"
    for init in cast.graph.initializer:
        array = onnx.numpy_helper.to_array(init).astype(np.float64)
        assert np.isfinite(array).all(), init.name
    clipped = {i.name: onnx.numpy_helper.to_array(i) for i in cast.graph.initializer if i.name in lowest}
    assert all(a.dtype == np.float16 and a.min() == -65504 for a in clipped.values())


def test_float32_rope_is_what_keeps_keys_accurate_at_late_positions(export, cast16, tmp_path):
    """Against a naive cast (everything float16), the keys of positions near 500 are far closer to float32."""
    naive = _cast_folder(export[1], tmp_path, "float16", keep_float32=frozenset())
    ids = np.arange(3, 15, dtype=np.int64)[None].repeat(2, 0)
    mask, positions = np.ones_like(ids), np.arange(480, 492, dtype=np.int64)[None].repeat(2, 0)
    empty = [np.zeros((2, KV_HEADS, 0, HEAD_DIM), np.float32)] * (2 * NUM_LAYERS)
    ref = _session(export[1] / "model.onnx").run(None, _feeds(ids, mask, positions, empty, np.float32))

    def key_error(folder):
        out = _session(folder / "model.onnx").run(None, _feeds(ids, mask, positions, empty, np.float16))
        return max(np.abs(out[1 + 2 * i].astype(np.float32) - ref[1 + 2 * i]).max() for i in range(NUM_LAYERS))

    assert key_error(cast16) < key_error(naive) / 4


def test_bfloat16_cast_matches_the_float32_export(export, tmp_path):
    """onnxruntime's CPU provider has no bfloat16 kernels: onnx's reference evaluator runs both graphs."""
    import ml_dtypes
    from onnx.reference import ReferenceEvaluator

    folder = _cast_folder(export[1], tmp_path, "bfloat16")
    ids, mask, positions = _prompts()
    real = mask.astype(bool)
    empty = [np.zeros((2, KV_HEADS, 0, HEAD_DIM), np.float32)] * (2 * NUM_LAYERS)
    ref = ReferenceEvaluator(str(export[1] / "model.onnx")).run(None, _feeds(ids, mask, positions, empty, np.float32))
    low = ReferenceEvaluator(str(folder / "model.onnx")).run(
        None, _feeds(ids, mask, positions, empty, ml_dtypes.bfloat16)
    )
    assert low[1].dtype == ml_dtypes.bfloat16
    bound = _bound(ref[0][real], "bfloat16")
    assert np.abs(ref[0] - low[0])[real].max() <= bound
    assert _sure_top1_mismatches(ref[0][real], low[0][real], bound) == 0


def test_a_half_precision_export_is_not_cast_again(export, tmp_path):
    with pytest.raises(LpesError, match="is float16; a bfloat16 engine needs"):
        trt_export.engine_onnx(export[1], "float16", "bfloat16", tmp_path)
    assert trt_export.engine_onnx(export[1], "float16", "float16", tmp_path) == export[1] / "model.onnx"
    with pytest.raises(LpesError, match="--dtype must be one of float32, float16, bfloat16, got 'int8'"):
        trt_export.build_engine_or_explain(export[1], tmp_path / "tensorrt", "int8")
    assert not (tmp_path / "tensorrt").exists()


# -- where it cannot build -------------------------------------------------------------------


def _fake_tensorrt(version: str) -> types.ModuleType:
    module = types.ModuleType("tensorrt")
    module.__version__ = version
    return module


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_without_the_tensorrt_package_it_says_so_and_leaves_the_recipe(export, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt -> ImportError
    monkeypatch.setattr(tensorrt_build, "gpu_info", lambda: tensorrt_build.GpuInfo("NVIDIA H200", "9.0"))
    before = _digest(export[1])
    out = tmp_path / "tensorrt"
    note = trt_export.build_engine_or_explain(export[1], out, "float16")
    assert note.startswith("TensorRT engine not built: this machine lacks the tensorrt Python package")
    assert "GPU" not in note and "\n" not in note
    assert _digest(export[1]) == before  # the ONNX export is left as it was
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "model.float16.onnx", "trtexec.sh"]
    script = (out / "trtexec.sh").read_text()
    command = " ".join(script.split("\\\n"))
    assert "--onnx=model.float16.onnx" in command and "--saveEngine=model.engine" in command
    assert "--timingCacheFile=timing.cache" in command and "--stronglyTyped" in command
    inputs = json.loads((export[1] / "lpes_onnx.json").read_text())["inputs"]
    for flag in ("--minShapes=", "--optShapes=", "--maxShapes="):
        listed = command.split(flag)[1].split()[0].split(",")
        assert [item.rsplit(":", 1)[0] for item in listed] == inputs
    # max batch, kv heads, max past (512 positions x SPEC's largest scale 4, less the newest token), head dim
    assert "past_key_values.2.value:8x2x2047x8" in command
    assert "trtexec" in capsys.readouterr().err  # the command is printed too
    assert "GPU model and the TensorRT version" in (out / "README.md").read_text()


def test_without_a_gpu_it_says_so(export, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt("10.9.0"))
    monkeypatch.setattr(tensorrt_build, "gpu_info", lambda: None)
    note = trt_export.build_engine_or_explain(export[1], tmp_path / "tensorrt", "float32")
    assert "lacks an NVIDIA GPU" in note and "package" not in note
    command = (tmp_path / "tensorrt" / "trtexec.sh").read_text()
    onnx_path = command.split("--onnx=")[1].split()[0]  # float32: the export itself, no cast
    assert (tmp_path / "tensorrt" / onnx_path).resolve() == (export[1] / "model.onnx").resolve()
    assert "--noTF32" in command


def test_an_old_tensorrt_and_a_missing_driver_are_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt("8.6.1"))

    def no_driver(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(devices.ctypes, "CDLL", no_driver)
    assert tensorrt_build.gpu_info() is None
    assert tensorrt_build.missing_requirements() == (
        "TensorRT >= 10 (found 8.6.1) and an NVIDIA GPU (the CUDA driver reports none)"
    )


def test_the_runner_says_what_it_needs(tmp_path, monkeypatch):
    from lpes.exporters.tensorrt.runner import TrtCausalLM

    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(LpesError, match="needs the tensorrt package"):
        TrtCausalLM(tmp_path)
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt("10.9.0"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(LpesError, match="needs an NVIDIA GPU"):
        TrtCausalLM(tmp_path)


def test_the_build_command_reports_a_user_error_in_one_line(tmp_path, capsys):
    """python -m lpes.exporters.tensorrt ends as every lpes command does: one line, exit 2."""
    assert trt_export.main([str(tmp_path / "not-an-export"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m lpes.exporters.tensorrt: error: ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


# -- TensorRT versions -----------------------------------------------------------------------


def test_build_plans_by_tensorrt_version():
    plan = tensorrt_build.build_plan
    assert plan("11.1.0", "float16") == tensorrt_build.BuildPlan(True, (), (), "float16")
    assert plan("10.9.0", "bfloat16") == tensorrt_build.BuildPlan(True, (), (), "bfloat16")
    assert plan("10.9.0", "float32").clear_flags == ("TF32",)  # float32 parity needs real float32 matmuls
    assert plan("10.9.0", "float16", "weak") == tensorrt_build.BuildPlan(False, ("FP16",), (), "float32")
    with pytest.raises(LpesError, match="TensorRT 11.0.1 removed weakly typed builds"):
        plan("11.0.1", "float16", "weak")
    with pytest.raises(LpesError, match="TensorRT >= 10"):
        plan("8.6.1", "float16")


# TensorRT 10's NetworkDefinitionCreationFlag as NvInfer.h numbers it (kEXPLICIT_BATCH = 0, deprecated
# and ignored; kSTRONGLY_TYPED = 1); create_network takes a bit mask of these (1 << flag).
NETWORK_FLAGS_10 = enum.IntEnum("NetworkDefinitionCreationFlag", {"EXPLICIT_BATCH": 0, "STRONGLY_TYPED": 1})


class _FakeTensorRT(types.ModuleType):
    """The part of the tensorrt module that the build calls, recording what it is asked."""

    def __init__(self, version: str, network_inputs: list[str], parse_ok: bool = True):
        super().__init__("tensorrt")
        self.__version__, self.calls = version, {"set": [], "cleared": [], "shapes": {}}
        fake = self

        class Network:
            num_inputs = len(network_inputs)

            def get_input(self, i):
                return types.SimpleNamespace(name=network_inputs[i])

        class Error:
            def desc(self):
                return "unsupported"

            def node_name(self):
                return "node_x"

            def node_operator(self):
                return "Foo"

        class Parser:
            num_errors = 0 if parse_ok else 1

            def __init__(self, network, logger):
                pass

            def parse_from_file(self, path):
                fake.calls["parsed"] = path
                return parse_ok

            def get_error(self, i):
                return Error()

        class Cache:
            def __init__(self, data):
                self.data = data

            def serialize(self):
                return self.data + b"+tuned"

        class Config:
            def set_flag(self, flag):
                fake.calls["set"].append(flag)

            def clear_flag(self, flag):
                fake.calls["cleared"].append(flag)

            def add_optimization_profile(self, profile):
                pass

            def create_timing_cache(self, data):
                fake.calls["cache_in"] = bytes(data)
                return Cache(bytes(data))

            def set_timing_cache(self, cache, ignore_mismatch):
                self.cache = cache
                return True

            def get_timing_cache(self):
                return self.cache

        class Profile:
            def set_shape(self, name, low, opt, high):
                fake.calls["shapes"][name] = (low, opt, high)

        class Builder:
            def __init__(self, logger):
                pass

            def create_network(self, flags):
                fake.calls["network_flags"] = flags
                return Network()

            def create_builder_config(self):
                return Config()

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                return b"ENGINE"

        self.Logger = lambda level: None
        self.Logger.WARNING = 2
        self.NetworkDefinitionCreationFlag = NETWORK_FLAGS_10
        self.BuilderFlag = types.SimpleNamespace(TF32="TF32", FP16="FP16", BF16="BF16")
        self.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")
        self.Builder, self.OnnxParser = Builder, Parser


def test_a_build_writes_engine_sidecar_and_timing_cache(export, tmp_path, monkeypatch):
    inputs = json.loads((export[1] / "lpes_onnx.json").read_text())["inputs"]
    fake = _FakeTensorRT("10.9.0", inputs)
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    monkeypatch.setattr(tensorrt_build, "gpu_info", lambda: tensorrt_build.GpuInfo("NVIDIA H200", "9.0"))
    out = tmp_path / "tensorrt"
    out.mkdir()
    (out / "timing.cache").write_bytes(b"cache")
    assert trt_export.build_engine_or_explain(export[1], out, "float16") is None
    assert fake.calls["parsed"] == str(out / "model.float16.onnx")
    # Bit 1 alone: a strongly typed network (and not bit 0, the deprecated explicit-batch flag); no precision flag.
    assert fake.calls["network_flags"] == 0b10 and fake.calls["set"] == []
    assert fake.calls["cache_in"] == b"cache" and (out / "timing.cache").read_bytes() == b"cache+tuned"
    assert (out / "model.engine").read_bytes() == b"ENGINE"
    sidecar = json.loads((out / "model.engine.json").read_text())
    assert sidecar["tensorrt"] == "10.9.0" and sidecar["gpu"] == {"name": "NVIDIA H200", "compute_capability": "9.0"}
    assert sidecar["inputs"] == inputs and sidecar["outputs"][0] == "logits"
    assert sidecar["spec"]["scales"] == list(SPEC.scales) and sidecar["dtype"] == "float16"
    assert sidecar["profile"] == default_profile(MAX_POSITIONS, max_scale=4.0).to_json()
    assert sidecar["profile"]["total"][2] == MAX_POSITIONS * 4  # the lengths SPEC's largest scale reaches
    assert sidecar["shapes"]["past_key_values.0.key"]["max"] == list(fake.calls["shapes"]["past_key_values.0.key"][2])


def test_a_parser_rejection_names_the_node(export, tmp_path, monkeypatch):
    inputs = json.loads((export[1] / "lpes_onnx.json").read_text())["inputs"]
    monkeypatch.setitem(sys.modules, "tensorrt", _FakeTensorRT("10.9.0", inputs, parse_ok=False))
    monkeypatch.setattr(tensorrt_build, "gpu_info", lambda: tensorrt_build.GpuInfo("NVIDIA L4", "8.9"))
    with pytest.raises(LpesError, match=r"rejected model.onnx: unsupported \(node 'node_x', op Foo\)"):
        trt_export.build_engine_or_explain(export[1], tmp_path / "tensorrt", "float32")


# -- on a GPU with TensorRT ------------------------------------------------------------------


def _gpu_skip_reason() -> str | None:
    missing = tensorrt_build.missing_requirements()
    if missing:
        return f"builds and runs a TensorRT engine: this machine lacks {missing}"
    if not torch.cuda.is_available():
        return "the TensorRT runner needs a CUDA build of torch"
    return None


gpu = pytest.mark.skipif(_gpu_skip_reason() is not None, reason=str(_gpu_skip_reason()))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_engine_generates_like_the_reference(export, tmp_path, dtype):
    """The engine's prefill logits and greedy tokens against the PyTorch reference (patched with SPEC)."""
    from lpes.converter.loading import load_model
    from lpes.converter.reference import apply
    from lpes.exporters.onnx.parity import TOLERANCES
    from lpes.exporters.runners import TorchGreedy
    from lpes.exporters.tensorrt.runner import TrtCausalLM

    model_dir, onnx_dir = export
    profile = default_profile(MAX_POSITIONS, max_batch=4)
    assert trt_export.build_engine_or_explain(onnx_dir, tmp_path, dtype, profile) is None
    engine = TrtCausalLM(tmp_path)
    model = apply(load_model(model_dir, "float32"), SPEC).eval()
    rows = [list(range(5, 69)), list(range(10, 50)), [7]]  # 64, 40 and 1 tokens: left padding
    ids, mask, positions = left_pad(rows)
    with torch.no_grad():
        reference = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                          position_ids=torch.from_numpy(positions)).logits.float().numpy()
    logits, _ = engine.forward(ids, mask, positions)
    real = mask.astype(bool)
    assert np.abs(logits - reference)[real].max() <= TOLERANCES[dtype].bound(reference[real])
    expected = TorchGreedy(model, PAD_ID).greedy(rows, 32, None)
    assert engine.greedy(rows, 32, None) == expected
