"""--objective answer-logprob: the likelihood target is the model's own answer with the gold value in place.

The answer forms below are SmolLM2-135M-Instruct's own, unscaled, on the real-model task (bench/real/position.json:
a sentence, or the JSON recited), and a chat answer naming the benchmark's UUID values.
"""

import json

import pytest

from lpes.cli import search_main
from lpes.validation.own_answers import BARE, KEPT, SUBSTITUTED, gold_shape, own_answer_target, question_key

GOLD = "240891"


KEY = "696853"


@pytest.mark.parametrize("generated, target, how", [
    # Right: cut after the value (the closing punctuation is form the verdict does not need).
    ('The value corresponding to the key "696853" is 240891.', 'The value corresponding to the key "696853" is 240891',
     KEPT),
    # Wrong value: the first 6-digit span that is not the question's key is the value.
    ('The value corresponding to the key "696853" is 118204.', 'The value corresponding to the key "696853" is 240891',
     SUBSTITUTED),
    # A leading space or newline is the prompt's separator, added back when the target is tokenized.
    ('\n "696853": "118204"', '"696853": "240891', SUBSTITUTED),
    # Gemma 3 270M writes the value first, then recites pairs: a gold value further on is not its answer.
    (' 131011\nKey: "371493"\nCorresponding value: 240891', "240891", SUBSTITUTED),
    (' 240891\nKey: "941235"\nCorresponding value: 9', "240891", KEPT),
    # No value written (the answer recites the prompt's opening): the bare gold.
    ('JSON data:\n{"', GOLD, BARE),
    # A longer or shorter number, or digits inside a word, is not a value of this shape.
    ('The value is 1182045 or 11820 or a118204', GOLD, BARE),
])
def test_the_target_is_the_models_own_answer_with_the_gold_value(generated, target, how):
    assert own_answer_target(generated, GOLD, KEY) == (target, how)


def test_uuid_values_are_found_by_their_shape():
    gold, key = "9f4a2c1e-0b7d-4e3a-8c55-1f2e3d4c5b6a", "a1b2c3d4-0000-4e3a-8c55-000000000000"
    opening = f'The value associated with key "{key}" is "'
    target, how = own_answer_target(opening + '3c9e1a7b-52d0-4f6e-9a1b-7d8c6e5f4a3b".', gold, key)
    assert how == SUBSTITUTED and target == opening + gold
    assert gold_shape(gold).fullmatch("ffffffff-ffff-ffff-ffff-ffffffffffff")
    assert not gold_shape(gold).search("ffffffff-ffff-ffff-ffff-fffffffffff")  # one short
    assert question_key(f'{{"{key}": "{gold}"}}\nKey: "{key}"\nCorresponding value:', gold) == key


def test_a_value_without_digits_is_never_substituted():
    """Words cannot be told from values by shape: a wrong word answer keeps the bare gold."""
    assert gold_shape("Paris") is None
    assert own_answer_target("The capital is Lyon.", "Paris") == ("Paris", BARE)


def search_args(out, objective):
    return ["lpes-tiny-kv", "--out", str(out), "--optimizer", "gradient", "--objective", objective,
            "--generations", "2", "--patience", "0", "--holdout", "4", "--baselines", "none",
            "--data", "tiny-kv:examples=1,length=512", "--scale-grid", "0.5:4:0.5"]


def test_on_a_model_that_answers_with_the_value_alone_it_is_the_gold_likelihood(tmp_path, capsys):
    """lpes-tiny-kv answers with the value's own tokens, so every own-form target is the gold value and the
    search climbs exactly what --objective logprob climbs: the same curve, the same objective at every step."""
    assert search_main(search_args(tmp_path / "own.json", "answer-logprob")) == 0
    assert "answer-logprob targets:" in capsys.readouterr().err
    assert search_main(search_args(tmp_path / "gold.json", "logprob")) == 0
    own, gold = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("own", "gold"))
    assert own["scales"] == gold["scales"]
    history = [[h["objective"] for h in s["provenance"]["search"]["history"]] for s in (own, gold)]
    assert history[0] == history[1]
    targets = own["provenance"]["search"]["answer_targets"]
    assert sum(targets.values()) == own["provenance"]["search"]["calibration_examples"] and targets[KEPT] > 0
    assert "answer_targets" not in gold["provenance"]["search"]


def test_an_answer_without_a_value_borrows_the_others_form_with_its_own_key():
    """The unscaled SmolLM2 recites the JSON on most prompts it gets wrong: such a prompt's target is the
    sentence the model wrote where it did give a value, naming this prompt's key (the last one its question
    names), then the gold value."""
    from lpes.validation.examples import Example
    from lpes.validation.own_answers import BORROWED, own_answer_examples

    def example(key, value):
        prompt = f'JSON data:\n{{"111111": "222222", "{key}": "{value}"}}\nKey: "{key}"\nCorresponding value:'
        return Example(prompt, value, 1, 2)

    recited = 'The JSON data contains the following key-value pairs:\n\n```json\n{\n    "'
    examples = [example("696853", "240891"), example("685782", "649187"), example("361681", "394856"),
                example("999999", "123456"), example("876471", "555555")]
    said = ['The value corresponding to the key "696853" is 240891.',
            'The value corresponding to the key "685782" is 946116.',
            recited + "87647",
            "I don't know",
            recited + '111111": "222222",']  # a recited key of the value's shape is not a wrong value
    targets, counts = own_answer_examples(examples, said)
    assert [t.answer for t in targets] == [
        'The value corresponding to the key "696853" is 240891',
        'The value corresponding to the key "685782" is 649187',
        'The value corresponding to the key "361681" is 394856',
        'The value corresponding to the key "999999" is 123456',
        'The value corresponding to the key "876471" is 555555']
    assert counts == {KEPT: 1, SUBSTITUTED: 1, BORROWED: 3, BARE: 0}
    assert [(t.prompt, t.gold_index) for t in targets] == [(e.prompt, e.gold_index) for e in examples]
    # With no right answer there is no form to borrow: each answer keeps its own, or the bare gold.
    targets, counts = own_answer_examples(examples[2:], said[2:])
    assert [t.answer for t in targets] == ["394856", "123456", recited + '555555']
    assert counts == {KEPT: 0, SUBSTITUTED: 1, BORROWED: 0, BARE: 2}


