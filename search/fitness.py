"""Scoring a scale vector on calibration examples with one loaded model per device.

Candidates swap scales in place through the reference patch (`lpes.apply`): the
model is loaded once per device and never reloaded. The one-forward-pass check
(`teacher_forced_correct`) is the default; `method="greedy"` scores by greedy
generation, the paper's way, for the cost benchmark.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lpes.converter.reference import apply
from lpes.spec import Spec
from lpes.validation import scoring
from lpes.validation.examples import Example

METHODS = ("teacher-forced", "greedy")


class ModelEvaluator:
    """Eq. 7 verdicts for chosen examples; `forward_tokens` counts the positions computed."""

    def __init__(self, models: list, tokenizer, examples: list[Example], method: str = "teacher-forced",
                 batch_size: int = 8):
        self.models, self.tokenizer, self.examples = models, tokenizer, examples
        self.method, self.batch_size = method, batch_size
        self.num_examples = len(examples)
        self.forward_tokens = 0
        self._pool = ThreadPoolExecutor(len(models)) if len(models) > 1 else None

    def correct(self, scales: tuple[float, ...], example_ids: list[int]) -> list[bool]:
        spec = Spec.from_scales(list(scales))
        for model in self.models:
            apply(model, spec)
        # Each replica takes an equal, contiguous share of the examples; results come back in order.
        shares = [example_ids[k::len(self.models)] for k in range(len(self.models))]
        runs = [(m, [self.examples[i] for i in share]) for m, share in zip(self.models, shares) if share]
        results = list(self._pool.map(self._score, runs)) if self._pool else [self._score(r) for r in runs]
        verdict = {}
        for share, scores in zip([s for s in shares if s], results):
            self.forward_tokens += scores.forward_tokens
            verdict.update({i: r.correct for i, r in zip(share, scores.results)})
        return [verdict[i] for i in example_ids]

    def _score(self, run) -> scoring.Scores:
        model, examples = run
        if self.method == "greedy":
            return scoring.greedy_correct(model, self.tokenizer, examples, self.batch_size)
        return scoring.teacher_forced_correct(model, self.tokenizer, examples, self.batch_size)


def devices(requested: str | None) -> list[str]:
    """Every visible GPU (one replica each), else the CPU; or the comma-separated list asked for."""
    import torch

    if requested:
        return [d.strip() for d in requested.split(",") if d.strip()]
    if torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return ["cpu"]


def load_replicas(model_path: Path, device_names: list[str], dtype: str = "float32") -> list:
    from lpes.converter.loading import load_model

    return [load_model(model_path, dtype).to(device) for device in device_names]
