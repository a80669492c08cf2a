"""--objective logprob and --optimizer gradient: the gradient is the objective's, the search is deterministic,
resumable to the byte, and refuses what it cannot do at plan time."""

import json

import numpy as np
import pytest
import torch

from lpes.cli import search_main
from lpes.converter.loading import load_model, load_tokenizer, resolve_model
from lpes.converter.reference import apply, apply_differentiable
from lpes.foundation.spec import LINEAR_ROPE, RopeScheme, Spec, load_spec
from lpes.search import gradient as gradient_module
from lpes.search.fitness import ModelEvaluator
from lpes.search.gradient import _basis
from lpes.search.objective import gold_weights
from lpes.validation import tiny_kv
from lpes.validation.examples import Example
from lpes.validation.scoring import answer_logprob_batches


@pytest.fixture(scope="module")
def kv_model():
    path = resolve_model("lpes-tiny-kv")
    return load_model(path, "float32"), load_tokenizer(path)


def kv_examples(count=4, length=384):
    made = tiny_kv.make_examples(num_pairs=8, length=length, gold_indices=[0, 7], examples_per_index=count // 2, seed=3)
    return [Example(e.prompt, e.answer, e.gold_index, e.num_pairs) for e in made]


def objective(model, tokenizer, examples, scales: torch.Tensor, rope: RopeScheme = LINEAR_ROPE) -> torch.Tensor:
    """J(s) through the differentiable patch: the weighted mean gold log-likelihood."""
    apply_differentiable(model, scales, rope)
    weights = gold_weights([e.gold_index for e in examples])
    [(rows, _)] = list(answer_logprob_batches(model, tokenizer, examples, grad=True,
                                              batches=[list(range(len(examples)))]))
    return sum(w * r.logprob for w, r in zip(weights, rows))


def float64_rms_norm(self, hidden_states):
    """LlamaRMSNorm without its float32 cast: in a float64 check every op is float64 (else float32 rounding
    of ~1e-7 swamps a finite difference)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@pytest.mark.parametrize("rope", [LINEAR_ROPE, RopeScheme("yarn")], ids=["linear", "yarn"])
def test_the_gradient_matches_a_finite_difference_in_float64(kv_model, monkeypatch, rope):
    from transformers.models.llama import modeling_llama

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", float64_rms_norm)
    model, tokenizer = kv_model
    model = model.double()
    try:
        examples = kv_examples()
        at = torch.tensor([0.9, 1.7, 2.4, 1.3], dtype=torch.float64, requires_grad=True)
        objective(model, tokenizer, examples, at, rope).backward()
        step = 1e-6
        finite = []
        with torch.no_grad():
            for h in range(4):
                up, down = at.detach().clone(), at.detach().clone()
                up[h] += step
                down[h] -= step
                finite.append(float(objective(model, tokenizer, examples, up, rope)
                                    - objective(model, tokenizer, examples, down, rope)) / (2 * step))
        assert np.allclose(at.grad.numpy(), finite, rtol=1e-5, atol=1e-8), (at.grad, finite)
        assert max(abs(g) for g in finite) > 1e-3  # the scales matter here: equal gradients are not both zero
    finally:
        model.float()


@pytest.mark.parametrize("rope", [LINEAR_ROPE, RopeScheme("yarn")], ids=["linear", "yarn"])
def test_the_differentiable_patch_computes_what_the_reference_does(kv_model, rope):
    """The reference runs transformers' own YaRN at each factor; the patch reads its ramp off it once."""
    model, tokenizer = kv_model
    examples = kv_examples()
    for scales in ([1.0, 1.0, 1.0, 1.0], [1.0, 2.5, 1.5, 3.0], [4.0, 1.25, 1.0, 2.0]):
        apply(model, Spec.from_scales(scales, rope=rope))
        [(reference, _)] = list(answer_logprob_batches(model, tokenizer, examples, batches=[[0, 1, 2, 3]]))
        with torch.no_grad():
            apply_differentiable(model, torch.tensor(scales), rope)
            [(ours, _)] = list(answer_logprob_batches(model, tokenizer, examples, batches=[[0, 1, 2, 3]]))
        assert [float(r.logprob) for r in ours] == pytest.approx([float(r.logprob) for r in reference], abs=1e-5)
    apply(model, Spec.from_scales([1.0] * 4))


def test_the_worst_token_margin_is_the_verdicts_sign_and_the_logits_own(kv_model):
    """AnswerLogprob.margin, recomputed from a plain forward's logits: positive exactly where every answer token
    is the argmax (bench/gradient_probe.py compares it with held-out verdicts on SmolLM2)."""
    from lpes.validation.scoring import answer_ids, encode_prompt

    model, tokenizer = kv_model
    examples = kv_examples(count=8)
    verdicts = set()
    for scales in ([1.0, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5]):  # compressed, the near facts are lost
        apply(model, Spec.from_scales(scales))
        [(rows, positions)] = list(answer_logprob_batches(model, tokenizer, examples, batches=[list(range(8))]))
        widths = []
        for example, row in zip(examples, rows):
            answer = answer_ids(tokenizer, example.prompt, example.answer)
            ids = encode_prompt(tokenizer, example.prompt) + answer
            widths.append(len(ids) - 1)  # the scored row: prompt and answer but its last token
            with torch.no_grad():
                logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0, -len(answer) - 1:-1], -1)
            margins = []
            for position, token in enumerate(answer):
                others = torch.cat([logprobs[position, :token], logprobs[position, token + 1:]])
                margins.append(float(logprobs[position, token] - others.max()))
            assert float(row.margin) == pytest.approx(min(margins), abs=1e-4)
            assert (float(row.margin) > 0) == row.argmax_correct
            verdicts.add(row.argmax_correct)
        assert positions == len(examples) * max(widths)  # what the search counts: every padded position
    assert verdicts == {True, False}  # both signs were met
    apply(model, Spec.from_scales([1.0] * 4))


