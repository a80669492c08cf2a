"""The genetic search: exact racing, no repeated scoring, resumable to the byte, clear errors."""

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from lpes.cli import search_main
from lpes.search import ga as ga_module
from lpes.search.cma import CMASearch, default_population
from lpes.search.ga import GASettings, GeneticSearch
from lpes.search.genome import ScaleGrid, SearchSpace
from lpes.validation import tiny_kv


class ThresholdTask:
    """A stand-in model: example i is answered iff the first layer's scale reaches t_i and the last stays low."""

    def __init__(self, n=48, seed=1):
        rng = random.Random(seed)
        self.thresholds = [rng.uniform(1, 4) for _ in range(n)]
        self.num_examples, self.forward_tokens, self.calls, self.rounds = n, 0, [], 0

    def correct(self, scales, ids):
        self.rounds += 1
        return self._verdicts(scales, ids)

    def correct_many(self, jobs):
        """Several (scales, ids) at once, as a pool of replicas scores them: one round."""
        self.rounds += 1
        return [self._verdicts(scales, ids) for scales, ids in jobs]

    def _verdicts(self, scales, ids):
        self.calls.append((scales, tuple(ids)))
        self.forward_tokens += 100 * len(ids)
        return [scales[0] >= self.thresholds[i] and scales[-1] <= 2.0 for i in ids]


SPACE = SearchSpace(ScaleGrid.parse("1:4:0.25"), num_layers=8, degree=3)


def run(racing, seed=0, generations=8, population=12, ties="gentle", optimizer=GeneticSearch, replicas=1,
        patience=0, wide_chunk=8):
    task = ThresholdTask()
    state = optimizer(SPACE, task, GASettings(population=population, generations=generations,
                                              parents=population // 2, seed=seed, racing=racing, chunk=8,
                                              wide_chunk=wide_chunk, ties=ties, replicas=replicas,
                                              patience=patience)).run()
    return state, task


def outcome(state):
    """What a search decides: its parents, the best per generation, CMA-ES's told ranks."""
    return ([(s.genome, s.fitness, s.order) for s in state.parents], [h["best"] for h in state.history],
            state.optimizer)


@pytest.mark.parametrize("seed, ties", [(0, "gentle"), (1, "gentle"), (2, "gentle"), (0, "first"), (1, "first")])
def test_racing_changes_cost_not_result(seed, ties):
    raced, raced_task = run(True, seed, ties=ties)
    plain, plain_task = run(False, seed, ties=ties)
    assert [(s.genome, s.fitness, s.order) for s in raced.parents] == [(s.genome, s.fitness, s.order)
                                                                       for s in plain.parents]
    assert [h["best"] for h in raced.history] == [h["best"] for h in plain.history]
    assert (raced.uniform["scale"], raced.uniform["fitness"]) == (plain.uniform["scale"], plain.uniform["fitness"])
    assert raced.raced_out > 0 and raced_task.forward_tokens < plain_task.forward_tokens


@pytest.mark.parametrize("seed, ties", [(0, "gentle"), (1, "gentle"), (0, "first")])
def test_cmaes_racing_changes_cost_not_result(seed, ties):
    """CMA-ES is told a ranking whose every input racing computes: the same search with or without racing."""
    population = default_population(SPACE.degree)
    raced, raced_task = run(True, seed, ties=ties, optimizer=CMASearch, population=population)
    plain, plain_task = run(False, seed, ties=ties, optimizer=CMASearch, population=population)
    assert outcome(raced) == outcome(plain)
    assert len(raced.optimizer["told"]) == 9 and raced.history[-1]["best"] > raced.history[0]["best"]
    assert raced.raced_out > 0 and raced_task.forward_tokens < plain_task.forward_tokens


@pytest.mark.parametrize("optimizer, seed", [(GeneticSearch, 0), (GeneticSearch, 1), (CMASearch, 0), (CMASearch, 1)])
def test_wide_chunks_change_how_many_calls_not_the_result_nor_the_verdicts(optimizer, seed):
    """A runner that cannot be dropped within its next k examples gets them in one chunk (up to wide_chunk): the
    same search, in fewer and wider calls, at no more verdicts but for a few (racing's order of runners moves with
    the chunks: a bar that rises while a wide chunk runs can make one needless; a runner finished sooner raises the
    bar for the others sooner)."""
    population = default_population(SPACE.degree) if optimizer is CMASearch else 12
    narrow, narrow_task = run(True, seed, optimizer=optimizer, population=population)
    wide, wide_task = run(True, seed, optimizer=optimizer, population=population, wide_chunk=32)
    assert outcome(wide) == outcome(narrow)
    assert len(wide_task.calls) < len(narrow_task.calls)
    assert max(len(ids) for _, ids in wide_task.calls) > 8 >= max(len(ids) for _, ids in narrow_task.calls)
    assert wide_task.forward_tokens <= 1.03 * narrow_task.forward_tokens


