"""The reference: a loaded transformers model running LPES through `lpes_rope`, or a stock RoPE baseline.

`apply` gives each decoder layer its own scale, applied through the spec's scheme (linear
`inv_freq / s_h`, or transformers' YaRN / dynamic NTK at factor s_h); `use_stock_rope` puts
every layer on one of transformers' own length-extension RoPE types (YaRN, dynamic NTK)
instead, the baselines a curve is held against. Either replaces what the other did, on the
same loaded weights.
"""

from __future__ import annotations

import copy
import weakref

import torch
from huggingface_hub.errors import StrictDataclassError
from torch import nn

from lpes.converter import lpes_rope
from lpes.converter.architectures import architecture_for
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import LINEAR_ROPE, RopeScheme, Spec, StockRope

# model -> its own rotary module, while a stock RoPE stands in for it (kept off the module tree).
_OWN_ROTARY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def apply(model: nn.Module, spec: Spec) -> nn.Module:
    """Make each decoder layer of `model` use `inv_freq / s_h`; returns the same model."""
    config = model.config
    spec = spec.for_layers(config.num_hidden_layers)
    kwargs = _patch_kwargs(model)
    check_rope_scheme(config, spec.rope)
    rope = None if spec.rope.linear else spec.rope.for_lpes_rope()
    return lpes_rope.apply_layer_scales(model, list(spec.scales), rope=rope, **kwargs)


def apply_differentiable(model: nn.Module, scales: torch.Tensor, rope: RopeScheme = LINEAR_ROPE) -> nn.Module:
    """Each decoder layer at `inv_freq / scales[h]` (linear) or transformers' YaRN at factor `scales[h]`, with
    autograd following `scales` into the model's loss: what lpes-search --optimizer gradient descends.
    Re-apply after each change of `scales`."""
    if scales.shape != (model.config.num_hidden_layers,):
        raise ValueError(f"{tuple(scales.shape)} scales for {model.config.num_hidden_layers} decoder layers")
    kwargs = _patch_kwargs(model)
    check_rope_scheme(model.config, rope)
    return lpes_rope.apply_layer_scales(model, scales, rope=None if rope.linear else rope.for_lpes_rope(), **kwargs)


def _patch_kwargs(model: nn.Module) -> dict:
    """Where `model`'s layers and rotary are, with its own rotary back in place and its layout checked."""
    config = model.config
    kwargs = architecture_for(config).patch_kwargs(config)
    _restore_own_rotary(model, kwargs["rotary_path"])
    try:
        rotary = lpes_rope.resolve_attribute(model, kwargs["rotary_path"])
    except AttributeError:
        raise LpesError(
            f"{type(model).__name__} has no model-level rotary module at {kwargs['rotary_path']}; "
            "add its layout to converter/architectures.py"
        ) from None
    if not isinstance(rotary, lpes_rope.LayerScaledRotary):  # checked when first wrapped; search swaps often
        _check_rope_layout(rotary, kwargs["layer_types"], kwargs["interleaved"], config.model_type)
    return kwargs


def check_rope_scheme(config, rope: RopeScheme) -> None:
    """LpesError (one line) unless every layer of this model can take transformers' `rope.rope_type` RoPE."""
    if rope.linear:
        return
    why = stock_rope_unsupported(config, rope.rope_type)
    if why:
        raise LpesError(f"per-layer {rope.name} (rope_type {rope.rope_type!r}) cannot run on this model: {why}")


