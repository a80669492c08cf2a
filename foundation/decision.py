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
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from lpes.foundation.errors import LpesError
from lpes.foundation.rope_schemes import SCHEMES
from lpes.foundation.spec_fields import (
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_SCALE,
    MIN_SCALE,
    STOCK_ROPE_TYPES,
    check_keys,
    is_int,
    is_number,
    one_line_text,
    show,
)

# per-type: one scale on the layers of full attention, the sliding-window ones unscaled (Gemma 3): stock config
# on a model with one RoPE per layer type, as one scale everywhere is.
LEVELS = {"unscaled": 0, "uniform": 1, "stock": 1, "per-type": 1, "per-layer": 2}
DEFAULT_ALPHA = 0.05
DETECTABLE_POINTS = 5.0  # the gain a held-out set must be able to show, in points of accuracy
# The least mean excess of next-token loss over a rung, in nats a token, that counts as a break at a longer length
# (validation/length_probe.py): any RoPE change costs a little everywhere (SmolLM2's s = 0.75: 0.01-0.05 below 6k).
LENGTH_MARGIN = 0.05
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

    @property
    def ahead(self) -> bool:
        return self.only_this > self.only_simpler or self.middle_only_this > self.middle_only_simpler

    def to_json(self) -> dict[str, Any]:
        return {"simpler": self.simpler, "only_this": self.only_this, "only_simpler": self.only_simpler,
                "p": self.p, "middle_only_this": self.middle_only_this,
                "middle_only_simpler": self.middle_only_simpler, "middle_p": self.middle_p}


def compare(this: Candidate, simpler: Candidate, middle: Sequence[bool]) -> Comparison:
    a, b, p = mcnemar(this.verdicts, simpler.verdicts)
    mid_this = [v for v, m in zip(this.verdicts, middle) if m]
    mid_simpler = [v for v, m in zip(simpler.verdicts, middle) if m]
    return Comparison(simpler.name, a, b, p, *mcnemar(mid_this, mid_simpler))


@dataclass(frozen=True)
class Row:
    """One candidate's line of the decision table: its verdicts, its accuracy, and its test against each simpler
    candidate (`against`, in the table's order)."""

    name: str
    kind: str
    rope_type: str | None
    factor: float | None
    scales: tuple[float, ...] | None
    verdicts: str  # "1" right, "0" wrong, one character per held-out prompt
    all: float  # accuracy in %, rounded to 2 places
    middle: float
    right: int
    middle_right: int
    against: tuple[Comparison, ...]

    @property
    def level(self) -> int:
        return LEVELS[self.kind]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "rope_type": self.rope_type, "factor": self.factor,
                "scales": list(self.scales) if self.scales else None, "verdicts": self.verdicts,
                "all": self.all, "middle": self.middle, "right": self.right, "middle_right": self.middle_right,
                "against": [a.to_json() for a in self.against]}


@dataclass(frozen=True)
class Ship:
    """What the decision ships: a row's name, kind, RoPE type and factor."""

    name: str
    kind: str
    rope_type: str | None
    factor: float | None
    max_length: int | None = None  # the longest prompt it was checked to hold at, where that limits it; None: none

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "kind": self.kind, "rope_type": self.rope_type, "factor": self.factor}
        return out if self.max_length is None else {**out, "max_length": self.max_length}


@dataclass(frozen=True)
class RungCheck:
    """A candidate against the unscaled model over the positions (previous rung, `length`] of the length probe
    (validation/length_probe.py): the mean loss excess and the sign test of its paired blocks."""

    length: int
    excess: float  # mean next-token loss, candidate minus unscaled, nats a token
    worse: int  # blocks where the candidate's mean loss is higher
    better: int
    p: float  # binomial_p(worse, better)

    def breaks(self, alpha: float) -> bool:
        return self.worse > self.better and self.p < alpha and self.excess >= LENGTH_MARGIN

    def to_json(self) -> dict[str, Any]:
        return {"length": self.length, "excess": self.excess, "worse": self.worse, "better": self.better, "p": self.p}

    def line(self) -> str:
        return (f"at {self.length:,} tokens {self.excess:+.2f} nats/token over unscaled "
                f"({self.worse}/{self.better} blocks worse/better, p = {self.p:.2g})")


