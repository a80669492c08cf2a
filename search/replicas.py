"""Model replicas that score candidates: in this process, or in Ray actors.

A replica is one copy of the model, loaded once, on one device or split over K GPUs by
transformers' device map (`--gpus-per-replica K`). A candidate travels with each batch and
is swapped in place: per-layer scales (`lpes.apply`) or a stock RoPE baseline
(`reference.use_stock_rope`); the model is never reloaded.

Two pools hold replicas behind one small interface (`ReplicaPool`):

- `LocalPool`: one replica per device group of this machine, run in threads;
- `RayPool`: one Ray actor per replica, driven by `ray.util.ActorPool` (the pattern of
  mergekit-evolve). An actor that dies is replaced and its batch scored again.

Only scoring is distributed. The genetic search, racing and checkpoints stay in the driver,
and a verdict depends only on (candidate, example), so the search ends with the same result
whatever the pool, the number of replicas, or the faults on the way. (Exactly so in float32 on
the CPU, tested; in bfloat16 on GPUs, batches of another size may round differently and flip
an answer decided by a near-tie.) A replacement actor waits up to REPLACEMENT_WAIT_S for room on the
cluster, then the search stops with its checkpoint (the same command resumes).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypedDict

from lpes.foundation.devices import format_bytes, requested_devices, visible_devices
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import RopeScheme, StockRope
from lpes.validation.examples import Example


@dataclass(frozen=True)
class SchemeScales:
    """One scale per decoder layer applied through a per-layer scheme other than linear (`--rope-type`)."""

    scales: tuple[float, ...]
    rope: RopeScheme


# What a replica scores: one (linear) scale per decoder layer, scales under a scheme, or a stock RoPE type.
Candidate = tuple[float, ...] | SchemeScales | StockRope

RAY_INSTALL = "--ray needs Ray: pip install 'lpes[ray]' (Ray 2.60 or later)"
# A batch whose replica dies this many times in a row is a fault of the batch or the cluster, not bad luck.
MAX_ATTEMPTS = 3
# A replacement for a dead replica waits this long for room (its predecessor's resources, normally freed
# at once); longer means another job took them, and the search stops instead of hanging.
REPLACEMENT_WAIT_S = 600.0


class ReplicaLayout(TypedDict):
    """Where scoring ran, as provenance records it."""

    backend: str  # "local" (threads of lpes-search) or "ray" (actors)
    replicas: int
    gpus_per_replica: int  # 0: CPU replicas
    devices: list[list[str]]  # per replica, the devices its model sits on (as the replica sees them)


@dataclass(frozen=True)
class ShareResult:
    """One replica's verdicts on its share of a chunk, and what it cost."""

    slot: int  # which replica (a replacement takes the slot of the one it replaces)
    example_ids: tuple[int, ...]
    verdicts: tuple[bool, ...]
    forward_tokens: int
    busy_s: float


@dataclass(frozen=True)
class ObjectiveResult:
    """One replica's gold log-likelihoods (and teacher-forced verdicts) on its share of a chunk."""

    slot: int
    example_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    argmax_correct: tuple[bool, ...]
    forward_tokens: int
    busy_s: float


@dataclass(frozen=True)
class GradientResult:
    """One batch's weighted objective and its gradient with respect to each layer's scale (dJ/ds_h)."""

    slot: int
    example_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    argmax_correct: tuple[bool, ...]
    objective: float  # sum over the batch of weight x log-likelihood
    gradient: tuple[float, ...]
    forward_tokens: int  # positions of the forward pass (the backward costs about two more)
    busy_s: float


class ReplicaPool(Protocol):
    size: int
    layout: ReplicaLayout

    def score(self, candidate: Candidate, shares: list[list[int]]) -> list[ShareResult]:
        """Verdicts of `candidate` on each share of example ids, one share per replica, in order."""
        ...

    def score_many(self, jobs: list[tuple[Candidate, list[int]]]) -> list[ShareResult]:
        """Verdicts of each (candidate, example ids) job, at most one job per replica, in order."""
        ...

    def greedy_accuracy(self, scales: Candidate, examples: list[Example]) -> float:
        """Greedy accuracy (the benchmark's test) of `scales` on `examples`, on one replica."""
        ...

    def objective_many(self, jobs: list[tuple[Candidate, list[int]]]) -> list[ObjectiveResult]:
        """Gold log-likelihoods of each (candidate, example ids) job, at most one job per replica, in order."""
        ...

    def gradient_many(self, jobs: list[tuple[tuple[float, ...], list[int], list[float]]]) -> list[GradientResult]:
        """Per (scales, one batch's example ids, their weights) job: the batch's objective and dJ/ds."""
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
        _require_accelerate()
        if ray is None:
            device_groups(requested_devices(device), gpus_per_replica)


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


