"""Issue 29: a model a user brings, and a curve applied to a model it was not searched on.

On folders built here: a spec records the model it was searched on (name, config and weights
digests) and applying it to another model says so in one line, with the report and the model card
naming that search instead of calling its baselines "best on calibration"; a tokenizer that cannot
encode the task (a WordLevel vocabulary without [UNK]; a Qwen2 folder whose tokenizer transformers
rebuilds as a BPE that encodes everything to []) stops every command at plan time in one line
naming it, exit 2, before any export; a weights-only folder's skip message leads to a run that
works; --holdout 0 prints no nan; lpes-validate rewrites the card with its validation or leaves
both alone; the demo's closing words say what its table shows.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from conftest import tiny_model_dir

from lpes.cli import convert_main, generate_main, search_main, validate_main
from lpes.converter.fingerprint import model_differences, model_fingerprint
from lpes.converter.loading import bundled_models, load_config
from lpes.foundation.spec import Spec, dump_spec

torch.set_num_threads(1)
ROOT = Path(__file__).parents[1]
KV_MODEL, INDUCTION_MODEL = "lpes-tiny-kv", "lpes-tiny-induction"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def fingerprint(folder: Path, name: str | None = None) -> dict:
    return model_fingerprint(load_config(folder), folder, name or folder.name)


def no_unk_tokenizer_model(root: Path) -> Path:
    """conftest's tiny Llama with a WordLevel tokenizer whose vocabulary has no [UNK] (its unknown token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tiny_model_dir("llama", root)
    for name in TOKENIZER_FILES:
        (folder / name).unlink()
    words = ["<pad>", "<bos>", "<eos>"] + [f"w{i}" for i in range(3, 100)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}))  # unk_token "[UNK]", not in it
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                            eos_token="<eos>").save_pretrained(folder)
    return folder


def onnx_folder(model: Path, folder: Path) -> Path:
    """An ONNX folder with `model`'s config and tokenizer and a valid one-node graph: lpes-generate checks the
    prompt against the tokenizer before it opens a session, so the graph never runs."""
    import onnx
    from onnx import TensorProto, helper

    folder.mkdir()
    for name in ("config.json", *TOKENIZER_FILES):
        shutil.copy(model / name, folder / name)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx")
    return folder


def error_line(err: str, prog: str) -> str:
    """The command's one error line; no traceback, no tokenizers exception anywhere."""
    assert "Traceback" not in err and "WordLevel error" not in err, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith(f"{prog}: error: ")]
    assert len(lines) == 1, err[-2000:]
    return lines[0]


def no_nan(text: str) -> None:
    assert not re.search(r"\bnan\b", text, re.I), text[-2000:]


# ---- the model a spec was searched on ----


def test_the_fingerprint_tells_a_copy_from_another_model(tmp_path):
    kv = bundled_models()[KV_MODEL]
    here = fingerprint(kv, KV_MODEL)
    assert here["name"] == KV_MODEL and len(here["config_sha256"]) == len(here["weights_sha256"]) == 64
    copy = shutil.copytree(kv, tmp_path / "my-copy")
    assert model_differences(here, fingerprint(copy)) == []  # the same model under another name
    assert model_differences(here, fingerprint(bundled_models()[INDUCTION_MODEL])) == ["weights", "config"]
    a, b = tiny_model_dir("llama", tmp_path / "a", seed=0), tiny_model_dir("llama", tmp_path / "b", seed=1)
    assert model_differences(fingerprint(a), fingerprint(b)) == ["weights"]  # one shape, other weights
    # A record from before the digests: what it names decides.
    legacy = {k: here[k] for k in ("architecture", "model_type", "num_hidden_layers", "rope_parameters", "name")}
    assert model_differences(legacy, fingerprint(bundled_models()[INDUCTION_MODEL], INDUCTION_MODEL)) == ["name"]
    assert model_differences({"architecture": "LlamaForCausalLM"}, here) == []


def spec_searched_on_induction(path: Path) -> Path:
    """A spec as lpes-search writes it on lpes-tiny-induction, but with a task lpes-tiny-kv's words encode."""
    task = {"data": "tiny-kv:examples=1", "chat_template": False, "answer_tokens": None,
            "prompt_tokens": [1024, 1024]}
    provenance = {
        "model": fingerprint(bundled_models()[INDUCTION_MODEL], INDUCTION_MODEL), "base_model": INDUCTION_MODEL,
        "search": {"task": task, "calibration_examples": 5, "fitness": 0.6, "best_uniform_scale": 1.5,
                   "best_uniform_fitness": 0.4, "stock_baselines": [{"rope_type": "yarn", "factor": 2.0}]},
        "held_out": {"examples": 5, "unscaled": 0.4, "lpes": 0.6},
    }
    dump_spec(Spec.from_scales([1.0, 2.0, 2.0, 1.0], provenance), path)
    return path


