"""What the optimizer climbs (`lpes-search --objective`): the benchmark's verdicts, or the gold answer's likelihood.

`accuracy` is Eq. 7, the share of calibration examples answered right: what validation reports and
what the held-out check uses. On a model that answers the middle of the prompt 0-5% of the time,
almost every curve gets the same verdicts there, and an optimizer of verdicts walks blind.

`logprob` is continuous: the mean log-likelihood of the gold answer's tokens given the prompt,
teacher-forced in one forward pass (validation/scoring.py, `answer_logprob_batches`), averaged per
gold position first so that each position of the needed fact counts the same (the middle as much
as the ends) however many examples each holds. Per-layer scales enter the model continuously, so
the model also says which way each scale should move (search/gradient.py).

`answer-logprob` is the same likelihood of a different target: the unscaled model's own greedy
answer, cut after its value, with the gold value in its place (validation/own_answers.py). A chat
model answers in a sentence; the bare value's likelihood rewards curves that change that sentence.

`answer-accuracy` is the verdict on that target, teacher-forced: an example is right iff every token
of its own-answer target is the argmax, in one forward pass. Where the task's verdict generates a
whole answer (the real models' 24-token budget) that costs a prompt's prefill and no decoding. On
SmolLM2-135M it is the calibration signal that followed held-out accuracy along the uniform line
(25 / 5 / 15% at s = 0.75 / 0.80 / 1.0, against 31.5 / 6.5 / 23.0 held out), where both likelihoods
peaked at 0.80 (bench/RESULTS.md). It is a verdict: raced, and climbed by the GA or CMA-ES. Its
targets keep the unscaled model's form: on Gemma 3 270M, where s = 0.75 makes the model quote the
value it wrote bare, it keeps s = 1 while the generated verdicts find 0.75 (37.0 against 24.0 held out).
"""

from __future__ import annotations

from collections.abc import Sequence

OBJECTIVES = ("accuracy", "answer-accuracy", "logprob", "answer-logprob")
# The objectives that are a likelihood: climbed by CMA-ES on every example, or by the gradient.
LIKELIHOODS = ("logprob", "answer-logprob")
# The objectives whose targets are the unscaled model's own answers (validation/own_answers.py).
OWN_ANSWERS = ("answer-accuracy", "answer-logprob")


def gold_weights(gold_indices: Sequence[int]) -> list[float]:
    """Each example's weight in the objective: 1 / (gold positions x examples at its position); they sum to 1."""
    counts: dict[int, int] = {}
    for gold in gold_indices:
        counts[gold] = counts.get(gold, 0) + 1
    return [1.0 / (len(counts) * counts[gold]) for gold in gold_indices]


def weighted(values: Sequence[float], weights: Sequence[float]) -> float:
    """The objective of per-example values (summed in example order: the same on every layout)."""
    return float(sum(w * v for w, v in zip(weights, values, strict=True)))
