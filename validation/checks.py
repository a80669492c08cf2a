"""What validation can afford on this machine, and the check that needs no weights.

Validation runs, by default, what the model, the machine and the inputs allow:

- `rope` (always, any model size, milliseconds): every layer's cos/sin, as the
  written folder's config and `lpes_rope` compute them, against an independent
  float64 computation of RoPE at positions i / s_h from the model's own inv_freq.
  Layers at scale 1 must reproduce the model's own cos/sin bit for bit. Under a spec's
  `rope_type` yarn or dynamic, each layer against transformers' own rotary module built
  from a config.json of that type at the layer's factor (within 1e-6).
- `kv` (key-value accuracy by position for every variant): when there is a
  tokenizer, the weights fit in memory, and the estimated time fits the budget.
  The estimate times a probe, the first real batch of the examples decoded by the
  unscaled model (its answers are kept), prefill and decode steps apart, and
  extrapolates to every batch of every variant that is scored (`estimate_seconds`).
  Under a budget the probe is bounded too: one prompt's prefill is timed first on
  prefixes of it, each twice the last, within PREFIX_SHARE of the budget
  (`time_prefixes`); where the prefills extrapolated from them (`prefill_at`) already
  exceed the budget, or the probe's own could, the scoring is skipped without a probe,
  and a probe that runs past the budget all the same is stopped after its forward.

A skipped check says why and which command runs it elsewhere.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from lpes.converter import lpes_rope
from lpes.converter.architectures import architecture_for
from lpes.foundation.spec import Spec

# Share of the available memory the weights (in the reference dtype) may take: the
# torch variants and each export hold one copy at a time, plus activations.
MEMORY_SHARE = 0.6
# A per-layer yarn/dynamic layer against transformers' own rotary at its factor: the same init function
# on the same parameters, so equal but for YaRN at factor 1 (the model's own RoPE, a rounding apart).
STOCK_ROPE_TOLERANCE = 1e-6
# How far the time estimate may be off either way, as the reports state it (it extrapolates one
# timed batch; the others differ in rows, lengths and where generation stops).
ESTIMATE_MARGIN = 2.0
# Under a budget, the prefix timings before the probe take at most this share of it (`time_prefixes`), from a
# first prefix of FIRST_PREFIX tokens up.
PREFIX_SHARE = 0.1
FIRST_PREFIX = 64


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "passed", "failed" or "skipped"
    detail: str

    @property
    def passed(self) -> bool:
        return self.status != "failed"

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}

    def line(self) -> str:
        return f"{self.name}: {self.status} ({self.detail})"


# ---- the check that needs no weights ----


def rope_check(config, spec: Spec, positions: int) -> Check:
    """Each layer's cos/sin for positions in 0..positions-1 against float64 RoPE at i / s_h."""
    arch = architecture_for(config)
    kwargs = arch.patch_kwargs(config)
    try:
        base = _rotary_module(config, kwargs["rotary_path"])
    except (TypeError, ValueError, AttributeError) as err:
        return Check("rope", "skipped", f"cannot rebuild the model's rotary module alone: {err}")
    layer_types = kwargs["layer_types"] or [None] * len(spec.scales)
    scales_by_type: dict[str | None, list[float]] = {}
    for layer_type, scale in zip(layer_types, spec.scales):
        scales_by_type.setdefault(layer_type, []).append(scale)
    rope = None if spec.rope.linear else spec.rope.for_lpes_rope()
    if rope is not None:  # per-layer yarn/dynamic: what a model of this RoPE can take, said in one line
        from lpes.converter.reference import check_rope_scheme
        from lpes.foundation.errors import LpesError

        try:
            check_rope_scheme(config, spec.rope)
        except LpesError as err:
            return Check("rope", "failed", str(err))
    rotary = lpes_rope.LayerScaledRotary(base, scales_by_type, kwargs["interleaved"], rope, base.config)
    # Every position of the first 512, then 1024 spread to the last: the far angles are where an
    # error shows, and a sample keeps memory small (a 128k-position table per scale is gigabytes).
    ids = torch.unique(torch.cat([torch.arange(min(positions, 512)), torch.linspace(0, positions - 1, 1024).long()]))
    ids = ids[None]
    own_by_type = {}
    for layer_type in dict.fromkeys(layer_types):  # one call per RoPE type computes every distinct scale
        with torch.no_grad():
            own_by_type[layer_type] = rotary(torch.zeros(1), ids, *(() if layer_type is None else (layer_type,)))
    worst = 0.0
    for layer, (layer_type, scale) in enumerate(zip(layer_types, spec.scales)):
        own = own_by_type[layer_type]
        got = own if rotary.uses_own_rope(layer_type, scale) else rotary.per_scale[(layer_type, scale)]
        if rope is None:
            expected, bound = _float64_rope(rotary, layer_type, scale, ids, kwargs["interleaved"])
        else:
            expected, bound = _stock_rope(config, base, spec, scale, ids), STOCK_ROPE_TOLERANCE
        if scale == 1.0 and rope is None and not all(torch.equal(a, b) for a, b in zip(got, own)):
            return Check("rope", "failed", f"layer {layer} (scale 1) differs from the model's own RoPE")
        error = max(float((g.double() - e).abs().max()) for g, e in zip(got, expected))
        if error > bound:
            return Check("rope", "failed", f"layer {layer}: cos/sin off by {error:.2e} (allowed {bound:.2e})")
        worst = max(worst, error)
    detail = f"{len(spec.scales)} layers, positions up to {positions - 1}, max error {worst:.1e}"
    if rope is not None:
        detail += f" against transformers' {spec.rope.name} at each layer's factor"
    return Check("rope", "passed", detail)


