"""Mistaken inputs to lpes-search and lpes-generate: one line on stderr, exit 2, no traceback, nothing written.

Each row runs the command's entry point (lpes.cli.search_main, generate_main) in this
process, with stderr captured (tests/test_hostile_cli.py runs the installed commands in
subprocesses). Every refusal must come before any heavy work: the rows that used to hang
(a 1e-9 grid step, 10**12 examples) have a timeout far below what loading and scoring take.

Each row says what it guards: "new" rows failed on main before issue 17 (commit 96aa84e: a
traceback, a hang, a run that went on, a misleading message or one without the hint);
"guard" rows already gave one line and exit 2 there, and keep doing so.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

BIN = Path(sys.executable).parent
TIMEOUT_S = 120  # far below a search of the bundled model; a row that hangs fails here
SEARCH = ("lpes-search", "lpes-tiny-kv", "--population", "2", "--generations", "0", "--out", "{out}")
GENERATE = ("lpes-generate", "{onnx}")


@dataclass(frozen=True)
class Row:
    id: str
    argv: tuple[str, ...]  # {out} {onnx} are filled in
    message: str  # a part of the one stderr line
    kind: str  # "new" (failed before this test) or "guard" (already right)
    checkpoint: str | None = None  # text of OUT.state.json before the run (a corrupt search checkpoint)
    skip_if: bool = False


ROWS = [
    # --alpha outside (0, 1), and a held-out set with its gold at one position: the decision could not be made
    Row("alpha-zero", (*SEARCH, "--alpha", "0"), "--alpha must be in (0, 1), got 0.0", "new"),
    Row("alpha-one", (*SEARCH, "--alpha", "1"), "--alpha must be in (0, 1), got 1.0", "new"),
    Row("alpha-nan", (*SEARCH, "--alpha", "nan"), "--alpha must be in (0, 1), got nan", "new"),
    Row("alpha-word", (*SEARCH, "--alpha", "five"), "argument --alpha: invalid float value: 'five'", "new"),
    Row("holdout-one-gold", (*SEARCH, "--data", "tiny-kv:gold=4"), "every held-out prompt has its gold at position 4",
        "new"),
    # --baselines: a typo, or none mixed with types
    Row("baselines-typo", (*SEARCH, "--baselines", "yarm"), "unknown RoPE type 'yarm' (known: yarn, dynamic, or none)",
        "new"),
    Row("baselines-none-and-yarn", (*SEARCH, "--baselines", "none,yarn"), "none stands alone", "new"),
    # --scale-grid: non-finite or far too many values
    Row("grid-inf", (*SEARCH, "--scale-grid", "1:inf:0.5"), "must be finite numbers", "new"),
    Row("grid-nan", (*SEARCH, "--scale-grid", "1:2:nan"), "must be finite numbers", "new"),
    Row("grid-step-1e-9", (*SEARCH, "--scale-grid", "1:4:1e-9"), "has 3000000001 values; at most 1000", "new"),
    Row("grid-below-spec-range", (*SEARCH, "--scale-grid", "1e-300:1:0.5"), "scales must lie in [0.001, 10000]",
        "new"),
    Row("grid-reversed", (*SEARCH, "--scale-grid", "3:1:0.5"), "has no values", "guard"),
    # --data: absurd sizes, out-of-range and negative numbers, typos
    Row("data-examples-1e12", (*SEARCH, "--data", f"tiny-kv:examples={10**12}"),
        "'examples_per_index' (examples) must be in 1..100000", "new"),
    Row("data-kv-examples-1e12", (*SEARCH, "--data", f"kv:examples={10**12}"), "must be in 1..100000", "new"),
    Row("data-kv-pairs-1e9", (*SEARCH, "--data", f"kv:pairs={10**9}"), "'num_pairs' (pairs) must be in 2..10000",
        "new"),
    # (main gave one line here, but blamed 'length')
    Row("data-tiny-pairs-1e9", (*SEARCH, "--data", f"tiny-kv:pairs={10**9}"), "(pairs) must be in 2..64", "new"),
    Row("data-length-1e9", (*SEARCH, "--data", f"tiny-kv:length={10**9}"), "'length' must be in 18..1048576", "new"),
    Row("data-total-size", (*SEARCH, "--data", "kv:pairs=10000,examples=100000,gold=0"), "GiB of prompts", "new"),
    Row("data-gold-out-of-range", (*SEARCH, "--data", "tiny-kv:gold=99"), "entry 99 is outside 0..15", "guard"),
    Row("data-gold-negative", (*SEARCH, "--data", "tiny-kv:gold=-1"), "entry -1 is outside 0..15", "guard"),
    Row("data-gold-twice", (*SEARCH, "--data", "tiny-kv:gold=0+0"), "lists 0 twice", "new"),
    Row("data-examples-negative", (*SEARCH, "--data", "tiny-kv:examples=-3"), "(examples) must be in 1..", "guard"),
    Row("data-seed-negative", (*SEARCH, "--data", "tiny-kv:seed=-1"), "'seed' must be >= 0", "guard"),
    Row("data-unknown-field", (*SEARCH, "--data", "tiny-kv:pair=4"), "unknown field 'pair' for tiny-kv (did you "
        "mean 'pairs'?", "new"),
    Row("data-unknown-task", (*SEARCH, "--data", "tinykv:examples=2"), "unknown task 'tinykv' (did you mean "
        "'tiny-kv'?", "new"),
    # words the bundled model cannot tokenize (its vocabulary has no unknown token)
    Row("data-words-outside-vocabulary", (*SEARCH, "--data", "kv:pairs=4,examples=1"),
        "--data: the word 'Extract' is not in the model's vocabulary", "new"),
    # devices this machine does not have
    Row("device-cuda", (*SEARCH, "--device", "cuda"), "this machine has no CUDA GPU", "new",
        skip_if=torch.cuda.is_available()),
    Row("device-tpu", (*SEARCH, "--device", "tpu:7"), "--device 'tpu:7' is not a torch device", "new"),
    # a corrupt checkpoint next to --out (the search resumes from OUT.state.json)
    Row("checkpoint-garbage", SEARCH, "is not a readable search checkpoint (JSONDecodeError); delete it to start "
        "over, or pass --force", "new", checkpoint="\x00garbage{"),
    Row("checkpoint-truncated", SEARCH, "is not a readable search checkpoint", "new",
        checkpoint='{"settings_key": "0123456789abcdef", "state": {"generation": 1, "parents": [[[['),
    Row("checkpoint-not-an-object", SEARCH, "is not a readable search checkpoint", "new", checkpoint="[1, 2]"),
    # (main said "from a search with other settings" here: one line, though not the reason)
    Row("checkpoint-wrong-fields", SEARCH, "is not a readable search checkpoint", "guard",
        checkpoint='{"settings_key": "x", "state": {"generation": 1, "colour": 2}}'),
    # GA settings: zero, negative or absurd
    Row("population-0", (*SEARCH, "--population", "0"), "--population must be in 2..10000", "guard"),
    Row("population-1e9", (*SEARCH, "--population", str(10**9)), "--population must be in 2..10000", "new"),
    Row("generations-negative", (*SEARCH, "--generations", "-1"), "--generations must be in 0..10000", "guard"),
    Row("generations-1e9", (*SEARCH, "--generations", str(10**9)), "--generations must be in 0..10000", "new"),
    Row("holdout-negative", (*SEARCH, "--holdout", "-1"), "--holdout must be >= 0", "guard"),
    Row("batch-size-0", (*SEARCH, "--batch-size", "0"), "--batch-size must be in 1..4096", "guard"),
    Row("batch-size-1e9", (*SEARCH, "--batch-size", str(10**9)), "--batch-size must be in 1..4096", "new"),
    Row("degree-1000", (*SEARCH, "--degree", "1000"), "--degree must be in 1..16", "new"),
    # lpes-generate
    Row("generate-max-new-tokens-negative", (*GENERATE, "p3_1 f2 q3", "--max-new-tokens", "-1"),
        "--max-new-tokens must be at least 1, got -1", "new"),
    Row("generate-words-outside-vocabulary", (*GENERATE, "The capital of France is"),
        "the prompt: the word 'The' is not in the model's vocabulary", "new"),
]


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stderr: str


def run_row(row: Row, root: Path, onnx: Path) -> tuple[Outcome, Path]:
    """The command's own entry point, in this process (a fresh torch import per row costs seconds).

    Anything but the one-line refusal escapes as an exception, whose traceback lands in stderr;
    an alarm stands in for the timeout of a row that would start real work.
    """
    from lpes import cli

    work = root / row.id
    work.mkdir()
    out = work / "best.json"
    if row.checkpoint is not None:
        (work / "best.json.state.json").write_text(row.checkpoint)
    main = {"lpes-search": cli.search_main, "lpes-generate": cli.generate_main}[row.argv[0]]
    argv = [a.format(out=out, onnx=onnx) for a in row.argv[1:]]
    stderr, cwd = io.StringIO(), os.getcwd()

    def too_slow(signum, frame):
        raise TimeoutError(f"{row.id} ran for {TIMEOUT_S} s: it started real work")

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(TIMEOUT_S)
    try:
        os.chdir(work)
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as exit_:
                code = exit_.code
            except BaseException:  # a traceback where one line was promised
                traceback.print_exc(file=stderr)
                code = None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(cwd)
    return Outcome(code, stderr.getvalue()), work


@pytest.fixture(scope="module")
def generate_folder(tmp_path_factory) -> Path:
    """A real ONNX export of the bundled model (its word-level vocabulary has no unknown token)."""
    from lpes.cli import convert_main

    root = tmp_path_factory.mktemp("export")
    (root / "spec.json").write_text(json.dumps({"version": 1, "scales": [1.0, 1.5, 2.0, 2.0]}))
    assert convert_main(["lpes-tiny-kv", "--curve", str(root / "spec.json"), "--to", "onnx", "--no-validate",
                         "--out", str(root / "out")]) == 0
    return root / "out" / "onnx"


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, generate_folder):
    root = tmp_path_factory.mktemp("hostile-search")
    return {row.id: run_row(row, root, generate_folder) for row in ROWS if not row.skip_if}


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_refused_in_one_line_before_any_work(outcomes, row):
    if row.skip_if:
        pytest.skip("this machine has the device the row asks for")
    done, work = outcomes[row.id]
    prog = row.argv[0]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{prog}: error: ") and row.message in lines[0], lines[0]
    written = sorted(p.name for p in work.iterdir())
    assert written == (["best.json.state.json"] if row.checkpoint is not None else []), written
    if row.checkpoint is not None:
        assert (work / "best.json.state.json").read_text() == row.checkpoint  # the user's file is left as it was


def test_every_row_says_what_it_guards():
    assert {row.kind for row in ROWS} <= {"new", "guard"}
    assert len({row.id for row in ROWS}) == len(ROWS)


def test_generation_past_the_trained_positions_says_so_in_one_line(generate_folder):
    """The bundled model was trained on 256 positions: 4 prompt tokens + 260 new ones get one note, then the text."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([str(BIN / "lpes-generate"), str(generate_folder), "p3_1 f2 q3", "--max-new-tokens", "260"],
                          capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    notes = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(notes) == 1, done.stderr
    assert "position 264, past the 256 the model was trained on" in notes[0], notes[0]  # <bos> + 3 words + 260
    assert done.stdout.split()[0].startswith("a")  # an answer token comes first