@pytest.mark.parametrize("optimizer", [GeneticSearch, CMASearch])
def test_racing_several_genomes_at_once_changes_cost_not_result(optimizer):
    """With R replicas R genomes race at once, each its own chunk: the result of one replica, in fewer rounds."""
    one, one_task = run(True, optimizer=optimizer, population=9)
    many, many_task = run(True, optimizer=optimizer, population=9, replicas=4)
    assert outcome(many) == outcome(one)
    assert many_task.rounds < one_task.rounds  # several genomes per round: fewer rounds
    assert max(len(ids) for _, ids in many_task.calls) <= 8  # the chunks did not grow with the replicas


@pytest.mark.parametrize("optimizer, population, generations, seeds", [
    (GeneticSearch, 12, 10, (0, 1)), (GeneticSearch, 32, 4, (0,)), (CMASearch, 6, 10, (0, 1))])
def test_sixteen_replicas_spend_at_most_a_tenth_more_tokens_than_one(optimizer, population, generations, seeds):
    for seed in seeds:
        one, one_task = run(True, seed, generations=generations, optimizer=optimizer, population=population)
        many, many_task = run(True, seed, generations=generations, optimizer=optimizer, population=population,
                              replicas=16)
        assert outcome(many) == outcome(one)
        assert many_task.forward_tokens <= 1.1 * one_task.forward_tokens, (one_task.forward_tokens,
                                                                           many_task.forward_tokens)


@pytest.mark.parametrize("optimizer", [GeneticSearch, CMASearch])
def test_the_same_seed_gives_the_same_search(optimizer):
    first, _ = run(True, seed=3, optimizer=optimizer, population=9)
    again, _ = run(True, seed=3, optimizer=optimizer, population=9)
    other, _ = run(True, seed=4, optimizer=optimizer, population=9)
    assert outcome(first) == outcome(again) and first.seen == again.seen
    assert first.seen != other.seen


@pytest.mark.parametrize("optimizer", [GeneticSearch, CMASearch])
def test_patience_stops_where_the_best_stopped_changing(optimizer):
    """The patient search is the full search cut short: the same path up to the generation it stops at."""
    full, full_task = run(True, generations=15, optimizer=optimizer, population=9)
    patient, patient_task = run(True, generations=15, optimizer=optimizer, population=9, patience=2)
    stop = patient.generation
    assert stop < 15 and patient.stop_reason
    assert patient.history == full.history[:stop + 1]
    assert patient.stop_reason == "no better curve for 2 generations (--patience 2)"
    assert patient.history[-1]["unchanged"] == 2 and all(h["unchanged"] < 2 for h in patient.history[:-1])
    assert patient_task.forward_tokens < full_task.forward_tokens


class UniformOnlyTask(ThresholdTask):
    """Only one scale in every layer answers anything: no per-layer curve can beat the uniform scan's best."""

    def _verdicts(self, scales, ids):
        self.calls.append((scales, tuple(ids)))
        self.forward_tokens += 100 * len(ids)
        return [len(set(scales)) == 1 and scales[0] == 2.0 and i % 2 == 0 for i in ids]


def test_cma_patience_counts_the_first_population_against_the_uniform_scan():
    """The first population races the scan's best like any later one: when none beats it, that is a generation
    without a better curve, so --patience 2 ends after populations 0 and 1 (main ran a third)."""
    task = UniformOnlyTask()
    state = CMASearch(SPACE, task, GASettings(population=6, generations=15, parents=3, seed=0, racing=True,
                                              chunk=8, patience=2)).run()
    assert state.uniform["scale"] == 2.0 and state.parents[0].fitness == 0.5
    assert [h["unchanged"] for h in state.history] == [1, 2]
    assert state.generation == 1 and state.stop_reason == "no better curve for 2 generations (--patience 2)"


