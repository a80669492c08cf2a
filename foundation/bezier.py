"""Bezier curves that map layer depth to a RoPE scale (docs/method.md, section 2).

A curve of degree d has control points P_0..P_d, each (x = layer position, y = scale).
Layer h sits at x_h = P_0.x + (P_d.x - P_0.x) / (L - 1) * h (Eq. 6); its scale is
B_y(t_h) where B_x(t_h) = x_h (Eq. 5). With non-decreasing control-point x, B_x is
non-decreasing in t, so bisection finds t_h.

The functions assume what lpes.foundation.spec checks on load: 2 to MAX_DEGREE + 1 control points,
finite, x non-decreasing with P_d.x > P_0.x (equal end x would put every layer at t = 0).
"""

from __future__ import annotations

import math
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


def layer_scales(points: np.ndarray, num_layers: int, t: np.ndarray | None = None) -> list[float]:
    """The per-layer scales s_h read off the curve (exact control-point y at both ends); `t`: the layers'
    parameters if already solved (layer_parameters)."""
    points = np.asarray(points, dtype=np.float64)
    scales = bernstein(points, layer_parameters(points, num_layers) if t is None else t)[:, 1]
    scales[0] = points[0, 1]
    if num_layers > 1:
        scales[-1] = points[-1, 1]
    return [float(s) for s in scales]


def checked_layer_scales(points, num_layers: int) -> list[float]:
    """The per-layer scales, clipped to the control points' y range (a Bezier curve stays within it, so rounding
    never takes a scale past the range they were checked for); LpesError (one line, naming a control point) when
    float64 cannot give the layers distinct, ordered positions, or when a scale is more than EXACT_TOLERANCE from
    the same curve evaluated exactly (ExactCurve)."""
    points = [(float(x), float(y)) for x, y in points]
    _check_positions(points, num_layers)
    ys = [y for _, y in points]
    t = layer_parameters(points, num_layers)
    scales = [float(s) for s in np.clip(layer_scales(points, num_layers, t), min(ys), max(ys))]
    exact = ExactCurve(points, num_layers)
    for h, (scale, t_h) in enumerate(zip(scales, t)):
        exact_scale = exact.scale(h, float(t_h))
        if abs(exact_scale - Fraction(scale)) > EXACT_TOLERANCE:
            raise LpesError(f"spec: the curve gives layer {h} of {num_layers} the scale {scale!r} in float64, but "
                            f"{float(exact_scale)!r} evaluated exactly; its control points (P0 at x "
                            f"{points[0][0]!r}, P{len(points) - 1} at x {points[-1][0]!r}) are beyond float64's "
                            "precision: shift or rescale the x values (e.g. 0 to the layer count)")
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


class ExactCurve:
    """The curve in exact rational arithmetic, as integers: every float is m 2^e, so with one power-of-two
    denominator D the control points are integers, and at t = p / 2^K the Bernstein sum times 2^(K d) D is an
    integer polynomial in p (no gcd on the way: fractions.Fraction took 40 s for 4,096 layers).

    K is chosen so that one step of t, 2^-K, moves B_y by at most a tenth of EXACT_TOLERANCE (B_y moves at most
    degree x max|dy| per unit of t): a bracket [p - 1, p + 1] of the exact t* = B_x^-1(x_h) gives B_y(t*) to
    well within the tolerance."""

    def __init__(self, points: list[tuple[float, float]], num_layers: int):
        exact = [(Fraction(x), Fraction(y)) for x, y in points]
        self.denominator = max(v.denominator for point in exact for v in point)  # powers of two: the lcm
        self.xs = [int(x * self.denominator) for x, _ in exact]
        self.ys = [int(y * self.denominator) for _, y in exact]
        self.degree, self.layers = len(points) - 1, num_layers
        self.binomials = [comb(self.degree, k) for k in range(self.degree + 1)]
        ys = [y for _, y in exact]
        steepest = self.degree * max(abs(b - a) for a, b in zip(ys, ys[1:]))
        self.flat = steepest == 0  # every y equal: the curve is that y everywhere
        self.bits = 1 if self.flat else max(1, math.ceil(math.log2(20 * float(steepest) / EXACT_TOLERANCE)))
        self.scale_of_sum = Fraction(1, 2 ** (self.bits * self.degree) * self.denominator)

    def scale(self, h: int, t_h: float) -> Fraction:
        """B_y at layer h's exact parameter; `t_h` (the float64 solution) is tried as the bracket's centre first."""
        if self.flat:
            return Fraction(self.ys[0], self.denominator)
        one = 1 << self.bits
        p = min(max(round(t_h * one), 1), one - 1)
        if not (self._below(p - 1, h, strict=False) and not self._below(p + 1, h)):  # B_x(p-1) <= x_h < B_x(p+1)
            lo, hi = 0, one  # B_x is non-decreasing: [0, 1] brackets every x_h
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if self._below(mid, h) else (lo, mid)
            p = lo
        return self._sum(self.ys, p) * self.scale_of_sum

    def _below(self, p: int, h: int, strict: bool = True) -> bool:
        """B_x(p / 2^K) < x_h (strict) or <= x_h, in integers."""
        steps = max(self.layers - 1, 1)
        left = self._sum(self.xs, p) * steps
        right = (self.xs[0] * steps + (self.xs[-1] - self.xs[0]) * h) << (self.bits * self.degree)
        return left < right if strict else left <= right

    def _sum(self, coefficients: list[int], p: int) -> int:
        q, d = (1 << self.bits) - p, self.degree
        p_powers, q_powers = [1], [1]
        for _ in range(d):
            p_powers.append(p_powers[-1] * p)
            q_powers.append(q_powers[-1] * q)
        return sum(b * p_powers[k] * q_powers[d - k] * c
                   for k, (b, c) in enumerate(zip(self.binomials, coefficients)))