@dataclass(frozen=True)
class Lengths:
    """The ladder of lengths a decision covers: each candidate checked against the unscaled model at every rung
    from the search length up to the longest prompt the shipped model serves, or as far as the run could go."""

    search: int  # tokens of the longest held-out prompt: where the verdicts decided
    serve: int  # the longest prompt the shipped model is meant to serve (lpes-search --serve-length)
    trained: int  # the model's max_position_embeddings
    checked: int  # the longest rung checked: `serve`, unless time or memory stopped the ladder first
    probe: str  # what was measured, in words
    checks: tuple[tuple[str, tuple[RungCheck, ...]], ...]  # candidate name -> its rungs (the unscaled model: none)
    stopped: str | None = None  # why the ladder stopped below `serve`

    def broken(self, alpha: float) -> dict[str, RungCheck]:
        """Each candidate that breaks at a rung, with the first rung it breaks at."""
        out = {}
        for name, rungs in self.checks:
            first = next((r for r in rungs if r.breaks(alpha)), None)
            if first is not None:
                out[name] = first
        return out

    def limit(self, kind: str) -> int | None:
        """The longest prompt a shipped `kind` may be served at, where it is below the model's own length: the
        serving length asked for, or the last rung checked. The unscaled model needs none."""
        limit = min(self.serve, self.checked)
        return limit if kind != "unscaled" and limit < self.trained else None

    def limit_for(self, row: Row, alpha: float) -> int | None:
        """The longest prompt a folder holding `row` may serve: below the first rung it breaks at (a curve shipped
        over the decision, --ship curve), else as `limit`."""
        rungs = dict(self.checks).get(row.name, ())
        first = next((i for i, r in enumerate(rungs) if r.breaks(alpha)), None)
        if first is None:
            return self.limit(row.kind)
        return rungs[first - 1].length if first > 0 else self.search

    def to_json(self) -> dict[str, Any]:
        return {"search": self.search, "serve": self.serve, "trained": self.trained, "checked": self.checked,
                "probe": self.probe, "checks": {name: [r.to_json() for r in rungs] for name, rungs in self.checks},
                "stopped": self.stopped}


@dataclass(frozen=True)
class Decision:
    """The spec's `provenance.decision`: the table, what ships and the line that says why."""

    alpha: float
    prompts: int
    middle_prompts: int
    rows: tuple[Row, ...]
    ship: Ship
    reason: str
    lengths: Lengths | None = None  # the ladder of lengths; None: decided at the search length alone

    def to_json(self) -> dict[str, Any]:
        out = {"alpha": self.alpha, "prompts": self.prompts, "middle_prompts": self.middle_prompts,
               "rows": [r.to_json() for r in self.rows], "ship": self.ship.to_json(), "reason": self.reason}
        return out if self.lengths is None else {**out, "lengths": self.lengths.to_json()}

    @property
    def shipped_row(self) -> Row:
        return next(r for r in self.rows if r.name == self.ship.name)

    def row_computing(self, scales: Sequence[float], rope_type: str) -> Row | None:
        """The row whose candidate computes these per-layer `scales` under `rope_type` (a spec's), if any: what
        a folder holds, read off its own scales rather than taken from a claim."""
        for row in self.rows:
            if _computes(row, tuple(scales), rope_type):
                return row
        return None


def _computes(row: Row, scales: tuple[float, ...], rope_type: str) -> bool:
    if row.kind in ("per-layer", "per-type"):
        scheme = rope_type if row.kind == "per-layer" else "linear"
        return rope_type == scheme and row.name == candidate_name(row.kind, row.rope_type, row.factor, scheme) and \
            row.scales is not None and len(row.scales) == len(scales) and \
            all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(row.scales, scales))
    factor = 1.0 if row.kind == "unscaled" else row.factor
    wanted_type = "linear" if row.kind in ("unscaled", "uniform") else row.rope_type
    return rope_type == wanted_type and all(math.isclose(s, factor, rel_tol=1e-9) for s in scales)


