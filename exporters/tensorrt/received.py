"""What a received TensorRT engine folder may name: its sidecar, no plugin or library."""

from __future__ import annotations

from pathlib import Path

from lpes.converter.trust import read_folder_json
from lpes.exporters.received import check_settings

ENGINE_SIDECAR = "model.engine.json"


def check_received_file(path: Path) -> None:
    """model.engine.json, wherever it is in a received folder."""
    if path.name == ENGINE_SIDECAR:
        check_engine_sidecar(path.parent)


def check_engine_sidecar(engine_dir: Path) -> None:
    """model.engine.json names no plugin or library (the runner also deserialises with host code disallowed)."""
    path = Path(engine_dir) / ENGINE_SIDECAR
    check_settings(path, Path(engine_dir), read_folder_json(path), "")
