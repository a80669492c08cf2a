"""The spec file (best.json): the one format that passes between the stages.

    {
      "format": "lpes-spec",
      "version": 1,
      "num_layers": 4,                                  # decoder layers the scales are for
      "scales": [4.0, 2.5, 1.5, 1.0],                   # s_h, one per layer
      "curve": {"degree": 3,                            # optional: the Bezier curve
                "control_points": [[0, 4.0], [1, 2.25], [2, 1.25], [3, 1.0]]},
      "rope_type": "yarn",                              # optional: how s_h is applied (default linear)
      "rope_parameters": {"beta_fast": 32, ...},        # optional: the scheme's parameters
      "provenance": {"lpes_version": "0.1.0",           # optional, free-form below
                     "model": {...fingerprint...}, "search": {...}}
    }

A file may also hold only `scales`, or only a curve (`curve` or a top-level
`control_points`, with an optional top-level `degree`); the scales are then read off
the curve for the model's layer count.

The loader is strict: a typo must not silently give all-ones scales, so every key
outside `provenance` must be known, no key may appear twice, and bools are not numbers.
Sane ranges (anything outside is a mistake, refused with the field's name):

- a scale (each of `scales`, each control point's y, `provenance.search.best_uniform_scale`)
  lies in [MIN_SCALE, MAX_SCALE] = [1e-3, 1e4]. Scales are interpolation factors, normally
  1..4 (s > 1 slows the rotation, s < 1 speeds it up, method.md section 1); every value in
  the range is a normal float32, so it survives the export's float32 arithmetic (1e-46 or
  1e-300 would become 0 there);
- 1 <= `num_layers` <= MAX_LAYERS = 4096, and at most that many `scales`;
- a curve has 2 to MAX_DEGREE + 1 = 17 control points (degree 1..16; the papers use 3),
  finite x, non-decreasing, with the last x greater than the first;
- the file is at most 8 MiB of UTF-8 JSON, nested at most 64 levels, integers at most
  40 digits.

`rope_type` says how layer h applies its scale (lpes_rope.py): `linear` (absent: every
file written before it existed), `inv_freq / s_h` on top of the model's own RoPE; `yarn`
or `dynamic`, transformers' YaRN or dynamic NTK at factor s_h, so that one factor for
every layer is exactly that stock RoPE. Those two need the model's own RoPE to be plain
and every factor >= 1. `rope_parameters` holds the scheme's parameters, YaRN's only:
`beta_fast`, `beta_slow` (numbers, beta_fast > beta_slow > 0) and
`original_max_position_embeddings` (an integer; default the model's trained length).
There is no static `ntk`: transformers has no init function for it (dynamic NTK at the
trained length is plain RoPE; past it, dynamic is what transformers offers).

Provenance that other stages read is typed: `search` (with `best_uniform_scale` and
`stock_baselines`, a list of `{"rope_type": "yarn" | "dynamic", "factor": f, ...}` with
1 <= f <= MAX_SCALE, and `task`, the task the curve was searched on: `{"data": description or
null, "chat_template": bool, "answer_tokens": int >= 1 or null, "prompt_tokens": [shortest,
longest]}`, each key known), `model` and `held_out` are objects, `base_model` and `lpes_version`
strings; read them through `Spec.best_uniform_scale`, `Spec.stock_baselines`, `Spec.search_task`,
`Spec.searched_model` and `Spec.base_model`. `model` is the model the curve was searched on
(converter.loading.model_fingerprint: architecture, RoPE, and where lpes-search wrote it `name`,
`config_sha256` and `weights_sha256`, strings); `base_model` the model a conversion applied it to.
"""

from __future__ import annotations

import difflib
import json
import math
import numbers
import os
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from lpes.foundation import bezier
from lpes.foundation.errors import LpesError
from lpes.foundation.files import write_bytes_atomic

__all__ = ["Curve", "SearchTask", "Spec", "StockRope", "dump_spec", "load_spec", "parse_spec"]