def candidate_name(kind: str, rope_type: str | None = None, factor: float | None = None,
                   scheme: str | None = None) -> str:
    """The name a candidate has in every table: "unscaled", "uniform s=0.75", "YaRN f=2", "per-layer curve"
    ("per-layer YaRN curve" for a curve applied as YaRN: `scheme`, the spec's rope_type)."""
    if kind == "unscaled":
        return "unscaled"
    if kind == "uniform":
        return f"uniform s={factor:g}"
    if kind == "stock":
        return f"{STOCK_ROPE_TYPES[rope_type]} f={factor:g}"
    if kind == "per-type":
        return f"full-attention layers s={factor:g}"
    return "per-layer curve" if scheme in (None, "linear") else f"per-layer {STOCK_ROPE_TYPES[scheme]} curve"


def decide(candidates: Sequence[Candidate], middle: Sequence[bool], alpha: float = DEFAULT_ALPHA,
           lengths: Lengths | None = None) -> Decision:
    """The decision (the spec's `decision`): the table, what to ship and why in one line. With `lengths`, a
    candidate that breaks at any rung of the ladder is not shipped (nor does it keep a simpler one out)."""
    check_alpha(alpha)
    if not candidates or candidates[0].kind != "unscaled":
        raise ValueError("the first candidate is the unscaled model")
    rows = tuple(_row(c, candidates, middle) for c in candidates)
    chosen, reason = decided(rows, alpha, len(middle), sum(middle), lengths)
    limit = lengths.limit(chosen.kind) if lengths else None
    return Decision(alpha, len(middle), sum(middle), rows, Ship(chosen.name, chosen.kind, chosen.rope_type,
                                                                chosen.factor, limit), reason, lengths)


def decided(rows: Sequence[Row], alpha: float, prompts: int, middle_prompts: int,
            lengths: Lengths | None = None) -> tuple[Row, str]:
    """The row the rule ships and the line that says why, from the table alone (so a decision read from a file
    is checked against its own table)."""
    if prompts < smallest_detectable(alpha):
        return rows[0], (f"{prompts} held-out prompts cannot show a {DETECTABLE_POINTS:g}-point gain at p < {alpha:g} "
                         f"(it takes {smallest_detectable(alpha)}): shipping the unscaled model; hold out more prompts")
    broken = lengths.broken(alpha) if lengths else {}
    # A stock type vLLM computes otherwise (rope_schemes.py); a row of unknown type (validation's own table names
    # its baselines only) is taken as served alike.
    unservable = {r.name for r in rows if r.kind == "stock" and r.rope_type in SCHEMES
                  and not SCHEMES[r.rope_type].vllm_same}
    eligible = [r for r in rows if r.name not in broken and r.name not in unservable]
    chosen, reason = _choose(rows, eligible, alpha, prompts, middle_prompts)
    unchecked = _choose(rows, rows, alpha, prompts, middle_prompts)[0]
    if unchecked is not chosen:  # what the search length alone would ship breaks longer, or means two models
        if unchecked.name in broken:
            held = lengths.limit_for(unchecked, alpha) if unchecked.name not in unservable else None
            why = broken[unchecked.name].line() + (
                f" (it holds up to {held:,}: --serve-length {held} ships it with that limit)" if held else "")
        else:
            why = f"vLLM computes it otherwise ({SCHEMES[unchecked.rope_type].vllm})"
        reason = f"{unchecked.name} not shipped: {why}; {reason}"
    if lengths and lengths.checked < lengths.serve:
        reason += f"; checked up to {lengths.checked:,} tokens ({lengths.stopped})"
    return chosen, reason


