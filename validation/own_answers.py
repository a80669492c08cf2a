"""The model's own answer form as a likelihood target (`lpes-search --objective answer-logprob`).

`logprob` scores the bare gold value right after the prompt. A chat model does not answer that
way: SmolLM2-135M-Instruct writes `The value corresponding to the key "696853" is 240891.`, and
on it the curve that raised the bare value's likelihood most (every layer at s = 0.80) answered
6.5% of the held-out prompts against 23.0% unscaled, because it changed how the model answers
(it began reciting the JSON), which the bare value's likelihood does not see (README, "The
premise, decided on a real model"). The target here is what the unscaled model itself wrote,
greedy, cut after its value, with the gold value put where its value stands: the objective then
pays for keeping the answer's form as well as for the value.

The value is found in the generated text as the gold itself, else as the last span of the gold's
shape (the same runs of letters and digits between the same separators, with a digit in it: the
benchmark's UUIDs, the real-model task's 6-digit numbers); the last, because the answer names the
key before the value. The answers that held the gold give the model's answer form: an answer of
another form (the unscaled SmolLM2 recites the JSON on most prompts it gets wrong, and a key it
recites has the value's shape) or with no value borrows the form most right answers took, with the
spans of the value's shape in it (the key it named) replaced by this prompt's key, the last such span
of the prompt (the question names the key last). With no right answer, each answer keeps its own
form, or the bare gold value where it wrote no value.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from lpes.validation.examples import Example

# How a target was made, per example; the counts go to the spec's provenance, and to stderr with what they mean.
KEPT, SUBSTITUTED, BORROWED, BARE = "kept", "substituted", "borrowed", "bare"
MEANING = {KEPT: "the answer held the gold value", SUBSTITUTED: "another value replaced by the gold",
           BORROWED: "no value written: the form of the others, with this prompt's key",
           BARE: "no value written and no form to borrow: the bare gold value"}


def gold_shape(gold: str) -> re.Pattern[str] | None:
    """A pattern for values shaped like `gold` (None when gold has no digit: words are not told from values)."""
    if not any(c.isdigit() for c in gold):
        return None
    parts = [f"[0-9A-Za-z]{{{len(run)}}}" if run[0].isalnum() else re.escape(run)
             for run in re.findall(r"[0-9A-Za-z]+|[^0-9A-Za-z]+", gold)]
    return re.compile(r"(?<![0-9A-Za-z])" + "".join(parts) + r"(?![0-9A-Za-z])")


def own_answer_target(generated: str, gold: str) -> tuple[str, str]:
    """The text to teacher-force after the prompt, and how it was made (KEPT, SUBSTITUTED or BARE)."""
    text = generated.lstrip()  # the prompt's separator is added back when the target is tokenized
    at = text.find(gold)
    if at >= 0:
        return text[: at + len(gold)], KEPT
    shape = gold_shape(gold)
    spans = [m for m in shape.finditer(text) if any(c.isdigit() for c in m.group())] if shape else []
    if spans:
        return text[: spans[-1].start()] + gold, SUBSTITUTED
    return gold, BARE


def own_answer_examples(examples: Sequence[Example], generated: Sequence[str]) -> tuple[list[Example], dict[str, int]]:
    """`examples` with each answer replaced by its own-form target, and how many targets were made each way.

    The forms of the answers that held the gold are the model's answer form: a wrong value is replaced only
    in an answer of one of those forms (not in the JSON it recites, whose first key has the value's shape);
    other answers borrow the most common of them. With no right answer, every answer's own form counts.
    """
    made = [own_answer_target(text, e.answer) for e, text in zip(examples, generated, strict=True)]
    forms = [_form(target[: len(target) - len(e.answer)], e.answer) for e, (target, _) in zip(examples, made)]
    right = Counter(form for form, (_, how) in zip(forms, made) if how == KEPT and form)
    counts = dict.fromkeys(MEANING, 0)
    out = []
    for example, (target, how), form in zip(examples, made, forms):
        if right and (how == BARE or (how == SUBSTITUTED and form not in right)):
            target, how = _borrowed(right.most_common(1)[0][0], example), BORROWED
        counts[how] += 1
        out.append(replace(example, answer=target))
    return out, counts


def _form(prefix: str, gold: str) -> str | None:
    """The text an answer writes before its value, with each span of the value's shape (the key) as a NUL."""
    shape = gold_shape(gold)
    return shape.sub("\0", prefix) if shape and "\0" not in prefix else None


def _borrowed(form: str, example: Example) -> str:
    """`form` filled with this example's key (the last span of the value's shape in its prompt) and its gold."""
    shape = gold_shape(example.answer)
    keys = [m.group() for m in shape.finditer(example.prompt)] if shape else []
    return (form.replace("\0", keys[-1]) if keys else form.replace("\0", "")) + example.answer