FORMAT = "lpes-spec"
VERSION = 1
MIN_SCALE = 1e-3
MAX_SCALE = 1e4
MAX_LAYERS = 4096
MAX_DEGREE = bezier.MAX_DEGREE
MAX_FILE_BYTES = 8 << 20
MAX_DEPTH = 64
MAX_INT_DIGITS = 40
MAX_ANSWER_TOKENS = 4096  # the answer budget (validation.tasks.MAX_ANSWER_TOKENS)

TOP_LEVEL_KEYS = ("format", "version", "num_layers", "scales", "curve", "control_points", "degree", "rope_type",
                  "rope_parameters", "provenance")
CURVE_KEYS = ("degree", "control_points")
_SCALE_RANGE = f"[{MIN_SCALE:g}, {MAX_SCALE:g}]"
# The stock length-extension RoPE types (transformers' rope_type -> the name readers know) that
# lpes-search scans as baselines and validation scores beside the curve.
STOCK_ROPE_TYPES = {"yarn": "YaRN", "dynamic": "dynamic NTK"}
# How a layer applies its scale (`rope_type`): -> the parameters it takes (converter/lpes_rope.py SCHEMES).
ROPE_SCHEMES = {"linear": (), "yarn": ("beta_fast", "beta_slow", "original_max_position_embeddings"), "dynamic": ()}
YARN_DEFAULT_BETAS = (32.0, 1.0)  # transformers' beta_fast, beta_slow when a config leaves them out
MAX_POSITIONS = 2**31 - 1


@dataclass(frozen=True)
class Curve:
    control_points: tuple[tuple[float, float], ...]

    @property
    def degree(self) -> int:
        return len(self.control_points) - 1

    def scales(self, num_layers: int) -> list[float]:
        """The per-layer scales; a Bezier curve stays within its control points' y range (clipped to it,
        so that rounding never takes a scale past the range the control points were checked for)."""
        ys = [y for _, y in self.control_points]
        scales = np.clip(bezier.layer_scales(self.control_points, num_layers), min(ys), max(ys))
        return [float(s) for s in scales]

    def to_json(self) -> dict[str, Any]:
        return {"degree": self.degree, "control_points": [list(p) for p in self.control_points]}


@dataclass(frozen=True)
class StockRope:
    """A stock RoPE length extension at one factor, the same in every layer: a baseline for a curve."""

    rope_type: str  # a key of STOCK_ROPE_TYPES, as config.json's rope_parameters name it
    factor: float

    @property
    def name(self) -> str:
        return f"{STOCK_ROPE_TYPES[self.rope_type]} f={self.factor:g}"

    @property
    def length_dependent(self) -> bool:
        """Its frequencies follow the sequence length: in a batch the longest row would set them for all."""
        return self.rope_type == "dynamic"

    def same_as_unscaled(self, longest: int, trained: int | None) -> bool:
        """It computes the model's own RoPE on sequences of at most `longest` positions.

        YaRN at factor 1 blends a frequency with itself, attention factor 1. Dynamic NTK at
        any factor keeps the base until a sequence passes `trained` (max_position_embeddings).
        """
        if self.rope_type == "yarn":
            return self.factor == 1.0
        return bool(trained) and longest <= trained


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
class RopeScheme:
    """How each layer applies its scale s_h: `linear` (inv_freq / s_h), or transformers' `yarn` / `dynamic` at s_h.

    YaRN's parameters left None take transformers' defaults (beta 32 and 1) and the model's
    trained length (`resolved` writes them out for a model).
    """

    rope_type: str = "linear"
    beta_fast: float | None = None
    beta_slow: float | None = None
    original_max_position_embeddings: int | None = None

    @property
    def name(self) -> str:
        return "linear" if self.rope_type == "linear" else STOCK_ROPE_TYPES[self.rope_type]

    @property
    def linear(self) -> bool:
        return self.rope_type == "linear"

    @property
    def length_dependent(self) -> bool:
        """Its frequencies follow the sequence length: in a batch the longest row would set them for all."""
        return self.rope_type == "dynamic"

    @property
    def parameters(self) -> dict[str, Any]:
        """The scheme's parameters that are set (the spec's `rope_parameters`)."""
        return {k: getattr(self, k) for k in ROPE_SCHEMES[self.rope_type] if getattr(self, k) is not None}

    def for_lpes_rope(self) -> dict[str, Any]:
        """The `rope` argument of lpes_rope.apply_layer_scales (and config.json's "lpes" -> "rope")."""
        return {"rope_type": self.rope_type, **self.parameters}

    def stock(self, factor: float) -> StockRope:
        """The stock RoPE that a curve with `factor` in every layer is (yarn, dynamic only)."""
        return StockRope(self.rope_type, float(factor))

    def resolved(self, config) -> RopeScheme:
        """The parameters a model gives the ones left out (YaRN: transformers' betas, the trained length)."""
        if self.rope_type != "yarn":
            return self
        fast, slow = YARN_DEFAULT_BETAS
        return replace(self, beta_fast=self.beta_fast if self.beta_fast is not None else fast,
                       beta_slow=self.beta_slow if self.beta_slow is not None else slow,
                       original_max_position_embeddings=self.original_max_position_embeddings
                       or int(config.max_position_embeddings))


