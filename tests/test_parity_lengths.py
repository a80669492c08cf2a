"""The ONNX parity check's "were the scales lost?" guard compares where the spec differs from the unscaled model
(issue 51, item 4): a correct export never fails it.

Dynamic NTK at any factor is the unscaled model up to max_position_embeddings (transformers keeps the base until a
sequence passes it), so on the cases' 64-token prompt a correct dynamic-NTK export was "indistinguishable from the
unscaled model" and lpes-convert exited 1. It is now compared at twice the trained length, where it must also match
the reference, or said not to apply where that prompt is unaffordable; every scale 1 under linear or YaRN is the
model's own RoPE, and says so.
"""

from __future__ import annotations

import contextlib
import io
import json
from types import SimpleNamespace

import pytest

from lpes.foundation.spec import RopeScheme, Spec

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from lpes.exporters.onnx.parity import MAX_UNSCALED_POSITIONS, unscaled_length  # noqa: E402


def _config(trained: int | None) -> SimpleNamespace:
    return SimpleNamespace(max_position_embeddings=trained)


@pytest.mark.parametrize("rope, scales, trained, length, why", [
    ("linear", [2.0, 1.0, 4.0], 512, 64, None),  # scaled layers differ on the cases' own prompt
    ("yarn", [1.0, 2.0, 1.0], 512, 64, None),
    ("linear", [1.0, 1.0, 1.0], 512, None, "every layer has a scale of 1.0, which is the unscaled model's own RoPE"),
    ("yarn", [1.0, 1.0, 1.0], 512, None, "every layer has YaRN at factor 1, which is the unscaled model's own RoPE"),
    # dynamic NTK, at any factor (1 included), is the unscaled model up to the trained length: twice it
    ("dynamic", [2.0, 2.0, 2.0], 256, 512, None),
    ("dynamic", [1.0, 1.0, 1.0], 256, 512, None),
    ("dynamic", [2.0, 1.0, 3.0], 16, 64, None),  # the cases' prompt is already past 2 x 16
    ("dynamic", [2.0, 2.0, 2.0], 8192, None,
     "dynamic NTK is the unscaled model up to 8,192 positions (max_position_embeddings), and a 16,384-position "
     f"prompt that tells them apart is past the {MAX_UNSCALED_POSITIONS:,} this check prefills"),
    ("dynamic", [2.0, 2.0, 2.0], None, None, "the config states none (max_position_embeddings)"),
])
def test_the_unscaled_model_is_compared_where_the_spec_differs_from_it(rope, scales, trained, length, why):
    got_length, got_why = unscaled_length(Spec.from_scales(scales, rope=RopeScheme(rope)), _config(trained))
    assert got_length == length
    assert (got_why is None) if why is None else (why in got_why), got_why


def _dynamic_spec(path, factor: float) -> None:
    """Dynamic NTK at `factor` in every layer of the bundled 4-layer model: the stock config a user converts (a
    held-out decision never ships it: vLLM computes dynamic NTK otherwise, foundation/rope_schemes.py)."""
    path.write_text(json.dumps({"format": "lpes-spec", "version": 1, "scales": [factor] * 4, "rope_type": "dynamic"}))


def test_a_dynamic_ntk_spec_exported_to_onnx_passes(tmp_path):
    """The reported case: lpes-tiny-kv (trained on 256 positions) shipping dynamic NTK f=2 --to onnx exited 1
    although the export answers as the reference; about 30 s (an export, its parity and one example per gold)."""
    from lpes import cli

    spec, out = tmp_path / "best.json", tmp_path / "out"
    _dynamic_spec(spec, 2.0)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.convert_main(["lpes-tiny-kv", "--curve", str(spec), "--to", "onnx", "--out", str(out),
                                 "--data", "tiny-kv:examples=1"])
    report = stdout.getvalue()
    assert code == 0, report + stderr.getvalue()
    assert "ONNX parity: PASSED" in report and "were the scales lost" not in report
    assert "export vs unscaled model at 512 positions" in report  # past the 256 it was trained on
