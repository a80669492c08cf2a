"""lpes-validate's report: every variant on the same examples, exports held to the reference."""

from __future__ import annotations

import json
import random

import pytest
import torch
from conftest import plain_greedy, tiny_model_dir
from transformers import AutoModelForCausalLM, AutoTokenizer

import lpes
from lpes.converter.hf_folder import write_hf_folder
from lpes.converter.loading import resolve_for_spec, resolve_model
from lpes.converter.reference import apply
from lpes.exporters import targets
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import Spec, StockRope
from lpes.validation import report, scoring
from lpes.validation.examples import Example
from lpes.validation.task_choice import resolve_task
from lpes.validation.variant_runs import ScoringSettings

torch.set_num_threads(1)
SPEC = Spec.from_scales([4.0, 1.0, 0.5])
QUIET = ScoringSettings(progress=False)
# conftest's tokenizer registers its unknown word "w3" as a special token, which splits w30..w39: avoid them.
WORDS = [f"w{i}" for i in range(4, 100) if not 30 <= i <= 39]


@pytest.fixture(scope="module")
def conversion(tmp_path_factory):
    """A tiny model, its LPES Hub folder and ONNX export, and examples half of which the reference gets right."""
    tmp = tmp_path_factory.mktemp("report")
    model_dir = tiny_model_dir("llama", tmp)
    out = tmp / "out"
    out.mkdir()
    write_hf_folder(resolve_for_spec(model_dir, SPEC), out, "tiny-llama", lpes.__version__)
    try:
        from lpes.exporters.onnx.export import export_onnx

        (out / "onnx").mkdir()
        export_onnx(resolve_for_spec(model_dir, SPEC), out / "onnx")
    except ImportError:
        pass  # the ONNX test below skips
    reference = apply(AutoModelForCausalLM.from_pretrained(model_dir).eval(), SPEC)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(0)
    examples, expected = [], []
    for n in range(12):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(6, 40)))
        own = tokenizer.decode(plain_greedy(reference, scoring.encode_prompt(tokenizer, prompt), 2))
        right = n % 2 == 0 and "<" not in own and own.count(" ") == 1  # two plain words
        examples.append(Example(prompt, own if right else "w98 w99", gold_index=n % 3, num_pairs=3))
        expected.append(right or own == "w98 w99")
    return model_dir, out, examples, expected


