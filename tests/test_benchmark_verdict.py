"""The verdict is lost-in-the-middle's: best_subspan_em of the text generated within the answer budget."""

from __future__ import annotations

import re
import string

import pytest
import torch
from conftest import tiny_model_dir
from test_scoring import ScriptedRunner, bpe_tokenizer, load_model

from lpes.foundation.errors import LpesError
from lpes.validation import kv_data, scoring
from lpes.validation.examples import Example
from lpes.validation.tasks import task_config

torch.set_num_threads(1)


# ---- the reference: lost-in-the-middle's src/lost_in_the_middle/metrics.py, verbatim but for `re` in
# place of the `regex` package (same behaviour for this ASCII pattern) ----


def reference_normalize_answer(s: str) -> str:
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def reference_best_subspan_em(prediction: str, ground_truths: list[str]) -> float:
    normalized_prediction = reference_normalize_answer(prediction)
    for ground_truth in ground_truths:
        normalized_ground_truth = reference_normalize_answer(ground_truth)
        if normalized_ground_truth.lower() in normalized_prediction.lower():
            return 1.0
    return 0.0


GOLD = "2f120554-4a53-48cc-bdfa-bc08935ddd72"
PREDICTIONS = [
    "\n" + GOLD,  # the SmolLM2 answer: a leading newline
    "  " + GOLD + "  ",
    f'"{GOLD}"',
    f'The value corresponding to the key "0b9a..." is "{GOLD}".',
    GOLD.upper(),
    GOLD.replace("-", ""),  # punctuation is dropped from both sides
    GOLD.replace("-", " "),  # ... but a space is not a dash
    GOLD[:-1],
    "",
    "The the a an " + GOLD,
    "an" + GOLD,
]


@pytest.mark.parametrize("prediction", PREDICTIONS)
def test_answer_found_is_best_subspan_em(prediction):
    assert scoring.answer_found(prediction, GOLD) == (reference_best_subspan_em(prediction, [GOLD]) == 1.0)
    for gold in ("Paris", "the answer", "696853", "a-b"):
        assert scoring.answer_found(prediction + gold, gold) == bool(reference_best_subspan_em(prediction + gold,
                                                                                                [gold]))


@pytest.fixture(scope="module")
def kv_setup(tmp_path_factory):
    records = kv_data.generate_records(4, 30, seed=0)
    texts = [kv_data.kv_prompt(r) + "\nThe value is " + r.value for r in records]
    tokenizer = bpe_tokenizer(texts)
    folder = tiny_model_dir("llama", tmp_path_factory.mktemp("verdict"), vocab_size=len(tokenizer))
    return load_model(folder), tokenizer


def scripted_answers(tokenizer, examples, texts, eos_id):
    """A runner whose output for each prompt is `texts[i]`'s tokens, then <eos>."""
    outputs = {}
    for example, text in zip(examples, texts, strict=True):
        prompt = tuple(scoring.encode_prompt(tokenizer, example.prompt))
        outputs[prompt] = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos_id]

    class Runner(ScriptedRunner):
        def greedy(self, input_ids, max_new_tokens, eos_token_id):
            self.calls.append((len(input_ids), max_new_tokens, eos_token_id))
            return [self.outputs[tuple(ids)][:max_new_tokens] for ids in input_ids]

    return Runner(outputs)


def test_a_leading_newline_or_a_preamble_within_the_budget_is_right(kv_setup):
    _, tokenizer = kv_setup
    eos = tokenizer.eos_token_id
    records = kv_data.generate_records(4, 6, seed=3)
    examples = kv_data.make_examples(records, [1], answer_tokens=40)
    texts = ["\n" + examples[0].answer, " " + examples[1].answer, f'"{examples[2].answer}"',
             f"The value is {examples[3].answer}.", "I do not know.", examples[4].answer[:10]]
    runner = scripted_answers(tokenizer, examples, texts, eos)
    scores = scoring.greedy_correct(runner, tokenizer, examples, batch_size=6, eos_token_id=eos)
    assert [r.correct for r in scores.results] == [True, True, True, True, False, False]
    for result, example in zip(scores.results, examples):
        assert result.correct == bool(reference_best_subspan_em(result.generated, [example.answer]))
    assert runner.calls == [(6, 40, eos)]  # the example's own budget, one call for the batch
    # Within the answer's own token count (the old rule) the preamble uses up the budget.
    exact = [Example(e.prompt, e.answer, e.gold_index, e.num_pairs) for e in examples]
    assert not scoring.greedy_correct(runner, tokenizer, exact[3:4], eos_token_id=eos).results[0].correct


def test_the_stop_token_ends_the_answer(kv_setup):
    _, tokenizer = kv_setup
    eos = tokenizer.eos_token_id
    example = kv_data.make_examples(kv_data.generate_records(4, 1, seed=4), [0], answer_tokens=60)[0]
    runner = scripted_answers(tokenizer, [example], ["no."], eos)
    runner.outputs = {k: v + tokenizer(example.answer, add_special_tokens=False)["input_ids"]
                      for k, v in runner.outputs.items()}  # the value after the stop token does not count
    result = scoring.greedy_correct(runner, tokenizer, [example], eos_token_id=eos).results[0]
    assert result.generated == "no." and not result.correct


def test_calibration_uses_teacher_forcing_only_without_a_budget(kv_setup):
    model, tokenizer = kv_setup
    records = kv_data.generate_records(4, 4, seed=9)
    exact = kv_data.make_examples(records, [0, 3], answer_tokens=None)
    budgeted = kv_data.make_examples(records, [0, 3], answer_tokens=6)
    forced = scoring.teacher_forced_correct(model, tokenizer, exact)
    assert scoring.calibration_correct(model, tokenizer, exact) == forced
    greedy = scoring.greedy_correct(model, tokenizer, budgeted)
    assert scoring.calibration_correct(model, tokenizer, budgeted) == greedy
    assert greedy.forward_tokens != forced.forward_tokens  # a decode loop ran, not one pass


def test_task_fields_for_small_real_models():
    config = task_config(None, "kv:pairs=20,keys=number,answer_tokens=24,examples=2")
    assert (config.keys, config.answer_tokens, config.num_pairs) == ("number", 24, 20)
    assert task_config(None, "kv:pairs=20").answer_tokens == kv_data.BENCHMARK_ANSWER_TOKENS
    assert task_config(None, "tiny-kv:examples=2").answer_tokens is None
    records = kv_data.generate_records(20, 3, seed=1, keys="number")
    assert all(re.fullmatch(r"[1-9]\d{5}", s) for r in records for pair in r.ordered_kv_records for s in pair)
    assert records == kv_data.generate_records(20, 3, seed=1, keys="number")
    for bad, words in [("kv:keys=uuids", "did you mean 'uuid'"), ("kv:answer_tokens=0", "answer_tokens"),
                       ("tiny-kv:keys=number", "unknown field"), ("kv:answer_tokens=x", "integer")]:
        with pytest.raises(LpesError, match=words):
            task_config(None, bad)
