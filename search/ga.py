"""The genetic search over Bezier curves, with exact racing and checkpoints.

Each generation keeps the best `parents` genomes (elitism), breeds `population - parents`
children by crossover and mutation, and scores only genomes whose rounded scale vector
was never seen. Fitness is Eq. 7: the share of calibration examples answered correctly.

Selection ranks by fitness, then by the smallest change to the model (sum of |log s_h|,
known before scoring), then by scoring order.

Racing, exactly: a genome is scored chunk by chunk. The parents of the next generation
are the best `parents` of (current parents + children), so a genome whose best possible
rank (its correct answers so far + every remaining example, its deviation, scored last)
is below the `parents`-th best of what was already scored can never be selected. Its
scoring stops there, before the first example when even a perfect score would not do
(once the parents are perfect, only a gentler curve can enter). Selection is therefore
identical to scoring every genome on every example, and so is the whole run: racing
changes the cost, never the result. Examples that the population fails most often are
scored first, so hopeless genomes are found early.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

from lpes.search.genome import Genome, SearchSpace


class Evaluator(Protocol):
    num_examples: int
    forward_tokens: int

    def correct(self, scales: tuple[float, ...], example_ids: list[int]) -> list[bool]: ...


@dataclass(frozen=True)
class GASettings:
    population: int = 16
    generations: int = 10
    parents: int = 8
    mutation_rate: float = 0.3
    crossover_rate: float = 0.15
    seed: int = 0
    racing: bool = True
    chunk: int = 8  # examples scored between two racing checks


@dataclass
class Scored:
    genome: Genome
    fitness: float
    order: int  # evaluation order: breaks ties the same way in every run
    deviation: float = 0.0  # sum of |log s_h|: how far the curve moves the model from its own RoPE


@dataclass
class SearchState:
    generation: int = 0
    rng_state: list | None = None
    parents: list[Scored] = field(default_factory=list)
    seen: dict[str, float | None] = field(default_factory=dict)  # scale key -> fitness (None: raced out)
    failures: list[int] = field(default_factory=list)  # per example: how often scored genomes failed it
    history: list[dict] = field(default_factory=list)
    evaluations: int = 0
    raced_out: int = 0
    duplicates_skipped: int = 0
    forward_tokens: int = 0

    def to_json(self) -> dict:
        data = asdict(self)
        data["parents"] = [[s.genome.to_json(), s.fitness, s.order, s.deviation] for s in self.parents]
        return data

    @classmethod
    def from_json(cls, data: dict) -> SearchState:
        state = cls(**{k: v for k, v in data.items() if k != "parents"})
        state.parents = [Scored(Genome.from_json(g), f, o, d) for g, f, o, d in data["parents"]]
        return state


def _rng_to_json(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from_json(data: list) -> random.Random:
    rng = random.Random()
    rng.setstate((data[0], tuple(data[1]), data[2]))
    return rng


class GeneticSearch:
    def __init__(self, space: SearchSpace, evaluator: Evaluator, settings: GASettings,
                 on_generation: Callable[[SearchState], None] | None = None, seeds: tuple[Genome, ...] = ()):
        """`on_generation` runs after every generation (checkpointing, progress); `seeds` join the
        first population after the unscaled genome."""
        self.space, self.evaluator, self.settings = space, evaluator, settings
        self.on_generation, self.seeds = on_generation, seeds

    def run(self, state: SearchState | None = None) -> SearchState:
        """Run to the last generation from `state` (a resumed checkpoint) or from scratch."""
        state = state or self._initial_state()
        # The evaluator counts tokens from zero in this process; the state carries earlier ones.
        self._tokens_before = state.forward_tokens - self.evaluator.forward_tokens
        rng = _rng_from_json(state.rng_state) if state.rng_state else random.Random(self.settings.seed)
        if not state.parents:
            self._first_generation(state, rng)
        while state.generation < self.settings.generations:
            scored = self._score_all(self._breed(state, rng), state, state.parents)
            state.parents = _best(state.parents + scored, self.settings.parents)
            state.generation += 1
            self._end_generation(state, rng, scored)
        return state

    def _initial_state(self) -> SearchState:
        return SearchState(failures=[0] * self.evaluator.num_examples)

    def _first_generation(self, state: SearchState, rng: random.Random) -> None:
        genomes = [self.space.identity()]
        for seed in self.seeds:
            if self._key(seed) not in {self._key(g) for g in genomes} and len(genomes) < self.settings.population:
                genomes.append(seed)
        while len(genomes) < self.settings.population:
            genomes.append(self._novel(lambda: self.space.random(rng), state, genomes))
        scored = self._score_all([g for g in genomes if g is not None], state, [])
        state.parents = _best(scored, self.settings.parents)
        self._end_generation(state, rng, scored)

    def _score_all(self, genomes: list[Genome], state: SearchState, parents: list[Scored]) -> list[Scored]:
        """Score `genomes` in order; with racing, each against the bar set by everything scored before it."""
        scored: list[Scored] = []
        for genome in genomes:
            bar = self._selection_bar(parents + scored) if self.settings.racing else None
            result = self._score(genome, state, bar)
            if result is not None:
                scored.append(result)
        return scored

    def _selection_bar(self, pool: list[Scored]) -> Scored | None:
        """The `parents`-th best genome so far by the selection order (None: not yet known).

        The next parents are the best of a pool that only grows, so the bar only rises:
        a genome that cannot beat it now is never selected.
        """
        if len(pool) < self.settings.parents:
            return None
        return _best(pool, self.settings.parents)[-1]

    def _breed(self, state: SearchState, rng: random.Random) -> list[Genome]:
        children: list[Genome] = []
        pool = [s.genome for s in state.parents]
        for k in range(self.settings.population - self.settings.parents):
            if k % 2 == 0:
                make = lambda: self.space.mutate(rng.choice(pool), rng, self.settings.mutation_rate)  # noqa: E731
            else:
                make = lambda: self.space.crossover(  # noqa: E731
                    rng.choice(pool), rng.choice(pool), rng, self.settings.crossover_rate)
            child = self._novel(make, state, children)
            if child is not None:
                children.append(child)
        return children

    def _novel(self, make: Callable[[], Genome], state: SearchState, batch: list[Genome], tries: int = 20):
        """A genome whose scales were never scored (nor queued in `batch`), or None after `tries`."""
        queued = {self._key(g) for g in batch if g is not None}
        for _ in range(tries):
            genome = make()
            key = self._key(genome)
            if key not in state.seen and key not in queued:
                return genome
            state.duplicates_skipped += 1
        return None

    def _key(self, genome: Genome) -> str:
        return json.dumps(self.space.scales_key(genome))

    def _score(self, genome: Genome, state: SearchState, bar: Scored | None) -> Scored | None:
        """Fitness on the calibration set, or None once it cannot beat `bar` (see the module docstring)."""
        scales = self.space.scales_key(genome)
        deviation = sum(abs(math.log(s)) for s in scales)
        total = self.evaluator.num_examples
        order = sorted(range(total), key=lambda i: (-state.failures[i], i))
        correct, remaining, chunk = 0, total, self.settings.chunk if bar is not None else total
        # Scored later than everything in the pool, it loses every full tie; so even a perfect
        # score on the remaining examples must beat the bar on (fitness, deviation).
        while bar is None or _can_beat(correct + remaining, deviation, bar, total):
            if remaining == 0:
                state.evaluations += 1
                state.seen[self._key(genome)] = correct / total
                return Scored(genome, correct / total, len(state.seen), deviation)
            ids = order[total - remaining:total - remaining + chunk]
            verdicts = self.evaluator.correct(scales, ids)
            correct += sum(verdicts)
            remaining -= len(ids)
            for i, ok in zip(ids, verdicts):
                state.failures[i] += not ok
        state.seen[self._key(genome)] = None
        state.raced_out += 1
        return None

    def _end_generation(self, state: SearchState, rng: random.Random, scored: list[Scored]) -> None:
        state.forward_tokens = self._tokens_before + self.evaluator.forward_tokens
        fitnesses = [s.fitness for s in scored]
        state.history.append({
            "generation": state.generation,
            "best": state.parents[0].fitness,
            "mean_scored": sum(fitnesses) / len(fitnesses) if fitnesses else None,
            "scored": len(scored),
            "raced_out": state.raced_out,
            "duplicates_skipped": state.duplicates_skipped,
            "forward_tokens": state.forward_tokens,
        })
        state.rng_state = _rng_to_json(rng)
        if self.on_generation is not None:
            self.on_generation(state)


def _can_beat(best_correct: int, deviation: float, bar: Scored, total: int) -> bool:
    """Whether a genome with at most `best_correct` right answers could rank above `bar`."""
    bar_correct = round(bar.fitness * total)
    return best_correct > bar_correct or (best_correct == bar_correct and round(deviation, 9) < round(bar.deviation, 9))


def _best(scored: list[Scored], count: int) -> list[Scored]:
    # At equal fitness the curve that changes the model least wins: it keeps what the model
    # learned at its own positions wherever scaling does not help.
    return sorted(scored, key=lambda s: (-s.fitness, round(s.deviation, 9), s.order))[:count]
