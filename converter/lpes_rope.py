"""Per-layer RoPE scaling (LPES): the one implementation.

lpes-convert copies this file verbatim next to the weights of every Hub folder it
writes, so it imports only torch and transformers. It is also the reference every
exporter is validated against: there is no second copy.

A layer's scale `s` is applied through a scheme (`rope`, config.json's "lpes" -> "rope"):

- `linear` (the default): `inv_freq / s` on top of the model's own RoPE variant, its
  attention scaling kept.
- `yarn`, `dynamic`: transformers' own YaRN (NTK-by-parts ramp and attention factor) or
  dynamic NTK at factor `s`, computed by transformers' RoPE init function
  (`ROPE_INIT_FUNCTIONS`) from a config copy of that layer's own, so a curve with one
  factor everywhere is exactly the stock `rope_parameters` of that type. Dynamic NTK
  follows the true sequence length of every call (`max(position_ids) + 1`) in each
  layer, as a freshly loaded stock model does; it keeps no state between calls.

How it works, in forward order:

1. The model's own rotary module runs unchanged and returns `(cos, sin)` for its
   RoPE variant (default, linear, llama3, yarn, longrope, dynamic...). Dynamic
   variants update their `inv_freq` here, from the true positions.
2. `LayerScaledRotary` wraps that module. After the call it computes one
   `(cos, sin)` per distinct layer scale `s`: from the variant's current
   `inv_freq / s` (linear), or from the scheme's own frequencies and attention
   factor at `s`. Layers that share a scale share the tensors.
3. A forward pre-hook on each decoder layer swaps the model-level
   `position_embeddings` for that layer's own pair.

A layer whose scale is exactly 1.0 keeps the model's own tensors under `linear` and
`yarn` (YaRN at factor 1 is plain RoPE), so a spec of all ones reproduces the
unpatched model bit for bit. Under `dynamic` a factor of 1 still moves the base past
the trained length, so every layer gets the scheme's frequencies.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = [
    "SCHEMES", "LayerRope", "LayerScaledRotary", "apply_layer_scales", "resolve_attribute", "rope_attribute",
    "rope_cos_sin", "scheme_rope_parameters", "unwrapped_rotary",
]

# Scheme -> the rope_parameters keys it takes besides the factor (None values are left out).
SCHEMES = {"linear": (), "yarn": ("beta_fast", "beta_slow", "original_max_position_embeddings"), "dynamic": ()}


def rope_cos_sin(
    inv_freq: torch.Tensor,
    position_ids: torch.Tensor,
    attention_scaling: float,
    dtype: torch.dtype,
    interleaved: bool = False,
    angle_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin exactly as transformers' rotary modules compute them (float32 angles; float64 only where a
    float64 gradient check asks for it)."""
    freqs = position_ids[..., None].to(angle_dtype) * inv_freq.to(angle_dtype)
    # Most models rotate halves ([f, f]); a few (Cohere, GLM) rotate adjacent pairs.
    emb = torch.repeat_interleave(freqs, 2, dim=-1) if interleaved else torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * attention_scaling).to(dtype), (emb.sin() * attention_scaling).to(dtype)


def scheme_rope_parameters(own: dict, max_position_embeddings: int, rope: dict, factor: float) -> dict:
    """The rope_parameters of transformers' `rope["rope_type"]` RoPE at `factor` on the model's own plain RoPE.

    Its theta and partial rotary are kept; YaRN's ramp is placed by
    `original_max_position_embeddings` (default: the model's trained length). This is what a
    config.json says for that RoPE, and what each layer's own config copy gets.
    """
    rope_type = rope["rope_type"]
    parameters = {**own, "rope_type": rope_type, "factor": float(factor)}
    if rope_type == "yarn":
        parameters["original_max_position_embeddings"] = (
            rope.get("original_max_position_embeddings") or max_position_embeddings
        )
    for key in SCHEMES[rope_type]:
        if key != "original_max_position_embeddings" and rope.get(key) is not None:
            parameters[key] = rope[key]
    return parameters


