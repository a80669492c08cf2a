"""What to ship, decided on held-out prompts: McNemar's exact test between the candidates, simplest first.

The candidates are what a search considered, from the simplest: the unscaled model (level 0); one change
every runtime has, the best uniform scale or a stock RoPE extension at its best factor (level 1); the
per-layer curve (level 2, custom code). Each has a verdict per held-out prompt, all on the same prompts.

A candidate *beats* a simpler one when it answers more prompts and McNemar's exact test (the two-sided
binomial test of the discordant prompts: right with one, wrong with the other) gives p < alpha, on all
prompts or on the middle ones (gold 25-75% of the context, where "lost in the middle" is lost), without
being significantly worse on the other. The decision is the simplest candidate that no more complex one
beats; within a level, the most accurate (all, then middle; a tie goes to the earlier, the gentler kind).

With too few held-out prompts the test cannot detect a 5-point gain even when every discordant prompt
goes one way; the decision is then the unscaled model, and its reason says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lpes.foundation.errors import LpesError

LEVELS = {"unscaled": 0, "uniform": 1, "stock": 1, "per-layer": 2}
DEFAULT_ALPHA = 0.05
DETECTABLE_POINTS = 5.0  # the gain a held-out set must be able to show, in points of accuracy
MIDDLE = (0.25, 0.75)  # gold index / (pairs - 1): the middle of the context


@dataclass(frozen=True)
class Candidate:
    """One option the search considered, with its verdict on every held-out prompt."""

    name: str  # as tables show it: "unscaled", "uniform s=0.75", "YaRN f=2", "per-layer curve"
    kind: str  # a key of LEVELS
    verdicts: tuple[bool, ...]
    rope_type: str | None = None  # uniform: "linear"; stock: "yarn" | "dynamic"; else None
    factor: float | None = None  # uniform: the scale; stock: the factor
    scales: tuple[float, ...] | None = None  # per-layer: the curve's scale in each layer

    @property
    def level(self) -> int:
        return LEVELS[self.kind]


def mcnemar(a: Sequence[bool], b: Sequence[bool]) -> tuple[int, int, float]:
    """(right only with a, right only with b, McNemar's exact two-sided p)."""
    if len(a) != len(b):
        raise ValueError(f"verdicts on {len(a)} and {len(b)} prompts: not the same prompts")
    only_a = sum(x and not y for x, y in zip(a, b))
    only_b = sum(y and not x for x, y in zip(a, b))
    return only_a, only_b, binomial_p(only_a, only_b)


def binomial_p(k: int, j: int) -> float:
    """Two-sided exact binomial p of k against j at probability 1/2 (exact integers, then one division)."""
    n = k + j
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(k, j) + 1))
    return min(1.0, 2 * tail / 2**n)


def in_middle(gold_index: int, num_pairs: int) -> bool:
    """The needed fact sits at 25-75% of the context."""
    low, high = MIDDLE
    return num_pairs > 1 and low <= gold_index / (num_pairs - 1) <= high


