"""A Hub-ready folder: the base weights unchanged, the scales in config.json, code wired by auto_map.

    out/
      config.json          base config + model_type "lpes_<base>", "lpes": {scales, curve, layout}, auto_map
      modeling_lpes.py     a short subclass of the base model class (audit it before trusting it)
      lpes_rope.py         the per-layer RoPE implementation, copied verbatim from lpes
      model*.safetensors   hard links to the base weights (copied across filesystems), never re-serialised
      tokenizer files, generation_config.json, chat template   copied
      lpes_spec.json, lpes_curve.png, README.md (model card)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from lpes.converter import lpes_rope
from lpes.converter.architectures import architecture_for
from lpes.converter.loading import load_config
from lpes.converter.model_card import write_model_card
from lpes.converter.modeling_template import MODELING_LPES
from lpes.errors import LpesError
from lpes.plots import plot_curve
from lpes.spec import Spec, dump_spec, write_text_atomic

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
NOT_COPIED = {"config.json", "README.md", ".gitattributes"}


def write_hf_folder(model_path: Path, spec: Spec, out_dir: Path, base_model: str, lpes_version: str) -> Path:
    """Write the Hub folder for `model_path` + `spec` into `out_dir` (which must exist)."""
    config = load_config(model_path)
    if getattr(config, "auto_map", None):
        raise LpesError(f"{model_path} is itself custom code (auto_map); lpes wraps only built-in transformers models")
    spec = spec.for_layers(config.num_hidden_layers)
    _link_or_copy_files(model_path, out_dir)
    _write_config(model_path, spec, out_dir, config)
    base_class = (config.architectures or [None])[0]
    if not base_class or not base_class.endswith("ForCausalLM"):
        raise LpesError(f"config.json 'architectures' is {config.architectures!r}; expected a *ForCausalLM class")
    modeling = MODELING_LPES.format(
        base_class=base_class,
        base_model_type=config.model_type,
        lpes_model_type=lpes_model_type(config.model_type),
        lpes_version=lpes_version,
    )
    (out_dir / "modeling_lpes.py").write_text(modeling)
    shutil.copyfile(lpes_rope.__file__, out_dir / "lpes_rope.py")
    dump_spec(spec, out_dir / "lpes_spec.json")
    plot_curve(spec, out_dir / "lpes_curve.png")
    write_model_card(out_dir, spec, base_model, config)
    return out_dir


def lpes_model_type(base_model_type: str) -> str:
    """A model_type transformers does not know, so a plain load fails instead of running unscaled."""
    return f"lpes_{base_model_type}"


def _write_config(model_path: Path, spec: Spec, out_dir: Path, config) -> None:
    data = json.loads((model_path / "config.json").read_text())
    layout = architecture_for(config).patch_kwargs(config)
    data["lpes"] = {
        "scales": list(spec.scales),
        "curve": spec.curve.to_json() if spec.curve else None,
        "base_model_type": config.model_type,
        **layout,
    }
    data["model_type"] = lpes_model_type(config.model_type)
    data["architectures"] = ["LpesForCausalLM"]
    data["auto_map"] = {
        "AutoConfig": "modeling_lpes.LpesConfig",
        "AutoModelForCausalLM": "modeling_lpes.LpesForCausalLM",
    }
    write_text_atomic(out_dir / "config.json", json.dumps(data, indent=2) + "\n")


def _link_or_copy_files(model_path: Path, out_dir: Path) -> None:
    for source in sorted(model_path.iterdir()):
        if not source.is_file() or source.name in NOT_COPIED or source.name.startswith("."):
            continue
        if source.suffix == ".py":
            continue  # base-model custom code is refused above; stray scripts are not part of the model
        target = out_dir / source.name
        if source.suffix in WEIGHT_SUFFIXES or source.name in WEIGHT_INDEXES:
            _link_or_copy(source, target)
        else:
            shutil.copyfile(source, target)


def _link_or_copy(source: Path, target: Path) -> None:
    """Hard link where the filesystem allows (no bytes copied, never re-serialised), else copy."""
    try:
        os.link(source.resolve(), target)
    except OSError:
        shutil.copyfile(source, target)
