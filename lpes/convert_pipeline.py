"""lpes-convert as options -> plan -> execute.

`plan` checks everything a user can get wrong (model, spec, targets, output folder)
in about a second, before any heavy work. `execute` writes every target into a
hidden staging folder next to the output, validates, and only then renames the
staging folder into place, so an interrupted run leaves nothing half-written.

    out/            the Hub folder (--to hf)
    out/onnx/       optimum-style ONNX export with KV cache (--to onnx)
    out/tensorrt/   TensorRT engine + sidecar (--to tensorrt, built from out/onnx)
    out/genai/      onnxruntime-genai package (--to genai)
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lpes.converter.loading import load_config, model_fingerprint, resolve_model
from lpes.converter.reference import check_layout
from lpes.errors import LpesError
from lpes.spec import Spec, load_spec

TARGETS = ("hf", "onnx", "tensorrt", "genai")
TARGET_DIRS = {"onnx": "onnx", "tensorrt": "tensorrt", "genai": "genai"}


@dataclass
class ConvertPlan:
    model_name: str
    model_path: Path
    spec: Spec
    out: Path
    targets: list[str]
    dtype: str = "float32"
    force: bool = False
    validate: bool = True
    push_to_hub: str | None = None
    tensorrt_profile: object | None = None  # exporters.tensorrt_profiles.Profile
    genai_target: tuple[str, str] = ("fp32", "cpu")  # onnxruntime-genai builder: precision, execution provider


@dataclass
class ConvertResult:
    out: Path
    passed: bool = True
    reports: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def parse_targets(text: str | list[str] | tuple[str, ...]) -> list[str]:
    names = [t.strip() for t in text.split(",")] if isinstance(text, str) else list(text)
    names = [n for n in names if n]
    unknown = [n for n in names if n not in TARGETS]
    if unknown or not names:
        got = ",".join(names) or "nothing"
        raise LpesError(f"--to takes a comma-separated list of {', '.join(TARGETS)}; got {got}")
    return [t for t in TARGETS if t in names]  # pipeline order, duplicates dropped


def plan(
    model: str,
    spec: Spec | str | os.PathLike,
    out: str | os.PathLike,
    targets: str | list[str] | tuple[str, ...] = ("hf",),
    dtype: str = "float32",
    force: bool = False,
    validate: bool = True,
    push_to_hub: str | None = None,
    tensorrt_profile: dict | None = None,
    genai_target: tuple[str, str] = ("fp32", "cpu"),
) -> ConvertPlan:
    """Check every input; raise LpesError with one line for the first problem found."""
    from lpes.converter.loading import DTYPES

    target_list = parse_targets(targets)
    if dtype not in DTYPES:
        raise LpesError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    model_path = resolve_model(model)
    config = load_config(model_path)
    spec = load_spec(spec) if not isinstance(spec, Spec) else spec
    spec = spec.for_layers(config.num_hidden_layers)
    _warn_if_made_for_another_model(spec, config)
    check_layout(config)
    out = Path(out)
    if out.exists() and not force:
        raise LpesError(f"output folder {out} exists; pass --force to replace it")
    if push_to_hub and "hf" not in target_list:
        raise LpesError("--push-to-hub uploads the Hub folder; add hf to --to")
    if {"onnx", "tensorrt"} & set(target_list):
        from lpes.exporters.onnx_export import check_exportable

        check_exportable(config, spec, dtype)
        if validate and "onnx" in target_list:
            from lpes.validation.ort_runner import check_dtype_supported

            check_dtype_supported(dtype)
    if "genai" in target_list:
        from lpes.exporters.genai import check_genai

        check_genai(model_path, spec, *genai_target)
    profile = None
    if "tensorrt" in target_list:
        from lpes.exporters.tensorrt_profiles import default_profile

        profile = default_profile(config.max_position_embeddings, **(tensorrt_profile or {}))
    spec = _with_provenance(spec, config, model)
    return ConvertPlan(model, model_path, spec, out, target_list, dtype, force, validate, push_to_hub, profile,
                       genai_target)


def _warn_if_made_for_another_model(spec: Spec, config) -> None:
    """A curve searched on one model may be applied to another on purpose; say so, do not refuse."""
    made_for = spec.provenance.get("model")
    if not isinstance(made_for, dict):
        return
    here = model_fingerprint(config)
    differs = [k for k in ("architecture", "rope_parameters") if k in made_for and made_for[k] != here[k]]
    if differs:
        _progress(f"warning: the spec was searched on another model (different {', '.join(differs)})")


def _with_provenance(spec: Spec, config, model_name: str) -> Spec:
    import lpes

    provenance = dict(spec.provenance)
    provenance.setdefault("model", model_fingerprint(config))
    provenance["base_model"] = model_name
    provenance["lpes_version"] = lpes.__version__
    return Spec(spec.scales, spec.curve, provenance)


def execute(plan: ConvertPlan) -> ConvertResult:
    """Run the planned targets in a staging folder, validate, rename into place."""
    staging = plan.out.parent / f".{plan.out.name}.lpes-partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    result = ConvertResult(plan.out)
    try:
        for step in _steps(plan):
            step(plan, staging, result)
        if plan.out.exists():
            shutil.rmtree(plan.out)
        os.replace(staging, plan.out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if plan.push_to_hub:
        from lpes.converter.hub import push_folder

        _progress(f"uploading {plan.out} to {plan.push_to_hub}")
        push_folder(plan.out, plan.push_to_hub)
    return result


def convert(model: str, spec, out, targets=("hf",), **options) -> ConvertResult:
    """Plan and execute in one call (the Python form of lpes-convert)."""
    return execute(plan(model, spec, out, targets, **options))


def _steps(plan: ConvertPlan):
    steps = []
    if "hf" in plan.targets:
        steps.append(_write_hf)
    if {"onnx", "tensorrt"} & set(plan.targets):
        steps.append(_write_onnx)
    if "tensorrt" in plan.targets:
        steps.append(_write_tensorrt)
    if "genai" in plan.targets:
        steps.append(_write_genai)
    if plan.validate:
        steps.append(_validate)
    return steps


def _progress(message: str) -> None:
    print(f"lpes-convert: {message}", file=sys.stderr, flush=True)


def _write_hf(plan: ConvertPlan, staging: Path, result: ConvertResult) -> None:
    import lpes
    from lpes.converter.hf_folder import write_hf_folder

    _progress("writing the Hub folder (weights linked, scales in config.json)")
    write_hf_folder(plan.model_path, plan.spec, staging, plan.model_name, lpes.__version__)


def _write_onnx(plan: ConvertPlan, staging: Path, result: ConvertResult) -> None:
    from lpes.exporters.onnx_export import export_onnx
    from lpes.validation.parity import check_parity

    onnx_dir = staging / TARGET_DIRS["onnx"]
    onnx_dir.mkdir()
    _progress(f"exporting ONNX ({plan.dtype}) with a KV cache")
    export_onnx(plan.model_path, plan.spec, onnx_dir, dtype=plan.dtype)
    if plan.validate:
        _progress("checking ONNX parity against the PyTorch reference")
        report = check_parity(plan.model_path, plan.spec, onnx_dir, plan.dtype)
        result.reports.append(report.format())
        result.passed &= report.passed


def _write_tensorrt(plan: ConvertPlan, staging: Path, result: ConvertResult) -> None:
    from lpes.exporters.tensorrt import build_engine_or_explain

    _progress("building the TensorRT engine from the ONNX export")
    note = build_engine_or_explain(staging / TARGET_DIRS["onnx"], staging / TARGET_DIRS["tensorrt"], plan.dtype,
                                   profile=plan.tensorrt_profile)
    if note:
        result.warnings.append(note)


def _write_genai(plan: ConvertPlan, staging: Path, result: ConvertResult) -> None:
    from lpes.exporters.genai import export_genai

    genai_dir = staging / TARGET_DIRS["genai"]
    genai_dir.mkdir()
    _progress("building the onnxruntime-genai package with per-layer RoPE caches")
    export_genai(plan.model_path, plan.spec, genai_dir, *plan.genai_target)


def _validate(plan: ConvertPlan, staging: Path, result: ConvertResult) -> None:
    from lpes.validation.report import validate

    _progress("validating key-value retrieval accuracy by position")
    report = validate(plan.model_path, staging, plan.spec)
    result.reports.append(report.format())
    result.passed &= report.passed
    if "hf" in plan.targets and (staging / "validation.md").is_file():
        from lpes.converter.model_card import write_model_card

        config = load_config(plan.model_path)
        write_model_card(staging, plan.spec, plan.model_name, config, (staging / "validation.md").read_text())