def check_alpha(alpha: float) -> float:
    """--alpha: a significance level in (0, 1)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise LpesError(f"--alpha must be in (0, 1), got {alpha!r}")
    return float(alpha)


def check_positions(positions: Sequence[tuple[int, int]], where: str) -> None:
    """The held-out prompts (gold index, pairs) put the needed fact at more than one position: one position
    says nothing of the middle against the ends. (Several positions none of which is in the middle: the
    decision runs on all prompts, its middle column empty.)"""
    golds = {g / max(1, n - 1) for g, n in positions}
    if len(golds) == 1:
        gold, pairs = positions[0]
        raise LpesError(f"{where}: every held-out prompt has its gold at position {gold} of {pairs}, so the decision "
                        "cannot hold the middle against the ends; give several gold positions, first to last "
                        "(e.g. gold=0+9+19 for 20 pairs)")


def smallest_detectable(alpha: float, points: float = DETECTABLE_POINTS) -> int:
    """The fewest prompts on which a gain of `points` can reach p < alpha (every discordant prompt one way)."""
    # p = 2 / 2^d for d discordant prompts all one way; d = points% of n.
    needed = math.floor(1 - math.log2(alpha)) + 1
    return math.ceil(needed * 100 / points)


@dataclass(frozen=True)
class Comparison:
    """A candidate held against a simpler one: discordant prompts and p, all and middle."""

    simpler: str
    only_this: int
    only_simpler: int
    p: float
    middle_only_this: int
    middle_only_simpler: int
    middle_p: float

    def beats(self, alpha: float) -> bool:
        ahead_all = self.only_this > self.only_simpler and self.p < alpha
        ahead_middle = self.middle_only_this > self.middle_only_simpler and self.middle_p < alpha
        behind_all = self.only_simpler > self.only_this and self.p < alpha
        behind_middle = self.middle_only_simpler > self.middle_only_this and self.middle_p < alpha
        return (ahead_all and not behind_middle) or (ahead_middle and not behind_all)


def compare(this: Candidate, simpler: Candidate, middle: Sequence[bool]) -> Comparison:
    a, b, p = mcnemar(this.verdicts, simpler.verdicts)
    mid_this = [v for v, m in zip(this.verdicts, middle) if m]
    mid_simpler = [v for v, m in zip(simpler.verdicts, middle) if m]
    return Comparison(simpler.name, a, b, p, *mcnemar(mid_this, mid_simpler))


def decide(candidates: Sequence[Candidate], middle: Sequence[bool], alpha: float = DEFAULT_ALPHA) -> dict[str, Any]:
    """The decision (the spec's `decision`): the table, what to ship and why in one line."""
    check_alpha(alpha)
    if not candidates or candidates[0].kind != "unscaled":
        raise ValueError("the first candidate is the unscaled model")
    prompts = len(middle)
    rows = [_row(c, candidates, middle) for c in candidates]
    chosen, reason = _choose(candidates, middle, alpha)
    if prompts < smallest_detectable(alpha):
        chosen = candidates[0]
        reason = (f"{prompts} held-out prompts cannot show a {DETECTABLE_POINTS:g}-point gain at p < {alpha:g} "
                  f"(it takes {smallest_detectable(alpha)}): shipping the unscaled model; hold out more prompts")
    return {"alpha": alpha, "prompts": prompts, "middle_prompts": sum(middle), "rows": rows,
            "ship": {"name": chosen.name, "kind": chosen.kind, "rope_type": chosen.rope_type,
                     "factor": chosen.factor},
            "reason": reason}


def _choose(candidates: Sequence[Candidate], middle: Sequence[bool], alpha: float) -> tuple[Candidate, str]:
    """The simplest level's best candidate that no more complex candidate beats, and the line that says why."""
    best = {}
    for c in candidates:  # each level's best: all, then middle; a tie keeps the earlier
        if c.level not in best or (sum(c.verdicts), _middle_right(c, middle)) > (
                sum(best[c.level].verdicts), _middle_right(best[c.level], middle)):
            best[c.level] = c
    levels = sorted(best)
    for level in levels:
        option = best[level]
        rivals = [(c, compare(c, option, middle)) for c in candidates if c.level > level]
        if any(cmp.beats(alpha) for _, cmp in rivals):
            continue
        if rivals:
            # The rival nearest to winning: one ahead on all or middle prompts before one behind, then by p.
            rival, cmp = min(rivals, key=lambda item: (not _ahead(item[1]), min(item[1].p, item[1].middle_p)))
            return option, f"{option.name} shipped; {rival.name} not: {_gain(rival, option, cmp, middle)}"
        below = best[max(lv for lv in levels if lv < level)] if level > levels[0] else None
        if below is None:
            return option, f"{option.name} shipped: the only candidate"
        cmp = compare(option, below, middle)
        return option, f"{option.name} shipped: {_gain(option, below, cmp, middle)}"
    raise AssertionError("the most complex level is never beaten")


def _ahead(cmp: Comparison) -> bool:
    return cmp.only_this > cmp.only_simpler or cmp.middle_only_this > cmp.middle_only_simpler


def _gain(this: Candidate, other: Candidate, cmp: Comparison, middle: Sequence[bool]) -> str:
    """"+1.6 in the middle over uniform s=0.75, p = 0.79": where `this` gained more surely, and its p."""
    if cmp.middle_p < cmp.p:
        gain, where, p = _middle_accuracy(this, middle) - _middle_accuracy(other, middle), "in the middle", cmp.middle_p
    else:
        gain, where, p = 100 * (sum(this.verdicts) - sum(other.verdicts)) / max(1, len(middle)), "overall", cmp.p
    return f"{gain:+.1f} {where} over {other.name}, p = {p:.2g}"


def _middle_right(c: Candidate, middle: Sequence[bool]) -> int:
    return sum(v for v, m in zip(c.verdicts, middle) if m)


def _middle_accuracy(c: Candidate, middle: Sequence[bool]) -> float:
    return 100 * _middle_right(c, middle) / max(1, sum(middle))


def _row(c: Candidate, candidates: Sequence[Candidate], middle: Sequence[bool]) -> dict[str, Any]:
    simpler = [compare(c, other, middle) for other in candidates if other.level < c.level]
    return {"name": c.name, "kind": c.kind, "rope_type": c.rope_type, "factor": c.factor,
            "scales": list(c.scales) if c.scales else None, "verdicts": "".join("1" if v else "0" for v in c.verdicts),
            "all": round(100 * sum(c.verdicts) / max(1, len(c.verdicts)), 2),
            "middle": round(_middle_accuracy(c, middle), 2),
            "right": sum(c.verdicts), "middle_right": _middle_right(c, middle),
            "against": [{"simpler": s.simpler, "only_this": s.only_this, "only_simpler": s.only_simpler,
                         "p": s.p, "middle_only_this": s.middle_only_this,
                         "middle_only_simpler": s.middle_only_simpler, "middle_p": s.middle_p} for s in simpler]}


def format_table(decision: dict[str, Any], label: str = "Decision") -> list[str]:
    """The decision as Markdown: one row per candidate, its p against each simpler one, then the reason."""
    lines = [f"| candidate | all ({decision['prompts']}) | middle ({decision['middle_prompts']}) | "
             "vs simpler: only this / only simpler, p (all; middle) |", "|---|---:|---:|---|"]
    for row in decision["rows"]:
        against = "; ".join(f"{a['simpler']}: {a['only_this']}/{a['only_simpler']}, p = {a['p']:.2g}; "
                            f"{a['middle_only_this']}/{a['middle_only_simpler']}, p = {a['middle_p']:.2g}"
                            for a in row["against"]) or "-"
        shipped = " **(shipped)**" if row["name"] == decision["ship"]["name"] else ""
        lines.append(f"| {row['name']}{shipped} | {row['all']:.1f} | {row['middle']:.1f} | {against} |")
    lines.append("")
    lines.append(f"{label} (McNemar's exact test, alpha {decision['alpha']:g}): {decision['reason']}")
    return lines
