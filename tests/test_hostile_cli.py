"""Mistaken and hostile inputs to the real command-line tools: one line on stderr, exit 2, nothing changed.

Each row runs one installed CLI (.venv/bin/lpes-*) in a subprocess, with its working
directory in a sandbox of its own that holds a copy of the bundled model, a spec, a
plain file and a folder of the user's. The whole sandbox is hashed before and after:
a refused command must leave every byte, name and mode as it was. Rows that feed
code to the tools check that a marker file the code would create does not exist,
with `y` on stdin so that a prompt, had there been one, would have been answered yes.

File permissions do not deny root: when the tests run as root, the rows that rely on them
run under setpriv with root's permission bypass (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH) dropped,
as tests/test_preflight.py does, and are skipped (saying so) only where setpriv is missing.
The rows run four at a time (each spends seconds importing torch and transformers).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import resource
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import conftest
import pytest

from lpes.converter.loading import bundled_models

BIN = Path(sys.executable).parent
RECORDS = Path(__file__).parent / "data" / "kv-retrieval-75_keys.first12.jsonl.gz"  # words lpes-tiny-kv lacks


@dataclass(frozen=True)
class Row:
    id: str
    argv: tuple[str, ...]  # {model} {models} {spec} {file} {mine} {hub} {stock_hub} {work} {marker} {records}
    message: str  # a part of the one stderr line
    setup: str | None = None  # name of a function below that prepares the sandbox
    full_disk: bool = False  # run under a 4 KiB file size limit (SIGXFSZ ignored: writes fail with EFBIG)
    permissions: bool = False  # relies on file permissions (root's bypass dropped when the tests run as root)
    unwritable: str | None = None  # a system folder that must refuse writes even to root, else the row is skipped
    unchanged: bool = True  # False: the sandbox may change (only the row's own expectations apply)


CONVERT = ("lpes-convert", "{model}", "--curve", "{spec}", "--to", "hf", "--no-validate", "--force", "--out")
PLAIN_CONVERT = ("lpes-convert", "{model}", "--curve", "{spec}", "--to", "hf", "--no-validate", "--out")
SEARCH = ("lpes-search", "{model}", "--population", "2", "--generations", "0", "--out")

ROWS = [
    # --out that would destroy something (issue 17: "Data lost"), all with --force
    Row("out-dot", (*CONVERT, "."), "is the current directory"),
    Row("out-empty", (*CONVERT, ""), "--out is empty"),
    Row("out-model", (*CONVERT, "{model}"), "is the model folder"),
    Row("out-parent-of-model", (*CONVERT, "{models}"), "holds the model folder"),
    Row("out-inside-model", (*CONVERT, "{model}/sub"), "is inside the model folder"),
    Row("out-ancestor-of-cwd", (*CONVERT, ".."), "holds the current directory"),
    Row("out-file", (*CONVERT, "{file}"), "is a file"),
    Row("out-not-lpes", (*CONVERT, "{mine}"), "was not written by lpes-convert"),
    Row("out-symlink", (*CONVERT, "{work}/link"), "is a symbolic link", setup="symlink_to_mine"),
    Row("out-under-dev-null", (*CONVERT, "/dev/null/x"), "/dev/null is not a folder"),
    Row("out-name-too-long", (*CONVERT, "x" * 240), "is too long"),
    Row("out-read-only-parent", (*CONVERT, "{work}/ro/out"), "no permission to write", setup="read_only_folder",
        permissions=True),
    Row("out-in-unwritable-system-folder", (*CONVERT, "/proc/sys/lpes-out"), "no permission to write in /proc/sys",
        unwritable="/proc/sys"),
    Row("out-full-disk", (*PLAIN_CONVERT, "{work}/new"), "File too large", full_disk=True),
    # model folders that would run code or unpickle (issue 17: "Code run without being asked")
    Row("model-auto-map", (*PLAIN_CONVERT, "{work}/out"), "holds custom model code (auto_map", setup="auto_map_model"),
    Row("model-pickle-only", (*PLAIN_CONVERT, "{work}/out"), "has only pickle weights (pytorch_model.bin)",
        setup="pickle_only_model"),
    Row("model-no-weights", (*PLAIN_CONVERT, "{work}/out"), "has no weights", setup="no_weights_model"),
    Row("model-truncated-weights", (*PLAIN_CONVERT, "{work}/out"), "is truncated or not safetensors",
        setup="truncated_model"),
    Row("model-unreadable", (*PLAIN_CONVERT, "{work}/out"), "cannot read the model folder",
        setup="unreadable_model", permissions=True),
    Row("model-is-a-file", ("lpes-convert", "{file}", "--curve", "{spec}", "--to", "hf", "--out", "{work}/out"),
        "is a file, not a model folder"),
    # lpes-search: its --out is one file, written atomically; the model folder is checked as above
    Row("search-out-folder", (*SEARCH, "{mine}"), "is a folder; name the spec file"),
    Row("search-out-in-model", (*SEARCH, "{model}/best.json"), "is inside the model folder"),
    Row("search-pickle-only", (*SEARCH, "{work}/best.json"), "has only pickle weights", setup="pickle_only_model"),
    # lpes-validate on a downloaded Hub folder: its code must be lpes's own, byte for byte
    Row("validate-poisoned-modeling", ("lpes-validate", "{hub}", "--model", "{model}"),
        "modeling_lpes.py differs from the modeling_lpes.py that lpes", setup="poison_modeling"),
    Row("validate-poisoned-rope", ("lpes-validate", "{hub}", "--model", "{model}"),
        "lpes_rope.py differs from the lpes_rope.py that lpes", setup="poison_rope"),
    Row("validate-auto-map-elsewhere", ("lpes-validate", "{hub}", "--model", "{model}"),
        "auto_map entry 'evil.EvilForCausalLM' points at code lpes did not write", setup="hub_auto_map_to_evil"),
    Row("validate-stray-python", ("lpes-validate", "{hub}", "--model", "{model}"),
        "evil.py is Python code that lpes did not write", setup="hub_stray_python"),
    Row("validate-pickle-only-hub", ("lpes-validate", "{hub}", "--model", "{model}"), "has only pickle weights",
        setup="hub_pickle_only"),
    Row("validate-auto-map-base-model", ("lpes-validate", "{hub}", "--model", "{model}"),
        "holds custom model code (auto_map", setup="auto_map_model"),
    # issue 43: a stock Hub folder (no lpes code) with pickle weights only, refused before the reference is scored
    Row("validate-pickle-only-stock-hub", ("lpes-validate", "{stock_hub}", "--model", "{model}"),
        "has only pickle weights (pytorch_model.bin); lpes never unpickles", setup="stock_hub_pickle_only"),
    Row("validate-pickle-pt-stock-hub", ("lpes-validate", "{stock_hub}", "--model", "{model}"),
        "has only pickle weights (consolidated.pt)", setup="stock_hub_pt_only"),
    # issue 43: --data records in words the tokenizer lacks: the refusal is the only line (no plan line before it)
    Row("validate-records-outside-vocabulary", ("lpes-validate", "{hub}", "--model", "{model}", "--data",
                                                "{records}"), "the word 'Extract' is not in the model's vocabulary"),
    Row("convert-records-outside-vocabulary", (*PLAIN_CONVERT[:-2], "--data", "{records}", "--out", "{work}/out"),
        "the word 'Extract' is not in the model's vocabulary"),
    # issue 43: curves float64 cannot evaluate: one line naming the point, nothing written
    Row("curve-x-far-from-zero", (*PLAIN_CONVERT, "{work}/out"), "control point P0 (x 1e+16) is too far from 0",
        setup="curve_far_from_zero"),
    Row("curve-x-not-representable", (*PLAIN_CONVERT, "{work}/out"),
        "'curve.control_points[1]' has x 10000000000000001, which float64 cannot represent exactly",
        setup="curve_unrepresentable_x"),
    Row("curve-x-span-subnormal", (*PLAIN_CONVERT, "{work}/out"), "control point P1 (x 5e-324) is too close to P0",
        setup="curve_subnormal_span"),
]


# ---- sandbox ----


def tree_digest(root: Path) -> dict[str, str]:
    """Every path under `root` (hidden ones too) -> its kind, mode and content hash."""
    digest = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if path.is_symlink():
            what = "link:" + os.readlink(path)
        elif path.is_dir():
            what = "dir"
        else:
            what = "file:" + hashlib.sha256(path.read_bytes()).hexdigest()
        digest[str(path.relative_to(root))] = f"{oct(info.st_mode)} {what}"
    return digest


@dataclass
class Sandbox:
    root: Path
    fill: dict[str, str] = field(default_factory=dict)

    @property
    def model(self) -> Path:
        return Path(self.fill["model"])

    @property
    def hub(self) -> Path:
        return Path(self.fill["hub"])

    @property
    def marker(self) -> Path:
        return Path(self.fill["marker"])


def make_sandbox(root: Path, hub_source: Path, stock_hub_source: Path) -> Sandbox:
    models, work, mine = root / "models", root / "work", root / "mine"
    shutil.copytree(bundled_models()["lpes-tiny-kv"], models / "tiny")
    work.mkdir()
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work\n")
    (root / "notes.txt").write_text("a file of the user's\n")
    (root / "spec.json").write_text(json.dumps({"version": 1, "scales": [1.0, 1.5, 2.0, 1.0]}))
    shutil.copytree(hub_source, root / "hub")
    shutil.copytree(stock_hub_source, root / "stock-hub")
    fill = {"model": models / "tiny", "models": models, "spec": root / "spec.json", "file": root / "notes.txt",
            "mine": mine, "hub": root / "hub", "stock_hub": root / "stock-hub", "work": work,
            "marker": root / "CODE-RAN", "records": RECORDS}
    return Sandbox(root, {k: str(v) for k, v in fill.items()})


def evil_code(marker: Path) -> str:
    return f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"


# setups: each prepares one hostile input inside the sandbox


def symlink_to_mine(box: Sandbox) -> None:
    (Path(box.fill["work"]) / "link").symlink_to(box.fill["mine"])


def read_only_folder(box: Sandbox) -> None:
    folder = Path(box.fill["work"]) / "ro"
    folder.mkdir()
    folder.chmod(0o555)


def auto_map_model(box: Sandbox) -> None:
    config = json.loads((box.model / "config.json").read_text())
    config.update(model_type="evilllama", auto_map={"AutoConfig": "evil.EvilConfig",
                                                    "AutoModelForCausalLM": "evil.EvilForCausalLM"})
    (box.model / "config.json").write_text(json.dumps(config))
    (box.model / "evil.py").write_text(evil_code(box.marker) + "from transformers import LlamaConfig\n"
                                       "class EvilConfig(LlamaConfig):\n    model_type = 'evilllama'\n")


class _Unpickled:
    """Unpickling this runs code (writes the marker)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (evil_code(self.marker),)


