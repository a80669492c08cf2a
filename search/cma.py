"""CMA-ES over the GA's genome and grid (`--optimizer cmaes`), raced exactly against the best so far.

The genome is the GA's (search/genome.py): the x of the interior control points on the layer
grid and the y of every control point on the scale grid. CMA-ES (the `cmaes` package, which
optuna's CmaEsSampler is built on) samples points of [0, 1]^n, one coordinate per gene, and
each point is rounded to a genome (each gene's range is cut into one equal cell per value, so
the grid's end values, where gentle curves lie, are as likely as any; interior x sorted): the
search moves on the grid and every candidate is a genome the GA could breed.

The best uniform scale of the raced uniform scan is the first incumbent (the best so far), so
the curve found can only match or beat it on calibration. With `ties="gentle"` CMA-ES starts at
the unscaled genome, the gentlest curve, and searches outward (from the best uniform scale it
settles on the first curve of the best fitness it meets, often a steep one); with `ties="first"`
it starts at the best uniform scale.

Each generation races every sample against the incumbent, the comparison racing decides
cheaply: a sample may fail at most as many examples as keeps it ranked above the incumbent by
the selection rule (fitness, then with `ties="gentle"` the smaller sum |log s_h|, then queue
order), and it meets the examples in one order fixed for the generation, the hardest so far
first. It is refuted at the example where its failures pass that allowance (its depth), or it
is scored in full and ranks above the incumbent (an improver). Every sample meets at least the
LOOK hardest examples. CMA-ES is told a full ranking: the improvers by the selection rule, then
the others by their failures among the LOOK hardest, the later refuted the better, the gentler
(with gentle ties), then sampling order. Scoring a sample in full would only tell what racing
skips, so CMA-ES gets the same ranking with or without racing and with any number of replicas:
the search walks the same path and ends with the same curve. The hardness that orders the
examples counts only verdicts every such run computes (each sample's up to its depth, and the
LOOK hardest) and the incumbent's failures.

A challenger's fate depends on itself and the incumbent alone, so R replicas race R samples at
once, each by its own chunk (one example first, doubling up to a batch, or at once the examples it
must fail before it could be refuted, up to the wide chunk): the tokens do not depend on R. A
sample rounded to a genome met before reuses what is known of it.

Resuming replays CMA-ES from its seed and the rankings told so far (kept in the checkpoint):
the same samples and state, with no model call.
"""

from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass

from lpes.foundation.errors import LpesError
from lpes.search.ga import GeneticSearch, Runner, Scored, SearchState, best_scored, selection_key
from lpes.search.genome import Genome
from lpes.search.objective import LIKELIHOODS
from lpes.search.optimizers import register

NAME = "cmaes"
LOOK = 4  # every sample meets at least this many of the hardest examples: what ranks the refuted ones
SIGMA = 0.3  # initial step size, in units of each gene's range


def default_population(degree: int) -> int:
    """Samples per generation: 6, chosen by bench/bench_search.py (bench/RESULTS.md). CMA-ES's own
    4 + floor(3 ln n) is 9 for the 6 genes of a cubic curve; 9 cost 7x fewer tokens than the plain GA
    on lpes-tiny-induction, 6 cost 11x, at the same held-out accuracy on both bundled models."""
    return 6


def _cmaes():
    try:
        import cmaes
    except ImportError:
        raise LpesError("--optimizer cmaes needs the cmaes package: pip install cmaes") from None
    return cmaes


