"""A decision read from a file is input like the rest of the spec (issue 51): every field typed and checked at load,
the counts and p values those of its own verdicts, what ships the row its own table's rule picks, text one
printable line, and what a folder is said to hold read off its scales rather than taken from a claim.

Each case starts from a decision lpes-search could have made (tests/test_decision.py's `decision_json`) and
breaks one thing; on the code before this check each of them converted, validated or crashed late.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_decision import CURVE, decision_json

from lpes.foundation.decision import Decision, format_table, parse_decision
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import parse_spec


def _spec(decision: dict, scales=CURVE, shipped: dict | None = None) -> dict:
    provenance = {"decision": decision} | ({"shipped": shipped} if shipped else {})
    return {"format": "lpes-spec", "version": 1, "scales": list(scales), "provenance": provenance}


def _set(path: str, value):
    """A change to the decision: `path` is dotted, list indices as numbers ("rows.1.against.0.p")."""
    def change(decision: dict) -> dict:
        out = copy.deepcopy(decision)
        *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
        holder = out
        for key in parents:
            holder = holder[key]
        holder[last] = value
        return out
    return change


BROKEN = [
    ("p a string", _set("rows.1.against.0.p", "0.01"), "'provenance.decision.rows[1].against[0].p' is '0.01'"),
    ("p not the counts'", _set("rows.1.against.0.p", 0.5), "McNemar's test of its counts gives"),
    ("middle p above 1", _set("rows.1.against.0.middle_p", 1.5), "rows[1].against[0].middle_p"),
    ("only ship and reason", lambda d: {"ship": d["ship"], "reason": d["reason"]}, "lacks 'alpha', 'prompts'"),
    ("alpha 2", _set("alpha", 2), "'provenance.decision.alpha' must be a number in (0, 1), got 2"),
    ("alpha a bool", _set("alpha", True), "'provenance.decision.alpha'"),
    ("prompts negative", _set("prompts", -3), "'provenance.decision.prompts' must be an integer"),
    ("prompts a float", _set("prompts", 200.0), "'provenance.decision.prompts' must be an integer"),
    ("right a bool", _set("rows.0.right", True), "'provenance.decision.rows[0].right'"),
    ("right not its verdicts'", _set("rows.0.right", 41), "but its verdicts hold 40 right"),
    ("verdicts too short", _set("rows.0.verdicts", "1" * 10), "rows[0].verdicts' must be a string of 200"),
    ("accuracy not the counts'", _set("rows.1.all", 99.0), "rows[1].all' is 99.0, but its counts give 40.00"),
    ("discordant count forged", _set("rows.1.against.0.only_this", 90), "but the two rows' verdicts give 40"),
    ("name says one factor, factor another", _set("rows.1.factor", 2.0), "rows[1].name' is 'uniform s=1.5', but"),
    ("ship's factor not its row's", _set("ship.factor", 2.0), "'provenance.decision.ship' says uniform linear 2.0"),
    ("ship names no row", _set("ship.name", "uniform s=9"), "'uniform s=9' is no row of the decision's table"),
    ("ship not what its table decides", _set("ship", {"name": "per-layer curve", "kind": "per-layer",
                                                      "rope_type": None, "factor": None}),
     "names 'per-layer curve', but its own table decides 'uniform s=1.5'"),
    ("kind unknown", _set("rows.1.kind", "per-head"), "rows[1].kind' must be one of"),
    ("stock factor below 1", _set("rows.1.factor", 0.5), "rows[1].factor' must be a scale in [1, 10000]"),
    ("row names twice", _set("rows.2.name", "unscaled"), "rows[2].name' must be one of 'per-layer curve'"),
    ("first row not unscaled", lambda d: {**d, "rows": d["rows"][1:]}, "against' must list the 0 simpler rows"),
    ("against in another order", _set("rows.2.against.0.simpler", "uniform s=1.5"), "must be 'unscaled'"),
    ("reason with a newline and escape codes", _set("reason", "ok\n\x1b[31mlpes-convert: error: forged\x1b[0m"),
     "'provenance.decision.reason' must be one line of at most 400 printable characters"),
    ("reason empty", _set("reason", " "), "'provenance.decision.reason' must be a non-empty string"),
    ("unknown key", _set("rows.0.ext", 1), "unknown key 'ext' in 'provenance.decision.rows[0]'"),
]


@pytest.mark.parametrize("name, change, fragment", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_decision_is_refused_at_load_naming_the_field(name, change, fragment):
    decision = change(decision_json("uniform s=1.5" if "stock" not in name else "YaRN f=2"))
    with pytest.raises(LpesError) as refused:
        parse_spec(_spec(decision))
    message = str(refused.value)
    assert fragment in message and "\n" not in message and message.isprintable(), message


def test_a_decision_as_lpes_search_writes_it_reads_back_field_for_field():
    for ship in ("unscaled", "uniform s=1.5", "YaRN f=2"):
        data = decision_json(ship)
        decision = parse_spec(_spec(data)).decision
        assert isinstance(decision, Decision) and decision.ship.name == ship
        assert json.dumps(decision.to_json()) == json.dumps(data)  # the spec's bytes unchanged by a round trip


def test_the_recorded_real_model_decisions_still_load():
    """Hold-out input: the specs real searches wrote on SmolLM2-135M before the decision was typed."""
    recorded = sorted(Path(__file__).parents[1].glob("bench/real/*decision*.json"))
    assert recorded
    for path in recorded:
        data = json.loads(path.read_text())
        assert parse_spec(data).decision.to_json() == data["provenance"]["decision"], path


def test_the_spec_scales_must_be_the_decisions_per_layer_row():
    with pytest.raises(LpesError, match="per-layer curve' row does not hold the spec's scales"):
        parse_spec(_spec(decision_json("uniform s=1.5"), scales=(1.0, 1.5, 2.0, 3.0)))


def test_a_folder_that_claims_the_decision_must_hold_it():
    """A received per-layer folder whose provenance says it ships a uniform decision: refused, not carded."""
    claim = {"ship": "decision", "what": "uniform s=1.5"}
    with pytest.raises(LpesError, match="'provenance.shipped' says the decision, uniform s=1.5, ships, but the "
                                        "spec's scales and rope_type compute per-layer curve"):
        parse_spec(_spec(decision_json("uniform s=1.5"), shipped=claim))
    held = parse_spec(_spec(decision_json("uniform s=1.5"), scales=(1.5,) * 4, shipped=claim))
    assert held.decision.row_computing(held.scales, held.rope.rope_type).name == "uniform s=1.5"
    with pytest.raises(LpesError, match="'provenance.shipped.what' must be one line"):
        parse_spec(_spec(decision_json("uniform s=1.5"), scales=(1.5,) * 4, shipped={**claim, "what": "a\nb"}))


def test_text_from_a_file_reaches_the_card_escaped():
    hostile = "see <img src=x onerror=alert(1)> [here](http://evil) | `x` **y**"
    decision = parse_decision(decision_json("uniform s=1.5", reason=hostile))
    shown = format_table(decision)[-1].split(": ", 1)[1]
    assert shown.replace("\\", "") == hostile  # the same words, each Markdown character escaped
    assert not re.search(r"(?<!\\)[<>\[\]|`*]", shown), shown


def test_ship_curve_marks_the_curve_shipped_and_the_decision_decided():
    decision = parse_decision(decision_json("uniform s=1.5"))
    table = "\n".join(format_table(decision, shipped="per-layer curve"))
    assert "| per-layer curve **(shipped)** |" in table and "| uniform s=1.5 **(decided)** |" in table
    assert table.count("(shipped)") == 1


@pytest.mark.parametrize("command", ["lpes-convert", "lpes-validate"])
def test_a_forged_decision_is_one_line_before_torch_loads(tmp_path, command):
    """The forged line, its colour codes and all, never reaches the terminal: the refusal is the only line."""
    folder = tmp_path / "received"
    folder.mkdir()
    forged = _set("reason", "fine\n\x1b[31mlpes-convert: error: forged\x1b[0m")(decision_json("uniform s=1.5"))
    (folder / "lpes_spec.json").write_text(json.dumps(_spec(forged)))
    out = tmp_path / "out"
    main = {"lpes-convert": "convert_main", "lpes-validate": "validate_main"}[command]
    argv = (["lpes-tiny-kv", "--curve", str(folder / "lpes_spec.json"), "--to", "hf", "--out", str(out)]
            if command == "lpes-convert" else [str(folder), "--model", "lpes-tiny-kv"])
    code = (f"import sys\nfrom lpes.cli import {main}\ncode = {main}({argv!r})\n"
            "print(code, sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "\x1b" not in done.stderr, done.stderr
    assert "'provenance.decision.reason' must be one line" in lines[0]
    assert done.stdout.split()[0] == "2", done.stdout + done.stderr
    assert not out.exists()


@pytest.mark.parametrize("field, value", [("base_model", "me\n\x1b[2Klpes: passed"), ("lpes_version", "0.1\r"),
                                          ("model", {"name": "x\x1b]8;;http://evil\x07y"}),
                                          ("search", {"task": {"data": "kv\npairs=20"}})])
def test_provenance_text_that_cards_and_terminals_show_is_one_printable_line(field, value):
    spec = {"format": "lpes-spec", "version": 1, "scales": [1.0], "provenance": {field: value}}
    with pytest.raises(LpesError, match=f"'provenance.{field}"):
        parse_spec(spec)
