"""What validation runs and how: the examples and whether key-value scoring fits this machine (`KvPlan`), the
variants in table order (`PlannedVariant`: unscaled, the baselines, the curve, each export found), and
scoring them all on the same examples, one copy of the weights at a time."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lpes.converter.loading import ResolvedModel
from lpes.exporters.targets import RunContext, RunnerUnavailable, registry
from lpes.foundation.devices import check_device, format_bytes
from lpes.foundation.errors import LpesError
from lpes.foundation.rope_schemes import SCHEMES
from lpes.foundation.spec import LINEAR_ROPE, Spec, StockRope
from lpes.validation import checks, scoring
from lpes.validation.examples import Example
from lpes.validation.model_preflight import DEFAULT_MAX_SECONDS
from lpes.validation.results import REFERENCE, UNIFORM, UNSCALED, VariantResult
from lpes.validation.sizes import FORWARD_MARGIN, forward_bytes
from lpes.validation.task_choice import ResolvedTask, check_examples_encode, token_span

BASELINE_NOTE = "PyTorch, best on calibration"
# Share of examples on which an export may decode differently from the reference. float32
# runtimes differ only in rounding, far below the logit gaps of a greedy choice; half
# precision moves logits by ~1e-3 relative and flips a near-tie now and then.
MAX_DISAGREEMENT = {"float32": 0.0, "float16": 0.02, "bfloat16": 0.05}
MAX_ROPE_POSITIONS = 32768  # the RoPE check's positions (it allocates positions x head_dim per scale)


@dataclass
class KvPlan:
    skipped: str | None  # why key-value scoring does not run here; None: it runs
    tokenizer: Any = None
    examples: list[Example] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)  # per example
    sequence_tokens: list[int] = field(default_factory=list)  # per example: prompt + answer budget
    warnings: list[str] = field(default_factory=list)
    tokenizer_missing: bool = False


@dataclass
class PlannedVariant:
    """A torch variant or an export, what it runs with, and whether another variant already gives its answers."""

    name: str
    kind: str  # "unscaled", "uniform", "stock", "reference", "export"
    scales: tuple[float, ...] | None = None
    rope: StockRope | None = None
    folder: Path | None = None
    note: str = ""
    baseline: bool = False
    same_as: str | None = None
    skipped: str | None = None  # why it cannot run (a stock type this model cannot take)
    one_at_a_time: bool = False


def positions_to_check(config, spec: Spec) -> int:
    """Every position the model is used at: its trained length times the largest scale (capped)."""
    trained = int(getattr(config, "max_position_embeddings", 0) or 4096)
    return min(MAX_ROPE_POSITIONS, max(trained, int(trained * max(spec.scales))))


def plan_kv(model_path: Path, config, examples, task: ResolvedTask | None, dtype, max_new_tokens,
             source: str | None = None) -> KvPlan:
    """Whether key-value scoring can run here: a tokenizer and memory for the weights; the examples."""
    from lpes.converter.loading import available_memory, dtype_bytes, has_tokenizer, load_tokenizer, parameter_count

    if not has_tokenizer(model_path):
        return KvPlan(f"{Path(model_path).name} has no tokenizer files, so no prompts can be built",
                      tokenizer_missing=True)
    needed = parameter_count(model_path) * dtype_bytes(dtype)
    available = available_memory()
    if available is not None and needed > checks.MEMORY_SHARE * available:
        return KvPlan(f"the weights take {format_bytes(needed)} in {dtype}; this machine has "
                      f"{format_bytes(available)} available")
    tokenizer = load_tokenizer(model_path)
    if examples is None:
        from lpes.validation.tasks import examples_for

        examples = examples_for(task.config, model_path, tokenizer=tokenizer, use_chat_template=task.chat_template,
                                split="validation")
    examples = list(examples)
    if not examples:
        raise LpesError("validation needs at least one example")
    check_examples_encode(tokenizer, examples, task, source)  # one line, before any model is loaded
    encoded = scoring.encode_examples(tokenizer, examples)
    prompts = [len(e.prompt_ids) for e in encoded]
    budgets = [max_new_tokens or x.answer_tokens or len(e.answer_ids) for x, e in zip(examples, encoded)]
    plan = KvPlan(None, tokenizer, examples, prompts, [p + b for p, b in zip(prompts, budgets)])
    longest = max(plan.sequence_tokens)
    forward = forward_bytes(config, longest, dtype_bytes(dtype))  # one row of the longest: the least a batch holds
    if available is not None and needed + FORWARD_MARGIN * forward > available:
        return KvPlan(f"the longest prompt ({longest:,} positions with its answer budget) keeps about "
                      f"{format_bytes(forward)} of keys, values and activations in {dtype}, beside "
                      f"{format_bytes(needed)} of weights; this machine has {format_bytes(available)} available")
    searched = task.searched.prompt_tokens if task is not None and task.searched is not None else None
    if searched and not 0.8 * searched[1] <= max(prompts) <= 1.25 * searched[1]:
        plan.warnings.append(f"the prompts are {token_span(min(prompts), max(prompts))} tokens, the curve was searched "
                             f"on {token_span(*searched)}: a curve is found for one length")
    return plan


def plan_variants(spec: Spec, config, longest: int, exports, baseline_note: str = "") -> list[PlannedVariant]:
    """The unscaled model, the baselines, the curve, the exports; each torch variant that computes what an
    earlier one computes (scale 1 everywhere, YaRN at 1, dynamic NTK within the trained length) is scored once."""
    from lpes.converter.reference import stock_rope_unsupported

    baseline_note = baseline_note or BASELINE_NOTE
    layers = len(spec.scales)
    planned = [PlannedVariant(UNSCALED, "unscaled", (1.0,) * layers)]
    same = "identical to the unscaled model, scored once"
    uniform = spec.best_uniform_scale
    if uniform is not None:  # the baselines a per-layer curve must beat, found by lpes-search
        planned.append(PlannedVariant(f"{UNIFORM} s={uniform:g}", "uniform", (uniform,) * layers,
                                      note=baseline_note + (f"; {same}" if uniform == 1.0 else ""), baseline=True,
                                      same_as=UNSCALED if uniform == 1.0 else None))
    trained = getattr(config, "max_position_embeddings", None)
    for rope in spec.stock_baselines:
        why = stock_rope_unsupported(config, rope.rope_type)  # a spec searched on another model
        if why:
            planned.append(PlannedVariant(rope.name, "stock", rope=rope, note=why, baseline=True, skipped=why))
            continue
        if rope.same_as_unscaled(longest, trained):
            where = f" on prompts within its {trained} trained positions" if rope.length_dependent else ""
            planned.append(PlannedVariant(rope.name, "stock", rope=rope, baseline=True, same_as=UNSCALED,
                                          note=f"{baseline_note}; {same}{where}"))
            continue
        note = f"{baseline_note}, one example at a time" if rope.length_dependent else baseline_note
        planned.append(PlannedVariant(rope.name, "stock", rope=rope, note=note, baseline=True,
                                      one_at_a_time=rope.length_dependent))
    twin = next((v.name for v in planned if v.scales == tuple(spec.scales) and v.same_as is None), None)
    single = spec.rope.length_dependent  # per-layer dynamic NTK: each example's own length, as its stock twin
    if not spec.rope.linear:  # the scales are yarn/dynamic factors (lpes_rope): YaRN at 1 alone is unscaled
        one = set(spec.scales) == {1.0} and SCHEMES[spec.rope.rope_type].unscaled_at_factor_one
        twin = UNSCALED if one else None
        if twin is None and len(set(spec.scales)) == 1:  # one factor everywhere: that stock baseline (a decision)
            stock = spec.rope.stock(spec.scales[0])
            twin = next((v.name for v in planned if v.rope == stock and v.same_as is None and not v.skipped), None)
    note = f"{twin} everywhere: scored once" if twin else ("" if spec.rope.linear else f"per-layer {spec.rope.name}")
    planned.append(PlannedVariant(REFERENCE, "reference", tuple(spec.scales), same_as=twin, note=note,
                                  one_at_a_time=single))
    planned += [PlannedVariant(name, "export", folder=folder, one_at_a_time=single) for name, folder in exports]
    return planned


@dataclass(frozen=True)
class ScoringSettings:
    """How validation scores every variant: one object from a command's plan to the last greedy call."""

    reference_dtype: str = "float32"  # the torch variants' precision
    device: str | None = None  # None: cuda when available, else cpu
    batch_size: int = 8
    max_batch_tokens: int = scoring.MAX_BATCH_TOKENS
    max_new_tokens: int | None = None  # None: each example's own answer budget
    max_seconds: float | None = DEFAULT_MAX_SECONDS
    progress: bool = True