def _choose(rows: Sequence[Row], eligible: Sequence[Row], alpha: float, prompts: int,
            middle_prompts: int) -> tuple[Row, str]:
    """The simplest level's best eligible candidate that no more complex eligible candidate beats, and the line
    that says why (`rows`: the whole table, which each row's tests against the simpler ones follow)."""
    best: dict[int, Row] = {}
    for row in eligible:  # each level's best: all, then middle; a tie keeps the earlier
        if row.level not in best or (row.right, row.middle_right) > (best[row.level].right,
                                                                     best[row.level].middle_right):
            best[row.level] = row
    levels = sorted(best)
    gain = _gain_line(prompts, middle_prompts)
    for level in levels:
        option = best[level]
        rivals = [(r, _versus(rows, r, option)) for r in eligible if r.level > level]
        if any(cmp.beats(alpha) for _, cmp in rivals):
            continue
        if rivals:
            # The rival nearest to winning: one ahead on all or middle prompts before one behind, then by p.
            rival, cmp = min(rivals, key=lambda item: (not item[1].ahead, min(item[1].p, item[1].middle_p)))
            return option, f"{option.name} shipped; {rival.name} not: {gain(rival, option, cmp)}"
        below = best[max(lv for lv in levels if lv < level)] if level > levels[0] else None
        if below is None:
            alone = "the only candidate" if len(eligible) == len(rows) else "the only one that holds"
            return option, f"{option.name} shipped: {alone}"
        return option, f"{option.name} shipped: {gain(option, below, _versus(rows, option, below))}"
    raise AssertionError("the most complex level is never beaten")


def _versus(rows: Sequence[Row], this: Row, simpler: Row) -> Comparison:
    """`this` row's test against `simpler` (its `against` follows the table's simpler rows in order)."""
    lower = [r for r in rows if r.level < this.level]
    return next(cmp for r, cmp in zip(lower, this.against) if r is simpler)


def _gain_line(prompts: int, middle_prompts: int):
    def gain(this: Row, other: Row, cmp: Comparison) -> str:
        """"+1.6 in the middle over uniform s=0.75, p = 0.79": where `this` gained more surely, and its p."""
        if cmp.middle_p < cmp.p:
            points = 100 * (this.middle_right - other.middle_right) / max(1, middle_prompts)
            return f"{points:+.1f} in the middle over {other.name}, p = {cmp.middle_p:.2g}"
        points = 100 * (this.right - other.right) / max(1, prompts)
        return f"{points:+.1f} overall over {other.name}, p = {cmp.p:.2g}"
    return gain


def _row(c: Candidate, candidates: Sequence[Candidate], middle: Sequence[bool]) -> Row:
    middle_right = sum(v for v, m in zip(c.verdicts, middle) if m)
    return Row(c.name, c.kind, c.rope_type, c.factor, tuple(c.scales) if c.scales else None,
               "".join("1" if v else "0" for v in c.verdicts),
               round(100 * sum(c.verdicts) / max(1, len(c.verdicts)), 2),
               round(100 * middle_right / max(1, sum(middle)), 2), sum(c.verdicts), middle_right,
               tuple(compare(c, other, middle) for other in candidates if other.level < c.level))


def format_table(decision: Decision, label: str = "Decision", shipped: str | None = None,
                 escape: bool = True) -> list[str]:
    """The decision as Markdown: one row per candidate, its p against each simpler one, then the reason.
    `shipped`: the row a folder holds where it is not the decision's (`--ship curve`); that row is marked
    shipped and the decision's row "decided". `escape` False: the reason as it is (a terminal's, for a decision
    just made, not read from a file)."""
    shipped = decision.ship.name if shipped is None else shipped
    lines = [f"| candidate | all ({decision.prompts}) | middle ({decision.middle_prompts}) | "
             "vs simpler: only this / only simpler, p (all; middle) |", "|---|---:|---:|---|"]
    for row in decision.rows:
        against = "; ".join(f"{a.simpler}: {a.only_this}/{a.only_simpler}, p = {a.p:.2g}; "
                            f"{a.middle_only_this}/{a.middle_only_simpler}, p = {a.middle_p:.2g}"
                            for a in row.against) or "-"
        mark = " **(shipped)**" if row.name == shipped else " **(decided)**" if row.name == decision.ship.name else ""
        lines.append(f"| {row.name}{mark} | {row.all:.1f} | {row.middle:.1f} | {against} |")
    lines.append("")
    if decision.lengths is not None:
        lines += ladder_table(decision.lengths, decision.alpha, escape) + [""]
    reason = markdown_text(decision.reason) if escape else decision.reason
    lines.append(f"{label} (McNemar's exact test, alpha {decision.alpha:g}): {reason}")
    return lines


