"""onnxruntime-genai package of an LPES model (`--to genai`).

onnxruntime-genai's model builder writes an optimised graph whose attention nodes
take the RoPE `cos_cache`/`sin_cache` as plain inputs. lpes keeps that graph and
gives each layer the caches of its own scale (`rope.py`), so the package runs
in the stock runtime with stock kernels.

In order:

1. `check_genai`: everything that can fail cheaply (package installed, precision and
   execution provider, architecture, RoPE variant, known builder pitfalls, kernel
   limits), before a weight is read.
2. The builder runs through its Python API, its output captured, into a staging
   folder inside `out_dir` (subprocess would cost a fresh torch import per build).
3. `rope.py` checks the builder's cache against the model's own RoPE, then
   points every scaled layer at the cache of its scale.
4. The graph, `genai_config.json`, the tokenizer files and `lpes_spec.json` land in
   `out_dir`.

Builder pitfalls measured with onnxruntime-genai 0.18 and transformers 5 (each is
refused by `check_genai` with a one-line reason):

- It takes every `nn.Linear` whose output size equals the vocabulary size for the
  LM head, MLP and attention projections included; the logits then come out of the
  middle of the network (a tiny model with vocabulary 128 = intermediate size 128
  gave logits 0.4 off at position 0).
- Its Llama class ignores `linear` and `yarn` RoPE (it builds the default cache). A spec
  with `rope_type` yarn is fine: the builder builds the model's own (plain) cache, and lpes
  replaces each scaled layer's pair with YaRN's at its factor; `dynamic` is refused, since
  a fixed cache cannot follow the sequence length.
  `converter.architectures` (`GenaiSupport`) lists only variants whose caches match transformers'; the
  cache check in step 3 catches any other mismatch.
- It does not apply a sliding window from a transformers-5 Mistral config (no
  `layer_types`), and the windowed KV cache it declares then fails on long prompts.
- Phi-3 with `max_position_embeddings != original_max_position_embeddings` goes to
  its LongRoPE class, which fails on any other RoPE type.
- ONNX Runtime's CPU GroupQueryAttention needs a head size that is a multiple of 16
  and a rotary half-width (cache columns) that is a multiple of 8.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from lpes.converter import lpes_rope
from lpes.converter.architectures import ARCHITECTURES, GenaiSupport, architecture_for
from lpes.converter.loading import ResolvedModel
from lpes.exporters.genai.builds import BUILDS
from lpes.foundation.errors import LpesError
from lpes.foundation.files import write_text_atomic
from lpes.foundation.spec import Spec, dump_spec
from lpes.foundation.spec_file import SPEC_FILE

SIDECAR_FILE = "lpes_genai.json"  # precision and provider the package was built for
GENAI_CONFIG = "genai_config.json"
# The builder's precision names -> lpes dtype names (an export's disagreement allowance); the
# quantised packages keep float32 activations and are held to the float32 allowance.
PRECISION_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
CONTEXT_CAP = 32768  # as TensorRT's default profile: caches of 2 x context x head_dim/2 floats per scale
_WORK_DIR = ".lpes-genai-build"  # inside out_dir, removed when done


@dataclass(frozen=True)
class GenaiPlan:
    model_path: Path
    spec: Spec  # resolved for the model's layer count
    precision: str
    execution_provider: str
    rope_type: str
    rotary: torch.nn.Module  # the model's own rotary module (CPU, float32 inv_freq)
    # The package's context length: the trained positions x the largest scale (capped), the
    # lengths an LPES model is used at; the builder itself would stop at max_position_embeddings.
    context_length: int = 0


def check_genai(resolved: ResolvedModel, precision: str = "fp32", execution_provider: str = "cpu",
                min_context: int = 0) -> GenaiPlan:
    """Validate everything `export_genai` needs without reading a weight; LpesError on the first problem.

    `min_context`: the longest sequence validation will generate on the package (ExportJob.validation_tokens).
    """
    if importlib.util.find_spec("onnxruntime_genai") is None:
        raise LpesError("--to genai needs onnxruntime-genai: pip install 'lpes[genai]'")
    _check_target(precision, execution_provider)
    model_path, config, spec = resolved.path, resolved.config, resolved.spec
    entry = _architecture_entry(config)
    rope_type = config.rope_parameters.get("rope_type", "default")
    if rope_type not in entry.rope_types:
        raise LpesError(
            f"--to genai supports {config.model_type} with RoPE {sorted(entry.rope_types)}, not {rope_type!r}: "
            "onnxruntime-genai's builder does not reproduce it"
        )
    _check_builder_pitfalls(config, entry)
    if config.eos_token_id is None and not _tokenizer_has_eos(model_path):
        raise LpesError("--to genai needs an end-of-sequence token (config eos_token_id or the tokenizer's); "
                        "onnxruntime-genai's generator stops on it")
    _check_rope_scheme(config, spec)
    meta_model = _meta_model(config)
    _check_lm_head_lookalikes(meta_model, config.vocab_size)
    rotary = _rotary_module(meta_model, config)
    if execution_provider == "cpu":
        _check_cpu_kernel_limits(config, rotary)
    # The validation prompts too: a stock YaRN decision at factor 1.75 on a model trained on 256 positions is
    # validated on its 512-position prompts (make demo).
    context = min(CONTEXT_CAP, max(config.max_position_embeddings, min_context,
                                   math.ceil(config.max_position_embeddings * max(spec.scales))))
    if entry.needs_equal_original_max:  # a longer context sends Phi-3 to the builder's LongRoPE class
        context = config.max_position_embeddings
    if min_context > context:
        cap = ("the model's trained length, which the builder needs for this architecture"
               if entry.needs_equal_original_max else f"lpes's cap for a genai package, {CONTEXT_CAP}")
        raise LpesError(f"--to genai: validation generates sequences of up to {min_context} tokens (prompt and "
                        f"answer), past the package's context length {context} ({cap}); validate on shorter "
                        "prompts (--data) or pass --no-validate")
    return GenaiPlan(Path(model_path), spec, precision, execution_provider, rope_type, rotary, context)


def _tokenizer_has_eos(model_path: Path) -> bool:
    from lpes.converter.loading import has_tokenizer, load_tokenizer

    return has_tokenizer(model_path) and load_tokenizer(model_path).eos_token_id is not None


def export_genai(resolved: ResolvedModel, out_dir: Path, precision: str = "fp32", execution_provider: str = "cpu"
                 ) -> Path:
    """Build the onnxruntime-genai package of `resolved`'s model with per-layer RoPE caches into `out_dir`."""
    return write_genai(check_genai(resolved, precision, execution_provider), out_dir)