LINEAR_ROPE = RopeScheme()  # every spec before rope_type existed


@dataclass(frozen=True)
class Spec:
    """Per-layer RoPE scales, the curve they came from, how they are applied, and where they came from."""

    scales: tuple[float, ...] | None
    curve: Curve | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    rope: RopeScheme = LINEAR_ROPE

    @property
    def num_layers(self) -> int | None:
        return None if self.scales is None else len(self.scales)

    @property
    def best_uniform_scale(self) -> float | None:
        """The best single scale lpes-search found (`provenance.search.best_uniform_scale`), if recorded.

        The baseline validation holds a per-layer curve against; written by the search, read by validation.
        """
        search = self.provenance.get("search")
        value = search.get("best_uniform_scale") if isinstance(search, dict) else None
        return float(value) if _is_number(value) and MIN_SCALE <= value <= MAX_SCALE else None

    @property
    def stock_baselines(self) -> tuple[StockRope, ...]:
        """The stock RoPE types lpes-search found best on calibration, each at its factor (none if not scanned)."""
        search = self.provenance.get("search")
        entries = search.get("stock_baselines") if isinstance(search, dict) else None
        return tuple(StockRope(e["rope_type"], float(e["factor"])) for e in entries or ())

    @property
    def search_task(self) -> SearchTask | None:
        """The task lpes-search calibrated on (`provenance.search.task`), None if not recorded.

        A spec written before the field was recorded gives its `search.data` and `search.chat_template`.
        """
        search = self.provenance.get("search")
        if not isinstance(search, dict):
            return None
        task = search.get("task")
        if isinstance(task, dict):
            tokens = task.get("prompt_tokens")
            return SearchTask(task.get("data"), task.get("chat_template", True), task.get("answer_tokens"),
                              None if tokens is None else (int(tokens[0]), int(tokens[1])))
        chat, data = search.get("chat_template"), search.get("data")
        if isinstance(chat, bool) and (data is None or isinstance(data, str)):
            answer = search.get("answer_tokens")
            return SearchTask(data, chat, answer if _is_int(answer) and answer >= 1 else None)
        return None

    @property
    def searched_model(self) -> dict[str, Any] | None:
        """The fingerprint of the model the curve was searched on (`provenance.model`), None if not recorded."""
        model = self.provenance.get("model")
        return model if isinstance(model, dict) else None

    @property
    def base_model(self) -> str | None:
        """The model the spec was searched on or converted from (`provenance.base_model`), if recorded."""
        value = self.provenance.get("base_model")
        return value if isinstance(value, str) and value else None

    def for_layers(self, num_layers: int) -> Spec:
        """This spec resolved for a model with `num_layers` decoder layers (scales filled in, count checked)."""
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= MAX_LAYERS:
            raise LpesError(f"the model has {_show(num_layers)} layers; lpes supports 1..{MAX_LAYERS}")
        if self.scales is None:
            scales = tuple(_check_scales(self.curve.scales(num_layers), "curve"))
            _check_scheme_scales(scales, self.rope, "curve")
            return replace(self, scales=scales)
        if len(self.scales) != num_layers:
            raise LpesError(f"spec: 'scales' has {len(self.scales)} entries but the model has {num_layers} layers")
        _check_scheme_scales(self.scales, self.rope, "scales")
        return self

    @classmethod
    def from_curve(cls, control_points, num_layers: int, provenance: dict | None = None,
                   rope: RopeScheme = LINEAR_ROPE) -> Spec:
        curve = _parse_curve({"control_points": control_points}, "curve.")
        return cls(None, curve, dict(provenance or {}), rope).for_layers(num_layers)

    @classmethod
    def from_scales(cls, scales, provenance: dict | None = None, rope: RopeScheme = LINEAR_ROPE) -> Spec:
        checked = tuple(_check_scales(scales, "scales"))
        _check_scheme_scales(checked, rope, "scales")
        return cls(checked, None, dict(provenance or {}), rope)

    def to_json(self) -> dict[str, Any]:
        if self.scales is None:
            raise LpesError("spec: cannot write a curve-only spec without a layer count; call for_layers first")
        out: dict[str, Any] = {"format": FORMAT, "version": VERSION, "num_layers": len(self.scales)}
        out["scales"] = list(self.scales)
        if self.curve is not None:
            out["curve"] = self.curve.to_json()
        if not self.rope.linear:  # absent means linear: files from before the field read the same
            out["rope_type"] = self.rope.rope_type
            if self.rope.parameters:
                out["rope_parameters"] = self.rope.parameters
        out["provenance"] = self.provenance
        return out