def test_the_curve_basis_is_the_spec_read_off():
    basis = _basis([0.0, 7 / 3, 14 / 3, 7.0], 8)
    control = np.array([1.0, 2.5, 0.7, 3.0])
    points = [[x, s] for x, s in zip([0.0, 7 / 3, 14 / 3, 7.0], control)]
    assert basis @ control == pytest.approx(Spec.from_curve(points, 8).scales, abs=1e-12)


def test_gold_positions_weigh_the_same_however_many_examples_each_holds():
    weights = gold_weights([0, 0, 0, 5])
    assert sum(weights) == pytest.approx(1.0)
    assert sum(weights[:3]) == pytest.approx(weights[3])


def gradient_args(out, *extra):
    return ["lpes-tiny-kv", "--out", str(out), "--optimizer", "gradient", "--objective", "logprob",
            "--generations", "3", "--patience", "0", "--holdout", "4", "--baselines", "none",
            "--data", "tiny-kv:examples=1,length=512", "--scale-grid", "0.5:4:0.5", *extra]


def test_a_gradient_search_is_deterministic_and_survives_kill_and_resume(tmp_path, monkeypatch):
    assert search_main(gradient_args(tmp_path / "a.json")) == 0
    assert search_main(gradient_args(tmp_path / "c.json")) == 0
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "c.json").read_bytes()
    original = gradient_module.GradientSearch._generation

    def killed_after_one(self, state, tokens_before):
        original(self, state, tokens_before)
        if state.generation == 1:
            raise KeyboardInterrupt  # right after the checkpoint of generation 1

    monkeypatch.setattr(gradient_module.GradientSearch, "_generation", killed_after_one)
    assert search_main(gradient_args(tmp_path / "b.json")) == 130
    assert not (tmp_path / "b.json").exists() and (tmp_path / "b.json.state.json").exists()
    monkeypatch.setattr(gradient_module.GradientSearch, "_generation", original)
    assert search_main(gradient_args(tmp_path / "b.json")) == 0
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    search = json.loads((tmp_path / "a.json").read_text())["provenance"]["search"]
    assert search["optimizer"] == "gradient" and search["objective"] == "logprob"
    assert [h["generation"] for h in search["history"]] == [0, 1, 2, 3]
    # The objective and the teacher-forced accuracy of every step are in the history; the spec is the best step.
    best = max(h["objective"] for h in search["history"])
    assert search["fitness"] == search["history"][-1]["best"] and best - search["fitness"] <= gradient_module.MIN_GAIN
    assert all("accuracy_teacher_forced" in h for h in search["history"])
    assert search["best_uniform_scale"] in [0.5 * k for k in range(1, 9)]