class LayerRope:
    """One factor of a scheme: transformers' init function on a config copy that belongs to it alone.

    Every LayerRope deep-copies the config it is given, so no two factors ever share one
    object (a shared config would hand every layer the factor written last).
    """

    def __init__(self, config, rope_parameters: dict):
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        self.config = copy.deepcopy(config)
        self.config.rope_parameters = copy.deepcopy(rope_parameters)
        if getattr(self.config, "head_dim", 0) is None:  # Mixtral says None; transformers' yarn/dynamic read it
            self.config.head_dim = self.config.hidden_size // self.config.num_attention_heads
        self.rope_type = rope_parameters["rope_type"]
        self.init = ROPE_INIT_FUNCTIONS[self.rope_type]
        self._static: dict[torch.device, tuple[torch.Tensor, float]] = {}  # device -> what init computes

    @property
    def factor(self) -> float:
        return self.config.rope_parameters["factor"]

    def frequencies(self, position_ids: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, float]:
        """(inv_freq, attention_scaling) for a call at `position_ids`, as transformers' rotary module has them."""
        if device not in self._static:  # what the module computes at init (for dynamic: at the trained length)
            self._static[device] = self.init(self.config, device)
        inv_freq, scaling = self._static[device]
        if self.rope_type == "dynamic":
            # transformers grows the base once the sequence passes the trained length; computed
            # for every call from this call's positions (in-graph when traced), no state kept.
            seq_len = torch.max(position_ids) + 1
            grown, _ = self.init(self.config, device, seq_len=seq_len)
            inv_freq = torch.where(seq_len > self.config.max_position_embeddings, grown, inv_freq)
        return inv_freq, scaling


