"""Issue 17, items 1-3: no code run unasked, safetensors only, outputs that never destroy anything.

- Trust: `converter.trust.check_hub_code` accepts exactly the code this lpes writes and
  refuses each way a published folder could carry other code (a control shows that such
  a folder, loaded the way validation loads it, does run its code).
- Weights: only safetensors headers are checked at plan time (a sparse 8B-shaped file
  passes in milliseconds); pickles are never read, even by the loader, and never copied.
- Outputs: --force replaces only an lpes output, atomically; a lock turns a second run
  away; runs killed at each step of the replace leave the old or the new output whole,
  and the next run finishes the job (removes stale staging, puts an old output back).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_hostile_cli import RECORDS, evil_code, tree_digest

from lpes.cli import convert_main
from lpes.converter.loading import bundled_models, check_weights, load_model
from lpes.converter.trust import check_hub_code
from lpes.foundation.errors import LpesError
from lpes.foundation.outputs import MARKER

SPEC_A = [1.0, 1.5, 2.0, 1.0]
SPEC_B = [1.0, 2.0, 2.0, 1.0]
CHILD_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}


def write_spec(path: Path, scales: list[float]) -> Path:
    path.write_text(json.dumps({"version": 1, "scales": scales}))
    return path


def convert_args(model: str | Path, spec: Path, out: Path, *extra: str) -> list[str]:
    return [str(model), "--curve", str(spec), "--to", "hf", "--no-validate", "--out", str(out), *extra]


def siblings(out: Path) -> list[str]:
    """What lpes keeps next to `out` (lock, staging, aside): nothing once a run is done."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Two outputs of the bundled model, spec A and spec B, and their digests."""
    root = tmp_path_factory.mktemp("made")
    outs = {}
    for name, scales in (("a", SPEC_A), ("b", SPEC_B)):
        spec = write_spec(root / f"{name}.json", scales)
        assert convert_main(convert_args("lpes-tiny-kv", spec, root / name)) == 0
        outs[name] = (spec, root / name, tree_digest(root / name))
    return outs


# ---- trust ----


def test_check_hub_code_accepts_what_this_lpes_writes(made, tmp_path):
    check_hub_code(made["a"][1])
    uniform = write_spec(tmp_path / "uniform.json", [2.0] * 4)  # one scale: a stock config, no code to check
    assert convert_main(convert_args("lpes-tiny-kv", uniform, tmp_path / "stock")) == 0
    assert not (tmp_path / "stock" / "modeling_lpes.py").exists()
    check_hub_code(tmp_path / "stock")


def _append(name: str, text: str):
    def change(folder: Path) -> None:
        path = folder / name
        path.write_text(path.read_text() + text)
    return change


def _edit_json(name: str, edit):
    def change(folder: Path) -> None:
        path = folder / name
        data = json.loads(path.read_text()) if path.exists() else {}
        edit(data)
        path.write_text(json.dumps(data))
    return change


def _rendered_from_config(edit):
    """Change config.json and write the modeling_lpes.py that lpes's own renderer makes from it."""
    def change(folder: Path) -> None:
        from lpes.converter.hf_folder import render_modeling

        data = json.loads((folder / "config.json").read_text())
        edit(data)
        (folder / "config.json").write_text(json.dumps(data))
        (folder / "modeling_lpes.py").write_text(render_modeling(data))
    return change


def _set_base_class(value: str):
    return _rendered_from_config(lambda c: c["lpes"].update(base_architecture=value))


HOSTILE_FOLDERS = {
    "code appended to modeling_lpes.py": (_append("modeling_lpes.py", "\nimport os\n"), "modeling_lpes.py differs"),
    "one character of modeling_lpes.py": (
        lambda f: (f / "modeling_lpes.py").write_text((f / "modeling_lpes.py").read_text().replace("h", "H", 1)),
        "modeling_lpes.py differs"),
    "code appended to lpes_rope.py": (_append("lpes_rope.py", "\nimport os\n"), "lpes_rope.py differs"),
    # A consistent pair: config value and file agree, but the value carries code into the template.
    "code in a config value, rendered": (_set_base_class('LlamaForCausalLM"\nimport os\nX = "'),
                                         "modeling_lpes.py differs"),
    "written by another lpes version": (
        _rendered_from_config(lambda c: c["lpes"].update(lpes_version="0.0.1")), "lpes-convert 0.0.1 wrote it"),
    "auto_map to another module": (_edit_json("config.json", lambda c: c["auto_map"].update(AutoModel="evil.X")),
                                   "auto_map entry 'evil.X'"),
    "auto_map to another repository": (
        _edit_json("config.json", lambda c: c["auto_map"].update(AutoModel="me/repo--modeling_lpes.LpesModel")),
        "points at code lpes did not write"),
    "auto_map in tokenizer_config.json": (
        _edit_json("tokenizer_config.json", lambda c: c.update(auto_map={"AutoTokenizer": ["evil.T", None]})),
        "tokenizer_config.json: auto_map entry 'evil.T'"),
    "python file in a subfolder": (lambda f: (f / "onnx").mkdir() or (f / "onnx" / "x.py").write_text(""),
                                   "onnx/x.py is Python code that lpes did not write"),
    "auto_map without modeling_lpes.py": (lambda f: (f / "modeling_lpes.py").unlink(), "has no modeling_lpes.py"),
    "config.json not JSON": (lambda f: (f / "config.json").write_text("{"), "cannot read"),
}


