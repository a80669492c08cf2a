"""The second bundled model's task (two-token facts) and the bundled model `lpes-tiny-induction`."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from lpes.converter.loading import bundled_models, load_tokenizer
from lpes.foundation.errors import LpesError
from lpes.validation import scoring, tasks
from lpes.validation import tiny_induction as task

MODEL = "lpes-tiny-induction"


def _facts(tokens: list[str]) -> list[tuple[str, str]]:
    """(key, value) of every fact, read off the prompt independently: a value's key stands DECOYS + 1 before it."""
    offset = task.DECOYS + 1
    return [(tokens[i - offset][1:], tokens[i]) for i in range(offset, len(tokens)) if tokens[i].startswith("v")]


def test_examples_are_deterministic_for_a_seed():
    first = task.make_examples(6, 64, [0, 3, 5], 4, seed=7)
    assert first == task.make_examples(6, 64, [0, 3, 5], 4, seed=7)
    assert first != task.make_examples(6, 64, [0, 3, 5], 4, seed=8)


def test_an_example_asks_for_the_value_after_its_gold_key():
    tokenizer = task.build_tokenizer()
    for example in task.make_examples(8, 48, [0, 4, 7], 5, seed=3):
        tokens = example.prompt.split()
        facts = _facts(tokens[:-1])
        assert len(facts) == 8 and len({key for key, _ in facts}) == 8
        # Between a key and its value stand DECOYS other keys, never a fact's key.
        between = {tokens[i - d] for i, t in enumerate(tokens) if t.startswith("v") for d in range(1, task.DECOYS + 1)}
        assert all(t.startswith("k") for t in between) and not between & {f"k{key}" for key, _ in facts}
        assert tokens[-1] == f"q{facts[example.gold_index][0]}"
        assert example.answer == facts[example.gold_index][1]
        assert len(tokenizer(example.prompt)["input_ids"]) == 48  # <bos> + context + query


def test_training_batch_targets_match_the_rows():
    ids = task.token_ids()
    names = task.vocabulary()
    batch = task.make_batch(random.Random(5), 4, 30, 5, queries=3)
    for row, target, key_target, source in zip(batch.ids, batch.targets, batch.key_targets, batch.sources):
        tokens = [names[i] for i in row.tolist()]
        assert tokens[0] == task.BOS_TOKEN and target[-1] == ids[task.EOS_TOKEN]
        values = dict(_facts(tokens[1:-6]))  # the context: three (query, answer) pairs close each row
        for position in (target != task.IGNORE).nonzero().flatten().tolist()[:-1]:
            asked = tokens[position][1:]
            assert names[target[position]] == values[asked] == tokens[position + 1]
            assert tokens[source[position]] == values[asked]
            assert tokens[source[position] - task.DECOYS - 1] == f"k{asked}"
        for position in (key_target != task.IGNORE).nonzero().flatten().tolist():
            assert tokens[position].startswith("v")
            assert names[key_target[position]] == tokens[position - task.DECOYS - 1]


def test_task_descriptions_and_the_model_folder_name_the_task():
    config = tasks.task_config(None, "tiny-induction:pairs=4,length=40,examples=2,gold=0+3")
    assert tasks.examples_for(config) == task.make_examples(4, 40, [0, 3], 2, seed=1)  # held-out: seed 2*0+1
    examples = tasks.examples_for(config, split="search")
    assert [e.gold_index for e in examples] == [0, 0, 3, 3]
    assert examples != tasks.examples_for(config, split="validation")
    with pytest.raises(LpesError, match=f"at least {(2 + task.DECOYS) * 8 + 2} for 8 pairs"):
        tasks.task_config(None, "tiny-induction:pairs=8,length=12")
    defaults = tasks.task_config(bundled_models()[MODEL], None)
    assert (defaults.task, defaults.num_pairs, defaults.length) == ("tiny-induction", 16, 512)


@pytest.fixture(scope="module")
def bundled():
    folder = bundled_models()[MODEL]
    return folder, AutoModelForCausalLM.from_pretrained(folder).eval(), load_tokenizer(folder)


def test_bundled_model_has_an_end_token_everywhere_genai_reads_it(bundled):
    folder, model, tokenizer = bundled
    eos = task.token_ids()[task.EOS_TOKEN]
    assert model.config.eos_token_id == tokenizer.eos_token_id == eos
    assert GenerationConfig.from_pretrained(folder).eos_token_id == eos


def test_bundled_model_answers_at_its_training_length_and_then_stops(bundled):
    folder, model, tokenizer = bundled
    examples = task.make_examples(16, 256, [0, 8, 15], 8, seed=99)
    scores = scoring.teacher_forced_correct(model, tokenizer, examples, batch_size=24)
    assert scores.accuracy >= 0.9
    batch = tokenizer([e.prompt for e in examples[:4]], return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=3, do_sample=False)
    for example, generated in zip(examples[:4], out[:, batch["input_ids"].shape[1]:]):
        words = tokenizer.convert_ids_to_tokens(generated.tolist())
        if words[0] == example.answer:  # a wrong answer may be followed by anything
            assert words[1] == task.EOS_TOKEN
