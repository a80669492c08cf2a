"""The search space: Bezier control points on a grid (docs/method.md, sections 2-3).

A genome holds, for a curve of degree d, the x of the d - 1 interior control points
(on the layer grid 0..L-1, kept sorted so x is non-decreasing) and the y of all d + 1
points (indices into the scale grid). The end points sit at the first and last layer.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass

from lpes.foundation.errors import LpesError
from lpes.foundation.spec import MAX_SCALE, MIN_SCALE, Spec

MAX_GRID_VALUES = 1000  # a genome's y indexes the grid; a 1e-9 step would allocate billions of values


@dataclass(frozen=True)
class ScaleGrid:
    values: tuple[float, ...]

    @classmethod
    def parse(cls, text: str) -> ScaleGrid:
        """MIN:MAX:STEP, both ends included (e.g. 1:4:0.25)."""
        try:
            low, high, step = (float(part) for part in text.split(":"))
        except ValueError:
            raise LpesError(f"--scale-grid must be MIN:MAX:STEP, got {text!r}") from None
        if not all(math.isfinite(v) for v in (low, high, step)):
            raise LpesError(f"--scale-grid {text!r}: MIN, MAX and STEP must be finite numbers")
        if step <= 0 or low <= 0 or high < low:
            raise LpesError(f"--scale-grid {text!r} has no values (need 0 < MIN <= MAX and STEP > 0)")
        if low < MIN_SCALE or high > MAX_SCALE:
            raise LpesError(f"--scale-grid {text!r}: scales must lie in [{MIN_SCALE:g}, {MAX_SCALE:g}] (as in a spec)")
        count = int(round((high - low) / step)) + 1
        if count > MAX_GRID_VALUES:
            raise LpesError(f"--scale-grid {text!r} has {count} values; at most {MAX_GRID_VALUES} (a larger STEP)")
        values = tuple(round(low + i * step, 10) for i in range(count) if low + i * step <= high + 1e-9)
        return cls(values)

    def nearest(self, value: float) -> int:
        return min(range(len(self.values)), key=lambda i: abs(self.values[i] - value))


@dataclass(frozen=True, order=True)
class Genome:
    interior_x: tuple[int, ...]
    y_index: tuple[int, ...]

    def control_points(self, grid: ScaleGrid, num_layers: int) -> list[list[float]]:
        xs = [0, *self.interior_x, num_layers - 1]
        return [[float(x), grid.values[i]] for x, i in zip(xs, self.y_index)]

    def spec(self, grid: ScaleGrid, num_layers: int) -> Spec:
        return Spec.from_curve(self.control_points(grid, num_layers), num_layers)

    def to_json(self) -> list[list[int]]:
        return [list(self.interior_x), list(self.y_index)]

    @classmethod
    def from_json(cls, data: list[list[int]]) -> Genome:
        return cls(tuple(data[0]), tuple(data[1]))


@dataclass(frozen=True)
class Curve:
    """A curve off the grid: control points (x, scale) that a gradient search moves continuously."""

    points: tuple[tuple[float, float], ...]

    def control_points(self, grid: ScaleGrid, num_layers: int) -> list[list[float]]:
        return [list(p) for p in self.points]

    def spec(self, grid: ScaleGrid, num_layers: int) -> Spec:
        return Spec.from_curve(self.control_points(grid, num_layers), num_layers)

    def to_json(self) -> dict:
        return {"points": [list(p) for p in self.points]}


def curve_from_json(data) -> Genome | Curve:
    """A checkpoint's best curve: a Genome on the grid (GA, CMA-ES) or a Curve (gradient)."""
    if isinstance(data, dict):
        return Curve(tuple((float(x), float(y)) for x, y in data["points"]))
    return Genome.from_json(data)


@dataclass(frozen=True)
class SearchSpace:
    grid: ScaleGrid
    num_layers: int
    degree: int

    def identity(self) -> Genome:
        """The unscaled model (every y at the grid value nearest 1.0)."""
        one = self.grid.nearest(1.0)
        return Genome(self._even_x(), (one,) * (self.degree + 1))

    def uniform(self, scale: float) -> Genome:
        """Every layer at the grid value nearest `scale`."""
        return Genome(self._even_x(), (self.grid.nearest(scale),) * (self.degree + 1))

    def random(self, rng: random.Random) -> Genome:
        xs = tuple(sorted(rng.randrange(self.num_layers) for _ in range(self.degree - 1)))
        ys = tuple(rng.randrange(len(self.grid.values)) for _ in range(self.degree + 1))
        return Genome(xs, ys)

    def mutate(self, genome: Genome, rng: random.Random, rate: float) -> Genome:
        """Each gene moves with probability `rate`: y to a neighbouring or random grid value, x by a few layers."""
        ys = [self._mutate_y(i, rng) if rng.random() < rate else i for i in genome.y_index]
        xs = [self._mutate_x(x, rng) if rng.random() < rate else x for x in genome.interior_x]
        return Genome(tuple(sorted(xs)), tuple(ys))

    def crossover(self, a: Genome, b: Genome, rng: random.Random, rate: float) -> Genome:
        """Uniform crossover: each gene comes from `b` with probability `rate`."""
        ys = tuple(yb if rng.random() < rate else ya for ya, yb in zip(a.y_index, b.y_index))
        xs = tuple(xb if rng.random() < rate else xa for xa, xb in zip(a.interior_x, b.interior_x))
        return Genome(tuple(sorted(xs)), ys)

    def scales_key(self, genome: Genome) -> tuple[float, ...]:
        """The rounded scale vector: two genomes with the same key are the same model."""
        return _scales_key(genome, self.grid, self.num_layers)

    def _even_x(self) -> tuple[int, ...]:
        return tuple(round(k * (self.num_layers - 1) / self.degree) for k in range(1, self.degree))

    def _mutate_y(self, index: int, rng: random.Random) -> int:
        if rng.random() < 0.5:  # small step keeps good curves nearby; a random jump escapes plateaus
            return min(max(index + rng.choice((-1, 1)), 0), len(self.grid.values) - 1)
        return rng.randrange(len(self.grid.values))

    def _mutate_x(self, x: int, rng: random.Random) -> int:
        step = max(1, self.num_layers // 8)
        return min(max(x + rng.randint(-step, step), 0), self.num_layers - 1)


@functools.lru_cache(maxsize=4096)
def _scales_key(genome: Genome, grid: ScaleGrid, num_layers: int) -> tuple[float, ...]:
    # Racing asks for a genome's key at every check, and a Bezier curve's scales take milliseconds to solve.
    return tuple(round(s, 6) for s in genome.spec(grid, num_layers).scales)
