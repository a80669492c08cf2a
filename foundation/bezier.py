"""Bezier curves that map layer depth to a RoPE scale (docs/method.md, section 2).

A curve of degree d has control points P_0..P_d, each (x = layer position, y = scale).
Layer h sits at x_h = P_0.x + (P_d.x - P_0.x) / (L - 1) * h (Eq. 6); its scale is
B_y(t_h) where B_x(t_h) = x_h (Eq. 5). With non-decreasing control-point x, B_x is
non-decreasing in t, so bisection finds t_h.

The functions assume what lpes.foundation.spec checks on load: 2 to MAX_DEGREE + 1 control points,
finite, x non-decreasing with P_d.x > P_0.x (equal end x would put every layer at t = 0).
"""

from __future__ import annotations

from fractions import Fraction
from math import comb

import numpy as np

from lpes.foundation.errors import LpesError

_BISECTION_STEPS = 64  # halves [0, 1] down to below float64 resolution
# The papers use cubic curves. Far higher degrees add nothing a smooth depth profile needs, and
# past a few hundred the binomials C(d, k) no longer fit a float64.
MAX_DEGREE = 16


def bernstein(points: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Evaluate the curve at parameters `t` (shape [n]); returns shape [n, 2] (Eq. 3-4)."""
    points = np.asarray(points, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)[:, None]
    degree = len(points) - 1
    weights = [comb(degree, k) * t**k * (1 - t) ** (degree - k) for k in range(1, degree + 1)]
    # Written as P_0 + sum_k w_k (P_k - P_0) (the weights sum to 1) so that equal control
    # values give exactly that value, with no rounding from summing the weights.
    return points[0] + sum(w * (p - points[0]) for w, p in zip(weights, points[1:]))


# How far a curve's float64 scales may be from its exact (rational) evaluation before it is refused.
EXACT_TOLERANCE = 1e-9


def layer_positions(points: np.ndarray, num_layers: int) -> list[float]:
    """x_h for each layer, in float64 as the spec defines them (Eq. 6): P_0.x + (P_d.x - P_0.x) h / (L - 1)."""
    first, last = float(points[0][0]), float(points[-1][0])
    return [first + (last - first) * h / max(num_layers - 1, 1) for h in range(num_layers)]


def layer_parameters(points: np.ndarray, num_layers: int) -> np.ndarray:
    """t_h for each layer: the bisection solution of B_x(t) = x_h, exactly 0 and 1 at the ends."""
    points = np.array(points, dtype=np.float64)
    if num_layers == 1:
        return np.zeros(1)
    # Measured from P_0.x: the same curve, but x = 1e16 + k no longer rounds the targets to float64's
    # spacing there (2), which gave two layers one position.
    points[:, 0] -= points[0, 0]
    targets = points[-1, 0] / (num_layers - 1) * np.arange(num_layers)
    lo, hi = np.zeros(num_layers), np.ones(num_layers)
    for _ in range(_BISECTION_STEPS):
        mid = (lo + hi) / 2
        below = bernstein(points, mid)[:, 0] < targets
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    t = (lo + hi) / 2
    t[0], t[-1] = 0.0, 1.0
    return t


def layer_scales(points: np.ndarray, num_layers: int) -> list[float]:
    """The per-layer scales s_h read off the curve (exact control-point y at both ends)."""
    points = np.asarray(points, dtype=np.float64)
    scales = bernstein(points, layer_parameters(points, num_layers))[:, 1]
    scales[0] = points[0, 1]
    if num_layers > 1:
        scales[-1] = points[-1, 1]
    return [float(s) for s in scales]


def checked_layer_scales(points, num_layers: int) -> list[float]:
    """The per-layer scales, clipped to the control points' y range (a Bezier curve stays within it, so rounding
    never takes a scale past the range they were checked for); LpesError (one line, naming a control point) when
    float64 cannot give the layers distinct, ordered positions, or when a scale is more than EXACT_TOLERANCE from
    the same curve evaluated exactly (fractions.Fraction)."""
    points = [(float(x), float(y)) for x, y in points]
    _check_positions(points, num_layers)
    ys = [y for _, y in points]
    scales = [float(s) for s in np.clip(layer_scales(points, num_layers), min(ys), max(ys))]
    t = layer_parameters(points, num_layers)
    exact_points = [(Fraction(x), Fraction(y)) for x, y in points]
    for h, (scale, t_h) in enumerate(zip(scales, t)):
        exact = _exact_scale(exact_points, num_layers, h, float(t_h))
        if abs(exact - Fraction(scale)) > EXACT_TOLERANCE:
            raise LpesError(f"spec: the curve gives layer {h} of {num_layers} the scale {scale!r} in float64, but "
                            f"{float(exact)!r} evaluated exactly; its control points (P0 at x {points[0][0]!r}, "
                            f"P{len(points) - 1} at x {points[-1][0]!r}) are beyond float64's precision: shift or "
                            "rescale the x values (e.g. 0 to the layer count)")
    return scales


def _check_positions(points: list[tuple[float, float]], num_layers: int) -> None:
    positions = layer_positions(points, num_layers)
    for h in range(1, num_layers):
        if not positions[h] > positions[h - 1]:
            last = len(points) - 1
            span = points[last][0] - points[0][0]
            if span / (num_layers - 1) > 0:  # the span would do from 0: P_0's offset drowns it
                raise LpesError(f"spec: the curve's control point P0 (x {points[0][0]!r}) is too far from 0 for "
                                f"its x span {span!r}: in float64 layers {h - 1} and {h} of {num_layers} get one "
                                "position; shift every x (e.g. start at 0)")
            raise LpesError(f"spec: the curve's control point P{last} (x {points[last][0]!r}) is too close to P0 "
                            f"(x {points[0][0]!r}): in float64 layers {h - 1} and {h} of {num_layers} get one "
                            "position; spread the x values (e.g. 0 to the layer count)")


def _exact_scale(points: list[tuple[Fraction, Fraction]], num_layers: int, h: int, t_h: float) -> Fraction:
    """B_y at layer h's exact parameter t* (B_x(t*) = x_h in rational arithmetic), known to within a tenth of
    EXACT_TOLERANCE: B_y moves at most degree * max|dy| per unit of t, so a bracket of t* that narrow is enough.
    The float64 solution t_h is tried as the bracket's centre first; bisection from [0, 1] only if it is off."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    degree = len(points) - 1
    target = xs[0] if num_layers == 1 else xs[0] + (xs[-1] - xs[0]) * Fraction(h, num_layers - 1)
    slope = degree * max(abs(b - a) for a, b in zip(ys, ys[1:]))
    if slope == 0:
        return ys[0]
    width = Fraction(EXACT_TOLERANCE) / 10 / slope

    def value(coords: list[Fraction], t: Fraction) -> Fraction:
        return sum(comb(degree, k) * t**k * (1 - t) ** (degree - k) * c for k, c in enumerate(coords))

    centre = Fraction(t_h)
    lo, hi = max(Fraction(0), centre - width / 2), min(Fraction(1), centre + width / 2)
    if not value(xs, lo) <= target <= value(xs, hi):
        lo, hi = Fraction(0), Fraction(1)  # B_x is non-decreasing: [0, 1] brackets every x_h
        while hi - lo > width:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if value(xs, mid) < target else (lo, mid)
    return value(ys, (lo + hi) / 2)
