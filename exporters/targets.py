"""The export targets of `lpes-convert --to`: one registered class per target.

A target says, in one class, everything the pipeline and the validation report need:

- `name`, `folder` (where it goes inside the output folder; "." is the folder itself)
  and `marker` (a file that is there when the export is);
- `label` (how the validation plot names it), `layout` (its line in lpes-convert --help),
  `default` (converted when --to is not given), `holds_spec` (its folder keeps lpes_spec.json,
  where lpes-validate looks for it), `uploads` (what --push-to-hub uploads), `generates`
  (what lpes-generate runs);
- `needs`: targets whose output it is built from (TensorRT builds from the ONNX export);
- `add_arguments` / `options`: its own command-line flags;
- `check`: everything that can fail before a weight is read (plan time); `output_bytes`: about
  how much it writes (the plan's free-space check);
- `write`: the export itself, into its folder of the staging output;
- `open`: a greedy runner over a written export, for key-value validation (an
  `exporters.runners.GreedyRunner`; raises `RunnerUnavailable` where this machine cannot run it);
- `check_received_file`: what a received folder's file that its runtime reads may name (exporters/received.py);
- `export_dtype`: the precision the export was written in (its disagreement allowance).

Each built-in target is a folder of exporters/ (`hf/`, `onnx/`, `tensorrt/`, `genai/`) whose `target.py`
holds its class, found by that name: adding a target is one new folder (or, in a test, one registered
class). What writes it, how it runs and what a received copy of it may name live in the same folder
(`onnx/export.py`, `onnx/runner.py`, `onnx/received.py`, ...), and the rest of lpes (the pipeline,
validation, the plots, the CLI) reaches it through this class only.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import pkgutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from lpes.exporters.runners import GreedyRunner
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import Spec, load_spec
from lpes.foundation.spec_file import SPEC_FILE

if TYPE_CHECKING:
    from lpes.converter.loading import ResolvedModel


class RunnerUnavailable(Exception):
    """An export is present but cannot run here (no GPU, runtime not installed)."""


def require(module: str, extra: str) -> None:
    """RunnerUnavailable unless `module` is installed (validation then skips the export)."""
    if importlib.util.find_spec(module) is None:
        raise RunnerUnavailable(f"{module} is not installed (pip install 'lpes[{extra}]')")


class Validated(Protocol):
    """What `Target.finish` reads of a validation (`lpes.validation.results.ValidationReport`)."""

    verdict: str
    searched_on: str | None

    def markdown(self) -> str: ...

    def measured(self) -> Any: ...

    def verdict_reason(self) -> str: ...


@dataclass(frozen=True)
class ExportJob:
    """What every target of one conversion shares: the resolved inputs, checked at plan time."""

    model_path: Path
    model_name: str
    config: Any  # the base model's transformers config
    spec: Spec  # resolved for the model's layer count, with provenance
    dtype: str  # --dtype: precision of the graph exports
    validate: bool
    # The longest prompt + answer budget validation generates, in tokens (0: no validation or no tokenizer): an
    # export whose context is fixed when it is built (genai) must hold it.
    validation_tokens: int = 0

    @property
    def resolved(self) -> ResolvedModel:
        """The model folder, config and spec as the plan resolved them, for the stages that take them."""
        from lpes.converter.loading import ResolvedModel

        return ResolvedModel(self.model_path, self.config, self.spec)


@dataclass(frozen=True)
class RunContext:
    """How validation runs an export: the reference's dtype and device, the tokenizer's pad id."""

    reference_dtype: str
    device: str
    pad_token_id: int


@dataclass
class Written:
    """What writing (and checking) one target gave: report text, warnings, pass or fail."""

    reports: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # What the target was asked to make and could not make on this machine, one line each
    # (a TensorRT engine without an NVIDIA GPU): lpes-convert prints them and exits 2.
    unbuilt: list[str] = field(default_factory=list)
    passed: bool = True


@dataclass
class OpenedExport:
    runner: GreedyRunner
    note: str  # the runtime, shown in the table (e.g. the onnxruntime provider)
    dtype: str


class Target:
    """One `--to` target. Subclass, set the class attributes, decorate with `@register`."""

    name: ClassVar[str]
    folder: ClassVar[str]
    marker: ClassVar[str]
    order: ClassVar[int] = 100  # position in the pipeline (and in the validation table)
    needs: ClassVar[tuple[str, ...]] = ()
    help: ClassVar[str] = ""
    label: ClassVar[str] = ""  # the validation plot's name for it (default "LPES, NAME export")
    layout: ClassVar[str] = ""  # its line under "Targets go into one folder" in lpes-convert --help (default help)
    default: ClassVar[bool] = False  # converted when --to is not given
    holds_spec: ClassVar[bool] = False  # its folder holds lpes_spec.json (lpes-validate reads it there)
    uploads: ClassVar[bool] = False  # what --push-to-hub uploads
    generates: ClassVar[bool] = False  # what lpes-generate runs

    def __init__(self, job: ExportJob, options: dict[str, Any] | None = None):
        self.job = job
        self.options = dict(options or {})

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """This target's own flags (none by default)."""

    @classmethod
    def options_from(cls, args: argparse.Namespace) -> dict[str, Any]:
        """The values of this target's flags, as `options` for the constructor."""
        return {}

    def check(self) -> None:
        """Raise LpesError for anything that would fail later; read no weights."""

    def output_bytes(self, out: Path) -> int:
        """About how many bytes `write` puts in its folder of the output `out` at most (plan time, for the
        free-space check; read no weights). Default: one copy of the weights in --dtype, as a graph export."""
        from lpes.converter.loading import dtype_bytes, parameter_count

        return parameter_count(self.job.model_path) * dtype_bytes(self.job.dtype)

    def plan_note(self) -> str | None:
        """After `check`: one line said before any work starts (what this run will not do here)."""
        return None

    def describe(self) -> str:
        """After `check`: what `write` makes on this machine, for the progress line (default: `help`)."""
        return self.help

    def write(self, folder: Path) -> Written:
        """Write the export into `folder` (created; empty unless it is the output folder itself)."""
        raise NotImplementedError

    def finish(self, folder: Path, validation: Validated | None) -> None:
        """After validation (None: it did not run): files that include its result (the model card)."""

    @classmethod
    def find(cls, out_dir: Path) -> Path | None:
        """Its folder inside the output folder `out_dir`, when the export is there."""
        folder = Path(out_dir) / cls.folder
        return folder if (folder / cls.marker).is_file() else None

    @classmethod
    def open(cls, folder: Path, run: RunContext) -> OpenedExport:
        """A greedy runner over the export in `folder`, for key-value validation."""
        raise RunnerUnavailable(f"lpes has no runner for {cls.name} exports")

    @classmethod
    def check_received_file(cls, path: Path) -> None:
        """Before any runtime opens a received folder (exporters/received.py): LpesError (one line) if `path`, one
        of its files that this target's runtime reads, names code to load or a file outside the folder."""

    @classmethod
    def export_dtype(cls, folder: Path, run: RunContext) -> str:
        """The precision the export in `folder` was written in."""
        return "float32"

    @classmethod
    def help_line(cls) -> str:
        """Its entry under "Targets go into one folder" in lpes-convert --help (continuation lines indented)."""
        path = "OUT/" if cls.folder == "." else f"OUT/{cls.folder}/"
        first, *rest = (cls.layout or f"{cls.name}: {cls.help}").splitlines()
        return "\n".join([f"  {path:<15}{first}"] + [" " * 17 + line for line in rest])


