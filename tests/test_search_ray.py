"""Scoring in Ray actors: the single-process result, through a replica's death; replicas over two GPUs, planned.

The Ray tests share one local cluster of 2 CPUs (ray.init(num_cpus=2)), as a user's notebook
would: search(ray="auto") then uses the cluster it finds initialized.
"""

import os
import signal
import subprocess
import sys
from dataclasses import replace

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from lpes.converter.loading import load_config, load_model, resolve_model
from lpes.converter.reference import apply
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import Spec
from lpes.search import ga as ga_module
from lpes.search.ray_pool import RAY_INSTALL, wait_ready
from lpes.search.replica import plan_device_map
from lpes.search.replicas import device_groups
from lpes.search.run import SearchOptions, search

# Prompts at twice the bundled model's training length: the unscaled model fails some, so the
# search has a curve to find; small enough that three searches take seconds.
SMALL = dict(data="tiny-kv:examples=1,length=512", population=4, generations=2, holdout=2, scale_grid="1:4:1",
             device="cpu")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             object_store_memory=100 * 2**20)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "best.json"
    return search("lpes-tiny-kv", out, SearchOptions(**SMALL), progress=False)


def result(spec: Spec) -> tuple:
    search_record = spec.provenance.raw["search"]
    baselines = [(b["rope_type"], b["factor"], b["fitness"]) for b in search_record["stock_baselines"]]
    return (spec.scales, spec.curve, [h["best"] for h in search_record["history"]], search_record["fitness"],
            spec.provenance.raw["held_out"], baselines)


GRADIENT = dict(SMALL, optimizer="gradient", objective="logprob", population=None, generations=3, patience=0,
                scale_grid="0.5:4:0.5", baselines="none", batch_size=1)


def test_two_ray_replicas_give_the_single_process_gradient_search(cluster, tmp_path):
    # batch 1 over 2 examples: each replica runs one batch of every generation, and the sum is in batch order.
    options = dict(GRADIENT, data="tiny-kv:examples=2,length=512")
    single = search("lpes-tiny-kv", tmp_path / "one.json", SearchOptions(**options), progress=False)
    spec = search("lpes-tiny-kv", tmp_path / "two.json", SearchOptions(**options, ray="auto", replicas=2),
                  progress=False)
    steps = single.provenance.raw["search"]["history"]
    assert len(set(steps[-1]["scales"])) > 1  # the descent moved the layers apart: not trivially equal
    assert result(spec) == result(single)
    assert spec.provenance.raw["search"]["history"] == single.provenance.raw["search"]["history"]


def test_answer_logprob_targets_reach_every_ray_replica(cluster, tmp_path, monkeypatch):
    """The own-answer targets are made in this process after the replicas loaded; each replica (a Ray actor)
    must score them. lpes-tiny-kv answers with the value alone, where they are the gold: here each target
    is given a sentence's opening (a value of the vocabulary before the gold), as a chat model's would be."""
    from lpes.validation import own_answers

    real = own_answers.own_answer_examples

    def sentence_targets(examples, generated):
        targets, counts = real(examples, generated)
        return [replace(t, answer=f"{t.answer[:3]} {t.answer}") for t in targets], counts

    monkeypatch.setattr(own_answers, "own_answer_examples", sentence_targets)
    options = dict(GRADIENT, data="tiny-kv:examples=2,length=512", generations=1)
    gold = search("lpes-tiny-kv", tmp_path / "gold.json", SearchOptions(**options), progress=False)
    options["objective"] = "answer-logprob"
    single = search("lpes-tiny-kv", tmp_path / "one.json", SearchOptions(**options), progress=False)
    spec = search("lpes-tiny-kv", tmp_path / "two.json", SearchOptions(**options, ray="auto", replicas=2),
                  progress=False)
    objectives = [[h["objective"] for h in s.provenance.raw["search"]["history"]] for s in (gold, single, spec)]
    assert objectives[0] != objectives[1]  # the targets changed what is scored
    assert spec.provenance.raw["search"]["history"] == single.provenance.raw["search"]["history"]