def score_all(model: ResolvedModel, kv_plan: KvPlan, planned: list[PlannedVariant],
              settings: ScoringSettings) -> tuple[list[VariantResult], str, str | None]:
    """Load the model, time a probe batch, and score every variant if the estimate fits the time budget.

    Under a budget the probe is bounded first (validation/checks.py): one prompt's prefill is timed on its
    prefixes, and where the prefills extrapolated from them exceed the budget, or the probe's could, nothing
    more runs; a probe that runs past the budget all the same is stopped after the forward that crossed it.

    Returns (results, estimate text, why skipped or None).
    """
    import torch

    from lpes.converter.loading import load_model

    where = torch.device(check_device(settings.device))
    torch_model = load_model(model.path, settings.reference_dtype).to(where)
    scored = [v for v in planned if v.same_as is None and v.skipped is None]
    eos = scoring.eos_token_ids(torch_model, kv_plan.tokenizer) or None  # the exports' runners stop alike
    probe, estimate, skipped = _probe_within_budget(torch_model, kv_plan, scored, settings, eos, where.type)
    if skipped is not None:
        return [], estimate, skipped
    scorer = _Scorer(torch_model, model.spec, kv_plan, settings, probe, eos, len(scored), str(where))
    del torch_model  # the scorer's is the one copy: it lets go of it before the exports load theirs
    results: list[VariantResult] = []
    for variant in planned:
        results.append(scorer.run(variant))
    scorer.close()
    return results, estimate, None