def test_a_curve_from_another_model_is_said_in_one_line_and_the_report_and_card_name_its_search(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    spec = spec_searched_on_induction(Path("spec.json"))
    assert convert_main([KV_MODEL, "--curve", str(spec), "--to", "hf", "--out", "out"]) == 0
    out, err = capsys.readouterr()
    said = [line for line in err.splitlines() if "searched on" in line]
    assert said == [f"lpes-convert: warning: the spec was searched on {INDUCTION_MODEL} (different weights, config), "
                    f"not on {KV_MODEL}: its baselines and search figures are that model's, and the report and "
                    "model card say so"]
    report, card = json.loads(Path("out/validation.json").read_text()), Path("out/README.md").read_text()
    assert report["searched_on"] == INDUCTION_MODEL
    table = Path("out/validation.md").read_text()
    assert "best on calibration" not in table + out
    assert f"best uniform s=1.5 (PyTorch, searched on {INDUCTION_MODEL})" in table
    assert f"YaRN f=2 (PyTorch, searched on {INDUCTION_MODEL})" in table
    assert f"Searched on: {INDUCTION_MODEL}." in table
    assert f"**These scales were searched on {INDUCTION_MODEL}**, not on this model and task" in card
    for claim in ("found by the same search", "of the same task", "its best factor on the calibration prompts"):
        assert claim not in card, claim
    written = json.loads(Path("out/lpes_spec.json").read_text())["provenance"]
    assert (written["model"]["name"], written["base_model"]) == (INDUCTION_MODEL, KV_MODEL)
    no_nan(out + err + card + table)

    # lpes-validate says it too, and rewrites the card with the validation it writes (100 -> 10 prompts).
    assert validate_main(["out", "--data", "tiny-kv:examples=2"]) == 0
    out, err = capsys.readouterr()
    assert f"lpes-validate: warning: the spec was searched on {INDUCTION_MODEL}" in err
    card, table = Path("out/README.md").read_text(), Path("out/validation.md").read_text()
    assert "out/README.md" in out and "2 examples per index" in table
    assert "Validation used 10 prompts (2 per gold index)" in card and table.strip() in card
    assert f"Searched on: {INDUCTION_MODEL}." in table  # the same task, other example counts
    # A run that keeps the earlier validation.md (skipped here: no time budget) leaves the card alone too.
    before = Path("out/README.md").read_bytes()
    assert validate_main(["out", "--data", "tiny-kv:examples=1", "--max-minutes", "0.000001"]) == 3
    assert "kept the earlier validation.json" in capsys.readouterr().out
    assert Path("out/README.md").read_bytes() == before

    # Without validation the card says so from the spec alone; on its own model nothing is said.
    assert convert_main([KV_MODEL, "--curve", str(spec), "--to", "hf", "--out", "plain", "--no-validate"]) == 0
    assert f"**These scales were searched on {INDUCTION_MODEL}**" in Path("plain/README.md").read_text()
    capsys.readouterr()
    assert convert_main([INDUCTION_MODEL, "--curve", str(spec), "--to", "hf", "--out", "own", "--no-validate"]) == 0
    assert "searched on" not in capsys.readouterr().err + Path("own/README.md").read_text()


# ---- a tokenizer that cannot encode the task, found at plan time ----


@pytest.fixture(scope="module")
def no_unk_model(tmp_path_factory) -> Path:
    return no_unk_tokenizer_model(tmp_path_factory.mktemp("no-unk"))


@pytest.fixture(scope="module")
def qwen2_model(tmp_path_factory) -> Path:
    folder = tiny_model_dir("qwen2", tmp_path_factory.mktemp("qwen2"))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)  # transformers' Qwen2Tokenizer, not the saved WordLevel
    assert type(tokenizer).__name__ == "Qwen2Tokenizer" and tokenizer("w5 w6")["input_ids"] == []
    return folder


def three_layer_spec(path: Path) -> Path:
    dump_spec(Spec.from_scales([1.0, 2.0, 1.0]), path)
    return path