def pickle_only_model(box: Sandbox) -> None:
    (box.model / "model.safetensors").unlink()
    (box.model / "pytorch_model.bin").write_bytes(pickle.dumps(_Unpickled(box.marker)))


def no_weights_model(box: Sandbox) -> None:
    (box.model / "model.safetensors").unlink()


def truncated_model(box: Sandbox) -> None:
    weights = box.model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100_000])


def unreadable_model(box: Sandbox) -> None:
    box.model.chmod(0)


def poison_modeling(box: Sandbox) -> None:
    path = box.hub / "modeling_lpes.py"
    path.write_text(evil_code(box.marker) + path.read_text())


def poison_rope(box: Sandbox) -> None:
    path = box.hub / "lpes_rope.py"
    path.write_text(path.read_text() + "\n" + evil_code(box.marker))


def hub_auto_map_to_evil(box: Sandbox) -> None:
    config = json.loads((box.hub / "config.json").read_text())
    config["auto_map"]["AutoModelForCausalLM"] = "evil.EvilForCausalLM"
    (box.hub / "config.json").write_text(json.dumps(config))
    (box.hub / "evil.py").write_text(evil_code(box.marker))


def hub_stray_python(box: Sandbox) -> None:
    (box.hub / "evil.py").write_text(evil_code(box.marker))


