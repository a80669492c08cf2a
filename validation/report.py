"""lpes-validate: key-value retrieval accuracy by gold position, for every variant of a conversion.

Variants, in order:

- `unscaled`: the base model as it ships (PyTorch);
- the baselines the search recorded in the spec, each at its best on the calibration set:
  `best uniform s=S` (one linear scale for every layer) and the stock length-extension
  RoPE types every runtime has, `YaRN f=F` and `dynamic NTK f=F` (transformers' own
  rotary, `converter.reference.use_stock_rope`; dynamic NTK one example at a time, since
  its frequencies follow the sequence length);
- `reference`: the same model patched with the spec (`converter.reference.apply`);
- every export found in the output folder, one per registered target
  (`lpes.exporters.targets`): the Hub folder (its own code, checked byte for byte
  first), `onnx/` (onnxruntime), `genai/` (onnxruntime-genai), `tensorrt/`
  (TensorRT, on a GPU). An export that cannot run on this machine (no GPU, runtime
  not installed) is reported as skipped.

Every variant decodes greedily on the same examples (`scoring.greedy_correct`). An
export passes when its greedy output differs from the reference's on no more
examples than its dtype allows (`MAX_DISAGREEMENT`: none in float32). The report
keeps every example's output per variant, and the prompt of every example on
which an export disagrees, so a disagreement can be replayed.

Writes into the output folder: `validation.json` (everything), `validation.md`
(the table and the plot, embedded in the model card) and `validation.png`
(accuracy against gold index, one line per variant); a model card lpes wrote there (README.md) is
rewritten with them, so that its text and the table it embeds agree (left alone when a run that does
not pass keeps the earlier results). A spec searched on another model or task says so: the report's
`searched_on`, the baselines' note, and the card name that search instead of "best on calibration".
"""

from __future__ import annotations

import json
import shlex
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lpes.exporters.targets import RunContext, RunnerUnavailable, registry, targets_where
from lpes.foundation.devices import check_device, format_bytes
from lpes.foundation.errors import LpesError
from lpes.foundation.files import write_text_atomic
from lpes.foundation.spec import LINEAR_ROPE, Spec, StockRope, load_spec
from lpes.validation import checks, scoring
from lpes.validation.accuracy_plot import plot_accuracy
from lpes.validation.examples import Example
from lpes.validation.results import (
    FORMAT,
    JSON_FILE,
    MARKDOWN_FILE,
    NOT_VALIDATED,
    PASSED,
    PLOT_FILE,
    REFERENCE,
    UNIFORM,
    UNSCALED,
    ValidationReport,
    VariantResult,
)

BASELINE_NOTE = "PyTorch, best on calibration"
SPEC_FILE = "lpes_spec.json"  # what every lpes-convert output keeps beside its export
# Share of examples on which an export may decode differently from the reference. float32
# runtimes differ only in rounding, far below the logit gaps of a greedy choice; half
# precision moves logits by ~1e-3 relative and flips a near-tie now and then.
MAX_DISAGREEMENT = {"float32": 0.0, "float16": 0.02, "bfloat16": 0.05}
DEFAULT_MAX_SECONDS = 20 * 60  # key-value scoring longer than this (estimated) is left to lpes-validate
MAX_ROPE_POSITIONS = 32768  # the RoPE check's positions (it allocates positions x head_dim per scale)


def answers_not_value(results: Sequence[scoring.ExampleResult], examples: Sequence[Example],
                      always: bool = False) -> str | None:
    """A sentence when most answers start with text that is not the value (`always`: say what they start with).

    The raw generation (`ExampleResult.generated`) is compared with the value after the benchmark's
    normalisation; a chat model that writes "The value corresponding to ..." first needs a budget
    (--answer-tokens) for the value to appear, and the one-pass search check cannot credit it at all.
    It takes a preamble for one when most of those answers open with the same word (or with nothing):
    wrong values differ from one another.
    """
    if not results:
        return None
    off = [(r, e) for r, e in zip(results, examples, strict=True) if not _starts_with_value(r.generated, e.answer)]
    openings = Counter((scoring.normalize_answer(r.generated).split() or [""])[0] for r, _ in off)
    preamble = len(off) >= 2 and 2 * max(openings.values(), default=0) >= len(off)
    if not always and (2 * len(off) <= len(results) or not preamble):
        return None
    shown = off[0] if off else (results[0], examples[0])
    budget = shown[1].answer_tokens
    said = " ".join(shown[0].generated.split())[:60]
    text = (f"{len(off)} of {len(results)} answers do not start with the value (e.g. {said!r} where "
            f"{shown[1].answer[:40]!r} was wanted)")
    if budget is None:
        return text + ("; with the answer's own tokens as its budget such an answer counts wrong: give "
                       "--answer-tokens 100 (the benchmark's) or try the other chat-template setting")
    return text + f"; they count where the value appears within the {budget}-token budget"


