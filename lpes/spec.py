"""The spec file (best.json): the one format that passes between the stages.

    {
      "format": "lpes-spec",
      "version": 1,
      "num_layers": 4,                                  # decoder layers the scales are for
      "scales": [4.0, 2.1, 1.3, 1.0],                   # s_h, finite and > 0, one per layer
      "curve": {"degree": 3,                            # optional: the Bezier curve
                "control_points": [[0, 4.0], [1, 1.0], [2, 1.0], [3, 1.0]]},
      "provenance": {"lpes_version": "0.1.0",           # optional, free-form below
                     "model": {...fingerprint...}, "search": {...}}
    }

A file may also hold only `scales`, or only a curve (`curve` or a top-level
`control_points`); the scales are then read off the curve for the model's layer count.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lpes import bezier
from lpes.errors import LpesError

FORMAT = "lpes-spec"
VERSION = 1


@dataclass(frozen=True)
class Curve:
    control_points: tuple[tuple[float, float], ...]

    @property
    def degree(self) -> int:
        return len(self.control_points) - 1

    def scales(self, num_layers: int) -> list[float]:
        return bezier.layer_scales(self.control_points, num_layers)

    def to_json(self) -> dict[str, Any]:
        return {"degree": self.degree, "control_points": [list(p) for p in self.control_points]}


@dataclass(frozen=True)
class Spec:
    """Per-layer RoPE scales, the curve they came from, and where they came from."""

    scales: tuple[float, ...] | None
    curve: Curve | None = None
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def num_layers(self) -> int | None:
        return None if self.scales is None else len(self.scales)

    def for_layers(self, num_layers: int) -> Spec:
        """This spec resolved for a model with `num_layers` decoder layers (scales filled in, count checked)."""
        if self.scales is None:
            return replace(self, scales=tuple(_check_scales(self.curve.scales(num_layers), "curve")))
        if len(self.scales) != num_layers:
            raise LpesError(f"spec: 'scales' has {len(self.scales)} entries but the model has {num_layers} layers")
        return self

    @classmethod
    def from_curve(cls, control_points, num_layers: int, provenance: dict | None = None) -> Spec:
        curve = _parse_curve({"control_points": control_points}, "curve")
        return cls(None, curve, dict(provenance or {})).for_layers(num_layers)

    @classmethod
    def from_scales(cls, scales, provenance: dict | None = None) -> Spec:
        return cls(tuple(_check_scales(scales, "scales")), None, dict(provenance or {}))

    def to_json(self) -> dict[str, Any]:
        if self.scales is None:
            raise LpesError("spec: cannot write a curve-only spec without a layer count; call for_layers first")
        out: dict[str, Any] = {"format": FORMAT, "version": VERSION, "num_layers": len(self.scales)}
        out["scales"] = list(self.scales)
        if self.curve is not None:
            out["curve"] = self.curve.to_json()
        out["provenance"] = self.provenance
        return out


def load_spec(path: str | os.PathLike, num_layers: int | None = None) -> Spec:
    """Read and validate a spec file; with `num_layers`, also check (or derive) the scales for it."""
    path = Path(path)
    if not path.is_file():
        raise LpesError(f"spec file not found: {path}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise LpesError(f"spec file {path} is not valid JSON: {err}") from None
    spec = parse_spec(data)
    return spec.for_layers(num_layers) if num_layers is not None else spec


def parse_spec(data: Any) -> Spec:
    """Validate a decoded spec; every error names the field and what is wrong."""
    if not isinstance(data, dict):
        raise LpesError("spec: top level must be a JSON object")
    if data.get("format", FORMAT) != FORMAT:
        raise LpesError(f"spec: 'format' is {data['format']!r}, expected {FORMAT!r}")
    version = data.get("version", VERSION)
    if version != VERSION:
        raise LpesError(f"spec: 'version' {version!r} is not supported (this lpes reads version {VERSION})")
    curve_data = data.get("curve")
    if curve_data is None and "control_points" in data:
        curve_data = {"control_points": data["control_points"], "degree": data.get("degree")}
    curve = _parse_curve(curve_data, "curve") if curve_data is not None else None
    scales = data.get("scales")
    if scales is None and curve is None:
        raise LpesError("spec: needs 'scales' or a curve ('curve' or 'control_points')")
    provenance = data.get("provenance", {})
    if not isinstance(provenance, dict):
        raise LpesError("spec: 'provenance' must be an object")
    spec = Spec(None if scales is None else tuple(_check_scales(scales, "scales")), curve, provenance)
    num_layers = data.get("num_layers")
    if num_layers is not None:
        if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
            raise LpesError(f"spec: 'num_layers' must be a positive integer, got {num_layers!r}")
        spec = spec.for_layers(num_layers)
    if spec.scales is not None and curve is not None:
        _check_scales_match_curve(spec.scales, curve)
    return spec


def dump_spec(spec: Spec, path: str | os.PathLike) -> None:
    """Write `spec` to `path` atomically (a temporary file renamed into place)."""
    write_text_atomic(Path(path), json.dumps(spec.to_json(), indent=2) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write through a temporary file in the same folder, renamed into place: never a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _check_scales(scales: Any, name: str) -> list[float]:
    if not isinstance(scales, (list, tuple)) or not scales:
        raise LpesError(f"spec: '{name}' must be a non-empty list of numbers")
    out = []
    for i, value in enumerate(scales):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise LpesError(f"spec: '{name}[{i}]' must be a number, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise LpesError(f"spec: '{name}[{i}]' must be finite and > 0, got {value!r}")
        out.append(float(value))
    return out


def _parse_curve(data: Any, name: str) -> Curve:
    if not isinstance(data, dict) or "control_points" not in data:
        raise LpesError(f"spec: '{name}' must be an object with 'control_points'")
    points = data["control_points"]
    if not isinstance(points, (list, tuple)) or len(points) < 2:
        raise LpesError(f"spec: '{name}.control_points' must be a list of at least 2 [x, y] points")
    parsed = []
    for i, point in enumerate(points):
        ok = isinstance(point, (list, tuple)) and len(point) == 2
        ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in point)
        if not ok or not all(math.isfinite(v) for v in point):
            raise LpesError(f"spec: '{name}.control_points[{i}]' must be a pair of finite numbers, got {point!r}")
        if point[1] <= 0:
            raise LpesError(f"spec: '{name}.control_points[{i}]' has scale (y) {point[1]!r}; it must be > 0")
        if parsed and point[0] < parsed[-1][0]:
            raise LpesError(f"spec: '{name}.control_points' x must be non-decreasing (point {i} goes back)")
        parsed.append((float(point[0]), float(point[1])))
    degree = data.get("degree")
    if degree is not None and degree != len(parsed) - 1:
        made = len(parsed) - 1
        raise LpesError(f"spec: '{name}.degree' is {degree} but {len(parsed)} control points make degree {made}")
    return Curve(tuple(parsed))


def _check_scales_match_curve(scales: tuple[float, ...], curve: Curve) -> None:
    expected = curve.scales(len(scales))
    worst = max(abs(a - b) / b for a, b in zip(scales, expected))
    if worst > 1e-9:
        raise LpesError(f"spec: 'scales' do not match the curve (relative difference {worst:.2e}); fix or drop one")
