"""Per-layer RoPE caches in an onnxruntime-genai graph.

The builder writes one `cos_cache`/`sin_cache` pair (positions x rotary_dim/2) and
feeds it to every layer's attention node (GroupQueryAttention with `do_rotary`, or
RotaryEmbedding nodes). The kernels take the caches as plain inputs, so LPES only
needs a different pair for each distinct scale:

1. `scaled_caches` computes them with the reference itself (`lpes_rope.LayerScaledRotary`
   around the model's own rotary module): `inv_freq / s` with the variant's attention
   scaling (linear), or YaRN's frequencies and attention factor at factor `s` (a spec's
   `rope_type` yarn). The builder stores only the first half of the `[f, f]` layout.
2. `check_builder_cache` makes sure the builder's own pair equals the model's RoPE
   at scale 1; if the builder computed another variant, scaling it would be wrong.
3. `attach_layer_caches` points each scaled layer's nodes at its scale's pair.
   Layers with scale 1.0 keep the builder's pair untouched.
"""

from __future__ import annotations

import json
import re

import ml_dtypes
import numpy as np
import onnx_ir as ir
import torch

from lpes.converter.lpes_rope import LayerScaledRotary
from lpes.foundation.errors import LpesError

COS_CACHE, SIN_CACHE = "cos_cache", "sin_cache"  # the builder's initializer names
SCALES_METADATA = "lpes.layer_scales"  # model metadata: the scales baked into the graph
_LAYER_NODE = re.compile(r"^/model/layers\.(\d+)/")  # the builder names every node by its layer


def cache_name(kind: str, scale_index: int) -> str:
    """Initializer name of the `kind` ("cos"/"sin") cache of the `scale_index`-th distinct scale."""
    return f"lpes.{kind}_cache.scale_{scale_index}"


def model_cache(rotary: torch.nn.Module, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The unscaled cache as the model's rotary module itself computes it, float32 (length, dim/2)."""
    positions = torch.arange(length)[None]
    with torch.no_grad():
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
    return _half(cos), _half(sin)


def scaled_caches(rotary: torch.nn.Module, scales: list[float], length: int, rope: dict | None = None
                  ) -> dict[float, tuple]:
    """float32 (cos, sin) caches of shape (length, dim/2) for each distinct scale other than 1.0.

    `rope`: the spec's scheme as lpes_rope takes it (None: linear); a static one only.
    """
    positions = torch.arange(length)[None]
    layered = LayerScaledRotary(rotary, {None: list(scales)}, False, rope)
    with torch.no_grad():
        layered(torch.zeros(1, dtype=torch.float32), positions)
    return {scale: (_half(cos), _half(sin)) for (_, scale), (cos, sin) in sorted(layered.per_scale.items())}


def _half(table: torch.Tensor) -> np.ndarray:
    # [f, f] layout: the kernels rebuild the second half from the first.
    table = table[0]
    return table[:, : table.shape[-1] // 2].numpy()


def builder_caches(model: ir.Model) -> tuple[ir.Value, ir.Value]:
    """The builder's cos/sin cache initializers; LpesError if the graph has none."""
    inits = model.graph.initializers
    if COS_CACHE not in inits or SIN_CACHE not in inits:
        raise LpesError(
            "the onnxruntime-genai graph has no cos_cache/sin_cache initializers; "
            "lpes cannot give its layers their own RoPE"
        )
    return inits[COS_CACHE], inits[SIN_CACHE]


def check_builder_cache(model: ir.Model, expected: tuple[np.ndarray, np.ndarray], rope_type: str) -> None:
    """Fail unless the builder's cache is the model's own RoPE at scale 1 (in the cache's dtype)."""
    for value, want in zip(builder_caches(model), expected, strict=True):
        got = value.const_value.numpy()
        want = want.astype(got.dtype)
        if got.shape != want.shape:
            raise LpesError(
                f"onnxruntime-genai's {value.name} has shape {list(got.shape)}, "
                f"the model's RoPE gives {list(want.shape)}; --to genai cannot scale it"
            )
        worst = float(np.abs(got.astype(np.float32) - want.astype(np.float32)).max())
        # Both sides round the same float32 angles, so they agree to a unit or two of the cache dtype.
        if worst > 2 * float(ml_dtypes.finfo(got.dtype).eps):
            raise LpesError(
                f"onnxruntime-genai's builder computed a {value.name} that is not the model's own "
                f"{rope_type!r} RoPE (max difference {worst:.3g}); --to genai cannot reproduce this model"
            )


def attach_layer_caches(model: ir.Model, scales: list[float], caches: dict[float, tuple]) -> None:
    """Make layer h's attention read the caches of `scales[h]`; shared between equal scales."""
    cos_value, sin_value = builder_caches(model)
    users = {kind: _layer_users(value, len(scales)) for kind, value in (("cos", cos_value), ("sin", sin_value))}
    index = {scale: i for i, scale in enumerate(sorted(caches))}
    for kind, builder_value, column in (("cos", cos_value, 0), ("sin", sin_value, 1)):
        dtype = builder_value.const_value.dtype
        new_values = {
            scale: _initializer(model.graph, cache_name(kind, index[scale]), caches[scale][column], dtype)
            for scale in caches
        }
        for layer, uses in users[kind].items():
            if scales[layer] != 1.0:
                for node, input_index in uses:
                    node.replace_input_with(input_index, new_values[scales[layer]])
        if not builder_value.uses():  # every layer scaled: the builder's pair is dead weight
            model.graph.initializers.pop(builder_value.name)
    model.metadata_props[SCALES_METADATA] = json.dumps(list(scales))


def _layer_users(value: ir.Value, num_layers: int) -> dict[int, list[tuple[ir.Node, int]]]:
    """Layer -> (node, input index) reading `value`; every reader must sit in a decoder layer."""
    by_layer: dict[int, list[tuple[ir.Node, int]]] = {}
    for node, input_index in value.uses():
        match = _LAYER_NODE.match(node.name or "")
        if match is None or int(match.group(1)) >= num_layers:
            raise LpesError(
                f"{value.name} is read by {node.name or node.op_type!r}, outside the decoder layers; "
                "lpes does not know this onnxruntime-genai graph layout"
            )
        by_layer.setdefault(int(match.group(1)), []).append((node, input_index))
    missing = sorted(set(range(num_layers)) - set(by_layer))
    if missing:
        raise LpesError(f"no attention node of layer(s) {missing} reads {value.name}; unknown graph layout")
    return by_layer


def _initializer(graph: ir.Graph, name: str, array: np.ndarray, dtype: ir.DataType) -> ir.Value:
    array = np.ascontiguousarray(array.astype(dtype.numpy()))
    tensor = ir.Tensor(array, dtype=dtype, name=name)
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(dtype), const_value=tensor)
    graph.register_initializer(value)
    return value
