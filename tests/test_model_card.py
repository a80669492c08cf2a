"""The model card: its load snippet runs as written, base_model is a Hub id or absent, its finding follows the data."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lpes.cli import convert_main
from lpes.converter.model_card import hub_id, model_card
from lpes.foundation.spec import Spec, dump_spec
from lpes.validation import scoring
from lpes.validation.examples import Example
from lpes.validation.results import REFERENCE, UNIFORM, UNSCALED, ValidationReport, VariantResult

BUNDLED = "lpes-tiny-kv"
FOLDER = "lpes-tiny-kv-lpes"  # the name the card's snippet loads, as make demo names the folder


def convert_bundled(tmp_path: Path, scales: list[float]) -> Path:
    spec = tmp_path / "best.json"
    dump_spec(Spec.from_scales(scales), spec)
    out = tmp_path / FOLDER
    assert convert_main([BUNDLED, "--curve", str(spec), "--to", "hf", "--out", str(out), "--no-validate"]) == 0
    return out


def load_snippet(card: str) -> str:
    return re.search(r"## Load\n\n```python\n(.*?)```", card, re.S).group(1)


@pytest.mark.parametrize("scales", [[3.75, 1.5, 1.25, 1.0], [2.0] * 4], ids=["per-layer", "uniform"])
def test_load_snippet_runs_as_written_without_a_prompt(tmp_path, scales):
    """Pasted into Python next to the folder, with no terminal to answer a trust prompt, it loads the scaled model."""
    out = convert_bundled(tmp_path, scales)
    snippet = load_snippet((out / "README.md").read_text())
    check = ("\nimport torch\nwith torch.no_grad():\n"
             "    logits = model(**tokenizer('p3_1 f2 q3', return_tensors='pt')).logits\n"
             "print(tokenizer.convert_ids_to_tokens(int(logits[0, -1].argmax())))\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", snippet + check], cwd=tmp_path, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Do you wish to run the custom code" not in done.stdout + done.stderr  # transformers' trust prompt
    assert done.stdout.split()[-1] == "a1"  # the value of key 3: the scaled model answers a short prompt


def test_base_model_is_a_hub_id_or_absent(tmp_path, monkeypatch):
    spec = Spec.from_scales([2.0, 1.0])
    assert "base_model: meta-llama/Llama-3.2-1B\n" in model_card(spec, "meta-llama/Llama-3.2-1B", None)
    local = tmp_path / "models" / "llama"
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # "models/llama" exists here: a local folder, not a Hub repo
    for name in (BUNDLED, "./my-model", str(local), "models/llama"):
        card = model_card(spec, name, None)
        assert "base_model:" not in card.split("---")[1], name
        assert str(tmp_path) not in card  # no path of this machine in a published file
    assert hub_id("models/llama") is None and hub_id("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"


def report_with(correct: dict[str, list[bool]], gold: list[int]) -> ValidationReport:
    """A report of real result objects: `correct[name][i]` is example i's verdict for that variant."""
    examples = [Example(f"prompt {i}", "a1", gold[i], 16) for i in range(len(gold))]
    variants = []
    for name, verdicts in correct.items():
        results = tuple(scoring.ExampleResult(i, gold[i], "a1" if ok else "a0", ok) for i, ok in enumerate(verdicts))
        baseline = name not in (UNSCALED, REFERENCE)
        variants.append(VariantResult(name, "ok", scoring.Scores(results, 0), baseline=baseline))
    return ValidationReport(BUNDLED, examples, variants, None, prompt_tokens=[1024] * len(gold))


def card_for(report: ValidationReport, uniform: float) -> str:
    spec = Spec.from_scales([3.75, 1.4, 1.2, 1.25], {"search": {"best_uniform_scale": uniform,
                                                                "calibration_examples": 40}})

    class Config:
        max_position_embeddings = 256

    return model_card(spec, BUNDLED, Config(), report.markdown(), report.measured())


GOLD = [0, 0, 15, 15]


def test_card_states_task_lengths_and_a_tie_with_the_uniform_baseline():
    report = report_with({UNSCALED: [False, False, True, True], f"{UNIFORM} s=3.75": [True, False, True, True],
                          REFERENCE: [True, False, True, True]}, GOLD)
    card = card_for(report, 3.75)
    assert "4 prompts (2 per gold index) of 1024 tokens" in card
    assert "256 positions" in card and "4.0x the length it was made for" in card
    assert "answers 50% of them (0% when the fact is the farthest, gold index 0)" in card
    assert "with the LPES scales, 75% (50%)" in card
    assert "matches the uniform baseline here; it does not beat it" in card


def test_card_says_when_the_curve_beats_or_trails_the_baseline():
    beats = report_with({UNSCALED: [False] * 4, f"{UNIFORM} s=2": [True, False, False, True],
                         REFERENCE: [True, True, True, True]}, GOLD)
    assert "beats it by 50.0 points" in card_for(beats, 2.0)
    trails = report_with({UNSCALED: [True] * 4, f"{UNIFORM} s=2": [True] * 4,
                          REFERENCE: [True, True, False, True]}, GOLD)
    text = card_for(trails, 2.0)
    assert "25.0 points below it" in text and "worse than it was unscaled" in text


def test_card_and_report_say_when_a_stock_rope_type_beats_the_curve():
    better = report_with({UNSCALED: [False] * 4, f"{UNIFORM} s=2": [True, False, False, True],
                          "YaRN f=2.5": [True] * 4, "dynamic NTK f=4": [True, True, False, True],
                          REFERENCE: [True, True, False, True]}, GOLD)
    card = card_for(better, 2.0)
    assert "each at its best factor on the calibration prompts: YaRN f=2.5 100%, dynamic NTK f=4 75%" in card
    assert "**YaRN f=2.5 beats the per-layer curve here** (100% vs 75%)" in card
    assert better.beaten().startswith("YaRN f=2.5 answers more examples than the LPES curve")
    assert "dynamic NTK f=4 answer" not in better.beaten()  # a tie is not "more"
    tie = report_with({UNSCALED: [False] * 4, "YaRN f=2.5": [True, True, False, True],
                       REFERENCE: [True, True, False, True]}, GOLD)
    assert "beats the per-layer curve" not in card_for(tie, 2.0) and tie.beaten() is None