def _starts_with_value(generated: str, answer: str) -> bool:
    said, value = scoring.normalize_answer(generated), scoring.normalize_answer(answer)
    return bool(said) and (said.startswith(value) or value.startswith(said))


def validate(
    model_path: Path,
    out_dir: Path,
    spec: Spec | None = None,
    examples: Sequence[Example] | None = None,
    *,
    data: str | None = None,
    chat_template: bool | None = None,
    answer_tokens: int | None = None,
    reference_dtype: str = "float32",
    batch_size: int = 8,
    max_batch_tokens: int = scoring.MAX_BATCH_TOKENS,
    max_new_tokens: int | None = None,
    variants: Sequence[str] | None = None,
    device: str | None = None,
    max_seconds: float | None = DEFAULT_MAX_SECONDS,
    model_name: str | None = None,
    shown_dir: Path | str | None = None,
    shown_model: str | None = None,
    progress: bool = True,
    config: Any = None,
    task: ResolvedTask | None = None,
) -> ValidationReport:
    """Check the RoPE of every layer, then score the unscaled model, the LPES reference and every export.

    `spec` None: the `lpes_spec.json` the folder keeps (`find_spec`). `config`: the model's
    transformers config with `spec` already resolved for it (lpes-convert's plan); None: read here.
    `examples` None: `task`, else the task of `resolve_task` (`data`, `chat_template` and
    `answer_tokens` over the task the spec was searched on, over the model folder's own).
    `variants` limits the exports scored (target names); None: all found.
    The key-value scoring runs only when there is a tokenizer, the weights fit in
    memory and the time estimated from a probe (one real batch) is within `max_seconds`
    (None: no limit); else the report says why it was skipped and which command runs
    it (`shown_dir` and `shown_model`: the folder and model as the user typed them).
    The torch variants run in `reference_dtype` on `device` (default: cuda when available).
    A run that is not "passed" never replaces earlier scored results in `out_dir` (`write_report`).
    """
    from lpes.converter.loading import model_label, resolved_for_model

    out_dir = Path(out_dir)
    config, spec = resolved_for_model(model_path, spec if spec is not None else find_spec(out_dir), config)
    name = model_label(str(model_name or spec.provenance.get("base_model") or Path(model_path).name))
    if examples is not None:  # the caller's examples: no task behind them
        task = None
    elif task is None:
        task = resolve_task(model_path, spec, data, chat_template, answer_tokens)
    exports = _found_exports(out_dir, variants)
    kv_plan = _plan_kv(model_path, config, examples, task, reference_dtype, max_new_tokens, name)
    longest = max(kv_plan.sequence_tokens, default=0) or 64  # the prompts plus the answers' budgets
    rope = checks.rope_check(config, spec, max(_positions_to_check(config, spec), longest))
    searched_on, baseline_note = _searched_on(spec, model_path, config, name, task)
    rerun = _Rerun(out_dir, shown_dir, shown_model or name, data, chat_template, answer_tokens)
    if kv_plan.skipped is None:
        planned = _plan_variants(spec, config, longest, exports, baseline_note)
        results, kv, setup = _score_kv(model_path, spec, kv_plan, planned, rerun, reference_dtype, device,
                                       batch_size, max_batch_tokens, max_new_tokens, max_seconds, progress)
    else:
        results, kv, setup = [], _kv_not_run(kv_plan, rerun, shown_model or name), None
    report = ValidationReport(name, kv_plan.examples if results else [], results, max_new_tokens, [rope, kv],
                              prompt_tokens=kv_plan.prompt_tokens if results else [],
                              task=_task_line(task, kv_plan, spec), setup_problem=setup,
                              console_paths=rerun.console_paths(), searched_on=searched_on)
    report.warnings += kv_plan.warnings + _answer_warnings(results, kv_plan.examples)
    write_report(report, out_dir)
    _rewrite_model_card(out_dir, report, spec, config, spec.base_model or name)
    return report