def test_two_ray_replicas_give_the_single_process_result(cluster, single_process, tmp_path, capsys):
    assert set(single_process.scales) != {1.0}  # the search found a curve: equal results are not trivially equal
    spec = search("lpes-tiny-kv", tmp_path / "best.json", SearchOptions(**SMALL, ray="auto", replicas=2))
    assert result(spec) == result(single_process)
    assert spec.provenance.raw["replicas"] == {"backend": "ray", "replicas": 2, "gpus_per_replica": 0,
                                           "devices": [["cpu"], ["cpu"]]}
    assert single_process.provenance.raw["replicas"]["backend"] == "local"
    # Both replicas scored: the per-generation log names each one's busy share and tokens/s.
    captured = capsys.readouterr()
    log = [line for line in (captured.out + captured.err).splitlines() if line.startswith("generation ")]
    assert len(log) == SMALL["generations"] + 1
    busy, rates = log[0].split("replicas busy ")[1].split(", tokens/s ")
    assert len(busy.split()) == 2 and all(float(r) > 0 for r in rates.split())


def test_a_killed_replica_is_replaced_and_the_search_ends_with_the_same_result(cluster, single_process, tmp_path,
                                                                                monkeypatch, capsys):
    original = ga_module.GeneticSearch._end_generation
    killed = []

    def kill_replica_0_after_generation_0(self, state, rng, scored):
        original(self, state, rng, scored)
        if state.generation == 0 and not killed:
            [name] = [n for n in ray.util.list_named_actors() if n.endswith("-replica-0-0")]
            pid = ray.get(ray.get_actor(name).info.remote())["pid"]
            os.kill(pid, signal.SIGKILL)  # the actor's process dies as a lost node's would
            killed.append(pid)

    monkeypatch.setattr(ga_module.GeneticSearch, "_end_generation", kill_replica_0_after_generation_0)
    spec = search("lpes-tiny-kv", tmp_path / "best.json", SearchOptions(**SMALL, ray="auto", replicas=2),
                  progress=False)
    assert killed
    assert "replica 0 died" in capsys.readouterr().err
    assert result(spec) == result(single_process)