def load_spec(path: str | os.PathLike, num_layers: int | None = None) -> Spec:
    """Read and validate a spec file; with `num_layers`, also check (or derive) the scales for it."""
    path = Path(path)
    spec = parse_spec(_decode(_read(path), path))
    return spec.for_layers(num_layers) if num_layers is not None else spec


def dump_spec(spec: Spec, path: str | os.PathLike) -> None:
    """Write `spec` to `path` atomically; refuses (LpesError) what load_spec would refuse to read back."""
    try:
        data = (json.dumps(spec.to_json(), indent=2, allow_nan=False) + "\n").encode()
    except ValueError:  # NaN or an infinity somewhere (the provenance is free-form): not JSON
        raise LpesError(f"cannot write {path}: the spec holds NaN or an infinite number, which JSON cannot "
                        "hold") from None
    _check_size(len(data), Path(path))
    parse_spec(_decode(data, Path(path)))
    write_bytes_atomic(Path(path), data)


def parse_spec(data: Any) -> Spec:
    """Validate a decoded spec; every error names the field and what is wrong."""
    if not isinstance(data, dict):
        raise LpesError("spec: top level must be a JSON object")
    _check_keys(data, TOP_LEVEL_KEYS, "")
    _check_header(data)
    num_layers = data.get("num_layers")
    if num_layers is not None and not (_is_int(num_layers) and 1 <= num_layers <= MAX_LAYERS):
        raise LpesError(f"spec: 'num_layers' must be an integer in 1..{MAX_LAYERS}, got {_show(num_layers)}")
    curve = _curve_of(data)
    scales = data.get("scales")
    if scales is None and curve is None:
        raise LpesError("spec: needs 'scales' or a curve ('curve' or 'control_points')")
    provenance = _check_provenance(data.get("provenance", {}))
    rope = _parse_rope(data)
    spec = Spec(None if scales is None else tuple(_check_scales(scales, "scales")), curve, provenance, rope)
    if spec.scales is not None:
        _check_scheme_scales(spec.scales, rope, "scales")
    if num_layers is not None:
        if spec.scales is not None and len(spec.scales) != num_layers:
            raise LpesError(f"spec: 'scales' has {len(spec.scales)} entries but 'num_layers' is {num_layers}")
        spec = spec.for_layers(num_layers)
    if spec.scales is not None and curve is not None:
        _check_scales_match_curve(spec.scales, curve)
    return spec


