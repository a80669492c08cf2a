"""lpes-convert as options -> plan -> execute.

`plan` checks everything a user can get wrong (model, spec, targets, output folder)
in about a second, before any heavy work. `execute` writes every target into a
hidden staging folder next to the output, validates, and only then renames the
staging folder into place, so an interrupted run leaves nothing half-written.

The targets are the registered classes of `lpes.exporters.targets` (one folder each,
`exporters/*/target.py`); this module names none of them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lpes.converter.fingerprint import model_fingerprint
from lpes.converter.loading import check_dtype, model_label
from lpes.exporters.targets import ExportJob, Target, default_targets, parse_targets, targets_where
from lpes.foundation.errors import LpesError
from lpes.foundation.outputs import staged_output
from lpes.foundation.preflight import check_folder_room
from lpes.foundation.provenance import Shipped
from lpes.foundation.spec import Spec, load_spec
from lpes.validation.model_preflight import DEFAULT_MAX_SECONDS, Output, Request, TaskRequest, preflight

if TYPE_CHECKING:
    from lpes.validation.report import ValidationReport


@dataclass(frozen=True)
class ConvertOptions:
    """What the user asked for (the flags of lpes-convert)."""

    model: str
    spec: Spec | str | os.PathLike
    out: str | os.PathLike
    targets: str | Sequence[str] | None = None  # None: the registry's default targets
    dtype: str = "float32"
    force: bool = False
    validate: bool = True
    push_to_hub: str | None = None
    data: str | None = None  # validation examples, as lpes-validate --data (None: the task the curve was searched on)
    max_validation_seconds: float | None = DEFAULT_MAX_SECONDS
    chat_template: bool | None = None  # None: as the search did (the spec's provenance), else on
    answer_tokens: int | None = None  # the answer budget over the task's (None: the search's, else the task's)
    ship: str = "decision"  # SHIP_CHOICES: what lpes-search's held-out decision names, or the per-layer curve
    # Per target name: the options of its own flags (see Target.options_from).
    target_options: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class ConvertPlan:
    job: ExportJob
    out: Path
    targets: list[Target]  # checked, in pipeline order
    force: bool = False
    push_to_hub: str | None = None
    data: str | None = None
    max_validation_seconds: float | None = None
    notes: list[str] = field(default_factory=list)  # said before any work starts, once every check has held
    chat_template: bool | None = None
    answer_tokens: int | None = None
    shown_model: str = ""  # the model as the user typed it (the commands the report prints name it so)
    task: Any = None  # validation.task_choice.ResolvedTask: the examples validation scores, resolved at plan time

    @property
    def target_names(self) -> list[str]:
        return [t.name for t in self.targets]


@dataclass
class ConvertResult:
    out: Path
    passed: bool = True  # no check failed
    reports: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unbuilt: list[str] = field(default_factory=list)  # asked for, not made here (a TensorRT engine): exit 2
    validated: bool = True  # every planned check ran (False: one was skipped; see the report)

    @property
    def verdict(self) -> str:
        """"passed", "failed", or "not validated" (a planned check did not run)."""
        return "failed" if not self.passed else ("passed" if self.validated else "not validated")


def plan(options: ConvertOptions) -> ConvertPlan:
    """Check every input; raise LpesError with one line for the first problem found."""
    target_classes = parse_targets(options.targets if options.targets is not None else default_targets())
    check_dtype(options.dtype)
    # The spec file first: its typos cost a second, not the model's checks (the preflight checks --out next).
    spec = load_spec(options.spec) if not isinstance(options.spec, Spec) else options.spec
    label = model_label(options.model)
    task = TaskRequest(options.data, options.chat_template, options.answer_tokens) if options.validate else None
    resolved = preflight(Request(
        "lpes-convert", str(options.model), Output(options.out, "folder", options.force, _inputs(options, spec)),
        spec, spec_for_config=lambda searched, config: shipped_spec(searched, options.ship, config, label),
        task=task, dtype=options.dtype))
    spec, config, model_path = resolved.spec, resolved.config, resolved.model_path
    warnings = resolved.warnings  # said once every check has held
    if spec.search_task and spec.search_task.prompt_tokens:  # a curve is specific to the length it was searched at
        from lpes.converter.architectures import window_warning

        warnings.append(window_warning(config, spec.scales, spec.search_task.prompt_tokens[1], "the shipped scaling"))
    uploaded = targets_where("uploads")
    if options.push_to_hub and not set(uploaded) & set(target_classes):
        raise LpesError(f"--push-to-hub uploads the Hub folder; add {','.join(t.name for t in uploaded)} to --to")
    if options.push_to_hub:
        from lpes.converter.hub import check_push_target

        check_push_target(options.push_to_hub)  # repo id, token, the Hub reachable: now, not after the export
    job = ExportJob(model_path, label, config, _with_provenance(spec, config, model_path, options.model),
                    options.dtype, options.validate, resolved.longest)
    targets = [cls(job, options.target_options.get(cls.name)) for cls in target_classes]
    for target in targets:
        target.check()
    room = check_folder_room(resolved.out, sum(t.output_bytes(resolved.out) for t in targets))  # preflight.py
    notes = [resolved.licence, f"plan: {room}", resolved.spec_note, resolved.dtype_note,
             *(t.plan_note() for t in targets), resolved.task.override if resolved.task else None]
    notes = [note for note in notes + warnings if note]
    return ConvertPlan(job, resolved.out, targets, force=options.force, push_to_hub=options.push_to_hub,
                       data=options.data, max_validation_seconds=options.max_validation_seconds, notes=notes,
                       chat_template=options.chat_template, answer_tokens=options.answer_tokens,
                       shown_model=str(options.model), task=resolved.task)


def _inputs(options: ConvertOptions, spec: Spec) -> tuple[tuple[str, str], ...]:
    """(flag, path) of the files the run reads: the spec and the validation data file(s)."""
    from lpes.validation.tasks import data_files

    inputs = [] if isinstance(options.spec, Spec) else [("--curve", options.spec)]
    searched = spec.search_task.data if spec.search_task else None
    flag = "--data" if options.data is not None else "the search's --data"
    return tuple(inputs + [(flag, path) for path in data_files(options.data if options.data is not None else searched)])


SHIP_CHOICES = ("decision", "curve")


def shipped_spec(spec: Spec, ship: str, config, model_name: str) -> tuple[Spec, str]:
    """The spec lpes-convert writes: `decision` (default) what lpes-search's held-out decision names, a stock
    config unless the per-layer curve won; `curve` the searched curve. Its provenance says which (`shipped`)."""
    from lpes.converter.reference import stock_rope_unsupported

    if ship not in SHIP_CHOICES:
        raise LpesError(f"--ship must be one of {', '.join(SHIP_CHOICES)}, got {ship!r}")
    decision = spec.decision
    if decision is None:
        note = ("the spec records no held-out decision (written before lpes-search made one, or --holdout 0): "
                "shipping its curve")
        return _marked(spec, ship, "the searched curve (no decision recorded)"), note
    chosen = decision.ship
    if ship == "curve":
        return (_marked(spec, ship, "the searched curve (--ship curve)"),
                f"--ship curve: shipping the searched curve, not the decision's {chosen.name}")
    shipped = spec.as_decided()
    if chosen.kind == "stock":
        if why := stock_rope_unsupported(config, chosen.rope_type):
            raise LpesError(f"the spec's decision ships {chosen.name}, which {model_name} cannot take ({why}); "
                            "pass --ship curve to ship the searched curve")
        shipped = replace(shipped, rope=shipped.rope.resolved(config))
    return _marked(shipped, ship, chosen.name), f"shipping the decision, {chosen.name}: {decision.reason}"


def _marked(spec: Spec, ship: str, what: str) -> Spec:
    return replace(spec, provenance=spec.provenance.updated(shipped=Shipped(ship, what)))


def _with_provenance(spec: Spec, config, model_path: Path, model_name: str) -> Spec:
    """The spec as the output holds it: `model` stays the model it was searched on (this one if it says none)."""
    from lpes.foundation.version import __version__

    model = spec.provenance.model  # the model it was searched on, where recorded; else this one
    if model is None:
        model = model_fingerprint(config, model_path, model_name)
    provenance = spec.provenance.updated(model=model, base_model=model_label(model_name), lpes_version=__version__)
    return replace(spec, provenance=provenance)


def execute(plan: ConvertPlan) -> ConvertResult:
    """Run the planned targets in a staging folder, validate, rename into place."""
    result = ConvertResult(plan.out)
    with staged_output(plan.out, plan.force) as staging:  # lock, staging folder, atomic swap (foundation/outputs.py)
        for note in plan.notes:  # under the lock: a second run on --out is turned away in one line
            _progress(note)
        run_targets(plan, staging, result)
    if plan.push_to_hub:
        from lpes.converter.hub import push_folder

        _progress(f"uploading {plan.out} to {plan.push_to_hub}")
        push_folder(plan.out, plan.push_to_hub)
    return result


def run_targets(plan: ConvertPlan, staging: Path, result: ConvertResult) -> None:
    """Write every target into `staging`, validate them together, then let each finish its files."""
    for target in plan.targets:
        folder = staging / target.folder
        folder.mkdir(parents=True, exist_ok=True)
        _progress(f"writing {target.name}: {target.describe()}")
        written = target.write(folder)
        result.reports += written.reports
        result.warnings += written.warnings
        result.unbuilt += written.unbuilt
        result.passed &= written.passed
    report = _validate(plan, staging, result) if plan.job.validate else None
    for target in plan.targets:
        target.finish(staging / target.folder, report)


def convert(model: str, spec, out, targets: str | Sequence[str] | None = None, **options) -> ConvertResult:
    """Plan and execute in one call (the Python form of lpes-convert)."""
    return execute(plan(ConvertOptions(model=model, spec=spec, out=out, targets=targets, **options)))


def _progress(message: str) -> None:
    print(f"lpes-convert: {message}", file=sys.stderr, flush=True)


def _validate(plan: ConvertPlan, staging: Path, result: ConvertResult) -> ValidationReport:
    from lpes.validation.report import Shown, validate
    from lpes.validation.variant_runs import ScoringSettings

    _progress("validating key-value retrieval accuracy by position")
    shown = Shown(plan.job.model_name, plan.out, plan.shown_model or None,
                  TaskRequest(plan.data, plan.chat_template, plan.answer_tokens))
    report = validate(plan.job.resolved, staging, plan.task, settings=ScoringSettings(
        max_seconds=plan.max_validation_seconds), variants=plan.target_names, shown=shown)
    result.reports.append(report.format())
    result.passed &= report.verdict != "failed"
    result.validated &= report.verdict == "passed"
    return report