def _score_kv(model_path: Path, spec: Spec, kv_plan: KvPlan, planned: list[PlannedVariant], rerun: _Rerun,
              reference_dtype: str, device: str | None, batch_size: int, max_batch_tokens: int,
              max_new_tokens: int | None, max_seconds: float | None,
              progress: bool) -> tuple[list[VariantResult], checks.Check, str | None]:
    """Score every planned variant (or skip them all over the time budget): the results, the kv check, and
    the setup problem (every variant answered nothing)."""
    started = time.perf_counter()
    results, estimate, skipped = _score_all(model_path, spec, kv_plan, planned, reference_dtype, device,
                                            batch_size, max_batch_tokens, max_new_tokens, max_seconds, progress)
    if skipped:
        return results, checks.Check("kv", "skipped", f"{skipped}; to run it on a faster machine, or here with no "
                                     f"budget: {rerun.command()} --max-minutes 0"), None
    setup = _setup_problem(results, len(kv_plan.examples))
    verdict = "failed" if setup or not all(v.passed for v in results) else "passed"
    took = checks.format_seconds(time.perf_counter() - started)
    kv = checks.Check("kv", verdict, f"{len(kv_plan.examples)} examples in {took} (estimated {estimate})")
    return results, kv, setup


def _kv_not_run(kv_plan: KvPlan, rerun: _Rerun, model: str) -> checks.Check:
    """The kv check when key-value scoring cannot run here, with the command that runs it where it can."""
    if kv_plan.tokenizer_missing:  # --model with the same folder would skip again: say what to give it
        elsewhere = rerun.command(model=TOKENIZER_MODEL)
        return checks.Check("kv", "skipped", f"{kv_plan.skipped}; to run it, name as {TOKENIZER_MODEL} a folder or "
                            f"Hub id of this model that has its tokenizer files: {elsewhere} (or copy them, e.g. "
                            f"tokenizer.json and tokenizer_config.json, into {_shown_path(model)} and run "
                            f"{rerun.command()})")
    return checks.Check("kv", "skipped", f"{kv_plan.skipped}; to run it where it fits: {rerun.command()}")


def _answer_warnings(results: list[VariantResult], examples: Sequence[Example]) -> list[str]:
    """A warning when most of the unscaled model's answers do not start with the value (`answers_not_value`)."""
    unscaled = next((v for v in results if v.name == UNSCALED and v.scores is not None), None)
    if unscaled is not None and (said := answers_not_value(unscaled.scores.results, examples)):
        return [f"{said} (the unscaled model)"]
    return []


TOKENIZER_MODEL = "MODEL_WITH_TOKENIZER"  # the skip message's placeholder for a model folder that has a tokenizer


def _searched_on(spec: Spec, model_path: Path, config, name: str,
                 task: ResolvedTask | None) -> tuple[str | None, str]:
    """What the curve and its baselines were searched on, where it is not what is validated here (the other
    model's name and/or "another task (DATA)"; None where it is this one, or the spec does not record it), and
    the note the baselines get in the table."""
    from lpes.converter.loading import other_model_searched

    model = other_model_searched(spec.searched_model, model_path, config, name)
    other_task = None
    if task is not None and task.other_task:
        other_task = f"another task ({shareable_data(task.searched.data) or 'the model folder task'})"
    searched_on = " and ".join(p for p in (model, other_task) if p) or None
    return searched_on, BASELINE_NOTE if searched_on is None else f"PyTorch, searched on {model or 'another task'}"


def _rewrite_model_card(out_dir: Path, report: ValidationReport, spec: Spec, config, base_model: str) -> None:
    """The folder's model card, rewritten with this validation when it replaced validation.md (lpes-validate on a
    Hub folder): the card's text and the table and plot it embeds then tell the same story. Left alone when
    the earlier results were kept (`report.kept`), or the folder has no lpes model card."""
    from lpes.converter.model_card import is_model_card, write_model_card

    if report.kept is not None or not is_model_card(out_dir / "README.md"):
        return
    report.files.append(write_model_card(out_dir, spec, base_model, config, report.markdown(), report.measured(),
                                         report.verdict, report.verdict_reason(), searched_on=report.searched_on))


# ---- the task ----


