"""What every target's runner shares: the `GreedyRunner` interface validation scores through, one
left-padding rule for every runtime (torch, onnxruntime, TensorRT), the greedy loop over a KV cache
that the onnxruntime and TensorRT runners step, and `TorchGreedy` for a transformers model (the
Hub folder, and the PyTorch variants validation scores beside the exports).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np


class GreedyRunner(Protocol):
    """Anything that decodes greedily: `TorchGreedy`, and what each target's `open` returns."""

    def greedy(
        self, input_ids: list[list[int]], max_new_tokens: int, eos_token_id: int | None
    ) -> list[list[int]]:
        """The new tokens of each prompt (not the prompt), at most `max_new_tokens`."""
        ...


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


def torch_left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple:
    """`left_pad` as torch tensors (input_ids, attention_mask, position_ids)."""
    import torch

    return tuple(torch.from_numpy(a) for a in left_pad(rows, pad_id))


def greedy_decode(step: Callable[..., tuple[np.ndarray, Any]], rows: list[list[int]], past: Any, max_new_tokens: int,
                  eos_token_id: int | list[int] | None) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy decoding through a KV cache, shared by the onnxruntime and TensorRT runners.

    `step(ids, mask, positions, past) -> (last-position logits [batch, vocab] as numpy, present)`.
    Rows are left-padded; a row stops at its first end token. Returns the new tokens per
    row and the logits each step chose from.
    """
    ids, mask, positions = left_pad(rows)
    new_tokens: list[list[int]] = [[] for _ in rows]
    done = np.zeros(len(rows), dtype=bool)
    step_logits = []
    stop = end_tokens(eos_token_id)
    for _ in range(max_new_tokens):
        logits, present = step(ids, mask, positions, past)
        step_logits.append(logits)
        chosen = logits.argmax(axis=-1)
        for row, token in enumerate(chosen):
            if not done[row]:
                new_tokens[row].append(int(token))
                done[row] = int(token) in stop
        if done.all():
            break
        past = present
        ids = chosen[:, None].astype(np.int64)
        positions = positions[:, -1:] + 1
        mask = np.concatenate([mask, np.ones((len(rows), 1), dtype=np.int64)], axis=1)
    return new_tokens, step_logits


def end_tokens(eos_token_id: int | list[int] | None) -> set[int]:
    """The ids that end a row: none, one, or several (as `eos_token_id` names them)."""
    if eos_token_id is None:
        return set()
    return {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)


class KVCacheGreedy:
    """`greedy` for a runner whose `greedy_with_logits` steps `greedy_decode` (onnxruntime, TensorRT)."""

    def greedy(
        self, input_ids: list[list[int]], max_new_tokens: int, eos_token_id: int | list[int] | None = None
    ) -> list[list[int]]:
        """Greedy continuation of each prompt (rows may differ in length; they are left-padded).

        Returns the new tokens of each row only; a row stops after an end token (`eos_token_id`,
        one id or several), which it keeps.
        """
        tokens, _ = self.greedy_with_logits(input_ids, max_new_tokens, eos_token_id)
        return tokens


def model_device(model: Any) -> Any:
    """The torch device of a model's first parameter (cpu for one without parameters)."""
    import torch

    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


class TorchGreedy:
    """`GreedyRunner` over a transformers model (plain or patched with the LPES reference)."""

    def __init__(self, model, pad_token_id: int, prefill_tokens: int | None = None):
        """`prefill_tokens`: prefill a batch in sequence chunks of about this many positions (transformers'
        `prefill_chunk_size`), then decode every row together. The same tokens (each position still attends to
        all before it), cheaper on a CPU: SmolLM2-135M, 32 prompts of 407 tokens on 2 cores, 0.95 s per
        prompt against 1.07 unchunked (bench/RESULTS.md). None: one prefill pass. Never for a RoPE that
        follows the sequence length (dynamic NTK): each chunk would see a shorter sequence."""
        self.model = model
        self.pad_token_id = pad_token_id
        self.prefill_tokens = prefill_tokens

    def greedy(
        self, input_ids: list[list[int]], max_new_tokens: int, eos_token_id: int | list[int] | None
    ) -> list[list[int]]:
        import torch
        from transformers import GenerationConfig

        ids, mask, _ = torch_left_pad(input_ids, self.pad_token_id)
        device = model_device(self.model)
        # A fresh config: the model's own may ask for sampling, which greedy scoring must not inherit.
        config = GenerationConfig(
            do_sample=False,
            num_beams=1,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_token_id,
            pad_token_id=self.pad_token_id,
            prefill_chunk_size=prefill_chunk(self.prefill_tokens, *ids.shape),
        )
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config
            )
        return out[:, ids.shape[1] :].cpu().tolist()


def prefill_chunk(prefill_tokens: int | None, rows: int, width: int) -> int | None:
    """The positions each prefill pass of `rows` x `width` takes to stay near `prefill_tokens`; None: one pass."""
    if prefill_tokens is None or rows * width <= prefill_tokens:
        return None
    return max(prefill_tokens // rows, PREFILL_CHUNK_MIN)


# Chunks narrower than this make each forward too small to keep the matmuls efficient.
PREFILL_CHUNK_MIN = 32
