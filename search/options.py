"""lpes-search's options (`SearchOptions`, one field per flag) and their checks, which fail in a second,
before any model is loaded; the defaults each flag falls back on."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from lpes.foundation.decision import check_alpha
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import ROPE_SCHEMES
from lpes.search.baselines import parse_baselines
from lpes.search.fitness import METHODS
from lpes.search.ga import GA_POPULATION as GA_POPULATION  # lpes-search --help names it
from lpes.search.ga import GASettings
from lpes.search.genome import ScaleGrid
from lpes.search.objective import OBJECTIVES
from lpes.search.optimizers import Optimizer, optimizer
from lpes.search.replicas import check_replica_options
from lpes.validation.task_choice import check_answer_tokens

TIES = ("gentle", "first")
DTYPE_CHOICES = ("auto", "float32", "float16", "bfloat16")
# Sane bounds: beyond them a typo would run for days or allocate without end.
MAX_POPULATION = 10_000
MAX_GENERATIONS = 10_000
MAX_BATCH_SIZE = 4096
# Held-out examples: as many as a data description may ask for per gold index (validation/tasks.py); the
# prompts they make are then held against the memory they take (search/plan.py).
MAX_HOLDOUT = 100_000
MAX_LENGTH_MINUTES = 10_000


@dataclass(frozen=True)
class SearchOptions:
    data: str | None = None  # kv:pairs=N,... or FILE.jsonl; None: the model folder's own task
    # None: the optimizer's own (its `population`, search/optimizers.py: 32 for the GA, 6 for CMA-ES).
    population: int | None = None
    generations: int = 20
    # "cmaes": CMA-ES (search/cma.py), the default by bench/bench_search.py: 11-21x fewer tokens than the
    # plain GA at the same held-out accuracy on both bundled models; "ga": the papers' genetic algorithm.
    optimizer: str = "cmaes"
    # Stop once the best curve has not changed for this many generations (or can no longer change); 0: never.
    # 2: what ships is decided on held-out prompts (foundation/decision.py), not by the last calibration point;
    # on SmolLM2 every generation after the uniform scan confirmed s = 0.75 (2 min each on two cores), and the
    # default search with its decision fits 15 min (bench/RESULTS.md). 10 had been bench_search.py's choice,
    # where 5 stopped CMA-ES on lpes-tiny-induction one held-out point short (1 of 100 prompts: noise).
    patience: int = 2
    degree: int = 3  # the papers' cubic curve
    scale_grid: str | None = None  # None: default_scale_grid(rope_type)
    seed: int = 0
    # Held-out examples behind the decision (foundation/decision.py): 200 is the fewest here at which a
    # 5-point gain can reach p < 0.05 with room to spare (120 when every discordant prompt goes one way).
    holdout: int = 200
    device: str | None = None
    # auto: float32 on a CPU (half-precision matmuls there are slow and inexact), bfloat16 on a GPU
    # that has it, else float16 (lpes.foundation.devices.default_dtype); provenance records the one used.
    dtype: str = "auto"
    method: str = "teacher-forced"
    # At equal fitness prefer the gentler curve: on the bundled model +4 points held out, at 2.4x the
    # cost of "first" (each gentler curve of equal fitness must be scored in full; bench/RESULTS.md).
    ties: str = "gentle"
    racing: bool = True
    # The uniform and stock scans by successive halving before their exact race (search/ga.py `_halve`): half
    # the scan's verdicts on SmolLM2 (bench/RESULTS.md); True: the exact race alone (--exact-scan).
    exact_scan: bool = False
    batch_size: int = 8
    chat_template: bool = True
    # Where the replicas run: None (this process) or a Ray address (auto, local, host:port).
    # Like device, none of these changes the result, so resuming on another layout is allowed.
    ray: str | None = None
    replicas: int | None = None  # Ray actors (default: one per gpus_per_replica GPUs, else 1)
    gpus_per_replica: int = 1  # a replica spans this many GPUs (transformers' device map)
    # Stock RoPE types scanned as baselines after the search (search/baselines.py), or "none".
    baselines: str = "yarn,dynamic"
    # The answer budget (TaskConfig.answer_tokens) over the task's own; None: the task's.
    answer_tokens: int | None = None
    # How each layer applies its scale (lpes_rope.py): linear inv_freq / s, or transformers' yarn / dynamic
    # at factor s, whose uniform curves are the stock baselines of that type.
    rope_type: str = "linear"
    # What the optimizer climbs (search/objective.py): Eq. 7's verdicts, or the gold answer's log-likelihood.
    objective: str = "accuracy"
    learning_rate: float = 0.1  # --optimizer gradient: Adam's step in log-scale (search/gradient.py)
    alpha: float = 0.05  # the decision's significance level (McNemar's exact test, foundation/decision.py)
    # The ladder of lengths (search/lengths.py): the longest prompt the shipped model serves (None: the model's
    # max_position_embeddings, or the search length where that is longer), checked from the search length up.
    serve_length: int | None = None
    beyond_trained: bool = False  # --serve-length may pass the model's own context
    length_text: str | None = None  # the probe's text (a UTF-8 file); None: the built-in one (length_probe.py)
    # The ladder's time; None: a quarter of the search's own time before it (at least LADDER_MIN_SECONDS).
    length_minutes: float | None = None


# Linear scales from 0.5 to 4: compression as well as Ms-PoE's 1.2-1.8 and context extension's 2-4x. Below 1
# is where both real models gain at their trained length (s = 0.75 in every layer: SmolLM2 23.0 -> 31.5,
# Gemma 3 24.0 -> 37.0 held out; README, "The premise"), which the earlier default 1:4 never offered.
# A YaRN or dynamic-NTK factor below 1 extends nothing, so theirs start at 1.
LINEAR_SCALE_GRID, FACTOR_SCALE_GRID = "0.5:4:0.25", "1:4:0.25"


def default_scale_grid(rope_type: str) -> str:
    """--scale-grid's default for a --rope-type."""
    return LINEAR_SCALE_GRID if rope_type == "linear" else FACTOR_SCALE_GRID