@register
class CMASearch(GeneticSearch):
    """CMA-ES in place of breeding; the uniform scan, racing, checkpoints and patience are the GA's. On a likelihood
    (`--objective logprob`, `answer-logprob`) its search is `LogprobCMASearch` (below)."""

    name = NAME
    order = 20
    verdicts, likelihood = True, True
    why = ""

    @classmethod
    def population(cls, degree: int) -> int:
        return default_population(degree)

    @classmethod
    def build(cls, plan, options, evaluator, settings, on_generation, step_progress) -> CMASearch:
        args = (plan.space, evaluator, settings, on_generation, step_progress)
        if options.objective in LIKELIHOODS:
            return LogprobCMASearch(*args, weights=plan.weights)
        return cls(*args)

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

        # Gentle ties want the curve nearest the model's own RoPE: start there and search outward.
        # Eq. 7 alone ("first"): start at the best uniform scale.
        start = self._encode(self.space.identity() if self.settings.ties == "gentle"
                             else self.space.uniform(state.uniform["scale"]))
        bounds = np.array([[0.0, 1.0]] * len(start))
        with warnings.catch_warnings():  # population 2: the rank-mu rate is 0, and cmaes divides by it on
            warnings.simplefilter("ignore", RuntimeWarning)  # the way to a bound it then does not use
            return _cmaes().CMA(mean=np.array(start), sigma=SIGMA, bounds=bounds,
                                seed=self.settings.seed % 2**32, population_size=self.settings.population)

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
        keys = []
        runners: dict[str, _Challenger] = {}
        for x in samples:
            genome = self._decode(x)
            key = self._key(genome)
            keys.append(key)
            if key not in runners:
                runners[key] = self._challenger(genome, key, state)
        state.duplicates_skipped += len(samples) - len(runners)
        incumbent, order = state.parents[0], self._order(state)
        for runner in runners.values():
            runner.allowed = self._allowed(runner, incumbent)
        label = self._label(generation, "first population") if generation == 0 else self._label(generation)
        self._race_incumbent(list(runners.values()), order, state, label)
        improvers = sorted((r for r in runners.values() if r.depth is None), key=lambda r: r.rank(self._total))
        # The told order: the improvers by the selection rule, then the rest, the later refuted the better,
        # then the gentler (with ties="gentle"), then sampling order.
        place = {r.key: p for p, r in enumerate(improvers)}

        look = order[:LOOK]

        def standing(j: int) -> tuple:
            runner = runners[keys[j]]
            if runner.key in place:
                return (0, place[runner.key], j)
            return (1, sum(i in runner.failed for i in look), -runner.depth, round(runner.deviation, 9), j)

        told = [0.0] * len(samples)
        for position, j in enumerate(sorted(range(len(samples)), key=standing)):
            told[j] = float(position)
        optimizer.tell(list(zip(samples, told)))
        state.optimizer["told"].append(told)
        hard = state.optimizer.setdefault("hard", [0] * self._total)
        for runner in runners.values():  # what racing always computes: each one's verdicts up to its depth
            for i in order[:len(order) if runner.depth is None else max(runner.depth, LOOK)]:
                hard[i] += i in runner.failed
        scored = [Scored(r.genome, r.correct / self._total, r.order, r.deviation) for r in improvers if r.fresh]
        before = state.parents[0]
        state.parents = best_scored([incumbent] + [Scored(r.genome, r.correct / self._total, r.order, r.deviation)
                                                  for r in improvers], 1, self._total)
        state.generation = generation
        # Generation 0 counts too: its population raced the uniform scan's best, and when none beat it that
        # is a generation without a better curve (a default SmolLM2 search spent a third population on it).
        self._track_best(state, before)
        self._end_generation(state, random.Random(0), scored)

    def _challenger(self, genome: Genome, key: str, state: SearchState) -> _Challenger:
        scales = self._scales(genome)
        entry = state.seen.get(key)
        if entry is None:
            state.seen[key] = [None, len(state.seen), 0, [], []]
            entry = state.seen[key]
        if entry[0] is not None:  # scored in full before
            done, failed = set(range(self._total)), set(entry[2])
        else:
            done, failed = set(entry[3]), set(entry[4])
        return _Challenger(genome, key, scales, self._deviation(scales), entry[1], len(done) - len(failed),
                           done, failed, fresh=entry[0] is None)

    def _allowed(self, runner: _Challenger, incumbent: Scored) -> int:
        """The most examples `runner` may fail and still rank above the incumbent (-1: it cannot)."""
        needed = round(incumbent.fitness * self._total)
        if (round(runner.deviation, 9), runner.order) >= (round(incumbent.deviation, 9), incumbent.order):
            needed += 1  # at equal fitness the incumbent ranks first
        return self._total - needed

    def _order(self, state: SearchState) -> list[int]:
        """The examples in the order every challenger meets them: the hardest so far first (ties: by index).

        Hardness counts only what racing always computes (each challenger's verdicts up to where it was
        refuted), and the incumbent's failures, so the order is the same with or without racing."""
        hard = list((state.optimizer or {}).get("hard") or [0] * self._total)
        for i in (state.seen[self._key(state.parents[0].genome)] + [[]])[2]:
            hard[i] += 1
        return sorted(range(self._total), key=lambda i: (-hard[i], i))

    def _margin(self, runner) -> int:
        """A challenger is refuted at its allowed + 1-th failure along the order, after the LOOK hardest."""
        if not isinstance(runner, _Challenger):
            return super()._margin(runner)
        return max(LOOK - len(runner.done), runner.allowed - len(runner.failed) + 1)

    def _race_incumbent(self, runners: list[_Challenger], order: list[int], state: SearchState, label: str) -> None:
        """Score each challenger along `order` until it is refuted (more failures than allowed) or scored in full.

        A challenger's fate depends on itself and the incumbent alone, so with R replicas R of them advance
        at once, each by its own chunk: what they spend does not depend on R."""
        open_ = [r for r in runners if not self._settle(r, order)]
        progress = self.step_progress(label, len(runners), sum(self._total - len(r.done) for r in open_))
        for _ in range(len(runners) - len(open_)):
            progress.finished(raced_out=True)
        try:
            while open_:
                batch = open_[:max(1, self.settings.replicas)] if self.settings.racing else open_[:1]
                jobs = [(runner.scales, [i for i in order if i not in runner.done][:self._chunk_size(runner)])
                        for runner in batch]
                progress.computed(self._score_jobs(batch, jobs, state))
                for runner in batch:
                    if self._settle(runner, order):
                        open_.remove(runner)
                        self._record(runner, state)
                        if runner.depth is not None:
                            progress.skipped(self._total - len(runner.done))
                        progress.finished(raced_out=runner.depth is not None)
        finally:
            progress.close()

    def _settle(self, runner: _Challenger, order: list[int]) -> bool:
        """Whether `runner` is decided: refuted at `depth` (its failures along `order` passed the allowance
        there) or an improver (every example met, no more failures than allowed)."""
        if any(i not in runner.done for i in order[:LOOK]):
            return False  # every sample meets the hardest LOOK examples: they rank the refuted ones
        failures = 0
        for depth, i in enumerate(order, 1):
            if runner.allowed < 0:
                runner.depth = 0
                return True
            if i not in runner.done:
                return False
            failures += i in runner.failed
            if failures > runner.allowed:
                runner.depth = depth
                return True
        runner.depth = None
        return True

    def _record(self, runner: _Challenger, state: SearchState) -> None:
        if len(runner.done) == self._total:
            fitness = runner.correct / self._total
            if state.seen[runner.key][0] is None:
                state.evaluations += 1
            state.seen[runner.key] = [fitness, runner.order, sorted(runner.failed)]
            if fitness > state.best_fitness:
                state.best_fitness, state.tokens_to_best = fitness, self._tokens_now()
                state.improvements.append([fitness, state.tokens_to_best])
        else:
            state.raced_out += 1
            state.seen[runner.key] = [None, runner.order, runner.correct, sorted(runner.done), sorted(runner.failed)]

    def _encode(self, genome: Genome) -> list[float]:
        """A genome as the point at the centre of its cell: each gene's range cut into one equal cell per value."""
        layers, values = self.space.num_layers, len(self.space.grid.values)
        return [(x + 0.5) / layers for x in genome.interior_x] + [(y + 0.5) / values for y in genome.y_index]

    def _decode(self, point) -> Genome:
        """The genome whose cells hold `point` (interior x sorted): every grid value, the ends too, is as likely."""
        layers, values = self.space.num_layers, len(self.space.grid.values)
        inner = self.space.degree - 1
        xs = tuple(sorted(_cell(float(u), layers) for u in point[:inner]))
        return Genome(xs, tuple(_cell(float(u), values) for u in point[inner:]))