def write_genai(plan: GenaiPlan, out_dir: Path) -> Path:
    """Build the package that `check_genai` planned into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = out_dir / _WORK_DIR
    try:
        package = work / "package"
        _run_builder(plan, package, work / "cache")
        _write_scaled_package(plan, package, out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    dump_spec(plan.spec, out_dir / SPEC_FILE)
    sidecar = {"format": "lpes-genai", "version": 1, "precision": plan.precision,
               "execution_provider": plan.execution_provider, "dtype": PRECISION_DTYPES.get(plan.precision, "float32")}
    write_text_atomic(out_dir / SIDECAR_FILE, json.dumps(sidecar, indent=2) + "\n")
    return out_dir


# Bytes per weight the builder writes, per precision (int4 counted as a byte: its scales and the layers it
# keeps in float).
_PRECISION_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1, "int4": 1}


def package_bytes(plan: GenaiPlan) -> int:
    """About the most `write_genai` holds on disk at once: the builder's package and the scaled one re-saved
    beside it, each the weights in the plan's precision."""
    from lpes.converter.loading import parameter_count

    return 2 * parameter_count(plan.model_path) * _PRECISION_BYTES.get(plan.precision, 4)


# ---- checks ----


def _check_target(precision: str, execution_provider: str) -> None:
    if execution_provider not in BUILDS:
        raise LpesError(f"genai execution provider must be one of {', '.join(BUILDS)}, got {execution_provider!r}")
    if precision not in BUILDS[execution_provider]:
        raise LpesError(
            f"genai precision for {execution_provider} must be one of "
            f"{', '.join(BUILDS[execution_provider])}, got {precision!r}"
        )


def _architecture_entry(config) -> GenaiSupport:
    entry = architecture_for(config).genai
    if entry is None:
        supported = sorted(name for name, arch in ARCHITECTURES.items() if arch.genai is not None)
        raise LpesError(
            f"--to genai does not support model type {config.model_type!r} (supported: {', '.join(supported)})"
        )
    hf_class = (config.architectures or [None])[0]
    if hf_class != entry.hf_class:
        raise LpesError(f"--to genai needs a {entry.hf_class} checkpoint, this config names {hf_class!r}")
    return entry


def _check_builder_pitfalls(config, entry: GenaiSupport) -> None:
    if getattr(config, "sliding_window", None) is not None:
        raise LpesError(
            f"--to genai: onnxruntime-genai's builder does not reproduce {config.model_type}'s sliding-window "
            f"attention (sliding_window={config.sliding_window})"
        )
    original = getattr(config, "original_max_position_embeddings", None)
    if entry.needs_equal_original_max and original != config.max_position_embeddings:
        raise LpesError(
            f"--to genai: onnxruntime-genai's builder treats a {config.model_type} model with "
            f"original_max_position_embeddings ({original}) != max_position_embeddings "
            f"({config.max_position_embeddings}) as LongRoPE"
        )


