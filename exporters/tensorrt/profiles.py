"""The optimization profile of a TensorRT engine: which batch, sequence and past lengths it accepts.

A TensorRT engine built from a graph with dynamic dimensions runs only the shapes its
profile allows, and tunes its kernels for the profile's `opt` point. The lpes ONNX graph
has four dynamic dimensions, named in the graph itself (see `graph_io`):

    batch                   rows per call                       min 1, opt 1, max --max-batch (8)
    sequence_length         new tokens per call                 min 1 (a decode step), max --max-sequence
    past_sequence_length    tokens already in the KV cache      min 0 (a prefill), max --max-past
    total_sequence_length   past + sequence (attention_mask)    max --max-total

`--max-total` bounds past + sequence: TensorRT checks each input against its own range
only, so the attention mask's range is what refuses a call whose past and new tokens
together exceed what the model covers. An LPES model is used beyond its trained positions:
a layer with scale s interpolates s x as many positions into its trained range, so the
spec covers `max_position_embeddings x` its largest scale (the demo: 256 x 4 = 1024).
That is `--max-total`'s default, capped at DEFAULT_TOTAL_CAP because the profile's max
shape sizes the engine's activation memory (never below the model's own positions; pass
`--max-total` to go further, up to that product).

Everything here is a pure function of numbers, so it is tested without TensorRT.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from lpes.exporters.onnx import graph_io
from lpes.foundation.errors import LpesError

DEFAULT_MAX_BATCH = 8  # the batch size of lpes-validate's key-value scoring
# Kernels are tuned at the opt point; one profile serves prefill and decode, so opt sits in
# the middle: a short prefill chunk over a half-full cache.
DEFAULT_OPT_SEQUENCE = 128
# Most past + new tokens a default profile spans (a 32k context: as far as common long-context
# evaluations go, and activation memory an engine still fits on one GPU at batch 8 for 7B models).
DEFAULT_TOTAL_CAP = 32768

_FIELDS = ("batch", "sequence", "past", "total")
# Graph dimension names (as the ONNX exporter writes them) -> Profile field.
DIMENSIONS = {
    graph_io.BATCH: "batch",
    graph_io.SEQUENCE: "sequence",
    graph_io.PAST_SEQUENCE: "past",
    graph_io.TOTAL_SEQUENCE: "total",
}


@dataclass(frozen=True)
class DimRange:
    min: int
    opt: int
    max: int

    def as_list(self) -> list[int]:
        return [self.min, self.opt, self.max]


@dataclass(frozen=True)
class Profile:
    batch: DimRange
    sequence: DimRange
    past: DimRange
    total: DimRange

    def to_json(self) -> dict[str, list[int]]:
        return {name: getattr(self, name).as_list() for name in _FIELDS}

    @classmethod
    def from_json(cls, data: dict) -> Profile:
        try:
            return cls(**{name: DimRange(*data[name]) for name in _FIELDS})
        except (KeyError, TypeError) as err:
            raise LpesError(f"TensorRT profile: need batch/sequence/past/total as [min, opt, max] ({err})") from None


def lpes_positions(max_positions: int, max_scale: float = 1.0) -> int:
    """The most past + new tokens the spec covers: `max_positions` x the largest scale (never below `max_positions`)."""
    return max(max_positions, math.floor(max_positions * max_scale))


def default_profile(
    max_positions: int,
    *,
    max_scale: float = 1.0,
    max_batch: int = DEFAULT_MAX_BATCH,
    opt_batch: int = 1,
    max_total: int | None = None,
    max_sequence: int | None = None,
    opt_sequence: int | None = None,
    max_past: int | None = None,
    opt_past: int | None = None,
) -> Profile:
    """The profile for a model with `max_positions` positions whose LPES spec's largest scale is `max_scale`.

    Every argument left None gets its default (see the module docstring).
    """
    _positive("max_position_embeddings", max_positions)
    covered = lpes_positions(max_positions, max_scale)
    total_max = max(max_positions, min(covered, DEFAULT_TOTAL_CAP)) if max_total is None else max_total
    _positive("--max-total", total_max)
    if total_max > covered:
        scaled = f" x the spec's largest scale ({max_scale:g}) = {covered}" if covered > max_positions else ""
        raise LpesError(
            f"--max-total {total_max} exceeds the model's max_position_embeddings ({max_positions}){scaled}"
        )
    sequence_max = total_max if max_sequence is None else max_sequence
    past_max = total_max - 1 if max_past is None else max_past
    _positive("--max-batch", max_batch)
    _positive("--max-sequence", sequence_max)
    if past_max < 0:
        raise LpesError(f"--max-past must be >= 0, got {past_max}")
    if sequence_max > total_max or past_max >= total_max:
        raise LpesError(
            f"--max-sequence ({sequence_max}) and --max-past ({past_max}) must fit in --max-total ({total_max}): "
            "sequence <= total and past < total"
        )
    half = max(1, total_max // 2)
    sequence_opt = min(DEFAULT_OPT_SEQUENCE, sequence_max, half) if opt_sequence is None else opt_sequence
    past_opt = min(past_max, total_max // 2, max(0, total_max - sequence_opt)) if opt_past is None else opt_past
    batch = _range("batch", 1, opt_batch, max_batch)
    sequence = _range("sequence", 1, sequence_opt, sequence_max)
    past = _range("past", 0, past_opt, past_max)
    if sequence.opt + past.opt > total_max:
        raise LpesError(
            f"--opt-sequence ({sequence.opt}) + --opt-past ({past.opt}) exceeds --max-total ({total_max})"
        )
    total = DimRange(sequence.min + past.min, sequence.opt + past.opt, total_max)
    return Profile(batch, sequence, past, total)


# TensorRT dimensions are 32-bit; a batch beyond this is a typo, not a deployment (its KV cache alone is terabytes).
MAX_DIMENSION = 2**31 - 1
MAX_BATCH = 65536


def _positive(flag: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise LpesError(f"{flag} must be a positive integer, got {str(value)[:40]}")
    limit = MAX_BATCH if flag == "--max-batch" else MAX_DIMENSION
    if value > limit:
        raise LpesError(f"{flag} must be at most {limit}, got {str(value)[:40]}")


def _range(name: str, low: int, opt: int, high: int) -> DimRange:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, opt, high)):
        raise LpesError(f"--opt-{name}/--max-{name} must be integers")
    if not low <= opt <= high:
        raise LpesError(f"{name}: need {low} <= --opt-{name} ({opt}) <= --max-{name} ({high})")
    return DimRange(low, opt, high)


def input_shapes(
    graph_inputs: dict[str, list[int | str]], profile: Profile
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """(min, opt, max) shape of every graph input, from its dims (ints, or the names in DIMENSIONS).

    Raises LpesError for a dynamic dimension the profile does not cover.
    """
    shapes = {}
    for name, dims in graph_inputs.items():
        ranges = []
        for dim in dims:
            if isinstance(dim, int) and dim >= 0:
                ranges.append(DimRange(dim, dim, dim))
            elif dim in DIMENSIONS:
                ranges.append(getattr(profile, DIMENSIONS[dim]))
            else:
                raise LpesError(
                    f"input {name!r} has a dynamic dimension {dim!r} that no TensorRT profile flag covers "
                    f"(known: {', '.join(DIMENSIONS)})"
                )
        shapes[name] = tuple(tuple(r.min if i == 0 else r.opt if i == 1 else r.max for r in ranges) for i in range(3))
    return shapes


def trtexec_shape_flags(shapes: dict[str, tuple[tuple[int, ...], ...]]) -> list[str]:
    """--minShapes/--optShapes/--maxShapes for trtexec, every input named (name:AxBxC)."""
    flags = []
    for index, flag in enumerate(("--minShapes", "--optShapes", "--maxShapes")):
        items = [f"{name}:{'x'.join(str(d) for d in shape[index])}" for name, shape in shapes.items()]
        flags.append(f"{flag}={','.join(items)}")
    return flags


# ---- flags ------------------------------------------------------------------------------------------

_FLAGS = (
    ("--max-batch", "max_batch", f"largest batch the engine accepts (default {DEFAULT_MAX_BATCH})"),
    ("--opt-batch", "opt_batch", "batch the kernels are tuned for (default 1)"),
    ("--max-total", "max_total", "largest past + new tokens (default: the model's max_position_embeddings x "
     f"the spec's largest scale, at most {DEFAULT_TOTAL_CAP})"),
    ("--max-sequence", "max_sequence", "most new tokens per call, i.e. the longest prefill (default: --max-total)"),
    ("--opt-sequence", "opt_sequence", f"new tokens the kernels are tuned for (default {DEFAULT_OPT_SEQUENCE})"),
    ("--max-past", "max_past", "longest KV cache (default: --max-total - 1)"),
    ("--opt-past", "opt_past", "KV cache length the kernels are tuned for (default: half of --max-total)"),
)


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """The profile flags, for any command that builds an engine."""
    group = parser.add_argument_group("TensorRT optimization profile")
    for flag, dest, text in _FLAGS:
        group.add_argument(flag, dest=dest, type=int, default=None, help=text)


def profile_overrides(args: argparse.Namespace) -> dict[str, int]:
    """The profile flags the user gave, as keyword arguments for `default_profile`."""
    return {dest: getattr(args, dest) for _, dest, _ in _FLAGS if getattr(args, dest, None) is not None}


def profile_from_args(args: argparse.Namespace, max_positions: int, max_scale: float = 1.0) -> Profile:
    """The profile the flags ask for (defaults from `max_positions` and the spec's largest scale)."""
    return default_profile(max_positions, max_scale=max_scale, **profile_overrides(args))