# ---- one replica ----


class Replica:
    """One copy of the model; the same class runs in a thread here or as a Ray actor."""

    def __init__(self, slot: int, model_path: str, devices: list[str] | None, dtype: str, tokenizer,
                 examples: list[Example], method: str, batch_size: int, threads: int | None = None):
        import torch

        if threads:
            torch.set_num_threads(threads)
        # None: the GPUs this process sees (a Ray actor sees exactly the ones Ray gave it).
        self.devices = devices or visible_devices()
        self.slot, self.tokenizer, self.examples = slot, tokenizer, examples
        self.method, self.batch_size = method, batch_size
        self.model = load_replica(Path(model_path), self.devices, dtype)
        self._candidate: Candidate | None = None

    def info(self) -> dict:
        return {"slot": self.slot, "pid": os.getpid(), "devices": self.devices}

    def score(self, candidate: Candidate, example_ids: Sequence[int]) -> ShareResult:
        from lpes.validation import scoring

        started = time.perf_counter()
        self._use(candidate)
        examples = [self.examples[i] for i in example_ids]
        score = scoring.greedy_correct if self.method == "greedy" else scoring.calibration_correct
        scores = score(self.model, self.tokenizer, examples, _batch_size(candidate, self.batch_size))
        return ShareResult(self.slot, tuple(example_ids), tuple(r.correct for r in scores.results),
                           scores.forward_tokens, time.perf_counter() - started)

    def objective(self, candidate: Candidate, example_ids: Sequence[int]) -> ObjectiveResult:
        from lpes.validation.scoring import answer_logprobs

        started = time.perf_counter()
        self._use(candidate)
        examples = [self.examples[i] for i in example_ids]
        logprobs, verdicts, tokens = answer_logprobs(self.model, self.tokenizer, examples,
                                                     _batch_size(candidate, self.batch_size))
        return ObjectiveResult(self.slot, tuple(example_ids), tuple(logprobs), tuple(verdicts), tokens,
                               time.perf_counter() - started)

    def gradient(self, scales: tuple[float, ...], example_ids: Sequence[int],
                 weights: Sequence[float]) -> GradientResult:
        """One forward and backward pass over the batch `example_ids` at the linear per-layer `scales`."""
        import torch

        from lpes.converter.reference import apply_differentiable
        from lpes.validation.scoring import answer_logprob_batches

        started = time.perf_counter()
        self._candidate = None  # the next candidate replaces the differentiable patch
        self.model.requires_grad_(False)  # the weights stay frozen: only the scales get gradients
        dtype = torch.promote_types(next(self.model.parameters()).dtype, torch.float32)
        device = next(self.model.parameters()).device
        layer_scales = torch.tensor(scales, dtype=dtype, device=device, requires_grad=True)
        apply_differentiable(self.model, layer_scales)
        examples = [self.examples[i] for i in example_ids]
        [(rows, tokens)] = list(answer_logprob_batches(self.model, self.tokenizer, examples, grad=True,
                                                       batches=[list(range(len(examples)))]))
        objective = sum(w * r.logprob for w, r in zip(weights, rows))
        objective.backward()
        return GradientResult(self.slot, tuple(example_ids), tuple(float(r.logprob.detach()) for r in rows),
                              tuple(r.argmax_correct for r in rows), float(objective.detach()),
                              tuple(float(g) for g in layer_scales.grad.double()), tokens,
                              time.perf_counter() - started)

    def greedy_accuracy(self, scales: Candidate, examples: list[Example]) -> float:
        from lpes.validation.scoring import greedy_correct

        self._use(scales)
        return greedy_correct(self.model, self.tokenizer, examples, _batch_size(scales, self.batch_size)).accuracy

    def _use(self, candidate: Candidate) -> None:
        from lpes.converter.reference import apply, use_stock_rope
        from lpes.foundation.spec import Spec

        if candidate == self._candidate:  # racing scores one genome chunk after chunk: swap only when it changes
            return
        if isinstance(candidate, StockRope):
            use_stock_rope(self.model, candidate)
        elif isinstance(candidate, SchemeScales):
            apply(self.model, Spec.from_scales(list(candidate.scales), rope=candidate.rope))
        else:
            apply(self.model, Spec.from_scales(list(candidate)))
        self._candidate = candidate