def test_a_wordlevel_tokenizer_without_unk_stops_every_command_at_plan_time(no_unk_model, tmp_path, capsys):
    spec = three_layer_spec(tmp_path / "spec.json")
    tokenizer = "the tokenizer of tiny-llama (TokenizersBackend) has no unknown token"

    out = tmp_path / "out"
    assert convert_main([str(no_unk_model), "--curve", str(spec), "--to", "hf,onnx", "--out", str(out)]) == 2
    line = error_line(capsys.readouterr().err, "lpes-convert")
    assert line == ("lpes-convert: error: validation on the model folder's own task (kv): the word 'Extract' is not "
                    f"in the model's vocabulary ({tokenizer})")
    assert not out.exists()  # before any export

    folder = tmp_path / "converted"
    assert convert_main([str(no_unk_model), "--curve", str(spec), "--to", "hf", "--out", str(folder),
                         "--no-validate"]) == 0
    capsys.readouterr()
    assert validate_main([str(folder), "--model", str(no_unk_model)]) == 2
    assert f"'Extract' is not in the model's vocabulary ({tokenizer})" in error_line(capsys.readouterr().err,
                                                                                     "lpes-validate")
    assert not (folder / "validation.json").exists()

    assert search_main([str(no_unk_model), "--out", str(tmp_path / "best.json"), "--data", "kv:pairs=4"]) == 2
    assert tokenizer in error_line(capsys.readouterr().err, "lpes-search")

    onnx = onnx_folder(no_unk_model, tmp_path / "onnx")
    assert generate_main([str(onnx), "w5 capital w6"]) == 2
    assert error_line(capsys.readouterr().err, "lpes-generate") == (
        "lpes-generate: error: the prompt: the word 'capital' is not in the model's vocabulary (the tokenizer of "
        f"{onnx} (TokenizersBackend) has no unknown token)")


def test_a_tokenizer_json_transformers_cannot_read_is_one_line_at_plan_time(tmp_path, capsys):
    folder = tiny_model_dir("llama", tmp_path)
    data = json.loads((folder / "tokenizer.json").read_text())
    data["model"]["type"] = "Nope"  # the tokenizers library raises a bare Exception on it
    (folder / "tokenizer.json").write_text(json.dumps(data))
    out = tmp_path / "out"
    assert convert_main([str(folder), "--curve", str(three_layer_spec(tmp_path / "spec.json")), "--to", "hf",
                         "--out", str(out)]) == 2
    assert error_line(capsys.readouterr().err, "lpes-convert").startswith(
        f"lpes-convert: error: cannot load the tokenizer of {folder}: data did not match any variant")
    assert not out.exists()