# --- reading the file ------------------------------------------------------------------------------------


def _read(path: Path) -> bytes:
    """The file's bytes, at most MAX_FILE_BYTES; every way it cannot be read is one line."""
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise LpesError(f"spec file {path} is a directory, not a file{_spec_inside(path)}")
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block, /dev/zero never ends
            raise LpesError(f"spec file {path} is not a regular file")
        _check_size(info.st_size, path)
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        raise LpesError(f"spec file not found: {path}") from None
    except PermissionError:
        raise LpesError(f"cannot read spec file {path}: permission denied") from None
    except OSError as err:
        raise LpesError(f"cannot read spec file {path}: {err.strerror or err}") from None
    except ValueError as err:  # a NUL byte in the path
        raise LpesError(f"spec file path {_show(str(path))} is not a valid path: {err}") from None
    _check_size(len(data), path)  # again: it may have grown since the stat
    return data


def _check_size(size: int, path: Path) -> None:
    if size > MAX_FILE_BYTES:
        raise LpesError(f"spec file {path} is larger than {MAX_FILE_BYTES >> 20} MiB; is it a spec?")


def _spec_inside(folder: Path) -> str:
    try:
        found = [name for name in ("best.json", "lpes_spec.json") if (folder / name).is_file()]
    except OSError:  # an unreadable folder: no hint
        found = []
    return f" (did you mean {folder / found[0]}?)" if found else ""


class _LongInteger:
    """Stands in for an integer literal too long to be a real value (Python refuses > 4300 digits)."""

    def __init__(self, literal: str) -> None:
        self.digits = len(literal.lstrip("-"))

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"


