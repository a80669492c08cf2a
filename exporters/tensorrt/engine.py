"""TensorRT engines from the ONNX export (`lpes-convert --to tensorrt`).

An engine is the ONNX export compiled for one GPU model by one TensorRT version: it runs
with no plugin and no custom code (the per-layer RoPE scales are constants of the graph),
but only on that GPU model and that TensorRT version. So this folder always carries the
recipe to rebuild it (`trtexec.sh`), and the engine only where this machine can build it.

In order:

1. CPU checks, before anything needs a GPU: the folder is an lpes ONNX export; every
   operator and data type is one TensorRT's ONNX parser reads (`ops.py`); the
   optimization profile fits the model's positions (`profiles.py`).
2. The graph TensorRT gets: the export itself when its dtype is the one asked for, else a
   float16/bfloat16 copy of the float32 export (`cast.py`), written here.
3. `trtexec.sh` and `README.md` (`recipe.py`): the equivalent trtexec command line
   (every input's min/opt/max shape, the timing cache, strong typing).
4. Where the machine has TensorRT >= 10 and an NVIDIA GPU: build (`build.py`) and
   write `model.engine`, `timing.cache` and the sidecar `model.engine.json` (TensorRT
   version, GPU and compute capability, profile, I/O names, the spec). Elsewhere: no engine,
   and a one-line note of exactly what is missing (lpes-convert prints it and exits 2).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from lpes.converter.loading import DTYPES, check_dtype
from lpes.exporters.onnx.export import MODEL_FILE, read_metadata
from lpes.exporters.tensorrt import build as tensorrt_build
from lpes.exporters.tensorrt.build import build_plan, build_serialized_engine
from lpes.exporters.tensorrt.ops import check_tensorrt_support
from lpes.exporters.tensorrt.profiles import Profile, default_profile, input_shapes
from lpes.exporters.tensorrt.recipe import (
    ENGINE_FILE,
    README_FILE,
    SIDECAR_FILE,
    TIMING_CACHE_FILE,
    TRTEXEC_FILE,
    pretty,
    trtexec_command,
    write_recipe,
)
from lpes.foundation.commands import ArgumentParser
from lpes.foundation.errors import LpesError
from lpes.foundation.files import write_bytes_atomic, write_text_atomic
from lpes.foundation.spec_file import SPEC_FILE

FORMAT = "lpes-tensorrt"
VERSION = 1


def build_engine_or_explain(
    onnx_dir: Path,
    out_dir: Path,
    dtype: str,
    profile: Profile | None = None,
    *,
    timing_cache: Path | None = None,
    workspace_bytes: int | None = None,
    typing: str = "strong",
) -> str | None:
    """Build `out_dir/model.engine` from the export in `onnx_dir`; None on success.

    Where this machine cannot build (no tensorrt package, no NVIDIA GPU) it builds nothing,
    leaves `trtexec.sh` and `README.md` in `out_dir`, prints the trtexec command to stderr
    and returns a one-line note saying what is missing. Raises LpesError for a graph or
    profile TensorRT could not take anywhere. `timing_cache` (default `out_dir/timing.cache`)
    is read if present and updated after the build; `typing="weak"` is TensorRT 10's
    builder-flag precision (see `build.py`).
    """
    onnx_dir, out_dir = Path(onnx_dir), Path(out_dir)
    check_dtype(dtype)
    metadata = read_metadata(onnx_dir)
    check_tensorrt_support(onnx_dir / MODEL_FILE)
    profile = profile or default_profile(max_positions(onnx_dir), max_scale=max(metadata["scales"]))
    missing = tensorrt_build.missing_requirements()
    # Without TensorRT here its version is unknown: the plan for 10 builds on 10 and 11 alike.
    plan = build_plan(tensorrt_build.tensorrt_version() if missing is None else "10", dtype, typing)
    onnx_file = engine_onnx(onnx_dir, metadata["dtype"], plan.onnx_dtype, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shapes = input_shapes(graph_input_dims(onnx_file), profile)
    command = trtexec_command(os.path.relpath(onnx_file, out_dir), shapes, plan, workspace_bytes)
    write_recipe(out_dir, command, dtype, missing, os.path.relpath(onnx_dir, out_dir))
    if missing is not None:
        where = f"build the engine in {out_dir.name}/ on the deployment machine with"
        print(f"{where}:\n{pretty(command)}", file=sys.stderr)
        return (
            f"TensorRT engine not built: this machine lacks {missing}; the ONNX export is in place, "
            f"and {out_dir.name}/{TRTEXEC_FILE} builds the engine on a machine with both "
            f"(see {out_dir.name}/{README_FILE})"
        )
    cache = Path(timing_cache) if timing_cache else out_dir / TIMING_CACHE_FILE
    serialized = build_serialized_engine(onnx_file, shapes, plan, cache, workspace_bytes)
    write_bytes_atomic(out_dir / ENGINE_FILE, serialized)
    sidecar = _sidecar(onnx_dir, onnx_file, out_dir, metadata, dtype, profile, shapes, plan, cache)
    write_text_atomic(out_dir / SIDECAR_FILE, json.dumps(sidecar, indent=2) + "\n")
    return None


def max_positions(onnx_dir: Path) -> int:
    """`max_position_embeddings` from the export's config.json (or its text_config)."""
    path = Path(onnx_dir) / "config.json"
    if not path.is_file():
        raise LpesError(f"{onnx_dir} has no config.json to read max_position_embeddings from")
    config = json.loads(path.read_text())
    value = config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings")
    if not isinstance(value, int) or value < 1:
        raise LpesError(f"{path} has no max_position_embeddings; pass the profile (--max-total) explicitly")
    return value


