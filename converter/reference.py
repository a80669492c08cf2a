"""The reference: a loaded transformers model running LPES through `lpes_rope`."""

from __future__ import annotations

import torch
from torch import nn

from lpes.converter import lpes_rope
from lpes.converter.architectures import architecture_for
from lpes.errors import LpesError
from lpes.spec import Spec


def apply(model: nn.Module, spec: Spec) -> nn.Module:
    """Make each decoder layer of `model` use `inv_freq / s_h`; returns the same model."""
    config = model.config
    arch = architecture_for(config)
    spec = spec.for_layers(config.num_hidden_layers)
    kwargs = arch.patch_kwargs(config)
    try:
        rotary = lpes_rope.resolve_attribute(model, kwargs["rotary_path"])
    except AttributeError:
        raise LpesError(
            f"{type(model).__name__} has no model-level rotary module at {kwargs['rotary_path']}; "
            "add its layout to lpes/converter/architectures.py"
        ) from None
    if not isinstance(rotary, lpes_rope.LayerScaledRotary):  # checked when first wrapped; search swaps often
        _check_rope_layout(rotary, kwargs["layer_types"], kwargs["interleaved"], config.model_type)
    return lpes_rope.apply_layer_scales(model, list(spec.scales), **kwargs)


def check_layout(config) -> None:
    """Fail before any heavy work if lpes cannot find the layers and rotary module of this architecture.

    Builds the model on the meta device: structure only, no memory, no weights.
    """
    from transformers import AutoModelForCausalLM

    kwargs = architecture_for(config).patch_kwargs(config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    for what in ("layers_path", "rotary_path"):
        try:
            lpes_rope.resolve_attribute(model, kwargs[what])
        except AttributeError:
            raise LpesError(
                f"{type(model).__name__} has no {kwargs[what]} (its {what.split('_')[0]}); "
                "add its layout to lpes/converter/architectures.py"
            ) from None


def _check_rope_layout(rotary: nn.Module, layer_types, interleaved: bool, model_type: str) -> None:
    """Fail loudly if lpes would compute cos/sin differently from the model itself."""
    for layer_type in sorted(set(layer_types or [None]), key=str):
        args = () if layer_type is None else (layer_type,)
        # On inv_freq's device: a model on a GPU computes there, and CPU positions could not meet it.
        device = lpes_rope.rope_attribute(rotary, "inv_freq", layer_type).device
        positions = torch.arange(8, device=device)[None]
        probe = torch.zeros(1, dtype=torch.float32, device=device)
        with torch.no_grad():
            cos, _ = rotary(probe, positions, *args)
            # Read after the call: dynamic variants update inv_freq there.
            inv_freq = lpes_rope.rope_attribute(rotary, "inv_freq", layer_type)
            scaling = lpes_rope.rope_attribute(rotary, "attention_scaling", layer_type)
            ours, _ = lpes_rope.rope_cos_sin(inv_freq, positions, scaling, cos.dtype, interleaved)
        if ours.shape != cos.shape or not torch.equal(ours, cos):
            raise LpesError(
                f"lpes does not reproduce {model_type!r}'s RoPE layout; add an entry to lpes/converter/architectures.py"
            )
