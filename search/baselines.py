"""The stock RoPE baselines: YaRN and dynamic NTK, each at its best factor on the calibration set.

A per-layer curve should be held against the length extensions every runtime already has,
not only against one linear scale for every layer. Each type is scanned over the search
grid's factors of at least 1 (below 1 neither type extends anything), scored like every
candidate (Eq. 7 on the same calibration examples, by the same replicas). The best factor is
the one with the most right answers; at equal fitness the smaller, gentler one.

Racing is exact here too: factors are scored in ascending order, a chunk of examples at a
time, and a factor is dropped once its right answers plus every example left cannot pass
the best found so far (a tie would go to the smaller factor, which was scored first).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from lpes.foundation.errors import LpesError
from lpes.foundation.spec import STOCK_ROPE_TYPES, StockRope

NONE = "none"


class BaselineResult(TypedDict):
    """One stock type's best factor, as provenance.search.stock_baselines records it."""

    rope_type: str
    factor: float
    fitness: float
    factors_scanned: list[float]
    tokens: int


def parse_baselines(text: str) -> tuple[str, ...]:
    """`yarn,dynamic` -> ("yarn", "dynamic"); `none` -> (); unknown names fail with the known ones."""
    if text.strip() == NONE:
        return ()
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if NONE in names:
        raise LpesError(f"--baselines {text!r}: {NONE} stands alone (it skips the scan)")
    for name in names:
        if name not in STOCK_ROPE_TYPES:
            raise LpesError(f"--baselines: unknown RoPE type {name!r} (known: {', '.join(STOCK_ROPE_TYPES)}, "
                            f"or {NONE})")
    if len(set(names)) != len(names) or not names:
        raise LpesError(f"--baselines {text!r}: name each type once, comma-separated, or pass {NONE}")
    return names


def scan_stock_baselines(evaluator, rope_types: Sequence[str], grid: Sequence[float], chunk: int,
                         progress: bool = True, halving: bool = False, wide_chunk: int = 0) -> list[BaselineResult]:
    """Each of `rope_types` at its best factor among `grid`'s values >= 1, on the evaluator's examples.

    `halving`: successive halving first, as the uniform scan's (search/ga.py `_halve`): every factor on the
    same spread examples, the best third kept, on twice as many; then the exact race among those left.
    `chunk` examples at a time; a factor that must fail more than that before it could be dropped gets that
    many at once, up to `wide_chunk` (as racing's chunks, search/ga.py `_chunk_size`).
    """
    from lpes.search.progress import StepProgress

    factors = sorted(f for f in grid if f >= 1.0)
    if not factors or not rope_types:
        return []
    results = []
    # A progress line from the first chunk on: factors done of all, tokens/s, ETA (search/progress.py).
    bar = StepProgress("lpes-search stock baselines", len(factors) * len(rope_types),
                       len(factors) * len(rope_types) * evaluator.num_examples, lambda: evaluator.forward_tokens,
                       progress, noun="factors")
    try:
        for rope_type in rope_types:
            tokens_before = evaluator.forward_tokens
            best_factor, best_correct = factors[0], -1
            met = _halve(evaluator, rope_type, factors, chunk, bar) if halving else {}
            for factor in [f for f in factors if f not in met or met[f] is not None]:
                correct = _race(evaluator, StockRope(rope_type, factor), best_correct, (chunk, wide_chunk), bar,
                                *(met.get(factor) or (0, set())))
                if correct is not None and correct > best_correct:
                    best_factor, best_correct = factor, correct
                bar.finished(raced_out=correct is None)
            results.append(BaselineResult(rope_type=rope_type, factor=best_factor,
                                          fitness=best_correct / evaluator.num_examples, factors_scanned=factors,
                                          tokens=evaluator.forward_tokens - tokens_before))
    finally:
        bar.close()
    return results


def scan_stock_objective(evaluator, rope_types: Sequence[str], grid: Sequence[float], weights: Sequence[float],
                         progress: bool = True) -> list[BaselineResult]:
    """`scan_stock_baselines` under --objective logprob: each factor's objective on every example (forward
    passes only, several factors at once across the replicas); the best, at a tie the smaller factor."""
    from lpes.search.progress import StepProgress

    factors = sorted(f for f in grid if f >= 1.0)
    results: list[BaselineResult] = []
    bar = StepProgress("lpes-search stock baselines", len(factors) * len(rope_types),
                       len(factors) * len(rope_types) * evaluator.num_examples, lambda: evaluator.forward_tokens,
                       progress, noun="factors")
    everything = list(range(evaluator.num_examples))
    try:
        for rope_type in rope_types:
            tokens_before = evaluator.forward_tokens
            found = evaluator.logprobs_many([(StockRope(rope_type, f), everything) for f in factors])
            objectives = [sum(w * v for w, v in zip(weights, logprobs)) for logprobs, _ in found]
            for _ in factors:
                bar.computed(len(everything))
                bar.finished()
            best = max(range(len(factors)), key=lambda k: (objectives[k], -k))
            results.append(BaselineResult(rope_type=rope_type, factor=factors[best], fitness=objectives[best],
                                          factors_scanned=factors, tokens=evaluator.forward_tokens - tokens_before))
    finally:
        bar.close()
    return results


def _race(evaluator, rope: StockRope, to_beat: int, chunks: tuple[int, int], bar, correct: int = 0,
          met: set[int] = frozenset()) -> int | None:
    """Right answers of `rope` on every example, or None once it cannot pass `to_beat` (going on from `correct`
    right answers on the examples `met`); `chunks`: (chunk, wide chunk), scan_stock_baselines's."""
    total = evaluator.num_examples
    left = [i for i in range(total) if i not in met]
    bar.begin(rope.name)
    while left:
        margin = correct + len(left) - to_beat  # the failures before it could be dropped: none wasted
        if margin <= 0:
            bar.skipped(len(left))
            return None
        size = max(chunks[0], min(chunks[1], margin))
        ids, left = left[:size], left[size:]
        correct += sum(evaluator.correct(rope, ids))
        bar.computed(len(ids))
    return correct


def _halve(evaluator, rope_type: str, factors: list[float], chunk: int, bar) -> dict[float, tuple | None]:
    """factor -> (right answers, examples met) of the factors successive halving keeps, None for those it drops."""
    from lpes.search.ga import HALVING_LEFT, spread

    total = evaluator.num_examples
    met: dict[float, tuple | None] = {f: (0, set()) for f in factors}
    alive, size = list(factors), min(chunk, total)
    while len(alive) > HALVING_LEFT and 2 * size <= total:
        ids = spread(total, size)
        for factor in alive:
            correct, done = met[factor]
            todo = [i for i in ids if i not in done]
            met[factor] = (correct + sum(evaluator.correct(StockRope(rope_type, factor), todo)), done | set(todo))
            bar.computed(len(todo))
        alive.sort(key=lambda f: (-met[f][0], f))  # at a tie the smaller factor, as the race's
        keep = max(HALVING_LEFT, -(-len(alive) // 3))
        for factor in alive[keep:]:
            bar.skipped(total - len(met[factor][1]))
            bar.finished(raced_out=True)
            met[factor] = None
        alive, size = alive[:keep], 2 * size
    return met


def describe(results: list[BaselineResult]) -> str:
    """One line for the log: each type's best factor and calibration fitness."""
    return "; ".join(f"{StockRope(r['rope_type'], r['factor']).name} best on calibration ({r['fitness']:.3f})"
                     for r in results)
