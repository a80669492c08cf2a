"""One replica: one copy of the model, loaded once, on one device or split over K GPUs by transformers' device
map; a candidate travels with each batch and is swapped in place. The same class runs in a thread of lpes-search
or as a Ray actor."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from lpes.foundation.devices import format_bytes, visible_devices
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import LINEAR_ROPE, RopeScheme, StockRope
from lpes.search.candidates import Candidate, GradientResult, ObjectiveResult, SchemeScales, ShareResult
from lpes.validation.examples import Example
from lpes.validation.shared_greedy import DraftPool


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
        # Every candidate answers the same prompts, and most answer most of them alike: each answer is a draft
        # for the next candidate's (validation/shared_greedy.py; greedy's tokens either way).
        self._drafts = DraftPool()

    def info(self) -> dict:
        return {"slot": self.slot, "pid": os.getpid(), "devices": self.devices}

    def score(self, candidate: Candidate, example_ids: Sequence[int]) -> ShareResult:
        from lpes.validation import scoring

        started = time.perf_counter()
        self._use(candidate)
        examples = [self.examples[i] for i in example_ids]
        wide, drafts = self._wide(candidate), self._drafts_for(candidate)
        if self.method == "greedy":
            scores = scoring.greedy_correct(self.model, self.tokenizer, examples, drafts=drafts, **wide)
        else:
            scores = scoring.calibration_correct(self.model, self.tokenizer, examples,
                                                 _batch_size(candidate, self.batch_size), drafts=drafts, greedy=wide)
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

    def gradient(self, scales: tuple[float, ...], example_ids: Sequence[int], weights: Sequence[float],
                 rope: RopeScheme = LINEAR_ROPE) -> GradientResult:
        """One forward and backward pass over the batch `example_ids` at the per-layer `scales` under `rope`."""
        import torch

        from lpes.converter.reference import apply_differentiable
        from lpes.validation.scoring import answer_logprob_batches

        started = time.perf_counter()
        self._candidate = None  # the next candidate replaces the differentiable patch
        self.model.requires_grad_(False)  # the weights stay frozen: only the scales get gradients
        dtype = torch.promote_types(next(self.model.parameters()).dtype, torch.float32)
        device = next(self.model.parameters()).device
        layer_scales = torch.tensor(scales, dtype=dtype, device=device, requires_grad=True)
        apply_differentiable(self.model, layer_scales, rope)
        examples = [self.examples[i] for i in example_ids]
        [(rows, tokens)] = list(answer_logprob_batches(self.model, self.tokenizer, examples, grad=True,
                                                       batches=[list(range(len(examples)))]))
        objective = sum(w * r.logprob for w, r in zip(weights, rows))
        objective.backward()
        return GradientResult(self.slot, tuple(example_ids), tuple(float(r.logprob.detach()) for r in rows),
                              tuple(r.argmax_correct for r in rows), float(objective.detach()),
                              tuple(float(g) for g in layer_scales.grad.double()), tokens,
                              time.perf_counter() - started)

    def greedy_texts(self, scales: Candidate, examples: list[Example]) -> list[str]:
        """What the model writes on `examples` under `scales` (greedy, each example's answer budget)."""
        from lpes.validation.scoring import greedy_correct

        self._use(scales)
        return [r.generated for r in greedy_correct(self.model, self.tokenizer, examples,
                                               _batch_size(scales, self.batch_size)).results]

    def set_examples(self, examples: list[Example]) -> None:
        """The examples the ids of later calls name (--objective answer-logprob swaps in their targets)."""
        self.examples = examples

    def greedy_verdicts(self, scales: Candidate, examples: list[Example]) -> list[bool]:
        """The benchmark's verdict (greedy, each example's answer budget) on each of `examples`."""
        from lpes.validation.scoring import greedy_correct

        self._use(scales)
        scores = greedy_correct(self.model, self.tokenizer, examples, drafts=self._drafts_for(scales),
                                **self._wide(scales))
        return [r.correct for r in scores.results]

    def token_losses(self, scales: Candidate, ids: list[int], max_seconds: float | None) -> list[float]:
        """The next-token loss at each position of `ids` under `scales` (validation/length_probe.py), stopping
        after the chunk that passes `max_seconds` (None: the whole sequence)."""
        from lpes.validation.length_probe import token_losses

        self._use(scales)
        deadline = None if max_seconds is None else time.perf_counter() + max_seconds
        return token_losses(self.model, ids, keep_going=None if deadline is None
                            else lambda _: time.perf_counter() < deadline)

    def _wide(self, candidate: Candidate) -> dict:
        """greedy_correct's batching where every verdict asked for is needed (held out, or a racing chunk its
        runner cannot be dropped within): batches of WIDE_BATCHES x --batch-size share each decode step's weight
        reads and their prompts' prefixes, and a prefill in chunks of one batch's tokens keeps its matmuls as
        efficient as a batch of --batch-size (SmolLM2 on 2 cores: 0.95 s per prompt, 1.07 unchunked;
        bench/RESULTS.md); the token cap grows with it. Not for dynamic NTK: one prompt at a time."""
        from lpes.validation.scoring import MAX_BATCH_TOKENS

        rows = _batch_size(candidate, WIDE_BATCHES * self.batch_size)
        if rows == 1:
            return {"batch_size": 1}
        return {"batch_size": rows, "max_batch_tokens": MAX_BATCH_TOKENS * WIDE_BATCHES,
                "prefill_tokens": MAX_BATCH_TOKENS // 2}

    def _drafts_for(self, candidate: Candidate) -> DraftPool | None:
        # Drafts and shared prefixes are passes of several positions: a RoPE that follows the sequence length
        # (dynamic NTK) would see the longest of them, so it decodes one token a pass, as generate does.
        return None if _length_dependent(candidate) else self._drafts

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


WIDE_BATCHES = 4  # rows decoded together where every verdict is needed, in batches of --batch-size


def _batch_size(candidate: Candidate, batch_size: int) -> int:
    # A length-dependent RoPE (dynamic NTK) takes its frequencies from a batch's longest row:
    # one example at a time, each verdict is the example's own, as for every other candidate.
    return 1 if _length_dependent(candidate) else batch_size


def _length_dependent(candidate: Candidate) -> bool:
    rope = candidate.rope if isinstance(candidate, SchemeScales) else candidate
    return isinstance(rope, (StockRope, RopeScheme)) and rope.length_dependent


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
    from lpes.converter.loading import torch_dtype

    require_accelerate()
    from transformers.integrations.accelerate import get_balanced_memory, infer_auto_device_map

    indices = [_cuda_index(d) for d in devices]
    if free_bytes is None:
        free_bytes = {d: torch.cuda.mem_get_info(i)[0] for d, i in zip(devices, indices)}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype))
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


def require_accelerate() -> None:
    try:
        import accelerate  # noqa: F401  (transformers' device maps are built on it)
    except ImportError:
        raise LpesError("--gpus-per-replica above 1 needs accelerate: pip install 'lpes[gpu]'") from None
