"""The spec's provenance, typed: where the scales came from, as lpes-search and lpes-convert recorded it.

The format is free-form beyond the fields other stages read; those are typed and checked once, when the spec is
read (`Provenance.parse`), and read as fields everywhere after (`spec.provenance.base_model`,
`spec.provenance.search.calibration_examples`, ...). The object as the file holds it is kept (`raw`) and written
back unchanged (`to_json`), so a spec read and written again is the same bytes; `updated` sets top-level entries
(lpes-convert's `base_model`, `shipped`, ...) where a dict assignment would and parses the result again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lpes.foundation.decision import Decision, parse_decision
from lpes.foundation.errors import LpesError
from lpes.foundation.rope_schemes import StockRope
from lpes.foundation.spec_fields import check_keys, check_provenance, is_int, is_number, one_line_text, show


@dataclass(frozen=True)
class SearchTask:
    """The task a curve was searched on (`provenance.search.task`): what validation uses by default."""

    data: str | None  # the --data description (a relative file path as given, else its name); None: the default
    chat_template: bool
    answer_tokens: int | None  # the answer budget (TaskConfig.answer_tokens); None: the answer's own tokens
    prompt_tokens: tuple[int, int] | None = None  # shortest and longest calibration prompt, in tokens

    def to_json(self) -> dict[str, Any]:
        return {"data": self.data, "chat_template": self.chat_template, "answer_tokens": self.answer_tokens,
                "prompt_tokens": None if self.prompt_tokens is None else list(self.prompt_tokens)}


@dataclass(frozen=True)
class SearchRecord:
    """`provenance.search`: lpes-search's settings and counts; the fields other stages read, typed."""

    task: SearchTask | None  # what validation scores by default
    data: str | None  # the --data description as recorded (the card names it)
    objective: str | None
    calibration_examples: int | None
    fitness: float | None  # the curve's on the calibration examples (a share, or a mean log-likelihood)
    best_uniform_scale: float | None  # the best single linear scale: the baseline a curve must beat
    best_uniform_fitness: float | None
    stock_baselines: tuple[StockRope, ...]  # each stock type at its best factor on calibration


@dataclass(frozen=True)
class HeldOut:
    """`provenance.held_out`: lpes-search's held-out accuracy before and after (shares; None: not measured)."""

    examples: int | None
    unscaled: float | None
    lpes: float | None


SHIPPED_KEYS = ("ship", "what")


@dataclass(frozen=True)
class Shipped:
    """`provenance.shipped` (lpes-convert's): which of the decision and the curve a folder was made from."""

    ship: str  # "decision" or "curve"
    what: str  # the shipped candidate's name, in words

    def to_json(self) -> dict[str, str]:
        return {"ship": self.ship, "what": self.what}


@dataclass(frozen=True)
class Provenance:
    """The spec's `provenance`, checked: typed fields, and the object as the file holds it (`raw`)."""

    raw: Mapping[str, Any]
    lpes_version: str | None = None
    base_model: str | None = None  # the model the spec was searched on or converted from, as published files name it
    model: Mapping[str, Any] | None = None  # the fingerprint of the model searched on (converter/fingerprint.py)
    search: SearchRecord | None = None
    held_out: HeldOut | None = None
    decision: Decision | None = None  # lpes-search's held-out decision (foundation/decision.py)
    shipped: Shipped | None = None

    @classmethod
    def parse(cls, data: Any) -> Provenance:
        """Check the provenance of a spec read from a file (or built in code); LpesError names the field."""
        data = check_provenance(data if data is not None else {})
        return cls(dict(data), _text(data, "lpes_version"), _text(data, "base_model"), data.get("model"),
                   _search(data.get("search")), _held_out(data.get("held_out")), parse_decision(data.get("decision")),
                   _shipped(data.get("shipped")))

    @classmethod
    def of(cls, value: Provenance | Mapping[str, Any] | None) -> Provenance:
        return value if isinstance(value, Provenance) else cls.parse(dict(value or {}))

    def to_json(self) -> dict[str, Any]:
        return dict(self.raw)

    def updated(self, **entries: Any) -> Provenance:
        """This provenance with top-level entries set (typed values as their JSON), checked again."""
        raw = dict(self.raw)
        for key, value in entries.items():
            raw[key] = value.to_json() if hasattr(value, "to_json") else value
        return Provenance.parse(raw)