def test_fitness_one_with_ties_first_ends_the_search_at_once():
    state, _ = run(True, generations=15, population=9, ties="first", patience=50)
    assert state.parents[0].fitness == 1.0 and state.stop_reason.startswith("fitness 1.0")
    reached = next(h["generation"] for h in state.history if h["best"] == 1.0)
    assert state.generation == max(reached, 1)


def test_the_progress_line_says_the_patience_and_why_the_search_stopped(tmp_path, capsys):
    out = tmp_path / "best.json"
    assert search_main(["lpes-tiny-kv", "--out", str(out), "--data", "tiny-kv:examples=1,length=512",
                        "--scale-grid", "1:4:1", "--population", "4", "--generations", "8", "--patience", "1",
                        "--holdout", "2", "--baselines", "none"]) == 0
    log = [line for line in capsys.readouterr().err.splitlines()
           if line.startswith(("generation", "lpes-search: stop"))]
    assert all("/1 generations; replicas busy" in line or line.endswith("(--patience 1)") for line in log), log
    assert "best unchanged 1/1 generations" in log[-2]
    assert log[-1].startswith("lpes-search: stopping after generation ")
    assert log[-1].endswith(": no better curve for 1 generations (--patience 1)")
    found = json.loads(out.read_text())["provenance"]["search"]
    assert found["stop_reason"] == "no better curve for 1 generations (--patience 1)"
    assert found["generations_run"] < 8 and found["optimizer"] == "cmaes" and found["population"] == 4


def test_a_checkpoint_of_another_optimizer_is_not_resumed():
    state, _ = run(True, generations=1, population=6)
    with pytest.raises(Exception, match="checkpoint is from ga, not cmaes"):
        CMASearch(SPACE, ThresholdTask(), GASettings(population=6, generations=2, parents=3)).run(state)


def test_several_candidates_are_scored_at_once_one_per_replica():
    """ModelEvaluator.correct_many: one job per replica; a job is halved while replicas are left idle."""
    from lpes.search.candidates import ShareResult
    from lpes.search.fitness import ModelEvaluator

    class Pool:
        size = 4

        def __init__(self):
            self.calls = []

        def score_many(self, jobs):
            self.calls.append(jobs)
            return [ShareResult(slot, tuple(ids), tuple(i % 2 == 0 for i in ids), 10 * len(ids), 0.0)
                    for slot, (_, ids) in enumerate(jobs)]

    pool = Pool()
    evaluator = ModelEvaluator(pool, 16)
    verdicts = evaluator.correct_many([((1.0,), [0, 1, 2, 3]), ((2.0,), [5])])
    assert verdicts == [[True, False, True, False], [False]]
    assert pool.calls[0] == [((1.0,), [0]), ((1.0,), [2]), ((1.0,), [1, 3]), ((2.0,), [5])]
    evaluator.correct_many([((float(k),), [k]) for k in range(6)])  # more jobs than replicas: two rounds
    assert [len(call) for call in pool.calls[1:]] == [4, 2] and evaluator.forward_tokens == 110


@pytest.mark.parametrize("racing", [False, True])
def test_no_scale_vector_is_scored_twice_on_an_example(racing):
    _, task = run(racing)
    scored = [(scales, i) for scales, ids in task.calls for i in ids]
    assert len(scored) == len(set(scored))


def test_search_improves_on_the_stand_in_task():
    state, _ = run(True, generations=15, population=6)
    best = [h["best"] for h in state.history]
    assert best == sorted(best) and best[0] < best[-1] == 1.0


def test_grid_parsing():
    assert ScaleGrid.parse("1:2:0.25").values == (1.0, 1.25, 1.5, 1.75, 2.0)
    for bad in ("2:1:0.5", "1:2:0", "a:b:c", "0:1:0.5"):
        with pytest.raises(Exception, match="scale-grid"):
            ScaleGrid.parse(bad)


@pytest.fixture(scope="module")
def tiny_kv_model(tmp_path_factory):
    """A random-weight model in the bundled model's format (tokenizer, lpes_task.json)."""
    folder = tmp_path_factory.mktemp("tinykv")
    tokenizer = tiny_kv.build_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, bos_token_id=1, eos_token_id=None)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "lpes_task.json").write_text(json.dumps(
        {"task": "tiny-kv", "num_pairs": 4, "length": 48, "gold_indices": [0, 3], "examples_per_index": 6}))
    return folder


def search_args(model, out, *extra):
    return [str(model), "--out", str(out), "--population", "6", "--generations", "3", "--holdout", "4",
            "--scale-grid", "1:3:0.5", *extra]


