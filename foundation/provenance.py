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
from lpes.foundation.rope_schemes import STOCK_TYPES, StockRope
from lpes.foundation.spec_fields import (
    MAX_ANSWER_TOKENS,
    MAX_SCALE,
    MIN_SCALE,
    SCALE_RANGE,
    check_keys,
    is_int,
    is_number,
    one_line_text,
    show,
    type_name,
)


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
        data = _check_provenance(data if data is not None else {})
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
    """provenance.search, its types checked beyond _check_provenance's (which checks the scale, baselines, task)."""
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


def _check_provenance(provenance: Any) -> dict[str, Any]:
    """Free-form, except the entries other stages read: those must have the type they are read as."""
    if not isinstance(provenance, dict):
        raise LpesError(f"spec: 'provenance' must be an object, got {type_name(provenance)}")
    for key in ("search", "model", "held_out"):
        if key in provenance and not isinstance(provenance[key], dict):
            raise LpesError(f"spec: 'provenance.{key}' must be an object, got {type_name(provenance[key])}")
    # Text that terminals and model cards show: one printable line, so a file cannot forge a line or colour one.
    for key in ("base_model", "lpes_version"):
        if provenance.get(key) is not None:
            one_line_text(provenance[key], f"provenance.{key}")
    for key in ("name", "config_sha256", "weights_sha256"):  # read to tell another model (Spec.searched_model)
        value = provenance.get("model", {}).get(key)
        if value is not None:
            one_line_text(value, f"provenance.model.{key}")
    uniform = provenance.get("search", {}).get("best_uniform_scale")
    if uniform is not None:
        if not is_number(uniform):
            raise LpesError(f"spec: 'provenance.search.best_uniform_scale' must be a number, got {show(uniform)}")
        if not MIN_SCALE <= uniform <= MAX_SCALE:
            raise LpesError(f"spec: 'provenance.search.best_uniform_scale' is {show(uniform)}; "
                            f"a scale must lie in {SCALE_RANGE}")
    _check_stock_baselines(provenance.get("search", {}).get("stock_baselines"))
    _check_search_task(provenance.get("search", {}).get("task"))
    return provenance


SEARCH_TASK_KEYS = ("data", "chat_template", "answer_tokens", "prompt_tokens")


def _check_search_task(task: Any) -> None:
    where = "provenance.search.task"
    if task is None:
        return
    if not isinstance(task, dict):
        raise LpesError(f"spec: '{where}' must be an object, got {type_name(task)}")
    check_keys(task, SEARCH_TASK_KEYS, where)
    if task.get("data") is not None and not (isinstance(task["data"], str) and task["data"].strip()
                                             and task["data"].isprintable()):
        raise LpesError(f"spec: '{where}.data' must be a --data description or null, got {show(task['data'])}")
    if "chat_template" in task and not isinstance(task["chat_template"], bool):
        raise LpesError(f"spec: '{where}.chat_template' must be true or false, got {show(task['chat_template'])}")
    answer = task.get("answer_tokens")
    if answer is not None and not (is_int(answer) and 1 <= answer <= MAX_ANSWER_TOKENS):
        raise LpesError(f"spec: '{where}.answer_tokens' must be an integer in 1..{MAX_ANSWER_TOKENS} or null, "
                        f"got {show(answer)}")
    tokens = task.get("prompt_tokens")
    if tokens is not None and not (isinstance(tokens, list) and len(tokens) == 2 and all(is_int(n) for n in tokens)
                                   and 0 <= tokens[0] <= tokens[1]):
        raise LpesError(f"spec: '{where}.prompt_tokens' must be [shortest, longest] token counts, got {show(tokens)}")


def _check_stock_baselines(entries: Any) -> None:
    where = "provenance.search.stock_baselines"
    if entries is None:
        return
    if not isinstance(entries, list):
        raise LpesError(f"spec: '{where}' must be a list, got {type_name(entries)}")
    seen = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise LpesError(f"spec: '{where}[{i}]' must be an object, got {type_name(entry)}")
        rope_type, factor = entry.get("rope_type"), entry.get("factor")
        if not isinstance(rope_type, str) or rope_type not in STOCK_TYPES:
            raise LpesError(f"spec: '{where}[{i}].rope_type' must be one of {', '.join(STOCK_TYPES)}, "
                            f"got {show(rope_type)}")
        if rope_type in seen:
            raise LpesError(f"spec: '{where}[{i}]': {rope_type!r} appears twice")
        seen.add(rope_type)
        if not is_number(factor) or not 1 <= factor <= MAX_SCALE:
            raise LpesError(f"spec: '{where}[{i}].factor' must be a number in [1, {MAX_SCALE:g}], got {show(factor)}")
