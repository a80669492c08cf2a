"""One retrieval example, the unit that search and validation score."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    """A prompt whose correct continuation is `answer`.

    `gold_index` is the position of the needed fact among the `num_pairs` facts in
    the context, so accuracy can be reported by position.

    `answer_tokens` is the generation budget: None gives the model exactly the answer's own
    token count (the bundled tasks, whose models answer with the value and nothing else); an
    integer lets it write up to that many tokens, in which the value must appear (the
    benchmark generates 100: real chat models open with a newline or "The value is ...").
    """

    prompt: str
    answer: str
    gold_index: int
    num_pairs: int
    answer_tokens: int | None = None