def test_exports_agree_with_the_reference_and_files_are_written(conversion):
    model_dir, out, examples, expected = conversion
    result = report.validate(resolve_for_spec(model_dir, SPEC), out, examples=examples, variants=["hf"],
                             settings=ScoringSettings(batch_size=5, progress=False))
    assert [v.name for v in result.variants] == ["unscaled", "reference", "hf"]
    reference, hf = result.variant("reference"), result.variant("hf")
    assert [r.correct for r in reference.scores.results] == expected
    assert sum(expected) >= 3
    by_index = {g: [c for e, c in zip(examples, expected) if e.gold_index == g] for g in range(3)}
    assert reference.scores.accuracy_by_gold_index() == {g: sum(c) / len(c) for g, c in by_index.items()}
    assert hf.disagreements == [] and hf.allowed == 0 and result.passed
    assert [r.generated for r in hf.scores.results] == [r.generated for r in reference.scores.results]
    # The unscaled model really runs without the scales (its answers differ somewhere).
    unscaled = result.variant("unscaled")
    assert [r.generated for r in unscaled.scores.results] != [r.generated for r in reference.scores.results]

    data = json.loads((out / "validation.json").read_text())
    assert data["format"] == "lpes-validation" and data["passed"] is True
    assert data["gold_indices"] == [0, 1, 2] and data["num_examples"] == 12
    for row, r in zip(data["examples"], reference.scores.results, strict=True):
        assert row["generated"]["reference"] == r.generated and set(row["generated"]) == {"unscaled", "reference", "hf"}
        assert "prompt" not in row  # kept only where an export disagrees
    markdown = (out / "validation.md").read_text()
    assert "| variant | 0 | 1 | 2 | all | vs reference |" in markdown
    assert "![accuracy by gold index](validation.png)" in markdown
    assert "0/12 differ (float32, allowed 0): ok" in markdown and markdown.rstrip().endswith("**passed**")
    assert (out / "validation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The Hub folder's model card is rewritten with the validation it embeds (issue 29).
    assert result.files == [out / "validation.json", out / "validation.md", out / "validation.png", out / "README.md"]
    assert markdown.strip() in (out / "README.md").read_text()
    assert "**passed**" in result.format()


def test_onnx_export_gives_the_reference_answers_in_float32(conversion):
    model_dir, out, examples, _ = conversion
    assert (out / "onnx" / "model.onnx").is_file()
    result = report.validate(resolve_for_spec(model_dir, targets.find_spec(out)), out, examples=examples,
                             variants=["onnx"], settings=ScoringSettings(batch_size=4, progress=False))
    onnx = result.variant("onnx")
    assert onnx.status == "ok" and onnx.dtype == "float32" and onnx.note == "CPUExecutionProvider"
    reference = result.variant("reference")
    assert [r.generated for r in onnx.scores.results] == [r.generated for r in reference.scores.results]
    assert onnx.disagreements == [] and result.passed


def register_fake(monkeypatch, make_runner) -> None:
    """A registered export target "fake" whose runner is `make_runner()` and whose dtype its sidecar names."""

    class Fake(targets.Target):
        name, folder, marker = "fake", "fake", "lpes_fake.json"

        @classmethod
        def open(cls, folder, run):
            return targets.OpenedExport(make_runner(), "fake runtime", cls.export_dtype(folder, run))

        @classmethod
        def export_dtype(cls, folder, run):
            return json.loads((folder / cls.marker).read_text())["dtype"]

    targets.registry()  # the built-ins first, so the fake is one more
    monkeypatch.setitem(targets._REGISTRY, "fake", Fake)


class OneWrongAnswer:
    """A runner that answers like the reference except on one prompt (an export with one bad example)."""

    def __init__(self, reference, pad_id: int, bad_prompt: list[int]):
        self.inner = scoring.TorchGreedy(reference, pad_id)
        self.bad_prompt = bad_prompt

    def greedy(self, input_ids, max_new_tokens, eos_token_id):
        outputs = self.inner.greedy(input_ids, max_new_tokens, eos_token_id)
        return [[97] * max_new_tokens if ids == self.bad_prompt else out for ids, out in zip(input_ids, outputs)]


def test_an_export_that_disagrees_fails_and_keeps_the_prompts(conversion, monkeypatch):
    model_dir, out, examples, _ = conversion
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    bad = scoring.encode_prompt(tokenizer, examples[1].prompt)
    (out / "fake").mkdir(exist_ok=True)
    (out / "fake" / "lpes_fake.json").write_text(json.dumps({"dtype": "float16"}))

    def wrong_on_one():
        return OneWrongAnswer(apply(AutoModelForCausalLM.from_pretrained(model_dir), SPEC), 0, bad)

    register_fake(monkeypatch, wrong_on_one)
    # 12 examples: float16 allows int(0.02 * 12) = 0; 60 (each prompt 5 times, 5 bad) allows 1.
    for copies, allowed in ((1, 0), (5, 1)):
        result = report.validate(resolve_for_spec(model_dir, SPEC), out, examples=examples * copies, variants=["fake"],
                                 settings=QUIET)
        fake = result.variant("fake")
        assert fake.disagreements == [1 + 12 * k for k in range(copies)]
        assert fake.allowed == allowed and result.passed is False
    # A failed run keeps the earlier scored results (the first run's, or an earlier test's) and writes beside them.
    assert "FAIL" in (out / "validation.failed.md").read_text() and "kept the earlier" in result.format()
    assert "fake decodes differently from the reference on 5 of 60 examples" in result.format()
    rows = json.loads((out / "validation.failed.json").read_text())["examples"]
    assert [row["id"] for row in rows if "prompt" in row] == fake.disagreements
    assert rows[1]["prompt"] == examples[1].prompt and rows[1]["generated"]["fake"] == "w97 w97"


def test_float16_threshold_lets_one_near_tie_through(conversion, monkeypatch):
    model_dir, out, examples, _ = conversion
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    many = [Example(e.prompt + f" w{40 + k}", e.answer, e.gold_index, 3) for k in range(5) for e in examples]
    bad = scoring.encode_prompt(tokenizer, many[0].prompt)  # one of 60 distinct prompts
    (out / "fake").mkdir(exist_ok=True)

    def wrong_on_one():
        return OneWrongAnswer(apply(AutoModelForCausalLM.from_pretrained(model_dir), SPEC), 0, bad)

    register_fake(monkeypatch, wrong_on_one)
    for dtype, passed in (("float16", True), ("float32", False)):
        (out / "fake" / "lpes_fake.json").write_text(json.dumps({"dtype": dtype}))
        result = report.validate(resolve_for_spec(model_dir, SPEC), out, examples=many, variants=["fake"],
                                 settings=QUIET)
        assert result.variant("fake").disagreements == [0]
        assert result.passed is passed


def test_export_that_cannot_run_here_is_skipped(conversion, monkeypatch):
    model_dir, out, examples, _ = conversion
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine without a GPU
    (out / "tensorrt").mkdir(exist_ok=True)
    (out / "tensorrt" / "model.engine").write_bytes(b"not an engine")
    result = report.validate(resolve_for_spec(model_dir, SPEC), out, examples=examples[:3], variants=["tensorrt"],
                             settings=QUIET)
    tensorrt = result.variant("tensorrt")
    assert tensorrt.status == "skipped" and "tensorrt" in tensorrt.note.lower() and tensorrt.scores is None
    # Written but not run here: the folder is not validated (no failure either).
    assert result.verdict == "not validated" and not result.passed
    assert "**not validated**: tensorrt not run (" in result.markdown()
    assert "| tensorrt | - | - | - | - | skipped: " in result.markdown()


def test_baselines_are_scored_as_transformers_runs_them_and_a_better_one_is_said(tmp_path):
    """Each recorded baseline's verdicts are those of a model whose config.json sets it (plain transformers,
    plain greedy, a fresh load per prompt for dynamic NTK), past the trained length."""
    model_dir = tiny_model_dir("llama", tmp_path, max_position_embeddings=16)
    rng = random.Random(1)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(20, 40))) for _ in range(6)]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    yarn = StockRope("yarn", 2.0)

    def answers(model_for):
        return [tokenizer.decode(plain_greedy(model_for(), scoring.encode_prompt(tokenizer, p), 2)) for p in prompts]

    def stock_model(rope_type, factor):
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        written = {"rope_type": rope_type, "rope_theta": 10000.0, "factor": factor}
        if rope_type == "yarn":
            written["original_max_position_embeddings"] = 16
        model.config.rope_parameters = written
        folder = tmp_path / f"{rope_type}-{factor}"
        model.save_pretrained(folder)
        return lambda: AutoModelForCausalLM.from_pretrained(folder).eval()

    by_yarn = answers(stock_model("yarn", 2.0))
    by_dynamic = answers(stock_model("dynamic", 3.0))
    # The answers are what YaRN says: it answers all, the others fewer (unless they happen to say the same).
    examples = [Example(p, a, gold_index=i % 2, num_pairs=2) for i, (p, a) in enumerate(zip(prompts, by_yarn))]
    provenance = {"search": {"stock_baselines": [{"rope_type": "yarn", "factor": 2.0},
                                                 {"rope_type": "dynamic", "factor": 3.0}]}}
    spec = Spec.from_scales([4.0, 1.0, 0.5], provenance)
    out = tmp_path / "out"
    out.mkdir()
    result = report.validate(resolve_for_spec(model_dir, spec), out, examples=examples, variants=[],
                             settings=ScoringSettings(batch_size=3, progress=False))
    assert [v.name for v in result.variants] == ["unscaled", yarn.name, "dynamic NTK f=3", "reference"]
    assert [r.correct for r in result.variant(yarn.name).scores.results] == [True] * 6
    dynamic = result.variant("dynamic NTK f=3")
    assert [r.generated for r in dynamic.scores.results] == by_dynamic
    assert "one example at a time" in dynamic.note and dynamic.baseline
    assert result.beaten().startswith("YaRN f=2") and "**Note**: YaRN f=2" in result.markdown()
    assert json.loads((out / "validation.json").read_text())["beaten"] == result.beaten()
    assert result.measured().stock[0][0] == yarn.name


