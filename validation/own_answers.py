"""The model's own answer form as a likelihood target (`lpes-search --objective answer-logprob`).

`logprob` scores the bare gold value right after the prompt. A chat model does not answer that
way: SmolLM2-135M-Instruct writes `The value corresponding to the key "696853" is 240891.`, and
on it the curve that raised the bare value's likelihood most (every layer at s = 0.80) answered
6.5% of the held-out prompts against 23.0% unscaled, because it changed how the model answers
(it began reciting the JSON), which the bare value's likelihood does not see (README, "The
premise, decided on a real model"). The target here is what the unscaled model itself wrote,
greedy, cut after its value, with the gold value put where its value stands: the objective then
pays for keeping the answer's form as well as for the value.

An answer's value is the first span in it of the gold's shape (the same runs of letters and
digits between the same separators, with a digit in it: the benchmark's UUIDs, the real-model
task's 6-digit numbers) that is not the key the question names (the last such span of the
prompt): SmolLM2 names the key before the value, and Gemma 3 270M writes the value first and then
goes on reciting pairs, one of which may hold the gold. The answers whose value is the gold give
the model's answer form (what they write before it, keys masked). An answer of another form (the
unscaled SmolLM2 recites the JSON on most prompts it gets wrong: its first span is a recited key)
or with no value borrows the form most right answers took, filled with its own prompt's key. With
no right answer, each answer keeps its own form, or the bare gold value where it wrote no value.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from lpes.validation.examples import Example

# How a target was made, per example; the counts go to the spec's provenance, and to stderr with what they mean.
KEPT, SUBSTITUTED, BORROWED, BARE = "kept", "substituted", "borrowed", "bare"
MEANING = {KEPT: "the answer's value was the gold", SUBSTITUTED: "another value replaced by the gold",
           BORROWED: "another form, or no value: the right answers' form with this prompt's key",
           BARE: "no value written and no form to borrow: the bare gold value"}
KEY_MASK = "\0"  # where a form names its prompt's key


def gold_shape(gold: str) -> re.Pattern[str] | None:
    """A pattern for values shaped like `gold` (None when gold has no digit: words are not told from values)."""
    if not any(c.isdigit() for c in gold):
        return None
    parts = [f"[0-9A-Za-z]{{{len(run)}}}" if run[0].isalnum() else re.escape(run)
             for run in re.findall(r"[0-9A-Za-z]+|[^0-9A-Za-z]+", gold)]
    return re.compile(r"(?<![0-9A-Za-z])" + "".join(parts) + r"(?![0-9A-Za-z])")


def question_key(prompt: str, gold: str) -> str | None:
    """The key the prompt's question names: its last span of the gold's shape (None if it has none)."""
    shape = gold_shape(gold)
    keys = [m.group() for m in shape.finditer(prompt)] if shape else []
    return keys[-1] if keys else None


def own_answer_target(generated: str, gold: str, key: str | None = None) -> tuple[str, str]:
    """The text to teacher-force after the prompt, and how it was made (KEPT, SUBSTITUTED or BARE).

    `key`: the question's key, which the answer may name before its value."""
    text = generated.lstrip()  # the prompt's separator is added back when the target is tokenized
    shape = gold_shape(gold)
    if shape is None:  # a word: found as it is, or not at all
        at = text.find(gold)
        return (text[: at + len(gold)], KEPT) if at >= 0 else (gold, BARE)
    value = next((m for m in shape.finditer(text) if m.group() != key and any(c.isdigit() for c in m.group())),
                 None)
    if value is None:
        return gold, BARE
    return text[: value.start()] + gold, KEPT if value.group() == gold else SUBSTITUTED


def own_answer_examples(examples: Sequence[Example], generated: Sequence[str]) -> tuple[list[Example], dict[str, int]]:
    """`examples` with each answer replaced by its own-form target, and how many targets were made each way."""
    keys = [question_key(e.prompt, e.answer) for e in examples]
    made = [own_answer_target(text, e.answer, key) for e, text, key in zip(examples, generated, keys, strict=True)]
    forms = [_form(target[: len(target) - len(e.answer)], key) for e, (target, _), key in zip(examples, made, keys)]
    right = Counter(form for form, (_, how) in zip(forms, made) if how == KEPT)
    counts = dict.fromkeys(MEANING, 0)
    out = []
    for example, (target, how), form, key in zip(examples, made, forms, keys):
        if right and (how == BARE or (how == SUBSTITUTED and form not in right)):
            target, how = right.most_common(1)[0][0].replace(KEY_MASK, key or "") + example.answer, BORROWED
        counts[how] += 1
        out.append(replace(example, answer=target))
    return out, counts


def _form(prefix: str, key: str | None) -> str:
    """What an answer writes before its value, with its prompt's key masked."""
    return prefix.replace(KEY_MASK, "").replace(key, KEY_MASK) if key else prefix.replace(KEY_MASK, "")
