"""Per-layer RoPE scaling (LPES): the one implementation.

lpes-convert copies this file verbatim next to the weights of every Hub folder it
writes, so it imports only torch. It is also the reference every exporter is
validated against: there is no second copy.

How it works, in forward order:

1. The model's own rotary module runs unchanged and returns `(cos, sin)` for its
   RoPE variant (default, linear, llama3, yarn, longrope, dynamic...). Dynamic
   variants update their `inv_freq` here, from the true positions.
2. `LayerScaledRotary` wraps that module. After the call it reads the variant's
   current `inv_freq`, divides it by each distinct layer scale `s` (positions
   become `i / s`), and computes one `(cos, sin)` per distinct scale, keeping the
   variant's attention scaling. Layers that share a scale share the tensors.
3. A forward pre-hook on each decoder layer swaps the model-level
   `position_embeddings` for that layer's own pair.

A layer whose scale is exactly 1.0 keeps the model's own tensors, so a spec of
all ones reproduces the unpatched model bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "LayerScaledRotary", "apply_layer_scales", "resolve_attribute", "rope_attribute", "rope_cos_sin", "unwrapped_rotary"
]


def rope_cos_sin(
    inv_freq: torch.Tensor,
    position_ids: torch.Tensor,
    attention_scaling: float,
    dtype: torch.dtype,
    interleaved: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin exactly as transformers' rotary modules compute them (float32 angles)."""
    freqs = position_ids[..., None].float() * inv_freq.float()
    # Most models rotate halves ([f, f]); a few (Cohere, GLM) rotate adjacent pairs.
    emb = torch.repeat_interleave(freqs, 2, dim=-1) if interleaved else torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * attention_scaling).to(dtype), (emb.sin() * attention_scaling).to(dtype)


class LayerScaledRotary(nn.Module):
    """Wraps a model's rotary module; also yields `(cos, sin)` for `inv_freq / s` per distinct scale."""

    def __init__(self, base: nn.Module, scales_by_type: dict[str | None, list[float]], interleaved: bool):
        super().__init__()
        self.base = base
        self.interleaved = interleaved
        self.scales_by_type = {t: sorted({s for s in scales if s != 1.0}) for t, scales in scales_by_type.items()}
        # Filled by forward, read by the decoder layers' pre-hooks within the same model call.
        self.per_scale: dict[tuple[str | None, float], tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, *args, **kwargs):
        cos_sin = self.base(x, position_ids, *args, **kwargs)
        layer_type = args[0] if args else kwargs.get("layer_type")  # Gemma 3 passes one per call
        inv_freq = rope_attribute(self.base, "inv_freq", layer_type)
        attention_scaling = rope_attribute(self.base, "attention_scaling", layer_type)
        for scale in self.scales_by_type.get(layer_type, []):
            self.per_scale[(layer_type, scale)] = rope_cos_sin(
                inv_freq / scale, position_ids, attention_scaling, cos_sin[0].dtype, self.interleaved
            )
        return cos_sin


def rope_attribute(rotary: nn.Module, name: str, layer_type: str | None = None):
    """`rotary`'s `name` ("inv_freq", "attention_scaling") for `layer_type` (None: a single RoPE).

    Models with one RoPE per layer type (Gemma 3) keep each as `{layer_type}_{name}`. A
    `LayerScaledRotary` answers for the module it wraps: the model's own, unscaled values.
    """
    prefix = "" if layer_type is None else f"{layer_type}_"
    return getattr(unwrapped_rotary(rotary), f"{prefix}{name}")


def unwrapped_rotary(rotary: nn.Module) -> nn.Module:
    """The model's own rotary module, whether or not lpes has wrapped it."""
    return rotary.base if isinstance(rotary, LayerScaledRotary) else rotary


def _layer_hook(rotary: LayerScaledRotary, layer_type: str | None, scale: float):
    def swap_position_embeddings(module, args, kwargs):
        kwargs["position_embeddings"] = rotary.per_scale[(layer_type, scale)]
        return args, kwargs

    return swap_position_embeddings


def resolve_attribute(root: nn.Module, dotted: str) -> nn.Module:
    """`root.a.b` for "a.b" (raises AttributeError where a name is missing)."""
    for name in dotted.split("."):
        root = getattr(root, name)
    return root


def apply_layer_scales(
    model: nn.Module,
    scales: list[float],
    layers_path: str = "model.layers",
    rotary_path: str = "model.rotary_emb",
    layer_types: list[str] | None = None,
    interleaved: bool = False,
) -> nn.Module:
    """Make decoder layer `h` of `model` use `inv_freq / scales[h]`; returns the model.

    `layer_types` names each layer's RoPE type for models with per-layer-type RoPE
    (Gemma 3's `config.layer_types`); None for a single rotary. Applying twice
    replaces the earlier scales.
    """
    layers = resolve_attribute(model, layers_path)
    if len(scales) != len(layers):
        raise ValueError(f"{len(scales)} scales for {len(layers)} decoder layers")
    owner_path, _, attr = rotary_path.rpartition(".")
    owner = resolve_attribute(model, owner_path) if owner_path else model
    base = unwrapped_rotary(getattr(owner, attr))
    types = layer_types or [None] * len(layers)
    scales_by_type: dict[str | None, list[float]] = {}
    for layer_type, scale in zip(types, scales):
        scales_by_type.setdefault(layer_type, []).append(float(scale))
    rotary = LayerScaledRotary(base, scales_by_type, interleaved)
    setattr(owner, attr, rotary)
    for layer, layer_type, scale in zip(layers, types, scales):
        for handle in getattr(layer, "_lpes_hooks", []):
            handle.remove()
        layer._lpes_hooks = []
        if float(scale) != 1.0:
            hook = _layer_hook(rotary, layer_type, float(scale))
            layer._lpes_hooks = [layer.register_forward_pre_hook(hook, with_kwargs=True)]
    return model
