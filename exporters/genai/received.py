"""What a received onnxruntime-genai package may name: genai_config.json's settings and files, the dtype sidecar."""

from __future__ import annotations

from pathlib import Path

from lpes.converter.trust import read_folder_json
from lpes.exporters.received import check_dtype_sidecar, check_settings
from lpes.foundation.errors import LpesError

GENAI_CONFIG = "genai_config.json"
SIDECAR = "lpes_genai.json"


def check_received_file(path: Path) -> None:
    """genai_config.json and lpes_genai.json, wherever they are in a received folder."""
    if path.name == GENAI_CONFIG:
        check_genai_config(path.parent)
    elif path.name == SIDECAR:
        check_dtype_sidecar(path)


def check_genai_config(package: Path) -> None:
    """genai_config.json: known session options only, providers lpes builds for, files inside the package,
    no library; and the fields the runner reads (model.context_length)."""
    path = Path(package) / GENAI_CONFIG
    data = read_folder_json(path)
    check_settings(path, Path(package), data, "")
    model = data.get("model")
    context = model.get("context_length") if isinstance(model, dict) else None
    if isinstance(context, bool) or not isinstance(context, int) or not 0 < context <= 2**31:
        raise LpesError(f"{path}: 'model.context_length' must be a positive integer, got {str(context)[:40]}")