class DifferentiableYarn:
    """transformers' YaRN as a function of a factor tensor that autograd follows (lpes-search --optimizer gradient).

    YaRN's `inv_freq` is `ext * keep + ext / f * (1 - keep)`: its NTK-by-parts ramp `keep` does not
    depend on the factor f. Both `ext` and `keep` are read off transformers' own init function (at
    factors 1 and 2), so the frequencies are transformers' at every f; the attention factor is its
    `yarn_get_mscale` (0.1 ln f + 1 above 1), or the ratio of two of them, or the configured constant.
    """

    def __init__(self, config, own: dict, rope: dict):
        at = {f: LayerRope(config, scheme_rope_parameters(own, config.max_position_embeddings, rope, f))
              for f in (1.0, 2.0)}
        self.config = at[1.0].config
        self._at = at
        self._tensors: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _ext_keep(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._tensors:
            ext, _ = self._at[1.0].init(self._at[1.0].config, device)
            at_two, _ = self._at[2.0].init(self._at[2.0].config, device)
            self._tensors[device] = ext, 2 * at_two / ext - 1  # at f = 2: ext * (keep + (1 - keep) / 2)
        return self._tensors[device]

    def frequencies(self, factor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(inv_freq, attention factor) at `factor` (a 0-d tensor), both in the graph."""
        ext, keep = self._ext_keep(factor.device)
        inv_freq = ext.to(factor.dtype) * (keep.to(factor.dtype) + (1 - keep.to(factor.dtype)) / factor)
        parameters = self.config.rope_parameters
        if parameters.get("attention_factor") is not None:
            return inv_freq, torch.as_tensor(float(parameters["attention_factor"]), dtype=factor.dtype)
        mscale, mscale_all_dim = parameters.get("mscale"), parameters.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            return inv_freq, _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        return inv_freq, _yarn_mscale(factor)


def _yarn_mscale(factor: torch.Tensor, mscale: float = 1.0) -> torch.Tensor:
    """transformers' `yarn_get_mscale` on a tensor: 1 up to factor 1, then 0.1 * mscale * ln(factor) + 1."""
    return torch.where(factor <= 1, torch.ones_like(factor), 0.1 * mscale * torch.log(factor.clamp_min(1)) + 1)


class LayerScaledRotary(nn.Module):
    """Wraps a model's rotary module; also yields each distinct scale's `(cos, sin)` under the scheme `rope`."""

    def __init__(self, base: nn.Module, scales_by_type: dict[str | None, list[float]], interleaved: bool,
                 rope: dict | None = None, config=None, layer_scales: torch.Tensor | None = None,
                 layer_types: list[str | None] | None = None):
        """`layer_scales` (linear or yarn): one scale per layer as a tensor that autograd follows (lpes-search
        --optimizer gradient); every layer then gets its own (cos, sin), at 1.0 too, in `per_layer`."""
        super().__init__()
        self.base = base
        self.layer_scales = layer_scales
        self.layer_types = list(layer_types or [])
        self.interleaved = interleaved
        self.rope = dict(rope or {"rope_type": "linear"})
        rope_type = self.rope["rope_type"]
        if rope_type not in SCHEMES:
            raise ValueError(f"unknown LPES rope_type {rope_type!r} (known: {', '.join(SCHEMES)})")
        self.keeps_own_rope = rope_type != "dynamic"  # scale 1 is the model's own RoPE
        self.scales_by_type = {
            t: sorted({float(s) for s in scales if not (self.keeps_own_rope and s == 1.0)})
            for t, scales in scales_by_type.items()
        }
        # (layer type, scale) -> its own LayerRope (yarn, dynamic); linear divides the model's inv_freq.
        self.layer_ropes: dict[tuple[str | None, float], LayerRope] = {}
        if rope_type != "linear":
            config = config if config is not None else base.config
            own = dict(config.rope_parameters)
            for layer_type, scales in self.scales_by_type.items():
                for scale in scales:
                    parameters = scheme_rope_parameters(own, config.max_position_embeddings, self.rope, scale)
                    self.layer_ropes[(layer_type, scale)] = LayerRope(config, parameters)
        if layer_scales is not None and rope_type == "dynamic":
            raise ValueError("differentiable layer scales are for the linear and yarn schemes only")
        self.yarn: DifferentiableYarn | None = None
        if layer_scales is not None and rope_type == "yarn":
            config = config if config is not None else base.config
            self.yarn = DifferentiableYarn(config, dict(config.rope_parameters), self.rope)
        # Filled by forward, read by the decoder layers' pre-hooks within the same model call.
        self.per_scale: dict[tuple[str | None, float], tuple[torch.Tensor, torch.Tensor]] = {}
        self.per_layer: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def uses_own_rope(self, layer_type: str | None, scale: float) -> bool:
        """Whether a layer at `scale` keeps the model's own (cos, sin)."""
        return float(scale) not in self.scales_by_type.get(layer_type, [])

    def frequencies(self, layer_type: str | None, scale: float, position_ids: torch.Tensor):
        """(inv_freq, attention_scaling) of a layer at `scale` for a call at `position_ids`."""
        inv_freq = rope_attribute(self.base, "inv_freq", layer_type)
        if self.rope["rope_type"] == "linear":
            return inv_freq / scale, rope_attribute(self.base, "attention_scaling", layer_type)
        return self.layer_ropes[(layer_type, float(scale))].frequencies(position_ids, inv_freq.device)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, *args, **kwargs):
        cos_sin = self.base(x, position_ids, *args, **kwargs)
        layer_type = args[0] if args else kwargs.get("layer_type")  # Gemma 3 passes one per call
        for scale in self.scales_by_type.get(layer_type, []):
            inv_freq, attention_scaling = self.frequencies(layer_type, scale, position_ids)
            self.per_scale[(layer_type, scale)] = rope_cos_sin(
                inv_freq, position_ids, attention_scaling, cos_sin[0].dtype, self.interleaved
            )
        if self.layer_scales is not None:
            self._differentiable(layer_type, position_ids, cos_sin[0].dtype)
        return cos_sin

    def _differentiable(self, layer_type: str | None, position_ids: torch.Tensor, dtype: torch.dtype) -> None:
        """Each layer's (cos, sin) from `inv_freq / layer_scales[h]`, in the graph autograd differentiates."""
        inv_freq = rope_attribute(self.base, "inv_freq", layer_type)
        scaling = rope_attribute(self.base, "attention_scaling", layer_type)
        angles = torch.promote_types(self.layer_scales.dtype, torch.float32)  # float64 for a gradient check
        for h, own_type in enumerate(self.layer_types):
            if own_type != layer_type:
                continue
            if self.yarn is not None:
                layer_inv_freq, layer_scaling = self.yarn.frequencies(self.layer_scales[h])
            else:
                layer_inv_freq, layer_scaling = inv_freq / self.layer_scales[h], scaling
            self.per_layer[h] = rope_cos_sin(layer_inv_freq, position_ids, layer_scaling, dtype, self.interleaved,
                                             angles)


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


def _differentiable_layer_hook(rotary: LayerScaledRotary, layer: int):
    def swap_position_embeddings(module, args, kwargs):
        kwargs["position_embeddings"] = rotary.per_layer[layer]
        return args, kwargs

    return swap_position_embeddings


def resolve_attribute(root: nn.Module, dotted: str) -> nn.Module:
    """`root.a.b` for "a.b" (raises AttributeError where a name is missing)."""
    for name in dotted.split("."):
        root = getattr(root, name)
    return root


def apply_layer_scales(
    model: nn.Module,
    scales: list[float] | torch.Tensor,
    layers_path: str = "model.layers",
    rotary_path: str = "model.rotary_emb",
    layer_types: list[str] | None = None,
    interleaved: bool = False,
    rope: dict | None = None,
) -> nn.Module:
    """Make decoder layer `h` of `model` use scale `scales[h]` under the scheme `rope`; returns the model.

    `rope` None is `{"rope_type": "linear"}` (`inv_freq / scales[h]`); `{"rope_type": "yarn"}`
    (optionally with beta_fast, beta_slow, original_max_position_embeddings) or
    `{"rope_type": "dynamic"}` give layer h transformers' RoPE of that type at factor
    scales[h]. `layer_types` names each layer's RoPE type for models with per-layer-type RoPE
    (Gemma 3's `config.layer_types`); None for a single rotary. Applying twice replaces the
    earlier scales. A 1-D tensor of `scales` (linear or yarn) is differentiable: autograd reaches each
    layer's scale through its (cos, sin), for lpes-search --optimizer gradient.
    """
    layers = resolve_attribute(model, layers_path)
    differentiable = isinstance(scales, torch.Tensor)
    if len(scales) != len(layers):
        raise ValueError(f"{len(scales)} scales for {len(layers)} decoder layers")
    owner_path, _, attr = rotary_path.rpartition(".")
    owner = resolve_attribute(model, owner_path) if owner_path else model
    base = unwrapped_rotary(getattr(owner, attr))
    types = layer_types or [None] * len(layers)
    scales_by_type: dict[str | None, list[float]] = {}
    for layer_type, scale in zip(types, [] if differentiable else scales):
        scales_by_type.setdefault(layer_type, []).append(float(scale))
    config = getattr(base, "config", None)
    config = config if config is not None else getattr(model, "config", None)
    rotary = LayerScaledRotary(base, scales_by_type, interleaved, rope, config,
                               layer_scales=scales if differentiable else None, layer_types=types)
    setattr(owner, attr, rotary)
    for h, (layer, layer_type) in enumerate(zip(layers, types)):
        for handle in getattr(layer, "_lpes_hooks", []):
            handle.remove()
        layer._lpes_hooks = []
        if differentiable:
            layer._lpes_hooks = [layer.register_forward_pre_hook(_differentiable_layer_hook(rotary, h),
                                                                 with_kwargs=True)]
            continue
        scale = scales[h]
        if not rotary.uses_own_rope(layer_type, scale):
            hook = _layer_hook(rotary, layer_type, float(scale))
            layer._lpes_hooks = [layer.register_forward_pre_hook(hook, with_kwargs=True)]
    return model
