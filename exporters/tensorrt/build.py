"""What a TensorRT build needs from the machine, and the build itself (tensorrt Python API).

- `missing_requirements()`: what this machine lacks to build (the tensorrt package, TensorRT
  >= 10, an NVIDIA GPU), in words; None when it can build.
- `build_plan()`: how a TensorRT version builds a given precision (pure, tested on CPU):
    TensorRT 11 builds every network strongly typed and has no precision builder flags;
    TensorRT 10 still has them, but lpes builds strongly typed there too (the precision is
    in the ONNX graph: the export's own dtype or `cast.py`), so both versions build
    the same network. `typing="weak"` keeps TensorRT 10's old route (a float32 graph plus
    BuilderFlag.FP16/BF16, TensorRT picks each layer's precision) for comparison.
  float32 engines clear TF32, whose 10-bit mantissa matmuls would miss float32 parity.
- `build_serialized_engine()`: parse, profile, timing cache, build. Needs a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lpes.foundation.devices import GpuInfo, gpu_info
from lpes.foundation.errors import LpesError
from lpes.foundation.files import write_bytes_atomic

# GpuInfo and gpu_info live in lpes.foundation.devices (the one driver probe); named here for the build's callers.
__all__ = ["MIN_TENSORRT", "BuildPlan", "GpuInfo", "build_plan", "build_serialized_engine", "gpu_info",
           "missing_requirements", "tensorrt_major", "tensorrt_version"]

MIN_TENSORRT = 10


@dataclass(frozen=True)
class BuildPlan:
    strongly_typed: bool
    set_flags: tuple[str, ...] = ()  # BuilderFlag names to set
    clear_flags: tuple[str, ...] = ()  # BuilderFlag names to clear
    onnx_dtype: str = "float32"  # the precision the ONNX graph handed to TensorRT must have

    def to_json(self) -> dict:
        return {"strongly_typed": self.strongly_typed, "builder_flags_set": list(self.set_flags),
                "builder_flags_cleared": list(self.clear_flags), "onnx_dtype": self.onnx_dtype}


def tensorrt_major(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        raise LpesError(f"cannot read the TensorRT version {version!r}") from None


def build_plan(tensorrt_version: str, dtype: str, typing: str = "strong") -> BuildPlan:
    """The network typing and builder flags for building a `dtype` engine with this TensorRT."""
    major = tensorrt_major(tensorrt_version)
    if major < MIN_TENSORRT:
        raise LpesError(f"lpes builds with TensorRT >= {MIN_TENSORRT}; this machine has TensorRT {tensorrt_version}")
    clear = ("TF32",) if dtype == "float32" else ()
    if typing == "strong":
        return BuildPlan(strongly_typed=True, clear_flags=clear, onnx_dtype=dtype)
    if typing != "weak":
        raise LpesError(f"typing must be 'strong' or 'weak', got {typing!r}")
    if major >= 11:
        raise LpesError(
            f"TensorRT {tensorrt_version} removed weakly typed builds (BuilderFlag.FP16/BF16); "
            "use the default strongly typed build"
        )
    flags = {"float16": ("FP16",), "bfloat16": ("BF16",)}.get(dtype, ())
    return BuildPlan(strongly_typed=False, set_flags=flags, clear_flags=clear, onnx_dtype="float32")


def tensorrt_version() -> str | None:
    """The installed tensorrt package's version, or None when it cannot be imported."""
    try:
        import tensorrt
    except (ImportError, OSError):  # OSError: the package is there but its CUDA libraries are not
        return None
    return str(tensorrt.__version__)


def missing_requirements() -> str | None:
    """What this machine lacks to build an engine, in one phrase; None when nothing is missing."""
    version = tensorrt_version()
    missing = []
    if version is None:
        missing.append("the tensorrt Python package (pip install 'tensorrt>=10')")
    elif tensorrt_major(version) < MIN_TENSORRT:
        missing.append(f"TensorRT >= {MIN_TENSORRT} (found {version})")
    if gpu_info() is None:
        missing.append("an NVIDIA GPU (the CUDA driver reports none)")
    return " and ".join(missing) or None


def build_serialized_engine(
    onnx_file: Path,
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]],
    plan: BuildPlan,
    timing_cache: Path,
    workspace_bytes: int | None = None,
):
    """Build the engine; returns the serialized engine (a buffer). Updates `timing_cache` in place."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(_network_flags(trt, plan))
    parser = trt.OnnxParser(network, logger)
    # parse_from_file, not parse(bytes): it finds external weights (model.onnx_data) next to the file.
    if not parser.parse_from_file(str(onnx_file)):
        raise LpesError(f"TensorRT's ONNX parser rejected {onnx_file.name}: {_parser_error(parser)}")
    config = builder.create_builder_config()
    for flag in plan.set_flags:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    for flag in plan.clear_flags:
        config.clear_flag(getattr(trt.BuilderFlag, flag))
    if workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    config.add_optimization_profile(_profile(builder, network, shapes))
    cache = _load_timing_cache(config, timing_cache)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise LpesError("TensorRT could not build the engine (its log above says why)")
    _save_timing_cache(config.get_timing_cache() or cache, timing_cache)
    return serialized


def _network_flags(trt, plan: BuildPlan) -> int:
    # TensorRT 11 keeps the STRONGLY_TYPED flag as an ignored no-op; TensorRT 10 needs it.
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    return 1 << int(flag) if plan.strongly_typed and flag is not None else 0


def _parser_error(parser) -> str:
    if parser.num_errors == 0:
        return "no reason given"
    error = parser.get_error(0)
    where = ""
    if hasattr(error, "node_name") and error.node_name():
        where = f" (node {error.node_name()!r}, op {error.node_operator()})"
    more = f"; and {parser.num_errors - 1} more" if parser.num_errors > 1 else ""
    return f"{error.desc()}{where}{more}"


def _profile(builder, network, shapes):
    names = [network.get_input(i).name for i in range(network.num_inputs)]
    missing = [n for n in names if n not in shapes]
    if missing:
        raise LpesError(f"no optimization profile shape for network input {missing[0]!r}")
    profile = builder.create_optimization_profile()
    for name in names:
        low, opt, high = shapes[name]
        profile.set_shape(name, low, opt, high)
    return profile


def _load_timing_cache(config, path: Path):
    data = path.read_bytes() if path.is_file() else b""
    cache = config.create_timing_cache(data)
    # A cache from another GPU or TensorRT version is refused; start from an empty one.
    if not config.set_timing_cache(cache, ignore_mismatch=False):
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, ignore_mismatch=False)
    return cache


def _save_timing_cache(cache, path: Path) -> None:
    write_bytes_atomic(path, cache.serialize())