def _rotary_module(config, rotary_path: str) -> torch.nn.Module:
    """The model's own rotary class, built alone on the CPU from the config it was made with."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    rotary = lpes_rope.resolve_attribute(meta, rotary_path)
    return type(rotary)(rotary.config)


def _stock_rope(config, base, spec: Spec, scale: float, ids: torch.Tensor):
    """transformers' own rotary class built from the config.json of the spec's scheme at factor `scale`."""
    from lpes.converter.reference import stock_rotary

    stock = stock_rotary(config, type(base), spec.rope.stock(scale), spec.rope)  # fresh: dynamic starts anew
    with torch.no_grad():
        return stock(torch.zeros(1), ids)


def _float64_rope(rotary, layer_type, scale: float, ids: torch.Tensor, interleaved: bool):
    inv_freq = lpes_rope.rope_attribute(rotary, "inv_freq", layer_type).double() / scale
    scaling = float(lpes_rope.rope_attribute(rotary, "attention_scaling", layer_type))
    angles = ids[..., None].double() * inv_freq
    emb = torch.repeat_interleave(angles, 2, dim=-1) if interleaved else torch.cat((angles, angles), dim=-1)
    # transformers forms the angles in float32: an error of a few ulps of the largest angle.
    bound = 4 * float(angles.abs().max()) * 2.0**-24 * max(scaling, 1.0) + 1e-6
    return (emb.cos() * scaling, emb.sin() * scaling), bound


# ---- what this machine can afford ----


@dataclass(frozen=True)
class Probe:
    """One real batch of the examples, greedy-decoded by the unscaled model and timed forward by forward."""

    example_ids: tuple[int, ...]  # the batch scoring starts with (the longest examples)
    scores: Any  # their scoring.Scores (results numbered within the batch), reused as the unscaled model's
    rows: int
    prompt_width: int  # padded prompt positions per row
    steps: int  # decode steps it ran (forwards after the prefill)
    budget_steps: int  # the decode steps its answer budget allowed
    prefill_s: float
    step_s: float  # per decode step, generation's own work included
    single: tuple[float, float] | None  # (prefill_s, step_s) of its first example alone, for batches of one
    seconds: float  # the probe's wall time


class ProbeOverBudget(Exception):
    """The probe ran past its deadline (raised after the forward that crossed it)."""


@dataclass(frozen=True)
class PrefixTiming:
    """One prompt's prefill timed on prefixes of it (`time_prefixes`), before the probe."""

    timings: tuple[tuple[int, float], ...]  # (tokens, seconds) of each prefix, each twice the last
    width: int  # the prompt's tokens: the probe batch's first (longest) example
    rows: int  # the probe batch's examples
    seconds: float  # what timing them took

    def row_prefill(self, worst: bool = False) -> float:
        """Seconds of one row's prefill at `width` (`prefill_at`)."""
        return prefill_at(self.timings, self.width, worst)


