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

from lpes.converter.fingerprint import model_fingerprint, searched_elsewhere
from lpes.converter.loading import check_dtype, load_config, model_label, model_location, resolve_model
from lpes.converter.weights_dtype import dtype_note
from lpes.exporters.targets import ExportJob, Target, default_targets, parse_targets, targets_where
from lpes.foundation.errors import LpesError
from lpes.foundation.outputs import check_output_folder, staged_output
from lpes.foundation.preflight import check_folder_room
from lpes.foundation.spec import Spec, load_spec

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
    max_validation_seconds: float | None = 20 * 60  # key-value scoring estimated longer is skipped; None: no limit
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
    # The spec file and --out first where that needs no model: their typos cost a second, not the model's checks.
    spec = load_spec(options.spec) if not isinstance(options.spec, Spec) else options.spec
    where = model_location(options.model)
    inputs = _inputs(options, spec)  # --force replaces --out whole: none of them may be in it
    out = check_output_folder(options.out, where, options.force, inputs) if where is not None else None
    model_path = resolve_model(options.model)
    from lpes.converter.reference import check_layout, check_rope_scheme  # torch: 3 s, after the cheap refusals

    config = load_config(model_path)
    spec = spec.for_layers(config.num_hidden_layers)
    warnings = [_warn_if_made_for_another_model(spec, config, model_path, options.model)]  # said once all checks held
    check_layout(config)
    spec, ship_note = shipped_spec(spec, options.ship, config, model_label(options.model))
    if spec.search_task and spec.search_task.prompt_tokens:  # a curve is specific to the length it was searched at
        from lpes.converter.architectures import window_warning

        warnings.append(window_warning(config, spec.scales, spec.search_task.prompt_tokens[1], "the shipped scaling"))
    check_rope_scheme(config, spec.rope)  # per-layer yarn/dynamic need a model whose own RoPE is plain
    if out is None:  # a hub model's folder is known once downloaded
        out = check_output_folder(options.out, model_path, options.force, inputs)
    task, longest = None, 0
    if options.validate:  # a typo in --data, or the search's data file missing, fails now, not after the export
        from lpes.search.options import check_answer_tokens
        from lpes.validation.task_choice import check_task_encodes, resolve_task

        check_answer_tokens(options.answer_tokens)
        task = resolve_task(model_path, spec, options.data, options.chat_template, options.answer_tokens)
        # A tokenizer that fails: now, one line. The longest sequence sizes a fixed-context export (genai).
        longest = check_task_encodes(model_path, task, model_label(options.model))
    uploaded = targets_where("uploads")
    if options.push_to_hub and not set(uploaded) & set(target_classes):
        raise LpesError(f"--push-to-hub uploads the Hub folder; add {','.join(t.name for t in uploaded)} to --to")
    if options.push_to_hub:
        from lpes.converter.hub import check_push_target

        check_push_target(options.push_to_hub)  # repo id, token, the Hub reachable: now, not after the export
    job = ExportJob(model_path, model_label(options.model), config,
                    _with_provenance(spec, config, model_path, options.model),
                    options.dtype, options.validate, longest)
    targets = [cls(job, options.target_options.get(cls.name)) for cls in target_classes]
    for target in targets:
        target.check()
    room = check_folder_room(out, sum(t.output_bytes(out) for t in targets))  # writable, with room (preflight.py)
    notes = [f"plan: {room}", ship_note, dtype_note(model_path, options.dtype), *(t.plan_note() for t in targets),
             task.override if task else None]
    notes = [note for note in notes + warnings if note]
    return ConvertPlan(job, out, targets, force=options.force, push_to_hub=options.push_to_hub, data=options.data,
                       max_validation_seconds=options.max_validation_seconds, notes=notes,
                       chat_template=options.chat_template, answer_tokens=options.answer_tokens,
                       shown_model=str(options.model), task=task)


def _inputs(options: ConvertOptions, spec: Spec) -> list[tuple[str, str]]:
    """(flag, path) of the files the run reads: the spec and the validation data file(s)."""
    from lpes.validation.tasks import data_files

    inputs = [] if isinstance(options.spec, Spec) else [("--curve", options.spec)]
    searched = spec.search_task.data if spec.search_task else None
    flag = "--data" if options.data is not None else "the search's --data"
    return inputs + [(flag, path) for path in data_files(options.data if options.data is not None else searched)]


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
    return replace(spec, provenance={**spec.provenance, "shipped": {"ship": ship, "what": what}})


def _warn_if_made_for_another_model(spec: Spec, config, model_path: Path, model_name: str) -> str | None:
    """A curve searched on one model may be applied to another on purpose: the line that says so (a note of the
    plan, said after every check has held; not a refusal)."""
    line = searched_elsewhere(spec.searched_model, model_path, config, model_name)
    return f"warning: {line}" if line else None


def _with_provenance(spec: Spec, config, model_path: Path, model_name: str) -> Spec:
    """The spec as the output holds it: `model` stays the model it was searched on (this one if it says none)."""
    from lpes.foundation.version import __version__

    provenance = dict(spec.provenance)
    provenance.setdefault("model", model_fingerprint(config, model_path, model_name))
    provenance["base_model"] = model_label(model_name)
    provenance["lpes_version"] = __version__
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
    from lpes.validation.report import validate

    _progress("validating key-value retrieval accuracy by position")
    report = validate(plan.job.model_path, staging, plan.job.spec, data=plan.data, chat_template=plan.chat_template,
                      answer_tokens=plan.answer_tokens, variants=plan.target_names, model_name=plan.job.model_name,
                      shown_dir=plan.out, shown_model=plan.shown_model or None,
                      max_seconds=plan.max_validation_seconds, config=plan.job.config, task=plan.task)
    result.reports.append(report.format())
    result.passed &= report.verdict != "failed"
    result.validated &= report.verdict == "passed"
    return report
