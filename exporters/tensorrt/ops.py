"""CPU-side check that TensorRT's ONNX parser can read a graph: operators and data types.

Run before anything needs a GPU, so that a graph TensorRT cannot build fails on the
machine that exported it, with the operator and node named, and not an hour later on
the deployment machine.

The table is onnx-tensorrt's operator support matrix (docs/operators.md, TensorRT 10.15:
opsets 9 to 24) for the operators a decoder export can contain, plus the operators it
marks unsupported. For each operator it lists the types of the operator's data tensor
(its first input; both sides of a Cast; the values of a Where) that TensorRT accepts.
An operator missing from the table is reported as unknown to TensorRT's parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lpes.foundation.errors import LpesError

OPSET_RANGE = (9, 24)

# onnx.TensorProto element types.
FP32, UINT8, INT8, INT32, INT64, BOOL, DOUBLE, FP16, BF16 = 1, 2, 3, 6, 7, 9, 11, 10, 16
FP8, INT4, FP4 = 17, 22, 23
TYPE_NAMES = {
    FP32: "float32", UINT8: "uint8", INT8: "int8", INT32: "int32", INT64: "int64", BOOL: "bool",
    DOUBLE: "float64", FP16: "float16", BF16: "bfloat16", FP8: "float8e4m3fn", INT4: "int4", FP4: "float4e2m1",
    4: "uint16", 5: "int16", 8: "string", 12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128",
}
# Network inputs and outputs may carry these types (UINT8 only there).
IO_TYPES = frozenset({FP32, FP16, BF16, INT32, INT64, BOOL, UINT8, INT8})

_F = frozenset({FP32, FP16, BF16})
_I = frozenset({INT32, INT64})
_B = frozenset({BOOL})
_FI, _FIB = _F | _I, _F | _I | _B
_F16 = frozenset({FP32, FP16})
_Q = frozenset({FP8, FP4, INT4})

SUPPORTED: dict[str, frozenset[int]] = {
    **dict.fromkeys(
        ["Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "AveragePool", "BatchNormalization", "Ceil", "Celu",
         "Clip", "Conv", "ConvTranspose", "Cos", "Cosh", "CumSum", "Dropout", "Einsum", "Elu", "Erf", "Exp",
         "Floor", "Gemm", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "GroupNormalization", "GRU",
         "HardSigmoid", "HardSwish", "Hardmax", "ImageScaler", "InstanceNormalization", "IsInf",
         "LayerNormalization", "LeakyRelu", "Log", "LogSoftmax", "LRN", "LSTM", "LpNormalization", "LpPool",
         "MatMul", "MaxPool", "MeanVarianceNormalization", "ParametricSoftplus", "PRelu", "QuantizeLinear",
         "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Reciprocal", "Resize",
         "RMSNormalization", "RNN", "RotaryEmbedding", "Round", "ScaledTanh", "Scan", "Selu", "Sigmoid", "Sin",
         "Sinh", "Softmax", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu", "Upsample"],
        _F,
    ),
    **dict.fromkeys(
        ["Abs", "Add", "ArgMax", "ArgMin", "DepthToSpace", "Div", "Equal", "Greater", "GreaterOrEqual", "IsNaN",
         "Less", "LessOrEqual", "Max", "Min", "Mod", "Mul", "Neg", "Pad", "Pow", "Range", "ReduceL1", "ReduceL2",
         "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum",
         "ReduceSumSquare", "Relu", "Scatter", "ScatterElements", "ScatterND", "Shrink", "Sign", "SpaceToDepth",
         "Sub", "Sum", "TopK"],
        _FI,
    ),
    **dict.fromkeys(
        ["Concat", "Expand", "EyeLike", "Flatten", "Gather", "GatherElements", "GatherND", "Identity", "If", "Loop",
         "OneHot", "Reshape", "ReverseSequence", "Shape", "Size", "Slice", "Split", "Squeeze", "Tile", "Transpose",
         "Trilu", "Unsqueeze", "Where"],
        _FIB,
    ),
    **dict.fromkeys(["And", "Not", "Or", "Xor"], _B),
    **dict.fromkeys(["BlackmanWindow", "HammingWindow", "HannWindow", "DeformConv", "GridSample", "Mish",
                     "NonMaxSuppression", "NonZero", "RoiAlign"], _F16),
    **dict.fromkeys(["Cast", "CastLike"], _FIB | {UINT8}),
    **dict.fromkeys(["Constant", "ConstantOfShape"], _FIB | _Q),
    "Attention": _F | {INT8, FP8},
    "DequantizeLinear": _Q | {INT8},
    "Gelu": _FI | {INT8},
    "Mean": _FI | {FP8},
    "STFT": frozenset({FP32}),
    "TensorScatter": _F | {INT32},
}
UNSUPPORTED = frozenset(
    ["AffineGrid", "Bernoulli", "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor", "Col2Im",
     "CenterCropPad", "Compress", "ConcatFromSequence", "ConvInteger", "DFT", "Det", "DynamicQuantizeLinear",
     "ImageDecoder", "MatMulInteger", "MaxRoiPool", "MaxUnpool", "MelWeightMatrix", "Multinomial",
     "NegativeLogLikelihoodLoss", "Optional", "OptionalGetElement", "OptionalHasElement", "QLinearConv",
     "QLinearMatMul", "RegexFullMatch", "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
     "SequenceInsert", "SequenceLength", "SequenceMap", "SoftmaxCrossEntropyLoss", "SplitToSequence",
     "StringConcat", "StringNormalizer", "StringSplit", "TfIdfVectorizer", "Unique"]
)
# Restrictions from the same table that a graph can break and that are cheap to see: the
# `axes` input of a reduction must be a build-time constant.
_CONSTANT_AXES = frozenset(op for op in SUPPORTED if op.startswith("Reduce"))


@dataclass(frozen=True)
class Problem:
    node: str
    op: str
    what: str

    def message(self) -> str:
        return f"TensorRT's ONNX parser does not support {self.what} (node {self.node!r}, op {self.op})"


def check_tensorrt_support(onnx_file: Path) -> None:
    """Raise LpesError naming the first operator or data type TensorRT's ONNX parser cannot take."""
    problems = find_problems(load_graph(onnx_file))
    if problems:
        more = f"; and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise LpesError(f"{onnx_file.name}: {problems[0].message()}{more}")