def _text(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and value else None


def _search(search: Mapping[str, Any] | None) -> SearchRecord | None:
    """provenance.search, its types checked beyond check_provenance's (which checks the scale, baselines, task)."""
    if search is None:
        return None
    where = "provenance.search"
    data = search.get("data")
    if data is not None:
        one_line_text(data, f"{where}.data")
    objective = search.get("objective")
    if objective is not None:
        one_line_text(objective, f"{where}.objective")
    examples = search.get("calibration_examples")
    if examples is not None and not (is_int(examples) and examples >= 0):
        raise LpesError(f"spec: '{where}.calibration_examples' must be a whole number >= 0, got {show(examples)}")
    fitness, uniform = _number(search, "fitness", where), _number(search, "best_uniform_fitness", where)
    stock = tuple(StockRope(e["rope_type"], float(e["factor"])) for e in search.get("stock_baselines") or ())
    scale = search.get("best_uniform_scale")
    return SearchRecord(_search_task(search), data, objective, examples, fitness,
                        None if scale is None else float(scale), uniform, stock)


def _search_task(search: Mapping[str, Any]) -> SearchTask | None:
    """The task searched on (`search.task`); a spec written before that field gives `search.data` and
    `search.chat_template` (its answer budget where valid)."""
    task = search.get("task")
    if isinstance(task, dict):
        tokens = task.get("prompt_tokens")
        return SearchTask(task.get("data"), task.get("chat_template", True), task.get("answer_tokens"),
                          None if tokens is None else (int(tokens[0]), int(tokens[1])))
    chat, data = search.get("chat_template"), search.get("data")
    if isinstance(chat, bool) and (data is None or isinstance(data, str)):
        answer = search.get("answer_tokens")
        return SearchTask(data, chat, answer if is_int(answer) and answer >= 1 else None)
    return None


def _held_out(held: Mapping[str, Any] | None) -> HeldOut | None:
    if held is None:
        return None
    where = "provenance.held_out"
    examples = held.get("examples")
    if examples is not None and not (is_int(examples) and examples >= 0):
        raise LpesError(f"spec: '{where}.examples' must be a whole number >= 0, got {show(examples)}")
    shares = [_number(held, key, where) for key in ("unscaled", "lpes")]
    for key, share in zip(("unscaled", "lpes"), shares, strict=True):
        if share is not None and not 0 <= share <= 1:
            raise LpesError(f"spec: '{where}.{key}' must be a share in [0, 1], got {show(share)}")
    return HeldOut(examples, *shares)


def _number(data: Mapping[str, Any], key: str, where: str) -> float | None:
    value = data.get(key)
    if value is not None and not is_number(value):
        raise LpesError(f"spec: '{where}.{key}' must be a number, got {show(value)}")
    return None if value is None else float(value)


def _shipped(shipped: Any) -> Shipped | None:
    if shipped is None:
        return None
    if not isinstance(shipped, dict):
        raise LpesError(f"spec: 'provenance.shipped' must be an object, got {show(shipped)}")
    check_keys(shipped, SHIPPED_KEYS, "provenance.shipped")
    if shipped.get("ship") not in ("decision", "curve"):
        raise LpesError("spec: 'provenance.shipped.ship' must be 'decision' or 'curve', "
                        f"got {show(shipped.get('ship'))}")
    return Shipped(shipped["ship"], one_line_text(shipped.get("what"), "provenance.shipped.what"))