_REGISTRY: dict[str, type[Target]] = {}
_BUILTINS_LOADED = False


def register(cls: type[Target]) -> type[Target]:
    """Class decorator: make `cls` a `--to` target under `cls.name`."""
    if not cls.name or cls.name != cls.name.strip() or "," in cls.name:
        raise ValueError(f"bad target name {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def registry() -> dict[str, type[Target]]:
    """Every registered target, in pipeline order."""
    _load_builtins()
    return dict(sorted(_REGISTRY.items(), key=lambda item: (item[1].order, item[0])))


def _load_builtins() -> None:
    """Import `target.py` of every folder of exporters/ (one folder per target): its class registers itself."""
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    import lpes.exporters as package

    for folder in pkgutil.iter_modules(package.__path__):
        if folder.ispkg and importlib.util.find_spec(f"{package.__name__}.{folder.name}.target") is not None:
            importlib.import_module(f"{package.__name__}.{folder.name}.target")
    _BUILTINS_LOADED = True


def parse_targets(text: str | Iterable[str]) -> list[type[Target]]:
    """`hf,onnx` -> the target classes asked for plus the ones they need, in pipeline order."""
    known = registry()
    names = [t.strip() for t in text.split(",")] if isinstance(text, str) else [str(t).strip() for t in text]
    names = [n for n in names if n]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        got = ",".join(names) or "nothing"
        raise LpesError(f"--to takes a comma-separated list of {', '.join(known)}; got {got}")
    wanted = set(names)
    for name in names:
        wanted.update(known[name].needs)
    return [cls for name, cls in known.items() if name in wanted]


def default_targets() -> str:
    """What --to converts when it is not given (comma-separated)."""
    return ",".join(name for name, cls in registry().items() if cls.default)


def targets_where(flag: str) -> list[type[Target]]:
    """The registered targets whose class attribute `flag` (holds_spec, uploads, generates) is set, in order."""
    return [cls for cls in registry().values() if getattr(cls, flag)]


def find_spec(out_dir: Path) -> Spec:
    """The spec an lpes-convert output folder holds: in the first export folder that keeps one."""
    holders = targets_where("holds_spec")
    for target in holders:
        candidate = Path(out_dir) / target.folder / SPEC_FILE
        if candidate.is_file():
            return load_spec(candidate)
    inside = " or ".join(f"{t.folder}/" for t in holders if t.folder != ".")
    raise LpesError(f"no {SPEC_FILE} in {out_dir} (nor in its {inside}); is it an lpes-convert output folder?")


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """Every target's own flags, on lpes-convert's parser."""
    for cls in registry().values():
        cls.add_arguments(parser)


def target_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per target name: the values of its own flags (`Target.options_from`)."""
    return {name: cls.options_from(args) for name, cls in registry().items()}
