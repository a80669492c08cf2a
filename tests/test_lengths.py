"""The ladder of lengths a decision covers (issue 50): the rule on constructed tables, the probe against an
independent one-pass reference, the ladder's bad input, and a search on the bundled model that runs it.

The rule's tables are built so that the answer is known by construction: a candidate that wins at the search
length and breaks at a longer rung is not shipped; one whose excess is noise (blocks either way, or below the
margin) is; a limit is written where the serving length or the budget stops the ladder below the model's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_decision import _candidates, _table

from lpes.foundation.decision import LENGTH_MARGIN, Lengths, RungCheck, binomial_p, decide, parse_decision
from lpes.foundation.errors import LpesError
from lpes.search.lengths import check_serve_length, rungs
from lpes.validation.length_probe import BLOCK, compare_by_rung, probe_ids, read_text, token_losses

N = 200
BASE = set(range(0, 200, 5))
UNIFORM = BASE | set(range(1, 200, 5))  # +40 right: the uniform scale wins at the search length


def _rung(length: int, excess: float, worse: int, better: int) -> RungCheck:
    return RungCheck(length, excess, worse, better, binomial_p(worse, better))


def _lengths(uniform: list[RungCheck], serve: int = 1600, checked: int | None = None, trained: int = 8192,
             stopped: str | None = None, curve_too: bool = False) -> Lengths:
    curve = tuple(uniform) if curve_too else tuple(_rung(r.length, 0.0, 5, 5) for r in uniform)
    return Lengths(400, serve, trained, checked or serve, "constructed", (("uniform s=0.75", tuple(uniform)),
                                                                          ("per-layer curve", curve)), stopped)


def test_a_break_at_one_rung_keeps_the_candidate_from_shipping_and_the_reason_names_it():
    lengths = _lengths([_rung(800, 0.01, 20, 5), _rung(1600, 2.4, 25, 0)], curve_too=True)
    decision = decide(_candidates(N, BASE, UNIFORM, UNIFORM), _table(N), lengths=lengths)
    assert decision.ship.kind == "unscaled"
    assert decision.reason.startswith("uniform s=0.75 not shipped: at 1,600 tokens +2.40 nats/token over unscaled "
                                      "(25/0 blocks worse/better, p = 6e-08) (it holds up to 800")
    assert parse_decision(json.loads(json.dumps(decision.to_json()))) == decision
    # the curve, as good at the search length, that holds at every rung: it ships in the uniform scale's place
    holds = decide(_candidates(N, BASE, UNIFORM, UNIFORM), _table(N), lengths=_lengths(list(lengths.checks[0][1])))
    assert holds.ship.kind == "per-layer" and holds.reason.startswith("uniform s=0.75 not shipped: at 1,600")


def test_noise_does_not_exclude():
    for checks in ([_rung(800, 0.2, 8, 7)],  # above the margin, but the blocks go both ways
                   [_rung(800, LENGTH_MARGIN / 2, 30, 0)]):  # every block worse, by less than the margin
        decision = decide(_candidates(N, BASE, UNIFORM, UNIFORM), _table(N), lengths=_lengths(checks, serve=800))
        assert decision.ship.name == "uniform s=0.75" and "not shipped: at" not in decision.reason


def test_a_broken_rival_does_not_keep_a_simpler_candidate_out():
    """The curve beats the uniform scale at the search length but breaks longer: the uniform scale ships."""
    curve = UNIFORM | set(range(2, 200, 5))
    lengths = Lengths(400, 800, 8192, 800, "constructed", (("uniform s=0.75", (_rung(800, 0.0, 4, 4),)),
                                                           ("per-layer curve", (_rung(800, 1.0, 24, 0),))))
    decision = decide(_candidates(N, BASE, UNIFORM, curve), _table(N), lengths=lengths)
    assert decision.ship.name == "uniform s=0.75" and decision.reason.startswith("per-layer curve not shipped")


def test_the_limit_is_the_serving_length_or_the_last_rung_checked():
    holds = [_rung(800, 0.0, 5, 5)]
    short = decide(_candidates(N, BASE, UNIFORM, UNIFORM), _table(N), lengths=_lengths(holds, serve=800))
    assert short.ship.max_length == 800  # the user serves 800 of the model's 8,192: the config says so
    stopped = _lengths(holds, serve=8192, checked=800, stopped="out of time")
    cut = decide(_candidates(N, BASE, UNIFORM, UNIFORM), _table(N), lengths=stopped)
    assert cut.ship.max_length == 800 and cut.reason.endswith("; checked up to 800 tokens (out of time)")
    whole = decide(_candidates(N, BASE, UNIFORM, UNIFORM), _table(N), lengths=_lengths(holds, serve=8192))
    assert whole.ship.max_length is None  # checked to the model's own length: no limit
    unscaled = decide(_candidates(N, BASE, BASE, BASE), _table(N), lengths=stopped)
    assert unscaled.ship.kind == "unscaled" and unscaled.ship.max_length is None  # the model as it was


@pytest.mark.parametrize("path, value, fragment", [
    (("ship", "max_length"), 4096, "ship.max_length' is 4096, but its ladder of lengths gives 800"),
    (("lengths", "checks", "uniform s=0.75", 0, "p"), 0.5, "but the sign test of its blocks gives"),
    (("lengths", "checked"), 99999, "lengths.checked' must be an integer in 400..800"),
    (("lengths", "probe"), "a\nb", "lengths.probe' must be one line"),
])
def test_a_forged_ladder_is_refused_at_load(path, value, fragment):
    data = decide(_candidates(N, BASE, UNIFORM, UNIFORM), _table(N),
                  lengths=_lengths([_rung(800, 0.0, 5, 5)], serve=800)).to_json()
    holder = data
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    with pytest.raises(LpesError, match=None) as refused:
        parse_decision(data)
    assert fragment in str(refused.value), refused.value


def test_rungs_double_from_the_search_length_to_the_serving_length():
    assert rungs(407, 8192) == [814, 1628, 3256, 6512, 8192]
    assert rungs(512, 512) == [] and rungs(400, 600) == [600]


@pytest.mark.parametrize("serve, fragment", [(0, "positive number"), (-5, "positive number"), ("x", "positive"),
                                             (300, "below the search length"), (9000, "beyond the model's own")])
def test_a_bad_serving_length_is_one_line(serve, fragment):
    with pytest.raises(LpesError, match=fragment):
        check_serve_length(serve, 400, 8192, beyond=False)
    assert check_serve_length(9000, 400, 8192, beyond=True) == 9000


def test_the_probe_is_the_one_pass_loss_and_the_model_never_breaks_against_itself():
    """Chunks over a KV cache give the loss of one plain forward over the whole sequence (an independent
    reference: transformers' own logits and torch's cross entropy)."""
    import torch

    from lpes.converter.loading import bundled_models, load_model

    model = load_model(bundled_models()["lpes-tiny-kv"])
    ids = [5 + (i * 7) % 600 for i in range(700)]
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
        reference = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="none").tolist()
    chunked = token_losses(model, ids, chunk=128)
    assert max(abs(a - b) for a, b in zip(chunked, reference)) < 1e-4 and len(chunked) == len(reference)
    assert not any(r.breaks(0.05) for r in compare_by_rung(chunked, reference, [256, 512, 700], start=128))
    shifted = [x + (0.3 if i >= 300 else 0.0) for i, x in enumerate(chunked)]  # worse past position 300
    [early, late, last] = compare_by_rung(shifted, chunked, [256, 512, 700], start=128)
    assert not early.breaks(0.05) and late.breaks(0.05) and last.breaks(0.05)
    assert last.worse == (700 - 1 - 511) // BLOCK and last.excess == pytest.approx(0.3)


def test_a_text_the_probe_cannot_use_is_one_line(tmp_path):
    from lpes.converter.loading import bundled_models, load_tokenizer

    for name, content, fragment in [("empty.txt", b"  \n", "is empty"), ("bin.txt", b"ab\0cd", "is binary"),
                                    ("latin.txt", "caf\xe9".encode("latin-1"), "is not UTF-8")]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(LpesError, match=fragment):
            read_text(tmp_path / name)
    tokenizer = load_tokenizer(bundled_models()["lpes-tiny-kv"])
    with pytest.raises(LpesError, match="cannot read the length probe's text"):
        probe_ids(tokenizer, 100)  # English, to a tokenizer of k12 and v5
    with pytest.raises(LpesError, match=r"has \d tokens, shorter than the longest rung \(100\)"):
        probe_ids(tokenizer, 100, "f1 f2 f3", "--length-text")


def test_a_search_checks_every_candidate_at_every_rung_and_records_it(tmp_path):
    """The bundled model trained on 256 positions, searched at 128, served to 1,024: the spec's decision holds
    the ladder, every candidate beyond the unscaled one checked at each rung up to 1,024."""
    from lpes.converter.loading import bundled_models
    from lpes.validation.tasks import examples_for, task_config

    model = bundled_models()["lpes-tiny-kv"]
    task = task_config(model, "tiny-kv:examples=12,length=256")
    text = tmp_path / "kv.txt"
    text.write_text(" ".join(e.prompt for e in examples_for(task, model, use_chat_template=True, split="validation")))
    out = tmp_path / "best.json"
    argv = ["lpes-tiny-kv", "--out", str(out), "--data", "tiny-kv:examples=2,length=128", "--scale-grid", "0.5:2:0.5",
            "--generations", "0", "--population", "2", "--holdout", "20", "--serve-length", "1024",
            "--beyond-trained", "--length-text", str(text), "--baselines", "yarn"]
    done = subprocess.run([str(Path(sys.executable).with_name("lpes-search")), *argv], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    decision = json.loads(out.read_text())["provenance"]["decision"]
    lengths = decision["lengths"]
    assert (lengths["serve"], lengths["checked"], lengths["stopped"]) == (1024, 1024, None)
    ladder = [r["length"] for r in next(iter(lengths["checks"].values()))]
    assert ladder == rungs(lengths["search"], 1024)
    assert list(lengths["checks"]) == [row["name"] for row in decision["rows"][1:]]
    assert "| candidate | " in done.stderr and "Lengths (next-token loss on --length-text" in done.stderr


def test_a_convert_of_a_limited_decision_writes_the_limit(tmp_path):
    """A uniform scale checked to 128 tokens of the bundled model's 256: config.json says 128, as transformers reads
    it, and the card tells the user to serve at most that."""
    from test_decision import CURVE, _convert, _verdicts

    from lpes.foundation.decision import Candidate

    base, better = set(range(0, 200, 5)), set(range(0, 200, 5)) | set(range(1, 200, 5))
    candidates = [Candidate("unscaled", "unscaled", _verdicts(N, base)),
                  Candidate("uniform s=0.75", "uniform", _verdicts(N, better), "linear", 0.75),
                  Candidate("per-layer curve", "per-layer", _verdicts(N, better), scales=CURVE)]
    lengths = Lengths(64, 128, 256, 128, "constructed", (("uniform s=0.75", (_rung(128, 0.0, 2, 2),)),
                                                         ("per-layer curve", (_rung(128, 0.0, 2, 2),))))
    decision = decide(candidates, _table(N), lengths=lengths)
    assert decision.ship.to_json()["max_length"] == 128
    spec = tmp_path / "best.json"
    spec.write_text(json.dumps({"format": "lpes-spec", "version": 1, "scales": list(CURVE),
                                "provenance": {"decision": decision.to_json()}}))
    out = tmp_path / "out"
    code, stderr = _convert(["lpes-tiny-kv", "--curve", str(spec), "--to", "hf", "--out", str(out), "--no-validate"])
    assert code == 0, stderr
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(out)
    assert config.max_position_embeddings == 128 and config.rope_parameters["factor"] == 0.75
    card = (out / "README.md").read_text()
    assert "**Serve this folder at most 128 tokens**" in card and "`--max-model-len 128`" in card
    assert "transformers warns at load that a linear factor should be at least 1 (0.75 here" in card
    assert "| uniform s=0.75 | +0.00 |" in card  # the lengths table, every candidate at every rung
    assert (out / "lpes_lengths.png").is_file() and "(lpes_lengths.png)" in card


def test_a_validation_where_what_ships_answers_below_unscaled_says_so_before_passed():
    """Gemma 3's s = 0.75 at 884 tokens: 0 of 43 discordant prompts; the exports agree, so it passes as a conversion,
    and the verdict line says first that what ships is worse (McNemar's test on these prompts)."""
    from lpes.validation.examples import Example
    from lpes.validation.results import REFERENCE, UNSCALED, ValidationReport, VariantResult
    from lpes.validation.scoring import ExampleResult, Scores

    def scores(right: set[int]) -> Scores:
        return Scores(tuple(ExampleResult(i, i % 4, "", i in right) for i in range(100)), 0)

    examples = [Example(f"p{i}", "v", i % 4, 4) for i in range(100)]
    unscaled = VariantResult(UNSCALED, "ok", scores(set(range(43))))
    worse = ValidationReport("m", examples, [unscaled, VariantResult(REFERENCE, "ok", scores(set()))], None)
    assert worse.verdict == "passed"
    assert worse.verdict_line().startswith("**what ships answers significantly below the unscaled model on these "
                                           "prompts** (0.0% vs 43.0% unscaled, 0/43 prompts")
    even = ValidationReport("m", examples, [unscaled, VariantResult(REFERENCE, "ok", scores(set(range(1, 44))))],
                            None)
    assert even.verdict_line() == "**passed**"


def test_one_scale_on_the_full_attention_layers_is_a_stock_candidate(tmp_path):
    """Gemma 3's layout: the full-attention layers at s = 0.75, the sliding ones unscaled, decided and converted
    to a stock config (one RoPE per layer type) that transformers reads back, no custom code."""
    from conftest import tiny_model_dir
    from test_decision import _convert, _verdicts

    from lpes.foundation.decision import Candidate

    types = ["sliding_attention", "full_attention", "sliding_attention"]
    model = tiny_model_dir("gemma3_text", tmp_path, head_dim=8, sliding_window=16, layer_types=types)
    per_type = (1.0, 0.75, 1.0)
    base, better = set(range(0, 200, 5)), set(range(0, 200, 5)) | set(range(1, 200, 5))
    candidates = [Candidate("unscaled", "unscaled", _verdicts(N, base)),
                  Candidate("uniform s=0.75", "uniform", _verdicts(N, better), "linear", 0.75),
                  Candidate("full-attention layers s=0.75", "per-type", _verdicts(N, better), "linear", 0.75,
                            per_type),
                  Candidate("per-layer curve", "per-layer", _verdicts(N, better), scales=(1.0, 1.5, 2.0))]
    lengths = Lengths(64, 2048, 2048, 2048, "constructed", (
        ("uniform s=0.75", (_rung(512, 2.4, 24, 0),)), ("full-attention layers s=0.75", (_rung(512, 0.01, 12, 12),)),
        ("per-layer curve", (_rung(512, 1.0, 24, 0),))))
    decision = decide(candidates, _table(N), lengths=lengths)
    assert decision.ship.name == "full-attention layers s=0.75" and decision.ship.max_length is None
    assert decision.reason.startswith("uniform s=0.75 not shipped: at 512 tokens +2.40")
    spec = tmp_path / "best.json"
    spec.write_text(json.dumps({"format": "lpes-spec", "version": 1, "scales": [1.0, 1.5, 2.0],
                                "provenance": {"decision": decision.to_json()}}))
    out = tmp_path / "out"
    code, stderr = _convert([str(model), "--curve", str(spec), "--to", "hf", "--out", str(out), "--no-validate"])
    assert code == 0, stderr
    from transformers import AutoConfig

    rope = AutoConfig.from_pretrained(out).rope_parameters
    assert rope["full_attention"]["rope_type"] == "linear" and rope["full_attention"]["factor"] == 0.75
    assert rope["sliding_attention"].get("factor", 1.0) == 1.0 and not (out / "modeling_lpes.py").exists()
    assert "This folder holds the decision, **full-attention layers s=0.75**" in (out / "README.md").read_text()


def test_a_stock_type_vllm_computes_otherwise_is_not_shipped():
    """Dynamic NTK wins on the held-out prompts, but vLLM serves a static NTK at every length where transformers
    serves the unscaled model within the trained length: one config, two models (foundation/rope_schemes.py)."""
    from test_decision import _verdicts

    from lpes.foundation.decision import Candidate

    base, better = set(range(0, 200, 5)), set(range(0, 200, 5)) | set(range(1, 200, 5))
    candidates = [Candidate("unscaled", "unscaled", _verdicts(N, base)),
                  Candidate("dynamic NTK f=2", "stock", _verdicts(N, better), "dynamic", 2.0)]
    decision = decide(candidates, _table(N))
    assert decision.ship.kind == "unscaled"
    assert decision.reason.startswith("dynamic NTK f=2 not shipped: vLLM computes it otherwise (one static cache")
    assert parse_decision(decision.to_json()) == decision


def test_plots_and_tables_name_what_ships_as_what_it_is():
    """make demo's stock YaRN folder was drawn as "LPES, Hub folder": a folder holding a stock config is named by it."""
    from lpes.validation.accuracy_plot import variant_label
    from lpes.validation.results import REFERENCE, VariantResult

    hub, reference = VariantResult("hf", "ok"), VariantResult(REFERENCE, "ok")
    assert variant_label(hub, "YaRN f=1.75") == "YaRN f=1.75, Hub folder"
    assert variant_label(reference, "YaRN f=1.75") == "YaRN f=1.75 (PyTorch reference)"
    assert variant_label(hub) == "LPES, Hub folder"  # a per-layer curve is LPES


def test_a_break_says_how_far_the_candidate_holds_and_the_flag_that_ships_it():
    lengths = _lengths([_rung(800, 0.0, 5, 5), _rung(1600, 0.6, 66, 15)], curve_too=True)
    decision = decide(_candidates(N, BASE, UNIFORM, UNIFORM), _table(N), lengths=lengths)
    assert "(it holds up to 800: --serve-length 800 ships it with that limit); unscaled shipped: the only one " \
           "that holds" in decision.reason


def test_a_search_with_no_longer_prompt_to_check_says_so(tmp_path):
    """make demo's case: searched at 512 positions of a model trained on 256, serving 512: no rung, one line."""
    import contextlib
    import io

    from lpes.cli import search_main

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = search_main(["lpes-tiny-kv", "--out", str(tmp_path / "best.json"), "--data",
                            "tiny-kv:examples=1,length=512", "--scale-grid", "1:2:1", "--generations", "0",
                            "--population", "2", "--holdout", "0", "--baselines", "none"])
    assert code == 0, stderr.getvalue()
    assert "lpes-search: lengths: no longer prompt to check: the model serves" in stderr.getvalue()


def test_validation_repeats_the_decision_with_a_stock_baseline_among_its_variants():
    """make demo's validation: a YaRN baseline variant in the table (named, its type unknown to the table)."""
    from lpes.validation.examples import Example
    from lpes.validation.results import REFERENCE, UNSCALED, ValidationReport, VariantResult
    from lpes.validation.scoring import ExampleResult, Scores

    def scores(right: set[int]) -> Scores:
        return Scores(tuple(ExampleResult(i, i % 4, "", i in right) for i in range(200)), 0)

    examples = [Example(f"p{i}", "v", i % 4, 4) for i in range(200)]
    variants = [VariantResult(UNSCALED, "ok", scores(set(range(0, 200, 2)))),
                VariantResult("YaRN f=1.75", "ok", scores(set(range(0, 200, 2)) | {1, 3, 5}), baseline=True),
                VariantResult(REFERENCE, "ok", scores(set(range(0, 200, 2)) | {1, 3, 5, 7}))]
    text = ValidationReport("m", examples, variants, None, shipped="YaRN f=1.75").markdown()
    assert "| YaRN f=1.75 **(decided)** |" in text or "| unscaled **(decided)** |" in text