def _probe_within_budget(model, kv_plan: KvPlan, scored: list[PlannedVariant], settings: ScoringSettings, eos,
                         device: str) -> tuple[Any, str, str | None]:
    """The probe batch (scored unscaled) and the estimate for every variant; or why the scoring is skipped."""
    examples, budget = kv_plan.examples, settings.max_seconds
    batch, wide = settings.batch_size, settings.max_batch_tokens
    over = f"over the {checks.format_seconds(budget)} budget" if budget is not None else ""
    deadline = None
    if budget is not None:  # the probe itself within the budget: its prefill timed on prefixes first
        deadline = time.perf_counter() + budget
        prefix = checks.time_prefix(model, kv_plan.tokenizer, examples, kv_plan.sequence_tokens, batch, wide, budget)
        least = sum(checks.prefill_seconds(prefix, kv_plan.prompt_tokens, kv_plan.sequence_tokens,
                                           1 if v.one_at_a_time else batch, wide) for v in scored)
        worst = prefix.rows * prefix.row_prefill(worst=True)
        if least > budget or prefix.seconds + worst > budget:
            estimate = checks.describe_prefix(least, prefix, device)
            if least > budget:
                return None, estimate, (f"{len(examples)} examples x {len(scored)} variants would take {estimate}, "
                                        f"{over}")
            return None, estimate, (f"the first batch alone ({prefix.rows} example(s) of {prefix.width:,} prompt "
                                    f"tokens) could take up to {checks.format_seconds(worst)} to prefill, {over} "
                                    f"(extrapolated from its first prompt's first {prefix.timings[-1][0]:,} tokens)")
    try:
        probe = checks.probe(model, kv_plan.tokenizer, examples, kv_plan.sequence_tokens, batch, wide,
                             settings.max_new_tokens, eos, single=any(v.one_at_a_time for v in scored),
                             deadline=deadline)
    except checks.ProbeOverBudget:
        return None, f"over {checks.format_seconds(budget)}", (
            f"{len(examples)} examples x {len(scored)} variants: the timed first batch alone ran past the "
            f"{checks.format_seconds(budget)} budget")
    seconds = sum(checks.estimate_seconds(probe, kv_plan.prompt_tokens, kv_plan.sequence_tokens,
                                          1 if v.one_at_a_time else batch, wide) for v in scored)
    estimate = checks.describe_estimate(seconds, probe, device)
    if budget is not None and seconds > budget:
        return None, estimate, f"{len(examples)} examples x {len(scored)} variants would take {estimate}, {over}"
    return probe, estimate, None


