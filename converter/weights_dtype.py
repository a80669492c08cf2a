"""The precision the weights are stored in, against the one their config.json names (plan time, headers only).

A checkpoint saved in float16 under a config that says float32 (or the reverse) loads without a
word: transformers casts to the dtype asked for. lpes says it in the plan line instead, with the
precision the run computes in, so that a difference between an export and the numbers a user
expected has its reason on screen before any work.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from lpes.converter.loading import check_weights
from lpes.foundation.files import read_json_object

# safetensors' dtype names -> lpes's (torch's) names.
STORED_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def stored_dtype(model_path: Path) -> str | None:
    """The float dtype most of the weights' elements are stored in (from the safetensors headers), or None."""
    from safetensors import safe_open

    elements: Counter[str] = Counter()
    for shard in check_weights(Path(model_path)):
        with safe_open(str(shard), framework="pt") as handle:
            for name in handle.keys():
                piece = handle.get_slice(name)
                dtype = STORED_DTYPES.get(piece.get_dtype())
                if dtype is not None:
                    size = 1
                    for length in piece.get_shape():
                        size *= length
                    elements[dtype] += size
    return elements.most_common(1)[0][0] if elements else None


def config_dtype(model_path: Path) -> str | None:
    """The dtype config.json names (`dtype`, or `torch_dtype` as transformers 4 wrote it), or None."""
    data = read_json_object(Path(model_path) / "config.json")
    named = data.get("dtype", data.get("torch_dtype"))
    return named if isinstance(named, str) and named in STORED_DTYPES.values() else None


def dtype_note(model_path: Path, computes_in: str, flag: str = "--dtype") -> str | None:
    """One line when the weights are stored in another dtype than config.json says, with the dtype this
    run computes in (`computes_in`, which `flag` sets); None when they agree or the config names none."""
    stored, named = stored_dtype(model_path), config_dtype(model_path)
    if stored is None or named is None or stored == named:
        return None
    keep = f"; {flag} {stored} keeps their precision" if stored != computes_in and stored != "float64" else ""
    return (f"note: the weights are stored in {stored}, but config.json says {named}; this run computes in "
            f"{computes_in} ({flag} {computes_in}{keep})")
