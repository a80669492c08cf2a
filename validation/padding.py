"""Left padding for batched prompts: one rule for every runtime (torch, onnxruntime, TensorRT)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def left_pad(rows: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids, attention_mask, position_ids), int64, each row right-aligned.

    Positions count real tokens only, so every row sees the positions it would see
    alone (RoPE and LPES depend on them); padded slots get position 1, as
    transformers' `generate` gives them (they are masked out either way).
    """
    width = max(len(row) for row in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        if len(row):
            ids[i, width - len(row):] = row
            mask[i, width - len(row):] = 1
    return ids, mask, positions_from_mask(mask)


def positions_from_mask(mask: np.ndarray) -> np.ndarray:
    positions = np.cumsum(mask, axis=1) - 1
    return np.where(mask == 0, 1, positions).astype(np.int64)
