"""The spec file's fields that other stages read, checked as strictly as the format (foundation/spec.py):
the header, scales and control points in their range, the RoPE scheme (the typed parts of `provenance` are
foundation/provenance.py's); and the helpers every check of a field uses to say what it got in one short line."""

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