def _batch_size(candidate: Candidate, batch_size: int) -> int:
    # A length-dependent RoPE (dynamic NTK) takes its frequencies from a batch's longest row:
    # one example at a time, each verdict is the example's own, as for every other candidate.
    rope = candidate.rope if isinstance(candidate, SchemeScales) else candidate
    return 1 if isinstance(rope, (StockRope, RopeScheme)) and rope.length_dependent else batch_size


def load_replica(model_path: Path, devices: list[str], dtype: str = "float32"):
    """The model on `devices[0]`, or split over all of `devices` by a planned device map."""
    from lpes.converter.loading import load_config, load_model

    if len(devices) == 1:
        return load_model(model_path, dtype).to(devices[0])
    plan = plan_device_map(load_config(model_path), devices, dtype)
    return load_model(model_path, dtype, device_map=plan)


def plan_device_map(config, devices: list[str], dtype: str = "float32",
                    free_bytes: dict[str, int] | None = None) -> dict[str, int]:
    """transformers' balanced device map of one replica over `devices` (cuda:i), planned on the meta device.

    `free_bytes`: memory to use per device (default: what is free on each GPU now). Decoder
    layers are never split; each GPU gets a near-equal share, and the map must fit on these
    GPUs alone: offloading to CPU or disk would make every candidate crawl.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from lpes.converter.architectures import architecture_for
    from lpes.converter.loading import DTYPES

    _require_accelerate()
    from transformers.integrations.accelerate import get_balanced_memory, infer_auto_device_map

    indices = [_cuda_index(d) for d in devices]
    if free_bytes is None:
        free_bytes = {d: torch.cuda.mem_get_info(i)[0] for d, i in zip(devices, indices)}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    no_split = model._no_split_modules
    budget = {i: int(free_bytes[d]) for d, i in zip(devices, indices)}
    balanced = get_balanced_memory(model, max_memory=dict(budget), no_split_module_classes=no_split)
    plan = dict(infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=no_split))
    # The LPES wrapper computes each layer's cos/sin from the model-level rotary's inv_freq and the
    # position ids, which start on the first device with the embeddings: keep the rotary there too
    # (its buffers are a few KB); accelerate's hooks then carry cos/sin to each layer's device.
    plan[architecture_for(config).patch_kwargs(config)["rotary_path"]] = indices[0]
    if not set(plan.values()) <= set(indices):
        free = ", ".join(f"{d} {format_bytes(free_bytes[d])}" for d in devices)
        raise LpesError(f"the {dtype} model does not fit on {len(devices)} GPU(s) ({free} free): "
                        "raise --gpus-per-replica")
    return plan


def _cuda_index(device: str) -> int:
    kind, _, index = device.partition(":")
    if kind != "cuda" or not index.isdigit():
        raise LpesError(f"a replica spans GPUs only (cuda:N), got {device!r}")
    return int(index)


def _require_accelerate() -> None:
    try:
        import accelerate  # noqa: F401  (transformers' device maps are built on it)
    except ImportError:
        raise LpesError("--gpus-per-replica above 1 needs accelerate: pip install 'lpes[gpu]'") from None


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

    def gradient_many(self, jobs: list[tuple[tuple[float, ...], list[int], list[float]]]) -> list[GradientResult]:
        return self._call_many("gradient", jobs)

    def _call_many(self, method: str, jobs: list[tuple]) -> list:
        """Replica k runs `method(*jobs[k])`; at most one job per replica."""
        runs = list(zip(self.replicas, jobs))
        if self._threads is None:
            return [getattr(replica, method)(*job) for replica, job in runs]
        return list(self._threads.map(lambda run: getattr(run[0], method)(*run[1]), runs))

    def greedy_accuracy(self, scales: Candidate, examples: list[Example]) -> float:
        return self.replicas[0].greedy_accuracy(scales, examples)

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


# ---- in Ray actors ----


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

    def gradient_many(self, jobs: list[tuple[tuple[float, ...], list[int], list[float]]]) -> list[GradientResult]:
        return self._call_many("gradient", jobs)

    def _call_many(self, method: str, jobs: list[tuple]) -> list:
        results = self._run_all([lambda actor, job=job: getattr(actor, method).remote(*job) for job in jobs])
        if any(list(r.example_ids) != list(job[1]) for r, job in zip(results, jobs)):
            raise RuntimeError("replica results came back out of order")  # ActorPool.get_next keeps order
        return results

    def greedy_accuracy(self, scales: Candidate, examples: list[Example]) -> float:
        [accuracy] = self._run_all([lambda actor: actor.greedy_accuracy.remote(scales, examples)])
        return accuracy

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
