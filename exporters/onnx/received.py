"""What a received ONNX export may name: external data inside its folder, a sidecar that matches the graph."""

from __future__ import annotations

import re
from pathlib import Path

from lpes.exporters.received import check_dtype_sidecar, check_named_file
from lpes.foundation.errors import LpesError

ONNX_METADATA = "lpes_onnx.json"


def check_received_file(path: Path) -> None:
    """Every .onnx file (an onnxruntime-genai package's too) and lpes_onnx.json, anywhere in a received folder."""
    if path.suffix == ".onnx":
        check_onnx_file(path)
    elif path.name == ONNX_METADATA:
        check_dtype_sidecar(path)


def check_onnx_file(onnx_file: Path) -> None:
    """Every external-data location of the graph is a regular file inside its folder (no absolute path,
    no `..`, no link out, no device); with lpes_onnx.json beside it, its layer count and dtype match the graph."""
    import onnx

    onnx_file = Path(onnx_file)
    try:
        model = onnx.load(str(onnx_file), load_external_data=False)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and onnx's own types
        raise LpesError(f"{onnx_file} is not an ONNX model ({type(err).__name__})") from None
    for tensor in _onnx_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = {entry.key: entry.value for entry in tensor.external_data}.get("location", "")
        where = f"external data of tensor {tensor.name[:80]!r}"
        check_named_file(onnx_file, onnx_file.parent, location, where)
        if not (onnx_file.parent / location).is_file():
            raise LpesError(f"{onnx_file}: {where} names {location[:80]!r}, which is not a file in "
                            f"{onnx_file.parent}")
    if (onnx_file.parent / ONNX_METADATA).is_file() and onnx_file.name == "model.onnx":
        _check_onnx_metadata(onnx_file, model)


def _onnx_tensors(model):
    """Every TensorProto of an ONNX model: initializers, sparse ones, attributes, subgraphs, functions."""

    def of_nodes(nodes):
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("sparse_tensor"):
                    yield attr.sparse_tensor.values
                    yield attr.sparse_tensor.indices
                for sparse in attr.sparse_tensors:
                    yield sparse.values
                    yield sparse.indices
                if attr.HasField("g"):
                    yield from of_graph(attr.g)
                for graph in attr.graphs:
                    yield from of_graph(graph)

    def of_graph(graph):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        yield from of_nodes(graph.node)

    yield from of_graph(model.graph)
    for function in model.functions:
        yield from of_nodes(function.node)


_ONNX_ELEMENT_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16"}


def _check_onnx_metadata(onnx_file: Path, model) -> None:
    """lpes_onnx.json's layer count and dtype against the graph's past_key_values inputs (the runner trusts it)."""
    from lpes.exporters.onnx.export import read_metadata

    metadata = read_metadata(onnx_file.parent)
    past = [i for i in model.graph.input if re.fullmatch(r"past_key_values\.\d+\.key", i.name)]
    sidecar = onnx_file.parent / ONNX_METADATA
    if metadata["num_layers"] != len(past):
        raise LpesError(f"{sidecar}: 'num_layers' is {metadata['num_layers']}, but {onnx_file.name} has "
                        f"{len(past)} layers of past_key_values inputs")
    if past:
        element = past[0].type.tensor_type.elem_type
        if _ONNX_ELEMENT_DTYPES.get(element, metadata["dtype"]) != metadata["dtype"]:
            raise LpesError(f"{sidecar}: 'dtype' is {metadata['dtype']}, but {onnx_file.name}'s cache is "
                            f"{_ONNX_ELEMENT_DTYPES[element]}")
