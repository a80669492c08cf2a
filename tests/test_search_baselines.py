"""lpes-search's stock RoPE baselines: each type at its best factor on calibration, exactly, recorded typed."""

import json
import random
import shutil

import pytest
from conftest import tiny_model_dir
from transformers import AutoModelForCausalLM

from lpes.cli import search_main
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import StockRope, load_spec
from lpes.search.baselines import parse_baselines, scan_stock_baselines
from lpes.search.run import SearchOptions, search
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


@pytest.mark.parametrize("seed", range(6))
def test_wide_chunks_find_the_same_factor_with_the_same_verdicts(seed):
    """A factor that must fail more than a chunk before it could be dropped gets them at once: the same factor,
    and no more verdicts than a chunk's overshoot where a factor is dropped (the chunks end elsewhere)."""
    narrow, wide = WindowTask(seed=seed), WindowTask(seed=seed)
    [found] = scan_stock_baselines(narrow, ["yarn"], GRID, chunk=4, progress=False)
    [found_wide] = scan_stock_baselines(wide, ["yarn"], GRID, chunk=4, progress=False, wide_chunk=16)
    assert {**found_wide, "tokens": 0} == {**found, "tokens": 0}
    assert wide.forward_tokens <= narrow.forward_tokens + 3 * len(found["factors_scanned"])
    assert len(wide.calls) < len(narrow.calls) and max(len(ids) for _, ids in wide.calls) == 16


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
    recorded = {b["rope_type"]: b for b in spec.provenance.raw["search"]["stock_baselines"]}
    assert set(recorded) == {"yarn", "dynamic"} and spec.provenance.raw["search"]["stock_baselines_skipped"] == {}
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
    # The bundled model with its RoPE written as linear at factor 1: the same model (it answers, so the
    # search writes a curve), whose own RoPE type the stock baselines cannot replace.
    from lpes.converter.loading import resolve_model

    model = tmp_path / "linear-model"
    shutil.copytree(resolve_model("lpes-tiny-kv"), model)
    config = json.loads((model / "config.json").read_text())
    config["rope_parameters"] = {**config["rope_parameters"], "rope_type": "linear", "factor": 1.0}
    (model / "config.json").write_text(json.dumps(config))
    code = search_main([str(model), "--out", str(tmp_path / "best.json"), "--data", "tiny-kv:examples=1,length=512",
                        "--population", "2", "--generations", "0", "--scale-grid", "1:2:1", "--holdout", "5"])
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
    assert spec.stock_baselines == () and spec.provenance.raw["search"]["stock_baselines"] == []


# -- --rope-type: per-layer factors under yarn / dynamic, whose uniform scan is that stock type's scan -------


def test_a_yarn_search_starts_from_stock_yarn_and_records_it_as_the_baseline(tmp_path):
    """The uniform scan under --rope-type yarn is stock YaRN's scan: the baseline recorded for yarn is its
    best, scored by a config.json that says yarn (loaded by plain transformers), and the curve is never
    below it on calibration."""
    from lpes.foundation.spec import RopeScheme

    options = SearchOptions(data="tiny-kv:examples=2,length=512", population=4, generations=1, holdout=2,
                            scale_grid="1:4:1", rope_type="yarn", baselines="yarn")
    spec = search("lpes-tiny-kv", tmp_path / "best.json", options, progress=False)
    assert spec.rope == RopeScheme("yarn", 32.0, 1.0, 256)  # written out for the model (its trained length)
    assert load_spec(tmp_path / "best.json").rope == spec.rope
    record = spec.provenance.raw["search"]
    assert record["rope_type"] == "yarn" and record["best_uniform_scale"] is None  # no linear uniform was scanned
    [yarn] = record["stock_baselines"]
    assert yarn["rope_type"] == "yarn" and yarn["factors_scanned"] == [1.0, 2.0, 3.0, 4.0]
    assert record["fitness"] >= yarn["fitness"]
    assert spec.stock_baselines == (StockRope("yarn", yarn["factor"]),)

    from lpes.converter.loading import load_tokenizer, resolve_model

    bundled = resolve_model("lpes-tiny-kv")
    folder = tmp_path / "yarn-model"
    shutil.copytree(bundled, folder)
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": config["rope_parameters"]["rope_theta"],
                                 "factor": yarn["factor"],
                                 "original_max_position_embeddings": config["max_position_embeddings"]}
    (folder / "config.json").write_text(json.dumps(config))
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    calibration = examples_for(task_config(bundled, options.data), bundled, split="search")
    assert scoring.teacher_forced_correct(model, load_tokenizer(bundled), calibration, 8).accuracy == yarn["fitness"]


@pytest.mark.parametrize("options, message", [
    (SearchOptions(rope_type="yarn", scale_grid="0.5:4:0.5"), "factors must be >= 1"),
    (SearchOptions(rope_type="ntk"), "--rope-type must be one of linear, yarn, dynamic"),
])
def test_rope_type_settings_fail_before_any_model_is_loaded(options, message):
    from lpes.search.run import check_options

    with pytest.raises(LpesError, match=message):
        check_options(options)


def test_a_model_that_cannot_take_the_scheme_is_refused_before_loading(tmp_path, capsys):
    model = tiny_model_dir("llama", tmp_path,
                           rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    code = search_main([str(model), "--out", str(tmp_path / "best.json"), "--rope-type", "dynamic",
                        "--data", "kv:pairs=4,examples=1", "--no-chat-template"])
    assert code == 2 and not (tmp_path / "best.json").exists()
    assert "per-layer dynamic NTK (rope_type 'dynamic') cannot run on this model: its own RoPE is 'linear'" in (
        capsys.readouterr().err)


def test_dynamic_candidates_are_scored_one_example_at_a_time():
    """Per-layer dynamic NTK takes its base from a batch's longest row: each verdict must be the example's own."""
    from lpes.foundation.spec import RopeScheme
    from lpes.search.candidates import SchemeScales
    from lpes.search.fitness import ModelEvaluator
    from lpes.search.replica import _batch_size

    class Pool:
        size = 1

        def score(self, candidate, shares):
            self.seen = candidate
            return []

    pool = Pool()
    evaluator = ModelEvaluator(pool, 4, RopeScheme("dynamic"))
    evaluator.correct((2.0, 1.0), [])
    assert pool.seen == SchemeScales((2.0, 1.0), RopeScheme("dynamic"))
    assert _batch_size(pool.seen, 8) == 1 and _batch_size(SchemeScales((2.0,), RopeScheme("yarn")), 8) == 8
    assert _batch_size((2.0, 1.0), 8) == 8 and _batch_size(StockRope("dynamic", 2.0), 8) == 1
