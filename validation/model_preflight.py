"""The preflight every command runs, written once: the cheap refusals, the output location, then the model,
its config, the spec and the task, each resolved once into one frozen `Preflight` that the command's plan and
execution read (lpes-convert, lpes-search, lpes-validate, lpes-generate: options -> plan -> execute).

The order is the cost of finding a mistake: what the flags alone decide (the command's own checks, then
`CHECKS`, which every command runs), the output location where the model's folder is known without a download,
the model folder, its config (transformers: 3 s), the layout and RoPE scheme that config decides, the output
location of a Hub model, the task and its tokenizer last. A refusal is one line (LpesError) and the only line:
what is worth saying on the way (a spec searched on another model, a task flag that replaces the search's, a
dtype unlike the weights') is returned in the plan, for the command to say once every check has held.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lpes.foundation.spec import RopeScheme, Spec

if TYPE_CHECKING:
    from lpes.converter.loading import ResolvedModel


@dataclass(frozen=True)
class Output:
    """Where a command writes. `kind`: "file" (lpes-search's spec), "folder" (lpes-convert's --out, replaced
    whole), "none" (lpes-validate writes into the folder it reads; lpes-generate writes nothing).
    `inputs`: (flag, path) of the files the run reads, which --force must not replace."""

    path: str | os.PathLike | None = None
    kind: str = "none"
    force: bool = False
    inputs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TaskRequest:
    """The validation task's flags (None: as the spec's search used, else the model folder's own task)."""

    data: str | None = None
    chat_template: bool | None = None
    answer_tokens: int | None = None


@dataclass(frozen=True)
class Request:
    """What one command asks the preflight to resolve."""

    command: str  # "lpes-convert", ...: what `CHECKS` may tell apart
    model: str | None = None  # as the user typed it; None: no base model (lpes-generate)
    output: Output = Output()
    spec: Spec | None = None  # loaded and checked by the command's own cheap checks
    # What the spec becomes once the config is known (lpes-convert: what the decision ships), with a note.
    spec_for_config: Callable[[Spec, Any], tuple[Spec, str | None]] | None = None
    rope_type: str | None = None  # the scheme to check where there is no spec (lpes-search's --rope-type)
    task: TaskRequest | None = None  # None: no validation task here
    # The dtype the model runs in, resolved ("auto" never), or how to resolve it once torch may load (the
    # devices decide it): what the dtype note compares the weights with.
    dtype: str | Callable[[], str] | None = None


@dataclass(frozen=True)
class Preflight:
    """Everything a request resolved, once: later stages read it and never load it again."""

    request: Request
    out: Path | None = None
    model_path: Path | None = None
    label: str = ""  # how published files name the model (converter.loading.model_label)
    config: Any = None
    spec: Spec | None = None  # one scale per layer of `config`, as `spec_for_config` made it
    spec_note: str | None = None  # what `spec_for_config` said
    rope: RopeScheme | None = None  # the scheme checked against the config
    task: Any = None  # validation.task_choice.ResolvedTask
    longest: int = 0  # the task's longest sequence, prompt and answer's budget (0: no tokenizer or no task)
    elsewhere: str | None = None  # the spec was searched on another model: the line that says so
    licence: str | None = None  # a real model's licence line (converter/real_models.py), said first
    dtype: str | None = None
    dtype_note: str | None = None

    @property
    def model(self) -> ResolvedModel:
        """The model folder, its config and the spec resolved for it, as the stages after a plan take them."""
        from lpes.converter.loading import ResolvedModel

        return ResolvedModel(self.model_path, self.config, self.spec)

    @property
    def warnings(self) -> list[str]:
        return [f"warning: {self.elsewhere}"] if self.elsewhere else []


DEFAULT_MAX_SECONDS = 20 * 60  # validation: key-value scoring estimated longer is skipped, with the command to run it

# Refusals every command makes from its flags alone, after its own and before any model is resolved: add one
# here and all four commands make it (tests/test_model_preflight.py).
CHECKS: list[Callable[[Request], None]] = []


def preflight(request: Request) -> Preflight:
    """Run `CHECKS` (after the command's own checks of its flags), then resolve the request; LpesError (one line)
    at the first problem."""
    from lpes.converter.loading import model_location
    from lpes.validation.task_choice import check_answer_tokens

    for common in CHECKS:
        common(request)
    if request.task is not None:
        check_answer_tokens(request.task.answer_tokens)
    where = model_location(request.model) if request.model is not None else None
    out = _output(request.output, where) if where is not None or request.model is None else None
    if request.model is None:
        return Preflight(request, out)
    return _with_model(request, out)


def _with_model(request: Request, out: Path | None) -> Preflight:
    from lpes.converter.fingerprint import searched_elsewhere
    from lpes.converter.loading import licence_note, load_config, model_label, resolve_model
    from lpes.converter.weights_dtype import dtype_note

    model_path = resolve_model(request.model)
    from lpes.converter.reference import check_layout, check_rope_scheme  # torch: 3 s, after the cheap refusals

    config = load_config(model_path)
    label = model_label(str(request.model))
    spec, spec_note, elsewhere = request.spec, None, None
    if spec is not None:
        spec = spec.for_layers(config.num_hidden_layers)
        elsewhere = searched_elsewhere(spec.searched_model, model_path, config, str(request.model))
    check_layout(config)
    if spec is not None and request.spec_for_config is not None:
        spec, spec_note = request.spec_for_config(spec, config)
    rope = spec.rope if spec is not None else None
    if request.rope_type is not None:
        rope = RopeScheme(request.rope_type).resolved(config)  # YaRN's parameters written out for this model
    if rope is not None:
        check_rope_scheme(config, rope)  # per-layer yarn/dynamic need a plain RoPE: fail before any loading
    if out is None:  # a Hub model's folder is known once downloaded
        out = _output(request.output, model_path)
    task, longest = _task(request, model_path, config, spec, label)
    dtype = request.dtype() if callable(request.dtype) else request.dtype
    note = dtype_note(model_path, dtype) if dtype is not None else None
    return Preflight(request, out, model_path, label, config, spec, spec_note, rope, task, longest, elsewhere,
                     licence_note(request.model), dtype, note)


def _output(output: Output, model_folder: Path | None) -> Path | None:
    """The checked output location (`foundation/outputs.py`), apart from the model's folder where it is known."""
    from lpes.foundation.outputs import check_not_in_output, check_output_file, check_output_folder, check_outside_model

    if output.kind == "folder":
        return check_output_folder(output.path, model_folder, output.force, list(output.inputs))
    if output.kind != "file":
        return None
    out = check_output_file(output.path, output.force)
    for flag, path in output.inputs:  # --force would write the spec over it
        check_not_in_output(path, out, flag)
    if model_folder is not None:
        check_outside_model(out, model_folder)
    return out


def _task(request: Request, model_path: Path, config, spec: Spec | None, label: str) -> tuple[Any, int]:
    """The validation task resolved and its prompts encoded (a typo in --data, a data file missing, a word the
    tokenizer lacks: now, one line). The longest sequence sizes a fixed-context export (genai)."""
    if request.task is None:
        return None, 0
    from lpes.validation.task_choice import check_task_encodes, resolve_task

    flags = request.task
    task = resolve_task(model_path, spec, flags.data, flags.chat_template, flags.answer_tokens)
    return task, check_task_encodes(model_path, config, task, label)