@dataclass(frozen=True)
class ResolvedTask:
    """The examples' task, the chat-template choice, and how they relate to the task the curve was searched on."""

    config: Any  # tasks.TaskConfig
    chat_template: bool
    data: str | None  # the description used (None: the model folder's own task)
    source: str  # "the search's", "--data", "the model's own"
    searched: Any = None  # spec.SearchTask, or None
    override: str | None = None  # one line when a flag replaces what the search used
    other_task: bool = False  # a flag makes it another task than the curve was searched on (not just fewer examples)


def resolve_task(model_path: Path, spec: Spec | None, data: str | None = None, chat_template: bool | None = None,
                 answer_tokens: int | None = None) -> ResolvedTask:
    """The task validation scores: each of `data`, `chat_template`, `answer_tokens` (the user's flags), where
    given, over what the spec's search used (`Spec.search_task`), over the model folder's own task.

    LpesError when the search's data cannot be read here (a file that is not where the search read it).
    """
    from lpes.validation.tasks import task_config

    searched = spec.search_task if spec is not None else None
    used = data if data is not None else (searched.data if searched is not None else None)
    try:
        config = task_config(model_path, used)
    except LpesError as err:
        if data is None and used is not None:
            raise LpesError(f"the curve was searched on --data {used}, which cannot be read here ({err}); pass "
                            "--data to validate on it (or on another task)") from None
        raise
    if data is None and searched is not None:
        config = replace(config, answer_tokens=searched.answer_tokens)
    if answer_tokens is not None:
        config = replace(config, answer_tokens=answer_tokens)
    chat = chat_template if chat_template is not None else (searched.chat_template if searched else True)
    changed, other_task = [], False
    if searched is not None:
        if data is not None and data != searched.data:
            same = _same_task_but_size(model_path, data, searched.data)
            other_task |= not same
            changed.append(f"--data {data} (searched on {searched.data or 'the model folder task'}"
                           f"{': the same task, other example counts' if same else ''})")
        if chat_template is not None and chat_template != searched.chat_template:
            other_task = True
            changed.append(f"chat template {_on(chat_template)} (searched with it {_on(searched.chat_template)})")
        if answer_tokens is not None and answer_tokens != searched.answer_tokens:
            other_task = True
            changed.append(f"--answer-tokens {answer_tokens} (searched with {_budget(searched.answer_tokens)})")
    override = None
    if changed:
        override = f"validating on {'; '.join(changed)}" + (": not the task the curve was searched on"
                                                             if other_task else "")
    source = "--data" if data is not None else ("the search's" if searched is not None else "the model's own")
    return ResolvedTask(config, chat, used, source, searched, override, other_task)


def check_task_encodes(model_path: Path, task: ResolvedTask, source: str | None = None) -> None:
    """The task's prompts and answers encode with the model's tokenizer (`tasks.check_vocabulary`, as lpes-search
    checks its data), else LpesError in one line: lpes-convert calls it at plan time, before any export.
    Nothing to check without tokenizer files (key-value scoring is then skipped, and says why)."""
    from lpes.converter.loading import has_tokenizer, load_tokenizer
    from lpes.validation.tasks import examples_for

    if not has_tokenizer(model_path):
        return
    tokenizer = load_tokenizer(model_path)
    examples = examples_for(task.config, model_path, tokenizer=tokenizer, use_chat_template=task.chat_template,
                            split="validation")
    check_examples_encode(tokenizer, examples, task, source)


_TASK_SOURCES = {"--data": "from --data", "the search's": "the task the curve was searched on",
                 "the model's own": "the model's own task"}


def check_examples_encode(tokenizer, examples: Sequence[Example], task: ResolvedTask | None,
                          source: str | None = None) -> None:
    """Every prompt and answer of `examples` encodes to tokens; else LpesError naming the tokenizer and the task."""
    from lpes.validation.tasks import check_vocabulary

    if task is None:
        what = "the validation examples"
    elif task.data is None:
        what = f"validation on the model folder's own task ({task.config.task})"
    elif task.source == "--data":
        what = f"validation on --data {shareable_data(task.data)}"
    else:
        what = f"validation on {shareable_data(task.data)} ({_TASK_SOURCES.get(task.source, task.source)})"
    try:
        check_vocabulary(tokenizer, [e.prompt for e in examples] + [e.answer for e in examples], what, source)
    except LpesError as err:
        if task is not None and task.source == "the search's":
            raise LpesError(f"{err}; pass --data for a task in this model's words") from None
        raise


