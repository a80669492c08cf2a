"""Replicas in Ray actors (`lpes-search --ray`): one actor per replica, driven by `ray.util.ActorPool` (the
pattern of mergekit-evolve). An actor that dies is replaced and its batch scored again; a replacement waits up
to REPLACEMENT_WAIT_S for room on the cluster, then the search stops with its checkpoint."""

from __future__ import annotations

import os
import sys
import uuid
from collections import deque

from lpes.foundation.errors import LpesError
from lpes.foundation.spec import RopeScheme
from lpes.search.candidates import Candidate, GradientResult, ObjectiveResult, ReplicaLayout, ShareResult
from lpes.search.replica import Replica
from lpes.validation.examples import Example

RAY_INSTALL = "--ray needs Ray: pip install 'lpes[ray]' (Ray 2.60 or later)"
# A batch whose replica dies this many times in a row is a fault of the batch or the cluster, not bad luck.
MAX_ATTEMPTS = 3
# A replacement for a dead replica waits this long for room (its predecessor's resources, normally freed
# at once); longer means another job took them, and the search stops instead of hanging.
REPLACEMENT_WAIT_S = 600.0
# How long lpes waits for a --ray HOST:PORT to answer (ray.init itself would retry for minutes).
RAY_CONNECT_TIMEOUT_S = 10.0


