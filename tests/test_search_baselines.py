"""lpes-search's stock RoPE baselines: each type at its best factor on calibration, exactly, recorded typed."""

import json
import random
import shutil
from pathlib import Path

import pytest
from conftest import tiny_model_dir
from transformers import AutoModelForCausalLM

from lpes.cli import search_main
from lpes.errors import LpesError
from lpes.search.baselines import parse_baselines, scan_stock_baselines
from lpes.search.run import SearchOptions, search
from lpes.spec import StockRope, load_spec
from lpes.validation import scoring
from lpes.validation.tasks import examples_for, task_config

GRID = [0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]


class WindowTask:
    """A stand-in model: example i is answered iff the factor lies in its window [low_i, high_i]."""

    def __init__(self, n=40, seed=0):
        rng = random.Random(seed)
        self.windows = [sorted((rng.uniform(0.5, 4.5), rng.uniform(0.5, 4.5))) for _ in range(n)]
        self.num_examples, self.forward_tokens, self.calls = n, 0, []

    def correct(self, rope, ids):
        self.calls.append((rope, tuple(ids)))
        self.forward_tokens += len(ids)
        return [self.windows[i][0] <= rope.factor <= self.windows[i][1] for i in ids]


def exhaustive(task, factors):
    """The plain scan: every factor >= 1 on every example; the most right answers, ties to the smaller factor."""
    right = {f: sum(low <= f <= high for low, high in task.windows) for f in factors if f >= 1}
    best = max(right.values())
    return min(f for f, r in right.items() if r == best), best / task.num_examples


@pytest.mark.parametrize("seed", range(6))
def test_racing_finds_the_exhaustive_best_factor_for_less(seed):
    task = WindowTask(seed=seed)
    [result] = scan_stock_baselines(task, ["yarn"], GRID, chunk=4, progress=False)
    assert (result["factor"], result["fitness"]) == exhaustive(WindowTask(seed=seed), GRID)
    assert result["factors_scanned"] == [f for f in GRID if f >= 1]
    assert all(rope.rope_type == "yarn" and rope.factor >= 1 for rope, _ in task.calls)
    scored = [(rope, i) for rope, ids in task.calls for i in ids]
    assert len(scored) == len(set(scored)) <= 7 * task.num_examples  # nothing twice


def test_a_factor_that_cannot_pass_the_best_is_not_scored_on():
    task = WindowTask()
    task.windows = [(1.4, 1.6)] * task.num_examples  # 1.5 answers everything: nothing after it can pass it
    [result] = scan_stock_baselines(task, ["dynamic"], GRID, chunk=4, progress=False)
    assert (result["factor"], result["fitness"]) == (1.5, 1.0)
    assert {rope.factor for rope, _ in task.calls} == {1.0, 1.5}
    assert sum(len(ids) for rope, ids in task.calls if rope.factor == 1.0) == task.num_examples


def test_a_grid_below_one_scans_nothing():
    assert scan_stock_baselines(WindowTask(), ["yarn", "dynamic"], [0.5, 0.75], chunk=4, progress=False) == []


@pytest.mark.parametrize("text, expected", [("yarn,dynamic", ("yarn", "dynamic")), ("dynamic", ("dynamic",)),
                                            ("none", ())])
def test_baselines_flag(text, expected):
    assert parse_baselines(text) == expected


@pytest.mark.parametrize("text, message", [("yarn,ntk", "unknown RoPE type 'ntk'"), ("yarn,yarn", "once"),
                                           (",", "once"), ("none,yarn", "none stands alone")])
def test_baselines_flag_typos(text, message):
    with pytest.raises(LpesError, match=message):
        parse_baselines(text)


def test_the_recorded_factors_score_what_transformers_gives_on_calibration(tmp_path):
    """The spec's YaRN fitness is what a config.json with that factor scores, loaded by plain transformers."""
    options = SearchOptions(data="tiny-kv:examples=2,length=512", population=4, generations=1, holdout=2,
                            scale_grid="1:4:1")
    spec = search("lpes-tiny-kv", tmp_path / "best.json", options, progress=False)
    recorded = {b["rope_type"]: b for b in spec.provenance["search"]["stock_baselines"]}
    assert set(recorded) == {"yarn", "dynamic"} and spec.provenance["search"]["stock_baselines_skipped"] == {}
    assert load_spec(tmp_path / "best.json").stock_baselines == (
        StockRope("yarn", recorded["yarn"]["factor"]), StockRope("dynamic", recorded["dynamic"]["factor"]))

    from lpes.converter.loading import load_tokenizer, resolve_model

    bundled = resolve_model("lpes-tiny-kv")
    folder = tmp_path / "yarn-model"
    shutil.copytree(bundled, folder)
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": config["rope_parameters"]["rope_theta"],
                                 "factor": recorded["yarn"]["factor"],
                                 "original_max_position_embeddings": config["max_position_embeddings"]}
    (folder / "config.json").write_text(json.dumps(config))
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    calibration = examples_for(task_config(bundled, options.data), bundled, split="search")
    scores = scoring.teacher_forced_correct(model, load_tokenizer(bundled), calibration, 8)
    assert scores.accuracy == recorded["yarn"]["fitness"]


def test_a_model_that_cannot_take_them_is_searched_and_says_why(tmp_path, capsys):
    model = tiny_model_dir("llama", tmp_path,
                           rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    real = Path(__file__).parent / "data" / "kv-retrieval-75_keys.first12.jsonl.gz"
    code = search_main([str(model), "--out", str(tmp_path / "best.json"), "--data", f"kv:file={real},gold=0+74",
                        "--population", "2", "--generations", "0", "--scale-grid", "1:2:1", "--no-chat-template"])
    assert code == 0
    search_record = json.loads((tmp_path / "best.json").read_text())["provenance"]["search"]
    assert search_record["stock_baselines"] == []
    assert set(search_record["stock_baselines_skipped"]) == {"yarn", "dynamic"}
    err = capsys.readouterr().err
    assert "no yarn baseline: its own RoPE is 'linear'" in err


def test_none_skips_the_scan(tmp_path):
    options = SearchOptions(data="tiny-kv:examples=1,length=512", population=2, generations=0, holdout=0,
                            scale_grid="1:2:1", baselines="none")
    spec = search("lpes-tiny-kv", tmp_path / "best.json", options, progress=False)
    assert spec.stock_baselines == () and spec.provenance["search"]["stock_baselines"] == []