def engine_onnx(onnx_dir: Path, export_dtype: str, wanted: str, out_dir: Path) -> Path:
    """The graph TensorRT builds: the export itself, or its `wanted` cast written into `out_dir`."""
    if export_dtype == wanted:
        return Path(onnx_dir) / MODEL_FILE
    if export_dtype != "float32":
        raise LpesError(
            f"the ONNX export in {onnx_dir} is {export_dtype}; a {wanted} engine needs a {wanted} "
            "or a float32 export to cast from"
        )
    from lpes.exporters.tensorrt.cast import write_cast_onnx

    cast = write_cast_onnx(Path(onnx_dir) / MODEL_FILE, Path(out_dir) / f"model.{wanted}.onnx", wanted)
    check_tensorrt_support(cast)
    return cast


def graph_input_dims(onnx_file: Path) -> dict[str, list[int | str]]:
    """Each graph input's dims: an int where static, the dimension's name where dynamic."""
    import onnx

    model = onnx.load(str(onnx_file), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    dims = {}
    for value in model.graph.input:
        if value.name in initializers:  # old-style graphs list weights as inputs
            continue
        shape = value.type.tensor_type.shape.dim
        dims[value.name] = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in shape]
    return dims


def _sidecar(onnx_dir, onnx_file, out_dir, metadata, dtype, profile, shapes, plan, cache) -> dict:
    gpu = tensorrt_build.gpu_info()
    spec_path = Path(onnx_dir) / SPEC_FILE
    return {
        "format": FORMAT,
        "version": VERSION,
        "dtype": dtype,
        "tensorrt": tensorrt_build.tensorrt_version(),
        "gpu": gpu.to_json() if gpu else None,
        "build": plan.to_json(),
        "onnx": os.path.relpath(onnx_file, out_dir),
        "timing_cache": os.path.relpath(cache, out_dir) if cache.parent == Path(out_dir) else str(cache),
        "profile": profile.to_json(),
        "shapes": {name: {"min": list(s[0]), "opt": list(s[1]), "max": list(s[2])} for name, s in shapes.items()},
        "inputs": metadata["inputs"],
        "outputs": metadata["outputs"],
        "num_layers": metadata["num_layers"],
        "num_key_value_heads": metadata["num_key_value_heads"],
        "head_dim": metadata["head_dim"],
        "spec": json.loads(spec_path.read_text()) if spec_path.is_file() else None,
    }


def read_sidecar(engine_dir: Path) -> dict | None:
    """`model.engine.json` of an engine folder, or None (an engine built with trtexec.sh has none)."""
    path = Path(engine_dir) / SIDECAR_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if data.get("format") != FORMAT:
        raise LpesError(f"{path} is not an lpes TensorRT sidecar")
    return data


PROG = "python -m lpes.exporters.tensorrt"


def main(argv: list[str] | None = None) -> int:
    """python -m lpes.exporters.tensorrt ONNX_DIR OUT_DIR --dtype D [profile flags]: build on this machine."""
    from lpes.foundation.commands import run_command

    return run_command(PROG, _build_here, argv)


def _build_here(argv: list[str] | None) -> int:
    from lpes.exporters.tensorrt.profiles import add_profile_arguments, profile_from_args

    parser = ArgumentParser(prog=PROG, description=main.__doc__)
    parser.add_argument("onnx_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--timing-cache", type=Path, help=f"timing cache (default OUT_DIR/{TIMING_CACHE_FILE})")
    add_profile_arguments(parser)
    args = parser.parse_args(argv)
    profile = profile_from_args(args, max_positions(args.onnx_dir), max(read_metadata(args.onnx_dir)["scales"]))
    note = build_engine_or_explain(args.onnx_dir, args.out_dir, args.dtype, profile, timing_cache=args.timing_cache)
    if note:
        print(note, file=sys.stderr)
        return 2
    print(f"wrote {args.out_dir / ENGINE_FILE}")
    return 0