def hub_pickle_only(box: Sandbox) -> None:
    (box.hub / "model.safetensors").unlink()
    (box.hub / "pytorch_model.bin").write_bytes(pickle.dumps(_Unpickled(box.marker)))


def stock_hub_pickle_only(box: Sandbox) -> None:
    stock = Path(box.fill["stock_hub"])
    (stock / "model.safetensors").unlink()
    (stock / "pytorch_model.bin").write_bytes(pickle.dumps(_Unpickled(box.marker)))


def stock_hub_pt_only(box: Sandbox) -> None:
    stock = Path(box.fill["stock_hub"])
    (stock / "model.safetensors").unlink()
    (stock / "consolidated.pt").write_bytes(pickle.dumps(_Unpickled(box.marker)))


def _curve_spec(path: Path, points: list) -> None:
    path.write_text(json.dumps({"version": 1, "curve": {"control_points": points}}))


def curve_far_from_zero(box: Sandbox) -> None:  # float64 spaces numbers 2 apart at 1e16: two layers one position
    _curve_spec(Path(box.fill["spec"]), [[1e16, 4.0], [1e16 + 2, 2.0], [1e16 + 4, 1.0]])


def curve_unrepresentable_x(box: Sandbox) -> None:  # 10000000000000001 reads as 1e16, the same as point 0
    points = "[[10000000000000000, 4.0], [10000000000000001, 2.0], [10000000000000004, 1.0]]"
    Path(box.fill["spec"]).write_text('{"version": 1, "curve": {"control_points": ' + points + "}}")


