"""Bezier curves that map layer depth to a RoPE scale (docs/method.md, section 2).

A curve of degree d has control points P_0..P_d, each (x = layer position, y = scale).
Layer h sits at x_h = P_0.x + (P_d.x - P_0.x) / (L - 1) * h (Eq. 6); its scale is
B_y(t_h) where B_x(t_h) = x_h (Eq. 5). With non-decreasing control-point x, B_x is
non-decreasing in t, so bisection finds t_h.

The functions assume what lpes.foundation.spec checks on load: 2 to MAX_DEGREE + 1 control points,
finite, x non-decreasing with P_d.x > P_0.x (equal end x would put every layer at t = 0).
"""

from __future__ import annotations

from math import comb

import numpy as np

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


def layer_parameters(points: np.ndarray, num_layers: int) -> np.ndarray:
    """t_h for each layer: the bisection solution of B_x(t) = x_h, exactly 0 and 1 at the ends."""
    points = np.asarray(points, dtype=np.float64)
    if num_layers == 1:
        return np.zeros(1)
    x0, xd = points[0, 0], points[-1, 0]
    targets = x0 + (xd - x0) / (num_layers - 1) * np.arange(num_layers)
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
