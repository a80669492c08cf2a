"""Issue 28: a verdict names what ran, and validation runs on the task the curve was searched on.

On model folders built here, with a chat template on the tokenizer as an instruct model has:
a skipped key-value check is "not validated" (exit 3) in the console, validation.json and the model
card; the search's --no-chat-template travels in the spec to lpes-convert; a run where nothing scores
fails clearly (search: exit 2, nothing written; validation: a failure of the setup); an earlier
validation.json survives a skipped run; identical variants are scored once.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from conftest import tiny_model_dir
from transformers import AutoTokenizer

from lpes.cli import convert_main, generate_main, search_main, validate_main
from lpes.converter.loading import resolve_for_spec, resolve_model
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import Spec, StockRope, dump_spec, parse_spec
from lpes.validation import report, scoring, variant_runs
from lpes.validation.task_choice import resolve_task
from lpes.validation.variant_runs import ScoringSettings

torch.set_num_threads(1)
# A template in the tiny vocabulary: user turn between w5 and w6, the assistant's turn opened by w7.
CHAT_TEMPLATE = ("{% for m in messages %}w5 {{ m['content'] }} w6{% endfor %}"
                 "{% if add_generation_prompt %} w7 {% endif %}")
KV = "kv:pairs=4,examples=2,gold=0+3"
UNBOUNDED = ScoringSettings(max_seconds=None, progress=False)


def with_chat_template(folder: Path, template: str = CHAT_TEMPLATE) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    """conftest's tiny Llama with a chat template, in a folder of its own (a test runs commands from there)."""
    return with_chat_template(tiny_model_dir("llama", tmp_path_factory.mktemp("chat")))


def searched_spec(path: Path, chat_template: bool = False, answer_tokens: int | None = 4, **search) -> Path:
    """A spec as lpes-search writes one: the task it calibrated on is in provenance.search.task."""
    task = {"data": KV, "chat_template": chat_template, "answer_tokens": answer_tokens, "prompt_tokens": [27, 27]}
    dump_spec(Spec.from_scales([2.0, 1.0, 1.0], {"search": {"task": task, **search}}), path)
    return path


def test_skipped_kv_is_not_validated_with_its_exit_status_and_its_command_runs(chat_model, monkeypatch, capsys):
    monkeypatch.chdir(chat_model.parent)
    searched_spec(Path("spec.json"))
    code = convert_main([chat_model.name, "--curve", "spec.json", "--to", "hf", "--out", "out",
                         "--max-minutes", "0.000001"])
    out, err = capsys.readouterr()
    assert code == 3, err[-2000:]
    assert "- kv: skipped (" in out and "**not validated**: kv skipped" in out and "**passed**" not in out
    assert "not validated: a planned check did not run (exit 3)" in err
    data = json.loads(Path("out/validation.json").read_text())
    assert data["verdict"] == "not validated" and data["passed"] is False
    card = Path("out/README.md").read_text()
    assert "**Not validated**" in card and "**passed**" not in card
    # The command it prints names the model as typed (a folder here, not a Hub id) and pastes as it is.
    command = out.split("here with no budget: ", 1)[1].split(")\n", 1)[0]
    assert command == f"lpes-validate out --model {chat_model.name} --max-minutes 0"
    argv = shlex.split(command)
    assert validate_main(argv[1:]) == 1  # it runs: and a random model answers nothing (the setup check below)
    out, _ = capsys.readouterr()
    assert "- kv: failed (4 examples" in out and "every variant answered 0 of 4 examples" in out
    assert "Task: kv:pairs=4,examples=2,gold=0+3 (the search's task), chat template off, answer budget 4" in out


