"""A Hub-ready folder: the base weights unchanged, the scales in config.json.

Two kinds, chosen by the scales:

- **Stock RoPE** where it is exact: every layer that shares a rotary has the same scale `s`
  and the model's RoPE type composes with `inv_freq / s` into a stock type (see
  `stock_rope_parameters`), or, under the spec's `yarn` / `dynamic` scheme, every layer has
  the same factor, which is that stock type at that factor. config.json is the base config
  with new `rope_parameters`; no
  custom code, so transformers (without trust_remote_code), vLLM, TensorRT-LLM and
  llama.cpp's converter run it natively.
- **Per-layer LPES** otherwise, with a loud failure on a plain load:

    out/
      config.json          base config + model_type "lpes_<base>", "lpes": {scales, curve, layout}, auto_map
      modeling_lpes.py     LpesModel (AutoModel) and LpesForCausalLM, short subclasses (audit before trusting)
      lpes_rope.py         the per-layer RoPE implementation, copied verbatim from lpes

Both hold: model*.safetensors as hard links to the base weights (copied across
filesystems, never re-serialised); tokenizer files that transformers 4.x and 5 both read;
generation_config.json, chat template; lpes_spec.json, lpes_curve.png, README.md (model card).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lpes.converter import lpes_rope
from lpes.converter.architectures import architecture_for
from lpes.converter.loading import PICKLE_SUFFIXES, ResolvedModel
from lpes.converter.model_card import LENGTHS_PLOT, write_model_card
from lpes.converter.modeling_template import MODELING_LPES
from lpes.converter.portable_files import COPIED_TOKENIZER_FILES, write_config_json, write_tokenizer_files
from lpes.converter.reference import check_rope_scheme
from lpes.foundation.errors import LpesError
from lpes.foundation.files import write_text_atomic
from lpes.foundation.plots import plot_curve, plot_lengths
from lpes.foundation.rope_schemes import SCHEMES
from lpes.foundation.spec import LINEAR_ROPE, RopeScheme, Spec, dump_spec
from lpes.foundation.spec_file import SPEC_FILE

WEIGHT_SUFFIXES = (".safetensors", ".gguf")  # pickles (.bin, .pt) are never copied: unpickling can run code
WEIGHT_INDEXES = ("model.safetensors.index.json",)
NOT_COPIED = {"config.json", "README.md", ".gitattributes", *COPIED_TOKENIZER_FILES}
MODELING_FILE = "modeling_lpes.py"
ROPE_FILE = "lpes_rope.py"


@dataclass(frozen=True)
class HubFolderWritten:
    path: Path
    stock_rope: bool  # True: a stock config that loads without custom code
    note: str  # one line for the command line: which kind was written and how to load it


def write_hf_folder(
    model: ResolvedModel, out_dir: Path, base_model: str, lpes_version: str, model_card: bool = True,
) -> HubFolderWritten:
    """Write the Hub folder for `model` (its folder, config and resolved spec) into `out_dir` (which must exist).

    `model_card=False` leaves README.md to the caller (lpes-convert writes it once, after validation).
    """
    model_path, config, spec = model.path, model.config, model.spec
    if getattr(config, "auto_map", None):
        raise LpesError(f"{model_path} is itself custom code (auto_map); lpes wraps only built-in transformers models")
    base_class = (config.architectures or [None])[0]
    if not base_class or not base_class.endswith("ForCausalLM"):
        raise LpesError(f"config.json 'architectures' is {config.architectures!r}; expected a *ForCausalLM class")
    data = json.loads((model_path / "config.json").read_text())
    layout = architecture_for(config).patch_kwargs(config)
    check_rope_scheme(config, spec.rope)
    stock = stock_rope_parameters(copy.deepcopy(dict(config.rope_parameters)), spec.scales, layout["layer_types"],
                                  spec.rope, config.max_position_embeddings)
    _link_or_copy_files(model_path, out_dir)
    write_tokenizer_files(model_path, out_dir)
    if stock is not None:
        data = _stock_config(data, stock, spec, lpes_version)
        note = f"one scale per rotary is stock RoPE: config.json {_describe(stock)}, no custom code"
    else:
        data = _lpes_config(data, spec, config, base_class, layout, lpes_version)
        write_text_atomic(out_dir / MODELING_FILE, render_modeling(data))
        shutil.copyfile(lpes_rope.__file__, out_dir / ROPE_FILE)
        note = "per-layer scales: modeling_lpes.py + lpes_rope.py, load with trust_remote_code=True"
    data = _with_serving_limit(data, spec)
    write_config_json(data, out_dir / "config.json")
    dump_spec(spec, out_dir / SPEC_FILE)
    plot_curve(spec, out_dir / "lpes_curve.png")
    if spec.decision is not None and spec.decision.lengths is not None:
        held = spec.decision.row_computing(spec.scales, spec.rope.rope_type)
        plot_lengths(spec.decision.lengths, spec.decision.alpha, out_dir / LENGTHS_PLOT, held.name if held else None)
    if model_card:
        write_model_card(out_dir, spec, base_model, config)
    return HubFolderWritten(out_dir, stock is not None, note)


def _with_serving_limit(data: dict[str, Any], spec: Spec) -> dict[str, Any]:
    """config.json with max_position_embeddings lowered to the length the decision checked what it holds at
    (Spec.serving_limit): transformers' and vLLM's longest prompt. Not under dynamic NTK, whose frequencies switch
    at max_position_embeddings: there the card states the limit instead."""
    limit = spec.serving_limit
    if limit is None or spec.rope.length_dependent:
        return data
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    if limit >= int(text.get("max_position_embeddings") or limit + 1):
        return data
    text["max_position_embeddings"] = limit
    return data


def render_modeling(config: dict[str, Any]) -> str:
    """The modeling_lpes.py for a written config.json (`config`): what a folder must hold, byte for byte."""
    lpes = config["lpes"]
    return MODELING_LPES.format(
        base_class=lpes["base_architecture"],
        base_model_class=lpes["base_model_class"],
        base_model_type=lpes["base_model_type"],
        lpes_model_type=config["model_type"],
        lpes_version=lpes["lpes_version"],
    )


def lpes_model_type(base_model_type: str) -> str:
    """A model_type transformers does not know, so a plain load fails instead of running unscaled."""
    return f"lpes_{base_model_type}"


def stock_rope_parameters(
    rope_parameters: dict[str, Any], scales: list[float] | tuple[float, ...], layer_types: list[str] | None,
    rope: RopeScheme = LINEAR_ROPE, max_position_embeddings: int | None = None,
) -> dict[str, Any] | None:
    """Stock rope_parameters equal to LPES with `scales`, or None where no stock type is exact.

    Exact only when every layer that shares a rotary shares a scale (all layers; with
    per-layer-type RoPE as in Gemma 3, all layers of one type) and that rotary's type composes.
    Under a `yarn` / `dynamic` scheme one factor everywhere is that type at that factor, the
    parameters lpes_rope gives each layer (a single plain RoPE: the scheme's own precondition);
    YaRN at factor 1 is the model's own RoPE, as lpes_rope keeps it.
    """
    if not rope.linear:
        if layer_types is not None or len(set(scales)) != 1:
            return None
        if float(scales[0]) == 1.0 and SCHEMES[rope.rope_type].unscaled_at_factor_one:  # YaRN at 1 (rope_schemes)
            return dict(rope_parameters)
        return lpes_rope.scheme_rope_parameters(rope_parameters, max_position_embeddings, rope.for_lpes_rope(),
                                                float(scales[0]))
    if layer_types is None:
        if len(set(scales)) != 1:
            return None
        return compose_rope(rope_parameters, float(scales[0]))
    composed = {}
    for layer_type, params in rope_parameters.items():
        type_scales = {s for s, t in zip(scales, layer_types) if t == layer_type}
        if len(type_scales) > 1:
            return None
        scale = float(type_scales.pop()) if type_scales else 1.0
        composed[layer_type] = compose_rope(params, scale)
        if composed[layer_type] is None:
            return None
    return composed


def compose_rope(params: dict[str, Any], scale: float) -> dict[str, Any] | None:
    """One rotary's stock rope_parameters for `inv_freq / scale` on top of `params`, or None if none is exact.

    LPES divides the rotary's current inv_freq by `scale` and keeps its attention factor.
    - default: inv_freq / s is rope_type linear, factor s.
    - linear (factor f): inv_freq / f / s is linear with factor f * s.
    - longrope: inv_freq = 1 / (ext * theta^(2i/d)) with ext the short or the long factors
      (picked by sequence length); dividing by s is multiplying both lists by s, and the
      attention factor depends only on factor / original_max_position_embeddings, unchanged.
    - yarn, llama3: they interpolate only the low frequencies and keep the high ones as they
      are; inv_freq / s moves the high ones too, which neither type can express. dynamic
      recomputes theta from the sequence length, which no factor on top can follow. None.
    """
    if scale == 1.0:
        return dict(params)
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        return {**params, "rope_type": "linear", "factor": scale}
    if rope_type == "linear":
        return {**params, "factor": float(params["factor"]) * scale}
    if rope_type == "longrope":
        return {
            **params,
            "short_factor": [float(f) * scale for f in params["short_factor"]],
            "long_factor": [float(f) * scale for f in params["long_factor"]],
        }
    return None


def _describe(rope_parameters: dict[str, Any]) -> str:
    def one(params: dict[str, Any]) -> str:
        rope_type = params.get("rope_type", "default")
        factor = f", factor {params['factor']:g}" if rope_type in ("linear", "yarn", "dynamic") else ""
        return f"rope_type {rope_type}{factor}"

    if "rope_type" in rope_parameters or "rope_theta" in rope_parameters:
        return one(rope_parameters)
    return "; ".join(f"{layer_type}: {one(params)}" for layer_type, params in rope_parameters.items())


def _stock_config(data: dict[str, Any], rope_parameters: dict[str, Any], spec: Spec, lpes_version: str) -> dict:
    data = dict(data)
    data.pop("rope_scaling", None)  # a 4.x field transformers 5 would read instead of rope_parameters
    data["rope_parameters"] = rope_parameters
    data["lpes"] = {"stock_rope": True, **_spec_fields(spec), "lpes_version": lpes_version}
    return data


def _lpes_config(data: dict[str, Any], spec: Spec, config, base_class: str, layout: dict, lpes_version: str) -> dict:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    base_model_class = MODEL_MAPPING_NAMES.get(config.model_type)
    if base_model_class is None:
        raise LpesError(f"transformers has no base model class (AutoModel) for model type {config.model_type!r}")
    prefix = getattr(transformers, base_class).base_model_prefix
    data = dict(data)
    data["lpes"] = {
        **_spec_fields(spec),
        "base_model_type": config.model_type,
        "base_architecture": base_class,
        "base_model_class": base_model_class,
        "lpes_version": lpes_version,
        # Paths inside the base model, which LpesModel is and LpesForCausalLM holds.
        **layout,
        "layers_path": _inside_base_model(layout["layers_path"], prefix),
        "rotary_path": _inside_base_model(layout["rotary_path"], prefix),
    }
    data["model_type"] = lpes_model_type(config.model_type)
    data["architectures"] = ["LpesForCausalLM"]
    # AutoConfig first, then AutoModel: vLLM imports them in this order and builds AutoModel.
    data["auto_map"] = {
        "AutoConfig": "modeling_lpes.LpesConfig",
        "AutoModel": "modeling_lpes.LpesModel",
        "AutoModelForCausalLM": "modeling_lpes.LpesForCausalLM",
    }
    return data


def _spec_fields(spec: Spec) -> dict[str, Any]:
    fields = {"scales": list(spec.scales), "curve": spec.curve.to_json() if spec.curve else None}
    if not spec.rope.linear:  # how modeling_lpes.py applies the scales (absent: linear)
        fields["rope"] = spec.rope.for_lpes_rope()
    return fields


def _inside_base_model(path: str, base_model_prefix: str) -> str:
    head, _, rest = path.partition(".")
    if head != base_model_prefix or not rest:
        raise LpesError(f"{path} is not inside the base model ({base_model_prefix}); fix converter/architectures.py")
    return rest


def _link_or_copy_files(model_path: Path, out_dir: Path) -> None:
    for source in sorted(model_path.iterdir()):
        if not source.is_file() or source.name in NOT_COPIED or source.name.startswith("."):
            continue
        if source.suffix == ".py" or source.name.endswith(PICKLE_SUFFIXES) or source.name.endswith(".bin.index.json"):
            continue  # custom code is refused above, stray scripts are not part of the model, pickles may run code
        target = out_dir / source.name
        if source.suffix in WEIGHT_SUFFIXES or source.name in WEIGHT_INDEXES:
            _link_or_copy(source, target)
        else:
            shutil.copyfile(source, target)


def hf_folder_bytes(model_path: Path, out: Path) -> int:
    """About what `write_hf_folder` writes into `out`: the files it copies, and the weights unless they can be
    hard-linked (the same filesystem), the model code and the spec; for the plan's free-space check."""
    from lpes.foundation.preflight import nearest_existing

    out_device = os.stat(nearest_existing(Path(out).parent)).st_dev
    total = 1 << 20  # config.json, the model code, the spec, the card
    for source in sorted(Path(model_path).iterdir()):
        if not source.is_file() or source.name.startswith(".") or source.name.endswith((".py", *PICKLE_SUFFIXES)):
            continue
        found = source.stat()  # a link's target: Hugging Face's cache links every file to blobs/
        linked = (source.suffix in WEIGHT_SUFFIXES or source.name in WEIGHT_INDEXES) and found.st_dev == out_device
        total += 0 if linked else found.st_size
    return total


def _link_or_copy(source: Path, target: Path) -> None:
    """Hard link where the filesystem allows (no bytes copied, never re-serialised), else copy."""
    try:
        os.link(source.resolve(), target)
    except OSError:
        shutil.copyfile(source, target)
