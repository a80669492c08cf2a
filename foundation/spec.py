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
outside `provenance` must be known, no key may appear twice, and bools are not numbers
(the file's bytes and JSON: spec_file.py; the fields other stages read: spec_fields.py).
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
(converter.fingerprint.model_fingerprint: architecture, RoPE, and where lpes-search wrote it `name`,
`config_sha256` and `weights_sha256`, strings); `base_model` the model a conversion applied it to.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lpes.foundation import bezier
from lpes.foundation.decision import Decision
from lpes.foundation.errors import LpesError, shown
from lpes.foundation.files import write_bytes_atomic
from lpes.foundation.provenance import Provenance, SearchTask, Shipped
from lpes.foundation.rope_schemes import SCHEMES, StockRope
from lpes.foundation.spec_fields import (
    FORMAT,
    MAX_ANSWER_TOKENS,
    MAX_LAYERS,
    MAX_SCALE,
    MIN_SCALE,
    ROPE_SCHEMES,
    STOCK_ROPE_TYPES,
    VERSION,
    YARN_DEFAULT_BETAS,
    check_header,
    check_keys,
    check_rope,
    check_scales,
    control_point,
    is_int,
    show,
)
from lpes.foundation.spec_file import check_size, decode_spec_json, read_spec_file

__all__ = ["Curve", "SearchTask", "Spec", "StockRope", "dump_spec", "load_spec", "parse_spec",
           # the format's ranges, which other stages read from here (defined with the fields' checks)
           "MAX_ANSWER_TOKENS", "MAX_LAYERS", "MAX_SCALE", "MIN_SCALE", "STOCK_ROPE_TYPES"]

MAX_DEGREE = bezier.MAX_DEGREE

TOP_LEVEL_KEYS = ("format", "version", "num_layers", "scales", "curve", "control_points", "degree", "rope_type",
                  "rope_parameters", "provenance")
CURVE_KEYS = ("degree", "control_points")


@dataclass(frozen=True)
class Curve:
    control_points: tuple[tuple[float, float], ...]

    @property
    def degree(self) -> int:
        return len(self.control_points) - 1

    def scales(self, num_layers: int) -> list[float]:
        """The per-layer scales, within the control points' y range; LpesError where float64 cannot evaluate
        the curve for `num_layers` layers to within 1e-9 of its exact value (bezier.checked_layer_scales)."""
        return bezier.checked_layer_scales(self.control_points, num_layers)

    def to_json(self) -> dict[str, Any]:
        return {"degree": self.degree, "control_points": [list(p) for p in self.control_points]}


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
        return SCHEMES[self.rope_type].length_dependent

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
    provenance: Provenance = Provenance({})
    rope: RopeScheme = LINEAR_ROPE

    @property
    def num_layers(self) -> int | None:
        return None if self.scales is None else len(self.scales)

    @property
    def best_uniform_scale(self) -> float | None:
        """The best single scale lpes-search found (`provenance.search.best_uniform_scale`), if recorded.

        The baseline validation holds a per-layer curve against; written by the search, read by validation.
        """
        return self.provenance.search.best_uniform_scale if self.provenance.search else None

    @property
    def stock_baselines(self) -> tuple[StockRope, ...]:
        """The stock RoPE types lpes-search found best on calibration, each at its factor (none if not scanned)."""
        return self.provenance.search.stock_baselines if self.provenance.search else ()

    @property
    def search_task(self) -> SearchTask | None:
        """The task lpes-search calibrated on (`provenance.search.task`), None if not recorded."""
        return self.provenance.search.task if self.provenance.search else None

    @property
    def searched_model(self) -> dict[str, Any] | None:
        """The fingerprint of the model the curve was searched on (`provenance.model`), None if not recorded."""
        model = self.provenance.model
        return dict(model) if isinstance(model, Mapping) else None

    @property
    def base_model(self) -> str | None:
        """The model the spec was searched on or converted from (`provenance.base_model`), if recorded."""
        return self.provenance.base_model

    @property
    def decision(self) -> Decision | None:
        """lpes-search's held-out decision (`provenance.decision`, foundation/decision.py), checked when the spec
        was read: None in a spec written before it existed or searched with --holdout 0."""
        return self.provenance.decision

    @property
    def serving_limit(self) -> int | None:
        """The longest prompt what this spec holds was checked to serve, where the decision's ladder of lengths
        limits it below the model's own context (foundation/decision.py Lengths); None: no limit."""
        decision = self.decision
        if decision is None or decision.lengths is None or self.scales is None:
            return None
        held = decision.row_computing(self.scales, self.rope.rope_type)
        return None if held is None else decision.lengths.limit_for(held, decision.alpha)

    def as_decided(self) -> Spec:
        """The spec of what the decision ships: the unscaled model, one scale or stock factor in every layer, or
        this curve; the provenance (decision included) kept. Needs the scales resolved (`for_layers`)."""
        ship = self.decision.ship if self.decision else None
        layers = len(self.scales)
        if ship is None or ship.kind == "per-layer":
            return self
        if ship.kind == "per-type":  # its row holds the scales, read off the model's layer types by the search
            return Spec.from_scales(list(self.decision.shipped_row.scales), self.provenance)
        if ship.kind == "unscaled":
            return Spec.from_scales([1.0] * layers, self.provenance)
        rope = LINEAR_ROPE if ship.kind == "uniform" else RopeScheme(ship.rope_type)
        return Spec.from_scales([ship.factor] * layers, self.provenance, rope)

    def for_layers(self, num_layers: int) -> Spec:
        """This spec resolved for a model with `num_layers` decoder layers (scales filled in, count checked)."""
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= MAX_LAYERS:
            raise LpesError(f"the model has {show(num_layers)} layers; lpes supports 1..{MAX_LAYERS}")
        if self.scales is None:
            scales = tuple(check_scales(self.curve.scales(num_layers), "curve"))
            _check_scheme_scales(scales, self.rope, "curve")
            return replace(self, scales=scales)
        if len(self.scales) != num_layers:
            raise LpesError(f"spec: 'scales' has {len(self.scales)} entries but the model has {num_layers} layers")
        _check_scheme_scales(self.scales, self.rope, "scales")
        return self

    @classmethod
    def from_curve(cls, control_points, num_layers: int, provenance: Provenance | Mapping | None = None,
                   rope: RopeScheme = LINEAR_ROPE) -> Spec:
        curve = _parse_curve({"control_points": control_points}, "curve.")
        return cls(None, curve, Provenance.of(provenance), rope).for_layers(num_layers)

    @classmethod
    def from_scales(cls, scales, provenance: Provenance | Mapping | None = None,
                    rope: RopeScheme = LINEAR_ROPE) -> Spec:
        checked = tuple(check_scales(scales, "scales"))
        _check_scheme_scales(checked, rope, "scales")
        return cls(checked, None, Provenance.of(provenance), rope)

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
        out["provenance"] = self.provenance.to_json()
        return out


def load_spec(path: str | os.PathLike, num_layers: int | None = None) -> Spec:
    """Read and validate a spec file; with `num_layers`, also check (or derive) the scales for it."""
    path = Path(path)
    spec = parse_spec(decode_spec_json(read_spec_file(path), path))
    return spec.for_layers(num_layers) if num_layers is not None else spec


def dump_spec(spec: Spec, path: str | os.PathLike) -> None:
    """Write `spec` to `path` atomically; refuses (LpesError) what load_spec would refuse to read back."""
    try:
        data = (json.dumps(spec.to_json(), indent=2, allow_nan=False) + "\n").encode()
    except ValueError:  # NaN or an infinity somewhere (the provenance is free-form): not JSON
        raise LpesError(f"cannot write {shown(path)}: the spec holds NaN or an infinite number, which JSON cannot "
                        "hold") from None
    check_size(len(data), Path(path))
    parse_spec(decode_spec_json(data, Path(path)))
    write_bytes_atomic(Path(path), data)


def parse_spec(data: Any) -> Spec:
    """Validate a decoded spec; every error names the field and what is wrong."""
    if not isinstance(data, dict):
        raise LpesError("spec: top level must be a JSON object")
    check_keys(data, TOP_LEVEL_KEYS, "")
    check_header(data)
    num_layers = data.get("num_layers")
    if num_layers is not None and not (is_int(num_layers) and 1 <= num_layers <= MAX_LAYERS):
        raise LpesError(f"spec: 'num_layers' must be an integer in 1..{MAX_LAYERS}, got {show(num_layers)}")
    curve = _curve_of(data)
    scales = data.get("scales")
    if scales is None and curve is None:
        raise LpesError("spec: needs 'scales' or a curve ('curve' or 'control_points')")
    provenance = Provenance.parse(data.get("provenance", {}))
    decision, shipped = provenance.decision, provenance.shipped
    rope = RopeScheme(*check_rope(data))
    spec = Spec(None if scales is None else tuple(check_scales(scales, "scales")), curve, provenance, rope)
    if spec.scales is not None:
        _check_scheme_scales(spec.scales, rope, "scales")
    if num_layers is not None:
        if spec.scales is not None and len(spec.scales) != num_layers:
            raise LpesError(f"spec: 'scales' has {len(spec.scales)} entries but 'num_layers' is {num_layers}")
        spec = spec.for_layers(num_layers)
    if spec.scales is not None and curve is not None:
        _check_scales_match_curve(spec.scales, curve)
    if decision is not None and scales is not None:
        _check_decision_matches(decision, shipped, spec)
    return spec


def _check_decision_matches(decision: Decision, shipped: Shipped | None, spec: Spec) -> None:
    """The scales the spec holds are what its decision says: the decision's row where lpes-convert shipped the
    decision, else (lpes-search's spec, or --ship curve) the per-layer row, where the table has one."""
    held = decision.row_computing(spec.scales, spec.rope.rope_type)
    if shipped is not None and shipped.ship == "decision":
        if held is None or held.name != decision.ship.name:
            raise LpesError(f"spec: 'provenance.shipped' says the decision, {decision.ship.name}, ships, but the "
                            f"spec's scales and rope_type compute {held.name if held else 'none of its candidates'}")
        return
    curve = next((r for r in decision.rows if r.kind == "per-layer"), None)
    if curve is not None and held is not curve:
        raise LpesError(f"spec: the decision's {curve.name!r} row does not hold the spec's scales and rope_type "
                        f"(they compute {held.name if held else 'none of its candidates'})")


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
        check_keys(data if isinstance(data, dict) else {}, CURVE_KEYS, where)
        raise LpesError(f"spec: '{where.rstrip('.') or 'curve'}' must be an object with 'control_points'")
    check_keys(data, CURVE_KEYS, where)
    name = f"{where}control_points"
    points = data["control_points"]
    if not isinstance(points, (list, tuple)) or len(points) < 2:
        raise LpesError(f"spec: '{name}' must be a list of at least 2 [x, y] points")
    if len(points) > MAX_DEGREE + 1:  # before any work: 1200 points overflow the binomials
        raise LpesError(f"spec: '{name}' has {len(points)} points (degree {len(points) - 1}); "
                        f"the degree must be at most {MAX_DEGREE}")
    parsed = [control_point(point, f"{name}[{i}]") for i, point in enumerate(points)]
    for i in range(1, len(parsed)):
        if parsed[i][0] < parsed[i - 1][0]:
            raise LpesError(f"spec: '{name}' x must be non-decreasing (point {i} goes back)")
    span = parsed[-1][0] - parsed[0][0]
    if not (math.isfinite(span) and span > 0):  # equal x put every layer at t = 0
        raise LpesError(f"spec: '{name}' x span (last x - first x) must be finite and > 0, got {span!r}")
    degree = data.get("degree")
    if degree is not None:
        if not is_int(degree):
            raise LpesError(f"spec: '{where}degree' must be an integer, got {show(degree)}")
        if degree != len(parsed) - 1:
            raise LpesError(f"spec: '{where}degree' is {degree} but {len(parsed)} control points make degree "
                            f"{len(parsed) - 1}")
    return Curve(tuple(parsed))


def _check_scheme_scales(scales, rope: RopeScheme, name: str) -> None:
    """YaRN and dynamic NTK take factors >= 1 (below it neither extends anything; transformers warns)."""
    if rope.linear:
        return
    least = SCHEMES[rope.rope_type].least_factor
    for i, value in enumerate(scales):
        if value < least:
            where = f"'{name}[{i}]' is" if name == "scales" else f"the curve gives layer {i} the scale"
            raise LpesError(f"spec: {where} {show(value)}; a {rope.name} factor (rope_type "
                            f"{rope.rope_type!r}) must be at least 1")


def _check_scales_match_curve(scales: tuple[float, ...], curve: Curve) -> None:
    expected = curve.scales(len(scales))
    worst = max(abs(a - b) / b for a, b in zip(scales, expected))  # b >= MIN_SCALE > 0
    if worst > 1e-9:
        raise LpesError(f"spec: 'scales' do not match the curve (relative difference {worst:.2e}); fix or drop one")
