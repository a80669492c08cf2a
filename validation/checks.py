"""What validation can afford on this machine, and the check that needs no weights.

Validation runs, by default, what the model, the machine and the inputs allow:

- `rope` (always, any model size, milliseconds): every layer's cos/sin, as the
  written folder's config and `lpes_rope` compute them, against an independent
  float64 computation of RoPE at positions i / s_h from the model's own inv_freq.
  Layers at scale 1 must reproduce the model's own cos/sin bit for bit.
- `kv` (key-value accuracy by position for every variant): when there is a
  tokenizer, the weights fit in memory, and the estimated time fits the budget.
  The estimate counts the forward tokens of every variant (2 x parameters FLOPs
  per token, plus attention) against a matmul rate measured on the device.

A skipped check says why and which command runs it elsewhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from lpes.converter import lpes_rope
from lpes.converter.architectures import architecture_for
from lpes.spec import Spec

# Share of the available memory the weights (in the reference dtype) may take: the
# torch variants and each export hold one copy at a time, plus activations.
MEMORY_SHARE = 0.6
# Sustained share of the measured matmul rate a decoder forward reaches (attention, norms,
# small batches): conservative, so an estimate errs towards "too slow" rather than hours.
EFFICIENCY = 0.3


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "passed", "failed" or "skipped"
    detail: str

    @property
    def passed(self) -> bool:
        return self.status != "failed"

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}

    def line(self) -> str:
        return f"{self.name}: {self.status} ({self.detail})"


# ---- the check that needs no weights ----


def rope_check(config, spec: Spec, positions: int) -> Check:
    """Each layer's cos/sin for positions in 0..positions-1 against float64 RoPE at i / s_h."""
    arch = architecture_for(config)
    kwargs = arch.patch_kwargs(config)
    try:
        base = _rotary_module(config, kwargs["rotary_path"])
    except (TypeError, ValueError, AttributeError) as err:
        return Check("rope", "skipped", f"cannot rebuild the model's rotary module alone: {err}")
    layer_types = kwargs["layer_types"] or [None] * len(spec.scales)
    scales_by_type: dict[str | None, list[float]] = {}
    for layer_type, scale in zip(layer_types, spec.scales):
        scales_by_type.setdefault(layer_type, []).append(scale)
    rotary = lpes_rope.LayerScaledRotary(base, scales_by_type, kwargs["interleaved"])
    # Every position of the first 512, then 1024 spread to the last: the far angles are where an
    # error shows, and a sample keeps memory small (a 128k-position table per scale is gigabytes).
    ids = torch.unique(torch.cat([torch.arange(min(positions, 512)), torch.linspace(0, positions - 1, 1024).long()]))
    ids = ids[None]
    own_by_type = {}
    for layer_type in dict.fromkeys(layer_types):  # one call per RoPE type computes every distinct scale
        with torch.no_grad():
            own_by_type[layer_type] = rotary(torch.zeros(1), ids, *(() if layer_type is None else (layer_type,)))
    worst = 0.0
    for layer, (layer_type, scale) in enumerate(zip(layer_types, spec.scales)):
        own = own_by_type[layer_type]
        got = own if scale == 1.0 else rotary.per_scale[(layer_type, scale)]
        expected, bound = _float64_rope(rotary, layer_type, scale, ids, kwargs["interleaved"])
        if scale == 1.0 and not all(torch.equal(a, b) for a, b in zip(got, own)):
            return Check("rope", "failed", f"layer {layer} (scale 1) differs from the model's own RoPE")
        error = max(float((g.double() - e).abs().max()) for g, e in zip(got, expected))
        if error > bound:
            return Check("rope", "failed", f"layer {layer}: cos/sin off by {error:.2e} (allowed {bound:.2e})")
        worst = max(worst, error)
    detail = f"{len(spec.scales)} layers, positions up to {positions - 1}, max error {worst:.1e}"
    return Check("rope", "passed", detail)


def _rotary_module(config, rotary_path: str) -> torch.nn.Module:
    """The model's own rotary class, built alone on the CPU from the config it was made with."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    rotary = lpes_rope.resolve_attribute(meta, rotary_path)
    return type(rotary)(rotary.config)


def _float64_rope(rotary, layer_type, scale: float, ids: torch.Tensor, interleaved: bool):
    inv_freq = lpes_rope.rope_attribute(rotary, "inv_freq", layer_type).double() / scale
    scaling = float(lpes_rope.rope_attribute(rotary, "attention_scaling", layer_type))
    angles = ids[..., None].double() * inv_freq
    emb = torch.repeat_interleave(angles, 2, dim=-1) if interleaved else torch.cat((angles, angles), dim=-1)
    # transformers forms the angles in float32: an error of a few ulps of the largest angle.
    bound = 4 * float(angles.abs().max()) * 2.0**-24 * max(scaling, 1.0) + 1e-6
    return (emb.cos() * scaling, emb.sin() * scaling), bound


# ---- what this machine can afford ----


def matmul_rate(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of a 512x512 matmul on `device` in `dtype`, measured (about 50 ms)."""
    a = torch.randn(512, 512, device=device).to(dtype)
    for _ in range(2):
        a @ a
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.05:
        a @ a
        runs += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 2 * 512**3 * runs / (time.perf_counter() - start)


def forward_flops(params: int, config, lengths: list[int]) -> float:
    """FLOPs of one forward over prompts of these lengths: 2 x params per token, plus attention."""
    hidden = getattr(config, "hidden_size", 0) or 0
    layers = config.num_hidden_layers
    return float(sum(2 * params * n + 2 * layers * hidden * n * n for n in lengths))


def format_bytes(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def format_seconds(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    return f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"
