"""The spec file's fields that other stages read, checked as strictly as the format (foundation/spec.py):
the header, scales and control points in their range, the RoPE scheme, the typed parts of `provenance`; and the
helpers every check of a field uses to say what it got in one short line."""

from __future__ import annotations

import difflib
import math
import numbers
from typing import Any

import numpy as np

from lpes.foundation.errors import LpesError
from lpes.foundation.rope_schemes import SCHEMES, STOCK_TYPES

FORMAT = "lpes-spec"
VERSION = 1
MIN_SCALE = 1e-3
MAX_SCALE = 1e4
MAX_LAYERS = 4096
MAX_ANSWER_TOKENS = 4096  # the answer budget (validation.tasks.MAX_ANSWER_TOKENS)
SCALE_RANGE = f"[{MIN_SCALE:g}, {MAX_SCALE:g}]"
# The stock length-extension RoPE types (transformers' rope_type -> the name readers know) that
# lpes-search scans as baselines and validation scores beside the curve (foundation/rope_schemes.py).
STOCK_ROPE_TYPES = STOCK_TYPES
# How a layer applies its scale (`rope_type`): -> the parameters it takes (converter/lpes_rope.py SCHEMES).
ROPE_SCHEMES = {t: facts.parameters for t, facts in SCHEMES.items()}
YARN_DEFAULT_BETAS = (32.0, 1.0)  # transformers' beta_fast, beta_slow when a config leaves them out
MAX_POSITIONS = 2**31 - 1
MAX_TEXT = 400  # characters of a text field: one line of a terminal or a card


def check_keys(data: dict, known: tuple[str, ...], where: str) -> None:
    for key in data:
        if key in known:
            continue
        place = f" in '{where.rstrip('.')}'" if where else ""
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}"
        raise LpesError(f"spec: unknown key {show(key)}{place} ({hint})")


def check_header(data: dict) -> None:
    if data.get("format", FORMAT) != FORMAT:
        raise LpesError(f"spec: 'format' is {show(data['format'])}, expected {FORMAT!r}")
    version = data.get("version", VERSION)
    if not is_int(version):
        raise LpesError(f"spec: 'version' must be the integer {VERSION}, got {show(version)}")
    if version != VERSION:
        raise LpesError(f"spec: 'version' {version} is not supported (this lpes reads version {VERSION})")


def control_point(point: Any, name: str) -> tuple[float, float]:
    if not (isinstance(point, (list, tuple)) and len(point) == 2 and all(is_number(v) for v in point)):
        raise LpesError(f"spec: '{name}' must be a pair of numbers [x, y], got {show(point)}")
    x, y = point
    for axis, value in (("x", x), ("scale (y)", y)):
        # A JSON integer float64 cannot hold (10000000000000001 reads as 1e16, 10**400 not at all) would make
        # two different points one, or overflow: refused rather than rounded.
        if isinstance(value, int) and not (abs(value) <= 2**1023 and float(value) == value):
            raise LpesError(f"spec: '{name}' has {axis} {show(value)}, which float64 cannot represent exactly")
    if not math.isfinite(x):
        raise LpesError(f"spec: '{name}' has x {show(x)}; it must be finite")
    if not MIN_SCALE <= y <= MAX_SCALE:
        raise LpesError(f"spec: '{name}' has scale (y) {show(y)}; a scale must lie in {SCALE_RANGE}")
    return float(x), float(y)


def check_scales(scales: Any, name: str) -> list[float]:
    if not isinstance(scales, (list, tuple)) or not scales:
        raise LpesError(f"spec: '{name}' must be a non-empty list of numbers")
    if len(scales) > MAX_LAYERS:  # before touching the entries
        raise LpesError(f"spec: '{name}' has {len(scales)} entries; at most {MAX_LAYERS} layers are supported")
    out = []
    for i, value in enumerate(scales):
        if not is_number(value):
            raise LpesError(f"spec: '{name}[{i}]' must be a number, got {show(value)}")
        if not MIN_SCALE <= value <= MAX_SCALE:  # also refuses nan and inf
            raise LpesError(f"spec: '{name}[{i}]' is {show(value)}; a scale must lie in {SCALE_RANGE}")
        out.append(float(value))
    return out