def ladder_table(lengths: Lengths, alpha: float, escape: bool = True) -> list[str]:
    """Each candidate at each rung of the ladder of lengths: its loss excess over the unscaled model, and where
    it breaks (foundation/decision.py RungCheck). `escape` False: the probe's words as they are (a terminal's)."""
    rungs = sorted({r.length for _, checks in lengths.checks for r in checks})
    checked = f"checked up to {lengths.checked:,} of {lengths.serve:,} tokens" if lengths.checked < lengths.serve \
        else f"checked up to {lengths.serve:,} tokens"
    probe = markdown_text(lengths.probe) if escape else lengths.probe
    lines = [f"Lengths ({probe}; nats/token over unscaled, {checked}):", "",
             "| candidate | " + " | ".join(f"{r:,}" for r in rungs) + " |", "|---|" + "---:|" * len(rungs)]
    for name, checks in lengths.checks:
        by_length = {r.length: r for r in checks}
        cells = [("-" if r not in by_length else f"{by_length[r].excess:+.2f}"
                  + (" **breaks**" if by_length[r].breaks(alpha) else "")) for r in rungs]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def markdown_text(text: str) -> str:
    """`text` (one printable line, maybe from a file) as Markdown shows it literally: no link, tag, table cell
    or emphasis it could open."""
    return "".join("\\" + c if c in MARKDOWN_SPECIAL else c for c in text)


MARKDOWN_SPECIAL = set("\\`*_[]<>|#!~")


# ---- reading a decision back (the spec's provenance.decision): every field typed and checked ----

WHERE = "provenance.decision"
DECISION_KEYS = ("alpha", "prompts", "middle_prompts", "rows", "ship", "reason", "lengths")
SHIP_KEYS = ("name", "kind", "rope_type", "factor", "max_length")
LENGTHS_KEYS = ("search", "serve", "trained", "checked", "probe", "checks", "stopped")
RUNG_KEYS = ("length", "excess", "worse", "better", "p")
OPTIONAL = {"lengths", "max_length", "stopped"}  # absent in decisions made before the ladder of lengths
ROW_KEYS = ("name", "kind", "rope_type", "factor", "scales", "verdicts", "all", "middle", "right", "middle_right",
            "against")
AGAINST_KEYS = ("simpler", "only_this", "only_simpler", "p", "middle_only_this", "middle_only_simpler", "middle_p")
MAX_ROWS = 64
MAX_PROMPTS = 1_000_000