def test_a_nan_gradient_stops_with_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    original = ModelEvaluator.gradients
    calls = []

    def nan_at_generation_two(self, scales, batches, weights):
        results = original(self, scales, batches, weights)
        calls.append(1)
        if len(calls) == 3:  # generations 0, 1, then 2
            results[0] = type(results[0])(**{**results[0].__dict__, "gradient": (float("nan"),) * 4})
        return results

    monkeypatch.setattr(ModelEvaluator, "gradients", nan_at_generation_two)
    assert search_main(gradient_args(tmp_path / "b.json")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "generation 2" in err[-1] and "not finite" in err[-1]
    checkpoint = json.loads((tmp_path / "b.json.state.json").read_text())
    assert checkpoint["state"]["generation"] == 1 and not (tmp_path / "b.json").exists()
    monkeypatch.setattr(ModelEvaluator, "gradients", original)
    assert search_main(gradient_args(tmp_path / "b.json")) == 0
    assert "resuming" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--objective", "accuracy"], "add --objective logprob"),
    (["--rope-type", "dynamic", "--scale-grid", "1:4:0.5"], "dynamic NTK moves its base"),
    (["--degree", "4"], "underdetermined"),
    (["--learning-rate", "0"], "--learning-rate must be in"),
    (["--optimizer", "ga"], "--objective logprob works with --optimizer cmaes or gradient"),
])
def test_what_a_gradient_search_cannot_do_is_refused_at_plan_time(tmp_path, capsys, extra, message):
    assert search_main(gradient_args(tmp_path / "x.json", *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_cmaes_climbs_the_logprob_objective_and_resumes(tmp_path, monkeypatch):
    args = ["lpes-tiny-kv", "--out", str(tmp_path / "a.json"), "--objective", "logprob", "--population", "4",
            "--generations", "2", "--patience", "0", "--holdout", "4", "--baselines", "none",
            "--data", "tiny-kv:examples=1,length=512", "--scale-grid", "1:4:0.5"]
    assert search_main(args) == 0
    search = json.loads((tmp_path / "a.json").read_text())["provenance"]["search"]
    assert search["optimizer"] == "cmaes" and search["objective"] == "logprob"
    assert search["fitness"] >= search["best_uniform_fitness"]  # the incumbent starts at the best uniform scale
    assert all(h["best"] <= search["fitness"] for h in search["history"])


def test_a_backward_that_would_not_fit_is_refused_at_plan_time(tmp_path, capsys, monkeypatch):
    from lpes.converter import loading

    monkeypatch.setattr(loading, "available_memory", lambda: 64 * 2**20)  # 64 MiB left on this machine
    assert search_main(gradient_args(tmp_path / "x.json")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "backward pass over the largest batch needs about" in err[0], err
    assert "64.0 MiB available" in err[0] and list(tmp_path.iterdir()) == []



def test_a_checkpoint_of_the_full_batch_version_is_refused_on_resume(tmp_path, monkeypatch, capsys):
    """The first gradient search took one step per pass and wrote no version; resuming its checkpoint with
    mini-batch steps would continue other steps than it began, so it is refused in one line, left as it was."""
    original = gradient_module.GradientSearch._generation

    def killed_after_one(self, state, tokens_before):
        original(self, state, tokens_before)
        raise KeyboardInterrupt

    monkeypatch.setattr(gradient_module.GradientSearch, "_generation", killed_after_one)
    assert search_main(gradient_args(tmp_path / "a.json")) == 130
    monkeypatch.setattr(gradient_module.GradientSearch, "_generation", original)
    state_file = tmp_path / "a.json.state.json"
    checkpoint = json.loads(state_file.read_text())
    assert checkpoint["state"]["optimizer"].pop("version") == gradient_module.VERSION
    state_file.write_text(json.dumps(checkpoint))
    before = state_file.read_bytes()
    capsys.readouterr()
    assert search_main(gradient_args(tmp_path / "a.json")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("lpes-search: error: the checkpoint is from gradient, not gradient 2: resume it with that, "
                       "or delete it to start over"), err
    assert state_file.read_bytes() == before and not (tmp_path / "a.json").exists()


def test_a_per_layer_yarn_gradient_search_writes_the_curve_the_reference_scores_as_recorded(tmp_path, kv_model):
    """--rope-type yarn --optimizer gradient descends transformers' YaRN factor per layer; the objective it
    records for the curve it writes is the reference's (lpes.apply, transformers' own YaRN) on the calibration set."""
    from lpes.validation.tasks import examples_for, task_config

    # 4x the trained length, where YaRN's factor matters: the descent leaves the uniform scan's point.
    data = "tiny-kv:examples=1,length=1024"
    args = gradient_args(tmp_path / "y.json", "--rope-type", "yarn", "--scale-grid", "1:2:0.5",
                         "--learning-rate", "0.3", "--data", data)
    assert search_main(args) == 0
    spec = load_spec(tmp_path / "y.json")
    search = spec.provenance.raw["search"]
    assert spec.rope.rope_type == "yarn" and search["rope_type"] == "yarn"
    assert len(set(spec.scales)) > 1 and search["fitness"] > search["history"][0]["objective"]  # it descended
    model, tokenizer = kv_model
    path = resolve_model("lpes-tiny-kv")
    examples = examples_for(task_config(path, data), path, split="search")
    apply(model, spec)
    [(rows, _)] = list(answer_logprob_batches(model, tokenizer, examples, batches=[list(range(len(examples)))]))
    weights = gold_weights([e.gold_index for e in examples])
    assert search["fitness"] == pytest.approx(sum(w * float(r.logprob) for w, r in zip(weights, rows)), abs=1e-5)
    apply(model, Spec.from_scales([1.0] * 4))
