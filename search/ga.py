"""The genetic search over Bezier curves, with exact racing and checkpoints.

Generation -1 scans the uniform curves (one grid scale for every layer): the best one is
the baseline a per-layer curve must beat, and it seeds generation 0 with the unscaled
genome and random ones. Each generation keeps the best `parents` genomes (elitism),
breeds `population - parents` children by crossover and mutation, and scores only
genomes whose rounded scale vector was never seen. Fitness is Eq. 7: the share of
calibration examples answered correctly.

Selection ranks by fitness, then (with `ties="gentle"`, the default) by the smallest change
to the model (sum of |log s_h|, known before scoring), then by queue order (the order
genomes were first bred, the same with or without racing). `ties="first"` is the plain GA
of the papers: Eq. 7 alone, the first genome found wins a tie.

Racing, exactly: selection only needs to know which genomes rank among the best `parents`
of (current parents + children), and their fitness. Genomes are scored a chunk of examples
at a time, always the one whose best possible rank (its right answers so far plus every
remaining example) is highest, and a genome is dropped as soon as that best possible rank
is below the `parents`-th best genome already scored in full. The pool only grows, so the
bar only rises: a dropped genome could never have been selected, and selection is
identical to scoring every genome on every example. Racing changes the cost, never the
result. Each genome meets the examples the population fails most often first, so hopeless
genomes are found early. With R replicas the R genomes of highest best possible rank advance
at once, each by its own chunk on its own replica: the chunks do not grow with R (cutting one
genome's chunk R ways did, and cost 1.6x the tokens at 16 replicas), and selection is the same.

Patience (`patience=K`): the search stops once the best genome has not changed for K
generations (with gentle ties a gentler curve of equal fitness is a change), or at once when
nothing can replace it (fitness 1.0 with `ties="first"`, or with the unscaled genome itself).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

from lpes.search.genome import Genome, SearchSpace, curve_from_json
from lpes.search.optimizers import Optimizer, register

GA_POPULATION = 32  # LongRoPE's GA used 64; racing makes a larger one cheap, 32 is enough for 4 points


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
    chunk: int = 8  # most examples scored between two racing checks (one full batch per replica)
    # ... except for a runner that cannot be dropped before it has failed more examples than this: it gets them in
    # one chunk of up to `wide_chunk` (decoded together, sharing their prompts' prefixes), which wastes no verdict.
    wide_chunk: int = 8
    first_chunk: int = 1  # a genome's first chunks are small and double up to `chunk`: most hopeless ones fail at once
    ties: str = "gentle"  # at equal fitness: "gentle" (smaller sum |log s_h| first) or "first" (queue order only)
    replicas: int = 1  # genomes raced at once, each its own chunk on its own replica (racing stays exact)
    # Stop once the best has not changed for this many generations, or can no longer change; 0: never.
    patience: int = 0
    # The uniform scan by successive halving (`_halve`) before its exact race; False: the exact race alone.
    halving: bool = False


@dataclass
class Scored:
    genome: Genome
    fitness: float
    order: int  # queue order: breaks full ties the same way in every run
    deviation: float = 0.0  # sum of |log s_h|: how far the curve moves the model from its own RoPE


@dataclass
class SearchState:
    generation: int = 0
    rng_state: list | None = None
    parents: list[Scored] = field(default_factory=list)
    # scale key -> [fitness, queue order, examples failed], or once raced out
    # [None, queue order, right answers, example ids met, of those the ones failed]
    seen: dict[str, list] = field(default_factory=dict)
    failures: list[int] = field(default_factory=list)  # per example: how often scored genomes failed it
    history: list[dict] = field(default_factory=list)
    uniform: dict | None = None  # the uniform scan's best: scale, fitness, tokens
    best_fitness: float = -1.0  # the best fitness scored so far, and the tokens spent when it was first reached
    tokens_to_best: int = 0
    evaluations: int = 0
    raced_out: int = 0
    duplicates_skipped: int = 0
    forward_tokens: int = 0
    unchanged: int = 0  # generations since the best last changed (the patience rule)
    stop_reason: str | None = None  # why the search ended before its last generation
    improvements: list[list] = field(default_factory=list)  # [fitness, tokens]: each time best_fitness rose
    optimizer: dict | None = None  # an optimizer's own state (search/cma.py)

    def to_json(self) -> dict:
        data = asdict(self)
        data["parents"] = [[s.genome.to_json(), s.fitness, s.order, s.deviation] for s in self.parents]
        return data

    @classmethod
    def from_json(cls, data: dict) -> SearchState:
        state = cls(**{k: v for k, v in data.items() if k != "parents"})
        state.parents = [Scored(curve_from_json(g), f, o, d) for g, f, o, d in data["parents"]]
        return state


@dataclass
class Runner:
    """A genome in the race: its right answers on the examples scored so far."""

    genome: Genome
    key: str
    scales: tuple[float, ...]
    deviation: float
    order: int
    correct: int = 0
    done: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)  # the examples of `done` it got wrong

    def best_rank(self, total: int) -> tuple:
        """Its selection key if every remaining example comes out right (smaller ranks higher)."""
        return selection_key(self.correct + total - len(self.done), self.deviation, self.order)


def _rng_to_json(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from_json(data: list) -> random.Random:
    rng = random.Random()
    rng.setstate((data[0], tuple(data[1]), data[2]))
    return rng


class StepProgress(Protocol):
    """What a step reports while it races (search/progress.py draws it)."""

    def computed(self, verdicts: int) -> None: ...
    def skipped(self, verdicts: int) -> None: ...
    def finished(self, raced_out: bool = False) -> None: ...
    def close(self) -> None: ...


class _Silent:
    def computed(self, verdicts: int) -> None: ...
    def skipped(self, verdicts: int) -> None: ...
    def finished(self, raced_out: bool = False) -> None: ...
    def close(self) -> None: ...


@register
class GeneticSearch(Optimizer):
    """`--optimizer ga`: the papers' genetic algorithm, raced exactly (above); CMA-ES (search/cma.py) builds on it."""

    name = "ga"
    order = 10
    verdicts, likelihood = True, False
    why = "the GA races exact right/wrong counts"

    @classmethod
    def population(cls, degree: int) -> int:
        return GA_POPULATION

    @classmethod
    def build(cls, plan, options, evaluator, settings, on_generation, step_progress) -> GeneticSearch:
        return cls(plan.space, evaluator, settings, on_generation, step_progress)

    def __init__(self, space: SearchSpace, evaluator: Evaluator, settings: GASettings,
                 on_generation: Callable[[SearchState], None] | None = None,
                 step_progress: Callable[[str, int, int], StepProgress] | None = None):
        """`on_generation` runs after every generation (checkpointing, progress).

        `step_progress(label, candidates, verdicts)` opens the progress of one step (the uniform
        scan, the first population, a generation): its candidates and the verdicts it needs at most.
        """
        self.space, self.evaluator, self.settings = space, evaluator, settings
        self.on_generation = on_generation
        self.step_progress = step_progress or (lambda label, candidates, verdicts: _Silent())

    def run(self, state: SearchState | None = None) -> SearchState:
        """Run to the last generation from `state` (a resumed checkpoint) or from scratch."""
        state = state or SearchState(failures=[0] * self.evaluator.num_examples)
        # The evaluator counts tokens from zero in this process; the state carries earlier ones.
        self._tokens_before = state.forward_tokens - self.evaluator.forward_tokens
        rng = _rng_from_json(state.rng_state) if state.rng_state else random.Random(self.settings.seed)
        if not state.parents:
            self._scan_uniform(state)
            self._first_generation(state, rng)
        while state.generation < self.settings.generations and state.stop_reason is None:
            scored = self._race(self._breed(state, rng), state, state.parents, self.settings.parents,
                                self._label(state.generation + 1))
            before = state.parents[0]
            state.parents = best_scored(state.parents + scored, self.settings.parents, self._total)
            state.generation += 1
            self._track_best(state, before)
            self._end_generation(state, rng, scored)
        return state

    def _track_best(self, state: SearchState, before: Scored) -> None:
        """The patience rule, after a generation: stop when the best can no longer change, or has not for K."""
        best = state.parents[0]
        state.unchanged = 0 if self._key(best.genome) != self._key(before.genome) else state.unchanged + 1
        patience = self.settings.patience
        if not patience:
            return
        # Fitness 1.0 with Eq. 7 alone (or with the unscaled genome itself): no genome can rank above it.
        if best.fitness >= 1.0 and (self.settings.ties == "first" or best.deviation == 0):
            state.stop_reason = "fitness 1.0: no curve can replace the best"
        elif state.unchanged >= patience:
            state.stop_reason = f"no better curve for {patience} generations (--patience {patience})"

    @property
    def _total(self) -> int:
        return self.evaluator.num_examples

    def _label(self, generation: int, what: str = "") -> str:
        return f"lpes-search gen {generation}/{self.settings.generations}" + (f" {what}" if what else "")

    def _scan_uniform(self, state: SearchState) -> None:
        """Generation -1: the best uniform curve, raced like the rest (ties: the gentler, or the smaller, scale)."""
        tokens_before = self.evaluator.forward_tokens
        genomes = [self.space.uniform(scale) for scale in self.space.grid.values]
        if self.settings.halving:
            genomes = self._halve(genomes, state, self._label(0, "uniform scan, halving"))
        best = best_scored(self._race(genomes, state, [], 1, self._label(0, "uniform scan")), 1, self._total)[0]
        scale = self.space.grid.values[best.genome.y_index[0]]
        state.uniform = {"scale": scale, "fitness": best.fitness,
                         "tokens": self.evaluator.forward_tokens - tokens_before}

    def _halve(self, genomes: list[Genome], state: SearchState, label: str) -> list[Genome]:
        """Successive halving: every genome on the same examples, spread evenly over the calibration set (which
        comes grouped by gold position), a full batch each; the best third kept (at the same rank rule as
        selection), on twice as many, until HALVING_LEFT are left or they have met half the examples. The exact
        race then goes on from what they met.

        Not exact as racing is: a scale that starts badly on the first examples is dropped. On generated
        verdicts (a few right in 40) racing drops almost nothing, and the held-out decision, not the scan,
        decides what ships. Dropped genomes are recorded as raced out: a later generation resumes them.
        """
        runners = [self._runner(g, state) for g in genomes]
        everyone = list(runners)
        size = min(self.settings.chunk * self.settings.replicas, self._total)
        progress = self.step_progress(label, len(runners), len(runners) * self._total)
        try:
            while len(runners) > HALVING_LEFT and 2 * size <= self._total:
                ids = spread(self._total, size)
                todo = [r for r in runners if set(ids) - r.done]
                for k in range(0, len(todo), self.settings.replicas):
                    batch = todo[k:k + self.settings.replicas]
                    jobs = [(r.scales, [i for i in ids if i not in r.done]) for r in batch]
                    progress.computed(self._score_jobs(batch, jobs, state))
                runners.sort(key=lambda r: selection_key(r.correct, r.deviation, r.order))
                keep = max(HALVING_LEFT, -(-len(runners) // 3))
                for runner in runners[keep:]:
                    state.raced_out += 1
                    progress.skipped(self._total - len(runner.done))
                    progress.finished(raced_out=True)
                runners, size = runners[:keep], 2 * size
        finally:
            progress.close()
        for runner in everyone:  # what each met, as a raced-out genome: the race (and later generations) go on
            state.seen[runner.key] = [None, runner.order, runner.correct, sorted(runner.done), sorted(runner.failed)]
        survivors = {r.key for r in runners}
        return [g for g in genomes if self._key(g) in survivors]

    def _first_generation(self, state: SearchState, rng: random.Random) -> None:
        genomes = [self.space.identity()]
        best_uniform = self.space.uniform(state.uniform["scale"])
        if self._key(best_uniform) != self._key(genomes[0]):
            genomes.append(best_uniform)
        genomes = genomes[:self.settings.population]
        while len(genomes) < self.settings.population:
            genomes.append(self._novel(lambda: self.space.random(rng), state, genomes))
        genomes = [g for g in genomes if g is not None]
        known = [self._known(g, state) for g in genomes]
        scored = [s for s in known if s is not None]
        fresh = [g for g, s in zip(genomes, known) if s is None]
        scored += self._race(fresh, state, scored, self.settings.parents, self._label(0, "first population"),
                             known=len(scored))
        state.parents = best_scored(scored, self.settings.parents, self._total)
        self._end_generation(state, rng, scored)

    def _known(self, genome: Genome, state: SearchState) -> Scored | None:
        """The genome as already scored in full (by the uniform scan), else None."""
        fitness, order, *_ = state.seen.get(self._key(genome), (None, None))
        return None if fitness is None else Scored(genome, fitness, order, self._deviation(self._scales(genome)))

    def _race(self, genomes: list[Genome], state: SearchState, parents: list[Scored], keep: int,
              label: str = "", known: int = 0, counts: dict[str, int] | None = None) -> list[Scored]:
        """Score `genomes` just enough to know exactly the best `keep` of parents + genomes.

        Returns the genomes scored in full (every one without racing); see the module docstring.
        `label` and `known` (candidates of the step already scored) are for the progress line;
        `counts`: the places each genome takes among the `keep` (by scale key; default one each).
        """
        runners = [self._runner(g, state) for g in genomes]
        scored: list[Scored] = []
        if not runners:
            return scored
        progress = self.step_progress(label, known + len(runners), sum(self._total - len(r.done) for r in runners))
        for _ in range(known):
            progress.finished()
        try:
            self._race_runners(runners, state, parents, keep, scored, progress, counts)
        finally:
            progress.close()
        return scored

    def _race_runners(self, runners: list[Runner], state: SearchState, parents: list[Scored], keep: int,
                      scored: list[Scored], progress: StepProgress, counts: dict[str, int] | None = None) -> None:
        # With R replicas the runners of highest best possible rank advance at once, each by its own chunk
        # (the chunks do not grow with R): as many as it takes to give every replica an example, and no
        # more than `keep` (one that completes can push the others out of the `keep` places). Racing one
        # runner at a time is the same with R = 1; more runners at once spend slightly more tokens.
        at_once = max(1, min(self.settings.replicas, keep))
        while runners:
            if self.settings.racing:
                runners = self._drop_hopeless(runners, parents + scored, keep, state, progress, counts)
                if not runners:
                    break
                batch, examples = [], 0
                for runner in sorted(runners, key=lambda r: r.best_rank(self._total))[:at_once]:
                    batch.append(runner)
                    examples += min(self._chunk_size(runner), self._total - len(runner.done))
                    if examples >= self.settings.replicas:
                        break
            else:
                batch = runners[:1]
            progress.computed(self._score_chunks(batch, state))
            for runner in batch:
                if len(runner.done) == self._total:
                    runners.remove(runner)
                    progress.finished()
                    fitness = runner.correct / self._total
                    state.seen[runner.key] = [fitness, runner.order, sorted(runner.failed)]
                    state.evaluations += 1
                    if fitness > state.best_fitness:
                        state.best_fitness, state.tokens_to_best = fitness, self._tokens_now()
                        state.improvements.append([fitness, state.tokens_to_best])
                    scored.append(Scored(runner.genome, fitness, runner.order, runner.deviation))

    def _drop_hopeless(self, runners: list[Runner], pool: list[Scored], keep: int, state: SearchState,
                       progress: StepProgress, counts: dict[str, int] | None = None):
        """The runners that could still rank among the best `keep` of `pool` and themselves.

        `counts`: how many places each genome takes (a genome sampled twice by CMA-ES takes two); default one.
        """
        bar = self._bar_now = self._bar(pool, keep, counts)
        if bar is None:
            return runners
        alive = []
        for runner in runners:
            if runner.best_rank(self._total) < bar:
                alive.append(runner)
            else:
                state.seen[runner.key] = [None, runner.order, runner.correct, sorted(runner.done),
                                          sorted(runner.failed)]
                state.raced_out += 1
                progress.skipped(self._total - len(runner.done))
                progress.finished(raced_out=True)
        return alive

    def _bar(self, pool: list[Scored], keep: int, counts: dict[str, int] | None) -> tuple | None:
        """The rank a runner must beat to place among the best `keep` (None: fewer places taken than that)."""
        taken = 0
        for scored in best_scored(pool, len(pool), self._total):
            taken += 1 if counts is None else counts.get(self._key(scored.genome), 1)
            if taken >= keep:
                return _rank(scored, self._total)
        return None

    def _runner(self, genome: Genome, state: SearchState) -> Runner:
        scales = self._scales(genome)
        key = _key_of(scales)
        if key in state.seen:  # raced out before (the unscaled genome, in the uniform scan): go on from there
            _, order, correct, done, *failed = state.seen[key]  # (a checkpoint of an older lpes: no failed)
            return Runner(genome, key, scales, self._deviation(scales), order, correct, set(done),
                          set(failed[0]) if failed else set())
        state.seen[key] = [None, len(state.seen)]
        return Runner(genome, key, scales, self._deviation(scales), len(state.seen) - 1)

    def _chunk_size(self, runner: Runner) -> int:
        if not self.settings.racing:
            return self._total
        # Small first chunks only pay where a runner can be dropped soon: they double up to a batch. One that must
        # fail `_margin` more examples before it could be dropped gets that many at once, up to `wide_chunk` (a
        # generated verdict costs about twice as much alone as in a batch of 8, and a fifth less again in one of 30
        # that shares its prompts' prefixes: bench/RESULTS.md). Racing stays exact: chunks move the checks, not
        # the result.
        doubling = min(self.settings.chunk, max(self.settings.first_chunk, len(runner.done)))
        return max(doubling, min(self.settings.wide_chunk, self._margin(runner)))

    def _margin(self, runner: Runner) -> int:
        """How many more examples `runner` can fail before it could be dropped (racing's bar, `_drop_hopeless`)."""
        bar = getattr(self, "_bar_now", None)
        if bar is None:  # fewer places taken than kept: nothing can be dropped yet
            return self.settings.chunk
        return runner.correct + self._total - len(runner.done) + bar[0] + 1  # bar[0]: minus the bar's right answers

    def _score_chunks(self, batch: list[Runner], state: SearchState) -> int:
        """Score each runner of `batch` on its next chunk of examples it has not met, those failed most often
        first (one replica each when there are several); how many verdicts."""
        jobs = []
        for runner in batch:
            todo = sorted((i for i in range(self._total) if i not in runner.done),
                          key=lambda i: (-state.failures[i], i))
            jobs.append((runner.scales, todo[:self._chunk_size(runner)]))
        return self._score_jobs(batch, jobs, state)

    def _score_jobs(self, batch: list, jobs: list[tuple[tuple[float, ...], list[int]]], state: SearchState) -> int:
        """Score job k, (scales, example ids), for runner k of `batch` (several at once, one per replica, where
        the evaluator can) and add the verdicts to the runner and to the examples' failure counts; how many."""
        many = getattr(self.evaluator, "correct_many", None)
        if many is not None and len(jobs) > 1:
            results = many(jobs)
        else:
            results = [self.evaluator.correct(scales, ids) for scales, ids in jobs]
        for runner, (_, ids), verdicts in zip(batch, jobs, results):
            runner.correct += sum(verdicts)
            runner.done.update(ids)
            runner.failed.update(i for i, ok in zip(ids, verdicts) if not ok)
            for i, ok in zip(ids, verdicts):
                state.failures[i] += not ok
        return sum(len(ids) for _, ids in jobs)

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

    def _scales(self, genome: Genome) -> tuple[float, ...]:
        return self.space.scales_key(genome)

    def _deviation(self, scales: tuple[float, ...]) -> float:
        """Sum of |log s_h|: how far the curve moves the model from its own RoPE (0: ties by queue order)."""
        return sum(abs(math.log(s)) for s in scales) if self.settings.ties == "gentle" else 0.0

    def _key(self, genome: Genome) -> str:
        return _key_of(self._scales(genome))

    def _tokens_now(self) -> int:
        return self._tokens_before + self.evaluator.forward_tokens

    def _end_generation(self, state: SearchState, rng: random.Random, scored: list[Scored]) -> None:
        state.forward_tokens = self._tokens_now()
        fitnesses = [s.fitness for s in scored]
        state.history.append({
            "generation": state.generation,
            "best": state.parents[0].fitness,
            "mean_scored": sum(fitnesses) / len(fitnesses) if fitnesses else None,
            "scored": len(scored),
            "raced_out": state.raced_out,
            "duplicates_skipped": state.duplicates_skipped,
            "forward_tokens": state.forward_tokens,
            "genomes": len(state.seen),  # distinct scale vectors met so far: what a search without racing scores
            "unchanged": state.unchanged,
        })
        state.rng_state = _rng_to_json(rng)
        if self.on_generation is not None:
            self.on_generation(state)


HALVING_LEFT = 3  # successive halving stops with this many genomes (or fewer) for the exact race


def spread(total: int, count: int) -> list[int]:
    """`count` example ids spread evenly over range(total): each gold position's block gets its share."""
    return sorted({int((j + 0.5) * total / count) for j in range(count)})


def _key_of(scales: tuple[float, ...]) -> str:
    return json.dumps(scales)


def selection_key(correct: int, deviation: float, order: int) -> tuple:
    """The selection rule's key (smaller ranks higher): right answers, then the gentler curve, then queue order."""
    # At equal fitness the curve that changes the model least wins (deviation is 0 with
    # ties="first"): it keeps what the model learned at its own positions wherever scaling does not help.
    return (-correct, round(deviation, 9), order)


def _rank(scored: Scored, total: int) -> tuple:
    return selection_key(round(scored.fitness * total), scored.deviation, scored.order)


def best_scored(scored: list[Scored], count: int, total: int) -> list[Scored]:
    """The `count` best of `scored` (fitness over `total` examples) by the selection rule."""
    return sorted(scored, key=lambda s: _rank(s, total))[:count]
