"""Scoring a scale vector on calibration examples with the replicas of a pool.

Candidates (scales, or a stock RoPE baseline) are swapped in place (`lpes.apply`): each
replica loads the model once and never reloads it (search/replicas.py). The default
(`scoring.calibration_correct`) is the one-forward-pass check where it gives the benchmark's
verdict (examples without an answer budget) and greedy generation within the budget
elsewhere; `method="greedy"` always generates, the paper's way, for the cost benchmark.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from lpes.foundation.spec import LINEAR_ROPE, RopeScheme
from lpes.search.candidates import Candidate, SchemeScales
from lpes.search.replicas import ReplicaPool

METHODS = ("teacher-forced", "greedy")
# A backward pass costs about two forward passes (it computes the gradients of activations and of
# the inputs of each matmul); the cost benchmark counts forward + backward as 3 forward passes.
BACKWARD_PASSES = 3


@dataclass
class ReplicaUsage:
    """What one replica slot did so far: seconds busy scoring and token positions computed."""

    busy_s: float = 0.0
    forward_tokens: int = 0


class ModelEvaluator:
    """Eq. 7 verdicts for chosen examples; `forward_tokens` counts the positions computed."""

    def __init__(self, pool: ReplicaPool, num_examples: int, rope: RopeScheme = LINEAR_ROPE):
        """`rope`: how the genomes' scales are applied (`--rope-type`); stock baselines are scored as they are."""
        self.pool, self.num_examples, self.rope = pool, num_examples, rope
        self.forward_tokens = 0
        self.usage = [ReplicaUsage() for _ in range(pool.size)]

    def correct(self, candidate: Candidate, example_ids: list[int]) -> list[bool]:
        # Every replica takes an equal share; a verdict depends on (candidate, example) only, so
        # how the chunk is cut never changes the result.
        shares = [example_ids[k::self.pool.size] for k in range(self.pool.size)]
        verdict = {}
        for result in self.pool.score(self._scheme(candidate), [s for s in shares if s]):
            self._count(result)
            verdict.update(zip(result.example_ids, result.verdicts))
        return [verdict[i] for i in example_ids]

    def correct_many(self, jobs: list[tuple[Candidate, list[int]]]) -> list[list[bool]]:
        """Verdicts of several candidates at once, each on its own example ids: one job per replica.

        With fewer jobs than replicas the largest share is halved until every replica has one (or no
        share holds two examples); with more, they go in rounds. Racing sends one genome's chunk per
        replica this way, so 16 replicas race 16 genomes instead of cutting one genome's chunk 16 ways.
        """
        score_many = getattr(self.pool, "score_many", None)
        if score_many is None:  # a pool without it (a test's stand-in): one candidate at a time
            return [self.correct(candidate, ids) for candidate, ids in jobs]
        shares = [(j, list(ids)) for j, (_, ids) in enumerate(jobs) if ids]
        while shares and len(shares) < self.pool.size:
            largest = max(range(len(shares)), key=lambda k: len(shares[k][1]))
            job, ids = shares[largest]
            if len(ids) < 2:
                break
            shares[largest:largest + 1] = [(job, ids[0::2]), (job, ids[1::2])]
        verdicts: list[dict[int, bool]] = [{} for _ in jobs]
        for start in range(0, len(shares), self.pool.size):
            round_ = shares[start:start + self.pool.size]
            calls = [(self._scheme(jobs[j][0]), ids) for j, ids in round_]
            for (j, _), result in zip(round_, score_many(calls)):
                self._count(result)
                verdicts[j].update(zip(result.example_ids, result.verdicts))
        return [[verdicts[j][i] for i in ids] for j, (_, ids) in enumerate(jobs)]

    def logprobs_many(self, jobs: list[tuple[Candidate, list[int]]]) -> list[tuple[list[float], list[bool]]]:
        """Per (candidate, example ids) job: each example's gold log-likelihood and teacher-forced verdict,
        the jobs cut and spread over the replicas as `correct_many` does (values do not depend on the cut)."""
        shares = [(j, ids[k::self.pool.size]) for j, (_, ids) in enumerate(jobs) for k in range(self.pool.size)]
        shares = [(j, ids) for j, ids in shares if ids]
        found: list[dict[int, tuple[float, bool]]] = [{} for _ in jobs]
        for start in range(0, len(shares), self.pool.size):
            round_ = shares[start:start + self.pool.size]
            for (j, _), result in zip(round_, self.pool.objective_many([(self._scheme(jobs[j][0]), ids)
                                                                        for j, ids in round_])):
                self._count(result)
                found[j].update(zip(result.example_ids, zip(result.logprobs, result.argmax_correct)))
        return [([found[j][i][0] for i in ids], [found[j][i][1] for i in ids]) for j, (_, ids) in enumerate(jobs)]

    def gradients(self, scales: tuple[float, ...], batches: list[list[int]], weights: list[float]) -> list:
        """Per batch (fixed by the caller, so its rounding is the same on any layout): its GradientResult,
        the batches spread over the replicas. A backward pass is counted as two forward passes."""
        results = []
        for start in range(0, len(batches), self.pool.size):
            round_ = batches[start:start + self.pool.size]
            jobs = [(scales, ids, [weights[i] for i in ids], self.rope) for ids in round_]
            for result in self.pool.gradient_many(jobs):
                self._count(result, passes=BACKWARD_PASSES)
                results.append(result)
        return results

    def _scheme(self, candidate: Candidate) -> Candidate:
        """A genome's scales as `--rope-type` applies them; stock baselines as they are."""
        if isinstance(candidate, tuple) and not self.rope.linear:
            return SchemeScales(candidate, self.rope)
        return candidate

    def _count(self, result, passes: int = 1) -> None:
        """What one replica's share cost: the search's tokens and that replica's busy time and tokens
        (`passes`: token-equivalents per position, 3 for a forward and a backward)."""
        self.forward_tokens += passes * result.forward_tokens
        self.usage[result.slot].busy_s += result.busy_s
        self.usage[result.slot].forward_tokens += passes * result.forward_tokens


class UsageMeter:
    """Per report: each replica's share of the wall time spent scoring, and its tokens per second."""

    def __init__(self, usage: list[ReplicaUsage]):
        self.usage = usage
        self._last = [ReplicaUsage(u.busy_s, u.forward_tokens) for u in usage]
        self._since = time.perf_counter()

    def step(self) -> tuple[list[float], list[float]]:
        """(busy share, tokens/s) of each replica since the previous step."""
        now = time.perf_counter()
        wall = max(now - self._since, 1e-9)
        busy = [(u.busy_s - last.busy_s) / wall for u, last in zip(self.usage, self._last)]
        rate = [(u.forward_tokens - last.forward_tokens) / wall for u, last in zip(self.usage, self._last)]
        self._last = [ReplicaUsage(u.busy_s, u.forward_tokens) for u in self.usage]
        self._since = now
        return busy, rate