def test_a_model_that_answers_with_the_value_first_keeps_the_bare_value_as_its_form():
    """Gemma 3 270M's answers (bench/real/gemma3/premise/compare-unscaled.json): the value, then more pairs."""
    from lpes.validation.examples import Example
    from lpes.validation.own_answers import BORROWED, own_answer_examples

    def example(key, value):
        return Example(f'{{"{key}": "{value}", "111111": "222222"}}\nKey: "{key}"\nCorresponding value:', value, 0, 2)

    examples = [example("371493", "142450"), example("941235", "240891"), example("819830", "344406")]
    said = [' 131011\nKey: "371493"\nCorresponding value: 142450', ' 240891\nKey: "941235"\nCorresponding value: 9',
            "\n\nThe JSON object below contains"]
    targets, counts = own_answer_examples(examples, said)
    assert [t.answer for t in targets] == ["142450", "240891", "344406"]
    assert counts == {KEPT: 1, SUBSTITUTED: 1, BORROWED: 1, BARE: 0}


def verdict_args(out, objective):
    return ["lpes-tiny-kv", "--out", str(out), "--objective", objective, "--generations", "2", "--patience", "0",
            "--holdout", "0", "--baselines", "none", "--data", "tiny-kv:examples=1,length=512",
            "--scale-grid", "0.5:4:0.5"]


def test_answer_accuracy_on_a_model_that_answers_with_the_value_alone_is_accuracy(tmp_path, capsys):
    """lpes-tiny-kv's own-form targets are its gold values and its verdict is teacher-forced already: the
    same curve and the same verdicts at every generation as --objective accuracy, raced the same way."""
    assert search_main(verdict_args(tmp_path / "own.json", "answer-accuracy")) == 0
    assert "answer-accuracy targets:" in capsys.readouterr().err
    assert search_main(verdict_args(tmp_path / "gold.json", "accuracy")) == 0
    own, gold = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("own", "gold"))
    assert own["scales"] == gold["scales"]
    assert own["provenance"]["search"]["history"] == gold["provenance"]["search"]["history"]
    assert sum(own["provenance"]["search"]["answer_targets"].values()) == 5


def test_answer_accuracy_is_the_teacher_forced_verdict_on_the_own_answers(tmp_path, monkeypatch):
    """With an answer budget the task's verdict generates; answer-accuracy's is one teacher-forced pass on each
    own-answer target, checked here against plain transformers. Every other target is made the second word of
    the model's own 8-token answer: a generated verdict (the word within the answer) counts it, teacher forcing
    (the word as the answer's first token) does not, unless the answer repeats its first word."""
    from dataclasses import replace

    import torch
    from transformers import AutoModelForCausalLM

    from lpes.converter.loading import load_tokenizer, resolve_model
    from lpes.validation import own_answers
    from lpes.validation.scoring import answer_ids, encode_prompt

    real, made = own_answers.own_answer_examples, []

    def second_words(examples, generated):
        targets, counts = real(examples, generated)
        for i, (target, text) in enumerate(zip(targets, generated)):
            words = text.split()
            made.append((replace(target, answer=words[1]) if i % 2 and len(words) > 1 else target, text))
        return [target for target, _ in made], counts

    monkeypatch.setattr(own_answers, "own_answer_examples", second_words)
    args = ["lpes-tiny-kv", "--out", str(tmp_path / "a.json"), "--objective", "answer-accuracy", "--answer-tokens",
            "8", "--scale-grid", "1:1:1", "--generations", "0", "--holdout", "0", "--baselines", "none",
            "--data", "tiny-kv:examples=4"]
    assert search_main(args) == 0  # the grid's one scale, 1: the unscaled model's verdicts
    fitness = json.loads((tmp_path / "a.json").read_text())["provenance"]["search"]["best_uniform_fitness"]

    path = resolve_model("lpes-tiny-kv")
    tokenizer, model = load_tokenizer(path), AutoModelForCausalLM.from_pretrained(path).eval()

    def forced(example):
        prompt, answer = encode_prompt(tokenizer, example.prompt), answer_ids(tokenizer, example.prompt, example.answer)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + answer[:-1]])).logits[0, -len(answer):]
        return logits.argmax(-1).tolist() == answer

    assert fitness == pytest.approx(sum(forced(target) for target, _ in made) / len(made))
    assert any(target.answer in text.split() and not forced(target) for target, text in made[1::2])