def time_prefixes(timer: Callable[[int], float], width: int, allowance: float) -> list[tuple[int, float]]:
    """(tokens, seconds) of `timer(n)`, one row's prefill of a prompt's first n tokens, at FIRST_PREFIX tokens
    and then twice as many each time up to `width`, while the next, at worst (attention's share grows as the
    square of the tokens, the rest linearly: 4x the last), fits in `allowance` seconds with what was spent.
    The first is always timed: FIRST_PREFIX tokens, whatever the prompt's length."""
    timings: list[tuple[int, float]] = []
    spent, tokens = 0.0, max(1, min(width, FIRST_PREFIX))
    while True:
        seconds = timer(tokens)
        timings.append((tokens, seconds))
        spent += seconds
        following = min(width, 2 * tokens)
        if tokens >= width or spent + seconds * (following / tokens) ** 2 > allowance:
            return timings
        tokens = following


def prefill_at(timings: list[tuple[int, float]] | tuple, width: int, worst: bool = False) -> float:
    """One row's prefill seconds at `width` tokens from prefix `timings`: the last one where it reached
    `width`, else the last grown to `width` as the last two grew (an exponent between 1, linear, and 2,
    quadratic), or at `worst` quadratically."""
    tokens, seconds = timings[-1]
    if tokens >= width:
        return seconds
    exponent = 1.0
    if worst:
        exponent = 2.0
    elif len(timings) > 1 and timings[-2][1] > 0 and seconds > 0:
        before, earlier = timings[-2]
        exponent = min(2.0, max(1.0, math.log(seconds / earlier) / math.log(tokens / before)))
    return seconds * (width / tokens) ** exponent


def time_prefix(model, tokenizer, examples, sequence_tokens: list[int], batch_size: int, max_batch_tokens: int,
                max_seconds: float) -> PrefixTiming:
    """`time_prefixes` on the first example of the probe's batch, within PREFIX_SHARE of `max_seconds`."""
    from lpes.validation import scoring

    first = scoring._batches(sequence_tokens, batch_size, max_batch_tokens)[0]
    ids = scoring.encode_prompt(tokenizer, examples[first[0]].prompt)
    device = _device_of(model)
    keep = {"logits_to_keep": 1} if scoring._accepts_logits_to_keep(model) else {}

    def timer(tokens: int) -> float:
        row = torch.tensor([ids[:tokens]], device=device)
        _synchronize(device)
        started = time.perf_counter()
        with torch.no_grad():
            model(input_ids=row, use_cache=False, **keep)
        _synchronize(device)
        return time.perf_counter() - started

    started = time.perf_counter()
    timings = time_prefixes(timer, len(ids), PREFIX_SHARE * max_seconds)
    return PrefixTiming(tuple(timings), len(ids), len(first), time.perf_counter() - started)


def prefill_seconds(prefix: PrefixTiming, prompt_tokens: list[int], sequence_tokens: list[int], batch_size: int,
                    max_batch_tokens: int) -> float:
    """Seconds of every batch's prefill alone (no decode step), as scoring forms the batches: a row's at the
    timed prompt's width, in proportion to each batch's rows and padded prompt positions."""
    from lpes.validation import scoring

    row = prefix.row_prefill()
    return sum(row * len(batch) * max(prompt_tokens[i] for i in batch) / max(prefix.width, 1)
               for batch in scoring._batches(sequence_tokens, batch_size, max_batch_tokens))


def describe_prefix(seconds: float, prefix: PrefixTiming, device: str) -> str:
    tokens, took = prefix.timings[-1]
    return (f"at least {format_seconds(seconds)} on {device} for the prefills alone, extrapolated from one prompt's "
            f"first {tokens:,} of {prefix.width:,} tokens ({format_seconds(took)})")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def probe(model, tokenizer, examples, sequence_tokens: list[int], batch_size: int, max_batch_tokens: int,
          max_new_tokens: int | None, eos, single: bool = False, deadline: float | None = None) -> Probe:
    """Score the first batch scoring would run (its longest examples) and time its prefill and decode steps.

    `single`: also time its first example alone (variants scored one example at a time). `deadline`: a
    time.perf_counter() past which the probe stops after its current forward (ProbeOverBudget).
    """
    from lpes.validation import scoring

    first = scoring._batches(sequence_tokens, batch_size, max_batch_tokens)[0]
    batch = [examples[i] for i in first]
    # A first call pays one-time costs (generation's setup, the allocator, kernels) that no later batch repeats.
    warm = scoring.encode_prompt(tokenizer, batch[0].prompt)[:16]
    scoring.TorchGreedy(model, scoring.pad_token_id(model, tokenizer)).greedy([warm], 2, None)
    started = time.perf_counter()
    scores, prefill_s, step_s, steps = _timed(model, lambda: scoring.greedy_correct(
        model, tokenizer, batch, batch_size, max_new_tokens, eos_token_id=eos, max_batch_tokens=max_batch_tokens),
        deadline)
    seconds = time.perf_counter() - started
    budgets = [seq - len(scoring.encode_prompt(tokenizer, e.prompt)) for seq, e in zip(
        [sequence_tokens[i] for i in first], batch)]
    alone = None
    if single and len(first) > 1:
        _, one_prefill, one_step, _ = _timed(model, lambda: scoring.greedy_correct(
            model, tokenizer, batch[:1], 1, max_new_tokens, eos_token_id=eos, max_batch_tokens=max_batch_tokens),
            deadline)
        alone = (one_prefill, one_step)
    width = max(sequence_tokens[i] - b for i, b in zip(first, budgets))
    return Probe(tuple(first), scores, len(first), width, steps, max(budgets) - 1, prefill_s, step_s, alone, seconds)


