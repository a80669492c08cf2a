"""Model replicas that score candidates: in this process, or in Ray actors.

A replica (replica.py) is one copy of the model, loaded once, on one device or split over K GPUs by
transformers' device map (`--gpus-per-replica K`). A candidate travels with each batch and
is swapped in place: per-layer scales (`lpes.apply`) or a stock RoPE baseline
(`reference.use_stock_rope`); the model is never reloaded. What a replica scores and returns: candidates.py.

Two pools hold replicas behind one small interface (`ReplicaPool`):

- `LocalPool` (here): one replica per device group of this machine, run in threads;
- `RayPool` (ray_pool.py): one Ray actor per replica, driven by `ray.util.ActorPool` (the pattern of
  mergekit-evolve). An actor that dies is replaced and its batch scored again.

Only scoring is distributed. The genetic search, racing and checkpoints stay in the driver,
and a verdict depends only on (candidate, example), so the search ends with the same result
whatever the pool, the number of replicas, or the faults on the way. (Exactly so in float32 on
the CPU, tested; in bfloat16 on GPUs, batches of another size may round differently and flip
an answer decided by a near-tie.) A replacement actor waits up to REPLACEMENT_WAIT_S for room on the
cluster, then the search stops with its checkpoint (the same command resumes).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from lpes.foundation.devices import requested_devices
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import RopeScheme
from lpes.search.candidates import Candidate, GradientResult, ObjectiveResult, ReplicaLayout, ShareResult
from lpes.search.ray_pool import RayPool, check_ray_address, import_ray
from lpes.search.replica import Replica, require_accelerate
from lpes.validation.examples import Example


class ReplicaPool(Protocol):
    size: int
    layout: ReplicaLayout

    def score(self, candidate: Candidate, shares: list[list[int]]) -> list[ShareResult]:
        """Verdicts of `candidate` on each share of example ids, one share per replica, in order."""
        ...

    def score_many(self, jobs: list[tuple[Candidate, list[int]]]) -> list[ShareResult]:
        """Verdicts of each (candidate, example ids) job, at most one job per replica, in order."""
        ...

    def greedy_verdicts(self, scales: Candidate, examples: list[Example]) -> list[bool]:
        """The benchmark's verdict (greedy) of `scales` on each of `examples`, on one replica."""
        ...

    def greedy_texts(self, scales: Candidate, examples: list[Example]) -> list[str]:
        """What the model writes on `examples` under `scales` (greedy), on one replica."""
        ...

    def token_losses(self, scales: Candidate, ids: list[int], max_seconds: float | None) -> list[float]:
        """Next-token losses of `scales` along `ids`, within `max_seconds`, on one replica (search/lengths.py)."""
        ...

    def set_examples(self, examples: list[Example]) -> None:
        """Every replica, and any that replaces one, scores these examples from now on (the same ids)."""
        ...

    def objective_many(self, jobs: list[tuple[Candidate, list[int]]]) -> list[ObjectiveResult]:
        """Gold log-likelihoods of each (candidate, example ids) job, at most one job per replica, in order."""
        ...

    def gradient_many(self, jobs: list[tuple[tuple[float, ...], list[int], list[float], RopeScheme]]
                      ) -> list[GradientResult]:
        """Per (scales, one batch's example ids, their weights, the scheme) job: the batch's objective and dJ/ds."""
        ...

    def close(self) -> None: ...


def check_replica_options(ray: str | None, replicas: int | None, gpus_per_replica: int, device: str | None) -> None:
    """Fail in a second, before any model is loaded, on a layout that cannot run."""
    if gpus_per_replica < 1:
        raise LpesError(f"--gpus-per-replica must be at least 1, got {gpus_per_replica}")
    if replicas is not None and replicas < 1:
        raise LpesError(f"--replicas must be at least 1, got {replicas}")
    if replicas is not None and ray is None:
        raise LpesError("--replicas is for --ray; without it there is one replica per --device group")
    if ray is not None:
        import_ray()
        if device not in (None, "cpu"):
            raise LpesError(f"--device {device} with --ray: Ray assigns the GPUs; pass --device cpu for CPU replicas")
        check_ray_address(ray)
    if gpus_per_replica > 1:
        require_accelerate()
        if ray is None:
            device_groups(requested_devices(device), gpus_per_replica)