def _check_rope_scheme(config, spec: Spec) -> None:
    from lpes.converter.reference import check_rope_scheme

    if spec.rope.length_dependent:
        raise LpesError(
            f"--to genai cannot run per-layer {spec.rope.name} (rope_type {spec.rope.rope_type!r}): onnxruntime-genai "
            "reads fixed cos/sin caches, and its frequencies follow the sequence length; use --to onnx or hf"
        )
    check_rope_scheme(config, spec.rope)


def _meta_model(config) -> torch.nn.Module:
    """The model's module tree without weights (nothing is allocated)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _check_lm_head_lookalikes(model: torch.nn.Module, vocab_size: int) -> None:
    lm_head = model.get_output_embeddings()
    lookalikes = [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module.out_features == vocab_size and module is not lm_head
    ]
    if lookalikes:
        raise LpesError(
            f"--to genai: {lookalikes[0]} has {vocab_size} outputs, the vocabulary size, and "
            "onnxruntime-genai's builder would wire it up as the LM head"
        )


def _rotary_module(meta_model: torch.nn.Module, config) -> torch.nn.Module:
    """A real (CPU) instance of the model's own rotary module: its inv_freq is what LPES scales."""
    arch = architecture_for(config)
    if arch.per_layer_type_rope or arch.interleaved_rope:
        raise LpesError(f"--to genai does not support {config.model_type}'s RoPE layout")
    rotary_class = type(lpes_rope.resolve_attribute(meta_model, arch.rotary_path))
    return rotary_class(config).eval()


def _check_cpu_kernel_limits(config, rotary: torch.nn.Module) -> None:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache_columns = rotary.inv_freq.numel()
    if head_dim % 16 or cache_columns % 8:
        raise LpesError(
            f"--to genai on cpu: onnxruntime's GroupQueryAttention needs head_dim % 16 == 0 and "
            f"rotary_dim / 2 % 8 == 0, this model has head_dim {head_dim}, rotary_dim / 2 {cache_columns}"
        )


# ---- build ----


def _run_builder(plan: GenaiPlan, package: Path, cache: Path) -> None:
    """Run onnxruntime-genai's builder in this process, its printed progress swallowed; errors become one line."""
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            # Importing the package appends its folder to sys.path: builder.py imports its siblings by name.
            from onnxruntime_genai.models import builder

            view = _model_view(plan, cache.parent / "model")
            args = (None, str(view), str(package), plan.precision, plan.execution_provider, str(cache))
            options = builder.parse_extra_options(*args, [])
            builder.create_model(*args, **options)
    except Exception as err:  # the builder raises anything from ValueError to KeyError
        message = " ".join(str(err).split())[:300] or "no message"
        raise LpesError(f"onnxruntime-genai's builder failed: {type(err).__name__}: {message}") from None


def _model_view(plan: GenaiPlan, folder: Path) -> Path:
    """The model folder as the builder should read it: links to its files, max_position_embeddings the
    package's context length (the builder sizes its caches and genai_config.json from it)."""
    folder.mkdir(parents=True)
    for source in plan.model_path.iterdir():
        if source.is_file() and source.name != "config.json":
            os.symlink(source.resolve(), folder / source.name)
    config = json.loads((plan.model_path / "config.json").read_text())
    config["max_position_embeddings"] = plan.context_length
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def _write_scaled_package(plan: GenaiPlan, package: Path, out_dir: Path) -> None:
    import onnx_ir as ir

    from lpes.exporters.genai import rope as genai_rope  # onnx_ir takes seconds to import: only when building

    filename = json.loads((package / GENAI_CONFIG).read_text())["model"]["decoder"]["filename"]
    model = ir.load(package / filename)
    length = genai_rope.builder_caches(model)[0].shape[0]  # the builder's context length
    genai_rope.check_builder_cache(model, genai_rope.model_cache(plan.rotary, length), plan.rope_type)
    scales = list(plan.spec.scales)
    rope = None if plan.spec.rope.linear else plan.spec.rope.for_lpes_rope()
    genai_rope.attach_layer_caches(model, scales, genai_rope.scaled_caches(plan.rotary, scales, length, rope))
    # Same layout as the builder: every tensor in one external data file next to the graph.
    ir.save(model, out_dir / filename, external_data=f"{filename}.data", size_threshold_bytes=0)
    for path in package.iterdir():
        if path.name not in (filename, f"{filename}.data"):
            os.replace(path, out_dir / path.name)
