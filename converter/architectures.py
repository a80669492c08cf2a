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
