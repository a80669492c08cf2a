"""What `SharedPrefixGreedy` computes with on a CPU, beside transformers' own: a cache that grows in place, and
attention that reads each key/value head once. The same numbers to the bit, without the copies that took a third of
the operators' time in a profile of a held-out batch (SmolLM2-135M, 32 rows of 407 positions on 2 cores): 7% of
its wall time (bench/RESULTS.md, "a fourth cut").

- transformers' `DynamicLayer` concatenates every pass's keys and values to the cache: a decode round copies the
  whole cache. `GrowingLayer` writes them into buffers with room to spare; its keys and values are views.
- transformers' sdpa attention copies each key/value head out to its query heads (`repeat_kv`) whenever it passes a
  mask and more than one query position (a prefill, a drafted round). torch's kernel takes them as they are
  (`enable_gqa`), and on a CPU computes each head's attention as it does on the copies.

Imported when the runner runs (it imports torch and transformers).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from lpes.exporters.runners import model_device

GROUPED_SDPA = "lpes_grouped_sdpa"  # the name it is registered under with transformers
ROOM = 64  # slots a buffer grows by at least: a reallocation copies the cache, once per this many or more


class GrowingLayer(DynamicLayer):
    """transformers' `DynamicLayer`, its keys and values the filled part of buffers with room for more slots."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def holding(cls, keys: torch.Tensor, values: torch.Tensor) -> GrowingLayer:
        """A layer whose buffers are `keys` and `values` themselves, handed over by the caller (no copy; the first
        update that needs room makes some)."""
        layer = cls()
        layer.lazy_initialization(keys, values)
        layer.buffers = layer.keys, layer.values = keys, values
        return layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        held = self.get_seq_length()
        total = held + key_states.shape[-2]
        if self.buffers is None or total > self.buffers[0].shape[-2]:
            self.buffers = tuple(_grown(old, new, held, total + max(ROOM, total // 8))
                                 for old, new in ((self.keys, key_states), (self.values, value_states)))
        for buffer, new in zip(self.buffers, (key_states, value_states)):
            buffer[:, :, held:total] = new
        self.keys, self.values = (buffer[:, :, :total] for buffer in self.buffers)
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        held = self.get_seq_length()
        if held:
            self.buffers = tuple(buffer[indices.to(buffer.device)] for buffer in self.buffers)
            self.keys, self.values = (buffer[:, :, :held] for buffer in self.buffers)


def _grown(old: torch.Tensor, new: torch.Tensor, held: int, slots: int) -> torch.Tensor:
    """A buffer of `slots` slots for rows shaped as `new`, holding `old`'s first `held`."""
    buffer = new.new_empty((*new.shape[:-2], slots, new.shape[-1]))
    if held:
        buffer[:, :, :held] = old
    return buffer


def growing_cache(layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Cache:
    """A cache of `GrowingLayer`s holding `layers` ([(keys, values)] per layer, handed over), or empty."""
    if layers is None:
        return Cache(layer_class_to_replicate=GrowingLayer)
    return Cache(layers=[GrowingLayer.holding(keys, values) for keys, values in layers])


def grouped_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """transformers' sdpa attention, the key/value heads given to torch's kernel as they are where it would copy
    them out (a mask and query heads sharing key/value heads); transformers' own function everywhere else."""
    extras = any(kwargs.get(name) is not None for name in ("softcap", "position_bias", "s_aux", "sinks"))
    if attention_mask is None or getattr(module, "num_key_value_groups", 1) == 1 or extras:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_SDPA, sdpa_mask)  # the masks sdpa's are


@contextmanager
def grouped_attention(model) -> Iterator[None]:
    """`grouped_sdpa` for `model` while inside, where it runs transformers' sdpa on a CPU (on a GPU, torch's kernels
    do not take a mask with shared heads: they would fall back to the slow one)."""
    before = model.config._attn_implementation
    if before != "sdpa" or model_device(model).type != "cpu":  # a replica spans GPUs or none
        yield
        return
    model.set_attn_implementation(GROUPED_SDPA)
    try:
        yield
    finally:
        model.set_attn_implementation(before)