def _decode(data: bytes, path: Path) -> Any:
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark from a Windows editor is harmless
    except UnicodeDecodeError as err:
        raise LpesError(f"spec file {path} is not UTF-8 text (byte {err.start})") from None
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_int=_parse_int, parse_constant=_no_constant)
    except RecursionError:
        raise LpesError(f"spec file {path}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:
        raise LpesError(f"spec file {path} is not valid JSON: {err}") from None
    _check_structure(value)
    return value


def _no_constant(name: str) -> Any:
    """NaN, Infinity, -Infinity: Python's json reads them, but they are not JSON and other readers refuse them."""
    raise LpesError(f"spec: {name} is not a JSON value (write a number, or null for none)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:  # json keeps the last one silently; which did the user mean?
            raise LpesError(f"spec: duplicate key {_show(key)}; each key may appear once")
        out[key] = value
    return out


def _parse_int(literal: str) -> int | _LongInteger:
    return _LongInteger(literal) if len(literal.lstrip("-")) > MAX_INT_DIGITS else int(literal)


def _check_structure(value: Any) -> None:
    """No nesting deeper than MAX_DEPTH (deeper breaks json.dumps later) and no over-long integer, anywhere."""
    if not isinstance(value, (dict, list)):
        if isinstance(value, _LongInteger):
            raise LpesError(f"spec: the top level is {value!r}")
        return
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        node, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            top = where.split(".")[0].split("[")[0]
            raise LpesError(f"spec: {_show(top) if top else 'the top level'} is nested deeper than {MAX_DEPTH} levels")
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            name = (f"{where}.{key}" if where else str(key)) if isinstance(node, dict) else f"{where}[{key}]"
            if isinstance(child, _LongInteger):
                raise LpesError(f"spec: {_show(name)} is {child!r}")
            if isinstance(child, (dict, list)):
                stack.append((child, name, depth + 1))


# --- the fields -------------------------------------------------------------------------------------------


def _check_keys(data: dict, known: tuple[str, ...], where: str) -> None:
    for key in data:
        if key in known:
            continue
        place = f" in '{where.rstrip('.')}'" if where else ""
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}"
        raise LpesError(f"spec: unknown key {_show(key)}{place} ({hint})")


def _check_header(data: dict) -> None:
    if data.get("format", FORMAT) != FORMAT:
        raise LpesError(f"spec: 'format' is {_show(data['format'])}, expected {FORMAT!r}")
    version = data.get("version", VERSION)
    if not _is_int(version):
        raise LpesError(f"spec: 'version' must be the integer {VERSION}, got {_show(version)}")
    if version != VERSION:
        raise LpesError(f"spec: 'version' {version} is not supported (this lpes reads version {VERSION})")


def _curve_of(data: dict) -> Curve | None:
    """The curve, given as 'curve' or as top-level 'control_points' (+ 'degree'), or None."""
    if "control_points" in data:
        if "curve" in data:
            raise LpesError("spec: give the curve once, as 'curve' or as top-level 'control_points', not both")
        return _parse_curve({k: data[k] for k in CURVE_KEYS if k in data}, "")
    if "degree" in data:
        raise LpesError("spec: 'degree' at the top level goes with a top-level 'control_points'; there is none")
    if data.get("curve") is None:
        return None
    return _parse_curve(data["curve"], "curve.")


def _parse_curve(data: Any, where: str) -> Curve:
    """`where` prefixes field names: "curve." for the curve object, "" for top-level control points."""
    if not isinstance(data, dict) or "control_points" not in data:
        _check_keys(data if isinstance(data, dict) else {}, CURVE_KEYS, where)
        raise LpesError(f"spec: '{where.rstrip('.') or 'curve'}' must be an object with 'control_points'")
    _check_keys(data, CURVE_KEYS, where)
    name = f"{where}control_points"
    points = data["control_points"]
    if not isinstance(points, (list, tuple)) or len(points) < 2:
        raise LpesError(f"spec: '{name}' must be a list of at least 2 [x, y] points")
    if len(points) > MAX_DEGREE + 1:  # before any work: 1200 points overflow the binomials
        raise LpesError(f"spec: '{name}' has {len(points)} points (degree {len(points) - 1}); "
                        f"the degree must be at most {MAX_DEGREE}")
    parsed = [_control_point(point, f"{name}[{i}]") for i, point in enumerate(points)]
    for i in range(1, len(parsed)):
        if parsed[i][0] < parsed[i - 1][0]:
            raise LpesError(f"spec: '{name}' x must be non-decreasing (point {i} goes back)")
    span = parsed[-1][0] - parsed[0][0]
    if not (math.isfinite(span) and span > 0):  # equal x put every layer at t = 0
        raise LpesError(f"spec: '{name}' x span (last x - first x) must be finite and > 0, got {span!r}")
    degree = data.get("degree")
    if degree is not None:
        if not _is_int(degree):
            raise LpesError(f"spec: '{where}degree' must be an integer, got {_show(degree)}")
        if degree != len(parsed) - 1:
            raise LpesError(f"spec: '{where}degree' is {degree} but {len(parsed)} control points make degree "
                            f"{len(parsed) - 1}")
    return Curve(tuple(parsed))


def _control_point(point: Any, name: str) -> tuple[float, float]:
    if not (isinstance(point, (list, tuple)) and len(point) == 2 and all(_is_number(v) for v in point)):
        raise LpesError(f"spec: '{name}' must be a pair of numbers [x, y], got {_show(point)}")
    x, y = point
    if not math.isfinite(x):
        raise LpesError(f"spec: '{name}' has x {_show(x)}; it must be finite")
    if not MIN_SCALE <= y <= MAX_SCALE:
        raise LpesError(f"spec: '{name}' has scale (y) {_show(y)}; a scale must lie in {_SCALE_RANGE}")
    return float(x), float(y)


def _check_scales(scales: Any, name: str) -> list[float]:
    if not isinstance(scales, (list, tuple)) or not scales:
        raise LpesError(f"spec: '{name}' must be a non-empty list of numbers")
    if len(scales) > MAX_LAYERS:  # before touching the entries
        raise LpesError(f"spec: '{name}' has {len(scales)} entries; at most {MAX_LAYERS} layers are supported")
    out = []
    for i, value in enumerate(scales):
        if not _is_number(value):
            raise LpesError(f"spec: '{name}[{i}]' must be a number, got {_show(value)}")
        if not MIN_SCALE <= value <= MAX_SCALE:  # also refuses nan and inf
            raise LpesError(f"spec: '{name}[{i}]' is {_show(value)}; a scale must lie in {_SCALE_RANGE}")
        out.append(float(value))
    return out


def _parse_rope(data: dict) -> RopeScheme:
    """`rope_type` (default linear) and its `rope_parameters`, checked as strictly as the rest."""
    rope_type = data.get("rope_type", "linear")
    if not isinstance(rope_type, str) or rope_type not in ROPE_SCHEMES:
        hint = ""
        if rope_type == "ntk":
            hint = " (transformers has no static NTK RoPE; dynamic is its NTK-aware scheme)"
        raise LpesError(f"spec: 'rope_type' must be one of {', '.join(ROPE_SCHEMES)}, got {_show(rope_type)}{hint}")
    parameters = data.get("rope_parameters")
    if parameters is None:
        return RopeScheme(rope_type)
    if not isinstance(parameters, dict):
        raise LpesError(f"spec: 'rope_parameters' must be an object, got {_type_name(parameters)}")
    known = ROPE_SCHEMES[rope_type]
    if not known and parameters:
        raise LpesError(f"spec: 'rope_parameters' has no fields for rope_type {rope_type!r} "
                        f"(only yarn takes {', '.join(ROPE_SCHEMES['yarn'])})")
    _check_keys(parameters, known, "rope_parameters.")
    for key in ("beta_fast", "beta_slow"):
        value = parameters.get(key)
        if value is not None and not (_is_number(value) and math.isfinite(value) and 0 < value <= MAX_SCALE):
            raise LpesError(f"spec: 'rope_parameters.{key}' must be a number in (0, {MAX_SCALE:g}], got {_show(value)}")
    fast, slow = (d if parameters.get(k) is None else parameters[k]
                  for k, d in zip(("beta_fast", "beta_slow"), YARN_DEFAULT_BETAS))
    if rope_type == "yarn" and not fast > slow:
        raise LpesError(f"spec: 'rope_parameters.beta_fast' ({_show(fast)}) must be greater than beta_slow "
                        f"({_show(slow)}); YaRN's ramp runs from one to the other")
    original = parameters.get("original_max_position_embeddings")
    if original is not None and not (_is_int(original) and 1 <= original <= MAX_POSITIONS):
        raise LpesError("spec: 'rope_parameters.original_max_position_embeddings' must be an integer in "
                        f"1..{MAX_POSITIONS}, got {_show(original)}")
    return RopeScheme(rope_type, *(None if parameters.get(k) is None else float(parameters[k])
                                   for k in ("beta_fast", "beta_slow")), original)


def _check_scheme_scales(scales, rope: RopeScheme, name: str) -> None:
    """YaRN and dynamic NTK take factors >= 1 (below it neither extends anything; transformers warns)."""
    if rope.linear:
        return
    for i, value in enumerate(scales):
        if value < 1.0:
            where = f"'{name}[{i}]' is" if name == "scales" else f"the curve gives layer {i} the scale"
            raise LpesError(f"spec: {where} {_show(value)}; a {rope.name} factor (rope_type "
                            f"{rope.rope_type!r}) must be at least 1")


def _check_provenance(provenance: Any) -> dict[str, Any]:
    """Free-form, except the entries other stages read: those must have the type they are read as."""
    if not isinstance(provenance, dict):
        raise LpesError(f"spec: 'provenance' must be an object, got {_type_name(provenance)}")
    for key in ("search", "model", "held_out"):
        if key in provenance and not isinstance(provenance[key], dict):
            raise LpesError(f"spec: 'provenance.{key}' must be an object, got {_type_name(provenance[key])}")
    for key in ("base_model", "lpes_version"):
        if provenance.get(key) is not None and not isinstance(provenance[key], str):
            raise LpesError(f"spec: 'provenance.{key}' must be a string, got {_show(provenance[key])}")
    for key in ("name", "config_sha256", "weights_sha256"):  # read to tell another model (Spec.searched_model)
        value = provenance.get("model", {}).get(key)
        if value is not None and not isinstance(value, str):
            raise LpesError(f"spec: 'provenance.model.{key}' must be a string, got {_show(value)}")
    uniform = provenance.get("search", {}).get("best_uniform_scale")
    if uniform is not None:
        if not _is_number(uniform):
            raise LpesError(f"spec: 'provenance.search.best_uniform_scale' must be a number, got {_show(uniform)}")
        if not MIN_SCALE <= uniform <= MAX_SCALE:
            raise LpesError(f"spec: 'provenance.search.best_uniform_scale' is {_show(uniform)}; "
                            f"a scale must lie in {_SCALE_RANGE}")
    _check_stock_baselines(provenance.get("search", {}).get("stock_baselines"))
    _check_search_task(provenance.get("search", {}).get("task"))
    return provenance


SEARCH_TASK_KEYS = ("data", "chat_template", "answer_tokens", "prompt_tokens")


def _check_search_task(task: Any) -> None:
    where = "provenance.search.task"
    if task is None:
        return
    if not isinstance(task, dict):
        raise LpesError(f"spec: '{where}' must be an object, got {_type_name(task)}")
    _check_keys(task, SEARCH_TASK_KEYS, where)
    if task.get("data") is not None and not (isinstance(task["data"], str) and task["data"].strip()):
        raise LpesError(f"spec: '{where}.data' must be a --data description or null, got {_show(task['data'])}")
    if "chat_template" in task and not isinstance(task["chat_template"], bool):
        raise LpesError(f"spec: '{where}.chat_template' must be true or false, got {_show(task['chat_template'])}")
    answer = task.get("answer_tokens")
    if answer is not None and not (_is_int(answer) and 1 <= answer <= MAX_ANSWER_TOKENS):
        raise LpesError(f"spec: '{where}.answer_tokens' must be an integer in 1..{MAX_ANSWER_TOKENS} or null, "
                        f"got {_show(answer)}")
    tokens = task.get("prompt_tokens")
    if tokens is not None and not (isinstance(tokens, list) and len(tokens) == 2 and all(_is_int(n) for n in tokens)
                                   and 0 <= tokens[0] <= tokens[1]):
        raise LpesError(f"spec: '{where}.prompt_tokens' must be [shortest, longest] token counts, got {_show(tokens)}")


def _check_stock_baselines(entries: Any) -> None:
    where = "provenance.search.stock_baselines"
    if entries is None:
        return
    if not isinstance(entries, list):
        raise LpesError(f"spec: '{where}' must be a list, got {_type_name(entries)}")
    seen = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise LpesError(f"spec: '{where}[{i}]' must be an object, got {_type_name(entry)}")
        rope_type, factor = entry.get("rope_type"), entry.get("factor")
        if not isinstance(rope_type, str) or rope_type not in STOCK_ROPE_TYPES:
            raise LpesError(f"spec: '{where}[{i}].rope_type' must be one of {', '.join(STOCK_ROPE_TYPES)}, "
                            f"got {_show(rope_type)}")
        if rope_type in seen:
            raise LpesError(f"spec: '{where}[{i}]': {rope_type!r} appears twice")
        seen.add(rope_type)
        if not _is_number(factor) or not 1 <= factor <= MAX_SCALE:
            raise LpesError(f"spec: '{where}[{i}].factor' must be a number in [1, {MAX_SCALE:g}], got {_show(factor)}")


def _check_scales_match_curve(scales: tuple[float, ...], curve: Curve) -> None:
    expected = curve.scales(len(scales))
    worst = max(abs(a - b) / b for a, b in zip(scales, expected))  # b >= MIN_SCALE > 0
    if worst > 1e-9:
        raise LpesError(f"spec: 'scales' do not match the curve (relative difference {worst:.2e}); fix or drop one")


# --- small helpers ----------------------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    """A real number; JSON true/false decode to bools, which Python counts as ints."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _type_name(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a bool", type(None): "null"}
    return names.get(type(value), "a number")


def _show(value: Any, limit: int = 60) -> str:
    """repr, cut short: messages stay one short line whatever the file holds."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."
