"""Fail before the work, in one line (issue 36): every output location and resource is checked at plan time.

Each case runs a real command (in-process, or in a subprocess where the process itself is the
subject: its working directory, its permissions) and checks the contract: exit 2, exactly one
stderr line, nothing written, and for lpes-validate no prompt scored before the refusal (its
scoring function is counted, and no progress line appears).

File permissions do not deny root; as root the permission cases run with the two capabilities
that bypass them dropped (setpriv), and are skipped, saying so, where setpriv is missing.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import conftest
import pytest
import torch
from safetensors.torch import load_file, save_file

from lpes.converter.loading import bundled_models

SPEC = {"version": 1, "scales": [1.0, 1.5, 2.0, 2.5]}  # the bundled lpes-tiny-kv has 4 layers


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "spec.json"
    path.write_text(json.dumps(SPEC))
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory, spec_file) -> Path:
    """An lpes-convert output folder of the bundled model (the Hub folder; lpes-validate's DIR)."""
    from lpes.cli import convert_main

    out = tmp_path_factory.mktemp("converted") / "out"
    assert convert_main(["lpes-tiny-kv", "--curve", str(spec_file), "--to", "hf", "--no-validate",
                         "--out", str(out)]) == 0
    return out


def run(main, argv: list[str]) -> tuple[int, list[str], str]:
    """Run a command in-process: its exit status, its stderr lines, its stdout."""
    stderr, stdout = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
        code = main(argv)
    return code, stderr.getvalue().splitlines(), stdout.getvalue()


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under `folder` (hidden ones included) with its size and modification time."""
    found = {}
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = Path(root) / name
            info = path.lstat()
            found[str(path.relative_to(folder))] = (info.st_size, info.st_mtime_ns)
    return found


@pytest.fixture
def scored(monkeypatch) -> list[int]:
    """Counts the calls of lpes-validate's scoring (one per validation that reaches its prompts)."""
    from lpes.validation import variant_runs

    calls: list[int] = []
    real = variant_runs.score_all

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(variant_runs, "score_all", counting)
    return calls


def assert_refused(code: int, lines: list[str], message: str) -> None:
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert message in lines[0], lines[0]


# ---- 1. every output location and the free space, before any model is loaded or scored ----


def test_validate_refuses_a_report_name_that_is_a_folder_before_scoring(converted, tmp_path, scored):
    from lpes.cli import validate_main

    folder = tmp_path / "dir"
    shutil.copytree(converted, folder)
    (folder / "validation.json").mkdir()
    before = snapshot(folder)
    code, lines, stdout = run(validate_main, [str(folder), "--data", "tiny-kv:examples=2"])
    assert_refused(code, lines, f"cannot write {folder / 'validation.json'}: it is a folder")
    assert scored == [] and stdout == ""
    assert snapshot(folder) == before


def test_validate_refuses_a_report_name_that_is_a_link(converted, tmp_path, scored):
    from lpes.cli import validate_main

    folder = tmp_path / "dir"
    shutil.copytree(converted, folder)
    (folder / "notes.md").write_text("mine\n")
    (folder / "validation.md").symlink_to("notes.md")  # inside the folder: the received-folder check lets it be
    before = snapshot(folder)
    code, lines, _ = run(validate_main, [str(folder), "--data", "tiny-kv:examples=2"])
    assert_refused(code, lines, "validation.md is a symbolic link, which lpes did not make")
    assert scored == []
    assert snapshot(folder) == before


def test_validate_refuses_a_full_disk_before_scoring(converted, tmp_path, scored, monkeypatch):
    from lpes.cli import validate_main
    from lpes.foundation import preflight

    folder = tmp_path / "dir"
    shutil.copytree(converted, folder)
    real = shutil.disk_usage
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    before = snapshot(folder)
    code, lines, _ = run(validate_main, [str(folder), "--data", "tiny-kv:examples=2"])
    assert_refused(code, lines, f"{folder} has 1000 bytes free; this run writes up to 20.0 MiB there "
                   "(4.0 MiB estimated, and a margin)")
    assert scored == []
    assert snapshot(folder) == before


def test_validate_says_its_plan_line_and_scores(converted, tmp_path, scored):
    """The control: the same folder, nothing in the way: the plan line, then the scoring, exit 0."""
    from lpes.cli import validate_main

    folder = tmp_path / "dir"
    shutil.copytree(converted, folder)
    code, lines, _ = run(validate_main, [str(folder), "--data", "tiny-kv:examples=1"])
    assert code == 0, lines
    assert lines[0].startswith("lpes-validate: plan: writes about 4.0 MiB (20.0 MiB with the margin; ")
    assert lines[0].endswith(f" free) in {folder}")
    assert scored == [1]
    assert (folder / "validation.json").is_file()


def test_convert_refuses_a_full_disk_with_the_size_it_needs(spec_file, tmp_path, monkeypatch):
    """hf,onnx of the bundled model: the ONNX export's weights in float32 (and the Hub folder's small files)."""
    from lpes.cli import convert_main
    from lpes.converter.loading import parameter_count
    from lpes.foundation import preflight
    from lpes.foundation.devices import format_bytes

    real = shutil.disk_usage
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    work = tmp_path / "work"
    work.mkdir()
    code, lines, _ = run(convert_main, ["lpes-tiny-kv", "--curve", str(spec_file), "--to", "hf,onnx",
                                        "--out", str(work / "out")])
    onnx = parameter_count(bundled_models()["lpes-tiny-kv"]) * 4
    assert_refused(code, lines, f"{work} has 1000 bytes free; this run writes up to")
    estimate = lines[0].split("(")[1].split(" estimated")[0]
    assert onnx < preflight.with_margin(onnx) and estimate == format_bytes(onnx + (1 << 20)), lines[0]
    assert list(work.iterdir()) == []


def test_convert_says_the_estimate_in_its_plan_line(spec_file, tmp_path):
    from lpes.convert_pipeline import ConvertOptions, plan

    planned = plan(ConvertOptions(model="lpes-tiny-kv", spec=spec_file, out=tmp_path / "out", targets="hf",
                                  validate=False))
    # The Hub folder on the same filesystem as the model links its weights: config, tokenizer and code only.
    same_filesystem = os.stat(bundled_models()["lpes-tiny-kv"]).st_dev == os.stat(tmp_path).st_dev
    assert planned.notes[0].startswith("plan: writes about ")
    assert planned.notes[0].endswith(f"free) into {tmp_path / 'out'}")
    assert ("MiB (17." in planned.notes[0]) == same_filesystem, planned.notes[0]
    assert list(tmp_path.iterdir()) == []  # the test write of the staging folder left nothing


def permission_prefix() -> list[str]:
    prefix = conftest.permission_prefix()
    if prefix is None:
        pytest.skip("running as root, and without setpriv root's permission bypass cannot be dropped")
    return prefix


def run_process(command: str, argv: list[str], cwd: Path, prefix: list[str] | None = None,
                script: str | None = None) -> subprocess.CompletedProcess:
    """One lpes command in a process of its own (as the console script runs it)."""
    code = script or f"import sys; from lpes.cli import {command}; sys.exit({command}(sys.argv[1:]))"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([*(prefix or []), sys.executable, "-c", code, *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_validate_refuses_a_read_only_folder_before_scoring(converted, tmp_path):
    prefix = permission_prefix()
    folder = tmp_path / "dir"
    shutil.copytree(converted, folder)
    before = snapshot(folder)
    folder.chmod(0o555)
    try:
        done = run_process("validate_main", [str(folder), "--data", "tiny-kv:examples=2"], tmp_path, prefix)
    finally:
        folder.chmod(0o755)
    lines = done.stderr.splitlines()
    assert_refused(done.returncode, lines, f"cannot write in {folder}: Permission denied")
    assert "example/s" not in done.stderr and done.stdout == ""  # no progress line: nothing scored
    assert snapshot(folder) == before


def test_convert_refuses_a_read_only_parent_before_loading(spec_file, tmp_path):
    prefix = permission_prefix()
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        done = run_process("convert_main", ["lpes-tiny-kv", "--curve", str(spec_file), "--to", "hf",
                                            "--out", str(parent / "out")], tmp_path, prefix)
    finally:
        parent.chmod(0o755)
    assert_refused(done.returncode, done.stderr.splitlines(), f"no permission to write in {parent}")
    assert list(parent.iterdir()) == []


# ---- 2. a path with a control character cannot break the one line ----


def test_a_spec_path_with_a_newline_is_quoted_on_one_line(tmp_path):
    from lpes.cli import convert_main

    spec = tmp_path / "my\nspec.json"
    code, lines, _ = run(convert_main, ["lpes-tiny-kv", "--curve", str(spec), "--out", str(tmp_path / "out")])
    assert_refused(code, lines, f"spec file not found: {str(spec)!r}")
    assert list(tmp_path.iterdir()) == []


def test_a_path_no_message_quotes_is_still_one_line(tmp_path, spec_file):
    """The net under every message: an escape sequence in a shard's name (its message does not quote it)."""
    from lpes.cli import convert_main

    model = tmp_path / "model"
    shutil.copytree(bundled_models()["lpes-tiny-kv"], model)
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "a\x1b[2Jb\n.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    code, lines, _ = run(convert_main, [str(model), "--curve", str(spec_file), "--out", str(tmp_path / "out")])
    assert_refused(code, lines, "a\\x1b[2Jb\\n.safetensors")
    assert "\x1b" not in lines[0]


# ---- 3. the working directory ----


def test_a_deleted_working_directory_is_refused_before_torch(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    script = ("import os, sys; os.rmdir(os.getcwd()); from lpes.cli import validate_main; "
              "code = validate_main(sys.argv[1:]); print('torch' in sys.modules); sys.exit(code)")
    done = run_process("validate_main", [str(tmp_path / "dir")], gone, script=script)
    assert_refused(done.returncode, done.stderr.splitlines(), "the working directory was deleted")
    assert done.stdout == "False\n"  # refused before anything imported torch (which dies there: oneMKL)


def test_an_unreadable_working_directory_is_refused(tmp_path, spec_file):
    prefix = permission_prefix()
    here = tmp_path / "here"
    here.mkdir()
    here.chmod(0)
    try:
        done = run_process("convert_main", ["lpes-tiny-kv", "--curve", str(spec_file), "--out", "out"], here, prefix)
    finally:
        here.chmod(0o755)
    assert_refused(done.returncode, done.stderr.splitlines(), f"cannot read the working directory {here}")
    assert list(here.iterdir()) == []


# ---- 4. special files in a model or received folder; weights in another dtype than the config ----


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()


@pytest.mark.parametrize("make, kind", [(_fifo, "a FIFO (named pipe)"), (_socket, "a socket")])
def test_a_special_file_in_a_model_folder_is_refused(make, kind, tmp_path, spec_file):
    from lpes.cli import convert_main

    model = tmp_path / "model"
    shutil.copytree(bundled_models()["lpes-tiny-kv"], model)
    (model / "extra").mkdir()
    make(model / "extra" / "tokenizer.model")
    before = snapshot(tmp_path)
    code, lines, _ = run(convert_main, [str(model), "--curve", str(spec_file), "--out", str(tmp_path / "out")])
    assert_refused(code, lines, f"{model / 'extra' / 'tokenizer.model'} is {kind}; a model folder holds regular "
                   "files and folders only")
    assert snapshot(tmp_path) == before


def test_a_fifo_in_a_received_folder_is_refused_by_validate_and_generate(converted, tmp_path, scored, spec_file):
    from lpes.cli import convert_main, generate_main, validate_main

    folder = tmp_path / "dir"
    shutil.copytree(converted, folder)
    os.mkfifo(folder / "validation.json")  # a reader would block here for ever
    before = snapshot(folder)
    code, lines, _ = run(validate_main, [str(folder), "--data", "tiny-kv:examples=2"])
    assert_refused(code, lines, f"{folder / 'validation.json'} is a FIFO (named pipe); a received folder")
    assert scored == []
    onnx = tmp_path / "onnx-out"
    assert convert_main(["lpes-tiny-kv", "--curve", str(spec_file), "--to", "onnx", "--no-validate",
                         "--out", str(onnx)]) == 0
    os.mkfifo(onnx / "onnx" / "model.onnx.data.pipe")
    code, lines, stdout = run(generate_main, [str(onnx), "p3_1 f2 q3", "--max-new-tokens", "1"])
    assert_refused(code, lines, "model.onnx.data.pipe is a FIFO (named pipe); a received folder")
    assert stdout == ""
    assert snapshot(folder) == before


def test_weights_stored_unlike_the_config_are_said_in_the_plan(tmp_path, spec_file):
    """float16 weights under a config that says float32: the plan names both and the --dtype the run uses."""
    from lpes.convert_pipeline import ConvertOptions, plan

    model = tmp_path / "model"
    shutil.copytree(bundled_models()["lpes-tiny-kv"], model)
    config = json.loads((model / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "float32"
    weights = load_file(model / "model.safetensors")
    save_file({name: tensor.to(torch.float16) for name, tensor in weights.items()}, model / "model.safetensors")
    planned = plan(ConvertOptions(model=str(model), spec=spec_file, out=tmp_path / "out", targets="hf",
                                  validate=False))
    assert ("note: the weights are stored in float16, but config.json says float32; this run computes in float32 "
            "(--dtype float32; --dtype float16 keeps their precision)") in planned.notes
    same = plan(ConvertOptions(model="lpes-tiny-kv", spec=spec_file, out=tmp_path / "out2", targets="hf",
                               validate=False))
    assert not [note for note in same.notes if "stored in" in note]  # the control: weights as the config says
