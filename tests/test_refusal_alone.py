"""A refusal is the only line a command prints (issue 51, item 5): its warnings and notes come once every check
has held, in lpes-convert, lpes-search, lpes-validate and lpes-generate; and lpes-validate's cheap refusals (no spec
in the folder, a mistyped flag) come before torch and transformers load, as lpes-convert's do.

Each case, on the code before this, printed a warning or note and then refused (two lines), or imported torch and
transformers for seconds before saying the folder holds no spec.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lpes.converter.loading import bundled_models
from lpes.foundation.errors import LpesError

CURVE = [1.0, 1.5, 2.0, 2.5]  # for the bundled 4-layer model


def _run(main: str, argv: list[str]) -> tuple[int, str]:
    from lpes import cli

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = getattr(cli, main)(argv)
        except SystemExit as exit:  # argparse's refusals end the process as the command would
            code = exit.code
    return code, stderr.getvalue()


def _lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def _spec(path: Path, scales: list[float], **provenance) -> Path:
    path.write_text(json.dumps({"format": "lpes-spec", "version": 1, "scales": scales, "provenance": provenance}))
    return path


def test_convert_that_would_warn_of_another_model_and_refuses_prints_the_refusal_alone(tmp_path):
    spec = _spec(tmp_path / "best.json", CURVE, model={"name": "someone/another-model"})
    out = tmp_path / "out"
    code, stderr = _run("convert_main", ["lpes-tiny-kv", "--curve", str(spec), "--to", "onnx", "--out", str(out),
                                         "--no-validate", "--push-to-hub", "me/repo"])
    assert code == 2 and _lines(stderr) == [
        "lpes-convert: error: --push-to-hub uploads the Hub folder; add hf to --to"], stderr
    assert not out.exists()


def test_convert_that_would_warn_of_stretched_windows_and_refuses_prints_the_refusal_alone(tmp_path):
    from conftest import tiny_model_dir

    model = tiny_model_dir("gemma2", tmp_path)  # layers 0 and 2 slide over 16 positions, which s = 0.5 stretches
    task = {"data": None, "chat_template": False, "answer_tokens": None, "prompt_tokens": [40, 60]}
    spec = _spec(tmp_path / "best.json", [0.5, 0.5, 0.5], search={"task": task})
    code, stderr = _run("convert_main", [str(model), "--curve", str(spec), "--to", "onnx", "--out",
                                         str(tmp_path / "out"), "--no-validate", "--push-to-hub", "me/repo"])
    assert code == 2 and len(_lines(stderr)) == 1 and "--push-to-hub uploads the Hub folder" in stderr, stderr


def test_convert_says_its_warning_once_every_check_has_held(tmp_path):
    """The same warning, where nothing refuses: said (once) with the plan's notes, before any work."""
    from lpes.convert_pipeline import ConvertOptions, plan

    spec = _spec(tmp_path / "best.json", CURVE, model={"name": "someone/another-model"})
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        planned = plan(ConvertOptions(model="lpes-tiny-kv", spec=spec, out=tmp_path / "out", targets="hf",
                                      validate=False))
    assert stderr.getvalue() == ""  # nothing said while planning: a refusal there is the only line
    assert [n for n in planned.notes if "searched on someone/another-model" in n][0].startswith("warning: ")


def test_search_that_would_note_the_weights_dtype_and_refuses_prints_the_refusal_alone(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(bundled_models()["lpes-tiny-kv"], model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))  # the weights are float32
    out = tmp_path / "best.json"
    (tmp_path / "best.json.state.json").write_text(json.dumps({"settings_key": "another", "state": {
        "generation": 1, "parents": []}}))  # a checkpoint of another search: refused once the plan has held
    code, stderr = _run("search_main", [str(model), "--out", str(out), "--data", "tiny-kv:examples=1",
                                        "--holdout", "10", "--dtype", "float32"])
    assert code == 2 and len(_lines(stderr)) == 1 and "is from a search with other settings" in stderr, stderr


def test_generate_that_would_note_the_chat_template_and_refuses_prints_the_refusal_alone(tmp_path):
    from conftest import tiny_tokenizer

    from lpes.generate import generate_text

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8}))
    (tmp_path / "model.onnx").write_bytes(b"")  # an export folder: its session is never opened here
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(LpesError, match="would reach position 11, past the 8"):
        generate_text(tmp_path, "w4 w5 w6 w7 w8 w9 w10", max_new_tokens=4, chat_template=True)
    assert stderr.getvalue() == ""


def _without_torch(argv: list[str], cwd: Path) -> tuple[list[str], str]:
    """lpes-validate in a fresh interpreter: (its exit code and the heavy modules it imported, its stderr)."""
    code = (f"import sys\nfrom lpes.cli import validate_main\ncode = validate_main({argv!r})\n"
            "print(code, sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)
    return done.stdout.split(), done.stderr


def test_validate_refuses_a_model_folder_without_a_spec_before_torch_loads(tmp_path):
    """A folder with a config and weights (the bundled model's) but no lpes_spec.json: the received-folder checks
    read its config with transformers, which imported torch (7 s) before the refusal."""
    folder = tmp_path / "model"
    shutil.copytree(bundled_models()["lpes-tiny-kv"], folder)
    result, stderr = _without_torch([str(folder)], tmp_path)
    assert result == ["2", "[]"], stderr
    assert _lines(stderr) == [f"lpes-validate: error: no lpes_spec.json in {folder} (nor in its onnx/); is it an "
                              "lpes-convert output folder?"]


@pytest.mark.parametrize("device", ["gpu", "tpu:7", "cuda:x", "xpu"])
def test_validate_refuses_a_mistyped_device_before_torch_loads(tmp_path, device):
    folder = tmp_path / "model"
    shutil.copytree(bundled_models()["lpes-tiny-kv"], folder)
    _spec(folder / "lpes_spec.json", CURVE)
    result, stderr = _without_torch([str(folder), "--device", device], tmp_path)
    message = f"--device {device!r} is not a device lpes runs on (cpu, cuda, cuda:1, mps)"
    assert result == ["2", "[]"] and len(_lines(stderr)) == 1 and message in stderr, stderr