def _same_task_but_size(model_path: Path, data: str, searched: str | None) -> bool:
    """The two descriptions give the same task but for how many examples per gold index."""
    from lpes.validation.tasks import task_config

    try:
        mine, theirs = task_config(model_path, data), task_config(model_path, searched)
    except LpesError:
        return False
    return replace(mine, examples_per_index=None) == replace(theirs, examples_per_index=None)


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _budget(tokens: int | None) -> str:
    return "the value's own tokens" if tokens is None else f"{tokens} tokens"


def _task_line(task: ResolvedTask | None, kv_plan: KvPlan, spec: Spec) -> str:
    if task is None:
        return "examples given by the caller"
    from lpes.validation.kv_data import has_chat_template

    data = shareable_data(task.data) or f"the model folder's own ({task.config.task})"
    chat = (_on(task.chat_template) if kv_plan.tokenizer is None or has_chat_template(kv_plan.tokenizer)
            else "none (the tokenizer has none)")
    line = f"{data} ({task.source} task), chat template {chat}, answer budget {_budget(task.config.answer_tokens)}"
    if kv_plan.prompt_tokens:
        line += f", prompts of {_span(min(kv_plan.prompt_tokens), max(kv_plan.prompt_tokens))} tokens"
    searched = task.searched.prompt_tokens if task.searched is not None else None
    if searched:
        line += f" (the search's: {_span(*searched)})"
    return line


def _span(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}-{high}"


def shareable_data(data: str | None) -> str | None:
    """--data as a published file may hold it: a relative file path as given (convert and validate, run
    where the search ran, read the same file), an absolute one by its name alone (no path of this machine)."""
    from lpes.validation.tasks import _is_description

    if data is None:
        return None
    if not _is_description(data):
        return _shown_path(data)
    task, _, rest = data.partition(":")
    items = [f"file={_shown_path(item.strip()[5:])}" if item.strip().startswith("file=") else item
             for item in rest.split(",")]
    return f"{task}:{','.join(items)}"


def _shown_path(path: str) -> str:
    return Path(path).name if Path(path).expanduser().is_absolute() else path


@dataclass
class _Rerun:
    """The lpes-validate command that runs what was skipped: as published (an absolute path by its name), and
    the console's form of each published one (folder and model as the user typed them, so that the command
    pastes and runs where they ran it; a bare folder name is not turned into a Hub id)."""

    out_dir: Path
    shown_dir: Path | str | None
    model: str
    data: str | None
    chat_template: bool | None
    answer_tokens: int | None
    _console: dict[str, str] = field(default_factory=dict)

    def command(self, model: str | None = None) -> str:
        """The published command (with another `model`: that one's); remembers its console form."""
        published = self._words(_shown_path, model or self.model)
        self._console[published] = self._words(str, model or self.model)
        return published

    def console_paths(self) -> dict[str, str]:
        return {p: c for p, c in self._console.items() if p != c}

    def _words(self, shown, model: str) -> str:
        words = ["lpes-validate", shown(str(self.shown_dir or self.out_dir)), "--model", shown(model)]
        if self.data is not None:
            words += ["--data", shareable_data(self.data) if shown is _shown_path else self.data]
        if self.chat_template is not None:
            words.append("--chat-template" if self.chat_template else "--no-chat-template")
        if self.answer_tokens is not None:
            words += ["--answer-tokens", str(self.answer_tokens)]
        return " ".join(shlex.quote(w) for w in words)


def _setup_problem(results: list[VariantResult], examples: int) -> str | None:
    """Every variant that ran answered nothing: the setup (prompt format, template, budget) is wrong, not the curve."""
    scored = [v for v in results if v.scores is not None]
    if not scored or any(v.scores.accuracy > 0 for v in scored):
        return None
    return (f"every variant answered 0 of {examples} examples: the task as set up does not fit this model (prompt "
            "format, chat template, answer budget), so this measured nothing about the curve; see the answers "
            "in validation.json, and try --answer-tokens 100, the other chat-template setting or other --data")


# ---- what runs, and whether it fits ----


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


def _positions_to_check(config, spec: Spec) -> int:
    """Every position the model is used at: its trained length times the largest scale (capped)."""
    trained = int(getattr(config, "max_position_embeddings", 0) or 4096)
    return min(MAX_ROPE_POSITIONS, max(trained, int(trained * max(spec.scales))))