def check_ray_address(address: str, timeout: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """--ray HOST:PORT (or ray://HOST:PORT) must accept a connection within `timeout` s; auto and local pass."""
    import socket

    if address in ("auto", "local"):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LpesError(f"--ray {address[:80]!r}: expected auto, local, HOST:PORT or ray://HOST:PORT")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as err:
        why = "no answer" if isinstance(err, TimeoutError) else (err.strerror or type(err).__name__).lower()
        raise LpesError(f"no Ray cluster at --ray {address} ({why} within {timeout:g} s); start one with "
                        "`ray start --head` or pass --ray local") from None


class RayPool:
    """One Ray actor per replica in an `ActorPool`; a dead actor is replaced and its batch resubmitted."""

    def __init__(self, address: str, replicas: int | None, gpus_per_replica: int, device: str | None,
                 replica_args: dict):
        self._ray = import_ray()
        self._actors: list = []
        self._shutdown = _connect(self._ray, address)
        try:
            self._start(replicas, gpus_per_replica, device, replica_args)
        except BaseException:
            self.close()
            raise

    def _start(self, replicas: int | None, gpus_per_replica: int, device: str | None, replica_args: dict) -> None:
        from ray.util import ActorPool

        ray = self._ray
        options, count, on_gpus = _actor_options(ray, replicas, gpus_per_replica, device)
        self._actor_class = ray.remote(max_restarts=0, **options)(Replica)
        # The tokenizer and examples go to the object store once; every actor, replacements too, reads them there.
        self._args = {**replica_args, "tokenizer": ray.put(replica_args["tokenizer"]),
                      "examples": ray.put(replica_args["examples"]), "devices": None if on_gpus else ["cpu"],
                      "threads": None if on_gpus else options["num_cpus"]}
        self._run = uuid.uuid4().hex[:8]  # names this search's actors in `ray list actors`
        self.replaced = 0
        self._actors = [self._new_actor(slot) for slot in range(count)]
        infos = wait_ready(ray, self._actors)
        self.size = count
        self.layout = ReplicaLayout(backend="ray", replicas=count, gpus_per_replica=gpus_per_replica if on_gpus else 0,
                                    devices=[info["devices"] for info in infos])
        self._pool = ActorPool(list(self._actors))

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
        results = self._run_all([lambda actor, job=job: getattr(actor, method).remote(*job) for job in jobs])
        if any(list(r.example_ids) != list(job[1]) for r, job in zip(results, jobs)):
            raise RuntimeError("replica results came back out of order")  # ActorPool.get_next keeps order
        return results

    def greedy_verdicts(self, scales: Candidate, examples: list[Example]) -> list[bool]:
        [verdicts] = self._run_all([lambda actor: actor.greedy_verdicts.remote(scales, examples)])
        return verdicts

    def greedy_texts(self, scales: Candidate, examples: list[Example]) -> list[str]:
        [texts] = self._run_all([lambda actor: actor.greedy_texts.remote(scales, examples)])
        return texts

    def token_losses(self, scales: Candidate, ids: list[int], max_seconds: float | None) -> list[float]:
        [losses] = self._run_all([lambda actor: actor.token_losses.remote(scales, ids, max_seconds)])
        return losses

    def set_examples(self, examples: list[Example]) -> None:
        self._args["examples"] = self._ray.put(examples)  # what a replacement actor loads
        self._ray.get([actor.set_examples.remote(self._args["examples"]) for actor in self._actors])

    def close(self) -> None:
        for actor in self._actors:
            try:
                self._ray.kill(actor)
            except Exception:  # already dead: nothing to free
                pass
        self._actors = []
        if self._shutdown:
            self._ray.shutdown()
            self._shutdown = False

    def _run_all(self, calls: list) -> list:
        """Each `call(actor)` on some actor, results in order; a call whose actor died runs again on a new one."""
        from ray.exceptions import ActorDiedError, RayActorError

        attempts = [0] * len(calls)
        given: dict[int, object] = {}  # call -> the actor it was dispatched to
        queue: deque[int] = deque()  # ActorPool.get_next returns results in the order submitted
        results: dict[int, object] = {}

        def dispatch(actor, index: int):
            given[index] = actor
            return calls[index](actor)

        def submit(index: int) -> None:
            attempts[index] += 1
            queue.append(index)
            self._pool.submit(dispatch, index)

        for index in range(len(calls)):
            submit(index)
        while self._pool.has_next():
            index = queue.popleft()
            try:
                results[index] = self._pool.get_next()
            except RayActorError as err:
                if attempts[index] >= MAX_ATTEMPTS:
                    raise LpesError(f"a Ray replica died {MAX_ATTEMPTS} times on one batch ({type(err).__name__}); "
                                    "see `ray logs` on the cluster") from None
                if isinstance(err, ActorDiedError):  # ActorPool dropped it; one merely unreachable stays in
                    self._replace(given[index], err)
                submit(index)
        return [results[i] for i in range(len(calls))]

    def _new_actor(self, slot: int):
        # The count keeps names unique: a dead actor's name is freed only once Ray has noticed its death.
        name = f"lpes-{self._run}-replica-{slot}-{self.replaced}"
        return self._actor_class.options(name=name).remote(slot=slot, **self._args)

    def _replace(self, dead, err: Exception) -> None:
        slot = self._actors.index(dead)
        try:
            self._ray.kill(dead, no_restart=True)
        except Exception:  # already gone
            pass
        self.replaced += 1
        actor = self._new_actor(slot)
        self._actors[slot] = actor
        wait_ready(self._ray, [actor], timeout=REPLACEMENT_WAIT_S)
        self._pool.push(actor)
        print(f"lpes-search: replica {slot} died ({type(err).__name__}); a new one scores its batch again",
              file=sys.stderr)


def wait_ready(ray, actors: list, timeout: float | None = None) -> list[dict]:
    """Wait for `actors` to load their model; one that fails, or finds no room in `timeout` s, says why in one line."""
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    try:
        return ray.get([a.info.remote() for a in actors], timeout=timeout)
    except GetTimeoutError:
        for actor in actors:
            ray.kill(actor)
        raise LpesError(f"a Ray replica found no room on the cluster within {timeout:g} s (`ray status` shows what "
                        "holds it); the search is checkpointed: run the same command again to resume") from None
    except (RayActorError, RayTaskError) as err:
        why = next((line for line in str(err).splitlines() if "Error" in line), type(err).__name__)
        raise LpesError(f"a Ray replica could not start: {why.strip()[:300]}") from None


def import_ray():
    """The ray module, or LpesError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise LpesError(RAY_INSTALL) from None
    return ray


def _connect(ray, address: str) -> bool:
    """Join or start a cluster; True when lpes started the connection (and so shuts it down)."""
    if ray.is_initialized():  # the caller (a notebook, a test) already chose the cluster
        return False
    quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": "WARNING",
             "configure_logging": True}
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        if address == "local":
            ray.init(address="local", num_cpus=os.cpu_count() or 1, **quiet)
        else:
            # Ray reads "auto" as RAY_ADDRESS if set, else the cluster started here with `ray start`.
            quiet.pop("include_dashboard")  # a running cluster has its own
            ray.init(address=address, **quiet)
    except ConnectionError as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise LpesError(f"no Ray cluster at --ray {address} ({first[:200]}); start one with `ray start --head` "
                        "or pass --ray local") from None
    return True


def _actor_options(ray, replicas: int | None, gpus_per_replica: int, device: str | None) -> tuple[dict, int, bool]:
    """Resources per actor, the replica count, and whether replicas sit on GPUs; fails fast when they cannot fit."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    gpus = sum(n.get("GPU", 0) for n in nodes)
    if gpus and device != "cpu":
        count = replicas or int(gpus // gpus_per_replica)
        most_on_a_node = max(n.get("GPU", 0) for n in nodes)
        if gpus_per_replica > most_on_a_node:
            raise LpesError(f"--gpus-per-replica {gpus_per_replica}: no Ray node has that many GPUs "
                            f"(at most {most_on_a_node:g})")
        if count < 1 or count * gpus_per_replica > gpus:
            raise LpesError(f"--replicas {count} x --gpus-per-replica {gpus_per_replica} needs "
                            f"{count * gpus_per_replica} GPUs; the Ray cluster has {gpus:g}")
        return {"num_gpus": gpus_per_replica, "num_cpus": 1}, count, True
    if gpus_per_replica > 1:
        raise LpesError(f"--gpus-per-replica {gpus_per_replica} needs GPUs; the Ray cluster has none")
    cpus = sum(n.get("CPU", 0) for n in nodes)
    count = replicas or 1
    if count > cpus:
        raise LpesError(f"--replicas {count} CPU replicas need {count} CPUs; the Ray cluster has {cpus:g}")
    # Each replica gets an equal share of the CPUs as torch threads, within what one node has.
    per_replica = max(1, min(int(cpus // count), int(max(n.get("CPU", 0) for n in nodes))))
    return {"num_cpus": per_replica}, count, False
