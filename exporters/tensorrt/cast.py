"""A float16 or bfloat16 copy of a float32 ONNX graph, for strongly typed TensorRT builds.

TensorRT 11 builds every network strongly typed: each layer runs in the type the graph
gives it, and there is no "allow FP16" builder flag any more. So the precision has to be
in the graph. This writes that graph from the float32 export, the way transformers runs
a half-precision model:

- weights, activations, the KV cache (`past_key_values.*` in, `present.*` out) in the low type;
- float32 islands where half precision loses the answer:
    * the RoPE angles: every node upstream of a Cos/Sin (positions times the per-layer
      `inv_freq / s_h`, which stay the exact float32 constants of the export) and the
      Cos/Sin themselves. In float16 a position above 2048 is not even an integer, and
      `inv_freq` would lose the scale's low bits;
    * the ops in KEEP_FLOAT32 (normalization statistics, softmax, exp/log) and every node
      fed only by float32 islands (the rest of an RMSNorm's statistics chain, for instance);
- `logits` stays float32 (as the exporter writes it for every dtype);
- input and output names unchanged, and Cast nodes wherever a tensor crosses a boundary.

Float constants are rounded to the low type with values beyond its range clipped to its
largest finite value (the attention mask's "minus infinity" is float32's lowest number).
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from lpes.foundation.errors import LpesError
from lpes.foundation.files import save_atomic

FLOAT = 1
LOW_TYPES = {"float16": 10, "bfloat16": 16}
KEEP_FLOAT32 = frozenset(
    {"Cos", "Sin", "Softmax", "LogSoftmax", "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2",
     "ReduceLogSumExp", "Pow", "Sqrt", "Reciprocal", "Exp", "Log", "LayerNormalization", "RMSNormalization",
     "SimplifiedLayerNormalization", "Range", "CumSum"}
)
ANGLE_OPS = frozenset({"Cos", "Sin"})
# Ops that read any input type: their input never needs a cast.
_TYPE_AGNOSTIC = frozenset({"Shape", "Size"})
FLOAT32_OUTPUTS = frozenset({"logits"})
# protobuf cannot hold more than 2 GiB in one file.
_EXTERNAL_DATA_THRESHOLD = 2**31 - 2**26


def write_cast_onnx(
    src: Path,
    dst: Path,
    dtype: str,
    keep_float32: frozenset[str] = KEEP_FLOAT32,
    float32_outputs: frozenset[str] = FLOAT32_OUTPUTS,
) -> Path:
    """Write the `dtype` copy of the float32 graph `src` to `dst` (weights in `<dst>_data` when large)."""
    import onnx

    if dtype not in LOW_TYPES:
        raise LpesError(f"cast ONNX: dtype must be one of {', '.join(LOW_TYPES)}, got {dtype!r}")
    model = onnx.load(str(src))
    cast_model(model, LOW_TYPES[dtype], keep_float32, float32_outputs)
    _save(model, Path(dst))
    return Path(dst)


def cast_model(model, low: int, keep_float32=KEEP_FLOAT32, float32_outputs=FLOAT32_OUTPUTS) -> None:
    """Rewrite `model` (an onnx ModelProto over float32) in place to the element type `low`."""
    from onnx import shape_inference

    graph = model.graph
    _constants_to_initializers(graph)
    types = _float_tensors(model)
    nodes = list(graph.node)
    _refuse_control_flow(nodes)
    float32_nodes = _float32_nodes(nodes, types, keep_float32)
    tensor_type = _retype_tensors(graph, nodes, types, float32_nodes, low)
    new_nodes = _insert_casts(graph, nodes, types, tensor_type, float32_nodes, low)
    new_nodes += _fix_outputs(graph, tensor_type, low, float32_outputs)
    del graph.node[:]
    graph.node.extend(new_nodes)
    # Stale annotations of retyped tensors would contradict the graph; inference rebuilds them.
    del graph.value_info[:]
    try:
        with _weights_detached(model):
            inferred = shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as err:
        raise LpesError(f"cast ONNX: the {_name(low)} graph does not type-check: {str(err).splitlines()[0]}") from None
    graph.value_info.extend(inferred.graph.value_info)


def _name(low: int) -> str:
    return {v: k for k, v in LOW_TYPES.items()}[low]


def _constants_to_initializers(graph) -> None:
    """Constant nodes become initializers, so one rule converts all constants."""
    from onnx import helper, numpy_helper

    keep = []
    for node in graph.node:
        attr = node.attribute[0] if node.op_type == "Constant" and len(node.attribute) == 1 else None
        if attr is not None and attr.name == "value":
            tensor = numpy_helper.to_array(attr.t)
        elif attr is not None and attr.name in ("value_float", "value_floats", "value_int", "value_ints"):
            value = helper.get_attribute_value(attr)
            tensor = np.asarray(value, dtype=np.float32 if "float" in attr.name else np.int64)
        else:
            keep.append(node)
            continue
        graph.initializer.append(numpy_helper.from_array(tensor, node.output[0]))
    del graph.node[:]
    graph.node.extend(keep)


def _float_tensors(model) -> set[str]:
    """Names of the float32 tensors of the source graph."""
    from onnx import shape_inference

    try:
        with _weights_detached(model):
            typed = shape_inference.infer_shapes(model).graph
    except Exception as err:
        raise LpesError(f"cast ONNX: cannot infer the source graph's types: {str(err).splitlines()[0]}") from None
    values = list(typed.input) + list(typed.output) + list(typed.value_info)
    floats = {v.name for v in values if v.type.tensor_type.elem_type == FLOAT}
    floats |= {i.name for i in typed.initializer if i.data_type == FLOAT}
    return floats


@contextmanager
def _weights_detached(model, threshold: int = 1 << 16):
    """The model without its large weights for the duration (inference needs only their types and shapes,
    and a model over 2 GiB cannot be handed to it whole)."""
    stash = {}
    for index, init in enumerate(model.graph.initializer):
        if len(init.raw_data) > threshold:
            stash[index] = init.raw_data
            init.ClearField("raw_data")
    try:
        yield model
    finally:
        for index, data in stash.items():
            model.graph.initializer[index].raw_data = data


def _refuse_control_flow(nodes) -> None:
    from onnx import AttributeProto

    for node in nodes:
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
            raise LpesError(f"cast ONNX: control flow ({node.op_type} node {node.name!r}) is not supported")


def _float32_nodes(nodes, floats: set[str], keep_float32) -> set[int]:
    """Indices of the nodes that run in float32 (see the module docstring)."""
    producer = {out: i for i, node in enumerate(nodes) for out in node.output}
    keep = {i for i, node in enumerate(nodes) if node.op_type in keep_float32}
    # Upstream of the RoPE angles: everything that computes them, through float tensors.
    stack = [i for i, node in enumerate(nodes) if node.op_type in ANGLE_OPS and node.op_type in keep_float32]
    while stack:
        for tensor in nodes[stack.pop()].input:
            j = producer.get(tensor)
            if j is not None and tensor in floats and j not in keep:
                keep.add(j)
                stack.append(j)
    # Downstream: a node whose computed float inputs all come from float32 nodes stays float32
    # (nodes are in topological order, so one pass sees every producer first).
    for i, node in enumerate(nodes):
        computed = [t for t in node.input if t in floats and t in producer]
        if i not in keep and computed and all(producer[t] in keep for t in computed):
            keep.add(i)
    return keep


def _retype_tensors(graph, nodes, floats, float32_nodes, low) -> dict[str, int]:
    """The element type of every float tensor in the new graph; rewrites float-creating attributes."""
    from onnx import numpy_helper

    tensor_type = {}
    for value in graph.input:
        if value.name in floats:
            value.type.tensor_type.elem_type = low
            tensor_type[value.name] = low
    for i, node in enumerate(nodes):
        precision = FLOAT if i in float32_nodes else low
        for out in node.output:
            if out in floats:
                tensor_type[out] = precision
        if precision == low:
            for attr in node.attribute:
                if attr.name in ("to", "dtype") and attr.i == FLOAT:  # Cast(to=float), RandomNormal(dtype=...)
                    attr.i = low
                elif attr.name == "value" and attr.t.data_type == FLOAT:  # ConstantOfShape
                    attr.t.CopyFrom(_convert(numpy_helper.to_array(attr.t), low, attr.t.name))
    for init in graph.initializer:
        if init.name in floats:
            tensor_type[init.name] = FLOAT  # converted per consumer in _insert_casts
    return tensor_type


def _insert_casts(graph, nodes, floats, tensor_type, float32_nodes, low) -> list:
    """The node list with a Cast (or a converted constant) wherever a float input's type differs."""
    from onnx import helper, numpy_helper

    initializers = {i.name: i for i in graph.initializer if i.name in floats}
    wanted_by: dict[str, set[int]] = defaultdict(set)
    for i, node in enumerate(nodes):
        if node.op_type in _TYPE_AGNOSTIC:
            continue
        for tensor in node.input:
            if tensor in initializers:
                wanted_by[tensor].add(FLOAT if i in float32_nodes else low)
    renamed = {}
    for name, wanted in wanted_by.items():
        if wanted == {low}:  # only low-precision readers: convert in place
            converted = _convert(numpy_helper.to_array(initializers[name]), low, name)
            initializers[name].CopyFrom(converted)
            tensor_type[name] = low
        elif low in wanted:  # read in both precisions: keep float32, add a low copy
            renamed[name] = f"{name}.{_name(low)}"
            graph.initializer.append(_convert(numpy_helper.to_array(initializers[name]), low, renamed[name]))
    out, casts = [], {}
    for i, node in enumerate(nodes):
        precision = FLOAT if i in float32_nodes else low
        for k, tensor in enumerate(node.input):
            if tensor not in tensor_type or node.op_type in _TYPE_AGNOSTIC or tensor_type[tensor] == precision:
                continue
            if tensor in renamed and precision == low:
                node.input[k] = renamed[tensor]
                continue
            key = (tensor, precision)
            if key not in casts:
                casts[key] = f"{tensor}.to_{'float32' if precision == FLOAT else _name(low)}"
                name = f"lpes_cast.{casts[key]}"
                out.append(helper.make_node("Cast", [tensor], [casts[key]], to=precision, name=name))
            node.input[k] = casts[key]
        out.append(node)
    return out