@pytest.mark.parametrize("change, message", HOSTILE_FOLDERS.values(), ids=list(HOSTILE_FOLDERS))
def test_check_hub_code_refuses_other_code(made, tmp_path, change, message):
    folder = tmp_path / "hub"
    shutil.copytree(made["a"][1], folder)
    change(folder)
    with pytest.raises(LpesError, match="^.*" + message.replace("(", r"\(").replace(".", r"\.")) as err:
        check_hub_code(folder)
    assert "\n" not in str(err.value)


def test_control_a_poisoned_folder_runs_its_code_when_loaded_unchecked(made, tmp_path):
    """What check_hub_code prevents: transformers imports the folder's modeling_lpes.py and runs it."""
    folder, marker = tmp_path / "hub", tmp_path / "CODE-RAN"
    shutil.copytree(made["a"][1], folder)
    (folder / "modeling_lpes.py").write_text(evil_code(marker) + (folder / "modeling_lpes.py").read_text())
    code = ("from transformers import AutoModelForCausalLM\n"
            f"AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True)\n")
    env = {**CHILD_ENV, "HF_MODULES_CACHE": str(tmp_path / "modules")}
    subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=300)
    assert marker.read_text() == "ran"
    with pytest.raises(LpesError, match="modeling_lpes.py differs"):
        check_hub_code(folder)