def check_rope(data: dict) -> tuple[str, float | None, float | None, int | None]:
    """`rope_type` (default linear) and its `rope_parameters`, checked as strictly as the rest: the fields of a
    `RopeScheme` (rope_type, beta_fast, beta_slow, original_max_position_embeddings)."""
    rope_type = data.get("rope_type", "linear")
    if not isinstance(rope_type, str) or rope_type not in ROPE_SCHEMES:
        hint = ""
        if rope_type == "ntk":
            hint = " (transformers has no static NTK RoPE; dynamic is its NTK-aware scheme)"
        raise LpesError(f"spec: 'rope_type' must be one of {', '.join(ROPE_SCHEMES)}, got {show(rope_type)}{hint}")
    parameters = data.get("rope_parameters")
    if parameters is None:
        return rope_type, None, None, None
    if not isinstance(parameters, dict):
        raise LpesError(f"spec: 'rope_parameters' must be an object, got {type_name(parameters)}")
    known = ROPE_SCHEMES[rope_type]
    if not known and parameters:
        raise LpesError(f"spec: 'rope_parameters' has no fields for rope_type {rope_type!r} "
                        f"(only yarn takes {', '.join(ROPE_SCHEMES['yarn'])})")
    check_keys(parameters, known, "rope_parameters.")
    for key in ("beta_fast", "beta_slow"):
        value = parameters.get(key)
        if value is not None and not (is_number(value) and math.isfinite(value) and 0 < value <= MAX_SCALE):
            raise LpesError(f"spec: 'rope_parameters.{key}' must be a number in (0, {MAX_SCALE:g}], got {show(value)}")
    fast, slow = (d if parameters.get(k) is None else parameters[k]
                  for k, d in zip(("beta_fast", "beta_slow"), YARN_DEFAULT_BETAS))
    if rope_type == "yarn" and not fast > slow:
        raise LpesError(f"spec: 'rope_parameters.beta_fast' ({show(fast)}) must be greater than beta_slow "
                        f"({show(slow)}); YaRN's ramp runs from one to the other")
    original = parameters.get("original_max_position_embeddings")
    if original is not None and not (is_int(original) and 1 <= original <= MAX_POSITIONS):
        raise LpesError("spec: 'rope_parameters.original_max_position_embeddings' must be an integer in "
                        f"1..{MAX_POSITIONS}, got {show(original)}")
    return (rope_type, *(None if parameters.get(k) is None else float(parameters[k])
                         for k in ("beta_fast", "beta_slow")), original)


def check_provenance(provenance: Any) -> dict[str, Any]:
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
        if not isinstance(rope_type, str) or rope_type not in STOCK_ROPE_TYPES:
            raise LpesError(f"spec: '{where}[{i}].rope_type' must be one of {', '.join(STOCK_ROPE_TYPES)}, "
                            f"got {show(rope_type)}")
        if rope_type in seen:
            raise LpesError(f"spec: '{where}[{i}]': {rope_type!r} appears twice")
        seen.add(rope_type)
        if not is_number(factor) or not 1 <= factor <= MAX_SCALE:
            raise LpesError(f"spec: '{where}[{i}].factor' must be a number in [1, {MAX_SCALE:g}], got {show(factor)}")


def one_line_text(value: Any, where: str) -> str:
    """A text field read from a file: one line of printable characters, at most MAX_TEXT of them."""
    if not isinstance(value, str) or not value.strip():
        raise LpesError(f"spec: '{where}' must be a non-empty string, got {show(value)}")
    if not value.isprintable() or len(value) > MAX_TEXT:
        raise LpesError(f"spec: '{where}' must be one line of at most {MAX_TEXT} printable characters, "
                        f"got {show(value)}")
    return value


def is_number(value: Any) -> bool:
    """A real number; JSON true/false decode to bools, which Python counts as ints."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def type_name(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a bool", type(None): "null"}
    return names.get(type(value), "a number")


def show(value: Any, limit: int = 60) -> str:
    """repr, cut short: messages stay one short line whatever the file holds."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."
