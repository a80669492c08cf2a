"""CMA-ES over the GA's genome and grid (`--optimizer cmaes`), with the same exact racing.

The genome is the GA's (search/genome.py): the x of the interior control points on the layer
grid and the y of every control point on the scale grid. CMA-ES (the `cmaes` package, which
optuna's CmaEsSampler is built on) samples points of [0, 1]^n, one coordinate per gene, and
each point is rounded to the nearest genome (interior x sorted), so the search moves on the
grid and every candidate is a genome the GA could breed. It starts at the best uniform scale
of the raced uniform scan, which is also the best so far: the curve found can only match or
beat it on calibration.

What CMA-ES is told, and why racing stays exact: CMA-ES uses only the order of its samples.
Each generation the best `mu` (half the population) are ranked exactly by the selection rule
(fitness, then with `ties="gentle"` the smaller sum |log s_h|, then queue order), found by the
GA's racing with `keep = mu`; the rest are told as tied after them, in sampling order. Ranking
the rest would mean scoring them in full, and it is what racing skips: told this way, CMA-ES
gets exactly the same information whether racing is on or off, with any number of replicas,
so the search walks the same path and ends with the same curve. (The rest feed only CMA-ES's
active covariance update, which pushes the distribution away from them; their order there is
sampling order instead of fitness order.) A point rounded to a genome scored before costs
nothing; two samples of one genome take two places among the best `mu`.

The best curve is the best genome of any generation (the best of a generation is always among
its `mu` scored in full). Resuming replays CMA-ES from its seed and the ranks told so far
(kept in the checkpoint): the same samples, the same state, with no model call.
"""

from __future__ import annotations

import math
import random
from collections import Counter

from lpes.errors import LpesError
from lpes.search.ga import GeneticSearch, SearchState, _best, _rank
from lpes.search.genome import Genome

NAME = "cmaes"
SIGMA = 0.25  # initial step size, in units of each gene's range: a quarter of the grid


def default_population(degree: int) -> int:
    """CMA-ES's own population size for the genome's 2 * degree coordinates: 4 + floor(3 ln n)."""
    return 4 + math.floor(3 * math.log(2 * degree))


def _cmaes():
    try:
        import cmaes
    except ImportError:
        raise LpesError("--optimizer cmaes needs the cmaes package: pip install cmaes") from None
    return cmaes


class CMASearch(GeneticSearch):
    """CMA-ES in place of breeding; the uniform scan, racing, checkpoints and patience are the GA's."""

    def run(self, state: SearchState | None = None) -> SearchState:
        state = state or SearchState(failures=[0] * self.evaluator.num_examples)
        self._tokens_before = state.forward_tokens - self.evaluator.forward_tokens
        version = _cmaes().__version__
        if not state.parents:
            self._scan_uniform(state)
            state.parents = [self._known(self.space.uniform(state.uniform["scale"]), state)]
            state.optimizer = {"name": NAME, "version": version, "told": []}
        elif (state.optimizer or {}).get("name") != NAME or state.optimizer.get("version") != version:
            found = state.optimizer or {"name": "ga"}
            raise LpesError(f"the checkpoint is from {found['name']} {found.get('version', '')}".rstrip()
                            + f", not cmaes {version}: resume it with that, or delete it to start over")
        optimizer = self._replay(state)
        while len(state.optimizer["told"]) <= self.settings.generations and state.stop_reason is None:
            self._generation(state, optimizer)
        return state

    def _new_optimizer(self, state: SearchState):
        import numpy as np

        start = self._encode(self.space.uniform(state.uniform["scale"]))
        bounds = np.array([[0.0, 1.0]] * len(start))
        return _cmaes().CMA(mean=np.array(start), sigma=SIGMA, bounds=bounds, seed=self.settings.seed % 2**32,
                            population_size=self.settings.population)

    def _replay(self, state: SearchState):
        """CMA-ES as it was after the generations in `state`: the same samples, told the same ranks."""
        optimizer = self._new_optimizer(state)
        for told in state.optimizer["told"]:
            samples = [optimizer.ask() for _ in range(self.settings.population)]
            optimizer.tell(list(zip(samples, told)))
        return optimizer

    def _generation(self, state: SearchState, optimizer) -> None:
        generation = len(state.optimizer["told"])
        samples = [optimizer.ask() for _ in range(self.settings.population)]
        genomes = [self._decode(x) for x in samples]
        keys = [self._key(g) for g in genomes]
        counts = Counter(keys)
        distinct = list({k: g for k, g in zip(keys, genomes)}.items())
        known = [s for s in (self._known(g, state) for _, g in distinct) if s is not None]
        fresh = [g for k, g in distinct if state.seen.get(k, [None])[0] is None]
        state.duplicates_skipped += len(samples) - len(fresh)
        mu = max(1, self.settings.parents)
        label = self._label(generation, "first population") if generation == 0 else self._label(generation)
        scored = self._race(fresh, state, known, mu, label, known=len(known), counts=counts)
        full = {self._key(s.genome): s for s in known + scored}
        # The best `mu` samples, exactly ranked; every other sample is told as tied after them.
        order = sorted((j for j in range(len(samples)) if keys[j] in full),
                       key=lambda j: (_rank(full[keys[j]], self._total), j))[:mu]
        told = [float(len(samples))] * len(samples)
        for place, j in enumerate(order):
            told[j] = float(place)
        optimizer.tell(list(zip(samples, told)))
        state.optimizer["told"].append(told)
        before = state.parents[0]
        state.parents = _best(state.parents + list(full.values()), 1, self._total)
        state.generation = generation
        if generation:
            self._track_best(state, before)
        self._end_generation(state, random.Random(0), scored)

    def _encode(self, genome: Genome) -> list[float]:
        layers, values = self.space.num_layers - 1, len(self.space.grid.values) - 1
        return ([x / layers if layers else 0.0 for x in genome.interior_x]
                + [y / values if values else 0.0 for y in genome.y_index])

    def _decode(self, point) -> Genome:
        layers, values = self.space.num_layers - 1, len(self.space.grid.values) - 1
        inner = self.space.degree - 1
        xs = tuple(sorted(_nearest(float(u), layers) for u in point[:inner]))
        return Genome(xs, tuple(_nearest(float(u), values) for u in point[inner:]))


def _nearest(unit: float, top: int) -> int:
    """The grid index nearest `unit` * top, within 0..top (halves round up, the same on every machine)."""
    return min(top, max(0, math.floor(unit * top + 0.5)))