def test_search_with_no_chat_template_then_convert_validates_that_way(tmp_path, monkeypatch, capsys):
    """The bundled model learns its task; given a chat template, the search's --no-chat-template must reach
    lpes-convert through the spec (and a flag that changes it is said in one line)."""
    model = tmp_path / "kv-model"
    shutil.copytree(resolve_model("lpes-tiny-kv"), model)
    with_chat_template(model, "{% for m in messages %}{{ m['content'] }} f1{% endfor %}")
    monkeypatch.chdir(tmp_path)
    assert search_main(["kv-model", "--out", "best.json", "--data", "tiny-kv:examples=1", "--no-chat-template",
                        "--population", "2", "--generations", "0", "--scale-grid", "1:2:1", "--holdout", "5",
                        "--baselines", "none"]) == 0
    spec = json.loads(Path("best.json").read_text())
    assert spec["provenance"]["search"]["task"] == {"data": "tiny-kv:examples=1", "chat_template": False,
                                                    "answer_tokens": None, "prompt_tokens": [1024, 1024]}
    capsys.readouterr()
    assert convert_main(["kv-model", "--curve", "best.json", "--to", "hf", "--out", "out"]) == 0
    out, err = capsys.readouterr()
    task = json.loads(Path("out/validation.json").read_text())["task"]
    assert task.startswith("tiny-kv:examples=1 (the search's task), chat template off")
    assert "not the task the curve was searched on" not in err
    # A flag that changes the search's setting says so in one line (here before a skipped validation).
    assert convert_main(["kv-model", "--curve", "best.json", "--to", "hf", "--out", "out2", "--chat-template",
                         "--max-minutes", "0.000001"]) == 3
    err = capsys.readouterr().err
    assert "lpes-convert: validating on chat template on (searched with it off): not the task the curve was " \
           "searched on" in err
    resolved = resolve_task(model, Spec.from_scales([1.0] * 4, spec["provenance"]), chat_template=True)
    assert resolved.chat_template is True and resolved.override.startswith("validating on chat template on")


def test_the_spec_chat_template_choice_builds_the_prompts(chat_model, tmp_path):
    """Without a flag, validation builds prompts as the search did; a flag wins."""
    spec = parse_spec(json.loads(searched_spec(tmp_path / "spec.json").read_text()))
    plain = resolve_task(chat_model, spec)
    assert (plain.chat_template, plain.config.answer_tokens, plain.source) == (False, 4, "the search's")
    out = tmp_path / "out"
    out.mkdir()
    for flag, templated in ((None, False), (True, True)):
        task = resolve_task(chat_model, spec, chat_template=flag)
        result = report.validate(resolve_for_spec(chat_model, spec), out, task, settings=UNBOUNDED)
        assert all(e.prompt.startswith("w5 ") == templated for e in result.examples)
        assert all(e.answer_tokens == 4 for e in result.examples)
    assert resolve_task(chat_model, spec, answer_tokens=9).config.answer_tokens == 9
    missing = Spec.from_scales([1.0] * 3, {"search": {"task": {"data": "kv:file=gone.jsonl", "chat_template": True}}})
    with pytest.raises(LpesError, match="searched on --data kv:file=gone.jsonl, which cannot be read here"):
        resolve_task(chat_model, missing)


def test_a_search_where_nothing_scores_stops_and_writes_nothing(chat_model, tmp_path, capsys):
    out = tmp_path / "best.json"
    code = search_main([str(chat_model), "--out", str(out), "--data", "kv:pairs=2,examples=1", "--answer-tokens", "3",
                        "--population", "2", "--generations", "0", "--scale-grid", "1:2:1", "--holdout", "2"])
    err = capsys.readouterr().err
    assert code == 2
    [line] = [line for line in err.splitlines() if line.startswith("lpes-search: error:")]
    assert "no candidate answered any of the 2 calibration examples" in line and "no curve to write" in line
    assert "answer budget 3 tokens" in line and "do not start with the value" in line
    assert not out.exists() and not out.with_name("best.json.state.json").exists()


def test_an_earlier_validation_survives_a_skipped_run(chat_model, tmp_path):
    spec = parse_spec(json.loads(searched_spec(tmp_path / "spec.json").read_text()))
    out = tmp_path / "out"
    out.mkdir()
    model, task = resolve_for_spec(chat_model, spec), resolve_task(chat_model, spec)
    first = report.validate(model, out, task, settings=UNBOUNDED)
    assert first.variants and (out / "validation.md").is_file()
    before = {name: (out / name).read_bytes() for name in ("validation.json", "validation.md")}
    skipped = report.validate(model, out, task, settings=ScoringSettings(max_seconds=1e-6, progress=False))
    assert skipped.verdict == "not validated" and skipped.checks[1].status == "skipped"
    assert {name: (out / name).read_bytes() for name in before} == before
    assert json.loads((out / "validation.skipped.json").read_text())["verdict"] == "not validated"
    assert "kept the earlier validation.json and validation.md (failed)" in skipped.format()