@pytest.mark.parametrize("optimizer", ["ga", "cmaes"])
def test_kill_and_resume_gives_the_same_bytes(tmp_path, tiny_kv_model, monkeypatch, optimizer):
    # The bundled model on short prompts: a random-weight one answers nothing, where a search stops (issue 28).
    def search_args(_, out):
        return globals()["search_args"]("lpes-tiny-kv", out, "--optimizer", optimizer, "--patience", "0",
                                        "--data", "tiny-kv:examples=1,length=512", "--scale-grid", "1:4:0.5")

    assert search_main(search_args(tiny_kv_model, tmp_path / "a.json")) == 0
    original = ga_module.GeneticSearch._end_generation

    def killed_after_two(self, state, rng, scored):
        original(self, state, rng, scored)
        if state.generation == 1:
            raise KeyboardInterrupt  # as if killed right after the checkpoint of generation 1

    monkeypatch.setattr(ga_module.GeneticSearch, "_end_generation", killed_after_two)
    assert search_main(search_args(tiny_kv_model, tmp_path / "b.json")) == 130
    assert not (tmp_path / "b.json").exists() and (tmp_path / "b.json.state.json").exists()
    monkeypatch.setattr(ga_module.GeneticSearch, "_end_generation", original)
    assert search_main(search_args(tiny_kv_model, tmp_path / "b.json")) == 0
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert not (tmp_path / "b.json.state.json").exists()
    spec = json.loads((tmp_path / "a.json").read_text())
    assert spec["provenance"]["search"]["seed"] == 0 and len(spec["scales"]) == 4
    assert spec["provenance"]["search"]["optimizer"] == optimizer and spec["provenance"]["search"]["population"] == 6
    assert (tmp_path / "a_curve.png").is_file() and (tmp_path / "a_fitness.png").is_file()