def test_tokenizer_auto_map_runs_nothing(tmp_path):
    """lpes-generate and validation load tokenizers from folders they are given: trust_remote_code=False."""
    from lpes.converter.loading import load_tokenizer

    folder, marker = tmp_path / "tok", tmp_path / "CODE-RAN"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(bundled_models()["lpes-tiny-kv"] / name, folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(auto_map={"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]}, tokenizer_class="Evil")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(evil_code(marker))
    try:
        load_tokenizer(folder)
    except LpesError:
        pass  # refusing is fine too; running evil.py or prompting is not
    assert not marker.exists()


# ---- weights ----


def write_sparse_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], cut: int = 0) -> int:
    """A valid safetensors header for float16 tensors of `shapes`, the data left as a hole (no disk used)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2 * int(torch.tensor(shape).prod())
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(blob)) + blob)
        handle.truncate(8 + len(blob) + offset - cut)
    return offset


def test_sparse_8b_shaped_checkpoint_passes_in_milliseconds(tmp_path):
    layers = {f"model.layers.{i}.mlp.up_proj.weight": (14336, 4096) for i in range(32)}
    size = write_sparse_safetensors(tmp_path / "model.safetensors", layers)
    assert size > 3.5e9
    started = time.perf_counter()
    assert check_weights(tmp_path) == [tmp_path / "model.safetensors"]
    assert time.perf_counter() - started < 1.0


def test_truncated_by_one_byte_is_refused(tmp_path):
    write_sparse_safetensors(tmp_path / "model.safetensors", {"w": (64, 64)}, cut=1)
    with pytest.raises(LpesError, match="model.safetensors is truncated or not safetensors"):
        check_weights(tmp_path)


@pytest.mark.parametrize("weight_map, message", [
    ({"w": "model-00001.safetensors", "v": "model-00002.safetensors"}, "shard model-00002.safetensors .* is missing"),
    ({"w": "../elsewhere.safetensors"}, "shards must be .safetensors files beside it"),
    ({"w": "pytorch_model-00001.bin"}, "shards must be .safetensors files beside it"),
    ({}, "'weight_map' must map"),
])
def test_sharded_index_is_checked(tmp_path, weight_map, message):
    write_sparse_safetensors(tmp_path / "model-00001.safetensors", {"w": (8, 8)})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(LpesError, match=message):
        check_weights(tmp_path)


@pytest.mark.parametrize("files, message", [
    (["pytorch_model.bin"], "has only pickle weights \\(pytorch_model.bin\\)"),
    (["consolidated.pth"], "has only pickle weights \\(consolidated.pth\\)"),
    (["model.gguf"], "has model.gguf but no model.safetensors"),
    ([], "has no weights"),
])
def test_folders_without_safetensors_are_refused(tmp_path, files, message):
    for name in files:
        (tmp_path / name).write_bytes(b"\x80\x04N.")  # pickle of None
    with pytest.raises(LpesError, match=message):
        check_weights(tmp_path)


def test_the_loader_never_unpickles_even_unchecked(tmp_path):
    """A plain state-dict pickle, which transformers would load without use_safetensors=True."""
    folder = tmp_path / "model"
    shutil.copytree(bundled_models()["lpes-tiny-kv"], folder)
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    with pytest.raises(OSError, match="safetensors"):
        load_model(folder)


def test_pickles_are_not_copied_into_the_hub_folder(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(bundled_models()["lpes-tiny-kv"], model)
    for name in ("pytorch_model.bin", "training_args.bin", "pytorch_model.bin.index.json", "optimizer.pt"):
        (model / name).write_bytes(b"\x80\x04N.")
    spec = write_spec(tmp_path / "spec.json", SPEC_A)
    assert convert_main(convert_args(model, spec, tmp_path / "out")) == 0
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert "model.safetensors" in names
    assert not {n for n in names if n.endswith((".bin", ".pt", ".bin.index.json"))}


# ---- outputs ----


def test_force_replaces_an_lpes_output_and_leaves_nothing_beside_it(made, tmp_path):
    spec_a, _, digest_a = made["a"]
    spec_b, _, digest_b = made["b"]
    out = tmp_path / "out"
    assert convert_main(convert_args("lpes-tiny-kv", spec_a, out)) == 0
    assert tree_digest(out) == digest_a
    assert convert_main(convert_args("lpes-tiny-kv", spec_b, out)) == 2  # no --force: refused
    assert convert_main(convert_args("lpes-tiny-kv", spec_b, out, "--force")) == 0
    assert tree_digest(out) == digest_b
    assert siblings(out) == []


def test_marker_names_no_path_of_this_machine(made):
    text = (made["a"][1] / MARKER).read_text()
    assert json.loads(text)["format"] == "lpes-output"
    assert str(made["a"][1].parent) not in text and "/" not in text


def test_an_empty_folder_may_be_replaced_with_force(made, tmp_path):
    (tmp_path / "out").mkdir()
    assert convert_main(convert_args("lpes-tiny-kv", made["a"][0], tmp_path / "out", "--force")) == 0
    assert (tmp_path / "out" / MARKER).is_file()


# ---- --force replaces what lpes wrote, never what it did not (issue 51) ----


def _quick_cli(main: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`main(argv)` in a child that prints its exit code and whether torch or transformers loaded."""
    code = (f"import sys\nfrom lpes.cli import {main}\ncode = {main}({argv!r})\n"
            "print(code, sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=CHILD_ENV)


@pytest.mark.parametrize("flag", ["--curve", "--data", "--data kv:file="])
def test_an_input_inside_the_out_force_would_replace_is_refused_before_torch_loads(made, tmp_path, flag):
    """The report: `--curve OUT/best.json --out OUT --force` deleted the spec and the user's notes, exit 0."""
    out = tmp_path / "out"
    shutil.copytree(made["a"][1], out)
    shutil.copy(made["a"][0], out / "best.json")
    shutil.copy(RECORDS, out / "records.jsonl.gz")
    (out / "notes.txt").write_text("the user's\n")
    before = tree_digest(out)
    spec, data = (out / "best.json", None) if flag == "--curve" else (made["a"][0], out / "records.jsonl.gz")
    argv = ["lpes-tiny-kv", "--curve", str(spec), "--to", "hf", "--out", str(out), "--force"]
    if data is not None:
        argv += ["--data", f"kv:file={data}" if flag.endswith("=") else str(data)]
    done = _quick_cli("convert_main", argv, tmp_path)
    assert done.stdout.split() == ["2", "[]"], done.stdout + done.stderr
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 1 and f"is inside --out {out}, which --force would replace" in errors[0], done.stderr
    assert errors[0].startswith(f"lpes-convert: error: {flag.split()[0]} ")
    assert tree_digest(out) == before and siblings(out) == []


def test_a_search_data_file_that_is_its_out_is_refused(tmp_path):
    data = tmp_path / "records.jsonl.gz"
    shutil.copy(RECORDS, data)
    done = _quick_cli("search_main", ["lpes-tiny-kv", "--data", str(data), "--out", str(data), "--force"], tmp_path)
    assert done.stdout.split() == ["2", "[]"], done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and f"--data {data} is --out {data}, which --force" in done.stderr
    assert data.read_bytes() == RECORDS.read_bytes()


def _plant(name: str, text: str = "the user's\n"):
    def plant(out: Path) -> None:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    return plant


def _edit(name: str):
    def edit(out: Path) -> None:
        (out / name).write_text((out / name).read_text() + "\nMy own note.\n")
    return edit


def _old_marker(out: Path) -> None:  # what lpes wrote before its marker listed the files
    (out / MARKER).write_text(json.dumps({"format": "lpes-output", "written_by": "lpes 0.0.9"}) + "\n")


FOREIGN = {
    "a notes file": (_plant("notes.txt"), "holds notes.txt, which lpes did not write"),
    "a spec kept there": (_plant("best.json", json.dumps({"version": 1, "scales": SPEC_B})),
                          "holds best.json, which lpes did not write"),
    "a file in a folder of the user's": (_plant("mine/thesis.tex"), "holds mine/, which lpes did not write"),
    "an empty folder": (lambda out: (out / "empty").mkdir(), "holds empty/, which lpes did not write"),
    "a link": (lambda out: (out / "link").symlink_to("/etc"), "holds link, which lpes did not write"),
    "an edited model card": (_edit("README.md"), "holds README.md, which was changed since lpes wrote it"),
    "an edited config of the same size": (
        lambda out: (out / "config.json").write_text((out / "config.json").read_text().replace('"', "'", 1)),
        "holds config.json, which was changed since lpes wrote it"),
    "a marker that lists no files": (_old_marker, "was written by an older lpes (its .lpes-output lists no files)"),
}


@pytest.mark.parametrize("plant", FOREIGN, ids=list(FOREIGN))
def test_force_refuses_to_replace_what_lpes_did_not_write(made, tmp_path, capsys, plant):
    change, message = FOREIGN[plant]
    out = tmp_path / "out"
    shutil.copytree(made["a"][1], out, symlinks=True)
    change(out)
    before = tree_digest(out)
    capsys.readouterr()
    assert convert_main(convert_args("lpes-tiny-kv", made["b"][0], out, "--force")) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and message in errors[0], errors
    assert tree_digest(out) == before and siblings(out) == []


def test_a_file_planted_after_the_plan_is_refused_under_the_lock(made, tmp_path):
    from lpes.convert_pipeline import ConvertOptions, execute, plan

    out = tmp_path / "out"
    shutil.copytree(made["a"][1], out)
    planned = plan(ConvertOptions("lpes-tiny-kv", made["b"][0], out, "hf", force=True, validate=False))
    (out / "notes.txt").write_text("the user's\n")
    with pytest.raises(LpesError, match="holds notes.txt, which lpes did not write"):
        execute(planned)
    assert (out / "notes.txt").read_text() == "the user's\n" and siblings(out) == []


def test_force_replaces_what_lpes_validate_and_an_interrupted_write_left(made, tmp_path):
    """lpes-validate's reports (recorded in the marker as it writes them) and a killed atomic write's temporary
    file are lpes's: --force replaces the folder with them, and the new marker lists every file it holds."""
    from lpes.foundation.outputs import record_written

    out = tmp_path / "out"
    shutil.copytree(made["a"][1], out)
    (out / "validation.skipped.json").write_text("{}\n")  # what lpes-validate writes, then records
    (out / "README.md").write_text((out / "README.md").read_text() + "\nvalidated again\n")
    record_written(out, [out / "validation.skipped.json", out / "README.md"])
    (out / ".config.json.k2x9_q0a.tmp.json").write_text("{")  # save_atomic killed before its rename
    assert convert_main(convert_args("lpes-tiny-kv", made["b"][0], out, "--force")) == 0
    assert tree_digest(out) == made["b"][2] and siblings(out) == []
    listed = json.loads((out / MARKER).read_text())["files"]
    assert sorted(listed) == sorted(p.name for p in out.iterdir() if p.name != MARKER)
    assert convert_main(convert_args("lpes-tiny-kv", made["a"][0], out, "--force")) == 0  # and again


def test_a_held_lock_turns_the_run_away(made, tmp_path, capsys):
    out = tmp_path / "out"
    with open(tmp_path / ".out.lpes-lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # what a running lpes-convert on the same --out holds
        capsys.readouterr()
        assert convert_main(convert_args("lpes-tiny-kv", made["a"][0], out)) == 2
        assert "another lpes run is writing" in capsys.readouterr().err
        assert not out.exists()
    assert convert_main(convert_args("lpes-tiny-kv", made["a"][0], out)) == 0
    assert siblings(out) == []


def test_two_concurrent_runs_one_wins(made, tmp_path):
    out = tmp_path / "out"
    argv = [str(Path(sys.executable).parent / "lpes-convert"), *convert_args("lpes-tiny-kv", made["a"][0], out)]
    runs = [subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=CHILD_ENV)
            for _ in range(2)]
    results = sorted((run.wait(timeout=300), run.stderr.read()) for run in runs)
    assert [code for code, _ in results] == [0, 2], results
    loser = results[1][1].strip().splitlines()[-1]
    assert "another lpes run is writing" in loser or "exists; pass --force" in loser, loser
    assert tree_digest(out) == made["a"][2]
    assert siblings(out) == []


CHILD = r'''
import os, signal, sys, time
from lpes.foundation import outputs
from lpes.cli import convert_main

point, argv = sys.argv[1], sys.argv[2:]
real_swap, real_exchange, real_rename, real_unlink = outputs._swap_in, outputs._exchange, os.rename, os.unlink


def die_after(fn, calls):
    count = 0
    def wrapped(*args, **kwargs):
        nonlocal count
        result = fn(*args, **kwargs)
        count += 1
        if count == calls:
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    return wrapped


def exchange_then_die_while_removing(a, b):
    done = real_exchange(a, b)
    os.unlink = die_after(real_unlink, 3)
    return done


def swap_in(staging, out):
    if point == "before-swap":
        os.kill(os.getpid(), signal.SIGKILL)
    if point == "sigterm":
        print("swapping", flush=True)
        time.sleep(120)
    if point == "exchanged":
        outputs._exchange = die_after(real_exchange, 1)
    if point == "removing-old":
        outputs._exchange = exchange_then_die_while_removing
    if point.startswith("two-renames"):  # a system without an atomic exchange
        outputs._exchange = lambda a, b: False
        os.rename = die_after(real_rename, 1 if point == "two-renames-aside" else 2)
    return real_swap(staging, out)


outputs._swap_in = swap_in
sys.exit(convert_main(argv))
'''

# kill point -> what `out` holds right after the kill ("a": old, "b": new, None: nothing, the old is aside)
KILL_POINTS = {"before-swap": "a", "exchanged": "b", "removing-old": "b", "two-renames-aside": None,
               "two-renames-in": "b"}


def run_child(tmp_path: Path, point: str, argv: list[str], **popen) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return subprocess.Popen([sys.executable, str(script), point, *argv], env=CHILD_ENV, text=True, **popen)


@pytest.mark.parametrize("point", KILL_POINTS)
def test_killed_force_replace_leaves_old_or_new_whole_and_the_next_run_recovers(made, tmp_path, point):
    spec_a, _, digest_a = made["a"]
    spec_b, _, digest_b = made["b"]
    out = tmp_path / "out"
    shutil.copytree(made["a"][1], out)
    child = run_child(tmp_path, point, convert_args("lpes-tiny-kv", spec_b, out, "--force"),
                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert child.wait(timeout=300) == -signal.SIGKILL, child.stderr.read()[-3000:]
    left = KILL_POINTS[point]
    if left is None:
        assert not out.exists() and tree_digest(tmp_path / ".out.lpes-old") == digest_a
    else:
        assert tree_digest(out) == {"a": digest_a, "b": digest_b}[left]
    assert siblings(out), "the kill should have left something to recover"
    # The next run on `out`, without --force: it puts an old output back, then refuses to replace it.
    code = convert_main(convert_args("lpes-tiny-kv", spec_a, out))
    if left is None:
        assert code == 2 and tree_digest(out) == digest_a
    # And with --force: whatever was left is cleaned up, and the new output is whole.
    assert convert_main(convert_args("lpes-tiny-kv", spec_b, out, "--force")) == 0
    assert tree_digest(out) == digest_b
    assert siblings(out) == []


def test_sigterm_removes_the_staging_folder(made, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(made["a"][1], out)
    child = run_child(tmp_path, "sigterm", convert_args("lpes-tiny-kv", made["b"][0], out, "--force"),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout.readline().strip() == "swapping"
    assert any(name.startswith(".out.lpes-partial-") for name in siblings(out))
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == 130
    assert "interrupted" in child.stderr.read()
    assert tree_digest(out) == made["a"][2]
    assert siblings(out) == []