def test_a_baseline_the_model_cannot_take_is_skipped_with_the_reason(conversion, tmp_path):
    model_dir, _, examples, _ = conversion
    linear = tiny_model_dir("llama", tmp_path,
                            rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    spec = Spec.from_scales(list(SPEC.scales), {"search": {"stock_baselines": [{"rope_type": "yarn", "factor": 2}]}})
    out = tmp_path / "out"
    out.mkdir()
    result = report.validate(resolve_for_spec(linear, spec), out, examples=examples[:3], variants=[], settings=QUIET)
    skipped = result.variant("YaRN f=2")
    assert skipped.status == "skipped" and "its own RoPE is 'linear'" in skipped.note
    assert result.passed  # a baseline that cannot run is no failure of the conversion


def test_unknown_variant_and_missing_spec_are_user_errors(conversion, tmp_path):
    model_dir, out, examples, _ = conversion
    with pytest.raises(LpesError, match="unknown variant 'trt'"):
        report.validate(resolve_for_spec(model_dir, SPEC), out, examples=examples, variants=["trt"], settings=QUIET)
    with pytest.raises(LpesError, match="no lpes_spec.json"):
        targets.find_spec(tmp_path)
    assert targets.find_spec(out).scales == SPEC.scales  # the Hub folder's lpes_spec.json


@pytest.mark.slow
def test_bundled_model_reference_and_onnx_agree_on_its_own_task(tmp_path):
    """The bundled model's ONNX export answers as its reference does on the model's task (lpes_task.json);
    4 examples per gold index suffice for that (how long a full validation takes is bench/'s business)."""
    model_dir = resolve_model("lpes-tiny-kv")
    from lpes.exporters.onnx.export import export_onnx

    spec = Spec.from_scales([2.0, 1.5, 1.0, 1.0])
    (tmp_path / "onnx").mkdir()
    export_onnx(resolve_for_spec(model_dir, spec), tmp_path / "onnx")
    result = report.validate(resolve_for_spec(model_dir, spec), tmp_path,
                             resolve_task(model_dir, spec, "tiny-kv:examples=4"), settings=QUIET)
    assert result.variant("onnx").disagreements == [] and result.passed
    # Scored, not skipped (a skipped variant has no disagreements either): 4 examples x 5 gold indices.
    assert len(result.variant("onnx").scores.results) == len(result.variant("reference").scores.results) == 4 * 5
    assert result.variant("reference").scores.accuracy > 0