def _plan_kv(model_path: Path, config, examples, task: ResolvedTask | None, dtype, max_new_tokens,
             source: str | None = None) -> KvPlan:
    """Whether key-value scoring can run here: a tokenizer and memory for the weights; the examples."""
    from lpes.converter.loading import DTYPES, available_memory, has_tokenizer, load_tokenizer, parameter_count

    if not has_tokenizer(model_path):
        return KvPlan(f"{Path(model_path).name} has no tokenizer files, so no prompts can be built",
                      tokenizer_missing=True)
    needed = parameter_count(model_path) * DTYPES[dtype].itemsize
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
    searched = task.searched.prompt_tokens if task is not None and task.searched is not None else None
    if searched and not 0.8 * searched[1] <= max(prompts) <= 1.25 * searched[1]:
        plan.warnings.append(f"the prompts are {_span(min(prompts), max(prompts))} tokens, the curve was searched "
                             f"on {_span(*searched)}: a curve is found for one length")
    return plan


def _plan_variants(spec: Spec, config, longest: int, exports, baseline_note: str = "") -> list[PlannedVariant]:
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
        twin = UNSCALED if spec.rope.rope_type == "yarn" and set(spec.scales) == {1.0} else None
    note = f"{twin} everywhere: scored once" if twin else ("" if spec.rope.linear else f"per-layer {spec.rope.name}")
    planned.append(PlannedVariant(REFERENCE, "reference", tuple(spec.scales), same_as=twin, note=note,
                                  one_at_a_time=single))
    planned += [PlannedVariant(name, "export", folder=folder, one_at_a_time=single) for name, folder in exports]
    return planned


def _score_all(model_path, spec, kv_plan: KvPlan, planned: list[PlannedVariant], reference_dtype, device,
               batch_size, max_batch_tokens, max_new_tokens, max_seconds, progress):
    """Load the model, time a probe batch, and score every variant if the estimate fits `max_seconds`.

    Returns (results, estimate text, why skipped or None).
    """
    import torch
    from tqdm.auto import tqdm

    from lpes.converter.loading import load_model
    from lpes.converter.reference import apply, use_stock_rope

    tokenizer, examples = kv_plan.tokenizer, kv_plan.examples
    where = torch.device(check_device(device))
    model = load_model(Path(model_path), reference_dtype).to(where)
    eos = scoring.eos_token_ids(model, tokenizer) or None  # the exports' runners get the same stop tokens
    scored = [v for v in planned if v.same_as is None and v.skipped is None]
    probe = checks.probe(model, tokenizer, examples, kv_plan.sequence_tokens, batch_size, max_batch_tokens,
                         max_new_tokens, eos, single=any(v.one_at_a_time for v in scored))
    seconds = sum(checks.estimate_seconds(probe, kv_plan.prompt_tokens, kv_plan.sequence_tokens,
                                          1 if v.one_at_a_time else batch_size, max_batch_tokens) for v in scored)
    estimate = checks.describe_estimate(seconds, probe, where.type)
    if max_seconds is not None and seconds > max_seconds:
        del model
        return [], estimate, (f"{len(examples)} examples x {len(scored)} variants would take {estimate}, over the "
                              f"{checks.format_seconds(max_seconds)} budget")
    bar = tqdm(total=len(examples) * len(scored), desc="lpes-validate", unit="example", disable=not progress)

    def score(name: str, runner, one_at_a_time: bool = False) -> scoring.Scores:
        bar.set_postfix_str(name)
        return scoring.greedy_correct(runner, tokenizer, examples, 1 if one_at_a_time else batch_size, max_new_tokens,
                                      progress=bar.update, eos_token_id=eos, max_batch_tokens=max_batch_tokens)

    results: list[VariantResult] = []
    by_name: dict[str, VariantResult] = {}
    run = RunContext(reference_dtype, str(where), scoring.pad_token_id(None, tokenizer))
    reference: VariantResult | None = None
    for v in planned:
        if v.kind == "export" and model is not None:
            del model  # one copy of the weights at a time: the exports load their own
            model = None
        if v.skipped is not None:
            result = VariantResult(v.name, "skipped", note=v.skipped, baseline=v.baseline)
        elif v.same_as is not None:
            result = VariantResult(v.name, "ok", by_name[v.same_as].scores, v.note, baseline=v.baseline,
                                   same_as=v.same_as)
        elif v.kind == "export":
            result = _score_export(v.name, v.folder, reference, run, eos, score, v.one_at_a_time)
            if result.status != "ok":
                bar.update(len(examples))
        else:
            if v.kind == "stock":
                use_stock_rope(model, v.rope)
            else:  # the curve under the spec's scheme; the uniform baseline is linear
                apply(model, Spec.from_scales(list(v.scales), rope=spec.rope if v.kind == "reference" else LINEAR_ROPE))
            if v.kind == "unscaled":  # the probe batch was scored unscaled: the others only
                bar.set_postfix_str(v.name)
                bar.update(len(probe.example_ids))
                rest = [i for i in range(len(examples)) if i not in set(probe.example_ids)]
                scores = checks.merge_scores(probe, _score_some(model, tokenizer, examples, rest, batch_size,
                                                                max_new_tokens, eos, max_batch_tokens, bar.update),
                                             rest)
            else:
                scores = score(v.name, model, v.one_at_a_time)
            result = VariantResult(v.name, "ok", scores, v.note, baseline=v.baseline)
        if v.kind == "reference":
            reference = result
        by_name[v.name] = result
        results.append(result)
    bar.close()
    return results, estimate, None


