"""The one place for architecture knowledge, keyed by `config.model_type`.

Most transformers-5 RoPE decoders share one layout: decoder layers at
`model.layers`, one rotary module at `model.rotary_emb` whose `(cos, sin)` every
layer receives. `DEFAULT` covers them; an entry here overrides only what differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lpes.foundation.errors import LpesError


@dataclass(frozen=True)
class GenaiSupport:
    """What onnxruntime-genai's model builder needs to reproduce a model of this type (`--to genai`)."""

    hf_class: str  # config.architectures[0]: the builder dispatches on it
    rope_types: frozenset[str]  # RoPE variants whose builder cache equals transformers' own
    # Phi-3: the builder picks its LongRoPE class whenever these two lengths differ.
    needs_equal_original_max: bool = False


@dataclass(frozen=True)
class Architecture:
    layers_path: str = "model.layers"
    rotary_path: str = "model.rotary_emb"
    # The rotary module is called once per layer type and keeps one inv_freq per type (Gemma 3).
    per_layer_type_rope: bool = False
    # cos/sin repeat each frequency for adjacent pairs instead of concatenating halves (Cohere).
    interleaved_rope: bool = False
    # Keyword arguments for from_pretrained/from_config when the model is loaded for export.
    export_load_kwargs: dict[str, Any] = field(default_factory=dict)
    # None: onnxruntime-genai's builder is not known to reproduce this architecture.
    genai: GenaiSupport | None = None

    def patch_kwargs(self, config) -> dict[str, Any]:
        """Arguments for `lpes_rope.apply_layer_scales` (also written into Hub configs)."""
        layer_types = list(config.layer_types) if self.per_layer_type_rope else None
        return {
            "layers_path": self.layers_path,
            "rotary_path": self.rotary_path,
            "layer_types": layer_types,
            "interleaved": self.interleaved_rope,
        }


DEFAULT = Architecture()
_MOE_EXPORT = {"experts_implementation": "batched_mm"}  # grouped_mm has no ONNX function

ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(genai=GenaiSupport("LlamaForCausalLM", frozenset({"default", "llama3"}))),
    "mistral": Architecture(genai=GenaiSupport("MistralForCausalLM", frozenset({"default", "linear"}))),
    "qwen2": Architecture(genai=GenaiSupport("Qwen2ForCausalLM", frozenset({"default", "linear"}))),
    "qwen3": Architecture(genai=GenaiSupport("Qwen3ForCausalLM", frozenset({"default", "linear"}))),
    "phi3": Architecture(genai=GenaiSupport("Phi3ForCausalLM", frozenset({"default"}), needs_equal_original_max=True)),
    "gemma3_text": Architecture(per_layer_type_rope=True),
    "gemma3": Architecture(
        layers_path="model.language_model.layers",
        rotary_path="model.language_model.rotary_emb",
        per_layer_type_rope=True,
    ),
    "olmo3": Architecture(per_layer_type_rope=True),
    "gpt_neox": Architecture(layers_path="gpt_neox.layers", rotary_path="gpt_neox.rotary_emb"),
    "cohere": Architecture(interleaved_rope=True),
    "cohere2": Architecture(interleaved_rope=True),
    "mixtral": Architecture(export_load_kwargs=_MOE_EXPORT),
    "qwen2_moe": Architecture(export_load_kwargs=_MOE_EXPORT),
    "qwen3_moe": Architecture(export_load_kwargs=_MOE_EXPORT),
    "deepseek_v3": Architecture(export_load_kwargs=_MOE_EXPORT),
}


def architecture_for(config) -> Architecture:
    """The entry for this config; raises LpesError for a model without RoPE."""
    if getattr(config, "rope_parameters", None) is None:
        raise LpesError(f"model type {config.model_type!r} has no RoPE (no rope_parameters); LPES needs RoPE")
    return ARCHITECTURES.get(config.model_type, DEFAULT)


SLIDING = "sliding_attention"  # transformers' layer_types name of a sliding-window attention layer


def stretched_windows(config, scales, length: int) -> tuple[list[int], float]:
    """The sliding-window layers a scale below 1 stretches past the distances they were trained on, and the
    farthest distance they would then see.

    A scale s makes a distance d look like d / s; a sliding-window layer attends to at most `sliding_window`
    positions, so on sequences of `length` it meets distances up to min(length, window) and under s up to
    min(length, window) / s. Past the window that layer never saw such distances (on Gemma 3 at 884 tokens
    s = 0.75 answered 0.0%, at 374 tokens 37.0%: bench/RESULTS.md).
    """
    window = getattr(config, "sliding_window", None)
    types = list(getattr(config, "layer_types", None) or [])
    if not window or len(types) != len(scales):
        return [], 0.0
    reach = min(length, window)
    layers = [h for h, (kind, s) in enumerate(zip(types, scales)) if kind == SLIDING and reach / s > window]
    return layers, (reach / min(scales[h] for h in layers) if layers else 0.0)


def window_warning(config, scales, length: int, what: str) -> str | None:
    """One line naming the layers `stretched_windows` finds, None when there are none."""
    layers, farthest = stretched_windows(config, scales, length)
    if not layers:
        return None
    return (f"warning: {what} stretches the sliding windows of layers {_ranges(layers)} past the "
            f"{config.sliding_window} positions they were trained on (at {length} positions distances look like up "
            f"to {farthest:.0f}); expect it to break at this length")


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 4] -> "0-2, 4"."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