def curve_subnormal_span(box: Sandbox) -> None:
    _curve_spec(Path(box.fill["spec"]), [[0, 4.0], [5e-324, 1.0]])


# ---- running ----


def small_file_limit() -> None:
    """In the child: writes past 4 KiB fail with EFBIG, as on a full disk, instead of killing it."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def row_skip(row: Row) -> str | None:
    if row.unwritable and os.access(row.unwritable, os.W_OK):
        return f"{row.unwritable} is writable here"
    if row.permissions and conftest.permission_prefix() is None:
        return "runs as root, whom file permissions do not deny, and setpriv is missing to drop root's bypass"
    return None


def run_row(row: Row, box: Sandbox, home: Path) -> subprocess.CompletedProcess:
    argv = [str(BIN / row.argv[0])] + [a.format(**box.fill) for a in row.argv[1:]]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "HOME": str(home),
           "HF_HOME": str(home / "hf"), "MPLCONFIGDIR": str(home / "mpl")}
    preexec = small_file_limit if row.full_disk else None
    prefix = conftest.permission_prefix() if row.permissions else []
    return subprocess.run([*prefix, *argv], cwd=box.fill["work"], input="y\ny\n", capture_output=True, text=True,
                          env=env, timeout=300, preexec_fn=preexec)


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory) -> Path:
    """A Hub folder lpes-convert wrote (per-layer scales, so it holds modeling_lpes.py)."""
    from lpes.cli import convert_main

    root = tmp_path_factory.mktemp("hub")
    (root / "spec.json").write_text(json.dumps({"version": 1, "scales": [1.0, 1.5, 2.0, 1.0]}))
    assert convert_main(["lpes-tiny-kv", "--curve", str(root / "spec.json"), "--to", "hf", "--no-validate",
                         "--out", str(root / "hub")]) == 0
    assert (root / "hub" / "modeling_lpes.py").is_file()
    return root / "hub"


@pytest.fixture(scope="module")
def stock_hub_folder(tmp_path_factory) -> Path:
    """A Hub folder lpes-convert wrote for one scale in every layer: a stock RoPE config, no lpes code."""
    from lpes.cli import convert_main

    root = tmp_path_factory.mktemp("stock-hub")
    (root / "spec.json").write_text(json.dumps({"version": 1, "scales": [2.0] * 4}))
    assert convert_main(["lpes-tiny-kv", "--curve", str(root / "spec.json"), "--to", "hf", "--no-validate",
                         "--out", str(root / "hub")]) == 0
    assert not list((root / "hub").glob("*.py"))
    return root / "hub"


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, hub_folder, stock_hub_folder):
    """Every row run once, four at a time: row id -> (result, sandbox, digest before, digest after)."""
    home = tmp_path_factory.mktemp("home")  # HOME and caches of the children
    prepared = {}
    for row in ROWS:
        if row_skip(row):
            continue
        box = make_sandbox(tmp_path_factory.mktemp(row.id), hub_folder, stock_hub_folder)
        if row.setup:
            globals()[row.setup](box)
        prepared[row.id] = (row, box, tree_digest(box.root))
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {rid: pool.submit(run_row, row, box, home) for rid, (row, box, _) in prepared.items()}
    results = {}
    for rid, (_, box, before) in prepared.items():
        done = futures[rid].result()
        results[rid] = (done, box, before, _digest_then_restore(box.root))
    return results


def _digest_then_restore(root: Path) -> dict:
    """The sandbox's digest as the row left it, modes included (as `before`, taken after the setup), then its
    folders given back for cleanup."""
    digest = tree_digest(root)
    for path in root.rglob("*"):
        if path.is_dir() and not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o700)
    return digest


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_refused_in_one_line_and_nothing_changed(outcomes, row):
    if row_skip(row):
        pytest.skip(row_skip(row))
    done, box, before, after = outcomes[row.id]
    prog = row.argv[0]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    if row.full_disk:  # the run got as far as writing: its progress line, then the error
        errors = [line for line in errors if not line.startswith(f"{prog}: writing")]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith(f"{prog}: error: ") and row.message in errors[0], errors[0]
    assert "Do you wish to run the custom code" not in done.stdout + done.stderr
    assert not box.marker.exists(), "code from the model folder ran"
    assert after == before, {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def test_the_rows_would_see_a_change(tmp_path, hub_folder, stock_hub_folder):
    """The digest sees a removed file, a mode change and a lone staging folder (so the rows can fail)."""
    box = make_sandbox(tmp_path, hub_folder, stock_hub_folder)
    before = tree_digest(box.root)
    (Path(box.fill["mine"]) / "thesis.tex").chmod(0o600)
    assert tree_digest(box.root) != before
    (Path(box.fill["work"]) / ".out.lpes-partial-1").mkdir()
    assert ".out.lpes-partial-1" in str(set(tree_digest(box.root)) - set(before))


QUICK_REFUSALS = [
    ("convert_main", ["lpes-tiny-kv", "--curve", "{spec}", "--to", "hf", "--force", "--out", "."], "current directory"),
    ("convert_main", ["lpes-tiny-kv", "--curve", "{spec}", "--to", "genai", "--genai-provider", "cpu",
                      "--genai-precision", "fp16", "--out", "{work}"], "exists; pass --force"),
    ("search_main", ["lpes-tiny-kv", "--out", "{work}"], "is a folder"),
    ("search_main", ["lpes-tiny-kv", "--alpha", "1", "--out", "{work}/best.json"], "--alpha"),
    ("search_main", ["lpes-tiny-kv", "--out", "{model}/best.json"], "is inside the model folder"),
    ("validate_main", ["{work}"], "no lpes_spec.json in"),
]


@pytest.mark.parametrize(("main", "argv", "message"), QUICK_REFUSALS, ids=["convert-out", "convert-genai-out",
                                                                          "search-out", "search-alpha",
                                                                          "search-out-in-model", "validate-no-spec"])
def test_a_typo_that_needs_no_model_is_refused_before_torch_loads(tmp_path, main, argv, message):
    """Refusals of --out and flags cost a second, not torch's and transformers' imports (3 s and more)."""
    (tmp_path / "spec.json").write_text(json.dumps({"version": 1, "scales": [1.0, 1.5, 2.0, 1.0]}))
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "mine.txt").write_text("the user's\n")
    fill = {"spec": str(tmp_path / "spec.json"), "work": str(tmp_path / "work"),
            "model": str(bundled_models()["lpes-tiny-kv"])}
    code = (f"import sys\nfrom lpes.cli import {main}\ncode = {main}({[a.format(**fill) for a in argv]!r})\n"
            "print(code, sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert message in done.stderr, done.stderr
    assert done.stdout.split() == ["2", "[]"], done.stdout + done.stderr