def open_pool(model_path: Path, tokenizer, examples: list[Example], *, method: str, batch_size: int,
              dtype: str = "float32", device: str | None = None, ray: str | None = None,
              replicas: int | None = None, gpus_per_replica: int = 1) -> ReplicaPool:
    """The replicas that will score: Ray actors with `ray` (an address, `auto` or `local`), else this process's."""
    args = {"model_path": str(model_path), "dtype": dtype, "tokenizer": tokenizer, "examples": examples,
            "method": method, "batch_size": batch_size}
    if ray is not None:
        return RayPool(ray, replicas, gpus_per_replica, device, args)
    devices = requested_devices(device)
    groups = device_groups(devices, gpus_per_replica)
    unused = devices[len(groups) * gpus_per_replica:]
    if unused:
        print(f"lpes-search: {','.join(unused)} unused ({len(devices)} GPUs do not divide into replicas of "
              f"{gpus_per_replica})", file=sys.stderr)
    return LocalPool([Replica(slot, devices=group, **args) for slot, group in enumerate(groups)], gpus_per_replica)


# ---- in this process ----


class LocalPool:
    """Replicas of this process, one per device group, scoring their shares in threads."""

    def __init__(self, replicas: list[Replica], gpus_per_replica: int):
        self.replicas = replicas
        self.size = len(replicas)
        self.layout = ReplicaLayout(backend="local", replicas=self.size,
                                    gpus_per_replica=0 if replicas[0].devices == ["cpu"] else gpus_per_replica,
                                    devices=[r.devices for r in replicas])
        self._threads = ThreadPoolExecutor(self.size) if self.size > 1 else None

    def score(self, candidate: Candidate, shares: list[list[int]]) -> list[ShareResult]:
        return self.score_many([(candidate, share) for share in shares])

    def score_many(self, jobs: list[tuple[Candidate, list[int]]]) -> list[ShareResult]:
        return self._call_many("score", jobs)

    def objective_many(self, jobs: list[tuple[Candidate, list[int]]]) -> list[ObjectiveResult]:
        return self._call_many("objective", jobs)

    def gradient_many(self, jobs: list[tuple[tuple[float, ...], list[int], list[float], RopeScheme]]
                      ) -> list[GradientResult]:
        return self._call_many("gradient", jobs)

    def _call_many(self, method: str, jobs: list[tuple]) -> list:
        """Replica k runs `method(*jobs[k])`; at most one job per replica."""
        runs = list(zip(self.replicas, jobs))
        if self._threads is None:
            return [getattr(replica, method)(*job) for replica, job in runs]
        return list(self._threads.map(lambda run: getattr(run[0], method)(*run[1]), runs))

    def greedy_verdicts(self, scales: Candidate, examples: list[Example]) -> list[bool]:
        return self.replicas[0].greedy_verdicts(scales, examples)

    def greedy_texts(self, scales: Candidate, examples: list[Example]) -> list[str]:
        return self.replicas[0].greedy_texts(scales, examples)

    def token_losses(self, scales: Candidate, ids: list[int], max_seconds: float | None) -> list[float]:
        return self.replicas[0].token_losses(scales, ids, max_seconds)

    def set_examples(self, examples: list[Example]) -> None:
        for replica in self.replicas:
            replica.set_examples(examples)

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown()


def device_groups(devices: list[str], gpus_per_replica: int) -> list[list[str]]:
    """`devices` cut into replicas of `gpus_per_replica` (devices left over stay unused)."""
    if gpus_per_replica == 1:
        return [[d] for d in devices]
    if any(not d.startswith("cuda") for d in devices):
        raise LpesError(f"--gpus-per-replica {gpus_per_replica} needs GPUs; the devices are {','.join(devices)}")
    count = len(devices) // gpus_per_replica
    if count == 0:
        raise LpesError(f"--gpus-per-replica {gpus_per_replica} needs {gpus_per_replica} GPUs; "
                        f"{len(devices)} visible ({','.join(devices)})")
    return [devices[k * gpus_per_replica:(k + 1) * gpus_per_replica] for k in range(count)]
