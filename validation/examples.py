"""One retrieval example, the unit that search and validation score."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    """A prompt whose correct continuation is `answer`.

    `gold_index` is the position of the needed fact among the `num_pairs` facts in
    the context, so accuracy can be reported by position.
    """

    prompt: str
    answer: str
    gold_index: int
    num_pairs: int