def _cell(unit: float, count: int) -> int:
    """Which of `count` equal cells of [0, 1] holds `unit` (the same on every machine)."""
    return min(count - 1, max(0, math.floor(unit * count)))


@dataclass
class _Challenger(Runner):
    """A sampled genome raced against the incumbent: its verdicts so far and, once decided, its depth."""

    fresh: bool = True  # not scored in full before this generation
    allowed: int = 0
    depth: int | None = 0  # where it was refuted along the order; None: it ranks above the incumbent

    def rank(self, total: int) -> tuple:
        return selection_key(self.correct, self.deviation, self.order)


class LogprobCMASearch(CMASearch):
    """CMA-ES on the gold answer's likelihood (`--objective logprob`): every sample scored on every example.

    A mean of log-likelihoods has no bound that refutes a sample early as right/wrong counts do,
    so there is no racing; the uniform scan, the incumbent, the told ranking (objective, then the
    gentler curve, then sampling order), checkpoints and replay are as above.
    """

    def __init__(self, *args, weights: list[float], **kwargs):
        super().__init__(*args, **kwargs)
        self.weights = weights

    def run(self, state: SearchState | None = None) -> SearchState:
        state = state or SearchState(failures=[0] * self.evaluator.num_examples)
        self._tokens_before = state.forward_tokens - self.evaluator.forward_tokens
        version = _cmaes().__version__
        if not state.parents:
            genomes = [self.space.uniform(scale) for scale in self.space.grid.values]
            tokens_before = self.evaluator.forward_tokens
            scored = self._score_all(genomes, state, self._label(0, "uniform scan"))
            best = _best_by_objective(scored)
            state.uniform = {"scale": self.space.grid.values[best.genome.y_index[0]], "fitness": best.fitness,
                             "tokens": self.evaluator.forward_tokens - tokens_before}
            state.parents = [best]
            state.optimizer = {"name": NAME, "version": version, "objective": "logprob", "told": []}
        elif (state.optimizer or {}).get("objective") != "logprob" or state.optimizer.get("version") != version:
            raise LpesError("the checkpoint is not from a cmaes search of --objective logprob with cmaes "
                            f"{version}: resume it with its own settings, or delete it to start over")
        optimizer = self._replay(state)
        while len(state.optimizer["told"]) <= self.settings.generations and state.stop_reason is None:
            self._objective_generation(state, optimizer)
        return state

    def _objective_generation(self, state: SearchState, optimizer) -> None:
        generation = len(state.optimizer["told"])
        samples = [optimizer.ask() for _ in range(self.settings.population)]
        genomes = [self._decode(x) for x in samples]
        unique = list({self._key(g): g for g in genomes}.values())
        state.duplicates_skipped += len(genomes) - len(unique)
        label = self._label(generation, "first population") if generation == 0 else self._label(generation)
        scored = {self._key(s.genome): s for s in self._score_all(unique, state, label)}
        told = [0.0] * len(samples)
        ranked = sorted(range(len(samples)), key=lambda j: (-scored[self._key(genomes[j])].fitness,
                                                             round(scored[self._key(genomes[j])].deviation, 9), j))
        for position, j in enumerate(ranked):
            told[j] = float(position)
        optimizer.tell(list(zip(samples, told)))
        state.optimizer["told"].append(told)
        before = state.parents[0]
        state.parents = [_best_by_objective([before, *scored.values()])]
        state.generation = generation
        self._track_best(state, before)  # generation 0 too, as CMASearch._generation says
        self._end_generation(state, random.Random(0), list(scored.values()))

    def _score_all(self, genomes: list, state: SearchState, label: str) -> list[Scored]:
        """Each genome's objective on every example (one known from before is not scored again)."""
        fresh = [g for g in genomes if (state.seen.get(self._key(g)) or [None])[0] is None]
        progress = self.step_progress(label, len(genomes), len(fresh) * self._total)
        for _ in range(len(genomes) - len(fresh)):
            progress.finished()
        everything = list(range(self._total))
        try:
            for start in range(0, len(fresh), max(1, self.settings.replicas)):
                batch = fresh[start:start + max(1, self.settings.replicas)]
                results = self.evaluator.logprobs_many([(self._scales(g), everything) for g in batch])
                for genome, (logprobs, verdicts) in zip(batch, results):
                    objective = sum(w * v for w, v in zip(self.weights, logprobs))
                    state.seen[self._key(genome)] = [objective, len(state.seen), [i for i, ok in enumerate(verdicts)
                                                                                  if not ok]]
                    state.evaluations += 1
                    if objective > state.best_fitness or state.evaluations == 1:
                        state.best_fitness, state.tokens_to_best = objective, self._tokens_now()
                        state.improvements.append([objective, state.tokens_to_best])
                    progress.computed(self._total)
                    progress.finished()
        finally:
            progress.close()
        out = []
        for genome in genomes:
            objective, order, _ = state.seen[self._key(genome)]
            out.append(Scored(genome, objective, order, self._deviation(self._scales(genome))))
        return out


def _best_by_objective(scored: list[Scored]) -> Scored:
    """The highest objective; at a tie the gentler curve (with gentle ties), then the earlier one."""
    return min(scored, key=lambda s: (-s.fitness, round(s.deviation, 9), s.order))
