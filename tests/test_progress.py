"""Progress inside every long step of lpes-search: candidates done of the step's total, tokens/s, an ETA.

A generation on a real model takes minutes; a line per generation alone looks frozen. The
search's steps (the uniform scan, the first population, each generation) and the stock-baseline
scan each draw a line that moves with every chunk of examples scored (search/progress.py).
"""

from __future__ import annotations

import io
import re
import sys

import pytest

from lpes.cli import search_main
from lpes.search import progress


def _lines(stderr: str) -> list[str]:
    """What a terminal would have shown, one redraw per line (tqdm redraws with a carriage return)."""
    return [line.strip() for line in re.split(r"[\r\n]", stderr) if line.strip()]


def _first(lines: list[str], pattern: str) -> int:
    return next(i for i, line in enumerate(lines) if re.search(pattern, line))


@pytest.fixture(scope="module")
def search_stderr(tmp_path_factory):
    """stderr of a small search of the bundled model, every chunk redrawn."""
    out = tmp_path_factory.mktemp("progress") / "best.json"
    capture = pytest.MonkeyPatch()
    capture.setattr(progress, "REFRESH_S", 0.0)
    stderr = io.StringIO()
    capture.setattr(sys, "stderr", stderr)
    try:
        code = search_main(["lpes-tiny-induction", "--out", str(out), "--data", "tiny-induction:examples=2",
                            "--population", "4", "--generations", "1", "--scale-grid", "1:2:0.5", "--holdout", "2",
                            "--baselines", "yarn"])
    finally:
        capture.undo()
    assert code == 0, stderr.getvalue()[-2000:]
    return _lines(stderr.getvalue())


@pytest.mark.parametrize(("step", "ends"), [
    ("gen 0/1 uniform scan", r"^generation 0:"),
    ("gen 0/1 first population", r"^generation 0:"),
    ("gen 1/1:", r"^generation 1:"),
    ("stock baselines", r"best on calibration"),
])
def test_every_step_shows_progress_before_it_ends(search_stderr, step, ends):
    lines = search_stderr
    end = _first(lines, ends)
    shown = [line for line in lines[:end] if step in line]
    assert shown, f"no progress line for {step!r} before {ends!r}"
    noun = "factors" if "baselines" in step else "candidates"
    total = int(re.search(rf"{noun} \d+/(\d+)", shown[0]).group(1))
    assert total >= 1
    # From the first chunk on: part of the step done, tokens/s and an ETA, before its last candidate finished.
    midway = [line for line in shown if re.search(rf"{noun} \d+/{total}", line)
              and not re.search(rf"{noun} {total}/{total}", line)
              and re.search(r"[1-9]\d* tok/s", line) and re.search(r"ETA <= \d+:\d\d", line)]
    assert midway, f"{step}: no line with tokens/s and an ETA before the step ended:\n" + "\n".join(shown)
    assert re.search(rf"{noun} {total}/{total}", shown[-1]), shown[-1]  # and it ends at its total


def test_the_eta_is_an_upper_bound_at_the_rate_so_far(monkeypatch):
    """Verdicts racing skips count as done; the ETA is what is left at the rate verdicts were computed."""
    now, tokens = [0.0], [0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    step = progress.StepProgress("step", candidates=3, work=300, tokens=lambda: tokens[0], enabled=False)
    assert step.postfix() == "candidates 0/3, 0 tok/s, ETA <= ?"
    now[0], tokens[0] = 10.0, 5000
    step.computed(50)  # 50 verdicts in 10 s
    step.skipped(50)  # a candidate raced out with 50 examples left
    step.finished(raced_out=True)
    assert step.postfix() == "candidates 1/3, 1 raced out, 500 tok/s, ETA <= 0:40"  # 200 left at 5 verdicts/s


def test_the_generation_line_says_what_the_generations_left_cost_at_most(monkeypatch):
    """After generation 1: generations left x the mean time of the generations after 0 (0 holds the uniform scan)."""
    from lpes.search import run as run_module

    now = [0.0]
    monkeypatch.setattr(run_module.time, "monotonic", lambda: now[0])
    reporter = run_module._Reporter(False, usage=None, tokens=lambda: 0, generations=20)
    for generation, at in enumerate([100.0, 130.0, 170.0]):  # generation 0 ends at 100 s, then 30 s and 40 s
        now[0] = at
        reporter.ended.append(now[0])
        if generation == 0:
            assert reporter.rest(generation) == ""  # no generation after 0 timed yet
    assert reporter.rest(2) == "; 18 generations left, ETA <= 10:30"  # 18 x 35 s
    assert reporter.rest(19) == "; 1 generation left, ETA <= 0:35"
    assert reporter.rest(20) == ""