def parse_decision(data: Any) -> Decision | None:
    """A decision read from a file, or LpesError naming the first field that is wrong: each field's type and
    range, each row's name, kind, factor and scales consistent, its counts and p values those of its verdicts,
    and what ships the row that its own table's rule picks. None: no decision recorded."""
    if data is None:
        return None
    _object(data, DECISION_KEYS, WHERE)
    alpha = data["alpha"]
    if not (is_number(alpha) and 0 < alpha < 1):
        _refuse("alpha", f"must be a number in (0, 1), got {show(alpha)}")
    prompts = _count(data["prompts"], "prompts", 1, MAX_PROMPTS)
    middle_prompts = _count(data["middle_prompts"], "middle_prompts", 0, prompts)
    if not isinstance(data["rows"], list) or not 1 <= len(data["rows"]) <= MAX_ROWS:
        _refuse("rows", f"must be a list of 1 to {MAX_ROWS} rows, got {show(data['rows'])}")
    rows: list[Row] = []
    for i, entry in enumerate(data["rows"]):
        rows.append(_parse_row(entry, f"rows[{i}]", rows, prompts, middle_prompts))
    if rows[0].kind != "unscaled":
        _refuse("rows[0].kind", f"must be 'unscaled' (the table starts there), got {show(rows[0].kind)}")
    ship = _parse_ship(data["ship"], rows)
    reason = one_line_text(data["reason"], f"{WHERE}.reason")
    lengths = _parse_lengths(data.get("lengths"), rows)
    chosen, _ = decided(rows, float(alpha), prompts, middle_prompts, lengths)
    if chosen.name != ship.name:
        _refuse("ship", f"names {show(ship.name)}, but its own table decides {show(chosen.name)}")
    limit = lengths.limit(ship.kind) if lengths else None
    if ship.max_length != limit:
        _refuse("ship.max_length", f"is {show(ship.max_length)}, but its ladder of lengths gives {show(limit)}")
    return Decision(float(alpha), prompts, middle_prompts, tuple(rows), ship, reason, lengths)


def _parse_lengths(data: Any, rows: list[Row]) -> Lengths | None:
    if data is None:
        return None
    where = "lengths"
    _object(data, LENGTHS_KEYS, f"{WHERE}.{where}")
    search = _count(data["search"], f"{where}.search", 1, MAX_POSITIONS)
    serve = _count(data["serve"], f"{where}.serve", search, MAX_POSITIONS)
    trained = _count(data["trained"], f"{where}.trained", 1, MAX_POSITIONS)
    checked = _count(data["checked"], f"{where}.checked", search, serve)
    probe = one_line_text(data["probe"], f"{WHERE}.{where}.probe")
    stopped = None if data.get("stopped") is None else one_line_text(data["stopped"], f"{WHERE}.{where}.stopped")
    if not isinstance(data["checks"], dict):
        _refuse(f"{where}.checks", f"must be an object, got {show(data['checks'])}")
    names = [r.name for r in rows[1:]]
    if list(data["checks"]) != [n for n in names if n in data["checks"]]:
        _refuse(f"{where}.checks", f"must name rows of the table below the unscaled one, in order, got "
                f"{show(list(data['checks']))}")
    checks = tuple((name, tuple(_parse_rung(r, f"{where}.checks.{name}[{i}]", search, checked)
                                for i, r in enumerate(_list(rungs, f"{where}.checks.{name}"))))
                   for name, rungs in data["checks"].items())
    return Lengths(search, serve, trained, checked, probe, checks, stopped)


def _parse_rung(data: Any, where: str, search: int, checked: int) -> RungCheck:
    _object(data, RUNG_KEYS, f"{WHERE}.{where}")
    length = _count(data["length"], f"{where}.length", search, checked)
    worse = _count(data["worse"], f"{where}.worse", 0, MAX_POSITIONS)
    better = _count(data["better"], f"{where}.better", 0, MAX_POSITIONS)
    if not (is_number(data["excess"]) and math.isfinite(data["excess"])):
        _refuse(f"{where}.excess", f"must be a finite number, got {show(data['excess'])}")
    if not (is_number(data["p"]) and math.isclose(data["p"], binomial_p(worse, better), rel_tol=1e-9,
                                                  abs_tol=1e-300)):
        _refuse(f"{where}.p", f"is {show(data['p'])}, but the sign test of its blocks gives "
                f"{binomial_p(worse, better):.6g}")
    return RungCheck(length, float(data["excess"]), worse, better, float(data["p"]))


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list) or len(value) > 64:
        _refuse(where, f"must be a list of at most 64 rungs, got {show(value)}")
    return value