def load_graph(onnx_file: Path):
    """The model's structure and types (no weights: the check needs none), local functions inlined."""
    import onnx
    from onnx import inliner, shape_inference

    if not Path(onnx_file).is_file():
        raise LpesError(f"no ONNX model at {onnx_file}")
    try:
        model = onnx.load(str(onnx_file), load_external_data=False)
    except Exception as err:  # protobuf's DecodeError and friends
        raise LpesError(f"{onnx_file} is not a readable ONNX model: {str(err).splitlines()[0]}") from None
    if model.functions:
        model = inliner.inline_local_functions(model)
    try:
        return shape_inference.infer_shapes(model)
    except Exception:  # inference is only for the types; without it, known types are still checked
        return model


def find_problems(model) -> list[Problem]:
    """Every unsupported operator, data type, opset or I/O type in `model` (subgraphs included)."""
    problems = _opset_problems(model)
    graph = model.graph
    types = _tensor_types(graph)
    for value in list(graph.input) + list(graph.output):
        elem = value.type.tensor_type.elem_type
        if elem and elem not in IO_TYPES:
            problems.append(Problem(value.name, "graph I/O", f"a network input/output of type {_type(elem)}"))
    constants = {i.name for i in graph.initializer}
    constants |= {out for n in graph.node if n.op_type == "Constant" for out in n.output}
    for node in _all_nodes(graph):
        problems.extend(_node_problems(node, types, constants))
    return problems


def _opset_problems(model) -> list[Problem]:
    low, high = OPSET_RANGE
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx") and not low <= entry.version <= high:
            return [Problem("<model>", "opset", f"opset {entry.version} (it reads opsets {low} to {high})")]
    return []


def _tensor_types(graph) -> dict[str, int]:
    types = {}
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        if value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    for init in graph.initializer:
        types[init.name] = init.data_type
    return types


def _all_nodes(graph):
    """The graph's nodes and, recursively, those of If/Loop/Scan bodies."""
    from onnx import AttributeProto

    for node in graph.node:
        yield node
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                yield from _all_nodes(sub)


def _node_problems(node, types: dict[str, int], constants: set[str]) -> list[Problem]:
    name = node.name or (node.output[0] if node.output else "?")
    if node.domain not in ("", "ai.onnx"):
        return [Problem(name, node.op_type, f"operator {node.domain}::{node.op_type} (a custom domain needs a plugin)")]
    if node.op_type in UNSUPPORTED or node.op_type not in SUPPORTED:
        return [Problem(name, node.op_type, f"operator {node.op_type}")]
    allowed = SUPPORTED[node.op_type]
    problems = []
    for tensor in _data_tensors(node):
        elem = types.get(tensor)
        # DOUBLE: the parser casts it down to float32 (the table's "limited support").
        if elem is not None and elem != DOUBLE and elem not in allowed:
            problems.append(Problem(name, node.op_type, f"{node.op_type} on {_type(elem)} (tensor {tensor!r})"))
    cast_to = _cast_target(node)
    if cast_to is not None and cast_to not in allowed:
        problems.append(Problem(name, node.op_type, f"Cast to {_type(cast_to)}"))
    if node.op_type in _CONSTANT_AXES and len(node.input) > 1 and node.input[1] and node.input[1] not in constants:
        problems.append(Problem(name, node.op_type, f"{node.op_type} with computed axes (they must be a constant)"))
    return problems


def _data_tensors(node) -> list[str]:
    """The inputs whose type the support table speaks of."""
    if node.op_type == "Where":
        return [t for t in node.input[1:3] if t]
    if node.op_type in ("Constant", "ConstantOfShape", "RandomNormal", "RandomUniform") or not node.input:
        return [t for t in node.output[:1] if t]
    return [node.input[0]] if node.input[0] else []


def _cast_target(node) -> int | None:
    if node.op_type != "Cast":
        return None
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _type(elem: int) -> str:
    return TYPE_NAMES.get(elem, f"ONNX type {elem}")
