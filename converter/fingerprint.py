"""Which model a curve was searched on, and whether the model it is applied to is that one.

lpes-search records `model_fingerprint` in the spec (`provenance.model`); lpes-convert and
lpes-validate compare it with the model they get (`model_differences`) and say so in one line
when it is another model (`searched_elsewhere`), as the report and the model card do.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from lpes.converter.loading import check_weights, model_label
from lpes.foundation.files import read_json_object


def model_fingerprint(config, model_path: Path | None = None, name: str | None = None) -> dict:
    """What a spec records about the model it was searched on (`provenance.model`).

    The architecture and RoPE always; with `name`, the model as published files name it (`model_label`);
    with `model_path`, `config_sha256` (config.json without the keys that say nothing about the model) and
    `weights_sha256` (`weights_digest`: the safetensors headers and samples of the data, not all of it).
    """
    out = {
        "architecture": (config.architectures or [type(config).__name__])[0],
        "model_type": config.model_type,
        "num_hidden_layers": config.num_hidden_layers,
        "rope_parameters": _plain(config.rope_parameters),
    }
    if name is not None:
        out["name"] = model_label(str(name))
    if model_path is not None:
        out["config_sha256"] = config_digest(Path(model_path))
        out["weights_sha256"] = weights_digest(Path(model_path))
    return out


# config.json keys that change with the tools that saved it, not with the model.
_UNRELATED_CONFIG_KEYS = ("transformers_version", "_name_or_path")
WEIGHT_SAMPLES, WEIGHT_SAMPLE_BYTES = 16, 4096


def config_digest(folder: Path) -> str:
    """SHA-256 of `folder`'s config.json as canonical JSON (sorted keys), without _UNRELATED_CONFIG_KEYS."""
    data = {k: v for k, v in read_json_object(Path(folder) / "config.json").items() if k not in _UNRELATED_CONFIG_KEYS}
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def weights_digest(folder: Path) -> str:
    """SHA-256 of every safetensors shard's header (names, dtypes, shapes, offsets) and WEIGHT_SAMPLES evenly
    spaced WEIGHT_SAMPLE_BYTES-byte samples of its data: milliseconds for any size, and two checkpoints of one
    shape (a model and its fine-tune) differ in the samples. Not a hash of all the weights."""
    digest = hashlib.sha256()
    for shard in check_weights(Path(folder)):
        with open(shard, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            digest.update(handle.read(length))
            start = 8 + length
            size = os.fstat(handle.fileno()).st_size - start
            for i in range(WEIGHT_SAMPLES):
                handle.seek(start + size * i // WEIGHT_SAMPLES)
                digest.update(handle.read(WEIGHT_SAMPLE_BYTES))
    return digest.hexdigest()


_FINGERPRINT_FIELDS = {"architecture": "architecture", "model_type": "model type", "num_hidden_layers": "layer count",
                       "rope_parameters": "RoPE"}


def model_differences(recorded, here: dict) -> list[str]:
    """What differs between the model a spec records (`provenance.model`) and `here` (`model_fingerprint`):
    [] when they are the same model, or when the record says too little to tell.

    With both digests on both sides they decide (a copy under another name is the same model);
    else the architecture and RoPE fields that both name, and the names.
    """
    if not isinstance(recorded, dict):
        return []
    digests = {"weights_sha256": "weights", "config_sha256": "config"}
    if all(recorded.get(k) and here.get(k) for k in digests):
        return [what for k, what in digests.items() if recorded[k] != here[k]]
    differs = [what for k, what in _FINGERPRINT_FIELDS.items() if k in recorded and k in here
               and recorded[k] != here[k]]
    if not differs and recorded.get("name") and here.get("name") and recorded["name"] != here["name"]:
        differs.append("name")
    return differs


def searched_elsewhere(recorded, model_path: Path, config, name: str) -> str | None:
    """One line when a spec recording `recorded` (its `provenance.model`) is applied to another model than it
    was searched on (`model_path`, shown as `name`), else None."""
    differs = model_differences(recorded, model_fingerprint(config, model_path, name))
    if not differs:
        return None
    return (f"the spec was searched on {searched_name(recorded)} (different {', '.join(differs)}), not on "
            f"{model_label(str(name))}: its baselines and search figures are that model's, and the report and model "
            "card say so")


def other_model_searched(recorded, model_path: Path, config, name: str) -> str | None:
    """The name of the model a spec was searched on (`searched_name`) when it is not this one, else None."""
    differs = model_differences(recorded, model_fingerprint(config, model_path, name))
    return searched_name(recorded) if differs else None


def searched_name(recorded) -> str:
    """The model a spec was searched on, as its `provenance.model` names it ("another model" when it does not)."""
    name = recorded.get("name") if isinstance(recorded, dict) else None
    return name if isinstance(name, str) and name else "another model"


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