def _score_some(model, tokenizer, examples, ids: list[int], batch_size, max_new_tokens, eos, max_batch_tokens,
                progress) -> scoring.Scores:
    """Greedy scores of the examples `ids` only (numbered by their place in `ids`)."""
    if not ids:
        return scoring.Scores((), 0)
    return scoring.greedy_correct(model, tokenizer, [examples[i] for i in ids], batch_size, max_new_tokens,
                                  progress=progress, eos_token_id=eos, max_batch_tokens=max_batch_tokens)


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


def _found_exports(out_dir: Path, names: Sequence[str] | None) -> list[tuple[str, Path]]:
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


def find_spec(out_dir: Path) -> Spec:
    """The spec an lpes-convert output folder holds: in the first export folder that keeps one."""
    holders = targets_where("holds_spec")
    for target in holders:
        candidate = Path(out_dir) / target.folder / SPEC_FILE
        if candidate.is_file():
            return load_spec(candidate)
    inside = " or ".join(f"{t.folder}/" for t in holders if t.folder != ".")
    raise LpesError(f"no {SPEC_FILE} in {out_dir} (nor in its {inside}); is it an lpes-convert output folder?")


# ---- files ----


def write_report(report: ValidationReport, out_dir: Path) -> list[Path]:
    """validation.json, validation.md, validation.png in `out_dir`, each written atomically.

    A run that is not "passed" never replaces earlier scored results (a validation.json whose
    variants were scored): it writes validation.skipped.* or validation.failed.* beside them,
    and `report.kept` says so.
    """
    out_dir = Path(out_dir)
    stem = "validation"
    earlier = _earlier_results(out_dir / JSON_FILE)
    if earlier is not None and report.verdict != PASSED:
        stem = "validation.skipped" if report.verdict == NOT_VALIDATED else "validation.failed"
        report.kept = (f"kept the earlier {JSON_FILE} and {MARKDOWN_FILE} ({earlier}); this run's report is "
                       f"{stem}.json and {stem}.md")
    json_path, md_path, png_path = (out_dir / f"{stem}{suffix}" for suffix in (".json", ".md", ".png"))
    write_text_atomic(json_path, json.dumps(report.to_json(), indent=1) + "\n")
    markdown = report.markdown()
    if stem != "validation":  # its plot is not the one the earlier markdown shows
        markdown = markdown.replace(f"]({PLOT_FILE})", f"]({png_path.name})")
    write_text_atomic(md_path, markdown)
    report.files = [json_path, md_path]
    if any(v.scores is not None for v in report.variants):
        plot_accuracy(report, png_path)
        report.files.append(png_path)
    return report.files


def _earlier_results(path: Path) -> str | None:
    """The verdict of an earlier validation.json that holds scored variants, else None."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    variants = data.get("variants")
    if not isinstance(variants, list) or not any(isinstance(v, dict) and "accuracy" in v for v in variants):
        return None
    verdict = data.get("verdict")
    return verdict if isinstance(verdict, str) else ("passed" if data.get("passed") is True else "failed")