def test_every_variant_at_zero_is_a_failure_of_the_setup(chat_model, tmp_path):
    spec = parse_spec(json.loads(searched_spec(tmp_path / "spec.json").read_text()))
    out = tmp_path / "out"
    out.mkdir()
    result = report.validate(resolve_for_spec(chat_model, spec), out, resolve_task(chat_model, spec),
                             settings=UNBOUNDED)
    assert result.verdict == "failed" and result.setup_problem.startswith("every variant answered 0 of 4")
    assert result.measured() is None  # the card states no measurement of a setup that measured nothing
    assert json.loads((out / "validation.json").read_text())["setup_problem"] == result.setup_problem


def test_answers_that_open_with_a_preamble_are_warned_about_and_wrong_values_are_not():
    from lpes.validation.examples import Example

    examples = [Example(f"prompt {i}", f"{i}f2a-77", 0, 2, answer_tokens) for i, answer_tokens in
                enumerate([None] * 4)]

    def said(texts, **kwargs):
        results = [scoring.ExampleResult(i, 0, text, False) for i, text in enumerate(texts)]
        return report.answers_not_value(results, examples, **kwargs)

    chatty = said(["The value corresponding to 0f2a", "The value is", "The value", "3f2a-77"])
    assert chatty.startswith("3 of 4 answers do not start with the value (e.g. 'The value corresponding to 0f2a'")
    assert "give --answer-tokens 100" in chatty
    assert said(["", "", "", "3f2a-77"]) is not None  # generation that stops at once
    assert said(["9a", "8b", "7c", "3f2a-77"]) is None  # wrong values, no preamble
    assert said(["0f2a-77", "1f2a-77 and more", "2f2a", "x"]) is None  # most start with the value
    assert said(["9a", "8b", "7c", "3f2a-77"], always=True).startswith("3 of 4 answers")


def test_identical_variants_are_scored_once(chat_model, tmp_path, monkeypatch):
    """Scale 1 everywhere, YaRN at 1 and dynamic NTK within the trained length are the unscaled model."""
    spec = Spec.from_scales([1.0] * 3, {"search": {"best_uniform_scale": 1.0, "stock_baselines": [
        {"rope_type": "yarn", "factor": 1.0}, {"rope_type": "dynamic", "factor": 2.0}]}})
    calls = []
    greedy = scoring.greedy_correct
    monkeypatch.setattr(scoring, "greedy_correct", lambda *a, **k: calls.append(len(a[2])) or greedy(*a, **k))
    out = tmp_path / "out"
    out.mkdir()
    result = report.validate(resolve_for_spec(chat_model, spec), out,
                             resolve_task(chat_model, spec, KV + ",answer_tokens=2"), variants=[], settings=UNBOUNDED)
    names = ["unscaled", "best uniform s=1", "YaRN f=1", "dynamic NTK f=2", "reference"]
    assert [v.name for v in result.variants] == names
    assert [v.same_as for v in result.variants] == [None] + ["unscaled"] * 4
    assert all(v.scores is result.variants[0].scores for v in result.variants)
    # The probe's batch and the rest of the unscaled examples: nothing else was decoded.
    assert sum(calls) == len(result.examples)
    assert StockRope("dynamic", 2.0).same_as_unscaled(600, 512) is False
    assert StockRope("yarn", 1.25).same_as_unscaled(10, 512) is False


