"""lpes-validate as options -> plan -> execute.

`plan` refuses what the folder and the flags alone decide (no folder, no spec, code or files the folder names
that lpes would not run, no room for the report) before torch loads, then resolves the base model, its config,
the task and the precision once (validation/model_preflight.py). `execute` says the plan's notes and scores.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lpes.foundation.errors import LpesError, shown
from lpes.validation.model_preflight import DEFAULT_MAX_SECONDS, Output, Preflight, Request, TaskRequest, preflight

if TYPE_CHECKING:
    from lpes.validation.report import ValidationReport



@dataclass(frozen=True)
class ValidateOptions:
    """What the user asked for (the flags of lpes-validate)."""

    folder: Path
    model: str | None = None  # None: the spec's base model, else converter.loading.DEFAULT_MODEL
    data: str | None = None
    chat_template: bool | None = None
    answer_tokens: int | None = None
    dtype: str = "auto"  # of the PyTorch reference: auto is float32 on a CPU, half precision on a GPU
    device: str | None = None  # None: cuda if any, else cpu
    max_seconds: float | None = DEFAULT_MAX_SECONDS


@dataclass(frozen=True)
class ValidatePlan:
    options: ValidateOptions
    resolved: Preflight
    model: str  # the base model as named (the flag, else the spec's)
    device: str
    notes: tuple[str, ...]  # said once every check has held


def plan(options: ValidateOptions) -> ValidatePlan:
    """Check the folder and the flags, then resolve the model and the task; LpesError (one line) at the first
    problem, before torch loads where the folder alone decides it."""
    from lpes.converter.loading import DEFAULT_MODEL
    from lpes.converter.trust import check_hub_code
    from lpes.exporters.received import check_received_folder
    from lpes.exporters.targets import find_spec
    from lpes.foundation.devices import check_device, check_device_name, default_dtype
    from lpes.validation.report_room import check_report_room

    folder = Path(options.folder)
    if not folder.is_dir():
        raise LpesError(f"{shown(folder)} is not a folder" if folder.exists() else f"folder not found: {shown(folder)}")
    spec = find_spec(folder)  # no spec, or a bad one: refused before the checks below import transformers
    check_device_name(options.device)  # a mistyped --device too (check_device, after torch, asks the machine)
    check_hub_code(folder)  # before anything imports the folder's code (converter/trust.py)
    check_received_folder(folder)  # and before a runtime opens a file or library it names (exporters/received.py)
    room = check_report_room(folder)  # before any prompt is scored (validation/report_room.py)
    model = options.model or spec.base_model or DEFAULT_MODEL
    dtype = options.dtype if options.dtype != "auto" else lambda: default_dtype(check_device(options.device))
    resolved = preflight(Request("lpes-validate", model, Output(), spec,
                                 task=TaskRequest(options.data, options.chat_template, options.answer_tokens),
                                 dtype=dtype))
    device = check_device(options.device)
    notes = [resolved.licence, *resolved.warnings, resolved.task.override, f"plan: {room}", resolved.dtype_note]
    return ValidatePlan(options, resolved, model, device, tuple(note for note in notes if note))


def execute(plan: ValidatePlan) -> ValidationReport:
    """Say the plan's notes, score every variant and write the report into the folder."""
    from lpes.validation.report import Shown, validate
    from lpes.validation.variant_runs import ScoringSettings

    for note in plan.notes:  # only now that every check has passed: a refusal is the only line on stderr
        print(f"lpes-validate: {note}", file=sys.stderr)
    options, resolved = plan.options, plan.resolved
    settings = ScoringSettings(resolved.dtype, plan.device, max_seconds=options.max_seconds)
    shown = Shown(plan.model, options.folder, plan.model, resolved.request.task)
    return validate(resolved.model, options.folder, resolved.task, settings=settings, shown=shown)
