"""ONNX export of an LPES model: one graph with a KV cache, runnable by stock onnxruntime.

In order:

1. Check everything that can fail cheaply (dtype, layer count, RoPE variant) before
   loading a single weight.
2. Load the model, patch it with the reference (`converter.reference.apply`), so the
   exported graph is the reference by construction, and wrap it so the KV cache goes
   in and out as flat tensors (`FlatKVCausalLM`).
3. `torch.onnx.export(dynamo=True)` traces it with dynamic batch, sequence and past
   length. A layer's frequencies (`inv_freq / s`, or YaRN's at factor s) depend on no
   input, so the ONNX optimizer folds them into one constant per distinct scale; those
   constants are renamed `lpes.inv_freq.scale_<s>` so the baked-in scales can be read off
   the graph. Per-layer dynamic NTK computes its base from `max(position_ids) + 1` in the
   graph (transformers' own function, traced), its trained-length frequencies a constant.
4. Make the graph portable and fast: drop what torch records about the exporting process
   (per-node stack traces, module paths, the exporter's signature: absolute paths of this
   machine), and rewrite, exactly, two patterns onnxruntime's own graph optimizer cannot
   fuse as torch.onnx writes them: RMSNorm's `x * Reciprocal(Sqrt(v))` becomes `x / Sqrt(v)`
   (fused into one `SimplifiedLayerNormalization` kernel at session start) and attention's
   key transpose through rank 3 becomes one Transpose (folded into the MatMul). The file
   keeps standard ONNX ops only (no contrib ops of onnxruntime's offline transformer
   optimizer), so TensorRT and other runtimes read the same graph.
5. Write `model.onnx` (weights in `model.onnx_data` above 2 GB), the model's config,
   generation config and tokenizer files, the spec (`lpes_spec.json`) and what made
   the graph (`lpes_onnx.json`).

Why torch.onnx and not transformers' exporter: transformers 5 ships none of its own
(optimum's is a separate package with its own model patches); torch.onnx(dynamo=True)
traces the patched model as it runs in PyTorch, hooks included, so the reference patch
needs no ONNX-specific twin.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path

import torch
from torch import nn

from lpes.converter.loading import DTYPES, ResolvedModel, check_dtype, load_model, torch_dtype
from lpes.converter.reference import apply, check_layout, check_rope_scheme
from lpes.exporters.onnx import graph_io
from lpes.foundation.errors import LpesError
from lpes.foundation.files import read_json_object, write_text_atomic
from lpes.foundation.spec import Spec, dump_spec
from lpes.foundation.spec_file import SPEC_FILE

DEFAULT_OPSET = 18
MODEL_FILE = "model.onnx"
EXTERNAL_DATA_FILE = "model.onnx_data"
METADATA_FILE = "lpes_onnx.json"
# protobuf cannot hold more than 2 GiB in one file; above this the weights go to model.onnx_data.
EXTERNAL_DATA_THRESHOLD = 2**31 - 2**26
# RoPE variants whose frequencies change with the sequence length through Python control flow:
# a traced graph would freeze the branch taken for the example input.
_LENGTH_DEPENDENT_ROPE = {"dynamic": "dynamic-NTK"}


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


def export_onnx(
    resolved: ResolvedModel, out_dir: Path, dtype: str = "float32", opset: int = DEFAULT_OPSET
) -> Path:
    """Export `resolved` (its folder, config and spec) with the spec applied into `out_dir` (created if needed);
    returns `out_dir`. What `check_exportable` refuses is refused first (lpes-convert's plan ran it already)."""
    model_path, spec, out_dir = resolved.path, resolved.spec, Path(out_dir)
    check_exportable(resolved.config, spec, dtype)

    model = load_model(model_path, dtype, for_export=True)
    apply(model, spec)
    shape = graph_io.CacheShape.from_config(model.config)
    program = _trace(model, shape, torch_dtype(dtype), opset)
    constants = _name_scaled_inv_freq(program.model, model, spec)
    strip_exporter_provenance(program.model)
    rewrites = _fuse_friendly(program.model)

    out_dir.mkdir(parents=True, exist_ok=True)
    _save_graph(program.model, out_dir)
    _copy_model_files(model_path, model, out_dir)
    dump_spec(spec, out_dir / SPEC_FILE)
    metadata = _metadata(shape, dtype, opset, spec, constants, rewrites)
    write_text_atomic(out_dir / METADATA_FILE, json.dumps(metadata, indent=2) + "\n")
    return out_dir


def check_exportable(config, spec: Spec | None = None, dtype: str = "float32") -> Spec | None:
    """Refuse, before loading any weight, what cannot be exported exactly; returns `spec` resolved for the model."""
    check_dtype(dtype)
    if spec is not None:
        spec = spec.for_layers(config.num_hidden_layers)
    check_layout(config)
    if spec is not None:
        check_rope_scheme(config, spec.rope)
    for rope_type in _rope_types(config.rope_parameters):
        if rope_type in _LENGTH_DEPENDENT_ROPE:
            raise LpesError(
                f"cannot export {_LENGTH_DEPENDENT_ROPE[rope_type]} RoPE (rope_type {rope_type!r}) to ONNX: "
                "its frequencies depend on the sequence length; export the model without it"
            )
    return spec


def _rope_types(rope_parameters: dict) -> list[str]:
    """The rope_type of each RoPE config (one, or one per layer type as in Gemma 3)."""
    if "rope_type" in rope_parameters or "rope_theta" in rope_parameters:
        return [rope_parameters.get("rope_type", "default")]
    return [p.get("rope_type", "default") for p in rope_parameters.values() if isinstance(p, dict)]


def _example_inputs(shape: graph_io.CacheShape, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    # Distinct sizes >= 2 so that the tracer keeps every dimension symbolic and unrelated.
    batch, seq, past = 3, 5, 7
    input_ids = torch.ones(batch, seq, dtype=torch.long)
    attention_mask = torch.ones(batch, past + seq, dtype=torch.long)
    position_ids = torch.arange(past, past + seq).expand(batch, -1)
    kv = (batch, shape.num_kv_heads, past, shape.head_dim)
    cache = [torch.zeros(kv, dtype=dtype) for _ in range(2 * shape.num_layers)]
    return (input_ids, attention_mask, position_ids, *cache)


def _dynamic_shapes(num_layers: int) -> dict:
    dim = torch.export.Dim
    batch, seq, past = dim(graph_io.BATCH), dim(graph_io.SEQUENCE), dim(graph_io.PAST_SEQUENCE)
    # total = past + seq; torch.export cannot name a sum of two dims, so it is a dim of its own whose
    # minimum is the one implied by past >= 2 and seq >= 2 (ranges are not part of the ONNX graph).
    total = dim(graph_io.TOTAL_SEQUENCE, min=4)
    return {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: total},
        "position_ids": {0: batch, 1: seq},
        "past": tuple({0: batch, 2: past} for _ in range(2 * num_layers)),
    }


def _trace(model, shape: graph_io.CacheShape, dtype: torch.dtype, opset: int):
    wrapper = FlatKVCausalLM(model, shape.num_layers).eval()
    with torch.no_grad(), warnings.catch_warnings(), _quiet_exporter():
        warnings.simplefilter("ignore")
        return torch.onnx.export(
            wrapper,
            _example_inputs(shape, dtype),
            dynamo=True,
            input_names=graph_io.input_names(shape.num_layers),
            output_names=graph_io.output_names(shape.num_layers),
            dynamic_shapes=_dynamic_shapes(shape.num_layers),
            opset_version=opset,
            optimize=True,
            verbose=False,
        )


class _quiet_exporter:
    """Silence torch.onnx's progress lines and missing-torchvision warnings for the duration."""

    _names = ("torch.onnx", "torch.export", "torch._export", "torch.fx.experimental.symbolic_shapes")

    def __enter__(self):
        self._levels = [(logging.getLogger(n), logging.getLogger(n).level) for n in self._names]
        for logger, _ in self._levels:
            logger.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        for logger, level in self._levels:
            logger.setLevel(level)


def _name_scaled_inv_freq(graph_model, model, spec: Spec) -> dict[str, str | None]:
    """Rename each scale's folded frequencies to `lpes.inv_freq.scale_<s>`; scale -> name (None if absent).

    The frequencies are what the reference computes for that scale at the trained length
    (`LayerScaledRotary.frequencies`). A scale whose constant is absent means the graph
    computes them at run time (long-RoPE picks its frequencies in-graph): still exact, just
    not folded.
    """
    import numpy as np

    from lpes.converter.architectures import architecture_for
    from lpes.converter.lpes_rope import LayerScaledRotary, resolve_attribute, unwrapped_rotary

    kwargs = architecture_for(model.config).patch_kwargs(model.config)
    layer_types = kwargs["layer_types"] or [None] * len(spec.scales)
    scales_by_type: dict = {}
    for layer_type, scale in zip(layer_types, spec.scales):
        scales_by_type.setdefault(layer_type, []).append(scale)
    # What the spec asks for, from the model's own rotary (not from whatever the traced model ran).
    own = unwrapped_rotary(resolve_attribute(model, kwargs["rotary_path"]))
    rope = None if spec.rope.linear else spec.rope.for_lpes_rope()
    rotary = LayerScaledRotary(own, scales_by_type, kwargs["interleaved"], rope, model.config)
    first = torch.zeros(1, 1, dtype=torch.long)
    # Only small 1-D initializers can be frequencies: never touch the weights.
    arrays = {
        v.name: v.const_value.numpy()
        for v in graph_model.graph.initializers.values()
        if v.const_value is not None and len(v.const_value.shape) == 1 and v.const_value.shape[0] <= 4096
    }
    found: dict[str, str | None] = {}
    scaled = {(t, s) for t, s in zip(layer_types, spec.scales) if not rotary.uses_own_rope(t, s)}
    for layer_type, scale in sorted(scaled, key=str):
        if spec.rope.length_dependent:  # dynamic NTK: the same plain frequencies up to the trained length,
            found[repr(scale)] = None  # its factor lives in the in-graph base; nothing to tell apart
            continue
        with torch.no_grad():
            expected = rotary.frequencies(layer_type, scale, first)[0].detach().float().cpu().numpy()
        label = f"{layer_type}.scale_{scale!r}" if layer_type else f"scale_{scale!r}"
        key = label.removeprefix("scale_") if layer_type is None else label
        match = next((n for n, a in arrays.items() if a.shape == expected.shape and np.array_equal(a, expected)), None)
        found[key] = None
        if match is not None:
            graph_model.graph.initializers[match].name = f"lpes.inv_freq.{label}"
            found[key] = f"lpes.inv_freq.{label}"
            del arrays[match]
    return found


def strip_exporter_provenance(graph_model) -> None:
    """Drop doc strings and metadata of the model, its graphs, functions, nodes and values, in place.

    torch.onnx records, per node, the Python stack trace, module path and FX node that made
    it (paths of this machine's site-packages and working tree: about 0.5 MB for a tiny model),
    plus the ExportedProgram's signature on the graph. None of it is read by a runtime.
    """
    graph_model.doc_string = None
    graph_model.metadata_props.clear()
    for graph in [*graph_model.graphs(), *graph_model.functions.values()]:
        graph.doc_string = None
        graph.metadata_props.clear()
        values = [*graph.inputs, *graph.outputs]
        if hasattr(graph, "initializers"):
            values += graph.initializers.values()
        for node in graph:
            node.doc_string = None
            node.metadata_props.clear()
            values += node.outputs
        for value in values:
            value.doc_string = None
            value.metadata_props.clear()


def _fuse_friendly(graph_model) -> dict[str, int]:
    """Rewrite, in place and exactly, what onnxruntime would otherwise run unfused; returns counts by rewrite."""
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    counts = {
        "rms_norm_division": divide_by_sqrt(graph_model.graph),
        "direct_key_transpose": transpose_keys_directly(graph_model.graph),
    }
    RemoveUnusedNodesPass()(graph_model)  # the detours the rewrites left behind
    return counts


def divide_by_sqrt(graph) -> int:
    """Rewrite every `Mul(x, Reciprocal(Sqrt(v)))` as `Div(x, Sqrt(v))`; returns how many Reciprocals went.

    torch.onnx exports `torch.rsqrt` (RMSNorm's `x * rsqrt(mean(x^2) + eps)`) as Sqrt then
    Reciprocal then Mul, a form onnxruntime's SimplifiedLayerNormFusion does not recognise;
    with Div it fuses the whole norm into one kernel (as it does for optimum's exports). The
    two forms differ by at most one rounding of the quotient.
    """
    from onnx_ir import Node

    rewritten = 0
    for reciprocal in [n for n in graph if _is_op(n, "Reciprocal")]:
        root, inverse = reciprocal.inputs[0], reciprocal.outputs[0]
        sqrt = root.producer() if root is not None else None
        uses = list(inverse.uses())
        if sqrt is None or sqrt.op_type != "Sqrt" or inverse.is_graph_output() or not uses:
            continue
        if not all(_is_op(use, "Mul") for use, _ in uses):
            continue
        for mul, index in uses:
            _replace(graph, mul, Node("", "Div", [mul.inputs[1 - index], root], name=f"{mul.name}_as_div"))
        graph.remove(reciprocal, safe=True)
        rewritten += 1
    return rewritten


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def transpose_keys_directly(graph) -> int:
    """Rewrite attention's key transpose as one Transpose of the last two axes; returns how many.

    torchlib's scaled_dot_product_attention transposes the keys of a rank-r tensor through
    rank 3, so that one static permutation serves any rank: Reshape(k, [-1, t, d]), then
    Transpose(0, 2, 1), then Reshape back to k.shape[:-2] + [d, t]. The same data movement as
    Transpose(k, perm=[..., r-1, r-2]); but only that direct form lets onnxruntime fold the
    transpose into the MatMul (FusedMatMul transB) instead of copying the whole KV cache of
    every layer at every step. Matched on the shape arithmetic torchlib emits, so nothing
    else is touched.
    """
    from onnx_ir import Attr, AttributeType, Node

    rewritten = 0
    for transpose in [n for n in graph if _is_op(n, "Transpose")]:
        perm = transpose.attributes.get("perm")
        squeeze = transpose.inputs[0].producer()
        users = list(transpose.outputs[0].uses())
        if perm is None or list(perm.as_ints()) != [0, 2, 1] or not _is_op(squeeze, "Reshape") or len(users) != 1:
            continue
        restore, index = users[0]
        key = squeeze.inputs[0]
        rank = key.shape.rank() if key.shape is not None else None
        if not _is_op(restore, "Reshape") or index != 0 or rank is None or rank < 3:
            continue
        if _shape_parts(squeeze.inputs[1], key) != [("const", (-1,)), ("dims", -2, -1), ("dims", -1, _INT64_MAX)]:
            continue
        last_two_swapped = [("dims", _INT64_MIN, -2), ("dims", -1, _INT64_MAX), ("dims", -2, -1)]
        if _shape_parts(restore.inputs[1], key) != last_two_swapped:
            continue
        order = [*range(rank - 2), rank - 1, rank - 2]
        swap = Attr("perm", AttributeType.INTS, order)
        _replace(graph, restore, Node("", "Transpose", [key], [swap], name=f"{transpose.name}_direct"))
        rewritten += 1  # the rank-3 detour, now unused, goes with the dead-node pass in _fuse_friendly
    return rewritten


def _is_op(node, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")


def _shape_parts(shape_value, source) -> list[tuple] | None:
    """A shape built as Concat(constant ints | Slice(Shape(source), start, end)), as tuples; None otherwise."""
    concat = shape_value.producer() if shape_value is not None else None
    if not _is_op(concat, "Concat") or concat.attributes["axis"].as_int() != 0:
        return None
    parts = []
    for value in concat.inputs:
        if value.const_value is not None:
            parts.append(("const", tuple(int(v) for v in value.const_value.numpy().ravel())))
            continue
        sliced = value.producer()
        if not _is_op(sliced, "Slice") or len(sliced.inputs) != 3:
            return None
        shape_of = sliced.inputs[0].producer()
        if not _is_op(shape_of, "Shape") or shape_of.inputs[0] is not source or "end" in shape_of.attributes:
            return None
        if shape_of.attributes.get("start") is not None and shape_of.attributes["start"].as_int() != 0:
            return None
        bounds = [sliced.inputs[i].const_value for i in (1, 2)]
        if any(b is None or b.numpy().size != 1 for b in bounds):
            return None
        parts.append(("dims", *(int(b.numpy().ravel()[0]) for b in bounds)))
    return parts


def _replace(graph, old, new) -> None:
    """Put `new` in place of `old`: its output takes over the old output's name, type, shape and uses."""
    from onnx_ir.convenience import replace_nodes_and_values

    replace_nodes_and_values(graph, old, [old], [new], [old.outputs[0]], [new.outputs[0]])


def _save_graph(graph_model, out_dir: Path) -> None:
    import onnx_ir

    size = sum(v.const_value.nbytes for v in graph_model.graph.initializers.values() if v.const_value is not None)
    if size > EXTERNAL_DATA_THRESHOLD:
        onnx_ir.save(graph_model, out_dir / MODEL_FILE, external_data=EXTERNAL_DATA_FILE)
    else:
        (out_dir / EXTERNAL_DATA_FILE).unlink(missing_ok=True)  # never leave a stale one beside the graph
        onnx_ir.save(graph_model, out_dir / MODEL_FILE)


def _copy_model_files(model_path: Path, model, out_dir: Path) -> None:
    from lpes.converter.portable_files import write_config_json, write_tokenizer_files

    # config and tokenizer files that transformers 4.x (optimum-onnx) reads as 5 does
    write_config_json(json.loads((model_path / "config.json").read_text()), out_dir / "config.json")
    if (model_path / "generation_config.json").is_file():
        shutil.copyfile(model_path / "generation_config.json", out_dir / "generation_config.json")
    else:
        model.generation_config.save_pretrained(out_dir)
    write_tokenizer_files(model_path, out_dir)


def _metadata(shape: graph_io.CacheShape, dtype: str, opset: int, spec: Spec, constants: dict, rewrites: dict) -> dict:
    import onnx
    import transformers

    return {
        "format": "lpes-onnx",
        "version": 1,
        "opset": opset,
        "exporter": f"torch.onnx.export(dynamo=True) torch {torch.__version__}",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__},
        "dtype": dtype,
        "inputs": graph_io.input_names(shape.num_layers),
        "outputs": graph_io.output_names(shape.num_layers),
        **shape.to_json(),
        "scales": list(spec.scales),
        "rope": spec.rope.for_lpes_rope(),  # how each layer applies its scale (lpes_rope.py)
        "scaled_inv_freq_constants": constants,
        # Subgraphs written in the form onnxruntime's graph optimizer fuses (see _fuse_friendly).
        "fusion_friendly_rewrites": rewrites,
    }


def read_metadata(onnx_dir: Path) -> dict:
    """The `lpes_onnx.json` of an export folder."""
    path = Path(onnx_dir) / METADATA_FILE
    if not path.is_file():
        raise LpesError(f"{onnx_dir} is not an lpes ONNX export (no {METADATA_FILE})")
    data = read_json_object(path)
    for key in ("num_layers", "num_key_value_heads", "head_dim"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1_000_000:
            raise LpesError(f"{path}: '{key}' must be a positive integer; is this folder an lpes ONNX export?")
    if data.get("dtype") not in DTYPES:
        raise LpesError(f"{path}: 'dtype' must be one of {', '.join(DTYPES)}, got {data.get('dtype')!r}")
    return data