def test_the_time_estimate_is_within_twice_the_measured_time(tmp_path, monkeypatch):
    import time

    measured = {}
    score_all = variant_runs.score_all

    def timed(*args, **kwargs):
        started = time.perf_counter()
        results = score_all(*args, **kwargs)
        measured["seconds"] = time.perf_counter() - started
        return results

    monkeypatch.setattr(variant_runs, "score_all", timed)
    seconds = {}
    describe = report.checks.describe_estimate

    def estimate(s, probe, device):
        seconds["estimate"] = s
        return describe(s, probe, device)

    monkeypatch.setattr(report.checks, "describe_estimate", estimate)
    model, spec = resolve_model("lpes-tiny-kv"), Spec.from_scales([2.0, 1.5, 1.0, 1.0])
    result = report.validate(resolve_for_spec(model, spec), tmp_path, resolve_task(model, spec, "tiny-kv:examples=2"),
                             variants=[], settings=UNBOUNDED)
    assert result.checks[1].status == "passed" and "expect the real time within 2x" in result.checks[1].detail
    assert measured["seconds"] / 2 <= seconds["estimate"] <= 2 * measured["seconds"], (seconds, measured)


def test_search_task_in_the_spec_is_typed(tmp_path):
    good = {"data": KV, "chat_template": False, "answer_tokens": None, "prompt_tokens": [3, 9]}
    assert parse_spec({"scales": [1], "provenance": {"search": {"task": good}}}).search_task.prompt_tokens == (3, 9)
    for task, message in (({"data": KV, "chat_templat": True},
                           "unknown key 'chat_templat' in 'provenance.search.task' (did you mean 'chat_template'?)"),
                          ({"chat_template": "no"}, "'provenance.search.task.chat_template' must be true or false"),
                          ({"answer_tokens": 0}, "'provenance.search.task.answer_tokens' must be an integer"),
                          ({"prompt_tokens": [9, 3]}, "'provenance.search.task.prompt_tokens' must be"),
                          ("kv", "'provenance.search.task' must be an object")):
        with pytest.raises(LpesError) as err:
            parse_spec({"scales": [1], "provenance": {"search": {"task": task}}})
        assert message in str(err.value)
    # A spec from before the field: its search.data and search.chat_template still say how it was searched.
    old = parse_spec({"scales": [1], "provenance": {"search": {"data": KV, "chat_template": False}}})
    assert (old.search_task.data, old.search_task.chat_template) == (KV, False)


def test_generate_applies_the_chat_template_and_says_when_nothing_came(tmp_path, monkeypatch, capsys):
    from conftest import tiny_tokenizer

    from lpes import generate

    folder = tmp_path / "onnx"
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    (folder / "model.onnx").write_bytes(b"")
    seen = {}

    def nothing(plan):  # the session itself is not what this checks: its plan, and the line said after it
        seen["templated"], seen["ids"] = plan.templated, plan.ids
        return ""

    monkeypatch.setattr(generate, "execute", nothing)
    monkeypatch.setattr("lpes.exporters.received.check_received_folder", lambda folder: None)
    assert generate_main([str(folder), "w4 w5"]) == 0
    err = capsys.readouterr().err
    assert seen["templated"] is True and "the model wrote nothing" in err and "try --no-chat-template" in err
    templated_ids = seen["ids"]
    assert generate_main([str(folder), "w4 w5", "--no-chat-template"]) == 0
    assert seen["templated"] is False and seen["ids"] == tokenizer("w4 w5")["input_ids"] != templated_ids
    assert "drop --no-chat-template" in capsys.readouterr().err


def test_absolute_paths_stay_on_the_console_and_out_of_published_files(chat_model, tmp_path, capsys):
    spec = searched_spec(tmp_path / "spec.json")
    out = tmp_path / "out"
    assert convert_main([str(chat_model), "--curve", str(spec), "--to", "hf", "--out", str(out),
                         "--max-minutes", "0.000001"]) == 3
    printed = capsys.readouterr().out
    assert f"lpes-validate {out} --model {chat_model} --max-minutes 0" in printed  # pastes and runs here
    for name in ("validation.json", "validation.md", "README.md", "lpes_spec.json"):
        text = (out / name).read_text()
        assert str(tmp_path) not in text, name
    assert "lpes-validate out --model tiny-llama --max-minutes 0" in (out / "validation.md").read_text()
