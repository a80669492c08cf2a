"""The ONNX graph's interface: input/output names, shapes, and the KV-cache wrapper.

Names follow optimum's decoder exports, so tools written for those read ours:

    inputs   input_ids [batch, seq]  attention_mask [batch, past + seq]  position_ids [batch, seq]
             past_key_values.{i}.key / .value  [batch, kv_heads, past, head_dim]
    outputs  logits [batch, seq, vocab] (float32 for every --dtype)
             present.{i}.key / .value  [batch, kv_heads, past + seq, head_dim]

One graph serves prefill (past = 0) and decode (seq = 1). Every layer keeps its full
history, sliding-window layers included: the attention mask, not the cache length,
limits what such a layer sees, so every layer has the same cache shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

INPUT_IDS, ATTENTION_MASK, POSITION_IDS, LOGITS = "input_ids", "attention_mask", "position_ids", "logits"
# The graph's dynamic dimensions, by the names the export gives them (TensorRT profiles read them back).
BATCH, SEQUENCE, PAST_SEQUENCE = "batch", "sequence_length", "past_sequence_length"
TOTAL_SEQUENCE = "total_sequence_length"  # past + sequence: the attention mask's length


def input_names(num_layers: int) -> list[str]:
    return [INPUT_IDS, ATTENTION_MASK, POSITION_IDS, *past_names(num_layers)]


def output_names(num_layers: int) -> list[str]:
    return [LOGITS, *present_names(num_layers)]


def past_names(num_layers: int) -> list[str]:
    return [f"past_key_values.{i}.{kind}" for i in range(num_layers) for kind in ("key", "value")]


def present_names(num_layers: int) -> list[str]:
    return [f"present.{i}.{kind}" for i in range(num_layers) for kind in ("key", "value")]


@dataclass(frozen=True)
class CacheShape:
    """What the KV-cache tensors of one model look like: [batch, kv_heads, length, head_dim] per layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, config) -> CacheShape:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return cls(config.num_hidden_layers, kv_heads, head_dim)

    def to_json(self) -> dict:
        return {"num_layers": self.num_layers, "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim}


class FlatKVCausalLM(nn.Module):
    """A causal LM whose cache goes in and out as flat tensors (what an ONNX graph can carry).

    The past tensors fill a transformers DynamicCache; the model appends this call's
    keys and values to it; the cache's tensors come back out as `present`.
    """

    def __init__(self, model: nn.Module, num_layers: int):
        super().__init__()
        self.model = model
        self.num_layers = num_layers

    def forward(self, input_ids, attention_mask, position_ids, *past: torch.Tensor):
        from transformers import DynamicCache

        # Without a config every layer is a plain DynamicLayer (full history): see the module docstring.
        cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(self.num_layers)])
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
        )
        present = [t for layer in out.cache.layers for t in (layer.keys, layer.values)]
        # float32 logits whatever the weights' dtype (transformers' generate upcasts them too):
        # numpy and onnxruntime's Python API have no bfloat16, and the argmax is the same.
        return (out.logits.float(), *present)
