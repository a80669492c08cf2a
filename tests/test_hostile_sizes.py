"""Every size a user can type is bounded at plan time (issue 51, item 3): --holdout and example counts against
what the data generator holds and the memory its prompts take, prompt lengths against the positions the model
was trained for, and the time probe of validation against the budget it serves.

Each refusal is one line, exit 2, before a prompt past the bound is built (a guard fails the test where one
would be), and leaves nothing behind: no lock, no --out folder the run made.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest
import torch
from conftest import tiny_model_dir

from lpes.cli import convert_main, search_main
from lpes.converter.loading import resolve_for_spec, resolve_model
from lpes.foundation.spec import Spec
from lpes.validation import checks, report, scoring, tasks
from lpes.validation.examples import Example
from lpes.validation.task_choice import resolve_task
from lpes.validation.variant_runs import ScoringSettings

TINY = "lpes-tiny-kv"  # trained on 256 positions; its own task is 1,024 (4x): lpes goes beyond on purpose


@pytest.fixture
def no_prompts_built(monkeypatch):
    """Building the examples of a split named here fails the test: the refusal must come first."""
    built = tasks.examples_for
    splits: set[str] = set()

    def guarded(config, *args, split="validation", **kwargs):
        if split in splits:
            raise AssertionError(f"the {split} prompts were built before the size was checked")
        return built(config, *args, split=split, **kwargs)

    monkeypatch.setattr(tasks, "examples_for", guarded)
    return splits


def refusal(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_holdout_beyond_any_generator_is_refused_before_torch_loads(tmp_path):
    """--holdout 1000000000 printed nothing and grew memory until killed, leaving its lock."""
    out = tmp_path / "sub" / "dir" / "best.json"
    code = (f"import sys\nfrom lpes.cli import search_main\n"
            f"code = search_main(['{TINY}', '--holdout', '1000000000', '--out', {str(out)!r}])\n"
            "print(code, sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["2", "[]"], done.stdout + done.stderr
    assert done.stderr.strip() == "lpes-search: error: --holdout must be at most 100000, got 1000000000"
    assert time.perf_counter() - started < 30
    assert list(tmp_path.iterdir()) == []  # no lock, no folder


def test_held_out_prompts_that_would_not_fit_in_memory_are_refused_before_any_is_built(
        tmp_path, monkeypatch, capsys, no_prompts_built):
    from lpes.converter import loading

    monkeypatch.setattr(loading, "available_memory", lambda: 2**30)
    no_prompts_built.update({"search", "validation"})
    out = tmp_path / "sub" / "best.json"
    assert search_main([TINY, "--holdout", "100000", "--out", str(out)]) == 2
    line = refusal(capsys)
    assert line.startswith("lpes-search: error: --holdout 100000: 100,000 prompts of this size make about "), line
    assert "1.0 GiB is available" in line
    assert list(tmp_path.iterdir()) == []  # the folder it made for --out is gone with its lock


def test_held_out_prompts_over_the_description_bound_are_refused(tmp_path, capsys, no_prompts_built):
    no_prompts_built.update({"search", "validation"})
    assert search_main([TINY, "--data", "tiny-kv:length=4096", "--holdout", "100000",
                        "--out", str(tmp_path / "best.json")]) == 2
    line = refusal(capsys)
    assert "--holdout 100000: 20000 examples x 5 gold indices of this size make about 1.9 GiB of prompts" in line
    assert list(tmp_path.iterdir()) == []


def test_a_bundled_length_far_beyond_the_model_is_refused_before_a_prompt_is_built(tmp_path, capsys,
                                                                                   no_prompts_built):
    """262,144 positions on a 256-position model: the search showed "ETA <= ?" with no bound."""
    no_prompts_built.update({"search", "validation"})
    out = tmp_path / "sub" / "dir" / "best.json"
    assert search_main([TINY, "--data", "tiny-kv:length=262144,examples=1", "--out", str(out)]) == 2
    assert refusal(capsys) == (
        "lpes-search: error: --data: its prompts reach 262,145 positions with the answer's budget, 1,024x the 256 "
        "lpes-tiny-kv was trained for; lpes goes up to 64x (16,384): ask for a shorter length")
    assert list(tmp_path.iterdir()) == []  # the empty --out parents it made are removed


def test_the_bundled_task_beyond_the_trained_length_still_plans(tmp_path):
    """lpes searches beyond the trained length on purpose: its own task is 4x, make demo's 2x, bench's 16x."""
    from lpes.search.options import SearchOptions
    from lpes.search.plan import plan_search

    plan = plan_search(TINY, tmp_path / "best.json", SearchOptions(data="tiny-kv:length=4096,examples=1",
                                                                   holdout=5), force=False)
    assert max(n for _, n in plan.lengths) == 4097


def test_kv_pairs_far_beyond_the_model_are_refused_before_the_held_out_prompts(tmp_path, capsys, no_prompts_built):
    model = tiny_model_dir("llama", tmp_path, max_position_embeddings=16)  # lpes goes up to 1,024 positions
    capsys.readouterr()
    no_prompts_built.add("validation")
    assert search_main([str(model), "--data", "kv:pairs=1000,examples=1", "--no-chat-template",
                        "--out", str(tmp_path / "run" / "best.json")]) == 2
    line = refusal(capsys)
    assert line.startswith("lpes-search: error: --data: its prompts reach ") and "the 16 tiny-llama was trained " \
        "for; lpes goes up to 64x (1,024): ask for fewer pairs or a shorter length" in line, line
    assert not (tmp_path / "run").exists()


def test_a_validation_length_at_the_documented_maximum_is_refused_before_the_export(tmp_path, monkeypatch, capsys,
                                                                                   no_prompts_built):
    """tiny-kv's length may be 1,048,576 (tasks.MAX_LENGTH): validating there made the time probe one prefill
    that never returned, so --max-minutes could not act."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.json").write_text('{"version": 1, "scales": [1.0, 1.5, 2.0, 1.0]}')
    no_prompts_built.add("validation")
    assert convert_main([TINY, "--curve", "spec.json", "--to", "hf", "--out", "out",
                         "--data", f"tiny-kv:length={tasks.MAX_LENGTH},examples=1"]) == 2
    assert "4,096x the 256 lpes-tiny-kv was trained for" in refusal(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.json"]


# ---- the time probe, bounded by the budget it serves ----


def quadratic_timer(calls: list):
    """A prefill of n tokens as a real one grows: a fixed cost, a linear part and attention's quadratic one."""
    def timer(tokens: int) -> float:
        calls.append(tokens)
        return 1e-3 + 1e-5 * tokens + 1e-9 * tokens**2
    return timer


def test_prefix_timings_stay_within_their_share_of_the_budget():
    calls: list[int] = []
    allowance = 10.0
    timings = checks.time_prefixes(quadratic_timer(calls), 2**20, allowance)
    assert calls[0] == checks.FIRST_PREFIX and all(b == 2 * a for a, b in zip(calls, calls[1:]))
    assert calls[-1] < 2**20 and sum(s for _, s in timings) <= allowance
    true = quadratic_timer([])(2**20)
    assert checks.prefill_at(timings, 2**20, worst=True) >= true  # an upper bound
    assert true / 2 <= checks.prefill_at(timings, 2**20) <= 2 * true  # and an estimate near it


def test_a_short_prompt_is_timed_whole_and_the_first_prefix_always():
    calls: list[int] = []
    timings = checks.time_prefixes(quadratic_timer(calls), 300, 60.0)
    assert calls == [64, 128, 256, 300] and checks.prefill_at(timings, 300) == timings[-1][1]
    calls.clear()
    assert len(checks.time_prefixes(quadratic_timer(calls), 2**20, 0.0)) == 1 and calls == [64]


def test_prefill_extrapolation_is_between_linear_and_quadratic():
    assert checks.prefill_at([(64, 1.0), (128, 1.0)], 1024) == 8.0  # flat (overhead): at least linear
    assert checks.prefill_at([(64, 1.0), (128, 16.0)], 256) == 64.0  # faster than quadratic: at most quadratic
    assert math.isclose(checks.prefill_at([(64, 1.0), (128, 2 ** 1.5)], 512), 2 ** 1.5 * 4 ** 1.5)


def test_validation_over_its_budget_skips_without_running_the_probe(tmp_path, monkeypatch):
    """Prompts of 8,192 tokens under a one-second budget: the prefixes say so, and no prompt is decoded."""
    decoded = []
    greedy = scoring.greedy_correct
    monkeypatch.setattr(scoring, "greedy_correct", lambda *a, **k: decoded.append(len(a[2])) or greedy(*a, **k))
    started = time.perf_counter()
    model, spec = resolve_model(TINY), Spec.from_scales([2.0, 1.5, 1.0, 1.0])
    result = report.validate(resolve_for_spec(model, spec), tmp_path,
                             resolve_task(model, spec, "tiny-kv:length=8192,examples=1"), variants=[],
                             settings=ScoringSettings(max_seconds=1.0, progress=False))
    kv = result.checks[1]
    assert kv.status == "skipped" and "over the 1.0 s budget" in kv.detail, kv.detail
    assert "extrapolated from one prompt's first" in kv.detail and decoded == []
    assert time.perf_counter() - started < 30


def test_a_probe_past_its_deadline_stops_after_the_forward_that_crossed_it(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tiny_model_dir("llama", tmp_path)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    examples = [Example(" ".join(f"w{4 + i % 90}" for i in range(40)), "w5", 0, 2, 8)] * 2
    forwards = []
    model.register_forward_hook(lambda *_: forwards.append(1))
    with torch.no_grad(), pytest.raises(checks.ProbeOverBudget):
        checks.probe(model, tokenizer, examples, [48, 48], 2, 8192, None, None, deadline=time.perf_counter())
    assert len(forwards) == 3  # the two-step warm-up, then the probe's prefill alone