def with_defaults(options: SearchOptions) -> SearchOptions:
    """`options` with the defaults that depend on other options filled in (what the spec records)."""
    if options.scale_grid is None:
        return replace(options, scale_grid=default_scale_grid(options.rope_type))
    return options


def check_options(options: SearchOptions) -> tuple[ScaleGrid, GASettings]:
    """Fail in a second on bad settings, before any model is loaded."""
    from lpes.foundation.spec import MAX_DEGREE

    options = with_defaults(options)
    if options.population is not None:
        _check_range("--population", options.population, 2, MAX_POPULATION)
    _check_range("--generations", options.generations, 0, MAX_GENERATIONS)
    _check_range("--patience", options.patience, 0, MAX_GENERATIONS)
    _check_objective(options, optimizer(options.optimizer))  # the optimizers are search/optimizers.py's registry
    _check_range("--degree", options.degree, 1, MAX_DEGREE)
    if options.method not in METHODS:
        raise LpesError(f"--method must be one of {', '.join(METHODS)}")
    if options.ties not in TIES:
        raise LpesError(f"--ties must be one of {', '.join(TIES)}")
    if options.holdout < 0:
        raise LpesError(f"--holdout must be >= 0, got {options.holdout}")
    if options.holdout > MAX_HOLDOUT:
        raise LpesError(f"--holdout must be at most {MAX_HOLDOUT}, got {options.holdout}")
    check_alpha(options.alpha)
    _check_range("--batch-size", options.batch_size, 1, MAX_BATCH_SIZE)
    minutes = options.length_minutes
    if minutes is not None and not (isinstance(minutes, (int, float)) and 0 < minutes <= MAX_LENGTH_MINUTES):
        raise LpesError(f"--length-minutes must be in (0, {MAX_LENGTH_MINUTES}], got {minutes!r}")
    if options.dtype not in DTYPE_CHOICES:
        raise LpesError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)}, got {options.dtype!r}")
    _check_devices(options.device)
    check_replica_options(options.ray, options.replicas, options.gpus_per_replica, options.device)
    parse_baselines(options.baselines)
    check_answer_tokens(options.answer_tokens)
    grid = ScaleGrid.parse(options.scale_grid)
    if not grid.values:
        raise LpesError(f"--scale-grid {options.scale_grid!r} has no values")
    _check_rope_type(options.rope_type, grid, options.scale_grid)
    population = resolve_population(options)
    settings = GASettings(population=population, generations=options.generations,
                          parents=max(1, population // 2), seed=options.seed, racing=options.racing,
                          ties=options.ties, patience=options.patience, halving=not options.exact_scan)
    return grid, settings


def _check_objective(options: SearchOptions, chosen: type[Optimizer]) -> None:
    if options.objective not in OBJECTIVES:
        raise LpesError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {options.objective!r}")
    chosen.check(options)  # the objectives it climbs
    if not (math.isfinite(options.learning_rate) and 0 < options.learning_rate <= 10):
        raise LpesError(f"--learning-rate must be in (0, 10], got {options.learning_rate}")


def resolve_population(options: SearchOptions) -> int:
    """--population, or the optimizer's own default."""
    if options.population is not None:
        return options.population
    return optimizer(options.optimizer).population(options.degree)


def _check_rope_type(rope_type: str, grid: ScaleGrid, text: str) -> None:
    if rope_type not in ROPE_SCHEMES:
        raise LpesError(f"--rope-type must be one of {', '.join(ROPE_SCHEMES)}, got {rope_type!r}")
    if rope_type != "linear" and min(grid.values) < 1.0:
        raise LpesError(f"--scale-grid {text!r} with --rope-type {rope_type}: its factors must be >= 1 "
                        "(below 1 it extends nothing); start the grid at 1 or more")


def _check_range(flag: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise LpesError(f"{flag} must be in {low}..{high}, got {value}")


def _check_devices(requested: str | None) -> None:
    """Every device asked for exists on this machine (cuda on a CPU-only machine fails here, not after loading)."""
    from lpes.foundation.devices import check_device

    for name in (requested or "").split(","):
        if name.strip():
            check_device(name.strip())


def resolve_dtype(options: SearchOptions) -> str:
    """The dtype the replicas load: --dtype, or for auto what suits the devices they run on."""
    from lpes.foundation.devices import default_dtype, requested_devices

    if options.dtype != "auto":
        return options.dtype
    if options.ray is not None:  # Ray's GPUs are not visible to this process
        return "float32" if options.device == "cpu" else "bfloat16"
    chosen = {default_dtype(name) for name in requested_devices(options.device)}
    return chosen.pop() if len(chosen) == 1 else "float32"  # a CPU among the devices: all in float32