class _Scorer:
    """Scores the planned variants in table order on one progress bar, one function per kind, with one copy of
    the weights at a time (the exports load their own once the torch variants are done)."""

    def __init__(self, model, spec: Spec, kv_plan: KvPlan, settings: ScoringSettings, probe, eos, variants: int,
                 device: str) -> None:
        from tqdm.auto import tqdm

        self.model, self.spec, self.kv, self.settings, self.probe, self.eos = model, spec, kv_plan, settings, probe, eos
        self.run_context = RunContext(settings.reference_dtype, device, scoring.pad_token_id(None, kv_plan.tokenizer))
        self.bar = tqdm(total=len(kv_plan.examples) * variants, desc="lpes-validate", unit="example",
                        disable=not settings.progress)
        self.by_name: dict[str, VariantResult] = {}
        self.reference: VariantResult | None = None

    def run(self, v: PlannedVariant) -> VariantResult:
        if v.kind == "export" and self.model is not None:
            self.model = None  # one copy of the weights at a time: the exports load their own
        if v.skipped is not None:
            result = VariantResult(v.name, "skipped", note=v.skipped, baseline=v.baseline)
        elif v.same_as is not None:
            result = VariantResult(v.name, "ok", self.by_name[v.same_as].scores, v.note, baseline=v.baseline,
                                   same_as=v.same_as)
        else:
            result = {"unscaled": self._unscaled, "uniform": self._scaled, "reference": self._scaled,
                      "stock": self._stock, "export": self._export}[v.kind](v)
        if v.kind == "reference":
            self.reference = result
        self.by_name[v.name] = result
        return result

    def close(self) -> None:
        self.bar.close()

    def _unscaled(self, v: PlannedVariant) -> VariantResult:
        """The unscaled model: the probe batch was scored so already, the other examples only here."""
        from lpes.converter.reference import apply

        apply(self.model, Spec.from_scales(list(v.scales), rope=LINEAR_ROPE))
        self.bar.set_postfix_str(v.name)
        self.bar.update(len(self.probe.example_ids))
        probed = set(self.probe.example_ids)
        rest = [i for i in range(len(self.kv.examples)) if i not in probed]
        scores = checks.merge_scores(self.probe, self._greedy(self.model, rest), rest)
        return VariantResult(v.name, "ok", scores, v.note, baseline=v.baseline)

    def _scaled(self, v: PlannedVariant) -> VariantResult:
        """The curve under the spec's scheme, or the uniform baseline (linear)."""
        from lpes.converter.reference import apply

        rope = self.spec.rope if v.kind == "reference" else LINEAR_ROPE
        apply(self.model, Spec.from_scales(list(v.scales), rope=rope))
        return VariantResult(v.name, "ok", self._score(v.name, self.model, v.one_at_a_time), v.note,
                             baseline=v.baseline)

    def _stock(self, v: PlannedVariant) -> VariantResult:
        """A stock RoPE baseline, as transformers computes it."""
        from lpes.converter.reference import use_stock_rope

        use_stock_rope(self.model, v.rope)
        return VariantResult(v.name, "ok", self._score(v.name, self.model, v.one_at_a_time), v.note,
                             baseline=v.baseline)

    def _export(self, v: PlannedVariant) -> VariantResult:
        result = _score_export(v.name, v.folder, self.reference, self.run_context, self.eos, self._score,
                               v.one_at_a_time)
        if result.status != "ok":
            self.bar.update(len(self.kv.examples))
        return result

    def _score(self, name: str, runner, one_at_a_time: bool) -> scoring.Scores:
        self.bar.set_postfix_str(name)
        return self._greedy(runner, range(len(self.kv.examples)), 1 if one_at_a_time else None)

    def _greedy(self, runner, ids, batch_size: int | None = None) -> scoring.Scores:
        """Greedy scores of the examples `ids` (numbered by their place in `ids`)."""
        ids = list(ids)
        if not ids:
            return scoring.Scores((), 0)
        settings = self.settings
        return scoring.greedy_correct(runner, self.kv.tokenizer, [self.kv.examples[i] for i in ids],
                                      batch_size or settings.batch_size, settings.max_new_tokens,
                                      progress=self.bar.update, eos_token_id=self.eos,
                                      max_batch_tokens=settings.max_batch_tokens)


def _score_export(name, folder, reference: VariantResult, run: RunContext, eos, score,
                  one_at_a_time: bool = False) -> VariantResult:
    target = registry()[name]
    try:
        opened = target.open(folder, run)
    except RunnerUnavailable as why:
        return VariantResult(name, "skipped", note=str(why))
    scores = score(name, opened.runner, one_at_a_time)
    differ = [
        r.example_id
        for r, ref in zip(scores.results, reference.scores.results, strict=True)
        if r.generated != ref.generated
    ]
    # Held to the looser of the two precisions: a bfloat16 reference flips near-ties too.
    share = max(MAX_DISAGREEMENT.get(opened.dtype, 0.0), MAX_DISAGREEMENT.get(run.reference_dtype, 0.0))
    allowed = int(share * len(scores.results))
    return VariantResult(name, "ok", scores, opened.note, opened.dtype, differ, allowed)


def found_exports(out_dir: Path, names: Sequence[str] | None) -> list[tuple[str, Path]]:
    targets = registry()
    if names is not None:
        unknown = [n for n in names if n not in targets]
        if unknown:
            raise LpesError(f"unknown variant {unknown[0]!r} (known: {', '.join(targets)})")
    found = []
    for name, target in targets.items():
        folder = target.find(out_dir)
        if folder is not None and (names is None or name in names):
            found.append((name, folder))
    return found