def test_a_tokenizer_that_encodes_the_task_to_nothing_is_explained(qwen2_model, tmp_path, capsys):
    spec = three_layer_spec(tmp_path / "spec.json")
    why = ("transformers built it as Qwen2Tokenizer, a BPE tokenizer, in place of the WordLevel model its "
           "tokenizer.json holds")

    assert convert_main([str(qwen2_model), "--curve", str(spec), "--to", "hf", "--out", str(tmp_path / "out"),
                         "--data", "kv:pairs=4,examples=1"]) == 2
    line = error_line(capsys.readouterr().err, "lpes-convert")
    assert line.startswith("lpes-convert: error: validation on --data kv:pairs=4,examples=1: the tokenizer of "
                           "tiny-qwen2 (Qwen2Tokenizer) encodes 'Extract the value") and why in line
    assert "empty answer" not in line and not (tmp_path / "out").exists()

    folder = tmp_path / "converted"
    assert convert_main([str(qwen2_model), "--curve", str(spec), "--to", "hf", "--out", str(folder),
                         "--no-validate"]) == 0
    capsys.readouterr()
    assert validate_main([str(folder), "--model", str(qwen2_model), "--data", "kv:pairs=4,examples=1"]) == 2
    assert why in error_line(capsys.readouterr().err, "lpes-validate")

    assert search_main([str(qwen2_model), "--out", str(tmp_path / "best.json"), "--data", "kv:pairs=4,examples=1"]) == 2
    assert why in error_line(capsys.readouterr().err, "lpes-search")

    assert generate_main([str(onnx_folder(qwen2_model, tmp_path / "onnx")), "w5 w6"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and why in error_line(err, "lpes-generate")  # not an empty line and exit 0


# ---- suggestions that lead somewhere ----


def test_a_weights_only_folder_is_told_what_to_give_and_that_command_runs(tmp_path, monkeypatch, capsys):
    full = tiny_model_dir("llama", tmp_path / "full")
    monkeypatch.chdir(tmp_path)
    Path("base").mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(full / name, Path("base") / name)
    three_layer_spec(Path("spec.json"))
    data = "kv:pairs=4,examples=1,gold=0+3"
    assert convert_main(["base", "--curve", "spec.json", "--to", "hf", "--out", "out", "--data", data]) == 3
    capsys.readouterr()
    detail = json.loads(Path("out/validation.json").read_text())["checks"][1]["detail"]
    elsewhere = f"lpes-validate out --model MODEL_WITH_TOKENIZER --data {data}"
    assert f"name as MODEL_WITH_TOKENIZER a folder or Hub id of this model that has its tokenizer files: {elsewhere}"\
        in detail
    # The command with this same folder comes only after copying the tokenizer in; both then run.
    copy_then = detail.split("(or copy them, e.g. tokenizer.json and tokenizer_config.json, into base and run ")[1]
    assert copy_then.startswith(f"lpes-validate out --model base --data {data})")
    # Each runs the key-value check (a random model answers nothing: exit 1, a failure of the setup, not a skip).
    kv = lambda: json.loads(Path("out/validation.json").read_text())["checks"][1]  # noqa: E731
    assert validate_main(shlex.split(elsewhere.replace("MODEL_WITH_TOKENIZER", str(full)))[1:]) != 3
    assert kv()["status"] != "skipped" and "examples in" in kv()["detail"]
    for name in TOKENIZER_FILES:
        shutil.copy(full / name, Path("base") / name)
    Path("out/validation.json").unlink()
    assert validate_main(shlex.split(copy_then[:-1])[1:]) != 3
    assert kv()["status"] != "skipped" and "examples in" in kv()["detail"]


def test_holdout_0_prints_no_nan(tmp_path, capsys):
    best = tmp_path / "best.json"
    assert search_main([KV_MODEL, "--out", str(best), "--data", "tiny-kv:examples=1", "--population", "2",
                        "--generations", "0", "--holdout", "0", "--baselines", "none", "--scale-grid", "1:2:1"]) == 0
    out, err = capsys.readouterr()
    assert "no held-out examples: --holdout 0" in err and "n/a -> n/a" not in err
    assert json.loads(best.read_text())["provenance"]["held_out"] == {"examples": 0, "unscaled": None, "lpes": None}
    assert convert_main([KV_MODEL, "--curve", str(best), "--to", "hf", "--out", str(tmp_path / "out"),
                         "--no-validate"]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert "It held out no prompts (`--holdout 0`)" in card and "?" not in card.split("## Load")[0]
    no_nan(out + err + capsys.readouterr().err + card + best.read_text())


# ---- the demo's closing words ----


def demo_words() -> str:
    lines = (ROOT / "Makefile").read_text().splitlines()
    recipe = lines[lines.index("demo: install") + 1:]
    recipe = recipe[:next(i for i, line in enumerate(recipe) if not line.startswith("\t"))]
    said = [re.match(r'\t@echo "(.*)"$', line) for line in recipe]
    return " ".join(m.group(1) for m in said if m)


def readme_demo_table() -> dict[str, dict[str, float]]:
    """docs/results.md's `make demo` table (README links to it): variant (first words) -> column -> accuracy."""
    text = (ROOT / "docs" / "results.md").read_text()
    lines = text[text.index(f"### `{INDUCTION_MODEL}`"):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| variant |"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    table = {}
    for row in lines[start + 2:end]:  # after the header and its |---| line
        cells = [c.strip().strip("*") for c in row.strip("|").split("|")]
        table[cells[0]] = {h: float(c) for h, c in zip(header[1:], cells[1:])}
    return table


def test_the_demo_closing_words_say_what_its_table_shows():
    """The words make demo ends with hold for the demo table docs/results.md records (tests/test_readme_after_demo.py
    checks them against a fresh demo's own output: its decision and the folder it shipped)."""
    words = demo_words()
    assert "can scale the retrieval layers" not in words and "cannot serve both" not in words
    table = readme_demo_table()
    row = {key: next(v for name, v in table.items() if name.startswith(key)) for key in ("YaRN", "LPES curve")}
    assert "YaRN, one setting for every layer, answers more held-out prompts than the per-layer curve" in words
    assert row["YaRN"]["all"] > row["LPES curve"]["all"]
    assert "the decision is YaRN, and the curve is not shipped" in words
