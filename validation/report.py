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
examples than its dtype allows (`variant_runs.MAX_DISAGREEMENT`: none in float32). The report
keeps every example's output per variant, and the prompt of every example on
which an export disagrees, so a disagreement can be replayed.

Writes into the output folder: `validation.json` (everything), `validation.md`
(the table and the plot, embedded in the model card) and `validation.png`
(accuracy against gold index, one line per variant); a model card lpes wrote there (README.md) is
rewritten with them, so that its text and the table it embeds agree (left alone when a run that does
not pass keeps the earlier results). A spec searched on another model or task says so: the report's
`searched_on`, the baselines' note, and the card name that search instead of "best on calibration".

This module runs the steps in order and writes the report; which task is scored is task_choice.py,
what runs and how (the variants, whether key-value scoring fits, the scoring itself) variant_runs.py.
"""

from __future__ import annotations

import json
import shlex
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lpes.converter.loading import ResolvedModel
from lpes.converter.model_card import LENGTHS_PLOT
from lpes.foundation.files import write_text_atomic
from lpes.foundation.spec import Spec
from lpes.validation import checks, scoring, variant_runs
from lpes.validation.accuracy_plot import plot_accuracy
from lpes.validation.examples import Example
from lpes.validation.model_preflight import TaskRequest
from lpes.validation.results import (
    FORMAT,
    JSON_FILE,
    MARKDOWN_FILE,
    NOT_VALIDATED,
    PASSED,
    PLOT_FILE,
    UNSCALED,
    ValidationReport,
    VariantResult,
)
from lpes.validation.task_choice import ResolvedTask, shareable_data, shown_path, task_line
from lpes.validation.variant_runs import BASELINE_NOTE, KvPlan, PlannedVariant, ScoringSettings


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


@dataclass(frozen=True)
class Shown:
    """How the report names what it validated: the model in published files, and the folder, model and task
    flags as the user typed them (the command it prints to run a skipped check repeats them)."""

    model_name: str | None = None  # None: the spec's base model, else the model folder's name
    folder: Path | str | None = None  # None: the folder validated
    model: str | None = None  # None: `model_name`
    flags: TaskRequest = TaskRequest()


DEFAULT_SETTINGS = ScoringSettings()
AS_VALIDATED = Shown()  # the folder and model as validated, no task flags


def validate(model: ResolvedModel, out_dir: Path, task: ResolvedTask | None = None,
             examples: Sequence[Example] | None = None, *, settings: ScoringSettings = DEFAULT_SETTINGS,
             variants: Sequence[str] | None = None, shown: Shown = AS_VALIDATED) -> ValidationReport:
    """Check the RoPE of every layer, then score the unscaled model, the LPES reference and every export.

    `model`: the base model's folder, config and the spec resolved for it (a command's plan resolved them).
    The examples are `examples` where given, else `task`'s (validation/task_choice.py resolve_task).
    `variants` limits the exports scored (target names); None: all found.
    The key-value scoring runs only when there is a tokenizer, the weights fit in
    memory and the time estimated from a probe (one real batch) is within `settings.max_seconds`
    (None: no limit); else the report says why it was skipped and which command runs it.
    A run that is not "passed" never replaces earlier scored results in `out_dir` (`write_report`).
    """
    from lpes.converter.loading import model_label

    if (task is None) == (examples is None):
        raise TypeError("validate() takes a task or examples, one of them")
    out_dir, spec, config = Path(out_dir), model.spec, model.config
    name = model_label(str(shown.model_name or spec.base_model or model.path.name))
    exports = variant_runs.found_exports(out_dir, variants)
    kv_plan = variant_runs.plan_kv(model.path, config, examples, task, settings.reference_dtype,
                                   settings.max_new_tokens, name)
    longest = max(kv_plan.sequence_tokens, default=0) or 64  # the prompts plus the answers' budgets
    rope = checks.rope_check(config, spec, max(variant_runs.positions_to_check(config, spec), longest))
    searched_on, baseline_note = _searched_on(spec, model.path, config, name, task)
    rerun = _Rerun(out_dir, shown.folder, shown.model or name, shown.flags)
    if kv_plan.skipped is None:
        planned = variant_runs.plan_variants(spec, config, longest, exports, baseline_note)
        results, kv, setup = _score_kv(model, kv_plan, planned, rerun, settings)
    else:
        results, kv, setup = [], _kv_not_run(kv_plan, rerun, shown.model or name), None
    report = ValidationReport(name, kv_plan.examples if results else [], results, settings.max_new_tokens, [rope, kv],
                              prompt_tokens=kv_plan.prompt_tokens if results else [],
                              task=task_line(task, kv_plan.tokenizer, kv_plan.prompt_tokens), setup_problem=setup,
                              console_paths=rerun.console_paths(), searched_on=searched_on,
                              decision=spec.decision, shipped=_shipped_name(spec),
                              lengths_plot=LENGTHS_PLOT if (out_dir / LENGTHS_PLOT).is_file() else None)
    report.warnings += kv_plan.warnings + _answer_warnings(results, kv_plan.examples)
    write_report(report, out_dir)
    _rewrite_model_card(out_dir, report, spec, config, spec.base_model or name)
    from lpes.foundation.outputs import record_written

    record_written(out_dir, report.files)  # lpes wrote them: a later lpes-convert --force may replace them
    return report


def _score_kv(model: ResolvedModel, kv_plan: KvPlan, planned: list[PlannedVariant], rerun: _Rerun,
              settings: ScoringSettings) -> tuple[list[VariantResult], checks.Check, str | None]:
    """Score every planned variant (or skip them all over the time budget): the results, the kv check, and
    the setup problem (every variant answered nothing)."""
    started = time.perf_counter()
    results, estimate, skipped = variant_runs.score_all(model, kv_plan, planned, settings)
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
                            f"tokenizer.json and tokenizer_config.json, into {shown_path(model)} and run "
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
    from lpes.converter.fingerprint import other_model_searched

    model = other_model_searched(spec.searched_model, model_path, config, name)
    other_task = None
    if task is not None and task.other_task:
        other_task = f"another task ({shareable_data(task.searched.data) or 'the model folder task'})"
    searched_on = " and ".join(p for p in (model, other_task) if p) or None
    return searched_on, BASELINE_NOTE if searched_on is None else f"PyTorch, searched on {model or 'another task'}"


def _shipped_name(spec: Spec) -> str | None:
    """What the folder holds by the name its decision gives it ("YaRN f=1.75"), where that is not the per-layer
    curve: read off the spec's scales (foundation/decision.py row_computing), not the provenance's claim."""
    held = spec.decision.row_computing(spec.scales, spec.rope.rope_type) if spec.decision and spec.scales else None
    return held.name if held is not None and held.kind != "per-layer" else None


def _rewrite_model_card(out_dir: Path, report: ValidationReport, spec: Spec, config, base_model: str) -> None:
    """The folder's model card, rewritten with this validation when it replaced validation.md (lpes-validate on a
    Hub folder): the card's text and the table and plot it embeds then tell the same story. Left alone when
    the earlier results were kept (`report.kept`), or the folder has no lpes model card."""
    from lpes.converter.model_card import is_model_card, write_model_card

    if report.kept is not None or not is_model_card(out_dir / "README.md"):
        return
    report.files.append(write_model_card(out_dir, spec, base_model, config, report.markdown(), report.measured(),
                                         report.verdict, report.verdict_reason(), searched_on=report.searched_on))




@dataclass
class _Rerun:
    """The lpes-validate command that runs what was skipped: as published (an absolute path by its name), and
    the console's form of each published one (folder and model as the user typed them, so that the command
    pastes and runs where they ran it; a bare folder name is not turned into a Hub id)."""

    out_dir: Path
    shown_dir: Path | str | None
    model: str
    flags: TaskRequest
    _console: dict[str, str] = field(default_factory=dict)

    def command(self, model: str | None = None) -> str:
        """The published command (with another `model`: that one's); remembers its console form."""
        published = self._words(shown_path, model or self.model)
        self._console[published] = self._words(str, model or self.model)
        return published

    def console_paths(self) -> dict[str, str]:
        return {p: c for p, c in self._console.items() if p != c}

    def _words(self, shown, model: str) -> str:
        words = ["lpes-validate", shown(str(self.shown_dir or self.out_dir)), "--model", shown(model)]
        flags = self.flags
        if flags.data is not None:
            words += ["--data", shareable_data(flags.data) if shown is shown_path else flags.data]
        if flags.chat_template is not None:
            words.append("--chat-template" if flags.chat_template else "--no-chat-template")
        if flags.answer_tokens is not None:
            words += ["--answer-tokens", str(flags.answer_tokens)]
        return " ".join(shlex.quote(w) for w in words)


def _setup_problem(results: list[VariantResult], examples: int) -> str | None:
    """Every variant that ran answered nothing: the setup (prompt format, template, budget) is wrong, not the curve."""
    scored = [v for v in results if v.scores is not None]
    if not scored or any(v.scores.accuracy > 0 for v in scored):
        return None
    return (f"every variant answered 0 of {examples} examples: the task as set up does not fit this model (prompt "
            "format, chat template, answer budget), so this measured nothing about the curve; see the answers "
            "in validation.json, and try --answer-tokens 100, the other chat-template setting or other --data")


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
