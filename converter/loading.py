"""Finding and loading the base model: a bundled short name, a local folder, or a hub id."""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

import torch

from lpes.converter.architectures import architecture_for
from lpes.errors import LpesError

BUNDLED_MODELS_DIR = Path(str(files("lpes") / "models"))  # package data of lpes, editable or wheel
DEFAULT_MODEL = "lpes-tiny-kv"

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def bundled_models() -> dict[str, Path]:
    """Short name -> folder of the models that ship inside lpes."""
    if not BUNDLED_MODELS_DIR.is_dir():
        return {}
    return {p.name: p for p in sorted(BUNDLED_MODELS_DIR.iterdir()) if (p / "config.json").is_file()}


def resolve_model(name: str | os.PathLike) -> Path:
    """A local folder for `name`: a bundled short name, an existing folder, or a hub download."""
    name = str(name)
    if name in bundled_models():
        return bundled_models()[name]
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise LpesError(f"{path} is not a Hugging Face model folder (no config.json)")
        return path
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise LpesError(f"model folder not found: {name}")
    return _download(name)


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return Path(snapshot_download(repo_id))
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise LpesError(f"cannot fetch {repo_id!r} from the Hub ({type(err).__name__}); pass a local folder") from None


def load_config(path: Path):
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as err:
        raise LpesError(f"cannot read the model config in {path}: {str(err).splitlines()[0]}") from None
    architecture_for(config)  # fails early for non-RoPE models
    return config


def load_model(path: Path, dtype: str = "float32", for_export: bool = False, device_map: dict | None = None):
    """Load the unpatched causal LM in eval mode (with export-friendly kernels when `for_export`).

    `device_map` (module name -> device) loads it split over several GPUs (search/replicas.py plans it).
    """
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise LpesError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    config = load_config(path)
    kwargs = dict(architecture_for(config).export_load_kwargs) if for_export else {}
    if device_map is not None:
        kwargs["device_map"] = device_map
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype], **kwargs)
    return model.eval()


def model_fingerprint(config) -> dict:
    """What a spec records about the model it was made for."""
    return {
        "architecture": (config.architectures or [type(config).__name__])[0],
        "model_type": config.model_type,
        "num_hidden_layers": config.num_hidden_layers,
        "rope_parameters": _plain(config.rope_parameters),
    }


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