def test_ray_flag_without_ray_says_how_to_install_it(tmp_path):
    # A Python where `import ray` fails, as on a machine without the extra (None in sys.modules blocks it).
    code = ("import sys; sys.modules['ray'] = None; from lpes.cli import search_main; "
            "sys.exit(search_main(sys.argv[1:]))")
    run = subprocess.run([sys.executable, "-c", code, "lpes-tiny-kv", "--out", str(tmp_path / "best.json"),
                          "--ray", "local", "--replicas", "2"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [f"lpes-search: error: {RAY_INSTALL}"]
    assert "pip install 'lpes[ray]'" in RAY_INSTALL and not (tmp_path / "best.json").exists()


def device_of(plan: dict, name: str):
    """Where `plan` puts the parameter `name`: the entry of its longest dotted prefix (as transformers reads it)."""
    parts = name.split(".")
    for end in range(len(parts), -1, -1):
        if ".".join(parts[:end]) in plan:
            return plan[".".join(parts[:end])]
    raise KeyError(name)


def test_a_replica_over_two_gpus_is_planned_whole_layers_balanced():
    """An 8B-shaped Llama in bfloat16 (16 GB) over two 40 GB GPUs, planned without a GPU."""
    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256)
    free = {"cuda:0": 40 * 2**30, "cuda:1": 40 * 2**30}
    plan = plan_device_map(config, ["cuda:0", "cuda:1"], "bfloat16", free)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    placed = {name: device_of(plan, name) for name, _ in model.named_parameters()}
    for i in range(32):  # a decoder layer is never split between GPUs
        assert len({d for n, d in placed.items() if n.startswith(f"model.layers.{i}.")}) == 1
    layers = [placed[f"model.layers.{i}.mlp.up_proj.weight"] for i in range(32)]
    assert layers == sorted(layers) and 12 <= layers.count(0) <= 20  # one hop, near-equal shares
    assert placed["model.embed_tokens.weight"] == 0 and placed["lm_head.weight"] == 1
    assert device_of(plan, "model.rotary_emb") == 0  # with the position ids, where LPES computes cos/sin
    used = {d: sum(p.numel() * 2 for n, p in model.named_parameters() if placed[n] == d) for d in (0, 1)}
    assert all(used[d] <= 40 * 2**30 for d in (0, 1)) and min(used.values()) > 0.3 * sum(used.values())
    with pytest.raises(LpesError, match="does not fit on 2 GPU"):
        plan_device_map(config, ["cuda:0", "cuda:1"], "bfloat16", {"cuda:0": 6 * 2**30, "cuda:1": 6 * 2**30})


def test_the_planned_map_loads_and_scores_like_the_whole_model(tmp_path):
    """transformers loads the two-device plan and its hooks compose with the LPES patch.

    No GPU here: the plan's first GPU becomes the CPU and its second the disk (accelerate's
    offload), so the model is dispatched over two devices with the hooks transformers puts
    between GPUs. Whether cuda tensors meet on the right device is left to a GPU machine.
    """
    path = resolve_model("lpes-tiny-kv")
    plan = plan_device_map(load_config(path), ["cuda:0", "cuda:1"], "float32", {"cuda:0": 3 * 10**6,
                                                                                "cuda:1": 3 * 10**6})
    assert set(plan.values()) == {0, 1}
    stand_in = {module: ("cpu", "disk")[device] for module, device in plan.items()}
    split = AutoModelForCausalLM.from_pretrained(path, device_map=stand_in, offload_folder=tmp_path).eval()
    whole = load_model(path)
    ids = torch.randint(3, whole.config.vocab_size, (2, 300), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        unscaled = whole(input_ids=ids).logits
        spec = Spec.from_scales([1.0, 2.0, 3.0, 1.5])
        apply(split, spec), apply(whole, spec)
        expected, got = whole(input_ids=ids).logits, split(input_ids=ids).logits
    assert not torch.allclose(expected, unscaled)  # the scales reach the layers
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("devices, k, groups", [
    (["cuda:0", "cuda:1", "cuda:2", "cuda:3"], 2, [["cuda:0", "cuda:1"], ["cuda:2", "cuda:3"]]),
    (["cuda:0", "cuda:1", "cuda:2"], 2, [["cuda:0", "cuda:1"]]),
    (["cpu"], 1, [["cpu"]]),
])
def test_devices_are_cut_into_replicas(devices, k, groups):
    assert device_groups(devices, k) == groups


@pytest.mark.parametrize("extra, message", [
    (["--gpus-per-replica", "2", "--device", "cpu"], "--gpus-per-replica 2 needs GPUs"),
    (["--replicas", "2"], "--replicas is for --ray"),
    (["--ray", "local", "--device", "cpu,cpu"], "Ray assigns the GPUs"),
    (["--gpus-per-replica", "0"], "--gpus-per-replica must be at least 1"),
])
def test_layouts_that_cannot_run_exit_2_in_one_line(tmp_path, capsys, extra, message):
    from lpes.cli import search_main

    assert search_main(["lpes-tiny-kv", "--out", str(tmp_path / "best.json"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_replica_that_finds_no_room_stops_in_one_line_instead_of_hanging(cluster):
    """What a replacement meets when another job took its predecessor's CPUs: a real actor Ray cannot place."""
    @ray.remote(num_cpus=64)
    class Unplaceable:
        def info(self):
            return {}

    with pytest.raises(LpesError, match="found no room on the cluster within 1 s .* run the same command again"):
        wait_ready(ray, [Unplaceable.remote()], timeout=1)
