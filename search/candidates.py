"""What a replica scores (a candidate: per-layer scales, scales under a scheme, or a stock RoPE type) and what
it returns (verdicts, gold log-likelihoods, or the objective's gradient), the same from a thread or a Ray actor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from lpes.foundation.spec import RopeScheme, StockRope


@dataclass(frozen=True)
class SchemeScales:
    """One scale per decoder layer applied through a per-layer scheme other than linear (`--rope-type`)."""

    scales: tuple[float, ...]
    rope: RopeScheme


# What a replica scores: one (linear) scale per decoder layer, scales under a scheme, or a stock RoPE type.
Candidate = tuple[float, ...] | SchemeScales | StockRope


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