def _parse_row(entry: Any, where: str, earlier: list[Row], prompts: int, middle_prompts: int) -> Row:
    _object(entry, ROW_KEYS, f"{WHERE}.{where}")
    kind, rope_type, factor = _kind_type_factor(entry, where)
    name = one_line_text(entry["name"], f"{WHERE}.{where}.name")
    scales = entry["scales"]
    if kind == "per-layer":
        scales = tuple(_scales(scales, f"{where}.scales"))
        allowed = [candidate_name("per-layer", scheme=s) for s in ("linear", *STOCK_ROPE_TYPES)]
        if name not in allowed:
            _refuse(f"{where}.name", f"must be one of {', '.join(map(repr, allowed))} for a per-layer row, "
                    f"got {show(name)}")
    elif kind == "per-type":
        scales = tuple(_scales(scales, f"{where}.scales"))
        if set(scales) != {1.0, factor}:
            _refuse(f"{where}.scales", f"must hold its factor {factor:g} (the full-attention layers) and 1 (the "
                    f"others), got {show(list(scales))}")
    else:
        if scales is not None:
            _refuse(f"{where}.scales", f"must be null for a {kind} row, got {show(scales)}")
    if kind != "per-layer" and name != candidate_name(kind, rope_type, factor):
        _refuse(f"{where}.name", f"is {show(name)}, but its kind and factor make it "
                f"{show(candidate_name(kind, rope_type, factor))}")
    if any(r.name == name for r in earlier):
        _refuse(f"{where}.name", f"{show(name)} appears twice in the table")
    verdicts = entry["verdicts"]
    if not (isinstance(verdicts, str) and len(verdicts) == prompts and set(verdicts) <= {"0", "1"}):
        _refuse(f"{where}.verdicts", f"must be a string of {prompts} '0'/'1' characters, got {show(verdicts)}")
    right = verdicts.count("1")
    if _count(entry["right"], f"{where}.right", 0, prompts) != right:
        _refuse(f"{where}.right", f"is {entry['right']}, but its verdicts hold {right} right")
    middle_right = _count(entry["middle_right"], f"{where}.middle_right", 0, min(right, middle_prompts))
    _accuracy(entry["all"], 100 * right / prompts, f"{where}.all")
    _accuracy(entry["middle"], 100 * middle_right / max(1, middle_prompts), f"{where}.middle")
    row = Row(name, kind, rope_type, factor, scales, verdicts, float(entry["all"]), float(entry["middle"]), right,
              middle_right, ())
    lower = [r for r in earlier if r.level < row.level]
    return replace(row, against=_parse_against(entry["against"], f"{where}.against", row, lower))


def _parse_against(entries: Any, where: str, row: Row, lower: list[Row]) -> tuple[Comparison, ...]:
    if not isinstance(entries, list) or len(entries) != len(lower):
        _refuse(where, f"must list the {len(lower)} simpler rows above it, got {show(entries)}")
    out = []
    for i, (entry, simpler) in enumerate(zip(entries, lower)):
        here = f"{where}[{i}]"
        _object(entry, AGAINST_KEYS, f"{WHERE}.{here}")
        if entry["simpler"] != simpler.name:
            _refuse(f"{here}.simpler", f"must be {show(simpler.name)} (the table's order), "
                    f"got {show(entry['simpler'])}")
        only_this = sum(a == "1" and b == "0" for a, b in zip(row.verdicts, simpler.verdicts))
        only_simpler = sum(a == "0" and b == "1" for a, b in zip(row.verdicts, simpler.verdicts))
        for key, value in (("only_this", only_this), ("only_simpler", only_simpler)):
            if _count(entry[key], f"{here}.{key}", 0, row.right + simpler.right) != value:
                _refuse(f"{here}.{key}", f"is {entry[key]}, but the two rows' verdicts give {value}")
        middle = [_count(entry[key], f"{here}.{key}", 0, limit) for key, limit in
                  (("middle_only_this", only_this), ("middle_only_simpler", only_simpler))]
        for key, counts in (("p", (only_this, only_simpler)), ("middle_p", middle)):
            if not (is_number(entry[key]) and math.isclose(entry[key], binomial_p(*counts), rel_tol=1e-9,
                                                            abs_tol=1e-300)):
                _refuse(f"{here}.{key}", f"is {show(entry[key])}, but McNemar's test of its counts gives "
                        f"{binomial_p(*counts):.6g}")
        out.append(Comparison(simpler.name, only_this, only_simpler, float(entry["p"]), *middle,
                              float(entry["middle_p"])))
    return tuple(out)