@pytest.mark.parametrize("extra, message", [
    (["--population", "1"], "--population must be in 2..10000"),
    (["--scale-grid", "3:1:0.5"], "has no values"),
    (["--data", "tiny-kv:examples=0"], "examples"),
])
def test_bad_inputs_exit_2(tmp_path, tiny_kv_model, capsys, extra, message):
    assert search_main(search_args(tiny_kv_model, tmp_path / "x.json", *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and not (tmp_path / "x.json").exists()


def test_refuses_to_overwrite_and_non_rope_models(tmp_path, tiny_kv_model, capsys):
    (tmp_path / "best.json").write_text("{}")
    assert search_main(search_args(tiny_kv_model, tmp_path / "best.json")) == 2
    assert "--force" in capsys.readouterr().err
    from transformers import GPT2Config
    AutoModelForCausalLM.from_config(GPT2Config(n_layer=2, n_embd=32, n_head=2)).save_pretrained(tmp_path / "g")
    assert search_main(search_args(tmp_path / "g", tmp_path / "new.json")) == 2
    assert "no RoPE" in capsys.readouterr().err


def test_search_on_the_bundled_model_improves_held_out_accuracy(tmp_path):
    """The trained tiny model loses far facts at 4x its training length; the found curve recovers them."""
    from lpes.search.run import SearchOptions, search

    options = SearchOptions(data="tiny-kv:examples=3", population=4, generations=1, holdout=15,
                            scale_grid="1:4:1")
    spec = search("lpes-tiny-kv", tmp_path / "best.json", options, progress=False)
    held_out = spec.provenance.raw["held_out"]
    assert held_out["lpes"] >= held_out["unscaled"] + 0.2
    assert spec.provenance.raw["search"]["fitness"] >= spec.provenance.raw["search"]["best_uniform_fitness"]


def test_dtype_reaches_the_loaded_model_and_the_spec(tmp_path, tiny_kv_model, monkeypatch):
    """--dtype bfloat16 loads the replica in bfloat16 (seen on its weights) and the spec says so; auto on a CPU
    is float32."""
    from lpes.converter import loading

    loaded = []
    real_load = loading.load_model

    def recording_load(*args, **kwargs):
        model = real_load(*args, **kwargs)
        loaded.append(next(model.parameters()).dtype)
        return model

    monkeypatch.setattr(loading, "load_model", recording_load)
    # The bundled model on short prompts: a random-weight one answers nothing, where a search stops (issue 28).
    # The least search that loads a replica: bfloat16 matmuls are slow on a CPU without native support.
    bundled = ("--data", "tiny-kv:examples=1,length=512", "--generations", "0", "--population", "2",
               "--scale-grid", "1:2:1", "--holdout", "2", "--baselines", "none")
    assert search_main(search_args("lpes-tiny-kv", tmp_path / "bf16.json", "--dtype", "bfloat16", *bundled)) == 0
    assert loaded == [torch.bfloat16]
    assert json.loads((tmp_path / "bf16.json").read_text())["provenance"]["search"]["dtype"] == "bfloat16"
    assert search_main(search_args("lpes-tiny-kv", tmp_path / "auto.json", "--device", "cpu", *bundled)) == 0
    assert loaded[1:] == [torch.float32]
    assert json.loads((tmp_path / "auto.json").read_text())["provenance"]["search"]["dtype"] == "float32"


def test_search_on_benchmark_records_never_holds_out_a_calibration_record(tmp_path, capsys, monkeypatch):
    """The benchmark's own records (tests/data): best.json names the two halves, and they are disjoint."""
    from dataclasses import replace

    from conftest import tiny_model_dir

    from lpes.search.run import SearchOptions, search
    from lpes.validation import kv_data, scoring

    calibration_correct = scoring.calibration_correct

    def first_right(*args, **kwargs):  # a random model answers nothing, where a search stops (issue 28)
        scores = calibration_correct(*args, **kwargs)
        return replace(scores, results=tuple(replace(r, correct=r.example_id == 0) for r in scores.results))

    monkeypatch.setattr(scoring, "calibration_correct", first_right)

    real = Path(__file__).parent / "data" / "kv-retrieval-75_keys.first12.jsonl.gz"
    options = SearchOptions(data=f"kv:file={real},gold=0+74", population=2, generations=0, holdout=100,
                            scale_grid="1:2:1", chat_template=False, answer_tokens=2)
    spec = search(str(tiny_model_dir("llama", tmp_path)), tmp_path / "best.json", options, progress=False)
    search_info = spec.provenance.raw["search"]
    calibration = search_info["calibration_data"]["records"]
    held_out = search_info["held_out_data"]["records"]
    assert calibration and held_out and not set(calibration) & set(held_out)
    assert sorted(calibration + held_out) == list(range(12))
    assert search_info["held_out_data"]["source"] == f"split of {real.name}"
    assert search_info["calibration_examples"] == 2 * len(calibration)  # every record at each of 2 gold indices
    assert spec.provenance.raw["held_out"]["examples"] == 2 * len(held_out)
    records = kv_data.read_jsonl(real)
    assert {records[i].value for i in calibration}.isdisjoint(records[i].value for i in held_out)
    cap = [line for line in capsys.readouterr().err.splitlines() if "--holdout" in line]
    assert cap == ["lpes-search: --holdout 100: the held-out data holds 12 examples (6 per gold index x 2); "
                   "using 12"]


def test_a_dynamic_search_within_the_trained_length_is_refused_before_any_scoring(tmp_path, capsys):
    """Dynamic NTK is plain RoPE within max_position_embeddings (256 here): every curve would be the unscaled model."""
    out = tmp_path / "best.json"
    args = ["lpes-tiny-kv", "--out", str(out), "--rope-type", "dynamic", "--scale-grid", "1:4:1", "--population", "2",
            "--generations", "0", "--holdout", "0", "--baselines", "none"]
    assert search_main([*args, "--data", "tiny-kv:examples=1,length=128"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "every calibration example is within the 256 positions" in err[0], err
    assert not out.exists() and "Traceback" not in "".join(err)
    assert search_main([*args, "--data", "tiny-kv:examples=1,length=512"]) == 0  # beyond 256 it searches


@pytest.mark.parametrize(("rope_type", "grid"), [("linear", "0.5:4:0.25"), ("yarn", "1:4:0.25")])
def test_the_default_grid_offers_compression_to_linear_scales_only(tmp_path, rope_type, grid):
    """Without --scale-grid a linear search scans s < 1 (what helps both real models); YaRN factors start at 1,
    so `--rope-type yarn` alone is not refused. The spec records the grid the search used, not None."""
    args = ["lpes-tiny-kv", "--out", str(tmp_path / "best.json"), "--rope-type", rope_type, "--generations", "0",
            "--holdout", "0", "--baselines", "none", "--data", "tiny-kv:examples=1,length=512"]
    assert search_main(args) == 0
    spec = json.loads((tmp_path / "best.json").read_text())
    assert spec["provenance"]["search"]["scale_grid"] == grid