def _fix_outputs(graph, tensor_type, low, float32_outputs) -> list:
    """Give each float output its interface type (float32 for `logits`, else low), casting if needed."""
    from onnx import helper

    casts = []
    for value in graph.output:
        if value.name not in tensor_type:
            continue
        wanted = FLOAT if value.name in float32_outputs else low
        value.type.tensor_type.elem_type = wanted
        if tensor_type[value.name] != wanted:
            inner = f"{value.name}.computed"
            _rename_tensor(graph, value.name, inner)
            casts.append(helper.make_node("Cast", [inner], [value.name], to=wanted, name=f"lpes_cast.{value.name}"))
    return casts


def _rename_tensor(graph, old: str, new: str) -> None:
    for node in graph.node:
        for k, name in enumerate(node.output):
            if name == old:
                node.output[k] = new
        for k, name in enumerate(node.input):
            if name == old:
                node.input[k] = new


def _convert(array: np.ndarray, low: int, name: str):
    """A TensorProto of `array` in the low type, out-of-range values clipped to its largest finite value."""
    import ml_dtypes
    from onnx import numpy_helper

    target = np.float16 if low == LOW_TYPES["float16"] else ml_dtypes.bfloat16
    limit = float(np.finfo(np.float16).max) if target is np.float16 else float(ml_dtypes.finfo(target).max)
    array = np.asarray(array, dtype=np.float32)
    finite = np.isfinite(array)
    clipped = np.where(finite, np.clip(array, -limit, limit), array)
    return numpy_helper.from_array(clipped.astype(target), name)


def _save(model, dst: Path) -> None:
    """Write atomically: a temporary file renamed into place (weights beside it when too large for one file)."""
    import onnx

    size = sum(len(i.raw_data) for i in model.graph.initializer)
    if size > _EXTERNAL_DATA_THRESHOLD:
        data = dst.with_name(f"{dst.name}_data")
        data.unlink(missing_ok=True)
        save_atomic(dst, lambda tmp: onnx.save_model(model, str(tmp), save_as_external_data=True,
                                                     all_tensors_to_one_file=True, location=data.name,
                                                     size_threshold=1024))
    else:
        save_atomic(dst, lambda tmp: onnx.save_model(model, str(tmp)))
