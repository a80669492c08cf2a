"""The held-out decision (foundation/decision.py) and what lpes-convert ships from it.

McNemar's p is checked against scipy's exact binomial test (an independent implementation); the rule on
verdict tables built so that the answer is known by construction; the convert path on the bundled model,
whose written config.json is read back by transformers itself.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from scipy.stats import binomtest

from lpes.foundation.decision import (
    Candidate,
    binomial_p,
    decide,
    format_table,
    in_middle,
    mcnemar,
    parse_decision,
    smallest_detectable,
)
from lpes.foundation.errors import LpesError

BUNDLED = "lpes-tiny-kv"


@pytest.mark.parametrize("only_a, only_b", [(0, 0), (1, 0), (3, 1), (19, 2), (10, 10), (0, 7), (40, 25), (2, 9),
                                            (100, 130)])
def test_mcnemar_p_is_scipys_exact_binomial_test(only_a, only_b):
    concordant = 5  # prompts both answer, and both miss: they must not change p
    a = [True] * only_a + [False] * only_b + [True] * concordant + [False] * concordant
    b = [False] * only_a + [True] * only_b + [True] * concordant + [False] * concordant
    got_a, got_b, p = mcnemar(a, b)
    assert (got_a, got_b) == (only_a, only_b)
    expected = 1.0 if only_a + only_b == 0 else binomtest(only_a, only_a + only_b, 0.5).pvalue
    assert p == pytest.approx(expected, rel=1e-12, abs=1e-300)


def test_mcnemar_refuses_verdicts_on_different_prompts():
    with pytest.raises(ValueError):
        mcnemar([True, False], [True])


def _table(n: int, golds: int = 5) -> list[bool]:
    """The middle flags of n prompts taken in turn from `golds` evenly spread positions of 20 pairs."""
    positions = [round(k * 19 / (golds - 1)) for k in range(golds)]
    return [in_middle(positions[i % golds], 20) for i in range(n)]


def _verdicts(n: int, right: set[int]) -> tuple[bool, ...]:
    return tuple(i in right for i in range(n))


def _candidates(n: int, unscaled: set[int], uniform: set[int], curve: set[int]) -> list[Candidate]:
    return [Candidate("unscaled", "unscaled", _verdicts(n, unscaled)),
            Candidate("uniform s=0.75", "uniform", _verdicts(n, uniform), "linear", 0.75),
            Candidate("per-layer curve", "per-layer", _verdicts(n, curve), scales=(0.7, 0.8))]


def test_per_layer_ships_only_when_it_beats_the_uniform_scale_at_p_below_alpha():
    n = 200
    base = set(range(0, 200, 5))  # 40 right unscaled
    uniform = base | set(range(1, 200, 5))  # +40: far beyond noise
    # 9 more prompts right with the curve and none lost: p = 2 / 2^9 = 0.0039
    curve = uniform | set(range(2, 47, 5))
    decision = decide(_candidates(n, base, uniform, curve), _table(n))
    assert decision.ship.kind == "per-layer"
    assert "+4.5 overall over uniform s=0.75" in decision.reason
    # 5 more and none lost: p = 2 / 32 = 0.0625, not below 0.05: the uniform scale ships, and says why
    curve = uniform | set(range(2, 27, 5))
    decision = decide(_candidates(n, base, uniform, curve), _table(n))
    assert decision.ship.to_json() == {"name": "uniform s=0.75", "kind": "uniform", "rope_type": "linear",
                                       "factor": 0.75}
    assert "per-layer curve not" in decision.reason and "p = 0.062" in decision.reason
    # the same 5 at alpha 0.1 do win
    assert decide(_candidates(n, base, uniform, curve), _table(n), alpha=0.1).ship.kind == "per-layer"


def test_a_tie_goes_to_the_simpler_candidate():
    n = 200
    base = set(range(0, 200, 4))
    swapped = (base - {0, 4, 8}) | {1, 5, 9}  # as many right, other prompts: discordant 3 / 3, p = 1
    decision = decide(_candidates(n, base, swapped, swapped), _table(n))
    assert decision.ship.kind == "unscaled"
    same = decide(_candidates(n, base, base, base), _table(n))
    assert same.ship.kind == "unscaled"


def test_a_gain_in_the_middle_alone_counts():
    n = 200
    middle = _table(n)
    base = set(range(0, 200, 2))
    gained = [i for i in range(n) if middle[i] and i not in base][:10]
    lost = [i for i in sorted(base) if not middle[i]][:10]  # as many lost at the ends: overall 10 / 10, p = 1
    uniform = (base | set(gained)) - set(lost)
    decision = decide(_candidates(n, base, uniform, uniform), middle)
    assert decision.ship.kind == "uniform"
    [versus] = decision.rows[1].against
    assert versus.p == 1.0 and versus.middle_p == pytest.approx(binomtest(10, 10, 0.5).pvalue)


def test_too_few_held_out_prompts_decide_for_the_unscaled_model():
    n = smallest_detectable(0.05) - 1
    assert n == 119  # 6 discordant prompts all one way (p = 0.031) are 5 points of 120
    decision = decide(_candidates(n, set(), set(range(n)), set(range(n))), _table(n))
    assert decision.ship.kind == "unscaled"
    assert "cannot show a 5-point gain" in decision.reason


def test_binomial_p_is_symmetric_and_at_most_one():
    assert binomial_p(3, 9) == binomial_p(9, 3)
    assert binomial_p(5, 5) == 1.0


def test_the_table_names_every_candidate_and_the_shipped_one():
    n = 200
    base = set(range(0, 200, 5))
    decision = decide(_candidates(n, base, base | set(range(1, 200, 5)), base), _table(n))
    text = "\n".join(format_table(decision))
    assert "| uniform s=0.75 **(shipped)** | 40.0 |" in text
    assert text.count("\n| ") == 3  # below the header: unscaled, uniform, curve
    assert parse_decision(json.loads(json.dumps(decision.to_json()))) == decision  # best.json reads back the same


# ---- lpes-convert ships the decision ----


CURVE = (1.0, 1.5, 2.0, 2.5)  # the per-layer spec the tests below convert


def decision_json(ship: str, scales: tuple[float, ...] = CURVE, reason: str | None = None) -> dict:
    """A decision lpes-search could have made, whose table ships `ship` ("unscaled", "uniform s=1.5", "YaRN f=2"):
    that candidate right on 40 more of 200 held-out prompts than the unscaled model, the curve no better."""
    n, base = 200, set(range(0, 200, 5))
    better = base | set(range(1, 200, 5))
    candidates = [Candidate("unscaled", "unscaled", _verdicts(n, base))]
    if ship.startswith("uniform"):
        candidates.append(Candidate(ship, "uniform", _verdicts(n, better), "linear", float(ship.split("=")[1])))
    elif ship != "unscaled":
        candidates.append(Candidate(ship, "stock", _verdicts(n, better), "yarn", float(ship.split("=")[1])))
    best = better if ship != "unscaled" else base
    candidates.append(Candidate("per-layer curve", "per-layer", _verdicts(n, best), scales=scales))
    decision = decide(candidates, _table(n)).to_json()
    assert decision["ship"]["name"] == ship
    return decision if reason is None else {**decision, "reason": reason}


def _spec_with_decision(tmp_path: Path, ship: str, reason: str | None = None) -> Path:
    """A per-layer spec for the bundled 4-layer model whose decision is `ship`."""
    spec = {"format": "lpes-spec", "version": 1, "scales": list(CURVE),
            "provenance": {"decision": decision_json(ship, reason=reason)}}
    path = tmp_path / "best.json"
    path.write_text(json.dumps(spec))
    return path


def _convert(argv: list[str]) -> tuple[int, str]:
    from lpes import cli

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.convert_main(argv)
        except SystemExit as exit:  # argparse's refusals end the process as the command would
            code = exit.code
    return code, stderr.getvalue()


def test_a_uniform_decision_converts_to_stock_rope_parameters_and_no_code(tmp_path):
    from transformers import AutoConfig

    spec = _spec_with_decision(tmp_path, "uniform s=1.5")
    out = tmp_path / "out"
    code, stderr = _convert([BUNDLED, "--curve", str(spec), "--to", "hf", "--out", str(out), "--no-validate"])
    assert code == 0, stderr
    assert "shipping the decision, uniform s=1.5" in stderr
    assert not (out / "modeling_lpes.py").exists() and not (out / "lpes_rope.py").exists()
    config = AutoConfig.from_pretrained(out)  # transformers' own reading of what was written
    assert config.rope_parameters["rope_type"] == "linear" and config.rope_parameters["factor"] == 1.5
    assert "auto_map" not in json.loads((out / "config.json").read_text())
    card = (out / "README.md").read_text()
    assert "This folder holds the decision, **uniform s=1.5**" in card


def test_ship_curve_writes_the_per_layer_files_and_says_so(tmp_path):
    spec = _spec_with_decision(tmp_path, "unscaled")
    out = tmp_path / "out"
    code, stderr = _convert([BUNDLED, "--curve", str(spec), "--to", "hf", "--out", str(out), "--no-validate",
                             "--ship", "curve"])
    assert code == 0, stderr
    assert "--ship curve: shipping the searched curve, not the decision's unscaled" in stderr
    assert (out / "modeling_lpes.py").is_file()
    assert json.loads((out / "config.json").read_text())["lpes"]["scales"] == [1.0, 1.5, 2.0, 2.5]
    assert "holds the searched curve (`lpes-convert --ship curve`)" in (out / "README.md").read_text()


def test_a_spec_without_a_decision_converts_its_curve_with_one_note(tmp_path):
    spec = tmp_path / "old.json"
    spec.write_text(json.dumps({"format": "lpes-spec", "version": 1, "scales": [1.0, 1.5, 2.0, 2.5]}))
    out = tmp_path / "out"
    code, stderr = _convert([BUNDLED, "--curve", str(spec), "--to", "hf", "--out", str(out), "--no-validate"])
    assert code == 0, stderr
    assert sum("records no held-out decision" in line for line in stderr.splitlines()) == 1
    assert (out / "modeling_lpes.py").is_file()


@pytest.mark.parametrize("argv_tail, message", [
    (["--ship", "decisoin"], "argument --ship: invalid choice: 'decisoin'"),
])
def test_bad_ship_is_one_line(tmp_path, argv_tail, message):
    spec = _spec_with_decision(tmp_path, "unscaled")
    out = tmp_path / "out"
    code, stderr = _convert([BUNDLED, "--curve", str(spec), "--to", "hf", "--out", str(out), *argv_tail])
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and message in stderr, stderr
    assert not out.exists()


def test_a_stock_decision_the_model_cannot_take_is_refused_in_one_line(tmp_path):
    from conftest import tiny_model_dir

    layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    model = tiny_model_dir("gemma3_text", tmp_path, head_dim=8, sliding_window=16, layer_types=layer_types)
    spec = tmp_path / "best.json"
    spec.write_text(json.dumps({"format": "lpes-spec", "version": 1, "scales": [1.0, 1.5, 2.0], "provenance": {
        "decision": decision_json("YaRN f=2", scales=(1.0, 1.5, 2.0))}}))
    out = tmp_path / "out"
    code, stderr = _convert([str(model), "--curve", str(spec), "--to", "hf", "--out", str(out), "--no-validate"])
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert "decision ships YaRN f=2, which" in stderr and "one RoPE per layer type" in stderr
    assert not out.exists()


def test_a_decision_of_unknown_kind_is_refused_when_the_spec_is_read(tmp_path):
    from lpes.foundation.spec import load_spec

    spec = _spec_with_decision(tmp_path, "unscaled")
    data = json.loads(spec.read_text())
    data["provenance"]["decision"]["ship"]["kind"] = "per-head"
    spec.write_text(json.dumps(data))
    with pytest.raises(LpesError, match="provenance.decision.ship.kind' must be one of"):
        load_spec(spec)


def test_sliding_window_stretch_is_named_by_layer():
    from conftest import tiny_config

    from lpes.converter.architectures import stretched_windows, window_warning

    config = tiny_config("gemma3_text", head_dim=8, sliding_window=512, num_hidden_layers=3,
                         layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    # Gemma 3's two lengths: 374 / 0.75 = 499 stays within 512; 884 tokens meet distances to 511, 511 / 0.75 = 681
    assert stretched_windows(config, [0.75] * 3, 374) == ([], 0.0)
    assert stretched_windows(config, [0.75] * 3, 884)[0] == [0, 1]
    assert stretched_windows(config, [1.0, 0.75, 0.75], 884)[0] == [1]  # the full-attention layer is not named
    line = window_warning(config, [0.75] * 3, 884, "uniform s=0.75")
    assert line.startswith("warning: uniform s=0.75 stretches the sliding windows of layers 0-1 past the 512")


def test_validation_repeats_the_decisions_test_and_names_the_searchs(tmp_path):
    spec = _spec_with_decision(tmp_path, "uniform s=1.5")
    out = tmp_path / "out"
    code, stderr = _convert([BUNDLED, "--curve", str(spec), "--to", "hf", "--out", str(out),
                             "--data", "tiny-kv:examples=2"])
    assert code in (0, 1), stderr  # 1: a validation check failed, which this test does not judge
    report = (out / "validation.md").read_text()
    assert "The decision's test on these prompts" in report
    assert "| unscaled **(decided)** | " in report and "On these prompts (McNemar's exact test, alpha 0.05):" in report
    # 10 prompts cannot show a 5-point gain: this run's own test says so rather than pick a winner
    assert "10 held-out prompts cannot show a 5-point gain" in report
    assert "lpes-search's decision on its 200 held-out prompts: uniform s=1.5 shipped; per-layer curve not" in report
    assert "## What ships and why" in (out / "README.md").read_text()
