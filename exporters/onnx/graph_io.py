"""The ONNX graph's interface: input/output names and shapes (no torch: lpes-convert's parser reads them).

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