def _parse_ship(entry: Any, rows: list[Row]) -> Ship:
    _object(entry, SHIP_KEYS, f"{WHERE}.ship")
    kind, rope_type, factor = _kind_type_factor(entry, "ship")
    name = entry["name"]
    row = next((r for r in rows if r.name == name), None)
    if row is None:
        _refuse("ship.name", f"{show(name)} is no row of the decision's table")
    if (row.kind, row.rope_type, row.factor) != (kind, rope_type, factor):
        _refuse("ship", f"says {kind} {rope_type} {factor}, but its row {show(name)} says "
                f"{row.kind} {row.rope_type} {row.factor}")
    limit = entry.get("max_length")
    if limit is not None:
        _count(limit, "ship.max_length", 1, MAX_POSITIONS)
    return Ship(name, kind, rope_type, factor, limit)


SHIP_TYPES = {"unscaled": (None,), "uniform": ("linear",), "stock": tuple(STOCK_ROPE_TYPES), "per-type": ("linear",),
              "per-layer": (None,)}


def _kind_type_factor(entry: dict, where: str) -> tuple[str, str | None, float | None]:
    kind, rope_type, factor = entry["kind"], entry["rope_type"], entry["factor"]
    if not isinstance(kind, str) or kind not in SHIP_TYPES:
        _refuse(f"{where}.kind", f"must be one of {', '.join(SHIP_TYPES)}, got {show(kind)}")
    if rope_type not in SHIP_TYPES[kind]:
        _refuse(f"{where}.rope_type", f"must be {' or '.join(map(str, SHIP_TYPES[kind]))} for a {kind} "
                f"row, got {show(rope_type)}")
    if kind in ("unscaled", "per-layer"):
        if factor is not None:
            _refuse(f"{where}.factor", f"must be null for a {kind} row, got {show(factor)}")
        return kind, rope_type, None
    least = 1.0 if kind == "stock" else MIN_SCALE
    if not (is_number(factor) and least <= factor <= MAX_SCALE):
        _refuse(f"{where}.factor", f"must be a scale in [{least:g}, {MAX_SCALE:g}] for a {kind} row, "
                f"got {show(factor)}")
    return kind, rope_type, float(factor)


def _scales(value: Any, where: str) -> list[float]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_LAYERS or not all(
            is_number(v) and MIN_SCALE <= v <= MAX_SCALE for v in value):
        _refuse(where, f"must be a list of 1 to {MAX_LAYERS} scales in [{MIN_SCALE:g}, {MAX_SCALE:g}], "
                f"got {show(value)}")
    return [float(v) for v in value]


def _object(value: Any, keys: tuple[str, ...], where: str) -> None:
    if not isinstance(value, dict):
        raise LpesError(f"spec: '{where}' must be an object, got {show(value)}")
    check_keys(value, keys, where)
    missing = [k for k in keys if k not in value and k not in OPTIONAL]
    if missing:
        raise LpesError(f"spec: '{where}' lacks {', '.join(map(repr, missing))}")


def _count(value: Any, where: str, least: int, most: int) -> int:
    if not (is_int(value) and least <= value <= most):
        _refuse(where, f"must be an integer in {least}..{most}, got {show(value)}")
    return value


def _accuracy(value: Any, exact: float, where: str) -> None:
    if not (is_number(value) and abs(value - exact) <= 0.005 + 1e-9):
        _refuse(where, f"is {show(value)}, but its counts give {exact:.2f}")


def _refuse(field: str, what: str) -> NoReturn:
    raise LpesError(f"spec: '{WHERE}.{field}' {what}")