def stock_rope_unsupported(config, rope_type: str) -> str | None:
    """Why the stock `rope_type` cannot stand in for this model's RoPE; None when it can."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    own = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if architecture_for(config).per_layer_type_rope:
        return f"{config.model_type} has one RoPE per layer type; the stock baselines are for a single RoPE"
    if own != "default":
        return f"its own RoPE is {own!r}; the stock baselines replace plain (default) RoPE only"
    if not getattr(config, "max_position_embeddings", None):
        return "its config gives no max_position_embeddings, the length the stock types extend"
    try:
        stock = _stock_config(config, StockRope(rope_type, 2.0))  # the factor does not decide whether it is taken
    except (ValueError, TypeError, KeyError, StrictDataclassError) as err:  # the config class's own validation
        return f"transformers' {type(config).__name__} refuses rope_type {rope_type!r} ({_last_line(err)})"
    try:  # what the rotary module will compute, past the trained length (a head of 2 rotated dims breaks NTK)
        ROPE_INIT_FUNCTIONS[rope_type](stock, "cpu", seq_len=2 * config.max_position_embeddings)
    except (ArithmeticError, ValueError, TypeError, KeyError) as err:
        return f"transformers' {rope_type} RoPE fails on this config ({type(err).__name__}: {_last_line(err)})"
    return None


def baseline_rope_parameters(config, rope: StockRope, scheme: RopeScheme | None = None) -> dict:
    """`rope_parameters` as a config.json sets them for `rope` on this model (its theta and partial rotary kept).

    `scheme` (of the same type) adds its parameters (YaRN's betas and original length): the
    stock RoPE that a per-layer curve of that scheme is where every layer has `rope.factor`.
    """
    own = scheme.for_lpes_rope() if scheme is not None and scheme.rope_type == rope.rope_type else {}
    return lpes_rope.scheme_rope_parameters(dict(config.rope_parameters), config.max_position_embeddings,
                                            {**own, "rope_type": rope.rope_type}, rope.factor)


def use_stock_rope(model: nn.Module, rope: StockRope | None) -> nn.Module:
    """Every layer on transformers' own `rope.rope_type` RoPE at `rope.factor`; None: the model's own RoPE again.

    The model's rotary class is built anew from its config with `baseline_rope_parameters`,
    which is what loading a config.json with them gives. LPES scales are removed first. A
    length-dependent type (dynamic NTK) starts afresh with every sequence (position 0), as a
    newly loaded model would: transformers' module otherwise keeps the longest length it met.
    """
    config = model.config
    rotary_path = architecture_for(config).patch_kwargs(config)["rotary_path"]
    apply(model, Spec.from_scales([1.0] * config.num_hidden_layers))  # no LPES hooks, the model's own rotary
    if rope is None:
        return model
    why = stock_rope_unsupported(config, rope.rope_type)
    if why:
        raise LpesError(f"no {rope.name} baseline for this model: {why}")
    owner, attr = _rotary_owner(model, rotary_path)
    own = lpes_rope.unwrapped_rotary(getattr(owner, attr))
    stock = type(own)(_stock_config(config, rope)).to(own.inv_freq.device)
    if rope.length_dependent:
        stock.register_forward_pre_hook(_fresh_for_each_sequence, with_kwargs=True)
    setattr(owner, attr, stock)
    _OWN_ROTARY[model] = own
    return model


def stock_rotary(config, rotary_class: type[nn.Module], rope: StockRope, scheme: RopeScheme | None = None):
    """transformers' own `rotary_class` built from the config.json that sets `rope` (with `scheme`'s parameters)."""
    return rotary_class(_stock_config(config, rope, scheme))


def _stock_config(config, rope: StockRope, scheme: RopeScheme | None = None):
    stock = copy.deepcopy(config)
    stock.rope_parameters = baseline_rope_parameters(config, rope, scheme)
    if getattr(stock, "head_dim", 0) is None:  # Mixtral's config says None; transformers' yarn/dynamic read it as is
        stock.head_dim = config.hidden_size // config.num_attention_heads
    # transformers' own checks, as when a config.json with them is loaded (5.0 has only validate_rope)
    (getattr(stock, "validate", None) or stock.validate_rope)()
    return stock


def _last_line(err: BaseException) -> str:
    """The error's last non-empty line (a StrictDataclassError ends with the cause), cut short."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return (lines[-1] if lines else type(err).__name__)[:200]


def _fresh_for_each_sequence(rotary: nn.Module, args: tuple, kwargs: dict) -> None:
    position_ids = kwargs["position_ids"] if "position_ids" in kwargs else args[1]
    if bool((position_ids == 0).any()):  # a prefill (a decode step continues from its prompt)
        rotary.register_buffer("inv_freq", rotary.original_inv_freq.clone(), persistent=False)
        rotary.max_seq_len_cached = rotary.original_max_seq_len


def _rotary_owner(model: nn.Module, rotary_path: str) -> tuple[nn.Module, str]:
    owner_path, _, attr = rotary_path.rpartition(".")
    return (lpes_rope.resolve_attribute(model, owner_path) if owner_path else model), attr


def _restore_own_rotary(model: nn.Module, rotary_path: str) -> None:
    own = _OWN_ROTARY.pop(model, None)
    if own is not None:
        owner, attr = _rotary_owner(model, rotary_path)
        setattr(owner, attr, own)


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
                "add its layout to converter/architectures.py"
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
                f"lpes does not reproduce {model_type!r}'s RoPE layout; add an entry to converter/architectures.py"
            )