def _timed(model, call, deadline: float | None = None):
    """`call()`'s result, the seconds to its first forward's end (the prefill), per later step, and the steps;
    ProbeOverBudget from the first forward that ends past `deadline` (a time.perf_counter())."""
    ends: list[float] = []
    cuda = _device_of(model).type == "cuda"

    def after(module, args, output):
        if cuda:
            torch.cuda.synchronize()
        ends.append(time.perf_counter())
        if deadline is not None and ends[-1] > deadline:
            raise ProbeOverBudget(f"{len(ends)} forward(s)")

    handle = model.register_forward_hook(after)
    try:
        started = time.perf_counter()
        result = call()
        finished = time.perf_counter()
    finally:
        handle.remove()
    if not ends:
        return result, finished - started, 0.0, 0
    steps = len(ends) - 1
    return result, ends[0] - started, (finished - ends[0]) / steps if steps else 0.0, steps


def _device_of(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def estimate_seconds(measured: Probe, prompt_tokens: list[int], sequence_tokens: list[int], batch_size: int,
                     max_batch_tokens: int) -> float:
    """Seconds to score every example once in batches as scoring forms them, extrapolated from the probe.

    A batch's prefill scales with its padded prompt positions, a decode step with its rows (between
    the probe's batch and one example, when that was timed), and the steps with the budget, in the
    share of it the probe's batch used (generation stops when every row has ended).
    """
    from lpes.validation import scoring

    used = measured.steps / measured.budget_steps if measured.budget_steps > 0 else 1.0
    total = 0.0
    for batch in scoring._batches(sequence_tokens, batch_size, max_batch_tokens):
        rows = len(batch)
        width = max(prompt_tokens[i] for i in batch)
        budget_steps = max(sequence_tokens[i] - prompt_tokens[i] for i in batch) - 1
        prefill, step = _per_batch(measured, rows)
        total += prefill * width / max(measured.prompt_width, 1) + step * budget_steps * used
    return total


def _per_batch(measured: Probe, rows: int) -> tuple[float, float]:
    """(prefill, step) seconds of a batch of `rows` at the probe's width: linear in rows between the two timings."""
    if measured.single is None or measured.rows == 1:
        share = rows / measured.rows
        return measured.prefill_s * share, measured.step_s * share
    (one_prefill, one_step), t = measured.single, (rows - 1) / (measured.rows - 1)
    return (one_prefill + t * (measured.prefill_s - one_prefill), one_step + t * (measured.step_s - one_step))


def describe_estimate(seconds: float, measured: Probe, device: str) -> str:
    return (f"about {format_seconds(seconds)} on {device}, extrapolated from a timed batch of {measured.rows} "
            f"example(s) of {measured.prompt_width} prompt tokens ({format_seconds(measured.seconds)}); "
            f"expect the real time within {ESTIMATE_MARGIN:g}x of it either way")


def merge_scores(measured: Probe, rest, rest_ids: list[int]):
    """The probe's scores and those of the other examples (`rest`, numbered within `rest_ids`), as one Scores."""
    from lpes.validation import scoring

    results = {}
    for ids, scores in ((measured.example_ids, measured.scores), (rest_ids, rest)):
        for i, result in zip(ids, scores.results, strict=True):
            results[i] = replace(result, example_id=i)
    return scoring.Scores(tuple(results[i] for i in sorted(results)),
                          measured.scores.forward_tokens + rest.forward_tokens)


def format_seconds(s: float) -> str:
    if s < 10:
        return f"{s:.1f} s"
    if s < 90:
        return f"{s:.0f} s"
    return f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"
